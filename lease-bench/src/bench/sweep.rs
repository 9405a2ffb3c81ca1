//! The `sweep` part: claim, renew, renew_many(1000) and claim_next(10) through the library, one
//! client, at growing table sizes and with many leases held, so one can see whether cost stays
//! flat as the store grows.

use std::collections::HashSet;
use std::sync::Arc;

use distribution::{Lease, LeaseStore, RunId, Ttl, WorkerId, MAX_BATCH};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::raw::RawConn;
use super::{BenchError, Summary, Target, TTL_MS};

/// Runs beside the held leases in the held case: what the measurement takes.
const FREE_BESIDE_HELD: usize = 10_000;
/// Above this size Postgres tables are loaded with one raw `INSERT … SELECT generate_series`.
const LIBRARY_LOAD_MAX: usize = 200_000;

/// One table the sweep measures.
struct Case {
    label: String,
    runs: usize,
    held: usize,
}

fn size_label(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

fn run_name(i: usize) -> String {
    format!("sw-{i:08}")
}

/// The sweep over `sizes` runs, then `held` held leases beside 10,000 free runs.
pub(super) async fn sweep(
    target: &Target,
    sizes: &[usize],
    held: usize,
    quick: bool,
) -> Result<Value, BenchError> {
    let mut cases: Vec<Case> = sizes
        .iter()
        .map(|&n| Case {
            label: format!("{} runs", size_label(n)),
            runs: n,
            held: 0,
        })
        .collect();
    if held > 0 {
        cases.push(Case {
            label: format!(
                "{} held + {} free",
                size_label(held),
                size_label(FREE_BESIDE_HELD)
            ),
            runs: held + FREE_BESIDE_HELD,
            held,
        });
    }
    let (ops, many_calls, next_calls) = if quick {
        (200, 10, 100)
    } else {
        (500, 20, 200)
    };
    let mut rows = Vec::new();
    for case in &cases {
        let ns = target.namespace("sweep");
        let lib = target.lib(&ns).await?;
        eprintln!(
            "bench: {} sweep, {}: loading",
            target.kind.name(),
            case.label
        );
        let t0 = Instant::now();
        let loaded_with = load(target, &ns, &lib, case.runs).await?;
        if case.held > 0 {
            hold(&lib, case.held).await?;
        }
        let load_secs = t0.elapsed().as_secs_f64();
        let mut row = measure_case(target, &ns, &lib, case, ops, many_calls, next_calls).await?;
        row["table"] = json!(case.label);
        row["runs"] = json!(case.runs);
        row["held"] = json!(case.held);
        row["loaded_with"] = json!(loaded_with);
        row["load_secs"] = json!(load_secs);
        rows.push(row);
        drop(lib);
        drop_namespace(target, &ns).await?;
    }
    // p50 at the largest size ÷ p50 at the smallest, per operation.
    let plain: Vec<&Value> = rows.iter().filter(|r| r["held"] == 0).collect();
    let mut growth = json!({});
    if let (Some(first), Some(last)) = (plain.first(), plain.last()) {
        for op in ["claim", "renew", "renew_many", "claim_next"] {
            let p = |r: &Value| r[op]["p50_us"].as_f64().unwrap_or(0.0);
            growth[op] = json!(p(last) / p(first).max(f64::MIN_POSITIVE));
        }
        growth["from"] = first["table"].clone();
        growth["to"] = last["table"].clone();
    }
    Ok(json!({
        "part": "sweep",
        "backend": target.kind.name(),
        "clients": 1,
        "ops": {"claim": ops, "renew": ops, "renew_many": many_calls, "claim_next": next_calls},
        "rows": rows,
        "p50_growth": growth,
    }))
}

/// Creates runs `sw-00000000` … in creation order; returns how.
async fn load(
    target: &Target,
    ns: &str,
    lib: &Arc<dyn LeaseStore>,
    runs: usize,
) -> Result<String, BenchError> {
    if let (RawConn::Pg(pool), true) = (&target.raw, runs > LIBRARY_LOAD_MAX) {
        let q = quoted(ns);
        sqlx::query(&format!(
            "INSERT INTO {q}.runs (run_id) \
             SELECT 'sw-' || lpad(g::text, 8, '0') FROM generate_series(0, $1 - 1) AS g"
        ))
        .bind(runs as i64)
        .execute(pool)
        .await?;
        sqlx::query(&format!("VACUUM ANALYZE {q}.runs"))
            .execute(pool)
            .await?;
        return Ok("raw INSERT … SELECT generate_series, then VACUUM ANALYZE".to_owned());
    }
    // Four calls in flight, each of MAX_BATCH ids, in order within each call.
    let chunks: Vec<Vec<RunId>> = (0..runs)
        .step_by(MAX_BATCH)
        .map(|start| {
            (start..(start + MAX_BATCH).min(runs))
                .map(|i| RunId::new(run_name(i)))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()?;
    let chunks = Arc::new(chunks);
    let mut tasks = Vec::new();
    for t in 0..4 {
        let (lib, chunks) = (lib.clone(), chunks.clone());
        tasks.push(tokio::spawn(async move {
            for chunk in chunks.iter().skip(t).step_by(4) {
                for result in lib.create_many(chunk).await? {
                    result?;
                }
            }
            Ok::<(), BenchError>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| BenchError::setup(e.to_string()))??;
    }
    if let RawConn::Pg(pool) = &target.raw {
        sqlx::query(&format!("VACUUM ANALYZE {}.runs", quoted(ns)))
            .execute(pool)
            .await?;
        return Ok("library create_many (1,000 per call), then VACUUM ANALYZE".to_owned());
    }
    Ok("library create_many (1,000 per call)".to_owned())
}

/// Claims the `held` oldest runs as another worker, for the whole measurement.
async fn hold(lib: &Arc<dyn LeaseStore>, held: usize) -> Result<(), BenchError> {
    let worker = WorkerId::new("sweep-holder")?;
    let ttl = Ttl::from_millis(TTL_MS)?;
    let mut got = 0;
    while got < held {
        let n = lib
            .claim_next(&worker, ttl, (held - got).min(MAX_BATCH))
            .await?
            .len();
        if n == 0 {
            return Err(BenchError::setup("sweep: nothing claimable to hold"));
        }
        got += n;
    }
    Ok(())
}

fn quoted(ns: &str) -> String {
    format!("\"{}\"", ns.replace('"', "\"\""))
}

/// Frees the case's data: the schema, or the namespace's keys.
async fn drop_namespace(target: &Target, ns: &str) -> Result<(), BenchError> {
    match &target.raw {
        RawConn::Pg(pool) => {
            sqlx::query(&format!("DROP SCHEMA {} CASCADE", quoted(ns)))
                .execute(pool)
                .await?;
        }
        RawConn::Redis(conn) => {
            let mut conn = conn.clone();
            let mut cursor: u64 = 0;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{{lease:{ns}}}*"))
                    .arg("COUNT")
                    .arg(10_000)
                    .query_async(&mut conn)
                    .await?;
                if !keys.is_empty() {
                    let _: u64 = redis::cmd("UNLINK")
                        .arg(&keys)
                        .query_async(&mut conn)
                        .await?;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
    }
    Ok(())
}

/// Times `n` runs of `body` (with `k` counting from 0), after `warm` untimed ones.
macro_rules! timed {
    ($n:expr, $warm:expr, |$k:ident| $body:block) => {{
        let mut lat = Vec::with_capacity($n);
        for $k in 0..($warm + $n) {
            let t = Instant::now();
            $body
            if $k >= $warm {
                lat.push(t.elapsed().as_nanos() as u64);
            }
        }
        let secs = lat.iter().sum::<u64>() as f64 / 1e9;
        Summary::of(lat, secs)
    }};
}

const WARM: usize = 20;

/// The four operations on one loaded table, validated afterwards.
async fn measure_case(
    target: &Target,
    ns: &str,
    lib: &Arc<dyn LeaseStore>,
    case: &Case,
    ops: usize,
    many_calls: usize,
    next_calls: usize,
) -> Result<Value, BenchError> {
    let raw = target.raw.namespace(ns);
    let worker = WorkerId::new("sweep-worker")?;
    let ttl = Ttl::from_millis(TTL_MS)?;
    // claim: runs spread over the free part of the table (the newest 10,000 when leases are
    // held; the whole table otherwise).
    let free = case.runs - case.held;
    let stride = (free / (ops + WARM)).max(1);
    let claim_ids: Vec<RunId> = (0..ops + WARM)
        .map(|j| RunId::new(run_name(case.held + j * stride)))
        .collect::<Result<_, _>>()?;
    let mut claimed: Vec<Lease> = Vec::with_capacity(ops + WARM);
    let claim = timed!(ops, WARM, |k| {
        claimed.push(lib.claim(&claim_ids[k], &worker, ttl).await?);
    });
    let lease = claimed[0].clone();
    let renew = timed!(ops, WARM, |_k| {
        lib.renew(&lease).await?;
    });
    // renew_many: 1,000 leases taken by claim_next (not timed).
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while batch.len() < MAX_BATCH {
        let got = lib
            .claim_next(&worker, ttl, MAX_BATCH - batch.len())
            .await?;
        if got.is_empty() {
            return Err(BenchError::setup("sweep: too few runs for renew_many"));
        }
        batch.extend(got);
    }
    let warm_many = 2;
    let renew_many = timed!(many_calls, warm_many, |_k| {
        for result in lib.renew_many(&batch).await? {
            result?;
        }
    });
    let mut handed: Vec<(String, u64)> = Vec::new();
    let claim_next = timed!(next_calls, WARM, |_k| {
        let got = lib.claim_next(&worker, ttl, 10).await?;
        if got.len() != 10 {
            return Err(BenchError::wrong(format!(
                "sweep claim_next(10) returned {}",
                got.len()
            )));
        }
        handed.extend(
            got.iter()
                .map(|l| (l.run().as_str().to_owned(), l.fence().get())),
        );
    });

    // Validation: every claim and claim_next landed (fence 1, our worker), distinct; the
    // renewed lease counted every renewal (it was also claimed: fence 1).
    let me = Some(worker.as_str().to_owned());
    let claim_names: Vec<String> = claimed
        .iter()
        .map(|l| l.run().as_str().to_owned())
        .collect();
    for (run, s) in claim_names.iter().zip(raw.seen(&claim_names).await?) {
        let heartbeats = if *run == claim_names[0] {
            ops + WARM
        } else {
            0
        } as u64;
        if s.fence != 1 || s.owner != me || s.heartbeats != heartbeats {
            return Err(BenchError::wrong(format!(
                "sweep claim of {run}: store has {s:?}"
            )));
        }
    }
    let many_names: Vec<String> = batch.iter().map(|l| l.run().as_str().to_owned()).collect();
    for (run, s) in many_names.iter().zip(raw.seen(&many_names).await?) {
        if s.heartbeats != (many_calls + warm_many) as u64 || s.owner != me {
            return Err(BenchError::wrong(format!(
                "sweep renew_many of {run}: store has {s:?}"
            )));
        }
    }
    let mut distinct = HashSet::new();
    let next_names: Vec<String> = handed.iter().map(|(r, _)| r.clone()).collect();
    for ((run, fence), s) in handed.iter().zip(raw.seen(&next_names).await?) {
        if !distinct.insert(run.clone()) || s.fence != *fence || *fence != 1 || s.owner != me {
            return Err(BenchError::wrong(format!(
                "sweep claim_next handed {run} (fence {fence}): store has {s:?}"
            )));
        }
    }
    let checked = claim_names.len()
        + (ops + WARM)
        + many_names.len() * (many_calls + warm_many)
        + next_names.len();
    Ok(json!({
        "claim": claim.json(),
        "renew": renew.json(),
        "renew_many": renew_many.json(),
        "claim_next": claim_next.json(),
        "validated": format!("{checked} effects checked"),
    }))
}

/// The sweep as a table.
pub(super) fn describe(v: &Value) -> String {
    let backend = v["backend"].as_str().unwrap_or("?");
    let mut out = format!(
        "table-size sweep, {backend}: library, 1 client; per table {} claims, {} renewals, {} renew_many(1000), {} claim_next(10) (after warm-up); p50 in µs\n| table | loaded with | load s | claim p50 | claim ops/s | renew p50 | renew ops/s | renew_many(1000) p50 | renew_many calls/s | claim_next(10) p50 | claim_next calls/s | validated |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
        v["ops"]["claim"], v["ops"]["renew"], v["ops"]["renew_many"], v["ops"]["claim_next"]
    );
    for r in v["rows"].as_array().into_iter().flatten() {
        let p = |op: &str| r[op]["p50_us"].as_f64().unwrap_or(0.0);
        let o = |op: &str| r[op]["ops_per_s"].as_f64().unwrap_or(0.0);
        out += &format!(
            "\n| {} | {} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} | {} |",
            r["table"].as_str().unwrap_or(""),
            r["loaded_with"].as_str().unwrap_or(""),
            r["load_secs"].as_f64().unwrap_or(0.0),
            p("claim"),
            o("claim"),
            p("renew"),
            o("renew"),
            p("renew_many"),
            o("renew_many"),
            p("claim_next"),
            o("claim_next"),
            r["validated"].as_str().unwrap_or(""),
        );
    }
    let g = &v["p50_growth"];
    if let Some(to) = g["to"].as_str() {
        let f = |op: &str| g[op].as_f64().unwrap_or(0.0);
        let worst = ["claim", "renew", "renew_many", "claim_next"]
            .iter()
            .map(|op| f(op))
            .fold(0.0, f64::max);
        out += &format!(
            "\np50 at {to} ÷ p50 at {}: claim {:.2}, renew {:.2}, renew_many(1000) {:.2}, claim_next(10) {:.2} (target ≤ 1.30: {})",
            g["from"].as_str().unwrap_or("?"),
            f("claim"),
            f("renew"),
            f("renew_many"),
            f("claim_next"),
            if worst <= 1.3 { "met" } else { "missed" },
        );
    }
    out
}
