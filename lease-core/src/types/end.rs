//! How a lease ends: `End`, `Ending`, and the checks of delays and reasons.

use super::*;

/// How a lease ends, in a batch of [`LeaseStore::end_many`](crate::LeaseStore::end_many).
///
/// Each is a fenced write, judged by the contract's rules.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum End {
    /// Complete the run: terminal, owner and expiry cleared.
    Complete,
    /// Append the payload (at most [`MAX_PAYLOAD_BYTES`](crate::MAX_PAYLOAD_BYTES)) to the run's journal under the lease's
    /// fence **and** complete the run, as one write: both happen or neither does. This is a
    /// job's durable effect and its completion in one commit.
    CompleteWith(Vec<u8>),
    /// Give the run back: runnable, claimable at once under a higher fence.
    Release,
    /// Suspend the run until [`resume`](crate::LeaseStore::resume).
    Suspend,
    /// Suspend the run until a signal for `name` answers this wait, or until `timeout` (on
    /// the store's clock; `None`: no timeout) has passed: see [`End::await_signal`] and
    /// [`crate::signal`]. Reported as [`Ended::Suspended`](crate::Ended::Suspended).
    AwaitSignal {
        /// The signal waited for.
        name: crate::SignalName,
        /// How long it is waited for; `None` for no timeout.
        timeout: Option<Duration>,
    },
    /// Give the run back, runnable but not claimable before this delay (at most
    /// [`MAX_RETRY_DELAY`](crate::MAX_RETRY_DELAY), whole milliseconds) has passed on the **store's** clock: a retry
    /// with backoff. `claim_next` passes the run by until then; a `claim` of it is refused
    /// with [`Error::Delayed`](crate::Error::Delayed). A zero delay is a [`Release`](End::Release).
    /// Reported as [`Ended::Released`](crate::Ended::Released).
    RetryAfter(Duration),
    /// Give up on the run: [failed](RunState::Failed), terminal until an operator resumes it,
    /// with this reason (at most [`MAX_REASON_BYTES`](crate::MAX_REASON_BYTES)) in its record.
    Fail(String),
    /// This attempt failed (the handler's error, a panic, a timeout): give the run back, not
    /// claimable before `retry_after` has passed on the store's clock, as
    /// [`RetryAfter`](End::RetryAfter) does, but **counting the attempt** against the run's
    /// budget ([`RunRecord::attempts`]), which a snooze does not. `reason` (checked as
    /// [`Fail`](End::Fail)'s) says what failed. Reported as
    /// [`Ended::Released`](crate::Ended::Released). What a `Worker` sends for
    /// a failed attempt that its `RetryPolicy` retries.
    AttemptFailed {
        /// How long the run waits before it is claimable again (at most [`MAX_RETRY_DELAY`](crate::MAX_RETRY_DELAY)).
        retry_after: Duration,
        /// What failed.
        reason: String,
    },
    /// For a `Worker` handler: the handler already ended the lease itself, as
    /// `Ended` says, atomically with its own effect, in its own transaction (Postgres
    /// `PostgresLeaseStore::end_in` inside the caller's transaction, or a fenced transaction's
    /// `complete`; a Redis fenced script that ends the lease;
    /// `MemoryLeaseStore::fenced_with`). The Worker
    /// writes nothing more: it stops the heartbeat, checks that the store shows the lease
    /// ended this way under its fence, and reports the end committed, or reports an error if
    /// the store does not. A store's [`end_many`](crate::LeaseStore::end_many) refuses it
    /// ([`InvalidInput::AlreadyCommitted`](crate::InvalidInput::AlreadyCommitted)).
    Committed(crate::Ended),
}

impl End {
    /// Suspend the run until a signal for `name` answers the wait, or until `timeout` has
    /// passed on the store's clock (1 ms to [`MAX_WAIT`](crate::MAX_WAIT), whole
    /// milliseconds); then the next claim takes it, and its lease says how the wait ended
    /// ([`Lease::resumed`](crate::Lease::resumed)). The lease is released at once: no
    /// heartbeat while the run waits. Take the wait's [`SignalToken`](crate::SignalToken)
    /// before ending the lease.
    ///
    /// # Errors
    /// The [`SignalName`](crate::SignalName) rule's, and [`InvalidInput::WaitTimeout`].
    pub fn await_signal(name: &str, timeout: Duration) -> Result<End, crate::Error> {
        crate::signal::check_wait_timeout(Some(timeout))?;
        Ok(End::AwaitSignal {
            name: crate::SignalName::new(name)?,
            timeout: Some(timeout),
        })
    }

    /// [`await_signal`](End::await_signal) without a timeout: the run waits until a signal,
    /// a [`resume`](crate::LeaseStore::resume) or a [`cancel`](crate::LeaseStore::cancel).
    ///
    /// # Errors
    /// The [`SignalName`](crate::SignalName) rule's.
    pub fn await_signal_unbounded(name: &str) -> Result<End, crate::Error> {
        Ok(End::AwaitSignal {
            name: crate::SignalName::new(name)?,
            timeout: None,
        })
    }

    /// The state the run is in after this end was applied.
    pub fn state(&self) -> RunState {
        match self.ended() {
            crate::Ended::Completed => RunState::Completed,
            crate::Ended::Released => RunState::Runnable,
            crate::Ended::Suspended => RunState::Suspended,
            crate::Ended::Failed => RunState::Failed,
            crate::Ended::Cancelled => RunState::Cancelled,
        }
    }

    /// How [`Error::LeaseEnded`](crate::Error::LeaseEnded) names this end once it was applied.
    pub fn ended(&self) -> crate::Ended {
        match self {
            End::Complete | End::CompleteWith(_) => crate::Ended::Completed,
            End::Release | End::RetryAfter(_) | End::AttemptFailed { .. } => crate::Ended::Released,
            End::Suspend | End::AwaitSignal { .. } => crate::Ended::Suspended,
            End::Fail(_) => crate::Ended::Failed,
            End::Committed(ended) => *ended,
        }
    }

    /// Whether a lease found ended as `ended` may have been ended by this end: as
    /// [`ended`](End::ended) says, or, for an [`AwaitSignal`](End::AwaitSignal), released (a
    /// signal that came while the lease ran answered the wait as it began, leaving the run
    /// claimable). How a retry of an unanswered end recognizes its own earlier commit.
    pub fn ends_as(&self, ended: crate::Ended) -> bool {
        ended == self.ended()
            || (matches!(self, End::AwaitSignal { .. }) && ended == crate::Ended::Released)
    }

    /// The end's name: `complete`, `complete-with`, `release`, `suspend`, `await-signal`, `retry-after`,
    /// `attempt-failed`, `fail` or `committed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            End::Complete => "complete",
            End::CompleteWith(_) => "complete-with",
            End::Release => "release",
            End::Suspend => "suspend",
            End::AwaitSignal { .. } => "await-signal",
            End::RetryAfter(_) => "retry-after",
            End::AttemptFailed { .. } => "attempt-failed",
            End::Fail(_) => "fail",
            End::Committed(_) => "committed",
        }
    }

    /// Whether this end gives the attempt back to the run's budget: a voluntary release, a
    /// suspend or a snooze ([`RetryAfter`](End::RetryAfter)). Every other end leaves the
    /// attempt counted (and a completion ends the run).
    pub fn refunds_attempt(&self) -> bool {
        matches!(
            self,
            End::Release | End::Suspend | End::AwaitSignal { .. } | End::RetryAfter(_)
        )
    }

    /// The delay before the run is claimable again, in whole milliseconds: that of a
    /// [`RetryAfter`](End::RetryAfter) or an [`AttemptFailed`](End::AttemptFailed), 0 for
    /// every other end.
    pub fn delay_millis(&self) -> u64 {
        match self {
            // At most MAX_RETRY_DELAY, checked.
            End::RetryAfter(delay) => delay.as_millis() as u64,
            End::AttemptFailed { retry_after, .. } => retry_after.as_millis() as u64,
            _ => 0,
        }
    }
}

impl fmt::Debug for End {
    // A payload can be large: show its size, not its bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::CompleteWith(p) => write!(f, "CompleteWith({} bytes)", p.len()),
            End::Committed(ended) => write!(f, "Committed({ended:?})"),
            End::Complete => f.write_str("Complete"),
            End::Release => f.write_str("Release"),
            End::Suspend => f.write_str("Suspend"),
            End::AwaitSignal { name, timeout } => {
                write!(f, "AwaitSignal {{ name: {name:?}, timeout: {timeout:?} }}")
            }
            End::RetryAfter(delay) => write!(f, "RetryAfter({delay:?})"),
            End::AttemptFailed {
                retry_after,
                reason,
            } => write!(
                f,
                "AttemptFailed {{ retry_after: {retry_after:?}, reason: {} bytes }}",
                reason.len()
            ),
            End::Fail(reason) => write!(f, "Fail({} bytes)", reason.len()),
        }
    }
}

/// One lease and how it ends: an item of [`LeaseStore::end_many`](crate::LeaseStore::end_many).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ending {
    /// The lease, whose fence the store checks.
    pub lease: Lease,
    /// How it ends.
    pub end: End,
}

impl Ending {
    /// `lease` ending with `end`.
    pub fn new(lease: Lease, end: End) -> Ending {
        Ending { lease, end }
    }
}

/// Validates an [`end_many`](crate::LeaseStore::end_many) batch: at most [`MAX_BATCH`](crate::MAX_BATCH) items,
/// every payload within [`MAX_PAYLOAD_BYTES`](crate::MAX_PAYLOAD_BYTES) and all of them within
/// [`MAX_BATCH_PAYLOAD_BYTES`](crate::MAX_BATCH_PAYLOAD_BYTES), every retry delay within [`MAX_RETRY_DELAY`](crate::MAX_RETRY_DELAY) and failure
/// reason within [`MAX_REASON_BYTES`](crate::MAX_REASON_BYTES), each run at most once. Backends call it before any
/// I/O.
///
/// # Errors
/// [`InvalidInput::BatchTooLarge`], [`InvalidInput::PayloadTooLarge`],
/// [`InvalidInput::BatchPayloadTooLarge`], [`InvalidInput::RetryDelayTooLong`],
/// [`InvalidInput::ReasonTooLong`], [`InvalidInput::AlreadyCommitted`] or
/// [`InvalidInput::DuplicateRun`].
pub fn check_end_batch(ends: &[Ending]) -> Result<(), InvalidInput> {
    check_batch(ends.len())?;
    let mut seen = std::collections::HashSet::with_capacity(ends.len());
    let mut total = 0usize;
    for ending in ends {
        match &ending.end {
            End::CompleteWith(payload) => {
                check_payload(payload)?;
                total += payload.len();
            }
            End::Committed(_) => {
                return Err(InvalidInput::AlreadyCommitted {
                    run: ending.lease.run().clone(),
                })
            }
            End::RetryAfter(delay) => check_retry_delay(*delay)?,
            End::AttemptFailed {
                retry_after,
                reason,
            } => {
                check_retry_delay(*retry_after)?;
                check_reason(reason)?;
            }
            End::Fail(reason) => check_reason(reason)?,
            End::AwaitSignal { timeout, .. } => crate::signal::check_wait_timeout(*timeout)?,
            End::Complete | End::Release | End::Suspend => {}
        }
        if !seen.insert(ending.lease.run()) {
            return Err(InvalidInput::DuplicateRun {
                run: ending.lease.run().clone(),
            });
        }
    }
    if total > MAX_BATCH_PAYLOAD_BYTES {
        return Err(InvalidInput::BatchPayloadTooLarge {
            len: total,
            max: MAX_BATCH_PAYLOAD_BYTES,
        });
    }
    Ok(())
}

/// Validates an [`End::RetryAfter`] delay (at most [`MAX_RETRY_DELAY`](crate::MAX_RETRY_DELAY)).
///
/// # Errors
/// [`InvalidInput::RetryDelayTooLong`].
pub fn check_retry_delay(delay: Duration) -> Result<(), InvalidInput> {
    if delay > MAX_RETRY_DELAY {
        return Err(InvalidInput::RetryDelayTooLong {
            delay,
            max: MAX_RETRY_DELAY,
        });
    }
    Ok(())
}

/// Validates an [`End::Fail`] reason: at most [`MAX_REASON_BYTES`](crate::MAX_REASON_BYTES), and no control character
/// but tabs and line feeds. Every backend stores the same reasons (Postgres cannot store a
/// NUL), and one bad reason is refused before any I/O instead of failing a whole batch.
///
/// ```
/// use lease_core::{backend::check_reason, InvalidInput};
/// assert!(check_reason("card declined:\n\tinsufficient funds").is_ok());
/// assert_eq!(
///     check_reason("bad\0byte"),
///     Err(InvalidInput::ReasonControlCharacter { at: 3, code: 0 })
/// );
/// ```
///
/// # Errors
/// [`InvalidInput::ReasonTooLong`], [`InvalidInput::ReasonControlCharacter`].
pub fn check_reason(reason: &str) -> Result<(), InvalidInput> {
    if reason.len() > MAX_REASON_BYTES {
        return Err(InvalidInput::ReasonTooLong {
            len: reason.len(),
            max: MAX_REASON_BYTES,
        });
    }
    if let Some((at, c)) = reason.char_indices().find(|&(_, c)| !reason_char(c)) {
        return Err(InvalidInput::ReasonControlCharacter {
            at,
            code: u32::from(c),
        });
    }
    Ok(())
}

/// Whether a failure reason may hold `c`: anything but a control character, except a tab or a
/// line feed.
fn reason_char(c: char) -> bool {
    !c.is_control() || c == '\t' || c == '\n'
}

/// `text` as a failure reason [`check_reason`] accepts: each control character other than a tab
/// or a line feed written as its escape (`\0`, `\u{1b}`, `\r`), then cut to at most
/// [`MAX_REASON_BYTES`](crate::MAX_REASON_BYTES) at a character boundary. What the `Worker` does to the
/// error messages it records.
///
/// ```
/// use lease_core::{backend::check_reason, sanitize_reason};
/// let reason = sanitize_reason("bad\0byte \u{1b}[31mred");
/// assert_eq!(reason, "bad\\0byte \\u{1b}[31mred");
/// assert!(check_reason(&reason).is_ok());
/// ```
pub fn sanitize_reason(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_REASON_BYTES));
    for c in text.chars() {
        if reason_char(c) {
            out.push(c);
        } else {
            out.extend(c.escape_debug());
        }
        if out.len() >= MAX_REASON_BYTES {
            break;
        }
    }
    truncate_reason(&out, MAX_REASON_BYTES).to_owned()
}

/// `text` cut to at most `max` bytes at a character boundary.
pub fn truncate_reason(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
