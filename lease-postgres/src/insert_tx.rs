//! Typed inserts in the caller's transaction: [`PostgresLeaseStore::insert_tx`] and
//! [`PostgresLeaseStore::insert_many_tx`], the `lease-runtime` job API
//! ([`JobArgs`], [`InsertOpts`], [`Inserted`]) over [`create_with_in`] and
//! [`create_many_with_in`].
//!
//! [`create_with_in`]: PostgresLeaseStore::create_with_in
//! [`create_many_with_in`]: PostgresLeaseStore::create_many_with_in

use lease_core::{InvalidInput, NewRun, Result};
use lease_runtime::{InsertOpts, Inserted, JobArgs};
use sqlx::PgConnection;

use crate::PostgresLeaseStore;

impl PostgresLeaseStore {
    /// Inserts one job of kind `T::KIND` with `args` as its payload **in the caller's
    /// transaction** on `conn` (a `&mut *tx` of a `sqlx::Transaction`, or a connection): the
    /// job exists if and when the caller's transaction commits, with whatever else it wrote.
    /// One statement; an id that exists answers [`Inserted::duplicate`] without failing the
    /// statement, so the transaction goes on.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use serde::{Deserialize, Serialize};
    /// use lease_postgres::{PostgresConfig, PostgresLeaseStore};
    /// use lease_runtime::{InsertOpts, JobArgs};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct SendReceipt {
    ///     order: u64,
    /// }
    /// impl JobArgs for SendReceipt {
    ///     const KIND: &'static str = "send_receipt";
    /// }
    ///
    /// let store = PostgresLeaseStore::connect(PostgresConfig::from_url("postgres://localhost/shop")).await?;
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("UPDATE orders SET paid = true WHERE id = $1").bind(7_i64).execute(&mut *tx).await?;
    /// let job = store.insert_tx(&mut *tx, &SendReceipt { order: 7 }, InsertOpts::new()).await?;
    /// tx.commit().await?;
    /// println!("receipt job {}", job.run_id);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`](lease_core::Error::InvalidInput) before any I/O for arguments or
    /// options [`InsertOpts::new_run`] refuses; otherwise as
    /// [`create_with_in`](PostgresLeaseStore::create_with_in), except that an existing run is
    /// `Ok` with [`Inserted::duplicate`].
    pub async fn insert_tx<T: JobArgs>(
        &self,
        conn: &mut PgConnection,
        args: &T,
        opts: InsertOpts,
    ) -> Result<Inserted> {
        let new = opts.new_run(args)?;
        let created = self.create_with_in(conn, &new).await.map(drop);
        Inserted::from_create(&new, &opts, created)
    }

    /// [`insert_tx`](PostgresLeaseStore::insert_tx) for up to
    /// [`MAX_BATCH`](lease_core::MAX_BATCH) jobs of one kind in one statement, one answer per
    /// job, in order.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](lease_core::Error::InvalidInput) before any I/O when any job is
    /// refused; otherwise as [`create_many_with_in`](PostgresLeaseStore::create_many_with_in),
    /// and the first error of a job other than an existing run.
    pub async fn insert_many_tx<T: JobArgs>(
        &self,
        conn: &mut PgConnection,
        jobs: &[(T, InsertOpts)],
    ) -> Result<Vec<Inserted>> {
        let runs = jobs
            .iter()
            .map(|(args, opts)| opts.new_run(args))
            .collect::<std::result::Result<Vec<NewRun>, InvalidInput>>()?;
        let results = self.create_many_with_in(conn, &runs).await?;
        runs.iter()
            .zip(jobs)
            .zip(results)
            .map(|((new, (_, opts)), created)| Inserted::from_create(new, opts, created))
            .collect()
    }
}
