//! The store's own wake-ups: its sessions start with `lease.wake_ups = off`, so the
//! `runs_wake` trigger does not notify inside its writes, and each write that made runs
//! claimable hands its kinds to the store's [`Notifier`] once it has committed. One task sends
//! what has gathered in one statement, then what gathered meanwhile, so however many sessions
//! write, one notifying transaction is in flight at a time, and none of the writers takes the
//! server's notification queue lock (a notifying commit holds it through its flush, so
//! concurrent notifying commits are not flushed together: `tests/wake_cost.rs`).
//!
//! Writes in the caller's transactions (`create_in`, fenced transactions) are not the store's
//! to see: the trigger notifies them when they commit, as before.
//!
//! A notification is a hint: one that cannot be sent is logged and dropped, and the workers'
//! fallback poll finds the run.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lease_core::{Kind, NewRun};
use sqlx::PgPool;
use tokio::sync::Notify;

const NOTIFY: &str = include_str!("../sql/notify.sql");

/// When a run of a kind becomes claimable, as its write knew it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Due {
    /// In this many milliseconds from the write.
    In(u64),
    /// At this instant, in µs since the Unix epoch on the database clock.
    At(i64),
}

/// The wake-ups of one store's writes, sent by one task. Dropped with the last clone of the
/// store, which ends the task.
pub(crate) struct Notifier {
    shared: Arc<Shared>,
    signal: Arc<Notify>,
}

struct Shared {
    pool: PgPool,
    /// Behind a transaction pooler, what each send begins with (`pooler.rs`).
    begin: Option<std::borrow::Cow<'static, str>>,
    schema: String,
    /// The bound on one send (the store's call timeout).
    limit: Duration,
    /// What to send next; identical wake-ups gathered meanwhile are sent once.
    pending: Mutex<HashSet<(String, Due)>>,
    /// Whether the sending task runs. It is started by the first wake-up, and again by the
    /// next one after it ended (its runtime shut down under it: a store used from several
    /// runtimes one after another).
    running: AtomicBool,
}

impl Notifier {
    pub(crate) fn new(
        pool: PgPool,
        begin: Option<std::borrow::Cow<'static, str>>,
        schema: &str,
        limit: Duration,
    ) -> Notifier {
        Notifier {
            shared: Arc::new(Shared {
                pool,
                begin,
                schema: schema.to_owned(),
                limit,
                pending: Mutex::new(HashSet::new()),
                running: AtomicBool::new(false),
            }),
            signal: Arc::new(Notify::new()),
        }
    }

    /// A committed write left a run of `kind` claimable in `delay_ms`.
    pub(crate) fn claimable(&self, kind: &Kind, delay_ms: u64) {
        self.claimable_all([(kind, delay_ms)]);
    }

    /// A committed write left these runs claimable: each of `(kind, delay_ms)`.
    pub(crate) fn claimable_all<'a>(&self, runs: impl IntoIterator<Item = (&'a Kind, u64)>) {
        self.add(
            runs.into_iter()
                .map(|(kind, ms)| (kind.as_str().to_owned(), Due::In(ms))),
        );
    }

    /// A committed create made these runs.
    pub(crate) fn created<'a>(&self, runs: impl IntoIterator<Item = &'a NewRun>) {
        self.add(runs.into_iter().flat_map(|new| {
            let at = new.run_at_micros();
            // Claimable at the later of the instant (counted on the database clock when sent)
            // and the delay: with an instant, the delay is a second hint only if there is one.
            let delay =
                (at.is_none() || new.delay_millis() > 0).then(|| Due::In(new.delay_millis()));
            at.map(Due::At)
                .into_iter()
                .chain(delay)
                .map(|due| (new.kind().as_str().to_owned(), due))
        }));
    }

    /// Adds one write's wake-ups together, so the task sends them in one batch (a batch of
    /// runs of one kind and delay is one notification).
    fn add(&self, dues: impl IntoIterator<Item = (String, Due)>) {
        let mut fresh = false;
        {
            let mut pending = lock(&self.shared.pending);
            for due in dues {
                fresh |= pending.insert(due);
            }
        }
        if !fresh {
            return; // each is waiting to be sent already
        }
        if !self.shared.running.swap(true, Ordering::AcqRel) {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(send_loop(Arc::downgrade(&self.shared), self.signal.clone()));
                }
                // Not on a Tokio runtime (the store's own calls always are): nothing can send
                // now; the wake-ups wait for the next write's.
                Err(_) => self.shared.running.store(false, Ordering::Release),
            }
        }
        self.signal.notify_one();
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        // Wakes the task, which finds the store gone and ends.
        self.signal.notify_one();
    }
}

/// Marks the task ended however it ends: returned, or dropped with its runtime.
struct Running(Weak<Shared>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(shared) = self.0.upgrade() {
            shared.running.store(false, Ordering::Release);
        }
    }
}

async fn send_loop(shared: Weak<Shared>, signal: Arc<Notify>) {
    let _running = Running(shared.clone());
    loop {
        signal.notified().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let batch: Vec<(String, Due)> = lock(&shared.pending).drain().collect();
        if batch.is_empty() {
            continue;
        }
        let mut kinds = Vec::with_capacity(batch.len());
        let mut ms = Vec::with_capacity(batch.len());
        let mut at = Vec::with_capacity(batch.len());
        for (kind, due) in batch {
            kinds.push(kind);
            match due {
                Due::In(delay) => {
                    ms.push(Some(i64::try_from(delay).unwrap_or(i64::MAX)));
                    at.push(None);
                }
                Due::At(instant) => {
                    ms.push(None);
                    at.push(Some(instant));
                }
            }
        }
        let send = || async {
            let query = sqlx::query(NOTIFY)
                .persistent(shared.begin.is_none())
                .bind(&shared.schema)
                .bind(&kinds)
                .bind(&ms)
                .bind(&at);
            match &shared.begin {
                None => query.execute(&shared.pool).await.map(drop),
                Some(begin) => {
                    let mut tx = shared.pool.begin_with(begin.clone()).await?;
                    query.execute(&mut *tx).await?;
                    tx.commit().await
                }
            }
        };
        let sent = tokio::time::timeout(shared.limit, async {
            match send().await {
                // Once more on another connection: the pool drops one that failed (an idle
                // session the server closed when it restarted).
                Err(_) => send().await,
                sent => sent,
            }
        })
        .await;
        match sent {
            Ok(Ok(_)) => {}
            // A hint lost, which the workers' fallback poll covers.
            Ok(Err(e)) => tracing::debug!(
                kinds = kinds.len(),
                error = %crate::error::PgError::from(e),
                "wake-ups not sent; workers find the runs at their fallback poll"
            ),
            Err(_) => tracing::debug!(
                kinds = kinds.len(),
                "wake-ups not sent within the call timeout; workers find the runs at their \
                 fallback poll"
            ),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
