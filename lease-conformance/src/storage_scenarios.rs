//! Retention that deletes: the churn each backend's own test measures its storage after (the
//! rows, keys or hash fields left under the namespace), since only the backend can count them.

use std::time::Duration;

use lease_core::{End, Ending, IdempotencyKey, LeaseStore, NewRun, RunId, Ttl, WorkerId};

/// What [`churn_and_purge`] left: an id it purged, and the highest fence that id carried.
#[derive(Clone, Debug)]
pub struct Churned {
    /// A purged id, claimed twice in its life (released once, then completed).
    pub run: RunId,
    /// Its last fence before the purge.
    pub fence: u64,
}

/// Creates `n` runs (each with a payload and a kind of its own every third run), claims them in
/// batches, appends a journal entry (one under an idempotency key) to each, completes them
/// (one is released and claimed again first, one cancelled instead, one failed), and purges
/// them all. Returns the twice-claimed id and its last fence.
///
/// # Panics
/// If any store call fails, or the purge does not remove exactly the `n` runs.
pub async fn churn_and_purge(store: &dyn LeaseStore, n: usize) -> Churned {
    let worker = WorkerId::new("churn").unwrap();
    let ttl = Ttl::from_millis(60_000).unwrap();
    let kinds = [
        lease_core::Kind::default(),
        lease_core::Kind::new("mail").unwrap(),
    ];
    let news: Vec<NewRun> = (0..n)
        .map(|i| {
            NewRun::new(RunId::new(format!("churn-{i:05}")).unwrap())
                .with_payload(format!("payload of run {i}").into_bytes())
                .with_kind(kinds[usize::from(i % 3 == 0)].clone())
        })
        .collect();
    for chunk in news.chunks(100) {
        for created in store.create_many_with(chunk).await.unwrap() {
            created.unwrap();
        }
    }
    let twice = RunId::new("churn-00001").unwrap();
    let first = store.claim(&twice, &worker, ttl).await.unwrap();
    store.release(&first).await.unwrap();
    let cancelled = RunId::new("churn-00002").unwrap();
    store.cancel(&cancelled, "not needed").await.unwrap();
    let step = IdempotencyKey::new("step-1").unwrap();
    let mut fence = 0;
    for kind in &kinds {
        loop {
            let leases = store
                .claim_next_kind(kind, &worker, ttl, 100)
                .await
                .unwrap();
            if leases.is_empty() {
                break;
            }
            let mut ends = Vec::new();
            for lease in leases {
                store.append(&lease, b"progress").await.unwrap();
                store
                    .append_keyed(&lease, &step, b"keyed progress")
                    .await
                    .unwrap();
                if lease.run() == &twice {
                    fence = lease.fence().get();
                }
                let end = if lease.run().as_str() == "churn-00003" {
                    End::Fail("card declined".to_owned())
                } else {
                    End::Complete
                };
                ends.push(Ending::new(lease, end));
            }
            for ended in store.end_many(&ends).await.unwrap() {
                ended.unwrap();
            }
        }
    }
    assert!(fence >= 2, "{twice} was claimed twice");
    let mut purged = 0;
    loop {
        let gone = store.purge(Duration::ZERO, 1000).await.unwrap();
        if gone.is_empty() {
            break;
        }
        purged += gone.len();
    }
    assert_eq!(purged, n, "every run ended, so every run is purged");
    Churned { run: twice, fence }
}

/// After [`churn_and_purge`]: the purged id created again is claimed above its last fence, and
/// its old lease is refused.
///
/// # Panics
/// If it is not.
pub async fn a_churned_id_comes_back_above_its_fence(store: &dyn LeaseStore, churned: &Churned) {
    let again = store.create(&churned.run).await.unwrap();
    assert!(
        again.fence.get() >= churned.fence,
        "created again at {}, below its last fence {}",
        again.fence,
        churned.fence
    );
    let lease = store
        .claim(
            &churned.run,
            &WorkerId::new("after").unwrap(),
            Ttl::from_millis(60_000).unwrap(),
        )
        .await
        .unwrap();
    assert!(
        lease.fence().get() > churned.fence,
        "claimed at {} after the purge of fence {}",
        lease.fence(),
        churned.fence
    );
    store.complete(&lease).await.unwrap();
}

/// The retention benchmark (not a conformance scenario: run by the backends' ignored
/// `purge_load` tests): `total` runs created with a payload, claimed, completed and purged
/// `batch` at a time, as a steady fleet with retention does. After every `every` runs
/// `measure` reports the backend's storage as a line (rows and bytes, keys and memory); the
/// lines are returned with the runs done so far and the seconds since the start.
///
/// # Panics
/// If a store call fails or a batch is not purged whole.
pub async fn churn_in_batches<F, Fut>(
    store: &dyn LeaseStore,
    total: usize,
    batch: usize,
    every: usize,
    mut measure: F,
) -> Vec<String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let worker = WorkerId::new("churn").unwrap();
    let ttl = Ttl::from_millis(60_000).unwrap();
    let started = std::time::Instant::now();
    let mut lines = vec![format!("0 runs, 0 s: {}", measure().await)];
    let mut done = 0;
    while done < total {
        let news: Vec<NewRun> = (done..(done + batch).min(total))
            .map(|i| {
                NewRun::new(RunId::new(format!("flat-{i:08}")).unwrap())
                    .with_payload(format!("{{\"order\": {i}, \"amount\": 1999}}").into_bytes())
            })
            .collect();
        for created in store.create_many_with(&news).await.unwrap() {
            created.unwrap();
        }
        let mut claimed = 0;
        while claimed < news.len() {
            let leases = store
                .claim_next(&worker, ttl, news.len() - claimed)
                .await
                .unwrap();
            assert!(!leases.is_empty(), "the batch's runs are claimable");
            claimed += leases.len();
            let ends: Vec<Ending> = leases
                .into_iter()
                .map(|lease| Ending::new(lease, End::Complete))
                .collect();
            for ended in store.end_many(&ends).await.unwrap() {
                ended.unwrap();
            }
        }
        let mut purged = 0;
        while purged < news.len() {
            let gone = store.purge(Duration::ZERO, news.len()).await.unwrap();
            assert!(!gone.is_empty(), "the batch's runs are purgeable");
            purged += gone.len();
        }
        let before = done;
        done += news.len();
        if done / every != before / every || done == total {
            lines.push(format!(
                "{done} runs, {:.0} s: {}",
                started.elapsed().as_secs_f64(),
                measure().await
            ));
        }
    }
    lines
}
