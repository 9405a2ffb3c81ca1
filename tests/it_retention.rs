//! Whole-system test of retention by the fleet: three `lease purge --every 1s` processes on one
//! store take turns at the purge lease. Ended runs go within two periods of their end; the
//! holder is SIGSTOPped and another takes over within the TTL and purges what ends after; when
//! the stopped one is continued, its lease is gone and it does not take the purge back. Every
//! ended run is purged exactly once (the processes' own counts add up), and the purge lease's
//! journal names one holder per fence, in fence order.
//!
//! The same with three pool workers (`lease-test-worker worker --pool`, the library's `Worker`
//! with `with_retention`), which also run the jobs whose runs they then purge.
//!
//! While the purgers work, the test renews a lease of its own (a run of a kind nobody serves, in
//! the same namespace) every 50 ms and reports the renewals' worst latency: a purge must not
//! stall the fleet's heartbeats. A thousand more ended runs make the first purges full batches.
//!
//! Run with the other whole-system tests, one at a time
//! (`cargo test -p distribution --test it_retention -- --test-threads=1`).

#[allow(dead_code)]
mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use distribution::{
    connect, CancellationToken, Config, End, Ending, LeaseStore, NewRun, RunId, Ttl, WorkerId,
    DEFAULT_PURGER_NAME, PURGER_KIND,
};
use support::partition::B_HOST;
use support::servers::{Kind, Server};
use support::worker::{lease_bin, Worker};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const TTL_MS: u64 = 2_000;
const SECS: fn(u64) -> Duration = Duration::from_secs;

fn spawn(id: &str, url: &str, ns: &str, log: &std::path::Path) -> Child {
    let log = std::fs::File::create(log).expect("create the purger's log");
    Command::new(lease_bin())
        .args(["--store", url, "--namespace", ns])
        .args(["--ttl-ms", &TTL_MS.to_string()])
        .args(["purge", "--older-than", "0s", "--every", "1s", "--id", id])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn lease purge --every")
}

fn signal(child: &Child, sig: &str) {
    let pid = child.id().expect("running").to_string();
    let sent = std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .expect("run kill");
    assert!(sent.success(), "{sig} to {pid}");
}

/// A store over `ns` of the server at `url`, for the test's own reads and writes.
async fn admin(url: &str, ns: &str) -> Arc<dyn LeaseStore> {
    connect(&Config::default().with_store(url).with_namespace(ns))
        .await
        .expect("admin connection")
}

/// Creates the runs `{prefix}-{i}`, each claimed and completed.
async fn completed(store: &Arc<dyn LeaseStore>, prefix: &str, n: usize) {
    let w = WorkerId::new("test").unwrap();
    for i in 0..n {
        let run = RunId::new(format!("{prefix}-{i}")).unwrap();
        store.create(&run).await.expect("create");
        let lease = store
            .claim(&run, &w, Ttl::from_secs(30).unwrap())
            .await
            .expect("claim");
        store.complete(&lease).await.expect("complete");
    }
}

/// Creates `n` runs `{prefix}-{i}` and completes them in batches: many ended runs, quickly.
async fn completed_in_bulk(store: &Arc<dyn LeaseStore>, prefix: &str, n: usize) {
    let w = WorkerId::new("bulk").unwrap();
    let ids: Vec<RunId> = (0..n)
        .map(|i| RunId::new(format!("{prefix}-{i}")).unwrap())
        .collect();
    for chunk in ids.chunks(500) {
        for result in store.create_many(chunk).await.expect("create_many") {
            result.expect("create");
        }
    }
    let mut done = 0;
    while done < n {
        let leases = store
            .claim_next(&w, Ttl::from_secs(30).unwrap(), 500)
            .await
            .expect("claim_next");
        assert!(
            !leases.is_empty(),
            "{done} of {n} completed, none left to claim"
        );
        let ends: Vec<Ending> = leases
            .into_iter()
            .map(|l| Ending::new(l, End::Complete))
            .collect();
        for result in store.end_many(&ends).await.expect("end_many") {
            result.expect("complete");
        }
        done += ends.len();
    }
}

/// A lease the test keeps, renewed every 50 ms while the purgers work.
struct Probe {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<(u32, Duration)>,
}

impl Probe {
    /// Claims the run `probe` (of the kind `probe`, which nobody serves) and renews it until
    /// stopped. Every renewal must be accepted: a purge that stalled one past the TTL would
    /// lose the lease.
    async fn start(store: Arc<dyn LeaseStore>) -> Probe {
        let run = RunId::new("probe").unwrap();
        let kind = distribution::Kind::new("probe").unwrap();
        store
            .create_with(&NewRun::new(run.clone()).with_kind(kind))
            .await
            .expect("create the probe");
        let mut lease = store
            .claim(
                &run,
                &WorkerId::new("probe").unwrap(),
                Ttl::from_millis(TTL_MS).unwrap(),
            )
            .await
            .expect("claim the probe");
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let (mut n, mut worst) = (0, Duration::ZERO);
            while !stopped.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let sent = Instant::now();
                lease = store
                    .renew(&lease)
                    .await
                    .expect("a renewal during the purges");
                worst = worst.max(sent.elapsed());
                n += 1;
            }
            (n, worst)
        });
        Probe { stop, task }
    }

    /// Stops renewing, reports how many renewals were made `during` what and the slowest,
    /// and checks that the slowest stayed under half the TTL.
    async fn finish(self, kind: Kind, during: &str) {
        self.stop.cancel();
        let (renewals, worst) = self.task.await.expect("the probe's task");
        eprintln!(
            "{kind:?}: {renewals} renewals of the probe's lease {during}, the slowest {worst:?}"
        );
        assert!(
            worst < Duration::from_millis(TTL_MS / 2),
            "a renewal took {worst:?} {during}"
        );
    }
}

/// The holder of the purge lease, waiting up to `within` for one other than `not`.
async fn holder(store: &dyn LeaseStore, not: Option<&str>, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(record) = store
            .inspect(&RunId::new(DEFAULT_PURGER_NAME).unwrap())
            .await
        {
            assert_eq!(record.kind.as_str(), PURGER_KIND);
            if let Some(owner) = record.owner.as_ref().filter(|_| !record.is_expired()) {
                if Some(owner.as_str()) != not {
                    return owner.as_str().to_owned();
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no purger other than {not:?} held the purge lease within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no completed run is left, at most `within`; how long that took.
async fn until_purged(store: &dyn LeaseStore, within: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let left = store.count().await.expect("count").completed;
        if left == 0 {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < within,
            "{left} completed runs left after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The runs a purger process says it purged, from its last line.
fn purged_by(log: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(log).expect("read the purger's log");
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with("lease: purger stopped:"))
        .unwrap_or_else(|| panic!("no summary line in {}:\n{text}", log.display()));
    line.split("purged ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {line:?}"))
}

async fn three_purgers_take_turns_through_a_sigstop(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let ns = server.namespace("retention");
    let url = server.url_via(B_HOST);
    let store = admin(&url, &ns).await;
    completed(&store, "early", 40).await;
    completed_in_bulk(&store, "bulk", 1_000).await;
    let probe = Probe::start(store.clone()).await;

    let _ = lease_bin(); // built before the clock starts
    let dir = std::env::temp_dir().join(format!(
        "lease-it-retention-{}-{kind:?}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("a log directory");
    let names = ["p1", "p2", "p3"];
    let logs: Vec<_> = names.iter().map(|n| dir.join(format!("{n}.log"))).collect();
    let mut children: Vec<Child> = names
        .iter()
        .zip(&logs)
        .map(|(n, log)| spawn(n, &url, &ns, log))
        .collect();

    let first = holder(&*store, None, SECS(30)).await;
    let took = until_purged(&*store, SECS(10)).await;
    eprintln!(
        "{kind:?}: {first} holds the purge lease; the first 1,040 runs were gone {took:?} after"
    );

    // The holder stops (SIGSTOP) between two purges; runs end meanwhile.
    let stopped = names.iter().position(|n| *n == first).unwrap();
    signal(&children[stopped], "-STOP");
    let cut = Instant::now();
    completed(&store, "late", 20).await;
    let second = holder(&*store, Some(&first), SECS(10)).await;
    // The TTL for the stopped holder's lease to run out, then two periods, and a margin.
    let gone = until_purged(&*store, SECS(8).saturating_sub(cut.elapsed())).await;
    eprintln!(
        "{kind:?}: {first} stopped; {second} took over; 20 more runs gone {:?} after the stop",
        cut.elapsed()
    );
    let _ = gone;

    // Continued, the old holder finds its lease gone and does not take the purge back.
    signal(&children[stopped], "-CONT");
    tokio::time::sleep(SECS(3)).await;
    assert_eq!(
        holder(&*store, None, SECS(1)).await,
        second,
        "the continued purger took the lease back from a live holder"
    );
    completed(&store, "after", 5).await;
    until_purged(&*store, SECS(4)).await;

    for child in &children {
        signal(child, "-TERM");
    }
    for (name, child) in names.iter().zip(&mut children) {
        let status = tokio::time::timeout(SECS(20), child.wait())
            .await
            .unwrap_or_else(|_| panic!("{name} did not exit within 20 s of SIGTERM"))
            .expect("wait");
        assert_eq!(status.code(), Some(0), "{name} exits 0 on SIGTERM");
    }
    probe.finish(kind, "during the purges").await;
    let purged: u64 = logs.iter().map(|l| purged_by(l)).sum();
    assert_eq!(purged, 1_065, "each ended run purged exactly once");
    let _ = std::fs::remove_dir_all(&dir);

    // One holder per fence, in fence order: first, then second, then whoever took the lease
    // as the others stopped.
    let holders = purge_history(&*store).await;
    eprintln!("{kind:?}: purge lease history {holders:?}");
    assert_eq!(holders[0].1, first, "{holders:?}");
    assert_eq!(holders[1].1, second, "{holders:?}");
}

/// The purge lease's history: (fence, holder) per entry, checked one takeover per fence.
async fn purge_history(store: &dyn LeaseStore) -> Vec<(u64, String)> {
    let journal = store
        .journal(&RunId::new(DEFAULT_PURGER_NAME).unwrap())
        .await
        .expect("the purge lease's journal");
    let holders: Vec<(u64, String)> = journal
        .iter()
        .map(|e| {
            let text = String::from_utf8(e.payload.clone()).expect("UTF-8");
            let who = text
                .strip_suffix(" holds the purge lease")
                .unwrap_or_else(|| panic!("unexpected journal entry {text:?}"));
            (e.fence.get(), who.to_owned())
        })
        .collect();
    assert!(
        holders.windows(2).all(|w| w[0].0 < w[1].0),
        "one takeover per fence: {holders:?}"
    );
    holders
}

/// Waits until every run is gone: none left but the purge lease's own run and the probe's.
async fn until_all_gone(store: &dyn LeaseStore, within: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let c = store.count().await.expect("count");
        let left = c.claimable + c.held + c.delayed + c.completed + c.failed;
        // The purge lease's run is held (or claimable between holders); the probe's is held.
        if left <= 2 && c.completed == 0 {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < within, "runs left after {within:?}: {c:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn create(store: &Arc<dyn LeaseStore>, prefix: &str, n: usize) {
    let ids: Vec<RunId> = (0..n)
        .map(|i| RunId::new(format!("{prefix}-{i}")).unwrap())
        .collect();
    for result in store.create_many(&ids).await.expect("create_many") {
        result.expect("create");
    }
}

async fn three_workers_with_retention_take_turns_through_a_sigstop(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let ns = server.namespace("worker_retention");
    let url = server.url_via(B_HOST);
    let store = admin(&url, &ns).await;
    create(&store, "early", 40).await;
    let probe = Probe::start(store.clone()).await;
    let names = ["w1", "w2", "w3"];
    let mut workers: Vec<Worker> = names
        .iter()
        .map(|n| {
            Worker::spawn(
                n,
                &url,
                &ns,
                TTL_MS,
                None,
                &[
                    "--id",
                    n,
                    "--pool",
                    "4",
                    "--retention-ms",
                    "0",
                    "--retention-every-ms",
                    "1000",
                ],
            )
        })
        .collect();
    for w in &mut workers {
        w.expect("pool_started", SECS(30)).await;
    }
    let first = holder(&*store, None, SECS(10)).await;
    let took = until_all_gone(&*store, SECS(10)).await;
    eprintln!(
        "{kind:?}: {first} holds the purge lease; the 40 runs were run and purged within {took:?}"
    );

    let stopped = names.iter().position(|n| *n == first).unwrap();
    workers[stopped].signal("STOP");
    let cut = Instant::now();
    create(&store, "late", 20).await;
    let second = holder(&*store, Some(&first), SECS(10)).await;
    // The other two run the 20 runs; the new holder purges them: the TTL, two periods, margin.
    until_all_gone(&*store, SECS(8).saturating_sub(cut.elapsed())).await;
    eprintln!(
        "{kind:?}: {first} stopped; {second} took over; 20 more runs run and purged {:?} after the stop",
        cut.elapsed()
    );
    workers[stopped].signal("CONT");
    tokio::time::sleep(SECS(3)).await;
    assert_eq!(
        holder(&*store, None, SECS(1)).await,
        second,
        "the continued worker took the purge lease back from a live holder"
    );

    let mut purged = 0;
    for mut w in workers {
        w.signal("TERM");
        let stopped = w.expect("stopped", SECS(30)).await;
        purged += stopped["purged"]
            .as_u64()
            .expect("purged in the stopped event");
        w.finish().await;
    }
    assert_eq!(purged, 60, "each ended run purged exactly once");
    probe.finish(kind, "while the workers ran and purged").await;
    let holders = purge_history(&*store).await;
    eprintln!("{kind:?}: purge lease history {holders:?}");
    assert_eq!(holders[0].1, first, "{holders:?}");
    assert_eq!(holders[1].1, second, "{holders:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_with_retention_take_turns_through_a_sigstop_on_postgres() {
    three_workers_with_retention_take_turns_through_a_sigstop(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_with_retention_take_turns_through_a_sigstop_on_redis() {
    three_workers_with_retention_take_turns_through_a_sigstop(Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_purgers_take_turns_through_a_sigstop_on_postgres() {
    three_purgers_take_turns_through_a_sigstop(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_purgers_take_turns_through_a_sigstop_on_redis() {
    three_purgers_take_turns_through_a_sigstop(Kind::Redis).await;
}
