//! Group-committed exactly-once effects: the caller's statements run inside the transaction
//! that ends a batch of leases, each under its lease's fence and in a savepoint of its own.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use lease_core::backend::{check_effects, fenced_verdict};
use lease_core::{BoxError, Effect, Ending, Error, LeaseStore, Result};
use lease_runtime::observe::count_stale;
use sqlx::postgres::PgRow;
use sqlx::PgConnection;

use crate::batch::end_verdicts;
use crate::durable::Waiter;
use crate::error::PgError;
use crate::store::{fence, get, state, PostgresLeaseStore};

/// Effects applied in one transaction at most. Each effect that writes takes a subtransaction
/// id, and a session that holds more than 64 of them at once overflows its cache of them in
/// the server, which makes every snapshot of every session look into `pg_subtrans` until the
/// transaction ends: a larger batch is committed as several transactions of 64.
pub const MAX_EFFECTS_PER_TRANSACTION: usize = 64;

/// The future a [`PgEffect`] returns.
pub type EffectFuture<'c> = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'c>>;

/// Each effect's savepoint, and the undoing of a failed one.
const SAVEPOINT: &str = "SAVEPOINT lease_effect";
const ROLLBACK_TO: &str = "ROLLBACK TO SAVEPOINT lease_effect";

type EffectFn = dyn for<'c> Fn(&'c mut PgConnection) -> EffectFuture<'c> + Send + Sync;

/// A handler's effect on its own tables, run by the Worker **inside the transaction that ends
/// the run's lease** together with the ends of other jobs: the exactly-once pattern of
/// [`fence_in`](PostgresLeaseStore::fence_in) + [`end_in`](PostgresLeaseStore::end_in) at the
/// cost of a savepoint instead of a transaction and a commit per job.
///
/// Hand it over with [`RunContext::set_effect`](lease_runtime::RunContext::set_effect) and return
/// the end (usually [`End::Complete`](lease_core::End::Complete)). When the batch commits:
///
/// - every run of the batch has its row locked and its lease checked by the fenced-write rules
///   first; the effect of a lease that was lost is **never run** (the end gets the verdict);
/// - each effect runs in a savepoint of its own on the batch's connection; one that returns an
///   error is rolled back alone ([`Error::EffectFailed`](lease_core::Error::EffectFailed)) and
///   its attempt counts as failed (retried under the Worker's retry policy), while the other
///   jobs commit;
/// - the effects and the ends commit in one commit: a crash before it leaves nothing, after it
///   the runs are completed and a reclaim finds them so. **The effect is never committed
///   twice.**
///
/// The effect **may run more than once before it commits**: a batch whose commit got no
/// answer is tried again, and the retry runs the effect again in a new transaction (the first
/// one rolled back; had it committed, the retry finds the lease ended and runs nothing). So it
/// is a function (`Fn`), it must do the same each time, and it must not end the transaction
/// itself (no `COMMIT`, `ROLLBACK`, or release of a savepoint it did not make). It runs under
/// the transaction's [bound](PostgresLeaseStore::fenced_transaction) (`statement_timeout`,
/// `lock_timeout`) and the store's call timeout; keep it to a few statements.
///
/// ```no_run
/// # use lease_postgres::{PgEffect, PostgresLeaseStore};
/// # use lease_core::{End, BoxError};
/// # use lease_runtime::RunContext;
/// async fn charge(ctx: RunContext) -> Result<End, BoxError> {
///     let run = ctx.run().to_string();
///     let fence = ctx.fence().get() as i64;
///     ctx.set_effect(PgEffect::new(move |conn| {
///         let run = run.clone();
///         Box::pin(async move {
///             sqlx::query("INSERT INTO payments (run_id, fence) VALUES ($1, $2)")
///                 .bind(run)
///                 .bind(fence)
///                 .execute(&mut *conn)
///                 .await?;
///             Ok(())
///         })
///     }))?;
///     Ok(End::Complete)
/// }
/// # use lease_postgres::sqlx;
/// ```
#[derive(Clone)]
pub struct PgEffect {
    run: Arc<EffectFn>,
}

impl PgEffect {
    /// An effect that runs `f` on the batch transaction's connection (inside its savepoint).
    pub fn new<F>(f: F) -> PgEffect
    where
        F: for<'c> Fn(&'c mut PgConnection) -> EffectFuture<'c> + Send + Sync + 'static,
    {
        PgEffect { run: Arc::new(f) }
    }
}

impl PgEffect {
    /// An effect of one statement with its parameters (`$1`, `$2`, …): the usual case, a row
    /// inserted or updated in your own table.
    ///
    /// ```
    /// # use lease_postgres::PgEffect;
    /// let effect = PgEffect::statement(
    ///     "INSERT INTO payments (run_id, fence, cents) VALUES ($1, $2, $3)",
    ///     ["charge-2041".into(), 7_i64.into(), 1_200_i64.into()],
    /// );
    /// # drop(effect);
    /// ```
    pub fn statement(sql: impl Into<String>, binds: impl IntoIterator<Item = Bind>) -> PgEffect {
        let sql: Arc<str> = sql.into().into();
        let binds: Arc<[Bind]> = binds.into_iter().collect();
        PgEffect::new(move |conn| {
            let (sql, binds) = (sql.clone(), binds.clone());
            Box::pin(async move {
                // Unnamed behind a transaction pooler, where a named statement would not
                // survive the transaction (`pooler.rs`).
                let persistent = !UNNAMED.try_with(|unnamed| *unnamed).unwrap_or(false);
                let mut query = sqlx::query(&sql).persistent(persistent);
                for bind in binds.iter() {
                    query = match bind {
                        Bind::Text(v) => query.bind(v.as_str()),
                        Bind::Int(v) => query.bind(*v),
                        Bind::Float(v) => query.bind(*v),
                        Bind::Bool(v) => query.bind(*v),
                        Bind::Bytes(v) => query.bind(v.as_slice()),
                        Bind::NullText => query.bind(None::<&str>),
                    };
                }
                query.execute(&mut *conn).await?;
                Ok(())
            })
        })
    }
}

tokio::task_local! {
    /// Whether the effects running now must send their statements unnamed (behind a
    /// transaction pooler).
    static UNNAMED: bool;
}

/// A parameter of [`PgEffect::statement`], owned so the effect can run again on a retry.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Bind {
    /// `text` (or any type Postgres casts a text parameter to).
    Text(String),
    /// `bigint`.
    Int(i64),
    /// `double precision`.
    Float(f64),
    /// `boolean`.
    Bool(bool),
    /// `bytea`.
    Bytes(Vec<u8>),
    /// A `NULL` of type `text`.
    NullText,
}

impl From<&str> for Bind {
    fn from(v: &str) -> Bind {
        Bind::Text(v.to_owned())
    }
}

impl From<String> for Bind {
    fn from(v: String) -> Bind {
        Bind::Text(v)
    }
}

impl From<i64> for Bind {
    fn from(v: i64) -> Bind {
        Bind::Int(v)
    }
}

impl From<f64> for Bind {
    fn from(v: f64) -> Bind {
        Bind::Float(v)
    }
}

impl From<bool> for Bind {
    fn from(v: bool) -> Bind {
        Bind::Bool(v)
    }
}

impl From<Vec<u8>> for Bind {
    fn from(v: Vec<u8>) -> Bind {
        Bind::Bytes(v)
    }
}

impl From<PgEffect> for Effect {
    fn from(effect: PgEffect) -> Effect {
        Effect::new(effect)
    }
}

impl fmt::Debug for PgEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PgEffect")
    }
}

impl PostgresLeaseStore {
    /// [`LeaseStore::end_many_with_effects`]: one transaction per
    /// [`MAX_EFFECTS_PER_TRANSACTION`] items.
    pub(crate) async fn end_with_effects(
        &self,
        ends: &[Ending],
        effects: &[Option<Effect>],
    ) -> Result<Vec<Result<()>>> {
        check_effects(self, ends, effects)?;
        if effects.iter().all(Option::is_none) {
            return self.end_many(ends).await;
        }
        let chunks = ends.len().div_ceil(MAX_EFFECTS_PER_TRANSACTION);
        let mut results = Vec::with_capacity(ends.len());
        for (ends, effects) in ends
            .chunks(MAX_EFFECTS_PER_TRANSACTION)
            .zip(effects.chunks(MAX_EFFECTS_PER_TRANSACTION))
        {
            let limit = self.route.call_timeout;
            let answer =
                match tokio::time::timeout(limit, self.effects_transaction(ends, effects)).await {
                    Ok(answer) => answer,
                    // The transaction is dropped with the future: rolled back, unless its commit
                    // was already on its way (then a retry finds its leases ended).
                    Err(_) => Err(self.timed_out(limit).into()),
                };
            match answer {
                Ok(verdicts) => results.extend(verdicts),
                Err(e) if chunks == 1 => return Err(e),
                // The transactions before this one committed: each item keeps its own answer.
                Err(e) => {
                    let again = e.is_retryable();
                    let why = e.to_string();
                    results.extend(ends.iter().map(|_| {
                        Err(if again {
                            Error::unavailable("postgres", why.clone())
                        } else {
                            Error::backend("postgres", why.clone())
                        })
                    }));
                }
            }
        }
        Ok(results)
    }

    /// One transaction: lock and check every lease, run the effects of those that pass in
    /// savepoints, end the leases whose effect went through, commit, confirm.
    async fn effects_transaction(
        &self,
        ends: &[Ending],
        effects: &[Option<Effect>],
    ) -> Result<Vec<Result<()>>> {
        let host = self.route.host_index();
        let switches = self.route.switches();
        let fail = |e: sqlx::Error| -> Error { self.route.fail(e).into() };
        let mut tx = self.route.begin_caller().await.map_err(fail)?;
        let (floor, cap) = self.transaction_bound;
        let runs: Vec<&str> = ends.iter().map(|e| e.lease.run().as_str()).collect();
        let rows: Vec<PgRow> = self
            .route
            .query(&self.sql.lock_many)
            .bind(&runs)
            .bind(floor)
            .bind(cap)
            .fetch_all(&mut *tx)
            .await
            .map_err(fail)?;
        let mut pid = None;
        let mut by_run: HashMap<String, &PgRow> = HashMap::with_capacity(rows.len());
        for row in &rows {
            pid = Some(get::<i32>(row, "pid")?);
            by_run.insert(get::<String>(row, "run_id")?, row);
        }
        // None: still to be ended.
        let mut verdicts: Vec<Option<Result<()>>> = Vec::with_capacity(ends.len());
        for ending in ends {
            let lease = &ending.lease;
            let verdict = match by_run.get(lease.run().as_str()) {
                None => Some(Err(Error::NotFound {
                    run: lease.run().clone(),
                })),
                Some(row) => count_stale(fenced_verdict(
                    lease.run(),
                    lease.fence(),
                    fence(get(row, "fence")?)?,
                    state(get(row, "state")?)?,
                    get::<Option<String>>(row, "lease_owner")?.is_some(),
                ))
                .err()
                .map(Err),
            };
            verdicts.push(verdict);
        }
        for ((ending, effect), verdict) in ends.iter().zip(effects).zip(&mut verdicts) {
            let Some(effect) = effect else { continue };
            if verdict.is_some() {
                continue; // refused: its effect never runs
            }
            let effect = effect
                .downcast::<PgEffect>()
                .ok_or_else(|| PgError::Failed("an effect of another backend".to_owned()))?;
            // One round trip per effect: savepoints are never released (a released one that
            // wrote keeps its subtransaction id all the same), so they nest, and a rollback to
            // the latest of the name undoes exactly this effect.
            self.route
                .query(SAVEPOINT)
                .execute(&mut *tx)
                .await
                .map_err(fail)?;
            let unnamed = self.route.pooled.is_some();
            match UNNAMED.scope(unnamed, (effect.run)(&mut tx)).await {
                Ok(()) => {}
                Err(e) => {
                    // If the connection broke, this fails and so does the whole transaction.
                    self.route
                        .query(ROLLBACK_TO)
                        .execute(&mut *tx)
                        .await
                        .map_err(fail)?;
                    tracing::debug!(run = %ending.lease.run(), error = %e, "effect failed; rolled back to its savepoint");
                    *verdict = Some(Err(Error::EffectFailed {
                        run: ending.lease.run().clone(),
                        reason: e.to_string(),
                    }));
                }
            }
        }
        let live: Vec<Ending> = ends
            .iter()
            .zip(&verdicts)
            .filter(|(_, verdict)| verdict.is_none())
            .map(|(ending, _)| ending.clone())
            .collect();
        let mut applied = Vec::new();
        if !live.is_empty() {
            let rows = self
                .end_query(&live)
                .fetch_all(&mut *tx)
                .await
                .map_err(fail)?;
            if rows.len() != live.len() {
                return Err(PgError::Failed(format!(
                    "end_many returned {} rows for {} ends",
                    rows.len(),
                    live.len()
                ))
                .into());
            }
            applied = end_verdicts(&live, &rows)?;
            if let Some(Err(e)) = applied.iter().find(|r| r.is_err()) {
                // Cannot happen under our locks; never commit an effect without its end.
                return Err(PgError::Failed(format!(
                    "an end checked under its row lock was not applied ({e}); the batch's \
                     transaction is rolled back, effects included"
                ))
                .into());
            }
        }
        let waiter = match pid {
            Some(pid) => Waiter::Session { pid, host },
            None => Waiter::Store,
        };
        self.route
            .bounded_for(waiter, tx.commit())
            .await
            .map_err(Error::from)?;
        // Covers this commit and, for a lease found ended under its own fence (a retry of a
        // batch whose commit got no answer), the earlier one.
        self.route
            .confirm_after(switches)
            .await
            .map_err(Error::from)?;
        let mut applied = applied.into_iter();
        Ok(verdicts
            .into_iter()
            .map(|verdict| verdict.unwrap_or_else(|| applied.next().unwrap_or(Ok(()))))
            .collect())
    }
}
