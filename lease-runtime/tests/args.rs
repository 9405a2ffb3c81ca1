//! Typed run arguments (the `serde` feature): a handler reads its run's payload as JSON with
//! `ctx.args::<T>()?`; a payload that is not `T`, or none, fails the attempt with a typed
//! error naming the run, never a panic, and the run ends failed at its last attempt with that
//! error as its reason.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_core::{End, LeaseStore, NewRun, RunId, RunState, Ttl, WorkerId};
use lease_runtime::{
    ArgsError, CancellationToken, MemoryLeaseStore, RetryPolicy, RunContext, Worker, WorkerConfig,
};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Charge {
    customer: String,
    amount_cents: u64,
}

fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_reads_its_arguments_and_a_bad_payload_fails_the_attempt_with_a_typed_error() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let runs = [
        NewRun::new(id("good")).with_payload(br#"{"customer":"c-1","amount_cents":1200}"#.to_vec()),
        NewRun::new(id("wrong-type"))
            .with_payload(br#"{"customer":"c-2","amount_cents":"12"}"#.to_vec()),
        NewRun::new(id("not-json")).with_payload(b"\xff\x00".to_vec()),
        NewRun::new(id("none")),
    ];
    store.create_many_with(&runs).await.unwrap();
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_poll_interval(Duration::from_millis(10))
        .with_retry(
            RetryPolicy::default()
                .with_max_attempts(2)
                .with_backoff(Duration::from_millis(1), Duration::from_millis(5)),
        );
    let worker = Worker::new(store.clone(), WorkerId::new("w").unwrap(), config).unwrap();
    let stop = CancellationToken::new();
    let handler = |ctx: RunContext| async move {
        let charge: Charge = ctx.args()?;
        let effect = format!("{} {}", charge.customer, charge.amount_cents);
        Ok(End::CompleteWith(effect.into_bytes()))
    };
    let token = stop.clone();
    let handle = tokio::spawn(async move { worker.run(handler, token).await });
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let mut ended = 0;
        for run in &runs {
            let state = store.inspect(run.run()).await.unwrap().state;
            ended += usize::from(matches!(state, RunState::Completed | RunState::Failed));
        }
        if ended == runs.len() {
            break;
        }
        assert!(Instant::now() < give_up, "{ended} of 4 runs ended in 20 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    let report = handle.await.unwrap().unwrap();
    assert_eq!(report.completed, 1);
    assert_eq!(report.gave_up, 3, "{report:?}");
    assert_eq!(
        store.journal(&id("good")).await.unwrap()[0].payload,
        b"c-1 1200"
    );
    for (run, says) in [
        (
            "wrong-type",
            "run wrong-type's payload is not valid arguments: invalid type",
        ),
        (
            "not-json",
            "run not-json's payload is not valid arguments: expected value",
        ),
        ("none", "run none has no payload to read arguments from"),
    ] {
        let record = store.inspect(&id(run)).await.unwrap();
        assert_eq!(record.state, RunState::Failed, "{run}");
        assert_eq!(record.attempts, 2, "{run}: both attempts used");
        let reason = record.failure.unwrap_or_default();
        assert!(reason.contains(says), "{run}: failed with {reason:?}");
    }
}

#[test]
fn args_errors_are_typed_and_name_the_run() {
    let missing = ArgsError::Missing { run: id("r") };
    assert_eq!(
        missing.to_string(),
        "run r has no payload to read arguments from"
    );
    let source = serde_json::from_slice::<Charge>(b"{}").unwrap_err();
    let invalid = ArgsError::Invalid {
        run: id("r"),
        source,
    };
    assert!(std::error::Error::source(&invalid).is_some());
    assert!(invalid
        .to_string()
        .starts_with("run r's payload is not valid arguments: missing field"));
}
