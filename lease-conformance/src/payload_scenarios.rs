//! A run's data: the payload it is created with, byte-exact from the create to every claim's
//! lease, inspect and the Worker's handler, immutable, bounded, and gone with the run.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{
    End, Error, InvalidInput, LeaseStore, NewRun, RunId, RunState, Ttl, MAX_RUN_PAYLOAD_BYTES,
};
use lease_runtime::{RunContext, Worker, WorkerConfig};
use tokio::time::Instant;

use crate::scenarios::{long, run, worker};
use crate::StoreFactory;

/// Payloads that are easy to get wrong: empty (apart from none), binary with NUL and 0xff, one
/// that starts with a byte a store might use as a marker, text, and one at the bound.
fn samples() -> Vec<(&'static str, Option<Vec<u8>>)> {
    let at_bound: Vec<u8> = (0..MAX_RUN_PAYLOAD_BYTES)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    vec![
        ("none", None),
        ("empty", Some(Vec::new())),
        ("binary", Some(vec![0, 0xff, b'=', 0, b':', 0x80, b'\n'])),
        ("marker", Some(b"=x".to_vec())),
        (
            "text",
            Some(r#"{"amount":1200,"currency":"EUR"}"#.as_bytes().to_vec()),
        ),
        ("bound", Some(at_bound)),
    ]
}

fn new_run(id: &str, payload: &Option<Vec<u8>>) -> NewRun {
    let new = NewRun::new(run(id));
    match payload {
        Some(bytes) => new.with_payload(bytes.clone()),
        None => new,
    }
}

/// Asserts `got` is `want` byte for byte, saying which run differs and how (sizes, not bytes).
#[track_caller]
fn assert_payload(what: &str, got: Option<&[u8]>, want: Option<&[u8]>) {
    assert!(
        got == want,
        "{what}: payload of {:?} bytes, expected {:?} bytes (or different bytes)",
        got.map(<[u8]>::len),
        want.map(<[u8]>::len)
    );
}

/// A payload goes in with the create and comes back byte-exact: from the create's record,
/// `inspect` and `inspect_many`, every claim's lease (`claim`, `claim_next`) and the renewal's
/// lease — for no payload, an empty one (kept apart from none), binary bytes, text and one of
/// exactly [`MAX_RUN_PAYLOAD_BYTES`], alone (`create_with`) and in a batch
/// (`create_many_with`). One byte over the bound is refused before any I/O with
/// `RunPayloadTooLarge`, alone or as one item of a batch, and nothing is created.
pub async fn a_payload_round_trips_byte_exact_from_create_to_every_claim(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let over = NewRun::new(run("over")).with_payload(vec![1u8; MAX_RUN_PAYLOAD_BYTES + 1]);
    let refused = store.create_with(&over).await;
    assert!(
        matches!(
            refused,
            Err(Error::InvalidInput(InvalidInput::RunPayloadTooLarge { len, max }))
                if len == MAX_RUN_PAYLOAD_BYTES + 1 && max == MAX_RUN_PAYLOAD_BYTES
        ),
        "a payload over the bound: {refused:?}"
    );
    let batch = [NewRun::new(run("fine")), over];
    assert!(matches!(
        store.create_many_with(&batch).await,
        Err(Error::InvalidInput(InvalidInput::RunPayloadTooLarge { .. }))
    ));
    for id in ["over", "fine"] {
        assert!(
            matches!(store.inspect(&run(id)).await, Err(Error::NotFound { .. })),
            "{id} was created by a refused call"
        );
    }

    let samples = samples();
    // One of each alone, one of each in a batch.
    let mut want: BTreeMap<RunId, Option<Vec<u8>>> = BTreeMap::new();
    for (name, payload) in &samples {
        let id = format!("one-{name}");
        let record = store.create_with(&new_run(&id, payload)).await.unwrap();
        assert_payload(&id, record.payload.as_deref(), payload.as_deref());
        want.insert(run(&id), payload.clone());
    }
    let batch: Vec<NewRun> = samples
        .iter()
        .map(|(name, payload)| new_run(&format!("many-{name}"), payload))
        .collect();
    let created = store.create_many_with(&batch).await.unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    for (name, payload) in &samples {
        want.insert(run(&format!("many-{name}")), payload.clone());
    }

    for (id, payload) in &want {
        let record = store.inspect(id).await.unwrap();
        assert_payload(id.as_str(), record.payload.as_deref(), payload.as_deref());
    }
    let ids: Vec<RunId> = want.keys().cloned().collect();
    for (id, record) in ids.iter().zip(store.inspect_many(&ids).await.unwrap()) {
        let record = record.unwrap();
        assert_payload(id.as_str(), record.payload.as_deref(), want[id].as_deref());
    }

    // claim: the "one-" runs; claim_next: the rest, in one call.
    for (name, payload) in &samples {
        let id = run(&format!("one-{name}"));
        let lease = store.claim(&id, &worker("a"), long()).await.unwrap();
        assert_payload(id.as_str(), lease.payload(), payload.as_deref());
        let renewed = store.renew(&lease).await.unwrap();
        assert_payload(id.as_str(), renewed.payload(), payload.as_deref());
    }
    let claimed = store.claim_next(&worker("b"), long(), 100).await.unwrap();
    assert_eq!(claimed.len(), samples.len(), "claim_next took every run");
    for lease in &claimed {
        assert_payload(
            lease.run().as_str(),
            lease.payload(),
            want[lease.run()].as_deref(),
        );
    }
    let renewed = store.renew_many(&claimed).await.unwrap();
    for lease in renewed {
        let lease = lease.unwrap();
        assert_payload(
            lease.run().as_str(),
            lease.payload(),
            want[lease.run()].as_deref(),
        );
    }
}

/// A payload never changes: a create of an existing id with another payload is refused as
/// `AlreadyExists` and the first payload stays, through claims, ends and a resume. A purge
/// removes it with the run; the id created again carries the new create's payload (or none),
/// never the old one.
pub async fn a_payload_is_immutable_and_goes_with_its_run(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let id = run("charge-7");
    store
        .create_with(&NewRun::new(id.clone()).with_payload(b"first".to_vec()))
        .await
        .unwrap();
    let again = store
        .create_with(&NewRun::new(id.clone()).with_payload(b"second".to_vec()))
        .await;
    assert!(
        matches!(again, Err(Error::AlreadyExists { .. })),
        "{again:?}"
    );
    let in_batch = store
        .create_many_with(&[NewRun::new(id.clone()).with_payload(b"third".to_vec())])
        .await
        .unwrap();
    assert!(matches!(in_batch[0], Err(Error::AlreadyExists { .. })));
    let lease = store.claim(&id, &worker("a"), long()).await.unwrap();
    assert_payload("after a second create", lease.payload(), Some(b"first"));
    store.suspend(&lease).await.unwrap();
    store.resume(&id).await.unwrap();
    let lease = store.claim(&id, &worker("a"), long()).await.unwrap();
    assert_payload("after a resume", lease.payload(), Some(b"first"));
    store.complete(&lease).await.unwrap();
    assert_payload(
        "a completed run",
        store.inspect(&id).await.unwrap().payload.as_deref(),
        Some(b"first"),
    );

    let purged = store.purge(Duration::ZERO, 10).await.unwrap();
    assert_eq!(purged, vec![id.clone()]);
    let record = store
        .create_with(&NewRun::new(id.clone()).with_payload(b"new life".to_vec()))
        .await
        .unwrap();
    assert_payload(
        "created again",
        record.payload.as_deref(),
        Some(b"new life"),
    );
    let lease = store.claim(&id, &worker("b"), long()).await.unwrap();
    assert_eq!(
        lease.fence().get(),
        3,
        "the new life continues above fence 2"
    );
    assert_payload("claimed again", lease.payload(), Some(b"new life"));
    store.complete(&lease).await.unwrap();
    assert_eq!(
        store.purge(Duration::ZERO, 10).await.unwrap(),
        vec![id.clone()]
    );
    store.create(&id).await.unwrap();
    assert_payload(
        "created again without one",
        store.inspect(&id).await.unwrap().payload.as_deref(),
        None,
    );
    let lease = store.claim(&id, &worker("c"), long()).await.unwrap();
    assert_payload("claimed without one", lease.payload(), None);
}

/// A Worker hands each handler its run's payload ([`RunContext::payload`]) byte-exact,
/// including an empty one and none, for runs created alone and in a batch.
pub async fn a_worker_hands_each_handler_its_runs_payload(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let mut want: BTreeMap<RunId, Option<Vec<u8>>> = BTreeMap::new();
    let batch: Vec<NewRun> = samples()
        .into_iter()
        .map(|(name, payload)| {
            want.insert(run(name), payload.clone());
            new_run(name, &payload)
        })
        .collect();
    store.create_many_with(&batch).await.unwrap();
    let seen: Arc<Mutex<BTreeMap<RunId, Option<Vec<u8>>>>> = Arc::default();
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_poll_interval(Duration::from_millis(20));
    let w = Worker::new(store.clone(), worker("payloads"), config).unwrap();
    let shutdown = lease_runtime::CancellationToken::new();
    let (s, stop) = (seen.clone(), shutdown.clone());
    let handler = move |ctx: RunContext| {
        let seen = s.clone();
        async move {
            seen.lock()
                .unwrap()
                .insert(ctx.run().clone(), ctx.payload().map(<[u8]>::to_vec));
            Ok(End::Complete)
        }
    };
    let handle = tokio::spawn(async move { w.run(handler, stop).await });
    let give_up = Instant::now() + Duration::from_secs(30);
    while !all_completed(&*store, &want).await {
        assert!(
            Instant::now() < give_up,
            "the runs did not complete in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    handle.await.unwrap().unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), want.len(), "one handler per run");
    for (id, payload) in &want {
        assert_payload(id.as_str(), seen[id].as_deref(), payload.as_deref());
    }
}

async fn all_completed(store: &dyn LeaseStore, runs: &BTreeMap<RunId, Option<Vec<u8>>>) -> bool {
    for id in runs.keys() {
        if store.inspect(id).await.unwrap().state != RunState::Completed {
            return false;
        }
    }
    true
}
