//! Claims: `claim`, `claim_next` over the runnable index, renewals, and the etcd leases
//! that time them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::rpc::{Compare, CompareOp, Txn};
use lease_core::backend::{check_claim_max, check_renew_batch};
use lease_core::machine::{Applied, Op};
use lease_core::{Error, Fence, Kind, Lease, LeaseStore, Result, RunId, StoreTime, Ttl, WorkerId};
use lease_runtime::observe::count_stale;

use super::decide::counted;
use super::{
    judged, lease_seconds, now_micros, shuffle, ClaimPage, EtcdLeaseStore, Plan, Seen, ROUNDS,
    SWEEP, SWEEP_EVERY,
};
use crate::codec::{prefix_end, Keys};
use crate::error::BACKEND;

/// Index entries one `claim_next` looks at before it answers with what it has: bounded work
/// per call, whatever stands in the index.
pub const SCAN_BUDGET: usize = 1024;

/// The largest page of the index `claim_next` reads at once.
const MAX_PAGE: usize = 512;

impl EtcdLeaseStore {
    /// Whether `worker` may claim `run` as read, by the contract's claim rules on the record
    /// as etcd judges it (its block key gone: expired or claimable); the refusal if not.
    pub(super) fn claim_verdict(
        run: &RunId,
        seen: &Seen,
        worker: &WorkerId,
        ttl: Ttl,
        now: u64,
    ) -> Result<()> {
        judged::step(run, seen, Op::Claim { worker, ttl }, now).map(|_| ())
    }

    /// The claim of a claimable run under etcd lease `lease`, which times its first `link`
    /// seconds (the whole TTL unless it is longer than the store's `max_lease`).
    /// The lease carries `payload`, read after `seen` (see [`EtcdLeaseStore::payloads`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn claim_plan(
        &self,
        run: &RunId,
        worker: &WorkerId,
        ttl: Ttl,
        (lease, link): (i64, i64),
        seen: &Seen,
        payload: Option<std::sync::Arc<[u8]>>,
        now: u64,
    ) -> Result<Plan<Lease>> {
        let rec = seen.live(run)?;
        // The claim as the machine makes it: an expired lease taken over (its block gone)
        // archived at its expiry, by `now` at the latest (`now` is read before the plan, so a
        // claim planned a while before its transaction can find the block gone earlier than
        // the expiry recorded for a renewal planned just before it: never later than this
        // claim); the fence raised, the attempt counted.
        let (mut new, applied) = judged::step(run, seen, Op::Claim { worker, ttl }, now)?;
        let Applied::Claimed { waited } = applied else {
            unreachable!("a claim answers Claimed")
        };
        // etcd's timing: the TTL in links of at most `max_lease`, the first now.
        new.ttl_ms = ttl.as_millis();
        new.not_before = 0;
        new.rest = ttl.as_millis().saturating_sub(link as u64 * 1000);
        new.since = now + link as u64 * 1_000_000;
        let out = Lease::new(
            run.clone(),
            worker.clone(),
            Fence::new(new.fence)?,
            ttl,
            StoreTime::from_micros(new.expires_at),
        )?
        .with_attempt(new.attempts)
        .with_payload(payload)
        // Read with the record this claim compares unchanged: the trace parent of the life it
        // claims.
        .with_trace_parent(rec.trace_parent.clone())
        .with_kind(match &rec.kind {
            Some(kind) => Kind::new(kind)?,
            None => Kind::default(),
        })
        .with_priority(rec.priority)
        // Claimable since the expiry of the lease before, or since its index position (its
        // creation, release or the end of its delay), on this client's clock as every etcd
        // time is.
        .with_waited(Some(waited));
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
        if rec.payload {
            // The payload handed out is the one still stored (the record compare already
            // says so; this says it of the key too).
            plan.compares.push(Compare::version(
                self.keys.payload(run.as_str()),
                CompareOp::Greater,
                0,
            ));
        }
        Ok(plan)
    }

    pub(super) async fn renew_each(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        let mut secs = Vec::with_capacity(leases.len());
        let mut ttls = Vec::with_capacity(leases.len());
        for lease in leases {
            let (s, ttl) = lease_seconds(lease.ttl())?;
            secs.push(self.link(s));
            ttls.push(ttl);
        }
        let ids = self.grant(&secs).await?;
        let runs: Vec<&RunId> = leases.iter().map(Lease::run).collect();
        self.decide(&runs, |i, seen, now| {
            let lease = &leases[i];
            let run = lease.run();
            let op = Op::Renew {
                lease,
                ttl: ttls[i],
            };
            let (mut new, _) = count_stale(judged::step(run, seen, op, now))?;
            new.rest = ttls[i].as_millis().saturating_sub(secs[i] as u64 * 1000);
            new.since = now + secs[i] as u64 * 1_000_000;
            let out = Lease::new(
                run.clone(),
                lease.owner().clone(),
                lease.fence(),
                ttls[i],
                StoreTime::from_micros(new.expires_at),
            )?
            .with_attempt(lease.attempt())
            .carrying(lease)
            .with_trace_parent(lease.trace_parent().cloned());
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
    /// index in `[from, to)`, under one etcd lease (granted only when one is claimable).
    /// Entries of `[from, to)` that are due (at or before now) but whose run etcd still holds
    /// or delays are moved to when etcd will release them (see [`EtcdLeaseStore::reposition`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn claim_page(
        &self,
        family: &[u8],
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
            if let Some((since, run)) = Keys::parse_index(family, kv.key()) {
                listed.push((since, RunId::new(run)?));
            }
        }
        let ids: Vec<&RunId> = listed.iter().map(|(_, r)| r).collect();
        let seen = self.read(&ids).await?;
        let mut claimable = Vec::new();
        let mut blocked = Vec::new();
        let mut lapsed = Vec::new();
        for (i, ((since, run), item)) in listed.iter().zip(&seen).enumerate() {
            if !item.live(run).is_ok_and(|rec| rec.since == *since) {
                continue; // moved since the range was read
            }
            match Self::claim_verdict(run, item, worker, ttl, now) {
                Ok(()) => claimable.push(i),
                _ if item.block.is_some() && *since <= now => blocked.push(i),
                _ if item.lapsed() && *since <= now => lapsed.push(i),
                _ => {}
            }
        }
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
        let mut out = ClaimPage {
            leases: Vec::new(),
            lost: 0,
            more: page.more() || resume.as_deref() != page.kvs().last().map(|kv| kv.key()),
            resume,
            scanned: listed.len(),
        };
        let moved = async {
            if !lapsed.is_empty() {
                let items: Vec<(&RunId, &Seen)> =
                    lapsed.iter().map(|&i| (&listed[i].1, &seen[i])).collect();
                self.rearm(&items, now).await?;
            }
            if blocked.is_empty() {
                return Ok(());
            }
            let items: Vec<(&RunId, &Seen)> =
                blocked.iter().map(|&i| (&listed[i].1, &seen[i])).collect();
            self.reposition(&items, now).await
        };
        let claimed = async {
            if claimable.is_empty() {
                return Ok(Vec::new());
            }
            let items: Vec<(&RunId, &Seen)> = claimable
                .iter()
                .map(|&i| (&listed[i].1, &seen[i]))
                .collect();
            let want_secs = [secs];
            let (granted, payloads) = tokio::join!(self.grant(&want_secs), self.payloads(&items));
            let (lease, payloads) = (granted?[0], payloads?);
            let mut plans = Vec::with_capacity(claimable.len());
            for ((run, item), payload) in items.into_iter().zip(payloads) {
                plans.push(self.claim_plan(run, worker, ttl, (lease, secs), item, payload, now)?);
            }
            self.execute(plans).await
        };
        let (moved, claimed) = tokio::join!(moved, claimed);
        moved?;
        for claimed in claimed? {
            match claimed {
                Some(lease) => out.leases.push(lease),
                None => out.lost += 1,
            }
        }
        Ok(out)
    }

    /// Moves the index entries of runs that are due by their recorded times but still held
    /// or delayed by etcd (a leader change re-armed their leases; the clock of the client
    /// that wrote them is behind) to when etcd's leader says their block expires, so that
    /// they stop standing before claimable runs. Each move is a conditional write on the
    /// record as read (one that lost a race is simply left: the run changed anyway); a block
    /// whose lease etcd already counts as expired is being deleted and is left in place.
    pub(super) async fn reposition(&self, items: &[(&RunId, &Seen)], now: u64) -> Result<()> {
        let mut ids: Vec<i64> = items.iter().map(|(_, s)| s.block_lease).collect();
        ids.sort_unstable();
        ids.dedup();
        let left = self.remaining(&ids).await?;
        let mut plans = Vec::new();
        for (run, item) in items {
            let Some(rec) = item.rec.as_ref() else {
                continue;
            };
            let secs = left.get(&item.block_lease).copied().unwrap_or(-1);
            if secs < 0 {
                continue;
            }
            let mut new = rec.clone();
            new.since = now + (secs as u64 + 1) * 1_000_000;
            if new.owner.is_some() {
                new.expires_at = new.expires_at.max(new.since);
            } else {
                new.not_before = new.not_before.max(new.since);
            }
            plans.push(self.plan(run.as_str(), item, &new, Vec::new(), ()));
        }
        tracing::debug!(
            moved = plans.len(),
            "runs due by their records but held by etcd moved to their real expiry"
        );
        self.execute(plans).await?;
        Ok(())
    }

    /// Re-arms runs whose link lapsed with time left (a TTL or delay longer than the
    /// store's `max_lease`): the next link, of at most `max_lease`, on an etcd lease, as a
    /// conditional write on the record as read and on the block still being absent. Time is
    /// counted only by etcd's leases, link by link: a lapsed link that nobody read for a
    /// while makes the run free later, never earlier.
    pub(super) async fn rearm(&self, items: &[(&RunId, &Seen)], now: u64) -> Result<()> {
        let links: Vec<i64> = items
            .iter()
            .map(|(_, item)| {
                let rest = item.rec.as_ref().map_or(0, |r| r.rest);
                self.link(rest.div_ceil(1000) as i64)
            })
            .collect();
        let ids = self.grant(&links).await?;
        let mut plans = Vec::new();
        for (((run, item), link), id) in items.iter().zip(&links).zip(&ids) {
            let Some(rec) = item.rec.as_ref() else {
                continue;
            };
            let mut new = rec.clone();
            new.rest = rec.rest.saturating_sub(*link as u64 * 1000);
            new.since = now + *link as u64 * 1_000_000;
            let r = run.as_str();
            let block = if rec.owner.is_some() {
                vec![self.put_block(r, true, *id)]
            } else {
                self.put_delay(r, *id).to_vec()
            };
            let mut plan = self.plan(r, item, &new, block, ());
            plan.compares.push(Compare::create_revision(
                self.keys.block(r),
                CompareOp::Equal,
                0,
            ));
            plans.push(plan);
        }
        tracing::debug!(
            rearmed = plans.len(),
            "lapsed links of long holds or delays re-armed"
        );
        self.execute(plans).await?;
        Ok(())
    }

    /// Whether the sweep past now is due: at most every [`SWEEP_EVERY`] per store.
    pub(super) fn sweep_due(&self) -> bool {
        let now = now_micros();
        let last = self.swept.load(Ordering::Relaxed);
        now.saturating_sub(last) >= SWEEP_EVERY.as_micros() as u64
            && self
                .swept
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Claims `run`: reads it first, and takes an etcd lease only once the read says the
    /// run is claimable, so a refused claim costs no grant.
    pub(super) async fn claim_one(
        &self,
        run: &RunId,
        worker: &WorkerId,
        ttl: Ttl,
    ) -> Result<Lease> {
        let (secs, ttl) = lease_seconds(ttl)?;
        for round in 0..ROUNDS {
            if round > 0 {
                tokio::time::sleep(Duration::from_millis(round as u64)).await;
            }
            let now = now_micros();
            let seen = self.read(&[run]).await?.remove(0);
            if let Err(refusal) = Self::claim_verdict(run, &seen, worker, ttl, now) {
                if seen.lapsed() {
                    // A long hold or delay between links: time goes on only once re-armed.
                    self.rearm(&[(run, &seen)], now).await?;
                }
                return Err(refusal);
            }
            let link = self.link(secs);
            let (links, items) = ([link], [(run, &seen)]);
            let (granted, payload) = tokio::join!(self.grant(&links), self.payloads(&items));
            let (lease, payload) = (granted?[0], payload?.pop().flatten());
            let plan = self.claim_plan(run, worker, ttl, (lease, link), &seen, payload, now)?;
            if let Some(Some(claimed)) = self.execute(vec![plan]).await?.pop() {
                return Ok(claimed);
            }
        }
        Err(Error::unavailable(
            BACKEND,
            "the run kept changing under this claim; retry",
        ))
    }

    /// `claim_next`: the kind's runnable families from the highest priority down (one
    /// transaction first tells which of its priorities above 0 have entries at all: a count
    /// of each family, no key read), each as [`claim_in_family`](Self::claim_in_family)
    /// claims, until `max` runs are claimed. Other kinds' runs are neither claimed nor read.
    pub(super) async fn claim_next_runs(
        &self,
        kind: &Kind,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
        check_claim_max(max)?;
        let (secs, ttl) = lease_seconds(ttl)?;
        let secs = self.link(secs);
        let name = (!kind.is_default()).then(|| kind.as_str());
        let families: Vec<(u8, Vec<u8>)> = (1..=lease_core::MAX_PRIORITY)
            .rev()
            .map(|p| (p, self.keys.runnable_family(name, p)))
            .collect();
        let ops: Vec<crate::rpc::TxnOp> = families
            .iter()
            .map(|(_, family)| Self::count_op(family.clone(), prefix_end(family)))
            .collect();
        let response = self.txn(Txn::new().and_then(ops)).await?;
        let mut got: Vec<Lease> = Vec::new();
        let used = families
            .into_iter()
            .enumerate()
            .filter(|(i, _)| counted(&response, *i) > 0)
            .map(|(_, level)| level)
            .chain([(0, self.keys.runnable_family(name, 0))]);
        for (priority, family) in used {
            if got.len() >= max {
                break;
            }
            let mut leases = self
                .claim_in_family(family, worker, ttl, secs, max - got.len())
                .await?;
            for lease in &mut leases {
                *lease = lease.clone().with_priority(priority);
            }
            got.extend(leases);
        }
        Ok(got)
    }

    /// Claims up to `max` runs of one runnable family: its index from its start, in pages
    /// that grow, until `max` runs are claimed, the index up to now is exhausted, or
    /// [`SCAN_BUDGET`] entries were looked at. Entries held past their recorded times are
    /// moved out of the way as they are met, so the next call does not meet them again.
    /// Returned in the order their leases expire.
    async fn claim_in_family(
        &self,
        family: Vec<u8>,
        worker: &WorkerId,
        ttl: Ttl,
        secs: i64,
        max: usize,
    ) -> Result<Vec<Lease>> {
        let mut got: Vec<Lease> = Vec::new();
        let mut from = family.clone();
        // The index in order, up to now: fresh and released runs, and held runs whose
        // recorded expiry has passed (etcd's block decides whether they are claimable).
        // After a lost race (concurrent callers read the same oldest entries) the next page
        // goes on past what was tried, wider, and picks among its claimable runs at random,
        // so that callers spread out instead of colliding on the same runs again.
        let mut spread = false;
        let mut scanned = 0;
        let mut limit = max * 2 + 8;
        while scanned < SCAN_BUDGET {
            let want = max - got.len();
            let to = Keys::family_bound(&family, now_micros());
            limit = limit.min(SCAN_BUDGET - scanned);
            let page = self
                .claim_page(
                    &family,
                    worker,
                    ttl,
                    secs,
                    from.clone(),
                    to,
                    limit,
                    want,
                    spread,
                )
                .await?;
            scanned += page.scanned.max(1);
            got.extend(page.leases);
            if let Some(mut next) = page.resume {
                next.push(0);
                from = next;
            }
            if got.len() >= max || (!page.more && page.lost == 0) {
                break;
            }
            spread |= page.lost > 0;
            limit = (limit * 4).min(MAX_PAGE);
        }
        // Past now, a bounded window from a rotating cursor: runs whose recorded times a
        // client with a clock ahead wrote in the future. Their blocks are etcd's judgement
        // too, and every entry comes under the window within a bounded number of sweeps, so
        // no run waits on a clock.
        if got.len() < max && self.sweep_due() {
            let bound = Keys::family_bound(&family, now_micros());
            let start = {
                let cursor = self.cursor.lock().unwrap_or_else(|p| p.into_inner());
                cursor
                    .get(&family)
                    .filter(|c| **c > bound)
                    .cloned()
                    .unwrap_or(bound)
            };
            let want = max - got.len();
            let page = self
                .claim_page(
                    &family,
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
            let mut cursors = self.cursor.lock().unwrap_or_else(|p| p.into_inner());
            match next {
                Some(next) => cursors.insert(family.clone(), next),
                None => cursors.remove(&family),
            };
        }
        got.sort_by_key(|l| l.expires_at());
        Ok(got)
    }

    pub(super) async fn renew_batch(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
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
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use lease_conformance::fixtures::etcd::{EtcdCluster, HINT, MEMBERS};
    use lease_core::{LeaseStore, RunId, Ttl, WorkerId};

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

    /// 300 runs held for a minute whose records say their leases expired a second ago (what
    /// a leader change that re-armed their etcd leases, or a holder whose clock is behind,
    /// leaves in the index) stand before a fresh run: `claim_next(10)` still hands out the
    /// fresh run at once, moves the held entries to when etcd will free them (the next call
    /// meets none of them), and no claim refused as held takes an etcd lease. Before, the
    /// call read 8 pages (224 entries for `max = 10`) from the index start and answered `[]`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn held_runs_recorded_as_expired_do_not_hide_a_claimable_one() {
        let Some(cluster) = lease_conformance::fixtures::required(
            "etcd cluster",
            EtcdCluster::start().map_err(|e| e.to_string()),
            HINT,
        ) else {
            return;
        };
        let endpoints: Vec<String> = (0..MEMBERS).map(|i| cluster.endpoint(i)).collect();
        let store = EtcdLeaseStore::connect(EtcdConfig::new(endpoints, "hol").unwrap())
            .await
            .unwrap();
        let (dead, live) = (
            WorkerId::new("dead").unwrap(),
            WorkerId::new("live").unwrap(),
        );
        let minute = Ttl::from_secs(60).unwrap();
        let held: Vec<RunId> = (0..300)
            .map(|i| RunId::new(format!("held-{i:03}")).unwrap())
            .collect();
        for r in store.create_many(&held).await.unwrap() {
            r.unwrap();
        }
        assert_eq!(
            store.claim_next(&dead, minute, 300).await.unwrap().len(),
            300
        );
        // Rewrite every record as if its lease had expired a second ago.
        let ids: Vec<&RunId> = held.iter().collect();
        let seen = store.read(&ids).await.unwrap();
        let past = now_micros() - 1_000_000;
        let plans = held
            .iter()
            .zip(&seen)
            .map(|(run, item)| {
                let mut rec = item.rec.clone().unwrap();
                rec.since = past;
                rec.expires_at = past;
                store.plan(run.as_str(), item, &rec, Vec::new(), ())
            })
            .collect();
        assert!(store
            .execute(plans)
            .await
            .unwrap()
            .iter()
            .all(Option::is_some));
        let family = store.keys.index_family(RunState::Runnable);
        let due = || async {
            let bound = Keys::family_bound(&family, now_micros());
            store
                .range(family.clone(), bound, 0, false, 0)
                .await
                .unwrap()
                .kvs()
                .len()
        };
        assert_eq!(
            due().await,
            300,
            "every held run stands in the index as due"
        );

        let fresh = RunId::new("fresh").unwrap();
        store.create(&fresh).await.unwrap();
        let got = store
            .claim_next(&live, Ttl::from_secs(30).unwrap(), 10)
            .await
            .unwrap();
        let runs: Vec<&RunId> = got.iter().map(Lease::run).collect();
        assert_eq!(
            runs,
            vec![&fresh],
            "the fresh run, at once, and no held one"
        );
        assert_eq!(
            due().await,
            0,
            "the held entries moved to their real expiry"
        );
        for run in &held[..3] {
            let record = store.inspect(run).await.unwrap();
            let left = record
                .expires_at
                .unwrap()
                .as_micros()
                .saturating_sub(now_micros());
            assert!(
                (50_000_000..=62_000_000).contains(&left),
                "{run} now shows the expiry etcd keeps ({left} us ahead)"
            );
        }

        // A refused claim takes no etcd lease.
        let granted = store.leases_granted();
        for run in held.iter().take(20) {
            let refused = store.claim(run, &live, minute).await;
            assert!(matches!(refused, Err(Error::Held { .. })), "{refused:?}");
        }
        assert_eq!(
            store.leases_granted(),
            granted,
            "20 claims refused as held granted nothing"
        );
    }
}
