//! The measurements beyond library-against-raw: batched heartbeats (with memory per lease),
//! claim_next under contention, and takeover after SIGKILL.

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distribution::forward::{Call, Forward, Next, Reply};
use distribution::{Heartbeats, LeaseStore, Result, RunScope, ScopeConfig, Ttl, WorkerId};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::Instant;

use super::{BenchError, Summary, Target};

/// CPU cores and model, for the report.
pub(super) fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(str::trim)
        .unwrap_or("unknown")
        .to_owned();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    json!({"cores": cores, "cpu": model, "os": std::env::consts::OS})
}

/// This process's CPU time (user + system), from `/proc/self/stat` (clock ticks of 10 ms).
pub(crate) fn cpu_time() -> Duration {
    stat_cpu(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default()).1
}

/// The CPU time (user + system) of every live process whose command name is `comm` (say
/// `postgres`: the server's backends and helpers), from `/proc/<pid>/stat`. A process that
/// exits between two readings takes its time with it.
pub(crate) fn processes_cpu(comm: &str) -> Duration {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .map(|stat| stat_cpu(&stat))
        .filter(|(name, _)| name == comm)
        .map(|(_, cpu)| cpu)
        .sum()
}

/// A `/proc/<pid>/stat` line's command name and CPU time (utime + stime, ticks of 10 ms).
fn stat_cpu(stat: &str) -> (String, Duration) {
    let name = stat
        .split_once('(')
        .and_then(|(_, r)| r.rsplit_once(')'))
        .map_or("", |(n, _)| n)
        .to_owned();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    (name, Duration::from_millis(ticks * 10))
}

/// Resident set size in bytes, from `/proc/self/statm`.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse().ok()))
        .map_or(0, |pages: u64| pages * 4096)
}

/// Counts renewal round trips and times each, around the library store.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn LeaseStore>,
    calls: Mutex<Vec<u64>>,
}

impl std::fmt::Display for Counting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "counting({})", self.inner)
    }
}

impl Counting {
    fn take(&self) -> Vec<u64> {
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn record(&self, t0: Instant) {
        let ns = t0.elapsed().as_nanos() as u64;
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ns);
    }
}

/// Every call forwarded by the forwarding base; renewals (one or a batch) timed.
#[async_trait::async_trait]
impl Forward for Counting {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }

    async fn around<T: Reply>(&self, call: Call<'_>, next: Next<'_, T>) -> Result<T> {
        if call.renews.is_empty() {
            return next.run().await;
        }
        let t0 = Instant::now();
        let out = next.run().await;
        self.record(t0);
        out
    }
}

/// One worker holding `leases` leases (TTL 30 s) for `ticks` heartbeat ticks of 10 s: batched
/// through a [`Heartbeats`] hub, then one renewal per scope. Reports round trips per tick,
/// worker CPU, p99 round-trip latency and RSS per held lease, and checks the store counted
/// every renewal.
pub(super) async fn heartbeat(
    target: &Target,
    leases: usize,
    ticks: u32,
) -> Result<Value, BenchError> {
    let ttl = Ttl::from_secs(30)?;
    let tick = Duration::from_secs(10);
    let mut modes = Vec::new();
    for batched in [true, false] {
        let ns = target.namespace("bench_hb");
        let counting = Arc::new(Counting {
            inner: target.lib(&ns).await?,
            calls: Mutex::new(Vec::new()),
        });
        let store: Arc<dyn LeaseStore> = counting.clone();
        let raw = target.raw.namespace(&ns);
        let names: Vec<String> = (0..leases).map(|i| format!("hb-{i:06}")).collect();
        raw.create_all(&names).await?;
        let worker = WorkerId::new("hb-worker")?;
        let hub = if batched {
            Some(Heartbeats::new(store.clone(), tick)?)
        } else {
            None
        };
        let config = match &hub {
            Some(hub) => ScopeConfig::default().with_heartbeats(hub.clone()),
            None => ScopeConfig::default().with_heartbeat(tick),
        };
        // Let the allocator settle before measuring the scopes' footprint.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let rss_before = rss();
        let mut scopes = Vec::with_capacity(leases);
        while scopes.len() < leases {
            let max = (leases - scopes.len()).min(distribution::MAX_BATCH);
            let got =
                RunScope::claim_next(store.clone(), &worker, ttl, max, config.clone()).await?;
            if got.is_empty() {
                return Err(BenchError::setup("heartbeat setup: nothing claimable"));
            }
            scopes.extend(got);
        }
        let rss_after = rss();
        counting.take();
        let cpu0 = cpu_time();
        let t0 = Instant::now();
        // The first renewal is due one tick after the claims; wait out `ticks` ticks and a margin.
        tokio::time::sleep(tick * ticks + Duration::from_secs(2)).await;
        let wall = t0.elapsed();
        let cpu = cpu_time().saturating_sub(cpu0);
        let calls = counting.take();
        let round_trips = calls.len();
        let latency = Summary::of(calls, wall.as_secs_f64());
        let cancelled = scopes.iter().filter(|s| s.is_cancelled()).count();
        let renewals: u64 = scopes.iter().map(RunScope::renewals).sum();
        let seen = raw.seen(&names).await?;
        let counted: u64 = seen.iter().map(|s| s.heartbeats).sum();
        let expected = leases as u64 * u64::from(ticks);
        if cancelled > 0 || renewals != expected || counted != expected {
            return Err(BenchError::wrong(format!(
                "heartbeat ({}): {cancelled} scopes cancelled, {renewals} renewals seen by scopes, \
                 {counted} counted by the store; expected {expected}",
                if batched { "batched" } else { "per scope" }
            )));
        }
        drop(scopes);
        drop(hub);
        modes.push(json!({
            "mode": if batched { "batched (Heartbeats hub)" } else { "one renewal per scope" },
            "ticks": ticks,
            "round_trips": round_trips,
            "round_trips_per_tick": round_trips as f64 / f64::from(ticks),
            "cpu_ms": cpu.as_millis() as u64,
            "cpu_ms_per_tick": cpu.as_millis() as f64 / f64::from(ticks),
            "round_trip_p50_us": latency.p50_us,
            "round_trip_p99_us": latency.p99_us,
            "rss_bytes_per_lease": (rss_after.saturating_sub(rss_before)) as f64 / leases as f64,
            "renewals_validated": counted,
        }));
    }
    let per = |i: usize| modes[i]["round_trips_per_tick"].as_f64().unwrap_or(0.0);
    Ok(json!({
        "part": "heartbeat",
        "backend": target.kind.name(),
        "leases": leases,
        "ttl_s": 30,
        "tick_s": 10,
        "modes": modes,
        "round_trip_reduction": per(1) / per(0).max(f64::MIN_POSITIVE),
    }))
}

/// 16 workers drain `runs` runs with claim_next(`batch`), through the library and then through
/// the raw statement, each in its own namespace; checks no run is handed out twice.
pub(super) async fn contention(
    target: &Target,
    runs: usize,
    batch: usize,
) -> Result<Value, BenchError> {
    const WORKERS: usize = 16;
    let ttl_ms = 600_000;
    let mut paths = Vec::new();
    for lib_path in [true, false] {
        let ns = target.namespace("bench_cn");
        let lib = target.lib(&ns).await?;
        let raw = Arc::new(target.raw.namespace(&ns));
        let names: Vec<String> = (0..runs).map(|i| format!("cn-{i:07}")).collect();
        raw.create_all(&names).await?;
        let start = Arc::new(tokio::sync::Barrier::new(WORKERS + 1));
        let mut tasks = Vec::new();
        for w in 0..WORKERS {
            let (lib, raw, start) = (lib.clone(), raw.clone(), start.clone());
            let worker = WorkerId::new(format!("cn-{w}"))?;
            tasks.push(tokio::spawn(async move {
                let ttl = Ttl::from_millis(ttl_ms)?;
                let mut got: Vec<(String, u64, String)> = Vec::new();
                let mut latencies = Vec::new();
                start.wait().await;
                loop {
                    let t0 = Instant::now();
                    let batch: Vec<(String, u64)> = if lib_path {
                        lib.claim_next(&worker, ttl, batch)
                            .await?
                            .into_iter()
                            .map(|l| (l.run().as_str().to_owned(), l.fence().get()))
                            .collect()
                    } else {
                        raw.claim_next(worker.as_str(), ttl_ms, batch).await?
                    };
                    latencies.push(t0.elapsed().as_nanos() as u64);
                    if batch.is_empty() {
                        break;
                    }
                    got.extend(
                        batch
                            .into_iter()
                            .map(|(r, f)| (r, f, worker.as_str().to_owned())),
                    );
                }
                Ok::<_, BenchError>((got, latencies))
            }));
        }
        start.wait().await;
        let t0 = Instant::now();
        let mut all = Vec::with_capacity(runs);
        let mut latencies = Vec::new();
        for task in tasks {
            let (got, lat) = task.await.map_err(|e| BenchError::setup(e.to_string()))??;
            all.extend(got);
            latencies.extend(lat);
        }
        let wall = t0.elapsed();
        // Validation: every run handed out exactly once, under fence 1, to the worker the store
        // names as owner.
        let mut distinct = HashSet::with_capacity(all.len());
        let twice = all
            .iter()
            .filter(|(r, _, _)| !distinct.insert(r.clone()))
            .count();
        let order: Vec<String> = all.iter().map(|(r, _, _)| r.clone()).collect();
        let seen = raw.seen(&order).await?;
        let mismatched = all
            .iter()
            .zip(&seen)
            .filter(|((_, fence, w), s)| {
                s.fence != *fence || *fence != 1 || s.owner.as_deref() != Some(w)
            })
            .count();
        if twice > 0 || all.len() != runs || mismatched > 0 {
            return Err(BenchError::wrong(format!(
                "contention: {} hand-outs of {runs} runs, {twice} twice, {mismatched} not matching the store",
                all.len()
            )));
        }
        let calls = Summary::of(latencies, wall.as_secs_f64());
        paths.push(json!({
            "path": match (lib_path, target.kind) {
                (true, _) => "library",
                (false, super::Kind::Postgres) => "raw claim_next.sql (FOR UPDATE SKIP LOCKED)",
                (false, super::Kind::Redis) => "raw claim_next.lua",
            },
            "runs_per_s": runs as f64 / wall.as_secs_f64(),
            "calls": calls.ops,
            "call_p50_us": calls.p50_us,
            "call_p99_us": calls.p99_us,
            "double_handouts": twice,
            "secs": wall.as_secs_f64(),
        }));
    }
    let rate = |i: usize| paths[i]["runs_per_s"].as_f64().unwrap_or(0.0);
    Ok(json!({
        "part": "contention",
        "backend": target.kind.name(),
        "workers": WORKERS,
        "runs": runs,
        "batch": batch,
        "paths": paths,
        "ratio": rate(0) / rate(1).max(f64::MIN_POSITIVE),
    }))
}

/// The poll interval of `lease-test-worker worker --next` while nothing is claimable (see
/// `lease-cli/test-worker/src/worker.rs`).
const WORKER_POLL: Duration = Duration::from_millis(50);

async fn event(
    lines: &mut Lines<BufReader<ChildStdout>>,
    name: &str,
    limit: Duration,
) -> Result<Value, BenchError> {
    let wait = async {
        while let Some(line) = lines
            .next_line()
            .await
            .map_err(|e| BenchError::setup(e.to_string()))?
        {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if v["event"] == name {
                    return Ok(v);
                }
            }
        }
        Err(BenchError::setup(format!("worker exited before `{name}`")))
    };
    tokio::time::timeout(limit, wait)
        .await
        .map_err(|_| BenchError::wrong(format!("no `{name}` event within {limit:?}")))?
}

fn spawn_worker(
    target: &Target,
    ns: &str,
    ttl_ms: u64,
    args: &[&str],
) -> Result<(Child, Lines<BufReader<ChildStdout>>), BenchError> {
    let exe = test_worker_binary()?;
    let mut child = Command::new(exe)
        .args([
            "--store",
            &target.url,
            "--namespace",
            ns,
            "--ttl-ms",
            &ttl_ms.to_string(),
            "worker",
        ])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| BenchError::setup(format!("cannot start `lease-test-worker worker`: {e}")))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| BenchError::setup("worker stdout"))?;
    Ok((child, BufReader::new(stdout).lines()))
}

/// The `lease-test-worker` binary the takeover trials start: `LEASE_TEST_WORKER_BIN`, or
/// `lease-test-worker` next to this binary (`cargo build --release -p lease-test-worker` puts it
/// there; `just bench` builds it first).
fn test_worker_binary() -> Result<std::path::PathBuf, BenchError> {
    if let Some(path) = std::env::var_os("LEASE_TEST_WORKER_BIN") {
        return Ok(path.into());
    }
    let exe = std::env::current_exe().map_err(|e| BenchError::setup(e.to_string()))?;
    let sibling = exe.with_file_name(format!("lease-test-worker{}", std::env::consts::EXE_SUFFIX));
    if sibling.exists() {
        Ok(sibling)
    } else {
        Err(BenchError::setup(format!(
            "the takeover part runs `lease-test-worker worker` processes and found no {}: build \
             it with `cargo build --release -p lease-test-worker` (same profile and target dir), \
             or set LEASE_TEST_WORKER_BIN",
            sibling.display()
        )))
    }
}

/// `trials` times: a `lease-test-worker worker` process claims a run and is SIGKILLed; another, polling
/// with `--next`, claims it. Measures kill → claimed, which must be ≤ TTL + one poll interval.
pub(super) async fn takeover(
    target: &Target,
    trials: usize,
    ttl_ms: u64,
) -> Result<Value, BenchError> {
    let mut samples = Vec::with_capacity(trials);
    let bound = Duration::from_millis(ttl_ms) + WORKER_POLL;
    let limit = Duration::from_secs(30);
    for trial in 0..trials {
        let ns = target.namespace("bench_to");
        let run = format!("takeover-{trial}");
        let (mut a, mut a_out) = spawn_worker(
            target,
            &ns,
            ttl_ms,
            &["--id", "a", "--run", &run, "--create"],
        )?;
        let claimed = event(&mut a_out, "claimed", limit).await?;
        let a_fence = claimed["fence"].as_u64().unwrap_or(0);
        let (mut b, mut b_out) = spawn_worker(
            target,
            &ns,
            ttl_ms,
            &["--id", "b", "--next", "--wait-ms", "30000"],
        )?;
        // B is connected and polling once it reports nothing claimable.
        event(&mut b_out, "refused", limit).await?;
        // Spread the kill over the heartbeat cycle (TTL/3), so trials see every phase,
        // including a kill just after a renewal (the worst case).
        let phase = Duration::from_millis((trial as u64 * 37) % (ttl_ms / 3).max(1));
        tokio::time::sleep(phase).await;
        a.start_kill()
            .map_err(|e| BenchError::setup(e.to_string()))?; // SIGKILL
        let killed = Instant::now();
        let taken = event(&mut b_out, "claimed", limit).await?;
        let took = killed.elapsed();
        let _ = a.wait().await;
        let _ = b.start_kill();
        let _ = b.wait().await;
        if taken["run"] != run.as_str() || taken["fence"].as_u64() != Some(a_fence + 1) {
            return Err(BenchError::wrong(format!(
                "takeover claimed {taken} after {claimed}"
            )));
        }
        samples.push(took);
    }
    let within = samples.iter().filter(|d| **d <= bound).count();
    let ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1_000.0).collect();
    let max = ms.iter().copied().fold(0.0, f64::max);
    let min = ms.iter().copied().fold(f64::MAX, f64::min);
    let mut sorted = ms.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(json!({
        "part": "takeover",
        "backend": target.kind.name(),
        "trials": trials,
        "ttl_ms": ttl_ms,
        "poll_ms": WORKER_POLL.as_millis() as u64,
        "bound_ms": bound.as_millis() as u64,
        "min_ms": min,
        "median_ms": sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
        "max_ms": max,
        "within_bound": within,
        "samples_ms": ms,
    }))
}

/// A human-readable summary of one extra measurement.
pub(super) fn describe(v: &Value) -> String {
    let backend = v["backend"].as_str().unwrap_or("?");
    match v["part"].as_str() {
        Some("heartbeat") => {
            let mut out = format!(
                "heartbeat, {backend}: {} leases, TTL 30 s, tick 10 s\n| mode | round trips / tick | worker CPU ms / tick | round trip p50 µs | round trip p99 µs | RSS bytes / held lease | renewals validated |\n|---|--:|--:|--:|--:|--:|--:|",
                v["leases"]
            );
            for m in v["modes"].as_array().into_iter().flatten() {
                out += &format!(
                    "\n| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
                    m["mode"].as_str().unwrap_or(""),
                    m["round_trips_per_tick"].as_f64().unwrap_or(0.0),
                    m["cpu_ms_per_tick"].as_f64().unwrap_or(0.0),
                    m["round_trip_p50_us"].as_f64().unwrap_or(0.0),
                    m["round_trip_p99_us"].as_f64().unwrap_or(0.0),
                    m["rss_bytes_per_lease"].as_f64().unwrap_or(0.0),
                    m["renewals_validated"],
                );
            }
            out + &format!(
                "\nround trips reduced {:.0}×",
                v["round_trip_reduction"].as_f64().unwrap_or(0.0)
            )
        }
        Some("contention") => {
            let mut out = format!(
                "claim_next contention, {backend}: {} workers drain {} runs, {} per call\n| path | runs/s | calls | call p50 µs | call p99 µs | double hand-outs |\n|---|--:|--:|--:|--:|--:|",
                v["workers"], v["runs"], v["batch"]
            );
            for p in v["paths"].as_array().into_iter().flatten() {
                out += &format!(
                    "\n| {} | {:.0} | {} | {:.0} | {:.0} | {} |",
                    p["path"].as_str().unwrap_or(""),
                    p["runs_per_s"].as_f64().unwrap_or(0.0),
                    p["calls"],
                    p["call_p50_us"].as_f64().unwrap_or(0.0),
                    p["call_p99_us"].as_f64().unwrap_or(0.0),
                    p["double_handouts"],
                );
            }
            out + &format!("\nlibrary/raw {:.2}", v["ratio"].as_f64().unwrap_or(0.0))
        }
        Some("takeover") => format!(
            "takeover after SIGKILL, {backend}: {} trials, TTL {} ms, poll {} ms, bound {} ms: min {:.0} ms, median {:.0} ms, max {:.0} ms; {} of {} within the bound",
            v["trials"], v["ttl_ms"], v["poll_ms"], v["bound_ms"],
            v["min_ms"].as_f64().unwrap_or(0.0),
            v["median_ms"].as_f64().unwrap_or(0.0),
            v["max_ms"].as_f64().unwrap_or(0.0),
            v["within_bound"], v["trials"],
        ),
        _ => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_command_name_and_user_plus_system_time() {
        // pid (comm) state ppid … utime=250 stime=50 (fields 14 and 15); a name may hold
        // spaces and parentheses.
        let line =
            "4242 (postgres: a (b)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0";
        let (name, cpu) = stat_cpu(line);
        assert_eq!(name, "postgres: a (b)");
        assert_eq!(cpu, Duration::from_millis(3_000));
    }
}
