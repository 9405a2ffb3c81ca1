//! [`FencedScript`]: a caller's Lua snippet run under the fence check of a lease, and
//! [`RedisLeaseStore::fenced_script`] / [`fenced_script_with_end`](RedisLeaseStore::fenced_script_with_end).

use std::fmt;

use lease_core::backend::check_end_batch;
use lease_core::{End, Ending, Error, Lease, Result};
use redis::{FromRedisValue, ToRedisArgs, Value};

use crate::call::{call_id, Call, Lua};
use crate::error::RedisError;
use crate::keys::{self, Class};
use crate::store::RedisLeaseStore;

/// A caller's Lua snippet that [`RedisLeaseStore::fenced_script`] runs atomically after the
/// fence check, so the caller's own Redis writes land only under the current fence.
///
/// The snippet is the body of a function: it sees `KEYS` and `ARGV` as the caller passed them
/// (the run hash and fence the adapter adds are hidden) and its `return` value becomes the
/// call's result. Build it once and reuse it: its SHA is cached by Redis.
///
/// Redis does not roll back a script that raises an error half-way, so check before writing.
/// A snippet that raises an error or returns one (`redis.error_reply`) fails the call, and
/// [`fenced_script_with_end`](RedisLeaseStore::fenced_script_with_end) then does not end the
/// lease.
///
/// A resend of the same call (after a lost reply) does not run the snippet again: the
/// adapter records each call's result with the run, under the lease's fence, until the lease
/// ends, and answers a resend with it. The result is kept with `cmsgpack`, so keep it small.
///
/// ```
/// use lease_redis::FencedScript;
/// let push = FencedScript::new("return redis.call('RPUSH', KEYS[1], ARGV[1])");
/// ```
pub struct FencedScript {
    script: Lua,
}

impl FencedScript {
    /// Wraps `lua`, the snippet to run after the fence check.
    pub fn new(lua: &str) -> FencedScript {
        let source = format!(
            "{}{}{lua}\nend)({{unpack(KEYS, 10)}}, {{unpack(ARGV, 7)}})\n{}",
            include_str!("../lua/common.lua"),
            include_str!("../lua/fenced_prelude.lua"),
            include_str!("../lua/fenced_epilogue.lua"),
        );
        FencedScript {
            script: Lua::new(source),
        }
    }
}

impl fmt::Debug for FencedScript {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedScript")
            .field("sha", &self.script.hash())
            .finish()
    }
}

impl RedisLeaseStore {
    /// Runs `script` atomically after the fence check on `lease`: the snippet runs, with
    /// `keys` and `args` as its `KEYS` and `ARGV`, only if the lease's fence is the run's
    /// current fence and the lease is held; otherwise nothing is written. Returns the
    /// snippet's return value.
    ///
    /// # Errors
    /// The fenced-write verdicts of the [`LeaseStore`](lease_core::LeaseStore) contract ([`Error::StaleFence`] and so
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
        self.run_fenced_script(lease, script, keys, args, None)
            .await
    }

    /// [`fenced_script`](RedisLeaseStore::fenced_script) that also **ends the lease** as `end`
    /// says (complete, complete with a journaled effect, release, suspend), in the same
    /// script: the caller's keys and the run's end change atomically, so a job's effect in its
    /// own keys and the run's completion happen together, and a reclaim after them finds the
    /// run completed — the effect is never applied twice.
    ///
    /// The adapter's part comes first and last: the fence check before the snippet (a refused
    /// fence runs nothing and changes nothing), the end after it. Redis never rolls a script
    /// back: if the snippet raises an error, the lease is not ended, but what the snippet wrote
    /// before the error stays. Check before writing, or write last.
    ///
    /// A resend of the call (after a lost reply) answers the snippet's first result and runs
    /// nothing again.
    ///
    /// # Errors
    /// As [`fenced_script`](RedisLeaseStore::fenced_script), and [`Error::InvalidInput`] for a
    /// payload over the limit or [`End::Committed`], and as
    /// [`InvalidInput::Unsupported`](lease_core::InvalidInput::Unsupported) for
    /// [`End::RetryAfter`], [`End::Fail`] and [`End::AwaitSignal`] (end the lease with
    /// [`end_many`](lease_core::LeaseStore::end_many) for those: a script that gives up has no effect to
    /// commit with its end).
    pub async fn fenced_script_with_end<T: FromRedisValue, K: AsRef<str>, A: ToRedisArgs>(
        &self,
        lease: &Lease,
        script: &FencedScript,
        keys: &[K],
        args: &[A],
        end: End,
    ) -> Result<T> {
        check_end_batch(std::slice::from_ref(&Ending::new(
            lease.clone(),
            end.clone(),
        )))?;
        if matches!(
            end,
            End::RetryAfter(_) | End::AttemptFailed { .. } | End::Fail(_) | End::AwaitSignal { .. }
        ) {
            return Err(lease_core::InvalidInput::Unsupported {
                operation: "fenced_script_with_end with a retry delay, a failure or a wait",
            }
            .into());
        }
        self.run_fenced_script(lease, script, keys, args, Some(end))
            .await
    }

    async fn run_fenced_script<T: FromRedisValue, K: AsRef<str>, A: ToRedisArgs>(
        &self,
        lease: &Lease,
        script: &FencedScript,
        keys: &[K],
        args: &[A],
        end: Option<End>,
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
        let run = lease.run();
        let (op, payload): (&str, &[u8]) = match &end {
            None => ("", b""),
            Some(End::CompleteWith(payload)) => ("complete-with", payload),
            Some(other) => (other.as_str(), b""),
        };
        let id = call_id();
        let (reply, ack, _) = self
            .write_kinded("fenced script", &Class::of_lease(lease), |kind| {
                let mut call = Call::new(&script.script);
                call.key(self.keys.runs())
                    .key(self.keys.calls(run))
                    .key(self.keys.claimable_of(kind))
                    .key(self.keys.journal(run))
                    .key(self.keys.ended())
                    .key(self.keys.suspended())
                    .key(self.keys.attempts())
                    .key(self.keys.kinds())
                    .key(self.keys.history())
                    .arg(keys::encode(run.as_str()))
                    .arg(lease.fence().get())
                    .arg(&id)
                    .arg(op)
                    .arg(payload)
                    .arg(kind.arg());
                for key in keys {
                    call.key(key.as_ref());
                }
                for arg in args {
                    call.arg(arg);
                }
                call
            })
            .await?;
        self.confirmed(self.status(lease, &reply), &ack)?;
        let value = reply.into_items().into_iter().nth(1).unwrap_or(Value::Nil);
        T::from_redis_value(value).map_err(|e| Error::backend(crate::error::BACKEND, e.to_string()))
    }
}
