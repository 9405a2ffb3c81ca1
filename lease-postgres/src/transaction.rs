//! [`FencedTransaction`]: the caller's own SQL, committed atomically with a fence check.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use lease_core::{End, Lease, Result};
use sqlx::{PgConnection, Postgres, Transaction};

use crate::durable::Waiter;
use crate::store::PostgresLeaseStore;

const COMMIT_SYNCHRONOUSLY: &str = include_str!("../sql/commit_synchronously.sql");

/// A database transaction that holds the lock on a run's row, opened by
/// [`PostgresLeaseStore::fenced_transaction`] after the lease passed the fenced-write rules.
///
/// It dereferences to the [`PgConnection`], so the caller runs its own statements on it:
/// `sqlx::query(..).execute(&mut *tx)`. [`commit`](FencedTransaction::commit) makes those
/// statements and the fence check one atomic unit: the row lock keeps every claim of the run
/// from committing until the transaction ends, so no reclaim can interleave. The server ends
/// the transaction on its own once it outlives its [bound](FencedTransaction::bound), so a
/// frozen holder cannot keep the row. Dropping it without committing rolls everything back.
pub struct FencedTransaction {
    tx: Transaction<'static, Postgres>,
    lease: Lease,
    store: PostgresLeaseStore,
    bound: Duration,
    /// Whose wait for standbys the store may cancel when this transaction's commit waits past
    /// the sync timeout: this session, on the host it was opened on.
    waiter: Waiter,
}

impl FencedTransaction {
    pub(crate) async fn begin(store: &PostgresLeaseStore, lease: &Lease) -> Result<Self> {
        let limit = store.route.call_timeout;
        match tokio::time::timeout(limit, Self::lock(store, lease)).await {
            Ok(result) => result,
            Err(_) => Err(store.timed_out(limit).into()),
        }
    }

    async fn lock(store: &PostgresLeaseStore, lease: &Lease) -> Result<Self> {
        let host = store.route.host_index();
        let mut tx = store
            .route
            .begin_caller()
            .await
            .map_err(|e| store.route.fail(e))?;
        // On a refusal `tx` is dropped, which rolls it back and releases the row.
        let (bound, pid) = store.lock_in(&mut tx, lease).await?;
        Ok(FencedTransaction {
            tx,
            lease: lease.clone(),
            store: store.clone(),
            bound,
            waiter: Waiter::Session { pid, host },
        })
    }

    /// The lease this transaction was verified against.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// How long the server lets this transaction wait for a lock, run one statement, or sit
    /// idle between statements before it aborts it (see
    /// [`PostgresLeaseStore::fenced_transaction`]).
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// The underlying sqlx transaction, for APIs that take one.
    pub fn transaction(&mut self) -> &mut Transaction<'static, Postgres> {
        &mut self.tx
    }

    /// Commits the caller's statements; the fence held throughout.
    ///
    /// The transaction commits synchronously whatever the caller's statements set
    /// (`SET LOCAL synchronous_commit = off` or the session-level `SET`): the store sets it
    /// back to `on`, transaction-local, in a statement just before the commit, so a commit
    /// reported done is flushed. The commit and, under `sync_replicas`, its confirmation are
    /// each bounded by the call timeout.
    ///
    /// # Errors
    /// [`Error::Unavailable`](lease_core::Error::Unavailable) if the server already aborted the transaction because it outlived
    /// its [bound](FencedTransaction::bound) (the message says which; nothing was committed), if
    /// the connection failed or did not answer in time (the commit may or may not have
    /// happened), or, under `sync_replicas`, if the commit was not confirmed on the standbys in
    /// time (it happened on the primary and may be lost on failover);
    /// [`Error::Backend`](lease_core::Error::Backend) if the database refused it (nothing was
    /// committed).
    pub async fn commit(mut self) -> Result<()> {
        let limit = self.store.route.call_timeout;
        let synchronous = self
            .store
            .route
            .query(COMMIT_SYNCHRONOUSLY)
            .execute(&mut *self.tx);
        match tokio::time::timeout(limit, synchronous).await {
            Ok(result) => result.map_err(|e| self.store.route.fail(e))?,
            Err(_) => return Err(self.store.timed_out(limit).into()),
        };
        self.commit_as_set().await
    }

    /// Commits with the `synchronous_commit` the transaction's last statement left: the
    /// store's own, `on` (`commit_synchronously.sql`, or an ending statement, which sets it
    /// too), then confirms.
    async fn commit_as_set(self) -> Result<()> {
        let FencedTransaction {
            tx, store, waiter, ..
        } = self;
        let switches = store.route.switches();
        let limit = store.route.call_timeout;
        let committed =
            tokio::time::timeout(limit, store.route.bounded_for(waiter, tx.commit())).await;
        match committed {
            Ok(result) => result?,
            Err(_) => return Err(store.timed_out(limit).into()),
        }
        match tokio::time::timeout(limit, store.route.confirm_after(switches)).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(store.timed_out(limit).into()),
        }
    }

    /// Ends the lease as `end` says (complete, complete with a journaled effect, release,
    /// suspend) **in this transaction**, then commits: the caller's statements, the fence
    /// check and the lease's end commit together or not at all, so a job's effect and its
    /// completion are one commit, and a worker that dies before it leaves nothing behind.
    ///
    /// # Errors
    /// The store's verdict on the end (it was checked when the row was locked, and the lock
    /// held since, so a refusal means the lease was ended in this very transaction); then as
    /// [`commit`](FencedTransaction::commit). On an error nothing commits: the transaction is
    /// rolled back, the caller's statements with it.
    pub async fn end(mut self, end: End) -> Result<()> {
        let limit = self.store.route.call_timeout;
        let ended =
            tokio::time::timeout(limit, self.store.end_in(&mut self.tx, &self.lease, end)).await;
        match ended {
            Ok(result) => result?,
            Err(_) => return Err(self.store.timed_out(limit).into()),
        }
        // The ending statement (end_many.sql) set synchronous commit on, last.
        self.commit_as_set().await
    }

    /// [`end`](FencedTransaction::end) with [`End::Complete`].
    ///
    /// # Errors
    /// As [`end`](FencedTransaction::end).
    pub async fn complete(self) -> Result<()> {
        self.end(End::Complete).await
    }

    /// [`end`](FencedTransaction::end) with [`End::Release`].
    ///
    /// # Errors
    /// As [`end`](FencedTransaction::end).
    pub async fn release(self) -> Result<()> {
        self.end(End::Release).await
    }

    /// [`end`](FencedTransaction::end) with [`End::Suspend`].
    ///
    /// # Errors
    /// As [`end`](FencedTransaction::end).
    pub async fn suspend(self) -> Result<()> {
        self.end(End::Suspend).await
    }

    /// Rolls everything back and releases the run's row.
    ///
    /// # Errors
    /// [`Error::Unavailable`](lease_core::Error::Unavailable) if the connection failed or did
    /// not answer within the call timeout (the server rolls back anyway when the session ends;
    /// the row stays locked at most the transaction's bound after its last statement).
    pub async fn rollback(self) -> Result<()> {
        let FencedTransaction { tx, store, .. } = self;
        let limit = store.route.call_timeout;
        match tokio::time::timeout(limit, tx.rollback()).await {
            Ok(result) => Ok(result.map_err(|e| store.route.fail(e))?),
            Err(_) => Err(store.timed_out(limit).into()),
        }
    }
}

impl Deref for FencedTransaction {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for FencedTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

impl fmt::Debug for FencedTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedTransaction")
            .field("run", self.lease.run())
            .field("fence", &self.lease.fence())
            .field("bound", &self.bound)
            .finish()
    }
}
