//! Key layout and value encoding.
//!
//! Every key is `prefix NUL kind NUL …`. Run ids hold no control characters, so a NUL after
//! a run id ends it: `prefix\0j\0run\0` lists exactly that run's journal, never that of a run
//! whose id starts with `run`.
//!
//! | key | value | lifetime |
//! |---|---|---|
//! | `r\0{run}` | the run record ([`Rec`]), fence included, and the run's trace parent if it has one ([`Rec::trace_parent`]) | never leased; deleted by purge (records an older release left as tombstones are honoured by create) |
//! | `F\0` | the fence floor: the highest fence of any purged run, in decimal | raised by purge, compared by create: every run starts at it |
//! | `b\0{run}` | `h` (held) or `d` (delayed) | attached to an etcd lease: gone when it expires |
//! | `d\0{run}` | empty: the run is delayed (for counts) | on the delay's lease, beside the block |
//! | `i\0{state}{since}{run}` | empty | the state index, ordered by claimable-since / ended-at; runnable runs of the default kind |
//! | `i\0K{kind}\0{since}{run}` | empty | the runnable runs of another kind ([`Rec::kind`]): a claim of a kind reads its own family only |
//! | `p\0{run}` | the run's payload, the bytes it was created with | written by create, deleted by purge |
//! | `j\0{run}\0{seq}` | a journal entry | until purge |
//! | `k\0{run}\0{key}` | the entry's seq | until purge |
//! | `s\0{state}{run}` | empty: the runs of a state by id (for `list`) | until the state changes |
//! | `w\0{kind}` | milliseconds until claimable: put by every write that makes a run of the kind claimable, watched by the stores' wake-up listeners | overwritten (one key per kind) |

use lease_core::{AttemptOutcome, Error, RunState, TraceParent};

use crate::error::BACKEND;

/// Builds every key of one store's namespace.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: Vec<u8>,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Keys {
        let mut p = prefix.as_bytes().to_vec();
        p.push(0);
        Keys { prefix: p }
    }

    fn kind(&self, kind: u8) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.push(kind);
        k.push(0);
        k
    }

    pub(crate) fn records(&self) -> Vec<u8> {
        self.kind(b'r')
    }

    pub(crate) fn record(&self, run: &str) -> Vec<u8> {
        let mut k = self.records();
        k.extend_from_slice(run.as_bytes());
        k
    }

    /// The run id of a record key.
    pub(crate) fn run_of_record<'a>(&self, key: &'a [u8]) -> Option<&'a str> {
        let base = self.prefix.len() + 2;
        key.get(base..).and_then(|r| std::str::from_utf8(r).ok())
    }

    /// The fence floor: every run is created at it, and every purge raises it to the fences it
    /// removes, so an id purged and created again never reuses a fence.
    pub(crate) fn floor(&self) -> Vec<u8> {
        self.kind(b'F')
    }

    pub(crate) fn blocks(&self) -> Vec<u8> {
        self.kind(b'b')
    }

    pub(crate) fn block(&self, run: &str) -> Vec<u8> {
        let mut k = self.blocks();
        k.extend_from_slice(run.as_bytes());
        k
    }

    /// The family of delay markers: a key per delayed run, on the delay's lease beside its
    /// block, so that held and delayed runs are counted without reading every block.
    pub(crate) fn delays(&self) -> Vec<u8> {
        self.kind(b'd')
    }

    pub(crate) fn delay(&self, run: &str) -> Vec<u8> {
        let mut k = self.delays();
        k.extend_from_slice(run.as_bytes());
        k
    }

    /// The run's payload (written only for a run created with one: see [`Rec::payload`]).
    pub(crate) fn payload(&self, run: &str) -> Vec<u8> {
        let mut k = self.kind(b'p');
        k.extend_from_slice(run.as_bytes());
        k
    }

    pub(crate) fn journal_prefix(&self, run: &str) -> Vec<u8> {
        let mut k = self.kind(b'j');
        k.extend_from_slice(run.as_bytes());
        k.push(0);
        k
    }

    pub(crate) fn entry(&self, run: &str, seq: u64) -> Vec<u8> {
        let mut k = self.journal_prefix(run);
        k.extend_from_slice(&seq.to_be_bytes());
        k
    }

    pub(crate) fn keys_prefix(&self, run: &str) -> Vec<u8> {
        let mut k = self.kind(b'k');
        k.extend_from_slice(run.as_bytes());
        k.push(0);
        k
    }

    pub(crate) fn idempotency(&self, run: &str, key: &str) -> Vec<u8> {
        let mut k = self.keys_prefix(run);
        k.extend_from_slice(key.as_bytes());
        k
    }

    /// The index family of `state`.
    pub(crate) fn index_family(&self, state: RunState) -> Vec<u8> {
        let mut k = self.kind(b'i');
        k.push(state_byte(state));
        k
    }

    /// The index family of the runnable runs of `kind` (`None`: the default kind) at
    /// `priority`. The default kind at priority 0 has the runnable state's family; another
    /// kind at priority 0 has `i\0K{kind}\0`; a priority above 0 has `i\0P{priority}{kind}\0`
    /// (the default kind's name empty: a kind is never empty). A kind holds no NUL, so the NUL
    /// after it ends it.
    pub(crate) fn runnable_family(&self, kind: Option<&str>, priority: u8) -> Vec<u8> {
        match (kind, priority) {
            (None, 0) => self.index_family(RunState::Runnable),
            (Some(kind), 0) => {
                let mut k = self.kinds_family();
                k.extend_from_slice(kind.as_bytes());
                k.push(0);
                k
            }
            (kind, priority) => {
                let mut k = self.priorities_family();
                k.push(priority);
                k.extend_from_slice(kind.unwrap_or_default().as_bytes());
                k.push(0);
                k
            }
        }
    }

    /// Every runnable family of a priority above 0 (for counts).
    pub(crate) fn priorities_family(&self) -> Vec<u8> {
        let mut k = self.kind(b'i');
        k.push(b'P');
        k
    }

    /// Every runnable family of a kind other than the default (for counts).
    pub(crate) fn kinds_family(&self) -> Vec<u8> {
        let mut k = self.kind(b'i');
        k.push(b'K');
        k
    }

    /// A run's index key: in `state`'s family, or for a runnable run in its kind's and
    /// priority's.
    pub(crate) fn index(
        &self,
        state: RunState,
        kind: Option<&str>,
        priority: u8,
        since: u64,
        run: &str,
    ) -> Vec<u8> {
        let mut k = if state == RunState::Runnable {
            self.runnable_family(kind, priority)
        } else {
            self.index_family(state)
        };
        k.extend_from_slice(&since.to_be_bytes());
        k.extend_from_slice(run.as_bytes());
        k
    }

    /// The first key of index family `family` past every entry at or before `since`.
    pub(crate) fn family_bound(family: &[u8], since: u64) -> Vec<u8> {
        let mut k = family.to_vec();
        k.extend_from_slice(&since.saturating_add(1).to_be_bytes());
        k
    }

    /// `(since, run)` of an index key of `family`.
    pub(crate) fn parse_index<'a>(family: &[u8], key: &'a [u8]) -> Option<(u64, &'a str)> {
        let base = family.len();
        if !key.starts_with(family) {
            return None;
        }
        let since = u64::from_be_bytes(key.get(base..base + 8)?.try_into().ok()?);
        let run = std::str::from_utf8(key.get(base + 8..)?).ok()?;
        Some((since, run))
    }

    /// The runs in `state`, ordered by id (for `list` by state).
    pub(crate) fn state_family(&self, state: RunState) -> Vec<u8> {
        let mut k = self.kind(b's');
        k.push(state_byte(state));
        k
    }

    pub(crate) fn state_entry(&self, state: RunState, run: &str) -> Vec<u8> {
        let mut k = self.state_family(state);
        k.extend_from_slice(run.as_bytes());
        k
    }

    /// The run id of a state entry.
    pub(crate) fn run_of_state_entry<'a>(&self, key: &'a [u8]) -> Option<&'a str> {
        let base = self.prefix.len() + 3;
        key.get(base..).and_then(|r| std::str::from_utf8(r).ok())
    }

    /// The wake keys' family (`w\0`), which the stores' listeners watch.
    pub(crate) fn wakes(&self) -> Vec<u8> {
        self.kind(b'w')
    }

    /// The wake key of `kind` (its name: the default kind's too).
    pub(crate) fn wake(&self, kind: &str) -> Vec<u8> {
        let mut k = self.wakes();
        k.extend_from_slice(kind.as_bytes());
        k
    }

    /// The kind a wake key names.
    pub(crate) fn kind_of_wake<'a>(&self, key: &'a [u8]) -> Option<&'a str> {
        let base = self.prefix.len() + 2;
        key.get(base..).and_then(|k| std::str::from_utf8(k).ok())
    }

    pub(crate) fn meta(&self) -> Vec<u8> {
        self.kind(b'm')
    }
}

/// The end of the range of every key starting with `prefix` (etcd's `range_end`).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn state_byte(state: RunState) -> u8 {
    match state {
        RunState::Runnable => b'r',
        RunState::Suspended => b's',
        RunState::Completed => b'c',
        RunState::Cancelled => b'x',
        _ => b'f',
    }
}

/// A run record as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rec {
    /// `None`: a tombstone (a purged run): only its fence is kept.
    pub(crate) state: Option<RunState>,
    pub(crate) fence: u64,
    pub(crate) heartbeats: u64,
    pub(crate) journal_len: u64,
    /// Its index position: when it became (or becomes) claimable, or when it ended; client
    /// microseconds, for ordering and reporting only.
    pub(crate) since: u64,
    pub(crate) owner: Option<String>,
    pub(crate) expires_at: u64,
    pub(crate) not_before: u64,
    pub(crate) ttl_ms: u64,
    pub(crate) failure: Option<String>,
    /// The attempt budget's counter (claims since create or resume, less voluntary ends).
    pub(crate) attempts: u64,
    /// Milliseconds the run stays held or delayed after its block's lease expires: a TTL or
    /// delay longer than the store's `max_lease` is timed by etcd in links of at most that,
    /// each re-armed by the next reader that finds the block gone (0: no link left).
    pub(crate) rest: u64,
    /// Whether the run was created with a payload (its `p` key), so that claims and inspect
    /// read that key only for the runs that have one.
    pub(crate) payload: bool,
    /// The run's kind, `None` for the default kind (and for records written before kinds).
    pub(crate) kind: Option<String>,
    /// The run's priority (0 for records written before priorities).
    pub(crate) priority: u8,
    /// When the run was created, client microseconds; 0: unknown (a record written before
    /// times were kept).
    pub(crate) created: u64,
    /// When its latest claim took it, client microseconds; 0: never claimed.
    pub(crate) claimed: u64,
    /// When that claim's lease was last renewed, client microseconds; 0: not renewed.
    pub(crate) renewed: u64,
    /// Its ended attempts, oldest first, at most [`MAX_HISTORY`](lease_core::MAX_HISTORY).
    pub(crate) history: Vec<Tried>,
    /// The trace context the run was created under
    /// ([`NewRun::with_trace_parent`](lease_core::NewRun::with_trace_parent)), fixed for its
    /// life: in the record itself (55 bytes), so that every claim, inspect and purge that
    /// reads or deletes the record has it, with no key of its own. `None` for a run created
    /// without one, and for every record written before trace parents were kept.
    pub(crate) trace_parent: Option<TraceParent>,
}

/// An ended attempt as stored (see [`lease_core::Attempt`]); times in client microseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tried {
    pub(crate) number: u64,
    pub(crate) fence: u64,
    pub(crate) worker: String,
    pub(crate) claimed: u64,
    pub(crate) ended: u64,
    pub(crate) outcome: AttemptOutcome,
    pub(crate) error: Option<String>,
}

impl Tried {
    pub(crate) fn attempt(&self) -> Result<lease_core::Attempt, Error> {
        let at = |us: u64| (us > 0).then(|| lease_core::StoreTime::from_micros(us));
        Ok(lease_core::Attempt::new(
            self.number,
            lease_core::Fence::new(self.fence)?,
            lease_core::WorkerId::new(&self.worker)?,
            self.outcome,
        )
        .with_times(at(self.claimed), at(self.ended))
        .with_error(self.error.clone()))
    }
}

const VERSION: u8 = 1;
const TOMBSTONE: u8 = 0xff;

impl Rec {
    pub(crate) fn fresh(fence: u64, now: u64) -> Rec {
        Rec {
            state: Some(RunState::Runnable),
            fence,
            heartbeats: 0,
            journal_len: 0,
            since: now,
            owner: None,
            expires_at: 0,
            not_before: 0,
            ttl_ms: 0,
            failure: None,
            attempts: 0,
            rest: 0,
            payload: false,
            kind: None,
            priority: 0,
            created: now,
            claimed: 0,
            renewed: 0,
            history: Vec::new(),
            trace_parent: None,
        }
    }

    /// A tombstone as an older release wrote it in a purged run's place (this release deletes
    /// the record and raises the fence floor instead; create still honours old tombstones).
    #[cfg(test)]
    pub(crate) fn tombstone(fence: u64) -> Rec {
        Rec {
            state: None,
            created: 0,
            ..Rec::fresh(fence, 0)
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.push(VERSION);
        out.push(self.state.map_or(TOMBSTONE, state_byte));
        for n in [
            self.fence,
            self.heartbeats,
            self.journal_len,
            self.since,
            self.expires_at,
            self.not_before,
            self.ttl_ms,
        ] {
            out.extend_from_slice(&n.to_be_bytes());
        }
        put_text(&mut out, self.owner.as_deref());
        put_text(&mut out, self.failure.as_deref());
        // Last, so a record written before the counter existed reads as 0 attempts.
        out.extend_from_slice(&self.attempts.to_be_bytes());
        out.extend_from_slice(&self.rest.to_be_bytes());
        out.extend_from_slice(&u64::from(self.payload).to_be_bytes());
        // Trailing and optional, so records of the default kind at priority 0 are as before;
        // written whenever the times follow them.
        let traced = self.trace_parent.is_some();
        let times =
            self.created | self.claimed | self.renewed != 0 || !self.history.is_empty() || traced;
        if self.kind.is_some() || self.priority > 0 || times {
            put_text(&mut out, self.kind.as_deref());
        }
        if self.priority > 0 || times {
            out.push(self.priority);
        }
        if times {
            for n in [self.created, self.claimed, self.renewed] {
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
        // Trailing and only when there is one: its count (1 to MAX_HISTORY), then each attempt;
        // a count of 0 (no attempt) only when a trace parent follows.
        if !self.history.is_empty() || traced {
            out.push(self.history.len() as u8);
            for t in &self.history {
                for n in [t.number, t.fence, t.claimed, t.ended] {
                    out.extend_from_slice(&n.to_be_bytes());
                }
                put_text(&mut out, Some(&t.worker));
                put_text(&mut out, Some(t.outcome.as_str()));
                put_text(&mut out, t.error.as_deref());
            }
        }
        // Trailing and only for a run created with one, so every other record is as before
        // (and an older release, which knows no count of 0, refuses a record with one rather
        // than drop it).
        if let Some(parent) = &self.trace_parent {
            put_text(&mut out, Some(parent.as_str()));
        }
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Rec, Error> {
        let corrupt = || {
            Error::backend(
                BACKEND,
                "a run record in etcd is not in this adapter's format",
            )
        };
        let mut r = Reader(bytes);
        if r.byte().ok_or_else(corrupt)? != VERSION {
            return Err(corrupt());
        }
        let state = match r.byte().ok_or_else(corrupt)? {
            b'r' => Some(RunState::Runnable),
            b's' => Some(RunState::Suspended),
            b'c' => Some(RunState::Completed),
            b'f' => Some(RunState::Failed),
            b'x' => Some(RunState::Cancelled),
            TOMBSTONE => None,
            _ => return Err(corrupt()),
        };
        let mut n = [0u64; 7];
        for slot in &mut n {
            *slot = r.u64().ok_or_else(corrupt)?;
        }
        let owner = r.text().ok_or_else(corrupt)?;
        let failure = r.text().ok_or_else(corrupt)?;
        // Absent from records written before the attempt budget.
        let mut trailing = || {
            if r.0.is_empty() {
                Ok(0)
            } else {
                r.u64().ok_or_else(corrupt)
            }
        };
        let attempts = trailing()?;
        // Absent from records written before chained leases.
        let rest = trailing()?;
        // Absent from records written before payloads.
        let payload = trailing()? != 0;
        // Absent from records of the default kind, and from those written before kinds.
        let kind = if r.0.is_empty() {
            None
        } else {
            r.text().ok_or_else(corrupt)?
        };
        // Absent from records of priority 0, and from those written before priorities.
        let priority = if r.0.is_empty() {
            0
        } else {
            r.byte().ok_or_else(corrupt)?
        };
        // Absent from records written before times were kept (and from tombstones).
        let mut times = [0u64; 3];
        if !r.0.is_empty() {
            for slot in &mut times {
                *slot = r.u64().ok_or_else(corrupt)?;
            }
        }
        // Absent when the run has no ended attempt and no trace parent follows (a count of 0:
        // none, before a trace parent).
        let mut history = Vec::new();
        let mut trace_parent = None;
        if !r.0.is_empty() {
            let count = usize::from(r.byte().ok_or_else(corrupt)?);
            if (count == 0 && r.0.is_empty()) || count > lease_core::MAX_HISTORY {
                return Err(corrupt());
            }
            for _ in 0..count {
                let mut n = [0u64; 4];
                for slot in &mut n {
                    *slot = r.u64().ok_or_else(corrupt)?;
                }
                let worker = r.text().ok_or_else(corrupt)?.ok_or_else(corrupt)?;
                let outcome = r.text().ok_or_else(corrupt)?.ok_or_else(corrupt)?;
                history.push(Tried {
                    number: n[0],
                    fence: n[1],
                    claimed: n[2],
                    ended: n[3],
                    worker,
                    outcome: outcome.parse().map_err(|_| corrupt())?,
                    error: r.text().ok_or_else(corrupt)?,
                });
            }
            // Absent from records of runs created without one, and from those written before
            // trace parents were kept. One that is not a traceparent is a corrupt record.
            if !r.0.is_empty() {
                let text = r.text().ok_or_else(corrupt)?.ok_or_else(corrupt)?;
                trace_parent = Some(TraceParent::new(&text).map_err(|why| {
                    Error::backend(
                        BACKEND,
                        format!("a run record in etcd has a corrupt trace parent {text:?}: {why}"),
                    )
                })?);
            }
        }
        if !r.0.is_empty() {
            return Err(corrupt());
        }
        Ok(Rec {
            state,
            fence: n[0],
            heartbeats: n[1],
            journal_len: n[2],
            since: n[3],
            expires_at: n[4],
            not_before: n[5],
            ttl_ms: n[6],
            owner,
            failure,
            attempts,
            rest,
            payload,
            kind,
            priority,
            created: times[0],
            claimed: times[1],
            renewed: times[2],
            history,
            trace_parent,
        })
    }
}

/// A journal entry as stored.
pub(crate) fn encode_entry(fence: u64, written_at: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + payload.len());
    out.extend_from_slice(&fence.to_be_bytes());
    out.extend_from_slice(&written_at.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

pub(crate) fn decode_entry(bytes: &[u8]) -> Result<(u64, u64, Vec<u8>), Error> {
    let mut r = Reader(bytes);
    match (r.u64(), r.u64()) {
        (Some(fence), Some(at)) => Ok((fence, at, r.0.to_vec())),
        _ => Err(Error::backend(
            BACKEND,
            "a journal entry in etcd is not in this adapter's format",
        )),
    }
}

fn put_text(out: &mut Vec<u8>, text: Option<&str>) {
    match text {
        None => out.extend_from_slice(&u32::MAX.to_be_bytes()),
        Some(t) => {
            out.extend_from_slice(&(t.len() as u32).to_be_bytes());
            out.extend_from_slice(t.as_bytes());
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }

    fn text(&mut self) -> Option<Option<String>> {
        let len = u32::from_be_bytes(self.take(4)?.try_into().ok()?);
        if len == u32::MAX {
            return Some(None);
        }
        let bytes = self.take(len as usize)?;
        Some(Some(std::str::from_utf8(bytes).ok()?.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_a_typed_error() {
        let mut rec = Rec::fresh(7, 42);
        rec.owner = Some("w-1".into());
        rec.failure = Some("gave up".into());
        rec.expires_at = 99;
        assert_eq!(Rec::decode(&rec.encode()).unwrap(), rec);
        rec.kind = Some("email".into());
        rec.payload = true;
        assert_eq!(Rec::decode(&rec.encode()).unwrap(), rec);
        rec.priority = 7;
        assert_eq!(Rec::decode(&rec.encode()).unwrap(), rec);
        rec.kind = None;
        assert_eq!(Rec::decode(&rec.encode()).unwrap(), rec);
        assert_eq!(Rec::decode(&Rec::tombstone(3).encode()).unwrap().fence, 3);
        // Times: with the default kind at priority 0 too, which then write both.
        rec.priority = 0;
        rec.claimed = 50;
        rec.renewed = 60;
        assert_eq!(Rec::decode(&rec.encode()).unwrap(), rec);
        // A record written before times (created 0) reads as before, without them.
        let mut old = Rec::fresh(7, 42);
        old.created = 0;
        let bytes = old.encode();
        assert_eq!(Rec::decode(&bytes).unwrap(), old);
        // A full attempt history round-trips; a count of 0 is refused.
        let mut held = rec.clone();
        held.owner = Some("w-2".into());
        held.attempts = 3;
        held.history = (0..lease_core::MAX_HISTORY as u64)
            .map(|i| Tried {
                number: i + 1,
                fence: i + 1,
                worker: "w-2".into(),
                claimed: 90 + i,
                ended: 100 + i,
                outcome: AttemptOutcome::Retried,
                error: Some("boom".into()),
            })
            .collect();
        assert_eq!(Rec::decode(&held.encode()).unwrap(), held);
        let mut counted = rec.encode();
        counted.push(0);
        assert!(Rec::decode(&counted).is_err());
        let mut trailing = rec.encode();
        trailing.push(0);
        assert!(matches!(Rec::decode(&trailing), Err(Error::Backend { .. })));
        for bad in [&b""[..], b"\x02r", b"\x01r\0\0"] {
            assert!(matches!(Rec::decode(bad), Err(Error::Backend { .. })));
        }
    }

    /// A trace parent is a trailing field, written only for a run created with one: every
    /// other record's bytes are as before (so a record written before trace parents reads as
    /// none), one with it round-trips with and without attempts, and a stored text that is not
    /// a traceparent is a corrupt record, a typed error.
    #[test]
    fn a_trace_parent_trails_the_record_and_a_corrupt_one_is_a_typed_error() {
        let parent =
            TraceParent::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let plain = Rec::fresh(7, 42);
        let mut traced = plain.clone();
        traced.trace_parent = Some(parent.clone());
        let (plain_bytes, traced_bytes) = (plain.encode(), traced.encode());
        assert_eq!(Rec::decode(&plain_bytes).unwrap().trace_parent, None);
        // The plain record's bytes, a count of no attempts, then the text.
        assert!(traced_bytes.starts_with(&plain_bytes));
        assert_eq!(traced_bytes[plain_bytes.len()], 0);
        assert_eq!(traced_bytes.len(), plain_bytes.len() + 1 + 4 + 55);
        assert_eq!(Rec::decode(&traced_bytes).unwrap(), traced);
        // Without times (as a record before them) and with a kind: the times are written.
        let mut old = traced.clone();
        old.created = 0;
        old.kind = Some("email".into());
        assert_eq!(Rec::decode(&old.encode()).unwrap(), old);
        // With attempts, and nothing before the history written for it.
        traced.history = vec![Tried {
            number: 1,
            fence: 8,
            worker: "w".into(),
            claimed: 50,
            ended: 60,
            outcome: AttemptOutcome::Retried,
            error: None,
        }];
        let decoded = Rec::decode(&traced.encode()).unwrap();
        assert_eq!(decoded, traced);
        assert_eq!(decoded.trace_parent, Some(parent));
        // Not a traceparent (the same length, upper case), or none after the count: corrupt.
        let mut bad = traced_bytes.clone();
        let at = bad.len() - 55;
        bad[at..].make_ascii_uppercase();
        let err = Rec::decode(&bad).unwrap_err();
        assert!(matches!(err, Error::Backend { .. }), "{err:?}");
        assert!(err.to_string().contains("trace parent"), "{err}");
        let mut none = plain_bytes.clone();
        none.push(0);
        none.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(Rec::decode(&none), Err(Error::Backend { .. })));
    }

    #[test]
    fn keys_of_one_run_never_cover_another() {
        let k = Keys::new("p");
        let (a, ab) = (k.journal_prefix("a"), k.entry("a/b", 1));
        assert!(!ab.starts_with(&a));
        let i = k.index(RunState::Runnable, None, 0, 5, "x/y");
        let runnable = k.runnable_family(None, 0);
        assert_eq!(Keys::parse_index(&runnable, &i), Some((5, "x/y")));
        assert!(i < Keys::family_bound(&runnable, 5));
        assert!(i >= Keys::family_bound(&runnable, 4));
        // A kind's family: apart from the default's and from every other kind's, even one
        // that the kind's name starts.
        let (email, emails) = (
            k.runnable_family(Some("email"), 0),
            k.runnable_family(Some("emails"), 0),
        );
        let e = k.index(RunState::Runnable, Some("email"), 0, 5, "x/y");
        assert!(e.starts_with(&email) && !e.starts_with(&emails) && !e.starts_with(&runnable));
        assert!(e.starts_with(&k.kinds_family()) && !i.starts_with(&k.kinds_family()));
        assert_eq!(Keys::parse_index(&email, &e), Some((5, "x/y")));
        assert_eq!(Keys::parse_index(&emails, &e), None);
        let done = k.index(RunState::Completed, Some("email"), 3, 5, "x/y");
        assert_eq!(
            done,
            k.index(RunState::Completed, None, 0, 5, "x/y"),
            "only runnable runs are by kind and priority"
        );
        // A priority's family: apart from priority 0's, from the other priorities', and from
        // the other kinds' at the same priority; the default kind's too.
        let (p3, p3_default, p4) = (
            k.runnable_family(Some("email"), 3),
            k.runnable_family(None, 3),
            k.runnable_family(Some("email"), 4),
        );
        let e3 = k.index(RunState::Runnable, Some("email"), 3, 5, "x/y");
        assert!(e3.starts_with(&p3) && e3.starts_with(&k.priorities_family()));
        for other in [
            &p3_default,
            &p4,
            &email,
            &emails,
            &runnable,
            &k.kinds_family(),
        ] {
            assert!(!e3.starts_with(other), "{other:?}");
        }
        let d3 = k.index(RunState::Runnable, None, 3, 5, "x/y");
        assert!(d3.starts_with(&p3_default) && !d3.starts_with(&p3));
        assert_eq!(Keys::parse_index(&p3, &e3), Some((5, "x/y")));
        assert_eq!(k.run_of_record(&k.record("r-1")), Some("r-1"));
        assert_eq!(prefix_end(b"a\xff"), b"b");
    }
}
