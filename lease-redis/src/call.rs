//! One script call as it goes on the wire, and what the replicas said about it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use redis::{Cmd, Script, ToRedisArgs};

use crate::error::RedisError;

/// A Lua script and its SHA1: run with `EVALSHA`, loaded with `SCRIPT LOAD` (on a Cluster,
/// on the namespace's node only) when the server answers `NOSCRIPT`.
pub(crate) struct Lua {
    source: String,
    script: Script,
}

/// What every script starts with when it is loaded: the contract's limits the scripts need
/// ([`lease_core::limits`]) as Lua locals (the scripts name them; none spells the numbers),
/// then `lua/record.lua`, the run record's and the attempt history's one reader and writer.
pub fn script_prelude() -> String {
    format!(
        "-- lease_core::limits, rendered as the script is loaded\n\
         local MAX_HISTORY = {}\n\
         local MAX_ATTEMPT_ERROR_BYTES = {}\n\
         local MAX_PRIORITY = {}\n{}",
        lease_core::MAX_HISTORY,
        lease_core::MAX_ATTEMPT_ERROR_BYTES,
        lease_core::MAX_PRIORITY,
        include_str!("../lua/record.lua"),
    )
}

impl Lua {
    /// The script `source`, after [`script_prelude`].
    pub(crate) fn new(source: impl Into<String>) -> Lua {
        let source = script_prelude() + &source.into();
        Lua {
            script: Script::new(&source),
            source,
        }
    }

    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    pub(crate) fn hash(&self) -> &str {
        self.script.get_hash()
    }
}

/// A script with its keys and arguments, sent as `EVALSHA` (and loaded on `NOSCRIPT`).
///
/// The adapter's own type rather than redis-rs's `ScriptInvocation`, whose command cannot be
/// put in a pipeline: a write that replicas must acknowledge travels as one pipeline of the
/// script, a barrier write and `WAIT`, on one connection.
pub(crate) struct Call<'a> {
    script: &'a Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl<'a> Call<'a> {
    pub(crate) fn new(script: &'a Lua) -> Call<'a> {
        Call {
            script,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    /// Adds a key (`KEYS[i]`).
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Adds an argument (`ARGV[i]`).
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    pub(crate) fn script(&self) -> &Lua {
        self.script
    }

    /// `EVALSHA sha numkeys keys… args…`.
    pub(crate) fn cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.hash())
            .arg(self.keys.len())
            .arg(&*self.keys)
            .arg(&*self.args);
        cmd
    }
}

/// What `WAIT` said after a write: how many replicas acknowledged it, against how many the
/// store requires.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ack {
    wanted: u32,
    acked: i64,
    timeout_ms: u128,
}

impl Ack {
    /// No replica acknowledgement is required.
    pub(crate) fn none() -> Ack {
        Ack {
            wanted: 0,
            acked: 0,
            timeout_ms: 0,
        }
    }

    pub(crate) fn new(wanted: u32, acked: i64, timeout_ms: u128) -> Ack {
        Ack {
            wanted,
            acked,
            timeout_ms,
        }
    }

    /// `Ok` when the required replicas hold everything the script wrote or saw, else the
    /// retryable [`RedisError::Replicas`]: a result nobody else may have is never reported.
    pub(crate) fn confirm(&self) -> Result<(), RedisError> {
        if self.acked >= i64::from(self.wanted) {
            Ok(())
        } else {
            Err(RedisError::Replicas {
                acked: self.acked,
                wanted: self.wanted,
                timeout_ms: self.timeout_ms,
            })
        }
    }
}

/// A fresh id for one fenced write, which its script records with the write's result: a
/// resend of the same call (the driver's or a proxy's) finds it and answers the first result
/// instead of applying the write again. Unique per process (a random start) and per call.
pub(crate) fn call_id() -> String {
    static START: LazyLock<u64> = LazyLock::new(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(now.as_nanos());
        }
        h.finish()
    });
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{:016x}{:x}", *START, NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_ids_do_not_repeat() {
        let ids: std::collections::HashSet<String> = (0..10_000).map(|_| call_id()).collect();
        assert_eq!(ids.len(), 10_000);
    }

    #[test]
    fn an_ack_short_of_the_replicas_wanted_is_refused() {
        assert!(Ack::none().confirm().is_ok());
        assert!(Ack::new(1, 1, 300).confirm().is_ok());
        let err = lease_core::Error::from(Ack::new(2, 1, 300).confirm().unwrap_err());
        assert!(err.is_retryable(), "{err}");
        assert!(err.to_string().contains("only 1 of 2 replicas"), "{err}");
    }
}
