//! What a run is created with, beyond its id: [`NewRun`].

use crate::limits::{MAX_PRIORITY, MAX_RUN_PAYLOAD_BYTES, MAX_START_DELAY};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::InvalidInput;
use crate::id::RunId;
use crate::kind::Kind;
use crate::queue::Queue;
use crate::types::{check_batch, PayloadSize};

/// A run to create ([`LeaseStore::create_with`](crate::LeaseStore::create_with),
/// [`create_many_with`](crate::LeaseStore::create_many_with)): its id and how it starts.
///
/// A delay is counted on the **store's** clock from the create, as a retry delay is: no claim
/// on any worker takes the run before it is over, whatever that worker's clock says
/// ([`Error::Delayed`](crate::Error::Delayed) with the time left; `claim_next` passes it by),
/// and [`RunRecord::not_before`](crate::RunRecord::not_before) says when it becomes
/// claimable. Waiting uses no attempt of the run's budget.
///
/// A payload is the run's data: bytes (at most [`MAX_RUN_PAYLOAD_BYTES`]) written with the
/// record in the create's one write, never changed after, handed to each claim's lease
/// ([`Lease::payload`](crate::Lease::payload)) and shown by
/// [`inspect`](crate::LeaseStore::inspect). A run created again after a purge takes the new
/// create's payload.
///
/// ```
/// use std::time::Duration;
/// use lease_core::{NewRun, RunId};
/// let new = NewRun::new(RunId::new("invoice-2041")?)
///     .with_payload(br#"{"amount":1200}"#.to_vec())
///     .with_delay(Duration::from_secs(90));
/// assert_eq!(new.delay(), Duration::from_secs(90));
/// assert_eq!(new.payload(), Some(&br#"{"amount":1200}"#[..]));
/// assert!(new.check().is_ok());
/// # Ok::<(), lease_core::InvalidInput>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct NewRun {
    run: RunId,
    delay: Duration,
    payload: Option<Arc<[u8]>>,
    kind: Kind,
    queue: Queue,
    run_at: Option<SystemTime>,
    priority: u8,
    unique_key: Option<Arc<str>>,
    trace_parent: Option<crate::TraceParent>,
}

impl fmt::Debug for NewRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewRun")
            .field("run", &self.run)
            .field("kind", &self.kind)
            .field("queue", &self.queue)
            .field("priority", &self.priority)
            .field("delay", &self.delay)
            .field("run_at", &self.run_at)
            .field("unique_key", &self.unique_key)
            .field("trace_parent", &self.trace_parent)
            .field(
                "payload",
                &PayloadSize(self.payload.as_ref().map(|p| p.len())),
            )
            .finish()
    }
}

impl NewRun {
    /// `run`, claimable at once.
    pub fn new(run: RunId) -> NewRun {
        NewRun {
            run,
            delay: Duration::ZERO,
            payload: None,
            kind: Kind::default(),
            queue: Queue::default(),
            run_at: None,
            priority: 0,
            unique_key: None,
            trace_parent: None,
        }
    }

    /// Created under the trace context `parent`: the W3C `traceparent` of the span that
    /// enqueues it, stored with the run and handed to each attempt
    /// ([`Lease::trace_parent`](crate::Lease::trace_parent)), so the handler's span continues
    /// the enqueuer's trace. The runtime's typed insert takes it from the current span when
    /// the `otel` feature is on.
    pub fn with_trace_parent(mut self, parent: crate::TraceParent) -> NewRun {
        self.trace_parent = Some(parent);
        self
    }

    /// The trace context the run is created under, if any.
    pub fn trace_parent(&self) -> Option<&crate::TraceParent> {
        self.trace_parent.as_ref()
    }

    /// With unique key `key` (the rules of a run id: 1 to
    /// [`MAX_ID_BYTES`](crate::MAX_ID_BYTES) bytes, no control character; checked by
    /// [`check`](NewRun::check)). While another run with this key is **live** (runnable:
    /// waiting, scheduled, held or retrying; or suspended), the create makes nothing and
    /// answers [`Error::AlreadyExists`](crate::Error::AlreadyExists) naming that run. A run
    /// holds its key until it ends (completed, failed, cancelled); a failed run that is resumed
    /// takes its key back only if no other live run took it meanwhile. Two creates racing
    /// with the same key create one run, on every backend that takes keys; a backend without
    /// them refuses the create ([`InvalidInput::Unsupported`]).
    pub fn with_unique_key(mut self, key: impl Into<String>) -> NewRun {
        self.unique_key = Some(Arc::from(key.into()));
        self
    }

    /// The run's unique key, if it has one.
    pub fn unique_key(&self) -> Option<&str> {
        self.unique_key.as_deref()
    }

    /// Of priority `priority`, 0 (the default, the lowest) to [`MAX_PRIORITY`]: within its
    /// kind, a claim takes the claimable runs of the highest priority first, and the longest
    /// waiting first within a priority. A kind's priorities never hold back another kind's
    /// runs: each kind is claimed on its own ([`claim_next_kind`](crate::LeaseStore::claim_next_kind)).
    /// Checked by [`check`](NewRun::check) before any I/O. The etcd backend refuses a
    /// priority above 0 ([`InvalidInput::Unsupported`]).
    pub fn with_priority(mut self, priority: u8) -> NewRun {
        self.priority = priority;
        self
    }

    /// The run's priority (0 without one).
    pub fn priority(&self) -> u8 {
        self.priority
    }

    /// Not claimable before `at`, a wall-clock time compared with the **store's** clock (on
    /// Postgres and Redis, the server's; in memory, this process's): a client whose clock is
    /// off changes nothing but [`check`](NewRun::check)'s bound. A time already past is
    /// claimable at once. With a [delay](NewRun::with_delay) too, the later of the two holds.
    /// At most [`MAX_START_DELAY`] ahead of this process's clock when checked. The etcd
    /// backend has no server clock to compare with and refuses it
    /// ([`InvalidInput::Unsupported`]); give it a delay.
    pub fn with_run_at(mut self, at: SystemTime) -> NewRun {
        self.run_at = Some(at);
        self
    }

    /// The wall-clock time before which the run is not claimable, if any.
    pub fn run_at(&self) -> Option<SystemTime> {
        self.run_at
    }

    /// [`run_at`](NewRun::run_at) in microseconds since the Unix epoch (0 for a time before
    /// it), as the backends send it to their store.
    pub fn run_at_micros(&self) -> Option<i64> {
        self.run_at.map(|at| {
            let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
            i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
        })
    }

    /// Of kind `kind` (the [`DEFAULT_KIND`](crate::DEFAULT_KIND) without it): only a claim of
    /// that kind takes it ([`claim_next_kind`](crate::LeaseStore::claim_next_kind)).
    pub fn with_kind(mut self, kind: Kind) -> NewRun {
        self.kind = kind;
        self
    }

    /// The run's kind.
    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// In queue `queue` (the [`DEFAULT_QUEUE`](crate::DEFAULT_QUEUE) without it): only a claim
    /// from that queue takes it ([`claim_next_in`](crate::LeaseStore::claim_next_in)), and
    /// none while the queue is [paused](crate::LeaseStore::pause_queue). A backend without
    /// queues refuses another queue ([`InvalidInput::Unsupported`]).
    pub fn with_queue(mut self, queue: Queue) -> NewRun {
        self.queue = queue;
        self
    }

    /// The run's queue.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Created with `payload` as its data (0 to [`MAX_RUN_PAYLOAD_BYTES`] bytes, checked by
    /// [`check`](NewRun::check) before any I/O). An empty payload is kept as empty, apart
    /// from none.
    pub fn with_payload(mut self, payload: impl Into<Vec<u8>>) -> NewRun {
        self.payload = Some(Arc::from(payload.into()));
        self
    }

    /// Created with `payload`, shared with its other holders (no copy of the bytes).
    pub fn with_payload_shared(mut self, payload: Option<Arc<[u8]>>) -> NewRun {
        self.payload = payload;
        self
    }

    /// The payload, if any.
    pub fn payload(&self) -> Option<&[u8]> {
        self.payload.as_deref()
    }

    /// The payload, shared (cheap to clone).
    pub fn payload_shared(&self) -> Option<Arc<[u8]>> {
        self.payload.clone()
    }

    /// The payload's size, 0 without one.
    pub fn payload_len(&self) -> usize {
        self.payload.as_ref().map_or(0, |p| p.len())
    }

    /// Not claimable until `delay` has passed on the store's clock (at most
    /// [`MAX_START_DELAY`]; the backends round up to their resolution: a millisecond, and on
    /// etcd a second, then a coarser grid past ten seconds, as for retry delays).
    pub fn with_delay(mut self, delay: Duration) -> NewRun {
        self.delay = delay;
        self
    }

    /// The run's id.
    pub fn run(&self) -> &RunId {
        &self.run
    }

    /// The delay before it is claimable (zero: at once).
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The delay in whole milliseconds, rounded up (never claimable earlier than asked).
    pub fn delay_millis(&self) -> u64 {
        let ms = self.delay.as_micros().div_ceil(1000);
        u64::try_from(ms).unwrap_or(u64::MAX)
    }

    /// Whether it asks for nothing but the id: what [`create`](crate::LeaseStore::create)
    /// does.
    pub fn is_plain(&self) -> bool {
        self.delay.is_zero()
            && self.payload.is_none()
            && self.kind.is_default()
            && self.queue.is_default()
            && self.run_at.is_none()
            && self.priority == 0
            && self.unique_key.is_none()
    }

    /// Validates it. Backends call it (or [`check_new_runs`]) before any I/O.
    ///
    /// # Errors
    /// [`InvalidInput::StartDelayTooLong`], [`InvalidInput::RunPayloadTooLarge`],
    /// [`InvalidInput::RunAtTooFar`], [`InvalidInput::PriorityTooHigh`]; for the unique key,
    /// the id errors ([`InvalidInput::EmptyId`], [`InvalidInput::IdTooLong`],
    /// [`InvalidInput::ControlCharacter`]) naming it.
    pub fn check(&self) -> Result<(), InvalidInput> {
        if let Some(key) = &self.unique_key {
            crate::id::validate("unique key", key)?;
        }
        if self.priority > MAX_PRIORITY {
            return Err(InvalidInput::PriorityTooHigh {
                priority: self.priority,
                max: MAX_PRIORITY,
            });
        }
        if self.payload_len() > MAX_RUN_PAYLOAD_BYTES {
            return Err(InvalidInput::RunPayloadTooLarge {
                len: self.payload_len(),
                max: MAX_RUN_PAYLOAD_BYTES,
            });
        }
        if self.delay > MAX_START_DELAY {
            return Err(InvalidInput::StartDelayTooLong {
                delay: self.delay,
                max: MAX_START_DELAY,
            });
        }
        if let Some(at) = self.run_at {
            let ahead = at.duration_since(SystemTime::now()).unwrap_or_default();
            if ahead > MAX_START_DELAY {
                return Err(InvalidInput::RunAtTooFar {
                    ahead: Duration::from_secs(ahead.as_secs()),
                    max: MAX_START_DELAY,
                });
            }
        }
        Ok(())
    }
}

impl From<RunId> for NewRun {
    fn from(run: RunId) -> NewRun {
        NewRun::new(run)
    }
}

/// Refuses runs with a unique key, for a backend that keeps none, with
/// [`InvalidInput::Unsupported`] (before any I/O): ignoring the key would create duplicates the
/// caller asked to be kept out.
///
/// # Errors
/// [`InvalidInput::Unsupported`] if any of `runs` has a unique key.
pub fn refuse_unique_keys<'a>(
    runs: impl IntoIterator<Item = &'a NewRun>,
) -> Result<(), InvalidInput> {
    if runs.into_iter().any(|n| n.unique_key.is_some()) {
        return Err(InvalidInput::Unsupported {
            operation: "a unique key",
        });
    }
    Ok(())
}

/// Refuses runs with a priority above 0, for a backend that keeps no priorities, with
/// [`InvalidInput::Unsupported`] (before any I/O).
///
/// # Errors
/// [`InvalidInput::Unsupported`] if any of `runs` has a priority.
pub fn refuse_priorities<'a>(
    runs: impl IntoIterator<Item = &'a NewRun>,
) -> Result<(), InvalidInput> {
    if runs.into_iter().any(|n| n.priority > 0) {
        return Err(InvalidInput::Unsupported {
            operation: "run priorities",
        });
    }
    Ok(())
}

/// Validates a [`create_many_with`](crate::LeaseStore::create_many_with) batch: 0 to
/// [`MAX_BATCH`](crate::MAX_BATCH) runs, each valid. Backends call it before any I/O, so
/// one bad item refuses the batch and changes nothing.
///
/// # Errors
/// [`InvalidInput::BatchTooLarge`], or the first item's error.
pub fn check_new_runs(runs: &[NewRun]) -> Result<(), InvalidInput> {
    check_batch(runs.len())?;
    runs.iter().try_for_each(NewRun::check)
}
