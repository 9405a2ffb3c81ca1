//! Restore safety: a prefix is bound to one cluster and to how far that cluster's Raft log
//! had come, so a cluster restored from a snapshot cannot hand out fences again.
//!
//! A snapshot restore done as etcd's guide does it (same member names, peer URLs and
//! `--initial-cluster-token`) keeps the cluster id and the member ids, and brings back every
//! key, fences included, as it was at the snapshot. What it cannot bring back is the Raft
//! log: `etcdctl snapshot restore` starts a fresh one, at an index of a few entries. So the
//! binding key `m` holds the cluster id and a Raft index the cluster had reached (the highest
//! committed index among its members), refreshed by the stores that use it:
//! - **At connect**, a store asks every member for its committed index and refuses when the
//!   highest is below the one recorded: the log went back, the cluster was restored.
//! - **While running**, a store refuses an answer whose revision is below one it had already
//!   received (a rewound history), and every [`GUARD_EVERY`] reads `m` before its next call:
//!   a binding whose revision went back was restored with the keyspace. Every
//!   [`REFRESH_EVERY`] it writes `m` again with the current index, so that a snapshot older
//!   than that is always caught.
//!
//! An operator who has checked that every run's fence is current after a restore rebinds
//! the prefix with [`EtcdLeaseStore::rebind`] (`lease etcd-rebind`).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::rpc::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use lease_core::{Error, Result};

use lease_core::MAX_BATCH;

use super::decide::next_page;
use super::{now_micros, EtcdLeaseStore, Link, Plan};
use crate::codec::{prefix_end, Rec};
use crate::config::EtcdConfig;
use crate::error::BACKEND;

/// How often a running store reads its binding before a call.
pub(super) const GUARD_EVERY: Duration = Duration::from_secs(1);

/// How often a running store records the cluster's Raft index in its binding.
pub(super) const REFRESH_EVERY: Duration = Duration::from_secs(30);

/// What a store has seen of its binding.
#[derive(Debug, Default)]
pub(super) struct Watch {
    /// The highest mod revision of the binding key seen.
    revision: AtomicI64,
    /// When the binding was last read and last refreshed (client micros).
    read_at: AtomicU64,
    refreshed_at: AtomicU64,
    /// Whether every record has its state entry (see [`Binding`]).
    pub(super) states: AtomicBool,
}

/// The binding as stored: `"{cluster}"` (before the Raft index was kept),
/// `"{cluster} {raft_index}"`, or `"{cluster} {raft_index} s"` once every record has its
/// entry in the state families (`list` by state reads them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Binding {
    cluster: u64,
    index: u64,
    states: bool,
}

impl Binding {
    fn parse(value: &[u8]) -> Option<Binding> {
        let text = std::str::from_utf8(value).ok()?;
        let mut parts = text.split(' ');
        let cluster = parts.next()?.parse().ok()?;
        let index = parts.next().map_or(Some(0), |i| i.parse().ok())?;
        let states = match parts.next() {
            None => false,
            Some("s") => true,
            Some(_) => return None,
        };
        Some(Binding {
            cluster,
            index,
            states,
        })
    }

    fn encode(self) -> Vec<u8> {
        let states = if self.states { " s" } else { "" };
        format!("{} {}{states}", self.cluster, self.index).into_bytes()
    }
}

/// What [`EtcdLeaseStore::rebind`] replaced and wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebound {
    /// The cluster id and Raft index the prefix was bound to, if any.
    pub before: Option<(u64, u64)>,
    /// The cluster id and Raft index it is bound to now.
    pub after: (u64, u64),
}

impl EtcdLeaseStore {
    /// The cluster id and the highest committed Raft index among the members that answer;
    /// refused when two members answer for different clusters (one URL naming members of
    /// two clusters).
    pub(super) async fn raft_progress(&self) -> Result<(u64, u64)> {
        let bound = self.config.timeout();
        let asked = self.links.iter().map(|link: &Link| async move {
            let mut maintenance = link.client.maintenance_client();
            tokio::time::timeout(bound, maintenance.status()).await
        });
        let answers = futures_util::future::join_all(asked).await;
        let mut seen: Option<(u64, u64, usize)> = None;
        let mut last = None;
        for (i, answer) in answers.into_iter().enumerate() {
            let status = match answer {
                Ok(Ok(status)) => status,
                Ok(Err(e)) => {
                    last = Some(crate::error::classify(e));
                    continue;
                }
                Err(_) => {
                    last = Some(crate::error::timed_out("a member status", bound));
                    continue;
                }
            };
            let cluster = status.header().map_or(0, |h| h.cluster_id());
            let index = status.raft_index();
            match seen {
                Some((other, _, at)) if other != cluster => {
                    return Err(Error::misconfigured(
                        BACKEND,
                        format!(
                            "the endpoints reach two etcd clusters: {} is in cluster {other}, \
                             {} in cluster {cluster}; list the members of one cluster",
                            self.config.endpoints()[at],
                            self.config.endpoints()[i],
                        ),
                    ))
                }
                Some((_, best, at)) => seen = Some((cluster, best.max(index), at)),
                None => seen = Some((cluster, index, i)),
            }
        }
        match seen {
            Some((cluster, index, _)) => Ok((cluster, index)),
            None => Err(last.unwrap_or_else(|| crate::error::timed_out("a member status", bound))),
        }
    }

    /// Binds the prefix at connect: records the cluster and its Raft index on first use,
    /// refuses another cluster or a Raft log that went back, and records the index again.
    /// With `rebind`, records the current cluster and index whatever was there.
    pub(super) async fn bind(&mut self, rebind: bool) -> Result<Rebound> {
        // The binding is checked here: the guard need not read or refresh it meanwhile.
        self.watch.read_at.store(now_micros(), Ordering::Relaxed);
        self.watch
            .refreshed_at
            .store(now_micros(), Ordering::Relaxed);
        let (cluster, index) = self.raft_progress().await?;
        let meta = self.keys.meta();
        let got = {
            let meta = meta.clone();
            self.call("connect", move |mut l| {
                let meta = meta.clone();
                async move { l.kv.get(meta, None).await }
            })
            .await?
        };
        let stored = got.kvs().first();
        let revision = stored.map_or(0, |kv| kv.mod_revision());
        let before = stored.and_then(|kv| Binding::parse(kv.value()));
        if stored.is_some_and(|kv| !kv.value().is_empty()) && before.is_none() && !rebind {
            return Err(self.refusal("its binding key holds something this adapter did not write"));
        }
        if let (Some(b), false) = (before, rebind) {
            if b.cluster != cluster {
                return Err(self.refusal(&format!(
                    "it was first used on etcd cluster {}, but this is cluster {cluster}",
                    b.cluster
                )));
            }
            if index < b.index {
                return Err(self.refusal(&format!(
                    "this cluster's Raft log is at index {index}, behind the {} this prefix \
                     recorded: the cluster was restored from a snapshot (or rebuilt from a \
                     member that had fallen behind)",
                    b.index
                )));
            }
        }
        let states = match before {
            Some(b) if b.states => true,
            // A prefix used before the state families existed (or never used): give every
            // record its entry, then say so in the binding.
            _ => {
                self.index_states().await?;
                true
            }
        };
        let after = Binding {
            cluster,
            states,
            index: if rebind {
                index
            } else {
                index.max(
                    before
                        .filter(|b| b.cluster == cluster)
                        .map_or(0, |b| b.index),
                )
            },
        };
        if rebind {
            // Before the new binding lets anyone serve the prefix again.
            self.raise_fences().await?;
        }
        let written = self.write_binding(revision, after).await?;
        self.watch.states.store(states, Ordering::Relaxed);
        self.cluster = cluster;
        if let Some(header) = written.header() {
            self.floor.fetch_max(header.revision(), Ordering::SeqCst);
        }
        self.watch.read_at.store(now_micros(), Ordering::Relaxed);
        self.watch
            .refreshed_at
            .store(now_micros(), Ordering::Relaxed);
        Ok(Rebound {
            before: before.map(|b| (b.cluster, b.index)),
            after: (after.cluster, after.index),
        })
    }

    /// Writes the binding if it is still at `revision`; either way notes the binding's
    /// newest revision (another store may have refreshed it in between, which is as good).
    async fn write_binding(
        &self,
        revision: i64,
        binding: Binding,
    ) -> Result<crate::rpc::TxnResponse> {
        let meta = self.keys.meta();
        let unchanged = if revision == 0 {
            Compare::create_revision(meta.clone(), CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(meta.clone(), CompareOp::Equal, revision)
        };
        let txn = Txn::new()
            .when([unchanged])
            .and_then([TxnOp::put(meta.clone(), binding.encode(), None)])
            .or_else([TxnOp::get(meta, None)]);
        let response = self
            .call("writing the prefix's binding", move |mut l| {
                let txn = txn.clone();
                async move { l.kv.txn(txn).await }
            })
            .await?;
        let newest = if response.succeeded() {
            response.header().map_or(0, |h| h.revision())
        } else {
            response
                .op_responses()
                .into_iter()
                .find_map(|op| match op {
                    TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.mod_revision()),
                    _ => None,
                })
                .unwrap_or(0)
        };
        self.watch.revision.fetch_max(newest, Ordering::SeqCst);
        Ok(response)
    }

    /// Before a call, at most every [`GUARD_EVERY`]: reads the binding and refuses when it
    /// went back; every [`REFRESH_EVERY`], records the cluster's Raft index in it.
    pub(super) async fn guard(&self) -> Result<()> {
        let now = now_micros();
        let last = self.watch.read_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) < GUARD_EVERY.as_micros() as u64
            || self
                .watch
                .read_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return Ok(());
        }
        let meta = self.keys.meta();
        let got = self
            .call("reading the prefix's binding", move |mut l| {
                let meta = meta.clone();
                async move { l.kv.get(meta, None).await }
            })
            .await;
        let got = match got {
            Ok(got) => got,
            Err(e) => {
                // Unchecked: the next call reads the binding again, whenever it comes.
                let _ = self.watch.read_at.compare_exchange(
                    now,
                    last,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                return Err(e);
            }
        };
        let stored = got.kvs().first();
        let revision = stored.map_or(0, |kv| kv.mod_revision());
        let seen = self.watch.revision.load(Ordering::SeqCst);
        if revision < seen {
            return Err(self.refusal(&format!(
                "its binding key went back from revision {seen} to {revision}: the keyspace \
                 was restored from a snapshot (or the key deleted)"
            )));
        }
        let binding = stored.and_then(|kv| Binding::parse(kv.value()));
        if binding.is_some_and(|b| b.cluster != self.cluster) {
            return Err(self.refusal("it is now bound to another cluster"));
        }
        self.watch.revision.fetch_max(revision, Ordering::SeqCst);
        let refreshed = self.watch.refreshed_at.load(Ordering::Relaxed);
        if now.saturating_sub(refreshed) >= REFRESH_EVERY.as_micros() as u64
            && self
                .watch
                .refreshed_at
                .compare_exchange(refreshed, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let (cluster, index) = self.raft_progress().await?;
            let recorded = binding.map_or(0, |b| b.index);
            if index < recorded {
                return Err(self.refusal(&format!(
                    "this cluster's Raft log is at index {index}, behind the {recorded} this \
                     prefix recorded: the cluster was restored from a snapshot"
                )));
            }
            let states = binding.is_some_and(|b| b.states);
            self.write_binding(
                revision,
                Binding {
                    cluster,
                    index,
                    states,
                },
            )
            .await?;
        }
        Ok(())
    }

    /// Gives every live record its state entry, in pages of [`MAX_BATCH`] records, each
    /// entry written only if its record is unchanged since the page was read (a record
    /// written since has its entry from that write).
    async fn index_states(&self) -> Result<()> {
        let prefix = self.keys.records();
        let end = prefix_end(&prefix);
        let mut from = prefix;
        let mut written = 0usize;
        loop {
            let page = self
                .range(from.clone(), end.clone(), MAX_BATCH as i64, true, 0)
                .await?;
            let mut plans = Vec::new();
            for kv in page.kvs() {
                let Some(run) = self.keys.run_of_record(kv.key()) else {
                    continue;
                };
                let Some(state) = Rec::decode(kv.value())?.state else {
                    continue;
                };
                plans.push(Plan {
                    compares: vec![Compare::mod_revision(
                        kv.key().to_vec(),
                        CompareOp::Equal,
                        kv.mod_revision(),
                    )],
                    ops: vec![TxnOp::put(
                        self.keys.state_entry(state, run),
                        Vec::new(),
                        None,
                    )],
                    bytes: 64,
                    out: (),
                    wake: None,
                });
            }
            written += plans.len();
            self.execute(plans).await?;
            match next_page(&page) {
                Some(next) => from = next,
                None => break,
            }
        }
        tracing::info!(
            prefix = self.config.prefix(),
            records = written,
            "etcd state index built"
        );
        Ok(())
    }

    /// A rebind moves every fence past anything the restored-over history could have issued:
    /// every record's fence (tombstones of an older release included) and the fence floor rise
    /// by [`REBIND_FENCE_STEP`](lease_core::REBIND_FENCE_STEP), as `lease pg-rebind` and `lease
    /// redis-rebind` do. A holder of the old history then presents a fence below the run's and
    /// is refused (`StaleFence`). Each record is rewritten only if unchanged since read; one
    /// that changed means a store still serves the prefix: the rebind fails saying so, and
    /// can be run again (a fence raised twice is only higher).
    async fn raise_fences(&self) -> Result<()> {
        let step = lease_core::REBIND_FENCE_STEP;
        let prefix = self.keys.records();
        let end = prefix_end(&prefix);
        let mut from = prefix;
        let mut raised = 0usize;
        loop {
            let page = self
                .range(from.clone(), end.clone(), MAX_BATCH as i64, true, 0)
                .await?;
            let mut plans = Vec::new();
            for kv in page.kvs() {
                if self.keys.run_of_record(kv.key()).is_none() {
                    continue;
                }
                let mut rec = Rec::decode(kv.value())?;
                rec.fence = rec.fence.checked_add(step).ok_or_else(|| {
                    Error::backend(BACKEND, "a fence would pass u64::MAX at rebind")
                })?;
                let value = rec.encode();
                plans.push(Plan {
                    compares: vec![Compare::mod_revision(
                        kv.key().to_vec(),
                        CompareOp::Equal,
                        kv.mod_revision(),
                    )],
                    bytes: kv.key().len() + value.len(),
                    ops: vec![TxnOp::put(kv.key().to_vec(), value, None)],
                    out: (),
                    wake: None,
                });
            }
            let planned = plans.len();
            let done = self.execute(plans).await?.into_iter().flatten().count();
            raised += done;
            if done < planned {
                return Err(self.still_served(raised));
            }
            match next_page(&page) {
                Some(next) => from = next,
                None => break,
            }
        }
        let floor = self.floor().await?;
        let top = floor.fence.saturating_add(step);
        let txn = Txn::new()
            .when([self.floor_unchanged(floor)])
            .and_then([TxnOp::put(self.keys.floor(), top.to_string(), None)]);
        let response = self.txn(txn).await?;
        if !response.succeeded() {
            return Err(self.still_served(raised));
        }
        tracing::warn!(
            prefix = self.config.prefix(),
            runs = raised,
            floor = top,
            "etcd prefix rebind: every fence raised"
        );
        Ok(())
    }

    fn still_served(&self, raised: usize) -> Error {
        Error::misconfigured(
            BACKEND,
            format!(
                "rebinding the etcd key prefix {:?}: a run changed while its fence was being \
                 raised ({raised} raised so far), so a store still serves the prefix; stop it \
                 and run `lease etcd-rebind` again (a fence raised twice is only higher)",
                self.config.prefix(),
            ),
        )
    }

    fn refusal(&self, why: &str) -> Error {
        Error::misconfigured(
            BACKEND,
            format!(
                "refusing the etcd key prefix {:?}: {why}. A cluster restored from a snapshot \
                 holds fences as they were at the snapshot, so two workers could write under \
                 one fence. Rebind it, which raises every fence past the old history's: \
                 `lease etcd-rebind --store etcd://…` (EtcdLeaseStore::rebind)",
                self.config.prefix(),
            ),
        )
    }

    /// Binds `config`'s prefix to the cluster its endpoints reach now, at its current Raft
    /// index, whatever it was bound to: the operator's decision after a restore. First every
    /// run's fence and the fence floor rise by [`REBIND_FENCE_STEP`](lease_core::REBIND_FENCE_STEP),
    /// so no fence the old history issued is issued again. Returns what was replaced.
    ///
    /// # Errors
    /// As for [`EtcdLeaseStore::connect`], without the binding's refusals.
    pub async fn rebind(config: EtcdConfig) -> Result<Rebound> {
        let mut store = Self::open(config).await?;
        let rebound = store.bind(true).await?;
        tracing::warn!(prefix = store.config.prefix(), before = ?rebound.before, after = ?rebound.after, "etcd prefix rebound by an operator");
        Ok(rebound)
    }
}

#[cfg(test)]
mod tests {
    use super::Binding;

    #[test]
    fn bindings_round_trip_and_the_old_form_reads_as_index_zero() {
        for states in [false, true] {
            let b = Binding {
                cluster: 17,
                index: 4_242,
                states,
            };
            assert_eq!(Binding::parse(&b.encode()), Some(b));
        }
        assert_eq!(
            Binding::parse(b"17"),
            Some(Binding {
                cluster: 17,
                index: 0,
                states: false,
            })
        );
        assert_eq!(Binding::parse(b"17 5 x"), None);
        assert_eq!(Binding::parse(b"17 x"), None);
        assert_eq!(Binding::parse(b""), None);
    }
}
