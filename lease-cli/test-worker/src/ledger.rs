//! The reference worker's external side-effect ledger, written under the fence.
//!
//! On Postgres it is a caller-owned table written in a fenced transaction; on Redis a list in
//! the run's hash slot written by a fenced script; on the memory store, the run's journal.
//! It has no uniqueness constraint, so a double execution would show as two entries.

use distribution::postgres::PostgresLeaseStore;
use distribution::redis::{FencedScript, RedisLeaseStore};
use distribution::{Config, Error, Lease, Result, RunId, Store};
use serde::{Deserialize, Serialize};

/// One recorded side effect.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) effect: String,
    pub(crate) fence: u64,
    pub(crate) worker: String,
}

pub(crate) struct Ledger {
    store: Store,
    redis_record: FencedScript,
    /// A plain connection for reading the Redis ledger (reads need no fence).
    redis_reader: Option<redis::aio::MultiplexedConnection>,
}

fn sql(template: &str, schema: &str) -> String {
    // Schema names are validated by the adapter; quote them as identifiers all the same.
    template.replace("{schema}", &format!("\"{}\"", schema.replace('"', "\"\"")))
}

fn pg_error(e: sqlx::Error) -> Error {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            Error::unavailable("postgres", e)
        }
        other => Error::backend("postgres", other),
    }
}

fn redis_key(store: &RedisLeaseStore, run: &RunId) -> String {
    store.script_key(run, "worker-ledger")
}

impl Ledger {
    pub(crate) async fn new(store: Store, url: &str) -> Result<Ledger> {
        let mut redis_reader = None;
        match &store {
            Store::Postgres(pg) => {
                let mut tx = pg.pool().begin().await.map_err(pg_error)?;
                sqlx::query(include_str!("../sql/ledger_lock.sql"))
                    .bind(pg.schema())
                    .execute(&mut *tx)
                    .await
                    .map_err(pg_error)?;
                sqlx::query(&sql(include_str!("../sql/ledger_create.sql"), pg.schema()))
                    .execute(&mut *tx)
                    .await
                    .map_err(pg_error)?;
                tx.commit().await.map_err(pg_error)?;
            }
            Store::Redis(_) => {
                // The store connected with this URL a moment ago; errors here are reported
                // without the driver's text, which may name the connection.
                let client = redis::Client::open(url)
                    .map_err(|_| Error::backend("redis", "cannot open a ledger reader"))?;
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| {
                        Error::unavailable("redis", format!("ledger reader: {:?}", e.kind()))
                    })?;
                redis_reader = Some(conn);
            }
            _ => {}
        }
        Ok(Ledger {
            store,
            redis_record: FencedScript::new(include_str!("../lua/ledger_record.lua")),
            redis_reader,
        })
    }

    /// Records `effect` under `lease`'s fence, atomically with the fence check.
    pub(crate) async fn record(&self, lease: &Lease, effect: &str) -> Result<()> {
        match &self.store {
            Store::Postgres(pg) => record_postgres(pg, lease, effect).await,
            Store::Redis(redis) => {
                let key = redis_key(redis, lease.run());
                let _len: i64 = redis
                    .fenced_script(
                        lease,
                        &self.redis_record,
                        &[key],
                        &[
                            effect.to_string(),
                            lease.fence().to_string(),
                            lease.owner().to_string(),
                        ],
                    )
                    .await?;
                Ok(())
            }
            other => {
                let entry = Entry {
                    effect: effect.to_string(),
                    fence: lease.fence().get(),
                    worker: lease.owner().to_string(),
                };
                let payload = serde_json::to_vec(&entry).expect("entries serialize");
                other.as_dyn().append(lease, &payload).await.map(drop)
            }
        }
    }

    /// Every entry recorded for `run`, in order.
    pub(crate) async fn entries(&self, run: &RunId) -> Result<Vec<Entry>> {
        match &self.store {
            Store::Postgres(pg) => {
                let rows: Vec<(String, i64, String)> =
                    sqlx::query_as(&sql(include_str!("../sql/ledger_select.sql"), pg.schema()))
                        .bind(run.as_str())
                        .fetch_all(pg.pool())
                        .await
                        .map_err(pg_error)?;
                Ok(rows
                    .into_iter()
                    .map(|(effect, fence, worker)| Entry {
                        effect,
                        fence: fence as u64,
                        worker,
                    })
                    .collect())
            }
            Store::Redis(redis) => {
                let mut conn = self
                    .redis_reader
                    .clone()
                    .expect("a redis ledger has a reader");
                let raw: Vec<String> = redis::cmd("LRANGE")
                    .arg(redis_key(redis, run))
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| {
                        Error::unavailable("redis", format!("ledger read: {:?}", e.kind()))
                    })?;
                raw.iter()
                    .map(|s| serde_json::from_str(s).map_err(|e| Error::backend("redis", e)))
                    .collect()
            }
            other => {
                let journal = other.as_dyn().journal(run).await?;
                Ok(journal
                    .iter()
                    .filter_map(|e| serde_json::from_slice(&e.payload).ok())
                    .collect())
            }
        }
    }
}

impl Ledger {
    /// Records `effect` in a Postgres fenced transaction that stays open for `hold` after the
    /// effect is written (as a step that does more work inside it would); `opened` is told the
    /// transaction's bound once the row is locked and the effect written.
    ///
    /// # Errors
    /// As [`Ledger::record`]; a backend error on a store other than Postgres.
    pub(crate) async fn record_held(
        &self,
        lease: &Lease,
        effect: &str,
        hold: std::time::Duration,
        opened: impl FnOnce(std::time::Duration),
    ) -> Result<()> {
        let Store::Postgres(pg) = &self.store else {
            return Err(Error::backend(
                "worker",
                "tx-step holds a Postgres fenced transaction; this store has none",
            ));
        };
        let mut tx = pg.fenced_transaction(lease).await?;
        insert_postgres(pg, &mut tx, lease, effect).await?;
        opened(tx.bound());
        tokio::time::sleep(hold).await;
        tx.commit().await
    }
}

async fn insert_postgres(
    pg: &PostgresLeaseStore,
    tx: &mut distribution::postgres::FencedTransaction,
    lease: &Lease,
    effect: &str,
) -> Result<()> {
    sqlx::query(&sql(include_str!("../sql/ledger_insert.sql"), pg.schema()))
        .bind(lease.run().as_str())
        .bind(effect)
        .bind(lease.fence().get() as i64)
        .bind(lease.owner().as_str())
        .execute(&mut **tx)
        .await
        .map_err(pg_error)?;
    Ok(())
}

async fn record_postgres(pg: &PostgresLeaseStore, lease: &Lease, effect: &str) -> Result<()> {
    let mut tx = pg.fenced_transaction(lease).await?;
    sqlx::query(&sql(include_str!("../sql/ledger_insert.sql"), pg.schema()))
        .bind(lease.run().as_str())
        .bind(effect)
        .bind(lease.fence().get() as i64)
        .bind(lease.owner().as_str())
        .execute(&mut *tx)
        .await
        .map_err(pg_error)?;
    tx.commit().await
}

/// `lease-test-worker ledger RUN [--json]`: prints the ledger's entries for `run`.
pub(crate) async fn show(
    config: &Config,
    run: &RunId,
    json: bool,
) -> Result<(), lease_cli::Failure> {
    let connected = distribution::connect_store(config).await?;
    let ledger = Ledger::new(connected, &config.store).await?;
    let entries = ledger.entries(run).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&entries).expect("entries serialize")
        );
    } else {
        for e in &entries {
            println!("fence {}  {}  {}", e.fence, e.worker, e.effect);
        }
        println!("({} entries)", entries.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use distribution::{connect_store, Config};
    use lease_conformance::fixtures::{unavailable, PostgresServer};

    /// Sixteen workers starting at once on a fresh schema all get their ledger: the table is
    /// created under an advisory lock, not by racing `CREATE TABLE IF NOT EXISTS`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn workers_starting_at_once_all_create_the_ledger() {
        let server = match PostgresServer::start() {
            Ok(server) => server,
            Err(why) => {
                return unavailable::<()>("postgres", why, "install postgresql").unwrap_or(());
            }
        };
        for round in 0..5 {
            let config = Config::default()
                .with_store(server.url())
                .with_namespace(format!("ledger_race_{round}"));
            let store = connect_store(&config).await.expect("connect");
            let mut starts = tokio::task::JoinSet::new();
            for _ in 0..16 {
                let (store, url) = (store.clone(), config.store.clone());
                starts.spawn(async move { Ledger::new(store, &url).await.map(drop) });
            }
            while let Some(started) = starts.join_next().await {
                started
                    .expect("task")
                    .unwrap_or_else(|e| panic!("round {round}: a worker's ledger failed: {e}"));
            }
        }
    }
}
