//! [`LeaseStore`] for [`RedisLeaseStore`]: each call, its script and its verdicts.

use super::*;

#[async_trait::async_trait]
impl LeaseStore for RedisLeaseStore {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        self.create_with(&NewRun::new(run.clone())).await
    }

    async fn create_with(&self, new: &NewRun) -> Result<RunRecord> {
        new.check()?;
        let run = new.run();
        let mut call = Call::new(&SCRIPTS.create);
        call.key(self.keys.runs())
            .key(self.keys.claimable_of(&Class::of_new(new)))
            .key(self.keys.ids())
            .key(self.keys.counter())
            .key(self.keys.floor())
            .key(self.keys.attempts())
            .key(self.keys.delayed())
            .key(self.keys.payloads())
            .key(self.keys.kinds())
            .key(self.keys.kind_set())
            .key(self.keys.unique())
            .key(self.keys.unique_of())
            .arg(keys::encode(run.as_str()))
            .arg(new.delay_millis())
            .arg(marked(new))
            .arg(run_at_arg(new))
            .arg(Class::of_new(new).arg())
            .arg(new.unique_key().unwrap_or(""))
            .arg(trace_arg(new));
        let (reply, ack) = self.write("create", &call).await?;
        match reply.status()? {
            "ok" => {
                ack.confirm()?;
                // Created at `now`; claimable from then, unless delayed until `delay_end`.
                let (now, delay_end) = (reply.time(1)?, reply.opt_time(3)?);
                Ok(
                    RunRecord::new(run.clone(), RunState::Runnable, reply.fence(2)?, now)
                        .with_not_before(delay_end)
                        .with_claimable_since(delay_end.is_none().then_some(now))
                        .with_payload(new.payload().map(<[u8]>::to_vec))
                        .with_trace_parent(new.trace_parent().cloned())
                        .with_kind(new.kind().clone())
                        .with_queue(new.queue().clone())
                        .with_priority(new.priority())
                        .with_times(lease_core::RunTimes {
                            created_at: Some(now),
                            ..lease_core::RunTimes::default()
                        }),
                )
            }
            "exists" => {
                // A retried create takes "already exists" for its own commit: the run must be
                // on the replicas as if this call had created it.
                ack.confirm()?;
                Err(Error::AlreadyExists { run: run.clone() })
            }
            "held" => {
                ack.confirm()?;
                Err(Error::AlreadyExists {
                    run: keys::decode(reply.str(1)?)?,
                })
            }
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }

    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        let encoded = keys::encode(run.as_str());
        let (reply, ack, kind) = self
            .write_kinded("claim", &Class::default(), |kind| {
                let mut call = Call::new(&SCRIPTS.claim);
                call.key(self.keys.runs())
                    .key(self.keys.claimable_of(kind))
                    .key(self.keys.attempts())
                    .key(self.keys.payloads())
                    .key(self.keys.kinds())
                    .key(self.keys.history())
                    .key(self.keys.restored())
                    .key(self.keys.waits())
                    .key(self.keys.deadlines())
                    .key(self.keys.resumed())
                    .key(self.keys.suspended())
                    .arg(&encoded)
                    .arg(worker.as_str())
                    .arg(ttl.as_millis())
                    .arg(kind.arg());
                call
            })
            .await?;
        match reply.status()? {
            "ok" => {
                let lease = self
                    .lease(run.clone(), worker, ttl, &reply, 1)?
                    .with_payload(reply.payload(4)?)
                    .with_resumed(reply.resumed(5)?)
                    .with_trace_parent(reply.trace_parent(6)?)
                    .with_kind(kind.kind)
                    .with_queue(kind.queue)
                    .with_priority(kind.priority);
                ack.confirm()?;
                Ok(lease)
            }
            "restored" => Err(self.restored(&reply)),
            "none" => Err(Error::NotFound { run: run.clone() }),
            "refused" => {
                let now = reply.time(5)?;
                // The expiry field: the holder's expiry, or an unowned run's retry delay.
                let left = reply.opt_time(3)?.map(|at| at.saturating_since(now));
                let owner = reply.owner(2)?;
                let (remaining, delayed) = match owner {
                    Some(_) => (left, None),
                    None => (None, left),
                };
                match claim_refusal(
                    run,
                    reply.state(1)?,
                    owner.as_ref(),
                    remaining,
                    delayed,
                    reply.fence(4)?,
                ) {
                    Some(refusal) => Err(refusal),
                    None => Err(reply
                        .bad("the script refused a claim the rules allow")
                        .into()),
                }
            }
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
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
        // The kind's indexes in the queue, priority 0 to MAX_PRIORITY.
        let indexes: Vec<String> = (0..=lease_core::MAX_PRIORITY)
            .map(|priority| {
                self.keys.claimable_of(&Class {
                    kind: kind.clone(),
                    priority,
                    queue: queue.clone(),
                })
            })
            .collect();
        if self.was_idle(kind) && !self.claimable_any(&indexes).await? {
            // Nothing in the kind's indexes and no restore marker: what the script would
            // answer, for one read-only command (an idle worker's poll).
            return Ok(Vec::new());
        }
        let mut leases = Vec::new();
        // Each script call examines a bounded number of stale index entries; calls continue
        // while one ran out of that budget, so a claimable run is never missed.
        loop {
            let mut call = Call::new(&SCRIPTS.claim_next);
            call.key(self.keys.runs())
                .key(&indexes[0])
                .key(self.keys.attempts())
                .key(self.keys.history());
            for index in &indexes[1..] {
                call.key(index);
            }
            call.key(self.keys.payloads())
                .key(self.keys.restored())
                .key(self.keys.queues())
                .key(self.keys.waits())
                .key(self.keys.deadlines())
                .key(self.keys.resumed())
                .key(self.keys.suspended());
            call.arg(worker.as_str())
                .arg(ttl.as_millis())
                .arg(max - leases.len())
                .arg(CLAIM_NEXT_SCAN)
                .arg(queue.as_str());
            let (reply, ack) = self.write("claim_next", &call).await?;
            if reply.len() == 2 && reply.status()? == "restored" {
                return Err(self.restored(&reply));
            }
            if reply.len() % 9 != 1 {
                return Err(reply
                    .bad(
                        "expected a flag, then groups of id, fence, expiry, attempts, payload, \
                         priority, waited, resumed, trace parent",
                    )
                    .into());
            }
            let more = reply.str(0)? == "1";
            let claimed = (1..reply.len())
                .step_by(9)
                .map(|i| {
                    let run = keys::decode(reply.str(i)?)?;
                    let priority: u8 = reply.parse(i + 5)?;
                    let waited = Duration::from_micros(reply.parse(i + 6)?);
                    let lease = self
                        .lease(run, worker, ttl, &reply, i + 1)?
                        .with_kind(kind.clone())
                        .with_queue(queue.clone())
                        .with_priority(priority)
                        .with_waited(Some(waited))
                        .with_resumed(reply.resumed(i + 7)?);
                    // Read by the script that claimed the run: the payload and trace parent of
                    // the life it claimed.
                    Ok(lease
                        .with_payload(reply.payload(i + 4)?)
                        .with_trace_parent(reply.trace_parent(i + 8)?))
                })
                .collect::<Result<Vec<Lease>>>()?;
            if !claimed.is_empty() {
                // Unconfirmed leases are never handed out; those of earlier calls are
                // withheld too (they expire by their TTL, their fences never reused).
                ack.confirm()?;
            }
            leases.extend(claimed);
            if !more || leases.len() >= max {
                self.set_idle(kind, leases.is_empty());
                return Ok(leases);
            }
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease> {
        let mut results = self.renew_many(std::slice::from_ref(lease)).await?;
        results
            .pop()
            .unwrap_or_else(|| Err(Error::backend(crate::error::BACKEND, "renew: empty reply")))
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        check_renew_batch(leases.len())?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let mut call = Call::new(&SCRIPTS.renew);
        call.key(self.keys.runs());
        for lease in leases {
            // The index of the kind the lease names: a wrong one only lets the run's entry
            // lag, which claim_next repairs (renew.lua).
            call.key(self.keys.claimable_of(&Class::of_lease(lease)));
        }
        for lease in leases {
            call.arg(keys::encode(lease.run().as_str()))
                .arg(lease.fence().get())
                .arg(lease.ttl().as_millis());
        }
        let (reply, ack) = self.write("renew", &call).await?;
        if reply.len() != leases.len() {
            return Err(reply.bad("expected one result per lease").into());
        }
        let results: Vec<Result<Lease>> = leases
            .iter()
            .enumerate()
            .map(|(i, lease)| {
                let one = reply.nested(i)?;
                self.status(lease, &one)?;
                Lease::new(
                    lease.run().clone(),
                    lease.owner().clone(),
                    lease.fence(),
                    lease.ttl(),
                    one.time(1)?,
                )
                .map(|renewed| {
                    renewed
                        .with_attempt(lease.attempt())
                        .carrying(lease)
                        .with_trace_parent(lease.trace_parent().cloned())
                })
                .map_err(Error::from)
            })
            .collect();
        if results.iter().any(needs_ack) {
            // A renewal a failover could lose is no renewal: the local deadline must not move.
            ack.confirm()?;
        }
        Ok(results)
    }

    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        check_payload(payload)?;
        let reply = self.fenced(lease, "append", payload).await?;
        Ok(JournalEntry::new(
            reply.parse(1)?,
            lease.fence(),
            payload.to_vec(),
            reply.time(2)?,
        ))
    }

    async fn append_keyed(
        &self,
        lease: &Lease,
        key: &IdempotencyKey,
        payload: &[u8],
    ) -> Result<JournalEntry> {
        check_payload(payload)?;
        let run = lease.run();
        let mut call = Call::new(&SCRIPTS.append_keyed);
        call.key(self.keys.runs())
            .key(self.keys.journal(run))
            .key(self.keys.journal_keys(run))
            .arg(keys::encode(run.as_str()))
            .arg(lease.fence().get())
            .arg(payload)
            .arg(key.as_str());
        let (reply, ack) = self.write("append_keyed", &call).await?;
        self.confirmed(self.status(lease, &reply), &ack)?;
        let seq: u64 = reply.parse(1)?;
        journal_entry(&reply, 2, seq)
    }

    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        let mut entries = Vec::new();
        // Paged: each script call copies at most about JOURNAL_PAGE_BYTES.
        let mut from = 0usize;
        loop {
            let mut call = Call::new(&SCRIPTS.journal);
            call.key(self.keys.runs())
                .key(self.keys.journal(run))
                .arg(keys::encode(run.as_str()))
                .arg(from)
                .arg(JOURNAL_PAGE_BYTES);
            let reply = self.read("journal", &call).await?;
            match reply.status()? {
                "ok" => {}
                "none" => return Err(Error::NotFound { run: run.clone() }),
                other => return Err(reply.bad(format!("unknown status {other:?}")).into()),
            }
            for i in 2..reply.len() {
                entries.push(journal_entry(&reply, i, entries.len() as u64 + 1)?);
            }
            let next = reply.str(1)?;
            if next.is_empty() {
                return Ok(entries);
            }
            from = reply.parse(1)?;
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.fenced(lease, "release", b"").await.map(drop)
    }

    async fn suspend(&self, lease: &Lease) -> Result<()> {
        self.fenced(lease, "suspend", b"").await.map(drop)
    }

    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        check_end_batch(ends)?;
        if ends.is_empty() {
            return Ok(Vec::new());
        }
        // Written into each attempt the call ends, where a resend of the call finds it.
        let id = call_id();
        let mut payloads: Vec<Cow<'_, [u8]>> = Vec::with_capacity(ends.len());
        for Ending { end, .. } in ends {
            payloads.push(match end {
                End::CompleteWith(payload) => Cow::Borrowed(payload),
                End::RetryAfter(_) => Cow::Owned(end.delay_millis().to_string().into_bytes()),
                End::AttemptFailed { reason, .. } => {
                    Cow::Owned(format!("{}:{reason}", end.delay_millis()).into_bytes())
                }
                End::Fail(reason) => Cow::Borrowed(reason.as_bytes()),
                // The timeout in ms ('' for none), then the name (end_many.lua).
                End::AwaitSignal { name, timeout } => Cow::Owned(
                    format!(
                        "{}:{name}",
                        timeout.map_or_else(String::new, |t| t.as_millis().to_string())
                    )
                    .into_bytes(),
                ),
                // check_end_batch refused Committed above.
                End::Complete | End::Release | End::Suspend | End::Committed(_) => {
                    Cow::Borrowed(&[])
                }
                // An end added to the contract after this adapter: refused before any write.
                _ => {
                    return Err(lease_core::InvalidInput::Unsupported {
                        operation: "an end of this kind",
                    }
                    .into())
                }
            });
        }
        // The kinds the leases name; an item whose run is of another kind is sent again with
        // its run's (end_many.lua then writes nothing).
        let mut kinds: Vec<Class> = ends.iter().map(|e| Class::of_lease(&e.lease)).collect();
        let mut resends = 0;
        let (reply, ack) = loop {
            let mut call = Call::new(&SCRIPTS.end_many);
            call.key(self.keys.runs())
                .key(self.keys.claimable())
                .key(self.keys.failures())
                .key(self.keys.ended())
                .key(self.keys.delayed())
                .key(self.keys.suspended())
                .key(self.keys.attempts())
                .key(self.keys.kinds())
                .key(self.keys.history())
                .key(self.keys.waits())
                .key(self.keys.deadlines())
                .key(self.keys.resumed())
                .arg(&id);
            for ((Ending { lease, end, .. }, payload), kind) in
                ends.iter().zip(&payloads).zip(&kinds)
            {
                // Declared, like every key a script touches, even if the item is refused.
                call.key(self.keys.journal(lease.run()))
                    .key(self.keys.claimable_of(kind))
                    .arg(end.as_str())
                    .arg(keys::encode(lease.run().as_str()))
                    .arg(lease.fence().get())
                    .arg(payload.as_ref())
                    .arg(kind.arg());
            }
            let (reply, ack) = self.write("end_many", &call).await?;
            if reply.str(0).ok() != Some("kind") {
                break (reply, ack);
            }
            if resends == KIND_RESENDS || reply.len() % 2 != 1 {
                return Err(reply
                    .bad("the runs' kinds kept changing, or a malformed kind reply")
                    .into());
            }
            resends += 1;
            for i in (1..reply.len()).step_by(2) {
                let item: usize = reply.parse(i)?;
                let slot = item
                    .checked_sub(1)
                    .and_then(|k| kinds.get_mut(k))
                    .ok_or_else(|| reply.bad(format!("no item {item}")))?;
                *slot = reply.class(i + 1)?;
            }
        };
        if reply.len() != ends.len() {
            return Err(reply.bad("expected one result per item").into());
        }
        let results: Vec<Result<()>> = ends
            .iter()
            .enumerate()
            .map(|(i, ending)| self.status(&ending.lease, &reply.nested(i)?))
            .collect();
        if results.iter().any(needs_ack) {
            // One WAIT acknowledges the whole batch; without it no item is reported ended.
            ack.confirm()?;
        }
        Ok(results)
    }

    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>> {
        check_create_batch(runs)?;
        let runs: Vec<NewRun> = runs.iter().cloned().map(NewRun::new).collect();
        self.create_many_with(&runs).await
    }

    async fn create_many_with(&self, runs: &[NewRun]) -> Result<Vec<Result<()>>> {
        check_new_runs(runs)?;
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let mut call = Call::new(&SCRIPTS.create_many);
        call.key(self.keys.runs())
            .key(self.keys.claimable())
            .key(self.keys.ids())
            .key(self.keys.counter())
            .key(self.keys.floor())
            .key(self.keys.attempts())
            .key(self.keys.delayed())
            .key(self.keys.payloads())
            .key(self.keys.kinds())
            .key(self.keys.kind_set())
            .key(self.keys.unique())
            .key(self.keys.unique_of());
        for new in runs {
            call.key(self.keys.claimable_of(&Class::of_new(new)))
                .arg(keys::encode(new.run().as_str()))
                .arg(new.delay_millis())
                .arg(marked(new))
                .arg(run_at_arg(new))
                .arg(Class::of_new(new).arg())
                .arg(new.unique_key().unwrap_or(""))
                .arg(trace_arg(new));
        }
        let (reply, ack) = self.write("create_many", &call).await?;
        if reply.len() != runs.len() {
            return Err(reply.bad("expected one result per run").into());
        }
        let results = runs
            .iter()
            .enumerate()
            .map(|(i, new)| match reply.str(i)? {
                "1" => Ok(()),
                "0" => Err(Error::AlreadyExists {
                    run: new.run().clone(),
                }),
                held if held.starts_with('=') => Err(Error::AlreadyExists {
                    run: keys::decode(&held[1..])?,
                }),
                other => Err(reply.bad(format!("unknown result {other:?}")).into()),
            })
            .collect::<Vec<Result<()>>>();
        // Created now, or already there (which a retried batch takes for its own commit):
        // either way on the replicas before it is reported.
        ack.confirm()?;
        Ok(results)
    }

    async fn complete(&self, lease: &Lease) -> Result<()> {
        self.fenced(lease, "complete", b"").await.map(drop)
    }

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        self.resume_run(run).await
    }

    async fn deliver_signal(
        &self,
        run: &RunId,
        name: &lease_core::SignalName,
        fence: lease_core::Fence,
        payload: &[u8],
    ) -> Result<lease_core::Signalled> {
        self.deliver(run, name, fence, payload).await
    }

    fn signal_key(&self) -> Option<&lease_core::SignalKey> {
        self.config().signal_key.as_ref()
    }

    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        self.inspect_run(run).await
    }

    async fn inspect_many(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        self.inspect_runs(runs).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        self.list_runs(filter).await
    }

    async fn purge(&self, older_than: Duration, max: usize) -> Result<Vec<RunId>> {
        self.purge_runs(lease_core::EndedStates::ALL, older_than, max)
            .await
    }

    async fn purge_ids(&self, runs: &[RunId]) -> Result<Vec<RunId>> {
        self.purge_ids_now(runs).await
    }

    async fn purge_ended(
        &self,
        states: lease_core::EndedStates,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<RunId>> {
        self.purge_runs(states, older_than, max).await
    }

    async fn count(&self) -> Result<lease_core::RunCounts> {
        self.count_runs().await
    }

    fn wakes(&self) -> Option<lease_core::Wakes> {
        let listening = self.listening.as_ref()?;
        Some(crate::wake::wakes(
            listening,
            &self.link,
            self.keys.wake_channel(),
        ))
    }

    fn capabilities(&self) -> lease_core::Capabilities {
        let caps = lease_core::Capabilities::default();
        if self.listening.is_some() {
            caps
        } else {
            caps.without_wake_ups()
        }
    }

    async fn count_kinds(&self) -> Result<Vec<lease_core::KindCounts>> {
        self.count_kinds_runs().await
    }

    async fn pause_queue(&self, queue: &Queue) -> Result<lease_core::QueueState> {
        self.set_paused(queue, true).await
    }

    async fn resume_queue(&self, queue: &Queue) -> Result<lease_core::QueueState> {
        let state = self.set_paused(queue, false).await?;
        // The resume is stored; its wake-ups are hints, and failing to send them fails nothing.
        if let Err(e) = self.wake_queue(queue).await {
            tracing::warn!(error = %e, %queue, "the resumed queue's workers were not woken; they find its runs at their next poll");
        }
        Ok(state)
    }

    async fn queues(&self) -> Result<Vec<lease_core::QueueState>> {
        self.queue_states().await
    }

    async fn count_purgeable(&self, older_than: Duration) -> Result<u64> {
        self.count_purgeable_runs(older_than).await
    }

    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        self.force_release_run(run).await
    }

    async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        self.cancel_run(run, reason).await
    }
}

/// Whether `answer` reports something under the caller's own fence, which must be confirmed
/// by the replicas before it is reported: success, or the lease ended under that fence (a
/// retry's "already applied").
pub(super) fn needs_ack<T>(answer: &Result<T>) -> bool {
    matches!(answer, Ok(_) | Err(Error::LeaseEnded { .. }))
}

/// Journal entry `i` of a journal reply, `'<fence>:<written_at>:<payload>'`, numbered `seq`.
fn journal_entry(reply: &Reply, i: usize, seq: u64) -> Result<JournalEntry> {
    let raw = reply.bytes(i)?;
    let malformed = || -> Error {
        reply
            .bad(format!("journal entry {seq} is malformed"))
            .into()
    };
    let mut parts = raw.splitn(3, |b| *b == b':');
    let (Some(fence), Some(at), Some(payload)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(malformed());
    };
    let number = |b: &[u8]| -> Result<u64> {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(malformed)
    };
    Ok(JournalEntry::new(
        seq,
        lease_core::Fence::new(number(fence)?)?,
        payload.to_vec(),
        StoreTime::from_micros(number(at)?),
    ))
}

/// A create's payload argument, as the scripts read it: `''` for none, else `'='` followed by
/// the bytes (so an empty payload stays apart from none).
/// A create's run_at argument: µs since the Unix epoch, or '' for none.
fn run_at_arg(new: &NewRun) -> String {
    new.run_at_micros()
        .map_or_else(String::new, |us| us.to_string())
}

/// A create's trace parent argument: its text, or '' for none.
fn trace_arg(new: &NewRun) -> &str {
    new.trace_parent()
        .map_or("", lease_core::TraceParent::as_str)
}

fn marked(new: &NewRun) -> Vec<u8> {
    match new.payload() {
        None => Vec::new(),
        Some(bytes) => {
            let mut out = Vec::with_capacity(1 + bytes.len());
            out.push(b'=');
            out.extend_from_slice(bytes);
            out
        }
    }
}
