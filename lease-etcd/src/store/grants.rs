//! The etcd leases that time blocks: a few, reused, instead of one per call.
//!
//! etcd's leader revokes at most 1,000 expired leases per second, in expiry order, for the
//! whole cluster (3.4's `leaseRevokeRate`). A client that granted a lease per call would,
//! above that rate, queue revocations faster than etcd drains them, and every dead holder's
//! run would wait behind the queue. So a store keeps one lease per duration (a *bucket*) and
//! attaches every block of that duration to it for [`REUSE`]: a lease of `secs` is granted
//! for `secs + REUSE` and handed out only during the first `REUSE` after it was asked for.
//! A block attached to it at `t` therefore expires after `t + secs` (later, never earlier:
//! the grant was sent before `t`, and etcd starts the lease when it grants it) and at most
//! `REUSE` plus a grant's round trip after `t + secs`. A store grants at most one lease per
//! bucket per `REUSE`: a Worker with one TTL, a second per second for its claims and renewals,
//! plus one per delay bucket in use.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lease_core::{Error, Result};

use super::EtcdLeaseStore;
use crate::error::BACKEND;

/// How long a granted lease is handed out, and so how much later than asked a block can
/// expire. Whole seconds: etcd's leases are.
pub(super) const REUSE: Duration = Duration::from_secs(1);

/// The buckets of one store: duration in seconds → (lease id, when it was asked for).
#[derive(Debug, Default)]
pub(super) struct Grants {
    buckets: tokio::sync::Mutex<HashMap<i64, (i64, Instant)>>,
    granted: AtomicU64,
}

impl Grants {
    pub(super) fn granted(&self) -> u64 {
        self.granted.load(Ordering::Relaxed)
    }
}

/// A delay's bucket in seconds: exact up to 10 s, then on a grid of about a tenth of the
/// delay (5 s up to a minute, 30 s up to ten minutes, then a minute), rounded up: a delayed
/// run becomes claimable later than asked by at most that step, never earlier.
pub(super) fn delay_bucket(secs: u64) -> u64 {
    let step = match secs {
        ..=10 => 1,
        11..=60 => 5,
        61..=600 => 30,
        _ => 60,
    };
    secs.div_ceil(step) * step
}

impl EtcdLeaseStore {
    /// For each duration in `secs`, an etcd lease that keeps a key attached to it now for at
    /// least that long: a bucket's lease when it is fresh enough, else one granted now.
    pub(super) async fn grant(&self, secs: &[i64]) -> Result<Vec<i64>> {
        let mut distinct: Vec<i64> = secs.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        // Held across the grants: callers that find a bucket stale wait for one grant
        // instead of each sending their own.
        let mut buckets = self.grants.buckets.lock().await;
        let mut ids = HashMap::with_capacity(distinct.len());
        let mut missing = Vec::new();
        for &s in &distinct {
            match buckets.get(&s) {
                Some(&(id, asked)) if asked.elapsed() < REUSE => {
                    ids.insert(s, id);
                }
                _ => missing.push(s),
            }
        }
        let pad = REUSE.as_secs() as i64;
        let granted = futures_util::future::try_join_all(missing.iter().map(|&s| async move {
            let asked = Instant::now();
            let granted = self
                .call("a lease grant", |mut l| async move {
                    l.leases.grant(s + pad).await
                })
                .await?;
            if !granted.error().is_empty() {
                return Err(Error::unavailable(BACKEND, granted.error().to_string()));
            }
            Ok::<_, Error>((s, granted.id(), asked))
        }))
        .await?;
        self.grants
            .granted
            .fetch_add(granted.len() as u64, Ordering::Relaxed);
        for (s, id, asked) in granted {
            buckets.insert(s, (id, asked));
            ids.insert(s, id);
        }
        // Buckets nobody asked for lately are dropped: their leases expire on their own.
        buckets.retain(|_, (_, asked)| asked.elapsed() < Duration::from_secs(60));
        Ok(secs.iter().map(|s| ids[s]).collect())
    }

    /// How many etcd leases this store has granted since it connected: at most one per
    /// duration in use per second (see the crate docs on lease reuse).
    pub fn leases_granted(&self) -> u64 {
        self.grants.granted()
    }

    /// The remaining seconds of etcd leases `ids` as etcd's leader counts them; -1 for a
    /// lease that expired (its keys are being deleted).
    pub(super) async fn remaining(&self, ids: &[i64]) -> Result<HashMap<i64, i64>> {
        let answers = futures_util::future::try_join_all(ids.iter().map(|&id| async move {
            let answer = self
                .call("a lease time-to-live", |mut l| async move {
                    l.leases.time_to_live(id).await
                })
                .await?;
            Ok::<_, Error>((id, answer.ttl()))
        }))
        .await?;
        Ok(answers.into_iter().collect())
    }
}
