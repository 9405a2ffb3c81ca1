//! `lease worker -- CMD` as a user runs it against a real PostgreSQL: one command per run it
//! claims, of the kinds it serves only; exit codes become completions and failed attempts;
//! a hung command is killed at its deadline; the Prometheus endpoint serves the library's
//! metrics; SIGTERM hands a running command's run back; bad input is refused before connecting.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use distribution::{RunId, RunRecord, RunState};
mod common;

use common::postgres;

const USAGE: i32 = 2;
const NAMESPACE: &str = "cli_worker";

fn lease(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lease"));
    command
        .args(args)
        .env_remove("LEASE_STORE")
        .env_remove("LEASE_NAMESPACE")
        .env_remove("LEASE_TTL_MS")
        .env_remove("LEASE_HEARTBEAT_MS");
    command
}

fn output(args: &[&str]) -> Output {
    lease(args).output().expect("run lease")
}

#[track_caller]
fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The command each run gets: `ok*` saves its payload and environment and exits 0, `bad*`
/// exits 3, `hang*` writes its pid and ignores SIGTERM, `slow*` sleeps.
fn script(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "case \"$LEASE_RUN\" in \
           ok*) cat > '{d}'/\"$LEASE_RUN\".payload; \
                echo \"$LEASE_FENCE $LEASE_KIND $LEASE_ATTEMPT\" > '{d}'/\"$LEASE_RUN\".env ;; \
           bad*) exit 3 ;; \
           hang*) echo $$ > '{d}'/\"$LEASE_RUN\".pid; trap '' TERM; sleep 30 ;; \
           slow*) echo $$ > '{d}'/\"$LEASE_RUN\".pid; exec sleep 30 ;; \
         esac"
    )
}

/// Polls the run's record until `done` holds (20 s at most).
#[track_caller]
fn wait_for(
    rt: &tokio::runtime::Runtime,
    store: &std::sync::Arc<dyn distribution::LeaseStore>,
    run: &str,
    done: impl Fn(&RunRecord) -> bool,
) -> RunRecord {
    let id = RunId::new(run).unwrap();
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let record = rt.block_on(store.inspect(&id)).unwrap();
        if done(&record) {
            return record;
        }
        assert!(
            Instant::now() < give_up,
            "{run} never got there: {record:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn alive(pid: &str) -> bool {
    // A zombie is dead for this purpose: its process has ended.
    std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
        .is_ok_and(|stat| !stat.contains(") Z "))
}

fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

/// The `lease worker` process, its stderr read line by line on a thread.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn start(args: &[&str]) -> Running {
        let mut child = lease(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start lease worker");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Running {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The first stderr line containing `text` (10 s at most).
    fn line(&mut self, text: &str) -> String {
        if let Some(line) = self.seen.iter().find(|l| l.contains(text)) {
            return line.clone();
        }
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            let left = give_up.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(text) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {text:?} on stderr: {:?}", self.seen),
            }
        }
    }

    /// SIGTERM, then the exit status (20 s at most).
    fn stop(&mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < give_up, "lease worker did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn lease_worker_runs_a_command_per_run_and_serves_its_metrics() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let base = ["--store", url.as_str(), "--namespace", NAMESPACE];
    let create = |run: &str, args: &[&str]| {
        assert_exit(&output(&[&base[..], &["create", run], args].concat()), 0);
    };
    create("ok-1", &["--kind", "mail", "--payload", "to: c-17 ✓"]);
    create("ok-2", &["--kind", "charge"]);
    create("bad-1", &["--kind", "mail"]);
    create("hang-1", &["--kind", "charge"]);
    create("other-1", &["--kind", "report"]);

    let script = script(dir.path());
    let mut worker = Running::start(
        &[
            &base[..],
            &[
                "--ttl-ms",
                "3000",
                "worker",
                "--kind",
                "mail",
                "--kind",
                "charge",
                "--concurrency",
                "4",
                "--max-attempts",
                "1",
                "--attempt-timeout-ms",
                "500",
                "--kill-after-ms",
                "200",
                "--grace",
                "300ms",
                "--metrics-addr",
                "127.0.0.1:0",
                "--counts-every",
                "1s",
                "--id",
                "shell-worker",
                "--",
                "sh",
                "-c",
                &script,
            ],
        ]
        .concat(),
    );
    let line = worker.line("serving metrics on http://");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();

    let (rt, store) = {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let config = distribution::Config::default()
            .with_store(&url)
            .with_namespace(NAMESPACE);
        let store = rt.block_on(distribution::connect(&config)).unwrap();
        (rt, store)
    };
    // Exit 0 completes, with the payload on stdin and the lease in the environment.
    for (run, kind, payload) in [("ok-1", "mail", "to: c-17 ✓"), ("ok-2", "charge", "")] {
        let record = wait_for(&rt, &store, run, |r| r.state == RunState::Completed);
        let saved = std::fs::read_to_string(dir.path().join(format!("{run}.payload"))).unwrap();
        assert_eq!(saved, payload, "{run}");
        let env = std::fs::read_to_string(dir.path().join(format!("{run}.env"))).unwrap();
        assert_eq!(
            env.trim(),
            format!("{} {kind} 1", record.fence.get()),
            "{run}"
        );
    }
    // Exit 3 under --max-attempts 1 fails the run with the exit code as the reason.
    let bad = wait_for(&rt, &store, "bad-1", |r| r.state == RunState::Failed);
    assert_eq!(
        bad.failure.as_deref(),
        Some("the command exited with 3"),
        "{bad:?}"
    );
    // A command that ignores SIGTERM is killed one kill grace after its deadline.
    let hang = wait_for(&rt, &store, "hang-1", |r| r.state == RunState::Failed);
    let reason = hang.failure.clone().unwrap_or_default();
    assert!(reason.contains("attempt timed out after 500ms"), "{hang:?}");
    let pid = std::fs::read_to_string(dir.path().join("hang-1.pid")).unwrap();
    assert!(!alive(&pid), "the hung command {pid} still runs");
    // A kind it does not serve is never claimed.
    let other = rt
        .block_on(store.inspect(&RunId::new("other-1").unwrap()))
        .unwrap();
    assert_eq!(
        (other.state, other.fence.get()),
        (RunState::Runnable, 0),
        "{other:?}"
    );

    // The endpoint: the Worker's ends, and the counts gauges it refreshes.
    let give_up = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let metrics = scrape(&addr);
        if metrics.contains("lease_runs{state=\"failed\"} 2") {
            break metrics;
        }
        assert!(Instant::now() < give_up, "{metrics}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    // By kind and queue: one completion each of mail and charge, in the default queue.
    for kind in ["mail", "charge"] {
        let labels = [
            "end=\"complete\"".to_owned(),
            "outcome=\"committed\"".to_owned(),
            format!("kind=\"{kind}\""),
            "queue=\"default\"".to_owned(),
        ];
        assert!(
            metrics
                .lines()
                .any(|line| line.starts_with("lease_worker_ends_total{")
                    && labels.iter().all(|l| line.contains(l.as_str()))
                    && line.ends_with(" 1")),
            "{kind}: {metrics}"
        );
        assert!(
            metrics.lines().any(|line| line
                .starts_with("lease_worker_handler_duration_seconds_count{")
                && line.contains(&format!("kind=\"{kind}\""))
                && line.contains("outcome=\"ok\"")),
            "{kind}: {metrics}"
        );
    }
    assert!(
        metrics.contains("lease_runs{state=\"completed\"} 2"),
        "{metrics}"
    );

    // SIGTERM while a command runs: it gets the grace, then SIGTERM; the run is handed back
    // with no attempt used.
    create("slow-1", &["--kind", "mail"]);
    let held = wait_for(&rt, &store, "slow-1", |r| r.owner.is_some());
    assert_eq!(
        held.owner.as_ref().map(|w| w.as_str()),
        Some("shell-worker")
    );
    let pid_file = dir.path().join("slow-1.pid");
    let give_up = Instant::now() + Duration::from_secs(10);
    while !pid_file.exists() {
        assert!(Instant::now() < give_up, "slow-1 never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = worker.stop();
    assert_eq!(status.code(), Some(0), "{:?}", worker.seen);
    let said = worker.line("lease: worker shell-worker stopped: claimed 5, completed 2");
    assert!(said.contains("runs failed 2"), "{said}");
    let slow = rt
        .block_on(store.inspect(&RunId::new("slow-1").unwrap()))
        .unwrap();
    assert_eq!(
        (slow.state, slow.owner.is_none(), slow.attempts),
        (RunState::Runnable, true, 0),
        "{slow:?}"
    );
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    assert!(!alive(&pid), "the slow command {pid} still runs");
}

/// `lease queue pause Q` holds back every `lease worker --queue Q` (its run is not claimed
/// for 3 s while the worker's other queue is served; a run of a queue it was not given is not
/// its to take), and once `lease queue resume Q` runs,
/// the worker claims the run and completes it; `lease queue list` shows each state.
#[test]
fn lease_worker_serves_its_queue_and_passes_it_while_paused() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let base = ["--store", url.as_str(), "--namespace", "cli_worker_queues"];
    let run = |args: &[&str]| output(&[&base[..], args].concat());
    let paused = run(&["queue", "pause", "mail"]);
    assert_exit(&paused, 0);
    let text = String::from_utf8_lossy(&paused.stdout).to_string();
    assert!(text.starts_with("mail paused since "), "{text}");
    assert_exit(&run(&["create", "ok-q1", "--queue", "mail"]), 0);
    assert_exit(&run(&["create", "ok-d1"]), 0);
    assert_exit(&run(&["create", "ok-b1", "--queue", "bulk"]), 0);
    let listed = run(&["list", "--queue", "mail", "-o", "json"]);
    assert_exit(&listed, 0);
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(
        listed.lines().count() == 1 && listed.contains("\"run\":\"ok-q1\""),
        "what waits in the paused queue: {listed}"
    );
    let inspected = run(&["inspect", "ok-q1"]);
    assert!(
        String::from_utf8_lossy(&inspected.stdout).contains("\nqueue: mail\n"),
        "{}",
        String::from_utf8_lossy(&inspected.stdout)
    );

    let script = script(dir.path());
    let mut worker = Running::start(
        &[
            &base[..],
            &[
                "worker",
                "--concurrency",
                "2",
                "--queue",
                "mail=2",
                "--queue",
                "bulk",
                "--no-retention",
                "--metrics-addr",
                "127.0.0.1:0",
                "--",
                "sh",
                "-c",
                &script,
            ],
        ]
        .concat(),
    );
    // Listening once its claims have begun.
    worker.line("serving metrics on http://");
    let (rt, store) = {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let config = distribution::Config::default()
            .with_store(&url)
            .with_namespace("cli_worker_queues");
        let store = rt.block_on(distribution::connect(&config)).unwrap();
        (rt, store)
    };
    // The worker claims: its other queue's run is done. Then three seconds in the paused
    // queue: never claimed.
    wait_for(&rt, &store, "ok-b1", |r| r.state == RunState::Completed);
    std::thread::sleep(Duration::from_secs(3));
    let record = rt
        .block_on(store.inspect(&RunId::new("ok-q1").unwrap()))
        .unwrap();
    assert_eq!(
        (record.state, record.attempts, record.fence.get()),
        (RunState::Runnable, 0, 0),
        "{record:?}"
    );

    assert_exit(&run(&["queue", "resume", "mail"]), 0);
    let record = wait_for(&rt, &store, "ok-q1", |r| r.state == RunState::Completed);
    assert_eq!(record.fence.get(), 1, "{record:?}");
    assert!(dir.path().join("ok-q1.env").exists(), "the command ran");
    // The default queue is not this worker's.
    let record = rt
        .block_on(store.inspect(&RunId::new("ok-d1").unwrap()))
        .unwrap();
    assert_eq!((record.state, record.attempts), (RunState::Runnable, 0));
    assert!(worker.stop().success());

    let listed = run(&["queue", "list", "-o", "json"]);
    assert_exit(&listed, 0);
    let states: Vec<serde_json::Value> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // mail, resumed; default, never paused, listed for its runnable run ok-d1.
    assert_eq!(states.len(), 2, "{states:?}");
    assert_eq!(
        (
            &states[0]["queue"],
            &states[0]["paused"],
            &states[0]["changed_at_us"]
        ),
        (
            &serde_json::json!("default"),
            &serde_json::json!(false),
            &serde_json::Value::Null
        )
    );
    assert_eq!(
        (&states[1]["queue"], &states[1]["paused"]),
        (&serde_json::json!("mail"), &serde_json::json!(false))
    );
    // A bad queue name or limit is refused before the store is reached.
    for args in [
        &["queue", "pause", ""][..],
        &["create", "x", "--queue", "a\tb"],
        &["worker", "--queue", "mail=x", "--", "true"],
        &["worker", "--queue", "mail=0", "--", "true"],
    ] {
        let out = run(args);
        assert_exit(&out, USAGE);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(err.contains("queue"), "{args:?}: {err}");
    }
}

#[test]
fn lease_worker_refuses_bad_input_before_connecting() {
    // Nothing listens there: a refusal that reached for the store would exit 5, not 2.
    let store = "postgres://app@127.0.0.1:1/engine";
    let long_kind = "k".repeat(65);
    let cases: &[(&[&str], &str)] = &[
        (
            &["--store", "memory:", "worker", "--", "true"],
            "memory: lives inside this one process",
        ),
        (
            &[
                "--store", store, "worker", "--kind", "a", "--kind", "a", "--", "true",
            ],
            "--kind a is given twice",
        ),
        (
            &[
                "--store", store, "worker", "--kind", &long_kind, "--", "true",
            ],
            "kind",
        ),
        (
            &[
                "--store",
                store,
                "worker",
                "--concurrency",
                "0",
                "--",
                "true",
            ],
            "concurrency",
        ),
        (
            &[
                "--store",
                store,
                "worker",
                "--max-attempts",
                "0",
                "--",
                "true",
            ],
            "--max-attempts must be at least 1",
        ),
        (
            &[
                "--store",
                store,
                "--ttl-ms",
                "1000",
                "worker",
                "--kill-after-ms",
                "600",
                "--",
                "true",
            ],
            "--kill-after-ms 600 does not fit in the TTL of 1000 ms",
        ),
        (
            &[
                "--store",
                store,
                "worker",
                "--attempt-timeout-ms",
                "0",
                "--",
                "true",
            ],
            "attempt timeout",
        ),
        (
            &[
                "--store",
                store,
                "worker",
                "--metrics-addr",
                "nowhere",
                "--",
                "true",
            ],
            "--metrics-addr \"nowhere\" is not an address",
        ),
        (
            &[
                "--store",
                store,
                "worker",
                "--retention",
                "7d",
                "--kind",
                "lease-purger",
                "--",
                "true",
            ],
            "the purge lease's kind",
        ),
        (
            &["--store", store, "-o", "json", "worker", "--", "true"],
            "-o json",
        ),
        (&["--store", store, "worker"], "CMD"),
    ];
    for (args, says) in cases {
        let out = output(args);
        assert_eq!(out.status.code(), Some(USAGE), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
