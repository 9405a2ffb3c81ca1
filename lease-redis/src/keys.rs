//! The key layout: every key of a namespace under one hash tag, run ids hex-encoded.
//!
//! A namespace `ns` owns these keys, all sharing the hash tag `{lease:ns}` and therefore one
//! Redis Cluster hash slot:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `{lease:ns}:runs` | hash | every run record, field `<id>`: state, fence, heartbeats, expiry, index member, owner, times, and the facts fixed at creation (flags: default class, no payload, has a trace parent, has waited for a signal; else the class) that spare the hot scripts a look-up (`lua/common.lua` has the format) |
//! | `{lease:ns}:j:<id>` | list | the run's journal, one entry per element |
//! | `{lease:ns}:claimable` | zset | runnable runs of the default kind scored by the instant (µs) they become claimable |
//! | `{lease:ns}:claimable:<kind>` | zset | the same for the runs of another [kind](lease_core::Kind), its name hex-encoded |
//! | `{lease:ns}:claimable[:<kind>]:p<N>` | zset | the same for a kind's runs of priority N, 1 to 9 |
//! | `{lease:ns}:claimable[:<kind>][:p<N>]:q<queue>` | zset | the same for the runs of a [queue](lease_core::Queue) other than the default, its name hex-encoded |
//! | `{lease:ns}:kind` | hash | the classes (kind, priority and queue, [`Class::arg`]) of runs not of the default kind at priority 0 in the default queue; written by create, removed by purge |
//! | `{lease:ns}:queues` | hash | every queue ever paused or resumed: `<queue>` → `1:<µs>` (paused since) or `0:<µs>` (resumed since); read by every `claim_next` |
//! | `{lease:ns}:kinds` | set | every class but the default that a run was created with, for `count` (never shrinks) |
//! | `{lease:ns}:ids` | zset | every run id, score 0, so members sort by id |
//! | `{lease:ns}:seq` | string | the creation counter (claimable-index tiebreak) |
//! | `{lease:ns}:k:<id>` | hash | the run's applied fenced writes under its latest fence: `f` = that fence, then call id → first result, so a resent write answers its first result; dropped by the next fence's first write, or by purge |
//! | `{lease:ns}:jk:<id>` | hash | the run's idempotency keys ([`append_keyed`](lease_core::LeaseStore::append_keyed)): key → position of its journal entry |
//! | `{lease:ns}:ended` | zset | completed and failed runs, `<id>` scored by when they ended (µs, server clock): what [`purge`](lease_core::LeaseStore::purge) removes, oldest first |
//! | `{lease:ns}:delayed` | zset | runs given back with a retry delay, `<id>` scored by the delay's end (entries whose delay is over no longer count): for [`count`](lease_core::LeaseStore::count) |
//! | `{lease:ns}:suspended` | zset | suspended runs, `<id>` scored by when: for `count` |
//! | `{lease:ns}:wait` | hash | the waits for a signal ([`End::AwaitSignal`](lease_core::End::AwaitSignal)): `<id>` → `fence:deadline:name` of the suspended run's wait (deadline in µs, empty for none); its member in the claimable index is scored by the deadline, so `claim_next` takes the run when the wait times out (`lua/record.lua`) |
//! | `{lease:ns}:deadlines` | zset | the waits with a deadline, `<id>` scored by it: for `count`, which counts them suspended |
//! | `{lease:ns}:resumed` | hash | how a run's last wait ended, until it waits again: `<id>` → `S:fence:at:name`, byte 31 and the signal's payload, or `T:fence:deadline:name` for a timeout; read by the claims (for the lease's [`resumed`](lease_core::Lease::resumed)), inspect and signals, removed by purge |
//! | `{lease:ns}:floor` | string | the fence floor: the highest fence of any purged run; every run is created at it, so an id purged and created again never reuses a fence, and a purge deletes everything else of the run |
//! | `{lease:ns}:tomb` | string | the format marker, `format <N>: …` ([`FORMAT`]): a later format is refused at connect, an earlier one raised; an older release kept a hash of purged runs' fences here; connecting folds such a hash into the floor and leaves this string, on which that release's create and purge fail (WRONGTYPE) |
//! | `{lease:ns}:payload` | hash | runs' payloads: `<id>` → the bytes it was created with ([`NewRun::with_payload`](lease_core::NewRun::with_payload)); and their trace parents: `t:<id>` → the `traceparent` it was created under ([`NewRun::with_trace_parent`](lease_core::NewRun::with_trace_parent)), only for a run whose record has the flag `t`; written by create, read by claims and inspect, removed by purge |
//! | `{lease:ns}:failed` | hash | failed runs' reasons: `<id>` → the reason its last holder gave ([`End::Fail`](lease_core::End::Fail)) |
//! | `{lease:ns}:attempts` | hash | the attempt budget's counters: `<id>` → claims since create or resume less voluntary ends ([`RunRecord::attempts`](lease_core::RunRecord::attempts)); no field reads 0 |
//! | `{lease:ns}:hist` | hash | the runs' attempt histories ([`RunRecord::history`](lease_core::RunRecord::history)): `<id>` → its last ended attempts; written by ends, force-release, cancel and the claim that takes over an expired lease (a fenced end, single or in `end_many`, adds its call id as an eighth field, to answer its resend), removed by purge |
//! | `{lease:ns}:barrier` | string | a counter written after each write that must be acknowledged by replicas, so `WAIT` confirms what the write saw |
//! | `{lease:ns}:epoch` | string | the store epoch: a counter every store increments at connect, on every new connection and every 30 s; one that reads back no higher than it had seen knows the namespace was restored (`src/epoch.rs`); a rebind raises it by 2^40 |
//! | `{lease:ns}:restored` | string | the restore marker: set (to why) by the store that saw the epoch go back, or by a rebind in progress; every claiming script refuses while it exists; cleared by a rebind |
//! | `{lease:ns}:u:<id>:<name>` | any | callers' keys for [fenced scripts](crate::FencedScript) |
//!
//! The records share one hash so that every script declares every key it touches, including
//! `claim_next` and `list`, which find runs through an index: a Cluster proxy that checks
//! declared keys accepts them all.
//!
//! `<id>` is the run id's UTF-8 bytes in lower-case hex: it contains no `{`, `}` or `:`, so a
//! run id can neither move a key to another slot nor collide with another run's keys, and hex
//! preserves byte order, so `:runs` sorts exactly as [`RunId`]'s `Ord` does.

use lease_core::{Kind, Lease, NewRun, Queue, RunId, MAX_PRIORITY};

use crate::error::RedisError;

/// The format of the namespace's records this release reads and writes, kept in the format
/// marker ([`Keys::tombstones`]): 2 made purged runs raise the fence floor; 3 put the queue in
/// a run's class; 4 added waits for signals (`:wait`, `:deadlines`, `:resumed`, a waiting run's
/// member in the claimable index, the record's flag `w`), which an earlier release would
/// misread (it drops a waiting run's index entry, and never times its wait out); 5 added
/// runs' trace parents (`t:<id>` in `:payload`, the record's flag `t`), which an earlier
/// release would drop (its leases and records carry none) and leave behind at purge. A
/// namespace at a later format is refused at connect; one at an earlier format is read as this
/// one (a class without a queue is the default queue's; no run waits; no run has a trace
/// parent, its record having no flag `t`) and its marker raised.
pub(crate) const FORMAT: u32 = 5;

/// The marker's text for [`FORMAT`].
pub(crate) const FORMAT_MARKER: &str =
    "format 5: purged runs raise the fence floor (:floor); no tombstones; queues in the class; \
     waits for signals (:wait, :deadlines, :resumed); trace parents (t:<id> in :payload)";

/// The longest namespace accepted, in bytes.
pub const MAX_NAMESPACE_BYTES: usize = 64;

/// Checks a namespace: 1 to 64 ASCII letters, digits, `_`, `-` or `.`.
pub(crate) fn check_namespace(ns: &str) -> Result<(), RedisError> {
    let ok = !ns.is_empty()
        && ns.len() <= MAX_NAMESPACE_BYTES
        && ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(RedisError::Config(format!(
            "namespace {ns:?} is invalid: it must be 1 to {MAX_NAMESPACE_BYTES} ASCII letters, \
             digits, '_', '-' or '.'"
        )))
    }
}

/// A run's kind, priority and queue: which claimable index holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Class {
    pub(crate) kind: Kind,
    pub(crate) priority: u8,
    pub(crate) queue: Queue,
}

impl Class {
    pub(crate) fn of_lease(lease: &Lease) -> Class {
        Class {
            kind: lease.kind().clone(),
            priority: lease.priority(),
            queue: lease.queue().clone(),
        }
    }

    pub(crate) fn of_new(new: &NewRun) -> Class {
        Class {
            kind: new.kind().clone(),
            priority: new.priority(),
            queue: new.queue().clone(),
        }
    }

    /// As the scripts keep it (in the kinds hash, for a run that is not of the default kind
    /// and priority 0 in the default queue): `""` for the default kind at priority 0, else the
    /// kind's name (`""` for the default), then a newline and the priority if it is above 0,
    /// then a vertical tab and the queue's name if it is not the default. Kinds and queues
    /// have no control characters, so both separators are unambiguous.
    pub(crate) fn arg(&self) -> String {
        let kind = kind_arg(&self.kind);
        let mut class = if self.priority == 0 {
            kind.to_owned()
        } else {
            format!("{kind}\n{}", self.priority)
        };
        if !self.queue.is_default() {
            class.push('\x0b');
            class.push_str(self.queue.as_str());
        }
        class
    }

    /// The class `arg` wrote.
    pub(crate) fn parse(s: &str) -> Result<Class, String> {
        let (s, queue) = match s.split_once('\x0b') {
            None => (s, Queue::default()),
            Some((rest, queue)) => (rest, Queue::new(queue).map_err(|e| e.to_string())?),
        };
        let (kind, priority) = match s.split_once('\n') {
            None => (s, 0),
            Some((kind, p)) => match p.parse::<u8>() {
                Ok(p) if (1..=MAX_PRIORITY).contains(&p) => (kind, p),
                _ => return Err(format!("not a run class: {s:?}")),
            },
        };
        let kind = if kind.is_empty() {
            Kind::default()
        } else {
            Kind::new(kind).map_err(|e| e.to_string())?
        };
        Ok(Class {
            kind,
            priority,
            queue,
        })
    }
}

/// A kind as the scripts take it: `""` for the default kind, else its name.
pub(crate) fn kind_arg(kind: &Kind) -> &str {
    if kind.is_default() {
        ""
    } else {
        kind.as_str()
    }
}

/// Lower-case hex of `id`'s UTF-8 bytes.
pub(crate) fn encode(id: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(id.len() * 2);
    for b in id.bytes() {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 0xf)] as char);
    }
    out
}

/// The UTF-8 text whose encoding is `hex`.
fn decode_text(hex: &str) -> Option<String> {
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// The run id whose encoding is `hex`.
pub(crate) fn decode(hex: &str) -> Result<RunId, RedisError> {
    let bad = || RedisError::Reply {
        script: "decode",
        detail: format!("not an encoded run id: {hex:?}"),
    };
    let id = decode_text(hex).ok_or_else(bad)?;
    RunId::new(id).map_err(|_| bad())
}

/// The kind whose encoding is `hex`, as in a claimable index's key.
pub(crate) fn decode_kind(hex: &str) -> Option<Kind> {
    Kind::new(decode_text(hex)?).ok()
}

/// The keys of one namespace.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    /// `{lease:<ns>}`: the hash tag every key starts with.
    tag: String,
}

impl Keys {
    pub(crate) fn new(namespace: &str) -> Keys {
        Keys {
            tag: format!("{{lease:{namespace}}}"),
        }
    }

    pub(crate) fn tag(&self) -> &str {
        &self.tag
    }

    /// The channel of the namespace's wake-ups (common.lua's `wake`).
    pub(crate) fn wake_channel(&self) -> String {
        format!("{}:wake", self.tag)
    }

    /// The hash of every run record, field = encoded run id.
    pub(crate) fn runs(&self) -> String {
        format!("{}:runs", self.tag)
    }

    pub(crate) fn journal(&self, run: &RunId) -> String {
        format!("{}:j:{}", self.tag, encode(run.as_str()))
    }

    /// The default kind's claimable index.
    pub(crate) fn claimable(&self) -> String {
        format!("{}:claimable", self.tag)
    }

    /// The claimable index of `class`'s kind, priority and queue: the default kind's at
    /// priority 0 in the default queue keeps the key it had before kinds; another kind's has
    /// its name in hex; a priority above 0 adds `:p<priority>`, a queue other than the
    /// default `:q<its name in hex>` (hex has no `p` or `q`, so no two classes share a key).
    pub(crate) fn claimable_of(&self, class: &Class) -> String {
        let mut key = if class.kind.is_default() {
            self.claimable()
        } else {
            format!("{}:claimable:{}", self.tag, encode(class.kind.as_str()))
        };
        if class.priority > 0 {
            key.push_str(&format!(":p{}", class.priority));
        }
        if !class.queue.is_default() {
            key.push_str(&format!(":q{}", encode(class.queue.as_str())));
        }
        key
    }

    /// Every queue ever paused or resumed (hash: name → `1:<µs>` when paused since then, or
    /// `0:<µs>` when resumed since then).
    pub(crate) fn queues(&self) -> String {
        format!("{}:queues", self.tag)
    }

    /// The kinds of runs not of the default kind (hash: encoded id → kind).
    pub(crate) fn kinds(&self) -> String {
        format!("{}:kind", self.tag)
    }

    /// Every kind but the default that a run was created with (set of names).
    pub(crate) fn kind_set(&self) -> String {
        format!("{}:kinds", self.tag)
    }

    /// Every run id, for listing in id order.
    pub(crate) fn ids(&self) -> String {
        format!("{}:ids", self.tag)
    }

    pub(crate) fn counter(&self) -> String {
        format!("{}:seq", self.tag)
    }

    /// The run's applied fenced writes under its latest fence (call id → first result).
    pub(crate) fn calls(&self, run: &RunId) -> String {
        format!("{}:k:{}", self.tag, encode(run.as_str()))
    }

    /// The run's idempotency keys: key → position of its journal entry.
    pub(crate) fn journal_keys(&self, run: &RunId) -> String {
        format!("{}:jk:{}", self.tag, encode(run.as_str()))
    }

    /// Ended runs by when they ended (zset: encoded id scored by µs), for retention.
    pub(crate) fn ended(&self) -> String {
        format!("{}:ended", self.tag)
    }

    /// Runs given back with a retry delay (zset: encoded id scored by the delay's end).
    pub(crate) fn delayed(&self) -> String {
        format!("{}:delayed", self.tag)
    }

    /// Suspended runs (zset: encoded id scored by when it was suspended).
    pub(crate) fn suspended(&self) -> String {
        format!("{}:suspended", self.tag)
    }

    /// The waits for a signal (hash: encoded id → `fence:deadline:name`, `lua/record.lua`).
    pub(crate) fn waits(&self) -> String {
        format!("{}:wait", self.tag)
    }

    /// The waits with a deadline (zset: encoded id scored by the deadline, in µs).
    pub(crate) fn deadlines(&self) -> String {
        format!("{}:deadlines", self.tag)
    }

    /// How runs' last waits ended (hash: encoded id → the signal or the timeout,
    /// `lua/record.lua`).
    pub(crate) fn resumed(&self) -> String {
        format!("{}:resumed", self.tag)
    }

    /// The fence floor (string: the highest fence of any purged run).
    pub(crate) fn floor(&self) -> String {
        format!("{}:floor", self.tag)
    }

    /// The format marker, where an older release kept purged runs' fences (a hash).
    pub(crate) fn tombstones(&self) -> String {
        format!("{}:tomb", self.tag)
    }

    /// Failed and cancelled runs' reasons (hash: encoded id → reason).
    pub(crate) fn failures(&self) -> String {
        format!("{}:failed", self.tag)
    }

    /// Runs' payloads (hash: encoded id → the bytes it was created with; no field for a run
    /// created without one), and their trace parents (`t:` and the encoded id → the
    /// `traceparent`; no field for a run created without one).
    pub(crate) fn payloads(&self) -> String {
        format!("{}:payload", self.tag)
    }

    /// Cancelled runs (set of encoded ids), so that count tells them from failed ones (both
    /// keep their reason in [`failures`](Keys::failures)).
    pub(crate) fn cancelled(&self) -> String {
        format!("{}:cancelled", self.tag)
    }

    /// The attempt budget's counters (hash: encoded id → count; absent is 0).
    pub(crate) fn attempts(&self) -> String {
        format!("{}:attempts", self.tag)
    }

    /// The runs' attempt histories (hash: encoded id → its ended attempts, as common.lua's
    /// `push_attempt` writes them).
    pub(crate) fn history(&self) -> String {
        format!("{}:hist", self.tag)
    }

    /// Unique keys (hash: key → the encoded id of the run that took it last, which holds it
    /// while it is live: runnable or suspended).
    pub(crate) fn unique(&self) -> String {
        format!("{}:uniq", self.tag)
    }

    /// The unique key of each run created with one (hash: encoded id → key), for resume and
    /// purge.
    pub(crate) fn unique_of(&self) -> String {
        format!("{}:uniqof", self.tag)
    }

    /// The counter written after a write that replicas must acknowledge.
    /// The store epoch (`src/epoch.rs`).
    pub(crate) fn epoch(&self) -> String {
        format!("{}:epoch", self.tag)
    }

    /// The restore marker (`src/epoch.rs`).
    pub(crate) fn restored(&self) -> String {
        format!("{}:restored", self.tag)
    }

    pub(crate) fn barrier(&self) -> String {
        format!("{}:barrier", self.tag)
    }

    /// A caller's key for `run`, in the run's slot.
    pub(crate) fn user(&self, run: &RunId, name: &str) -> String {
        format!("{}:u:{}:{name}", self.tag, encode(run.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_ids_round_trip_and_keep_order() {
        let ids = [
            "a",
            "a:b",
            "a}b",
            "{x}",
            "}{",
            "a b",
            "ä€𝄞",
            "\u{ffff}",
            &"€".repeat(85),
        ];
        for id in ids {
            let run = RunId::new(id).unwrap();
            let hex = encode(id);
            assert!(hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            assert_eq!(decode(&hex).unwrap(), run);
        }
        let mut sorted: Vec<&str> = ids.to_vec();
        sorted.sort();
        let mut by_hex = ids.to_vec();
        by_hex.sort_by_key(|id| encode(id));
        assert_eq!(sorted, by_hex);
    }

    #[test]
    fn every_key_has_the_namespace_tag_once() {
        let keys = Keys::new("tenant");
        let run = RunId::new("{evil}:x").unwrap();
        for key in [
            keys.runs(),
            keys.journal(&run),
            keys.claimable(),
            keys.claimable_of(&Class {
                kind: Kind::new("{x}:y").unwrap(),
                priority: 9,
                queue: Queue::new("{q}:z").unwrap(),
            }),
            keys.queues(),
            keys.kinds(),
            keys.kind_set(),
            keys.ids(),
            keys.counter(),
            keys.failures(),
            keys.cancelled(),
            keys.ended(),
            keys.waits(),
            keys.deadlines(),
            keys.resumed(),
            keys.epoch(),
            keys.restored(),
            keys.user(&run, "out"),
        ] {
            assert!(key.starts_with("{lease:tenant}:"), "{key}");
            // Redis hashes the text between the first '{' and the next '}'.
            assert_eq!(key.matches('{').count(), 1, "{key}");
            assert_eq!(key.matches('}').count(), 1, "{key}");
        }
    }

    #[test]
    fn namespaces_are_validated() {
        assert!(check_namespace("tenant_1.a-b").is_ok());
        for bad in ["", "a}b", "a{b", "a:b", "a b", &"x".repeat(65)] {
            assert!(check_namespace(bad).is_err(), "{bad:?}");
        }
    }
}
