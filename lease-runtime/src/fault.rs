//! A fault-injecting wrapper over any `LeaseStore`, for partition tests and the demo.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::forward::{Call, Forward, Next, Reply};
use lease_core::{Error, Lease, LeaseStore, Result, RunId};
use tokio::sync::watch;

/// What a [`FaultyStore`] does to the calls passing through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// Calls go through untouched.
    Pass,
    /// Calls wait, as over a black-holed network, until the fault changes. When it changes back
    /// to [`Fault::Pass`] the waiting calls are delivered, late, like retransmitted packets after
    /// a partition heals; under [`Fault::Fail`] they fail.
    Hang,
    /// Calls fail at once with [`Error::Unavailable`], as on a refused connection.
    Fail,
}

/// What a [`FaultyStore`] does to a call's reply **after the wrapped store applied the call**:
/// the faults of a network that delivered the request and then failed the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReplyFault {
    /// Replies come back untouched.
    Pass,
    /// Each reply arrives this much later than the store answered (the call was applied at
    /// once): a slow answer, as after a retransmission.
    Delay(Duration),
    /// The call is applied and its reply never arrives: the caller's future never completes.
    Lose,
    /// The call is applied and the caller gets [`Error::Unavailable`], as when the connection
    /// drops between the store's commit and its reply.
    Error,
    /// The request is delivered twice: the store applies it twice and the caller gets the first
    /// reply.
    Duplicate,
}

/// The backend name of the errors a [`FaultyStore`] injects.
pub const FAULT_BACKEND: &str = "fault-injection";

/// Wraps a [`LeaseStore`] and injects [`Fault`]s into every call before it reaches the store,
/// and [`ReplyFault`]s into every reply after the store applied it, so partition behaviour can
/// be tested in one process. It also counts the renewals of each run it receives
/// ([`renewals_of`](FaultyStore::renewals_of)), whatever becomes of them, so a test can see a
/// heartbeat that should have stopped. Clones share the switches and the counts.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::Arc;
/// use lease_core::{Error, LeaseStore, RunId};
/// use lease_runtime::{Fault, FaultyStore, MemoryLeaseStore};
/// let store = FaultyStore::new(Arc::new(MemoryLeaseStore::new()));
/// store.set(Fault::Fail);
/// let err = store.inspect(&RunId::new("r").unwrap()).await.unwrap_err();
/// assert!(err.is_retryable());
/// # }
/// ```
#[derive(Clone)]
pub struct FaultyStore {
    inner: Arc<dyn LeaseStore>,
    fault: Arc<watch::Sender<Fault>>,
    reply: Arc<Mutex<ReplyFault>>,
    renewals_by_run: Arc<Mutex<HashMap<RunId, u64>>>,
}

impl FaultyStore {
    /// Wraps `inner`, passing calls through until told otherwise.
    pub fn new(inner: Arc<dyn LeaseStore>) -> FaultyStore {
        FaultyStore {
            inner,
            fault: Arc::new(watch::Sender::new(Fault::Pass)),
            reply: Arc::new(Mutex::new(ReplyFault::Pass)),
            renewals_by_run: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Switches what happens to the replies of calls that reach the store from now on.
    pub fn set_reply(&self, fault: ReplyFault) {
        tracing::info!(store = %self.inner, ?fault, "reply fault injection switched");
        *self
            .reply
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = fault;
    }

    /// The current reply fault.
    pub fn reply_fault(&self) -> ReplyFault {
        *self
            .reply
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many renewals of `run` were asked through this store (by `renew`, or as one lease
    /// of a `renew_many` batch), counted before any fault, including renewals the store refused.
    pub fn renewals_of(&self, run: &RunId) -> u64 {
        let counts = self
            .renewals_by_run
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        counts.get(run).copied().unwrap_or(0)
    }

    fn count_renewals<'a>(&self, leases: impl IntoIterator<Item = &'a Lease>) {
        let mut counts = self
            .renewals_by_run
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for lease in leases {
            *counts.entry(lease.run().clone()).or_default() += 1;
        }
    }

    /// Hands the reply `out` to the caller as the current reply fault says.
    async fn answer<T>(&self, fault: ReplyFault, out: Result<T>) -> Result<T> {
        match fault {
            ReplyFault::Pass | ReplyFault::Duplicate => out,
            ReplyFault::Delay(by) => {
                tokio::time::sleep(by).await;
                out
            }
            ReplyFault::Lose => std::future::pending().await,
            ReplyFault::Error => Err(Error::unavailable(
                FAULT_BACKEND,
                format!(
                    "injected loss of the reply from {} (the call was applied)",
                    self.inner
                ),
            )),
        }
    }

    /// Switches the fault for calls in flight and to come.
    pub fn set(&self, fault: Fault) {
        tracing::info!(store = %self.inner, ?fault, "fault injection switched");
        self.fault.send_replace(fault);
    }

    /// The current fault.
    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    /// The wrapped store, reached without faults.
    pub fn inner(&self) -> &Arc<dyn LeaseStore> {
        &self.inner
    }

    /// Waits while hanging; fails under [`Fault::Fail`].
    async fn gate(&self) -> Result<()> {
        let mut fault = self.fault.subscribe();
        loop {
            match *fault.borrow_and_update() {
                Fault::Pass => return Ok(()),
                Fault::Fail => {
                    return Err(Error::unavailable(
                        FAULT_BACKEND,
                        format!("injected connection failure to {}", self.inner),
                    ))
                }
                Fault::Hang => {}
            }
            // The sender lives as long as `self`, so this only returns on a change.
            let _ = fault.changed().await;
        }
    }
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner)
            .field("fault", &self.fault())
            .field("reply", &self.reply_fault())
            .finish()
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "faulty({})", self.inner)
    }
}

/// Every call through the faults, by the forwarding base: a method added to the trait is
/// faulted too.
#[async_trait::async_trait]
impl Forward for FaultyStore {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }

    async fn around<T: Reply>(&self, call: Call<'_>, next: Next<'_, T>) -> Result<T> {
        self.count_renewals(call.renews);
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = next.run().await;
        }
        let out = next.run().await;
        self.answer(fault, out).await
    }
}
