//! `RedisLeaseStore`: the `LeaseStore` contract as Lua scripts run atomically by Redis.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use lease_core::backend::{
    check_claim_max, check_create_batch, check_end_batch, check_new_runs, check_payload,
    check_renew_batch, claim_refusal, fenced_verdict,
};
use lease_core::{
    End, Ending, Error, IdempotencyKey, JournalEntry, Kind, Lease, LeaseStore, ListFilter, NewRun,
    Result, RunId, RunRecord, RunState, StoreTime, Ttl, WorkerId,
};
use lease_runtime::observe::count_stale;

use crate::call::{call_id, Ack, Call, Lua};
use crate::config::RedisConfig;
use crate::epoch::Epoch;
use crate::error::RedisError;
use crate::guard::Guard;
use crate::keys::{self, Class, Keys};
use crate::link::Link;
use crate::reply::Reply;

/// How many run ids one `list` script call examines at most, whatever its filter keeps: the
/// bound on the work one call asks of the server.
pub(crate) const LIST_SCAN: usize = 1000;

/// How many index entries one `claim_next` script call may examine that turn out not to be
/// claimable (stale entries it removes or moves): the bound on one call's extra work.
const CLAIM_NEXT_SCAN: usize = 128;

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

macro_rules! lua {
    ($file:literal) => {
        concat!(
            include_str!("../lua/common.lua"),
            include_str!(concat!("../lua/", $file))
        )
    };
}

/// A hot script, without the common.lua prelude: building its helpers costs each call more
/// than the script's own work saves (see `tests/server_cpu.rs`).
macro_rules! lua_alone {
    ($file:literal) => {
        include_str!(concat!("../lua/", $file))
    };
}

/// A rebind script: common.lua, then the rebind helper, then the script.
macro_rules! lua_rebind {
    ($file:literal) => {
        concat!(
            include_str!("../lua/common.lua"),
            include_str!("../lua/rebind_prelude.lua"),
            include_str!(concat!("../lua/", $file))
        )
    };
}

/// Every script, built once per process; a call runs EVALSHA and loads it on NOSCRIPT.
pub(crate) struct Scripts {
    pub(crate) create: Lua,
    pub(crate) create_many: Lua,
    pub(crate) claim: Lua,
    pub(crate) claim_next: Lua,
    pub(crate) renew: Lua,
    pub(crate) fenced: Lua,
    pub(crate) end_many: Lua,
    pub(crate) append_keyed: Lua,
    pub(crate) resume: Lua,
    pub(crate) force_release: Lua,
    pub(crate) cancel: Lua,
    pub(crate) inspect: Lua,
    pub(crate) inspect_many: Lua,
    pub(crate) journal: Lua,
    pub(crate) list: Lua,
    pub(crate) purge_due: Lua,
    pub(crate) purge: Lua,
    pub(crate) fold_tombstones: Lua,
    pub(crate) count_purgeable: Lua,
    pub(crate) count: Lua,
    pub(crate) count_kinds: Lua,
    pub(crate) kinds: Lua,
    pub(crate) epoch: Lua,
    pub(crate) epoch_marker: Lua,
    pub(crate) rebind_begin: Lua,
    pub(crate) rebind_page: Lua,
    pub(crate) rebind_end: Lua,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    create: Lua::new(lua!("create.lua")),
    create_many: Lua::new(lua!("create_many.lua")),
    claim: Lua::new(lua_alone!("claim.lua")),
    claim_next: Lua::new(lua!("claim_next.lua")),
    renew: Lua::new(lua_alone!("renew.lua")),
    fenced: Lua::new(lua_alone!("fenced.lua")),
    end_many: Lua::new(lua!("end_many.lua")),
    append_keyed: Lua::new(lua_alone!("append_keyed.lua")),
    resume: Lua::new(lua!("resume.lua")),
    force_release: Lua::new(lua!("force_release.lua")),
    cancel: Lua::new(lua!("cancel.lua")),
    inspect: Lua::new(lua!("inspect.lua")),
    inspect_many: Lua::new(lua!("inspect_many.lua")),
    journal: Lua::new(lua!("journal.lua")),
    list: Lua::new(lua!("list.lua")),
    purge_due: Lua::new(lua!("purge_due.lua")),
    purge: Lua::new(lua!("purge.lua")),
    fold_tombstones: Lua::new(lua!("fold_tombstones.lua")),
    count_purgeable: Lua::new(lua!("count_purgeable.lua")),
    count: Lua::new(lua!("count.lua")),
    count_kinds: Lua::new(lua!("count_kinds.lua")),
    kinds: Lua::new(lua!("kinds.lua")),
    epoch: Lua::new(lua_alone!("epoch.lua")),
    epoch_marker: Lua::new(lua_alone!("epoch_marker.lua")),
    rebind_begin: Lua::new(lua_rebind!("rebind_begin.lua")),
    rebind_page: Lua::new(lua_rebind!("rebind_page.lua")),
    rebind_end: Lua::new(lua_alone!("rebind_end.lua")),
});

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

#[async_trait::async_trait]
impl LeaseStore for RedisLeaseStore {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        self.create_with(&NewRun::new(run.clone())).await
    }

    async fn create_with(&self, new: &NewRun) -> Result<RunRecord> {
        new.check()?;
        let run = new.run();
        let mut call = Call::new(&SCRIPTS.create);
        call.key(self.keys.runs())
            .key(self.keys.claimable_of(&Class::of_new(new)))
            .key(self.keys.ids())
            .key(self.keys.counter())
            .key(self.keys.floor())
            .key(self.keys.attempts())
            .key(self.keys.delayed())
            .key(self.keys.payloads())
            .key(self.keys.kinds())
            .key(self.keys.kind_set())
            .arg(keys::encode(run.as_str()))
            .arg(new.delay_millis())
            .arg(marked(new))
            .arg(run_at_arg(new))
            .arg(Class::of_new(new).arg());
        let (reply, ack) = self.write("create", &call).await?;
        match reply.status()? {
            "ok" => {
                ack.confirm()?;
                // Created at `now`; claimable from then, unless delayed until `delay_end`.
                let (now, delay_end) = (reply.time(1)?, reply.opt_time(3)?);
                Ok(
                    RunRecord::new(run.clone(), RunState::Runnable, reply.fence(2)?, now)
                        .with_not_before(delay_end)
                        .with_claimable_since(delay_end.is_none().then_some(now))
                        .with_payload(new.payload().map(<[u8]>::to_vec))
                        .with_kind(new.kind().clone())
                        .with_priority(new.priority())
                        .with_times(lease_core::RunTimes {
                            created_at: Some(now),
                            ..lease_core::RunTimes::default()
                        }),
                )
            }
            "exists" => {
                // A retried create takes "already exists" for its own commit: the run must be
                // on the replicas as if this call had created it.
                ack.confirm()?;
                Err(Error::AlreadyExists { run: run.clone() })
            }
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }

    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        let encoded = keys::encode(run.as_str());
        let (reply, ack, kind) = self
            .write_kinded("claim", &Class::default(), |kind| {
                let mut call = Call::new(&SCRIPTS.claim);
                call.key(self.keys.runs())
                    .key(self.keys.claimable_of(kind))
                    .key(self.keys.attempts())
                    .key(self.keys.payloads())
                    .key(self.keys.kinds())
                    .key(self.keys.history())
                    .key(self.keys.restored())
                    .arg(&encoded)
                    .arg(worker.as_str())
                    .arg(ttl.as_millis())
                    .arg(kind.arg());
                call
            })
            .await?;
        match reply.status()? {
            "ok" => {
                let lease = self
                    .lease(run.clone(), worker, ttl, &reply, 1)?
                    .with_payload(reply.payload(4)?)
                    .with_kind(kind.kind)
                    .with_priority(kind.priority);
                ack.confirm()?;
                Ok(lease)
            }
            "restored" => Err(self.restored(&reply)),
            "none" => Err(Error::NotFound { run: run.clone() }),
            "refused" => {
                let now = reply.time(5)?;
                // The expiry field: the holder's expiry, or an unowned run's retry delay.
                let left = reply.opt_time(3)?.map(|at| at.saturating_since(now));
                let owner = reply.owner(2)?;
                let (remaining, delayed) = match owner {
                    Some(_) => (left, None),
                    None => (None, left),
                };
                match claim_refusal(
                    run,
                    reply.state(1)?,
                    owner.as_ref(),
                    remaining,
                    delayed,
                    reply.fence(4)?,
                ) {
                    Some(refusal) => Err(refusal),
                    None => Err(reply
                        .bad("the script refused a claim the rules allow")
                        .into()),
                }
            }
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
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
        // The kind's indexes, priority 0 to MAX_PRIORITY.
        let indexes: Vec<String> = (0..=lease_core::MAX_PRIORITY)
            .map(|priority| {
                self.keys.claimable_of(&Class {
                    kind: kind.clone(),
                    priority,
                })
            })
            .collect();
        let mut leases = Vec::new();
        // Each script call examines a bounded number of stale index entries; calls continue
        // while one ran out of that budget, so a claimable run is never missed.
        loop {
            let mut call = Call::new(&SCRIPTS.claim_next);
            call.key(self.keys.runs())
                .key(&indexes[0])
                .key(self.keys.attempts())
                .key(self.keys.history());
            for index in &indexes[1..] {
                call.key(index);
            }
            call.key(self.keys.payloads()).key(self.keys.restored());
            call.arg(worker.as_str())
                .arg(ttl.as_millis())
                .arg(max - leases.len())
                .arg(CLAIM_NEXT_SCAN);
            let (reply, ack) = self.write("claim_next", &call).await?;
            if reply.len() == 2 && reply.status()? == "restored" {
                return Err(self.restored(&reply));
            }
            if reply.len() % 7 != 1 {
                return Err(reply
                    .bad(
                        "expected a flag, then groups of id, fence, expiry, attempts, payload, \
                         priority, waited",
                    )
                    .into());
            }
            let more = reply.str(0)? == "1";
            let claimed = (1..reply.len())
                .step_by(7)
                .map(|i| {
                    let run = keys::decode(reply.str(i)?)?;
                    let priority: u8 = reply.parse(i + 5)?;
                    let waited = Duration::from_micros(reply.parse(i + 6)?);
                    let lease = self
                        .lease(run, worker, ttl, &reply, i + 1)?
                        .with_kind(kind.clone())
                        .with_priority(priority)
                        .with_waited(Some(waited));
                    // Read by the script that claimed the run: the payload of the life it
                    // claimed.
                    Ok(lease.with_payload(reply.payload(i + 4)?))
                })
                .collect::<Result<Vec<Lease>>>()?;
            if !claimed.is_empty() {
                // Unconfirmed leases are never handed out; those of earlier calls are
                // withheld too (they expire by their TTL, their fences never reused).
                ack.confirm()?;
            }
            leases.extend(claimed);
            if !more || leases.len() >= max {
                return Ok(leases);
            }
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease> {
        let mut results = self.renew_many(std::slice::from_ref(lease)).await?;
        results
            .pop()
            .unwrap_or_else(|| Err(Error::backend(crate::error::BACKEND, "renew: empty reply")))
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        check_renew_batch(leases.len())?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let mut call = Call::new(&SCRIPTS.renew);
        call.key(self.keys.runs());
        for lease in leases {
            // The index of the kind the lease names: a wrong one only lets the run's entry
            // lag, which claim_next repairs (renew.lua).
            call.key(self.keys.claimable_of(&Class::of_lease(lease)));
        }
        for lease in leases {
            call.arg(keys::encode(lease.run().as_str()))
                .arg(lease.fence().get())
                .arg(lease.ttl().as_millis());
        }
        let (reply, ack) = self.write("renew", &call).await?;
        if reply.len() != leases.len() {
            return Err(reply.bad("expected one result per lease").into());
        }
        let results: Vec<Result<Lease>> = leases
            .iter()
            .enumerate()
            .map(|(i, lease)| {
                let one = reply.nested(i)?;
                self.status(lease, &one)?;
                Lease::new(
                    lease.run().clone(),
                    lease.owner().clone(),
                    lease.fence(),
                    lease.ttl(),
                    one.time(1)?,
                )
                .map(|renewed| renewed.with_attempt(lease.attempt()).carrying(lease))
                .map_err(Error::from)
            })
            .collect();
        if results.iter().any(needs_ack) {
            // A renewal a failover could lose is no renewal: the local deadline must not move.
            ack.confirm()?;
        }
        Ok(results)
    }

    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        check_payload(payload)?;
        let reply = self.fenced(lease, "append", payload).await?;
        Ok(JournalEntry::new(
            reply.parse(1)?,
            lease.fence(),
            payload.to_vec(),
            reply.time(2)?,
        ))
    }

    async fn append_keyed(
        &self,
        lease: &Lease,
        key: &IdempotencyKey,
        payload: &[u8],
    ) -> Result<JournalEntry> {
        check_payload(payload)?;
        let run = lease.run();
        let mut call = Call::new(&SCRIPTS.append_keyed);
        call.key(self.keys.runs())
            .key(self.keys.journal(run))
            .key(self.keys.journal_keys(run))
            .arg(keys::encode(run.as_str()))
            .arg(lease.fence().get())
            .arg(payload)
            .arg(key.as_str());
        let (reply, ack) = self.write("append_keyed", &call).await?;
        self.confirmed(self.status(lease, &reply), &ack)?;
        let seq: u64 = reply.parse(1)?;
        journal_entry(&reply, 2, seq)
    }

    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        let mut entries = Vec::new();
        // Paged: each script call copies at most about JOURNAL_PAGE_BYTES.
        let mut from = 0usize;
        loop {
            let mut call = Call::new(&SCRIPTS.journal);
            call.key(self.keys.runs())
                .key(self.keys.journal(run))
                .arg(keys::encode(run.as_str()))
                .arg(from)
                .arg(JOURNAL_PAGE_BYTES);
            let reply = self.read("journal", &call).await?;
            match reply.status()? {
                "ok" => {}
                "none" => return Err(Error::NotFound { run: run.clone() }),
                other => return Err(reply.bad(format!("unknown status {other:?}")).into()),
            }
            for i in 2..reply.len() {
                entries.push(journal_entry(&reply, i, entries.len() as u64 + 1)?);
            }
            let next = reply.str(1)?;
            if next.is_empty() {
                return Ok(entries);
            }
            from = reply.parse(1)?;
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.fenced(lease, "release", b"").await.map(drop)
    }

    async fn suspend(&self, lease: &Lease) -> Result<()> {
        self.fenced(lease, "suspend", b"").await.map(drop)
    }

    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        check_end_batch(ends)?;
        if ends.is_empty() {
            return Ok(Vec::new());
        }
        // Written into each attempt the call ends, where a resend of the call finds it.
        let id = call_id();
        let mut payloads: Vec<Cow<'_, [u8]>> = Vec::with_capacity(ends.len());
        for Ending { end, .. } in ends {
            payloads.push(match end {
                End::CompleteWith(payload) => Cow::Borrowed(payload),
                End::RetryAfter(_) => Cow::Owned(end.delay_millis().to_string().into_bytes()),
                End::AttemptFailed { reason, .. } => {
                    Cow::Owned(format!("{}:{reason}", end.delay_millis()).into_bytes())
                }
                End::Fail(reason) => Cow::Borrowed(reason.as_bytes()),
                // check_end_batch refused Committed above.
                End::Complete | End::Release | End::Suspend | End::Committed(_) => {
                    Cow::Borrowed(&[])
                }
                // An end added to the contract after this adapter: refused before any write.
                _ => {
                    return Err(lease_core::InvalidInput::Unsupported {
                        operation: "an end of this kind",
                    }
                    .into())
                }
            });
        }
        // The kinds the leases name; an item whose run is of another kind is sent again with
        // its run's (end_many.lua then writes nothing).
        let mut kinds: Vec<Class> = ends.iter().map(|e| Class::of_lease(&e.lease)).collect();
        let mut resends = 0;
        let (reply, ack) = loop {
            let mut call = Call::new(&SCRIPTS.end_many);
            call.key(self.keys.runs())
                .key(self.keys.claimable())
                .key(self.keys.failures())
                .key(self.keys.ended())
                .key(self.keys.delayed())
                .key(self.keys.suspended())
                .key(self.keys.attempts())
                .key(self.keys.kinds())
                .key(self.keys.history())
                .arg(&id);
            for ((Ending { lease, end, .. }, payload), kind) in
                ends.iter().zip(&payloads).zip(&kinds)
            {
                // Declared, like every key a script touches, even if the item is refused.
                call.key(self.keys.journal(lease.run()))
                    .key(self.keys.claimable_of(kind))
                    .arg(end.as_str())
                    .arg(keys::encode(lease.run().as_str()))
                    .arg(lease.fence().get())
                    .arg(payload.as_ref())
                    .arg(kind.arg());
            }
            let (reply, ack) = self.write("end_many", &call).await?;
            if reply.str(0).ok() != Some("kind") {
                break (reply, ack);
            }
            if resends == KIND_RESENDS || reply.len() % 2 != 1 {
                return Err(reply
                    .bad("the runs' kinds kept changing, or a malformed kind reply")
                    .into());
            }
            resends += 1;
            for i in (1..reply.len()).step_by(2) {
                let item: usize = reply.parse(i)?;
                let slot = item
                    .checked_sub(1)
                    .and_then(|k| kinds.get_mut(k))
                    .ok_or_else(|| reply.bad(format!("no item {item}")))?;
                *slot = reply.class(i + 1)?;
            }
        };
        if reply.len() != ends.len() {
            return Err(reply.bad("expected one result per item").into());
        }
        let results: Vec<Result<()>> = ends
            .iter()
            .enumerate()
            .map(|(i, ending)| self.status(&ending.lease, &reply.nested(i)?))
            .collect();
        if results.iter().any(needs_ack) {
            // One WAIT acknowledges the whole batch; without it no item is reported ended.
            ack.confirm()?;
        }
        Ok(results)
    }

    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>> {
        check_create_batch(runs)?;
        let runs: Vec<NewRun> = runs.iter().cloned().map(NewRun::new).collect();
        self.create_many_with(&runs).await
    }

    async fn create_many_with(&self, runs: &[NewRun]) -> Result<Vec<Result<()>>> {
        check_new_runs(runs)?;
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let mut call = Call::new(&SCRIPTS.create_many);
        call.key(self.keys.runs())
            .key(self.keys.claimable())
            .key(self.keys.ids())
            .key(self.keys.counter())
            .key(self.keys.floor())
            .key(self.keys.attempts())
            .key(self.keys.delayed())
            .key(self.keys.payloads())
            .key(self.keys.kinds())
            .key(self.keys.kind_set());
        for new in runs {
            call.key(self.keys.claimable_of(&Class::of_new(new)))
                .arg(keys::encode(new.run().as_str()))
                .arg(new.delay_millis())
                .arg(marked(new))
                .arg(run_at_arg(new))
                .arg(Class::of_new(new).arg());
        }
        let (reply, ack) = self.write("create_many", &call).await?;
        if reply.len() != runs.len() {
            return Err(reply.bad("expected one result per run").into());
        }
        let results = runs
            .iter()
            .enumerate()
            .map(|(i, new)| match reply.str(i)? {
                "1" => Ok(()),
                "0" => Err(Error::AlreadyExists {
                    run: new.run().clone(),
                }),
                other => Err(reply.bad(format!("unknown result {other:?}")).into()),
            })
            .collect::<Vec<Result<()>>>();
        // Created now, or already there (which a retried batch takes for its own commit):
        // either way on the replicas before it is reported.
        ack.confirm()?;
        Ok(results)
    }

    async fn complete(&self, lease: &Lease) -> Result<()> {
        self.fenced(lease, "complete", b"").await.map(drop)
    }

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        self.resume_run(run).await
    }

    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        self.inspect_run(run).await
    }

    async fn inspect_many(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        self.inspect_runs(runs).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        self.list_runs(filter).await
    }

    async fn purge(&self, older_than: Duration, max: usize) -> Result<Vec<RunId>> {
        self.purge_runs(lease_core::EndedStates::ALL, older_than, max)
            .await
    }

    async fn purge_ids(&self, runs: &[RunId]) -> Result<Vec<RunId>> {
        self.purge_ids_now(runs).await
    }

    async fn purge_ended(
        &self,
        states: lease_core::EndedStates,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<RunId>> {
        self.purge_runs(states, older_than, max).await
    }

    async fn count(&self) -> Result<lease_core::RunCounts> {
        self.count_runs().await
    }

    fn wakes(&self) -> Option<lease_core::Wakes> {
        let listening = self.listening.as_ref()?;
        Some(crate::wake::wakes(
            listening,
            &self.link,
            self.keys.wake_channel(),
        ))
    }

    async fn count_kinds(&self) -> Result<Vec<lease_core::KindCounts>> {
        self.count_kinds_runs().await
    }

    async fn count_purgeable(&self, older_than: Duration) -> Result<u64> {
        self.count_purgeable_runs(older_than).await
    }

    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        self.force_release_run(run).await
    }

    async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        self.cancel_run(run, reason).await
    }
}

/// Whether `answer` reports something under the caller's own fence, which must be confirmed
/// by the replicas before it is reported: success, or the lease ended under that fence (a
/// retry's "already applied").
fn needs_ack<T>(answer: &Result<T>) -> bool {
    matches!(answer, Ok(_) | Err(Error::LeaseEnded { .. }))
}

/// Journal entry `i` of a journal reply, `'<fence>:<written_at>:<payload>'`, numbered `seq`.
fn journal_entry(reply: &Reply, i: usize, seq: u64) -> Result<JournalEntry> {
    let raw = reply.bytes(i)?;
    let malformed = || -> Error {
        reply
            .bad(format!("journal entry {seq} is malformed"))
            .into()
    };
    let mut parts = raw.splitn(3, |b| *b == b':');
    let (Some(fence), Some(at), Some(payload)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(malformed());
    };
    let number = |b: &[u8]| -> Result<u64> {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(malformed)
    };
    Ok(JournalEntry::new(
        seq,
        lease_core::Fence::new(number(fence)?)?,
        payload.to_vec(),
        StoreTime::from_micros(number(at)?),
    ))
}

/// A create's payload argument, as the scripts read it: `''` for none, else `'='` followed by
/// the bytes (so an empty payload stays apart from none).
/// A create's run_at argument: µs since the Unix epoch, or '' for none.
fn run_at_arg(new: &NewRun) -> String {
    new.run_at_micros()
        .map_or_else(String::new, |us| us.to_string())
}

fn marked(new: &NewRun) -> Vec<u8> {
    match new.payload() {
        None => Vec::new(),
        Some(bytes) => {
            let mut out = Vec::with_capacity(1 + bytes.len());
            out.push(b'=');
            out.extend_from_slice(bytes);
            out
        }
    }
}
