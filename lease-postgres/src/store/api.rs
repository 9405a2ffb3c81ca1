//! [`LeaseStore`] for [`PostgresLeaseStore`]: each call, its statement and its verdicts.

use super::*;

#[async_trait::async_trait]
impl LeaseStore for PostgresLeaseStore {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        self.create_with(&NewRun::new(run.clone())).await
    }

    async fn create_with(&self, new: &NewRun) -> Result<RunRecord> {
        new.check()?;
        let run = new.run();
        let record = call!(self, |conn| {
            // No row and no record: the run was purged between the two reads; the next attempt
            // creates it.
            self.record_write(conn, &self.sql.create, run, Some(new), |current| {
                current.map(|_| Error::AlreadyExists { run: run.clone() })
            })
            .await
        })?;
        if let Some(notifier) = &self.notifier {
            notifier.created([new]);
        }
        Ok(record)
    }

    async fn create_many_with(&self, runs: &[NewRun]) -> Result<Vec<Result<()>>> {
        lease_core::backend::check_new_runs(runs)?;
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let results = call!(self, |conn| self.create_batch(conn, runs).await)?;
        if let Some(notifier) = &self.notifier {
            notifier.created(
                runs.iter()
                    .zip(&results)
                    .filter(|(_, r)| r.is_ok())
                    .map(|(new, _)| new),
            );
        }
        Ok(results)
    }

    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        call!(self, |conn| {
            for _ in 0..ATTEMPTS {
                let row = self
                    .write_opt(
                        conn,
                        self.route
                            .query(&self.sql.claim)
                            .bind(run.as_str())
                            .bind(worker.as_str())
                            .bind(ttl_param(ttl)),
                    )
                    .await?;
                if let Some(row) = row {
                    let fence = fence(get(&row, "fence")?)?;
                    let expires_at = store_time(get(&row, "expires_us")?)?;
                    let attempt = count(get(&row, "attempts")?)?;
                    return Ok(leased(run, worker, fence, ttl, expires_at, attempt)?
                        .with_payload(payload(&row)?)
                        .with_trace_parent(trace_parent(&row)?)
                        .with_kind(kind(&row)?)
                        .with_queue(queue(&row)?)
                        .with_priority(priority(&row)?)
                        .with_resumed(resumed(&row)?));
                }
                // The read only explains the refusal; if the row now allows a claim (the
                // lease expired in between), the claim itself is tried again.
                let Some(row) = self.explain(conn, run).await? else {
                    return Err(Error::NotFound { run: run.clone() });
                };
                if let Some(refusal) = claim_refusal(
                    run,
                    row.state,
                    row.owner.as_ref(),
                    row.remaining,
                    row.delay,
                    row.fence,
                ) {
                    return Err(refusal);
                }
            }
            Err(Self::raced(run))
        })
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
        let rows = call!(self, |conn| {
            self.write_all(
                conn,
                self.route
                    .query(&self.sql.claim_next)
                    .bind(worker.as_str())
                    .bind(ttl_param(ttl))
                    .bind(max as i64)
                    .bind(LAGGING_MOVED_PER_CLAIM)
                    .bind(kind.as_str())
                    .bind(queue.as_str()),
            )
            .await
        })?;
        rows.iter()
            .map(|row| {
                let run = RunId::new(get::<String>(row, "run_id")?).map_err(corrupt)?;
                let fence = fence(get(row, "fence")?)?;
                let expires_at = store_time(get(row, "expires_us")?)?;
                let attempt = count(get(row, "attempts")?)?;
                let waited: Option<i64> = get(row, "waited_us")?;
                Ok(leased(&run, worker, fence, ttl, expires_at, attempt)?
                    .with_payload(payload(row)?)
                    .with_trace_parent(trace_parent(row)?)
                    .with_kind(kind.clone())
                    .with_queue(queue.clone())
                    .with_priority(priority(row)?)
                    .with_resumed(resumed(row)?)
                    .with_waited(waited.map(|us| Duration::from_micros(us.max(0) as u64))))
            })
            .collect()
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease> {
        call!(self, |conn| self.renew_one(conn, lease).await)
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        check_renew_batch(leases.len())?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let mut seen = HashSet::with_capacity(leases.len());
        if !leases.iter().all(|lease| seen.insert(lease.run())) {
            // One statement updates a row once; repeated runs are renewed one by one, in order,
            // as the memory store does.
            return call!(self, |conn| {
                let mut results = Vec::with_capacity(leases.len());
                for lease in leases {
                    results.push(self.renew_one(conn, lease).await);
                }
                Ok(results)
            });
        }
        call!(self, |conn| self.renew_batch(conn, leases).await)
    }

    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        check_payload(payload)?;
        call!(self, |conn| {
            for _ in 0..ATTEMPTS {
                let row = self
                    .write_opt(
                        conn,
                        self.route
                            .query(&self.sql.append)
                            .bind(lease.run().as_str())
                            .bind(fence_param(lease.fence()))
                            .bind(payload),
                    )
                    .await?;
                if let Some(row) = row {
                    let seq: i64 = get(&row, "seq")?;
                    return Ok(JournalEntry::new(
                        u64::try_from(seq).map_err(corrupt)?,
                        fence(get(&row, "fence")?)?,
                        payload.to_vec(),
                        store_time(get(&row, "written_us")?)?,
                    ));
                }
                self.fenced_refusal(conn, lease).await?;
            }
            Err(Self::raced(lease.run()))
        })
    }

    async fn append_keyed(
        &self,
        lease: &Lease,
        key: &IdempotencyKey,
        payload: &[u8],
    ) -> Result<JournalEntry> {
        check_payload(payload)?;
        call!(self, |conn| {
            for _ in 0..ATTEMPTS {
                let written = self
                    .write_opt(
                        conn,
                        self.route
                            .query(&self.sql.append_keyed)
                            .bind(lease.run().as_str())
                            .bind(fence_param(lease.fence()))
                            .bind(payload)
                            .bind(key.as_str()),
                    )
                    .await;
                let row = match written {
                    Ok(row) => row,
                    // The same key committed by a concurrent call after this statement's
                    // snapshot: run it again, and it finds that entry.
                    Err(e) if is_duplicate_key(&e) => continue,
                    Err(e) => return Err(e),
                };
                if let Some(row) = row {
                    let seq: i64 = get(&row, "seq")?;
                    return Ok(JournalEntry::new(
                        u64::try_from(seq).map_err(corrupt)?,
                        fence(get(&row, "fence")?)?,
                        get(&row, "payload")?,
                        store_time(get(&row, "written_us")?)?,
                    ));
                }
                self.fenced_refusal(conn, lease).await?;
            }
            Err(Self::raced(lease.run()))
        })
    }

    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        let rows = call!(self, |conn| {
            self.read_all(conn, self.route.query(&self.sql.journal).bind(run.as_str()))
                .await
        })?;
        if rows.is_empty() {
            return Err(Error::NotFound { run: run.clone() });
        }
        let mut entries = Vec::with_capacity(rows.len());
        for row in &rows {
            let Some(seq) = get::<Option<i64>>(row, "seq")? else {
                continue; // the run exists and its journal is empty
            };
            entries.push(JournalEntry::new(
                u64::try_from(seq).map_err(corrupt)?,
                fence(get(row, "fence")?)?,
                get(row, "payload")?,
                store_time(get(row, "written_us")?)?,
            ));
        }
        Ok(entries)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        call!(self, |conn| self.end(conn, lease, RunState::Runnable).await)?;
        if let Some(notifier) = &self.notifier {
            notifier.claimable(lease.kind(), 0);
        }
        Ok(())
    }

    async fn suspend(&self, lease: &Lease) -> Result<()> {
        call!(self, |conn| self
            .end(conn, lease, RunState::Suspended)
            .await)
    }

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        let record = call!(self, |conn| {
            self.record_write(conn, &self.sql.resume, run, None, |current| match current {
                None => Some(Error::NotFound { run: run.clone() }),
                Some(r) if !matches!(r.state, RunState::Suspended | RunState::Failed) => {
                    Some(Error::NotSuspended {
                        run: run.clone(),
                        state: r.state,
                    })
                }
                Some(_) => None,
            })
            .await
        })?;
        self.claimable_now(&record);
        Ok(record)
    }

    async fn deliver_signal(
        &self,
        run: &RunId,
        name: &lease_core::SignalName,
        signal_fence: Fence,
        payload: &[u8],
    ) -> Result<lease_core::Signalled> {
        lease_core::signal::check_signal_payload(payload)?;
        let delivered = call!(self, |conn| {
            for _ in 0..ATTEMPTS {
                let query = self.signal_query(run, name, signal_fence, payload);
                if let Some(row) = self.write_opt(conn, query).await? {
                    let claimable: bool = get(&row, "claimable")?;
                    return Ok(Some(claimable.then(|| kind(&row)).transpose()?));
                }
                // Judged on the record, by the one rule: a duplicate of the delivery that
                // answered the wait, a refusal, or (raced: the run now waits in it) again.
                let current = self.inspect_on(conn, run).await?;
                match lease_core::signal::signal_verdict(
                    run,
                    lease_core::signal::Waiting::of(&current),
                    name,
                    signal_fence,
                    payload,
                    current.observed_at,
                ) {
                    Ok(lease_core::signal::Delivery::Duplicate) => {
                        // A retry takes "delivered before" for its own delivery: confirmed
                        // like a fresh write.
                        self.route.confirm_seen(conn).await?;
                        return Ok(None);
                    }
                    Ok(_) => continue,
                    Err(refusal) => return Err(refusal),
                }
            }
            Err(Self::raced(run))
        })?;
        if let (Some(Some(kind)), Some(notifier)) = (&delivered, &self.notifier) {
            notifier.claimable(kind, 0);
        }
        Ok(lease_core::Signalled::new(run.clone(), delivered.is_none()))
    }

    fn signal_key(&self) -> Option<&lease_core::SignalKey> {
        self.signal_key.as_ref()
    }

    async fn complete(&self, lease: &Lease) -> Result<()> {
        call!(self, |conn| self
            .end(conn, lease, RunState::Completed)
            .await)
    }

    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        call!(self, |conn| self.inspect_on(conn, run).await)
    }

    async fn inspect_many(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        lease_core::backend::check_create_batch(runs)?; // the batch rule: at most MAX_BATCH ids
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = runs.iter().map(RunId::as_str).collect();
        let rows = call!(self, |conn| {
            self.read_all(conn, self.route.query(&self.sql.inspect_many).bind(&ids))
                .await
        })?;
        if rows.len() != runs.len() {
            return Err(PgError::Failed(format!(
                "inspect_many returned {} rows for {} ids",
                rows.len(),
                runs.len()
            ))
            .into());
        }
        runs.iter()
            .zip(&rows)
            .map(|(run, row)| {
                Ok(match get::<Option<String>>(row, "run_id")? {
                    Some(_) => Ok(record(row)?),
                    None => Err(Error::NotFound { run: run.clone() }),
                })
            })
            .collect()
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        check_list(filter)?;
        let rows = call!(self, |conn| {
            self.read_all(
                conn,
                self.route
                    .query(&self.sql.list)
                    .bind(filter.state.map(RunState::as_str))
                    .bind(filter.expired)
                    .bind(filter.after.as_ref().map(RunId::as_str))
                    .bind(filter.limit as i64)
                    .bind(filter.kind.as_ref().map(Kind::as_str))
                    .bind(filter.queue.as_ref().map(Queue::as_str)),
            )
            .await
        })?;
        Ok(rows.iter().map(record).collect::<Result<_, _>>()?)
    }

    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        lease_core::backend::check_end_batch(ends)?;
        if ends.is_empty() {
            return Ok(Vec::new());
        }
        let results = call!(self, |conn| self.end_batch(conn, ends).await)?;
        if let Some(notifier) = &self.notifier {
            notifier.claimable_all(
                ends.iter()
                    .zip(&results)
                    .filter(|(_, result)| result.is_ok())
                    .flat_map(|(ending, _)| {
                        let kind = ending.lease.kind();
                        match &ending.end {
                            End::Release | End::RetryAfter(_) | End::AttemptFailed { .. } => {
                                [Some((kind, ending.end.delay_millis())), None]
                            }
                            // Claimable now if a signal answered it early, else at its
                            // deadline (if any).
                            End::AwaitSignal { timeout, .. } => [
                                Some((kind, 0)),
                                timeout.map(|t| (kind, t.as_millis() as u64)),
                            ],
                            _ => [None, None],
                        }
                    })
                    .flatten(),
            );
        }
        Ok(results)
    }

    fn takes_effect(&self, effect: &lease_core::Effect) -> bool {
        effect.is::<crate::PgEffect>()
    }

    async fn end_many_with_effects(
        &self,
        ends: &[Ending],
        effects: &[Option<lease_core::Effect>],
    ) -> Result<Vec<Result<()>>> {
        self.end_with_effects(ends, effects).await
    }

    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>> {
        lease_core::backend::check_create_batch(runs)?;
        let runs: Vec<NewRun> = runs.iter().cloned().map(NewRun::new).collect();
        self.create_many_with(&runs).await
    }

    async fn purge(&self, older_than: Duration, max: usize) -> Result<Vec<RunId>> {
        self.purge_ended(lease_core::EndedStates::ALL, older_than, max)
            .await
    }

    async fn purge_ended(
        &self,
        states: lease_core::EndedStates,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<RunId>> {
        check_purge(older_than, max)?;
        let states = states.names();
        let rows = call!(self, |conn| {
            self.write_all(
                conn,
                self.route
                    .query(&self.sql.purge)
                    .bind(older_than.as_millis() as i64) // at most MAX_PURGE_AGE, checked
                    .bind(max as i64)
                    .bind(&states),
            )
            .await
        })?;
        rows.iter()
            .map(|row| Ok(RunId::new(get::<String>(row, "run_id")?).map_err(corrupt)?))
            .collect()
    }

    async fn purge_ids(&self, runs: &[RunId]) -> Result<Vec<RunId>> {
        lease_core::backend::check_create_batch(runs)?;
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = runs.iter().map(RunId::as_str).collect();
        let rows = call!(self, |conn| {
            self.write_all(conn, self.route.query(&self.sql.purge_ids).bind(&ids))
                .await
        })?;
        rows.iter()
            .map(|row| Ok(RunId::new(get::<String>(row, "run_id")?).map_err(corrupt)?))
            .collect()
    }

    async fn count(&self) -> Result<lease_core::RunCounts> {
        let row = call!(self, |conn| {
            let query = self
                .route
                .query(&self.sql.count)
                .bind(lease_core::MAX_COUNT as i64);
            self.read_all_without_jit(conn, query).await
        })?
        .into_iter()
        .next()
        .ok_or_else(|| PgError::Failed("count returned no row".to_owned()))?;
        let figure = |name: &str| -> Result<u64> {
            let n: i64 = get(&row, name)?;
            Ok(u64::try_from(n).map_err(corrupt)?)
        };
        let mut counts = lease_core::RunCounts::default();
        counts.claimable = figure("claimable")?;
        counts.held = figure("held")?;
        counts.delayed = figure("delayed")?;
        counts.suspended = figure("suspended")?;
        counts.completed = figure("completed")?;
        counts.failed = figure("failed")?;
        counts.cancelled = figure("cancelled")?;
        let oldest: Option<i64> = get(&row, "oldest_claimable_us")?;
        counts.oldest_claimable_age =
            oldest.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)));
        let longest: Option<i64> = get(&row, "longest_held_us")?;
        counts.longest_held =
            longest.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)));
        Ok(counts)
    }

    async fn pause_queue(&self, queue: &Queue) -> Result<QueueState> {
        self.set_paused(queue, true).await
    }

    async fn resume_queue(&self, queue: &Queue) -> Result<QueueState> {
        let state = self.set_paused(queue, false).await?;
        // Wakes the idle workers of the kinds with runs waiting in the queue (a hint: one that
        // is lost costs a worker its fallback poll).
        if let Some(notifier) = &self.notifier {
            match self.queue_kinds(queue).await {
                Ok(kinds) => notifier.claimable_all(kinds.iter().map(|k| (k, 0))),
                Err(e) => {
                    tracing::warn!(error = %e, %queue, "the resumed queue's kinds were not read; its workers find its runs at their next poll")
                }
            }
        }
        Ok(state)
    }

    async fn queues(&self) -> Result<Vec<QueueState>> {
        let rows = call!(self, |conn| {
            let query = self
                .route
                .query(&self.sql.queues)
                .bind(lease_core::MAX_QUEUES_LISTED as i64);
            self.read_all_without_jit(conn, query).await
        })?;
        rows.iter().map(|row| Ok(queue_state(row)?)).collect()
    }

    async fn count_kinds(&self) -> Result<Vec<lease_core::KindCounts>> {
        let rows = call!(self, |conn| {
            let query = self
                .route
                .query(&self.sql.count_kinds)
                .bind(lease_core::MAX_COUNT as i64)
                .bind(lease_core::MAX_KINDS_COUNTED as i64);
            self.read_all_without_jit(conn, query).await
        })?;
        rows.iter()
            .map(|row| {
                let figure = |name: &str| -> Result<u64> {
                    Ok(u64::try_from(get::<i64>(row, name)?).map_err(corrupt)?)
                };
                let lag: Option<i64> = get(row, "oldest_claimable_us")?;
                Ok(lease_core::KindCounts::new(
                    kind(row)?,
                    figure("runnable")?,
                    figure("claimable")?,
                    lag.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))),
                ))
            })
            .collect()
    }

    fn wakes(&self) -> Option<lease_core::Wakes> {
        let listening = self.listening.as_ref()?;
        let pool = self.listen_pool.as_ref().unwrap_or(&self.route.own);
        Some(crate::wake::wakes(listening, pool, &self.schema))
    }

    fn capabilities(&self) -> lease_core::Capabilities {
        // The whole contract to the millisecond, and runs created (and leases ended) inside
        // the caller's transaction (`create_in`, `end_in`).
        let caps = lease_core::Capabilities::default().with_transactional_enqueue();
        if self.listening.is_some() {
            caps
        } else {
            caps.without_wake_ups()
        }
    }

    async fn count_purgeable(&self, older_than: Duration) -> Result<u64> {
        check_purge(older_than, 1)?;
        let row = call!(self, |conn| {
            self.read_opt(
                conn,
                self.route
                    .query(&self.sql.count_purgeable)
                    .bind(older_than.as_millis() as i64),
            )
            .await
        })?;
        let n: i64 = match row {
            Some(row) => get(&row, "n")?,
            None => 0,
        };
        Ok(u64::try_from(n).map_err(corrupt)?)
    }

    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        let record = call!(self, |conn| {
            self.record_write(
                conn,
                &self.sql.force_release,
                run,
                None,
                |current| match current {
                    None => Some(Error::NotFound { run: run.clone() }),
                    Some(r) if r.state == RunState::Suspended => {
                        Some(Error::Suspended { run: run.clone() })
                    }
                    Some(r) if r.state == RunState::Completed => {
                        Some(Error::Completed { run: run.clone() })
                    }
                    Some(r) if r.state == RunState::Failed => {
                        Some(Error::Failed { run: run.clone() })
                    }
                    Some(r) if r.state == RunState::Cancelled => {
                        Some(Error::Cancelled { run: run.clone() })
                    }
                    Some(_) => None,
                },
            )
            .await
        })?;
        self.claimable_now(&record);
        Ok(record)
    }

    async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        lease_core::backend::check_reason(reason)?;
        call!(self, |conn| {
            for _ in 0..ATTEMPTS {
                let query = self
                    .route
                    .query(&self.sql.cancel)
                    .bind(run.as_str())
                    .bind(reason)
                    .bind(lease_core::attempt_error(reason));
                if let Some(row) = self.write_opt(conn, query).await? {
                    return Ok(record(&row)?);
                }
                match self.inspect_on(conn, run).await?.state {
                    RunState::Completed => return Err(Error::Completed { run: run.clone() }),
                    RunState::Cancelled => {
                        // A retried cancel (or a second one): the run must be as durable
                        // as if this call had cancelled it. Read again after the wait.
                        self.route.confirm_seen(conn).await?;
                        return self.inspect_on(conn, run).await;
                    }
                    // Changed between the two statements: try again.
                    _ => {}
                }
            }
            Err(Self::raced(run))
        })
    }
}
