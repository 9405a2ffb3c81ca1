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
    NewRun, Result, RunId, RunRecord, RunState, StoreTime, Ttl, WorkerId,
};
use lease_runtime::observe::count_stale;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgArguments, PgPool, PgPoolOptions, PgRow};
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
            let $conn: &mut sqlx::PgConnection = &mut pooled;
            $body
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

/// The embedded migrations; they run unqualified with `search_path` set to the store's schema.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

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
const ATTEMPTS: usize = 5;

/// How many lagging index entries (held runs whose `claimable_at` passed while they renewed)
/// one `claim_next` moves forward; see `sql/claim_next.sql`. Each is one non-HOT update, so
/// this bounds what a claim pays for the heartbeats' HOT updates.
const LAGGING_MOVED_PER_CLAIM: i64 = 256;

/// The statements, with `{schema}` replaced by the store's quoted schema.
#[derive(Debug)]
pub(crate) struct Queries {
    pub(crate) create: String,
    inspect: String,
    inspect_many: String,
    claim: String,
    claim_next: String,
    explain: String,
    renew: String,
    renew_many: String,
    renew_many_explain: String,
    pub(crate) end_many: String,
    pub(crate) create_many: String,
    purge: String,
    purge_ids: String,
    count_purgeable: String,
    count: String,
    count_kinds: String,
    no_jit: String,
    append: String,
    append_keyed: String,
    journal: String,
    end_lease: String,
    resume: String,
    force_release: String,
    cancel: String,
    list: String,
    pub(crate) lock_run: String,
    pub(crate) lock_many: String,
    create_schema: String,
    set_search_path: String,
    migrate_lock: String,
    schema_migrated: String,
    schema_version: String,
}

impl Queries {
    fn new(schema: &str) -> Queries {
        // Identifiers cannot be bound as parameters, so the schema is spliced in, quoted: any
        // characters are safe inside a double-quoted identifier once its quotes are doubled.
        let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
        let q = |sql: &str| sql.replace("{schema}", &quoted);
        Queries {
            create: q(include_str!("../sql/create.sql")),
            inspect: q(include_str!("../sql/inspect.sql")),
            inspect_many: q(include_str!("../sql/inspect_many.sql")),
            claim: q(include_str!("../sql/claim.sql")),
            claim_next: q(include_str!("../sql/claim_next.sql")),
            explain: q(include_str!("../sql/explain.sql")),
            renew: q(include_str!("../sql/renew.sql")),
            renew_many: q(include_str!("../sql/renew_many.sql")),
            renew_many_explain: q(include_str!("../sql/renew_many_explain.sql")),
            end_many: q(include_str!("../sql/end_many.sql")),
            create_many: q(include_str!("../sql/create_many.sql")),
            purge: q(concat!(
                include_str!("../sql/purge.sql"),
                include_str!("../sql/purge_remove.sql")
            )),
            purge_ids: q(concat!(
                include_str!("../sql/purge_ids.sql"),
                include_str!("../sql/purge_remove.sql")
            )),
            count_purgeable: q(include_str!("../sql/count_purgeable.sql")),
            count: q(include_str!("../sql/count.sql")),
            count_kinds: q(include_str!("../sql/count_kinds.sql")),
            no_jit: q(include_str!("../sql/no_jit.sql")),
            append: q(include_str!("../sql/append.sql")),
            append_keyed: q(include_str!("../sql/append_keyed.sql")),
            journal: q(include_str!("../sql/journal.sql")),
            end_lease: q(include_str!("../sql/end_lease.sql")),
            resume: q(include_str!("../sql/resume.sql")),
            force_release: q(include_str!("../sql/force_release.sql")),
            cancel: q(include_str!("../sql/cancel.sql")),
            list: q(include_str!("../sql/list.sql")),
            lock_run: q(include_str!("../sql/lock_run.sql")),
            lock_many: q(include_str!("../sql/lock_many.sql")),
            create_schema: q(include_str!("../sql/create_schema.sql")),
            set_search_path: q(include_str!("../sql/set_search_path.sql")),
            migrate_lock: q(include_str!("../sql/migrate_lock.sql")),
            schema_migrated: q(include_str!("../sql/schema_migrated.sql")),
            schema_version: q(include_str!("../sql/schema_version.sql")),
        }
    }
}

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
    /// The store's wake-ups; `None` when they are off (`wake_ups=false`).
    listening: Option<Arc<lease_runtime::WakeListener>>,
    /// Sends the notifications of the store's own writes once they commit; `None` when
    /// wake-ups are off.
    notifier: Option<Arc<crate::notify::Notifier>>,
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
        let route = Route::new(&config, parsed);
        // Direct connections first: through the pool, a refused or unreachable server only
        // shows as "pool timed out" after the whole acquire timeout, hiding why. This also
        // picks the primary among several hosts.
        route.find_primary(config.acquire_timeout).await?;
        let store = PostgresLeaseStore::assemble(route, &config, parsed_wake_ups)?;
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

    /// Without migrations: refuses a schema that lacks the newest embedded migration, before
    /// any operation would fail on a missing table or column. Reads the catalog only.
    async fn check_schema(&self) -> Result<()> {
        let needed = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
        let pool = &self.route.own;
        let migrated: bool = sqlx::query_scalar(&self.sql.schema_migrated)
            .bind(&self.schema)
            .fetch_one(pool)
            .await
            .map_err(|e| self.route.fail(e))?;
        let found: Option<i64> = if migrated {
            sqlx::query_scalar(&self.sql.schema_version)
                .fetch_one(pool)
                .await
                .map_err(|e| self.route.fail(e))?
        } else {
            None
        };
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
            sql: Arc::new(Queries::new(schema)),
            shown,
            listening: wake_ups.then(|| Arc::new(lease_runtime::WakeListener::new())),
            notifier: wake_ups.then(|| {
                Arc::new(crate::notify::Notifier::new(
                    route.own.clone(),
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
        sqlx::query(&self.sql.no_jit)
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
            .read_opt(conn, sqlx::query(&self.sql.explain).bind(run.as_str()))
            .await?;
        Ok(row.map(|row| Explained::from_row(&row)).transpose()?)
    }

    fn raced(run: &RunId) -> Error {
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
                    sqlx::query(&self.sql.renew)
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
                    sqlx::query(&self.sql.renew_many)
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
                    sqlx::query(&self.sql.renew_many_explain).bind(&refused),
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
                    sqlx::query(&self.sql.end_lease)
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
            let mut query = sqlx::query(sql).bind(run.as_str());
            if let Some(new) = create {
                query = query
                    .bind(millis(new))
                    .bind(new.payload())
                    .bind(new.kind().as_str())
                    .bind(new.run_at_micros())
                    .bind(i16::from(new.priority()));
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

    async fn inspect_on(&self, conn: &mut PgConnection, run: &RunId) -> Result<RunRecord> {
        let row = self
            .read_opt(conn, sqlx::query(&self.sql.inspect).bind(run.as_str()))
            .await?;
        match row {
            Some(row) => Ok(record(&row)?),
            None => Err(Error::NotFound { run: run.clone() }),
        }
    }
}

/// Whether `e` is the driver's unique violation (23505), folded into this adapter's error.
fn is_duplicate_key(e: &Error) -> bool {
    matches!(e, Error::Backend { detail, .. } if detail.to_string().contains("journal_idem_key"))
}

/// What a refused claim or fenced write is judged against.
struct Explained {
    state: RunState,
    owner: Option<WorkerId>,
    fence: Fence,
    remaining: Option<Duration>,
    delay: Option<Duration>,
}

impl Explained {
    fn from_row(row: &PgRow) -> Result<Explained, PgError> {
        let remaining: Option<i64> = get(row, "remaining_us")?;
        let delay: Option<i64> = get(row, "delay_us")?;
        Ok(Explained {
            state: state(get(row, "state")?)?,
            owner: worker(get(row, "lease_owner")?)?,
            fence: fence(get(row, "fence")?)?,
            remaining: remaining.map(|us| Duration::from_micros(us.max(0) as u64)),
            delay: delay.map(|us| Duration::from_micros(us.max(0) as u64)),
        })
    }
}

/// The verdict on `lease` of a row holding its run's `fence`, `state` and `lease_owner`:
/// `Ok(Err(refusal))`, or `Ok(Ok(()))` when the row allows the lease's writes.
pub(crate) fn row_verdict(lease: &Lease, row: &PgRow) -> Result<Result<()>, PgError> {
    Ok(count_stale(fenced_verdict(
        lease.run(),
        lease.fence(),
        fence(get(row, "fence")?)?,
        state(get(row, "state")?)?,
        get::<Option<String>>(row, "lease_owner")?.is_some(),
    )))
}

pub(crate) fn get<'r, T>(row: &'r PgRow, column: &str) -> Result<T, PgError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(column).map_err(PgError::from)
}

pub(crate) fn corrupt(why: impl fmt::Display) -> PgError {
    PgError::Corrupt {
        table: "runs",
        why: why.to_string(),
    }
}

pub(crate) fn fence(value: i64) -> Result<Fence, PgError> {
    u64::try_from(value)
        .ok()
        .and_then(|v| Fence::new(v).ok())
        .ok_or_else(|| corrupt(format!("fence {value} out of range")))
}

fn store_time(micros: i64) -> Result<StoreTime, PgError> {
    u64::try_from(micros)
        .map(StoreTime::from_micros)
        .map_err(|_| corrupt(format!("time {micros}us before the Unix epoch")))
}

pub(crate) fn state(name: String) -> Result<RunState, PgError> {
    name.parse().map_err(corrupt)
}

fn worker(owner: Option<String>) -> Result<Option<WorkerId>, PgError> {
    owner.map(WorkerId::new).transpose().map_err(corrupt)
}

pub(crate) fn fence_param(fence: Fence) -> i64 {
    fence.get() as i64 // at most Fence::MAX = i64::MAX
}

fn ttl_param(ttl: Ttl) -> i64 {
    ttl.as_millis() as i64 // at most one day
}

pub(crate) fn record(row: &PgRow) -> Result<RunRecord, PgError> {
    let expires: Option<i64> = get(row, "expires_us")?;
    let heartbeats: i64 = get(row, "heartbeats")?;
    let mut record = RunRecord::new(
        RunId::new(get::<String>(row, "run_id")?).map_err(corrupt)?,
        state(get(row, "state")?)?,
        fence(get(row, "fence")?)?,
        store_time(get(row, "observed_us")?)?,
    )
    .with_heartbeats(u64::try_from(heartbeats).map_err(corrupt)?)
    .with_not_before(
        get::<Option<i64>>(row, "not_before_us")?
            .map(store_time)
            .transpose()?,
    )
    .with_failure(get(row, "failure")?)
    .with_attempts(count(get(row, "attempts")?)?);
    record.owner = worker(get(row, "lease_owner")?)?;
    record.expires_at = expires.map(store_time).transpose()?;
    // The statements that read the payload (create, inspect) return it; the others have no
    // such column, and leave it None.
    if row.try_column("payload").is_ok() {
        record.payload = get(row, "payload")?;
    }
    // Every statement that returns a record returns its kind, but an older statement text (a
    // test's own query) may not.
    if row.try_column("kind").is_ok() {
        record.kind = kind(row)?;
    }
    if row.try_column("priority").is_ok() {
        record.priority = priority(row)?;
    }
    if row.try_column("created_us").is_ok() {
        let time = |column: &str| get::<Option<i64>>(row, column)?.map(store_time).transpose();
        record = record.with_times(lease_core::RunTimes {
            created_at: time("created_us")?,
            claimed_at: time("claimed_us")?,
            renewed_at: time("renewed_us")?,
            ended_at: time("ended_us")?,
        });
    }
    if row.try_column("claimable_since_us").is_ok() {
        record = record.with_claimable_since(
            get::<Option<i64>>(row, "claimable_since_us")?
                .map(store_time)
                .transpose()?,
        );
    }
    // inspect returns the attempt history, one array per field.
    if row.try_column("h_outcome").is_ok() {
        record = record.with_history(history(row)?);
    }
    Ok(record)
}

/// The ended attempts in `h_*` columns of `row` (null arrays: none).
fn history(row: &PgRow) -> Result<Vec<lease_core::Attempt>, PgError> {
    let outcomes: Vec<String> = get::<Option<_>>(row, "h_outcome")?.unwrap_or_default();
    let n = outcomes.len();
    let column = |name: &str| -> Result<Vec<Option<i64>>, PgError> {
        let v: Vec<Option<i64>> = get::<Option<_>>(row, name)?.unwrap_or_default();
        if v.len() == n {
            Ok(v)
        } else {
            Err(corrupt(format!(
                "history column {name} has {} entries, not {n}",
                v.len()
            )))
        }
    };
    let (attempts, fences) = (column("h_attempt")?, column("h_fence")?);
    let (claimed, ended) = (column("h_claimed_us")?, column("h_ended_us")?);
    let workers: Vec<Option<String>> = get::<Option<_>>(row, "h_worker")?.unwrap_or_default();
    let errors: Vec<Option<String>> = get::<Option<_>>(row, "h_error")?.unwrap_or_default();
    if workers.len() != n || errors.len() != n {
        return Err(corrupt("history columns of different lengths"));
    }
    let mut out = Vec::with_capacity(n);
    for (i, outcome) in outcomes.iter().enumerate() {
        let outcome: lease_core::AttemptOutcome = outcome.parse().map_err(corrupt)?;
        let number = count(attempts[i].ok_or_else(|| corrupt("history entry without n"))?)?;
        let fence = Fence::new(count(fences[i].unwrap_or(0))?).map_err(corrupt)?;
        let worker =
            worker(workers[i].clone())?.ok_or_else(|| corrupt("history entry without w"))?;
        let at = |us: Option<i64>| us.map(store_time).transpose();
        out.push(
            lease_core::Attempt::new(number, fence, worker, outcome)
                .with_times(at(claimed[i])?, at(ended[i])?)
                .with_error(errors[i].clone()),
        );
    }
    Ok(out)
}

/// The row's `priority` column.
fn priority(row: &PgRow) -> Result<u8, PgError> {
    let p: i16 = get(row, "priority")?;
    u8::try_from(p)
        .ok()
        .filter(|p| *p <= lease_core::MAX_PRIORITY)
        .ok_or_else(|| corrupt(format!("priority {p} out of range")))
}

/// The row's `kind` column.
fn kind(row: &PgRow) -> Result<Kind, PgError> {
    Kind::new(get::<String>(row, "kind")?).map_err(corrupt)
}

/// A non-negative counter column.
fn count(value: i64) -> Result<u64, PgError> {
    u64::try_from(value).map_err(|_| corrupt(format!("counter {value} below zero")))
}

fn leased(
    run: &RunId,
    owner: &WorkerId,
    fence: Fence,
    ttl: Ttl,
    expires_at: StoreTime,
    attempt: u64,
) -> Result<Lease> {
    Ok(
        Lease::new(run.clone(), owner.clone(), fence, ttl, expires_at)
            .map_err(corrupt)?
            .with_attempt(attempt),
    )
}

/// The renewed lease: the same, to a new expiry (the payload carried over: it never changes).
fn renewed(lease: &Lease, expires_at: StoreTime) -> Result<Lease> {
    Ok(leased(
        lease.run(),
        lease.owner(),
        lease.fence(),
        lease.ttl(),
        expires_at,
        lease.attempt(),
    )?
    .carrying(lease))
}

/// A claim row's payload column, shared.
fn payload(row: &PgRow) -> Result<Option<std::sync::Arc<[u8]>>, PgError> {
    Ok(get::<Option<Vec<u8>>>(row, "payload")?.map(std::sync::Arc::from))
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

#[async_trait::async_trait]
impl LeaseStore for PostgresLeaseStore {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        self.create_with(&NewRun::new(run.clone())).await
    }

    async fn create_with(&self, new: &NewRun) -> Result<RunRecord> {
        new.check()?;
        let run = new.run();
        let record = call!(self, |conn| {
            // No row and no record: the run was purged between the two reads; the next attempt
            // creates it.
            self.record_write(conn, &self.sql.create, run, Some(new), |current| {
                current.map(|_| Error::AlreadyExists { run: run.clone() })
            })
            .await
        })?;
        if let Some(notifier) = &self.notifier {
            notifier.created([new]);
        }
        Ok(record)
    }

    async fn create_many_with(&self, runs: &[NewRun]) -> Result<Vec<Result<()>>> {
        lease_core::backend::check_new_runs(runs)?;
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let results = call!(self, |conn| self.create_batch(conn, runs).await)?;
        if let Some(notifier) = &self.notifier {
            notifier.created(
                runs.iter()
                    .zip(&results)
                    .filter(|(_, r)| r.is_ok())
                    .map(|(new, _)| new),
            );
        }
        Ok(results)
    }

    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        call!(self, |conn| {
            for _ in 0..ATTEMPTS {
                let row = self
                    .write_opt(
                        conn,
                        sqlx::query(&self.sql.claim)
                            .bind(run.as_str())
                            .bind(worker.as_str())
                            .bind(ttl_param(ttl)),
                    )
                    .await?;
                if let Some(row) = row {
                    let fence = fence(get(&row, "fence")?)?;
                    let expires_at = store_time(get(&row, "expires_us")?)?;
                    let attempt = count(get(&row, "attempts")?)?;
                    return Ok(leased(run, worker, fence, ttl, expires_at, attempt)?
                        .with_payload(payload(&row)?)
                        .with_kind(kind(&row)?)
                        .with_priority(priority(&row)?));
                }
                // The read only explains the refusal; if the row now allows a claim (the
                // lease expired in between), the claim itself is tried again.
                let Some(row) = self.explain(conn, run).await? else {
                    return Err(Error::NotFound { run: run.clone() });
                };
                if let Some(refusal) = claim_refusal(
                    run,
                    row.state,
                    row.owner.as_ref(),
                    row.remaining,
                    row.delay,
                    row.fence,
                ) {
                    return Err(refusal);
                }
            }
            Err(Self::raced(run))
        })
    }

    async fn claim_next(&self, worker: &WorkerId, ttl: Ttl, max: usize) -> Result<Vec<Lease>> {
        self.claim_next_kind(&Kind::default(), worker, ttl, max)
            .await
    }

    async fn claim_next_kind(
        &self,
        kind: &Kind,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
        check_claim_max(max)?;
        let rows = call!(self, |conn| {
            self.write_all(
                conn,
                sqlx::query(&self.sql.claim_next)
                    .bind(worker.as_str())
                    .bind(ttl_param(ttl))
                    .bind(max as i64)
                    .bind(LAGGING_MOVED_PER_CLAIM)
                    .bind(kind.as_str()),
            )
            .await
        })?;
        rows.iter()
            .map(|row| {
                let run = RunId::new(get::<String>(row, "run_id")?).map_err(corrupt)?;
                let fence = fence(get(row, "fence")?)?;
                let expires_at = store_time(get(row, "expires_us")?)?;
                let attempt = count(get(row, "attempts")?)?;
                let waited: Option<i64> = get(row, "waited_us")?;
                Ok(leased(&run, worker, fence, ttl, expires_at, attempt)?
                    .with_payload(payload(row)?)
                    .with_kind(kind.clone())
                    .with_priority(priority(row)?)
                    .with_waited(waited.map(|us| Duration::from_micros(us.max(0) as u64))))
            })
            .collect()
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease> {
        call!(self, |conn| self.renew_one(conn, lease).await)
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        check_renew_batch(leases.len())?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let mut seen = HashSet::with_capacity(leases.len());
        if !leases.iter().all(|lease| seen.insert(lease.run())) {
            // One statement updates a row once; repeated runs are renewed one by one, in order,
            // as the memory store does.
            return call!(self, |conn| {
                let mut results = Vec::with_capacity(leases.len());
                for lease in leases {
                    results.push(self.renew_one(conn, lease).await);
                }
                Ok(results)
            });
        }
        call!(self, |conn| self.renew_batch(conn, leases).await)
    }

    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        check_payload(payload)?;
        call!(self, |conn| {
            for _ in 0..ATTEMPTS {
                let row = self
                    .write_opt(
                        conn,
                        sqlx::query(&self.sql.append)
                            .bind(lease.run().as_str())
                            .bind(fence_param(lease.fence()))
                            .bind(payload),
                    )
                    .await?;
                if let Some(row) = row {
                    let seq: i64 = get(&row, "seq")?;
                    return Ok(JournalEntry::new(
                        u64::try_from(seq).map_err(corrupt)?,
                        fence(get(&row, "fence")?)?,
                        payload.to_vec(),
                        store_time(get(&row, "written_us")?)?,
                    ));
                }
                self.fenced_refusal(conn, lease).await?;
            }
            Err(Self::raced(lease.run()))
        })
    }

    async fn append_keyed(
        &self,
        lease: &Lease,
        key: &IdempotencyKey,
        payload: &[u8],
    ) -> Result<JournalEntry> {
        check_payload(payload)?;
        call!(self, |conn| {
            for _ in 0..ATTEMPTS {
                let written = self
                    .write_opt(
                        conn,
                        sqlx::query(&self.sql.append_keyed)
                            .bind(lease.run().as_str())
                            .bind(fence_param(lease.fence()))
                            .bind(payload)
                            .bind(key.as_str()),
                    )
                    .await;
                let row = match written {
                    Ok(row) => row,
                    // The same key committed by a concurrent call after this statement's
                    // snapshot: run it again, and it finds that entry.
                    Err(e) if is_duplicate_key(&e) => continue,
                    Err(e) => return Err(e),
                };
                if let Some(row) = row {
                    let seq: i64 = get(&row, "seq")?;
                    return Ok(JournalEntry::new(
                        u64::try_from(seq).map_err(corrupt)?,
                        fence(get(&row, "fence")?)?,
                        get(&row, "payload")?,
                        store_time(get(&row, "written_us")?)?,
                    ));
                }
                self.fenced_refusal(conn, lease).await?;
            }
            Err(Self::raced(lease.run()))
        })
    }

    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        let rows = call!(self, |conn| {
            self.read_all(conn, sqlx::query(&self.sql.journal).bind(run.as_str()))
                .await
        })?;
        if rows.is_empty() {
            return Err(Error::NotFound { run: run.clone() });
        }
        let mut entries = Vec::with_capacity(rows.len());
        for row in &rows {
            let Some(seq) = get::<Option<i64>>(row, "seq")? else {
                continue; // the run exists and its journal is empty
            };
            entries.push(JournalEntry::new(
                u64::try_from(seq).map_err(corrupt)?,
                fence(get(row, "fence")?)?,
                get(row, "payload")?,
                store_time(get(row, "written_us")?)?,
            ));
        }
        Ok(entries)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        call!(self, |conn| self.end(conn, lease, RunState::Runnable).await)?;
        if let Some(notifier) = &self.notifier {
            notifier.claimable(lease.kind(), 0);
        }
        Ok(())
    }

    async fn suspend(&self, lease: &Lease) -> Result<()> {
        call!(self, |conn| self
            .end(conn, lease, RunState::Suspended)
            .await)
    }

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        let record = call!(self, |conn| {
            self.record_write(conn, &self.sql.resume, run, None, |current| match current {
                None => Some(Error::NotFound { run: run.clone() }),
                Some(r) if !matches!(r.state, RunState::Suspended | RunState::Failed) => {
                    Some(Error::NotSuspended {
                        run: run.clone(),
                        state: r.state,
                    })
                }
                Some(_) => None,
            })
            .await
        })?;
        self.claimable_now(&record);
        Ok(record)
    }

    async fn complete(&self, lease: &Lease) -> Result<()> {
        call!(self, |conn| self
            .end(conn, lease, RunState::Completed)
            .await)
    }

    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        call!(self, |conn| self.inspect_on(conn, run).await)
    }

    async fn inspect_many(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        lease_core::backend::check_create_batch(runs)?; // the batch rule: at most MAX_BATCH ids
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = runs.iter().map(RunId::as_str).collect();
        let rows = call!(self, |conn| {
            self.read_all(conn, sqlx::query(&self.sql.inspect_many).bind(&ids))
                .await
        })?;
        if rows.len() != runs.len() {
            return Err(PgError::Failed(format!(
                "inspect_many returned {} rows for {} ids",
                rows.len(),
                runs.len()
            ))
            .into());
        }
        runs.iter()
            .zip(&rows)
            .map(|(run, row)| {
                Ok(match get::<Option<String>>(row, "run_id")? {
                    Some(_) => Ok(record(row)?),
                    None => Err(Error::NotFound { run: run.clone() }),
                })
            })
            .collect()
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        check_list(filter)?;
        let rows = call!(self, |conn| {
            self.read_all(
                conn,
                sqlx::query(&self.sql.list)
                    .bind(filter.state.map(RunState::as_str))
                    .bind(filter.expired)
                    .bind(filter.after.as_ref().map(RunId::as_str))
                    .bind(filter.limit as i64)
                    .bind(filter.kind.as_ref().map(Kind::as_str)),
            )
            .await
        })?;
        Ok(rows.iter().map(record).collect::<Result<_, _>>()?)
    }

    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        lease_core::backend::check_end_batch(ends)?;
        if ends.is_empty() {
            return Ok(Vec::new());
        }
        let results = call!(self, |conn| self.end_batch(conn, ends).await)?;
        if let Some(notifier) = &self.notifier {
            notifier.claimable_all(
                ends.iter()
                    .zip(&results)
                    .filter(|(ending, result)| {
                        result.is_ok()
                            && matches!(
                                ending.end,
                                End::Release | End::RetryAfter(_) | End::AttemptFailed { .. }
                            )
                    })
                    .map(|(ending, _)| (ending.lease.kind(), ending.end.delay_millis())),
            );
        }
        Ok(results)
    }

    fn takes_effect(&self, effect: &lease_core::Effect) -> bool {
        effect.is::<crate::PgEffect>()
    }

    async fn end_many_with_effects(
        &self,
        ends: &[Ending],
        effects: &[Option<lease_core::Effect>],
    ) -> Result<Vec<Result<()>>> {
        self.end_with_effects(ends, effects).await
    }

    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>> {
        lease_core::backend::check_create_batch(runs)?;
        let runs: Vec<NewRun> = runs.iter().cloned().map(NewRun::new).collect();
        self.create_many_with(&runs).await
    }

    async fn purge(&self, older_than: Duration, max: usize) -> Result<Vec<RunId>> {
        self.purge_ended(lease_core::EndedStates::ALL, older_than, max)
            .await
    }

    async fn purge_ended(
        &self,
        states: lease_core::EndedStates,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<RunId>> {
        check_purge(older_than, max)?;
        let states = states.names();
        let rows = call!(self, |conn| {
            self.write_all(
                conn,
                sqlx::query(&self.sql.purge)
                    .bind(older_than.as_millis() as i64) // at most MAX_PURGE_AGE, checked
                    .bind(max as i64)
                    .bind(&states),
            )
            .await
        })?;
        rows.iter()
            .map(|row| Ok(RunId::new(get::<String>(row, "run_id")?).map_err(corrupt)?))
            .collect()
    }

    async fn purge_ids(&self, runs: &[RunId]) -> Result<Vec<RunId>> {
        lease_core::backend::check_create_batch(runs)?;
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = runs.iter().map(RunId::as_str).collect();
        let rows = call!(self, |conn| {
            self.write_all(conn, sqlx::query(&self.sql.purge_ids).bind(&ids))
                .await
        })?;
        rows.iter()
            .map(|row| Ok(RunId::new(get::<String>(row, "run_id")?).map_err(corrupt)?))
            .collect()
    }

    async fn count(&self) -> Result<lease_core::RunCounts> {
        let row = call!(self, |conn| {
            let query = sqlx::query(&self.sql.count).bind(lease_core::MAX_COUNT as i64);
            self.read_all_without_jit(conn, query).await
        })?
        .into_iter()
        .next()
        .ok_or_else(|| PgError::Failed("count returned no row".to_owned()))?;
        let figure = |name: &str| -> Result<u64> {
            let n: i64 = get(&row, name)?;
            Ok(u64::try_from(n).map_err(corrupt)?)
        };
        let mut counts = lease_core::RunCounts::default();
        counts.claimable = figure("claimable")?;
        counts.held = figure("held")?;
        counts.delayed = figure("delayed")?;
        counts.suspended = figure("suspended")?;
        counts.completed = figure("completed")?;
        counts.failed = figure("failed")?;
        counts.cancelled = figure("cancelled")?;
        let oldest: Option<i64> = get(&row, "oldest_claimable_us")?;
        counts.oldest_claimable_age =
            oldest.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)));
        let longest: Option<i64> = get(&row, "longest_held_us")?;
        counts.longest_held =
            longest.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)));
        Ok(counts)
    }

    async fn count_kinds(&self) -> Result<Vec<lease_core::KindCounts>> {
        let rows = call!(self, |conn| {
            let query = sqlx::query(&self.sql.count_kinds)
                .bind(lease_core::MAX_COUNT as i64)
                .bind(lease_core::MAX_KINDS_COUNTED as i64);
            self.read_all_without_jit(conn, query).await
        })?;
        rows.iter()
            .map(|row| {
                let figure = |name: &str| -> Result<u64> {
                    Ok(u64::try_from(get::<i64>(row, name)?).map_err(corrupt)?)
                };
                let lag: Option<i64> = get(row, "oldest_claimable_us")?;
                Ok(lease_core::KindCounts::new(
                    kind(row)?,
                    figure("runnable")?,
                    figure("claimable")?,
                    lag.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))),
                ))
            })
            .collect()
    }

    fn wakes(&self) -> Option<lease_core::Wakes> {
        let listening = self.listening.as_ref()?;
        Some(crate::wake::wakes(listening, &self.route.own, &self.schema))
    }

    async fn count_purgeable(&self, older_than: Duration) -> Result<u64> {
        check_purge(older_than, 1)?;
        let row = call!(self, |conn| {
            self.read_opt(
                conn,
                sqlx::query(&self.sql.count_purgeable).bind(older_than.as_millis() as i64),
            )
            .await
        })?;
        let n: i64 = match row {
            Some(row) => get(&row, "n")?,
            None => 0,
        };
        Ok(u64::try_from(n).map_err(corrupt)?)
    }

    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        let record = call!(self, |conn| {
            self.record_write(
                conn,
                &self.sql.force_release,
                run,
                None,
                |current| match current {
                    None => Some(Error::NotFound { run: run.clone() }),
                    Some(r) if r.state == RunState::Suspended => {
                        Some(Error::Suspended { run: run.clone() })
                    }
                    Some(r) if r.state == RunState::Completed => {
                        Some(Error::Completed { run: run.clone() })
                    }
                    Some(r) if r.state == RunState::Failed => {
                        Some(Error::Failed { run: run.clone() })
                    }
                    Some(r) if r.state == RunState::Cancelled => {
                        Some(Error::Cancelled { run: run.clone() })
                    }
                    Some(_) => None,
                },
            )
            .await
        })?;
        self.claimable_now(&record);
        Ok(record)
    }

    async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        lease_core::backend::check_reason(reason)?;
        call!(self, |conn| {
            for _ in 0..ATTEMPTS {
                let query = sqlx::query(&self.sql.cancel)
                    .bind(run.as_str())
                    .bind(reason)
                    .bind(lease_core::attempt_error(reason));
                if let Some(row) = self.write_opt(conn, query).await? {
                    return Ok(record(&row)?);
                }
                match self.inspect_on(conn, run).await?.state {
                    RunState::Completed => return Err(Error::Completed { run: run.clone() }),
                    RunState::Cancelled => {
                        // A retried cancel (or a second one): the run must be as durable
                        // as if this call had cancelled it. Read again after the wait.
                        self.route.confirm_seen(conn).await?;
                        return self.inspect_on(conn, run).await;
                    }
                    // Changed between the two statements: try again.
                    _ => {}
                }
            }
            Err(Self::raced(run))
        })
    }
}

/// A start delay as the statements take it: whole milliseconds, rounded up (checked, so at
/// most 30 days).
pub(crate) fn millis(new: &NewRun) -> i64 {
    i64::try_from(new.delay_millis()).unwrap_or(i64::MAX)
}

/// The columns `sql/create_many.sql` takes for a batch: ids, start delays, payloads, kinds,
/// run_at times and priorities.
pub(crate) type CreateColumns<'a> = (
    Vec<&'a str>,
    Vec<i64>,
    Vec<Option<&'a [u8]>>,
    Vec<&'a str>,
    Vec<Option<i64>>,
    Vec<i16>,
);

/// The columns of `runs` for `sql/create_many.sql`.
pub(crate) fn create_many_columns(runs: &[NewRun]) -> CreateColumns<'_> {
    (
        runs.iter().map(|n| n.run().as_str()).collect(),
        runs.iter().map(millis).collect(),
        runs.iter().map(NewRun::payload).collect(),
        runs.iter().map(|n| n.kind().as_str()).collect(),
        runs.iter().map(NewRun::run_at_micros).collect(),
        runs.iter().map(|n| i16::from(n.priority())).collect(),
    )
}
