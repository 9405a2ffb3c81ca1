//! The model's state: the store's record, the workers, the messages in flight, the history,
//! and the actions that move them.

/// The run's state in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Claimable when unowned or expired.
    Runnable,
    /// Waiting for a resume; never claimable or renewable.
    Suspended,
    /// Done for good.
    Completed,
    /// Given up on; never claimable until an operator resumes it.
    Failed,
    /// Cancelled by an operator: terminal, never claimable, its holder fenced out.
    Cancelled,
}

/// The store's record of the run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Store {
    /// The current fence (0 before the first claim).
    pub fence: u8,
    /// The holder, if any.
    pub owner: Option<u8>,
    /// The lease's expiry on the store's clock.
    pub expires: u8,
    /// Runnable, suspended, completed or failed.
    pub phase: Phase,
    /// Before this tick an unowned runnable run is not claimable (a retry delay).
    pub not_before: u8,
    /// Claims per worker, used only by [`Flaw::PerWorkerFence`](crate::Flaw::PerWorkerFence).
    pub per_worker: Vec<u8>,
    /// The attempt budget's counter: claims since the last resume, less voluntary releases.
    pub attempts: u8,
}

/// A lease as its worker holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Held {
    /// The fence the claim returned.
    pub fence: u8,
    /// The local deadline: the worker works only while `now < deadline`.
    pub deadline: u8,
}

/// One worker's memory.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Worker {
    /// The lease it believes it holds.
    pub lease: Option<Held>,
    /// The claim it is waiting for: its number (a call's own identity, so a late or
    /// duplicated reply to an earlier claim never answers a later one) and send instant.
    pub claim_pending: Option<(u8, u8)>,
    /// The last tick it sent a renewal (one per tick at most).
    pub renew_sent: Option<u8>,
    /// Claims sent so far.
    pub claims: u8,
    /// Fenced writes sent so far.
    pub writes: u8,
}

/// What a request asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Claim the run; the worker's claim number.
    Claim(u8),
    /// Renew under a fence.
    Renew(u8),
    /// A fenced write (a journal append, an effect).
    Write(u8),
    /// Suspend under a fence.
    Suspend(u8),
    /// Complete under a fence.
    Complete(u8),
    /// Give the run back with a retry delay, under a fence.
    Retry(u8),
    /// Give the run back voluntarily (its attempt goes back to the budget), under a fence.
    Release(u8),
    /// Fail the run under a fence.
    Fail(u8),
}

/// The store's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    /// The claim succeeded with this fence, as this attempt of the run's budget.
    Granted(u8, u8),
    /// The fenced operation was accepted.
    Accepted,
    /// Refused (held, stale fence, lease ended, …).
    Refused,
}

/// A message in flight. Replies echo the request's send instant, as a caller matches a reply
/// to the call it made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    /// Worker to store.
    Request {
        /// The sender.
        from: u8,
        /// When it was sent.
        sent: u8,
        /// What it asks.
        op: Op,
    },
    /// Store to worker.
    Reply {
        /// The worker that asked.
        to: u8,
        /// When the request was sent.
        sent: u8,
        /// What was asked.
        op: Op,
        /// The verdict.
        answer: Answer,
    },
}

/// A message and whether it is already a duplicate (a duplicate is not duplicated again).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Packet {
    /// The message.
    pub msg: Msg,
    /// Whether this is the network's copy.
    pub copy: bool,
}

/// What the properties watch: facts about everything the store accepted so far.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct History {
    /// The highest fence ever granted.
    pub granted_max: u8,
    /// A claim returned a fence not above every earlier one.
    pub fence_repeated: bool,
    /// The highest fence a write was accepted under.
    pub written_max: u8,
    /// A write was accepted under a fence lower than an earlier accepted write's.
    pub stale_after_newer: bool,
    /// The worker whose writes were accepted under each fence (index = fence).
    pub writer_of: Vec<Option<u8>>,
    /// Two workers had writes accepted under one fence.
    pub shared_fence: bool,
    /// How many completions were accepted.
    pub completes: u8,
    /// A renewal was accepted while the run was suspended.
    pub renewed_suspended: bool,
    /// A write under an old fence was refused (for showing the model reaches it).
    pub stale_refused: bool,
    /// An operator resumed the run at some point.
    pub resumed: bool,
    /// A claim succeeded after a resume.
    pub claimed_after_resume: bool,
    /// A claim was granted inside a retry delay.
    pub claimed_in_delay: bool,
    /// A run given back with a retry delay was claimed again.
    pub retried: bool,
    /// A run was failed at some point.
    pub failed: bool,
    /// A claim succeeded after a failed run was resumed.
    pub claimed_after_failure: bool,
    /// Handlers started (a granted lease taken up and worked on) since the last resume.
    pub ran: u8,
    /// Voluntary releases the store accepted since the last resume.
    pub refunded: u8,
    /// A worker failed the run for a claim past its budget.
    pub failed_by_budget: bool,
    /// An operator cancelled the run.
    pub cancelled: bool,
    /// The cancel came while a worker held the run.
    pub cancelled_held: bool,
    /// A renewal, write or end under a fence was accepted after the cancel.
    pub accepted_after_cancel: bool,
    /// A claim was granted after the cancel.
    pub claimed_after_cancel: bool,
    /// A worker's fenced operation was refused after the cancel (it learned of it).
    pub holder_refused_after_cancel: bool,
}

/// One state of the whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The global tick.
    pub now: u8,
    /// The store.
    pub store: Store,
    /// The workers.
    pub workers: Vec<Worker>,
    /// Messages in flight, sorted (a multiset: order of arrival is the scheduler's choice).
    pub net: Vec<Packet>,
    /// What the store accepted.
    pub history: History,
}

impl State {
    /// How many workers believe they hold the run and are within their local deadline.
    pub fn working(&self) -> usize {
        self.workers
            .iter()
            .filter(|w| w.lease.is_some_and(|l| self.now < l.deadline))
            .count()
    }
}

/// A step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time passes by one tick.
    Tick,
    /// A worker sends a claim.
    Claim(u8),
    /// A worker sends a renewal.
    Renew(u8),
    /// A worker sends a fenced write.
    Write(u8),
    /// A worker suspends its run (and stops working on it).
    Suspend(u8),
    /// A worker completes its run (and stops working on it).
    Complete(u8),
    /// A worker gives its run back with a retry delay (and stops working on it).
    Retry(u8),
    /// A worker fails its run (and stops working on it).
    Fail(u8),
    /// A worker gives its run back voluntarily (and stops working on it).
    Release(u8),
    /// An operator resumes the suspended or failed run.
    Resume,
    /// An operator cancels the run.
    Cancel,
    /// The network delivers the message at this index.
    Deliver(usize),
    /// The network loses it.
    Drop(usize),
    /// The network delivers it twice (a copy stays in flight).
    Duplicate(usize),
}
