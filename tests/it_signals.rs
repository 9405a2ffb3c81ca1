//! Whole-system test of signals: processes that do not share memory, one store.
//!
//! Worker process A claims a run whose handler waits for `approval` and exits once the wait is
//! stored (the run holds no lease while it waits). The `lease signal` command, a process of its
//! own, delivers the approval with A's token; sent again, it changes nothing. Worker process B
//! resumes the run under a higher fence, reads the payload, and waits for `shipped`. The first
//! wait's token, replayed, is refused by the store (`earlier wait`), a token re-pointed with
//! another token's signature is refused by its signature, and the second token lets B complete
//! the run. Tokens are signed: every process has the same `LEASE_SIGNAL_SECRET`.
//!
//! On Postgres and on Redis, against private servers. Every test has `leases` in its name:
//! `cargo test -p distribution --test it_signals`.

#[allow(dead_code)]
mod support;

use std::process::{Output, Stdio};
use std::time::Duration;

use distribution::{connect, Config, Kind, LeaseStore, NewRun, RunId, RunState};
use serde_json::Value;
use support::servers::{Kind as Backend, Server};
use support::worker::{lease_bin, test_worker_bin};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const SECRET: &str = "the namespace's signal secret, for this test";
const RUN: &str = "order-1";

/// The store flags and environment every process of the scenario gets.
fn command(bin: std::path::PathBuf, url: &str, namespace: &str) -> Command {
    let mut command = Command::new(bin);
    command
        .env("LEASE_SIGNAL_SECRET", SECRET)
        .env_remove("LEASE_STORE")
        .args(["--store", url, "--namespace", namespace])
        .kill_on_drop(true);
    command
}

/// Starts `lease-test-worker approval` exiting after `ends` committed ends.
fn approval_worker(url: &str, namespace: &str, id: &str, ends: usize) -> Child {
    command(test_worker_bin(), url, namespace)
        .args(["approval", "--id", id, "--ends", &ends.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start lease-test-worker approval")
}

/// The worker's events until it exits (at most a minute), and its exit status.
async fn events_until_exit(mut child: Child) -> Vec<Value> {
    let stdout = child.stdout.take().expect("piped");
    let mut lines = BufReader::new(stdout).lines();
    let mut events = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await.expect("read events") {
            events.push(serde_json::from_str::<Value>(&line).unwrap_or(Value::String(line)));
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .unwrap_or_else(|_| panic!("the worker did not exit; events so far: {events:?}"));
    let status = child.wait().await.expect("wait for the worker");
    assert!(status.success(), "worker exited {status}: {events:?}");
    events
}

fn event<'a>(events: &'a [Value], name: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["event"] == name)
        .unwrap_or_else(|| panic!("no {name} event in {events:?}"))
}

/// `lease signal TOKEN --payload PAYLOAD -o json`.
async fn signal(url: &str, namespace: &str, token: &str, payload: &str) -> Output {
    command(lease_bin(), url, namespace)
        .args(["-o", "json", "signal", token, "--payload", payload])
        .output()
        .await
        .expect("run lease signal")
}

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "lease signal failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("lease signal prints JSON")
}

async fn signals_cross_processes(backend: Backend) {
    let Some(server) = Server::start(backend) else {
        return;
    };
    let url = server.url_via("127.0.0.1");
    let namespace = server.namespace("signals");
    let store: std::sync::Arc<dyn LeaseStore> = connect(
        &Config::default()
            .with_store(url.clone())
            .with_namespace(namespace.clone()),
    )
    .await
    .expect("the test's own connection");
    let run = RunId::new(RUN).unwrap();
    store
        .create_with(&NewRun::new(run.clone()).with_kind(Kind::new("approval").unwrap()))
        .await
        .unwrap();

    // A takes the run, waits for approval, and exits: the run is suspended, unowned.
    let a = events_until_exit(approval_worker(&url, &namespace, "a", 1)).await;
    let waiting = event(&a, "waiting");
    assert_eq!(
        (&waiting["signal"], &waiting["fence"]),
        (&"approval".into(), &1.into())
    );
    let first = waiting["token"].as_str().expect("a token").to_owned();
    let record = store.inspect(&run).await.unwrap();
    assert_eq!(
        (record.state, record.owner.as_ref()),
        (RunState::Suspended, None)
    );
    assert_eq!(
        record
            .wait
            .as_ref()
            .map(|w| (w.name.as_str(), w.fence.get())),
        Some(("approval", 1))
    );

    // The approval, through the CLI, twice: delivered once.
    let delivered = json_of(&signal(&url, &namespace, &first, "yes").await);
    assert_eq!(delivered["duplicate"], false, "{delivered}");
    let again = json_of(&signal(&url, &namespace, &first, "yes").await);
    assert_eq!(again["duplicate"], true, "{again}");

    // B resumes it under fence 2, reads the payload, and waits for the shipment.
    let mut b = approval_worker(&url, &namespace, "b", 2);
    let stdout = b.stdout.take().expect("piped");
    let mut lines = BufReader::new(stdout).lines();
    let mut b_events: Vec<Value> = Vec::new();
    let second = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("B did not wait again: {b_events:?}"))
            .expect("read B's events")
            .unwrap_or_else(|| panic!("B exited early: {b_events:?}"));
        let e: Value = serde_json::from_str(&line).expect("a JSON event");
        b_events.push(e.clone());
        if e["event"] == "waiting" {
            break e;
        }
    };
    let approved = event(&b_events, "approved");
    assert_eq!(
        (
            &approved["payload"],
            &approved["fence"],
            &approved["wait_fence"]
        ),
        (&"yes".into(), &2.into(), &1.into())
    );
    assert_eq!(
        (&second["signal"], &second["fence"]),
        (&"shipped".into(), &2.into())
    );
    let second = second["token"].as_str().expect("a token").to_owned();
    // Wait until B's second wait is stored.
    for _ in 0..300 {
        if store.inspect(&run).await.unwrap().wait.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The first wait's token, replayed: refused by the store, with the reason; nothing stored.
    let replayed = signal(&url, &namespace, &first, "yes").await;
    assert_eq!(replayed.status.code(), Some(4), "refused: {replayed:?}");
    let why = String::from_utf8_lossy(&replayed.stderr);
    assert!(why.contains("earlier wait"), "{why}");
    // The second token's body with the first one's signature: refused before the store.
    let body = second.rsplit_once('.').unwrap().0;
    let signature = first.rsplit_once('.').unwrap().1;
    let forged = signal(&url, &namespace, &format!("{body}.{signature}"), "x").await;
    assert_eq!(forged.status.code(), Some(2), "refused: {forged:?}");
    assert!(String::from_utf8_lossy(&forged.stderr).contains("signature does not match"));
    let record = store.inspect(&run).await.unwrap();
    assert_eq!(
        record.state,
        RunState::Suspended,
        "the refusals changed nothing"
    );

    // The shipment: B completes the run under fence 3 and exits.
    assert_eq!(
        json_of(&signal(&url, &namespace, &second, "box-7").await)["duplicate"],
        false
    );
    while let Some(line) = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("B exits after the shipment")
        .expect("read B's events")
    {
        b_events.push(serde_json::from_str(&line).expect("a JSON event"));
    }
    assert!(b.wait().await.unwrap().success(), "{b_events:?}");
    let shipped = event(&b_events, "shipped");
    assert_eq!(
        (&shipped["payload"], &shipped["fence"]),
        (&"box-7".into(), &3.into())
    );
    let record = store.inspect(&run).await.unwrap();
    assert_eq!((record.state, record.fence.get()), (RunState::Completed, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_leases_postgres_a_wait_is_answered_across_processes_once() {
    signals_cross_processes(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_leases_redis_a_wait_is_answered_across_processes_once() {
    signals_cross_processes(Backend::Redis).await;
}
