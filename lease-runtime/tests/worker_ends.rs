//! The `Worker`'s batches of ends on the memory store: never a batch the store must refuse,
//! an invalid batch never mistaken for lost leases, and an end still being retried never meeting
//! a new lease of its own run.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_core::{
    End, Error, InvalidInput, LeaseStore, RunId, RunState, Ttl, WorkerId, MAX_PAYLOAD_BYTES,
};
use lease_runtime::{
    CancellationToken, EndReport, MemoryLeaseStore, RunContext, Worker, WorkerConfig, WorkerReport,
};

mod common;

use common::gated;

fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

/// The ends a worker reported: run, fence, committed, when.
type Ended = Arc<Mutex<Vec<(String, u64, bool, Instant)>>>;

/// Runs `worker` over `handler` until `done(report so far)` or `within`, then shuts it down.
async fn run_until(
    worker: Worker,
    handler: impl Fn(RunContext) -> lease_runtime::HandlerFuture + Send + Sync + 'static,
    ended: Ended,
    done: impl Fn(&[(String, u64, bool, Instant)]) -> bool,
    within: Duration,
) -> WorkerReport {
    let shutdown = CancellationToken::new();
    let running = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { worker.run(handler, shutdown).await })
    };
    let deadline = Instant::now() + within;
    while !done(&ended.lock().unwrap()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    running.await.unwrap().unwrap()
}

fn recorder(worker: Worker) -> (Worker, Ended) {
    let ended: Ended = Arc::default();
    let seen = ended.clone();
    let worker = worker.on_end(move |report: &EndReport<'_>| {
        seen.lock().unwrap().push((
            report.lease.run().to_string(),
            report.lease.fence().get(),
            report.result.is_ok(),
            Instant::now(),
        ));
    });
    (worker, ended)
}

/// 70 handlers finishing together, each with an effect of the largest allowed payload (70 MiB
/// in all), under `with_batch(100, 50 ms)`: the batcher cuts the batches at 64 MiB, the store
/// accepts every one, and all 70 runs complete with their effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seventy_largest_effects_at_once_all_complete() {
    let store = gated(|_| None);
    let runs: Vec<RunId> = (0..70).map(|i| id(&format!("big-{i:02}"))).collect();
    store.create_many(&runs).await.unwrap();
    let gate = Arc::new(tokio::sync::Barrier::new(70));
    let worker = Worker::new(
        store.clone() as Arc<dyn LeaseStore>,
        WorkerId::new("w").unwrap(),
        WorkerConfig::new(Ttl::from_secs(30).unwrap())
            .with_concurrency(70)
            .with_batch(100, Duration::from_millis(50)),
    )
    .unwrap();
    let (worker, ended) = recorder(worker);
    let handler = move |_ctx: RunContext| -> lease_runtime::HandlerFuture {
        let gate = gate.clone();
        Box::pin(async move {
            gate.wait().await; // all 70 finish together
            Ok(End::CompleteWith(vec![7; MAX_PAYLOAD_BYTES]))
        })
    };
    let report = run_until(
        worker,
        handler,
        ended.clone(),
        |e| e.len() >= 70,
        Duration::from_secs(30),
    )
    .await;
    let batches = store.batches.lock().unwrap().clone();
    eprintln!(
        "70 effects of 1 MiB: {report:?}; batch sizes {:?}",
        batches.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert_eq!(report.completed, 70, "{report:?}");
    assert_eq!((report.refused, report.failed), (0, 0), "{report:?}");
    assert!(batches.len() >= 2, "one batch cannot carry 70 MiB");
    for run in &runs {
        assert_eq!(store.inspect(run).await.unwrap().state, RunState::Completed);
        assert_eq!(store.journal(run).await.unwrap().len(), 1);
    }
}

/// A store that refuses every batch of more than one end as invalid (a bug somewhere): the
/// Worker tries the ends again one by one, and every job completes; none is counted as a lost
/// lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_batch_is_retried_end_by_end_not_taken_for_lost_leases() {
    let store = gated(|ends| {
        (ends.len() > 1).then(|| {
            Error::InvalidInput(InvalidInput::BatchTooLarge {
                len: ends.len(),
                max: 1,
            })
        })
    });
    let runs: Vec<RunId> = (0..12).map(|i| id(&format!("job-{i:02}"))).collect();
    store.create_many(&runs).await.unwrap();
    let gate = Arc::new(tokio::sync::Barrier::new(12));
    let worker = Worker::new(
        store.clone() as Arc<dyn LeaseStore>,
        WorkerId::new("w").unwrap(),
        WorkerConfig::new(Ttl::from_secs(30).unwrap())
            .with_concurrency(12)
            .with_batch(100, Duration::from_millis(20)),
    )
    .unwrap();
    let (worker, ended) = recorder(worker);
    let handler = move |_ctx: RunContext| -> lease_runtime::HandlerFuture {
        let gate = gate.clone();
        Box::pin(async move {
            gate.wait().await;
            Ok(End::Complete)
        })
    };
    let report = run_until(
        worker,
        handler,
        ended.clone(),
        |e| e.len() >= 12,
        Duration::from_secs(20),
    )
    .await;
    let batches = store.batches.lock().unwrap().clone();
    eprintln!(
        "every multi-end batch refused as invalid: {report:?}; batch sizes {:?}",
        batches.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert!(
        batches.iter().any(|b| b.len() > 1),
        "the test needs a batch of several ends: {batches:?}"
    );
    assert_eq!(report.completed, 12, "{report:?}");
    assert_eq!((report.refused, report.failed), (0, 0), "{report:?}");
    for run in &runs {
        assert_eq!(store.inspect(run).await.unwrap().state, RunState::Completed);
    }
}

/// `end_many` fails without an answer for 2.5 s (nothing applied) while the leases' TTL is
/// 1 s: the Worker retries each end until its lease's local deadline, decides it then, and
/// only after that (once the store lets the lease expire) can it claim the run again, under
/// the next fence. No batch ever carries two ends of one run, and no handler of a run starts
/// while an earlier end of the same run is undecided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_end_is_still_retried_is_not_claimed_again_until_it_is_decided() {
    let opened = Instant::now();
    let store = gated(move |_| {
        (opened.elapsed() < Duration::from_millis(2_500))
            .then(|| Error::unavailable("test", "end_many unanswered"))
    });
    let runs: Vec<RunId> = (0..3).map(|i| id(&format!("job-{i}"))).collect();
    store.create_many(&runs).await.unwrap();
    let starts: Arc<Mutex<Vec<(String, u64, Instant)>>> = Arc::default();
    let worker = Worker::new(
        store.clone() as Arc<dyn LeaseStore>,
        WorkerId::new("w").unwrap(),
        WorkerConfig::new(Ttl::from_millis(1_000).unwrap())
            .with_concurrency(3)
            .with_poll_interval(Duration::from_millis(10))
            .with_batch(10, Duration::from_millis(5)),
    )
    .unwrap();
    let (worker, ended) = recorder(worker);
    let handler = {
        let starts = starts.clone();
        move |ctx: RunContext| -> lease_runtime::HandlerFuture {
            starts
                .lock()
                .unwrap()
                .push((ctx.run().to_string(), ctx.fence().get(), Instant::now()));
            Box::pin(async move { Ok(End::Complete) })
        }
    };
    let report = run_until(
        worker,
        handler,
        ended.clone(),
        |e| e.iter().filter(|(_, _, ok, _)| *ok).count() >= 3,
        Duration::from_secs(20),
    )
    .await;
    let ended = ended.lock().unwrap().clone();
    let starts = starts.lock().unwrap().clone();
    let batches = store.batches.lock().unwrap().clone();
    eprintln!("ends retried past their leases: {report:?}; starts {starts:?}; ends {ended:?}");
    for batch in &batches {
        let mut runs: Vec<&str> = batch.iter().map(|(r, _)| r.as_str()).collect();
        runs.sort_unstable();
        let before = runs.len();
        runs.dedup();
        assert_eq!(
            runs.len(),
            before,
            "a batch held two ends of one run: {batch:?}"
        );
    }
    for (run, fence, started) in &starts {
        for (ended_run, ended_fence, _, at) in &ended {
            if ended_run == run && ended_fence < fence {
                assert!(
                    at < started,
                    "{run} started under fence {fence} before its end under fence \
                     {ended_fence} was decided"
                );
            }
        }
        if *fence > 1 {
            assert!(
                ended.iter().any(|(r, f, _, _)| r == run && *f == fence - 1),
                "{run} was claimed again under fence {fence} while its end under fence {} \
                 was undecided",
                fence - 1
            );
        }
    }
    assert_eq!(
        ended.iter().filter(|(_, _, ok, _)| *ok).count(),
        3,
        "every run completes in the end: {ended:?}"
    );
    for run in &runs {
        assert_eq!(store.inspect(run).await.unwrap().state, RunState::Completed);
    }
}

/// A handler that ends its lease itself, with its effect, under the store's lock
/// ([`MemoryLeaseStore::fenced_with`]) and says so ([`End::Committed`]): the Worker writes
/// nothing more (no `end_many` at all), reports each end committed, and each run completed
/// once with one effect. A handler that says so without having ended its lease is reported as
/// a failed end, not counted complete, and its run stays held until it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_committed_by_the_handler_is_checked_not_written_again() {
    use lease_core::Ended;
    use std::collections::HashMap;
    let store = gated(|_| None);
    let runs: Vec<RunId> = (0..6).map(|i| id(&format!("pay-{i}"))).collect();
    store.create_many(&runs).await.unwrap();
    let liar = id("liar");
    store.create(&liar).await.unwrap();
    let payments: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let worker = Worker::new(
        store.clone() as Arc<dyn LeaseStore>,
        WorkerId::new("w").unwrap(),
        WorkerConfig::new(Ttl::from_secs(30).unwrap()).with_concurrency(7),
    )
    .unwrap();
    let (worker, ended) = recorder(worker);
    let handler = {
        let (store, payments) = (store.clone(), payments.clone());
        move |ctx: RunContext| -> lease_runtime::HandlerFuture {
            let (store, payments) = (store.clone(), payments.clone());
            Box::pin(async move {
                if ctx.run().as_str() != "liar" {
                    let lease = ctx.lease();
                    store.inner.fenced_with(&lease, |tx| {
                        tx.end(End::Complete)?;
                        payments
                            .lock()
                            .unwrap()
                            .insert(lease.run().to_string(), lease.fence().get());
                        Ok::<_, Error>(())
                    })?;
                }
                Ok(End::Committed(Ended::Completed))
            })
        }
    };
    let report = run_until(
        worker,
        handler,
        ended.clone(),
        |e| e.len() >= 7,
        Duration::from_secs(20),
    )
    .await;
    let ends = ended.lock().unwrap().clone();
    eprintln!("ends committed by their handlers: {report:?}");
    assert_eq!(report.completed, 6, "{report:?}");
    assert_eq!(report.failed, 1, "the liar's end is a failure: {report:?}");
    assert!(
        store.batches.lock().unwrap().is_empty(),
        "the worker wrote an end_many: {:?}",
        store.batches.lock().unwrap()
    );
    assert!(ends.iter().any(|(r, _, ok, _)| r == "liar" && !*ok));
    for run in &runs {
        assert_eq!(store.inspect(run).await.unwrap().state, RunState::Completed);
        assert_eq!(payments.lock().unwrap()[run.as_str()], 1);
    }
    let record = store.inspect(&liar).await.unwrap();
    assert_eq!(
        (record.state, record.owner.is_some()),
        (RunState::Runnable, true),
        "the liar's run is left to expire: {record:?}"
    );
}

/// The memory store's effect-and-end: a refused fence runs nothing; an effect that fails
/// applies none of the store's part; one that succeeds applies its appends and its end
/// together.
#[tokio::test]
async fn fenced_with_applies_the_stores_part_only_with_the_effect() {
    let store = MemoryLeaseStore::new();
    let r = id("r");
    store.create(&r).await.unwrap();
    let a = store
        .claim(
            &r,
            &WorkerId::new("a").unwrap(),
            Ttl::from_millis(1).unwrap(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let b = store
        .claim(
            &r,
            &WorkerId::new("b").unwrap(),
            Ttl::from_secs(30).unwrap(),
        )
        .await
        .unwrap();
    let mut ran = false;
    let err = store
        .fenced_with(&a, |_| {
            ran = true;
            Ok::<_, Error>(())
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::StaleFence {
                presented: 1,
                current: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!ran, "the effect ran under a stale fence");
    let err = store
        .fenced_with(&b, |tx| {
            tx.append(b"half")?;
            tx.end(End::Complete)?;
            Err::<(), _>(Error::backend("test", "the effect failed"))
        })
        .unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    assert_eq!(store.inspect(&r).await.unwrap().state, RunState::Runnable);
    assert!(store.journal(&r).await.unwrap().is_empty());
    store
        .fenced_with(&b, |tx| {
            tx.append(b"step")?;
            tx.end(End::CompleteWith(b"done".to_vec()))
        })
        .unwrap();
    assert_eq!(store.inspect(&r).await.unwrap().state, RunState::Completed);
    let journal: Vec<Vec<u8>> = store
        .journal(&r)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.payload)
        .collect();
    assert_eq!(journal, [b"step".to_vec(), b"done".to_vec()]);
}
