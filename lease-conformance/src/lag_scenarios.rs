//! The queue's lag as `count` reports it: on the store's clock, from when each run became
//! claimable.

use std::time::Duration;

use lease_core::LeaseStore;
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
    sleep(t.past_short()).await;
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
