//! The limit row: the Worker's claim and end batches sent by hand. `loops` tasks each claim a
//! batch with the adapter's own `claim_next` statement or script and complete it, every effect
//! journaled, with its own `end_many`, through the same drivers and no library code, until the
//! backlog is drained. No handler, no heartbeat, no batcher: the physical limit of the same
//! statements on the same machine, which the Worker rows are read against.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use distribution::{LeaseStore, RunId};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::sweep::drop_namespace;
use super::worker::{checked_store, create_backlog, effect, job_names};
use super::{BenchError, Target};

/// Lease TTL of the raw claims (as the Worker rows').
const TTL_MS: u64 = 30_000;

/// `loops` raw loops drain `jobs` runs, claiming `claim` at a time; the row, validated as the
/// Worker rows are (each run completed with its one effect, under its final fence).
pub(super) async fn drain(
    target: &Target,
    loops: usize,
    claim: usize,
    jobs: usize,
) -> Result<Value, BenchError> {
    let ns = target.namespace("limit");
    let lib: Arc<dyn LeaseStore> = target.lib(&ns).await?;
    let names = job_names(jobs)?;
    create_backlog(&lib, &names).await?;
    let raw = Arc::new(target.raw.namespace(&ns));
    let done = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(loops);
    for l in 0..loops {
        let (raw, done, calls) = (raw.clone(), done.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            let worker = format!("limit-{l}");
            while done.load(Ordering::Relaxed) < jobs as u64 {
                let claimed = raw.claim_next(&worker, TTL_MS, claim).await?;
                calls.fetch_add(1, Ordering::Relaxed);
                if claimed.is_empty() {
                    // The rest is claimed by other loops; wait for them to finish it.
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    continue;
                }
                let ends: Vec<(String, u64, Vec<u8>)> = claimed
                    .into_iter()
                    .map(|(run, fence)| {
                        let payload = effect(&RunId::new(&run)?, fence);
                        Ok::<_, BenchError>((run, fence, payload))
                    })
                    .collect::<Result<_, _>>()?;
                raw.complete_many(&ends).await?;
                done.fetch_add(ends.len() as u64, Ordering::Relaxed);
            }
            Ok::<(), BenchError>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| BenchError::setup(e.to_string()))??;
    }
    let secs = t0.elapsed().as_secs_f64();
    checked_store(target, &ns, &lib, &names).await?;
    drop_namespace(target, &ns).await?;
    Ok(json!({
        "loops": loops,
        "claim": claim,
        "jobs": jobs,
        "secs": secs,
        "jobs_per_s": jobs as f64 / secs,
        "claim_next_calls": calls.load(Ordering::Relaxed),
        "validated": format!(
            "{jobs} runs completed in the store, each with one journal entry under its final fence"
        ),
    }))
}
