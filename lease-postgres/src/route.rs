//! Which server the store talks to: the primary among the configured hosts, on two pools —
//! the store's own sessions, never handed out, and the caller's — each new connection of
//! either checked before use. What a write must wait for is in `durable.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::Row;

use crate::config::{Parsed, PostgresConfig};
use crate::error::PgError;
use crate::pooler::Pinned;

const CHECK_SERVER: &str = include_str!("../sql/check_server.sql");

/// The hosts, the one in use, the pools on it, and the durability the store demands.
pub(crate) struct Route {
    /// The store's own statements. Never handed to a caller, so no caller's `SET` (a
    /// session-level `synchronous_commit = off`) can change how the store's writes commit,
    /// and the store may cancel these sessions' waits for standbys (they carry `app_name`).
    pub(crate) own: PgPool,
    /// The caller's statements ([`PostgresLeaseStore::pool`](crate::PostgresLeaseStore::pool),
    /// fenced transactions), checked as the store's own; the store never cancels their waits
    /// wholesale, only the one wait of a fenced transaction it commits itself.
    pub(crate) caller: PgPool,
    pub(crate) hosts: Vec<PgConnectOptions>,
    /// The caller pool's options for each of `hosts`: not silent when wake-ups are on, and
    /// with the server's JIT setting.
    caller_hosts: Vec<PgConnectOptions>,
    pub(crate) current: AtomicUsize,
    /// When the store last moved to another host; older connections are discarded.
    switched_at: Mutex<Instant>,
    pub(crate) sync_replicas: u32,
    pub(crate) sync_timeout: Duration,
    /// Why the last new connection was refused, so a pool timeout can say it.
    refusal: Mutex<Option<PgError>>,
    /// The `application_name` of the store's own sessions, to find their waits on a standby.
    pub(crate) app_name: String,
    /// Accept a server that can lose an acknowledged commit (`volatile=true`).
    volatile: bool,
    /// Accept standbys that acknowledge nothing (`async_standbys=accept`).
    async_standbys: bool,
    /// The settings accepted under `volatile` or `async_standbys`, for `Display` and the one
    /// warning.
    accepted: Mutex<Vec<String>>,
    warned: AtomicBool,
    /// Whether a connection ever passed the checks: a setting that goes missing afterwards
    /// (a promoted standby without `synchronous_standby_names`) is a retryable state of the
    /// server, not a configuration the store was pointed at.
    worked: AtomicBool,
    /// How many times the store moved to another host: a confirmation is valid only on the
    /// server that committed.
    switches: AtomicU64,
    /// The bound on one call of the store.
    pub(crate) call_timeout: Duration,
    /// The schema's binding to a cluster and timeline, checked on every new connection once
    /// the schema is migrated (`binding.rs`).
    pub(crate) binding: crate::binding::Binding,
    /// Behind a transaction pooler: what the store's transactions begin with (`pooler.rs`).
    pub(crate) pooled: Option<crate::pooler::Pooled>,
}

/// The settings every session of the store's own pool starts with, in its startup packet (no
/// round trip): every statement's wait for a row lock is bounded (fenced transactions tighten
/// it), and every commit waits for its flush (and, under `sync_replicas`, the standbys'),
/// whatever the server, database or role says. A `silent` session starts with
/// `lease.wake_ups = off`, which the `runs_wake` trigger reads: its writes notify nobody by
/// themselves. The store's own pool is always silent (with wake-ups, the store sends its own
/// writes' notifications after they commit, coalesced: [`Notifier`](crate::notify::Notifier));
/// the caller pool only without wake-ups. Checked on every new connection.
fn session(
    options: PgConnectOptions,
    lock_wait: &str,
    app_name: &str,
    silent: bool,
) -> PgConnectOptions {
    let options = options.options([("lock_timeout", lock_wait), ("synchronous_commit", "on")]);
    let options = if silent {
        options.options([("lease.wake_ups", "off")])
    } else {
        options
    };
    options.application_name(app_name)
}

/// A session of the store's own pool: [`session`], silent, and with JIT compilation off. The
/// store's statements are index probes and bounded walks, each a millisecond or two, but a
/// generic plan costs a `LIMIT` it cannot see as a tenth of the table: `claim_next` on a
/// queue of 600,000 runs was costed above `jit_above_cost`, and each call spent ~450 ms
/// compiling itself (BENCHMARKS.md). The caller's pool keeps the server's setting: its
/// sessions run the caller's statements too.
fn own_session(options: PgConnectOptions, lock_wait: &str, app_name: &str) -> PgConnectOptions {
    session(options, lock_wait, app_name, true).options([("jit", "off")])
}

/// A session's options behind a transaction pooler: its name only, since the pooler refuses
/// startup `options` and would not keep session settings anyway; each transaction sets them
/// (`pooler.rs`).
fn pooled_session(options: PgConnectOptions, app_name: &str) -> PgConnectOptions {
    options.application_name(app_name)
}

impl Route {
    /// The pools and their checks; connects lazily.
    pub(crate) fn new(config: &PostgresConfig, parsed: Parsed) -> Arc<Route> {
        let app_name = app_name();
        let lock_wait = parsed.lock_wait.as_millis().to_string();
        let caller_name = format!("{app_name} caller");
        let (hosts, caller_hosts): (Vec<PgConnectOptions>, Vec<PgConnectOptions>) = parsed
            .hosts
            .iter()
            .map(|host| {
                if parsed.pooler {
                    (
                        pooled_session(host.clone(), &app_name),
                        pooled_session(host.clone(), &caller_name),
                    )
                } else {
                    (
                        own_session(host.clone(), &lock_wait, &app_name),
                        session(host.clone(), &lock_wait, &caller_name, !parsed.wake_ups),
                    )
                }
            })
            .unzip();
        let sizes = (config.max_connections, config.acquire_timeout);
        Arc::new_cyclic(|me: &Weak<Route>| {
            let pool = checked_pool(me, hosts[0].clone(), sizes);
            let caller = checked_pool(me, caller_hosts[0].clone(), sizes);
            Route::assemble(pool, caller, (hosts, caller_hosts), &parsed, app_name)
        })
    }

    /// A route over a pool the caller built: its one host, no host switching. The caller's
    /// pool serves the caller's statements (checked once here, by
    /// [`check_pooled`](Route::check_pooled)); the store's own statements run on a pool of the
    /// store's, made from the same connect options and checked on every new connection, so
    /// that nothing the caller does to a session can weaken a claim.
    pub(crate) fn over(caller: PgPool, config: &PostgresConfig, parsed: &Parsed) -> Arc<Route> {
        let app_name = app_name();
        let lock_wait = parsed.lock_wait.as_millis().to_string();
        let caller_host = (*caller.connect_options()).clone();
        let host = if parsed.pooler {
            pooled_session(caller_host.clone(), &app_name)
        } else {
            own_session(caller_host.clone(), &lock_wait, &app_name)
        };
        let sizes = (config.max_connections, config.acquire_timeout);
        Arc::new_cyclic(|me: &Weak<Route>| {
            let pool = checked_pool(me, host.clone(), sizes);
            let hosts = (vec![host], vec![caller_host]);
            Route::assemble(pool, caller, hosts, parsed, app_name)
        })
    }

    fn assemble(
        pool: PgPool,
        caller: PgPool,
        (hosts, caller_hosts): (Vec<PgConnectOptions>, Vec<PgConnectOptions>),
        parsed: &Parsed,
        app_name: String,
    ) -> Route {
        Route {
            own: pool,
            caller,
            hosts,
            caller_hosts,
            current: AtomicUsize::new(0),
            switched_at: Mutex::new(Instant::now()),
            sync_replicas: parsed.sync_replicas,
            sync_timeout: parsed.sync_timeout,
            refusal: Mutex::new(None),
            app_name,
            volatile: parsed.volatile,
            async_standbys: parsed.async_standbys,
            accepted: Mutex::new(Vec::new()),
            warned: AtomicBool::new(false),
            worked: AtomicBool::new(false),
            switches: AtomicU64::new(0),
            call_timeout: parsed.call_timeout,
            binding: crate::binding::Binding::default(),
            pooled: parsed.pooler.then(|| {
                crate::pooler::Pooled::new(
                    &parsed.lock_wait.as_millis().to_string(),
                    parsed.wake_ups,
                )
            }),
        }
    }

    /// Checks one connection of the caller's pool as every new connection of the store's own
    /// pool is checked.
    pub(crate) async fn check_pooled(&self) -> Result<(), PgError> {
        let mut conn = self.caller.acquire().await.map_err(|e| self.fail(e))?;
        match self.check_new(&mut conn).await {
            Ok(()) => Ok(()),
            Err(e) => {
                let refusal = self
                    .refusal
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                Err(refusal.unwrap_or_else(|| self.fail(e)))
            }
        }
    }

    /// The risky settings accepted (`volatile`, `async_standbys`); empty otherwise.
    pub(crate) fn accepted(&self) -> Vec<String> {
        self.accepted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether the store accepts every risk (`volatile=true`).
    pub(crate) fn is_volatile(&self) -> bool {
        self.volatile
    }

    /// How many times the store moved hosts so far.
    pub(crate) fn switches(&self) -> u64 {
        self.switches.load(Ordering::Acquire)
    }

    fn since_switch(&self) -> Duration {
        self.switched_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    /// `host:port` of the host in use, for messages.
    pub(crate) fn at(&self) -> String {
        let host = self.current_options();
        format!("{}:{}", host.get_host(), host.get_port())
    }

    /// The options of the host in use.
    pub(crate) fn current_options(&self) -> PgConnectOptions {
        self.hosts[self.current.load(Ordering::Acquire) % self.hosts.len()].clone()
    }

    /// Moves from host `from` to the next one (no-op if another caller moved already).
    fn advance(&self, from: usize) {
        if self.hosts.len() < 2 {
            return;
        }
        let next = (from + 1) % self.hosts.len();
        if self
            .current
            .compare_exchange(from, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.use_host(next);
        }
    }

    fn use_host(&self, index: usize) {
        self.current.store(index, Ordering::Release);
        self.switches.fetch_add(1, Ordering::AcqRel);
        *self.switched_at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        let host = &self.hosts[index];
        self.own.set_connect_options(host.clone());
        // The caller's own options for that host: the store's would make its sessions silent
        // (no wake-ups from the caller's writes) and take JIT away from its statements.
        self.caller
            .set_connect_options(self.caller_hosts[index].clone());
        tracing::warn!(
            host = %host.get_host(),
            port = host.get_port(),
            "lease-postgres: moving to another host"
        );
    }

    /// Looks for the primary among the hosts, with one direct connection each, and uses it.
    ///
    /// # Errors
    /// The last host's failure, or a retryable error if every reachable host is a standby.
    pub(crate) async fn find_primary(&self, timeout: Duration) -> Result<(), PgError> {
        use sqlx::{ConnectOptions, Connection};
        let start = self.current.load(Ordering::Acquire);
        let mut last = None;
        for step in 0..self.hosts.len() {
            let index = (start + step) % self.hosts.len();
            let options = &self.hosts[index];
            let mut conn = match tokio::time::timeout(timeout, options.connect()).await {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => {
                    last = Some(PgError::from(e));
                    continue;
                }
                Err(_) => {
                    last = Some(PgError::Unreachable(format!(
                        "no connection to {}:{} within {timeout:?}",
                        options.get_host(),
                        options.get_port()
                    )));
                    continue;
                }
            };
            let standby = async {
                let mut pinned = Pinned::on(&mut conn, self.own_begin()).await?;
                let standby = self
                    .query_scalar::<bool>("SELECT pg_is_in_recovery()")
                    .fetch_one(pinned.conn())
                    .await;
                pinned.finish(standby).await
            }
            .await;
            // Best effort: the server drops the session either way.
            let _ = conn.close().await;
            match standby {
                Ok(false) => {
                    if index != start {
                        self.use_host(index);
                    }
                    return Ok(());
                }
                Ok(true) => {
                    last = Some(PgError::Standby(format!(
                        "{}:{} is a standby (pg_is_in_recovery() is true)",
                        options.get_host(),
                        options.get_port()
                    )))
                }
                Err(e) => last = Some(PgError::from(e)),
            }
        }
        Err(match last {
            Some(PgError::Standby(_)) | None => PgError::Standby(format!(
                "none of the {} hosts is a primary; retry after a standby is promoted",
                self.hosts.len()
            )),
            Some(other) => other,
        })
    }

    /// The check every new connection passes before either pool hands it out: a primary, and
    /// — under `sync_replicas` — one with synchronous standbys configured and streaming, or
    /// — without it — one no standby replicates from (unless accepted); and, once the schema
    /// is migrated, the server the schema is bound to, on its timeline.
    async fn check_new(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        let mut pinned = Pinned::on(conn, self.own_begin()).await?;
        let checked = self.check_in(pinned.conn()).await;
        pinned.finish(checked).await
    }

    /// [`check_new`](Route::check_new), on `conn` as it is.
    async fn check_in(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        let row = self.query(CHECK_SERVER).fetch_one(&mut *conn).await?;
        let in_recovery: bool = row.try_get("in_recovery")?;
        let names: String = row.try_get("standby_names")?;
        let streaming: i64 = row.try_get("sync_standbys")?;
        let others: i64 = row.try_get("other_standbys")?;
        let fsync: String = row.try_get("fsync")?;
        let synchronous_commit: String = row.try_get("synchronous_commit")?;
        let index = self.current.load(Ordering::Acquire);
        let host = &self.hosts[index % self.hosts.len()];
        let at = format!("{}:{}", host.get_host(), host.get_port());
        let refusal = if in_recovery {
            // The pool tries again at once, on the next host.
            self.advance(index);
            Some(PgError::Standby(format!(
                "{at} is a standby (pg_is_in_recovery() is true), not the primary; retry once a \
                 primary is reachable"
            )))
        } else if let Some(restored) = self
            .binding
            .check(&mut *conn, &at, self.sync_replicas)
            .await?
        {
            // Is this primary the one the schema was bound to, on the same timeline
            // (`binding.rs`)? Before the standbys are counted: a failover under sync_replicas
            // is recorded even while the promoted server has no standby yet.
            Some(restored)
        } else if let Some(unsafe_setting) =
            self.durability(&at, &fsync, &synchronous_commit, streaming + others)
        {
            Some(unsafe_setting)
        } else if self.sync_replicas > 0 && names.trim().is_empty() {
            let message = format!(
                "sync_replicas={} but synchronous_standby_names is empty on {at}, so no commit \
                 waits for a standby: set synchronous_standby_names (for example 'ANY {} (*)') on \
                 the primary, or drop sync_replicas",
                self.sync_replicas, self.sync_replicas
            );
            // At connect a configuration mistake; later (a standby promoted without the
            // setting) a state the server can leave: each write is withheld, retryably.
            Some(if self.worked.load(Ordering::Acquire) {
                PgError::Busy(message)
            } else {
                PgError::Config(message)
            })
        } else if i64::from(self.sync_replicas) > streaming {
            Some(PgError::Busy(format!(
                "sync_replicas={} but only {streaming} synchronous standby(s) stream from {at} \
                 (pg_stat_replication); a claim could be lost on failover, so none is handed out \
                 until the standbys are back",
                self.sync_replicas
            )))
        } else {
            None
        };
        let mut slot = self.refusal.lock().unwrap_or_else(|e| e.into_inner());
        match refusal {
            None => {
                *slot = None;
                self.worked.store(true, Ordering::Release);
                Ok(())
            }
            Some(refusal) => {
                let message = refusal.to_string();
                *slot = Some(refusal);
                Err(sqlx::Error::Protocol(message))
            }
        }
    }

    /// The refusal for a server on which an acknowledged commit can be lost, unless the store
    /// accepted that risk (then the settings are recorded and warned about once).
    fn durability(
        &self,
        at: &str,
        fsync: &str,
        synchronous_commit: &str,
        standbys: i64,
    ) -> Option<PgError> {
        // (short name, sentence, whether `async_standbys=accept` covers it)
        let mut risks: Vec<(String, String, bool)> = Vec::new();
        if fsync != "on" {
            risks.push((
                "fsync off".to_owned(),
                format!(
                    "{at} runs with fsync = {fsync}: a crash of the machine can lose commits it \
                     acknowledged, and a lost claim's fence would be issued again; set fsync = \
                     on, or accept the risk with ?volatile=true"
                ),
                false,
            ));
        }
        let waits = match synchronous_commit {
            "on" | "remote_apply" => true,
            // Not even the local flush is waited for under `off`; under `local` and
            // `remote_write` the standbys' flush is not.
            "local" | "remote_write" => self.sync_replicas == 0,
            _ => false,
        };
        if !waits {
            risks.push((
                format!("synchronous_commit {synchronous_commit}"),
                format!(
                    "the store's sessions on {at} see synchronous_commit = {synchronous_commit} \
                     although the store sets it to on (an options parameter or a server override \
                     changed it), so a commit can be acknowledged before it is flushed{}; remove \
                     that setting, or accept the risk with ?volatile=true",
                    if self.sync_replicas > 0 {
                        " on the synchronous standbys"
                    } else {
                        ""
                    }
                ),
                false,
            ));
        }
        if self.sync_replicas == 0 && standbys > 0 {
            risks.push((
                "standbys without sync_replicas".to_owned(),
                format!(
                    "{standbys} standby(s) replicate from {at} (pg_stat_replication) and \
                     sync_replicas=0, so a claim is acknowledged before any standby has it: a \
                     standby promoted after a failure would issue its fence again; set \
                     sync_replicas=N (with synchronous_standby_names on the primary) so that N \
                     standbys hold every lease before it is handed out, or, for read replicas \
                     that are never promoted while this store runs, accept exactly this risk \
                     with ?async_standbys=accept"
                ),
                true,
            ));
        }
        let mut refused: Vec<String> = Vec::new();
        let mut taken: Vec<String> = Vec::new();
        for (setting, sentence, narrow) in risks {
            if self.volatile || (narrow && self.async_standbys) {
                taken.push(setting);
            } else {
                refused.push(sentence);
            }
        }
        if !refused.is_empty() {
            return Some(PgError::Config(refused.join("; also, ")));
        }
        if taken.is_empty() {
            return None;
        }
        let mut accepted = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        for setting in taken {
            if !accepted.contains(&setting) {
                accepted.push(setting);
            }
        }
        if !self.warned.swap(true, Ordering::AcqRel) {
            if self.volatile {
                tracing::warn!(
                    server = %at,
                    accepted = %accepted.join(", "),
                    "volatile mode: accepting postgres settings under which an acknowledged \
                     commit can be lost, so a fence may be issued twice after a crash"
                );
            } else {
                tracing::warn!(
                    server = %at,
                    accepted = %accepted.join(", "),
                    "async_standbys=accept: accepting standbys that acknowledge nothing, so a \
                     fence may be issued twice if one of them is promoted"
                );
            }
        }
        None
    }

    /// Folds a driver error into the adapter's, moving to another host when this one failed or
    /// is a standby, and explaining a pool timeout by the last refused connection.
    pub(crate) fn fail(&self, e: sqlx::Error) -> PgError {
        let timed_out = matches!(e, sqlx::Error::PoolTimedOut);
        // A pool timing out with every connection in use is exhausted, not cut off from its host.
        let exhausted = timed_out && self.own.size() >= self.own.options().get_max_connections();
        let e = PgError::from(e);
        if let PgError::Unreachable(_) | PgError::Standby(_) = &e {
            if !exhausted {
                self.advance(self.current.load(Ordering::Acquire));
            }
        }
        if timed_out {
            let refusal = self.refusal.lock().unwrap_or_else(|e| e.into_inner());
            match &*refusal {
                Some(PgError::Config(m)) => return PgError::Config(m.clone()),
                Some(PgError::Busy(m) | PgError::Standby(m)) => {
                    return PgError::Busy(format!("no usable connection: {m}"))
                }
                _ => {}
            }
        }
        e
    }
}

/// A name for the store's own sessions, unique per store in the process.
fn app_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "lease-postgres {}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A lazily connecting pool on `host` whose every new connection passes
/// [`check_new`](Route::check_new), and which discards connections made before the store last
/// moved hosts.
fn checked_pool(
    me: &Weak<Route>,
    host: PgConnectOptions,
    (max, acquire): (u32, Duration),
) -> PgPool {
    let (checked, fresh) = (me.clone(), me.clone());
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(acquire)
        // sqlx pings every connection it hands out by default: one extra round trip per
        // operation (60-70 us on loopback, measured by `lease bench`). A connection that died
        // meanwhile fails its statement instead, as `Unavailable`, and is discarded.
        .test_before_acquire(false)
        .after_connect(move |conn, _| {
            let route = checked.clone();
            Box::pin(async move {
                match route.upgrade() {
                    Some(route) => route.check_new(conn).await,
                    None => Ok(()),
                }
            })
        })
        .before_acquire(move |_, meta| {
            // A connection made before the store moved hosts may be on the old primary.
            let keep = fresh
                .upgrade()
                .is_none_or(|route| meta.age < route.since_switch());
            Box::pin(async move { Ok(keep) })
        })
        .connect_lazy_with(host)
}
