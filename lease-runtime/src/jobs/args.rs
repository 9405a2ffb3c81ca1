//! [`JobArgs`]: a job's arguments as a Rust type, and [`ArgsError`]: why a payload is not them.

use lease_core::{InvalidInput, Kind, RunId};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::InsertOpts;
use crate::KindPolicy;

/// The arguments of one kind of job: a serde type whose JSON is the run's payload, with the
/// kind it is inserted under and served by.
///
/// A one-line impl ties the type to its kind; [`insert_opts`](JobArgs::insert_opts) gives the
/// kind's insert defaults, which the options of each insert override field by field.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use lease_runtime::{InsertOpts, JobArgs};
///
/// #[derive(Serialize, Deserialize)]
/// struct ChargeCard {
///     customer: String,
///     amount_cents: u64,
/// }
/// impl JobArgs for ChargeCard {
///     const KIND: &'static str = "charge_card";
///     // Charges are claimed before the kind's other runs unless an insert says otherwise.
///     fn insert_opts() -> InsertOpts {
///         InsertOpts::new().with_priority(9)
///     }
/// }
/// ```
pub trait JobArgs: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The kind its runs are created with and claimed by (a [`Kind`]: 1 to
    /// [`MAX_KIND_BYTES`](lease_core::MAX_KIND_BYTES) bytes, no control characters; a kind
    /// that breaks these rules is an [`InvalidInput`] at the insert and when a worker starts).
    const KIND: &'static str;

    /// This kind's insert defaults (queue, priority, delay or start time); an insert's own options
    /// take precedence over each of them. None by default.
    fn insert_opts() -> InsertOpts {
        InsertOpts::new()
    }

    /// How a worker serving this kind runs it ([`Kinds::job`](crate::Kinds::job)): its own
    /// concurrency limit, retry policy and attempt timeout, each the worker's when unset (the
    /// default: all unset).
    fn policy() -> KindPolicy {
        KindPolicy::new()
    }

    /// [`KIND`](JobArgs::KIND) as a [`Kind`].
    ///
    /// # Errors
    /// [`InvalidInput`] when the constant breaks the kind rules.
    fn kind() -> Result<Kind, InvalidInput> {
        Kind::new(Self::KIND)
    }
}

/// Why a run's payload could not be read as a handler's arguments
/// ([`RunContext::args`](crate::RunContext::args), [`Kinds::job`](crate::Kinds::job)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArgsError {
    /// The run was created without a payload.
    #[error("run {run} has no payload to read arguments from")]
    Missing {
        /// The run.
        run: RunId,
    },
    /// The payload is not JSON of the handler's argument type.
    #[error("run {run}'s payload is not valid arguments: {source}")]
    Invalid {
        /// The run.
        run: RunId,
        /// What JSON decoding said (the line, column and mismatch).
        source: serde_json::Error,
    },
}

/// `payload` of `run` read as `T`.
pub(crate) fn decode<T: DeserializeOwned>(
    run: &RunId,
    payload: Option<&[u8]>,
) -> Result<T, ArgsError> {
    let payload = payload.ok_or_else(|| ArgsError::Missing { run: run.clone() })?;
    serde_json::from_slice(payload).map_err(|source| ArgsError::Invalid {
        run: run.clone(),
        source,
    })
}
