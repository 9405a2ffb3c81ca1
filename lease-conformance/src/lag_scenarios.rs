//! The queue's lag as `count` reports it: on the store's clock, from when each run became
//! claimable.

use std::time::Duration;

use lease_core::{LeaseStore, LeaseStoreExt};
use tokio::time::{sleep, Instant};

use crate::scenarios::{run, worker};
use crate::StoreFactory;

async fn lag(store: &dyn LeaseStore) -> Option<Duration> {
    store.count().await.expect("count").oldest_claimable_age
}

/// `count` reports no lag with nothing claimable; a waiting run's lag grows from its creation;
/// a held run is not waiting; a run whose lease expired waits from the expiry, not from its
/// creation. Each figure lies between the bounds the test's own clock puts on the store's (a
/// store that cannot tell reports `None` throughout).
pub async fn count_tells_the_queue_lag_on_the_store_clock(factory: &dyn StoreFactory) {
    let t = crate::timing(factory);
    let reports = factory.capabilities().queue_lag;
    let store = factory.fresh().await;
    let slack = Duration::from_millis(2);
    assert_eq!(lag(&*store).await, None, "an empty store");

    let sent = Instant::now();
    store.create(&run("waiting")).await.unwrap();
    let created = Instant::now();
    sleep(t.scale(Duration::from_millis(300))).await;
    let asked = Instant::now();
    let age = lag(&*store).await;
    let answered = Instant::now();
    if !reports {
        assert_eq!(age, None, "a store that cannot tell says so");
        return;
    }
    let age = age.expect("a waiting run");
    assert!(
        age + slack >= asked - created && age <= answered - sent + slack,
        "lag {age:?} outside {:?}..={:?}",
        asked - created,
        answered - sent
    );

    // Held for a minute: nothing waits.
    let w = worker("w");
    let held = store
        .claim(&run("waiting"), &w, t.at_least(60_000))
        .await
        .unwrap();
    assert_eq!(lag(&*store).await, None, "the only run is held");

    // A lease that expires: the run waits from its expiry on.
    let short = t.short_ttl();
    store.create(&run("expiring")).await.unwrap();
    let claim_sent = Instant::now();
    store.claim(&run("expiring"), &w, short).await.unwrap();
    let claim_answered = Instant::now();
    crate::until_expired(&*store, &run("expiring"), t).await;
    let asked = Instant::now();
    let age = lag(&*store).await.expect("an expired lease is claimable");
    let answered = Instant::now();
    let ttl = short.as_duration();
    let low = (asked - claim_answered).saturating_sub(ttl);
    let high = (answered - claim_sent).saturating_sub(ttl);
    assert!(
        age + slack >= low && age <= high + slack,
        "lag {age:?} outside {low:?}..={high:?} (since the expiry, not the creation)"
    );
    store.complete(&held).await.unwrap();
}

/// A benchmark, not a scenario: `count` (with the queue's lag) over 1,000,000 claimable runs,
/// 1,000 held and 1,000 completed. Returns a line with the figures and the median and worst
/// of five calls' times.
pub async fn count_at_scale(store: std::sync::Arc<dyn LeaseStore>) -> String {
    const RUNS: usize = 1_000_000;
    let ids: Vec<lease_core::RunId> = (0..RUNS)
        .map(|i| lease_core::RunId::new(format!("r-{i:07}")).unwrap())
        .collect();
    let t0 = Instant::now();
    let mut chunks = ids.chunks(lease_core::MAX_BATCH);
    loop {
        let calls: Vec<_> = chunks
            .by_ref()
            .take(4)
            .map(|chunk| {
                let (store, chunk) = (store.clone(), chunk.to_vec());
                tokio::spawn(async move { store.create_many(&chunk).await.unwrap() })
            })
            .collect();
        if calls.is_empty() {
            break;
        }
        for call in calls {
            for result in call.await.unwrap() {
                result.unwrap();
            }
        }
    }
    let created = t0.elapsed();
    let w = worker("scale");
    let held = store
        .claim_next(&w, lease_core::Ttl::from_secs(600).unwrap(), 1_000)
        .await
        .unwrap();
    assert_eq!(held.len(), 1_000);
    let done = store
        .claim_next(&w, lease_core::Ttl::from_secs(600).unwrap(), 1_000)
        .await
        .unwrap();
    for result in store.complete_many(&done).await.unwrap() {
        result.unwrap();
    }
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..5 {
        let sent = Instant::now();
        last = Some(store.count().await.unwrap());
        times.push(sent.elapsed());
    }
    times.sort();
    let counts = last.unwrap();
    assert_eq!(
        (counts.claimable, counts.held, counts.completed),
        (RUNS as u64 - 2_000, 1_000, 1_000),
        "{counts:?}"
    );
    let lag = counts.oldest_claimable_age.expect("runs wait");
    format!(
        "{RUNS} runs created in {created:.1?}; count over 998,000 claimable, 1,000 held and \
         1,000 completed: median {:.1?}, worst {:.1?} of 5 calls; lag {lag:.1?}",
        times[2], times[4]
    )
}
