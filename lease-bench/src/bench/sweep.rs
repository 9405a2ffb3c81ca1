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
    // Every table is loaded first; then each operation runs in rounds that visit the tables in
    // turn (rotating which goes first), so background work on the shared machine (autovacuum,
    // an AOF rewrite, other processes) falls on every size alike, as the ops part alternates
    // library and raw calls.
    let mut states = Vec::with_capacity(cases.len());
    for case in &cases {
        let ns = target.namespace("sweep");
        let lib = target.lib(&ns).await?;
        eprintln!(
            "bench: {} sweep, {}: loading",
            target.kind.name(),
            case.label
        );
        let t0 = Instant::now();
        // The held runs first, so that claim_next takes exactly them; then the free ones.
        if case.held > 0 {
            load(target, &ns, &lib, 0..case.held).await?;
            hold(&lib, case.held).await?;
        }
        let loaded_with = load(target, &ns, &lib, case.held..case.runs).await?;
        let load_secs = t0.elapsed().as_secs_f64();
        states.push(CaseState::new(
            target,
            ns,
            lib,
            case,
            ops,
            loaded_with,
            load_secs,
        )?);
    }
    let counts = [ops, ops, many_calls, next_calls];
    for (op, &n) in SWEEP_OPS.iter().zip(&counts) {
        eprintln!("bench: {} sweep, {}", target.kind.name(), op.name());
        if *op == SweepOp::RenewMany {
            for st in &mut states {
                st.take_batch().await?;
            }
        }
        let per_round = n.div_ceil(ROUNDS);
        for round in 0..=ROUNDS {
            let count = if round == 0 { op.warm() } else { per_round };
            let tables = states.len();
            for i in 0..tables {
                let st = &mut states[(i + round) % tables];
                for _ in 0..count {
                    let t = Instant::now();
                    st.one(*op).await?;
                    if round > 0 {
                        st.lat[*op as usize].push(t.elapsed().as_nanos() as u64);
                    }
                }
            }
        }
    }
    let mut rows = Vec::new();
    for (case, st) in cases.iter().zip(states) {
        let mut row = st.validate().await?;
        row["table"] = json!(case.label);
        row["runs"] = json!(case.runs);
        row["held"] = json!(case.held);
        drop_namespace(target, row["ns"].as_str().unwrap_or_default()).await?;
        rows.push(row);
    }
    // p50 at the largest size, and with leases held, ÷ p50 at the smallest size, per operation.
    let plain: Vec<&Value> = rows.iter().filter(|r| r["held"] == 0).collect();
    let ratio = |from: &Value, to: &Value| {
        let mut g = json!({"from": from["table"], "to": to["table"]});
        for op in ["claim", "renew", "renew_many", "claim_next"] {
            let p = |r: &Value| r[op]["p50_us"].as_f64().unwrap_or(0.0);
            g[op] = json!(p(to) / p(from).max(f64::MIN_POSITIVE));
        }
        g
    };
    let mut growth = Vec::new();
    if let (Some(first), Some(last)) = (plain.first(), plain.last()) {
        if plain.len() > 1 {
            growth.push(ratio(first, last));
        }
        if let Some(held) = rows.iter().find(|r| r["held"] != 0) {
            growth.push(ratio(first, held));
        }
    }
    Ok(json!({
        "part": "sweep",
        "backend": target.kind.name(),
        "clients": 1,
        "rounds": ROUNDS,
        "ops": {"claim": ops, "renew": ops, "renew_many": many_calls, "claim_next": next_calls},
        "rows": rows,
        "p50_growth": growth,
    }))
}

/// Creates runs `sw-<i>` for `i` in `range`; returns how.
async fn load(
    target: &Target,
    ns: &str,
    lib: &Arc<dyn LeaseStore>,
    range: std::ops::Range<usize>,
) -> Result<String, BenchError> {
    if let (RawConn::Pg(pool), true) = (&target.raw, range.len() > LIBRARY_LOAD_MAX) {
        let q = quoted(ns);
        sqlx::query(&format!(
            "INSERT INTO {q}.runs (run_id, fence) \
             SELECT 'sw-' || lpad(g::text, 8, '0'), 0 FROM generate_series($1, $2 - 1) AS g"
        ))
        .bind(range.start as i64)
        .bind(range.end as i64)
        .execute(pool)
        .await?;
        sqlx::query(&format!("VACUUM ANALYZE {q}.runs"))
            .execute(pool)
            .await?;
        return Ok("raw INSERT … SELECT generate_series, then VACUUM ANALYZE".to_owned());
    }
    // Four calls in flight, each of MAX_BATCH ids, in order within each call.
    let chunks: Vec<Vec<RunId>> = range
        .clone()
        .step_by(MAX_BATCH)
        .map(|start| {
            (start..(start + MAX_BATCH).min(range.end))
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

pub(super) fn quoted(ns: &str) -> String {
    format!("\"{}\"", ns.replace('"', "\"\""))
}

/// Frees the case's data: the schema, or the namespace's keys.
pub(super) async fn drop_namespace(target: &Target, ns: &str) -> Result<(), BenchError> {
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

/// Measured rounds per operation (after one warm-up round).
const ROUNDS: usize = 5;

/// The operations of the sweep, in the order measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SweepOp {
    Claim,
    Renew,
    RenewMany,
    ClaimNext,
}

const SWEEP_OPS: [SweepOp; 4] = [
    SweepOp::Claim,
    SweepOp::Renew,
    SweepOp::RenewMany,
    SweepOp::ClaimNext,
];

impl SweepOp {
    fn name(self) -> &'static str {
        match self {
            SweepOp::Claim => "claim",
            SweepOp::Renew => "renew",
            SweepOp::RenewMany => "renew_many",
            SweepOp::ClaimNext => "claim_next",
        }
    }

    /// Untimed calls per table in the warm-up round.
    fn warm(self) -> usize {
        match self {
            SweepOp::RenewMany => 2,
            _ => 20,
        }
    }
}

/// One loaded table and what the sweep did to it.
struct CaseState {
    ns: String,
    lib: Arc<dyn LeaseStore>,
    raw: super::raw::Raw,
    worker: WorkerId,
    ttl: Ttl,
    claim_ids: Vec<RunId>,
    claimed: Vec<Lease>,
    renewals: u64,
    batch: Vec<Lease>,
    batch_renewals: u64,
    handed: Vec<(String, u64)>,
    lat: [Vec<u64>; 4],
    loaded_with: String,
    load_secs: f64,
}

impl CaseState {
    fn new(
        target: &Target,
        ns: String,
        lib: Arc<dyn LeaseStore>,
        case: &Case,
        ops: usize,
        loaded_with: String,
        load_secs: f64,
    ) -> Result<CaseState, BenchError> {
        // claim: runs spread over the free part of the table (the newest 10,000 when leases
        // are held; the whole table otherwise).
        let n = ops.div_ceil(ROUNDS) * ROUNDS + SweepOp::Claim.warm();
        let free = case.runs - case.held;
        let stride = (free / n).max(1);
        let claim_ids = (0..n)
            .map(|j| RunId::new(run_name(case.held + j * stride)))
            .collect::<Result<_, _>>()?;
        Ok(CaseState {
            raw: target.raw.namespace(&ns),
            ns,
            lib,
            worker: WorkerId::new("sweep-worker")?,
            ttl: Ttl::from_millis(TTL_MS)?,
            claim_ids,
            claimed: Vec::new(),
            renewals: 0,
            batch: Vec::new(),
            batch_renewals: 0,
            handed: Vec::new(),
            lat: Default::default(),
            loaded_with,
            load_secs,
        })
    }

    /// 1,000 leases for renew_many, taken by claim_next (not timed).
    async fn take_batch(&mut self) -> Result<(), BenchError> {
        while self.batch.len() < MAX_BATCH {
            let got = self
                .lib
                .claim_next(&self.worker, self.ttl, MAX_BATCH - self.batch.len())
                .await?;
            if got.is_empty() {
                return Err(BenchError::setup("sweep: too few runs for renew_many"));
            }
            self.batch.extend(got);
        }
        Ok(())
    }

    async fn one(&mut self, op: SweepOp) -> Result<(), BenchError> {
        match op {
            SweepOp::Claim => {
                let id = self
                    .claim_ids
                    .get(self.claimed.len())
                    .ok_or_else(|| BenchError::setup("sweep: out of runs to claim"))?;
                let lease = self.lib.claim(id, &self.worker, self.ttl).await?;
                self.claimed.push(lease);
            }
            SweepOp::Renew => {
                self.lib.renew(&self.claimed[0]).await?;
                self.renewals += 1;
            }
            SweepOp::RenewMany => {
                for result in self.lib.renew_many(&self.batch).await? {
                    result?;
                }
                self.batch_renewals += 1;
            }
            SweepOp::ClaimNext => {
                let got = self.lib.claim_next(&self.worker, self.ttl, 10).await?;
                if got.len() != 10 {
                    return Err(BenchError::wrong(format!(
                        "sweep claim_next(10) returned {}",
                        got.len()
                    )));
                }
                self.handed.extend(
                    got.iter()
                        .map(|l| (l.run().as_str().to_owned(), l.fence().get())),
                );
            }
        }
        Ok(())
    }

    /// Checks every effect in the store; returns the row.
    async fn validate(self) -> Result<Value, BenchError> {
        // Every claim and claim_next landed (fence 1, our worker) and is distinct; the renewed
        // lease (the first claim) and the batch counted every renewal.
        let me = Some(self.worker.as_str().to_owned());
        let raw = &self.raw;
        let claim_names: Vec<String> = self
            .claimed
            .iter()
            .map(|l| l.run().as_str().to_owned())
            .collect();
        for (i, (run, s)) in claim_names
            .iter()
            .zip(raw.seen(&claim_names).await?)
            .enumerate()
        {
            let heartbeats = if i == 0 { self.renewals } else { 0 };
            if s.fence != 1 || s.owner != me || s.heartbeats != heartbeats {
                return Err(BenchError::wrong(format!(
                    "sweep claim of {run}: store has {s:?}"
                )));
            }
        }
        let many_names: Vec<String> = self
            .batch
            .iter()
            .map(|l| l.run().as_str().to_owned())
            .collect();
        for (run, s) in many_names.iter().zip(raw.seen(&many_names).await?) {
            if s.heartbeats != self.batch_renewals || s.owner != me {
                return Err(BenchError::wrong(format!(
                    "sweep renew_many of {run}: store has {s:?}"
                )));
            }
        }
        let mut distinct = HashSet::new();
        let next_names: Vec<String> = self.handed.iter().map(|(r, _)| r.clone()).collect();
        for ((run, fence), s) in self.handed.iter().zip(raw.seen(&next_names).await?) {
            if !distinct.insert(run.clone()) || s.fence != *fence || *fence != 1 || s.owner != me {
                return Err(BenchError::wrong(format!(
                    "sweep claim_next handed {run} (fence {fence}): store has {s:?}"
                )));
            }
        }
        let checked = claim_names.len()
            + self.renewals as usize
            + many_names.len() * self.batch_renewals as usize
            + next_names.len();
        let summary = |i: usize| {
            let lat = self.lat[i].clone();
            let secs = lat.iter().sum::<u64>() as f64 / 1e9;
            Summary::of(lat, secs).json()
        };
        Ok(json!({
            "ns": self.ns,
            "loaded_with": self.loaded_with,
            "load_secs": self.load_secs,
            "claim": summary(0),
            "renew": summary(1),
            "renew_many": summary(2),
            "claim_next": summary(3),
            "validated": format!("{checked} effects checked"),
        }))
    }
}

/// The sweep as a table.
pub(super) fn describe(v: &Value) -> String {
    let backend = v["backend"].as_str().unwrap_or("?");
    let mut out = format!(
        "table-size sweep, {backend}: library, 1 client; per table {} claims, {} renewals, {} renew_many(1000), {} claim_next(10), in {} rounds that visit the tables in turn (after a warm-up round); p50 in µs\n| table | loaded with | load s | claim p50 | claim ops/s | renew p50 | renew ops/s | renew_many(1000) p50 | renew_many calls/s | claim_next(10) p50 | claim_next calls/s | validated |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
        v["ops"]["claim"], v["ops"]["renew"], v["ops"]["renew_many"], v["ops"]["claim_next"], v["rounds"]
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
    for g in v["p50_growth"].as_array().into_iter().flatten() {
        let to = g["to"].as_str().unwrap_or("?");
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
