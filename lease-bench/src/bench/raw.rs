//! The raw path: the adapters' own SQL and Lua files, sent through the same drivers (sqlx,
//! redis-rs) with no library code, plus the setup and validation reads both paths share.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Row;

use super::BenchError;

/// `claim_next.sql`'s `$4`, as the adapter binds it (`LAGGING_MOVED_PER_CLAIM` in
/// `lease-postgres/src/store.rs`).
const LAGGING_MOVED_PER_CLAIM: i64 = 256;

/// The statements of `lease-postgres/sql`, byte for byte, with `{schema}` spliced in as the
/// adapter does.
pub(crate) struct PgSql {
    claim: String,
    claim_next: String,
    end_many: String,
    renew: String,
    renew_many: String,
    append: String,
    end_lease: String,
    pub(super) quoted: String,
}

impl PgSql {
    fn new(schema: &str) -> PgSql {
        let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
        let q = |sql: &str| distribution::postgres::render_sql(sql, schema);
        PgSql {
            claim: q(include_str!("../../../lease-postgres/sql/claim.sql")),
            claim_next: q(include_str!("../../../lease-postgres/sql/claim_next.sql")),
            end_many: q(include_str!("../../../lease-postgres/sql/end_many.sql")),
            renew: q(include_str!("../../../lease-postgres/sql/renew.sql")),
            renew_many: q(include_str!("../../../lease-postgres/sql/renew_many.sql")),
            append: q(include_str!("../../../lease-postgres/sql/append.sql")),
            end_lease: q(include_str!("../../../lease-postgres/sql/end_lease.sql")),
            quoted,
        }
    }
}

macro_rules! lua {
    ($file:literal) => {
        Script::new(&format!(
            "{}{}{}",
            distribution::redis::script_prelude(),
            include_str!("../../../lease-redis/lua/common.lua"),
            include_str!(concat!("../../../lease-redis/lua/", $file))
        ))
    };
}

/// The scripts of `lease-redis/lua`, prefixed by `common.lua` as the adapter does.
pub(crate) struct RedisScripts {
    create: Script,
    claim: Script,
    claim_next: Script,
    end_many: Script,
    renew: Script,
    fenced: Script,
}

impl RedisScripts {
    fn new() -> RedisScripts {
        RedisScripts {
            create: lua!("create.lua"),
            claim: lua!("claim.lua"),
            claim_next: lua!("claim_next.lua"),
            end_many: lua!("end_many.lua"),
            renew: lua!("renew.lua"),
            fenced: lua!("fenced.lua"),
        }
    }
}

/// A connection for the raw path, shared by every namespace of one server.
#[derive(Clone)]
pub(crate) enum RawConn {
    /// A sqlx pool with the same size as the library's.
    Pg(PgPool),
    /// A redis-rs connection manager, as the library uses.
    Redis(ConnectionManager),
}

impl RawConn {
    pub(crate) async fn postgres(url: &str, size: u32) -> Result<RawConn, BenchError> {
        // The same pool settings as the adapter's (no ping per checkout), so the ratio measures
        // the library, not a pool option.
        let pool = PgPoolOptions::new()
            .max_connections(size)
            .acquire_timeout(Duration::from_secs(60))
            .test_before_acquire(false)
            .connect(url)
            .await?;
        Ok(RawConn::Pg(pool))
    }

    pub(crate) async fn redis(url: &str) -> Result<RawConn, BenchError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(Duration::from_secs(30)))
            .set_connection_timeout(Some(Duration::from_secs(2)));
        Ok(RawConn::Redis(
            ConnectionManager::new_with_config(client, config).await?,
        ))
    }

    /// The raw path over namespace `ns` (a Postgres schema or a Redis key namespace).
    pub(crate) fn namespace(&self, ns: &str) -> Raw {
        match self {
            RawConn::Pg(pool) => Raw::Pg {
                pool: pool.clone(),
                sql: Box::new(PgSql::new(ns)),
                best: None,
            },
            RawConn::Redis(conn) => Raw::Redis {
                conn: conn.clone(),
                tag: format!("{{lease:{ns}}}"),
                scripts: Box::new(RedisScripts::new()),
            },
        }
    }
}

/// The raw path over one namespace.
pub(crate) enum Raw {
    /// Postgres statements.
    Pg {
        /// The pool.
        pool: PgPool,
        /// The statements.
        sql: Box<PgSql>,
        /// The best statements for the job, when this raw path stands for them (`best` part).
        best: Option<Box<super::best::BestSql>>,
    },
    /// Redis scripts.
    Redis {
        /// The connection.
        conn: ConnectionManager,
        /// `{lease:<ns>}`.
        tag: String,
        /// The scripts.
        scripts: Box<RedisScripts>,
    },
}

/// Lower-case hex of the id's bytes: the Redis adapter's key encoding.
fn hex(id: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(id.len() * 2);
    for b in id.bytes() {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 0xf)] as char);
    }
    out
}

fn unhex(hex: &[u8]) -> Result<String, BenchError> {
    let bytes = hex
        .chunks(2)
        .map(|p| {
            std::str::from_utf8(p)
                .ok()
                .and_then(|s| u8::from_str_radix(s, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(|| BenchError::wrong("claim_next reply with a malformed id"))?;
    String::from_utf8(bytes).map_err(|_| BenchError::wrong("claim_next reply id is not UTF-8"))
}

fn items(value: Value) -> Result<Vec<Value>, BenchError> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(BenchError::wrong(format!(
            "expected an array reply, got {other:?}"
        ))),
    }
}

fn text(value: &Value) -> Result<&[u8], BenchError> {
    match value {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.as_bytes()),
        other => Err(BenchError::wrong(format!(
            "expected a string, got {other:?}"
        ))),
    }
}

fn int(value: &Value) -> Result<u64, BenchError> {
    match value {
        Value::Int(i) => Ok(*i as u64),
        other => std::str::from_utf8(text(other)?)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| BenchError::wrong(format!("expected a number, got {other:?}"))),
    }
}

/// Checks a script's `{'ok', ...}` reply and returns its items.
fn ok(op: &str, value: Value) -> Result<Vec<Value>, BenchError> {
    let items = items(value)?;
    match items.first().map(text).transpose()? {
        Some(b"ok") => Ok(items),
        _ => Err(BenchError::wrong(format!(
            "raw {op} was refused: {items:?}"
        ))),
    }
}

/// What the store holds for a run, read for validation.
#[derive(Debug, Default, Clone)]
pub(crate) struct Seen {
    pub(crate) state: String,
    pub(crate) owner: Option<String>,
    pub(crate) fence: u64,
    pub(crate) heartbeats: u64,
    pub(crate) journal: u64,
}

impl Raw {
    fn pg_missing(op: &str) -> BenchError {
        BenchError::wrong(format!("raw {op} matched no row: the write did not happen"))
    }

    /// `claim.sql` / `claim.lua`; returns the fence.
    pub(crate) async fn claim(
        &self,
        run: &str,
        worker: &str,
        ttl_ms: u64,
    ) -> Result<u64, BenchError> {
        match self {
            Raw::Pg { pool, sql, .. } => {
                let row = sqlx::query(&sql.claim)
                    .bind(run)
                    .bind(worker)
                    .bind(ttl_ms as i64)
                    .fetch_optional(pool)
                    .await?
                    .ok_or_else(|| Self::pg_missing("claim"))?;
                let _expires: i64 = row.try_get("expires_us")?;
                Ok(row.try_get::<i64, _>("fence")? as u64)
            }
            Raw::Redis { conn, tag, scripts } => {
                let reply: Value = scripts
                    .claim
                    .key(format!("{tag}:runs"))
                    .key(format!("{tag}:claimable"))
                    .key(format!("{tag}:attempts"))
                    .key(format!("{tag}:payload"))
                    .key(format!("{tag}:kind"))
                    .key(format!("{tag}:hist"))
                    .key(format!("{tag}:restored"))
                    .arg(hex(run))
                    .arg(worker)
                    .arg(ttl_ms)
                    .arg("")
                    .invoke_async(&mut conn.clone())
                    .await?;
                let items = ok("claim", reply)?;
                int(items.get(1).unwrap_or(&Value::Nil))
            }
        }
    }

    /// `claim_next.sql` / `claim_next.lua`; returns (run, fence) pairs.
    pub(crate) async fn claim_next(
        &self,
        worker: &str,
        ttl_ms: u64,
        max: usize,
    ) -> Result<Vec<(String, u64)>, BenchError> {
        match self {
            Raw::Pg { pool, sql, .. } => {
                let rows = sqlx::query(&sql.claim_next)
                    .bind(worker)
                    .bind(ttl_ms as i64)
                    .bind(max as i64)
                    .bind(LAGGING_MOVED_PER_CLAIM)
                    .bind(distribution::DEFAULT_KIND)
                    .bind(distribution::DEFAULT_QUEUE)
                    .fetch_all(pool)
                    .await?;
                rows.iter()
                    .map(|row| {
                        let _expires: i64 = row.try_get("expires_us")?;
                        Ok((
                            row.try_get::<String, _>("run_id")?,
                            row.try_get::<i64, _>("fence")? as u64,
                        ))
                    })
                    .collect()
            }
            Raw::Redis { conn, tag, scripts } => {
                let mut call = scripts.claim_next.key(format!("{tag}:runs"));
                call.key(format!("{tag}:claimable"))
                    .key(format!("{tag}:attempts"))
                    .key(format!("{tag}:hist"));
                // The default kind's indexes at priorities 1 to 9.
                for priority in 1..=9 {
                    call.key(format!("{tag}:claimable:p{priority}"));
                }
                call.key(format!("{tag}:payload"))
                    .key(format!("{tag}:restored"))
                    .key(format!("{tag}:queues"));
                let reply: Value = call
                    .arg(worker)
                    .arg(ttl_ms)
                    .arg(max)
                    .arg(distribution::redis::CLAIM_NEXT_SCAN)
                    .arg(distribution::DEFAULT_QUEUE)
                    .invoke_async(&mut conn.clone())
                    .await?;
                // A flag (more to examine), then id, fence, expiry, attempts, payload, priority,
                // waited per run.
                let items = items(reply)?;
                items
                    .get(1..)
                    .unwrap_or_default()
                    .chunks(7)
                    .map(|t| Ok((unhex(text(&t[0])?)?, int(&t[1])?)))
                    .collect()
            }
        }
    }

    /// `end_many.sql` / `end_many.lua`: completes every `(run, fence)` lease with its
    /// `payload` journaled (`complete-with`), in one statement or script call; fails unless
    /// each was ended.
    pub(crate) async fn complete_many(
        &self,
        leases: &[(String, u64, Vec<u8>)],
    ) -> Result<(), BenchError> {
        if leases.is_empty() {
            return Ok(());
        }
        match self {
            Raw::Pg { pool, sql, .. } => {
                // A row another transaction has locked (a claim_next walking past it) is
                // skipped, not waited for: sent again, as the library's batcher does.
                let mut left: Vec<&(String, u64, Vec<u8>)> = leases.iter().collect();
                for _ in 0..1_000 {
                    let n = left.len();
                    let runs: Vec<&str> = left.iter().map(|l| l.0.as_str()).collect();
                    let fences: Vec<i64> = left.iter().map(|l| l.1 as i64).collect();
                    let payloads: Vec<Option<&[u8]>> =
                        left.iter().map(|l| Some(l.2.as_slice())).collect();
                    let rows = sqlx::query(&sql.end_many)
                        .bind(runs)
                        .bind(fences)
                        .bind(vec!["completed"; n])
                        .bind(payloads)
                        .bind(vec![0_i64; n])
                        .bind(vec![None::<&str>; n])
                        .bind(vec![false; n])
                        .bind(vec!["completed"; n])
                        .bind(vec![None::<&str>; n])
                        // No wait (the signals' $10 and $11): a completion.
                        .bind(vec![None::<&str>; n])
                        .bind(vec![None::<i64>; n])
                        .fetch_all(pool)
                        .await?;
                    if rows.len() != n {
                        return Err(BenchError::wrong(format!(
                            "raw end_many answered {} rows for {n} leases",
                            rows.len()
                        )));
                    }
                    let mut skipped = Vec::new();
                    for (lease, row) in left.iter().zip(&rows) {
                        let ended: bool = row.try_get("ended")?;
                        let locked: bool = row.try_get("locked")?;
                        if ended {
                            continue;
                        }
                        if locked {
                            return Err(BenchError::wrong(format!(
                                "raw end_many refused the lease of {} under fence {}",
                                lease.0, lease.1
                            )));
                        }
                        skipped.push(*lease);
                    }
                    if skipped.is_empty() {
                        return Ok(());
                    }
                    left = skipped;
                }
                Err(BenchError::wrong("raw end_many kept skipping locked rows"))
            }
            Raw::Redis { conn, tag, scripts } => {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let id = format!(
                    "raw-many-{}-{}",
                    std::process::id(),
                    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                );
                let mut call = scripts.end_many.key(format!("{tag}:runs"));
                call.key(format!("{tag}:claimable"))
                    .key(format!("{tag}:failed"))
                    .key(format!("{tag}:ended"))
                    .key(format!("{tag}:delayed"))
                    .key(format!("{tag}:suspended"))
                    .key(format!("{tag}:attempts"))
                    .key(format!("{tag}:kind"))
                    .key(format!("{tag}:hist"))
                    .arg(&id);
                for (run, fence, payload) in leases {
                    let run = hex(run);
                    call.key(format!("{tag}:j:{run}"))
                        .key(format!("{tag}:claimable"))
                        .arg("complete-with")
                        .arg(&run)
                        .arg(*fence)
                        .arg(payload.as_slice())
                        .arg("");
                }
                let reply: Value = call.invoke_async(&mut conn.clone()).await?;
                let items = items(reply)?;
                let done = items
                    .into_iter()
                    .filter(|item| {
                        matches!(item, Value::Array(parts)
                            if parts.first().and_then(|p| text(p).ok()) == Some(b"ok".as_slice()))
                    })
                    .count();
                if done != leases.len() {
                    return Err(BenchError::wrong(format!(
                        "raw end_many ended {done} of {} leases",
                        leases.len()
                    )));
                }
                Ok(())
            }
        }
    }

    /// `renew.sql` / `renew.lua` with one lease.
    pub(crate) async fn renew(&self, run: &str, fence: u64, ttl_ms: u64) -> Result<(), BenchError> {
        match self {
            Raw::Pg { pool, sql, .. } => {
                let row = sqlx::query(&sql.renew)
                    .bind(run)
                    .bind(fence as i64)
                    .bind(ttl_ms as i64)
                    .fetch_optional(pool)
                    .await?
                    .ok_or_else(|| Self::pg_missing("renew"))?;
                let _expires: i64 = row.try_get("expires_us")?;
                Ok(())
            }
            Raw::Redis { .. } => self.renew_many(&[(run, fence, ttl_ms)]).await,
        }
    }

    /// `renew_many.sql` / `renew.lua`; fails unless every lease was renewed.
    pub(crate) async fn renew_many(&self, leases: &[(&str, u64, u64)]) -> Result<(), BenchError> {
        match self {
            Raw::Pg { pool, sql, .. } => {
                let runs: Vec<&str> = leases.iter().map(|l| l.0).collect();
                let fences: Vec<i64> = leases.iter().map(|l| l.1 as i64).collect();
                // One TTL for the statement, as the adapter sends it (the leases of a batch
                // share their TTL).
                let ttl = leases.first().map_or(0, |l| l.2 as i64);
                if leases.iter().any(|l| l.2 as i64 != ttl) {
                    return Err(BenchError::setup("renew_many takes leases of one TTL"));
                }
                let rows = sqlx::query(&sql.renew_many)
                    .bind(&runs)
                    .bind(&fences)
                    .bind(ttl)
                    .fetch_all(pool)
                    .await?;
                if rows.len() != leases.len() {
                    return Err(BenchError::wrong("raw renew_many: a row per lease"));
                }
                for row in &rows {
                    if row.try_get::<Option<i64>, _>("expires_us")?.is_none() {
                        return Err(Self::pg_missing("renew_many"));
                    }
                }
                Ok(())
            }
            Raw::Redis { conn, tag, scripts } => {
                let mut call = scripts.renew.key(format!("{tag}:runs"));
                for _ in leases {
                    call.key(format!("{tag}:claimable"));
                }
                for (run, fence, ttl) in leases {
                    call.arg(hex(run)).arg(*fence).arg(*ttl);
                }
                let reply: Value = call.invoke_async(&mut conn.clone()).await?;
                let results = items(reply)?;
                if results.len() != leases.len() {
                    return Err(BenchError::wrong("raw renew: a result per lease"));
                }
                for one in results {
                    ok("renew", one)?;
                }
                Ok(())
            }
        }
    }

    /// `append.sql` / `fenced.lua append`; returns the seq.
    pub(crate) async fn append(
        &self,
        run: &str,
        fence: u64,
        payload: &[u8],
    ) -> Result<u64, BenchError> {
        match self {
            Raw::Pg { pool, sql, .. } => {
                let row = sqlx::query(&sql.append)
                    .bind(run)
                    .bind(fence as i64)
                    .bind(payload)
                    .fetch_optional(pool)
                    .await?
                    .ok_or_else(|| Self::pg_missing("append"))?;
                let _at: i64 = row.try_get("written_us")?;
                let _fence: i64 = row.try_get("fence")?;
                Ok(row.try_get::<i64, _>("seq")? as u64)
            }
            Raw::Redis { .. } => {
                let items = self.fenced(run, "append", fence, payload).await?;
                int(items.get(1).unwrap_or(&Value::Nil))
            }
        }
    }

    /// `end_lease.sql 'completed'` / `fenced.lua complete`.
    pub(crate) async fn complete(&self, run: &str, fence: u64) -> Result<(), BenchError> {
        match self {
            Raw::Pg { pool, sql, .. } => {
                sqlx::query(&sql.end_lease)
                    .bind(run)
                    .bind(fence as i64)
                    .bind("completed")
                    .fetch_optional(pool)
                    .await?
                    .ok_or_else(|| Self::pg_missing("complete"))?;
                Ok(())
            }
            Raw::Redis { .. } => self.fenced(run, "complete", fence, b"").await.map(drop),
        }
    }

    async fn fenced(
        &self,
        run: &str,
        op: &str,
        fence: u64,
        payload: &[u8],
    ) -> Result<Vec<Value>, BenchError> {
        let Raw::Redis { conn, tag, scripts } = self else {
            return Err(BenchError::wrong("fenced.lua on a Postgres target"));
        };
        let id = hex(run);
        // A call id unique to this call, as the adapter's: the key of its resend record.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let call = format!(
            "raw-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let reply: Value = scripts
            .fenced
            .key(format!("{tag}:runs"))
            .key(format!("{tag}:j:{id}"))
            .key(format!("{tag}:claimable"))
            .key(format!("{tag}:k:{id}"))
            .key(format!("{tag}:c:{call}"))
            .key(format!("{tag}:ended"))
            .key(format!("{tag}:suspended"))
            .key(format!("{tag}:attempts"))
            .key(format!("{tag}:kind"))
            .key(format!("{tag}:hist"))
            .arg(op)
            .arg(&id)
            .arg(fence)
            .arg(payload)
            .arg(&call)
            .arg(60_000)
            .arg("")
            .invoke_async(&mut conn.clone())
            .await?;
        ok(op, reply)
    }

    /// Setup, not measured: creates `runs` as `create.sql` / `create.lua` would, in bulk.
    pub(crate) async fn create_all(&self, runs: &[String]) -> Result<(), BenchError> {
        match self {
            Raw::Pg { pool, sql, .. } => {
                for chunk in runs.chunks(10_000) {
                    sqlx::query(&format!(
                        "INSERT INTO {}.runs (run_id, fence) SELECT unnest($1::text[]), 0",
                        sql.quoted
                    ))
                    .bind(chunk)
                    .execute(pool)
                    .await?;
                }
                Ok(())
            }
            Raw::Redis { conn, tag, scripts } => {
                let mut tasks = tokio::task::JoinSet::new();
                for chunk in runs.chunks(runs.len().div_ceil(16).max(1)) {
                    let (mut conn, tag, chunk) = (conn.clone(), tag.clone(), chunk.to_vec());
                    let script = scripts.create.clone();
                    tasks.spawn(async move {
                        for run in chunk {
                            let id = hex(&run);
                            let reply: Value = script
                                .key(format!("{tag}:runs"))
                                .key(format!("{tag}:claimable"))
                                .key(format!("{tag}:ids"))
                                .key(format!("{tag}:seq"))
                                .key(format!("{tag}:tomb"))
                                .key(format!("{tag}:attempts"))
                                .key(format!("{tag}:delayed"))
                                .key(format!("{tag}:payload"))
                                .key(format!("{tag}:kind"))
                                .key(format!("{tag}:kinds"))
                                .key(format!("{tag}:uniq"))
                                .key(format!("{tag}:uniqof"))
                                .arg(&id)
                                .arg(0)
                                .arg("")
                                .arg("")
                                .arg("")
                                // No unique key, no trace parent.
                                .arg("")
                                .arg("")
                                .invoke_async(&mut conn)
                                .await?;
                            ok("create", reply)?;
                        }
                        Ok::<(), BenchError>(())
                    });
                }
                while let Some(done) = tasks.join_next().await {
                    done.map_err(|e| BenchError::setup(e.to_string()))??;
                }
                Ok(())
            }
        }
    }

    /// Validation, not measured: what the store holds for each of `runs`, in order.
    pub(crate) async fn seen(&self, runs: &[String]) -> Result<Vec<Seen>, BenchError> {
        let mut out = Vec::with_capacity(runs.len());
        match self {
            Raw::Pg { pool, sql, .. } => {
                for chunk in runs.chunks(10_000) {
                    let rows = sqlx::query(&format!(
                        "SELECT i.ord, r.state, r.lease_owner, r.fence, r.heartbeats, \
                         (SELECT count(*) FROM {q}.journal j WHERE j.run_id = r.run_id) AS journal \
                         FROM unnest($1::text[]) WITH ORDINALITY AS i(run_id, ord) \
                         JOIN {q}.runs r ON r.run_id = i.run_id ORDER BY i.ord",
                        q = sql.quoted
                    ))
                    .bind(chunk)
                    .fetch_all(pool)
                    .await?;
                    if rows.len() != chunk.len() {
                        return Err(BenchError::wrong("validation: runs are missing"));
                    }
                    for row in rows {
                        out.push(Seen {
                            state: row.try_get("state")?,
                            owner: row.try_get("lease_owner")?,
                            fence: row.try_get::<i64, _>("fence")? as u64,
                            heartbeats: row.try_get::<i64, _>("heartbeats")? as u64,
                            journal: row.try_get::<i64, _>("journal")? as u64,
                        });
                    }
                }
            }
            Raw::Redis { conn, tag, .. } => {
                for chunk in runs.chunks(1_000) {
                    let mut pipe = redis::pipe();
                    for run in chunk {
                        let id = hex(run);
                        pipe.cmd("HGET").arg(format!("{tag}:runs")).arg(&id);
                        pipe.cmd("LLEN").arg(format!("{tag}:j:{id}"));
                    }
                    let replies: Vec<Value> = pipe.query_async(&mut conn.clone()).await?;
                    for pair in replies.chunks(2) {
                        // 'state:fence:heartbeats:expiry:member:owner', as common.lua writes it,
                        // then times and facts from a byte 1 on (no owner holds one).
                        let record = String::from_utf8_lossy(
                            text(&pair[0])
                                .map_err(|_| BenchError::wrong("validation: run missing"))?,
                        )
                        .into_owned();
                        let record = record.split('\u{1}').next().unwrap_or_default();
                        let mut fields = record.splitn(6, ':');
                        let mut field = || fields.next().unwrap_or_default().to_owned();
                        let (state, fence, heartbeats, _expiry, _member, owner) =
                            (field(), field(), field(), field(), field(), field());
                        out.push(Seen {
                            state,
                            owner: Some(owner).filter(|o| !o.is_empty()),
                            fence: fence.parse().unwrap_or(0),
                            heartbeats: heartbeats.parse().unwrap_or(0),
                            journal: int(&pair[1])?,
                        });
                    }
                }
            }
        }
        Ok(out)
    }
}
