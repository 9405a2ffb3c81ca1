//! The store's part inside the **caller's own transaction**: fence check, end of the lease,
//! transactional enqueue. The caller opens the transaction on its own pool (same database),
//! writes its effect, calls these, and commits: the effect and the store's part commit
//! together or not at all.

use std::time::Duration;

use lease_core::backend::{check_create_batch, check_end_batch, fenced_verdict};
use lease_core::{End, Ending, Error, Lease, Result, RunId, RunRecord};
use sqlx::PgConnection;

use crate::batch::{created_verdicts, end_verdicts};
use crate::error::PgError;
use crate::store::{fence, record, state, PostgresLeaseStore};

impl PostgresLeaseStore {
    /// In the caller's transaction on `conn`: locks the run's row (`SELECT … FOR UPDATE`) and
    /// checks `lease` by the fenced-write rules, as [`fenced_transaction`] does. Returns the
    /// transaction's bound.
    ///
    /// From here until the caller's commit no claim of the run can commit, so the caller's
    /// statements and the store's part are judged under one fence. The same round trip sets
    /// the bound of [`fenced_transaction`] on the caller's transaction, transaction-local
    /// (`lock_timeout`, `statement_timeout`, `idle_in_transaction_session_timeout`): the
    /// server ends the transaction by itself if its client freezes, so **a frozen holder
    /// delays a reclaim by at most `2 × bound` past its lease's expiry**, exactly as for a
    /// fenced transaction (see there). Call it first in the transaction, before the effect,
    /// so a refusal costs nothing and the bound covers the rest.
    ///
    /// `conn` must be inside a transaction (`pool.begin()`): outside one the lock and the
    /// bound end with the statement.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::StaleFence`], [`Error::FenceAhead`],
    /// [`Error::LeaseEnded`]; [`Error::Unavailable`] if the row stayed locked by another
    /// transaction past the lock wait, or the connection failed. After an error the caller
    /// rolls back.
    ///
    /// [`fenced_transaction`]: PostgresLeaseStore::fenced_transaction
    pub async fn fence_in(&self, conn: &mut PgConnection, lease: &Lease) -> Result<Duration> {
        let (floor, cap) = self.transaction_bound;
        let row = sqlx::query_as::<_, (String, Option<String>, i64, i64)>(&self.sql.lock_run)
            .bind(lease.run().as_str())
            .bind(floor)
            .bind(cap)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| self.route.fail(e))?;
        let Some((current_state, owner, current, bound_ms)) = row else {
            return Err(Error::NotFound {
                run: lease.run().clone(),
            });
        };
        fenced_verdict(
            lease.run(),
            lease.fence(),
            fence(current)?,
            state(current_state)?,
            owner.is_some(),
        )?;
        Ok(Duration::from_millis(bound_ms.max(0) as u64))
    }

    /// In the caller's transaction on `conn`: ends `lease` as `end` says (complete, complete
    /// with a journaled effect, release, suspend), fenced. The end commits with the caller's
    /// transaction, or not at all: a job's effect in the caller's tables and the run's
    /// completion are one commit, so a crash between them is impossible, and a reclaim after
    /// the commit finds the run completed — **the effect is never applied twice**.
    ///
    /// Call [`fence_in`](PostgresLeaseStore::fence_in) first in the transaction (it locks the
    /// row and bounds the transaction); without it this statement still checks the fence, but a
    /// row locked by another transaction is skipped ([`Error::Unavailable`]) and the caller's
    /// earlier statements ran unfenced.
    ///
    /// Under `sync_replicas`, the caller's commit is durable on the standbys only once
    /// [`confirm_in`](PostgresLeaseStore::confirm_in) says so.
    ///
    /// # Errors
    /// The fenced-write verdicts (`StaleFence`, `FenceAhead`, `LeaseEnded`, `NotFound`);
    /// [`Error::InvalidInput`] for a payload over the limit or [`End::Committed`]. After an
    /// error the caller rolls back, so its own statements do not commit without the end.
    pub async fn end_in(&self, conn: &mut PgConnection, lease: &Lease, end: End) -> Result<()> {
        let ends = [Ending::new(lease.clone(), end)];
        check_end_batch(&ends)?;
        let rows = self
            .end_query(&ends)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| self.route.fail(e))?;
        if rows.len() != 1 {
            return Err(PgError::Failed(format!(
                "end_many returned {} rows for one end",
                rows.len()
            ))
            .into());
        }
        end_verdicts(&ends, &rows)?
            .pop()
            .unwrap_or_else(|| Err(PgError::Failed("no verdict".to_owned()).into()))
    }

    /// In the caller's transaction on `conn`: creates `run` (runnable, fence 0) — the
    /// **transactional enqueue**. The run exists if and only if the caller's transaction
    /// commits, and no `claim_next` sees it before (it is invisible to other sessions until
    /// the commit), so a job is enqueued exactly when the business change that needs it
    /// commits.
    ///
    /// # Errors
    /// [`Error::AlreadyExists`]; [`Error::Unavailable`] if the connection failed. A failed
    /// statement aborts the caller's transaction: check for the run beforehand if an existing
    /// one is expected, or use [`create_many_in`](PostgresLeaseStore::create_many_in), which
    /// answers per id without failing.
    pub async fn create_in(&self, conn: &mut PgConnection, run: &RunId) -> Result<RunRecord> {
        let row = sqlx::query(&self.sql.create)
            .bind(run.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| self.route.fail(e))?;
        match row {
            Some(row) => Ok(record(&row)?),
            None => Err(Error::AlreadyExists { run: run.clone() }),
        }
    }

    /// [`create_in`](PostgresLeaseStore::create_in) for up to
    /// [`MAX_BATCH`](lease_core::MAX_BATCH) runs in one statement, with one result per id, in
    /// order ([`Error::AlreadyExists`] for an id that exists or repeats).
    ///
    /// # Errors
    /// The outer error for a batch that is too large or a failed connection.
    pub async fn create_many_in(
        &self,
        conn: &mut PgConnection,
        runs: &[RunId],
    ) -> Result<Vec<Result<()>>> {
        check_create_batch(runs)?;
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = runs.iter().map(RunId::as_str).collect();
        let rows = sqlx::query(&self.sql.create_many)
            .bind(&ids)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| self.route.fail(e))?;
        created_verdicts(runs, &rows)
    }

    /// After the caller committed on `conn` a transaction holding the store's part: returns
    /// once the configured synchronous standbys flushed it (`sync_replicas`), as every write
    /// of the store is confirmed; at once without `sync_replicas`. Run it on the connection
    /// that committed, before reporting the job done.
    ///
    /// # Errors
    /// A retryable [`Error::Unavailable`] when the standbys did not flush the commit within
    /// the sync timeout: it committed on the primary and may be lost on failover.
    pub async fn confirm_in(&self, conn: &mut PgConnection) -> Result<()> {
        Ok(self
            .route
            .confirm_on(conn, std::time::Instant::now())
            .await?)
    }
}
