//! A run's queue: which capacity it is claimed from, and whether claims take it at all.

use crate::limits::MAX_QUEUE_BYTES;
use std::sync::Arc;

use crate::error::InvalidInput;
use crate::types::StoreTime;

/// The queue of a run created without one, and the queue
/// [`claim_next_kind`](crate::LeaseStore::claim_next_kind) claims from.
pub const DEFAULT_QUEUE: &str = "default";

/// A run's queue ([`NewRun::with_queue`](crate::NewRun::with_queue)): a short name, 1 to
/// [`MAX_QUEUE_BYTES`] bytes of UTF-8 without control characters, fixed when the run is
/// created.
///
/// Kinds route runs to handlers; queues decide capacity. A claim takes runs of one queue and
/// one kind ([`claim_next_in`](crate::LeaseStore::claim_next_in)), so a `Worker`
/// (`lease-runtime`) gives each queue it serves its own concurrency, and a queue that is
/// [paused](crate::LeaseStore::pause_queue) is claimed by no worker until it is resumed. A run
/// created without a queue is in the [`DEFAULT_QUEUE`].
///
/// ```
/// use lease_core::{InvalidInput, Queue};
/// let queue = Queue::new("mailers")?;
/// assert_eq!(queue.as_str(), "mailers");
/// assert!(Queue::default().is_default());
/// assert!(matches!(Queue::new(""), Err(InvalidInput::EmptyQueue { .. })));
/// # Ok::<(), InvalidInput>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Queue(Arc<str>);

impl Queue {
    /// Validates `queue`: 1 to [`MAX_QUEUE_BYTES`] bytes of UTF-8, no control characters.
    ///
    /// # Errors
    /// [`InvalidInput::EmptyQueue`], [`InvalidInput::QueueTooLong`] or
    /// [`InvalidInput::ControlCharacter`], naming the offending byte.
    pub fn new(queue: impl AsRef<str>) -> Result<Queue, InvalidInput> {
        let queue = queue.as_ref();
        crate::name::check(
            queue,
            MAX_QUEUE_BYTES,
            "queue",
            InvalidInput::EmptyQueue {
                max: MAX_QUEUE_BYTES,
            },
            |len| InvalidInput::QueueTooLong {
                len,
                max: MAX_QUEUE_BYTES,
            },
        )?;
        Ok(Queue(Arc::from(queue)))
    }

    /// The queue's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether it is the [`DEFAULT_QUEUE`].
    pub fn is_default(&self) -> bool {
        &*self.0 == DEFAULT_QUEUE
    }
}

impl Default for Queue {
    /// The [`DEFAULT_QUEUE`].
    fn default() -> Queue {
        Queue(Arc::from(DEFAULT_QUEUE))
    }
}

crate::name::name_traits!(Queue);

/// A queue as [`queues`](crate::LeaseStore::queues) lists it: whether it is paused, and since
/// when (the store's clock; `None` for a queue never paused or resumed).
///
/// Backends build it with [`QueueState::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueState {
    /// The queue.
    pub queue: Queue,
    /// Whether claims pass it by.
    pub paused: bool,
    /// When it was last paused or resumed, on the store's clock (`None` for a queue never
    /// paused or resumed).
    pub changed_at: Option<StoreTime>,
}

impl QueueState {
    /// `queue`, paused or not, changed at `changed_at`.
    pub fn new(queue: Queue, paused: bool, changed_at: Option<StoreTime>) -> QueueState {
        QueueState {
            queue,
            paused,
            changed_at,
        }
    }
}

/// Refuses queues other than the default, for a backend that has no index per queue: nothing
/// is written.
///
/// # Errors
/// [`InvalidInput::Unsupported`] naming queues.
pub fn refuse_queues<'a>(queues: impl IntoIterator<Item = &'a Queue>) -> Result<(), InvalidInput> {
    if queues.into_iter().any(|q| !q.is_default()) {
        return Err(InvalidInput::Unsupported {
            operation: "queues other than the default",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_are_exact() {
        assert!(Queue::new("q".repeat(64)).is_ok());
        assert_eq!(
            Queue::new("q".repeat(65)).unwrap_err(),
            InvalidInput::QueueTooLong { len: 65, max: 64 }
        );
        assert_eq!(
            Queue::new("").unwrap_err(),
            InvalidInput::EmptyQueue { max: 64 }
        );
        assert_eq!(
            Queue::new("a\nb").unwrap_err(),
            InvalidInput::ControlCharacter {
                what: "queue",
                at: 1
            }
        );
        assert_eq!(Queue::new("default").unwrap(), Queue::default());
        assert!(refuse_queues([&Queue::default()]).is_ok());
        assert!(refuse_queues([&Queue::new("q").unwrap()]).is_err());
    }
}
