//! The store's part inside the **caller's own transaction**: fence check, end of the lease,
//! transactional enqueue. The caller opens the transaction on its own pool (same database),
//! writes its effect, calls these, and commits: the effect and the store's part commit
//! together or not at all.

use std::future::Future;
use std::time::Duration;

use lease_core::backend::{check_create_batch, check_end_batch, check_new_runs, fenced_verdict};
use lease_core::{End, Ending, Error, Lease, NewRun, Result, RunId, RunRecord};
use lease_runtime::observe::count_stale;
use sqlx::PgConnection;

use crate::batch::{created_verdicts, end_verdicts};
use crate::error::PgError;
use crate::store::{fence, get, record, state, PostgresLeaseStore};

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
    /// bound end with the statement. The same statement makes the transaction commit
    /// synchronously (`synchronous_commit = on`, transaction-local) whatever the session's
    /// setting, so the caller's commit is flushed before it returns.
    ///
    /// Like every call of the store it is bounded by the call timeout: past it the answer is
    /// [`Error::Unavailable`] and `conn`, still waiting for the server, must be dropped, not
    /// reused (roll back by dropping the transaction).
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::StaleFence`], [`Error::FenceAhead`],
    /// [`Error::LeaseEnded`]; [`Error::Unavailable`] if the row stayed locked by another
    /// transaction past the lock wait, the connection failed, or no answer came within the call
    /// timeout. After an error the caller rolls back.
    ///
    /// [`fenced_transaction`]: PostgresLeaseStore::fenced_transaction
    pub async fn fence_in(&self, conn: &mut PgConnection, lease: &Lease) -> Result<Duration> {
        Ok(self.lock_in(conn, lease).await?.0)
    }

    /// [`fence_in`](Self::fence_in), also returning the session's process id.
    pub(crate) async fn lock_in(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
    ) -> Result<(Duration, i32)> {
        let (floor, cap) = self.transaction_bound;
        if let Some(pooled) = &self.route.pooled {
            // Behind a transaction pooler the session's lock_timeout is whatever the server
            // session has: bound this transaction's wait for the row as a session of the
            // store's would be.
            let set = self
                .route
                .query(include_str!("../sql/lock_wait_local.sql"))
                .bind(&pooled.lock_wait_ms);
            self.in_time(async {
                set.execute(&mut *conn)
                    .await
                    .map_err(|e| self.route.fail(e).into())
            })
            .await?;
        }
        let query = self
            .route
            .query(&self.sql.lock_run)
            .bind(lease.run().as_str())
            .bind(floor)
            .bind(cap);
        let row = self
            .in_time(async {
                query
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(|e| self.route.fail(e).into())
            })
            .await?;
        let Some(row) = row else {
            return Err(Error::NotFound {
                run: lease.run().clone(),
            });
        };
        count_stale(fenced_verdict(
            lease.run(),
            lease.fence(),
            fence(get(&row, "fence")?)?,
            state(get(&row, "state")?)?,
            get::<Option<String>>(&row, "lease_owner")?.is_some(),
        ))?;
        let bound_ms: i64 = get(&row, "bound_ms")?;
        Ok((
            Duration::from_millis(bound_ms.max(0) as u64),
            get(&row, "pid")?,
        ))
    }

    /// `call`, or a retryable [`Error::Unavailable`] once it outlives the call timeout: the
    /// bound of every call on a connection the caller owns, which the store cannot discard.
    pub(crate) async fn in_time<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        let limit = self.route.call_timeout;
        match tokio::time::timeout(limit, call).await {
            Ok(answer) => answer,
            Err(_) => Err(PgError::Unreachable(format!(
                "no answer from postgres within the call timeout ({limit:?}); the caller's \
                 connection is still waiting: drop it (its transaction rolls back when the \
                 session ends), do not reuse it"
            ))
            .into()),
        }
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
    /// [`confirm_in`](PostgresLeaseStore::confirm_in) says so. The statement makes the
    /// transaction commit synchronously, as [`fence_in`](Self::fence_in) does; it is bounded
    /// by the call timeout as `fence_in` is.
    ///
    /// # Errors
    /// The fenced-write verdicts (`StaleFence`, `FenceAhead`, `LeaseEnded`, `NotFound`);
    /// [`Error::InvalidInput`] for a payload over the limit or [`End::Committed`]. After an
    /// error the caller rolls back, so its own statements do not commit without the end.
    pub async fn end_in(&self, conn: &mut PgConnection, lease: &Lease, end: End) -> Result<()> {
        let ends = [Ending::new(lease.clone(), end)];
        check_end_batch(&ends)?;
        let query = self.end_query(&ends);
        let rows = self
            .in_time(async {
                query
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(|e| self.route.fail(e).into())
            })
            .await?;
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

    /// In the caller's transaction on `conn`: creates `run` (runnable, unclaimed) — the
    /// **transactional enqueue**. The run exists if and only if the caller's transaction
    /// commits, and no `claim_next` sees it before (it is invisible to other sessions until
    /// the commit), so a job is enqueued exactly when the business change that needs it
    /// commits.
    ///
    /// A purged id is created again as [`create`](lease_core::LeaseStore::create) does: its
    /// first claim takes a fence above every fence its purged life carried, whatever the
    /// isolation level and however old the transaction's snapshot. Under `REPEATABLE READ` or
    /// `SERIALIZABLE`, if another transaction created the id after this one took its snapshot,
    /// the statement fails with a serialization failure ([`Error::Unavailable`]; roll back and
    /// run the transaction again).
    ///
    /// # Errors
    /// [`Error::AlreadyExists`]; [`Error::Unavailable`] if the connection failed, no answer
    /// came within the call timeout, or the snapshot predates another creation of the id. A failed
    /// statement aborts the caller's transaction: check for the run beforehand if an existing
    /// one is expected, or use [`create_many_in`](PostgresLeaseStore::create_many_in), which
    /// answers per id without failing.
    pub async fn create_in(&self, conn: &mut PgConnection, run: &RunId) -> Result<RunRecord> {
        self.create_with_in(conn, &NewRun::new(run.clone())).await
    }

    /// [`create_in`](PostgresLeaseStore::create_in) with what `new` asks for (a start delay
    /// on the database clock, counted from the statement: see [`NewRun`]). A job scheduled
    /// for later is enqueued in the transaction that needs it, or not at all.
    ///
    /// # Errors
    /// As [`create_in`](PostgresLeaseStore::create_in); [`Error::InvalidInput`] for a delay
    /// over [`MAX_START_DELAY`](lease_core::MAX_START_DELAY), before any I/O.
    pub async fn create_with_in(&self, conn: &mut PgConnection, new: &NewRun) -> Result<RunRecord> {
        new.check()?;
        let run = new.run();
        for _ in 0..crate::store::ATTEMPTS {
            let query = crate::store::bind_create(
                self.route.query(&self.sql.create).bind(run.as_str()),
                new,
            );
            let row = self
                .in_time(async {
                    query
                        .fetch_optional(&mut *conn)
                        .await
                        .map_err(|e| self.created_meanwhile(&format!("run {run}"), e).into())
                })
                .await?;
            if let Some(row) = row {
                return Ok(record(&row)?);
            }
            let Some(key) = new.unique_key() else {
                return Err(Error::AlreadyExists { run: run.clone() });
            };
            // The id exists, or a live run holds the key; neither when the holder ended since
            // the statement looked: then it is tried again.
            if let Some(holder) = self.in_time(self.unique_holder(conn, run, key)).await? {
                return Err(Error::AlreadyExists { run: holder });
            }
        }
        Err(crate::store::PostgresLeaseStore::raced(run))
    }

    /// A serialization failure of a create in the caller's transaction, said as what it
    /// almost always is: the id was created after the transaction's snapshot.
    fn created_meanwhile(&self, what: &str, e: sqlx::Error) -> PgError {
        let serialization =
            matches!(&e, sqlx::Error::Database(db) if db.code().as_deref() == Some("40001"));
        let e = self.route.fail(e);
        if serialization {
            return PgError::Busy(format!(
                "{what} was created by another transaction after this one's snapshot; roll \
                 back and run the transaction again ({e})"
            ));
        }
        e
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
        let runs: Vec<NewRun> = runs.iter().cloned().map(NewRun::new).collect();
        self.create_many_with_in(conn, &runs).await
    }

    /// [`create_many_in`](PostgresLeaseStore::create_many_in) with each run's [`NewRun`]:
    /// one statement, a result per item in order.
    ///
    /// # Errors
    /// The outer error for a batch that is too large, an item [`NewRun::check`] refuses
    /// (before any I/O: nothing is created), or a failed connection.
    pub async fn create_many_with_in(
        &self,
        conn: &mut PgConnection,
        runs: &[NewRun],
    ) -> Result<Vec<Result<()>>> {
        check_new_runs(runs)?;
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let columns = crate::store::create_many_columns(runs);
        let query =
            crate::store::bind_create_many(self.route.query(&self.sql.create_many), &columns);
        let rows = self
            .in_time(async {
                query.fetch_all(&mut *conn).await.map_err(|e| {
                    self.created_meanwhile(&format!("one of the {} runs", runs.len()), e)
                        .into()
                })
            })
            .await?;
        let results = created_verdicts(runs, &rows)?;
        self.in_time(self.name_holders(conn, runs, results)).await
    }

    /// After the caller committed on `conn` a transaction holding the store's part: returns
    /// once the server flushed it to disk and the configured synchronous standbys
    /// (`sync_replicas`) flushed it too, as every write of the store is confirmed. Run it on
    /// the connection that committed, before reporting the job done. It covers any commit
    /// made on `conn` before it, synchronous or not (a `SET LOCAL synchronous_commit = off`
    /// after [`end_in`](Self::end_in)): the target is the server's WAL insert position, and a
    /// barrier write of the store's (one synchronously committed WAL record) flushes it, and
    /// sends it to the standbys. Without `sync_replicas`, a WAL already flushed that far
    /// costs one read on `conn` and no barrier. Bounded by the call timeout.
    ///
    /// # Errors
    /// A retryable [`Error::Unavailable`] when the standbys did not flush the commit within
    /// the sync timeout (it committed on the primary and may be lost on failover), when the
    /// store's sessions are on another server than `conn` (the barrier could not flush its
    /// commit), or no answer came within the call timeout.
    pub async fn confirm_in(&self, conn: &mut PgConnection) -> Result<()> {
        self.in_time(async { Ok(self.route.confirm_caller(conn).await?) })
            .await
    }
}
