//! [`EtcdLeaseStore`]: the [`LeaseStore`](lease_core::LeaseStore) contract as etcd transactions.

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::rpc::{
    Client, Compare, ConnectOptions, KvClient, LeaseClient, ResponseHeader, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use lease_core::backend::fenced_verdict;
use lease_core::{Error, Fence, InvalidInput, Lease, Result, RunId, RunState, Ttl};
use lease_runtime::observe::count_stale;

use crate::codec::{Keys, Rec};
use crate::config::EtcdConfig;
use crate::error::{classify, timed_out, BACKEND};

mod admin;
mod api;
mod claims;
mod decide;
mod grants;
mod guard;
mod judged;
mod reads;
mod wake;
mod writes;

pub use claims::SCAN_BUDGET;
pub use guard::Rebound;

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

/// A [`LeaseStore`](lease_core::LeaseStore) on etcd v3 (3.4 and later).
///
/// Each run is a record key that is never leased, so its fence survives anything etcd's Raft
/// log survives; a purge deletes the run's keys and raises the namespace's fence floor, where
/// every run is created, so an id created again never reuses a fence. A
/// claim attaches a *block* key to an etcd lease that outlives the claim's TTL (one lease per
/// duration, reused for a second; TTLs past `max_lease` in re-armed links): while the block
/// exists the run is held, and when etcd expires the lease (timed by its leader) the block
/// disappears and the run is claimable. No client clock decides expiry. Every write is one
/// etcd transaction that compares the record's revision with the one the decision was made
/// on, so each check is atomic; batches are nested transactions, one commit per chunk of
/// up to 128 operations (etcd's default `--max-txn-ops`), each item judged on its own.
///
/// Times in records ([`RunRecord::observed_at`](lease_core::RunRecord::observed_at), expiries, journal times) are the client's
/// wall clock when written or read, for display and ordering only (etcd has no time read);
/// claimability is always etcd's lease. See the crate docs for the pitfalls this handles.
pub struct EtcdLeaseStore {
    /// One client per endpoint; calls go to `current` and move on when it fails.
    links: Vec<Link>,
    current: Arc<AtomicUsize>,
    /// Where `claim_next`'s sweep past now goes on from in each kind's family, and when it
    /// last ran.
    cursor: Arc<std::sync::Mutex<std::collections::HashMap<Vec<u8>, Vec<u8>>>>,
    swept: Arc<AtomicU64>,
    keys: Keys,
    config: EtcdConfig,
    cluster: u64,
    /// The highest revision an answer carried: a later call answered below it means the
    /// cluster's history went back (restored from a snapshot), and the store fails closed.
    floor: Arc<AtomicI64>,
    /// What the restore guard has seen and when it last looked (`guard.rs`).
    watch: Arc<guard::Watch>,
    /// The etcd leases blocks are attached to, reused per duration.
    grants: Arc<grants::Grants>,
    /// The store's wake-ups; `None` when they are off (`wake_ups=false`).
    listening: Option<Arc<lease_runtime::WakeListener>>,
}

/// The clients of one endpoint.
#[derive(Clone)]
struct Link {
    /// Kept for its token refresh; the calls go through the clients below.
    client: Client,
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
    /// The etcd lease the block is attached to, 0 when absent.
    block_lease: i64,
}

impl Seen {
    /// The live record if `lease` may write to it, per the fenced-write rules.
    fn writable(&self, lease: &Lease) -> Result<&Rec> {
        let rec = self.live(lease.run())?;
        count_stale(fenced_verdict(
            lease.run(),
            lease.fence(),
            Fence::new(rec.fence)?,
            state_of(rec),
            rec.owner.is_some(),
        ))?;
        Ok(rec)
    }

    /// A run whose record is `rec` at revision `rev`, with `block` (its lease unknown).
    fn of(rec: Rec, rev: i64, block: Option<bool>) -> Seen {
        Seen {
            rec: Some(rec),
            rev,
            block,
            block_lease: 0,
        }
    }

    /// A run as one transaction's gets of its record and its block answered it.
    fn parse(record: Option<&TxnOpResponse>, block: Option<&TxnOpResponse>) -> Result<Seen> {
        let mut item = Seen::default();
        if let Some(TxnOpResponse::Get(get)) = record {
            if let Some(kv) = get.kvs().first() {
                item.rec = Some(Rec::decode(kv.value())?);
                item.rev = kv.mod_revision();
            }
        }
        if let Some(TxnOpResponse::Get(get)) = block {
            if let Some(kv) = get.kvs().first() {
                item.block = Some(kv.value() == b"h");
                item.block_lease = kv.lease();
            }
        }
        Ok(item)
    }

    /// Whether a long hold or delay is between links: no block, time left on the chain.
    fn lapsed(&self) -> bool {
        self.block.is_none()
            && self
                .rec
                .as_ref()
                .is_some_and(|r| r.rest > 0 && r.state == Some(RunState::Runnable))
    }

    /// The live record (not a tombstone), or `NotFound`.
    fn live(&self, run: &RunId) -> Result<&Rec> {
        match &self.rec {
            Some(rec) if rec.state.is_some() => Ok(rec),
            _ => Err(Error::NotFound { run: run.clone() }),
        }
    }
}

/// The fence floor as one read saw it.
#[derive(Debug, Clone, Copy, Default)]
struct Floor {
    /// The highest fence of any purged run (0 before the first purge).
    fence: u64,
    /// The revision that last wrote the floor key, 0 while it does not exist (etcd compares a
    /// missing key's revisions as 0).
    rev: i64,
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
    /// Index entries looked at.
    scanned: usize,
}

/// One item's conditional write, and what it returns if its compares hold.
struct Plan<T> {
    compares: Vec<Compare>,
    ops: Vec<TxnOp>,
    bytes: usize,
    out: T,
    /// The run becomes claimable: its kind and the milliseconds until then, for its kind's
    /// wake key (put once per transaction: etcd refuses a key put twice in one).
    wake: Option<(String, u64)>,
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
        let mut store = Self::open(config).await?;
        store.bind(false).await?;
        tracing::debug!(store = %store, cluster = store.cluster, "connected to etcd");
        Ok(store)
    }

    /// The clients of every endpoint that answers, before any check of the cluster.
    async fn open(config: EtcdConfig) -> Result<EtcdLeaseStore> {
        // The builders take any value; out of range is refused here, before any arithmetic.
        config.validate()?;
        let mut options = ConnectOptions::new()
            .with_timeout(config.timeout())
            .with_connect_timeout(config.connect_timeout())
            .with_keep_alive(Duration::from_secs(10), config.timeout());
        if let Some((user, password)) = config.user() {
            // Tokens expire (simple tokens after --auth-token-ttl idle, JWTs at their TTL):
            // the client authenticates again when etcd says a token is invalid.
            options = options
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        #[cfg(feature = "tls")]
        if config.tls() {
            // The platform's roots (`with_enabled_roots`: the `tls` feature enables tonic's
            // `tls-native-roots`); a bare `TlsOptions::new()` trusts no root at all.
            options = options.with_tls(crate::rpc::TlsOptions::new().with_enabled_roots());
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
                    client: client.clone(),
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
        let listening = config
            .wake_ups()
            .then(|| Arc::new(lease_runtime::WakeListener::new()));
        let store = EtcdLeaseStore {
            links,
            // Each store starts at an endpoint of its own, so a fleet spreads over the members.
            current: Arc::new(AtomicUsize::new(now_micros() as usize % links_len)),
            cursor: Arc::default(),
            swept: Arc::new(AtomicU64::new(0)),
            keys: Keys::new(config.prefix()),
            config,
            cluster: 0,
            floor: Arc::new(AtomicI64::new(0)),
            grants: Arc::default(),
            watch: Arc::default(),
            listening,
        };
        Ok(store)
    }

    /// The first link of a hold or delay of `secs`: at most the store's `max_lease`.
    fn link(&self, secs: i64) -> i64 {
        secs.min(self.config.max_lease().as_secs() as i64).max(1)
    }

    /// The settings this store was opened with.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Runs one call on the current endpoint under the client-side bound. When it fails as
    /// unavailable (the member is down, cut off, or has no leader), later calls go to the next
    /// endpoint: the client fails over to the members that can answer.
    ///
    /// A request etcd refused before applying anything (the member has no leader, or a
    /// linearizable read was cut by a leader change) is sent again on the next endpoint after
    /// a short pause, within the same bound: an election reads as a slower call, not as an
    /// error. A request that timed out or failed otherwise is never sent again here: it may
    /// have been applied.
    async fn call<T, F, Fut>(&self, what: &str, make: F) -> Result<T>
    where
        F: Fn(Link) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, crate::rpc::Error>>,
    {
        let bound = self.config.timeout();
        let started = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            let at = self.current.load(Ordering::Relaxed) % self.links.len();
            let link = &self.links[at];
            let left = bound.saturating_sub(started.elapsed());
            let mut answer = match tokio::time::timeout(left, make(link.clone())).await {
                Ok(result) => result,
                Err(_) => return self.failed_over(at, Err(timed_out(what, bound))),
            };
            // A token etcd no longer takes (expired, or issued before a user or role changed:
            // etcd refuses such a request before applying it) is refreshed and the request
            // sent once more. The client refreshes an expired token by itself; this covers the
            // old auth revision, and a refresh that raced another.
            if matches!(&answer, Err(e) if crate::error::is_stale_token(e)) {
                tracing::debug!(endpoint = %self.config.endpoints()[at], "etcd refused the auth token; refreshing it");
                let left = bound.saturating_sub(started.elapsed());
                answer = match tokio::time::timeout(left, async {
                    link.client.refresh_token().await?;
                    make(link.clone()).await
                })
                .await
                {
                    Ok(result) => result,
                    Err(_) => return self.failed_over(at, Err(timed_out(what, bound))),
                };
            }
            match answer {
                Err(e)
                    if crate::error::is_refused_unapplied(&e)
                        && bound.saturating_sub(started.elapsed()) > pause * 2 =>
                {
                    tracing::debug!(endpoint = %self.config.endpoints()[at], error = %e, "etcd refused the request before applying it; sending it again");
                }
                answer => return self.failed_over(at, answer.map_err(classify)),
            }
            self.fail_over_from(at);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// Moves later calls to the next endpoint when `answer` says this one is unavailable.
    fn failed_over<T>(&self, at: usize, answer: Result<T>) -> Result<T> {
        if let Err(Error::Unavailable { .. }) = &answer {
            self.fail_over_from(at);
        }
        answer
    }

    /// Moves later calls from endpoint `at` to the next one (unless another call already did).
    fn fail_over_from(&self, at: usize) {
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
        self.guard().await?;
        let floor = self.floor.load(Ordering::SeqCst);
        let response = self
            .call("a transaction", move |mut l| {
                let txn = txn.clone();
                async move { l.kv.txn(txn).await }
            })
            .await?;
        self.check_header(response.header(), floor)?;
        Ok(response)
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
}
