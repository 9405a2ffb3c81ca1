//! Typed jobs on the memory store: `JobArgs`, `InsertOpts`, `insert` / `insert_many` and
//! `Kinds::job`. The Postgres and Redis adapters run the same API in their own tests
//! (`lease-postgres/tests/jobs.rs`, `lease-redis/tests/claim_payload.rs`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_core::{
    End, Error, InvalidInput, Kind, LeaseStore, ListFilter, NewRun, RunId, RunState, Ttl, WorkerId,
};
use lease_runtime::{
    CancellationToken, InsertExt, InsertOpts, JobArgs, Kinds, MemoryLeaseStore, RunContext, Worker,
    WorkerConfig,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SendEmail {
    to: String,
}
impl JobArgs for SendEmail {
    const KIND: &'static str = "send_email";
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    customer: String,
    amount_cents: u64,
}
impl JobArgs for Charge {
    const KIND: &'static str = "charge";
    fn insert_opts() -> InsertOpts {
        InsertOpts::new().with_priority(3)
    }
}

/// A kind that breaks the kind rules (a control character).
#[derive(Serialize, Deserialize)]
struct BadKind;
impl JobArgs for BadKind {
    const KIND: &'static str = "bad\nkind";
}

/// Arguments JSON cannot hold: a map whose keys are not strings.
#[derive(Serialize, Deserialize)]
struct NotJson {
    by_pair: BTreeMap<(u8, u8), u8>,
}
impl JobArgs for NotJson {
    const KIND: &'static str = "not_json";
}

fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

fn worker(store: Arc<dyn LeaseStore>) -> Worker {
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_poll_interval(Duration::from_millis(10));
    Worker::new(store, WorkerId::new("w").unwrap(), config).unwrap()
}

/// Waits until every run in `runs` has ended, or fails after 20 s.
async fn until_ended(store: &dyn LeaseStore, runs: &[RunId]) {
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let mut open = Vec::new();
        for run in runs {
            let state = store.inspect(run).await.unwrap().state;
            if !matches!(state, RunState::Completed | RunState::Failed) {
                open.push(run.clone());
            }
        }
        if open.is_empty() {
            return;
        }
        assert!(Instant::now() < give_up, "{open:?} still open after 20 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_insert_makes_a_run_of_the_kind_with_the_args_as_json_and_a_time_ordered_id() {
    let store = MemoryLeaseStore::new();
    let email = SendEmail {
        to: "a@example.com".into(),
    };
    let first = store.insert(&email, InsertOpts::new()).await.unwrap();
    let second = store.insert(&email, InsertOpts::new()).await.unwrap();
    assert!(!first.duplicate && !second.duplicate);
    assert_ne!(
        first.run_id, second.run_id,
        "each insert without an id is a new run"
    );
    // A UUIDv7: 36 characters, version nibble 7, and later ids sort after earlier ones.
    let text = first.run_id.as_str();
    assert_eq!(text.len(), 36, "{text}");
    assert_eq!(&text[14..15], "7", "{text} is not a version 7 UUID");
    assert!(
        second.run_id.as_str() > text,
        "{second:?} sorts before {first:?}"
    );

    let record = store.inspect(&first.run_id).await.unwrap();
    assert_eq!(record.state, RunState::Runnable);
    assert_eq!(record.kind.as_str(), "send_email");
    assert_eq!(
        record.payload.as_deref(),
        Some(&br#"{"to":"a@example.com"}"#[..])
    );
}

#[tokio::test]
async fn an_insert_with_an_id_sent_twice_creates_one_run_and_answers_duplicate() {
    let store = MemoryLeaseStore::new();
    let opts = InsertOpts::new().with_id(id("order-7"));
    let args = SendEmail {
        to: "b@example.com".into(),
    };
    let first = store.insert(&args, opts.clone()).await.unwrap();
    assert!(!first.duplicate);
    assert_eq!(first.run_id, id("order-7"));
    // The resend carries other arguments: nothing is changed, the first run is kept.
    let other = SendEmail {
        to: "c@example.com".into(),
    };
    let again = store.insert(&other, opts).await.unwrap();
    assert!(again.duplicate);
    assert_eq!(again.run_id, id("order-7"));
    let record = store.inspect(&id("order-7")).await.unwrap();
    assert_eq!(
        record.payload.as_deref(),
        Some(&br#"{"to":"b@example.com"}"#[..])
    );
    let listed = store.list(&ListFilter::default()).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
}

#[tokio::test]
async fn insert_many_answers_each_job_in_order_and_a_repeated_id_is_a_duplicate() {
    let store = MemoryLeaseStore::new();
    let charge = |n: u64| Charge {
        customer: format!("c-{n}"),
        amount_cents: n,
    };
    let jobs = vec![
        (charge(1), InsertOpts::new().with_id(id("charge-1"))),
        (charge(2), InsertOpts::new()),
        (charge(3), InsertOpts::new().with_id(id("charge-1"))),
        (charge(4), InsertOpts::new().with_priority(9)),
    ];
    let answers = store.insert_many(&jobs).await.unwrap();
    let flags: Vec<bool> = answers.iter().map(|a| a.duplicate).collect();
    assert_eq!(flags, [false, false, true, false]);
    assert_eq!(answers[0].run_id, id("charge-1"));
    assert_eq!(answers[2].run_id, id("charge-1"));
    // The kind's default priority (3), unless the insert sets its own.
    let mut priorities = Vec::new();
    for answer in [&answers[0], &answers[1], &answers[3]] {
        priorities.push(store.inspect(&answer.run_id).await.unwrap().priority);
    }
    assert_eq!(priorities, [3, 3, 9]);
    let again = store.insert_many(&jobs[..2]).await.unwrap();
    assert!(
        again[0].duplicate,
        "a batch sent again: its named jobs are duplicates"
    );
    assert!(
        !again[1].duplicate,
        "a job without an id is a new run each time"
    );
}

#[tokio::test]
async fn bad_arguments_and_bad_kinds_are_refused_before_anything_is_written() {
    let store = MemoryLeaseStore::new();
    let err = store.insert(&BadKind, InsertOpts::new()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::ControlCharacter { .. })
        ),
        "{err:?}"
    );
    let pairs = NotJson {
        by_pair: BTreeMap::from([((1, 2), 3)]),
    };
    let err = store.insert(&pairs, InsertOpts::new()).await.unwrap_err();
    match &err {
        Error::InvalidInput(InvalidInput::JobArgs { kind, why }) => {
            assert_eq!(kind, "not_json");
            assert!(why.contains("key must be a string"), "{why}");
        }
        other => panic!("expected JobArgs, got {other:?}"),
    }
    let too_high = InsertOpts::new().with_priority(200);
    let err = store
        .insert(&SendEmail { to: "x".into() }, too_high)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::PriorityTooHigh { .. })
        ),
        "{err:?}"
    );
    // One bad job in a batch: nothing of the batch is created.
    let jobs = vec![
        (
            SendEmail { to: "ok".into() },
            InsertOpts::new().with_id(id("fine")),
        ),
        (
            SendEmail { to: "no".into() },
            InsertOpts::new().with_priority(200),
        ),
    ];
    assert!(store.insert_many(&jobs).await.is_err());
    assert!(store.list(&ListFilter::default()).await.unwrap().is_empty());

    // A worker given a typed job whose kind is invalid refuses to start, naming it.
    let shared: Arc<dyn LeaseStore> = Arc::new(store);
    let kinds = Kinds::new()
        .job::<BadKind, _, _>(|_ctx: RunContext, _args: BadKind| async { Ok(End::Complete) });
    let err = worker(shared)
        .run_kinds(kinds, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::ControlCharacter { .. })
        ),
        "{err:?}"
    );
}

/// Two kinds served by one worker: each handler gets its own decoded arguments, once; a run
/// of a served kind whose payload is not its arguments fails at its first attempt with the
/// decode error as its reason, and its handler never sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_job_hands_each_handler_its_decoded_args_and_fails_undecodable_runs_for_good() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let email = store
        .insert(
            &SendEmail {
                to: "d@example.com".into(),
            },
            InsertOpts::new(),
        )
        .await
        .unwrap();
    let charge = store
        .insert(
            &Charge {
                customer: "c-9".into(),
                amount_cents: 1200,
            },
            InsertOpts::new(),
        )
        .await
        .unwrap();
    let garbled = id("garbled");
    store
        .create_with(
            &NewRun::new(garbled.clone())
                .with_kind(Kind::new(Charge::KIND).unwrap())
                .with_payload(br#"{"customer":"c-1","amount_cents":"twelve"}"#.to_vec()),
        )
        .await
        .unwrap();
    let empty = id("empty");
    store
        .create_with(&NewRun::new(empty.clone()).with_kind(Kind::new(SendEmail::KIND).unwrap()))
        .await
        .unwrap();

    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let (emails, charges) = (seen.clone(), seen.clone());
    let kinds = Kinds::new()
        .job::<SendEmail, _, _>(move |ctx: RunContext, args: SendEmail| {
            let seen = emails.clone();
            async move {
                seen.lock()
                    .unwrap()
                    .push(format!("{} email {}", ctx.run(), args.to));
                Ok(End::Complete)
            }
        })
        .job::<Charge, _, _>(move |ctx: RunContext, args: Charge| {
            let seen = charges.clone();
            async move {
                let line = format!(
                    "{} charge {} {}",
                    ctx.run(),
                    args.customer,
                    args.amount_cents
                );
                seen.lock().unwrap().push(line);
                Ok(End::Complete)
            }
        });
    let stop = CancellationToken::new();
    let serve = worker(store.clone());
    let token = stop.clone();
    let handle = tokio::spawn(async move { serve.run_kinds(kinds, token).await });
    let all = [
        email.run_id.clone(),
        charge.run_id.clone(),
        garbled.clone(),
        empty.clone(),
    ];
    until_ended(store.as_ref(), &all).await;
    stop.cancel();
    let report = handle.await.unwrap().unwrap();
    assert_eq!(report.completed, 2, "{report:?}");

    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    let mut expected = vec![
        format!("{} email d@example.com", email.run_id),
        format!("{} charge c-9 1200", charge.run_id),
    ];
    expected.sort();
    assert_eq!(seen, expected, "each handler ran once, with its arguments");
    for (run, says) in [
        (
            &garbled,
            "run garbled's payload is not valid arguments: invalid type",
        ),
        (&empty, "run empty has no payload to read arguments from"),
    ] {
        let record = store.inspect(run).await.unwrap();
        assert_eq!(record.state, RunState::Failed, "{run}");
        assert_eq!(
            record.attempts, 1,
            "{run}: failed at its first attempt, not retried"
        );
        let reason = record.failure.unwrap_or_default();
        assert!(reason.contains(says), "{run}: failed with {reason:?}");
    }
}

#[tokio::test]
async fn an_insert_with_the_unique_key_of_a_live_run_answers_that_run() {
    let store = MemoryLeaseStore::new();
    let key = InsertOpts::new().with_unique_key("email:e@example.com");
    let args = SendEmail {
        to: "e@example.com".into(),
    };
    let first = store.insert(&args, key.clone()).await.unwrap();
    let again = store.insert(&args, key.clone()).await.unwrap();
    assert!(!first.duplicate);
    assert!(again.duplicate);
    assert_eq!(
        again.run_id, first.run_id,
        "the live run's id, not the new one's"
    );
    // In a batch too, with an id of its own that was never created.
    let batch = store
        .insert_many(&[(args.clone(), key.clone().with_id(id("other")))])
        .await
        .unwrap();
    assert!(batch[0].duplicate);
    assert_eq!(batch[0].run_id, first.run_id);
    assert!(matches!(
        store.inspect(&id("other")).await,
        Err(Error::NotFound { .. })
    ));
    // Once the run has ended, the key is free.
    let lease = store
        .claim(
            &first.run_id,
            &WorkerId::new("w").unwrap(),
            Ttl::from_secs(5).unwrap(),
        )
        .await
        .unwrap();
    store.complete(&lease).await.unwrap();
    let after = store.insert(&args, key).await.unwrap();
    assert!(!after.duplicate);
    assert_ne!(after.run_id, first.run_id);
}

/// A handler's follow-up job, for the drain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct FollowUp {
    of: String,
}
impl JobArgs for FollowUp {
    const KIND: &'static str = "follow_up";
}

/// `Worker::drain` runs every job there is to run now and returns by itself: the jobs inserted
/// before it, the follow-up jobs their handlers insert, and a failing job's retries when the
/// policy has no backoff (failed at its last attempt); a job scheduled for later is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_runs_everything_runnable_now_and_stops_by_itself() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    for to in ["a@example.com", "b@example.com"] {
        store
            .insert(&SendEmail { to: to.into() }, InsertOpts::new())
            .await
            .unwrap();
    }
    let later = store
        .insert(
            &SendEmail {
                to: "later@example.com".into(),
            },
            InsertOpts::new().with_delay(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    let broken = store
        .insert(
            &Charge {
                customer: "broken".into(),
                amount_cents: 1,
            },
            InsertOpts::new(),
        )
        .await
        .unwrap();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let (emails, follow_ups) = (seen.clone(), seen.clone());
    let kinds = Kinds::new()
        .job::<SendEmail, _, _>(move |ctx: RunContext, args: SendEmail| {
            let seen = emails.clone();
            async move {
                seen.lock().unwrap().push(format!("email {}", args.to));
                let follow_up = FollowUp { of: args.to };
                ctx.store().insert(&follow_up, InsertOpts::new()).await?;
                Ok(End::Complete)
            }
        })
        .job::<FollowUp, _, _>(move |_ctx: RunContext, args: FollowUp| {
            let seen = follow_ups.clone();
            async move {
                seen.lock().unwrap().push(format!("follow-up {}", args.of));
                Ok(End::Complete)
            }
        })
        .job::<Charge, _, _>(|_ctx: RunContext, _args: Charge| async {
            Err("the card was declined".into())
        });
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap()).with_retry(
        lease_runtime::RetryPolicy::default()
            .with_max_attempts(3)
            .with_backoff(Duration::ZERO, Duration::ZERO),
    );
    let worker = Worker::new(store.clone(), WorkerId::new("w").unwrap(), config).unwrap();
    let report = tokio::time::timeout(Duration::from_secs(20), worker.drain(kinds))
        .await
        .expect("the drain stops by itself")
        .unwrap();
    assert_eq!(report.completed, 4, "{report:?}");
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        [
            "email a@example.com",
            "email b@example.com",
            "follow-up a@example.com",
            "follow-up b@example.com",
        ]
    );
    let record = store.inspect(&broken.run_id).await.unwrap();
    assert_eq!(record.state, RunState::Failed);
    assert_eq!(record.attempts, 3, "every attempt ran within the drain");
    let record = store.inspect(&later.run_id).await.unwrap();
    assert_eq!(record.state, RunState::Runnable);
    assert_eq!(record.attempts, 0, "the scheduled job was left");
}

/// A job whose handler always fails, with its own policy: one attempt, cut off after 50 ms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Fragile {
    n: u32,
}
impl JobArgs for Fragile {
    const KIND: &'static str = "fragile";
    fn policy() -> lease_runtime::KindPolicy {
        lease_runtime::KindPolicy::new()
            .with_retry(lease_runtime::RetryPolicy::default().with_max_attempts(1))
            .with_attempt_timeout(Duration::from_millis(50))
    }
}

/// Each kind runs under its own policy where it has one, and the worker's where not: the
/// fragile kind fails at its first attempt, cut off by its own deadline; the other kind, under
/// the worker's policy, is tried three times. A kind's policy that breaks the worker's rules is
/// refused when the worker starts, naming the kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_runs_under_its_own_policy_or_the_workers() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let fragile = store
        .insert(&Fragile { n: 1 }, InsertOpts::new())
        .await
        .unwrap();
    let sturdy = store
        .insert(
            &Charge {
                customer: "c-1".into(),
                amount_cents: 5,
            },
            InsertOpts::new(),
        )
        .await
        .unwrap();
    let kinds = Kinds::new()
        .job::<Fragile, _, _>(|_ctx: RunContext, _args: Fragile| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(End::Complete)
        })
        .job::<Charge, _, _>(|_ctx: RunContext, _args: Charge| async { Err("declined".into()) });
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_grace(Duration::from_millis(50))
        .with_retry(
            lease_runtime::RetryPolicy::default()
                .with_max_attempts(3)
                .with_backoff(Duration::ZERO, Duration::ZERO),
        );
    let worker = Worker::new(store.clone(), WorkerId::new("w").unwrap(), config).unwrap();
    tokio::time::timeout(Duration::from_secs(20), worker.drain(kinds))
        .await
        .expect("the drain stops by itself")
        .unwrap();
    let record = store.inspect(&fragile.run_id).await.unwrap();
    assert_eq!(record.state, RunState::Failed);
    assert_eq!(record.attempts, 1, "its own budget: one attempt");
    let reason = record.failure.unwrap_or_default();
    assert!(
        reason.contains("attempt timed out after 50ms"),
        "cut off by its own timeout: {reason}"
    );
    let record = store.inspect(&sturdy.run_id).await.unwrap();
    assert_eq!(record.state, RunState::Failed);
    assert_eq!(record.attempts, 3, "the worker's budget: three attempts");

    let bad = Kinds::new().handle_with(
        Kind::new("bad").unwrap(),
        |_ctx: RunContext| async { Ok(End::Complete) },
        lease_runtime::KindPolicy::new().with_attempt_timeout(Duration::ZERO),
    );
    let err = worker
        .run_kinds(bad, CancellationToken::new())
        .await
        .unwrap_err();
    match err {
        Error::InvalidInput(InvalidInput::WorkerSetting { setting, value, .. }) => {
            assert_eq!(setting, "attempt timeout");
            assert!(value.contains("for kind bad"), "{value}");
        }
        other => panic!("expected the attempt timeout refused, got {other:?}"),
    }
}

/// Queues: a worker serves the queues it is given (the default queue alone unless told), each
/// within its own limit; a paused queue's runs wait, for every worker, until it is resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_its_queues_each_within_its_limit_and_passes_a_paused_one() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let email = |to: &str| SendEmail { to: to.into() };
    let mut mail = Vec::new();
    for to in ["a", "b", "c", "d"] {
        let opts = InsertOpts::new().with_queue("mail");
        mail.push(store.insert(&email(to), opts).await.unwrap().run_id);
    }
    let bulk = store
        .insert(&email("bulk"), InsertOpts::new().with_queue("bulk"))
        .await
        .unwrap()
        .run_id;
    let plain = store
        .insert(&email("plain"), InsertOpts::new())
        .await
        .unwrap()
        .run_id;
    assert_eq!(
        store.inspect(&mail[0]).await.unwrap().queue.as_str(),
        "mail"
    );
    let bad = store
        .insert(&email("x"), InsertOpts::new().with_queue(""))
        .await
        .unwrap_err();
    assert!(
        matches!(bad, Error::InvalidInput(InvalidInput::EmptyQueue { .. })),
        "{bad:?}"
    );
    let queue = |name: &str| lease_core::Queue::new(name).unwrap();
    store.pause_queue(&queue("bulk")).await.unwrap();

    // At most one mail job at a time, whatever the worker's concurrency.
    let (running, most) = (Arc::new(Mutex::new(0usize)), Arc::new(Mutex::new(0usize)));
    let kinds = || {
        let (running, most) = (running.clone(), most.clone());
        Kinds::new().job::<SendEmail, _, _>(move |_ctx: RunContext, _args: SendEmail| {
            let (running, most) = (running.clone(), most.clone());
            async move {
                let now = {
                    let mut n = running.lock().unwrap();
                    *n += 1;
                    *n
                };
                {
                    let mut most = most.lock().unwrap();
                    *most = (*most).max(now);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                *running.lock().unwrap() -= 1;
                Ok(End::Complete)
            }
        })
    };
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_concurrency(8)
        .with_queue(queue("mail"), Some(1))
        .with_queue(queue("bulk"), None);
    let worker = Worker::new(store.clone(), WorkerId::new("w").unwrap(), config.clone()).unwrap();
    let report = worker.drain(kinds()).await.unwrap();
    assert_eq!(report.completed, 4, "the mail jobs alone: {report:?}");
    assert_eq!(*most.lock().unwrap(), 1, "the mail queue's limit");
    for run in &mail {
        assert_eq!(store.inspect(run).await.unwrap().state, RunState::Completed);
    }
    // The paused queue's run and the default queue's (not served) wait.
    for run in [&bulk, &plain] {
        let record = store.inspect(run).await.unwrap();
        assert_eq!((record.state, record.attempts), (RunState::Runnable, 0));
    }

    store.resume_queue(&queue("bulk")).await.unwrap();
    let report = worker.drain(kinds()).await.unwrap();
    assert_eq!(report.completed, 1, "{report:?}");
    assert_eq!(
        store.inspect(&bulk).await.unwrap().state,
        RunState::Completed
    );
    // A worker given no queue serves the default queue.
    let plain_worker = Worker::new(
        store.clone(),
        WorkerId::new("w2").unwrap(),
        WorkerConfig::new(Ttl::from_secs(30).unwrap()),
    )
    .unwrap();
    assert_eq!(plain_worker.drain(kinds()).await.unwrap().completed, 1);
    assert_eq!(
        store.inspect(&plain).await.unwrap().state,
        RunState::Completed
    );

    // A queue twice, or a limit above the worker's concurrency, is refused before any claim.
    for config in [
        config.clone().with_queue(queue("mail"), None),
        WorkerConfig::new(Ttl::from_secs(30).unwrap())
            .with_concurrency(2)
            .with_queue(queue("mail"), Some(3)),
    ] {
        let err = Worker::new(store.clone(), WorkerId::new("w3").unwrap(), config).unwrap_err();
        assert!(
            matches!(
                err,
                InvalidInput::WorkerSetting { setting, .. } if setting.starts_with("queue")
            ),
            "{err:?}"
        );
    }
}
