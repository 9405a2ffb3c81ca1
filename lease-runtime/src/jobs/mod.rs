//! Typed jobs: a job's arguments are a Rust type ([`JobArgs`]) tied to its kind, inserted with
//! one call ([`InsertExt::insert`], options in [`InsertOpts`]) and handed to its handler
//! decoded ([`Kinds::job`](crate::Kinds::job)).
//!
//! The arguments travel as the run's payload, in JSON (`serde_json`), so a run inserted from
//! another language or by the `lease` command is read the same way. Underneath, an insert is a
//! [`create_with`](lease_core::LeaseStore::create_with) (or
//! [`create_many_with`](lease_core::LeaseStore::create_many_with)) of a
//! [`NewRun`](lease_core::NewRun), and a claimed job is a lease with its fence: the typed layer
//! adds no write of its own.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
//! use serde::{Deserialize, Serialize};
//! use lease_runtime::{InsertExt, InsertOpts, JobArgs, MemoryLeaseStore};
//!
//! #[derive(Serialize, Deserialize)]
//! struct SendEmail {
//!     to: String,
//! }
//! impl JobArgs for SendEmail {
//!     const KIND: &'static str = "send_email";
//! }
//!
//! let store = MemoryLeaseStore::new();
//! let first = store.insert(&SendEmail { to: "a@example.com".into() }, InsertOpts::new()).await?;
//! assert!(!first.duplicate);
//! // An insert that names its id is answered the same way when it is sent again.
//! let opts = InsertOpts::new().with_id(first.run_id.clone());
//! let again = store.insert(&SendEmail { to: "a@example.com".into() }, opts).await?;
//! assert!(again.duplicate);
//! assert_eq!(again.run_id, first.run_id);
//! # Ok(()) }
//! ```

pub(crate) mod args;
mod insert;

pub use args::{ArgsError, JobArgs};
pub use insert::{new_run_id, InsertExt, InsertOpts, Inserted};
