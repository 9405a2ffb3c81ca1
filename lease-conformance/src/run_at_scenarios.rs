//! A run created for a wall-clock time ([`NewRun::with_run_at`]): not claimable before it on
//! the store's clock, claimable at once when it is past, the later of it and a delay holding.
//!
//! A backend without a server clock to compare with (etcd) takes the time as a delay on the
//! creating host's clock, timed in its delay steps (rounded up to its TTL granularity). One that
//! refuses it does so with [`InvalidInput::Unsupported`] and creates nothing: the scenario
//! checks that refusal and stops there.

use std::time::{Duration, SystemTime};

use lease_core::{Error, InvalidInput, NewRun, RunState, MAX_START_DELAY};
use tokio::time::Instant;

use crate::scenarios::{long, run, worker};
use crate::StoreFactory;

fn at(id: &str, when: SystemTime) -> NewRun {
    NewRun::new(run(id)).with_run_at(when)
}

/// `run_at` ahead is not claimable before it (`claim` answers `Delayed` with the time left,
/// `claim_next` passes it by, the record's `not_before` says when), and is claimed once the
/// store's clock reaches it, never before; a time already past is claimable at once; with a
/// delay too, the later of the two holds; alone or in a batch. A time further ahead than
/// [`MAX_START_DELAY`] is refused before any I/O.
pub async fn a_run_created_for_a_wall_time_waits_for_it_on_the_store_clock(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let now = SystemTime::now();
    let too_far = at("too-far", now + MAX_START_DELAY + Duration::from_secs(3600));
    assert!(matches!(
        store.create_with(&too_far).await,
        Err(Error::InvalidInput(InvalidInput::RunAtTooFar { max, .. })) if max == MAX_START_DELAY
    ));
    assert!(matches!(
        store
            .create_many_with(&[NewRun::new(run("fine")), too_far])
            .await,
        Err(Error::InvalidInput(InvalidInput::RunAtTooFar { .. }))
    ));
    for id in ["too-far", "fine"] {
        assert!(
            matches!(store.inspect(&run(id)).await, Err(Error::NotFound { .. })),
            "{id} was created by a refused call"
        );
    }

    let wait = Duration::from_millis(1500);
    let sent = Instant::now();
    let when = SystemTime::now() + wait;
    let takes_run_at = store.capabilities().run_at;
    let record = match store.create_with(&at("at-time", when)).await {
        Ok(record) => {
            assert!(takes_run_at, "{store} takes run_at but says it does not");
            record
        }
        Err(Error::InvalidInput(InvalidInput::Unsupported { .. })) => {
            assert!(!takes_run_at, "{store} says it takes run_at and refuses it");
            assert!(matches!(
                store.inspect(&run("at-time")).await,
                Err(Error::NotFound { .. })
            ));
            eprintln!("this backend takes no run_at: refused, nothing created");
            return;
        }
        Err(e) => panic!("create with run_at: {e}"),
    };
    assert_eq!((record.state, record.attempts), (RunState::Runnable, 0));
    // A store timing delays in steps rounds the wait up, by less than a step.
    let rounded = wait + store.capabilities().ttl_granularity;
    let read = store.inspect(&run("at-time")).await.unwrap();
    let left = read
        .not_before
        .expect("a run waiting for its time says when it is claimable")
        .saturating_since(read.observed_at);
    assert!(
        !left.is_zero() && left <= rounded,
        "claimable in {left:?} for a time {wait:?} ahead"
    );

    let past = SystemTime::now() - Duration::from_secs(3600);
    let created = store
        .create_many_with(&[
            at("in-batch", when),
            at("past", past),
            at("past-delayed", past).with_delay(wait),
            at("past-at-epoch", SystemTime::UNIX_EPOCH),
        ])
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");

    match store.claim(&run("at-time"), &worker("a"), long()).await {
        Err(Error::Delayed { run: r, remaining }) => {
            assert_eq!(r, run("at-time"));
            assert!(
                !remaining.is_zero() && remaining <= rounded,
                "{remaining:?}"
            );
        }
        other => panic!("a claim before run_at answered {other:?}"),
    }
    let handed: Vec<String> = store
        .claim_next(&worker("a"), long(), 10)
        .await
        .unwrap()
        .iter()
        .map(|l| l.run().to_string())
        .collect();
    assert_eq!(
        handed,
        ["past", "past-at-epoch"],
        "only the runs whose time is past (and no delay holds), in input order"
    );

    // Each is claimed once its time (or, for the delayed one, its delay) has passed on the
    // store's clock, and not before.
    let mut waiting = vec!["at-time", "in-batch", "past-delayed"];
    let deadline = sent + wait + Duration::from_secs(10);
    while !waiting.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{waiting:?} not claimable 10 s after their time"
        );
        let mut still = Vec::new();
        for id in waiting {
            match store.claim(&run(id), &worker("b"), long()).await {
                Ok(lease) => {
                    assert!(
                        sent.elapsed() + Duration::from_millis(50) >= wait,
                        "{id} claimed {:?} after the create, before its {wait:?}",
                        sent.elapsed()
                    );
                    assert_eq!(lease.fence().get(), 1);
                }
                Err(Error::Delayed { .. }) => still.push(id),
                Err(e) => panic!("{id}: {e}"),
            }
        }
        waiting = still;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
