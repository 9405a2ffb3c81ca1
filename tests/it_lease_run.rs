//! Whole-system test of `lease run -- CMD`: two `lease run` processes race for one run on one
//! store, with a real network cut.
//!
//! A holds the run and its command appends `FENCE SEQ NANOS` to a file every ~20 ms; B waits
//! with `--wait-ms`. A is cut off from the store; its scope's local deadline passes, and A must
//! kill its command (which ignores SIGTERM, so SIGKILL it is) before its lease can expire on the
//! store's clock. B claims at fence 2 when the store allows and starts its own command. The
//! file is the evidence: every fence-1 line precedes every fence-2 line, each fence has one
//! writer (its sequence numbers count 1, 2, 3, … without repeats), and A exits with the
//! lease-lost code.
//!
//! Every test has `lease_run` and `leases` in its name; they install iptables rules, so run them
//! one at a time: `cargo test -p distribution --test it_lease_run -- --test-threads=1`.

// This file uses the binaries and the partition, not the scripted worker.
#[allow(dead_code)]
mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use distribution::{connect, Config, RunId, RunState};
use support::partition::{Partition, A_HOST, B_HOST};
use support::servers::{Kind, Server};
use support::worker::lease_bin;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

const TTL_MS: u64 = 1_500;
const GRACE_MS: u64 = 300;
/// `exit::LEASE_LOST` of `lease`.
const LEASE_LOST: i32 = 6;
/// What the command exits with when it sees the stop file.
const COMMAND_EXIT: i32 = 3;
const RUN: &str = "nightly-report";
const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The files of one scenario; the stop file is created on drop, so a command left behind by a
/// failed test ends its loop.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn new(what: &str) -> Files {
        let dir = std::env::temp_dir().join(format!("lease-run-it-{}-{what}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the scenario's directory");
        Files { dir }
    }

    fn log(&self) -> PathBuf {
        self.dir.join("log")
    }

    fn stop(&self) -> PathBuf {
        self.dir.join("stop")
    }

    /// The command both processes run: it ignores SIGTERM (so only SIGKILL stops it), and
    /// appends its fence, a sequence number and the wall clock every ~20 ms until the stop file
    /// appears.
    fn script(&self) -> String {
        format!(
            "trap '' TERM; i=0; while [ ! -e '{stop}' ]; do i=$((i+1)); \
             echo \"$LEASE_FENCE $i $(date +%s%N)\" >> '{log}'; sleep 0.02; done; exit {COMMAND_EXIT}",
            stop = self.stop().display(),
            log = self.log().display(),
        )
    }

    /// The log's lines as (fence, seq, wall-clock nanoseconds); a line being written is skipped.
    fn lines(&self) -> Vec<(u64, u64, u128)> {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        text.lines()
            .filter_map(|line| {
                let mut parts = line.split(' ');
                let fence = parts.next()?.parse().ok()?;
                let seq = parts.next()?.parse().ok()?;
                let nanos = parts.next()?.parse().ok()?;
                Some((fence, seq, nanos))
            })
            .collect()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::write(self.stop(), b"");
    }
}

/// A running `lease run`, with its stderr lines.
struct LeaseRun {
    name: &'static str,
    child: Child,
    stderr: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl LeaseRun {
    fn spawn(name: &'static str, url: &str, ns: &str, wait_ms: u64, files: &Files) -> LeaseRun {
        let mut child = Command::new(lease_bin())
            .args(["--store", url, "--namespace", ns])
            .args(["--ttl-ms", &TTL_MS.to_string()])
            .args(["run", RUN, "--create", "--id", name])
            .args(["--kill-after-ms", &GRACE_MS.to_string()])
            .args(["--wait-ms", &wait_ms.to_string()])
            .args(["--", "sh", "-c", &files.script()])
            .env("RUST_LOG", "lease::run=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn lease run");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        LeaseRun {
            name,
            child,
            stderr: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `text`.
    async fn expect(&mut self, text: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.stderr.recv()).await {
                Ok(Some(line)) => {
                    let found = line.contains(text);
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Ok(None) => panic!(
                    "lease run {} exited before saying {text:?}: {:#?}",
                    self.name, self.seen
                ),
                Err(_) => panic!(
                    "lease run {} did not say {text:?} within {within:?}: {:#?}",
                    self.name, self.seen
                ),
            }
        }
    }

    /// Waits for the process to exit; returns its code and everything it said on stderr.
    async fn exit(mut self, within: Duration) -> (Option<i32>, String) {
        let status = timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("lease run {} did not exit within {within:?}", self.name))
            .expect("wait for lease run");
        while let Some(line) = self.stderr.recv().await {
            self.seen.push(line);
        }
        (status.code(), self.seen.join("\n"))
    }
}

/// Polls `check` every 10 ms until it holds, failing with `what` after `within`.
async fn until(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Two `lease run` processes race for one run; the holder is cut off from the store and its
/// command is killed before the other's command starts under fence 2.
async fn partitioned_holder_is_killed_before_the_next_command_starts(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let ns = server.namespace("lease_run");
    let files = Files::new(&format!("{kind:?}"));
    let mut partition = Partition::prepare(server.port()).await;
    let admin = connect(
        &Config::default()
            .with_store(server.url_via(B_HOST))
            .with_namespace(ns.clone()),
    )
    .await
    .expect("admin connection");
    let run = RunId::new(RUN).unwrap();

    // A claims (creating the run), starts its command and renews.
    let a_url = partition.a_url(&server.url_via(A_HOST));
    let a = LeaseRun::spawn("a", &a_url, &ns, 0, &files);
    until("A's command writes under fence 1", SECS(30), || {
        files.lines().iter().any(|l| l.0 == 1)
    })
    .await;
    let deadline = Instant::now() + SECS(10);
    while admin.inspect(&run).await.expect("inspect").heartbeats == 0 {
        assert!(Instant::now() < deadline, "A never renewed its lease");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // B waits for the run while A holds it.
    let mut b = LeaseRun::spawn("b", &server.url_via(B_HOST), &ns, 30_000, &files);
    b.expect("waiting to claim", SECS(30)).await;
    assert!(
        files.lines().iter().all(|l| l.0 == 1),
        "B's command ran while A held the run: {:?}",
        files.lines()
    );

    partition.cut();
    let cut = Instant::now();
    let (code, said) = a.exit(SECS(30)).await;
    let a_exited = cut.elapsed();
    assert_eq!(
        code,
        Some(LEASE_LOST),
        "A must exit with lease lost: {said}"
    );
    assert!(
        said.contains(&format!(
            "lost the lease on run {RUN} under fence 1 (local deadline passed"
        )),
        "A stopped at its local deadline: {said}"
    );
    assert!(
        said.contains("stopped with SIGKILL"),
        "the command ignores SIGTERM: {said}"
    );
    // The last renewal A sent was sent before the cut, so its lease cannot expire on the store
    // before cut + TTL; A killed its command (and exited) before that.
    assert!(
        a_exited < Duration::from_millis(TTL_MS),
        "A exited {a_exited:?} after the cut, later than the TTL of {TTL_MS} ms"
    );

    until("B's command writes under fence 2", SECS(30), || {
        files.lines().iter().any(|l| l.0 == 2)
    })
    .await;
    partition.heal();
    std::fs::write(files.stop(), b"").expect("create the stop file");
    let (code, said) = b.exit(SECS(30)).await;
    assert_eq!(
        code,
        Some(COMMAND_EXIT),
        "B passes its command's exit code through: {said}"
    );

    let lines = files.lines();
    let first_b = lines.iter().position(|l| l.0 == 2).expect("a fence-2 line");
    let (a_lines, b_lines) = lines.split_at(first_b);
    assert!(
        a_lines.iter().all(|l| l.0 == 1) && b_lines.iter().all(|l| l.0 == 2),
        "every fence-1 line precedes every fence-2 line, no other fence: {lines:?}"
    );
    for (fence, written) in [(1, a_lines), (2, b_lines)] {
        let seqs: Vec<u64> = written.iter().map(|l| l.1).collect();
        let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
        assert_eq!(seqs, expected, "one writer under fence {fence}");
    }
    let (a_last, b_first) = (a_lines.last().expect("A wrote").2, b_lines[0].2);
    assert!(
        a_last < b_first,
        "A's command wrote at {a_last} ns, after B's first line at {b_first} ns"
    );
    eprintln!(
        "{kind:?}: A exited {a_exited:?} after the cut; {} ms between A's last line and B's first",
        (b_first - a_last) / 1_000_000
    );

    let record = admin.inspect(&run).await.expect("inspect");
    assert_eq!(
        (record.state, record.owner, record.fence.get()),
        (RunState::Runnable, None, 2),
        "B released the run after its command"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_lease_run_partitioned_holder_is_killed_before_the_next_command_on_postgres() {
    partitioned_holder_is_killed_before_the_next_command_starts(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_lease_run_partitioned_holder_is_killed_before_the_next_command_on_redis() {
    partitioned_holder_is_killed_before_the_next_command_starts(Kind::Redis).await;
}
