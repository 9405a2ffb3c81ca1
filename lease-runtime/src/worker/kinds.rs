//! Which kinds a [`Worker`](crate::Worker) serves, each with its handler: [`Kinds`].

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::context::{Handler, HandlerFuture, RunContext};
use super::KindPolicy;
use crate::jobs::{args::decode, JobArgs};
use lease_core::{sanitize_reason, BoxError, End, InvalidInput, Kind};

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
    /// A typed job whose `KIND` is not a valid kind: reported when the worker starts.
    invalid: Option<InvalidInput>,
}

/// One served kind.
pub(super) struct Route {
    pub(super) kind: Kind,
    pub(super) handler: Arc<dyn Handler>,
    /// The kind's own limit, retry policy and attempt timeout, where it has them.
    pub(super) policy: KindPolicy,
}

impl fmt::Debug for Kinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.routes.iter().map(|r| (&r.kind, r.policy)))
            .finish()
    }
}

impl Kinds {
    /// No kinds yet.
    pub fn new() -> Kinds {
        Kinds::default()
    }

    /// Serves `kind` with `handler`, within the worker's concurrency.
    pub fn handle(self, kind: Kind, handler: impl Handler) -> Kinds {
        self.handle_with(kind, handler, KindPolicy::new())
    }

    /// Serves `kind` with `handler` under the kind's own `policy` (concurrency limit, retry
    /// policy, attempt timeout), each unset part the worker's.
    pub fn handle_with(mut self, kind: Kind, handler: impl Handler, policy: KindPolicy) -> Kinds {
        self.routes.push(Route {
            kind,
            handler: Arc::new(handler),
            policy,
        });
        self
    }

    /// Serves `kind` with `handler`, at most `concurrency` of its runs at once (1 up to the
    /// worker's concurrency, checked when the worker starts).
    pub fn handle_limited(self, kind: Kind, handler: impl Handler, concurrency: usize) -> Kinds {
        self.handle_with(
            kind,
            handler,
            KindPolicy::new().with_concurrency(concurrency),
        )
    }

    /// Serves the jobs of `T` (kind `T::KIND`) with `handler`, which takes the run's context
    /// and its arguments decoded, under `T`'s [`policy`](JobArgs::policy) (the worker's
    /// settings for what it leaves unset).
    ///
    /// A payload that is not `T` (or a run without one) fails the run for good, with the
    /// decode error as its reason ([`End::Fail`]): arguments that cannot be read now will not
    /// be readable on a retry. The handler is not called.
    ///
    /// ```
    /// use serde::{Deserialize, Serialize};
    /// use lease_core::End;
    /// use lease_runtime::{JobArgs, Kinds, RunContext};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct SendEmail {
    ///     to: String,
    /// }
    /// impl JobArgs for SendEmail {
    ///     const KIND: &'static str = "send_email";
    /// }
    ///
    /// let kinds = Kinds::new().job::<SendEmail, _, _>(|_ctx: RunContext, args: SendEmail| async move {
    ///     println!("mail to {}", args.to);
    ///     Ok(End::Complete)
    /// });
    /// assert_eq!(kinds.len(), 1);
    /// ```
    pub fn job<T, F, Fut>(self, handler: F) -> Kinds
    where
        T: JobArgs,
        F: Fn(RunContext, T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<End, BoxError>> + Send + 'static,
    {
        self.typed::<T, F, Fut>(handler, T::policy())
    }

    /// [`job`](Kinds::job), at most `concurrency` of its runs at once (as
    /// [`handle_limited`](Kinds::handle_limited)).
    pub fn job_limited<T, F, Fut>(self, handler: F, concurrency: usize) -> Kinds
    where
        T: JobArgs,
        F: Fn(RunContext, T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<End, BoxError>> + Send + 'static,
    {
        self.typed::<T, F, Fut>(handler, T::policy().with_concurrency(concurrency))
    }

    fn typed<T, F, Fut>(mut self, handler: F, policy: KindPolicy) -> Kinds
    where
        T: JobArgs,
        F: Fn(RunContext, T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<End, BoxError>> + Send + 'static,
    {
        match T::kind() {
            Ok(kind) => self.routes.push(Route {
                kind,
                handler: Arc::new(Typed {
                    handler,
                    args: PhantomData::<fn() -> T>,
                }),
                policy,
            }),
            Err(invalid) => {
                self.invalid.get_or_insert(invalid);
            }
        }
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
        if let Some(invalid) = &self.invalid {
            return Err(invalid.clone());
        }
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
            if let Some(limit) = route.policy.concurrency {
                if limit == 0 || limit > concurrency {
                    return Err(InvalidInput::WorkerSetting {
                        setting: "kind concurrency",
                        value: format!("{limit} for kind {}", route.kind),
                        rule: "from 1 to the worker's concurrency",
                    });
                }
            }
            let whose = format!(" for kind {}", route.kind);
            if let Some(retry) = &route.policy.retry {
                super::config::check_retry(retry, &whose)?;
            }
            if let Some(d) = route.policy.attempt_timeout {
                super::config::check_attempt_timeout(d, &whose)?;
            }
        }
        Ok(())
    }
}

/// A served kind in one served queue while the worker runs: what a claim asks for, with the
/// kind's handler and the semaphores of the kind's and the queue's own limits. A kind's limit
/// is shared by its lanes in every queue, a queue's by its lanes of every kind.
pub(super) struct Lane {
    pub(super) kind: Kind,
    pub(super) queue: lease_core::Queue,
    pub(super) handler: Arc<dyn Handler>,
    pub(super) limit: Option<Arc<Semaphore>>,
    pub(super) queue_limit: Option<Arc<Semaphore>>,
    /// The kind's retry policy and attempt timeout, where it has its own.
    pub(super) policy: KindPolicy,
}

/// A lane's own slots: its kind's and its queue's, each where it has a limit.
pub(super) type LaneSlots = (Option<OwnedSemaphorePermit>, Option<OwnedSemaphorePermit>);

impl Lane {
    /// Every route in every queue (queue by queue, the kinds in turn within each).
    pub(super) fn from_routes(
        routes: Vec<Route>,
        queues: &[(lease_core::Queue, Option<usize>)],
    ) -> Vec<Lane> {
        let kinds: Vec<(Route, Option<Arc<Semaphore>>)> = routes
            .into_iter()
            .map(|r| {
                let limit = r.policy.concurrency.map(|n| Arc::new(Semaphore::new(n)));
                (r, limit)
            })
            .collect();
        let mut lanes = Vec::with_capacity(kinds.len() * queues.len());
        for (queue, queue_limit) in queues {
            let queue_limit = queue_limit.map(|n| Arc::new(Semaphore::new(n)));
            for (route, limit) in &kinds {
                lanes.push(Lane {
                    kind: route.kind.clone(),
                    queue: queue.clone(),
                    handler: route.handler.clone(),
                    limit: limit.clone(),
                    queue_limit: queue_limit.clone(),
                    policy: route.policy,
                });
            }
        }
        lanes
    }

    /// A slot of this lane's kind's and queue's own limits (`None` for either without one),
    /// or `None` when either is full.
    pub(super) fn try_slot(&self) -> Option<LaneSlots> {
        let take = |limit: &Option<Arc<Semaphore>>| match limit {
            None => Some(None),
            Some(limit) => limit.clone().try_acquire_owned().ok().map(Some),
        };
        let kind = take(&self.limit)?;
        let queue = take(&self.queue_limit)?;
        Some((kind, queue))
    }
}

/// A job's hold on its slots: the worker's, and its kind's and queue's where they have limits.
/// Dropped when the job is over; a kind's or queue's slot coming free wakes a claim loop that
/// found every lane full.
pub(super) struct Slot {
    pub(super) _worker: OwnedSemaphorePermit,
    pub(super) lane: LaneSlots,
    pub(super) freed: Arc<Notify>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Each permit taken is released at the end of its statement, before the notification.
        let kind = self.lane.0.take().is_some();
        let queue = self.lane.1.take().is_some();
        if kind || queue {
            self.freed.notify_one();
        }
    }
}

/// A typed job's handler: decodes the payload, then calls the user's function.
struct Typed<T, F> {
    handler: F,
    args: PhantomData<fn() -> T>,
}

impl<T, F, Fut> Handler for Typed<T, F>
where
    T: JobArgs,
    F: Fn(RunContext, T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<End, BoxError>> + Send + 'static,
{
    fn call(&self, ctx: RunContext) -> HandlerFuture {
        match decode::<T>(ctx.run(), ctx.payload()) {
            Ok(args) => Box::pin((self.handler)(ctx, args)),
            Err(why) => {
                tracing::warn!(run = %ctx.run(), kind = T::KIND, error = %why, "job arguments do not decode; failing the run");
                let reason = sanitize_reason(&why.to_string());
                Box::pin(async move { Ok(End::Fail(reason)) })
            }
        }
    }
}
