//! What the commands `lease run` and `lease worker` start find in their environment: the
//! parent's, less the store's settings (`Config::ENV_VARS`: `LEASE_STORE` with its password
//! and the rest), plus the lease's own variables. Against a real PostgreSQL, the store named
//! only through the environment, as a deployment names it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use distribution::Config;

mod common;

use common::postgres;

const NAMESPACE: &str = "cli_child_env";

/// `lease ARGS` with every store setting in its environment (valid for a Postgres store) and
/// one variable of the application's own.
fn lease(url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lease"));
    command.args(args).env("APP_SETTING", "passes through");
    for (var, value) in [
        ("LEASE_STORE", url),
        ("LEASE_NAMESPACE", NAMESPACE),
        ("LEASE_TTL_MS", "5000"),
        ("LEASE_HEARTBEAT_MS", "1000"),
        ("LEASE_REPLICAS", "0"),
        ("LEASE_REPLICA_TIMEOUT_MS", "1000"),
        ("LEASE_SYNC_REPLICAS", "0"),
        ("LEASE_MAX_CONNECTIONS", "4"),
        ("LEASE_MIGRATE", "true"),
        ("LEASE_SIGNAL_SECRET", "the namespace's signal secret"),
    ] {
        command.env(var, value);
    }
    command
}

/// The `NAME=value` lines of `env`'s output (a value spanning lines is cut at its first).
fn parse(env: &str) -> BTreeMap<String, String> {
    env.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The child got no store setting, the application's variable, and the lease's variables;
/// nothing in it holds the store URL.
#[track_caller]
fn assert_child_env(env: &str, url: &str, run: &str) {
    let vars = parse(env);
    let leaked: Vec<&str> = Config::ENV_VARS
        .iter()
        .copied()
        .filter(|var| vars.contains_key(*var))
        .collect();
    assert!(leaked.is_empty(), "the child got {leaked:?}:\n{env}");
    assert!(
        !env.contains(url),
        "the store URL reached the child:\n{env}"
    );
    assert_eq!(
        vars.get("APP_SETTING").map(String::as_str),
        Some("passes through")
    );
    assert_eq!(vars.get("LEASE_RUN").map(String::as_str), Some(run));
    assert_eq!(vars.get("LEASE_FENCE").map(String::as_str), Some("1"));
    assert!(vars.contains_key("PATH"), "PATH passes through:\n{env}");
}

#[test]
fn lease_run_gives_its_command_no_store_settings() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let out = lease(&url, &["run", "env-run", "--create", "--", "env"])
        .output()
        .expect("run lease");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_child_env(&String::from_utf8_lossy(&out.stdout), &url, "env-run");
}

#[test]
fn lease_worker_gives_its_commands_no_store_settings() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let created = lease(&url, &["create", "env-worker"])
        .output()
        .expect("run lease");
    assert_eq!(created.status.code(), Some(0), "{created:?}");
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("env-worker.env");
    let script = format!("env > '{}'.part && mv '{0}'.part '{0}'", saved.display());
    let mut worker = lease(
        &url,
        &["worker", "--grace", "1s", "--", "sh", "-c", &script],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::inherit())
    .spawn()
    .expect("start lease worker");
    let env = wait_for_file(&saved, Duration::from_secs(20));
    let _ = Command::new("kill")
        .args(["-TERM", &worker.id().to_string()])
        .status();
    let status = worker.wait().unwrap();
    assert!(status.success(), "lease worker: {status}");
    assert_child_env(&env, &url, "env-worker");
    assert_eq!(
        parse(&env).get("LEASE_KIND").map(String::as_str),
        Some("default")
    );
}

/// The file's text once it exists (`within` at most).
fn wait_for_file(path: &Path, within: Duration) -> String {
    let give_up = Instant::now() + within;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return text;
        }
        assert!(
            Instant::now() < give_up,
            "{} not written within {within:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
