//! A signal delivered in the caller's transaction: [`PostgresLeaseStore::signal_tx`].

use lease_core::signal::{check_signal_payload, signal_verdict, Delivery, Waiting};
use lease_core::{Error, Result, SignalToken, Signalled};
use sqlx::PgConnection;

use crate::store::{fence_param, record, PostgresLeaseStore, ATTEMPTS};

impl PostgresLeaseStore {
    /// `sql/signal.sql` for the wait of `fence` for `name` on `run`, bound: what
    /// `deliver_signal` and `signal_tx` send.
    pub(crate) fn signal_query<'q>(
        &'q self,
        run: &'q lease_core::RunId,
        name: &'q lease_core::SignalName,
        fence: lease_core::Fence,
        payload: &'q [u8],
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        self.route
            .query(&self.sql.signal)
            .bind(run.as_str())
            .bind(name.as_str())
            .bind(fence_param(fence))
            .bind(payload)
    }
}

impl PostgresLeaseStore {
    /// [`signal`](lease_core::SignalExt::signal) **in the caller's transaction** on `conn` (a
    /// `&mut *tx` of a `sqlx::Transaction` on the store's database): the signal is delivered
    /// if and when the caller's transaction commits, with whatever else it wrote (the approval
    /// row and the resumed run together, or neither). The same rules as `signal`: the token is
    /// checked against the store's [`SignalKey`](lease_core::SignalKey) first, and delivered
    /// only to the wait it names; a duplicate of the delivery that answered the wait is
    /// `Ok` with [`Signalled::duplicate`]. The wait's deadline is judged on the database clock
    /// at the transaction's start (`now()`). The run's row stays locked until the caller
    /// commits or rolls back: no claim of the run commits in between. Its workers are woken
    /// when the transaction commits.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use lease_core::SignalToken;
    /// use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore};
    ///
    /// let store = PostgresLeaseStore::connect(PostgresConfig::from_url("postgres://localhost/shop")).await?;
    /// let token: SignalToken = "lst1.…".parse()?; // from the approval link
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("INSERT INTO approvals (order_id, by) VALUES ($1, $2)")
    ///     .bind(7_i64)
    ///     .bind("ana")
    ///     .execute(&mut *tx)
    ///     .await?;
    /// store.signal_tx(&mut *tx, &token, b"approved by ana").await?;
    /// tx.commit().await?; // the approval and the run's resumption, together
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`signal`](lease_core::SignalExt::signal): [`InvalidInput`](lease_core::InvalidInput)
    /// for the token or the payload before any I/O; [`Error::StaleSignal`];
    /// [`Error::NotFound`]; [`Error::Unavailable`] when the statement outlives the store's call
    /// timeout (drop the connection then).
    pub async fn signal_tx(
        &self,
        conn: &mut PgConnection,
        token: &SignalToken,
        payload: &[u8],
    ) -> Result<Signalled> {
        token.verify(self.signal_key.as_ref())?;
        check_signal_payload(payload)?;
        let run = token.run();
        for _ in 0..ATTEMPTS {
            let query = self.signal_query(run, token.name(), token.fence(), payload);
            let fail = |e| Error::from(self.route.fail(e));
            if self
                .in_time(async { query.fetch_optional(&mut *conn).await.map_err(fail) })
                .await?
                .is_some()
            {
                return Ok(Signalled::new(run.clone(), false));
            }
            let inspect = self.route.query(&self.sql.inspect).bind(run.as_str());
            let row = self
                .in_time(async { inspect.fetch_optional(&mut *conn).await.map_err(fail) })
                .await?
                .ok_or_else(|| Error::NotFound { run: run.clone() })?;
            let current = record(&row)?;
            match signal_verdict(
                run,
                Waiting::of(&current),
                token.name(),
                token.fence(),
                payload,
                current.observed_at,
            )? {
                Delivery::Duplicate => return Ok(Signalled::new(run.clone(), true)),
                // The run came to wait in it since the statement looked: again.
                _ => continue,
            }
        }
        Err(PostgresLeaseStore::raced(run))
    }
}
