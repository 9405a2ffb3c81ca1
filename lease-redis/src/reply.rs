//! Reading script replies: status first, then strings (fences stay decimal strings in Lua).

use std::str::FromStr;
use std::sync::Arc;

use lease_core::{
    Attempt, Fence, RunId, RunRecord, RunState, RunTimes, StoreTime, TraceParent, WorkerId,
};
use redis::Value;

use crate::error::RedisError;
use crate::keys::Class;

/// A script's reply as its elements.
pub(crate) struct Reply {
    script: &'static str,
    items: Vec<Value>,
}

impl Reply {
    pub(crate) fn new(script: &'static str, value: Value) -> Result<Reply, RedisError> {
        match value {
            Value::Array(items) => Ok(Reply { script, items }),
            other => Err(RedisError::Reply {
                script,
                detail: format!("expected an array, got {other:?}"),
            }),
        }
    }

    pub(crate) fn bad(&self, detail: impl Into<String>) -> RedisError {
        RedisError::Reply {
            script: self.script,
            detail: detail.into(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn bytes(&self, i: usize) -> Result<&[u8], RedisError> {
        match self.items.get(i) {
            Some(Value::BulkString(b)) => Ok(b),
            Some(Value::SimpleString(s)) => Ok(s.as_bytes()),
            other => Err(self.bad(format!("element {i}: expected a string, got {other:?}"))),
        }
    }

    pub(crate) fn str(&self, i: usize) -> Result<&str, RedisError> {
        std::str::from_utf8(self.bytes(i)?).map_err(|_| self.bad(format!("element {i}: not UTF-8")))
    }

    pub(crate) fn status(&self) -> Result<&str, RedisError> {
        self.str(0)
    }

    pub(crate) fn parse<T: FromStr>(&self, i: usize) -> Result<T, RedisError> {
        let s = self.str(i)?;
        s.parse()
            .map_err(|_| self.bad(format!("element {i}: cannot read {s:?}")))
    }

    pub(crate) fn fence(&self, i: usize) -> Result<Fence, RedisError> {
        Fence::new(self.parse(i)?).map_err(|e| self.bad(e.to_string()))
    }

    pub(crate) fn time(&self, i: usize) -> Result<StoreTime, RedisError> {
        Ok(StoreTime::from_micros(self.parse(i)?))
    }

    /// `''` as `None`, else a time.
    pub(crate) fn opt_time(&self, i: usize) -> Result<Option<StoreTime>, RedisError> {
        if self.str(i)?.is_empty() {
            return Ok(None);
        }
        self.time(i).map(Some)
    }

    /// A payload element as common.lua's `payload_of` writes it: its bytes, or nil for none.
    pub(crate) fn payload(&self, i: usize) -> Result<Option<Arc<[u8]>>, RedisError> {
        match self.items.get(i) {
            Some(Value::Nil) => Ok(None),
            Some(Value::BulkString(bytes)) => Ok(Some(Arc::from(bytes.as_slice()))),
            other => Err(self.bad(format!("element {i}: expected a payload, got {other:?}"))),
        }
    }

    /// A trace parent element as common.lua's `trace_of` writes it: a version-00
    /// `traceparent`, or nil for none. A stored text that is not one is a corrupt record.
    pub(crate) fn trace_parent(&self, i: usize) -> Result<Option<TraceParent>, RedisError> {
        let Some(bytes) = self.payload(i)? else {
            return Ok(None);
        };
        std::str::from_utf8(&bytes)
            .ok()
            .and_then(|text| TraceParent::new(text).ok())
            .map(Some)
            .ok_or_else(|| {
                self.bad(format!(
                    "element {i}: not a trace parent: {:?}",
                    String::from_utf8_lossy(&bytes)
                ))
            })
    }

    pub(crate) fn state(&self, i: usize) -> Result<RunState, RedisError> {
        self.parse(i)
    }

    /// `''` as `None`, else a worker id.
    pub(crate) fn owner(&self, i: usize) -> Result<Option<WorkerId>, RedisError> {
        let s = self.str(i)?;
        if s.is_empty() {
            return Ok(None);
        }
        WorkerId::new(s)
            .map(Some)
            .map_err(|e| self.bad(e.to_string()))
    }

    /// A run's class (kind and priority) as the scripts write it ([`Class::arg`]).
    pub(crate) fn class(&self, i: usize) -> Result<Class, RedisError> {
        Class::parse(self.str(i)?).map_err(|e| self.bad(format!("element {i}: {e}")))
    }

    /// The ten record fields (state, owner, expiry, fence, heartbeats, failure, attempts,
    /// kind, times, wait) from `i`.
    /// The expiry field of an unowned runnable run is the instant it is claimable from: its
    /// delay's end ahead of the read, or since when it has been claimable.
    pub(crate) fn record(
        &self,
        run: RunId,
        i: usize,
        observed_at: StoreTime,
    ) -> Result<RunRecord, RedisError> {
        let owner = self.owner(i + 1)?;
        let state = self.state(i)?;
        let at = self.opt_time(i + 2)?;
        let failure = self.str(i + 5)?;
        let mut record = RunRecord::new(run, state, self.fence(i + 3)?, observed_at)
            .with_heartbeats(self.parse(i + 4)?)
            .with_not_before(
                at.filter(|at| owner.is_none() && state == RunState::Runnable && *at > observed_at),
            )
            .with_claimable_since(
                at.filter(|at| {
                    owner.is_none() && state == RunState::Runnable && *at <= observed_at
                }),
            )
            .with_failure(
                matches!(state, RunState::Failed | RunState::Cancelled).then(|| failure.to_owned()),
            )
            .with_attempts(self.parse(i + 6)?)
            .with_kind(self.class(i + 7)?.kind)
            .with_queue(self.class(i + 7)?.queue)
            .with_priority(self.class(i + 7)?.priority)
            .with_times(self.times(i + 8)?);
        record.wait = self.wait(i + 9)?;
        record.expires_at = if owner.is_some() { at } else { None };
        record.owner = owner;
        Ok(record)
    }

    /// Fields in one record.
    pub(crate) const RECORD_FIELDS: usize = 10;

    /// A run's wait for a signal, as the wait hash keeps it (`fence:deadline:name`, deadline
    /// '' for none; `lua/record.lua`), or '' for none.
    pub(crate) fn wait(&self, i: usize) -> Result<Option<lease_core::Wait>, RedisError> {
        let text = self.str(i)?;
        if text.is_empty() {
            return Ok(None);
        }
        crate::signal::parse_wait(text)
            .map(Some)
            .ok_or_else(|| self.bad(format!("element {i}: wait {text:?}")))
    }

    /// How a run's last wait ended, as the resumed hash keeps it (`lua/record.lua`), or a nil
    /// reply for none.
    pub(crate) fn resumed(&self, i: usize) -> Result<Option<lease_core::WaitEnd>, RedisError> {
        match self.payload(i)? {
            None => Ok(None),
            Some(bytes) => crate::signal::parse_resumed(&bytes)
                .map(Some)
                .ok_or_else(|| self.bad(format!("element {i}: a malformed wait end"))),
        }
    }

    /// A record's times, `created,claimed,renewed,ended` in µs on the server clock, each
    /// empty when unknown or none.
    pub(crate) fn times(&self, i: usize) -> Result<RunTimes, RedisError> {
        let text = self.str(i)?;
        let mut parts = text.split(',');
        let mut next = || -> Result<Option<StoreTime>, RedisError> {
            match parts.next() {
                Some("") => Ok(None),
                Some(us) => us
                    .parse()
                    .map(|us| Some(StoreTime::from_micros(us)))
                    .map_err(|_| self.bad(format!("element {i}: times {text:?}"))),
                None => Err(self.bad(format!("element {i}: times {text:?}"))),
            }
        };
        let times = RunTimes {
            created_at: next()?,
            claimed_at: next()?,
            renewed_at: next()?,
            ended_at: next()?,
        };
        if parts.next().is_some() {
            return Err(self.bad(format!("element {i}: times {text:?}")));
        }
        Ok(times)
    }

    /// The attempt history at `i`, as common.lua's `push_attempt` writes it (a nil reply:
    /// none).
    pub(crate) fn history(&self, i: usize) -> Result<Vec<Attempt>, RedisError> {
        let Some(bytes) = self.payload(i)? else {
            return Ok(Vec::new());
        };
        let bad = |what: &str| self.bad(format!("element {i}: attempt history: {what}"));
        let text = std::str::from_utf8(&bytes).map_err(|_| bad("not UTF-8"))?;
        let time = |us: &str| -> Result<Option<StoreTime>, RedisError> {
            if us.is_empty() {
                return Ok(None);
            }
            us.parse()
                .map(|us| Some(StoreTime::from_micros(us)))
                .map_err(|_| bad("a time"))
        };
        let mut out = Vec::new();
        for entry in text.split('\u{1e}') {
            let f: Vec<&str> = entry.split('\u{1f}').collect();
            // An end by a fenced call has that call's id after its error (fenced.lua): it
            // answers the call's resend, and is no part of the attempt.
            let f = if f.len() == 8 { &f[..7] } else { &f[..] };
            let [number, fence, worker, claimed, ended, outcome, error] = f[..] else {
                return Err(bad("an entry of another shape"));
            };
            let number = number.parse().map_err(|_| bad("an attempt number"))?;
            let fence = Fence::new(fence.parse().map_err(|_| bad("a fence"))?)
                .map_err(|_| bad("fence 0"))?;
            let worker = WorkerId::new(worker).map_err(|_| bad("a worker id"))?;
            let outcome = outcome.parse().map_err(|_| bad("an outcome"))?;
            let error = match error.strip_prefix('=') {
                Some(text) => Some(text.to_owned()),
                None if error.is_empty() => None,
                None => return Err(bad("an error")),
            };
            out.push(
                Attempt::new(number, fence, worker, outcome)
                    .with_times(time(claimed)?, time(ended)?)
                    .with_error(error),
            );
        }
        Ok(out)
    }

    /// The nested reply at `i`.
    pub(crate) fn nested(&self, i: usize) -> Result<Reply, RedisError> {
        match self.items.get(i) {
            Some(v) => Reply::new(self.script, v.clone()),
            None => Err(self.bad(format!("element {i} missing"))),
        }
    }

    pub(crate) fn into_items(self) -> Vec<Value> {
        self.items
    }
}
