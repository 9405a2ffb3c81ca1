//! The `worker` part: the library's `Worker` runtime draining a backlog (jobs/s with 1, 4 and
//! 16 instances in one process, each job one fenced durable effect and its completion), and the
//! graceful handover of a shut-down worker's runs to another.
//!
//! Run on durable servers (Postgres with fsync and synchronous_commit on; Redis with
//! appendonly yes and appendfsync always); the settings are read back and reported.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distribution::{
    BoxError, CancellationToken, End, Kind, Kinds, LeaseStore, NewRun, RunContext, RunId, RunState,
    Ttl, Worker, WorkerConfig, WorkerId, MAX_BATCH,
};
use serde_json::{json, Value};
use sqlx::Row;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::fleet::Fleet;
use super::raw::RawConn;
use super::sweep::drop_namespace;
use super::{BenchError, Target};

/// Lease TTL of the worker rows.
const TTL_S: u64 = 30;

/// A Worker setting tried: handlers per instance, end batch size and delay.
#[derive(Clone, Copy, Debug)]
struct Setting {
    concurrency: usize,
    batch: usize,
    delay_ms: u64,
}

impl Setting {
    fn config(self) -> Result<WorkerConfig, BenchError> {
        Ok(WorkerConfig::new(Ttl::from_secs(TTL_S)?)
            .with_concurrency(self.concurrency)
            .with_batch(self.batch, Duration::from_millis(self.delay_ms))
            .with_poll_interval(Duration::from_millis(50)))
    }

    fn json(self) -> Value {
        json!({"concurrency": self.concurrency, "batch": self.batch, "delay_ms": self.delay_ms})
    }
}

const SETTINGS: [Setting; 4] = [
    Setting {
        concurrency: 32,
        batch: 100,
        delay_ms: 1,
    },
    Setting {
        concurrency: 64,
        batch: 250,
        delay_ms: 2,
    },
    Setting {
        concurrency: 128,
        batch: 100,
        delay_ms: 1,
    },
    Setting {
        concurrency: 128,
        batch: 500,
        delay_ms: 2,
    },
];

/// The server's durability settings, read back.
async fn durability(target: &Target) -> Result<String, BenchError> {
    Ok(match &target.raw {
        RawConn::Pg(pool) => {
            let fsync: String = sqlx::query("SHOW fsync")
                .fetch_one(pool)
                .await?
                .try_get(0)?;
            let sync: String = sqlx::query("SHOW synchronous_commit")
                .fetch_one(pool)
                .await?
                .try_get(0)?;
            format!("fsync={fsync}, synchronous_commit={sync}")
        }
        RawConn::Redis(conn) => {
            let mut conn = conn.clone();
            let get = |name: &'static str| redis::cmd("CONFIG").arg("GET").arg(name).clone();
            let aof: Vec<String> = get("appendonly").query_async(&mut conn).await?;
            let fsync: Vec<String> = get("appendfsync").query_async(&mut conn).await?;
            format!(
                "appendonly={}, appendfsync={}",
                aof.get(1).map_or("?", String::as_str),
                fsync.get(1).map_or("?", String::as_str)
            )
        }
    })
}

/// The ids of a backlog of `jobs` runs: `job-0000000`, `job-0000001`, …
pub(super) fn job_names(jobs: usize) -> Result<Vec<RunId>, BenchError> {
    Ok((0..jobs)
        .map(|i| RunId::new(format!("job-{i:07}")))
        .collect::<Result<_, _>>()?)
}

pub(super) async fn create_backlog(
    lib: &Arc<dyn LeaseStore>,
    names: &[RunId],
) -> Result<(), BenchError> {
    create_backlog_with(lib, names, 0, &[Kind::default()]).await
}

/// The kinds of a drain over `n` kinds: the default alone, or `kind-0` … `kind-{n-1}`.
fn bench_kinds(n: usize) -> Result<Vec<Kind>, BenchError> {
    if n <= 1 {
        return Ok(vec![Kind::default()]);
    }
    Ok((0..n)
        .map(|k| Kind::new(format!("kind-{k}")))
        .collect::<Result<_, _>>()?)
}

/// The backlog, each run created with `payload` bytes (0: none), run `i` of `kinds[i % n]`.
async fn create_backlog_with(
    lib: &Arc<dyn LeaseStore>,
    names: &[RunId],
    payload: usize,
    kinds: &[Kind],
) -> Result<(), BenchError> {
    let mut tasks = Vec::new();
    for (t, chunk) in names.chunks(MAX_BATCH).enumerate() {
        let lib = lib.clone();
        let chunk: Vec<NewRun> = chunk
            .iter()
            .enumerate()
            .map(|(i, run)| {
                let new = NewRun::new(run.clone())
                    .with_kind(kinds[(t * MAX_BATCH + i) % kinds.len()].clone());
                match payload {
                    0 => new,
                    n => new.with_payload(vec![b'p'; n]),
                }
            })
            .collect();
        tasks.push((
            t,
            tokio::spawn(async move {
                for result in lib.create_many_with(&chunk).await? {
                    result?;
                }
                Ok::<(), BenchError>(())
            }),
        ));
        // At most four calls in flight.
        if tasks.len() == 4 {
            for (_, task) in tasks.drain(..) {
                task.await.map_err(|e| BenchError::setup(e.to_string()))??;
            }
        }
    }
    for (_, task) in tasks {
        task.await.map_err(|e| BenchError::setup(e.to_string()))??;
    }
    Ok(())
}

pub(super) fn effect(run: &RunId, fence: u64) -> Vec<u8> {
    format!("effect of {run} under fence {fence}").into_bytes()
}

/// `workers` Worker instances drain `jobs` runs, each created with `payload` bytes that its
/// handler checks, spread over `kinds` kinds that each worker serves with a handler of its own;
/// returns the row, validated.
async fn drain(
    target: &Target,
    workers: usize,
    setting: Setting,
    jobs: usize,
    payload: usize,
    kinds: usize,
) -> Result<Value, BenchError> {
    let kinds = bench_kinds(kinds)?;
    let ns = target.namespace("worker");
    let lib = target.lib(&ns).await?;
    let names = job_names(jobs)?;
    create_backlog_with(&lib, &names, payload, &kinds).await?;

    let mut fleet = Fleet::new(jobs);
    // The Redis server's CPU seconds before and after the drain: a figure the machine's load
    // moves far less than jobs/s, since the server is the bottleneck.
    let server_cpu = || async {
        match &target.raw {
            RawConn::Redis(conn) => {
                Ok::<_, BenchError>(Some(super::best::server_stats(&mut conn.clone()).await?.1))
            }
            RawConn::Pg(_) => Ok(None),
        }
    };
    let cpu_before = server_cpu().await?;
    let t0 = Instant::now();
    for w in 0..workers {
        let worker = fleet.counting(Worker::new(
            lib.clone(),
            WorkerId::new(format!("bench-worker-{w}"))?,
            setting.config()?,
        )?);
        let shutdown = fleet.shutdown();
        let handler = move |ctx: RunContext| async move {
            let got = ctx.payload().map_or(0, <[u8]>::len);
            if got != payload {
                return Err(format!("payload of {got} bytes, not {payload}").into());
            }
            Ok::<_, BoxError>(End::CompleteWith(effect(ctx.run(), ctx.fence().get())))
        };
        let served = kinds
            .iter()
            .fold(Kinds::new(), |k, kind| k.handle(kind.clone(), handler));
        fleet.spawn(async move { worker.run_kinds(served, shutdown).await });
    }
    let limit = Duration::from_secs(300);
    let waited = fleet.wait(limit).await;
    let secs = t0.elapsed().as_secs_f64();
    let cpu_after = server_cpu().await?;
    let totals = fleet.stop().await?;
    if let Err(completed) = waited {
        return Err(BenchError::wrong(format!(
            "{workers} workers completed {completed} of {jobs} jobs within {limit:?}"
        )));
    }
    let (done, batches, claimed, not_ok) = (
        totals.completed,
        totals.batches,
        totals.claimed,
        totals.not_ok,
    );
    checked_store(target, &ns, &lib, &names).await?;
    if done != jobs as u64 || not_ok != 0 {
        return Err(BenchError::wrong(format!(
            "worker reports: {done} completed of {jobs} jobs in the store, {not_ok} refused, failed or errored"
        )));
    }
    drop_namespace(target, &ns).await?;
    Ok(json!({
        "workers": workers,
        "setting": setting.json(),
        "jobs": jobs,
        "payload_bytes": payload,
        "kinds": kinds.len(),
        "secs": secs,
        "jobs_per_s": jobs as f64 / secs,
        "server_cpu_us_per_job": cpu_before
            .zip(cpu_after)
            .map(|(before, after)| (after - before) * 1e6 / jobs as f64),
        "claimed": claimed,
        "batches": batches,
        "ends_per_batch": done as f64 / batches.max(1) as f64,
        "validated": format!(
            "{jobs} runs completed in the store, each with one journal entry under its final fence; reports' completed sum {done}"
        ),
    }))
}

/// Every run is completed with exactly one journal entry, written under its final fence, and
/// holding the effect its handler returned.
pub(super) async fn checked_store(
    target: &Target,
    ns: &str,
    lib: &Arc<dyn LeaseStore>,
    names: &[RunId],
) -> Result<(), BenchError> {
    let raw = target.raw.namespace(ns);
    let text: Vec<String> = names.iter().map(|r| r.as_str().to_owned()).collect();
    let seen = raw.seen(&text).await?;
    let bad = text
        .iter()
        .zip(&seen)
        .find(|(_, s)| s.state != "completed" || s.journal != 1);
    if let Some((run, s)) = bad {
        return Err(BenchError::wrong(format!(
            "worker run {run}: expected completed with one journal entry, store has {s:?}"
        )));
    }
    // The entry's fence and payload, 16 reads in flight.
    let fences: Arc<Vec<(RunId, u64)>> = Arc::new(
        names
            .iter()
            .cloned()
            .zip(seen.iter().map(|s| s.fence))
            .collect(),
    );
    let mut tasks = Vec::new();
    for t in 0..16 {
        let (lib, fences) = (lib.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            for (run, fence) in fences.iter().skip(t).step_by(16) {
                let journal = lib.journal(run).await?;
                let [entry] = journal.as_slice() else {
                    return Err(BenchError::wrong(format!(
                        "{run}: {} entries",
                        journal.len()
                    )));
                };
                if entry.fence.get() != *fence || entry.payload != effect(run, *fence) {
                    return Err(BenchError::wrong(format!(
                        "{run}: entry under fence {} with {:?}, run at fence {fence}",
                        entry.fence,
                        String::from_utf8_lossy(&entry.payload)
                    )));
                }
            }
            Ok::<(), BenchError>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| BenchError::setup(e.to_string()))??;
    }
    Ok(())
}

/// The settings trial at 4 instances, then 1/4/16 instances with the fastest setting.
pub(super) async fn throughput(
    target: &Target,
    jobs: usize,
    counts: &[usize],
    payload: usize,
    kinds: usize,
    quick: bool,
) -> Result<Value, BenchError> {
    let durable = durability(target).await?;
    let trial_jobs = if quick { jobs } else { jobs / 2 };
    let mut trials = Vec::new();
    let mut best: Option<(f64, Setting)> = None;
    for setting in SETTINGS {
        eprintln!(
            "bench: {} worker setting {setting:?}, 4 instances, {trial_jobs} jobs",
            target.kind.name()
        );
        let row = drain(target, 4, setting, trial_jobs, 0, 1).await?;
        let rate = row["jobs_per_s"].as_f64().unwrap_or(0.0);
        if best.is_none_or(|(b, _)| rate > b) {
            best = Some((rate, setting));
        }
        trials.push(row);
    }
    let (_, setting) = best.ok_or_else(|| BenchError::setup("no worker setting tried"))?;
    let mut rows = Vec::new();
    for &workers in counts {
        eprintln!(
            "bench: {} {workers} workers drain {jobs} jobs",
            target.kind.name()
        );
        let mut plain = drain(target, workers, setting, jobs, 0, 1).await?;
        let rate = |row: &Value| row["jobs_per_s"].as_f64().unwrap_or(0.0);
        // The limit: the same claim and end batches by hand, right after.
        let claim = setting.concurrency.min(MAX_BATCH);
        eprintln!(
            "bench: {} limit row, {workers} loops claim {claim} and end them, {jobs} jobs",
            target.kind.name()
        );
        let limit = super::limit::drain(target, workers, claim, jobs).await?;
        plain["over_limit"] = json!(rate(&plain) / rate(&limit));
        plain["limit"] = limit;
        if payload == 0 && kinds <= 1 {
            rows.push(plain);
            continue;
        }
        let mut row = json!({"workers": workers});
        // The same drain with payloads, with kinds, and with both (as a job queue uses them),
        // each right after the plain one: each ratio is of one run.
        let variants = [
            ("payload", payload > 0, payload, 1),
            ("kinds", kinds > 1, 0, kinds),
            ("both", payload > 0 && kinds > 1, payload, kinds),
        ];
        for (name, wanted, payload, kinds) in variants {
            if !wanted {
                continue;
            }
            eprintln!(
                "bench: {} {workers} workers drain {jobs} jobs with {name} ({payload} payload bytes, {kinds} kinds)",
                target.kind.name()
            );
            let with = drain(target, workers, setting, jobs, payload, kinds).await?;
            row[format!("{name}_over_plain")] = json!(rate(&with) / rate(&plain));
            row[format!("with_{name}")] = with;
        }
        row["plain"] = plain;
        rows.push(row);
    }
    Ok(json!({
        "part": "worker",
        "backend": target.kind.name(),
        "durability": durable,
        "ttl_s": TTL_S,
        "payload_bytes": payload,
        "kinds": kinds,
        "trials": trials,
        "best_setting": setting.json(),
        "rows": rows,
    }))
}

/// One handover trial's measurements.
struct Handover {
    ms: f64,
    fences_ok: bool,
}

/// Worker A holds `runs` runs with handlers that never finish and is shut down with a short
/// grace; worker B, polling, claims them. Measures shutdown call → B's last claim, three times.
pub(super) async fn handover(target: &Target, runs: usize) -> Result<Value, BenchError> {
    let grace = Duration::from_millis(100);
    let poll = Duration::from_millis(50);
    let durable = durability(target).await?;
    let mut trials = Vec::new();
    for _ in 0..3 {
        trials.push(handover_once(target, runs, grace, poll).await?);
    }
    let mut ms: Vec<f64> = trials.iter().map(|t| t.ms).collect();
    ms.sort_by(f64::total_cmp);
    if trials.iter().any(|t| !t.fences_ok) {
        return Err(BenchError::wrong(
            "handover: a fence did not move by exactly one",
        ));
    }
    Ok(json!({
        "part": "handover",
        "backend": target.kind.name(),
        "durability": durable,
        "runs": runs,
        "grace_ms": grace.as_millis() as u64,
        "poll_ms": poll.as_millis() as u64,
        "trials_ms": ms,
        "median_ms": ms[ms.len() / 2],
        "max_ms": ms[ms.len() - 1],
        "fences": "every run's fence under B = its fence under A + 1",
    }))
}

async fn handover_once(
    target: &Target,
    runs: usize,
    grace: Duration,
    poll: Duration,
) -> Result<Handover, BenchError> {
    let ns = target.namespace("handover");
    let lib = target.lib(&ns).await?;
    let names: Vec<RunId> = (0..runs)
        .map(|i| RunId::new(format!("held-{i:05}")))
        .collect::<Result<_, _>>()?;
    create_backlog(&lib, &names).await?;
    let ttl = Ttl::from_secs(TTL_S)?;
    let config = |concurrency: usize| {
        WorkerConfig::new(ttl)
            .with_concurrency(concurrency)
            .with_poll_interval(poll)
            .with_grace(grace)
    };

    // A: holds every run; its handlers never finish.
    let a_fences: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let a_started = Arc::new(Notify::new());
    let a_stop = CancellationToken::new();
    let a = Worker::new(lib.clone(), WorkerId::new("handover-a")?, config(runs))?;
    let a_task = {
        let (fences, started, stop) = (a_fences.clone(), a_started.clone(), a_stop.clone());
        tokio::spawn(async move {
            a.run(
                move |ctx: RunContext| {
                    let (fences, started) = (fences.clone(), started.clone());
                    async move {
                        let n = {
                            let mut f = fences.lock().unwrap_or_else(|e| e.into_inner());
                            f.insert(ctx.run().as_str().to_owned(), ctx.fence().get());
                            f.len()
                        };
                        if n == runs {
                            started.notify_one();
                        }
                        std::future::pending::<()>().await;
                        Ok::<_, BoxError>(End::Complete)
                    }
                },
                stop,
            )
            .await
        })
    };
    tokio::time::timeout(Duration::from_secs(30), a_started.notified())
        .await
        .map_err(|_| BenchError::wrong("handover: worker A did not start every handler"))?;

    // B: polling, idle while A holds everything.
    let b_claims: Arc<Mutex<Vec<(String, u64, Instant)>>> = Arc::default();
    let b_all = Arc::new(Notify::new());
    let b_stop = CancellationToken::new();
    let b = Worker::new(lib.clone(), WorkerId::new("handover-b")?, config(runs))?;
    let b_task = {
        let (claims, all, stop) = (b_claims.clone(), b_all.clone(), b_stop.clone());
        tokio::spawn(async move {
            b.run(
                move |ctx: RunContext| {
                    let (claims, all) = (claims.clone(), all.clone());
                    async move {
                        let n = {
                            let mut c = claims.lock().unwrap_or_else(|e| e.into_inner());
                            c.push((
                                ctx.run().as_str().to_owned(),
                                ctx.fence().get(),
                                Instant::now(),
                            ));
                            c.len()
                        };
                        if n == runs {
                            all.notify_one();
                        }
                        Ok::<_, BoxError>(End::Complete)
                    }
                },
                stop,
            )
            .await
        })
    };
    // Let B back off to its poll interval.
    tokio::time::sleep(poll * 6).await;
    let cut = Instant::now();
    a_stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), b_all.notified())
        .await
        .map_err(|_| BenchError::wrong("handover: worker B did not claim every run"))?;
    b_stop.cancel();
    let a_report = a_task
        .await
        .map_err(|e| BenchError::setup(e.to_string()))??;
    let b_report = b_task
        .await
        .map_err(|e| BenchError::setup(e.to_string()))??;
    let claims = b_claims.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let a_fences = a_fences.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let last = claims.iter().map(|c| c.2).max().unwrap_or(cut);
    let fences_ok = claims.len() == runs
        && claims
            .iter()
            .all(|(run, fence, _)| a_fences.get(run).is_some_and(|a| a + 1 == *fence));
    if a_report.released != runs as u64 || b_report.completed != runs as u64 {
        return Err(BenchError::wrong(format!(
            "handover: A released {} and B completed {} of {runs}",
            a_report.released, b_report.completed
        )));
    }
    for run in &names {
        let record = lib.inspect(run).await?;
        if record.state != RunState::Completed || record.fence.get() != 2 {
            return Err(BenchError::wrong(format!("handover: {run} is {record:?}")));
        }
    }
    drop_namespace(target, &ns).await?;
    Ok(Handover {
        ms: last.duration_since(cut).as_secs_f64() * 1_000.0,
        fences_ok,
    })
}

/// The worker and handover measurements as tables.
pub(super) fn describe(v: &Value) -> String {
    let backend = v["backend"].as_str().unwrap_or("?");
    let durable = v["durability"].as_str().unwrap_or("?");
    let f = |x: &Value| x.as_f64().unwrap_or(0.0);
    if v["part"] == "handover" {
        return format!(
            "graceful handover, {backend} ({durable}): worker A holds {} runs (handlers that never finish) and is shut down with {} ms of grace; worker B polls every {} ms; shutdown call → B's last claim: {} ms (median {:.0} ms, max {:.0} ms); {}",
            v["runs"], v["grace_ms"], v["poll_ms"],
            v["trials_ms"].as_array().into_iter().flatten().map(|m| format!("{:.0}", f(m))).collect::<Vec<_>>().join(", "),
            f(&v["median_ms"]), f(&v["max_ms"]), v["fences"].as_str().unwrap_or(""),
        );
    }
    let setting = |s: &Value| {
        format!(
            "concurrency {}, batch {}, delay {} ms",
            s["concurrency"], s["batch"], s["delay_ms"]
        )
    };
    let mut out = format!(
        "Worker runtime, {backend} ({durable}): each job one effect journaled with its completion (End::CompleteWith, group-committed by end_many); TTL {} s\nsetting trial, 4 instances:\n| setting | jobs | jobs/s | ends per end_many | validated |\n|---|--:|--:|--:|---|",
        v["ttl_s"]
    );
    for r in v["trials"].as_array().into_iter().flatten() {
        out += &format!(
            "\n| {} | {} | {:.0} | {:.1} | {} |",
            setting(&r["setting"]),
            r["jobs"],
            f(&r["jobs_per_s"]),
            f(&r["ends_per_batch"]),
            r["validated"].as_str().unwrap_or("")
        );
    }
    out += &format!(
        "\nwith the fastest setting ({}); the limit: as many loops claiming the setting's concurrency with claim_next and completing them with one end_many, by hand:\n| instances | runs | jobs | jobs/s | vs plain | server CPU µs / job | vs plain | limit jobs/s | vs limit | ends per end_many | validated |\n|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
        setting(&v["best_setting"])
    );
    for r in v["rows"].as_array().into_iter().flatten() {
        // A plain row, or a plain row paired with the same drain with payloads, kinds or both.
        let mut drains = vec![(r.get("plain").unwrap_or(r), None)];
        for name in ["payload", "kinds", "both"] {
            if let Some(with) = r.get(format!("with_{name}").as_str()) {
                let what = match (f(&with["payload_bytes"]) as u64, f(&with["kinds"]) as u64) {
                    (0, k) => format!("{k} kinds"),
                    (b, 1) => format!("{b} B payloads"),
                    (b, k) => format!("{b} B payloads, {k} kinds"),
                };
                let ratio = f(&r[format!("{name}_over_plain").as_str()]);
                drains.push((with, Some((what, ratio))));
            }
        }
        let plain_cpu = r.get("plain").unwrap_or(r)["server_cpu_us_per_job"].as_f64();
        for (d, vs) in drains {
            let (cpu, cpu_ratio) = match (d["server_cpu_us_per_job"].as_f64(), plain_cpu) {
                (Some(us), Some(plain)) => (format!("{us:.1}"), format!("{:.2}×", us / plain)),
                _ => ("—".to_owned(), "—".to_owned()),
            };
            let (what, ratio) = match vs {
                Some((what, ratio)) => (what, format!("{ratio:.2}×")),
                None => ("one kind, no payload".to_owned(), "1".to_owned()),
            };
            let (limit, over) = match d.get("limit") {
                Some(limit) => (
                    format!("{:.0}", f(&limit["jobs_per_s"])),
                    format!("{:.2}×", f(&d["over_limit"])),
                ),
                None => ("—".to_owned(), "—".to_owned()),
            };
            out += &format!(
                "\n| {} | {what} | {} | {:.0} | {ratio} | {cpu} | {cpu_ratio} | {limit} | {over} | {:.1} | {} |",
                r["workers"],
                d["jobs"],
                f(&d["jobs_per_s"]),
                f(&d["ends_per_batch"]),
                d["validated"].as_str().unwrap_or("")
            );
        }
    }
    out
}
