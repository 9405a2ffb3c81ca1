//! `RedisLeaseStore`: the `LeaseStore` contract as Lua scripts run atomically by Redis.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lease_core::backend::{
    check_claim_max, check_create_batch, check_end_batch, check_new_runs, check_payload,
    check_renew_batch, claim_refusal, fenced_verdict,
};
use lease_core::{
    End, Ending, Error, IdempotencyKey, JournalEntry, Kind, Lease, LeaseStore, ListFilter, NewRun,
    Queue, Result, RunId, RunRecord, RunState, StoreTime, Ttl, WorkerId,
};

use crate::call::{call_id, Ack, Call};
use crate::config::RedisConfig;
use crate::epoch::Epoch;
use crate::error::RedisError;
use crate::guard::Guard;
use crate::keys::{self, Class, Keys};
use crate::link::{lock, Link};
use crate::reply::Reply;
use lease_runtime::observe::count_stale;

/// How many run ids one `list` script call examines at most, whatever its filter keeps: the
/// bound on the work one call asks of the server.
pub(crate) const LIST_SCAN: usize = 1000;

/// How many index entries one `claim_next` script call may examine that turn out not to be
/// claimable (stale entries it removes or moves): the bound on one call's extra work. A claim
/// that meets more calls the script again, so behind `n` stale entries it makes at least
/// `n / CLAIM_NEXT_SCAN` calls, each of bounded server time.
pub const CLAIM_NEXT_SCAN: usize = 128;

/// The most runs one purge script call removes: the bound on its server time (a few ms).
pub(crate) const PURGE_SCRIPT_RUNS: usize = 100;

/// The most entries of the ended index one purge of some ended states (not all) looks at per
/// script call, those of other states passed over included: the bound on its server time.
pub(crate) const PURGE_SCAN: usize = 2_000;

/// Where purges of some ended states look from: see [`RedisLeaseStore::purge_runs`].
pub(crate) type PurgeFrom = std::collections::HashMap<u8, (String, String)>;

/// How many payload bytes one `journal` script call returns at most (beyond its last entry):
/// the bound on one call's copy of a long journal.
const JOURNAL_PAGE_BYTES: usize = 4 << 20;

/// How many times a call is sent again with a run's actual kind, after a script answered that
/// the run is of another kind than the call presumed (only if the id was purged and created
/// again with yet another kind in between would a second resend be needed).
pub(crate) const KIND_RESENDS: usize = 3;

mod api;
mod scripts;

use api::needs_ack;
pub(crate) use scripts::SCRIPTS;

/// A [`LeaseStore`] on Redis: each operation is one Lua script, judged on the server's clock
/// (`TIME`), with fences incremented inside the claim script.
///
/// All keys of a namespace share one hash tag, so every script touches one Cluster slot, and
/// every script declares every key it touches; see the [crate docs](crate) for the layout.
/// Connects to one server, a Cluster or a Sentinel-managed primary (see [`RedisConfig`]) over a
/// multiplexed connection that is made anew, and checked again by the durability guard, after
/// a failure. Response and connection timeouts make a dead server give retryable errors
/// ([`Error::Unavailable`]) rather than hangs.
#[derive(Clone)]
pub struct RedisLeaseStore {
    pub(crate) link: Arc<Link>,
    pub(crate) keys: Keys,
    config: RedisConfig,
    /// The store's wake-ups; `None` when they are off (`wake_ups=false`).
    listening: Option<Arc<lease_runtime::WakeListener>>,
    /// Per set of ended states purged (not all of them), the score and member of the last
    /// entry of the ended index the purges passed over before any candidate: the next purge
    /// looks after it.
    pub(crate) purge_from: Arc<std::sync::Mutex<PurgeFrom>>,
    /// The kinds whose last `claim_next` found nothing: the next one first asks, with one
    /// `EXISTS`, whether any of the kind's claimable indexes (or the restore marker) is there.
    pub(crate) idle_kinds: Arc<std::sync::Mutex<std::collections::HashSet<Kind>>>,
}

impl RedisLeaseStore {
    /// Connects with `config` and checks the durability guard (see
    /// [`RedisConfig::with_volatile`]): a server on which an acknowledged claim can be lost is
    /// refused. The guard runs again on every new connection, so a server that was restarted
    /// or replaced with unsafe settings stops this store's operations (and cancels the scopes
    /// renewing through it) with [`Error::Misconfigured`].
    ///
    /// # Errors
    /// [`Error::Unavailable`] if the server cannot be reached; [`Error::Misconfigured`] for an
    /// unusable URL (an unknown parameter, a Cluster node behind a plain URL) or namespace, or
    /// unsafe durability settings, each in one sentence naming the setting and the fix;
    /// [`Error::Backend`] for a rejected password.
    pub async fn connect(config: RedisConfig) -> Result<RedisLeaseStore> {
        config.check()?;
        Self::open(config, None, true).await
    }

    /// The store over `config`, checked, on its own client or the caller's; with `enforce`,
    /// a restored namespace is refused (`epoch.rs`).
    pub(crate) async fn open(
        config: RedisConfig,
        client: Option<redis::Client>,
        enforce: bool,
    ) -> Result<RedisLeaseStore> {
        let keys = Keys::new(config.namespace());
        let epoch = Epoch::new(&keys, &config, enforce);
        let link =
            Link::connect(&config, Guard::new(&config), epoch, keys.barrier(), client).await?;
        let store = RedisLeaseStore {
            link: Arc::new(link),
            keys,
            listening: config
                .wake_ups()
                .then(|| Arc::new(lease_runtime::WakeListener::new())),
            config,
            purge_from: Arc::default(),
            idle_kinds: Arc::default(),
        };
        store.fold_tombstones().await?;
        Ok(store)
    }

    /// A store on the single server of the caller's `client`, with every other setting of
    /// `config` (namespace, `replicas` and their timeout, response and connect timeouts,
    /// `volatile`); the guard runs as in [`connect`](RedisLeaseStore::connect). The store opens
    /// its own connections from the client (one shared, and one per concurrent acknowledged
    /// write), so it never interleaves with the caller's commands.
    ///
    /// `config` is [`RedisConfig::for_client`], or a `redis://` config whose parameters apply
    /// and whose address is replaced by the client's. A Cluster or Sentinel needs the store's
    /// own client, configured not to resend writes: connect with a `redis+cluster://` or
    /// `redis+sentinel://` URL.
    ///
    /// ```no_run
    /// # async fn demo() -> lease_core::Result<()> {
    /// use lease_redis::{redis, RedisConfig, RedisLeaseStore};
    /// let client = redis::Client::open("redis://cache:6379").expect("a valid URL");
    /// let store =
    ///     RedisLeaseStore::from_client(client, RedisConfig::for_client().with_namespace("jobs"))
    ///         .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`connect`](RedisLeaseStore::connect); [`Error::Misconfigured`] for a Cluster or
    /// Sentinel `config`.
    pub async fn from_client(
        client: redis::Client,
        config: RedisConfig,
    ) -> Result<RedisLeaseStore> {
        config.check()?;
        let config = config.with_client_address(&client)?;
        Self::open(config, Some(client), true).await
    }

    /// [`connect`](RedisLeaseStore::connect) with [`RedisConfig::from_url`].
    ///
    /// # Errors
    /// As [`connect`](RedisLeaseStore::connect).
    pub async fn from_url(url: &str) -> Result<RedisLeaseStore> {
        Self::connect(RedisConfig::from_url(url)).await
    }

    /// The unsafe durability settings this store accepted because it is
    /// [volatile](RedisConfig::with_volatile) (for example `appendfsync everysec`) or accepts
    /// [replicas that acknowledge nothing](RedisConfig::with_async_replicas_accepted)
    /// (`replicas without replicas=N`); empty when nothing risky was accepted. Also shown by
    /// `Display`.
    pub fn accepted_risks(&self) -> Vec<String> {
        self.link.guard().accepted()
    }

    /// The configuration this store was built from.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// A key for the caller's own data about `run`, named `name`, in the run's hash slot: the
    /// keys a [`FencedScript`](crate::FencedScript) may touch. Distinct runs and names give distinct keys.
    pub fn script_key(&self, run: &RunId, name: &str) -> String {
        self.keys.user(run, name)
    }

    /// Whether the last `claim_next` of `kind` found nothing.
    pub(crate) fn was_idle(&self, kind: &Kind) -> bool {
        lock(&self.idle_kinds).contains(kind)
    }

    pub(crate) fn set_idle(&self, kind: &Kind, idle: bool) {
        let mut idle_kinds = lock(&self.idle_kinds);
        if idle {
            idle_kinds.insert(kind.clone());
        } else {
            idle_kinds.remove(kind);
        }
    }

    /// Whether any of a kind's claimable `indexes` or the restore marker is there (`EXISTS`;
    /// an emptied sorted set is deleted). Read-only, one command.
    pub(crate) async fn claimable_any(&self, indexes: &[String]) -> Result<bool> {
        let mut exists = redis::cmd("EXISTS");
        exists.arg(self.keys.restored()).arg(indexes);
        match self.link.command(&exists).await? {
            redis::Value::Int(n) => Ok(n > 0),
            other => Err(Error::backend(
                crate::error::BACKEND,
                format!("EXISTS answered {other:?}"),
            )),
        }
    }

    /// Runs a script that writes nothing (or nothing replicas must confirm).
    pub(crate) async fn read(
        &self,
        script: &'static str,
        call: &Call<'_>,
    ) -> Result<Reply, RedisError> {
        Reply::new(script, self.link.read(call).await?)
    }

    /// Runs the writing script `build` makes for `kind`, the kind the caller presumes its run
    /// is of, and again for the run's actual kind while the script answers `{'kind', actual}`
    /// (written nothing). Returns the reply, what the replicas acknowledged and the run's kind.
    pub(crate) async fn write_kinded<'a>(
        &self,
        script: &'static str,
        kind: &Class,
        build: impl Fn(&Class) -> Call<'a>,
    ) -> Result<(Reply, Ack, Class)> {
        let mut kind = kind.clone();
        for _ in 0..=KIND_RESENDS {
            let (reply, ack) = self.write(script, &build(&kind)).await?;
            if reply.status().ok() != Some("kind") {
                return Ok((reply, ack, kind));
            }
            kind = reply.class(1)?;
        }
        Err(Error::backend(
            crate::error::BACKEND,
            format!("{script}: the run's kind changed {KIND_RESENDS} times during the call"),
        ))
    }

    /// Runs a writing script; returns its reply and what the replicas acknowledged, to
    /// [`confirm`](Ack::confirm) before any answer is reported.
    pub(crate) async fn write(
        &self,
        script: &'static str,
        call: &Call<'_>,
    ) -> Result<(Reply, Ack), RedisError> {
        let (value, ack) = self.link.write(call).await?;
        Ok((Reply::new(script, value)?, ack))
    }

    /// Turns a fenced script's `ok` / `none` / `verdict` reply into the contract's answer.
    pub(crate) fn status(&self, lease: &Lease, reply: &Reply) -> Result<()> {
        match reply.status()? {
            "ok" => Ok(()),
            "none" => Err(Error::NotFound {
                run: lease.run().clone(),
            }),
            "verdict" => {
                let owned = reply.str(3)? == "1";
                count_stale(fenced_verdict(
                    lease.run(),
                    lease.fence(),
                    reply.fence(1)?,
                    reply.state(2)?,
                    owned,
                ))?;
                Err(reply
                    .bad("the script refused a write the verdict allows")
                    .into())
            }
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }

    /// `answer`, once the replicas hold what it reports, if it reports something about the
    /// caller's own fence: a write applied (now, or by an earlier attempt whose reply was
    /// lost) or a lease ended under that fence, which a retrying caller takes as its own
    /// commit. A retry never confirms less than the first attempt.
    pub(crate) fn confirmed<T>(&self, answer: Result<T>, ack: &Ack) -> Result<T> {
        if needs_ack(&answer) {
            ack.confirm()?;
        }
        answer
    }

    /// The refusal of a claiming script that found the namespace marked restored
    /// (`{'restored', why}`); the store's next call checks a new connection, which refuses
    /// too until the namespace is rebound (`epoch.rs`).
    fn restored(&self, reply: &Reply) -> Error {
        self.link.recheck();
        let why = reply.str(1).unwrap_or("marked restored");
        self.link.epoch().refusal(why).into()
    }

    /// The lease of a claim reply's fence, expiry and attempts from `i` (its payload, in the
    /// reply after them, is added by the caller).
    fn lease(
        &self,
        run: RunId,
        worker: &WorkerId,
        ttl: Ttl,
        reply: &Reply,
        i: usize,
    ) -> Result<Lease> {
        Ok(Lease::new(
            run,
            worker.clone(),
            reply.fence(i)?,
            ttl,
            reply.time(i + 1)?,
        )
        .map_err(|e| reply.bad(e.to_string()))?
        .with_attempt(reply.parse(i + 2)?))
    }

    async fn fenced(&self, lease: &Lease, op: &str, payload: &[u8]) -> Result<Reply> {
        let run = lease.run();
        let id = call_id();
        let (reply, ack, _) = self
            .write_kinded("fenced", &Class::of_lease(lease), |kind| {
                let mut call = Call::new(&SCRIPTS.fenced);
                call.key(self.keys.runs())
                    .key(self.keys.journal(run))
                    .key(self.keys.claimable_of(kind))
                    .key(self.keys.calls(run))
                    .key(self.keys.ended())
                    .key(self.keys.suspended())
                    .key(self.keys.attempts())
                    .key(self.keys.kinds())
                    .key(self.keys.history())
                    .arg(op)
                    .arg(keys::encode(run.as_str()))
                    .arg(lease.fence().get())
                    .arg(payload)
                    .arg(&id)
                    .arg(kind.arg());
                call
            })
            .await?;
        self.confirmed(self.status(lease, &reply), &ack)?;
        Ok(reply)
    }

    /// A record reply (`ok` or `refused`, then state, owner, expiry, fence, heartbeats,
    /// failure, now).
    pub(crate) fn record(&self, run: &RunId, reply: &Reply) -> Result<RunRecord> {
        let now = reply.time(1 + Reply::RECORD_FIELDS)?;
        Ok(reply.record(run.clone(), 1, now)?)
    }
}

impl fmt::Debug for RedisLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLeaseStore")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for RedisLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.config, f)?;
        let accepted = self.accepted_risks();
        if !accepted.is_empty() {
            write!(
                f,
                " [{}accepts {}; a fence may be issued twice]",
                if self.config.is_volatile() {
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
