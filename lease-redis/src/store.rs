//! `RedisLeaseStore`: the `LeaseStore` contract as Lua scripts run atomically by Redis.

use std::fmt;
use std::sync::{Arc, LazyLock};

use lease_core::{
    check_claim_max, check_create_batch, check_end_batch, check_list, check_payload,
    check_renew_batch, claim_refusal, fenced_verdict, End, Ending, Error, JournalEntry, Lease,
    LeaseStore, ListFilter, Result, RunId, RunRecord, RunState, StoreTime, Ttl, WorkerId,
};
use redis::{FromRedisValue, Script, ScriptInvocation, ToRedisArgs, Value};

use crate::config::RedisConfig;
use crate::error::RedisError;
use crate::guard::Guard;
use crate::keys::{self, Keys};
use crate::link::Link;
use crate::reply::Reply;

/// How many run ids one `list` script call examines at most, whatever its filter keeps: the
/// bound on the work one call asks of the server.
const LIST_SCAN: usize = 1000;

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

/// Every script, built once per process; `Script` runs EVALSHA and loads itself on NOSCRIPT.
struct Scripts {
    create: Script,
    create_many: Script,
    claim: Script,
    claim_next: Script,
    renew: Script,
    fenced: Script,
    end_many: Script,
    resume: Script,
    force_release: Script,
    inspect: Script,
    journal: Script,
    list: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    create: Script::new(lua!("create.lua")),
    create_many: Script::new(lua!("create_many.lua")),
    claim: Script::new(lua_alone!("claim.lua")),
    claim_next: Script::new(lua!("claim_next.lua")),
    renew: Script::new(lua_alone!("renew.lua")),
    fenced: Script::new(lua_alone!("fenced.lua")),
    end_many: Script::new(lua!("end_many.lua")),
    resume: Script::new(lua!("resume.lua")),
    force_release: Script::new(lua!("force_release.lua")),
    inspect: Script::new(lua!("inspect.lua")),
    journal: Script::new(lua!("journal.lua")),
    list: Script::new(lua!("list.lua")),
});

/// A caller's Lua snippet that [`RedisLeaseStore::fenced_script`] runs atomically after the
/// fence check, so the caller's own Redis writes land only under the current fence.
///
/// The snippet is the body of a function: it sees `KEYS` and `ARGV` as the caller passed them
/// (the run hash and fence the adapter adds are hidden) and its `return` value becomes the
/// call's result. Build it once and reuse it: its SHA is cached by Redis.
///
/// Redis does not roll back a script that raises an error half-way, so check before writing.
///
/// ```
/// use lease_redis::FencedScript;
/// let push = FencedScript::new("return redis.call('RPUSH', KEYS[1], ARGV[1])");
/// ```
pub struct FencedScript {
    script: Script,
}

impl FencedScript {
    /// Wraps `lua`, the snippet to run after the fence check.
    pub fn new(lua: &str) -> FencedScript {
        let source = format!(
            "{}{}{lua}\nend)({{unpack(KEYS, 2)}}, {{unpack(ARGV, 3)}})\nreturn {{ 'ok', lease_result }}\n",
            include_str!("../lua/common.lua"),
            include_str!("../lua/fenced_prelude.lua"),
        );
        FencedScript {
            script: Script::new(&source),
        }
    }
}

impl fmt::Debug for FencedScript {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedScript")
            .field("sha", &self.script.get_hash())
            .finish()
    }
}

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
    link: Arc<Link>,
    keys: Keys,
    config: RedisConfig,
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
        let link = Link::connect(&config, Guard::new(&config)).await?;
        Ok(RedisLeaseStore {
            link: Arc::new(link),
            keys: Keys::new(config.namespace()),
            config,
        })
    }

    /// [`connect`](RedisLeaseStore::connect) with [`RedisConfig::from_url`].
    ///
    /// # Errors
    /// As [`connect`](RedisLeaseStore::connect).
    pub async fn from_url(url: &str) -> Result<RedisLeaseStore> {
        Self::connect(RedisConfig::from_url(url)).await
    }

    /// The unsafe durability settings this store accepted because it is
    /// [volatile](RedisConfig::with_volatile) (for example `appendfsync everysec`); empty when
    /// the server is safe. Also shown by `Display`.
    pub fn accepted_risks(&self) -> Vec<String> {
        self.link.guard().accepted()
    }

    /// The configuration this store was built from.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// A key for the caller's own data about `run`, named `name`, in the run's hash slot: the
    /// keys a [`FencedScript`] may touch. Distinct runs and names give distinct keys.
    pub fn script_key(&self, run: &RunId, name: &str) -> String {
        self.keys.user(run, name)
    }

    /// Runs `script` atomically after the fence check on `lease`: the snippet runs, with
    /// `keys` and `args` as its `KEYS` and `ARGV`, only if the lease's fence is the run's
    /// current fence and the lease is held; otherwise nothing is written. Returns the
    /// snippet's return value.
    ///
    /// # Errors
    /// The fenced-write verdicts of the [`LeaseStore`] contract ([`Error::StaleFence`] and so
    /// on); [`Error::Backend`] if a key is not under this store's hash tag (build keys with
    /// [`script_key`](RedisLeaseStore::script_key)), the snippet fails, or its result does not
    /// convert to `T`.
    pub async fn fenced_script<T: FromRedisValue, K: AsRef<str>, A: ToRedisArgs>(
        &self,
        lease: &Lease,
        script: &FencedScript,
        keys: &[K],
        args: &[A],
    ) -> Result<T> {
        if let Some(key) = keys
            .iter()
            .map(AsRef::as_ref)
            .find(|k| !k.starts_with(self.keys.tag()))
        {
            return Err(RedisError::Config(format!(
                "fenced script key {key:?} is outside this store's hash slot; build keys with \
                 RedisLeaseStore::script_key"
            ))
            .into());
        }
        let runs = self.keys.runs();
        let mut call = script.script.key(&runs);
        call.arg(keys::encode(lease.run().as_str()))
            .arg(lease.fence().get());
        for key in keys {
            call.key(key.as_ref());
        }
        for arg in args {
            call.arg(arg);
        }
        let (reply, mut session) = self.run("fenced script", &call).await?;
        self.fenced_status(lease, &reply)?;
        session.replicated(&runs).await?;
        let value = reply.into_items().into_iter().nth(1).unwrap_or(Value::Nil);
        T::from_redis_value(value).map_err(|e| Error::backend(crate::error::BACKEND, e.to_string()))
    }

    /// Runs a script; returns its reply and the session it ran on, for
    /// [`replicated`](crate::link::Session::replicated) after a write.
    async fn run(
        &self,
        script: &'static str,
        call: &ScriptInvocation<'_>,
    ) -> Result<(Reply, crate::link::Session<'_>), RedisError> {
        let mut session = self.link.session().await?;
        let value = session.invoke(call).await?;
        Ok((Reply::new(script, value)?, session))
    }

    /// Turns a fenced script's `none` / `verdict` reply into the contract's error.
    fn fenced_status(&self, lease: &Lease, reply: &Reply) -> Result<()> {
        match reply.status()? {
            "ok" => Ok(()),
            "none" => Err(Error::NotFound {
                run: lease.run().clone(),
            }),
            "verdict" => {
                let owned = reply.str(3)? == "1";
                fenced_verdict(
                    lease.run(),
                    lease.fence(),
                    reply.fence(1)?,
                    reply.state(2)?,
                    owned,
                )?;
                Err(reply
                    .bad("the script refused a write the verdict allows")
                    .into())
            }
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }

    fn lease(
        &self,
        run: RunId,
        worker: &WorkerId,
        ttl: Ttl,
        reply: &Reply,
        i: usize,
    ) -> Result<Lease> {
        Lease::new(
            run,
            worker.clone(),
            reply.fence(i)?,
            ttl,
            reply.time(i + 1)?,
        )
        .map_err(|e| reply.bad(e.to_string()).into())
    }

    async fn fenced(&self, lease: &Lease, op: &str, payload: &[u8]) -> Result<Reply> {
        let run = lease.run();
        let runs = self.keys.runs();
        let mut call = SCRIPTS.fenced.key(&runs);
        call.key(self.keys.journal(run))
            .key(self.keys.claimable())
            .arg(op)
            .arg(keys::encode(run.as_str()))
            .arg(lease.fence().get())
            .arg(payload);
        let (reply, mut session) = self.run("fenced", &call).await?;
        self.fenced_status(lease, &reply)?;
        session.replicated(&runs).await?;
        Ok(reply)
    }

    /// A record reply (`ok` or `refused`, then state, owner, expiry, fence, heartbeats, now).
    fn record(&self, run: &RunId, reply: &Reply) -> Result<RunRecord> {
        let now = reply.time(6)?;
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
                " [volatile: accepts {}; a fence may be issued twice]",
                accepted.join(", ")
            )?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl LeaseStore for RedisLeaseStore {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        let runs = self.keys.runs();
        let mut call = SCRIPTS.create.key(&runs);
        call.key(self.keys.claimable())
            .key(self.keys.ids())
            .key(self.keys.counter())
            .arg(keys::encode(run.as_str()));
        let (reply, mut session) = self.run("create", &call).await?;
        match reply.status()? {
            "ok" => {
                session.replicated(&runs).await?;
                Ok(RunRecord {
                    run: run.clone(),
                    state: RunState::Runnable,
                    owner: None,
                    expires_at: None,
                    fence: lease_core::Fence::ZERO,
                    heartbeats: 0,
                    observed_at: reply.time(1)?,
                })
            }
            "exists" => Err(Error::AlreadyExists { run: run.clone() }),
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }

    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        let runs = self.keys.runs();
        let mut call = SCRIPTS.claim.key(&runs);
        call.key(self.keys.claimable())
            .arg(keys::encode(run.as_str()))
            .arg(worker.as_str())
            .arg(ttl.as_millis());
        let (reply, mut session) = self.run("claim", &call).await?;
        match reply.status()? {
            "ok" => {
                let lease = self.lease(run.clone(), worker, ttl, &reply, 1)?;
                session.replicated(&runs).await?;
                Ok(lease)
            }
            "none" => Err(Error::NotFound { run: run.clone() }),
            "refused" => {
                let now = reply.time(5)?;
                let remaining = reply.opt_time(3)?.map(|at| at.saturating_since(now));
                let owner = reply.owner(2)?;
                match claim_refusal(
                    run,
                    reply.state(1)?,
                    owner.as_ref(),
                    remaining,
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
        check_claim_max(max)?;
        let runs = self.keys.runs();
        let mut call = SCRIPTS.claim_next.key(&runs);
        call.key(self.keys.claimable())
            .arg(worker.as_str())
            .arg(ttl.as_millis())
            .arg(max);
        let (reply, mut session) = self.run("claim_next", &call).await?;
        if reply.len() % 3 != 0 {
            return Err(reply.bad("expected triples of id, fence, expiry").into());
        }
        let leases = (0..reply.len())
            .step_by(3)
            .map(|i| {
                let run = keys::decode(reply.str(i)?)?;
                self.lease(run, worker, ttl, &reply, i + 1)
            })
            .collect::<Result<Vec<Lease>>>()?;
        if !leases.is_empty() {
            session.replicated(&runs).await?;
        }
        Ok(leases)
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
        let runs = self.keys.runs();
        let mut call = SCRIPTS.renew.key(&runs);
        for lease in leases {
            call.arg(keys::encode(lease.run().as_str()))
                .arg(lease.fence().get())
                .arg(lease.ttl().as_millis());
        }
        let (reply, mut session) = self.run("renew", &call).await?;
        if reply.len() != leases.len() {
            return Err(reply.bad("expected one result per lease").into());
        }
        let results: Vec<Result<Lease>> = leases
            .iter()
            .enumerate()
            .map(|(i, lease)| {
                let one = reply.nested(i)?;
                self.fenced_status(lease, &one)?;
                Lease::new(
                    lease.run().clone(),
                    lease.owner().clone(),
                    lease.fence(),
                    lease.ttl(),
                    one.time(1)?,
                )
                .map_err(Error::from)
            })
            .collect();
        if results.iter().any(Result::is_ok) {
            // A renewal a failover could lose is no renewal: the local deadline must not move.
            session.replicated(&runs).await?;
        }
        Ok(results)
    }

    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        check_payload(payload)?;
        let reply = self.fenced(lease, "append", payload).await?;
        Ok(JournalEntry {
            seq: reply.parse(1)?,
            fence: lease.fence(),
            payload: payload.to_vec(),
            written_at: reply.time(2)?,
        })
    }

    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        let mut call = SCRIPTS.journal.key(self.keys.runs());
        call.key(self.keys.journal(run))
            .arg(keys::encode(run.as_str()));
        let (reply, _) = self.run("journal", &call).await?;
        match reply.status()? {
            "ok" => {}
            "none" => return Err(Error::NotFound { run: run.clone() }),
            other => return Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
        (1..reply.len())
            .map(|i| {
                let raw = reply.bytes(i)?;
                let mut parts = raw.splitn(3, |b| *b == b':');
                let (Some(fence), Some(at), Some(payload)) =
                    (parts.next(), parts.next(), parts.next())
                else {
                    return Err(reply.bad(format!("journal entry {i} is malformed")).into());
                };
                let number = |b: &[u8]| -> Result<u64> {
                    std::str::from_utf8(b)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| reply.bad(format!("journal entry {i} is malformed")).into())
                };
                Ok(JournalEntry {
                    seq: i as u64,
                    fence: lease_core::Fence::new(number(fence)?)?,
                    payload: payload.to_vec(),
                    written_at: StoreTime::from_micros(number(at)?),
                })
            })
            .collect()
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
        let runs = self.keys.runs();
        let mut call = SCRIPTS.end_many.key(&runs);
        call.key(self.keys.claimable());
        for Ending { lease, end } in ends {
            let payload: &[u8] = match end {
                End::CompleteWith(payload) => {
                    // Declared, like every key a script touches, even if the item is refused.
                    call.key(self.keys.journal(lease.run()));
                    payload
                }
                End::Complete | End::Release | End::Suspend => b"",
            };
            call.arg(end.as_str())
                .arg(keys::encode(lease.run().as_str()))
                .arg(lease.fence().get())
                .arg(payload);
        }
        let (reply, mut session) = self.run("end_many", &call).await?;
        if reply.len() != ends.len() {
            return Err(reply.bad("expected one result per item").into());
        }
        let results: Vec<Result<()>> = ends
            .iter()
            .enumerate()
            .map(|(i, ending)| self.fenced_status(&ending.lease, &reply.nested(i)?))
            .collect();
        if results.iter().any(Result::is_ok) {
            // One WAIT acknowledges the whole batch; without it no item is reported ended.
            session.replicated(&runs).await?;
        }
        Ok(results)
    }

    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>> {
        check_create_batch(runs)?;
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let records = self.keys.runs();
        let mut call = SCRIPTS.create_many.key(&records);
        call.key(self.keys.claimable())
            .key(self.keys.ids())
            .key(self.keys.counter());
        for run in runs {
            call.arg(keys::encode(run.as_str()));
        }
        let (reply, mut session) = self.run("create_many", &call).await?;
        if reply.len() != runs.len() {
            return Err(reply.bad("expected one result per run").into());
        }
        let results = runs
            .iter()
            .enumerate()
            .map(|(i, run)| match reply.str(i)? {
                "1" => Ok(()),
                "0" => Err(Error::AlreadyExists { run: run.clone() }),
                other => Err(reply.bad(format!("unknown result {other:?}")).into()),
            })
            .collect::<Vec<Result<()>>>();
        if results.iter().any(Result::is_ok) {
            session.replicated(&records).await?;
        }
        Ok(results)
    }

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        let runs = self.keys.runs();
        let mut call = SCRIPTS.resume.key(&runs);
        call.key(self.keys.claimable())
            .arg(keys::encode(run.as_str()));
        let (reply, mut session) = self.run("resume", &call).await?;
        match reply.status()? {
            "ok" => {
                session.replicated(&runs).await?;
                self.record(run, &reply)
            }
            "none" => Err(Error::NotFound { run: run.clone() }),
            "refused" => Err(Error::NotSuspended {
                run: run.clone(),
                state: reply.state(1)?,
            }),
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }

    async fn complete(&self, lease: &Lease) -> Result<()> {
        self.fenced(lease, "complete", b"").await.map(drop)
    }

    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        let mut call = SCRIPTS.inspect.key(self.keys.runs());
        call.arg(keys::encode(run.as_str()));
        let (reply, _) = self.run("inspect", &call).await?;
        match reply.status()? {
            "ok" => self.record(run, &reply),
            "none" => Err(Error::NotFound { run: run.clone() }),
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        check_list(filter)?;
        let mut after = filter
            .after
            .as_ref()
            .map(|run| keys::encode(run.as_str()))
            .unwrap_or_default();
        let mut out = Vec::new();
        // Page through the ids, LIST_SCAN at a time, so no one script call scans the whole
        // namespace however selective the filter is.
        while out.len() < filter.limit {
            let mut call = SCRIPTS.list.key(self.keys.ids());
            call.key(self.keys.runs())
                .arg(&after)
                .arg(filter.limit - out.len())
                .arg(filter.state.map_or("", RunState::as_str))
                .arg(if filter.expired { "1" } else { "0" })
                .arg(LIST_SCAN);
            let (reply, _) = self.run("list", &call).await?;
            let now = reply.time(0)?;
            if reply.len() < 2 || (reply.len() - 2) % 6 != 0 {
                return Err(reply
                    .bad("expected a cursor and records of six fields")
                    .into());
            }
            for i in (2..reply.len()).step_by(6) {
                out.push(reply.record(keys::decode(reply.str(i)?)?, i + 1, now)?);
            }
            let cursor = reply.str(1)?;
            if cursor.is_empty() {
                break;
            }
            after = cursor.to_owned();
        }
        Ok(out)
    }

    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        let runs = self.keys.runs();
        let mut call = SCRIPTS.force_release.key(&runs);
        call.key(self.keys.claimable())
            .arg(keys::encode(run.as_str()));
        let (reply, mut session) = self.run("force_release", &call).await?;
        match reply.status()? {
            "ok" => {
                session.replicated(&runs).await?;
                self.record(run, &reply)
            }
            "none" => Err(Error::NotFound { run: run.clone() }),
            "refused" => match reply.state(1)? {
                RunState::Suspended => Err(Error::Suspended { run: run.clone() }),
                RunState::Completed => Err(Error::Completed { run: run.clone() }),
                RunState::Runnable => Err(reply.bad("refused a runnable run").into()),
            },
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }
}
