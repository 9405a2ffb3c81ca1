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
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let reports = store.capabilities().queue_lag;
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

/// `count` tells how long the lease held longest has been held, on the store's clock: since
/// the claim of the held run claimed earliest, renewed or not; a lease that expired is not
/// held, nor is one given back. Each figure lies between that run's `held_for` read just
/// before and just after the count (a store that cannot tell reports `None` throughout).
pub async fn count_tells_the_longest_held_lease(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let (w, long) = (worker("w"), t.at_least(60_000));
    let slack = Duration::from_millis(2);
    assert_eq!(
        store.count().await.unwrap().longest_held,
        None,
        "an empty store"
    );
    for id in ["first", "second", "brief"] {
        store.create(&run(id)).await.unwrap();
    }
    let first = store.claim(&run("first"), &w, long).await.unwrap();
    sleep(t.scale(Duration::from_millis(300))).await;
    let second = store.claim(&run("second"), &w, long).await.unwrap();
    // Claimed after "first", but it expires: not held.
    store.claim(&run("brief"), &w, t.short_ttl()).await.unwrap();
    crate::until_expired(&*store, &run("brief"), t).await;
    // Renewed: held since its claim all the same.
    let first = store.renew(&first).await.unwrap();
    let held_for = |id: &'static str| {
        let store = store.clone();
        async move { store.inspect(&run(id)).await.unwrap().held_for() }
    };
    let within = |longest: Option<Duration>, before: Option<Duration>, after: Option<Duration>| {
        if !store.capabilities().queue_lag {
            assert_eq!(longest, None, "a store that cannot tell says so");
            return;
        }
        let (longest, before, after) = (
            longest.expect("a lease is held"),
            before.expect("held"),
            after.expect("held"),
        );
        assert!(
            longest + slack >= before && longest <= after + slack,
            "longest held {longest:?} outside {before:?}..={after:?}"
        );
    };
    let before = held_for("first").await;
    let counts = store.count().await.unwrap();
    let after = held_for("first").await;
    within(counts.longest_held, before, after);

    // Given back: the other lease is the longest held now.
    store.release(&first).await.unwrap();
    let before = held_for("second").await;
    let counts = store.count().await.unwrap();
    let after = held_for("second").await;
    within(counts.longest_held, before, after);
    store.complete(&second).await.unwrap();
    assert_eq!(
        store.count().await.unwrap().longest_held,
        None,
        "nothing held"
    );
}

/// The record tells since when a runnable run has been claimable, on the store's clock
/// (`claimable_since`, `waiting_for`): since its creation, since its release, since the end
/// of its retry delay (and nothing while the delay runs), since its resume or force-release;
/// a held or suspended run is not waiting, and one whose lease expired waits since the
/// expiry. `list` says what `inspect` says. A store that cannot tell the queue's lag reports
/// no instant for any run.
pub async fn records_tell_since_when_a_run_has_been_claimable(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let (r, w, long) = (run("waiting"), worker("w"), t.at_least(60_000));
    let created = store.create(&r).await.unwrap();
    let record = store.inspect(&r).await.unwrap();
    if !store.capabilities().queue_lag {
        assert_eq!(
            (created.claimable_since, record.claimable_since),
            (None, None),
            "a store that cannot tell says so: {record:?}"
        );
        return;
    }
    assert_eq!(created.claimable_since, created.created_at, "{created:?}");
    assert_eq!(record.claimable_since, record.created_at, "{record:?}");
    let since = record
        .claimable_since
        .expect("claimable since its creation");
    assert_eq!(
        record.waiting_for(),
        Some(record.observed_at.saturating_since(since)),
        "{record:?}"
    );

    // Held: not waiting.
    let lease = store.claim(&r, &w, long).await.unwrap();
    let held = store.inspect(&r).await.unwrap();
    assert_eq!(
        (held.claimable_since, held.waiting_for()),
        (None, None),
        "{held:?}"
    );
    // Released: waiting since the release.
    store.release(&lease).await.unwrap();
    let released = store.inspect(&r).await.unwrap();
    let since = released
        .claimable_since
        .expect("claimable since its release");
    assert!(
        since >= held.observed_at && since <= released.observed_at,
        "released at {since:?}, outside {:?}..={:?}",
        held.observed_at,
        released.observed_at
    );
    let listed = store.list(&lease_core::ListFilter::new()).await.unwrap();
    let listed = listed.iter().find(|x| x.run == r).expect("listed");
    assert_eq!(listed.claimable_since, Some(since), "{listed:?}");

    // A retry delay: nothing while it runs, its end once it is over.
    let lease = store.claim(&r, &w, long).await.unwrap();
    store
        .retry_after(&lease, t.scale(Duration::from_millis(300)))
        .await
        .unwrap();
    let delayed = store.inspect(&r).await.unwrap();
    let until = delayed.not_before.expect("delayed");
    assert_eq!(
        (delayed.claimable_since, delayed.waiting_for()),
        (None, None),
        "{delayed:?}"
    );
    let give_up = Instant::now() + t.scale(Duration::from_secs(10));
    let due = loop {
        let record = store.inspect(&r).await.unwrap();
        if record.not_before.is_none() {
            break record;
        }
        assert!(
            Instant::now() < give_up,
            "the delay never ended: {record:?}"
        );
        sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(due.claimable_since, Some(until), "{due:?}");

    // Suspended: not waiting; resumed: waiting since the resume.
    let lease = store.claim(&r, &w, long).await.unwrap();
    store.suspend(&lease).await.unwrap();
    let parked = store.inspect(&r).await.unwrap();
    assert_eq!(
        (parked.claimable_since, parked.waiting_for()),
        (None, None),
        "{parked:?}"
    );
    let resumed = store.resume(&r).await.unwrap();
    let since = resumed.claimable_since.expect("claimable since its resume");
    assert!(
        since >= parked.observed_at && since <= resumed.observed_at,
        "{resumed:?}"
    );
    assert_eq!(
        store.inspect(&r).await.unwrap().claimable_since,
        Some(since)
    );

    // An expired lease: waiting since its expiry, which the record already carries.
    store.claim(&r, &w, t.short_ttl()).await.unwrap();
    crate::until_expired(&*store, &r, t).await;
    let expired = store.inspect(&r).await.unwrap();
    let expiry = expired.expires_at.expect("the expired lease's expiry");
    assert_eq!(
        (expired.claimable_since, expired.waiting_for()),
        (None, Some(expired.observed_at.saturating_since(expiry))),
        "{expired:?}"
    );
    // Force-released: waiting since the force-release.
    let freed = store.force_release(&r).await.unwrap();
    let since = freed
        .claimable_since
        .expect("claimable since the force-release");
    assert!(
        since >= expired.observed_at && since <= freed.observed_at,
        "{freed:?}"
    );
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
    let longest = counts.longest_held.expect("1,000 leases are held");
    format!(
        "{RUNS} runs created in {created:.1?}; count over 998,000 claimable, 1,000 held and \
         1,000 completed: median {:.1?}, worst {:.1?} of 5 calls; lag {lag:.1?}; longest held \
         {longest:.1?}",
        times[2], times[4]
    )
}

/// `count_kinds` reports each kind that has runnable runs, by name: how many are runnable
/// (claimable, held or delayed), how many are claimable now, and the kind's own lag, on the
/// store's clock; suspended and ended runs are not counted, and a kind whose runs all ended
/// is gone. A store that cannot count by kind refuses as unsupported, before any I/O.
pub async fn count_kinds_tells_each_kinds_waiting_runs_and_lag(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    if !store.capabilities().kind_counts {
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
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
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
