//! `lease pg-rebind` and `lease redis-rebind` as an operator runs them after a restore: each
//! raises every fence by 2^32 and says what it did (text and JSON); each is refused, by name,
//! on another backend, before connecting.

use std::process::{Command, Output};

use lease_conformance::fixtures::{unavailable, RedisServer};

mod common;
use common::postgres;

const USAGE: i32 = 2;
const STEP: u64 = 1 << 32;

fn lease(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lease"))
        .args(args)
        .env_remove("LEASE_STORE")
        .env_remove("LEASE_NAMESPACE")
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        stdout(out),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Creates `order-1` (fence 0), rebinds with `command` (JSON), checks that the run's fence is
/// now at least 2^32, and rebinds again in text.
fn rebind_raises_the_fence(url: &str, namespace: &str, command: &str) -> serde_json::Value {
    let base = ["--store", url, "--namespace", namespace];
    let run = |extra: &[&str]| lease(&[&base[..], extra].concat());
    assert_exit(&run(&["create", "order-1"]), 0);
    let out = run(&["-o", "json", command]);
    assert_exit(&out, 0);
    let rebound: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(rebound["runs_raised"], 1, "{rebound}");
    let out = run(&["-o", "json", "inspect", "order-1"]);
    assert_exit(&out, 0);
    let record: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(
        record["fence"].as_u64().is_some_and(|f| f >= STEP),
        "{record}"
    );
    let out = run(&[command]);
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("raised by 2^32"), "{}", stdout(&out));
    rebound
}

#[test]
fn pg_rebind_raises_every_fence_and_records_the_server() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let rebound = rebind_raises_the_fence(&url, "cli_rebind", "pg-rebind");
    assert!(rebound["after"]["system_identifier"].is_i64(), "{rebound}");
    assert_eq!(rebound["after"]["timeline"], 1, "{rebound}");
    assert_eq!(rebound["fence_floor"], STEP, "{rebound}");
    let out = lease(&["--store", "memory:", "pg-rebind"]);
    assert_exit(&out, USAGE);
    assert!(String::from_utf8_lossy(&out.stderr).contains("postgres:// store only"));
}

#[test]
fn redis_rebind_raises_every_fence_and_clears_the_mark() {
    let server = match RedisServer::start() {
        Ok(server) => server,
        Err(why) => {
            return unavailable(
                "redis",
                why,
                "install redis-server (bash scripts/test.sh does it)",
            )
            .unwrap_or(())
        }
    };
    let rebound = rebind_raises_the_fence(&server.url(), "cli_rebind", "redis-rebind");
    assert_eq!(rebound["marker"], serde_json::Value::Null, "{rebound}");
    assert_eq!(rebound["fence_floor"], STEP.to_string(), "{rebound}");
    let out = lease(&["--store", "memory:", "redis-rebind"]);
    assert_exit(&out, USAGE);
    assert!(String::from_utf8_lossy(&out.stderr).contains("redis:// store only"));
}
