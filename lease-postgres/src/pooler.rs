//! Working through a connection pooler in transaction mode (PgBouncer's
//! `pool_mode = transaction`, `pooler=transaction` in the URL).
//!
//! Such a pooler hands each *transaction* of a client connection to whichever server session is
//! free, so three things the store otherwise relies on are gone:
//!
//! - The startup `options` parameter (PgBouncer refuses it), and with it the session settings
//!   of `route.rs`. Each of the store's calls runs instead in one explicit transaction that
//!   begins `READ COMMITTED` and sets them transaction-local ([`begin_sql`]): nothing is lost
//!   between two statements, and nothing leaks to the pooler's other clients, whose own
//!   session-level `SET`s (a `synchronous_commit = off`, a `default_transaction_isolation`) are
//!   overridden for the store's transaction too.
//! - Named prepared statements: a statement prepared in one transaction may not exist in the
//!   next, or exist under the same name from another client. Every statement is sent unnamed
//!   ([`Route::query`]), inside the transaction, so its parse and its execution reach the same
//!   server session.
//! - `LISTEN`, which needs a session that stays: workers listen on a direct connection
//!   (`listen_url=`) or poll.
//!
//! The checks on every new connection run in such a transaction too, so `fsync` and the
//! synchronous commit the store's transactions get are what they read.

use std::borrow::Cow;
use std::str::FromStr;

use sqlx::postgres::{PgArguments, PgConnectOptions, PgConnection, PgRow, Postgres};
use sqlx::query::{Query, QueryScalar};
use sqlx::FromRow;

use crate::config::Parsed;
use crate::error::PgError;
use crate::route::Route;

/// The transactions the store begins behind a pooler.
pub(crate) struct Pooled {
    /// For the store's own sessions: silent, without JIT.
    pub(crate) own: String,
    /// For the caller's sessions: silent only without wake-ups; the server's JIT setting.
    pub(crate) caller: String,
    /// The lock wait, in milliseconds, for a caller's transaction the store did not begin.
    pub(crate) lock_wait_ms: String,
}

impl Pooled {
    pub(crate) fn new(lock_wait_ms: &str, wake_ups: bool) -> Pooled {
        Pooled {
            own: begin_sql(lock_wait_ms, true, true),
            caller: begin_sql(lock_wait_ms, !wake_ups, false),
            lock_wait_ms: lock_wait_ms.to_owned(),
        }
    }
}

/// `BEGIN` at `READ COMMITTED` with the store's session settings made transaction-local: one
/// simple-protocol message, one round trip.
pub(crate) fn begin_sql(lock_wait_ms: &str, silent: bool, jit_off: bool) -> String {
    let mut sql = format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '{lock_wait_ms}'; \
         SET LOCAL synchronous_commit = on"
    );
    if jit_off {
        sql.push_str("; SET LOCAL jit = off");
    }
    if silent {
        sql.push_str("; SET LOCAL lease.wake_ups = off");
    }
    sql
}

/// Checks the pooler settings of `parsed` and resolves its listen URL from `listen_url` and
/// the main URL's parts.
pub(crate) fn checked(
    mut parsed: Parsed,
    listen_url: Option<String>,
    (userinfo, path, query): (&str, &str, &str),
) -> Result<Parsed, PgError> {
    if parsed.pooler && parsed.sync_replicas > 0 {
        return Err(PgError::Config(format!(
            "pooler=transaction with sync_replicas={}: the standbys' confirmation of a write is \
             read on the server session that committed it, which a transaction pooler does not \
             keep; give the store the primary's own address for sync_replicas",
            parsed.sync_replicas
        )));
    }
    let Some(listen_url) = listen_url else {
        return Ok(parsed);
    };
    if !parsed.pooler {
        return Err(PgError::Config(
            "listen_url= is for pooler=transaction: without a pooler the store listens on its \
             own sessions"
                .to_owned(),
        ));
    }
    let rest = listen_url
        .strip_prefix("postgres://")
        .or_else(|| listen_url.strip_prefix("postgresql://"))
        .ok_or_else(|| {
            PgError::Config(format!(
                "listen_url={listen_url:?} is not a postgres://HOST:PORT URL"
            ))
        })?;
    if rest.contains('@') || rest.contains('%') {
        return Err(PgError::Config(
            "listen_url= takes postgres://HOST:PORT[/DATABASE] only: the user and password \
             are the main URL's, written once"
                .to_owned(),
        ));
    }
    let (host, own_path) = match rest.find('/') {
        Some(slash) => rest.split_at(slash),
        None => (rest, ""),
    };
    if host.is_empty() || host.contains(',') || rest.contains('?') {
        return Err(PgError::Config(format!(
            "listen_url={listen_url:?}: expected one host, postgres://HOST:PORT[/DATABASE], \
             without parameters (the main URL's apply)"
        )));
    }
    let path = if own_path.is_empty() { path } else { own_path };
    let one = format!("postgres://{userinfo}{host}{path}{query}");
    let options = PgConnectOptions::from_str(&one)
        .map_err(|e| PgError::Config(format!("listen_url={listen_url:?}: {e}")))?;
    parsed.listen = Some(options);
    Ok(parsed)
}

/// Whether the store's workers listen for wake-ups: with wake-ups on, always without a
/// pooler; behind one, only on a listen URL. Behind a pooler, says which in one log line.
pub(crate) fn listens(route: &Route, wake_ups: bool, listen: Option<&PgConnectOptions>) -> bool {
    if route.pooled.is_none() || !wake_ups {
        return wake_ups;
    }
    match listen {
        Some(direct) => {
            tracing::info!(
                listen = %format!("{}:{}", direct.get_host(), direct.get_port()),
                "lease-postgres behind a transaction pooler: workers listen for wake-ups on the \
                 direct listen_url connection"
            );
            true
        }
        None => {
            tracing::info!(
                "lease-postgres behind a transaction pooler without listen_url: workers poll \
                 for runs (LISTEN needs a session the pooler does not keep); the store's writes \
                 still notify listeners elsewhere"
            );
            false
        }
    }
}

impl Route {
    /// A statement, unnamed behind a pooler (see the module's documentation).
    pub(crate) fn query<'q>(&self, sql: &'q str) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(sql).persistent(self.pooled.is_none())
    }

    /// [`query`](Route::query) for one column.
    pub(crate) fn query_scalar<'q, O>(
        &self,
        sql: &'q str,
    ) -> QueryScalar<'q, Postgres, O, PgArguments>
    where
        (O,): for<'r> FromRow<'r, PgRow>,
    {
        sqlx::query_scalar(sql).persistent(self.pooled.is_none())
    }

    /// What the store's own calls begin with behind a pooler; `None` without one.
    pub(crate) fn own_begin(&self) -> Option<Cow<'static, str>> {
        self.pooled.as_ref().map(|p| Cow::Owned(p.own.clone()))
    }

    /// What a transaction on the caller's pool begins with behind a pooler; `None` without one.
    pub(crate) fn caller_begin(&self) -> Option<Cow<'static, str>> {
        self.pooled.as_ref().map(|p| Cow::Owned(p.caller.clone()))
    }

    /// A transaction on the caller's pool, with the store's settings behind a pooler.
    pub(crate) async fn begin_caller(
        &self,
    ) -> Result<sqlx::Transaction<'static, Postgres>, sqlx::Error> {
        match self.caller_begin() {
            Some(begin) => self.caller.begin_with(begin).await,
            None => self.caller.begin().await,
        }
    }
}

/// `conn` as it is without a pooler; behind one, in a transaction of the store's, which
/// [`finish`](Pinned::finish) commits or rolls back.
pub(crate) enum Pinned<'c> {
    Direct(&'c mut PgConnection),
    Begun(sqlx::Transaction<'c, Postgres>),
}

impl<'c> Pinned<'c> {
    /// Begins with `begin` when there is one.
    pub(crate) async fn on(
        conn: &'c mut PgConnection,
        begin: Option<Cow<'static, str>>,
    ) -> Result<Pinned<'c>, sqlx::Error> {
        Ok(match begin {
            None => Pinned::Direct(conn),
            Some(begin) => Pinned::Begun(sqlx::Connection::begin_with(conn, begin).await?),
        })
    }

    /// The connection to run statements on.
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        match self {
            Pinned::Direct(conn) => conn,
            Pinned::Begun(tx) => tx,
        }
    }

    /// Commits after `result` succeeded, rolls back after it failed; `result` either way,
    /// unless the commit failed.
    pub(crate) async fn finish<T, E: From<sqlx::Error>>(
        self,
        result: Result<T, E>,
    ) -> Result<T, E> {
        self.finish_or(result, E::from).await
    }

    /// [`finish`](Pinned::finish), with a failed commit's error made by `fail`.
    pub(crate) async fn finish_or<T, E>(
        self,
        result: Result<T, E>,
        fail: impl FnOnce(sqlx::Error) -> E,
    ) -> Result<T, E> {
        let Pinned::Begun(tx) = self else {
            return result;
        };
        match result {
            Ok(value) => {
                tx.commit().await.map_err(fail)?;
                Ok(value)
            }
            Err(e) => {
                // Best effort: a connection that cannot roll back is closed by the pool.
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }
}

impl crate::PostgresLeaseStore {
    /// [`migrate`](crate::PostgresLeaseStore::migrate) behind a transaction pooler, where a
    /// session-level lock or `search_path` would stay on a server session the store may never
    /// see again: every migration in one transaction, on a connection of its own, under a
    /// transaction-level advisory lock and a transaction-local `search_path`. The statements
    /// sqlx prepares for its bookkeeping are deallocated before the commit, so the server
    /// session goes back to the pooler as it came.
    pub(crate) async fn migrate_pooled(&self) -> lease_core::Result<()> {
        use sqlx::{ConnectOptions, Connection};
        let fail = |e| self.route.fail(e);
        let mut conn = self.route.current_options().connect().await.map_err(fail)?;
        // Waiting for another process's migration lock is the point here: no lock_timeout.
        let begin = "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = 0; \
                     SET LOCAL statement_timeout = 0; SET LOCAL synchronous_commit = on";
        let migrated = self.migrate_on(&mut conn, begin).await;
        // Best effort: the pooler ends or reuses the server session either way.
        let _ = conn.close().await;
        Ok(migrated?)
    }

    /// [`migrate_pooled`](Self::migrate_pooled)'s transaction on `conn`.
    async fn migrate_on(
        &self,
        conn: &mut PgConnection,
        begin: &'static str,
    ) -> Result<(), PgError> {
        use sqlx::Connection;
        let mut tx = conn.begin_with(begin).await?;
        self.route
            .query(include_str!("../sql/migrate_lock_local.sql"))
            .bind(self.schema())
            .execute(&mut *tx)
            .await?;
        self.route
            .query(&self.sql.create_schema)
            .execute(&mut *tx)
            .await?;
        self.route
            .query(include_str!("../sql/set_search_path_local.sql"))
            .bind(crate::store::quoted(self.schema()))
            .execute(&mut *tx)
            .await?;
        apply_migrations(&mut tx).await?;
        self.route.query("DEALLOCATE ALL").execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }
}
/// What sqlx's `Migrator::run_direct` does without its session-level lock (the transaction's
/// serializes instead), written out because its future is not `Send` over a `PgConnection`:
/// the bookkeeping table, a refusal of a dirty or unknown applied migration or of one whose
/// checksum changed, then every missing migration, in order.
async fn apply_migrations(conn: &mut PgConnection) -> Result<(), sqlx::migrate::MigrateError> {
    use sqlx::migrate::{Migrate, MigrateError};
    let migrator = crate::migrator();
    conn.ensure_migrations_table().await?;
    if let Some(version) = conn.dirty_version().await? {
        return Err(MigrateError::Dirty(version));
    }
    let applied = conn.list_applied_migrations().await?;
    for done in &applied {
        if !migrator.iter().any(|m| m.version == done.version) {
            return Err(MigrateError::VersionMissing(done.version));
        }
    }
    for migration in migrator.iter() {
        if migration.migration_type.is_down_migration() {
            continue;
        }
        match applied
            .iter()
            .find(|done| done.version == migration.version)
        {
            Some(done) if done.checksum != migration.checksum => {
                return Err(MigrateError::VersionMismatch(migration.version));
            }
            Some(_) => {}
            None => {
                conn.apply(migration).await?;
            }
        }
    }
    Ok(())
}

/// Compiles only if the futures of the pooler's paths are `Send` (an `async fn` of a trait
/// object demands it); `raw_sql` and sqlx's `Migrator::run_direct` made them not.
#[cfg(test)]
#[allow(dead_code)]
fn send_futures(store: &crate::PostgresLeaseStore, route: &Route, conn: &mut PgConnection) {
    fn s<T: Send>(_: T) {}
    s(store.migrate_pooled());
    s(store.migrate());
    s(route.find_primary(std::time::Duration::from_secs(1)));
    s(route.bind("x"));
    s(route.confirm_caller(conn));
    s(crate::PostgresLeaseStore::connect(
        crate::PostgresConfig::from_url("x"),
    ));
}
