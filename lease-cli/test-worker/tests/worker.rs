//! `lease-test-worker` as the whole-system tests drive it: `worker` claims and records effects
//! in the ledger under the fence, `ledger` reads them back.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use lease_conformance::fixtures::{unavailable, RedisServer};

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn test_worker(base: &[&str], args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lease-test-worker"))
        .args(base)
        .args(args)
        .env_remove("LEASE_STORE")
        .env_remove("LEASE_NAMESPACE")
        .env_remove("LEASE_TTL_MS")
        .env_remove("LEASE_HEARTBEAT_MS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run lease-test-worker");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write the steps");
    child.wait_with_output().expect("lease-test-worker output")
}

/// Fences stay exact in the Redis ledger: an effect written under fence 100000000000001 reads
/// back as that integer (a Lua number would make it 1e+14).
#[test]
fn the_redis_ledger_keeps_large_fences_exact() {
    let server = match RedisServer::start() {
        Ok(server) => server,
        Err(why) => {
            return unavailable::<()>(
                "redis",
                why,
                "install redis-server (bash scripts/test.sh does it)",
            )
            .unwrap_or(())
        }
    };
    let url = format!("redis://127.0.0.1:{}", server.port());
    let base = ["--store", url.as_str(), "--namespace", "tw_fences"];
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let config = distribution::Config::default()
            .with_store(url.clone())
            .with_namespace("tw_fences");
        let store = distribution::connect(&config).await.unwrap();
        let run = distribution::RunId::new("order-9").unwrap();
        store.create(&run).await.unwrap();
    });
    // Move the fence to 10^14 by hand: the record's second field.
    let key = "{lease:tw_fences}:runs";
    let field: String = "order-9".bytes().map(|b| format!("{b:02x}")).collect();
    let redis_cli = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .arg("-p")
            .arg(server.port().to_string())
            .args(args)
            .output()
            .expect("run redis-cli");
        assert!(out.status.success(), "redis-cli {args:?}");
        stdout(&out).trim().to_string()
    };
    let value = redis_cli(&["HGET", key, &field]);
    let mut parts: Vec<&str> = value.splitn(6, ':').collect();
    assert_eq!(parts.len(), 6, "record {value:?}");
    parts[1] = "100000000000000";
    redis_cli(&["HSET", key, &field, &parts.join(":")]);

    let worker = test_worker(
        &base,
        &[
            "--ttl-ms", "60000", "worker", "--id", "worker-a", "--run", "order-9",
        ],
        b"step charge-card\nwait\nexit\n",
    );
    assert_eq!(worker.status.code(), Some(0), "{}", stdout(&worker));
    assert!(
        stdout(&worker).contains("\"fence\":100000000000001"),
        "{}",
        stdout(&worker)
    );
    let ledger = test_worker(&base, &["ledger", "order-9", "--json"], b"");
    assert_eq!(ledger.status.code(), Some(0), "{}", stdout(&ledger));
    let entries: serde_json::Value = serde_json::from_str(&stdout(&ledger)).expect("ledger JSON");
    assert_eq!(
        entries[0]["fence"].as_u64(),
        Some(100_000_000_000_001),
        "{entries}"
    );
    assert_eq!(entries[0]["effect"], "charge-card");
    assert_eq!(entries[0]["worker"], "worker-a");
}
