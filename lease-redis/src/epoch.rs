//! Restore safety: a namespace whose data went back (an older RDB or AOF put back) is refused
//! until an operator rebinds it, so that fences claimed since the backup are not issued again
//! while their holders still run.
//!
//! Redis keeps no history a store could compare with, so the namespace keeps one: the epoch
//! `{lease:ns}:epoch`, a counter every store increments (`lua/epoch.lua`) at connect, on every
//! new connection and every [`EPOCH_EVERY`] while it runs, each store remembering the highest
//! value it had acknowledged by the configured replicas (as its other writes are). A store whose
//! increment reads back a value **not above** the one it remembers knows the data went back;
//! the script then sets the marker `{lease:ns}:restored`, in the same atomic step, and the store
//! refuses every call with [`Error::Misconfigured`](lease_core::Error::Misconfigured) naming
//! `lease redis-rebind`. Every claiming script (`claim.lua`, `claim_next.lua`) reads the marker
//! and refuses while it is set, so a process started after the restore cannot claim either once
//! any old process has noticed, and a store meeting the marker on a new connection refuses
//! every call.
//!
//! A restore restarts the server, so every connection of a store that lived through it is new
//! afterwards and checked before its first command (a Cluster's: at the guard's re-check
//! after the failure, before the next call); renewals and fenced writes need no check of their
//! own. A dataset replaced while the server runs (keys replayed into it, no restart) is noticed
//! at the next increment, within [`EPOCH_EVERY`]; a claim made before that may repeat a fence.
//!
//! Not detected: a restore nobody alive had seen past (no store had incremented the epoch since
//! the backup, or none of them is still running). A fleet started afresh after a restore, with
//! no process of the old history alive, has no holder to fear.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lease_core::Result;

use crate::call::Call;
use crate::config::RedisConfig;
use crate::error::RedisError;
use crate::keys::Keys;
use crate::reply::Reply;
use crate::store::{RedisLeaseStore, SCRIPTS};

/// How often a running store increments the epoch, at the start of a call.
pub(crate) const EPOCH_EVERY: Duration = Duration::from_secs(30);

pub use lease_core::REBIND_FENCE_STEP;

/// How far a rebind raises the epoch: past any value a store of the history before the
/// restore could have seen (2^40 increments: every store's every 30 s for millennia).
const EPOCH_JUMP: u64 = 1 << 40;

/// What a store knows of its namespace's epoch.
pub(crate) struct Epoch {
    key: String,
    marker: String,
    namespace: String,
    server: String,
    /// Whether a restore is refused (a rebind's store refuses nothing).
    enforce: bool,
    /// The highest epoch this store's increments read back, acknowledged by the replicas.
    seen: AtomicU64,
    /// When the epoch was last incremented, in ms since `origin`.
    checked_ms: AtomicU64,
    origin: Instant,
}

impl Epoch {
    pub(crate) fn new(keys: &Keys, config: &RedisConfig, enforce: bool) -> Epoch {
        Epoch {
            key: keys.epoch(),
            marker: keys.restored(),
            namespace: config.namespace().to_owned(),
            server: config.shown_url(),
            enforce,
            seen: AtomicU64::new(0),
            checked_ms: AtomicU64::new(0),
            origin: Instant::now(),
        }
    }

    /// The increment, sent with what this store has seen, and that value, to judge the
    /// reply by ([`judge`](Epoch::judge)).
    pub(crate) fn call(&self) -> (Call<'static>, u64) {
        let seen = self.seen.load(Ordering::SeqCst);
        let mut call = Call::new(&SCRIPTS.epoch);
        call.key(&self.key).key(&self.marker).arg(seen);
        (call, seen)
    }

    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// Whether the periodic increment is due; `true` for one caller only.
    pub(crate) fn due(&self) -> bool {
        let now = self.now_ms();
        let last = self.checked_ms.load(Ordering::Relaxed);
        now.saturating_sub(last) >= EPOCH_EVERY.as_millis() as u64
            && self
                .checked_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Judges an increment's reply: a refusal when the marker is set or the epoch did not
    /// rise above `sent`, what this store had seen when it sent the increment (not what it
    /// has seen since: two connections' increments may answer in any order); otherwise the
    /// epoch is remembered if the replicas acknowledged it (an unacknowledged one could be
    /// lost in a failover without any restore, and then read as one).
    pub(crate) fn judge(
        &self,
        value: redis::Value,
        acked: bool,
        sent: u64,
    ) -> Result<(), RedisError> {
        let reply = Reply::new("epoch", value)?;
        let epoch: u64 = reply.parse(0)?;
        let marker = reply.str(1).ok();
        self.checked_ms.store(self.now_ms(), Ordering::Relaxed);
        if self.enforce {
            if let Some(marker) = marker {
                return Err(self.refusal(marker));
            }
            if epoch <= sent {
                // The script set the marker, unless one was there.
                return Err(self.refusal(&format!(
                    "the epoch went back to {epoch} under a store that had seen {sent}"
                )));
            }
        }
        if acked {
            self.seen.fetch_max(epoch, Ordering::SeqCst);
        }
        Ok(())
    }

    /// The refusal of a restored namespace; `why` is the marker's text.
    pub(crate) fn refusal(&self, why: &str) -> RedisError {
        RedisError::Config(format!(
            "refusing the redis namespace {:?} at {}: it was restored ({why}): its data went \
             back to an older state (an RDB or AOF put back, or a replica promoted that had not \
             received every write), so fences claimed since could be issued again while their \
             holders still run. Once those holders are stopped or may be fenced out, rebind the \
             namespace, which raises every fence by 2^32: `lease redis-rebind --store \
             redis://…` (RedisLeaseStore::rebind)",
            self.namespace, self.server
        ))
    }
}

/// What [`RedisLeaseStore::rebind`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebound {
    /// Why the namespace was marked restored, if it was.
    pub marker: Option<String>,
    /// How many run records had their fence raised by [`REBIND_FENCE_STEP`] (a record the
    /// scan met twice counts twice).
    pub runs: u64,
    /// The fence floor after the rebind (decimal).
    pub floor: String,
    /// The epoch after the rebind.
    pub epoch: u64,
}

impl RedisLeaseStore {
    /// Rebinds `config`'s namespace after a restore: raises the fence floor and every run's
    /// fence by [`REBIND_FENCE_STEP`] (2^32), so that no fence the history before the restore
    /// issued is ever issued again, clears the restore marker and raises the epoch past any
    /// value a store of that history had seen. The operator's decision, once the workers of
    /// the old history are stopped or may be fenced out: a holder of a lease claimed before
    /// is refused with [`StaleFence`](lease_core::Error::StaleFence) from then on, and stores
    /// still running serve again at their next call.
    ///
    /// Claims stay refused while it runs (it sets the marker first); the runs are raised in
    /// script calls of 500 records, each confirmed by the replicas as any write is. Works
    /// while the namespace is refused. Safe to run again after a failure: each run raises
    /// every fence further.
    ///
    /// # Errors
    /// As [`connect`](RedisLeaseStore::connect), without the restore's refusal.
    pub async fn rebind(config: RedisConfig) -> Result<Rebound> {
        config.check()?;
        let store = RedisLeaseStore::open(config, None, false).await?;
        let keys = &store.keys;
        let step = REBIND_FENCE_STEP.to_string();
        let marker = {
            let mut read = Call::new(&SCRIPTS.epoch_marker);
            read.key(keys.restored());
            let reply = store.read("epoch_marker", &read).await?;
            reply.str(0).ok().map(str::to_owned)
        };
        let mut begin = Call::new(&SCRIPTS.rebind_begin);
        begin.key(keys.restored()).key(keys.floor()).arg(&step);
        let (reply, ack) = store.write("rebind_begin", &begin).await?;
        ack.confirm()?;
        let floor = reply.str(0)?.to_owned();
        let mut cursor = "0".to_owned();
        let mut runs = 0u64;
        loop {
            let mut page = Call::new(&SCRIPTS.rebind_page);
            page.key(keys.runs()).arg(&cursor).arg(&step);
            let (reply, ack) = store.write("rebind_page", &page).await?;
            ack.confirm()?;
            runs += reply.parse::<u64>(1)?;
            cursor = reply.str(0)?.to_owned();
            if cursor == "0" {
                break;
            }
        }
        let mut end = Call::new(&SCRIPTS.rebind_end);
        end.key(keys.restored())
            .key(keys.epoch())
            .arg(EPOCH_JUMP.to_string());
        let (reply, ack) = store.write("rebind_end", &end).await?;
        ack.confirm()?;
        let rebound = Rebound {
            marker,
            runs,
            floor,
            epoch: reply.parse(0)?,
        };
        tracing::warn!(
            namespace = store.config().namespace(),
            marker = ?rebound.marker,
            runs = rebound.runs,
            "redis namespace rebound by an operator: every fence raised by 2^32"
        );
        Ok(rebound)
    }
}
