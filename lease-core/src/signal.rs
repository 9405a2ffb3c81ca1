//! Waiting for a signal: a run suspended until a person or a webhook answers, fenced to the
//! wait the answer is for (`ARCHITECTURE.md`, "Signals").
//!
//! A handler ends its lease with [`End::await_signal`](crate::End::await_signal): the lease is
//! released and the run is [suspended](crate::RunState::Suspended), waiting for a
//! [`SignalName`] until a deadline on the store's clock. The wait is the one its suspending
//! lease's fence names: a [`SignalToken`] carries the run, the name and that fence, and
//! [`SignalExt::signal`] delivers a payload only while the run still waits in that wait. A
//! token of an earlier wait, a wait that timed out or was cancelled, and a second signal with
//! another payload are refused with [`Error::StaleSignal`](crate::Error::StaleSignal); the same
//! delivery sent again answers as the first did ([`Signalled::duplicate`]) and changes
//! nothing. The next claim takes the run under a higher fence and hands its lease the wait's
//! end ([`Lease::resumed`](crate::Lease::resumed)): the [`Signal`], or that it timed out.

mod token;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::InvalidInput;
use crate::limits::{MAX_SIGNAL_BYTES, MAX_SIGNAL_PAYLOAD_BYTES, MAX_WAIT};
use crate::{Fence, LeaseStore, Result, RunId, RunState, StoreTime};

pub use token::{SignalKey, SignalToken};

/// The name a run waits for: a short name, 1 to [`MAX_SIGNAL_BYTES`] bytes of UTF-8 without
/// control characters (`approval`, `payment-received`).
///
/// ```
/// use lease_core::{InvalidInput, SignalName};
/// assert_eq!(SignalName::new("approval")?.as_str(), "approval");
/// assert!(matches!(SignalName::new(""), Err(InvalidInput::EmptySignalName { .. })));
/// # Ok::<(), InvalidInput>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SignalName(Arc<str>);

impl SignalName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`InvalidInput::EmptySignalName`], [`InvalidInput::SignalNameTooLong`] or
    /// [`InvalidInput::ControlCharacter`].
    pub fn new(name: impl AsRef<str>) -> Result<SignalName, InvalidInput> {
        let name = name.as_ref();
        crate::name::check(
            name,
            MAX_SIGNAL_BYTES,
            "signal name",
            InvalidInput::EmptySignalName {
                max: MAX_SIGNAL_BYTES,
            },
            |len| InvalidInput::SignalNameTooLong {
                len,
                max: MAX_SIGNAL_BYTES,
            },
        )?;
        Ok(SignalName(Arc::from(name)))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

crate::name::name_traits!(SignalName);

/// Checks a wait's timeout: `None` for an unbounded wait, else 1 ms to [`MAX_WAIT`] in whole
/// milliseconds (the stores time it on their clock, in milliseconds).
pub(crate) fn check_wait_timeout(timeout: Option<Duration>) -> Result<(), InvalidInput> {
    match timeout {
        None => Ok(()),
        Some(t)
            if t < Duration::from_millis(1)
                || t > MAX_WAIT
                || !crate::capabilities::whole_millis(t) =>
        {
            Err(InvalidInput::WaitTimeout {
                timeout: t,
                max: MAX_WAIT,
            })
        }
        Some(_) => Ok(()),
    }
}

/// Checks a signal's payload against [`MAX_SIGNAL_PAYLOAD_BYTES`].
pub fn check_signal_payload(payload: &[u8]) -> Result<(), InvalidInput> {
    if payload.len() > MAX_SIGNAL_PAYLOAD_BYTES {
        return Err(InvalidInput::SignalPayloadTooLarge {
            len: payload.len(),
            max: MAX_SIGNAL_PAYLOAD_BYTES,
        });
    }
    Ok(())
}

/// What a suspended run waits for ([`RunRecord::wait`](crate::RunRecord::wait)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Wait {
    /// The signal it waits for.
    pub name: SignalName,
    /// Until when, on the store's clock; `None` for a wait without a timeout. Once passed,
    /// the wait has timed out: a signal is refused and the next claim takes the run.
    pub deadline: Option<StoreTime>,
    /// The fence of the lease that suspended it: the wait a [`SignalToken`] must name.
    pub fence: Fence,
}

impl Wait {
    /// A wait for `name` until `deadline`, begun by the lease of `fence`.
    pub fn new(name: SignalName, deadline: Option<StoreTime>, fence: Fence) -> Wait {
        Wait {
            name,
            deadline,
            fence,
        }
    }

    /// Whether it has timed out at `now`.
    pub fn timed_out(&self, now: StoreTime) -> bool {
        self.deadline.is_some_and(|d| d <= now)
    }
}

/// A delivered signal: what `RunContext::signal` (`lease-runtime`) hands the resumed handler
/// (`lease-runtime`), and what a run's record keeps of the last wait it answered.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Signal {
    /// The name it answered.
    pub name: SignalName,
    /// The fence of the wait it answered.
    pub fence: Fence,
    /// When it arrived, on the store's clock.
    pub at: StoreTime,
    payload: Arc<[u8]>,
}

impl Signal {
    /// A signal for the wait of `fence`, arrived `at` with `payload`.
    pub fn new(
        name: SignalName,
        fence: Fence,
        at: StoreTime,
        payload: impl Into<Arc<[u8]>>,
    ) -> Signal {
        Signal {
            name,
            fence,
            at,
            payload: payload.into(),
        }
    }

    /// The payload it was delivered with.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The payload, shared.
    pub fn payload_shared(&self) -> Arc<[u8]> {
        self.payload.clone()
    }
}

impl fmt::Debug for Signal {
    // A payload may be large or private: its size, not its bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signal")
            .field("name", &self.name)
            .field("fence", &self.fence)
            .field("at", &self.at)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

/// How a run's last wait ended: what its next leases carry
/// ([`Lease::resumed`](crate::Lease::resumed)) until it waits again.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitEnd {
    /// A signal answered it.
    Signalled(Signal),
    /// Its deadline passed first.
    TimedOut {
        /// The signal it waited for.
        name: SignalName,
        /// The fence of the wait.
        fence: Fence,
        /// Its deadline, on the store's clock.
        at: StoreTime,
    },
}

impl WaitEnd {
    /// The name waited for.
    pub fn name(&self) -> &SignalName {
        match self {
            WaitEnd::Signalled(s) => &s.name,
            WaitEnd::TimedOut { name, .. } => name,
        }
    }

    /// The fence of the wait it ended.
    pub fn fence(&self) -> Fence {
        match self {
            WaitEnd::Signalled(s) => s.fence,
            WaitEnd::TimedOut { fence, .. } => *fence,
        }
    }

    /// The signal, if one answered.
    pub fn signal(&self) -> Option<&Signal> {
        match self {
            WaitEnd::Signalled(s) => Some(s),
            WaitEnd::TimedOut { .. } => None,
        }
    }
}

/// What a delivered signal did ([`SignalExt::signal`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Signalled {
    /// The run signalled.
    pub run: RunId,
    /// `true` when this delivery had been made before (the same token and payload): it
    /// changed nothing, and answers as the first did.
    pub duplicate: bool,
}

impl Signalled {
    /// The answer for `run`.
    pub fn new(run: RunId, duplicate: bool) -> Signalled {
        Signalled { run, duplicate }
    }
}

/// Why a signal was refused ([`Error::StaleSignal`](crate::Error::StaleSignal)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SignalRefusal {
    /// The run is not waiting (runnable, held, ended, or suspended without a wait).
    NotWaiting,
    /// The run waits again, in a later wait than the token's.
    EarlierWait,
    /// The wait timed out before the signal came.
    TimedOut,
    /// The wait was answered already, with another payload.
    AlreadySignalled,
    /// The run waits in the token's wait, but for another signal.
    OtherSignal,
    /// The token names a wait this run never had (a fence above the run's).
    UnknownWait,
}

impl SignalRefusal {
    /// A stable name: `not_waiting`, `earlier_wait`, `timed_out`, `already_signalled`,
    /// `other_signal`, `unknown_wait`.
    pub fn as_str(&self) -> &'static str {
        match self {
            SignalRefusal::NotWaiting => "not_waiting",
            SignalRefusal::EarlierWait => "earlier_wait",
            SignalRefusal::TimedOut => "timed_out",
            SignalRefusal::AlreadySignalled => "already_signalled",
            SignalRefusal::OtherSignal => "other_signal",
            SignalRefusal::UnknownWait => "unknown_wait",
        }
    }

    /// Reads a name [`as_str`](Self::as_str) wrote (a backend's answer).
    pub fn parse(s: &str) -> Option<SignalRefusal> {
        Some(match s {
            "not_waiting" => SignalRefusal::NotWaiting,
            "earlier_wait" => SignalRefusal::EarlierWait,
            "timed_out" => SignalRefusal::TimedOut,
            "already_signalled" => SignalRefusal::AlreadySignalled,
            "other_signal" => SignalRefusal::OtherSignal,
            "unknown_wait" => SignalRefusal::UnknownWait,
            _ => return None,
        })
    }
}

impl fmt::Display for SignalRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SignalRefusal::NotWaiting => "it is not waiting for a signal",
            SignalRefusal::EarlierWait => "the token is of an earlier wait; the run waits again",
            SignalRefusal::TimedOut => "the wait timed out before the signal came",
            SignalRefusal::AlreadySignalled => {
                "the wait was answered already, with another payload"
            }
            SignalRefusal::OtherSignal => "it waits for another signal",
            SignalRefusal::UnknownWait => "the token names a wait this run never had",
        })
    }
}

/// What a signal does, when it is not refused ([`signal_verdict`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delivery {
    /// The run waits in the token's wait: deliver, and make it claimable.
    Deliver,
    /// The lease of the token's fence still holds the run: its handler took the token and has
    /// not ended yet (its wait is not stored, or not even begun). The signal is kept as that
    /// fence's answer, and the run stays as it is; when the lease then ends waiting for this
    /// name, the wait is answered at once (the run is claimable, with the signal).
    Early,
    /// This very delivery answered the wait before: nothing changes.
    Duplicate,
}

/// What the record of a run says about signals, for [`signal_verdict`].
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Waiting<'a> {
    /// Its state.
    pub state: RunState,
    /// Its fence.
    pub fence: Fence,
    /// Whether a lease holds it (live or expired, not yet reclaimed).
    pub owned: bool,
    /// Its wait.
    pub wait: Option<&'a Wait>,
    /// How its last wait ended (or the early answer of the holding lease's wait).
    pub resumed: Option<&'a WaitEnd>,
}

impl<'a> Waiting<'a> {
    /// What `record` says.
    pub fn of(record: &'a crate::RunRecord) -> Waiting<'a> {
        Waiting {
            state: record.state,
            fence: record.fence,
            owned: record.owner.is_some(),
            wait: record.wait.as_ref(),
            resumed: record.resumed.as_ref(),
        }
    }
}

/// The store's verdict on a signal for `run`, whose record says `at`, for the wait of `fence`
/// and `name` with `payload` at `now` (the store's clock): what the signal does, or the
/// refusal. The one rule every backend follows (the memory and etcd stores call it through
/// the machine, Postgres explains its conditional write with it, Lua follows it; the
/// conformance suite and the model check them against it).
///
/// In order: the token's wait answered before (a duplicate of the same payload; another
/// payload, or a timeout, refused); a fence the run never had; the wait itself (another
/// name, or its deadline passed, refused); a later wait; the holding lease of the token's
/// fence, not yet waiting ([`Delivery::Early`]); anything else is not waiting.
pub fn signal_verdict(
    run: &RunId,
    at: Waiting<'_>,
    name: &SignalName,
    fence: Fence,
    payload: &[u8],
    now: StoreTime,
) -> Result<Delivery> {
    let Waiting {
        state,
        fence: current,
        owned,
        wait,
        resumed: ended,
    } = at;
    let refuse = |reason| {
        Err(crate::Error::StaleSignal {
            run: run.clone(),
            state,
            reason,
        })
    };
    // The wait's answer first: a delivery sent again learns what the first did, whatever the
    // run did since, until it waits again.
    if let Some(end) = ended.filter(|e| e.fence() == fence && e.name() == name) {
        return match end {
            WaitEnd::Signalled(s) if s.payload() == payload => Ok(Delivery::Duplicate),
            WaitEnd::Signalled(_) => refuse(SignalRefusal::AlreadySignalled),
            WaitEnd::TimedOut { .. } => refuse(SignalRefusal::TimedOut),
        };
    }
    if fence > current {
        return refuse(SignalRefusal::UnknownWait);
    }
    match wait {
        Some(w) if state == RunState::Suspended && w.fence == fence => {
            if &w.name != name {
                refuse(SignalRefusal::OtherSignal)
            } else if w.timed_out(now) {
                refuse(SignalRefusal::TimedOut)
            } else {
                Ok(Delivery::Deliver)
            }
        }
        Some(w) if state == RunState::Suspended && w.fence > fence => {
            refuse(SignalRefusal::EarlierWait)
        }
        // The holder's wait, answered early once: not by another signal too.
        None if state == RunState::Runnable && owned && current == fence => {
            if ended.is_some_and(|e| e.fence() == fence) {
                refuse(SignalRefusal::OtherSignal)
            } else {
                Ok(Delivery::Early)
            }
        }
        _ => refuse(SignalRefusal::NotWaiting),
    }
}

/// Signals on any store: [`signal`](SignalExt::signal) checks a [`SignalToken`] (its
/// signature, when the store has a [`SignalKey`]) and delivers its payload.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// use lease_core::{End, LeaseStore, LeaseStoreExt, RunId, RunState, SignalExt, SignalToken};
/// use lease_core::{Ttl, WorkerId};
/// use lease_runtime::MemoryLeaseStore;
/// use std::time::Duration;
///
/// let store = MemoryLeaseStore::new();
/// let run = RunId::new("order-7")?;
/// store.create(&run).await?;
/// let lease = store.claim(&run, &WorkerId::new("w")?, Ttl::from_secs(30)?).await?;
/// let token = SignalToken::for_lease(&lease, "approval", store.signal_key())?;
/// store.end_one(&lease, End::await_signal("approval", Duration::from_secs(3600))?).await?;
/// assert_eq!(store.inspect(&run).await?.state, RunState::Suspended);
///
/// let first = store.signal(&token, b"yes").await?;
/// let again = store.signal(&token, b"yes").await?; // a webhook's retry
/// assert!(!first.duplicate && again.duplicate);
/// assert_eq!(store.inspect(&run).await?.state, RunState::Runnable);
/// # Ok(()) }
/// ```
#[async_trait::async_trait]
pub trait SignalExt {
    /// Delivers `payload` (at most [`MAX_SIGNAL_PAYLOAD_BYTES`]) to the wait `token` names,
    /// making the run claimable, only if the run still waits in that wait.
    ///
    /// # Errors
    /// [`InvalidInput::SignalToken`] for a token whose signature does not match the store's
    /// key (or that lacks one the store requires); [`Error::StaleSignal`](crate::Error::StaleSignal)
    /// naming the run's state and why, with nothing stored; [`Error::NotFound`](crate::Error::NotFound);
    /// the backend's errors.
    async fn signal(&self, token: &SignalToken, payload: &[u8]) -> Result<Signalled>;
}

#[async_trait::async_trait]
impl<S: LeaseStore + ?Sized> SignalExt for S {
    async fn signal(&self, token: &SignalToken, payload: &[u8]) -> Result<Signalled> {
        token.verify(self.signal_key())?;
        check_signal_payload(payload)?;
        self.deliver_signal(token.run(), token.name(), token.fence(), payload)
            .await
    }
}

/// For a backend without signals ([`Capabilities::signals`](crate::Capabilities) false): refuses
/// a batch of ends holding an [`End::AwaitSignal`](crate::End::AwaitSignal), before any I/O.
///
/// # Errors
/// [`InvalidInput::Unsupported`].
pub fn refuse_waits(ends: &[crate::Ending]) -> Result<(), InvalidInput> {
    if ends
        .iter()
        .any(|e| matches!(e.end, crate::End::AwaitSignal { .. }))
    {
        return Err(InvalidInput::Unsupported {
            operation: "waiting for a signal",
        });
    }
    Ok(())
}
