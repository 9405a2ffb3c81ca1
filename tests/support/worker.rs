//! `lease-test-worker worker` processes driven over stdin, read through their JSON event
//! stream, and the binaries the whole-system tests start (`lease`, `lease-test-worker`).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// The directory holding the `lease` and `lease-test-worker` binaries: `LEASE_TEST_BIN_DIR`
/// when set (scripts/run-tests.sh builds them with the tests), else built once per test
/// process.
///
/// They are built in their own target directory (`target/lease-it`): building them in the
/// test's target directory would resolve features differently from the test build and make the
/// two rebuild each other's dependencies on every run.
fn bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // scripts/run-tests.sh builds them with the tests, in the tests' own target directory.
        if let Some(dir) = std::env::var_os("LEASE_TEST_BIN_DIR") {
            let dir = PathBuf::from(dir);
            for bin in ["lease", "lease-test-worker"] {
                assert!(
                    dir.join(bin).is_file(),
                    "LEASE_TEST_BIN_DIR={} has no {bin} binary",
                    dir.display()
                );
            }
            return dir;
        }
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/<test> → target/<profile>
        let profile_dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("test executable in target/<profile>/deps")
            .to_path_buf();
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let mut build = std::process::Command::new(cargo);
        build.args([
            "build",
            "--quiet",
            "-p",
            "lease-cli",
            "-p",
            "lease-test-worker",
            "--bins",
        ]);
        if release {
            build.arg("--release");
        }
        let target = profile_dir
            .parent()
            .expect("target directory")
            .join("lease-it");
        build.env("CARGO_TARGET_DIR", &target);
        let status = build
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build for the lease binaries");
        assert!(
            status.success(),
            "building lease and lease-test-worker failed"
        );
        target.join(if release { "release" } else { "debug" })
    })
    .clone()
}

/// The operator's `lease` binary.
#[allow(dead_code)] // each test file uses the half of this module it needs
pub(crate) fn lease_bin() -> PathBuf {
    bin_dir().join("lease")
}

/// The test-support binary: `lease-test-worker worker …` and `lease-test-worker ledger …`.
#[allow(dead_code)]
pub(crate) fn test_worker_bin() -> PathBuf {
    bin_dir().join("lease-test-worker")
}

/// A running `lease-test-worker worker`.
pub(crate) struct Worker {
    pub(crate) name: &'static str,
    child: Child,
    stdin: Option<ChildStdin>,
    events: mpsc::UnboundedReceiver<Value>,
    /// Every event seen so far, for failure messages.
    pub(crate) seen: Vec<Value>,
}

impl Worker {
    /// Starts `lease-test-worker worker` against `store` in `namespace` with `ttl_ms`, plus `args`.
    pub(crate) fn spawn(
        name: &'static str,
        store: &str,
        namespace: &str,
        ttl_ms: u64,
        heartbeat_ms: Option<u64>,
        args: &[&str],
    ) -> Worker {
        let mut command = Command::new(test_worker_bin());
        command
            .args(["--store", store, "--namespace", namespace])
            .args(["--ttl-ms", &ttl_ms.to_string()]);
        if let Some(hb) = heartbeat_ms {
            command.args(["--heartbeat-ms", &hb.to_string()]);
        }
        command
            .arg("worker")
            .args(args)
            .env("LEASE_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("spawn lease-test-worker worker");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take();
        let (tx, events) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let event: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("worker printed a non-JSON line {line:?}: {e}"));
                if tx.send(event).is_err() {
                    return;
                }
            }
        });
        Worker {
            name,
            child,
            stdin,
            events,
            seen: Vec::new(),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id().expect("worker still running")
    }

    /// Sends one command line.
    pub(crate) async fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to worker");
        stdin.flush().await.expect("flush worker stdin");
    }

    /// Waits for the next event named `name`, keeping the others in `seen`.
    pub(crate) async fn expect(&mut self, name: &str, within: Duration) -> Value {
        self.expect_one_of(&[name], within).await
    }

    /// Waits for the next event named any of `names`, keeping the others in `seen`.
    pub(crate) async fn expect_one_of(&mut self, names: &[&str], within: Duration) -> Value {
        let name = names.join(" or ");
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(event)) => {
                    self.seen.push(event.clone());
                    if names.iter().any(|n| event["event"] == *n) {
                        return event;
                    }
                }
                Ok(None) => panic!(
                    "worker {} exited before {name:?}; events: {:#?}",
                    self.name, self.seen
                ),
                Err(_) => panic!(
                    "worker {} sent no {name:?} within {within:?}; events: {:#?}",
                    self.name, self.seen
                ),
            }
        }
    }

    /// Sends a signal (`STOP`, `CONT`, `KILL`) to the process.
    pub(crate) fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Kills the process with SIGKILL (no chance to flush or release anything) and returns every
    /// event it printed before it died.
    pub(crate) async fn kill(mut self) -> Vec<Value> {
        self.signal("KILL");
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("worker {} survived SIGKILL", self.name));
        while let Some(event) = self.events.recv().await {
            self.seen.push(event);
        }
        self.seen
    }

    /// Closes stdin and waits for a clean exit; returns every event seen.
    pub(crate) async fn finish(mut self) -> Vec<Value> {
        drop(self.stdin.take());
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("worker {} did not exit", self.name))
            .expect("wait for worker");
        while let Some(event) = self.events.recv().await {
            self.seen.push(event);
        }
        assert!(
            status.success(),
            "worker {} exited with {status}: {:#?}",
            self.name,
            self.seen
        );
        self.seen
    }
}
