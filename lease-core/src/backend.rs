//! For authors of a new [`LeaseStore`](crate::LeaseStore) backend: the input checks and the
//! verdict rules every backend applies the same way. Users of the library need none of this.
//!
//! # Writing a backend
//!
//! 1. Implement [`LeaseStore`](crate::LeaseStore). Its documentation is the contract: every
//!    method says what it must accept, refuse and with which error, all judged atomically on
//!    the **store's** clock. Build records with [`RunRecord::new`](crate::RunRecord::new) and
//!    [`JournalEntry::new`](crate::JournalEntry::new) and leases with
//!    [`Lease::new`](crate::Lease::new).
//! 2. Check input before any I/O with the `check_*` functions here, so every backend refuses
//!    the same input with the same [`InvalidInput`](crate::InvalidInput).
//! 3. When a conditional write matched nothing, explain it with [`fenced_verdict`] (fenced
//!    writes) or [`claim_refusal`] (claims) from the row you read back: the order of the
//!    refusals is part of the contract. Both are pure functions that count nothing: to have
//!    the stale writes you refuse in the `lease_stale_writes_refused_total` series, pass the
//!    verdict through `lease_runtime::observe::count_stale`, as the backends of this workspace
//!    do.
//! 4. Run the `lease-conformance` suite against it: one line,
//!    `lease_conformance::conformance_tests!(your_factory());`, where the factory hands out a
//!    store over a fresh, empty namespace. Passing it is the definition of a correct backend;
//!    `lease_conformance::model_check` adds a model-based property test of random operation
//!    sequences. The repository's `examples/custom_backend.rs` is a worked example.
//!
//! # How the trait evolves
//!
//! Within a major version, [`LeaseStore`](crate::LeaseStore) only grows, and every method
//! added after 0.1 arrives **with a default implementation**, so a backend written against an
//! older release keeps compiling. A default never weakens the contract: it refuses with
//! [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported) (as
//! [`purge`](crate::LeaseStore::purge) and [`count`](crate::LeaseStore::count) do) or builds
//! on methods whose semantics already make it exact (as
//! [`inspect_many`](crate::LeaseStore::inspect_many) loops over `inspect`). The enums a
//! backend matches on ([`End`](crate::End), [`RunState`](crate::RunState),
//! [`Ended`](crate::Ended)) are `#[non_exhaustive]`: give them a wildcard arm that refuses
//! what the backend does not know (an `end_many` item of an unknown [`End`](crate::End) is
//! [`Unsupported`](crate::InvalidInput::Unsupported)), never one that guesses. Removing or
//! changing a method, or a default that would change what an existing backend answers, waits
//! for a major version.

pub use crate::new_run::check_new_runs;
pub use crate::store::{claim_refusal, fenced_verdict};
pub use crate::types::{
    check_claim_max, check_create_batch, check_end_batch, check_list, check_payload, check_purge,
    check_reason, check_renew_batch, check_retry_delay, truncate_reason,
};

/// Validates an [`end_many_with_effects`](crate::LeaseStore::end_many_with_effects) call
/// before any I/O: the end batch as [`check_end_batch`] does, as many effects as ends, and
/// every effect one `store` [takes](crate::LeaseStore::takes_effect).
///
/// # Errors
/// As [`check_end_batch`]; [`InvalidInput::Effects`](crate::InvalidInput::Effects).
pub fn check_effects<S: crate::LeaseStore + ?Sized>(
    store: &S,
    ends: &[crate::Ending],
    effects: &[Option<crate::Effect>],
) -> Result<(), crate::InvalidInput> {
    check_end_batch(ends)?;
    if ends.len() != effects.len() {
        return Err(crate::InvalidInput::Effects {
            why: "as many effects (or None) as ends are needed",
        });
    }
    if effects.iter().flatten().any(|e| !store.takes_effect(e)) {
        return Err(crate::InvalidInput::Effects {
            why: "an effect of a kind this store cannot apply (built for another backend)",
        });
    }
    Ok(())
}
