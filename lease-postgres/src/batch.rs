//! `end_many` and `create_many`: a batch in one statement, one round trip and one commit.

use std::time::Instant;

use lease_core::{AttemptOutcome, End, Ending, Error, NewRun, Result};
use sqlx::postgres::PgRow;
use sqlx::PgConnection;

use crate::error::PgError;
use crate::store::{fence_param, get, row_verdict, PostgresLeaseStore};

impl PostgresLeaseStore {
    /// [`LeaseStore::end_many`](lease_core::LeaseStore::end_many): `sql/end_many.sql`, one
    /// statement (so one commit) for the whole batch.
    pub(crate) async fn end_batch(
        &self,
        conn: &mut PgConnection,
        ends: &[Ending],
    ) -> Result<Vec<Result<()>>> {
        let rows = self
            .write_batch(conn, self.end_query(ends), ends.len(), "end_many", |row| {
                get(row, "ended")
            })
            .await?;
        let results = end_verdicts(ends, &rows)?;
        if results
            .iter()
            .any(|r| matches!(r, Err(Error::LeaseEnded { .. })))
        {
            // "Already ended under your fence": a retry takes it for its commit, so the
            // standbys must hold it, as they must hold a fresh end.
            self.route.confirm_seen(conn).await?;
        }
        Ok(results)
    }

    /// `sql/end_many.sql` for `ends`, bound.
    pub(crate) fn end_query<'q>(
        &'q self,
        ends: &'q [Ending],
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        let runs: Vec<&str> = ends.iter().map(|e| e.lease.run().as_str()).collect();
        let fences: Vec<i64> = ends.iter().map(|e| fence_param(e.lease.fence())).collect();
        let states: Vec<&str> = ends.iter().map(|e| e.end.state().as_str()).collect();
        let payloads: Vec<Option<&[u8]>> = ends
            .iter()
            .map(|e| match &e.end {
                End::CompleteWith(payload) => Some(payload.as_slice()),
                _ => None,
            })
            .collect();
        let delays: Vec<i64> = ends.iter().map(|e| e.end.delay_millis() as i64).collect();
        let failures: Vec<Option<&str>> = ends
            .iter()
            .map(|e| match &e.end {
                End::Fail(reason) => Some(reason.as_str()),
                _ => None,
            })
            .collect();
        let refunds: Vec<bool> = ends.iter().map(|e| e.end.refunds_attempt()).collect();
        let (wait_names, wait_ms): (Vec<Option<&str>>, Vec<Option<i64>>) = ends
            .iter()
            .map(|e| match &e.end {
                // At most MAX_WAIT, checked: fits an i64 of milliseconds.
                End::AwaitSignal { name, timeout } => {
                    (Some(name.as_str()), timeout.map(|t| t.as_millis() as i64))
                }
                _ => (None, None),
            })
            .unzip();
        // check_end_batch refused End::Committed, the only end without an outcome.
        let (outcomes, errors): (Vec<&str>, Vec<Option<&str>>) = ends
            .iter()
            .map(|e| match AttemptOutcome::of_end(&e.end) {
                Some((outcome, error)) => (outcome.as_str(), error),
                None => (AttemptOutcome::Completed.as_str(), None),
            })
            .unzip();
        self.route
            .query(&self.sql.end_many)
            .bind(runs)
            .bind(fences)
            .bind(states)
            .bind(payloads)
            .bind(delays)
            .bind(failures)
            .bind(refunds)
            .bind(outcomes)
            .bind(errors)
            .bind(wait_names)
            .bind(wait_ms)
    }

    /// [`LeaseStore::create_many`](lease_core::LeaseStore::create_many): `sql/create_many.sql`,
    /// one statement for the whole batch.
    pub(crate) async fn create_batch(
        &self,
        conn: &mut PgConnection,
        runs: &[NewRun],
    ) -> Result<Vec<Result<()>>> {
        let columns = crate::store::create_many_columns(runs);
        let query =
            crate::store::bind_create_many(self.route.query(&self.sql.create_many), &columns);
        // One row per created run, none for the others.
        let rows = self
            .write_batch(conn, query, 0, "create_many", |_| Ok(true))
            .await?;
        let results = created_verdicts(runs, &rows)?;
        let results = self.name_holders(conn, runs, results).await?;
        if results
            .iter()
            .any(|r| matches!(r, Err(Error::AlreadyExists { .. })))
        {
            // A retried batch takes "already exists" for its own commit: those runs must be as
            // durable as the ones it created.
            self.route.confirm_seen(conn).await?;
        }
        Ok(results)
    }

    /// Runs a batch statement that writes: its wait for synchronous standbys is bounded, and if
    /// any row says it applied a write, the batch is reported only once durable as configured
    /// (as every single write is). `rows`, when not 0, is the number of rows it must return.
    async fn write_batch(
        &self,
        conn: &mut PgConnection,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
        rows: usize,
        what: &str,
        applied: impl Fn(&PgRow) -> Result<bool, PgError>,
    ) -> Result<Vec<PgRow>> {
        let sent = Instant::now();
        let answer = self.route.bounded(query.fetch_all(&mut *conn)).await?;
        if rows != 0 && answer.len() != rows {
            return Err(PgError::Failed(format!(
                "{what} returned {} rows for {rows} items",
                answer.len()
            ))
            .into());
        }
        let mut wrote = false;
        for row in &answer {
            if applied(row)? {
                wrote = true;
                break;
            }
        }
        if wrote {
            self.route.confirm_on(conn, sent).await?;
        }
        Ok(answer)
    }
}

/// The verdict of each item of `ends` from the rows of `sql/end_many.sql` (one per item, in
/// order).
pub(crate) fn end_verdicts(ends: &[Ending], rows: &[PgRow]) -> Result<Vec<Result<()>>> {
    let mut results = Vec::with_capacity(ends.len());
    for (Ending { lease, end, .. }, row) in ends.iter().zip(rows) {
        let result = if get::<bool>(row, "ended")? {
            Ok(())
        } else if !get::<bool>(row, "locked")? {
            if get::<bool>(row, "run_exists")? {
                // Skipped, not waited for: nothing was written for this item.
                Err(PgError::Busy(format!(
                    "run {}'s row is locked by another transaction (a fenced transaction in \
                     progress), so its {} was skipped and nothing was written for it; retry",
                    lease.run(),
                    end.as_str()
                ))
                .into())
            } else {
                Err(Error::NotFound {
                    run: lease.run().clone(),
                })
            }
        } else {
            // Read under our row lock: the refusal is current.
            match row_verdict(lease, row)? {
                Err(refusal) => Err(refusal),
                // Cannot happen under the lock. Not retried alone: the batch is one commit.
                Ok(()) => Err(PgError::Failed(format!(
                    "run {}'s row allowed the {} under our lock, yet the statement did not \
                     apply it; nothing was written for it",
                    lease.run(),
                    end.as_str()
                ))
                .into()),
            }
        };
        results.push(result);
    }
    Ok(results)
}

/// The verdict of each of `runs` from the rows of `sql/create_many.sql` (the ordinals that
/// created their run).
pub(crate) fn created_verdicts(runs: &[NewRun], rows: &[PgRow]) -> Result<Vec<Result<()>>> {
    let mut results: Vec<Result<()>> = runs
        .iter()
        .map(|new| {
            Err(Error::AlreadyExists {
                run: new.run().clone(),
            })
        })
        .collect();
    for row in rows {
        let ord: i64 = get(row, "ord")?;
        let slot = usize::try_from(ord)
            .ok()
            .and_then(|ord| ord.checked_sub(1))
            .and_then(|index| results.get_mut(index))
            .ok_or_else(|| {
                PgError::Failed(format!(
                    "create_many answered ordinal {ord} for {} ids",
                    runs.len()
                ))
            })?;
        *slot = Ok(());
    }
    Ok(results)
}
