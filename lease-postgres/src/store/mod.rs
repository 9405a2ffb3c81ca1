//! [`PostgresLeaseStore`]: the run record as a table, every check in one conditional statement.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lease_core::backend::{
    check_claim_max, check_list, check_payload, check_purge, check_renew_batch, claim_refusal,
    fenced_verdict,
};
use lease_core::{
    End, Ending, Error, Fence, IdempotencyKey, JournalEntry, Kind, Lease, LeaseStore, ListFilter,
    NewRun, Queue, QueueState, Result, RunId, RunRecord, RunState, StoreTime, Ttl, WorkerId,
};
use lease_runtime::observe::count_stale;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::query::Query;
use sqlx::Postgres;
use sqlx::{PgConnection, Row};

use crate::config::PostgresConfig;
use crate::error::PgError;
use crate::route::Route;
use crate::transaction::FencedTransaction;

/// Runs `$body` with `$conn`, one pooled connection, the whole call (acquiring the connection
/// included) bounded by the store's call timeout. On timeout the connection is detached from
/// the pool and closed: a connection whose answer never came is never reused (sqlx would
/// otherwise ping it on release, waiting for TCP to give up).
macro_rules! call {
    ($store:expr, |$conn:ident| $body:expr) => {{
        let store: &PostgresLeaseStore = $store;
        let started = std::time::Instant::now();
        let limit = store.route.call_timeout;
        let mut pooled = match store
            .route
            .acquire_own(limit, || store.timed_out(limit))
            .await
        {
            Ok(pooled) => pooled,
            Err(e) => return Err(e.into()),
        };
        let left = limit.saturating_sub(started.elapsed());
        let answer = tokio::time::timeout(left, async {
            // Behind a transaction pooler the whole call is one transaction of the store's,
            // with its settings (`pooler.rs`); otherwise each statement commits by itself.
            let fail = |e| store.route.fail(e).into();
            let mut pinned =
                match crate::pooler::Pinned::on(&mut pooled, store.route.own_begin()).await {
                    Ok(pinned) => pinned,
                    Err(e) => return Err(fail(e)),
                };
            let result = async {
                let $conn: &mut sqlx::PgConnection = pinned.conn();
                $body
            }
            .await;
            pinned.finish_or(result, fail).await
        })
        .await;
        match answer {
            Ok(result) => result,
            Err(_) => {
                drop(pooled.detach());
                Err(store.timed_out(limit).into())
            }
        }
    }};
}

mod api;
mod decode;
mod queries;

pub(crate) use decode::*;
pub use queries::render_sql;
pub(crate) use queries::{quoted, Queries};

/// The embedded migrations; they run unqualified with `search_path` set to the store's schema.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The schema's format version this release reads and writes: the version of its newest
/// embedded migration. A schema at a newer one (migrated by a later release) is refused with a
/// clear error, with or without migrations; one at an older one is migrated up (or refused with
/// `migrate=false`).
pub fn format_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// The embedded migrations, for a caller who runs them in their own migration step.
///
/// They are written unqualified: run them on a connection whose `search_path` is the store's
/// schema (created beforehand), as [`PostgresLeaseStore::migrate`] does, which also serializes
/// concurrent runs with an advisory lock. sqlx records them in `<schema>._sqlx_migrations`;
/// a store connected with [`with_migrations(false)`](PostgresConfig::with_migrations) checks
/// that table for the newest version listed here.
///
/// ```
/// let newest = lease_postgres::migrator().iter().map(|m| m.version).max();
/// assert!(newest.is_some());
/// ```
pub fn migrator() -> &'static Migrator {
    &MIGRATOR
}

/// How often an operation whose refusal could not be explained (the row changed between the
/// write and the read that explains it) is tried again before giving up.
pub(crate) const ATTEMPTS: usize = 5;

/// How many lagging index entries (held runs whose `claimable_at` passed while they renewed)
/// one `claim_next` moves forward; see `sql/claim_next.sql`. Each is one non-HOT update, so
/// this bounds what a claim pays for the heartbeats' HOT updates.
const LAGGING_MOVED_PER_CLAIM: i64 = 256;

/// A [`LeaseStore`] on Postgres: one row per run in `<schema>.runs`, one per journal entry in
/// `<schema>.journal`.
///
/// Claims and fenced writes are single conditional `UPDATE … RETURNING` statements judged on
/// the database clock (`now()`); a statement that matches nothing is explained by a read of the
/// row through [`claim_refusal`] or [`fenced_verdict`], so the reasons are those of every other
/// backend. [`PostgresLeaseStore::fenced_transaction`] lets callers commit their own SQL
/// atomically with the fence check.
#[derive(Clone)]
pub struct PostgresLeaseStore {
    pub(crate) route: Arc<Route>,
    /// The floor and cap of a fenced transaction's bound, in milliseconds.
    pub(crate) transaction_bound: (i64, i64),
    schema: String,
    pub(crate) sql: Arc<Queries>,
    shown: String,
    /// The store's wake-ups; `None` when they are off (`wake_ups=false`), or behind a
    /// transaction pooler without a listen URL.
    listening: Option<Arc<lease_runtime::WakeListener>>,
    /// Where the listening sessions come from behind a transaction pooler (`listen_url=`);
    /// the store's own pool otherwise.
    listen_pool: Option<PgPool>,
    /// Sends the notifications of the store's own writes once they commit; `None` when
    /// wake-ups are off.
    notifier: Option<Arc<crate::notify::Notifier>>,
    /// What signal tokens are signed and checked with.
    pub(crate) signal_key: Option<lease_core::SignalKey>,
}

impl PostgresLeaseStore {
    /// Connects with `config`, creating the schema and running the migrations unless turned off.
    ///
    /// # Errors
    /// [`Error::Unavailable`] if the server cannot be reached within the acquire timeout;
    /// [`Error::Backend`] for a malformed URL or schema, refused credentials or a failed
    /// migration; [`Error::Misconfigured`] for a server that would not keep the store's
    /// promises, among them one whose history went back (a restore: another system identifier
    /// or timeline than the schema is bound to, which [`rebind`](Self::rebind) accepts). No
    /// error carries the password.
    pub async fn connect(config: PostgresConfig) -> Result<PostgresLeaseStore> {
        let store = PostgresLeaseStore::connect_unbound(config).await?;
        store.route.bind(&store.schema).await?;
        Ok(store)
    }

    /// As [`connect`](Self::connect), without the check of the schema's binding to the
    /// cluster (`binding.rs`): for [`rebind`](Self::rebind).
    pub(crate) async fn connect_unbound(config: PostgresConfig) -> Result<PostgresLeaseStore> {
        let parsed = config.parse()?;
        let migrate = parsed.migrate;
        let parsed_wake_ups = parsed.wake_ups;
        let listen = parsed.listen.clone();
        let route = Route::new(&config, parsed);
        // Direct connections first: through the pool, a refused or unreachable server only
        // shows as "pool timed out" after the whole acquire timeout, hiding why. This also
        // picks the primary among several hosts.
        route.find_primary(config.acquire_timeout).await?;
        let store = PostgresLeaseStore::assemble(route, &config, parsed_wake_ups, listen)?;
        // One pooled connection now, so a server that fails the checks (a standby, missing
        // synchronous standbys) is refused at connect rather than on the first operation, and
        // before a migration could wait on a standby that is not there.
        let checked = store.route.own.acquire().await;
        drop(checked.map_err(|e| store.route.fail(e))?);
        store.prepare_schema(migrate).await?;
        Ok(store)
    }

    /// Connects to `url` with the defaults of [`PostgresConfig::from_url`].
    ///
    /// # Errors
    /// As [`PostgresLeaseStore::connect`].
    pub async fn connect_url(url: &str) -> Result<PostgresLeaseStore> {
        PostgresLeaseStore::connect(PostgresConfig::from_url(url)).await
    }

    /// A store over a pool the caller built, with every setting of `config` but its hosts:
    /// schema, migrations (or, with [`with_migrations(false)`](PostgresConfig::with_migrations),
    /// none and a check of the schema's version), `sync_replicas` and its timeout, the call
    /// timeout, the fenced-transaction bound, `volatile` and `async_standbys`. The URL of
    /// `config` (see [`PostgresConfig::for_pool`]) gives parameters only; its hosts are
    /// ignored, and the store does not move between hosts.
    ///
    /// The caller's pool serves the caller: [`pool`](Self::pool) returns it, and fenced
    /// transactions run on it; one of its connections is checked now as
    /// [`connect`](Self::connect) checks each of its own (a primary, `fsync` and
    /// `synchronous_commit` on or `volatile`, the standbys). The store's own statements run
    /// on a pool of the store's, made from the same connect options (`max_connections` and
    /// the acquire timeout of `config`), whose every new connection is checked and whose
    /// sessions no caller can reach: a session setting the caller changes (a
    /// `synchronous_commit = off`) never weakens a claim. The caller's `after_connect` hooks
    /// do not run on those sessions; the store's statements name their schema and need none.
    ///
    /// ```no_run
    /// # async fn demo() -> lease_core::Result<()> {
    /// use lease_postgres::{sqlx::postgres::PgPoolOptions, PostgresConfig, PostgresLeaseStore};
    /// let pool = PgPoolOptions::new()
    ///     .max_connections(20)
    ///     .connect_lazy("postgres://app@db/engine")
    ///     .expect("a valid URL");
    /// let config = PostgresConfig::for_pool().with_schema("leases").with_migrations(false);
    /// let store = PostgresLeaseStore::from_pool(pool, config).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`PostgresLeaseStore::connect`].
    pub async fn from_pool(pool: PgPool, config: PostgresConfig) -> Result<PostgresLeaseStore> {
        let parsed = config.parse()?;
        let migrate = parsed.migrate;
        let store = PostgresLeaseStore::assemble(
            Route::over(pool, &config, &parsed),
            &config,
            parsed.wake_ups,
            parsed.listen.clone(),
        )?;
        store.route.check_pooled().await?;
        store.prepare_schema(migrate).await?;
        store.route.bind(&store.schema).await?;
        Ok(store)
    }

    /// Runs the migrations, or without them checks the schema's version: the last step of
    /// [`connect`](Self::connect) and [`from_pool`](Self::from_pool).
    async fn prepare_schema(&self, migrate: bool) -> Result<()> {
        if migrate {
            self.migrate().await
        } else {
            self.check_schema().await
        }
    }

    /// The schema's format version: the newest migration applied to it (`None` when it has
    /// none). Reads the catalog only.
    async fn schema_version(&self) -> Result<Option<i64>> {
        let fail = |e| self.route.fail(e);
        let mut conn = self.route.own.acquire().await.map_err(fail)?;
        let mut pinned = crate::pooler::Pinned::on(&mut conn, self.route.own_begin())
            .await
            .map_err(fail)?;
        let version = async {
            let conn = pinned.conn();
            let migrated: bool = self
                .route
                .query_scalar(&self.sql.schema_migrated)
                .bind(&self.schema)
                .fetch_one(&mut *conn)
                .await?;
            if !migrated {
                return Ok(None);
            }
            self.route
                .query_scalar(&self.sql.schema_version)
                .fetch_one(&mut *conn)
                .await
        }
        .await;
        Ok(pinned.finish(version).await.map_err(fail)?)
    }

    /// Refuses a schema whose format is newer than this release's: a later release migrated
    /// it (its records may hold what this code would misread, such as queues before they
    /// existed), so this code must not write to it, with or without migrations.
    async fn refuse_newer_schema(&self) -> Result<Option<i64>> {
        let found = self.schema_version().await?;
        let ours = format_version();
        match found {
            Some(version) if version > ours => Err(PgError::Config(format!(
                "schema {:?} is at format {version}, newer than this release's ({ours}): a \
                 later release migrated it; upgrade this program (or use another schema) \
                 before it reads or writes the runs there",
                self.schema
            ))
            .into()),
            found => Ok(found),
        }
    }

    /// Without migrations: refuses a schema that lacks the newest embedded migration, before
    /// any operation would fail on a missing table or column, or that a later release
    /// migrated. Reads the catalog only.
    async fn check_schema(&self) -> Result<()> {
        let needed = format_version();
        let found = self.refuse_newer_schema().await?;
        match found {
            Some(version) if version >= needed => Ok(()),
            found => {
                let state = match found {
                    Some(version) => format!("is at migration {version}"),
                    None => "has no migrations".to_owned(),
                };
                Err(PgError::Config(format!(
                    "schema {:?} {state} and this release needs {needed}; migrations are off \
                     (migrate=false), so run them first: `lease migrate`, \
                     PostgresLeaseStore::migrate, or lease_postgres::migrator() in your own step",
                    self.schema
                ))
                .into())
            }
        }
    }

    /// Hands a resumed or force-released run that is claimable now to the notifier.
    fn claimable_now(&self, record: &RunRecord) {
        if let Some(notifier) = &self.notifier {
            if record.state == RunState::Runnable && record.owner.is_none() {
                notifier.claimable(&record.kind, 0);
            }
        }
    }

    fn assemble(
        route: Arc<Route>,
        config: &PostgresConfig,
        wake_ups: bool,
        listen: Option<PgConnectOptions>,
    ) -> Result<PostgresLeaseStore> {
        let schema = config.schema.as_str();
        if schema.is_empty() || schema.len() > 63 || schema.contains('\0') {
            return Err(PgError::Config(format!(
                "schema name {schema:?} must be 1 to 63 bytes without NUL"
            ))
            .into());
        }
        let options = route.current_options();
        let shown = format!(
            "postgres://{}:{}/{} (schema {schema})",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or(""),
        );
        Ok(PostgresLeaseStore {
            transaction_bound: (
                config.transaction_floor.as_millis() as i64,
                config.transaction_cap.as_millis() as i64,
            ),
            schema: schema.to_owned(),
            sql: Arc::new(Queries::new(schema, route.pooled.is_some())),
            shown,
            signal_key: config.signal_key.clone(),
            listening: crate::pooler::listens(&route, wake_ups, listen.as_ref())
                .then(|| Arc::new(lease_runtime::WakeListener::new())),
            listen_pool: listen.map(|options| {
                PgPoolOptions::new()
                    .max_connections(2)
                    .acquire_timeout(config.acquire_timeout)
                    .connect_lazy_with(options.application_name(&route.app_name))
            }),
            notifier: wake_ups.then(|| {
                Arc::new(crate::notify::Notifier::new(
                    route.own.clone(),
                    route.own_begin(),
                    schema,
                    route.call_timeout,
                ))
            }),
            route,
        })
    }

    /// Creates the schema if missing and applies the embedded migrations, serialized across
    /// processes by a Postgres advisory lock, so a fleet starting at once is safe. Runs on a
    /// dedicated connection whose `search_path` is the schema; sqlx's `_sqlx_migrations`
    /// bookkeeping table lives in the schema too.
    ///
    /// # Errors
    /// As [`PostgresLeaseStore::connect`].
    pub async fn migrate(&self) -> Result<()> {
        self.refuse_newer_schema().await?;
        if self.route.pooled.is_some() {
            return self.migrate_pooled().await;
        }
        let timeout = self.route.own.options().get_acquire_timeout();
        let prepare: Arc<[String; 3]> = Arc::new([
            self.sql.migrate_lock.clone(),
            self.sql.create_schema.clone(),
            self.sql.set_search_path.clone(),
        ]);
        let schema = self.schema.clone();
        // A one-connection pool: its connection takes the lock, creates the schema and points
        // its search_path at it before the migrator sees it. Closing the pool ends the session,
        // which releases the lock.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(timeout)
            .after_connect(move |conn, _| {
                let prepare = Arc::clone(&prepare);
                let schema = schema.clone();
                Box::pin(async move {
                    sqlx::query(&prepare[0])
                        .bind(&schema)
                        .execute(&mut *conn)
                        .await?;
                    sqlx::query(&prepare[1]).execute(&mut *conn).await?;
                    sqlx::query(&prepare[2]).execute(&mut *conn).await?;
                    Ok(())
                })
            })
            // Waiting for another process's migration lock is the point here: no lock_timeout.
            .connect_lazy_with(
                self.route
                    .current_options()
                    .options([("lock_timeout", "0"), ("statement_timeout", "0")]),
            );
        let applied = MIGRATOR.run(&pool).await;
        pool.close().await;
        Ok(applied.map_err(PgError::from)?)
    }

    /// The pool for the caller's own statements (and the caller's transactions with
    /// [`fence_in`](Self::fence_in) / [`end_in`](Self::end_in)): the one given to
    /// [`from_pool`](Self::from_pool), or one the store opened beside its own.
    ///
    /// The store's own statements never run on it, so nothing done to its sessions changes how
    /// the store's writes commit, and the store never cancels its sessions' waits. Sessions
    /// the store opened carry its settings: `lock_timeout` (the
    /// [lock wait](PostgresConfig::with_lock_wait)) and `synchronous_commit = on`, and are
    /// checked as the store's own before use.
    pub fn pool(&self) -> &PgPool {
        &self.route.caller
    }

    /// Stores `queue` as paused or not (`sql/pause_queue.sql`), durable as a create is. Sent
    /// again after an outer error, it stores the same thing.
    async fn set_paused(&self, queue: &Queue, paused: bool) -> Result<QueueState> {
        let row = call!(self, |conn| {
            let query = self
                .route
                .query(&self.sql.pause_queue)
                .bind(queue.as_str())
                .bind(paused);
            self.write_opt(conn, query).await
        })?;
        let row = row.ok_or_else(|| Error::backend("postgres", "pause_queue returned no row"))?;
        tracing::info!(%queue, paused, "queue state stored");
        Ok(queue_state(&row)?)
    }

    /// The kinds with runnable runs in `queue` (`sql/queue_kinds.sql`), for the wake-ups of
    /// its resume.
    async fn queue_kinds(&self, queue: &Queue) -> Result<Vec<Kind>> {
        let rows = call!(self, |conn| {
            let query = self
                .route
                .query(&self.sql.queue_kinds)
                .bind(queue.as_str())
                .bind(lease_core::MAX_KINDS_COUNTED as i64);
            self.read_all_without_jit(conn, query).await
        })?;
        Ok(rows.iter().map(kind).collect::<Result<Vec<_>, _>>()?)
    }

    /// A statement that writes, returning at most one row: its wait for synchronous standbys
    /// is bounded, and a row (a write done) is reported only once durable as configured,
    /// confirmed on the same connection.
    async fn write_opt(
        &self,
        conn: &mut PgConnection,
        query: Query<'_, Postgres, PgArguments>,
    ) -> Result<Option<PgRow>> {
        let sent = std::time::Instant::now();
        let row = self.route.bounded(query.fetch_optional(&mut *conn)).await?;
        if row.is_some() {
            self.route.confirm_on(conn, sent).await?;
        }
        Ok(row)
    }

    /// As [`write_opt`](Self::write_opt), for statements returning many rows.
    async fn write_all(
        &self,
        conn: &mut PgConnection,
        query: Query<'_, Postgres, PgArguments>,
    ) -> Result<Vec<PgRow>> {
        let sent = std::time::Instant::now();
        let rows = self.route.bounded(query.fetch_all(&mut *conn)).await?;
        if !rows.is_empty() {
            self.route.confirm_on(conn, sent).await?;
        }
        Ok(rows)
    }

    async fn read_opt(
        &self,
        conn: &mut PgConnection,
        query: Query<'_, Postgres, PgArguments>,
    ) -> Result<Option<PgRow>> {
        Ok(query
            .fetch_optional(conn)
            .await
            .map_err(|e| self.route.fail(e))?)
    }

    async fn read_all(
        &self,
        conn: &mut PgConnection,
        query: Query<'_, Postgres, PgArguments>,
    ) -> Result<Vec<PgRow>> {
        Ok(query
            .fetch_all(conn)
            .await
            .map_err(|e| self.route.fail(e))?)
    }

    /// The rows of a read run in a transaction without JIT (`sql/no_jit.sql`), as the counts
    /// run: compiling count.sql took 200 to 360 ms on a million runs, three times what running
    /// it takes (BENCHMARKS.md). Off for this transaction only.
    async fn read_all_without_jit(
        &self,
        conn: &mut PgConnection,
        query: Query<'_, Postgres, PgArguments>,
    ) -> Result<Vec<PgRow>> {
        let fail = |e| self.route.fail(e);
        let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(fail)?;
        self.route
            .query(&self.sql.no_jit)
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
        let rows = self.read_all(&mut tx, query).await?;
        tx.commit().await.map_err(fail)?;
        Ok(rows)
    }

    /// The error of a call that outlived the call timeout.
    pub(crate) fn timed_out(&self, limit: Duration) -> PgError {
        PgError::Unreachable(format!(
            "no answer from postgres within the call timeout ({limit:?}); the connection is \
             closed, and a write it carried may or may not have committed"
        ))
    }

    /// `verdict`, once the standbys hold what it reports when it reports a lease ended under
    /// the caller's own fence: a retrying caller takes that answer for its own commit, so it
    /// is confirmed like a fresh write (through `conn`, which read it), whoever committed the
    /// end and however (a caller's transaction may have committed asynchronously). A retry
    /// never confirms less than the first attempt.
    async fn confirmed<T>(&self, conn: &mut PgConnection, verdict: Result<T>) -> Result<T> {
        if matches!(verdict, Err(Error::LeaseEnded { .. })) {
            self.route.confirm_seen(conn).await?;
        }
        verdict
    }

    /// The unsafe durability settings this store accepted because it is
    /// [volatile](PostgresConfig::with_volatile) (for example `fsync off`) or accepts
    /// [standbys that acknowledge nothing](PostgresConfig::with_async_standbys_accepted)
    /// (`standbys without sync_replicas`); empty when nothing risky was accepted. Also shown by
    /// `Display`.
    pub fn accepted_risks(&self) -> Vec<String> {
        self.route.accepted()
    }

    /// The schema holding the store's tables.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Opens a transaction, locks the run's row (`SELECT … FOR UPDATE`) and verifies `lease`
    /// by the fenced-write rules. The caller runs its own statements on the returned
    /// transaction; [`FencedTransaction::commit`] makes them and the fence check one atomic
    /// unit. While it is open no claim of the run can commit, so the server bounds it.
    ///
    /// # The bound
    /// In the same round trip as the lock, the transaction gets
    /// `bound = clamp(lease time left on the database clock, floor, cap)` (floor 250 ms, cap
    /// 60 s by default; see [`PostgresConfig::with_transaction_bound`]) as its transaction-local
    /// `lock_timeout`, `statement_timeout` and `idle_in_transaction_session_timeout`. The time
    /// left is the row's `lease_expires_at - now()`. The server enforces these by itself, even
    /// when the client is frozen or partitioned: one statement running longer than the bound
    /// is cancelled, and a transaction idle for longer than the bound after its last statement
    /// (the client stopped between statements or before `commit`) is ended with its session;
    /// either way nothing it wrote lands and its `commit` fails with [`Error::Unavailable`].
    ///
    /// Each statement and each idle gap is bounded, not their sum (PostgreSQL 15 has no limit
    /// on a whole transaction). So a holder that freezes releases the row at most
    /// **`2 × bound` after its last statement began**: that statement runs at most `bound`,
    /// the idle gap after it at most `bound`. A holder stops issuing statements at its scope's
    /// local deadline, before its lease expires, so a reclaim waits at most `2 × bound` past
    /// the lease's expiry, plus the claimer's own lock wait. With short statements it is
    /// about one idle bound after the last one (`tests/bounds.rs` measures both). Keep
    /// fenced transactions short, or lower the cap, if a reclaim must come sooner. A client
    /// that keeps issuing statements holds the row as long as it runs; its scope's deadline
    /// stops it.
    ///
    /// The wait for the row lock itself is bounded by the store's
    /// [lock wait](PostgresConfig::with_lock_wait).
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::StaleFence`], [`Error::FenceAhead`],
    /// [`Error::LeaseEnded`]; [`Error::Unavailable`] if the database cannot be reached or the
    /// row stayed locked by another transaction for longer than the lock wait.
    pub async fn fenced_transaction(&self, lease: &Lease) -> Result<FencedTransaction> {
        FencedTransaction::begin(self, lease).await
    }

    /// Explains a refused fenced write of `lease`: `Err(verdict)` (a lease ended under its
    /// own fence confirmed first), or `Ok(())` when the row now allows it (it changed since
    /// the write), in which case the caller tries again.
    async fn fenced_refusal(&self, conn: &mut PgConnection, lease: &Lease) -> Result<()> {
        let row = self.explain(conn, lease.run()).await?;
        let Some(row) = row else {
            return Err(Error::NotFound {
                run: lease.run().clone(),
            });
        };
        let verdict = count_stale(fenced_verdict(
            lease.run(),
            lease.fence(),
            row.fence,
            row.state,
            row.owner.is_some(),
        ));
        self.confirmed(conn, verdict).await
    }

    async fn explain(&self, conn: &mut PgConnection, run: &RunId) -> Result<Option<Explained>> {
        let row = self
            .read_opt(conn, self.route.query(&self.sql.explain).bind(run.as_str()))
            .await?;
        Ok(row.map(|row| Explained::from_row(&row)).transpose()?)
    }

    pub(crate) fn raced(run: &RunId) -> Error {
        PgError::Failed(format!(
            "run {run} changed under every one of {ATTEMPTS} attempts; giving up"
        ))
        .into()
    }

    async fn renew_one(&self, conn: &mut PgConnection, lease: &Lease) -> Result<Lease> {
        for _ in 0..ATTEMPTS {
            let row = self
                .write_opt(
                    conn,
                    self.route
                        .query(&self.sql.renew)
                        .bind(lease.run().as_str())
                        .bind(fence_param(lease.fence()))
                        .bind(ttl_param(lease.ttl())),
                )
                .await?;
            if let Some(row) = row {
                let expires_at = store_time(get(&row, "expires_us")?)?;
                return renewed(lease, expires_at);
            }
            self.fenced_refusal(conn, lease).await?;
        }
        Err(Self::raced(lease.run()))
    }

    /// `renew_many` of distinct runs: per TTL in the batch (one, as a rule), one
    /// `sql/renew_many.sql` statement that renews and returns the renewed runs; then, only if
    /// some lease was not renewed, one read (`sql/renew_many_explain.sql`) that explains those.
    async fn renew_batch(
        &self,
        conn: &mut PgConnection,
        leases: &[Lease],
    ) -> Result<Vec<Result<Lease>>> {
        let index: HashMap<&str, usize> = leases
            .iter()
            .enumerate()
            .map(|(i, l)| (l.run().as_str(), i))
            .collect();
        let mut expiries: Vec<Option<i64>> = vec![None; leases.len()];
        let mut ttls: Vec<i64> = leases.iter().map(|l| ttl_param(l.ttl())).collect();
        ttls.sort_unstable();
        ttls.dedup();
        for ttl in ttls {
            let (runs, fences): (Vec<&str>, Vec<i64>) = leases
                .iter()
                .filter(|l| ttl_param(l.ttl()) == ttl)
                .map(|l| (l.run().as_str(), fence_param(l.fence())))
                .unzip();
            let rows = self
                .write_all(
                    conn,
                    self.route
                        .query(&self.sql.renew_many)
                        .bind(&runs)
                        .bind(&fences)
                        .bind(ttl),
                )
                .await?;
            for row in &rows {
                let run: &str = get(row, "run_id")?;
                let Some(&i) = index.get(run) else {
                    return Err(PgError::Failed(format!(
                        "renew_many renewed run {run}, which is not in its batch"
                    ))
                    .into());
                };
                expiries[i] = Some(get(row, "expires_us")?);
            }
        }
        let refused: Vec<&str> = leases
            .iter()
            .zip(&expiries)
            .filter(|(_, expires)| expires.is_none())
            .map(|(l, _)| l.run().as_str())
            .collect();
        let mut current: HashMap<String, PgRow> = HashMap::with_capacity(refused.len());
        if !refused.is_empty() {
            let rows = self
                .read_all(
                    conn,
                    self.route
                        .query(&self.sql.renew_many_explain)
                        .bind(&refused),
                )
                .await?;
            for row in rows {
                current.insert(get(&row, "run_id")?, row);
            }
        }
        let mut results = Vec::with_capacity(leases.len());
        for (lease, expires) in leases.iter().zip(expiries) {
            let run = lease.run().as_str();
            let result = if let Some(expires) = expires {
                renewed(lease, store_time(expires)?)
            } else if let Some(row) = current.get(run) {
                // Refusals are final (a fence never goes back, and an ended lease's fence is
                // never held again), so a plain read explains them.
                match row_verdict(lease, row)? {
                    Err(refusal) => Err(refusal),
                    // It would renew, yet was not renewed: its row was locked (skipped, not
                    // waited for) or changed during the statement. Never reported as renewed;
                    // the scope keeps its deadline and the next heartbeat tries again.
                    Ok(()) => Err(PgError::Busy(format!(
                        "run {run}'s row is locked by another transaction (a fenced \
                         transaction in progress) or changed during the batch, so its renewal \
                         was skipped; the next heartbeat tries again"
                    ))
                    .into()),
                }
            } else {
                Err(Error::NotFound {
                    run: lease.run().clone(),
                })
            };
            results.push(result);
        }
        if results
            .iter()
            .any(|r| matches!(r, Err(Error::LeaseEnded { .. })))
        {
            self.route.confirm_seen(conn).await?;
        }
        Ok(results)
    }

    async fn end(&self, conn: &mut PgConnection, lease: &Lease, to: RunState) -> Result<()> {
        for _ in 0..ATTEMPTS {
            let row = self
                .write_opt(
                    conn,
                    self.route
                        .query(&self.sql.end_lease)
                        .bind(lease.run().as_str())
                        .bind(fence_param(lease.fence()))
                        .bind(to.as_str()),
                )
                .await?;
            if row.is_some() {
                return Ok(());
            }
            self.fenced_refusal(conn, lease).await?;
        }
        Err(Self::raced(lease.run()))
    }

    /// A record statement (`create`, `resume`, `force_release`) whose zero rows are explained
    /// by `refusal` from the current record (or `None` if the run is missing).
    async fn record_write(
        &self,
        conn: &mut PgConnection,
        sql: &str,
        run: &RunId,
        create: Option<&NewRun>,
        refusal: impl Fn(Option<&RunRecord>) -> Option<Error>,
    ) -> Result<RunRecord> {
        for _ in 0..ATTEMPTS {
            let mut query = self.route.query(sql).bind(run.as_str());
            if let Some(new) = create {
                query = bind_create(query, new);
            }
            let row = self.write_opt(conn, query).await?;
            if let Some(row) = row {
                return Ok(record(&row)?);
            }
            let current = self.inspect_on(conn, run).await;
            let current = match current {
                Ok(record) => Some(record),
                Err(Error::NotFound { .. }) => None,
                Err(e) => return Err(e),
            };
            if let (None, Some(key)) = (&current, create.and_then(NewRun::unique_key)) {
                // No run with the id: a live run holds the key, or held it and has ended since
                // (the create is tried again).
                if let Some(holder) = self.unique_holder(conn, run, key).await? {
                    self.route.confirm_seen(conn).await?;
                    return Err(Error::AlreadyExists { run: holder });
                }
                continue;
            }
            if let Some(refusal) = refusal(current.as_ref()) {
                if matches!(refusal, Error::AlreadyExists { .. }) {
                    // A retried create takes "already exists" for its own commit: the run
                    // must be as durable as if this call had created it.
                    self.route.confirm_seen(conn).await?;
                }
                return Err(refusal);
            }
        }
        Err(Self::raced(run))
    }

    /// Why a create of `run` with unique key `key` created nothing: the run with the id, else
    /// the live run holding the key (`sql/unique_holder.sql`); `None` when neither exists now.
    pub(crate) async fn unique_holder(
        &self,
        conn: &mut PgConnection,
        run: &RunId,
        key: &str,
    ) -> Result<Option<RunId>> {
        let row = self
            .read_opt(
                conn,
                self.route
                    .query(&self.sql.unique_holder)
                    .bind(run.as_str())
                    .bind(key),
            )
            .await?;
        Ok(row.map(|row| run_id(get(&row, "run_id")?)).transpose()?)
    }

    /// The results of a batch of creates with each input that created nothing for its unique
    /// key told apart (`sql/unique_holders.sql`): an id that exists stays
    /// [`Error::AlreadyExists`] naming itself; an input whose key a live run holds (one
    /// before it in the batch included) names that run; one whose holder has ended since the
    /// batch looked is refused as raced (retryable: create it again).
    pub(crate) async fn name_holders(
        &self,
        conn: &mut PgConnection,
        runs: &[NewRun],
        results: Vec<Result<()>>,
    ) -> Result<Vec<Result<()>>> {
        let keyed = |(new, result): &(&NewRun, &Result<()>)| {
            new.unique_key().is_some() && matches!(result, Err(Error::AlreadyExists { .. }))
        };
        let asked: Vec<(&NewRun, &Result<()>)> =
            runs.iter().zip(results.iter()).filter(keyed).collect();
        if asked.is_empty() {
            return Ok(results);
        }
        let ids: Vec<&str> = asked.iter().map(|(n, _)| n.run().as_str()).collect();
        let keys: Vec<&str> = asked.iter().filter_map(|(n, _)| n.unique_key()).collect();
        let rows = self
            .read_all(
                conn,
                self.route
                    .query(&self.sql.unique_holders)
                    .bind(&ids)
                    .bind(&keys),
            )
            .await?;
        let mut existing = std::collections::HashSet::new();
        let mut holders = std::collections::HashMap::new();
        for row in &rows {
            let run = run_id(get(row, "run_id")?)?;
            match get::<Option<String>>(row, "unique_key")? {
                Some(key) => {
                    holders.insert(key, run);
                }
                None => {
                    existing.insert(run);
                }
            }
        }
        Ok(runs
            .iter()
            .zip(results)
            .map(|(new, result)| match (new.unique_key(), result) {
                (Some(key), Err(Error::AlreadyExists { run })) if !existing.contains(&run) => {
                    match holders.get(key) {
                        Some(holder) => Err(Error::AlreadyExists {
                            run: holder.clone(),
                        }),
                        None => Err(Self::raced(&run)),
                    }
                }
                (_, result) => result,
            })
            .collect())
    }

    async fn inspect_on(&self, conn: &mut PgConnection, run: &RunId) -> Result<RunRecord> {
        let row = self
            .read_opt(conn, self.route.query(&self.sql.inspect).bind(run.as_str()))
            .await?;
        match row {
            Some(row) => Ok(record(&row)?),
            None => Err(Error::NotFound { run: run.clone() }),
        }
    }
}

impl fmt::Debug for PostgresLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLeaseStore")
            .field("server", &self.shown)
            .field("pool_size", &self.route.own.size())
            .finish()
    }
}

impl fmt::Display for PostgresLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)?;
        let accepted = self.accepted_risks();
        if !accepted.is_empty() {
            write!(
                f,
                " [{}accepts {}; a fence may be issued twice]",
                if self.route.is_volatile() {
                    "volatile: "
                } else {
                    ""
                },
                accepted.join(", ")
            )?;
        }
        Ok(())
    }
}
