//! Which kinds a [`Worker`](crate::Worker) serves, each with its handler: [`Kinds`].

use std::fmt;
use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::context::Handler;
use lease_core::{InvalidInput, Kind};

/// The kinds one [`Worker`](crate::Worker) serves ([`Worker::run_kinds`](crate::Worker::run_kinds)):
/// each kind with its own handler, and optionally its own concurrency limit within the
/// worker's.
///
/// The worker claims each kind through that kind's index
/// ([`claim_next_kind`](lease_core::LeaseStore::claim_next_kind)), taking the kinds in turn, so a
/// kind with a deep backlog does not starve the others, and never claims a run of a kind it
/// does not serve: such a run waits for a worker that does.
///
/// ```
/// use lease_core::{End, Kind};
/// use lease_runtime::{Kinds, RunContext};
/// let kinds = Kinds::new()
///     .handle(Kind::new("email")?, |_ctx: RunContext| async { Ok(End::Complete) })
///     .handle_limited(Kind::new("charge")?, |_ctx: RunContext| async { Ok(End::Complete) }, 2);
/// assert_eq!(kinds.len(), 2);
/// # Ok::<(), lease_core::InvalidInput>(())
/// ```
#[derive(Default)]
pub struct Kinds {
    pub(super) routes: Vec<Route>,
}

/// One served kind.
pub(super) struct Route {
    pub(super) kind: Kind,
    pub(super) handler: Arc<dyn Handler>,
    /// The kind's own concurrency limit, if it has one.
    pub(super) limit: Option<usize>,
}

impl fmt::Debug for Kinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.routes.iter().map(|r| (&r.kind, r.limit)))
            .finish()
    }
}

impl Kinds {
    /// No kinds yet.
    pub fn new() -> Kinds {
        Kinds::default()
    }

    /// Serves `kind` with `handler`, within the worker's concurrency.
    pub fn handle(mut self, kind: Kind, handler: impl Handler) -> Kinds {
        self.routes.push(Route {
            kind,
            handler: Arc::new(handler),
            limit: None,
        });
        self
    }

    /// Serves `kind` with `handler`, at most `concurrency` of its runs at once (1 up to the
    /// worker's concurrency, checked when the worker starts).
    pub fn handle_limited(
        mut self,
        kind: Kind,
        handler: impl Handler,
        concurrency: usize,
    ) -> Kinds {
        self.routes.push(Route {
            kind,
            handler: Arc::new(handler),
            limit: Some(concurrency),
        });
        self
    }

    /// How many kinds it serves.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether it serves no kind.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Checks it against the worker's `concurrency`: at least one kind, each once, each
    /// limit from 1 to `concurrency`.
    pub(super) fn check(&self, concurrency: usize) -> Result<(), InvalidInput> {
        if self.routes.is_empty() {
            return Err(InvalidInput::WorkerSetting {
                setting: "kinds",
                value: "none".to_owned(),
                rule: "a worker serves at least one kind",
            });
        }
        for (i, route) in self.routes.iter().enumerate() {
            if self.routes[..i].iter().any(|r| r.kind == route.kind) {
                return Err(InvalidInput::WorkerSetting {
                    setting: "kinds",
                    value: route.kind.to_string(),
                    rule: "each kind has one handler",
                });
            }
            if let Some(limit) = route.limit {
                if limit == 0 || limit > concurrency {
                    return Err(InvalidInput::WorkerSetting {
                        setting: "kind concurrency",
                        value: format!("{limit} for kind {}", route.kind),
                        rule: "from 1 to the worker's concurrency",
                    });
                }
            }
        }
        Ok(())
    }
}

/// A served kind while the worker runs: its handler and the semaphore of its own limit.
pub(super) struct Lane {
    pub(super) kind: Kind,
    pub(super) handler: Arc<dyn Handler>,
    pub(super) limit: Option<Arc<Semaphore>>,
}

impl Lane {
    pub(super) fn from_routes(routes: Vec<Route>) -> Vec<Lane> {
        routes
            .into_iter()
            .map(|r| Lane {
                kind: r.kind,
                handler: r.handler,
                limit: r.limit.map(|n| Arc::new(Semaphore::new(n))),
            })
            .collect()
    }

    /// A slot of this kind's own limit: `Some(None)` when it has none, `None` when it is full.
    pub(super) fn try_slot(&self) -> Option<Option<OwnedSemaphorePermit>> {
        match &self.limit {
            None => Some(None),
            Some(limit) => limit.clone().try_acquire_owned().ok().map(Some),
        }
    }
}

/// A job's hold on its slots: the worker's, and its kind's when the kind has a limit. Dropped
/// when the job is over; a kind's slot coming free wakes a claim loop that found every kind
/// full.
pub(super) struct Slot {
    pub(super) _worker: OwnedSemaphorePermit,
    pub(super) kind: Option<OwnedSemaphorePermit>,
    pub(super) freed: Arc<Notify>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.kind.take().is_some() {
            self.freed.notify_one();
        }
    }
}
