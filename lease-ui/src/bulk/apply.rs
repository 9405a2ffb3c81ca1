//! A bulk action carried out: each run done or refused with the store's reason, grouped, so
//! that every run of the set is accounted for.

use std::collections::BTreeMap;

use lease_core::{Error, LeaseStore, RunId, RunRecord, RunState};

use super::Bulk;

/// What an action did: the runs done, and the others by the store's reason.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    pub(super) done: Vec<RunId>,
    pub(super) refused: BTreeMap<String, Vec<RunId>>,
}

/// A store's refusal without the run's id, so that refusals group: `run x is completed` reads
/// `the run is completed`. A failure to reach a verdict says its outcome is unknown.
fn refusal(e: &Error, run: &RunId) -> String {
    if let Error::NotFound { .. } = e {
        return "not found: purged, or never created".to_owned();
    }
    let text = e.to_string().replace(&format!("run {run}"), "the run");
    if e.is_verdict() {
        text
    } else {
        format!("{text} (the outcome is unknown: it may have been applied)")
    }
}

/// Does `action` to `runs`, one by one (a purge in one call). A failure to reach the store
/// stops it: the runs not tried are refused as such.
pub(super) async fn apply(
    store: &dyn LeaseStore,
    action: Bulk,
    runs: &[RunRecord],
    reason: &str,
) -> Outcome {
    let mut out = Outcome::default();
    if action == Bulk::Purge {
        purge(store, runs, &mut out).await;
        return out;
    }
    let mut stopped: Option<String> = None;
    for record in runs {
        let run = &record.run;
        if let Some(why) = &stopped {
            out.refused
                .entry(why.clone())
                .or_default()
                .push(run.clone());
            continue;
        }
        let result = match action {
            Bulk::Retry => store.resume(run).await,
            _ => store.cancel(run, reason).await,
        };
        match result {
            // Cancelling a cancelled run answers its record unchanged: it was not this one.
            Ok(r) if action == Bulk::Cancel && r.failure.as_deref() != Some(reason) => out
                .refused
                .entry("the run was cancelled already, with another reason: left as it was".into())
                .or_default()
                .push(run.clone()),
            Ok(_) => out.done.push(run.clone()),
            Err(e) => {
                if !e.is_verdict() {
                    stopped = Some(format!(
                        "not tried: the store failed on an earlier run ({e})"
                    ));
                }
                out.refused
                    .entry(refusal(&e, run))
                    .or_default()
                    .push(run.clone());
            }
        }
    }
    out
}

/// Purges `runs` in one call; a run the store kept is read again to say why.
async fn purge(store: &dyn LeaseStore, runs: &[RunRecord], out: &mut Outcome) {
    let ids: Vec<RunId> = runs.iter().map(|r| r.run.clone()).collect();
    if ids.is_empty() {
        return;
    }
    let removed = match store.purge_ids(&ids).await {
        Ok(removed) => removed,
        Err(e) => {
            let why = format!("not purged: {}", refusal(&e, &ids[0]));
            out.refused.insert(why, ids);
            return;
        }
    };
    let kept: Vec<RunId> = ids
        .iter()
        .filter(|id| !removed.contains(id))
        .cloned()
        .collect();
    out.done = ids.into_iter().filter(|id| removed.contains(id)).collect();
    if kept.is_empty() {
        return;
    }
    let why_each: Vec<String> = match store.inspect_many(&kept).await {
        Ok(records) => records
            .iter()
            .map(|r| match r {
                Ok(r) if !matches!(r.state, RunState::Runnable | RunState::Suspended) => {
                    format!(
                        "not purged: the store kept it ({} when read again)",
                        r.state.as_str()
                    )
                }
                Ok(r) => format!("not purged: the run is {} now", r.state.as_str()),
                Err(Error::NotFound { .. }) => {
                    "not purged by this call: gone already (purged by another)".to_owned()
                }
                Err(e) => format!("not purged: {e}"),
            })
            .collect(),
        Err(e) => vec![format!("not purged (the store did not say why: {e})"); kept.len()],
    };
    for (id, why) in kept.into_iter().zip(why_each) {
        out.refused.entry(why).or_default().push(id);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use lease_core::{LeaseStoreExt, ListFilter, Ttl, WorkerId};
    use lease_runtime::{Fault, FaultyStore, MemoryLeaseStore};

    fn ids(names: &[&str]) -> Vec<RunId> {
        names.iter().map(|n| RunId::new(n).unwrap()).collect()
    }

    async fn created(store: &dyn LeaseStore, names: &[&str]) -> Vec<RunRecord> {
        for run in ids(names) {
            store.create(&run).await.unwrap();
        }
        store.list(&ListFilter::new()).await.unwrap()
    }

    async fn claim(store: &dyn LeaseStore, run: &str) -> lease_core::Lease {
        let w = WorkerId::new("w").unwrap();
        let ttl = Ttl::from_secs(60).unwrap();
        store
            .claim(&RunId::new(run).unwrap(), &w, ttl)
            .await
            .unwrap()
    }

    fn refused(out: &Outcome) -> Vec<(&str, Vec<&str>)> {
        out.refused
            .iter()
            .map(|(why, runs)| (why.as_str(), runs.iter().map(RunId::as_str).collect()))
            .collect()
    }

    #[tokio::test]
    async fn runs_changed_since_the_read_are_refused_with_the_stores_reason_grouped() {
        let store = MemoryLeaseStore::new();
        let read = created(&store, &["a", "b", "c", "d", "e"]).await;
        // Between the read and the action: b completes, c is purged, d and e are cancelled.
        let lease = claim(&store, "b").await;
        store.complete(&lease).await.unwrap();
        let [_, _, c, d, e] = &ids(&["a", "b", "c", "d", "e"])[..] else {
            unreachable!()
        };
        store.cancel(c, "x").await.unwrap();
        store.purge_ids(std::slice::from_ref(c)).await.unwrap();
        store.cancel(d, "earlier").await.unwrap();
        store.cancel(e, "earlier").await.unwrap();
        let out = apply(&store, Bulk::Cancel, &read, "now").await;
        assert_eq!(out.done, ids(&["a"]));
        assert_eq!(
            refused(&out),
            [
                ("not found: purged, or never created", vec!["c"]),
                ("the run is completed", vec!["b"]),
                (
                    "the run was cancelled already, with another reason: left as it was",
                    vec!["d", "e"]
                ),
            ]
        );
    }

    #[tokio::test]
    async fn a_purge_counts_what_the_store_removed_and_says_why_it_kept_the_rest() {
        let store = MemoryLeaseStore::new();
        created(&store, &["x", "y", "z"]).await;
        for run in ["x", "y", "z"] {
            let lease = claim(&store, run).await;
            store.fail(&lease, "boom").await.unwrap();
        }
        let read = store.list(&ListFilter::new()).await.unwrap();
        let [_, y, z] = &ids(&["x", "y", "z"])[..] else {
            unreachable!()
        };
        store.resume(y).await.unwrap();
        store.purge_ids(std::slice::from_ref(z)).await.unwrap();
        let out = apply(&store, Bulk::Purge, &read, "").await;
        assert_eq!(out.done, ids(&["x"]));
        assert_eq!(
            refused(&out),
            [
                (
                    "not purged by this call: gone already (purged by another)",
                    vec!["z"]
                ),
                ("not purged: the run is runnable now", vec!["y"]),
            ]
        );
        assert!(store.inspect(y).await.is_ok(), "the runnable run is kept");
    }

    #[tokio::test]
    async fn a_store_that_fails_stops_the_action_and_every_run_is_still_accounted_for() {
        let memory: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
        let read = created(&*memory, &["a", "b", "c"]).await;
        let store = FaultyStore::new(memory.clone());
        store.set(Fault::Fail);
        let out = apply(&store, Bulk::Retry, &read, "").await;
        assert!(out.done.is_empty());
        let groups = refused(&out);
        assert_eq!(groups.len(), 2, "{groups:?}");
        let unknown = groups
            .iter()
            .find(|(why, _)| why.contains("outcome is unknown"));
        assert_eq!(
            unknown.map(|(_, runs)| runs.clone()),
            Some(vec!["a"]),
            "{groups:?}"
        );
        let untried = groups.iter().find(|(why, _)| why.starts_with("not tried"));
        assert_eq!(
            untried.map(|(_, runs)| runs.clone()),
            Some(vec!["b", "c"]),
            "{groups:?}"
        );
    }
}
