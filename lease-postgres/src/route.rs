//! Which server the store talks to: the primary among the configured hosts, checked on every
//! new connection, and — under `sync_replicas` — whether a commit reached its standbys.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::Row;

use crate::config::{Parsed, PostgresConfig};
use crate::error::PgError;

const CHECK_SERVER: &str = include_str!("../sql/check_server.sql");
const SYNC_ACKED: &str = include_str!("../sql/sync_acked.sql");
const CANCEL_SYNC_WAITS: &str = include_str!("../sql/cancel_sync_waits.sql");

/// The hosts, the one in use, the pool on it, and the durability the store demands.
pub(crate) struct Route {
    pub(crate) pool: PgPool,
    hosts: Vec<PgConnectOptions>,
    current: AtomicUsize,
    /// When the store last moved to another host; older connections are discarded.
    switched_at: Mutex<Instant>,
    pub(crate) sync_replicas: u32,
    pub(crate) sync_timeout: Duration,
    /// Why the last new connection was refused, so a pool timeout can say it.
    refusal: Mutex<Option<PgError>>,
    /// This store's `application_name`, to find its own sessions waiting on a standby.
    app_name: String,
    /// Accept a server that can lose an acknowledged commit (`volatile=true`).
    volatile: bool,
    /// The settings accepted under `volatile`, for `Display` and the one warning.
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
}

impl Route {
    /// The pool and its checks; connects lazily.
    pub(crate) fn new(config: &PostgresConfig, parsed: Parsed) -> Arc<Route> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let app_name = format!(
            "lease-postgres {}.{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let lock_wait = parsed.lock_wait.as_millis().to_string();
        let hosts: Vec<PgConnectOptions> = parsed
            .hosts
            .into_iter()
            .map(|host| {
                // Session settings ride in the startup packet: no round trip. Every statement's
                // wait for a row lock is bounded; fenced transactions tighten it with SET LOCAL.
                // synchronous_commit = on whatever the server, database or role says: a
                // commit is acknowledged only once its WAL is flushed (and, under
                // sync_replicas, on the standbys). Checked on every new connection.
                let host = host.options([
                    ("lock_timeout", lock_wait.as_str()),
                    ("synchronous_commit", "on"),
                ]);
                if parsed.sync_replicas > 0 {
                    host.application_name(&app_name)
                } else {
                    host
                }
            })
            .collect();
        Arc::new_cyclic(|me: &Weak<Route>| {
            let (checked, fresh) = (me.clone(), me.clone());
            let pool = PgPoolOptions::new()
                .max_connections(config.max_connections)
                .acquire_timeout(config.acquire_timeout)
                // sqlx pings every connection it hands out by default: one extra round trip per
                // operation (60-70 us on loopback, measured by `lease bench`). A connection that
                // died meanwhile fails its statement instead, as `Unavailable`, and is discarded.
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
                .connect_lazy_with(hosts[0].clone());
            Route {
                pool,
                hosts,
                current: AtomicUsize::new(0),
                switched_at: Mutex::new(Instant::now()),
                sync_replicas: parsed.sync_replicas,
                sync_timeout: parsed.sync_timeout,
                refusal: Mutex::new(None),
                app_name,
                volatile: parsed.volatile,
                accepted: Mutex::new(Vec::new()),
                warned: AtomicBool::new(false),
                worked: AtomicBool::new(false),
                switches: AtomicU64::new(0),
                call_timeout: parsed.call_timeout,
            }
        })
    }

    /// A route over a pool the caller built: its one host, the durability `parsed` demands
    /// (checked by [`check_pooled`](Route::check_pooled)), no host switching. Its sessions are
    /// the caller's, without an `application_name` of the store's: a standby wait past the
    /// sync timeout is not cancelled on the server but given up as `Busy`.
    pub(crate) fn over(pool: PgPool, parsed: &Parsed) -> Arc<Route> {
        Arc::new(Route {
            hosts: vec![(*pool.connect_options()).clone()],
            pool,
            current: AtomicUsize::new(0),
            switched_at: Mutex::new(Instant::now()),
            sync_replicas: parsed.sync_replicas,
            sync_timeout: parsed.sync_timeout,
            refusal: Mutex::new(None),
            app_name: String::new(),
            volatile: parsed.volatile,
            accepted: Mutex::new(Vec::new()),
            warned: AtomicBool::new(false),
            worked: AtomicBool::new(false),
            switches: AtomicU64::new(0),
            call_timeout: parsed.call_timeout,
        })
    }

    /// Checks one connection of a caller's pool as every new connection of the store's own
    /// pool is checked.
    pub(crate) async fn check_pooled(&self) -> Result<(), PgError> {
        let mut conn = self.pool.acquire().await.map_err(|e| self.fail(e))?;
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

    /// The unsafe settings accepted because the store is volatile; empty otherwise.
    pub(crate) fn accepted(&self) -> Vec<String> {
        self.accepted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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
        self.pool.set_connect_options(self.hosts[index].clone());
        tracing::warn!(
            host = %self.hosts[index].get_host(),
            port = self.hosts[index].get_port(),
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
            let standby = sqlx::query_scalar::<_, bool>("SELECT pg_is_in_recovery()")
                .fetch_one(&mut conn)
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

    /// The check every new connection passes before the pool hands it out: a primary, and —
    /// under `sync_replicas` — one with synchronous standbys configured and streaming.
    async fn check_new(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        let row = sqlx::query(CHECK_SERVER).fetch_one(&mut *conn).await?;
        let in_recovery: bool = row.try_get("in_recovery")?;
        let names: String = row.try_get("standby_names")?;
        let streaming: i64 = row.try_get("sync_standbys")?;
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
        } else if let Some(unsafe_setting) = self.durability(&at, &fsync, &synchronous_commit) {
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
    /// is volatile (then the settings are recorded and warned about once).
    fn durability(&self, at: &str, fsync: &str, synchronous_commit: &str) -> Option<PgError> {
        let mut risks = Vec::new();
        if fsync != "on" {
            risks.push((
                "fsync off".to_owned(),
                format!(
                    "{at} runs with fsync = {fsync}: a crash of the machine can lose commits it \
                     acknowledged, and a lost claim's fence would be issued again; set fsync = \
                     on, or accept the risk with ?volatile=true"
                ),
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
            ));
        }
        if risks.is_empty() {
            return None;
        }
        if !self.volatile {
            let sentences: Vec<String> = risks.into_iter().map(|(_, s)| s).collect();
            return Some(PgError::Config(sentences.join("; also, ")));
        }
        let mut accepted = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        for (setting, _) in risks {
            if !accepted.contains(&setting) {
                accepted.push(setting);
            }
        }
        if !self.warned.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                server = %at,
                accepted = %accepted.join(", "),
                "volatile mode: accepting postgres settings under which an acknowledged commit \
                 can be lost, so a fence may be issued twice after a crash"
            );
        }
        None
    }

    /// Folds a driver error into the adapter's, moving to another host when this one failed or
    /// is a standby, and explaining a pool timeout by the last refused connection.
    pub(crate) fn fail(&self, e: sqlx::Error) -> PgError {
        let timed_out = matches!(e, sqlx::Error::PoolTimedOut);
        // A pool timing out with every connection in use is exhausted, not cut off from its host.
        let exhausted = timed_out && self.pool.size() >= self.pool.options().get_max_connections();
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

    /// Runs a write, bounding its wait for synchronous standbys: past the sync timeout the
    /// wait is cancelled on the server (which then returns the commit as done locally, with a
    /// WARNING only), and [`confirm`](Route::confirm) decides.
    pub(crate) async fn bounded<T>(
        &self,
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
            self.cancel_sync_waits().await;
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

    /// Cancels this store's waits for standbys, on a direct connection to every host (the
    /// pool's new connections are refused while the standbys are missing, and the waiting
    /// write may be on a host the store has since moved away from). Only this store's own
    /// sessions (its `application_name`) waiting on a standby are touched.
    async fn cancel_sync_waits(&self) {
        use sqlx::{ConnectOptions, Connection};
        if self.app_name.is_empty() {
            // A caller's pool: its sessions cannot be told from other clients'.
            return;
        }
        let bound = self.sync_timeout.as_millis() as i64;
        for options in &self.hosts {
            // Best effort: if this fails too, the write's own connection is gone or will be.
            if let Ok(Ok(mut conn)) =
                tokio::time::timeout(self.sync_timeout, options.connect()).await
            {
                let _ = sqlx::query(CANCEL_SYNC_WAITS)
                    .bind(&self.app_name)
                    .bind(bound)
                    .fetch_all(&mut conn)
                    .await;
                let _ = conn.close().await;
            }
        }
    }

    /// Under `sync_replicas = N`: returns once N synchronous standbys of the server behind
    /// `conn` flushed everything it had flushed when the call began (so every commit that
    /// returned, or that the caller read, before it), or fails with a retryable error once
    /// the sync timeout, counted from `since` (when the write was sent), has passed; it looks
    /// at least once. Run on the connection that committed (or read) what it confirms, so no
    /// host switch can make another server answer. Without `sync_replicas`, at once.
    pub(crate) async fn confirm_on(
        &self,
        conn: &mut PgConnection,
        since: Instant,
    ) -> Result<(), PgError> {
        if self.sync_replicas == 0 {
            return Ok(());
        }
        let deadline = since + self.sync_timeout;
        let mut target: Option<String> = None;
        loop {
            let row = sqlx::query(SYNC_ACKED)
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

    /// [`confirm_on`](Route::confirm_on) after a commit whose connection is gone (a fenced
    /// transaction's): on a pooled connection, valid only if the store did not move hosts
    /// since `switches` was read before the commit.
    pub(crate) async fn confirm_after(&self, since: Instant, switches: u64) -> Result<(), PgError> {
        if self.sync_replicas == 0 {
            return Ok(());
        }
        let mut conn = self.pool.acquire().await.map_err(|e| self.fail(e))?;
        self.confirm_on(&mut conn, since).await?;
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
}
