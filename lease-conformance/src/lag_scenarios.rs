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

/// `count_kinds` reports each kind that has runnable runs, by name: how many are runnable
/// (claimable, held or delayed), how many are claimable now, and the kind's own lag, on the
/// store's clock; suspended and ended runs are not counted, and a kind whose runs all ended
/// is gone. A store that cannot count by kind refuses as unsupported, before any I/O.
pub async fn count_kinds_tells_each_kinds_waiting_runs_and_lag(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    if !factory.capabilities().kind_counts {
        let refused = store.count_kinds().await;
        assert!(
            matches!(
                refused,
                Err(lease_core::Error::InvalidInput(
                    lease_core::InvalidInput::Unsupported { .. }
                ))
            ),
            "{refused:?}"
        );
        return;
    }
    assert_eq!(store.count_kinds().await.unwrap(), vec![], "an empty store");
    let kind = |k: &str| lease_core::Kind::new(k).unwrap();
    let new = |id: &str, k: &str| lease_core::NewRun::new(run(id)).with_kind(kind(k));
    let w = worker("w");
    let long = lease_core::Ttl::from_secs(60).unwrap();
    let sent = Instant::now();
    for (id, k) in [
        ("e-1", "email"),
        ("e-2", "email"),
        ("e-3", "email"),
        ("s-1", "sms"),
    ] {
        store.create_with(&new(id, k)).await.unwrap();
    }
    let created = Instant::now();
    store
        .create_with(&new("s-late", "sms").with_delay(Duration::from_secs(3600)))
        .await
        .unwrap();
    store
        .create_with(&new("e-hi", "email").with_priority(5))
        .await
        .unwrap();
    store.create(&run("d-1")).await.unwrap();
    // email: one held, one completed (not counted); sms: one suspended (not counted).
    store.claim(&run("e-1"), &w, long).await.unwrap();
    let done = store.claim(&run("e-2"), &w, long).await.unwrap();
    store.complete(&done).await.unwrap();
    let parked = store.claim(&run("s-1"), &w, long).await.unwrap();
    store.suspend(&parked).await.unwrap();
    sleep(Duration::from_millis(50)).await;
    let asked = Instant::now();
    let counts = store.count_kinds().await.unwrap();
    let answered = Instant::now();
    let figures: Vec<(String, u64, u64, bool)> = counts
        .iter()
        .map(|c| {
            let lagging = c.oldest_claimable_age.is_some();
            (c.kind.to_string(), c.runnable, c.claimable, lagging)
        })
        .collect();
    assert_eq!(
        figures,
        vec![
            ("default".into(), 1, 1, true),
            ("email".into(), 3, 2, true),
            ("sms".into(), 1, 0, false),
        ],
        "{counts:?}"
    );
    // email's longest wait is e-3's, created before the pause, whatever its priority.
    let lag = counts[1].oldest_claimable_age.unwrap();
    let slack = Duration::from_millis(2);
    assert!(
        lag + slack >= asked - created && lag <= answered - sent + slack,
        "email's lag {lag:?} outside {:?}..={:?}",
        asked - created,
        answered - sent
    );
    // A kind with nothing runnable left is not reported.
    store.cancel(&run("s-late"), "not needed").await.unwrap();
    let kinds: Vec<String> = store
        .count_kinds()
        .await
        .unwrap()
        .iter()
        .map(|c| c.kind.to_string())
        .collect();
    assert_eq!(kinds, ["default", "email"]);
}

/// Each lease `claim_next` hands out says how long its run had been claimable
/// ([`Lease::waited`](lease_core::Lease::waited)): a fresh run since its creation, a run whose
/// lease expired since that expiry; a renewal keeps it. Each figure lies between the bounds the
/// test's own clock puts on the store's.
pub async fn claim_next_tells_how_long_each_run_waited(factory: &dyn StoreFactory) {
    let t = crate::timing(factory);
    let store = factory.fresh().await;
    let slack = Duration::from_millis(2);
    let w = worker("w");
    let long = t.at_least(60_000);

    let sent = Instant::now();
    store.create(&run("waits")).await.unwrap();
    let created = Instant::now();
    sleep(t.scale(Duration::from_millis(300))).await;
    let asked = Instant::now();
    let lease = store.claim_next(&w, long, 1).await.unwrap().remove(0);
    let answered = Instant::now();
    let waited = lease
        .waited()
        .expect("claim_next says how long the run waited");
    let (low, high) = (asked - created, answered - sent);
    assert!(
        waited + slack >= low && waited <= high + slack,
        "waited {waited:?} outside {low:?}..={high:?} (since its creation)"
    );
    let renewed = store.renew(&lease).await.unwrap();
    assert_eq!(renewed.waited(), Some(waited), "a renewal keeps it");

    // A lease that expired: the run waits from the expiry, not from its creation.
    let short = t.short_ttl();
    store.create(&run("expires")).await.unwrap();
    let claim_sent = Instant::now();
    store.claim(&run("expires"), &w, short).await.unwrap();
    let claim_answered = Instant::now();
    crate::until_expired(&*store, &run("expires"), t).await;
    let asked = Instant::now();
    let lease = store.claim_next(&w, long, 1).await.unwrap().remove(0);
    let answered = Instant::now();
    assert_eq!(lease.run(), &run("expires"));
    let waited = lease
        .waited()
        .expect("claim_next says how long the run waited");
    let ttl = short.as_duration();
    let low = (asked - claim_answered).saturating_sub(ttl);
    let high = (answered - claim_sent).saturating_sub(ttl);
    assert!(
        waited + slack >= low && waited <= high + slack,
        "waited {waited:?} outside {low:?}..={high:?} (since the expiry)"
    );
}
