//! [`LeaseStore`] for [`MemoryLeaseStore`]: each call under the store's lock.

use super::*;

#[async_trait::async_trait]
impl LeaseStore for MemoryLeaseStore {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        self.create_one(&NewRun::new(run.clone()))
    }

    async fn create_with(&self, new: &NewRun) -> Result<RunRecord> {
        new.check()?;
        self.create_one(new)
    }

    async fn create_many_with(&self, runs: &[NewRun]) -> Result<Vec<Result<()>>> {
        check_new_runs(runs)?;
        Ok(runs
            .iter()
            .map(|new| self.create_one(new).map(|_| ()))
            .collect())
    }

    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        let now = self.now();
        let mut state = self.lock();
        let slot = found(&mut state, run)?;
        self.try_claim(run, slot, worker, ttl, now)
    }

    async fn claim_next(&self, worker: &WorkerId, ttl: Ttl, max: usize) -> Result<Vec<Lease>> {
        self.claim_next_kind(&Kind::default(), worker, ttl, max)
            .await
    }

    async fn claim_next_kind(
        &self,
        kind: &Kind,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
        self.claim_next_in(&Queue::default(), kind, worker, ttl, max)
            .await
    }

    async fn claim_next_in(
        &self,
        queue: &Queue,
        kind: &Kind,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
        check_claim_max(max)?;
        let now = self.now();
        let mut state = self.lock();
        if state.queues.get(queue).is_some_and(|(paused, _)| *paused) {
            return Ok(Vec::new());
        }
        // The machine's claim order: the highest priority first, then the longest claimable,
        // then creation.
        let mut due = BTreeMap::new();
        for (run, slot) in &state.runs {
            if slot.run.kind == *kind && slot.run.queue == *queue && slot.run.is_claimable(now) {
                due.insert((slot.run.claim_order(), slot.order), run.clone());
                if due.len() > max {
                    due.pop_last();
                }
            }
        }
        let mut leases = Vec::with_capacity(due.len());
        for run in due.into_values() {
            let slot = state.runs.get_mut(&run).expect("collected above");
            leases.push(self.try_claim(&run, slot, worker, ttl, now)?);
        }
        Ok(leases)
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease> {
        self.renew_one(lease)
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        check_renew_batch(leases.len())?;
        Ok(leases.iter().map(|lease| self.renew_one(lease)).collect())
    }

    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        check_payload(payload)?;
        self.fenced(lease, |slot, now| {
            push_entry(slot, lease.fence(), payload.to_vec(), None, now)
        })
    }

    async fn append_keyed(
        &self,
        lease: &Lease,
        key: &IdempotencyKey,
        payload: &[u8],
    ) -> Result<JournalEntry> {
        check_payload(payload)?;
        let now = self.now();
        let mut state = self.lock();
        let slot = found(&mut state, lease.run())?;
        // The fence first: a key never lets a stale or forged fence through.
        if lease.fence() != slot.run.fence {
            verdict(lease, slot)?;
        }
        if let Some(&at) = slot.keys.get(key) {
            return Ok(slot.journal[at].clone());
        }
        verdict(lease, slot)?;
        Ok(push_entry(
            slot,
            lease.fence(),
            payload.to_vec(),
            Some(key),
            now,
        ))
    }

    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        let state = self.lock();
        let slot = state
            .runs
            .get(run)
            .ok_or_else(|| Error::NotFound { run: run.clone() })?;
        Ok(slot.journal.clone())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.end(lease, End::Release)
    }

    async fn suspend(&self, lease: &Lease) -> Result<()> {
        self.end(lease, End::Suspend)
    }

    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        check_end_batch(ends)?;
        // One lock for the batch: the memory store's "one commit".
        let now = self.now();
        let mut state = self.lock();
        Ok(ends
            .iter()
            .map(|Ending { lease, end, .. }| {
                let slot = found(&mut state, lease.run())?;
                count_stale(self.end_in(slot, lease, end, now))
            })
            .collect())
    }

    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>> {
        check_create_batch(runs)?;
        let mut results = Vec::with_capacity(runs.len());
        for run in runs {
            results.push(self.create(run).await.map(|_| ()));
        }
        Ok(results)
    }

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        let now = self.now();
        let mut state = self.lock();
        let slot = found(&mut state, run)?;
        self.step(run, slot, Op::Resume, now)?;
        let record = slot.run.record(run, now);
        // Live again: it takes its unique key back, unless another live run took it meanwhile.
        if let Some(key) = slot.unique_key.clone() {
            match state.holder(&key) {
                Some(holder) if &holder != run => {
                    found(&mut state, run)?.unique_key = None;
                }
                _ => {
                    state.unique.insert(key, run.clone());
                }
            }
        }
        Ok(record)
    }

    async fn deliver_signal(
        &self,
        run: &RunId,
        name: &lease_core::SignalName,
        fence: Fence,
        payload: &[u8],
    ) -> Result<lease_core::Signalled> {
        lease_core::signal::check_signal_payload(payload)?;
        let now = self.now();
        let mut state = self.lock();
        let slot = found(&mut state, run)?;
        let op = Op::Signal {
            name,
            fence,
            payload,
        };
        match self.step(run, slot, op, now)? {
            machine::Applied::Signalled { duplicate } => {
                Ok(lease_core::Signalled::new(run.clone(), duplicate))
            }
            applied => unreachable!("a signal answers Signalled, not {applied:?}"),
        }
    }

    fn signal_key(&self) -> Option<&lease_core::SignalKey> {
        self.key()
    }

    async fn complete(&self, lease: &Lease) -> Result<()> {
        self.end(lease, End::Complete)
    }

    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        let now = self.now();
        let state = self.lock();
        let slot = state
            .runs
            .get(run)
            .ok_or_else(|| Error::NotFound { run: run.clone() })?;
        Ok(record_with_payload(run, slot, now))
    }

    async fn inspect_many(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        lease_core::backend::check_create_batch(runs)?; // the batch rule: at most MAX_BATCH ids
        let now = self.now();
        let state = self.lock();
        Ok(runs
            .iter()
            .map(|run| match state.runs.get(run) {
                Some(slot) => Ok(record_with_payload(run, slot, now)),
                None => Err(Error::NotFound { run: run.clone() }),
            })
            .collect())
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        check_list(filter)?;
        let now = self.now();
        let state = self.lock();
        let mut records: Vec<RunRecord> = state
            .runs
            .iter()
            .filter(|(run, _)| filter.after.as_ref().is_none_or(|after| *run > after))
            .filter(|(_, slot)| filter.keeps(&slot.run.kind, &slot.run.queue))
            .map(|(run, slot)| slot.run.record(run, now))
            .filter(|r| filter.state.is_none_or(|s| r.state == s))
            .filter(|r| !filter.expired || r.is_expired())
            .collect();
        records.sort_by(|a, b| a.run.cmp(&b.run));
        records.truncate(filter.limit);
        Ok(records)
    }

    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        let now = self.now();
        let mut state = self.lock();
        let slot = found(&mut state, run)?;
        self.step(run, slot, Op::ForceRelease, now)?;
        Ok(slot.run.record(run, now))
    }

    async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        lease_core::backend::check_reason(reason)?;
        let now = self.now();
        let mut state = self.lock();
        let slot = found(&mut state, run)?;
        self.step(run, slot, Op::Cancel { reason }, now)?;
        Ok(slot.run.record(run, now))
    }

    async fn purge(&self, older_than: std::time::Duration, max: usize) -> Result<Vec<RunId>> {
        self.purge_ended(lease_core::EndedStates::ALL, older_than, max)
            .await
    }

    async fn purge_ended(
        &self,
        states: lease_core::EndedStates,
        older_than: std::time::Duration,
        max: usize,
    ) -> Result<Vec<RunId>> {
        check_purge(older_than, max)?;
        let now = self.now();
        let mut state = self.lock();
        let mut due: BTreeMap<(StoreTime, u64), RunId> = BTreeMap::new();
        for (run, slot) in &state.runs {
            if slot.run.purgeable(states, older_than, now) {
                // The oldest ended first: `claimable_at` is when it ended.
                due.insert((slot.run.claimable_at, slot.order), run.clone());
                if due.len() > max {
                    due.pop_last();
                }
            }
        }
        let purged: Vec<RunId> = due.into_values().collect();
        for run in &purged {
            state.remove(run).expect("collected above");
        }
        Ok(purged)
    }

    async fn purge_ids(&self, runs: &[RunId]) -> Result<Vec<RunId>> {
        lease_core::backend::check_create_batch(runs)?;
        let mut state = self.lock();
        let mut purged = Vec::new();
        for run in runs {
            let ended = state.runs.get(run).is_some_and(|slot| slot.run.is_ended());
            if ended {
                state.remove(run).expect("looked up above");
                purged.push(run.clone());
            }
        }
        Ok(purged)
    }

    async fn count(&self) -> Result<lease_core::RunCounts> {
        let now = self.now();
        let state = self.lock();
        let mut counts = lease_core::RunCounts::default();
        let mut oldest: Option<StoreTime> = None;
        let mut longest: Option<StoreTime> = None;
        for slot in state.runs.values().map(|slot| &slot.run) {
            if slot.state == RunState::Runnable && slot.expires_at.is_some_and(|at| at > now) {
                if let Some(claimed) = slot.claimed_at {
                    longest = Some(longest.map_or(claimed, |l| l.min(claimed)));
                }
            }
            if slot.state == RunState::Runnable {
                // Claimable since the expiry of its lease, or since claimable_at.
                let since = slot.expires_at.unwrap_or(slot.claimable_at);
                if since <= now && oldest.is_none_or(|o| since < o) {
                    oldest = Some(since);
                }
            }
            let figure = match slot.state {
                RunState::Suspended => &mut counts.suspended,
                RunState::Completed => &mut counts.completed,
                RunState::Failed => &mut counts.failed,
                RunState::Cancelled => &mut counts.cancelled,
                RunState::Runnable => match slot.expires_at {
                    Some(at) if at > now => &mut counts.held,
                    Some(_) => &mut counts.claimable,
                    None if slot.claimable_at > now => &mut counts.delayed,
                    None => &mut counts.claimable,
                },
                // A state of a later contract than this store knows: in none of the figures.
                _ => continue,
            };
            *figure = (*figure + 1).min(lease_core::MAX_COUNT);
        }
        counts.oldest_claimable_age = oldest.map(|since| now.saturating_since(since));
        counts.longest_held = longest.map(|claimed| now.saturating_since(claimed));
        Ok(counts)
    }

    async fn count_kinds(&self) -> Result<Vec<lease_core::KindCounts>> {
        let now = self.now();
        let state = self.lock();
        // kind -> (runnable, claimable, the earliest instant one became claimable)
        let mut by_kind: BTreeMap<Kind, (u64, u64, Option<StoreTime>)> = BTreeMap::new();
        for slot in state
            .runs
            .values()
            .map(|slot| &slot.run)
            .filter(|s| s.state == RunState::Runnable)
        {
            let figures = by_kind.entry(slot.kind.clone()).or_default();
            figures.0 = (figures.0 + 1).min(lease_core::MAX_COUNT);
            let since = slot.expires_at.unwrap_or(slot.claimable_at);
            if since <= now {
                figures.1 = (figures.1 + 1).min(lease_core::MAX_COUNT);
                figures.2 = Some(figures.2.map_or(since, |o| o.min(since)));
            }
        }
        Ok(by_kind
            .into_iter()
            .take(lease_core::MAX_KINDS_COUNTED)
            .map(|(kind, (runnable, claimable, since))| {
                lease_core::KindCounts::new(
                    kind,
                    runnable,
                    claimable,
                    since.map(|s| now.saturating_since(s)),
                )
            })
            .collect())
    }

    async fn pause_queue(&self, queue: &Queue) -> Result<QueueState> {
        Ok(self.set_paused(queue, true))
    }

    async fn resume_queue(&self, queue: &Queue) -> Result<QueueState> {
        let state = self.set_paused(queue, false);
        // Idle workers of any kind may have runs of the queue waiting.
        self.wakes.wake_all();
        Ok(state)
    }

    async fn queues(&self) -> Result<Vec<QueueState>> {
        let state = self.lock();
        let mut queues: BTreeMap<Queue, QueueState> = state
            .queues
            .iter()
            .map(|(queue, (paused, at))| {
                let listed = QueueState::new(queue.clone(), *paused, Some(*at));
                (queue.clone(), listed)
            })
            .collect();
        for slot in state.runs.values() {
            if slot.run.state == RunState::Runnable && !queues.contains_key(&slot.run.queue) {
                let queue = slot.run.queue.clone();
                queues.insert(queue.clone(), QueueState::new(queue, false, None));
            }
        }
        Ok(queues
            .into_values()
            .take(lease_core::MAX_QUEUES_LISTED)
            .collect())
    }

    fn wakes(&self) -> Option<lease_core::Wakes> {
        Some(self.wakes.clone())
    }

    async fn count_purgeable(&self, older_than: std::time::Duration) -> Result<u64> {
        check_purge(older_than, 1)?;
        let now = self.now();
        let state = self.lock();
        Ok(state
            .runs
            .values()
            .filter(|slot| {
                slot.run
                    .purgeable(lease_core::EndedStates::ALL, older_than, now)
            })
            .count() as u64)
    }
}
