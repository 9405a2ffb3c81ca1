//! One way to insert a job: [`InsertOpts`], [`InsertExt::insert`] and its answer [`Inserted`].

use std::time::{Duration, SystemTime};

use lease_core::{Error, InvalidInput, LeaseStore, NewRun, Result, RunId};

use super::JobArgs;

/// How one job is inserted: its id, queue, priority and start. Every field is optional; an
/// unset one takes the kind's default ([`JobArgs::insert_opts`]), then the store's (a
/// generated id, the default queue, priority 0, claimable at once).
///
/// ```
/// use std::time::Duration;
/// use lease_runtime::InsertOpts;
/// let opts = InsertOpts::new().with_priority(2).with_delay(Duration::from_secs(60));
/// # let _ = opts;
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct InsertOpts {
    id: Option<RunId>,
    queue: Option<String>,
    priority: Option<u8>,
    start: Option<Start>,
    unique_key: Option<String>,
    trace_parent: Option<lease_core::TraceParent>,
}

/// When the run becomes claimable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    After(Duration),
    At(SystemTime),
}

impl InsertOpts {
    /// No option set.
    pub fn new() -> InsertOpts {
        InsertOpts::default()
    }

    /// The run's id, for a caller that has one (an order number, a request id): an insert
    /// that finds a run with this id creates nothing and answers
    /// [`duplicate`](Inserted::duplicate), so an insert sent twice runs once. Without it the id
    /// is generated ([`new_run_id`]).
    pub fn with_id(mut self, id: RunId) -> InsertOpts {
        self.id = Some(id);
        self
    }

    /// The run's queue ([`NewRun::with_queue`]): only workers serving it claim the run, within
    /// the queue's own concurrency, and none while the queue is paused
    /// ([`pause_queue`](LeaseStore::pause_queue)). Checked at insert
    /// ([`Queue::new`](lease_core::Queue::new)'s rules); the etcd backend keeps only the
    /// default queue and refuses another.
    pub fn with_queue(mut self, queue: impl Into<String>) -> InsertOpts {
        self.queue = Some(queue.into());
        self
    }

    /// The run's priority: 0 (the default) to [`MAX_PRIORITY`](lease_core::MAX_PRIORITY),
    /// higher claimed first within its kind ([`NewRun::with_priority`]).
    pub fn with_priority(mut self, priority: u8) -> InsertOpts {
        self.priority = Some(priority);
        self
    }

    /// Not claimable before `delay` has passed on the store's clock, at most
    /// [`MAX_START_DELAY`](lease_core::MAX_START_DELAY) ([`NewRun::with_delay`]). Replaces a
    /// start time set before.
    pub fn with_delay(mut self, delay: Duration) -> InsertOpts {
        self.start = Some(Start::After(delay));
        self
    }

    /// Not claimable before `at` ([`NewRun::with_run_at`]: the store's clock decides, except
    /// on etcd, which turns it into a delay on this host's clock). Replaces a delay set before.
    pub fn with_run_at(mut self, at: SystemTime) -> InsertOpts {
        self.start = Some(Start::At(at));
        self
    }

    /// A unique key: while a run inserted with `key` is live (waiting, scheduled, running,
    /// retrying or suspended), another insert with it creates nothing and answers
    /// [`duplicate`](Inserted::duplicate) with that run's id; once the run has ended
    /// (completed, failed, cancelled) the key is free again. Two inserts racing with one key
    /// create one run. The key is namespace-wide, across kinds: put the kind in it to keep
    /// kinds apart. See [`NewRun::with_unique_key`]; the etcd backend does not take keys yet
    /// and refuses the insert.
    pub fn with_unique_key(mut self, key: impl Into<String>) -> InsertOpts {
        self.unique_key = Some(key.into());
        self
    }

    /// The trace context the run is created under ([`NewRun::with_trace_parent`]): the
    /// Worker's span for each attempt continues it. Without it, the insert takes the current
    /// span's when the `otel` feature is on ([`current_trace_parent`](crate::trace::current_trace_parent)),
    /// and none otherwise.
    pub fn with_trace_parent(mut self, parent: lease_core::TraceParent) -> InsertOpts {
        self.trace_parent = Some(parent);
        self
    }

    /// The id given with [`with_id`](InsertOpts::with_id), if any.
    pub fn id(&self) -> Option<&RunId> {
        self.id.as_ref()
    }

    /// These options, each unset field taken from `defaults`.
    pub fn or(self, defaults: InsertOpts) -> InsertOpts {
        InsertOpts {
            id: self.id.or(defaults.id),
            queue: self.queue.or(defaults.queue),
            priority: self.priority.or(defaults.priority),
            start: self.start.or(defaults.start),
            unique_key: self.unique_key.or(defaults.unique_key),
            trace_parent: self.trace_parent.or(defaults.trace_parent),
        }
    }

    /// The [`NewRun`] that inserts `args` with these options over `T`'s defaults: `T::KIND`,
    /// the arguments' JSON as the payload, the id given or a generated one. For callers of the
    /// lower-level [`create_with`](LeaseStore::create_with) family.
    ///
    /// # Errors
    /// [`InvalidInput`] when `T::KIND` is not a valid kind, the arguments cannot be written as
    /// JSON, or the run breaks a [`NewRun::check`] rule (payload size, priority, start).
    pub fn new_run<T: JobArgs>(&self, args: &T) -> std::result::Result<NewRun, InvalidInput> {
        let opts = self.clone().or(T::insert_opts());
        let kind = T::kind()?;
        let payload = serde_json::to_vec(args).map_err(|e| InvalidInput::JobArgs {
            kind: T::KIND.to_owned(),
            why: e.to_string(),
        })?;
        let id = match opts.id {
            Some(id) => id,
            None => new_run_id(),
        };
        let mut new = NewRun::new(id).with_kind(kind).with_payload(payload);
        if let Some(queue) = opts.queue {
            new = new.with_queue(lease_core::Queue::new(queue)?);
        }
        if let Some(priority) = opts.priority {
            new = new.with_priority(priority);
        }
        if let Some(key) = opts.unique_key {
            new = new.with_unique_key(key);
        }
        // The caller's, else the current span's (with the `otel` feature).
        if let Some(parent) = opts
            .trace_parent
            .or_else(crate::trace::current_trace_parent)
        {
            new = new.with_trace_parent(parent);
        }
        new = match opts.start {
            Some(Start::After(delay)) => new.with_delay(delay),
            Some(Start::At(at)) => new.with_run_at(at),
            None => new,
        };
        new.check()?;
        Ok(new)
    }
}

/// What an insert did: the run's id, and whether the run existed already.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inserted {
    /// The run: the one created, or the one found.
    pub run_id: RunId,
    /// True when nothing was created because the run existed already: an insert with an id
    /// that was sent before or repeated in the same batch, or with the unique key of a live
    /// run.
    pub duplicate: bool,
}

/// A fresh run id: a UUIDv7 (time-ordered, so ids sort by creation time to the millisecond;
/// 74 random bits), as text.
pub fn new_run_id() -> RunId {
    RunId::new(uuid::Uuid::now_v7().to_string()).expect("a UUID is a valid run id")
}

impl Inserted {
    /// The answer to an insert from the answer to the create of `new`, made from `opts`: for
    /// adapters that insert through a create of their own (a create in the caller's
    /// transaction). A run that exists — the id given, or the live run holding the unique key
    /// — is a duplicate.
    ///
    /// # Errors
    /// `created`'s error, unless it says the run exists.
    pub fn from_create(new: &NewRun, opts: &InsertOpts, created: Result<()>) -> Result<Inserted> {
        match created {
            Ok(()) => Ok(Inserted {
                run_id: new.run().clone(),
                duplicate: false,
            }),
            // A generated id is fresh: a run with it can only be this insert's own earlier
            // send (the store resent the create after a lost reply), so it was created, not
            // found. Any other run that exists was found.
            Err(Error::AlreadyExists { run }) => Ok(Inserted {
                duplicate: opts.id.is_some() || &run != new.run(),
                run_id: run,
            }),
            Err(e) => Err(e),
        }
    }
}

/// Typed inserts on any store, `Arc<dyn LeaseStore>` included.
///
/// Each insert is one [`create_with`](LeaseStore::create_with) (or one
/// [`create_many_with`](LeaseStore::create_many_with) for a batch), so it is as atomic and as
/// durable as the store's create. A retry of an insert with the same id (given with
/// [`InsertOpts::with_id`]) or the same unique key ([`InsertOpts::with_unique_key`], while
/// the run is live) answers `duplicate: true` with that run's id and changes nothing. An insert
/// with neither that fails with an outer error (a timeout, a lost connection) may or may not
/// have created its run, and its retry makes a second one: give a job that must not run twice
/// an id or a key.
#[async_trait::async_trait]
pub trait InsertExt: LeaseStore {
    /// Inserts one job of kind `T::KIND` with `args` as its payload.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] before any I/O for arguments or options
    /// [`InsertOpts::new_run`] refuses; otherwise as [`create_with`](LeaseStore::create_with),
    /// except that an existing run is `Ok` with [`Inserted::duplicate`].
    async fn insert<T: JobArgs>(&self, args: &T, opts: InsertOpts) -> Result<Inserted> {
        let new = opts.new_run(args)?;
        let created = self.create_with(&new).await.map(drop);
        Inserted::from_create(&new, &opts, created)
    }

    /// Inserts up to [`MAX_BATCH`](lease_core::MAX_BATCH) jobs of one kind in one round trip,
    /// one answer per job, in order.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] before any I/O when any job is refused (nothing is created);
    /// the outer error of [`create_many_with`](LeaseStore::create_many_with); the first error
    /// of a job other than an existing run (the other jobs' fate is then as the store says:
    /// insert them again with their ids to learn it).
    async fn insert_many<T: JobArgs>(&self, jobs: &[(T, InsertOpts)]) -> Result<Vec<Inserted>> {
        let runs = jobs
            .iter()
            .map(|(args, opts)| opts.new_run(args))
            .collect::<std::result::Result<Vec<NewRun>, InvalidInput>>()?;
        let results = self.create_many_with(&runs).await?;
        runs.iter()
            .zip(jobs)
            .zip(results)
            .map(|((new, (_, opts)), created)| Inserted::from_create(new, opts, created))
            .collect()
    }
}

impl<S: LeaseStore + ?Sized> InsertExt for S {}
