//! Typed jobs on Redis: an insert with an id, or with a unique key, sent twice creates one run
//! and answers `duplicate`, a batch answers each job, and a worker serving the kind through `Kinds::job`
//! hands the handler the decoded arguments once (the shared server: `REDIS_URL`, or one
//! private server for this process).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_conformance::fixtures::redis;
use lease_core::{End, RunId, RunState, Ttl, WorkerId};
use lease_runtime::{
    CancellationToken, InsertExt, InsertOpts, JobArgs, Kinds, RunContext, Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Resize {
    image: String,
    width: u32,
}
impl JobArgs for Resize {
    const KIND: &'static str = "resize";
}

fn args_again() -> Resize {
    Resize {
        image: "cat.png".into(),
        width: 640,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_job_inserted_twice_runs_once_with_its_arguments() {
    let Some(factory) = redis().await else {
        return;
    };
    let store = factory.fresh().await;
    let args = Resize {
        image: "cat.png".into(),
        width: 640,
    };
    let named = InsertOpts::new().with_id(RunId::new("resize-cat").unwrap());
    let first = store.insert(&args, named.clone()).await.unwrap();
    let again = store.insert(&args, named.clone()).await.unwrap();
    assert!(!first.duplicate);
    assert!(again.duplicate);
    assert_eq!(again.run_id, first.run_id);
    let batch = store
        .insert_many(&[
            (
                Resize {
                    image: "dog.png".into(),
                    width: 320,
                },
                InsertOpts::new(),
            ),
            (args, named),
        ])
        .await
        .unwrap();
    assert!(!batch[0].duplicate && batch[1].duplicate, "{batch:?}");
    assert_eq!(batch[1].run_id, first.run_id);
    // A unique key without an id: the second insert finds the first's run.
    let keyed = InsertOpts::new().with_unique_key("resize:cat.png:640");
    let by_key = store.insert(&args_again(), keyed.clone()).await.unwrap();
    let by_key_again = store.insert(&args_again(), keyed).await.unwrap();
    assert!(!by_key.duplicate && by_key_again.duplicate);
    assert_eq!(by_key_again.run_id, by_key.run_id);

    let seen = Arc::new(Mutex::new(Vec::new()));
    let handled = seen.clone();
    let kinds = Kinds::new().job::<Resize, _, _>(move |ctx: RunContext, args: Resize| {
        let seen = handled.clone();
        async move {
            seen.lock()
                .unwrap()
                .push((ctx.run().to_string(), args.image, args.width));
            Ok(End::Complete)
        }
    });
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_poll_interval(Duration::from_millis(20));
    let worker = Worker::new(store.clone(), WorkerId::new("w").unwrap(), config).unwrap();
    let stop = CancellationToken::new();
    let token = stop.clone();
    let serving = tokio::spawn(async move { worker.run_kinds(kinds, token).await });
    let give_up = Instant::now() + Duration::from_secs(20);
    for run in [&first.run_id, &batch[0].run_id, &by_key.run_id] {
        while store.inspect(run).await.unwrap().state != RunState::Completed {
            assert!(Instant::now() < give_up, "{run} was not completed in 20 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    stop.cancel();
    serving.await.unwrap().unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    let mut expected = vec![
        (batch[0].run_id.to_string(), "dog.png".to_owned(), 320),
        ("resize-cat".to_owned(), "cat.png".to_owned(), 640),
        (by_key.run_id.to_string(), "cat.png".to_owned(), 640),
    ];
    expected.sort();
    assert_eq!(
        seen, expected,
        "each job's handler ran once with its arguments"
    );
}
