//! The `best` part: the library against the best raw statement for each job on the same data
//! (Postgres, `sql/best_*.sql`), and the library's claim → renew → release cycle against an
//! rslock-style lock cycle (Redis), with the server's CPU per cycle from `INFO commandstats`.
//!
//! The best statements do less than the library's (see each file's header); the ratio is what
//! the design costs, not the wrapper. Every effect is validated as in the `ops` part.

use std::collections::HashMap;
use std::sync::Arc;

use distribution::{LeaseStore, RunId, RunState, Ttl, WorkerId};
use redis::aio::ConnectionManager;
use redis::Script;
use serde_json::{json, Value};
use sqlx::Row;
use tokio::time::Instant;

use super::raw::{Raw, RawConn};
use super::{BenchError, Kind, Sizes, Summary, Target, TTL_MS};

/// `lease-bench/sql/best_*.sql` with `{schema}` spliced in.
pub(crate) struct BestSql {
    claim: String,
    renew: String,
    renew_many: String,
    claim_next: String,
    end_many: String,
}

impl BestSql {
    fn new(quoted: &str) -> BestSql {
        let q = |sql: &str| sql.replace("{schema}", quoted);
        BestSql {
            claim: q(include_str!("../../sql/best_claim.sql")),
            renew: q(include_str!("../../sql/best_renew.sql")),
            renew_many: q(include_str!("../../sql/best_renew_many.sql")),
            claim_next: q(include_str!("../../sql/best_claim_next.sql")),
            end_many: q(include_str!("../../sql/best_end_many.sql")),
        }
    }
}

impl RawConn {
    /// The raw path over `ns` standing for the best statements (Postgres only).
    pub(crate) fn namespace_best(&self, ns: &str) -> Raw {
        match self.namespace(ns) {
            Raw::Pg { pool, sql, .. } => {
                let best = Some(Box::new(BestSql::new(&sql.quoted)));
                Raw::Pg { pool, sql, best }
            }
            other => other,
        }
    }
}

fn missing(op: &str) -> BenchError {
    BenchError::wrong(format!(
        "best {op} matched no row: the write did not happen"
    ))
}

impl Raw {
    /// Whether this raw path sends the best statements.
    pub(crate) fn is_best(&self) -> bool {
        matches!(self, Raw::Pg { best: Some(_), .. })
    }

    fn best_sql(&self) -> Result<(&sqlx::PgPool, &BestSql), BenchError> {
        match self {
            Raw::Pg {
                pool,
                best: Some(best),
                ..
            } => Ok((pool, best)),
            _ => Err(BenchError::setup("best statements exist for Postgres only")),
        }
    }

    /// `best_claim.sql`; returns the fence.
    pub(crate) async fn best_claim(
        &self,
        run: &str,
        worker: &str,
        ttl_ms: u64,
    ) -> Result<u64, BenchError> {
        let (pool, sql) = self.best_sql()?;
        let row = sqlx::query(&sql.claim)
            .bind(run)
            .bind(worker)
            .bind(ttl_ms as i64)
            .fetch_optional(pool)
            .await?
            .ok_or_else(|| missing("claim"))?;
        Ok(row.try_get::<i64, _>("fence")? as u64)
    }

    /// `best_renew.sql`; fails unless one row was renewed.
    pub(crate) async fn best_renew(
        &self,
        run: &str,
        fence: u64,
        ttl_ms: u64,
    ) -> Result<(), BenchError> {
        let (pool, sql) = self.best_sql()?;
        let done = sqlx::query(&sql.renew)
            .bind(run)
            .bind(fence as i64)
            .bind(ttl_ms as i64)
            .execute(pool)
            .await?;
        if done.rows_affected() != 1 {
            return Err(missing("renew"));
        }
        Ok(())
    }

    /// `best_renew_many.sql`; fails unless every lease was renewed (one TTL for the batch: the
    /// first lease's).
    pub(crate) async fn best_renew_many(
        &self,
        leases: &[(&str, u64, u64)],
    ) -> Result<(), BenchError> {
        let (pool, sql) = self.best_sql()?;
        let runs: Vec<&str> = leases.iter().map(|l| l.0).collect();
        let fences: Vec<i64> = leases.iter().map(|l| l.1 as i64).collect();
        let ttl = leases.first().map_or(0, |l| l.2 as i64);
        let rows = sqlx::query(&sql.renew_many)
            .bind(&runs)
            .bind(&fences)
            .bind(ttl)
            .fetch_all(pool)
            .await?;
        if rows.len() != leases.len() {
            return Err(BenchError::wrong(format!(
                "best renew_many renewed {} of {} leases",
                rows.len(),
                leases.len()
            )));
        }
        Ok(())
    }

    /// `best_claim_next.sql`; returns (run, fence) pairs.
    pub(crate) async fn best_claim_next(
        &self,
        worker: &str,
        ttl_ms: u64,
        max: usize,
    ) -> Result<Vec<(String, u64)>, BenchError> {
        let (pool, sql) = self.best_sql()?;
        let rows = sqlx::query(&sql.claim_next)
            .bind(worker)
            .bind(ttl_ms as i64)
            .bind(max as i64)
            .fetch_all(pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get::<String, _>("run_id")?,
                    row.try_get::<i64, _>("fence")? as u64,
                ))
            })
            .collect()
    }

    /// `best_end_many.sql`: completes every lease with `payload` journaled; fails unless each
    /// was completed.
    pub(crate) async fn best_end_many(
        &self,
        leases: &[(&str, u64, u64)],
        payload: &[u8],
    ) -> Result<(), BenchError> {
        let (pool, sql) = self.best_sql()?;
        let runs: Vec<&str> = leases.iter().map(|l| l.0).collect();
        let fences: Vec<i64> = leases.iter().map(|l| l.1 as i64).collect();
        let payloads: Vec<&[u8]> = leases.iter().map(|_| payload).collect();
        let done = sqlx::query(&sql.end_many)
            .bind(&runs)
            .bind(&fences)
            .bind(&payloads)
            .execute(pool)
            .await?;
        if done.rows_affected() != leases.len() as u64 {
            return Err(BenchError::wrong(format!(
                "best end_many completed {} of {} runs",
                done.rows_affected(),
                leases.len()
            )));
        }
        Ok(())
    }
}

/// The commands a cycle sends itself (not those its scripts call, which `commandstats` also
/// counts, inside the script's own time).
const TOP_LEVEL: [&str; 6] = ["set", "evalsha", "evalsha_ro", "eval", "eval_ro", "wait"];

/// `INFO commandstats` (calls and usec per command) and the server's CPU seconds.
pub(super) async fn server_stats(
    conn: &mut ConnectionManager,
) -> Result<(HashMap<String, (u64, u64)>, f64), BenchError> {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let mut stats = HashMap::new();
    for line in text.lines() {
        let Some((name, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| -> u64 {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        stats.insert(name.to_owned(), (field("calls="), field("usec=")));
    }
    let cpu: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let secs = cpu
        .lines()
        .filter(|l| l.starts_with("used_cpu_user:") || l.starts_with("used_cpu_sys:"))
        .filter_map(|l| {
            l.split_once(':')
                .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        })
        .sum();
    Ok((stats, secs))
}

/// One side of the Redis comparison.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Library,
    Rslock,
}

struct SideTotals {
    latencies: Vec<u64>,
    secs: f64,
    cycles: u64,
    usec: u64,
    cpu_secs: f64,
    calls: HashMap<String, u64>,
}

impl SideTotals {
    fn new() -> SideTotals {
        SideTotals {
            latencies: Vec::new(),
            secs: 0.0,
            cycles: 0,
            usec: 0,
            cpu_secs: 0.0,
            calls: HashMap::new(),
        }
    }
}

/// The Redis comparison at each client count: the library's claim → renew → release against
/// `SET NX PX` → extend script → release script, `pairs` measured rounds each (plus a warm-up),
/// alternating which side goes first, each side alone on the server after `CONFIG RESETSTAT`.
pub(super) async fn rslock(
    target: &Target,
    clients: &[usize],
    sizes: &Sizes,
) -> Result<Value, BenchError> {
    let RawConn::Redis(conn) = &target.raw else {
        return Err(BenchError::setup("the rslock comparison needs Redis"));
    };
    let extend = Script::new(include_str!("../../lua/rslock_extend.lua"));
    let release = Script::new(include_str!("../../lua/rslock_release.lua"));
    let ttl = Ttl::from_millis(TTL_MS)?;
    let mut rows = Vec::new();
    for &c in clients {
        let ns = target.namespace(&format!("best_rslock_c{c}"));
        let lib = target.lib(&ns).await?;
        let runs: Vec<RunId> = (0..c)
            .map(|i| RunId::new(format!("cycle-{i}")))
            .collect::<Result<_, _>>()?;
        for result in lib.create_many(&runs).await? {
            result?;
        }
        let per_round = sizes.ops.div_ceil(c).max(1);
        let mut totals = [SideTotals::new(), SideTotals::new()];
        for round in 0..=sizes.pairs {
            let order = if round % 2 == 0 {
                [Side::Library, Side::Rslock]
            } else {
                [Side::Rslock, Side::Library]
            };
            for side in order {
                let mut admin = conn.clone();
                let _: () = redis::cmd("CONFIG")
                    .arg("RESETSTAT")
                    .query_async(&mut admin)
                    .await?;
                let (_, cpu0) = server_stats(&mut admin).await?;
                let t0 = Instant::now();
                let mut tasks = Vec::with_capacity(c);
                for (i, run) in runs.iter().enumerate() {
                    let (lib, run) = (lib.clone(), run.clone());
                    let (mut conn, extend, release) =
                        (conn.clone(), extend.clone(), release.clone());
                    let key = format!("{{bench:{ns}}}:lock:{i}");
                    tasks.push(tokio::spawn(async move {
                        let worker = WorkerId::new(format!("cycle-worker-{i}"))?;
                        let mut lat = Vec::with_capacity(per_round);
                        for k in 0..per_round {
                            let t = Instant::now();
                            match side {
                                Side::Library => library_cycle(&lib, &run, &worker, ttl).await?,
                                Side::Rslock => {
                                    let value =
                                        format!("{i}:{round}:{k}:{}", t0.elapsed().as_nanos());
                                    rslock_cycle(&mut conn, &extend, &release, &key, &value).await?
                                }
                            }
                            lat.push(t.elapsed().as_nanos() as u64);
                        }
                        Ok::<_, BenchError>(lat)
                    }));
                }
                let mut lat = Vec::new();
                for task in tasks {
                    lat.extend(task.await.map_err(|e| BenchError::setup(e.to_string()))??);
                }
                let secs = t0.elapsed().as_secs_f64();
                let (stats, cpu1) = server_stats(&mut admin).await?;
                let cycles = lat.len() as u64;
                // Validation from the server's side: each cycle sent its commands.
                let call = |name: &str| stats.get(name).map_or(0, |s| s.0);
                let (evalsha, set) = (call("evalsha"), call("set"));
                let expected = match side {
                    Side::Library => (3 * cycles, 0),
                    Side::Rslock => (2 * cycles, cycles),
                };
                // The warm-up round also holds the first EVALSHA of each script, refused with
                // NOSCRIPT before the script is loaded.
                let wrong = if round == 0 {
                    evalsha < expected.0 || set < expected.1
                } else {
                    (evalsha, set) != expected
                };
                if wrong {
                    return Err(BenchError::wrong(format!(
                        "{} round {round}: {evalsha} EVALSHA and {set} SET for {cycles} cycles",
                        side_name(side)
                    )));
                }
                if round == 0 {
                    continue; // warm-up: connections, script cache
                }
                let t = &mut totals[side as usize];
                t.latencies.extend(lat);
                t.secs += secs;
                t.cycles += cycles;
                t.cpu_secs += cpu1 - cpu0;
                for (name, (calls, usec)) in &stats {
                    if TOP_LEVEL.contains(&name.as_str()) {
                        t.usec += usec;
                    }
                    if !name.starts_with("config") && name != "info" {
                        *t.calls.entry(name.clone()).or_default() += calls;
                    }
                }
            }
        }
        // Validation from the data: every library cycle claimed (fence +1), renewed (heartbeat
        // +1) and released its run; every rslock key is gone.
        let done = (sizes.pairs + 1) as u64 * per_round as u64;
        for run in &runs {
            let record = lib.inspect(run).await?;
            if record.fence.get() != done
                || record.heartbeats != done
                || record.owner.is_some()
                || record.state != RunState::Runnable
            {
                return Err(BenchError::wrong(format!(
                    "library cycle on {run}: after {done} cycles the store has {record:?}"
                )));
            }
        }
        let mut admin = conn.clone();
        let mut exists = redis::cmd("EXISTS");
        for i in 0..c {
            exists.arg(format!("{{bench:{ns}}}:lock:{i}"));
        }
        let left: u64 = exists.query_async(&mut admin).await?;
        if left != 0 {
            return Err(BenchError::wrong(format!(
                "{left} rslock keys left after release"
            )));
        }
        let side_json = |t: &SideTotals| {
            let s = Summary::of(t.latencies.clone(), t.secs);
            json!({
                "cycles_per_s": s.ops_per_s(),
                "p50_us": s.p50_us,
                "p99_us": s.p99_us,
                "cycles": t.cycles,
                "commandstats_usec_per_cycle": t.usec as f64 / t.cycles.max(1) as f64,
                "server_cpu_us_per_cycle": t.cpu_secs * 1e6 / t.cycles.max(1) as f64,
                "calls": t.calls,
            })
        };
        let (l, r) = (side_json(&totals[0]), side_json(&totals[1]));
        let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
        rows.push(json!({
            "clients": c,
            "library": l,
            "rslock": r,
            "ops_ratio": f(&l, "cycles_per_s") / f(&r, "cycles_per_s").max(f64::MIN_POSITIVE),
            "cpu_ratio": f(&l, "commandstats_usec_per_cycle")
                / f(&r, "commandstats_usec_per_cycle").max(f64::MIN_POSITIVE),
            "validated": format!(
                "{n} library cycles (fence, heartbeats, released) and {n} rslock cycles \
                 (replies, no key left); EVALSHA and SET counts per round",
                n = done * c as u64
            ),
        }));
    }
    Ok(json!({
        "part": "rslock",
        "backend": Kind::Redis.name(),
        "rounds": sizes.pairs,
        "cycles_per_round": sizes.ops,
        "rows": rows,
    }))
}

fn side_name(side: Side) -> &'static str {
    match side {
        Side::Library => "library cycle",
        Side::Rslock => "rslock cycle",
    }
}

/// claim → renew → release through the library.
async fn library_cycle(
    lib: &Arc<dyn LeaseStore>,
    run: &RunId,
    worker: &WorkerId,
    ttl: Ttl,
) -> Result<(), BenchError> {
    let lease = lib.claim(run, worker, ttl).await?;
    let lease = lib.renew(&lease).await?;
    lib.release(&lease).await?;
    Ok(())
}

/// `SET key value NX PX ttl` → extend → release, each checked.
async fn rslock_cycle(
    conn: &mut ConnectionManager,
    extend: &Script,
    release: &Script,
    key: &str,
    value: &str,
) -> Result<(), BenchError> {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(TTL_MS)
        .query_async(conn)
        .await?;
    if set.as_deref() != Some("OK") {
        return Err(BenchError::wrong(format!("rslock SET NX on {key} refused")));
    }
    let extended: i64 = extend
        .key(key)
        .arg(value)
        .arg(TTL_MS)
        .invoke_async(conn)
        .await?;
    let released: i64 = release.key(key).arg(value).invoke_async(conn).await?;
    if (extended, released) != (1, 1) {
        return Err(BenchError::wrong(format!(
            "rslock cycle on {key}: extend {extended}, release {released}"
        )));
    }
    Ok(())
}

/// The rslock comparison as a table.
pub(super) fn describe(v: &Value) -> String {
    let mut out = format!(
        "claim → renew → release cycle, redis: library vs rslock (SET NX PX, extend and release scripts); {} rounds of {} cycles per side, alternating; server CPU from INFO commandstats (usec of the commands each cycle sends, CONFIG RESETSTAT before each side)\n| clients | lib cycles/s | rslock cycles/s | ops ratio | lib p50 µs | rslock p50 µs | lib server µs / cycle | rslock server µs / cycle | CPU ratio (target ≤ 2) | lib process CPU µs / cycle | rslock process CPU µs / cycle | validated |\n|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
        v["rounds"], v["cycles_per_round"]
    );
    for r in v["rows"].as_array().into_iter().flatten() {
        let f = |side: &str, k: &str| r[side][k].as_f64().unwrap_or(0.0);
        out += &format!(
            "\n| {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {} |",
            r["clients"],
            f("library", "cycles_per_s"),
            f("rslock", "cycles_per_s"),
            r["ops_ratio"].as_f64().unwrap_or(0.0),
            f("library", "p50_us"),
            f("rslock", "p50_us"),
            f("library", "commandstats_usec_per_cycle"),
            f("rslock", "commandstats_usec_per_cycle"),
            r["cpu_ratio"].as_f64().unwrap_or(0.0),
            f("library", "server_cpu_us_per_cycle"),
            f("rslock", "server_cpu_us_per_cycle"),
            r["validated"].as_str().unwrap_or(""),
        );
    }
    out
}
