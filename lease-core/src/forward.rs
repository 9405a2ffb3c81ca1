//! The forwarding base of store wrappers: implement [`Forward`] (the wrapped store and, if
//! the wrapper does anything, an [`around`](Forward::around) hook) and the wrapper is a
//! [`LeaseStore`] that forwards **every** call, each through the hook. A method added to the
//! trait is added here once, for every wrapper: none can silently skip it and fall back to
//! the trait's default (`forward_covers_every_trait_method` checks this file against the
//! trait).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//! use lease_core::forward::{Call, Forward, Next, Reply};
//! use lease_core::{LeaseStore, Result, RunId};
//! use lease_runtime::MemoryLeaseStore;
//!
//! /// Counts the calls that reach the store.
//! #[derive(Debug)]
//! struct Counted {
//!     inner: Arc<dyn LeaseStore>,
//!     calls: AtomicU64,
//! }
//!
//! impl std::fmt::Display for Counted {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         write!(f, "counted({})", self.inner)
//!     }
//! }
//!
//! #[async_trait::async_trait]
//! impl Forward for Counted {
//!     fn inner(&self) -> &dyn LeaseStore {
//!         &*self.inner
//!     }
//!
//!     async fn around<T: Reply>(&self, _call: Call<'_>, next: Next<'_, T>) -> Result<T> {
//!         self.calls.fetch_add(1, Ordering::Relaxed);
//!         next.run().await
//!     }
//! }
//!
//! let store = Counted { inner: Arc::new(MemoryLeaseStore::new()), calls: AtomicU64::new(0) };
//! store.create(&RunId::new("r")?).await?;
//! store.inspect(&RunId::new("r")?).await?;
//! assert_eq!(store.calls.load(Ordering::Relaxed), 2);
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::{
    Capabilities, Effect, EndedStates, Ending, Error, IdempotencyKey, JournalEntry, Kind,
    KindCounts, Lease, LeaseStore, ListFilter, NewRun, Queue, QueueState, Result, RunCounts, RunId,
    RunRecord, Ttl, Wakes, WorkerId,
};

/// What a forwarded call is: the trait method's name and what it names, for a wrapper's
/// traces, metrics or faults.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Call<'a> {
    /// The [`LeaseStore`] method.
    pub operation: &'static str,
    /// The run it is about, when one.
    pub run: Option<&'a RunId>,
    /// The lease it writes under, when one.
    pub lease: Option<&'a Lease>,
    /// The worker that claims, when one.
    pub worker: Option<&'a WorkerId>,
    /// The items of a batch, or the most a call may return.
    pub items: Option<usize>,
    /// The leases it renews (`renew`, `renew_many`).
    pub renews: &'a [Lease],
}

impl<'a> Call<'a> {
    fn new(operation: &'static str) -> Call<'a> {
        Call {
            operation,
            run: None,
            lease: None,
            worker: None,
            items: None,
            renews: &[],
        }
    }

    fn run(operation: &'static str, run: &'a RunId) -> Call<'a> {
        Call {
            run: Some(run),
            ..Call::new(operation)
        }
    }

    fn lease(operation: &'static str, lease: &'a Lease) -> Call<'a> {
        Call {
            run: Some(lease.run()),
            lease: Some(lease),
            ..Call::new(operation)
        }
    }

    fn items(operation: &'static str, items: usize) -> Call<'a> {
        Call {
            items: Some(items),
            ..Call::new(operation)
        }
    }

    fn claims(operation: &'static str, worker: &'a WorkerId, max: usize) -> Call<'a> {
        Call {
            worker: Some(worker),
            items: Some(max),
            ..Call::new(operation)
        }
    }
}

/// A call's future, as [`Next::run`] returns it.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// The wrapped store's call, to run once, more than once (a duplicated request) or never
/// (a refused one).
pub struct Next<'a, T> {
    make: Box<dyn Fn() -> Pending<'a, T> + Send + Sync + 'a>,
}

impl<'a, T> Next<'a, T> {
    fn new<F>(make: impl Fn() -> F + Send + Sync + 'a) -> Next<'a, T>
    where
        F: Future<Output = Result<T>> + Send + 'a,
    {
        Next {
            make: Box::new(move || Box::pin(make())),
        }
    }

    /// Sends the call to the wrapped store.
    pub fn run(&self) -> Pending<'a, T> {
        (self.make)()
    }
}

impl<T> fmt::Debug for Next<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Next")
    }
}

/// What a wrapper can read of any reply without knowing its type.
pub trait Reply: Send + 'static {
    /// The items of a reply that holds several (leases, records, ids, verdicts).
    fn len(&self) -> Option<usize> {
        None
    }

    /// Whether a reply of several items holds none.
    fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// The refusals of a batch's items, each judged on its own.
    fn item_errors(&self) -> Vec<&Error> {
        Vec::new()
    }

    /// The lease a claim or renewal answered.
    fn lease(&self) -> Option<&Lease> {
        None
    }
}

impl Reply for Lease {
    fn lease(&self) -> Option<&Lease> {
        Some(self)
    }
}

macro_rules! single {
    ($($t:ty),*) => { $(impl Reply for $t {})* };
}
single!(
    (),
    u64,
    RunRecord,
    JournalEntry,
    RunCounts,
    QueueState,
    crate::Signalled
);

macro_rules! many {
    ($($t:ty),*) => {
        $(impl Reply for Vec<$t> {
            fn len(&self) -> Option<usize> {
                Some(<[$t]>::len(self))
            }
        })*
    };
}
many!(
    Lease,
    RunId,
    RunRecord,
    JournalEntry,
    KindCounts,
    QueueState
);

macro_rules! verdicts {
    ($($t:ty),*) => {
        $(impl Reply for Vec<Result<$t>> {
            fn len(&self) -> Option<usize> {
                Some(<[Result<$t>]>::len(self))
            }

            fn item_errors(&self) -> Vec<&Error> {
                self.iter().filter_map(|r| r.as_ref().err()).collect()
            }
        })*
    };
}
verdicts!((), Lease, RunRecord);

/// A store that wraps another and forwards every call through [`around`](Forward::around).
/// Every `Forward` is a [`LeaseStore`].
#[async_trait::async_trait]
pub trait Forward: fmt::Debug + fmt::Display + Send + Sync + 'static {
    /// The wrapped store.
    fn inner(&self) -> &dyn LeaseStore;

    /// What the wrapper supports, given what the wrapped store does (`inner`); the default
    /// is the wrapped store's.
    fn capabilities_over(&self, inner: Capabilities) -> Capabilities {
        inner
    }

    /// Runs `call` (sent to the wrapped store by [`Next::run`]); the default sends it as it
    /// is and returns its reply.
    async fn around<T: Reply>(&self, call: Call<'_>, next: Next<'_, T>) -> Result<T> {
        let _ = call;
        next.run().await
    }
}

/// Forwards one method: the call's description, then the wrapped store's method.
macro_rules! forward {
    ($self:ident, $call:expr, $method:ident($($arg:expr),*)) => {
        $self
            .around($call, Next::new(move || $self.inner().$method($($arg),*)))
            .await
    };
}

#[async_trait::async_trait]
impl<W: Forward> LeaseStore for W {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        forward!(self, Call::run("create", run), create(run))
    }

    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        let call = Call {
            worker: Some(worker),
            ..Call::run("claim", run)
        };
        forward!(self, call, claim(run, worker, ttl))
    }

    async fn claim_next(&self, worker: &WorkerId, ttl: Ttl, max: usize) -> Result<Vec<Lease>> {
        let call = Call::claims("claim_next", worker, max);
        forward!(self, call, claim_next(worker, ttl, max))
    }

    async fn claim_next_kind(
        &self,
        kind: &Kind,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
        let call = Call::claims("claim_next_kind", worker, max);
        forward!(self, call, claim_next_kind(kind, worker, ttl, max))
    }

    async fn claim_next_in(
        &self,
        queue: &Queue,
        kind: &Kind,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
        let call = Call::claims("claim_next_in", worker, max);
        forward!(self, call, claim_next_in(queue, kind, worker, ttl, max))
    }

    async fn pause_queue(&self, queue: &Queue) -> Result<QueueState> {
        forward!(self, Call::new("pause_queue"), pause_queue(queue))
    }

    async fn resume_queue(&self, queue: &Queue) -> Result<QueueState> {
        forward!(self, Call::new("resume_queue"), resume_queue(queue))
    }

    async fn queues(&self) -> Result<Vec<QueueState>> {
        forward!(self, Call::new("queues"), queues())
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease> {
        let call = Call {
            renews: std::slice::from_ref(lease),
            ..Call::lease("renew", lease)
        };
        forward!(self, call, renew(lease))
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        let call = Call {
            renews: leases,
            ..Call::items("renew_many", leases.len())
        };
        forward!(self, call, renew_many(leases))
    }

    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        forward!(self, Call::lease("append", lease), append(lease, payload))
    }

    async fn append_keyed(
        &self,
        lease: &Lease,
        key: &IdempotencyKey,
        payload: &[u8],
    ) -> Result<JournalEntry> {
        let call = Call::lease("append_keyed", lease);
        forward!(self, call, append_keyed(lease, key, payload))
    }

    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        forward!(self, Call::run("journal", run), journal(run))
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        forward!(self, Call::lease("release", lease), release(lease))
    }

    async fn suspend(&self, lease: &Lease) -> Result<()> {
        forward!(self, Call::lease("suspend", lease), suspend(lease))
    }

    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        forward!(self, Call::items("end_many", ends.len()), end_many(ends))
    }

    fn takes_effect(&self, effect: &Effect) -> bool {
        self.inner().takes_effect(effect)
    }

    async fn end_many_with_effects(
        &self,
        ends: &[Ending],
        effects: &[Option<Effect>],
    ) -> Result<Vec<Result<()>>> {
        let call = Call::items("end_many_with_effects", ends.len());
        forward!(self, call, end_many_with_effects(ends, effects))
    }

    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>> {
        let call = Call::items("create_many", runs.len());
        forward!(self, call, create_many(runs))
    }

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        forward!(self, Call::run("resume", run), resume(run))
    }

    async fn complete(&self, lease: &Lease) -> Result<()> {
        forward!(self, Call::lease("complete", lease), complete(lease))
    }

    async fn deliver_signal(
        &self,
        run: &RunId,
        name: &crate::SignalName,
        fence: crate::Fence,
        payload: &[u8],
    ) -> Result<crate::Signalled> {
        forward!(
            self,
            Call::run("deliver_signal", run),
            deliver_signal(run, name, fence, payload)
        )
    }

    fn signal_key(&self) -> Option<&crate::SignalKey> {
        self.inner().signal_key()
    }

    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        forward!(self, Call::run("inspect", run), inspect(run))
    }

    async fn inspect_many(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        let call = Call::items("inspect_many", runs.len());
        forward!(self, call, inspect_many(runs))
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        forward!(self, Call::items("list", filter.limit), list(filter))
    }

    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        forward!(self, Call::run("force_release", run), force_release(run))
    }

    async fn create_with(&self, new: &NewRun) -> Result<RunRecord> {
        forward!(self, Call::run("create_with", new.run()), create_with(new))
    }

    async fn create_many_with(&self, runs: &[NewRun]) -> Result<Vec<Result<()>>> {
        let call = Call::items("create_many_with", runs.len());
        forward!(self, call, create_many_with(runs))
    }

    async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        forward!(self, Call::run("cancel", run), cancel(run, reason))
    }

    async fn purge(&self, older_than: Duration, max: usize) -> Result<Vec<RunId>> {
        forward!(self, Call::items("purge", max), purge(older_than, max))
    }

    async fn purge_ended(
        &self,
        states: EndedStates,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<RunId>> {
        let call = Call::items("purge_ended", max);
        forward!(self, call, purge_ended(states, older_than, max))
    }

    async fn purge_ids(&self, runs: &[RunId]) -> Result<Vec<RunId>> {
        forward!(self, Call::items("purge_ids", runs.len()), purge_ids(runs))
    }

    async fn count(&self) -> Result<RunCounts> {
        forward!(self, Call::new("count"), count())
    }

    async fn count_kinds(&self) -> Result<Vec<KindCounts>> {
        forward!(self, Call::new("count_kinds"), count_kinds())
    }

    async fn count_purgeable(&self, older_than: Duration) -> Result<u64> {
        let call = Call::new("count_purgeable");
        forward!(self, call, count_purgeable(older_than))
    }

    fn wakes(&self) -> Option<Wakes> {
        self.inner().wakes()
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities_over(self.inner().capabilities())
    }
}

#[cfg(test)]
mod tests {
    /// The names of the `fn`s declared in `source` between `start` and the first line that is
    /// exactly `end`.
    fn fns(source: &str, start: &str, end: &str) -> std::collections::BTreeSet<String> {
        let body = &source[source.find(start).expect("the block")..];
        let body = &body[..body.find(end).expect("its end")];
        body.lines()
            .filter_map(|line| {
                let line = line.trim_start();
                let rest = line
                    .strip_prefix("async fn ")
                    .or_else(|| line.strip_prefix("fn "))?;
                Some(rest.split(['(', '<']).next()?.to_owned())
            })
            .collect()
    }

    #[test]
    fn forward_covers_every_trait_method() {
        let trait_fns = fns(include_str!("store.rs"), "pub trait LeaseStore:", "\n}\n");
        let forwarded = fns(
            include_str!("forward.rs"),
            "impl<W: Forward> LeaseStore for W {",
            "\n}\n",
        );
        assert!(trait_fns.len() > 30, "{trait_fns:?}");
        assert_eq!(
            trait_fns, forwarded,
            "every LeaseStore method is forwarded, and nothing else"
        );
    }
}
