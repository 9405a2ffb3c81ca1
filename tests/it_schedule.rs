//! Whole-system test of periodic runs: three `lease schedule` processes, one schedule ticking
//! every second, on one store, for about 20 s. The holder of the schedule's lease is cut off
//! from the store with iptables, the next holder is SIGKILLed, and the last one keeps going.
//! Every tick from the schedule's start to the end is enqueued, exactly once: no gap, no
//! double, no tick before the schedule started, and none of the tick runs touched by anyone
//! else (fence 0: each was created once and never claimed).
//!
//! The test has `leases` in its name: it installs iptables rules, so run it one at a time
//! (`cargo test -p distribution --test it_schedule -- --test-threads=1`).

#[allow(dead_code)]
mod support;

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distribution::{connect, Config, ListFilter, RunId, RunState};
use support::partition::{Partition, A_HOST, B_HOST};
use support::servers::{Kind, Server};
use support::worker::lease_bin;
use tokio::process::{Child, Command};
use tokio::time::Instant;

const TTL_MS: u64 = 2_000;
const NAME: &str = "tick";
const SECS: fn(u64) -> Duration = Duration::from_secs;

fn spawn(id: &str, url: &str, ns: &str) -> Child {
    Command::new(lease_bin())
        .args(["--store", url, "--namespace", ns])
        .args(["--ttl-ms", &TTL_MS.to_string()])
        .args(["schedule", NAME, "--every", "1s", "--id", id])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn lease schedule")
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// The holder of the schedule's lease, waiting up to `within` for one other than `not`.
async fn holder(
    leases: &dyn distribution::LeaseStore,
    not: Option<&str>,
    within: Duration,
) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(record) = leases.inspect(&RunId::new(NAME).unwrap()).await {
            if let Some(owner) = record.owner.as_ref().filter(|_| !record.is_expired()) {
                if Some(owner.as_str()) != not {
                    return owner.as_str().to_owned();
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no scheduler other than {not:?} held the schedule within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The tick runs' ticks, each checked created once and never claimed.
async fn ticks(runs: &dyn distribution::LeaseStore) -> Vec<u64> {
    let records = runs
        .list(&ListFilter::new().with_limit(10_000))
        .await
        .expect("list the tick runs");
    let mut out = Vec::new();
    for record in records {
        let tick = record
            .run
            .as_str()
            .strip_prefix(&format!("{NAME}@"))
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("a run that is not a tick: {}", record.run));
        assert_eq!(
            (record.state, record.fence.get(), record.attempts),
            (RunState::Runnable, 0, 0),
            "tick run {} was touched after its create",
            record.run
        );
        out.push(tick);
    }
    out
}

async fn three_schedulers_enqueue_each_tick_once_through_a_cut_and_a_kill(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let ns = server.namespace("schedule");
    let mut partition = Partition::prepare(server.port()).await;
    let admin = |namespace: String| {
        let url = server.url_via(B_HOST);
        async move {
            connect(&Config::default().with_store(url).with_namespace(namespace))
                .await
                .expect("admin connection")
        }
    };
    let runs = admin(ns.clone()).await;
    let leases = admin(format!("{ns}_schedules")).await;

    // A first, through its own address, so that A holds the lease when the cut comes.
    let _ = lease_bin(); // built before the clock starts
    let begun = unix_now();
    let a_url = partition.a_url(&server.url_via(A_HOST));
    let mut a = spawn("a", &a_url, &ns);
    assert_eq!(holder(&*leases, None, SECS(30)).await, "a");
    let mut b = spawn("b", &server.url_via(B_HOST), &ns);
    let mut c = spawn("c", &server.url_via(B_HOST), &ns);
    tokio::time::sleep(SECS(5)).await;

    partition.cut();
    let second = holder(&*leases, Some("a"), SECS(15)).await;
    eprintln!("{kind:?}: A cut off; {second} took the schedule over");
    tokio::time::sleep(SECS(4)).await;

    let (killed, last) = if second == "b" {
        (&mut b, &mut c)
    } else {
        (&mut c, &mut b)
    };
    killed.kill().await.expect("SIGKILL the second holder");
    let third = holder(&*leases, Some(&second), SECS(15)).await;
    eprintln!("{kind:?}: {second} SIGKILLed; {third} took the schedule over");
    assert_ne!(third, "a", "A is still cut off");
    tokio::time::sleep(SECS(5)).await;
    partition.heal();
    tokio::time::sleep(SECS(2)).await;

    // Stop the rest: SIGTERM hands the lease back and exits 0.
    let ended = unix_now();
    for child in [&mut *last, &mut a] {
        let pid = child.id().expect("running").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(sent.success(), "SIGTERM to {pid}");
    }
    for (name, child) in [("last", last), ("a", &mut a)] {
        let status = tokio::time::timeout(SECS(20), child.wait())
            .await
            .unwrap_or_else(|_| panic!("{name} did not exit within 20 s of SIGTERM"))
            .expect("wait");
        assert_eq!(status.code(), Some(0), "{name} exits 0 on SIGTERM");
    }

    // The schedule's start, as its first holder recorded it in the lease run's journal.
    let journal = leases
        .journal(&RunId::new(NAME).unwrap())
        .await
        .expect("the schedule lease's journal");
    let started: u64 = std::str::from_utf8(&journal[0].payload)
        .expect("UTF-8")
        .parse()
        .expect("a start in Unix seconds");
    assert!(
        started >= begun && started <= begun + 10,
        "started {started}, begun {begun}"
    );
    let ticks = ticks(&*runs).await;
    assert!(!ticks.is_empty(), "no tick run was created");
    let (first, final_tick) = (ticks[0], ticks[ticks.len() - 1]);
    let gaps: Vec<(u64, u64)> = ticks
        .windows(2)
        .filter(|w| w[1] != w[0] + 1)
        .map(|w| (w[0], w[1]))
        .collect();
    eprintln!(
        "{kind:?}: {} ticks, {first} to {final_tick} (schedule begun at {begun}, stopped at {ended})",
        ticks.len()
    );
    assert!(gaps.is_empty(), "ticks missing between {gaps:?}");
    assert!(
        first > begun && first <= begun + 2,
        "first tick {first}, begun {begun}"
    );
    assert!(
        final_tick + 3 >= ended && final_tick <= ended,
        "last tick {final_tick}, stopped at {ended}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_schedule_three_schedulers_enqueue_each_tick_once_on_postgres() {
    three_schedulers_enqueue_each_tick_once_through_a_cut_and_a_kill(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_schedule_three_schedulers_enqueue_each_tick_once_on_redis() {
    three_schedulers_enqueue_each_tick_once_through_a_cut_and_a_kill(Kind::Redis).await;
}
