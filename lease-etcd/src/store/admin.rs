//! Administration: creates, resumes, forced releases, cancels and purges.

use std::time::Duration;

use crate::rpc::{DeleteOptions, Txn, TxnOp, TxnOpResponse};
use lease_core::backend::{check_new_runs, check_purge};
use lease_core::machine::{Applied, Op};
use lease_core::{EndedStates, Error, NewRun, Result, RunId, RunRecord, RunState};

use super::{judged, now_micros, EtcdLeaseStore, Plan, Seen};
use crate::codec::{prefix_end, Keys, Rec};
use crate::error::BACKEND;

/// Runs per purge transaction: each takes up to 8 operations (record, index and state
/// entries, journal, keys, payload, block and delay marker), and etcd's default
/// `--max-txn-ops` is 128 (the floor's put and compare besides).
const PURGE_CHUNK: usize = 15;

/// A range of keys: from, and the end (exclusive).
type KeyRange = (Vec<u8>, Vec<u8>);

impl EtcdLeaseStore {
    pub(super) fn purgeable_ranges(&self, older_than: Duration) -> [KeyRange; 3] {
        self.purgeable_families(older_than).map(|(_, range)| range)
    }

    /// Each ended state's index family, with its range of entries ended before `older_than`.
    fn purgeable_families(&self, older_than: Duration) -> [(Vec<u8>, KeyRange); 3] {
        let cutoff = now_micros().saturating_sub(older_than.as_micros() as u64);
        [RunState::Completed, RunState::Failed, RunState::Cancelled].map(|state| {
            let family = self.keys.index_family(state);
            let bound = Keys::family_bound(&family, cutoff);
            (family.clone(), (family, bound))
        })
    }

    /// The families of `states` only, each with its range (the families are per state, so a
    /// purge of some states reads nothing of the others).
    fn purgeable_families_of(
        &self,
        states: EndedStates,
        older_than: Duration,
    ) -> Vec<(Vec<u8>, KeyRange)> {
        [RunState::Completed, RunState::Failed, RunState::Cancelled]
            .into_iter()
            .zip(self.purgeable_families(older_than))
            .filter(|(state, _)| states.contains(*state))
            .map(|(_, family)| family)
            .collect()
    }
    /// Creates each run in one conditional write; a start delay is timed by etcd as a retry
    /// delay is (its block and marker on a lease of the delay's bucket, in links past
    /// `max_lease`), so no claim takes the run before it is over.
    pub(super) async fn create_batch(&self, runs: &[NewRun]) -> Result<Vec<Result<()>>> {
        check_new_runs(runs)?;
        let mut first = std::collections::HashMap::new();
        let mut dup = vec![false; runs.len()];
        for (i, new) in runs.iter().enumerate() {
            if first.insert(new.run(), i).is_some() {
                dup[i] = true;
            }
        }
        let unique: Vec<&NewRun> = runs
            .iter()
            .enumerate()
            .filter(|(i, _)| !dup[*i])
            .map(|(_, r)| r)
            .collect();
        let ids: Vec<&RunId> = unique.iter().map(|n| n.run()).collect();
        // Each delay's bucket in seconds (0: none), and a lease for its first link.
        let secs: Vec<u64> = unique
            .iter()
            .map(|n| match start_delay_ms(n) {
                0 => 0,
                ms => super::grants::delay_bucket(ms.div_ceil(1000)),
            })
            .collect();
        let wanted: Vec<i64> = secs
            .iter()
            .filter(|&&s| s > 0)
            .map(|&s| self.link(s as i64))
            .collect();
        let mut granted = if wanted.is_empty() {
            Vec::new().into_iter()
        } else {
            self.grant(&wanted).await?.into_iter()
        };
        let leases: Vec<i64> = secs
            .iter()
            .map(|&s| {
                if s > 0 {
                    granted.next().unwrap_or(0)
                } else {
                    0
                }
            })
            .collect();
        let mut decided = self
            .decide_at(&ids, true, |i, seen, now, floor| {
                let run = ids[i];
                // At the fence floor (compared below), or at a tombstone an older release
                // left, if higher.
                let fence = match &seen.rec {
                    Some(rec) if rec.state.is_some() => {
                        return Err(Error::AlreadyExists { run: run.clone() })
                    }
                    Some(tombstone) => tombstone.fence.max(floor.fence),
                    None => floor.fence,
                };
                // Creation order within the batch: each id one microsecond after the one before.
                let since = now + i as u64;
                let mut rec = Rec::fresh(fence, since);
                rec.created = now;
                let mut extra = Vec::new();
                if secs[i] > 0 {
                    let delay = secs[i] * 1_000_000;
                    let link = self.link(secs[i] as i64) as u64 * 1_000_000;
                    rec.rest = (delay - link) / 1000;
                    rec.since = since + link;
                    rec.not_before = since + delay;
                    extra.extend(self.put_delay(run.as_str(), leases[i]));
                }
                if !unique[i].kind().is_default() {
                    rec.kind = Some(unique[i].kind().as_str().to_owned());
                }
                rec.priority = unique[i].priority();
                // In the record itself, written by this create's transaction.
                rec.trace_parent = unique[i].trace_parent().cloned();
                let payload = unique[i].payload();
                if let Some(bytes) = payload {
                    rec.payload = true;
                    extra.push(TxnOp::put(self.keys.payload(run.as_str()), bytes, None));
                }
                let mut plan = self.plan(run.as_str(), seen, &rec, extra, ());
                plan.compares.push(self.floor_unchanged(floor));
                plan.bytes += payload.map_or(0, <[u8]>::len);
                Ok(plan)
            })
            .await?
            .into_iter();
        Ok(runs
            .iter()
            .zip(dup)
            .map(|(new, dup)| {
                if dup {
                    Err(Error::AlreadyExists {
                        run: new.run().clone(),
                    })
                } else {
                    decided.next().expect("one result per unique run")
                }
            })
            .collect())
    }

    pub(super) async fn resume_run(&self, run: &RunId) -> Result<RunRecord> {
        self.decide_one(run, |seen, now| {
            let (mut new, _) = judged::step(run, seen, Op::Resume, now)?;
            new.since = now;
            new.not_before = 0;
            new.rest = 0;
            let after = Seen::of(new.clone(), seen.rev, None);
            let out = self.record(run, &after, now)?;
            Ok(self.plan(run.as_str(), seen, &new, Vec::new(), out))
        })
        .await
    }

    pub(super) async fn force_release_run(&self, run: &RunId) -> Result<RunRecord> {
        self.decide_one(run, |seen, now| {
            let (new, _) = judged::step(run, seen, Op::ForceRelease, now)?;
            self.unowned_plan(run, seen, new, now)
        })
        .await
    }

    /// The write of `new` as an unowned record (no lease, no delay, no link left; its index
    /// position now) with the block deleted, answering the record as written: what
    /// force-release and cancel both leave.
    fn unowned_plan(
        &self,
        run: &RunId,
        seen: &Seen,
        mut new: Rec,
        now: u64,
    ) -> Result<Plan<RunRecord>> {
        new.owner = None;
        new.expires_at = 0;
        new.not_before = 0;
        new.rest = 0;
        new.since = now; // for an ended run, when it ended: retention's age
        let after = Seen::of(new.clone(), seen.rev, None);
        let out = self.record(run, &after, now)?;
        Ok(self.plan(
            run.as_str(),
            seen,
            &new,
            self.delete_block(run.as_str()).to_vec(),
            out,
        ))
    }

    /// Cancels in one conditional write: the record rewritten (its state entries moved, its
    /// block and delay marker deleted), so a holder's next write, which compares the record,
    /// is refused and explained as cancelled. A cancelled run is returned as it is, after a
    /// write that checks it is still so.
    pub(super) async fn cancel_run(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        lease_core::backend::check_reason(reason)?;
        self.decide_one(run, |seen, now| {
            match judged::step(run, seen, Op::Cancel { reason }, now)? {
                (_, Applied::AlreadyCancelled) => {
                    let out = self.record(run, seen, now)?;
                    Ok(Plan {
                        compares: vec![self.unchanged(run.as_str(), seen)],
                        ops: Vec::new(),
                        bytes: 0,
                        out,
                        wake: None,
                    })
                }
                (new, _) => self.unowned_plan(run, seen, new, now),
            }
        })
        .await
    }

    /// Purges in rounds: the due runs are read, then deleted (record, index and state
    /// entries, journal, idempotency keys, payload, block) in one transaction per chunk that
    /// also raises the fence floor to their fences and holds only if the floor is as read: a
    /// create of any id compares the floor too, so none starts below a fence purged before it
    /// committed. A chunk whose floor moved (another purge) is decided again.
    pub(super) async fn purge_runs(
        &self,
        states: EndedStates,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<RunId>> {
        check_purge(older_than, max)?;
        let mut due: Vec<(u64, RunId)> = Vec::new();
        for (family, (from, to)) in self.purgeable_families_of(states, older_than) {
            let page = self.range(from, to, max as i64, false, 0).await?;
            for kv in page.kvs() {
                if let Some((since, run)) = Keys::parse_index(&family, kv.key()) {
                    due.push((since, RunId::new(run)?));
                }
            }
        }
        due.sort();
        due.truncate(max);
        let mut purged = Vec::new();
        for chunk in due.chunks(PURGE_CHUNK) {
            purged.extend(self.purge_chunk(chunk).await?);
        }
        Ok(purged)
    }

    /// Removes those of `runs` that ended, whatever their age (see
    /// [`LeaseStore::purge_ids`](lease_core::LeaseStore::purge_ids)): each as a purge removes
    /// it, decided on the record as read (a run changed since is left alone).
    pub(super) async fn purge_ids_now(&self, runs: &[RunId]) -> Result<Vec<RunId>> {
        lease_core::backend::check_create_batch(runs)?;
        let mut unique: Vec<&RunId> = runs.iter().collect();
        unique.sort();
        unique.dedup();
        let mut due = Vec::new();
        for page in unique.chunks(PURGE_CHUNK * 8) {
            let seen = self.read(page).await?;
            for (run, item) in page.iter().zip(&seen) {
                let Ok(rec) = item.live(run) else { continue };
                if matches!(
                    rec.state,
                    Some(RunState::Completed | RunState::Failed | RunState::Cancelled)
                ) {
                    due.push((rec.since, (*run).clone()));
                }
            }
        }
        let mut purged = Vec::new();
        for chunk in due.chunks(PURGE_CHUNK) {
            purged.extend(self.purge_chunk(chunk).await?);
        }
        Ok(purged)
    }

    async fn purge_chunk(&self, due: &[(u64, RunId)]) -> Result<Vec<RunId>> {
        for round in 0..super::ROUNDS {
            if round > 0 {
                tokio::time::sleep(Duration::from_millis(round as u64)).await;
            }
            let floor = self.floor().await?;
            let ids: Vec<&RunId> = due.iter().map(|(_, r)| r).collect();
            let seen = self.read(&ids).await?;
            let mut nested = Vec::new();
            let mut runs = Vec::new();
            let mut top = floor.fence;
            for ((since, run), item) in due.iter().zip(&seen) {
                let Ok(rec) = item.live(run) else { continue };
                let ended = matches!(
                    rec.state,
                    Some(RunState::Completed | RunState::Failed | RunState::Cancelled)
                );
                if !ended || rec.since != *since {
                    continue; // changed since the index was read: not removed
                }
                let r = run.as_str();
                let journal = self.keys.journal_prefix(r);
                let keys = self.keys.keys_prefix(r);
                let mut ops = self.erase(r, rec);
                ops.push(TxnOp::delete(
                    journal.clone(),
                    Some(DeleteOptions::new().with_range(prefix_end(&journal))),
                ));
                ops.push(TxnOp::delete(
                    keys.clone(),
                    Some(DeleteOptions::new().with_range(prefix_end(&keys))),
                ));
                if rec.payload {
                    ops.push(TxnOp::delete(self.keys.payload(r), None));
                }
                ops.extend(self.delete_block(r));
                nested.push(TxnOp::txn(
                    Txn::new().when([self.unchanged(r, item)]).and_then(ops),
                ));
                runs.push(run.clone());
                top = top.max(rec.fence);
            }
            if runs.is_empty() {
                return Ok(Vec::new());
            }
            // Raised whichever runs' compares hold: a floor above a fence that stays is
            // harmless (runs created later start higher), one below a purged fence is not.
            nested.push(TxnOp::put(self.keys.floor(), top.to_string(), None));
            let response = self
                .txn(
                    Txn::new()
                        .when([self.floor_unchanged(floor)])
                        .and_then(nested),
                )
                .await?;
            if !response.succeeded() {
                continue; // the floor moved: another purge; read again
            }
            let answers = response.op_responses();
            return Ok(runs
                .into_iter()
                .zip(answers)
                .filter_map(|(run, answer)| match answer {
                    TxnOpResponse::Txn(inner) if inner.succeeded() => Some(run),
                    _ => None,
                })
                .collect());
        }
        Err(Error::unavailable(
            BACKEND,
            "the fence floor kept changing under this purge (other purges); retry",
        ))
    }

    /// The ops that delete `rec`'s record and its index and state entries.
    fn erase(&self, run: &str, rec: &Rec) -> Vec<TxnOp> {
        let mut ops = vec![TxnOp::delete(self.keys.record(run), None)];
        if let Some(state) = rec.state {
            ops.push(TxnOp::delete(
                self.keys
                    .index(state, rec.kind.as_deref(), rec.priority, rec.since, run),
                None,
            ));
            ops.push(TxnOp::delete(self.keys.state_entry(state, run), None));
        }
        ops
    }
}

/// How long `new` waits before it is claimable, in whole milliseconds: its delay, or the time
/// left to its `run_at` **on this host's clock** when it is later. etcd has no clock a client
/// can compare a wall time with (it times delays with its leases), so a start time becomes a
/// delay here: the run is never claimable before `run_at` as this host saw it, and late by at
/// most the delay's bucket (`grants::delay_bucket`) plus a lease link per leader change. A
/// start time only decides when the run becomes claimable; no fence depends on it.
fn start_delay_ms(new: &NewRun) -> u64 {
    let until = new
        .run_at()
        .and_then(|at| at.duration_since(std::time::SystemTime::now()).ok())
        .map_or(0, |left| {
            u64::try_from(left.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
        });
    new.delay_millis().max(until)
}
