//! Effects committed with the end of a lease, in the store's batch transaction: exactly-once
//! effects at group-commit speed.

use std::any::{Any, TypeId};
use std::fmt;
use std::sync::Arc;

/// Work a handler hands its `Worker` (`lease-runtime`) to run **inside the transaction that
/// ends its lease**, with the ends of other jobs (group commit), instead of paying for a
/// transaction and a commit of its own (`fence_in` + `end_in`).
///
/// An effect is built by an adapter whose store can apply it (the Postgres adapter's
/// `PgEffect`, a closure over the batch transaction's connection) and handed over with
/// `RunContext::set_effect`. The store runs it under the
/// lease's fence check, each effect in a savepoint of its own: the effect and the end commit
/// together or not at all, an effect that fails is rolled back alone
/// ([`Error::EffectFailed`](crate::Error::EffectFailed)) and its run is retried while its
/// neighbours commit, and an effect whose lease was lost is never run.
///
/// **An effect may run more than once before it commits once.** A batch whose commit went
/// unanswered is tried again, running its effects again in a new transaction (the first one
/// rolled back, or it committed and the retry finds the lease ended and runs nothing). An
/// effect is therefore a function, not a one-shot closure, and must do the same thing each
/// time; it commits at most once per lease.
///
/// Cloning is cheap (a reference count).
#[derive(Clone)]
pub struct Effect {
    inner: Arc<dyn Any + Send + Sync>,
    /// For messages: the adapter's type name.
    name: &'static str,
}

impl Effect {
    /// For adapters: wraps the adapter's own effect type `T`, which its store takes back with
    /// [`downcast`](Effect::downcast).
    pub fn new<T: Any + Send + Sync>(effect: T) -> Effect {
        Effect {
            inner: Arc::new(effect),
            name: std::any::type_name::<T>(),
        }
    }

    /// The adapter's effect, if this is one of `T`.
    pub fn downcast<T: Any>(&self) -> Option<&T> {
        self.inner.downcast_ref::<T>()
    }

    /// Whether this effect is a `T`.
    pub fn is<T: Any>(&self) -> bool {
        self.type_id() == TypeId::of::<T>()
    }

    /// The type id of the adapter's effect.
    pub fn type_id(&self) -> TypeId {
        (*self.inner).type_id()
    }

    /// The adapter's type name, for messages.
    pub fn type_name(&self) -> &'static str {
        self.name
    }
}

impl fmt::Debug for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Effect").field(&self.name).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mine(u32);

    #[test]
    fn an_effect_gives_back_only_its_own_type() {
        let effect = Effect::new(Mine(7));
        assert!(effect.is::<Mine>());
        assert!(!effect.is::<u32>());
        assert_eq!(effect.downcast::<Mine>().map(|m| m.0), Some(7));
        assert!(effect.downcast::<String>().is_none());
        assert!(effect.type_name().ends_with("Mine"));
        assert!(format!("{:?}", effect.clone()).contains("Mine"));
    }
}
