//! Claims: `claim`, `claim_next` over the runnable index, renewals, and the etcd leases
//! that time them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{Compare, CompareOp};
use lease_core::backend::{check_claim_max, check_renew_batch, claim_refusal};
use lease_core::{
    Error, Fence, Lease, LeaseStore, Result, RunId, RunState, StoreTime, Ttl, WorkerId,
};

use super::{
    lease_seconds, now_micros, shuffle, state_of, ClaimPage, EtcdLeaseStore, Plan, Seen, SWEEP,
    SWEEP_EVERY,
};
use crate::codec::prefix_end;
use crate::error::BACKEND;

impl EtcdLeaseStore {
    /// it is due to expire then. A renewal attaches the block to a new lease.
    pub(super) async fn grant(&self, secs: &[i64]) -> Result<Vec<i64>> {
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

    /// Why `run` cannot be claimed, or `None` if it can (etcd's block key is gone).
    pub(super) fn claim_verdict(run: &RunId, seen: &Seen, now: u64) -> Result<Option<Error>> {
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
    pub(super) fn claim_plan(
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

    pub(super) async fn renew_each(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
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
    pub(super) async fn claim_page(
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
    pub(super) fn sweep_due(&self) -> bool {
        let now = now_micros();
        let last = self.swept.load(Ordering::Relaxed);
        now.saturating_sub(last) >= SWEEP_EVERY.as_micros() as u64
            && self
                .swept
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    pub(super) async fn claim_one(
        &self,
        run: &RunId,
        worker: &WorkerId,
        ttl: Ttl,
    ) -> Result<Lease> {
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

    pub(super) async fn claim_next_runs(
        &self,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
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
}
