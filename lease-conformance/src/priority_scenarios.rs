//! A run's priority ([`NewRun::with_priority`]): within a kind the claimable runs of the highest
//! priority are claimed first, the longest waiting first within a priority; the priority is
//! fixed and carried by every lease and record.
//!
//! A backend without an index per priority refuses a priority above 0 with
//! [`InvalidInput::Unsupported`] and creates nothing: the scenario checks that refusal and
//! stops there.

use std::time::Duration;

use lease_core::{Error, InvalidInput, Kind, LeaseStore, ListFilter, NewRun, MAX_PRIORITY};

use crate::scenarios::{long, run, worker};
use crate::StoreFactory;

fn at(id: &str, priority: u8) -> NewRun {
    NewRun::new(run(id)).with_priority(priority)
}

/// The ids of one `claim_next` of `max`, in the order handed out; each lease's priority is
/// the one its id ends with.
async fn next(store: &dyn LeaseStore, max: usize) -> Vec<String> {
    let leases = store.claim_next(&worker("w"), long(), max).await.unwrap();
    for lease in &leases {
        let id = lease.run().as_str();
        let digit = id.as_bytes()[id.len() - 1] - b'0';
        assert_eq!(lease.priority(), digit, "{lease:?}");
    }
    leases.iter().map(|l| l.run().as_str().to_owned()).collect()
}

/// The highest priority first, then the longest waiting, alone, in a batch and across batches;
/// a run of a high priority that is delayed or held holds no lower one back; a released run
/// goes back to its priority; another kind's runs of a higher priority are never taken by this
/// kind's claim; leases (claims and renewals), `inspect`, `inspect_many` and `list` say the
/// priority. A priority above [`MAX_PRIORITY`] is refused before any I/O, alone and in a batch.
pub async fn higher_priorities_are_claimed_first_and_the_oldest_first_within_one(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let too_high = at("too-high", MAX_PRIORITY + 1);
    assert!(matches!(
        store.create_with(&too_high).await,
        Err(Error::InvalidInput(InvalidInput::PriorityTooHigh { priority, max }))
            if priority == MAX_PRIORITY + 1 && max == MAX_PRIORITY
    ));
    assert!(matches!(
        store.create_many_with(&[at("fine-0", 0), too_high]).await,
        Err(Error::InvalidInput(InvalidInput::PriorityTooHigh { .. }))
    ));
    assert!(matches!(
        store.inspect(&run("fine-0")).await,
        Err(Error::NotFound { .. })
    ));

    match store.create_with(&at("first-1", 1)).await {
        Ok(record) => assert_eq!(record.priority, 1, "the create's record"),
        Err(Error::InvalidInput(InvalidInput::Unsupported { .. })) => {
            assert!(matches!(
                store.inspect(&run("first-1")).await,
                Err(Error::NotFound { .. })
            ));
            eprintln!("this backend has no priorities yet: refused, nothing created");
            return;
        }
        Err(e) => panic!("create with a priority: {e}"),
    }
    for new in [
        at("a-0", 0),
        at("b-5", 5),
        at("c-0", 0),
        at("d-9", 9),
        at("e-5", 5),
        at("late-9", 9).with_delay(Duration::from_secs(3600)),
        at("other-9", 9).with_kind(Kind::new("other").unwrap()),
    ] {
        store.create_with(&new).await.unwrap();
    }
    let batch = [at("h-5", 5), at("i-0", 0), at("j-9", 9)];
    let created = store.create_many_with(&batch).await.unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");

    // One batch across priorities: 9s, then the 5s, oldest first within each.
    assert_eq!(next(&*store, 4).await, ["d-9", "j-9", "b-5", "e-5"]);
    // Released, d-9 goes back to the head: its priority is higher than what is left.
    let d = store.claim(&run("d-9"), &worker("w"), long()).await;
    assert!(matches!(d, Err(Error::Held { .. })), "{d:?}");
    let held = store
        .list(&ListFilter::new().with_state(lease_core::RunState::Runnable))
        .await
        .unwrap();
    let d9 = held.iter().find(|r| r.run.as_str() == "d-9").unwrap();
    assert_eq!(d9.priority, 9);
    let lease = store.force_release(&run("d-9")).await.unwrap();
    assert_eq!(lease.priority, 9);
    let again = store.claim_next(&worker("w"), long(), 1).await.unwrap();
    assert_eq!(again[0].run().as_str(), "d-9");
    assert_eq!(again[0].priority(), 9);
    let renewed = store.renew(&again[0]).await.unwrap();
    assert_eq!(renewed.priority(), 9, "a renewal keeps the priority");
    // Released under a lease that names another priority (changed by hand): back at its own.
    store.release(&renewed.with_priority(0)).await.unwrap();
    assert_eq!(next(&*store, 1).await, ["d-9"]);
    // The rest, one at a time: no run of priority 9 of this kind is claimable (late-9 is
    // delayed, other-9 is of another kind).
    let mut rest = Vec::new();
    loop {
        let one = next(&*store, 1).await;
        if one.is_empty() {
            break;
        }
        rest.extend(one);
    }
    assert_eq!(rest, ["h-5", "first-1", "a-0", "c-0", "i-0"]);

    let other = store
        .claim_next_kind(&Kind::new("other").unwrap(), &worker("w"), long(), 10)
        .await
        .unwrap();
    assert_eq!(other.len(), 1);
    assert_eq!(
        (other[0].run().as_str(), other[0].priority()),
        ("other-9", 9)
    );

    let late = store.inspect(&run("late-9")).await.unwrap();
    assert_eq!((late.fence.get(), late.priority), (0, 9));
    let records = store
        .inspect_many(&[run("a-0"), run("b-5"), run("j-9")])
        .await
        .unwrap();
    let priorities: Vec<u8> = records
        .iter()
        .map(|r| r.as_ref().unwrap().priority)
        .collect();
    assert_eq!(priorities, [0, 5, 9]);
    // The priority is fixed: created again, the id is refused and keeps it.
    assert!(matches!(
        store.create_with(&at("b-5", 0)).await,
        Err(Error::AlreadyExists { .. })
    ));
    assert_eq!(store.inspect(&run("b-5")).await.unwrap().priority, 5);
}
