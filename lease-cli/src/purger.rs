//! `lease purge --older-than AGE --every AGE`: retention by the fleet from the command line.
//! The process takes turns with the store's other purgers (other such processes, and workers
//! with retention) under one lease, and purges while it holds it (see [`Purger`]).

use std::time::Duration;

use distribution::{
    connect, Backend, Config, Kind, Purger, WorkerId, DEFAULT_PURGE_BATCH, PURGER_KIND,
};
use lease_cli::{usage, Failure};

/// Purges every `every` while this process holds the purge lease, until SIGINT or SIGTERM;
/// then releases the lease and exits 0.
pub(crate) async fn purge_every(
    config: &Config,
    age: Duration,
    every: Duration,
    id: Option<String>,
) -> Result<(), Failure> {
    if config.backend()? == Backend::Memory {
        return Err(usage(
            "lease purge --every takes turns with the purgers of other hosts through a store \
             they all share; memory: lives inside this one process: name a shared store with \
             --store or LEASE_STORE (postgres://, redis:// or etcd://), or purge once without \
             --every",
        ));
    }
    Purger::check(age, every, DEFAULT_PURGE_BATCH)?;
    let worker = WorkerId::new(id.unwrap_or_else(crate::run::default_worker))?;
    let store = connect(config).await?;
    let purger = Purger::new(store.clone(), store, worker, config.ttl)
        .with_age(age)?
        .with_every(every)?
        .with_lease_kind(Kind::new(PURGER_KIND)?);
    let shutdown = crate::schedule::shutdown_on_signals()?;
    tracing::info!(?age, ?every, "purger started");
    let report = purger.run(shutdown).await?;
    eprintln!(
        "lease: purger stopped: held the purge lease {} times, purged {} runs in {} calls, stood down {} times",
        report.held, report.purged, report.batches, report.stood_down
    );
    Ok(())
}
