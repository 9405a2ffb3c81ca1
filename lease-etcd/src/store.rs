//! [`EtcdLeaseStore`]: the [`LeaseStore`] contract as etcd transactions.

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KvClient, LeaseClient,
    PutOptions, ResponseHeader, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use lease_core::backend::{
    check_claim_max, check_create_batch, check_end_batch, check_list, check_payload, check_purge,
    check_renew_batch, claim_refusal, fenced_verdict,
};
use lease_core::{
    End, Ending, Error, Fence, IdempotencyKey, InvalidInput, JournalEntry, Lease, LeaseStore,
    ListFilter, Result, RunCounts, RunId, RunRecord, RunState, StoreTime, Ttl, WorkerId, MAX_BATCH,
    MAX_COUNT,
};

use crate::codec::{decode_entry, encode_entry, prefix_end, Keys, Rec};
use crate::config::EtcdConfig;
use crate::error::{classify, timed_out, BACKEND};

/// The shortest TTL etcd times: its leases are whole seconds.
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// Runs per read: two reads each, within etcd's default `--max-txn-ops` (128).
const CHUNK: usize = 64;

/// Operations per transaction, nested ones and compares included: etcd's default
/// `--max-txn-ops`, which etcd 3.4 applies to a transaction and its nested ones together.
const MAX_TXN_OPS: usize = 128;

/// Payload bytes per transaction, within etcd's default `--max-request-bytes` (1.5 MiB).
const CHUNK_BYTES: usize = 1 << 20;

/// How often an item whose compare lost a race (another writer changed the run between the
/// read and the write) is read and decided again before the call gives up as contended.
const ROUNDS: usize = 32;

/// Journal entries per read: each can be 1 MiB.
const JOURNAL_PAGE: i64 = 64;

/// Index entries `claim_next` looks at past now, per sweep.
const SWEEP: usize = 64;

/// How often a store sweeps past now.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// The largest message this adapter accepts from etcd (a journal page).
const MAX_DECODING: usize = 96 << 20;

/// A [`LeaseStore`] on etcd v3 (3.4 and later).
///
/// Each run is a record key that is never leased and never deleted (a purge leaves a
/// tombstone with the fence), so its fence survives anything etcd's Raft log survives. A
/// claim attaches a *block* key to a fresh etcd lease of the claim's TTL: while the block
/// exists the run is held, and when etcd expires the lease (timed by its leader) the block
/// disappears and the run is claimable. No client clock decides expiry. Every write is one
/// etcd transaction that compares the record's revision with the one the decision was made
/// on, so each check is atomic; batches are nested transactions, one commit per chunk of
/// up to 128 operations (etcd's default `--max-txn-ops`), each item judged on its own.
///
/// Times in records ([`RunRecord::observed_at`], expiries, journal times) are the client's
/// wall clock when written or read, for display and ordering only (etcd has no time read);
/// claimability is always etcd's lease. See the crate docs for the pitfalls this handles.
pub struct EtcdLeaseStore {
    /// One client per endpoint; calls go to `current` and move on when it fails.
    links: Vec<Link>,
    current: Arc<AtomicUsize>,
    /// Where `claim_next`'s sweep past now goes on from, and when it last ran.
    cursor: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    swept: Arc<AtomicU64>,
    keys: Keys,
    config: EtcdConfig,
    cluster: u64,
    /// The highest revision an answer carried: a later call answered below it means the
    /// cluster's history went back (restored from a snapshot), and the store fails closed.
    floor: Arc<AtomicI64>,
}

/// The clients of one endpoint.
#[derive(Clone)]
struct Link {
    kv: KvClient,
    leases: LeaseClient,
}

/// What one read saw of a run.
#[derive(Debug, Clone, Default)]
struct Seen {
    rec: Option<Rec>,
    /// The record's mod revision, 0 when absent.
    rev: i64,
    /// The block key: `Some(true)` held, `Some(false)` delayed, `None` absent.
    block: Option<bool>,
}

impl Seen {
    /// The live record if `lease` may write to it, per the fenced-write rules.
    fn writable(&self, lease: &Lease) -> Result<&Rec> {
        let rec = self.live(lease.run())?;
        fenced_verdict(
            lease.run(),
            lease.fence(),
            Fence::new(rec.fence)?,
            state_of(rec),
            rec.owner.is_some(),
        )?;
        Ok(rec)
    }

    /// The live record (not a tombstone), or `NotFound`.
    fn live(&self, run: &RunId) -> Result<&Rec> {
        match &self.rec {
            Some(rec) if rec.state.is_some() => Ok(rec),
            _ => Err(Error::NotFound { run: run.clone() }),
        }
    }
}

/// What one page of `claim_next` claimed.
struct ClaimPage {
    leases: Vec<Lease>,
    /// Candidates another caller claimed first.
    lost: usize,
    /// Whether the range had more entries than it returned.
    more: bool,
    /// The index key the next page starts after.
    resume: Option<Vec<u8>>,
}

/// One item's conditional write, and what it returns if its compares hold.
struct Plan<T> {
    compares: Vec<Compare>,
    ops: Vec<TxnOp>,
    bytes: usize,
    out: T,
}

/// The client's wall clock in microseconds, strictly increasing within this process (so runs
/// created one after another keep their order). For ordering and display only.
fn now_micros() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = wall.max(last + 1);
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// Shuffles `items` (Fisher–Yates over a xorshift stream from `seed`): enough to spread
/// concurrent callers over different runs; nothing depends on its quality.
fn shuffle(items: &mut [usize], seed: u64) {
    let mut x = seed | 1;
    for i in (1..items.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        items.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

fn state_of(rec: &Rec) -> RunState {
    rec.state.unwrap_or(RunState::Completed)
}

/// A TTL as etcd times it: whole seconds, rounded up (a lease lasts longer, never shorter).
fn lease_seconds(ttl: Ttl) -> Result<(i64, Ttl)> {
    if ttl.as_duration() < MIN_TTL {
        return Err(InvalidInput::TtlUnderBackendMinimum {
            ttl: ttl.as_duration(),
            min: MIN_TTL,
            backend: BACKEND,
        }
        .into());
    }
    let secs = ttl.as_millis().div_ceil(1000);
    Ok((secs as i64, Ttl::from_secs(secs)?))
}

impl EtcdLeaseStore {
    /// Connects to the cluster and checks it: every member reachable through the endpoint
    /// list, and the key prefix bound to this cluster's id (a prefix first used on another
    /// cluster, or a cluster restored from a snapshot under a new id, is refused: its fences
    /// may have gone back).
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no member answers within the connect timeout;
    /// [`Error::Misconfigured`] for bad credentials or a prefix bound to another cluster.
    pub async fn connect(config: EtcdConfig) -> Result<EtcdLeaseStore> {
        // The builders take any value; out of range is refused here, before any arithmetic.
        config.validate()?;
        let mut options = ConnectOptions::new()
            .with_timeout(config.timeout())
            .with_connect_timeout(config.connect_timeout())
            .with_keep_alive(Duration::from_secs(10), config.timeout());
        if let Some((user, password)) = config.user() {
            options = options.with_user(user.clone(), password.clone());
        }
        #[cfg(feature = "tls")]
        if config.tls() {
            options = options.with_tls(etcd_client::TlsOptions::new());
        }
        #[cfg(not(feature = "tls"))]
        debug_assert!(
            !config.tls(),
            "from_url refuses etcds:// without the tls feature"
        );
        // A member that has lost its leader answers "no leader" at once instead of letting a
        // request wait out its timeout (etcd's require-leader metadata).
        let options = options.with_require_leader(true);
        let bound = config.connect_timeout() + config.timeout();
        let mut links = Vec::with_capacity(config.endpoints().len());
        let mut last = None;
        for endpoint in config.endpoints() {
            let connected = tokio::time::timeout(
                bound,
                Client::connect([endpoint.as_str()], Some(options.clone())),
            )
            .await;
            match connected {
                Ok(Ok(client)) => links.push(Link {
                    kv: client.kv_client().max_decoding_message_size(MAX_DECODING),
                    leases: client.lease_client(),
                }),
                Ok(Err(e)) => last = Some(classify(e)),
                Err(_) => last = Some(timed_out("connecting to etcd", bound)),
            }
        }
        if links.is_empty() {
            return Err(last.unwrap_or_else(|| timed_out("connecting to etcd", bound)));
        }
        let links_len = links.len();
        let mut store = EtcdLeaseStore {
            links,
            // Each store starts at an endpoint of its own, so a fleet spreads over the members.
            current: Arc::new(AtomicUsize::new(now_micros() as usize % links_len)),
            cursor: Arc::new(std::sync::Mutex::new(None)),
            swept: Arc::new(AtomicU64::new(0)),
            keys: Keys::new(config.prefix()),
            config,
            cluster: 0,
            floor: Arc::new(AtomicI64::new(0)),
        };
        store.bind_cluster().await?;
        tracing::debug!(store = %store, cluster = store.cluster, "connected to etcd");
        Ok(store)
    }

    /// Records the cluster id under the prefix on first use; later refuses any other.
    async fn bind_cluster(&mut self) -> Result<()> {
        let meta = self.keys.meta();
        let txn = Txn::new()
            .when([Compare::create_revision(meta.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(meta.clone(), b"".to_vec(), None)])
            .or_else([TxnOp::get(meta.clone(), None)]);
        let mut answer = None;
        for _ in 0..self.links.len() {
            let txn = txn.clone();
            match self
                .call("connect", |mut l| async move { l.kv.txn(txn).await })
                .await
            {
                Err(e) if e.is_retryable() => answer = Some(Err(e)),
                other => {
                    answer = Some(other);
                    break;
                }
            }
        }
        let response = answer.expect("at least one endpoint")?;
        let header = response
            .header()
            .ok_or_else(|| Error::backend(BACKEND, "etcd answered without a header"))?;
        let cluster = header.cluster_id();
        let id = cluster.to_string();
        let stored = if response.succeeded() {
            None
        } else {
            response.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(get) => get
                    .kvs()
                    .first()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
                _ => None,
            })
        };
        match stored.as_deref() {
            None | Some("") => {
                let value = id.into_bytes();
                self.call("connect", |mut l| async move {
                    l.kv.put(meta, value, None).await
                })
                .await?;
            }
            Some(bound) if bound == id => {}
            Some(bound) => {
                return Err(Error::misconfigured(
                    BACKEND,
                    format!(
                        "the prefix {:?} was first used on etcd cluster {bound}, but this is \
                         cluster {id}: a cluster restored from a snapshot may hold fences that \
                         went back, so two workers could write under one fence. Use a new \
                         prefix, or, once every run's fence is known to be current, delete the \
                         key {:?} to rebind the prefix",
                        self.config.prefix(),
                        String::from_utf8_lossy(&self.keys.meta()),
                    ),
                ))
            }
        }
        self.cluster = cluster;
        self.floor.fetch_max(header.revision(), Ordering::SeqCst);
        Ok(())
    }

    /// The settings this store was opened with.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Runs one call on the current endpoint under the client-side bound. When it fails as
    /// unavailable (the member is down, cut off, or has no leader), later calls go to the next
    /// endpoint: the client fails over to the members that can answer.
    async fn call<T, F, Fut>(&self, what: &str, make: F) -> Result<T>
    where
        F: FnOnce(Link) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let at = self.current.load(Ordering::Relaxed) % self.links.len();
        let bound = self.config.timeout();
        let answer = match tokio::time::timeout(bound, make(self.links[at].clone())).await {
            Ok(result) => result.map_err(classify),
            Err(_) => Err(timed_out(what, bound)),
        };
        if let Err(Error::Unavailable { .. }) = &answer {
            let next = (at + 1) % self.links.len();
            if self
                .current
                .compare_exchange(at, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
                && self.links.len() > 1
            {
                tracing::debug!(from = %self.config.endpoints()[at], to = %self.config.endpoints()[next], "etcd endpoint unavailable; failing over");
            }
        }
        answer
    }

    /// Fails closed when an answer comes from another cluster or from below a revision an
    /// earlier answer (received before this call was sent) carried.
    fn check_header(&self, header: Option<&ResponseHeader>, floor: i64) -> Result<()> {
        let Some(header) = header else {
            return Err(Error::backend(BACKEND, "etcd answered without a header"));
        };
        if self.cluster != 0 && header.cluster_id() != self.cluster {
            return Err(Error::misconfigured(
                BACKEND,
                format!(
                    "etcd answered from cluster {} instead of {}: the endpoints now reach \
                     another cluster (restored from a snapshot?), whose fences may have gone back",
                    header.cluster_id(),
                    self.cluster
                ),
            ));
        }
        if header.revision() < floor {
            return Err(Error::misconfigured(
                BACKEND,
                format!(
                    "etcd's revision went back from {floor} to {}: its history was rewound \
                     (a snapshot restore?), so fences may have gone back; refusing to go on",
                    header.revision()
                ),
            ));
        }
        self.floor.fetch_max(header.revision(), Ordering::SeqCst);
        Ok(())
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let floor = self.floor.load(Ordering::SeqCst);
        let response = self
            .call("a transaction", |mut l| async move { l.kv.txn(txn).await })
            .await?;
        self.check_header(response.header(), floor)?;
        Ok(response)
    }

    /// An etcd lease of `secs` seconds for each entry, granted at once: one lease per distinct
    /// TTL, shared by the entries that ask for it. Sharing is exact because this adapter never
    /// keeps a lease alive: a lease is a timer started at its grant, and every key attached to
    /// it is due to expire then. A renewal attaches the block to a new lease.
    async fn grant(&self, secs: &[i64]) -> Result<Vec<i64>> {
        let mut distinct: Vec<i64> = secs.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let granted = futures_util::future::try_join_all(distinct.iter().map(|&ttl| async move {
            let granted = self
                .call("a lease grant", |mut l| async move {
                    l.leases.grant(ttl, None).await
                })
                .await?;
            if !granted.error().is_empty() {
                return Err(Error::unavailable(BACKEND, granted.error().to_string()));
            }
            Ok::<_, Error>((ttl, granted.id()))
        }))
        .await?;
        let ids: std::collections::HashMap<i64, i64> = granted.into_iter().collect();
        Ok(secs.iter().map(|s| ids[s]).collect())
    }

    /// Reads the records and block keys of `runs` (chunked; each chunk one consistent read).
    async fn read(&self, runs: &[&RunId]) -> Result<Vec<Seen>> {
        let chunks = futures_util::future::try_join_all(
            runs.chunks(CHUNK).map(|chunk| self.read_chunk(chunk)),
        )
        .await?;
        let seen: Vec<Seen> = chunks.into_iter().flatten().collect();
        if seen.len() != runs.len() {
            return Err(Error::backend(BACKEND, "etcd answered a read short"));
        }
        Ok(seen)
    }

    async fn read_chunk(&self, chunk: &[&RunId]) -> Result<Vec<Seen>> {
        let mut ops = Vec::with_capacity(chunk.len() * 2);
        for run in chunk {
            ops.push(TxnOp::get(self.keys.record(run.as_str()), None));
            ops.push(TxnOp::get(self.keys.block(run.as_str()), None));
        }
        let response = self.txn(Txn::new().and_then(ops)).await?;
        let mut seen = Vec::with_capacity(chunk.len());
        for pair in response.op_responses().chunks(2) {
            let mut item = Seen::default();
            if let Some(TxnOpResponse::Get(get)) = pair.first() {
                if let Some(kv) = get.kvs().first() {
                    item.rec = Some(Rec::decode(kv.value())?);
                    item.rev = kv.mod_revision();
                }
            }
            if let Some(TxnOpResponse::Get(get)) = pair.get(1) {
                item.block = get.kvs().first().map(|kv| kv.value() == b"h");
            }
            seen.push(item);
        }
        Ok(seen)
    }

    /// Runs each plan as its own conditional write, chunked into nested transactions; returns
    /// which held their compares.
    async fn execute<T>(&self, plans: Vec<Plan<T>>) -> Result<Vec<Option<T>>> {
        let mut chunks: Vec<Vec<Plan<T>>> = Vec::new();
        let mut chunk: Vec<Plan<T>> = Vec::new();
        let (mut bytes, mut ops) = (0, 0);
        for plan in plans {
            let cost = plan.ops.len() + plan.compares.len() + 1;
            if !chunk.is_empty() && (ops + cost > MAX_TXN_OPS || bytes + plan.bytes > CHUNK_BYTES) {
                chunks.push(std::mem::take(&mut chunk));
                bytes = 0;
                ops = 0;
            }
            bytes += plan.bytes;
            ops += cost;
            chunk.push(plan);
        }
        if !chunk.is_empty() {
            chunks.push(chunk);
        }
        // Chunks are independent commits (each item is judged on its own): sent together.
        let outs =
            futures_util::future::try_join_all(chunks.into_iter().map(|c| self.commit(c))).await?;
        Ok(outs.into_iter().flatten().collect())
    }

    async fn commit<T>(&self, chunk: Vec<Plan<T>>) -> Result<Vec<Option<T>>> {
        if chunk.len() == 1 {
            let plan = chunk.into_iter().next().expect("one plan");
            let response = self
                .txn(Txn::new().when(plan.compares).and_then(plan.ops))
                .await?;
            return Ok(vec![response.succeeded().then_some(plan.out)]);
        }
        let mut outs = Vec::with_capacity(chunk.len());
        let mut nested = Vec::with_capacity(chunk.len());
        for plan in chunk {
            nested.push(TxnOp::txn(
                Txn::new().when(plan.compares).and_then(plan.ops),
            ));
            outs.push(plan.out);
        }
        let response = self.txn(Txn::new().and_then(nested)).await?;
        let answers = response.op_responses();
        if answers.len() != outs.len() {
            return Err(Error::backend(BACKEND, "etcd answered a batch short"));
        }
        Ok(outs
            .into_iter()
            .zip(answers)
            .map(|(out, answer)| match answer {
                TxnOpResponse::Txn(inner) if inner.succeeded() => Some(out),
                _ => None,
            })
            .collect())
    }

    /// Reads, decides and writes each run until its compares hold: the heart of every write.
    /// `plan` sees the run as read and either refuses (a verdict) or plans a write; a write
    /// whose compares failed (the run changed in between) is read and decided again.
    async fn decide<T>(
        &self,
        runs: &[&RunId],
        mut plan: impl FnMut(usize, &Seen, u64) -> Result<Plan<T>>,
    ) -> Result<Vec<Result<T>>> {
        let mut results: Vec<Option<Result<T>>> = (0..runs.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..runs.len()).collect();
        for round in 0..ROUNDS {
            if round > 0 {
                tokio::time::sleep(Duration::from_millis(round as u64)).await;
            }
            let now = now_micros();
            let ids: Vec<&RunId> = pending.iter().map(|&i| runs[i]).collect();
            let seen = self.read(&ids).await?;
            let mut plans = Vec::new();
            let mut planned = Vec::new();
            for (&i, item) in pending.iter().zip(&seen) {
                match plan(i, item, now) {
                    Ok(p) => {
                        plans.push(p);
                        planned.push(i);
                    }
                    Err(refusal) => results[i] = Some(Err(refusal)),
                }
            }
            let outs = self.execute(plans).await?;
            let mut again = Vec::new();
            for (i, out) in planned.into_iter().zip(outs) {
                match out {
                    Some(out) => results[i] = Some(Ok(out)),
                    None => again.push(i),
                }
            }
            pending = again;
            if pending.is_empty() {
                break;
            }
        }
        Ok(results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(Error::unavailable(
                        BACKEND,
                        "the run kept changing under this write; retry",
                    ))
                })
            })
            .collect())
    }

    async fn decide_one<T>(
        &self,
        run: &RunId,
        mut plan: impl FnMut(&Seen, u64) -> Result<Plan<T>>,
    ) -> Result<T> {
        self.decide(&[run], |_, seen, now| plan(seen, now))
            .await?
            .pop()
            .expect("one result per run")
    }

    /// The compare that the record is as read.
    fn unchanged(&self, run: &str, seen: &Seen) -> Compare {
        let key = self.keys.record(run);
        if seen.rev == 0 {
            Compare::create_revision(key, CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(key, CompareOp::Equal, seen.rev)
        }
    }

    /// The ops that replace `old` with `new` (record and index).
    fn rewrite(&self, run: &str, old: Option<&Rec>, new: &Rec) -> Vec<TxnOp> {
        let mut ops = vec![TxnOp::put(self.keys.record(run), new.encode(), None)];
        let position = |rec: &Rec| rec.state.map(|s| self.keys.index(s, rec.since, run));
        let (from, to) = (old.and_then(position), position(new));
        if from != to {
            if let Some(from) = from {
                ops.push(TxnOp::delete(from, None));
            }
            if let Some(to) = to {
                ops.push(TxnOp::put(to, Vec::new(), None));
            }
        }
        ops
    }

    fn plan<T>(&self, run: &str, seen: &Seen, new: &Rec, extra: Vec<TxnOp>, out: T) -> Plan<T> {
        let mut ops = self.rewrite(run, seen.rec.as_ref().filter(|r| r.state.is_some()), new);
        let bytes = extra.len() * 64;
        ops.extend(extra);
        Plan {
            compares: vec![self.unchanged(run, seen)],
            ops,
            bytes,
            out,
        }
    }

    fn put_block(&self, run: &str, held: bool, lease: i64) -> TxnOp {
        let value = if held { b"h".to_vec() } else { b"d".to_vec() };
        TxnOp::put(
            self.keys.block(run),
            value,
            Some(PutOptions::new().with_lease(lease)),
        )
    }

    fn delete_block(&self, run: &str) -> TxnOp {
        TxnOp::delete(self.keys.block(run), None)
    }

    /// The record as etcd judges it at `now`: an expiry etcd has not yet reached is shown
    /// ahead of `now`, and one it has reached at or before it, whatever the clocks say.
    fn record(&self, run: &RunId, seen: &Seen, now: u64) -> Result<RunRecord> {
        let rec = seen.live(run)?;
        let state = state_of(rec);
        let mut record = RunRecord::new(
            run.clone(),
            state,
            Fence::new(rec.fence)?,
            StoreTime::from_micros(now),
        )
        .with_heartbeats(rec.heartbeats)
        .with_failure(rec.failure.clone())
        .with_attempts(rec.attempts);
        if let Some(owner) = &rec.owner {
            let expires_at = match seen.block {
                Some(true) => rec.expires_at.max(now + 1),
                _ => rec.expires_at.min(now),
            };
            record = record.with_lease(WorkerId::new(owner)?, StoreTime::from_micros(expires_at));
        } else if state == RunState::Runnable && seen.block == Some(false) {
            record =
                record.with_not_before(Some(StoreTime::from_micros(rec.not_before.max(now + 1))));
        }
        Ok(record)
    }

    /// Why `run` cannot be claimed, or `None` if it can (etcd's block key is gone).
    fn claim_verdict(run: &RunId, seen: &Seen, now: u64) -> Result<Option<Error>> {
        let rec = seen.live(run)?;
        let left = |at: u64| Duration::from_micros(at.saturating_sub(now).max(1_000));
        let (remaining, delayed) = match (seen.block, &rec.owner) {
            (Some(_), Some(_)) => (Some(left(rec.expires_at)), None),
            (Some(_), None) => (None, Some(left(rec.not_before))),
            (None, _) => (None, None),
        };
        let owner = rec.owner.as_deref().map(WorkerId::new).transpose()?;
        Ok(claim_refusal(
            run,
            state_of(rec),
            owner.as_ref(),
            remaining,
            delayed,
            Fence::new(rec.fence)?,
        ))
    }

    /// The claim of a claimable run under etcd lease `lease`.
    fn claim_plan(
        &self,
        run: &RunId,
        worker: &WorkerId,
        ttl: Ttl,
        lease: i64,
        seen: &Seen,
        now: u64,
    ) -> Result<Plan<Lease>> {
        let rec = seen.live(run)?;
        let mut new = rec.clone();
        new.fence += 1;
        // Every claim counts against the attempt budget; a voluntary end gives it back.
        new.attempts += 1;
        new.owner = Some(worker.as_str().to_string());
        new.expires_at = now + ttl.as_millis() * 1000;
        new.ttl_ms = ttl.as_millis();
        new.not_before = 0;
        new.since = new.expires_at;
        let out = Lease::new(
            run.clone(),
            worker.clone(),
            Fence::new(new.fence)?,
            ttl,
            StoreTime::from_micros(new.expires_at),
        )?
        .with_attempt(new.attempts);
        let mut plan = self.plan(
            run.as_str(),
            seen,
            &new,
            vec![self.put_block(run.as_str(), true, lease)],
            out,
        );
        plan.compares.push(Compare::create_revision(
            self.keys.block(run.as_str()),
            CompareOp::Equal,
            0,
        ));
        Ok(plan)
    }

    /// The end of a lease (`end` already checked), planned against what was read.
    fn end_plan(
        &self,
        lease: &Lease,
        end: &End,
        delay_lease: i64,
        seen: &Seen,
        now: u64,
    ) -> Result<Plan<()>> {
        let run = lease.run();
        let rec = seen.writable(lease)?;
        let delay = end.delay_millis() * 1000;
        let mut new = rec.clone();
        new.state = Some(end.state());
        new.owner = None;
        new.expires_at = 0;
        new.since = now + delay;
        new.not_before = if delay > 0 { now + delay } else { 0 };
        if end.refunds_attempt() {
            new.attempts = new.attempts.saturating_sub(1);
        }
        let mut extra = vec![self.delete_block(run.as_str())];
        let mut bytes = 0;
        match end {
            End::CompleteWith(payload) => {
                new.journal_len += 1;
                bytes = payload.len();
                extra.push(TxnOp::put(
                    self.keys.entry(run.as_str(), new.journal_len),
                    encode_entry(rec.fence, now, payload),
                    None,
                ));
            }
            End::Fail(reason) => new.failure = Some(reason.clone()),
            End::Complete
            | End::Release
            | End::Suspend
            | End::RetryAfter(_)
            | End::AttemptFailed { .. } => {}
            _ => {
                return Err(InvalidInput::Unsupported {
                    operation: "this kind of end",
                }
                .into())
            }
        }
        if delay > 0 {
            // The block key replaces the deleted one: the delay is timed by etcd.
            extra[0] = self.put_block(run.as_str(), false, delay_lease);
        }
        let mut plan = self.plan(run.as_str(), seen, &new, extra, ());
        plan.bytes += bytes;
        Ok(plan)
    }

    async fn end_each(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        let delays: Vec<i64> = ends
            .iter()
            .map(|e| e.end.delay_millis().div_ceil(1000) as i64)
            .collect();
        let wanted: Vec<i64> = delays.iter().copied().filter(|&s| s > 0).collect();
        let mut granted = self.grant(&wanted).await?.into_iter();
        let leases: Vec<i64> = delays
            .iter()
            .map(|&s| {
                if s > 0 {
                    granted.next().unwrap_or(0)
                } else {
                    0
                }
            })
            .collect();
        let runs: Vec<&RunId> = ends.iter().map(|e| e.lease.run()).collect();
        self.decide(&runs, |i, seen, now| {
            self.end_plan(&ends[i].lease, &ends[i].end, leases[i], seen, now)
        })
        .await
    }

    async fn end_one(&self, lease: &Lease, end: End) -> Result<()> {
        self.end_each(&[Ending::new(lease.clone(), end)])
            .await?
            .pop()
            .expect("one result")
    }

    async fn renew_each(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        let mut secs = Vec::with_capacity(leases.len());
        let mut ttls = Vec::with_capacity(leases.len());
        for lease in leases {
            let (s, ttl) = lease_seconds(lease.ttl())?;
            secs.push(s);
            ttls.push(ttl);
        }
        let ids = self.grant(&secs).await?;
        let runs: Vec<&RunId> = leases.iter().map(Lease::run).collect();
        self.decide(&runs, |i, seen, now| {
            let lease = &leases[i];
            let run = lease.run();
            let rec = seen.writable(lease)?;
            let mut new = rec.clone();
            new.heartbeats += 1;
            new.expires_at = now + ttls[i].as_millis() * 1000;
            new.since = new.expires_at;
            let out = Lease::new(
                run.clone(),
                lease.owner().clone(),
                lease.fence(),
                ttls[i],
                StoreTime::from_micros(new.expires_at),
            )?
            .with_attempt(lease.attempt());
            Ok(self.plan(
                run.as_str(),
                seen,
                &new,
                vec![self.put_block(run.as_str(), true, ids[i])],
                out,
            ))
        })
        .await
    }

    /// Claims up to `want` claimable runs among the first `limit` entries of the runnable
    /// index in `[from, to)`, under one etcd lease granted for them.
    #[allow(clippy::too_many_arguments)]
    async fn claim_page(
        &self,
        worker: &WorkerId,
        ttl: Ttl,
        secs: i64,
        from: Vec<u8>,
        to: Vec<u8>,
        limit: usize,
        want: usize,
        spread: bool,
    ) -> Result<ClaimPage> {
        let now = now_micros();
        let page = self.range(from, to, limit as i64, false, 0).await?;
        let mut listed: Vec<(u64, RunId)> = Vec::new();
        for kv in page.kvs() {
            if let Some((since, run)) = self.keys.parse_index(kv.key()) {
                listed.push((since, RunId::new(run)?));
            }
        }
        let ids: Vec<&RunId> = listed.iter().map(|(_, r)| r).collect();
        let seen = self.read(&ids).await?;
        let mut claimable: Vec<usize> = listed
            .iter()
            .zip(&seen)
            .enumerate()
            .filter(|(_, ((since, run), item))| {
                item.live(run).is_ok_and(|rec| rec.since == *since)
                    && matches!(Self::claim_verdict(run, item, now), Ok(None))
            })
            .map(|(i, _)| i)
            .collect();
        // In order, the page resumes after the last run tried; spread, after the whole page.
        let mut resume = page.kvs().last().map(|kv| kv.key().to_vec());
        if spread {
            shuffle(
                &mut claimable,
                now ^ (worker.as_str().len() as u64).rotate_left(17),
            );
        } else if claimable.len() > want {
            resume = Some(page.kvs()[claimable[want - 1]].key().to_vec());
        }
        claimable.truncate(want);
        claimable.sort_unstable();
        let candidates: Vec<(&RunId, &Seen)> = claimable
            .iter()
            .map(|&i| (&listed[i].1, &seen[i]))
            .collect();
        let mut out = ClaimPage {
            leases: Vec::new(),
            lost: 0,
            more: page.more() || resume.as_deref() != page.kvs().last().map(|kv| kv.key()),
            resume,
        };
        if candidates.is_empty() {
            return Ok(out);
        }
        let lease = self.grant(&[secs]).await?[0];
        let mut plans = Vec::with_capacity(candidates.len());
        for (run, item) in &candidates {
            plans.push(self.claim_plan(run, worker, ttl, lease, item, now)?);
        }
        for claimed in self.execute(plans).await? {
            match claimed {
                Some(lease) => out.leases.push(lease),
                None => out.lost += 1,
            }
        }
        Ok(out)
    }

    /// Whether the sweep past now is due: at most every [`SWEEP_EVERY`] per store.
    fn sweep_due(&self) -> bool {
        let now = now_micros();
        let last = self.swept.load(Ordering::Relaxed);
        now.saturating_sub(last) >= SWEEP_EVERY.as_micros() as u64
            && self
                .swept
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Ranges `[from, to)`, up to `limit` keys (0: all), keys only unless `values`.
    async fn range(
        &self,
        from: Vec<u8>,
        to: Vec<u8>,
        limit: i64,
        values: bool,
        revision: i64,
    ) -> Result<etcd_client::GetResponse> {
        let mut options = GetOptions::new().with_range(to).with_limit(limit);
        if !values {
            options = options.with_keys_only();
        }
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let floor = self.floor.load(Ordering::SeqCst);
        let response = self
            .call("a range read", |mut l| async move {
                l.kv.get(from, Some(options)).await
            })
            .await?;
        self.check_header(response.header(), floor)?;
        Ok(response)
    }

    /// How many keys `[from, to)` holds.
    fn count_op(from: Vec<u8>, to: Vec<u8>) -> TxnOp {
        TxnOp::get(
            from,
            Some(GetOptions::new().with_range(to).with_count_only()),
        )
    }

    fn purgeable_ranges(&self, older_than: Duration) -> [(Vec<u8>, Vec<u8>); 2] {
        let cutoff = now_micros().saturating_sub(older_than.as_micros() as u64);
        [RunState::Completed, RunState::Failed].map(|state| {
            (
                self.keys.index_family(state),
                self.keys.index_bound(state, cutoff),
            )
        })
    }
}

fn counted(response: &TxnResponse, i: usize) -> u64 {
    match response.op_responses().get(i) {
        Some(TxnOpResponse::Get(get)) => get.count().max(0) as u64,
        _ => 0,
    }
}

#[async_trait::async_trait]
impl LeaseStore for EtcdLeaseStore {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        let created = self.create_many(std::slice::from_ref(run)).await?;
        created.into_iter().next().expect("one result")?;
        self.inspect(run).await
    }

    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        let (secs, ttl) = lease_seconds(ttl)?;
        let lease = self.grant(&[secs]).await?[0];
        self.decide_one(run, |seen, now| {
            if let Some(refusal) = Self::claim_verdict(run, seen, now)? {
                return Err(refusal);
            }
            self.claim_plan(run, worker, ttl, lease, seen, now)
        })
        .await
    }

    async fn claim_next(&self, worker: &WorkerId, ttl: Ttl, max: usize) -> Result<Vec<Lease>> {
        check_claim_max(max)?;
        let (secs, ttl) = lease_seconds(ttl)?;
        let family = self.keys.index_family(RunState::Runnable);
        let mut got: Vec<Lease> = Vec::new();
        let mut from = family.clone();
        // The index in order, up to now: fresh and released runs, and held runs whose
        // recorded expiry has passed (etcd's block decides whether they are claimable).
        // After a lost race (concurrent callers read the same oldest entries) the next page
        // goes on past what was tried, wider, and picks among its claimable runs at random,
        // so that callers spread out instead of colliding on the same runs again.
        let mut spread = false;
        for _ in 0..8 {
            let want = max - got.len();
            let to = self.keys.index_bound(RunState::Runnable, now_micros());
            let limit = if spread { want * 8 + 8 } else { want * 2 + 8 };
            let page = self
                .claim_page(worker, ttl, secs, from.clone(), to, limit, want, spread)
                .await?;
            got.extend(page.leases);
            if let Some(mut next) = page.resume {
                next.push(0);
                from = next;
            }
            if got.len() >= max || (!page.more && page.lost == 0) {
                break;
            }
            spread |= page.lost > 0;
        }
        // Past now, a bounded window from a rotating cursor: runs whose recorded times a
        // client with a clock ahead wrote in the future. Their blocks are etcd's judgement
        // too, and every entry comes under the window within a bounded number of sweeps, so
        // no run waits on a clock.
        if got.len() < max && self.sweep_due() {
            let bound = self.keys.index_bound(RunState::Runnable, now_micros());
            let start = {
                let cursor = self.cursor.lock().unwrap_or_else(|p| p.into_inner());
                cursor.clone().filter(|c| *c > bound).unwrap_or(bound)
            };
            let want = max - got.len();
            let page = self
                .claim_page(
                    worker,
                    ttl,
                    secs,
                    start,
                    prefix_end(&family),
                    SWEEP,
                    want,
                    false,
                )
                .await?;
            got.extend(page.leases);
            let next = page.resume.filter(|_| page.more).map(|mut last| {
                last.push(0);
                last
            });
            *self.cursor.lock().unwrap_or_else(|p| p.into_inner()) = next;
        }
        got.sort_by_key(|l| l.expires_at());
        Ok(got)
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease> {
        self.renew_each(std::slice::from_ref(lease))
            .await?
            .pop()
            .expect("one result")
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        check_renew_batch(leases.len())?;
        let mut runs = std::collections::HashSet::new();
        if leases.iter().all(|l| runs.insert(l.run())) {
            return self.renew_each(leases).await;
        }
        // The same run twice: one transaction cannot write a key twice, so one at a time.
        let mut results = Vec::with_capacity(leases.len());
        for lease in leases {
            match self.renew(lease).await {
                Err(e) if !e.is_verdict() => return Err(e),
                other => results.push(other),
            }
        }
        Ok(results)
    }

    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        check_payload(payload)?;
        self.append_entry(lease, None, payload, false).await
    }

    async fn append_keyed(
        &self,
        lease: &Lease,
        key: &IdempotencyKey,
        payload: &[u8],
    ) -> Result<JournalEntry> {
        check_payload(payload)?;
        self.append_entry(lease, Some(key), payload, true).await
    }

    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        let seen = self.read(&[run]).await?;
        seen[0].live(run)?;
        let revision = self.floor.load(Ordering::SeqCst);
        let prefix = self.keys.journal_prefix(run.as_str());
        let end = prefix_end(&prefix);
        let mut from = prefix;
        let mut entries = Vec::new();
        loop {
            let page = self
                .range(from.clone(), end.clone(), JOURNAL_PAGE, true, revision)
                .await?;
            for kv in page.kvs() {
                let (fence, at, payload) = decode_entry(kv.value())?;
                // Entries are numbered from 1 without gaps, and read in key (seq) order.
                let seq = entries.len() as u64 + 1;
                entries.push(JournalEntry::new(
                    seq,
                    Fence::new(fence)?,
                    payload,
                    StoreTime::from_micros(at),
                ));
            }
            match page.kvs().last() {
                Some(last) if page.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => break,
            }
        }
        Ok(entries)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.end_one(lease, End::Release).await
    }

    async fn suspend(&self, lease: &Lease) -> Result<()> {
        self.end_one(lease, End::Suspend).await
    }

    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        check_end_batch(ends)?;
        self.end_each(ends).await
    }

    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>> {
        check_create_batch(runs)?;
        let mut first = std::collections::HashMap::new();
        let mut dup = vec![false; runs.len()];
        for (i, run) in runs.iter().enumerate() {
            if first.insert(run, i).is_some() {
                dup[i] = true;
            }
        }
        let unique: Vec<&RunId> = runs
            .iter()
            .enumerate()
            .filter(|(i, _)| !dup[*i])
            .map(|(_, r)| r)
            .collect();
        let mut decided = self
            .decide(&unique, |i, seen, now| {
                let run = unique[i];
                let fence = match &seen.rec {
                    Some(rec) if rec.state.is_some() => {
                        return Err(Error::AlreadyExists { run: run.clone() })
                    }
                    Some(tombstone) => tombstone.fence,
                    None => 0,
                };
                // Creation order within the batch: each id one microsecond after the one before.
                let since = now + i as u64;
                Ok(self.plan(
                    run.as_str(),
                    seen,
                    &Rec::fresh(fence, since),
                    Vec::new(),
                    (),
                ))
            })
            .await?
            .into_iter();
        Ok(runs
            .iter()
            .zip(dup)
            .map(|(run, dup)| {
                if dup {
                    Err(Error::AlreadyExists { run: run.clone() })
                } else {
                    decided.next().expect("one result per unique run")
                }
            })
            .collect())
    }

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        self.decide_one(run, |seen, now| {
            let rec = seen.live(run)?;
            let state = state_of(rec);
            if !matches!(state, RunState::Suspended | RunState::Failed) {
                return Err(Error::NotSuspended {
                    run: run.clone(),
                    state,
                });
            }
            let mut new = rec.clone();
            new.state = Some(RunState::Runnable);
            new.failure = None;
            new.attempts = 0; // a fresh budget
            new.since = now;
            new.not_before = 0;
            let after = Seen {
                rec: Some(new.clone()),
                rev: seen.rev,
                block: None,
            };
            let out = self.record(run, &after, now)?;
            Ok(self.plan(run.as_str(), seen, &new, Vec::new(), out))
        })
        .await
    }

    async fn complete(&self, lease: &Lease) -> Result<()> {
        self.end_one(lease, End::Complete).await
    }

    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        let now = now_micros();
        let seen = self.read(&[run]).await?;
        self.record(run, &seen[0], now)
    }

    async fn inspect_many(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        if runs.len() > MAX_BATCH {
            return Err(InvalidInput::BatchTooLarge {
                len: runs.len(),
                max: MAX_BATCH,
            }
            .into());
        }
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let now = now_micros();
        let ids: Vec<&RunId> = runs.iter().collect();
        let seen = self.read(&ids).await?;
        Ok(runs
            .iter()
            .zip(&seen)
            .map(|(run, item)| self.record(run, item, now))
            .collect())
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        check_list(filter)?;
        let prefix = self.keys.records();
        let end = prefix_end(&prefix);
        let mut from = match &filter.after {
            Some(after) => {
                let mut k = self.keys.record(after.as_str());
                k.push(0);
                k
            }
            None => prefix,
        };
        let page_size = if filter.state.is_some() || filter.expired {
            MAX_BATCH as i64
        } else {
            filter.limit as i64
        };
        let mut out = Vec::new();
        while out.len() < filter.limit {
            let now = now_micros();
            let page = self
                .range(from.clone(), end.clone(), page_size, true, 0)
                .await?;
            let revision = page.header().map_or(0, ResponseHeader::revision);
            let mut runs = Vec::new();
            let mut recs = Vec::new();
            for kv in page.kvs() {
                let Some(run) = self.keys.run_of_record(kv.key()) else {
                    continue;
                };
                let rec = Rec::decode(kv.value())?;
                if rec.state.is_none() {
                    continue;
                }
                runs.push(RunId::new(run)?);
                recs.push((rec, kv.mod_revision()));
            }
            // The block keys at the page's revision: one consistent view.
            let mut ops = Vec::new();
            for run in &runs {
                ops.push(TxnOp::get(
                    self.keys.block(run.as_str()),
                    Some(GetOptions::new().with_revision(revision)),
                ));
            }
            let mut blocks = Vec::with_capacity(runs.len());
            for chunk in ops.chunks(CHUNK * 2) {
                let response = self.txn(Txn::new().and_then(chunk.to_vec())).await?;
                for answer in response.op_responses() {
                    blocks.push(match answer {
                        TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value() == b"h"),
                        _ => None,
                    });
                }
            }
            for ((run, (rec, rev)), block) in runs.iter().zip(recs).zip(blocks) {
                let seen = Seen {
                    rec: Some(rec),
                    rev,
                    block,
                };
                let record = self.record(run, &seen, now)?;
                if filter.state.is_none_or(|s| s == record.state)
                    && (!filter.expired || record.is_expired())
                    && out.len() < filter.limit
                {
                    out.push(record);
                }
            }
            match page.kvs().last() {
                Some(last) if page.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => break,
            }
        }
        Ok(out)
    }

    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        self.decide_one(run, |seen, now| {
            let rec = seen.live(run)?;
            match state_of(rec) {
                RunState::Suspended => return Err(Error::Suspended { run: run.clone() }),
                RunState::Completed => return Err(Error::Completed { run: run.clone() }),
                RunState::Failed => return Err(Error::Failed { run: run.clone() }),
                _ => {}
            }
            let mut new = rec.clone();
            new.owner = None;
            new.expires_at = 0;
            new.not_before = 0;
            new.since = now;
            let after = Seen {
                rec: Some(new.clone()),
                rev: seen.rev,
                block: None,
            };
            let out = self.record(run, &after, now)?;
            Ok(self.plan(
                run.as_str(),
                seen,
                &new,
                vec![self.delete_block(run.as_str())],
                out,
            ))
        })
        .await
    }

    async fn purge(&self, older_than: Duration, max: usize) -> Result<Vec<RunId>> {
        check_purge(older_than, max)?;
        let mut due: Vec<(u64, RunId)> = Vec::new();
        for (from, to) in self.purgeable_ranges(older_than) {
            let page = self.range(from, to, max as i64, false, 0).await?;
            for kv in page.kvs() {
                if let Some((since, run)) = self.keys.parse_index(kv.key()) {
                    due.push((since, RunId::new(run)?));
                }
            }
        }
        due.sort();
        due.truncate(max);
        let ids: Vec<&RunId> = due.iter().map(|(_, r)| r).collect();
        let seen = self.read(&ids).await?;
        let mut plans = Vec::new();
        for ((since, run), item) in due.iter().zip(&seen) {
            let Ok(rec) = item.live(run) else { continue };
            let ended = matches!(rec.state, Some(RunState::Completed | RunState::Failed));
            if !ended || rec.since != *since {
                continue; // changed since the index was read: not removed
            }
            let r = run.as_str();
            let journal = self.keys.journal_prefix(r);
            let keys = self.keys.keys_prefix(r);
            let extra = vec![
                TxnOp::delete(
                    journal.clone(),
                    Some(DeleteOptions::new().with_range(prefix_end(&journal))),
                ),
                TxnOp::delete(
                    keys.clone(),
                    Some(DeleteOptions::new().with_range(prefix_end(&keys))),
                ),
                self.delete_block(r),
            ];
            plans.push(self.plan(r, item, &Rec::tombstone(rec.fence), extra, run.clone()));
        }
        Ok(self.execute(plans).await?.into_iter().flatten().collect())
    }

    async fn count(&self) -> Result<RunCounts> {
        let families = [
            RunState::Runnable,
            RunState::Suspended,
            RunState::Completed,
            RunState::Failed,
        ];
        let mut ops: Vec<TxnOp> = families
            .iter()
            .map(|&s| {
                let family = self.keys.index_family(s);
                Self::count_op(family.clone(), prefix_end(&family))
            })
            .collect();
        let blocks = self.keys.blocks();
        ops.push(TxnOp::get(
            blocks.clone(),
            Some(
                GetOptions::new()
                    .with_range(prefix_end(&blocks))
                    .with_limit((2 * MAX_COUNT) as i64),
            ),
        ));
        let response = self.txn(Txn::new().and_then(ops)).await?;
        let (mut held, mut delayed) = (0u64, 0u64);
        if let Some(TxnOpResponse::Get(get)) = response.op_responses().get(4) {
            for kv in get.kvs() {
                if kv.value() == b"h" {
                    held += 1;
                } else {
                    delayed += 1;
                }
            }
        }
        let runnable = counted(&response, 0);
        let cap = |n: u64| n.min(MAX_COUNT);
        let mut counts = RunCounts::default();
        counts.claimable = cap(runnable.saturating_sub(held + delayed));
        counts.held = cap(held);
        counts.delayed = cap(delayed);
        counts.suspended = cap(counted(&response, 1));
        counts.completed = cap(counted(&response, 2));
        counts.failed = cap(counted(&response, 3));
        Ok(counts)
    }

    async fn count_purgeable(&self, older_than: Duration) -> Result<u64> {
        check_purge(older_than, 1)?;
        let ops: Vec<TxnOp> = self
            .purgeable_ranges(older_than)
            .into_iter()
            .map(|(from, to)| Self::count_op(from, to))
            .collect();
        let response = self.txn(Txn::new().and_then(ops)).await?;
        Ok(counted(&response, 0) + counted(&response, 1))
    }
}

impl EtcdLeaseStore {
    async fn append_entry(
        &self,
        lease: &Lease,
        key: Option<&IdempotencyKey>,
        payload: &[u8],
        retry: bool,
    ) -> Result<JournalEntry> {
        let run = lease.run();
        // A key already used returns its entry: read it (entries never change until purge).
        let used = match key {
            Some(key) => {
                let index = self.keys.idempotency(run.as_str(), key.as_str());
                let got = self
                    .call("a read", |mut l| async move { l.kv.get(index, None).await })
                    .await?;
                got.kvs()
                    .first()
                    .and_then(|kv| <[u8; 8]>::try_from(kv.value()).ok().map(u64::from_be_bytes))
            }
            None => None,
        };
        if let Some(seq) = used {
            let seen = self.read(&[run]).await?;
            // The fence first: a used key never lets a stale or forged fence through.
            if lease.fence().get() != seen[0].live(run)?.fence {
                seen[0].writable(lease)?;
            }
            let entry = self.keys.entry(run.as_str(), seq);
            let got = self
                .call("a read", |mut l| async move { l.kv.get(entry, None).await })
                .await?;
            if let Some(kv) = got.kvs().first() {
                let (fence, at, payload) = decode_entry(kv.value())?;
                return Ok(JournalEntry::new(
                    seq,
                    Fence::new(fence)?,
                    payload,
                    StoreTime::from_micros(at),
                ));
            }
        }
        let index = key.map(|key| self.keys.idempotency(run.as_str(), key.as_str()));
        let appended = self
            .decide_one(run, |seen, now| {
                let rec = seen.writable(lease)?;
                let mut new = rec.clone();
                new.journal_len += 1;
                let seq = new.journal_len;
                let mut extra = vec![TxnOp::put(
                    self.keys.entry(run.as_str(), seq),
                    encode_entry(rec.fence, now, payload),
                    None,
                )];
                let mut compares = Vec::new();
                if let Some(index) = &index {
                    extra.push(TxnOp::put(index.clone(), seq.to_be_bytes().to_vec(), None));
                    // Written by nobody since the read above: else read and decide again.
                    compares.push(Compare::create_revision(index.clone(), CompareOp::Equal, 0));
                }
                let out = JournalEntry::new(
                    seq,
                    lease.fence(),
                    payload.to_vec(),
                    StoreTime::from_micros(now),
                );
                let mut plan = self.plan(run.as_str(), seen, &new, extra, out);
                plan.compares.extend(compares);
                plan.bytes += payload.len();
                Ok(plan)
            })
            .await;
        match appended {
            // Another call wrote the key between the read and the write: it now answers.
            Err(Error::Unavailable { .. }) if key.is_some() && retry => {
                Box::pin(self.append_entry(lease, key, payload, false)).await
            }
            other => other,
        }
    }
}

impl fmt::Debug for EtcdLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLeaseStore")
            .field("config", &self.config)
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for EtcdLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.config, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_conformance::fixtures::etcd::{EtcdCluster, HINT, MEMBERS};

    #[test]
    fn ttls_are_whole_seconds_from_one_rounded_up_and_shorter_ones_refused() {
        let secs = |ms| lease_seconds(Ttl::from_millis(ms).unwrap());
        assert!(matches!(
            secs(999),
            Err(Error::InvalidInput(InvalidInput::TtlUnderBackendMinimum { min, .. })) if min == MIN_TTL
        ));
        let (n, ttl) = secs(1_001).unwrap();
        assert_eq!((n, ttl.as_millis()), (2, 2_000));
        let (n, ttl) = secs(30_000).unwrap();
        assert_eq!((n, ttl.as_millis()), (30, 30_000));
    }

    /// A run whose recorded claimable-since is an hour ahead (written by a client whose clock
    /// is an hour fast) is still handed out by `claim_next` on the next sweep past now, while a
    /// run etcd still holds is not: no run waits on a clock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_stamped_by_a_fast_clock_is_still_claimed() {
        let Some(cluster) = lease_conformance::fixtures::required(
            "etcd cluster",
            EtcdCluster::start().map_err(|e| e.to_string()),
            HINT,
        ) else {
            return;
        };
        let endpoints: Vec<String> = (0..MEMBERS).map(|i| cluster.endpoint(i)).collect();
        let store = EtcdLeaseStore::connect(EtcdConfig::new(endpoints, "skew").unwrap())
            .await
            .unwrap();
        let w = WorkerId::new("w").unwrap();
        let (skewed, held) = (RunId::new("skewed").unwrap(), RunId::new("held").unwrap());
        store.create(&skewed).await.unwrap();
        store.create(&held).await.unwrap();
        store
            .claim(&held, &w, Ttl::from_secs(60).unwrap())
            .await
            .unwrap();
        // Rewrite the fresh run as a client an hour fast would have written it.
        let seen = store.read(&[&skewed]).await.unwrap().remove(0);
        let mut ahead = seen.rec.clone().unwrap();
        ahead.since = now_micros() + 3_600_000_000;
        let plan = store.plan(skewed.as_str(), &seen, &ahead, Vec::new(), ());
        assert_eq!(store.execute(vec![plan]).await.unwrap(), vec![Some(())]);

        // The first call sweeps past now at once; a later one within SWEEP_EVERY would not.
        let got = store
            .claim_next(&w, Ttl::from_secs(30).unwrap(), 10)
            .await
            .unwrap();
        let runs: Vec<&RunId> = got.iter().map(Lease::run).collect();
        assert_eq!(runs, vec![&skewed], "the skewed run, and not the held one");
        assert_eq!(got[0].fence().get(), 1);
        assert!(store
            .claim_next(&w, Ttl::from_secs(30).unwrap(), 10)
            .await
            .unwrap()
            .is_empty());
    }
}
