//! Restore safety: a schema is bound to the cluster it was created on and to that cluster's
//! timeline, so that a server whose history went back cannot hand out fences again.
//!
//! A point-in-time recovery, a restored base backup brought up with a recovery target, or an
//! asynchronous standby promoted all bring the runs back as they were at some earlier point,
//! while workers that claimed since may still run under fences the server will now issue
//! again. Each of them starts a new timeline (a recovery ends on one; a promotion begins one),
//! and a database made anew (initdb, dump and restore) has another system identifier. So the
//! schema's `cluster_binding` row (migration `20261214000000_cluster_binding`) holds both,
//! and every new connection of either pool compares them with the server's, after the
//! durability checks:
//! - another system identifier, or another timeline, is refused with one sentence naming what
//!   was recorded, what the server says, and the command that rebinds
//!   ([`PostgresLeaseStore::rebind`], `lease pg-rebind`);
//! - except a later timeline under `sync_replicas`: there a promotion is a failover of a
//!   standby that held every claim (no lease is handed out before N synchronous standbys hold
//!   it), so the new timeline is recorded and logged.
//!
//! A restore restarts the server, so every connection a store holds is new afterwards and is
//! checked before its first statement. Not detected: a base backup started as a primary without
//! recovery (crash recovery from its `backup_label` keeps the timeline), and a point-in-time
//! recovery of a cluster used with `sync_replicas` (taken for a failover). Rebind after those by
//! hand.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use lease_core::Result;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres, Row};

use crate::config::PostgresConfig;
use crate::error::PgError;
use crate::pooler::Pinned;
use crate::route::Route;
use crate::store::PostgresLeaseStore;

pub use lease_core::REBIND_FENCE_STEP;

/// The binding statements, with the store's schema spliced in.
#[derive(Debug)]
struct Statements {
    schema: String,
    read: String,
    write: String,
    rebind_fences: String,
}

/// What the route knows of the schema's binding: the statements once the schema is migrated
/// (before that the table may not exist), and the last refusal.
#[derive(Debug, Default)]
pub(crate) struct Binding {
    sql: OnceLock<Statements>,
    /// The refusal of the last new connection whose server did not match, until one matches.
    refused: Mutex<Option<String>>,
    /// Tells the calls waiting for a connection that one was refused for its binding: the
    /// pool would otherwise retry until its timeout, hiding why.
    notice: tokio::sync::Notify,
}

/// What [`PostgresLeaseStore::rebind`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebound {
    /// The system identifier and timeline the schema was bound to, if any.
    pub before: Option<(i64, i64)>,
    /// The system identifier and timeline it is bound to now.
    pub after: (i64, i64),
    /// How many runs had their fence raised by [`REBIND_FENCE_STEP`].
    pub runs: u64,
    /// The fence floor after the rebind.
    pub floor: i64,
}

/// The server's identity and the recorded one, as `sql/binding_read.sql` returns them.
struct Seen {
    system: i64,
    timeline: i64,
    bound: Option<(i64, i64)>,
}

// The binding's statements run once per new connection: unnamed, so that they also work behind
// a transaction pooler (`pooler.rs`) without knowing whether there is one.
async fn read(conn: &mut PgConnection, sql: &str) -> Result<Seen, sqlx::Error> {
    let row = sqlx::query(sql).persistent(false).fetch_one(conn).await?;
    let system: i64 = row.try_get("system_identifier")?;
    let timeline: i64 = row.try_get("timeline")?;
    let bound_system: Option<i64> = row.try_get("bound_system_identifier")?;
    let bound_timeline: Option<i64> = row.try_get("bound_timeline")?;
    Ok(Seen {
        system,
        timeline,
        bound: bound_system.zip(bound_timeline),
    })
}

async fn write(
    conn: &mut PgConnection,
    sql: &str,
    (system, timeline): (i64, i64),
) -> Result<Option<(i64, i64)>, sqlx::Error> {
    let row = sqlx::query(sql)
        .persistent(false)
        .bind(system)
        .bind(timeline)
        .fetch_optional(conn)
        .await?;
    row.map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .transpose()
}

/// As [`write`], committed without waiting for synchronous standbys: a connection check must
/// not hang on a promoted server that has none yet, and a binding lost in a failover is only
/// recorded again.
async fn record(conn: &mut PgConnection, sql: &str, here: (i64, i64)) -> Result<(), sqlx::Error> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    sqlx::query(include_str!("../sql/commit_locally.sql"))
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    write(&mut tx, sql, here).await?;
    tx.commit().await
}

impl Statements {
    fn new(schema: &str) -> Statements {
        let q = |sql: &str| crate::store::render_sql(sql, schema);
        Statements {
            schema: schema.to_owned(),
            read: q(include_str!("../sql/binding_read.sql")),
            write: q(include_str!("../sql/binding_write.sql")),
            rebind_fences: q(include_str!("../sql/rebind_fences.sql")),
        }
    }
}

impl Binding {
    /// Turns the check on, for `schema` (migrated).
    pub(crate) fn arm(&self, schema: &str) {
        let _ = self.sql.set(Statements::new(schema));
    }

    /// The refusal of the last connection refused for its binding, if no connection passed
    /// since.
    pub(crate) fn refused(&self) -> Option<PgError> {
        lock(&self.refused).clone().map(PgError::Config)
    }

    /// Checks the server behind `conn` (at `at`) against the schema's binding, binding it on
    /// first use and recording a later timeline under `sync_replicas`. `Ok(Some(refusal))`
    /// when it does not match; `Ok(None)` when it does, or before the check is armed.
    pub(crate) async fn check(
        &self,
        conn: &mut PgConnection,
        at: &str,
        sync_replicas: u32,
    ) -> Result<Option<PgError>, sqlx::Error> {
        let Some(sql) = self.sql.get() else {
            return Ok(None);
        };
        let schema = sql.schema.as_str();
        let seen = read(&mut *conn, &sql.read).await?;
        let refusal = match seen.bound {
            None => {
                record(&mut *conn, &sql.write, (seen.system, seen.timeline)).await?;
                tracing::info!(
                    server = at,
                    schema,
                    system_identifier = seen.system,
                    timeline = seen.timeline,
                    "lease-postgres: schema bound to this cluster"
                );
                None
            }
            Some((system, timeline)) if system == seen.system && timeline == seen.timeline => None,
            Some((system, timeline))
                if system == seen.system && timeline < seen.timeline && sync_replicas > 0 =>
            {
                record(&mut *conn, &sql.write, (seen.system, seen.timeline)).await?;
                tracing::info!(
                    server = at,
                    schema,
                    from = timeline,
                    to = seen.timeline,
                    "lease-postgres: a failover under sync_replicas: the schema's timeline \
                     recorded anew"
                );
                None
            }
            Some(bound) => Some(refusal(at, schema, bound, (seen.system, seen.timeline))),
        };
        let mut slot = lock(&self.refused);
        match refusal {
            None => {
                *slot = None;
                Ok(None)
            }
            Some(message) => {
                *slot = Some(message.clone());
                drop(slot);
                self.notice.notify_waiters();
                Ok(Some(PgError::Config(message)))
            }
        }
    }
}

/// The sentence a store refusing a restored server says.
fn refusal(at: &str, schema: &str, bound: (i64, i64), here: (i64, i64)) -> String {
    let what = if bound.0 != here.0 {
        format!(
            "it was bound to the cluster with system identifier {} (timeline {}), but {at} is \
             system identifier {} (timeline {}): another database cluster",
            bound.0, bound.1, here.0, here.1
        )
    } else {
        format!(
            "it was bound to system identifier {} on timeline {}, but {at} is on timeline {}: \
             the cluster was restored to an earlier point (point-in-time recovery, a base \
             backup), or a standby that had not received every claim was promoted",
            bound.0, bound.1, here.1
        )
    };
    format!(
        "refusing schema {schema:?}: {what}. Its runs may be as they were before claims that \
         workers still hold, so their fences would be issued again. Once the old holders are \
         stopped or may be fenced out, rebind the schema, which raises every fence by 2^32: \
         `lease pg-rebind --store postgres://…` (PostgresLeaseStore::rebind)"
    )
}

impl Route {
    /// A connection of the store's own pool within `limit`. A connection refused for its
    /// binding ends the wait at once, with the refusal, instead of the pool's retries until
    /// the timeout; `timed_out` makes the error of a wait that outlived `limit`.
    pub(crate) async fn acquire_own(
        &self,
        limit: Duration,
        timed_out: impl FnOnce() -> PgError,
    ) -> Result<PoolConnection<Postgres>, PgError> {
        let started = std::time::Instant::now();
        let refused = self.binding.notice.notified();
        tokio::pin!(refused);
        refused.as_mut().enable();
        tokio::select! {
            biased;
            got = tokio::time::timeout(limit, self.own.acquire()) => match got {
                Ok(Ok(pooled)) => return Ok(pooled),
                Ok(Err(e)) => return Err(self.fail(e)),
                Err(_) => return Err(self.binding.refused().unwrap_or_else(timed_out)),
            },
            () = &mut refused => {}
        }
        // Some connection was refused for its binding: this call's, or another's whose check
        // read the binding before a rebind committed. Ask the server once more, on a
        // connection of this call's own, before refusing.
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, self.recheck_binding()).await {
            Ok(Ok(())) => {}
            Ok(Err(refusal)) => return Err(refusal),
            Err(_) => return Err(timed_out()),
        }
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, self.own.acquire()).await {
            Ok(Ok(pooled)) => Ok(pooled),
            Ok(Err(e)) => Err(self.fail(e)),
            Err(_) => Err(timed_out()),
        }
    }

    /// The binding check on a direct connection to the host in use (not the pool's, which
    /// would retry a refusal until its timeout).
    async fn recheck_binding(&self) -> Result<(), PgError> {
        use sqlx::{ConnectOptions, Connection};
        let mut conn = self.current_options().connect().await?;
        let at = self.at();
        let checked = self.check_binding(&mut conn, &at).await;
        // Best effort: the server ends the session either way.
        let _ = conn.close().await;
        match checked {
            Ok(None) => Ok(()),
            Ok(Some(refusal)) => Err(refusal),
            Err(e) => Err(PgError::from(e)),
        }
    }

    /// The binding check on `conn`, in a transaction of the store's behind a pooler.
    async fn check_binding(
        &self,
        conn: &mut PgConnection,
        at: &str,
    ) -> Result<Option<PgError>, sqlx::Error> {
        let mut pinned = Pinned::on(conn, self.own_begin()).await?;
        let checked = self
            .binding
            .check(pinned.conn(), at, self.sync_replicas)
            .await;
        pinned.finish(checked).await
    }

    /// Arms the binding check for `schema` and checks one connection now: first use binds.
    pub(crate) async fn bind(&self, schema: &str) -> Result<(), PgError> {
        self.binding.arm(schema);
        let mut conn = self.own.acquire().await.map_err(|e| self.fail(e))?;
        let at = self.at();
        let checked = self.check_binding(&mut conn, &at).await;
        match checked {
            Ok(None) => Ok(()),
            Ok(Some(refusal)) => Err(refusal),
            Err(e) => Err(self.fail(e)),
        }
    }
}

impl PostgresLeaseStore {
    /// Rebinds `config`'s schema to the cluster its host is now, after a restore: in one
    /// transaction, raises every run's fence and the schema's fence floor by
    /// [`REBIND_FENCE_STEP`] (2^32), so that no fence the history before the restore issued is
    /// ever issued again, and records the server's system identifier and timeline. The
    /// operator's decision, once the workers of the old history are stopped or may be fenced
    /// out: a holder of a lease claimed before is refused with [`StaleFence`](lease_core::Error::StaleFence)
    /// from then on. Works while the binding does not match (the refusal is only for serving);
    /// runs the migrations as [`connect`](Self::connect) does. Rewrites every run's row: on a
    /// large table, a long transaction.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), without the binding's refusal.
    pub async fn rebind(config: PostgresConfig) -> Result<Rebound> {
        let store = PostgresLeaseStore::connect_unbound(config).await?;
        let route = &store.route;
        // Not armed on this store's route: its connections must work while the binding does
        // not match (armed, a new connection would be refused, retried until the timeout).
        let sql = Statements::new(store.schema());
        let fail = |e| route.fail(e);
        let mut conn = route.own.acquire().await.map_err(fail)?;
        let mut tx = match route.own_begin() {
            Some(begin) => sqlx::Connection::begin_with(&mut *conn, begin).await,
            None => sqlx::Connection::begin(&mut *conn).await,
        }
        .map_err(fail)?;
        let seen = read(&mut tx, &sql.read).await.map_err(fail)?;
        let row = route
            .query(&sql.rebind_fences)
            .bind(REBIND_FENCE_STEP as i64)
            .fetch_one(&mut *tx)
            .await
            .map_err(fail)?;
        let runs: i64 = row.try_get("runs").map_err(fail)?;
        let floor: i64 = row.try_get("floor").map_err(fail)?;
        let after = (seen.system, seen.timeline);
        write(&mut tx, &sql.write, after).await.map_err(fail)?;
        tx.commit().await.map_err(fail)?;
        let rebound = Rebound {
            before: seen.bound,
            after,
            runs: runs as u64,
            floor,
        };
        tracing::warn!(
            schema = store.schema(),
            before = ?rebound.before,
            after = ?rebound.after,
            runs = rebound.runs,
            "postgres schema rebound by an operator: every fence raised by 2^32"
        );
        Ok(rebound)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
