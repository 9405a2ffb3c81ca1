//! `RedisLeaseStore`: the `LeaseStore` contract as Lua scripts run atomically by Redis.

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use lease_core::{
    check_claim_max, check_list, check_payload, check_renew_batch, claim_refusal, fenced_verdict,
    Error, JournalEntry, Lease, LeaseStore, ListFilter, Result, RunId, RunRecord, RunState,
    StoreTime, Ttl, WorkerId,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, Script, ToRedisArgs, Value};

use crate::config::RedisConfig;
use crate::error::{scrub, RedisError};
use crate::keys::{self, Keys};
use crate::reply::Reply;

macro_rules! lua {
    ($file:literal) => {
        concat!(
            include_str!("../lua/common.lua"),
            include_str!(concat!("../lua/", $file))
        )
    };
}

/// Every script, built once per process; `Script` runs EVALSHA and loads itself on NOSCRIPT.
struct Scripts {
    create: Script,
    claim: Script,
    claim_next: Script,
    renew: Script,
    fenced: Script,
    resume: Script,
    force_release: Script,
    inspect: Script,
    journal: Script,
    list: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    create: Script::new(lua!("create.lua")),
    claim: Script::new(lua!("claim.lua")),
    claim_next: Script::new(lua!("claim_next.lua")),
    renew: Script::new(lua!("renew.lua")),
    fenced: Script::new(lua!("fenced.lua")),
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
            "{}{}{lua}\nend)({{unpack(KEYS, 2)}}, {{unpack(ARGV, 2)}})\nreturn {{ 'ok', lease_result }}\n",
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
/// All keys of a namespace share one hash tag, so every script touches one Cluster slot; see
/// the [crate docs](crate) for the layout. Connects through redis-rs's `ConnectionManager`
/// (multiplexed, reconnecting), with response and connection timeouts so a dead server gives
/// retryable errors ([`Error::Unavailable`]) rather than hangs.
#[derive(Clone)]
pub struct RedisLeaseStore {
    conn: ConnectionManager,
    keys: Keys,
    config: RedisConfig,
    /// The password, only to scrub it from driver messages; never printed.
    secret: Option<String>,
}

impl RedisLeaseStore {
    /// Connects with `config` and checks the durability guard: a server whose
    /// `CONFIG GET appendonly` answers `no` is refused unless the config is volatile. When
    /// `CONFIG` is not permitted (managed Redis), logs a warning and proceeds.
    ///
    /// # Errors
    /// [`Error::Unavailable`] if the server cannot be reached; [`Error::Backend`] for an invalid
    /// URL or namespace, a rejected password, or a server that does not persist writes.
    pub async fn connect(config: RedisConfig) -> Result<RedisLeaseStore> {
        config.check()?;
        let client = redis::Client::open(config.url()).map_err(|e| {
            // The URL itself may be in the message; show the redacted one instead.
            RedisError::Config(format!(
                "cannot use {}: {}",
                config.redacted_url(),
                scrub(&e.to_string(), Some(config.url()))
            ))
        })?;
        let secret = client
            .get_connection_info()
            .redis_settings()
            .password()
            .map(str::to_owned);
        let manager_config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(config.response_timeout()))
            .set_connection_timeout(Some(config.connect_timeout()))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client, manager_config)
            .await
            .map_err(|e| RedisError::from_driver(&e, secret.as_deref()))?;
        let store = RedisLeaseStore {
            conn,
            keys: Keys::new(config.namespace()),
            config,
            secret,
        };
        store.durability_guard().await?;
        Ok(store)
    }

    /// [`connect`](RedisLeaseStore::connect) with [`RedisConfig::from_url`].
    ///
    /// # Errors
    /// As [`connect`](RedisLeaseStore::connect).
    pub async fn from_url(url: &str) -> Result<RedisLeaseStore> {
        Self::connect(RedisConfig::from_url(url)).await
    }

    async fn durability_guard(&self) -> Result<()> {
        let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendonly")
            .query_async(&mut self.conn.clone())
            .await;
        match reply {
            Ok(pair) => match pair.get(1).map(String::as_str) {
                Some("yes") => Ok(()),
                Some("no") if self.config.is_volatile() => {
                    tracing::warn!(
                        server = %self.config.redacted_url(),
                        "redis does not persist writes (appendonly no) and volatile mode is on: \
                         a restart resets fences, so two holders could share a fence"
                    );
                    Ok(())
                }
                Some("no") => Err(RedisError::NotDurable {
                    server: self.config.redacted_url(),
                }
                .into()),
                _ => {
                    tracing::warn!(
                        server = %self.config.redacted_url(),
                        "cannot tell whether redis persists writes (CONFIG GET appendonly gave \
                         no answer); fences survive a restart only if it does"
                    );
                    Ok(())
                }
            },
            Err(e) => {
                let err = RedisError::from_driver(&e, self.secret.as_deref());
                if matches!(err, RedisError::Unreachable(_)) {
                    return Err(err.into());
                }
                tracing::warn!(
                    server = %self.config.redacted_url(),
                    error = %err,
                    "cannot check whether redis persists writes (CONFIG not permitted); \
                     proceeding: fences survive a restart only if the server persists writes"
                );
                Ok(())
            }
        }
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
        let mut call = script.script.key(self.keys.run(lease.run()));
        call.arg(lease.fence().get());
        for key in keys {
            call.key(key.as_ref());
        }
        for arg in args {
            call.arg(arg);
        }
        let reply = Reply::new(
            "fenced script",
            self.invoke(call.invoke_async(&mut self.conn.clone()))
                .await?,
        )?;
        self.fenced_status(lease, &reply)?;
        let value = reply.into_items().into_iter().nth(1).unwrap_or(Value::Nil);
        T::from_redis_value(value).map_err(|e| Error::backend(crate::error::BACKEND, e.to_string()))
    }

    async fn invoke(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<Value>>,
    ) -> Result<Value, RedisError> {
        call.await
            .map_err(|e| RedisError::from_driver(&e, self.secret.as_deref()))
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
        let reply = self
            .invoke(
                SCRIPTS
                    .fenced
                    .key(self.keys.run(run))
                    .key(self.keys.journal(run))
                    .key(self.keys.claimable())
                    .arg(op)
                    .arg(lease.fence().get())
                    .arg(payload)
                    .invoke_async(&mut self.conn.clone()),
            )
            .await?;
        let reply = Reply::new("fenced", reply)?;
        self.fenced_status(lease, &reply)?;
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
        fmt::Display::fmt(&self.config, f)
    }
}

#[async_trait::async_trait]
impl LeaseStore for RedisLeaseStore {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        let reply = self
            .invoke(
                SCRIPTS
                    .create
                    .key(self.keys.run(run))
                    .key(self.keys.claimable())
                    .key(self.keys.runs())
                    .key(self.keys.counter())
                    .arg(keys::encode(run.as_str()))
                    .invoke_async(&mut self.conn.clone()),
            )
            .await?;
        let reply = Reply::new("create", reply)?;
        match reply.status()? {
            "ok" => Ok(RunRecord {
                run: run.clone(),
                state: RunState::Runnable,
                owner: None,
                expires_at: None,
                fence: lease_core::Fence::ZERO,
                heartbeats: 0,
                observed_at: reply.time(1)?,
            }),
            "exists" => Err(Error::AlreadyExists { run: run.clone() }),
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }

    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        let reply = self
            .invoke(
                SCRIPTS
                    .claim
                    .key(self.keys.run(run))
                    .key(self.keys.claimable())
                    .arg(worker.as_str())
                    .arg(ttl.as_millis())
                    .invoke_async(&mut self.conn.clone()),
            )
            .await?;
        let reply = Reply::new("claim", reply)?;
        match reply.status()? {
            "ok" => self.lease(run.clone(), worker, ttl, &reply, 1),
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
        let reply = self
            .invoke(
                SCRIPTS
                    .claim_next
                    .key(self.keys.claimable())
                    .arg(self.keys.run_prefix())
                    .arg(worker.as_str())
                    .arg(ttl.as_millis())
                    .arg(max)
                    .invoke_async(&mut self.conn.clone()),
            )
            .await?;
        let reply = Reply::new("claim_next", reply)?;
        if reply.len() % 3 != 0 {
            return Err(reply.bad("expected triples of id, fence, expiry").into());
        }
        (0..reply.len())
            .step_by(3)
            .map(|i| {
                let run = keys::decode(reply.str(i)?)?;
                self.lease(run, worker, ttl, &reply, i + 1)
            })
            .collect()
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
        let mut call = SCRIPTS.renew.key(self.keys.claimable());
        for lease in leases {
            call.key(self.keys.run(lease.run()));
            call.arg(lease.fence().get()).arg(lease.ttl().as_millis());
        }
        let reply = self
            .invoke(call.invoke_async(&mut self.conn.clone()))
            .await?;
        let reply = Reply::new("renew", reply)?;
        if reply.len() != leases.len() {
            return Err(reply.bad("expected one result per lease").into());
        }
        Ok(leases
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
            .collect())
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
        let reply = self
            .invoke(
                SCRIPTS
                    .journal
                    .key(self.keys.run(run))
                    .key(self.keys.journal(run))
                    .invoke_async(&mut self.conn.clone()),
            )
            .await?;
        let reply = Reply::new("journal", reply)?;
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

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        let reply = self
            .invoke(
                SCRIPTS
                    .resume
                    .key(self.keys.run(run))
                    .key(self.keys.claimable())
                    .invoke_async(&mut self.conn.clone()),
            )
            .await?;
        let reply = Reply::new("resume", reply)?;
        match reply.status()? {
            "ok" => self.record(run, &reply),
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
        let reply = self
            .invoke(
                SCRIPTS
                    .inspect
                    .key(self.keys.run(run))
                    .invoke_async(&mut self.conn.clone()),
            )
            .await?;
        let reply = Reply::new("inspect", reply)?;
        match reply.status()? {
            "ok" => self.record(run, &reply),
            "none" => Err(Error::NotFound { run: run.clone() }),
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        check_list(filter)?;
        let after = filter
            .after
            .as_ref()
            .map(|run| keys::encode(run.as_str()))
            .unwrap_or_default();
        let reply = self
            .invoke(
                SCRIPTS
                    .list
                    .key(self.keys.runs())
                    .arg(self.keys.run_prefix())
                    .arg(after)
                    .arg(filter.limit)
                    .arg(filter.state.map_or("", RunState::as_str))
                    .arg(if filter.expired { "1" } else { "0" })
                    .invoke_async(&mut self.conn.clone()),
            )
            .await?;
        let reply = Reply::new("list", reply)?;
        let now = reply.time(0)?;
        if (reply.len() - 1) % 6 != 0 {
            return Err(reply.bad("expected records of six fields").into());
        }
        (1..reply.len())
            .step_by(6)
            .map(|i| Ok(reply.record(keys::decode(reply.str(i)?)?, i + 1, now)?))
            .collect()
    }

    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        let reply = self
            .invoke(
                SCRIPTS
                    .force_release
                    .key(self.keys.run(run))
                    .key(self.keys.claimable())
                    .invoke_async(&mut self.conn.clone()),
            )
            .await?;
        let reply = Reply::new("force_release", reply)?;
        match reply.status()? {
            "ok" => self.record(run, &reply),
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
