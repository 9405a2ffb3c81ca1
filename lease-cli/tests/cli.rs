//! The `lease` binary as a user runs it: the demo, operator commands against the memory store
//! and a real PostgreSQL, `lease run -- CMD`, and the exit codes and messages of bad input.

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use distribution::{Config, LeaseStore, RunId, Ttl, WorkerId};

use lease_conformance::fixtures::{unavailable, RedisServer};

mod common;

use common::postgres;

const NOT_FOUND: i32 = 3;
const REFUSED: i32 = 4;
const UNAVAILABLE: i32 = 5;
const USAGE: i32 = 2;
const LEASE_LOST: i32 = 6;

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
    let memory = |args: &[&str]| {
        let mut all = vec!["--store", "memory:"];
        all.extend_from_slice(args);
        lease(&all)
    };
    let out = memory(&["inspect", "order-1"]);
    assert_exit(&out, NOT_FOUND);
    assert_eq!(stderr(&out).trim(), "lease: run order-1 not found");
    assert_exit(&memory(&["release", "order-1", "--force"]), NOT_FOUND);
    assert_exit(&memory(&["resume", "order-1", "--json"]), NOT_FOUND);
    // NDJSON: no runs, no lines.
    let out = memory(&["list", "-o", "json"]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), "");
    let out = memory(&["list"]);
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("(no runs)"), "{}", stdout(&out));
    let out = memory(&["create", "order-1", "--json"]);
    assert_exit(&out, 0);
    let record: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        (record["state"].as_str(), record["fence"].as_u64()),
        (Some("runnable"), Some(0))
    );
    assert_eq!(record["not_before_us"], serde_json::Value::Null, "{record}");
    // A start delay: the record says when the run becomes claimable.
    let out = memory(&["create", "order-2", "--delay", "90s", "-o", "json"]);
    assert_exit(&out, 0);
    let record: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let left = record["claimable_in_ms"].as_i64().unwrap_or(0);
    assert!((89_000..=90_000).contains(&left), "{record}");
    // Over 366 days, or no unit: refused before the store, naming the rule.
    let out = memory(&["create", "order-3", "--delay", "367d"]);
    assert_exit(&out, USAGE);
    assert!(stderr(&out).contains("start delay"), "{}", stderr(&out));
    assert_exit(&memory(&["create", "order-3", "--delay", "90"]), USAGE);
}

/// There is no default store: every command that reaches one exits 2 with one sentence naming
/// LEASE_STORE and --store when none is configured (before, `lease list` answered "(no runs)"
/// and `lease run --create -- CMD` ran CMD on a private store of its own, on every host), and
/// the command of `lease run` never starts. `lease run` refuses `memory:` even written out;
/// `lease demo` runs on the embedded store without a flag.
#[test]
fn without_a_store_every_command_that_needs_one_exits_2_naming_lease_store() {
    let marker = std::env::temp_dir().join(format!("lease-no-store-{}", std::process::id()));
    let touch = format!("touch {}", marker.display());
    let commands: &[&[&str]] = &[
        &["list"],
        &["inspect", "nightly"],
        &["create", "nightly"],
        &["journal", "nightly"],
        &["resume", "nightly"],
        &["release", "nightly", "--force"],
        &["purge", "--older-than", "7d"],
        &["migrate"],
        &["run", "nightly", "--create", "--", "sh", "-c", &touch],
    ];
    for args in commands {
        let out = lease(args);
        assert_exit(&out, USAGE);
        let err = stderr(&out);
        assert!(
            err.contains("no store configured")
                && err.contains("LEASE_STORE")
                && err.contains("--store"),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");
        assert_eq!(stdout(&out), "", "{args:?} printed something");
    }
    let out = lease(&[
        "--store", "memory:", "run", "nightly", "--create", "--", "sh", "-c", &touch,
    ]);
    assert_exit(&out, USAGE);
    let err = stderr(&out);
    assert!(
        err.contains("memory: lives inside this one process") && err.contains("LEASE_STORE"),
        "{err}"
    );
    assert!(
        !marker.exists(),
        "lease run started its command without a store every host shares"
    );
    // The demo needs no store.
    assert_exit(&lease(&["demo"]), 0);
}

#[test]
fn bad_input_gets_its_exit_code_and_one_sentence() {
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["--store", "memory:", "inspect", ""],
            USAGE,
            "run id is empty",
        ),
        (
            &["--store", "memory:", "inspect", "a\nb"],
            USAGE,
            "control character",
        ),
        (&["--ttl-ms", "0", "inspect", "r"], USAGE, "TTL"),
        (
            &["--store", "memory:", "release", "r"],
            USAGE,
            "needs --force",
        ),
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
        (&["list"], USAGE, "no store configured"),
        (
            &["--store", "memory:", "signal", "lst1.!!", "--payload", "x"],
            USAGE,
            "signal token refused: its body is not base64url",
        ),
        (
            &[
                "--store",
                "memory:",
                "signal",
                "https://shop/approve",
                "--payload",
                "x",
            ],
            USAGE,
            "does not start with lst1.",
        ),
        (
            // A well-formed token of a run the (empty) store does not have.
            &[
                "--store",
                "memory:",
                "signal",
                "lst1.AAAAAAAAAAEIYXBwcm92YWxvcmRlci0x",
            ],
            NOT_FOUND,
            "run order-1 not found",
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

/// Each line of the output as a JSON object (NDJSON).
fn ndjson(out: &Output) -> Vec<serde_json::Value> {
    stdout(out)
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not one JSON object: {line:?}: {e}"))
        })
        .collect()
}

fn id(run: &str) -> RunId {
    RunId::new(run).unwrap()
}

fn worker(name: &str) -> WorkerId {
    WorkerId::new(name).unwrap()
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

/// The test's own connection to the store, and a runtime to drive it.
fn admin(url: &str, namespace: &str) -> (tokio::runtime::Runtime, Arc<dyn LeaseStore>) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = Config::default().with_store(url).with_namespace(namespace);
    let store = rt.block_on(distribution::connect(&config)).unwrap();
    (rt, store)
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

/// `inspect`, `list` and `journal` run no DDL: on a schema nobody migrated they create
/// nothing and say to run `lease migrate`; after it they work.
#[test]
fn read_only_commands_never_create_the_schema() {
    let Some((server, url)) = postgres() else {
        return;
    };
    let base = ["--store", url.as_str(), "--namespace", "cli_readonly"];
    let with = |args: &[&str]| lease(&[&base[..], args].concat());
    for args in [&["inspect", "r"][..], &["list"], &["journal", "r"]] {
        let out = with(args);
        assert_exit(&out, USAGE);
        let message = stderr(&out);
        assert!(
            message.contains("has no migrations") && message.contains("lease migrate"),
            "{args:?}: {message}"
        );
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let probe = Config::default()
        .with_store(url.as_str())
        .with_namespace("cli_readonly_probe");
    let schemas: i64 = rt.block_on(async {
        let Ok(distribution::Store::Postgres(pg)) = distribution::connect_store(&probe).await
        else {
            panic!("a postgres store");
        };
        distribution::postgres::sqlx::query_scalar(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'cli_readonly'",
        )
        .fetch_one(pg.pool())
        .await
        .unwrap()
    });
    assert_eq!(schemas, 0, "a read-only command created the schema");
    assert_exit(&with(&["migrate"]), 0);
    assert_exit(&with(&["inspect", "r"]), NOT_FOUND);
    assert_exit(&with(&["list"]), 0);
    drop(server);
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
    // A worker claims (fence 1) and goes away without releasing: the lease stays held.
    let (rt, store) = admin(&url, "cli_ops");
    let held = rt
        .block_on(store.claim(&id("order-7"), &worker("worker-a"), ttl(60_000)))
        .unwrap();
    assert_eq!(held.fence().get(), 1);

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
    let runs = ndjson(&out);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["owner"], "worker-a");
    assert_eq!(stdout(&with(&["list", "--expired", "-o", "json"])), "");

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
    let out = with(&["run", "order-7", "--", "sh", "-c", "echo $LEASE_FENCE"]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), "2\n");
    let stale = rt.block_on(store.append(&held, b"late")).unwrap_err();
    assert!(
        matches!(
            stale,
            distribution::Error::StaleFence {
                presented: 1,
                current: 2,
                ..
            }
        ),
        "{stale}"
    );
    drop(rt);

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

/// Fences are exact up to the last one (i64::MAX) in `lease run`'s environment and in the
/// operator's messages: a claim at fence 100000000000001 hands the command exactly that (a Lua
/// number would make it 1e+14), and force-releasing a run at the last fence says it can never
/// be claimed again instead of naming a fence that does not exist.
#[test]
fn fences_stay_exact_to_the_last_one_in_lease_run_and_messages() {
    let Some(server) = redis() else {
        return;
    };
    let port = server.port();
    let url = format!("redis://127.0.0.1:{port}");
    let base = ["--store", url.as_str(), "--namespace", "cli_fences"];
    let with = |args: &[&str]| lease(&[&base[..], args].concat());
    assert_exit(&with(&["create", "order-9"]), 0);
    set_fence(port, "cli_fences", "order-9", "100000000000000");

    let out = with(&["run", "order-9", "--", "sh", "-c", "echo $LEASE_FENCE"]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), "100000000000001\n");

    // A worker holds the run; move it to the last fence and take it back.
    let (rt, store) = admin(&url, "cli_fences");
    rt.block_on(store.claim(&id("order-9"), &worker("worker-a"), ttl(60_000)))
        .unwrap();
    set_fence(port, "cli_fences", "order-9", "9223372036854775807");
    let released = with(&["release", "order-9", "--force"]);
    assert_exit(&released, 0);
    let said = stdout(&released);
    assert!(!said.contains("9223372036854775808"), "{said}");
    assert!(said.contains("never be claimed again"), "{said}");
    let refused = with(&["run", "order-9", "--", "true"]);
    assert_exit(&refused, REFUSED);
    assert!(
        stderr(&refused).contains("has used every fence up to the maximum"),
        "{}",
        stderr(&refused)
    );
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
        ndjson(out)
            .iter()
            .map(|r| r["run"].as_str().unwrap().to_owned())
            .collect()
    };
    let all: Vec<String> = runs.iter().map(ToString::to_string).collect();

    assert_eq!(ids(&with(&["list", "--json"])), all[..100]);
    assert_eq!(ids(&with(&["-o", "json", "list"])), all[..100]);
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

/// `lease run` starts the command with the run and its fence in the environment, exits with
/// the command's code (128 + N for a death by signal N, 127 for a command not found), and
/// refuses a kill grace that does not fit in the TTL before touching the store.
#[test]
fn lease_run_passes_the_lease_in_the_environment_and_the_exit_code_through() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let base = ["--store", url.as_str(), "--namespace", "cli_env"];
    let lease = |args: &[&str]| lease(&[&base[..], args].concat());
    let out = lease(&[
        "run",
        "nightly",
        "--create",
        "--",
        "sh",
        "-c",
        "echo \"$LEASE_RUN $LEASE_FENCE\"; exit 7",
    ]);
    assert_exit(&out, 7);
    assert_eq!(stdout(&out), "nightly 1\n");

    let out = lease(&["run", "nightly", "--create", "--", "sh", "-c", "kill -9 $$"]);
    assert_exit(&out, 128 + 9);

    let out = lease(&["run", "nightly", "--create", "--", "/no/such/command"]);
    assert_exit(&out, 127);
    assert!(
        stderr(&out).contains("cannot start /no/such/command"),
        "{}",
        stderr(&out)
    );

    let out = lease(&["run", "never-created", "--", "true"]);
    assert_exit(&out, NOT_FOUND);
    assert_eq!(stderr(&out).trim(), "lease: run never-created not found");

    let out = lease(&[
        "--ttl-ms",
        "1500",
        "run",
        "nightly",
        "--create",
        "--kill-after-ms",
        "750",
        "--",
        "true",
    ]);
    assert_exit(&out, USAGE);
    let err = stderr(&out);
    assert!(
        err.contains("--kill-after-ms 750 does not fit in the TTL of 1500 ms"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");

    let out = lease(&["run", "nightly", "--create"]);
    assert_exit(&out, USAGE);
    let out = lease(&["-o", "json", "run", "nightly", "--create", "--", "true"]);
    assert_exit(&out, USAGE);
    assert!(
        stderr(&out).contains("-o json does not apply to lease run"),
        "{}",
        stderr(&out)
    );
}

/// A run held by someone else is refused with the holder's name and exit 4, and the command
/// never starts; with --wait-ms it is claimed as soon as the holder's lease expires, under the
/// next fence; by default the lease is released after the command, with --complete the run is
/// completed on exit 0.
#[test]
fn lease_run_refuses_a_held_run_or_waits_for_it_and_ends_the_lease_after() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let base = ["--store", url.as_str(), "--namespace", "cli_run"];
    let with = |args: &[&str]| lease(&[&base[..], args].concat());
    let (rt, store) = admin(&url, "cli_run");
    rt.block_on(store.create(&id("job"))).unwrap();
    rt.block_on(store.claim(&id("job"), &worker("holder"), ttl(60_000)))
        .unwrap();

    let marker = std::env::temp_dir().join(format!("lease-run-{}", std::process::id()));
    let touch = format!("touch {}", marker.display());
    let out = with(&["run", "job", "--", "sh", "-c", &touch]);
    assert_exit(&out, REFUSED);
    let err = stderr(&out);
    assert!(
        err.starts_with("lease: run job is held by holder for another "),
        "{err}"
    );
    assert!(err.contains("(--wait-ms MS waits for it)"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");
    let out = with(&["run", "job", "--wait-ms", "300", "--", "sh", "-c", &touch]);
    assert_exit(&out, REFUSED);
    assert!(
        stderr(&out).contains("after waiting 300 ms"),
        "{}",
        stderr(&out)
    );
    assert!(!marker.exists(), "the command ran without the lease");

    // A holder whose lease expires in a second: --wait-ms takes the run when the store allows.
    rt.block_on(store.force_release(&id("job"))).unwrap();
    rt.block_on(store.claim(&id("job"), &worker("holder"), ttl(1_000)))
        .unwrap();
    let out = with(&[
        "run",
        "job",
        "--wait-ms",
        "20000",
        "--id",
        "cron-b",
        "--",
        "sh",
        "-c",
        "echo $LEASE_FENCE",
    ]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), "3\n");
    let record = rt.block_on(store.inspect(&id("job"))).unwrap();
    assert_eq!(
        (record.state, record.owner, record.fence.get()),
        (distribution::RunState::Runnable, None, 3),
        "released after the command"
    );

    // --complete: a failing command still releases, a succeeding one completes.
    assert_exit(&with(&["run", "job", "--complete", "--", "false"]), 1);
    let record = rt.block_on(store.inspect(&id("job"))).unwrap();
    assert_eq!(
        (record.state, record.fence.get()),
        (distribution::RunState::Runnable, 4)
    );
    // ... and leaves the failed attempt, with its exit code, in the run's history.
    let shown = with(&["inspect", "job", "-o", "json"]);
    assert_exit(&shown, 0);
    let record: serde_json::Value = serde_json::from_str(&stdout(&shown)).unwrap();
    let last = record["history"].as_array().and_then(|h| h.last()).cloned();
    let last = last.unwrap_or_else(|| panic!("a history: {record}"));
    assert_eq!(
        (&last["fence"], &last["outcome"], &last["error"]),
        (
            &serde_json::json!(4),
            &serde_json::json!("retried"),
            &serde_json::json!("the command exited with 1")
        ),
        "{record}"
    );
    assert!(
        last["worker"].as_str().is_some_and(|w| !w.is_empty()),
        "{last}"
    );
    let outcomes: Vec<&str> = record["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["outcome"].as_str())
        .collect();
    assert_eq!(
        outcomes,
        ["force-released", "expired", "released", "retried"],
        "the operator's release, the holder whose lease ran out, --wait-ms's run, this one"
    );
    assert!(
        last["ended_at_us"].as_u64() >= last["claimed_at_us"].as_u64(),
        "{last}"
    );
    let text = stdout(&with(&["inspect", "job"]));
    assert!(
        text.contains("attempt 3 fence 4 by ") && text.contains(": \"the command exited with 1\""),
        "{text}"
    );
    assert_exit(&with(&["run", "job", "--complete", "--", "true"]), 0);
    let record = rt.block_on(store.inspect(&id("job"))).unwrap();
    assert_eq!(
        (record.state, record.fence.get()),
        (distribution::RunState::Completed, 5)
    );
    let out = with(&["run", "job", "--", "true"]);
    assert_exit(&out, REFUSED);
    assert!(
        stderr(&out).contains("run job is completed"),
        "{}",
        stderr(&out)
    );
}

/// When the store refuses a renewal (an operator took the run over and someone claimed it),
/// `lease run` stops the command, SIGKILL after the grace for one that ignores SIGTERM, and
/// exits 6 saying why.
#[test]
fn lease_run_kills_the_command_when_the_lease_is_taken_and_exits_6() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let (rt, store) = admin(&url, "cli_lost");
    let child = Command::new(env!("CARGO_BIN_EXE_lease"))
        .args([
            "--store",
            &url,
            "--namespace",
            "cli_lost",
            "--ttl-ms",
            "1500",
        ])
        .args([
            "run",
            "job",
            "--create",
            "--id",
            "cron-a",
            "--kill-after-ms",
            "200",
        ])
        .args([
            "--",
            "sh",
            "-c",
            "trap '' TERM; while :; do sleep 0.05; done",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start lease run");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let record = rt.block_on(store.inspect(&id("job")));
        if record.is_ok_and(|r| r.heartbeats > 0) {
            break; // claimed and renewing
        }
        assert!(
            std::time::Instant::now() < deadline,
            "lease run never claimed and renewed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    rt.block_on(store.force_release(&id("job"))).unwrap();
    let intruder = rt
        .block_on(store.claim(&id("job"), &worker("intruder"), ttl(60_000)))
        .unwrap();
    assert_eq!(intruder.fence().get(), 2);
    let out = child.wait_with_output().expect("lease run exits");
    assert_exit(&out, LEASE_LOST);
    let err = stderr(&out);
    assert!(
        err.contains("lost the lease on run job under fence 1 (renewal rejected: stale fence"),
        "{err}"
    );
    assert!(err.contains("stopped with SIGKILL"), "{err}");
}

/// `lease cancel` on a run a `lease run` holds: the command is stopped and `lease run` exits
/// 6 naming the cancel; the record shows the state and the reason; a later `lease run` is
/// refused; a second cancel changes nothing; a missing run and a bad reason get their codes.
#[test]
fn lease_cancel_stops_the_holding_lease_run_and_ends_the_run_for_good() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let base = ["--store", url.as_str(), "--namespace", "cli_cancel"];
    let with = |args: &[&str]| lease(&[&base[..], args].concat());
    let (rt, store) = admin(&url, "cli_cancel");
    let child = Command::new(env!("CARGO_BIN_EXE_lease"))
        .args(base)
        .args(["--ttl-ms", "1500"])
        .args([
            "run",
            "job",
            "--create",
            "--id",
            "cron-a",
            "--kill-after-ms",
            "200",
        ])
        .args(["--", "sh", "-c", "while :; do sleep 0.05; done"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start lease run");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !rt
        .block_on(store.inspect(&id("job")))
        .is_ok_and(|r| r.heartbeats > 0)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "lease run never claimed and renewed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let cancel = with(&["cancel", "job", "--reason", "not needed today"]);
    assert_exit(&cancel, 0);
    assert!(
        stdout(&cancel).contains("cancelled job; its holder cron-a (fence 1) is fenced out"),
        "{}",
        stdout(&cancel)
    );
    let out = child.wait_with_output().expect("lease run exits");
    assert_exit(&out, LEASE_LOST);
    let err = stderr(&out);
    assert!(
        err.contains("lost the lease on run job under fence 1")
            && err.contains("the run was cancelled"),
        "{err}"
    );

    let shown = with(&["inspect", "job", "-o", "json"]);
    assert_exit(&shown, 0);
    let record: serde_json::Value = serde_json::from_str(&stdout(&shown)).unwrap();
    assert_eq!(record["state"], "cancelled", "{record}");
    assert_eq!(record["reason"], "not needed today", "{record}");
    assert_eq!(record["owner"], serde_json::Value::Null, "{record}");

    let again = with(&["run", "job", "--", "true"]);
    assert_exit(&again, REFUSED);
    assert!(
        stderr(&again).contains("run job was cancelled"),
        "{}",
        stderr(&again)
    );
    let twice = with(&["cancel", "job", "--reason", "another"]);
    assert_exit(&twice, 0);
    assert!(
        stdout(&twice).contains("job was already cancelled"),
        "{}",
        stdout(&twice)
    );
    assert_exit(&with(&["cancel", "missing", "--reason", "x"]), NOT_FOUND);
    let bad = with(&["cancel", "job", "--reason", "bell\u{7}"]);
    assert_exit(&bad, USAGE);
    let listed = with(&["list", "--state", "cancelled", "-o", "json"]);
    assert_exit(&listed, 0);
    let runs: Vec<_> = ndjson(&listed).iter().map(|r| r["run"].clone()).collect();
    assert_eq!(runs, ["job"]);
}

/// `lease journal RUN` prints the journal in order with each entry's fence: a table, or one
/// JSON object per line with `-o json` (the deprecated `--json` prints the same).
#[test]
fn lease_journal_prints_each_entry_with_its_fence() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let base = ["--store", url.as_str(), "--namespace", "cli_journal"];
    let with = |args: &[&str]| lease(&[&base[..], args].concat());
    let (rt, store) = admin(&url, "cli_journal");
    rt.block_on(store.create(&id("order"))).unwrap();
    let first = rt
        .block_on(store.claim(&id("order"), &worker("a"), ttl(60_000)))
        .unwrap();
    rt.block_on(store.append(&first, b"charged card")).unwrap();
    rt.block_on(store.force_release(&id("order"))).unwrap();
    let second = rt
        .block_on(store.claim(&id("order"), &worker("b"), ttl(60_000)))
        .unwrap();
    rt.block_on(store.append(&second, &[0xff, 0xfe])).unwrap();

    let out = with(&["-o", "json", "journal", "order"]);
    assert_exit(&out, 0);
    let entries = ndjson(&out);
    assert_eq!(entries.len(), 2, "{}", stdout(&out));
    assert_eq!(
        (entries[0]["seq"].as_u64(), entries[0]["fence"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(entries[0]["payload"], "charged card");
    assert_eq!(entries[1]["fence"], 2);
    assert_eq!(entries[1]["payload_hex"], "fffe");
    assert_eq!(stdout(&with(&["journal", "order", "--json"])), stdout(&out));

    let out = with(&["journal", "order"]);
    assert_exit(&out, 0);
    let table = stdout(&out);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("SEQ"), "{table}");
    assert!(
        lines[1].starts_with("1 ") && lines[1].ends_with("charged card"),
        "{table}"
    );
    assert!(lines[2].ends_with("(not UTF-8) fffe"), "{table}");
    assert_exit(&with(&["journal", "missing"]), NOT_FOUND);
}

/// `lease create --payload TEXT` and `--payload-file FILE|-` store the bytes exactly; `lease
/// inspect` shows them (`payload` when UTF-8, `payload_hex` when not; the table line escapes
/// control characters); a claim hands them to the worker. Over 64 KiB, or both flags, is
/// refused before the store with exit 2, and nothing is created.
#[test]
fn lease_create_takes_a_payload_and_inspect_shows_it() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let base = ["--store", url.as_str(), "--namespace", "cli_payload"];
    let with = |args: &[&str]| lease(&[&base[..], args].concat());
    let out = with(&[
        "create",
        "charge-1",
        "--payload",
        r#"{"amount":12}"#,
        "-o",
        "json",
    ]);
    assert_exit(&out, 0);
    let record: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(record["payload"], r#"{"amount":12}"#, "{record}");
    assert_eq!(record["payload_bytes"], 13);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payload.bin");
    std::fs::write(&file, b"\x1b[31m\xff\x00").unwrap();
    let path = file.to_str().unwrap();
    assert_exit(&with(&["create", "charge-2", "--payload-file", path]), 0);
    let record: serde_json::Value =
        serde_json::from_str(&stdout(&with(&["inspect", "charge-2", "-o", "json"]))).unwrap();
    assert_eq!(
        (&record["payload"], &record["payload_hex"]),
        (
            &serde_json::Value::Null,
            &serde_json::json!("1b5b33316dff00")
        )
    );
    std::fs::write(&file, b"line\tone\x1b[2J").unwrap();
    assert_exit(&with(&["create", "charge-3", "--payload-file", path]), 0);
    let table = stdout(&with(&["inspect", "charge-3"]));
    assert!(
        table.contains(r#"payload (12 bytes): "line\tone\u{1b}[2J""#),
        "{table}"
    );
    let (rt, store) = admin(&url, "cli_payload");
    let lease = rt
        .block_on(store.claim(&id("charge-3"), &worker("w"), ttl(60_000)))
        .unwrap();
    assert_eq!(lease.payload(), Some(&b"line\tone\x1b[2J"[..]));

    std::fs::write(&file, vec![b'x'; distribution::MAX_RUN_PAYLOAD_BYTES + 1]).unwrap();
    let out = with(&["create", "charge-4", "--payload-file", path]);
    assert_exit(&out, USAGE);
    assert_eq!(
        stderr(&out).trim(),
        "lease: run payload of 65537 bytes is over the maximum of 65536 bytes"
    );
    assert_exit(
        &with(&[
            "create",
            "charge-4",
            "--payload",
            "a",
            "--payload-file",
            path,
        ]),
        USAGE,
    );
    assert_exit(&with(&["inspect", "charge-4"]), NOT_FOUND);
}

/// `lease schedule` refuses what cannot work before it touches a store, with exit 2 and the
/// reason: an interval that is not whole seconds, a cron expression that does not parse, both
/// or neither, a name too long for its tick ids, and `memory:` (a private store no other
/// scheduler or worker shares).
#[test]
fn lease_schedule_refuses_bad_schedules_and_the_memory_store() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--every", "1500ms"],
            "interval 1.5s must be a whole number of seconds",
        ),
        (
            &["--every", "0s"],
            "interval 0ns must be a whole number of seconds",
        ),
        (&["--cron", "61 * * * *"], "cron expression \"61 * * * *\""),
        (
            &["--every", "1s", "--cron", "* * * * *"],
            "cannot be used with",
        ),
        (&[], "--every <AGE>"),
    ];
    let redis = "redis://127.0.0.1:1"; // never reached: each is refused first
    for (flags, says) in cases {
        let mut args = vec!["--store", redis, "schedule", "nightly"];
        args.extend_from_slice(flags);
        let out = lease(&args);
        assert_exit(&out, USAGE);
        assert!(stderr(&out).contains(says), "{flags:?}: {}", stderr(&out));
    }
    let long = "n".repeat(240);
    let out = lease(&["--store", redis, "schedule", &long, "--every", "1s"]);
    assert_exit(&out, USAGE);
    assert!(
        stderr(&out).contains("schedule name of 240 bytes is over the maximum of 234"),
        "{}",
        stderr(&out)
    );
    let big = "x".repeat(distribution::MAX_RUN_PAYLOAD_BYTES + 1);
    let out = lease(&[
        "--store",
        redis,
        "schedule",
        "nightly",
        "--every",
        "1s",
        "--payload",
        &big,
    ]);
    assert_exit(&out, USAGE);
    assert!(
        stderr(&out).contains("run payload of 65537 bytes"),
        "{}",
        stderr(&out)
    );
    let out = lease(&["--store", "memory:", "schedule", "nightly", "--every", "1s"]);
    assert_exit(&out, USAGE);
    assert!(
        stderr(&out).contains("memory: lives inside this one"),
        "{}",
        stderr(&out)
    );
}

/// `lease purge --every` refuses a bad period, flags that do not go together and the memory
/// store, each before connecting (the Redis URL is never reached).
#[test]
fn lease_purge_every_refuses_bad_input_before_connecting() {
    let redis = "redis://127.0.0.1:1";
    let cases: &[(&[&str], &str)] = &[
        (
            &["--older-than", "7d", "--every", "500ms"],
            "worker setting every is 500ms; a purger's period must be 1 s to a day",
        ),
        (
            &["--older-than", "7d", "--every", "2d"],
            "a purger's period must be 1 s to a day",
        ),
        (
            &["--older-than", "7d", "--every", "1m", "--dry-run"],
            "cannot be used with",
        ),
        (&["--older-than", "7d", "--id", "host-a"], "--every <AGE>"),
        (
            &["--older-than", "7d", "--every", "1m", "--id", ""],
            "empty",
        ),
    ];
    for (flags, says) in cases {
        let mut args = vec!["--store", redis, "purge"];
        args.extend_from_slice(flags);
        let out = lease(&args);
        assert_exit(&out, USAGE);
        assert!(stderr(&out).contains(says), "{flags:?}: {}", stderr(&out));
    }
    let out = lease(&[
        "--store",
        "memory:",
        "purge",
        "--older-than",
        "7d",
        "--every",
        "1m",
    ]);
    assert_exit(&out, USAGE);
    assert!(
        stderr(&out).contains("memory: lives inside this one process"),
        "{}",
        stderr(&out)
    );
}

/// `lease completions bash` prints a bash completion script for `lease` and its commands.
#[test]
fn completions_print_a_script_for_the_shell() {
    let out = lease(&["completions", "bash"]);
    assert_exit(&out, 0);
    let script = stdout(&out);
    assert!(script.contains("_lease()"), "{script}");
    assert!(script.contains("complete -F _lease"), "{script}");
    for command in ["journal", "run", "worker", "completions", "inspect"] {
        assert!(script.contains(command), "{command} missing: {script}");
    }
    assert!(
        !script.contains("ledger"),
        "the test worker's commands are not lease's"
    );
    let out = lease(&["completions", "tcsh"]);
    assert_exit(&out, USAGE);
}

/// SIGINT and SIGTERM sent to `lease run` are forwarded to the command, which exits as it
/// chooses (its code passes through); a command that ignores the signal is killed with SIGKILL
/// one grace later (exit 137).
#[test]
fn lease_run_forwards_stop_signals_to_the_command_and_kills_it_after_the_grace() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("lease-run-signals-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (signal, script, code) in [
        ("INT", "trap 'exit 9' INT", 9),
        ("TERM", "trap 'exit 10' TERM", 10),
        ("TERM", "trap '' TERM", 128 + 9),
    ] {
        let started = dir.join(format!("{signal}-{code}"));
        let command = format!(
            "{script}; touch '{}'; while :; do sleep 0.05; done",
            started.display()
        );
        let job = format!("job-{signal}-{code}");
        let child = Command::new(env!("CARGO_BIN_EXE_lease"))
            .args(["--store", &url, "--namespace", "cli_signals"])
            .args(["--ttl-ms", "1500", "run", &job, "--create"])
            .args(["--kill-after-ms", "200", "--", "sh", "-c", &command])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start lease run");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !started.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the command never started"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let sent = std::time::Instant::now();
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
        let out = child.wait_with_output().unwrap();
        assert_exit(&out, code);
        if code == 128 + 9 {
            assert!(
                sent.elapsed() >= Duration::from_millis(200),
                "SIGKILL came before the grace: {:?}",
                sent.elapsed()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hostile numbers and a missing command are usage errors with one sentence, before anything
/// is claimed or started (no panic on an overflowing grace or wait).
#[test]
fn lease_run_refuses_absurd_waits_graces_and_a_missing_command() {
    // Refused before any connection: the store named here does not exist.
    let base = ["--store", "postgres://lease@127.0.0.1:1/none"];
    let lease = |args: &[&str]| lease(&[&base[..], args].concat());
    let huge = u64::MAX.to_string();
    let out = lease(&["run", "job", "--create", "--wait-ms", &huge, "--", "true"]);
    assert_exit(&out, USAGE);
    assert!(
        stderr(&out).contains("is longer than a year"),
        "{}",
        stderr(&out)
    );
    let out = lease(&[
        "run",
        "job",
        "--create",
        "--kill-after-ms",
        &huge,
        "--",
        "true",
    ]);
    assert_exit(&out, USAGE);
    assert!(
        stderr(&out).contains("does not fit in the TTL"),
        "{}",
        stderr(&out)
    );
    let out = lease(&["run", "job", "--create"]);
    assert_exit(&out, USAGE);
    assert!(stderr(&out).contains("CMD"), "{}", stderr(&out));
    let out = lease(&["run", "bad\u{7}id", "--create", "--", "true"]);
    assert_exit(&out, USAGE);
    assert!(
        stderr(&out).contains("control character"),
        "{}",
        stderr(&out)
    );
}

/// `lease run --attempt-timeout-ms` stops a command that outlives its deadline (SIGTERM, then
/// SIGKILL one grace later if it ignores it), exits 124, and gives the run back with the
/// attempt counted; `--max-attempts` then fails the run on the claim past its budget (exit 4,
/// the command never started), and `lease resume` gives it a fresh budget.
#[test]
fn lease_run_times_attempts_out_and_fails_a_run_past_its_budget() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let base = ["--store", url.as_str(), "--namespace", "cli_budget"];
    let with = |args: &[&str]| lease(&[&base[..], args].concat());
    let marker = std::env::temp_dir().join(format!("lease-budget-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let hang = format!("touch '{}'; trap '' TERM; sleep 30", marker.display());
    let run = |args: &[&str]| {
        with(
            &[
                &[
                    "run",
                    "job",
                    "--create",
                    "--max-attempts",
                    "2",
                    "--attempt-timeout-ms",
                    "300",
                    "--kill-after-ms",
                    "100",
                ][..],
                args,
            ]
            .concat(),
        )
    };
    for attempt in 1..=2 {
        let started = std::time::Instant::now();
        let out = run(&["--", "sh", "-c", &hang]);
        assert_exit(&out, 124);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(10),
            "attempt {attempt} took {took:?}"
        );
        assert!(
            stderr(&out).contains("outlived --attempt-timeout-ms 300"),
            "{}",
            stderr(&out)
        );
        let record: serde_json::Value =
            serde_json::from_str(&stdout(&with(&["inspect", "job", "-o", "json"]))).unwrap();
        assert_eq!(
            (
                record["state"].as_str(),
                record["owner"].as_str(),
                record["attempts"].as_u64()
            ),
            (Some("runnable"), None, Some(attempt)),
            "{record}"
        );
    }
    std::fs::remove_file(&marker).unwrap();
    let out = run(&["--", "sh", "-c", &hang]);
    assert_exit(&out, REFUSED);
    assert!(
        stderr(&out).contains("claimed 2 times without finishing"),
        "{}",
        stderr(&out)
    );
    assert!(!marker.exists(), "the command ran past the budget");
    let record: serde_json::Value =
        serde_json::from_str(&stdout(&with(&["inspect", "job", "-o", "json"]))).unwrap();
    assert_eq!(record["state"].as_str(), Some("failed"), "{record}");
    assert_exit(&with(&["resume", "job"]), 0);
    assert_exit(&run(&["--", "true"]), 0);
    let record: serde_json::Value =
        serde_json::from_str(&stdout(&with(&["inspect", "job", "-o", "json"]))).unwrap();
    assert_eq!(
        (record["state"].as_str(), record["attempts"].as_u64()),
        (Some("runnable"), Some(0)),
        "a fresh budget, and a success gives its attempt back: {record}"
    );
}

/// The default build reaches etcd: `--store etcd://h1:p1,h2:p2,h3:p3/prefix` creates and
/// inspects a run, and `etcd-rebind` binds the prefix (refused, by name, on another backend).
#[test]
fn the_default_build_reaches_etcd_and_rebinds_a_prefix() {
    use lease_conformance::fixtures::etcd::{EtcdCluster, HINT, MEMBERS};
    let Some(cluster) = lease_conformance::fixtures::required(
        "etcd cluster",
        EtcdCluster::start().map_err(|e| e.to_string()),
        HINT,
    ) else {
        return;
    };
    let hosts: Vec<String> = (0..MEMBERS)
        .map(|i| cluster.endpoint(i).trim_start_matches("http://").to_owned())
        .collect();
    let url = format!("etcd://{}/cli", hosts.join(","));
    let out = lease(&["--store", &url, "create", "order-1"]);
    assert_exit(&out, 0);
    let out = lease(&["--store", &url, "-o", "json", "inspect", "order-1"]);
    assert_exit(&out, 0);
    let record: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(record["state"], "runnable", "{record}");
    assert_eq!(record["fence"], 0, "{record}");
    let out = lease(&["--store", &url, "-o", "json", "etcd-rebind"]);
    assert_exit(&out, 0);
    let rebound: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(rebound["prefix"], "cli", "{rebound}");
    assert!(rebound["before"]["cluster"].is_u64(), "{rebound}");
    assert!(rebound["after"]["raft_index"].is_u64(), "{rebound}");
    let out = lease(&["--store", "memory:", "etcd-rebind"]);
    assert_exit(&out, USAGE);
    assert!(
        stderr(&out).contains("etcd:// store only"),
        "{}",
        stderr(&out)
    );
    let out = lease(&["--help"]);
    assert!(stdout(&out).contains("etcd-rebind"));
}

/// `lease create --kind K` creates a run of that kind (shown by `inspect`, text and JSON),
/// `lease list --kind K` lists only that kind's runs, a bad kind is refused before the store
/// with exit 2, and a worker of another kind never claims the run.
#[test]
fn lease_create_and_list_take_a_kind() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let base = ["--store", url.as_str(), "--namespace", "cli_kinds"];
    let with = |args: &[&str]| lease(&[&base[..], args].concat());
    assert_exit(&with(&["create", "mail-1", "--kind", "email"]), 0);
    assert_exit(&with(&["create", "mail-2", "--kind", "email"]), 0);
    assert_exit(&with(&["create", "plain-1"]), 0);
    let record: serde_json::Value =
        serde_json::from_str(&stdout(&with(&["inspect", "mail-1", "-o", "json"]))).unwrap();
    assert_eq!(record["kind"], "email", "{record}");
    let table = stdout(&with(&["inspect", "mail-2"]));
    assert!(table.contains("kind: email"), "{table}");
    let plain = stdout(&with(&["inspect", "plain-1"]));
    assert!(!plain.contains("kind:"), "{plain}");

    let listed = stdout(&with(&["list", "--kind", "email", "-o", "json"]));
    let runs: Vec<String> = listed
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["run"].to_string())
        .collect();
    assert_eq!(runs, [r#""mail-1""#, r#""mail-2""#], "{listed}");
    let listed = stdout(&with(&["list", "--kind", "default", "-o", "json"]));
    assert_eq!(listed.lines().count(), 1, "{listed}");
    assert!(listed.contains(r#""run":"plain-1""#), "{listed}");

    let out = with(&["create", "mail-3", "--kind", &"k".repeat(65)]);
    assert_exit(&out, USAGE);
    assert_eq!(
        stderr(&out).trim(),
        "lease: kind is 65 bytes long; the limit is 64 bytes of UTF-8"
    );
    assert_exit(&with(&["list", "--kind", ""]), USAGE);

    let (rt, store) = admin(&url, "cli_kinds");
    assert!(matches!(
        rt.block_on(store.inspect(&id("mail-3"))),
        Err(distribution::Error::NotFound { .. })
    ));
    let claimed = rt
        .block_on(store.claim_next(&worker("w"), ttl(60_000), 10))
        .unwrap();
    assert_eq!(
        claimed.iter().map(|l| l.run().as_str()).collect::<Vec<_>>(),
        ["plain-1"],
        "the default kind's claim took only the run without a kind"
    );
    let emails = rt
        .block_on(store.claim_next_kind(
            &distribution::Kind::new("email").unwrap(),
            &worker("w"),
            ttl(60_000),
            10,
        ))
        .unwrap();
    assert_eq!(emails.len(), 2);
}

/// `lease create --priority N` creates a run of that priority (`inspect` shows it, text and
/// JSON), claimed before the runs of lower priorities, on Postgres and on Redis; a priority
/// over 9 is a usage error before the store.
#[test]
fn lease_create_takes_a_priority() {
    let Some((_pg, url)) = postgres() else {
        return;
    };
    let Some(redis) = redis() else {
        return;
    };
    let rurl = format!("redis://127.0.0.1:{}", redis.port());
    for url in [url.as_str(), rurl.as_str()] {
        let base = ["--store", url, "--namespace", "cli_priority"];
        let with = |args: &[&str]| lease(&[&base[..], args].concat());
        assert_exit(&with(&["create", "low"]), 0);
        assert_exit(&with(&["create", "high", "--priority", "7"]), 0);
        let record: serde_json::Value =
            serde_json::from_str(&stdout(&with(&["inspect", "high", "-o", "json"]))).unwrap();
        assert_eq!(record["priority"], 7, "{record}");
        let record: serde_json::Value =
            serde_json::from_str(&stdout(&with(&["inspect", "low", "-o", "json"]))).unwrap();
        assert_eq!(record["priority"], 0, "{record}");
        let table = stdout(&with(&["inspect", "high"]));
        assert!(table.contains("priority: 7"), "{table}");
        assert!(!stdout(&with(&["inspect", "low"])).contains("priority:"));

        let out = with(&["create", "too-high", "--priority", "10"]);
        assert_exit(&out, USAGE);
        assert!(
            stderr(&out).contains("10 is not in 0..=9"),
            "{}",
            stderr(&out)
        );

        let (rt, store) = admin(url, "cli_priority");
        assert!(matches!(
            rt.block_on(store.inspect(&id("too-high"))),
            Err(distribution::Error::NotFound { .. })
        ));
        let claimed = rt
            .block_on(store.claim_next(&worker("w"), ttl(60_000), 10))
            .unwrap();
        assert_eq!(
            claimed
                .iter()
                .map(|l| (l.run().as_str(), l.priority()))
                .collect::<Vec<_>>(),
            [("high", 7), ("low", 0)],
            "{url}"
        );
    }
}

/// `lease create --run-at TIME` (RFC 3339) creates a run not claimable before that time on the
/// store's clock (`inspect -o json` says when: `not_before_us`); a past time is claimable at
/// once; a time that does not parse, or with --delay, is a usage error before the store.
#[test]
fn lease_create_takes_a_wall_clock_time() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let base = ["--store", url.as_str(), "--namespace", "cli_run_at"];
    let with = |args: &[&str]| lease(&[&base[..], args].concat());
    let ahead = std::time::SystemTime::now() + Duration::from_secs(3600);
    let micros = ahead
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let text = format!("@{micros}");
    // RFC 3339 text from the seconds, through the same crate the CLI uses.
    let rfc = chrono::DateTime::<chrono::Utc>::from_timestamp(micros as i64, 0)
        .unwrap()
        .to_rfc3339();
    assert_exit(&with(&["create", "later", "--run-at", &rfc]), 0);
    let record: serde_json::Value =
        serde_json::from_str(&stdout(&with(&["inspect", "later", "-o", "json"]))).unwrap();
    assert_eq!(
        record["not_before_us"].as_u64(),
        Some(micros * 1_000_000),
        "{record}"
    );
    assert_exit(
        &with(&["create", "earlier", "--run-at", "2001-02-03T04:05:06+01:00"]),
        0,
    );
    let (rt, store) = admin(&url, "cli_run_at");
    let claimed = rt
        .block_on(store.claim_next(&worker("w"), ttl(60_000), 10))
        .unwrap();
    assert_eq!(
        claimed.iter().map(|l| l.run().as_str()).collect::<Vec<_>>(),
        ["earlier"]
    );
    assert!(matches!(
        rt.block_on(store.claim(&id("later"), &worker("w"), ttl(60_000))),
        Err(distribution::Error::Delayed { .. })
    ));
    for bad in [
        vec!["create", "bad", "--run-at", &text],
        vec!["create", "bad", "--run-at", &rfc, "--delay", "1s"],
    ] {
        assert_exit(&with(&bad), USAGE);
    }
    assert!(matches!(
        rt.block_on(store.inspect(&id("bad"))),
        Err(distribution::Error::NotFound { .. })
    ));
}

/// `lease schedule --kind K` enqueues tick runs of that kind, on Postgres and on Redis; each
/// stops with 0 on SIGTERM.
#[test]
fn lease_schedule_takes_a_kind() {
    let Some((_pg, url)) = postgres() else {
        return;
    };
    let Some(redis) = redis() else {
        return;
    };
    let rurl = format!("redis://127.0.0.1:{}", redis.port());
    for url in [url.as_str(), rurl.as_str()] {
        let base = ["--store", url, "--namespace", "cli_sched_kind"];
        let mut child = Command::new(env!("CARGO_BIN_EXE_lease"))
            .args(base)
            .args(["schedule", "digest", "--every", "1s", "--kind", "report"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start lease schedule");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let listed = loop {
            let out = lease(&[&base[..], &["list", "--kind", "report", "-o", "json"]].concat());
            let text = stdout(&out);
            if !text.trim().is_empty() {
                break text;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no tick run of kind report in 30 s on {url}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(child.wait().unwrap().success(), "SIGTERM ends it with 0");
        for line in listed.lines() {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(record["kind"], "report", "{record}");
            assert!(
                record["run"].as_str().unwrap().starts_with("digest@"),
                "{record}"
            );
        }
        // The default kind has none of them.
        let defaults = lease(&[&base[..], &["list", "--kind", "default", "-o", "json"]].concat());
        assert_exit(&defaults, 0);
        assert!(
            !stdout(&defaults).contains("digest@"),
            "{}",
            stdout(&defaults)
        );
    }
}

/// `lease stats` prints the runs in each state and the queue's lag (JSON and text), then each
/// kind's runnable runs and lag, on Postgres and on Redis; the lag runs from when the waiting
/// run became claimable.
#[test]
fn lease_stats_counts_runs_and_the_queue_lag() {
    let Some((_pg, url)) = postgres() else {
        return;
    };
    let Some(redis) = redis() else {
        return;
    };
    let rurl = format!("redis://127.0.0.1:{}", redis.port());
    for url in [url.as_str(), rurl.as_str()] {
        let base = ["--store", url, "--namespace", "cli_stats"];
        let with = |args: &[&str]| lease(&[&base[..], args].concat());
        let stats = |args: &[&str]| -> serde_json::Value {
            let out = with(args);
            assert_exit(&out, 0);
            serde_json::from_str(&stdout(&out)).unwrap()
        };
        let empty = stats(&["stats", "-o", "json"]);
        assert_eq!(empty["claimable"], 0, "{empty}");
        assert!(empty["oldest_claimable_age_us"].is_null(), "{empty}");

        let t0 = std::time::Instant::now();
        for run in ["a", "b", "c"] {
            assert_exit(&with(&["create", run]), 0);
        }
        let (rt, store) = admin(url, "cli_stats");
        let lease = rt
            .block_on(store.claim(&id("c"), &worker("w"), ttl(60_000)))
            .unwrap();
        rt.block_on(store.complete(&lease)).unwrap();
        rt.block_on(store.claim(&id("b"), &worker("w"), ttl(60_000)))
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let now = stats(&["stats", "-o", "json"]);
        let bound = t0.elapsed().as_micros() as u64;
        assert_eq!(
            (&now["claimable"], &now["held"], &now["completed"]),
            (&1.into(), &1.into(), &1.into()),
            "{now}"
        );
        let lag = now["oldest_claimable_age_us"].as_u64().unwrap();
        assert!(
            (300_000..=bound).contains(&lag),
            "a has waited since its create: {lag} µs, at most {bound}"
        );
        let text = stdout(&with(&["stats"]));
        assert!(text.contains("claimable  1"), "{text}");
        assert!(
            text.contains("the longest-waiting claimable run has waited"),
            "{text}"
        );

        // By kind: the runnable runs of each kind (not c, completed) and each kind's lag.
        assert_exit(&with(&["create", "mail-1", "--kind", "email"]), 0);
        let now = stats(&["stats", "-o", "json"]);
        let kinds: Vec<(String, u64, u64, bool)> = now["kinds"]
            .as_array()
            .unwrap_or_else(|| panic!("kinds: {now}"))
            .iter()
            .map(|k| {
                (
                    k["kind"].as_str().unwrap().to_owned(),
                    k["runnable"].as_u64().unwrap(),
                    k["claimable"].as_u64().unwrap(),
                    k["oldest_claimable_age_us"].is_u64(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            vec![("default".into(), 2, 1, true), ("email".into(), 1, 1, true)],
            "{now}"
        );
        let text = stdout(&with(&["stats"]));
        assert!(
            text.lines()
                .any(|l| l.starts_with("email") && l.split_whitespace().nth(1) == Some("1")),
            "{text}"
        );
    }
}

/// `inspect -o json` shows the run's times on the store's clock and how long it has been held;
/// `list --held-longer-than AGE` keeps the held runs claimed at least AGE ago, on Postgres and
/// Redis.
#[test]
fn inspect_shows_the_times_and_list_finds_runs_held_too_long() {
    let Some((_pg, url)) = postgres() else {
        return;
    };
    let Some(redis) = redis() else {
        return;
    };
    let rurl = format!("redis://127.0.0.1:{}", redis.port());
    for url in [url.as_str(), rurl.as_str()] {
        let base = ["--store", url, "--namespace", "cli_times"];
        let with = |args: &[&str]| lease(&[&base[..], args].concat());
        let json = |args: &[&str]| -> serde_json::Value {
            let out = with(args);
            assert_exit(&out, 0);
            serde_json::from_str(&stdout(&out)).unwrap()
        };
        for run in ["long", "short", "waiting"] {
            assert_exit(&with(&["create", run]), 0);
        }
        let (rt, store) = admin(url, "cli_times");
        let lease = rt
            .block_on(store.claim(&id("long"), &worker("w-long"), ttl(600_000)))
            .unwrap();
        // Held for two seconds on the store's own clock, as the records tell it.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let held = rt.block_on(store.inspect(&id("long"))).unwrap().held_for();
            if held.is_some_and(|d| d >= Duration::from_millis(2_100)) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never held two seconds"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let short = rt
            .block_on(store.claim(&id("short"), &worker("w-short"), ttl(600_000)))
            .unwrap();
        // Listed at once, while "short" has been held far less than the bound (the commands
        // below take their time on a loaded machine).
        let listed = with(&["list", "--held-longer-than", "2s", "-o", "json"]);
        assert_exit(&listed, 0);
        let runs: Vec<String> = ndjson(&listed)
            .iter()
            .map(|r| r["run"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(runs, ["long"], "only the run held over two seconds");

        let r = json(&["inspect", "long", "-o", "json"]);
        let us = |field: &str| r[field].as_u64().unwrap_or_else(|| panic!("{field}: {r}"));
        assert!(us("created_at_us") <= us("claimed_at_us"), "{r}");
        assert!(us("claimed_at_us") <= us("observed_at_us"), "{r}");
        assert!(
            r["renewed_at_us"].is_null() && r["ended_at_us"].is_null(),
            "{r}"
        );
        let held_ms = us("held_for_ms");
        assert!(held_ms >= 2_100, "{r}");
        assert_eq!(
            held_ms,
            (us("observed_at_us") - us("claimed_at_us")) / 1000,
            "{r}"
        );
        let text = stdout(&with(&["inspect", "long"]));
        assert!(
            text.contains("\nclaimed: ") && text.contains("\nheld for: "),
            "{text}"
        );

        let none = with(&["list", "--held-longer-than", "1h", "-o", "json"]);
        assert_exit(&none, 0);
        assert_eq!(stdout(&none), "", "nothing held an hour");
        let bad = with(&["list", "--state", "completed", "--held-longer-than", "1s"]);
        assert_exit(&bad, USAGE);
        assert!(
            stderr(&bad).contains("--held-longer-than"),
            "{}",
            stderr(&bad)
        );

        rt.block_on(store.complete(&lease)).unwrap();
        let done = json(&["inspect", "long", "-o", "json"]);
        let ended = done["ended_at_us"].as_u64().expect("ended");
        assert!(ended >= us("claimed_at_us"), "{done}");
        assert!(done["held_for_ms"].is_null(), "{done}");
        let waiting = json(&["inspect", "waiting", "-o", "json"]);
        assert!(waiting["created_at_us"].is_u64(), "{waiting}");
        assert!(waiting["claimed_at_us"].is_null(), "{waiting}");

        // "waiting" has waited since its creation, over a second by now; "short", released
        // now, has only begun to wait; "long" ended.
        rt.block_on(store.release(&short)).unwrap();
        assert_eq!(
            waiting["claimable_since_us"], waiting["created_at_us"],
            "{waiting}"
        );
        assert!(
            waiting["waiting_for_ms"]
                .as_u64()
                .is_some_and(|ms| ms >= 1_100),
            "{waiting}"
        );
        let released = json(&["inspect", "short", "-o", "json"]);
        let since = released["claimable_since_us"].as_u64().expect("claimable");
        assert!(since >= us("claimed_at_us"), "{released}");
        assert!(released["waiting_for_ms"].is_u64(), "{released}");
        assert!(done["waiting_for_ms"].is_null(), "{done}");
        let text = stdout(&with(&["inspect", "waiting"]));
        assert!(text.contains("\nwaiting for: "), "{text}");
        let listed = with(&["list", "--waiting-longer-than", "1s", "-o", "json"]);
        assert_exit(&listed, 0);
        let runs: Vec<String> = ndjson(&listed)
            .iter()
            .map(|r| r["run"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(runs, ["waiting"], "only the run waiting over a second");
        let bad = with(&["list", "--state", "failed", "--waiting-longer-than", "1s"]);
        assert_exit(&bad, USAGE);
        assert!(
            stderr(&bad).contains("--waiting-longer-than lists runnable runs"),
            "{}",
            stderr(&bad)
        );
    }
}

/// `lease create` prints the run's id, generated (a UUIDv7) when none is given. With
/// `--unique-key`, a second create while the first run is live prints the first run's id,
/// creates nothing and exits 0, saying so on standard error; once that run has ended the key is
/// free. `-o json` prints the record with `duplicate`. A bad key exits 2 before the store.
#[test]
fn lease_create_generates_an_id_and_a_unique_key_finds_the_live_run() {
    let Some((_server, url)) = postgres() else {
        return;
    };
    let base = ["--store", url.as_str(), "--namespace", "cli_unique"];
    let with = |args: &[&str]| lease(&[&base[..], args].concat());
    let out = with(&["create", "--kind", "email", "--unique-key", "welcome:7"]);
    assert_exit(&out, 0);
    let first = stdout(&out).trim().to_owned();
    assert_eq!(first.len(), 36, "a UUID: {first:?}");
    assert_eq!(&first[14..15], "7", "version 7: {first}");
    let out = with(&["create", "--kind", "email", "--unique-key", "welcome:7"]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out).trim(), first);
    assert!(
        stderr(&out).contains(&format!("run {first} holds unique key \"welcome:7\"")),
        "{}",
        stderr(&out)
    );
    // `-o json`: the record, with `duplicate`.
    let json = |args: &[&str]| -> serde_json::Value {
        let out = with(&[args, &["-o", "json"]].concat());
        assert_exit(&out, 0);
        serde_json::from_str(&stdout(&out)).unwrap()
    };
    let record = json(&["create", "other-id", "--unique-key", "welcome:7"]);
    assert_eq!(record["run"], first.as_str(), "{record}");
    assert_eq!(record["duplicate"], true, "{record}");
    assert_exit(&with(&["inspect", "other-id"]), NOT_FOUND);

    let (rt, store) = admin(&url, "cli_unique");
    let lease = rt
        .block_on(store.claim(&id(&first), &worker("w"), ttl(60_000)))
        .unwrap();
    rt.block_on(store.complete(&lease)).unwrap();
    let record = json(&["create", "--kind", "email", "--unique-key", "welcome:7"]);
    assert_ne!(record["run"], first.as_str(), "{record}");
    assert_eq!(record["duplicate"], false, "{record}");
    assert_eq!(record["kind"], "email", "{record}");

    let out = with(&["create", "--unique-key", ""]);
    assert_exit(&out, USAGE);
    assert_eq!(
        stderr(&out).trim(),
        "lease: unique key is empty; it must be 1 to 255 bytes of UTF-8"
    );
}
