//! The `lease` binary as a user runs it: the demo, operator commands against the memory store
//! and a real PostgreSQL, and the exit codes and messages of bad input.

use std::process::{Command, Output};

use lease_conformance::fixtures::{unavailable, PostgresServer, RedisServer};

const NOT_FOUND: i32 = 3;
const REFUSED: i32 = 4;
const UNAVAILABLE: i32 = 5;
const USAGE: i32 = 2;

fn lease(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lease"))
        .args(args)
        .env_remove("LEASE_STORE")
        .env_remove("LEASE_NAMESPACE")
        .env_remove("LEASE_TTL_MS")
        .env_remove("LEASE_HEARTBEAT_MS")
        .output()
        .expect("run lease")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
}

#[test]
fn demo_shows_the_stale_write_rejected_by_fence_and_one_effect() {
    let out = lease(&["demo"]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("claims demo-"), "{text}");
    assert!(text.contains("fence 1"), "{text}");
    assert!(
        text.contains("scope is cancelled: local deadline"),
        "{text}"
    );
    assert!(text.contains(": fence 2"), "{text}");
    assert!(
        text.contains("rejected: StaleFence { presented: 1, current: 2 }"),
        "{text}"
    );
    assert!(
        text.contains("exactly one \"effect: charge card\""),
        "{text}"
    );
}

#[test]
fn operator_commands_on_the_memory_store_report_missing_runs() {
    // Each `memory:` process starts empty: there is nothing to inspect or release.
    let out = lease(&["inspect", "order-1"]);
    assert_exit(&out, NOT_FOUND);
    assert_eq!(stderr(&out).trim(), "lease: run order-1 not found");
    assert_exit(&lease(&["release", "order-1", "--force"]), NOT_FOUND);
    assert_exit(&lease(&["resume", "order-1", "--json"]), NOT_FOUND);
    let out = lease(&["list", "--json"]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out).trim(), "[]");
    let out = lease(&["create", "order-1", "--json"]);
    assert_exit(&out, 0);
    let record: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        (record["state"].as_str(), record["fence"].as_u64()),
        (Some("runnable"), Some(0))
    );
}

#[test]
fn bad_input_gets_its_exit_code_and_one_sentence() {
    let cases: &[(&[&str], i32, &str)] = &[
        (&["inspect", ""], USAGE, "run id is empty"),
        (&["inspect", "a\nb"], USAGE, "control character"),
        (&["--ttl-ms", "0", "inspect", "r"], USAGE, "TTL"),
        (&["release", "r"], USAGE, "needs --force"),
        (
            &["--store", "mysql://app:hunter2@db/runs", "inspect", "r"],
            USAGE,
            "unknown store scheme \"mysql\"",
        ),
        (
            &["--store", "postgres://app:hunter2@/runs", "inspect", "r"],
            USAGE,
            "malformed store URL",
        ),
        (
            &["--store", "redis://app:hunter2@127.0.0.1:1", "inspect", "r"],
            UNAVAILABLE,
            "unavailable: ",
        ),
        (
            &[
                "--store",
                "postgres://app:hunter2@127.0.0.1:1/runs",
                "inspect",
                "r",
            ],
            UNAVAILABLE,
            "unavailable: ",
        ),
        (
            &["--store", "memory:", "migrate"],
            USAGE,
            "postgres:// store only",
        ),
    ];
    for (args, code, says) in cases {
        let out = lease(args);
        assert_exit(&out, *code);
        let err = stderr(&out);
        assert!(err.contains(says), "{args:?}: {err}");
        if *code == UNAVAILABLE {
            // The server's own reason, at once, not a pool timeout.
            assert!(err.contains("Connection refused"), "{args:?}: {err}");
        }
        assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");
        assert!(
            !err.contains("hunter2") && !stdout(&out).contains("hunter2"),
            "{err}"
        );
    }
}

/// A bad namespace is bad input on every backend alike: exit 2 and one sentence naming the
/// rule, before any connection (the servers named here do not exist).
#[test]
fn a_bad_namespace_exits_2_naming_the_rule_on_every_backend() {
    for store in [
        "memory:",
        "redis://127.0.0.1:1",
        "postgres://app@127.0.0.1:1/runs",
    ] {
        for ns in ["a}b", "{a}", "a:b", "a b"] {
            let out = lease(&["--store", store, "--namespace", ns, "list"]);
            assert_exit(&out, USAGE);
            let err = stderr(&out);
            assert!(
                err.contains("1 to 63 ASCII letters, digits, '_', '-' or '.'"),
                "{store} {ns:?}: {err}"
            );
            assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");
        }
    }
}

fn postgres() -> Option<(PostgresServer, String)> {
    match PostgresServer::start() {
        Ok(server) => {
            let url = server.url();
            Some((server, url))
        }
        Err(why) => unavailable(
            "postgres",
            why,
            "install postgresql (bash scripts/test.sh does it)",
        ),
    }
}

fn redis() -> Option<RedisServer> {
    RedisServer::start().map_or_else(
        |why| {
            unavailable(
                "redis",
                why,
                "install redis-server (bash scripts/test.sh does it)",
            )
        },
        Some,
    )
}

#[test]
fn operator_commands_on_postgres_show_and_hand_over_a_run() {
    let Some((server, url)) = postgres() else {
        return;
    };
    let base = ["--store", url.as_str(), "--namespace", "cli_ops"];
    let with = |args: &[&str]| lease(&[&base[..], args].concat());

    assert_exit(&with(&["migrate"]), 0);
    assert_exit(&with(&["create", "order-7"]), 0);
    // A worker claims (fence 1) and exits without releasing: the lease stays held.
    let mut worker = Command::new(env!("CARGO_BIN_EXE_lease"))
        .args(base)
        .args([
            "--ttl-ms", "60000", "worker", "--id", "worker-a", "--run", "order-7",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run the worker");
    assert_exit(&worker, 0);
    assert!(
        stdout(&worker).contains("\"fence\":1"),
        "{}",
        stdout(&worker)
    );

    let out = with(&["inspect", "order-7", "--json"]);
    assert_exit(&out, 0);
    let record: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(record["owner"], "worker-a");
    assert_eq!(record["fence"], 1);
    assert!(
        record["remaining_ms"].as_i64().unwrap() > 50_000,
        "{record}"
    );
    let table = stdout(&with(&["inspect", "order-7"]));
    assert!(table.starts_with("RUN"), "{table}");
    assert!(
        table.contains("order-7") && table.contains("worker-a"),
        "{table}"
    );

    let out = with(&["list", "--state", "runnable", "--json"]);
    assert_exit(&out, 0);
    let runs: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(stdout(&with(&["list", "--expired", "--json"])).trim(), "[]");

    let out = with(&["resume", "order-7"]);
    assert_exit(&out, REFUSED);
    assert!(
        stderr(&out).contains("is runnable, not suspended"),
        "{}",
        stderr(&out)
    );

    let out = with(&["release", "order-7", "--force"]);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains("released order-7 from worker-a (fence 1)"),
        "{}",
        stdout(&out)
    );
    // The next claim takes fence 2, which fences worker-a out.
    worker = Command::new(env!("CARGO_BIN_EXE_lease"))
        .args(base)
        .args(["worker", "--id", "worker-b", "--run", "order-7"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run the worker");
    assert_exit(&worker, 0);
    assert!(
        stdout(&worker).contains("\"fence\":2"),
        "{}",
        stdout(&worker)
    );

    let out = with(&["inspect", "missing"]);
    assert_exit(&out, NOT_FOUND);

    // A wrong password: one sentence, no password.
    let wrong = server
        .password_url()
        .replace(server.password(), "not-the-password");
    let out = lease(&["--store", &wrong, "inspect", "order-7"]);
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0));
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("password authentication failed"), "{err}");
    assert!(
        !err.contains("not-the-password") && !err.contains(server.password()),
        "{err}"
    );
}

/// `redis-cli -p PORT ARGS…`, its output trimmed.
fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("run redis-cli");
    assert!(out.status.success(), "redis-cli {args:?}: {}", stderr(&out));
    stdout(&out).trim().to_string()
}

/// Rewrites the fence (the second field) of `run`'s record in the namespace's runs hash.
fn set_fence(port: u16, namespace: &str, run: &str, fence: &str) {
    let key = format!("{{lease:{namespace}}}:runs");
    let field: String = run.bytes().map(|b| format!("{b:02x}")).collect();
    let value = redis_cli(port, &["HGET", &key, &field]);
    let mut parts: Vec<&str> = value.splitn(6, ':').collect();
    assert_eq!(parts.len(), 6, "record {value:?}");
    parts[1] = fence;
    redis_cli(port, &["HSET", &key, &field, &parts.join(":")]);
}

/// Fences are exact up to the last one (i64::MAX) in the reference worker's Redis ledger and in
/// the operator's messages: an effect written under fence 100000000000001 reads back as that
/// integer (a Lua number would make it 1e+14), and force-releasing a run at the last fence says
/// it can never be claimed again instead of naming a fence that does not exist.
#[test]
fn fences_stay_exact_to_the_last_one_in_the_redis_ledger_and_messages() {
    let Some(server) = redis() else {
        return;
    };
    let port = server.port();
    let url = format!("redis://127.0.0.1:{port}");
    let base = ["--store", url.as_str(), "--namespace", "cli_fences"];
    let with = |args: &[&str]| lease(&[&base[..], args].concat());
    assert_exit(&with(&["create", "order-9"]), 0);
    set_fence(port, "cli_fences", "order-9", "100000000000000");

    let mut worker = Command::new(env!("CARGO_BIN_EXE_lease"))
        .args(base)
        .args([
            "--ttl-ms", "60000", "worker", "--id", "worker-a", "--run", "order-9",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run the worker");
    {
        use std::io::Write;
        let mut stdin = worker.stdin.take().expect("stdin");
        stdin.write_all(b"step charge-card\nwait\nexit\n").unwrap();
    }
    let worker = worker.wait_with_output().expect("worker output");
    assert_exit(&worker, 0);
    assert!(
        stdout(&worker).contains("\"fence\":100000000000001"),
        "{}",
        stdout(&worker)
    );
    let ledger = with(&["ledger", "order-9", "--json"]);
    assert_exit(&ledger, 0);
    let entries: serde_json::Value = serde_json::from_str(&stdout(&ledger)).expect("ledger JSON");
    assert_eq!(
        entries[0]["fence"].as_u64(),
        Some(100_000_000_000_001),
        "{entries}"
    );
    assert_eq!(entries[0]["effect"], "charge-card");

    // The worker exited holding the run; move it to the last fence and take it back.
    set_fence(port, "cli_fences", "order-9", "9223372036854775807");
    let released = with(&["release", "order-9", "--force"]);
    assert_exit(&released, 0);
    let said = stdout(&released);
    assert!(!said.contains("9223372036854775808"), "{said}");
    assert!(said.contains("never be claimed again"), "{said}");
    let refused = lease(
        &[
            &base[..],
            &["worker", "--id", "worker-b", "--run", "order-9"],
        ]
        .concat(),
    );
    assert_exit(&refused, REFUSED);
    assert!(stderr(&refused).contains("fence"), "{}", stderr(&refused));
}

/// `lease list` pages through the store, 1,000 records a call, and prints every page: past
/// one page and past the store's 10,000-per-call cap, `--limit` is the total printed, the JSON
/// is one array in id order without repeats, and a filter matching runs far apart finds each.
#[test]
fn list_streams_pages_until_the_limit_or_the_end() {
    let Some(server) = redis() else {
        return;
    };
    let url = server.url();
    let runs: Vec<distribution::RunId> = (0..12_345)
        .map(|i| distribution::RunId::new(format!("run-{i:05}")).unwrap())
        .collect();
    let suspended = ["run-00000", "run-04999", "run-12344"];
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let config = distribution::Config::default()
            .with_store(url.clone())
            .with_namespace("cli_pages");
        let store = distribution::connect(&config).await.unwrap();
        for chunk in runs.chunks(1_000) {
            for created in store.create_many(chunk).await.unwrap() {
                created.unwrap();
            }
        }
        let worker = distribution::WorkerId::new("worker-a").unwrap();
        for run in suspended {
            let run = distribution::RunId::new(run).unwrap();
            let lease = store
                .claim(&run, &worker, distribution::Ttl::from_secs(60).unwrap())
                .await
                .unwrap();
            store.suspend(&lease).await.unwrap();
        }
    });
    let base = ["--store", url.as_str(), "--namespace", "cli_pages"];
    let with = |args: &[&str]| lease(&[&base[..], args].concat());
    let ids = |out: &Output| -> Vec<String> {
        assert_exit(out, 0);
        let records: Vec<serde_json::Value> = serde_json::from_str(&stdout(out)).unwrap();
        records
            .iter()
            .map(|r| r["run"].as_str().unwrap().to_owned())
            .collect()
    };
    let all: Vec<String> = runs.iter().map(ToString::to_string).collect();

    assert_eq!(ids(&with(&["list", "--json"])), all[..100]);
    assert_eq!(
        ids(&with(&["list", "--limit", "2500", "--json"])),
        all[..2500]
    );
    assert_eq!(ids(&with(&["list", "--limit", "20000", "--json"])), all);
    assert_eq!(
        ids(&with(&["list", "--state", "suspended", "--json"])),
        suspended
    );
    assert_eq!(
        ids(&with(&[
            "list",
            "--state",
            "suspended",
            "--limit",
            "2",
            "--json"
        ])),
        suspended[..2]
    );

    let out = with(&["list", "--limit", "1001"]);
    assert_exit(&out, 0);
    let table = stdout(&out);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 1 + 1001, "a header and 1,001 rows");
    assert!(lines[0].starts_with("RUN"), "{}", lines[0]);
    assert!(lines[1001].starts_with("run-01000 "), "{}", lines[1001]);

    let out = with(&["list", "--limit", "0"]);
    assert_exit(&out, USAGE);
    assert!(
        stderr(&out).contains("--limit must be at least 1"),
        "{}",
        stderr(&out)
    );
}
