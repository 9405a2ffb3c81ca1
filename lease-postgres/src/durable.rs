//! What a write waits for under `sync_replicas`: its commit's wait for the synchronous
//! standbys, bounded by the store (cancelled on the server past the sync timeout, its own
//! sessions' waits only), and the confirmation that the standbys flushed what is reported.
//!
//! Two kinds of confirmation:
//! - [`confirm_on`](Route::confirm_on), after the store's own write on its own session: that
//!   commit was synchronous, so it lies below the server's flush position, the target.
//! - [`confirm_seen`](Route::confirm_seen), after an answer about something another session
//!   may have committed (a lease already ended under the caller's fence, a run that already
//!   exists, a caller's transaction): that commit may have been asynchronous (a caller's
//!   `SET LOCAL synchronous_commit = off` after the store's last statement, a role default),
//!   below the insert position but not yet the flush position. A barrier
//!   (`sql/barrier.sql`: one WAL record, committed synchronously) flushes everything before
//!   it and waits for the standbys; the target is then its own position. Without
//!   `sync_replicas` the barrier is still written: it is what makes such a commit durable on
//!   the server's own disk before the answer reports it done.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnection;
use sqlx::Row;

use crate::error::PgError;
use crate::pooler::Pinned;
use crate::route::Route;

const SYNC_ACKED: &str = include_str!("../sql/sync_acked.sql");
const CANCEL_SYNC_WAITS: &str = include_str!("../sql/cancel_sync_waits.sql");
const BARRIER: &str = include_str!("../sql/barrier.sql");
const WAL_INSERT: &str = include_str!("../sql/wal_insert.sql");
const WAL_FLUSHED: &str = include_str!("../sql/wal_flushed.sql");

/// Whose wait for a standby the store may cancel when a write outlives the sync timeout.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Waiter {
    /// Any of the store's own sessions (its `application_name`).
    Store,
    /// One session of the caller's pool, on host `host`: a fenced transaction the store
    /// commits.
    Session { pid: i32, host: usize },
}

impl Route {
    /// Runs a write on one of the store's own sessions, bounding its wait for synchronous
    /// standbys: past the sync timeout the wait is cancelled on the server (which then returns
    /// the commit as done locally, with a WARNING only), and a confirmation decides.
    pub(crate) async fn bounded<T>(
        &self,
        write: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, PgError> {
        self.bounded_for(Waiter::Store, write).await
    }

    /// [`bounded`](Route::bounded) for a write whose wait is `waiter`'s.
    pub(crate) async fn bounded_for<T>(
        &self,
        waiter: Waiter,
        write: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, PgError> {
        if self.sync_replicas == 0 {
            return write.await.map_err(|e| self.fail(e));
        }
        let mut write = std::pin::pin!(write);
        tokio::select! {
            done = &mut write => return done.map_err(|e| self.fail(e)),
            () = tokio::time::sleep(self.sync_timeout) => {}
        }
        for _ in 0..20 {
            self.cancel_sync_waits(waiter).await;
            tokio::select! {
                done = &mut write => return done.map_err(|e| self.fail(e)),
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        // The server cannot be told to stop waiting: give up on this write (its connection is
        // discarded with it) rather than wait without bound.
        Err(PgError::Busy(format!(
            "a write waited for sync_replicas={} synchronous standbys for more than {:?} and \
             its wait could not be cancelled; it may or may not have committed on the primary",
            self.sync_replicas,
            self.sync_timeout + Duration::from_secs(2)
        )))
    }

    /// Cancels `waiter`'s waits for standbys on a direct connection (the pools' new
    /// connections are refused while the standbys are missing): the store's own sessions on
    /// every host (the waiting write may be on a host the store has since moved away from),
    /// or one session on its host. A session of the caller's pool is never touched unless it
    /// is the one named.
    async fn cancel_sync_waits(&self, waiter: Waiter) {
        use sqlx::{ConnectOptions, Connection};
        let bound = self.sync_timeout.as_millis() as i64;
        let (name, pid, hosts): (Option<&str>, Option<i32>, Vec<usize>) = match waiter {
            Waiter::Store => (Some(&self.app_name), None, (0..self.hosts.len()).collect()),
            Waiter::Session { pid, host } => (None, Some(pid), vec![host % self.hosts.len()]),
        };
        for index in hosts {
            let options = &self.hosts[index];
            // Best effort: if this fails too, the write's own connection is gone or will be.
            if let Ok(Ok(mut conn)) =
                tokio::time::timeout(self.sync_timeout, options.connect()).await
            {
                let _ = self
                    .query(CANCEL_SYNC_WAITS)
                    .bind(name)
                    .bind(bound)
                    .bind(pid)
                    .fetch_all(&mut conn)
                    .await;
                let _ = conn.close().await;
            }
        }
    }

    /// Under `sync_replicas = N`: returns once N synchronous standbys of the server behind
    /// `conn` flushed everything it had flushed when the call began (so every synchronous
    /// commit that returned before it), or fails with a retryable error once the sync timeout,
    /// counted from `since` (when the write was sent), has passed; it looks at least once. Run
    /// on the connection that committed what it confirms, so no host switch can make another
    /// server answer. Without `sync_replicas`, at once.
    pub(crate) async fn confirm_on(
        &self,
        conn: &mut PgConnection,
        since: Instant,
    ) -> Result<(), PgError> {
        if self.sync_replicas == 0 {
            return Ok(());
        }
        self.flushed_to(conn, None, since).await
    }

    /// Returns once everything the server behind `conn` (one of the store's own sessions)
    /// had committed, or reported, when the call began is flushed to its disk and, under
    /// `sync_replicas`, held by the standbys, whoever committed it and however: a barrier,
    /// then (with standbys) its confirmation. For an answer that reports another session's
    /// commit as the caller's (a lease already ended under its fence, a run that already
    /// exists), which may have been asynchronous.
    pub(crate) async fn confirm_seen(&self, conn: &mut PgConnection) -> Result<(), PgError> {
        let since = Instant::now();
        let lsn: String = self
            .bounded(self.query_scalar(BARRIER).fetch_one(&mut *conn))
            .await?;
        if self.sync_replicas == 0 {
            return Ok(());
        }
        self.flushed_to(conn, Some(lsn), since).await
    }

    /// [`confirm_seen`](Route::confirm_seen) after a commit made on a connection that is gone
    /// (a fenced transaction's), on one of the store's own sessions: valid only if the store
    /// did not move hosts since `switches` was read before the commit. Without
    /// `sync_replicas`, at once: the store made that commit synchronous itself (its last
    /// statement sets `synchronous_commit = on`), so it was flushed before it returned.
    pub(crate) async fn confirm_after(&self, switches: u64) -> Result<(), PgError> {
        if self.sync_replicas == 0 {
            return Ok(());
        }
        let mut conn = self.own.acquire().await.map_err(|e| self.fail(e))?;
        self.confirm_seen(&mut conn).await?;
        self.same_host(switches)
    }

    /// Returns once everything committed on the caller's connection `conn` before the call
    /// is flushed to its server's disk and, under `sync_replicas`, held by the standbys. The
    /// target is read on `conn` (its server's insert position, past any commit it made,
    /// asynchronous or not); a barrier on one of the store's own sessions flushes it and
    /// waits for the standbys; then `conn`'s server is asked, so a store that moved hosts
    /// meanwhile cannot answer for it. Without `sync_replicas` and with the WAL already
    /// flushed past the insert position (the caller's commit was synchronous, and nothing
    /// else is pending), one read on `conn` and no barrier.
    pub(crate) async fn confirm_caller(&self, conn: &mut PgConnection) -> Result<(), PgError> {
        if self.sync_replicas == 0 {
            let (target, flushed) = self.wal_flushed(conn, None).await?;
            if flushed {
                return Ok(());
            }
            self.barrier().await?;
            // Asked of `conn`'s server, so a barrier that ran on another cannot answer for it.
            return match self.wal_flushed(conn, Some(target)).await? {
                (_, true) => Ok(()),
                (target, false) => Err(PgError::Busy(format!(
                    "the commit on the caller's connection (WAL {target}) was not flushed by                      the store's barrier (the store is on another server than the caller's                      connection); not reported as done"
                ))),
            };
        }
        let since = Instant::now();
        let target: String = self
            .query_scalar(WAL_INSERT)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| self.fail(e))?;
        let switches = self.switches();
        self.barrier().await?;
        self.same_host(switches)?;
        self.flushed_to(conn, Some(target), since).await
    }

    /// A barrier on one of the store's own sessions.
    async fn barrier(&self) -> Result<(), PgError> {
        let mut own = self.own.acquire().await.map_err(|e| self.fail(e))?;
        let mut pinned = Pinned::on(&mut own, self.own_begin())
            .await
            .map_err(|e| self.fail(e))?;
        let written = self
            .bounded(
                self.query_scalar::<String>(BARRIER)
                    .fetch_one(pinned.conn()),
            )
            .await;
        pinned.finish(written.map(drop)).await
    }

    /// `target` (the WAL insert position of `conn`'s server now, when `None`) and whether
    /// that server flushed its WAL up to it. Behind a pooler, `conn` (the caller's, after its
    /// commit) is read in a transaction of the store's.
    async fn wal_flushed(
        &self,
        conn: &mut PgConnection,
        target: Option<String>,
    ) -> Result<(String, bool), PgError> {
        let read = async {
            let mut pinned = Pinned::on(conn, self.caller_begin()).await?;
            let row = self
                .query(WAL_FLUSHED)
                .bind(target)
                .fetch_one(pinned.conn())
                .await;
            pinned.finish(row).await
        };
        let row = read.await.map_err(|e| self.fail(e))?;
        Ok((
            row.try_get("target").map_err(PgError::from)?,
            row.try_get("flushed").map_err(PgError::from)?,
        ))
    }

    fn same_host(&self, switches: u64) -> Result<(), PgError> {
        if self.switches() != switches {
            return Err(PgError::Busy(
                "the store moved to another host between the commit and its confirmation, so \
                 the standbys of the server that committed could not be asked; not reported \
                 as done"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// Polls `conn`'s server until N synchronous standbys flushed `target` (its flush position
    /// when `None`), until the sync timeout counted from `since`.
    async fn flushed_to(
        &self,
        conn: &mut PgConnection,
        mut target: Option<String>,
        since: Instant,
    ) -> Result<(), PgError> {
        let deadline = since + self.sync_timeout;
        loop {
            let row = self
                .query(SYNC_ACKED)
                .bind(target.as_deref())
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| self.fail(e))?;
            let acked: i64 = row.try_get("acked").map_err(PgError::from)?;
            if acked >= i64::from(self.sync_replicas) {
                return Ok(());
            }
            let lsn: String = row.try_get("target").map_err(PgError::from)?;
            if Instant::now() >= deadline {
                return Err(PgError::Busy(format!(
                    "the write committed on the primary but only {acked} of sync_replicas={} \
                     synchronous standbys flushed it (WAL {lsn}) within {:?}; it could be lost \
                     on failover, so it is not reported as done",
                    self.sync_replicas, self.sync_timeout
                )));
            }
            target = Some(lsn);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The host in use, for a [`Waiter::Session`].
    pub(crate) fn host_index(&self) -> usize {
        self.current.load(Ordering::Acquire)
    }
}
