//! Reads: records as etcd judges them, the journal, lists and counts.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::rpc::{GetOptions, ResponseHeader, Txn, TxnOp, TxnOpResponse};
use lease_core::backend::{check_list, check_purge};
use lease_core::{
    Fence, InvalidInput, JournalEntry, Kind, ListFilter, Result, RunCounts, RunId, RunRecord,
    RunState, StoreTime, WorkerId, MAX_BATCH, MAX_COUNT,
};

use super::decide::counted;
use super::decide::next_page;
use super::{now_micros, state_of, EtcdLeaseStore, Seen, CHUNK, JOURNAL_PAGE};
use crate::codec::{decode_entry, prefix_end, Rec};

impl EtcdLeaseStore {
    /// The payloads of `items` (`None` for a run whose record says it has none, which costs
    /// no read): [`CHUNK`] runs per read, the reads sent together. A payload never changes
    /// while its record stands (a purge rewrites the record, a create again too), so a payload
    /// read after its record, under a write that compares that record unchanged, is the
    /// record's own.
    pub(super) async fn payloads(
        &self,
        items: &[(&RunId, &Seen)],
    ) -> Result<Vec<Option<Arc<[u8]>>>> {
        let wanted: Vec<usize> = (0..items.len())
            .filter(|&i| items[i].1.rec.as_ref().is_some_and(|r| r.payload))
            .collect();
        let mut out = vec![None; items.len()];
        if wanted.is_empty() {
            return Ok(out);
        }
        let reads = wanted.chunks(CHUNK).map(|chunk| {
            let ops = chunk
                .iter()
                .map(|&i| TxnOp::get(self.keys.payload(items[i].0.as_str()), None))
                .collect::<Vec<_>>();
            self.txn(Txn::new().and_then(ops))
        });
        let responses = futures_util::future::try_join_all(reads).await?;
        let answers = responses.iter().flat_map(|r| r.op_responses());
        for (&i, answer) in wanted.iter().zip(answers) {
            if let TxnOpResponse::Get(get) = answer {
                out[i] = get.kvs().first().map(|kv| Arc::from(kv.value()));
            }
        }
        Ok(out)
    }

    /// Records with their payloads and attempt histories, as inspect returns them.
    pub(super) async fn records_with_payloads(
        &self,
        runs: &[&RunId],
        seen: &[Seen],
        now: u64,
    ) -> Result<Vec<Result<RunRecord>>> {
        let items: Vec<(&RunId, &Seen)> = runs.iter().copied().zip(seen).collect();
        let payloads = self.payloads(&items).await?;
        Ok(items
            .iter()
            .zip(payloads)
            .map(|((run, item), payload)| {
                let record = self
                    .record(run, item, now)?
                    .with_payload(payload.map(|p| p.to_vec()));
                let history = item.live(run)?.history.iter().map(|t| t.attempt());
                Ok(record.with_history(history.collect::<Result<_>>()?))
            })
            .collect())
    }

    /// ahead of `now`, and one it has reached at or before it, whatever the clocks say.
    pub(super) fn record(&self, run: &RunId, seen: &Seen, now: u64) -> Result<RunRecord> {
        let rec = seen.live(run)?;
        let state = state_of(rec);
        let mut record = RunRecord::new(
            run.clone(),
            state,
            Fence::new(rec.fence)?,
            StoreTime::from_micros(now),
        )
        .with_heartbeats(rec.heartbeats)
        .with_failure(rec.failure.clone())
        .with_attempts(rec.attempts)
        .with_trace_parent(rec.trace_parent.clone());
        if let Some(kind) = &rec.kind {
            record = record.with_kind(Kind::new(kind)?);
        }
        record = record.with_priority(rec.priority);
        let time = |us: u64| (us > 0).then(|| StoreTime::from_micros(us));
        record = record.with_times(lease_core::RunTimes {
            created_at: time(rec.created),
            claimed_at: time(rec.claimed),
            renewed_at: time(rec.renewed),
            // For an ended run, its index position is when it ended.
            ended_at: matches!(
                state,
                RunState::Completed | RunState::Failed | RunState::Cancelled
            )
            .then(|| StoreTime::from_micros(rec.since)),
        });
        if let Some(owner) = &rec.owner {
            let expires_at = if seen.block == Some(true) || seen.lapsed() {
                rec.expires_at.max(now + 1)
            } else {
                rec.expires_at.min(now)
            };
            record = record.with_lease(WorkerId::new(owner)?, StoreTime::from_micros(expires_at));
        } else if state == RunState::Runnable && (seen.block == Some(false) || seen.lapsed()) {
            record =
                record.with_not_before(Some(StoreTime::from_micros(rec.not_before.max(now + 1))));
        }
        Ok(record)
    }

    pub(super) async fn journal_entries(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        let seen = self.read(&[run]).await?;
        seen[0].live(run)?;
        let revision = self.floor.load(Ordering::SeqCst);
        let prefix = self.keys.journal_prefix(run.as_str());
        let end = prefix_end(&prefix);
        let mut from = prefix;
        let mut entries = Vec::new();
        loop {
            let page = self
                .range(from.clone(), end.clone(), JOURNAL_PAGE, true, revision)
                .await?;
            for kv in page.kvs() {
                let (fence, at, payload) = decode_entry(kv.value())?;
                // Entries are numbered from 1 without gaps, and read in key (seq) order.
                let seq = entries.len() as u64 + 1;
                entries.push(JournalEntry::new(
                    seq,
                    Fence::new(fence)?,
                    payload,
                    StoreTime::from_micros(at),
                ));
            }
            match next_page(&page) {
                Some(next) => from = next,
                None => break,
            }
        }
        Ok(entries)
    }

    pub(super) async fn inspect_batch(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        if runs.len() > MAX_BATCH {
            return Err(InvalidInput::BatchTooLarge {
                len: runs.len(),
                max: MAX_BATCH,
            }
            .into());
        }
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let now = now_micros();
        let ids: Vec<&RunId> = runs.iter().collect();
        let seen = self.read(&ids).await?;
        self.records_with_payloads(&ids, &seen, now).await
    }

    pub(super) async fn list_runs(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        check_list(filter)?;
        if let Some(state) = filter.state {
            if self.watch.states.load(Ordering::Relaxed) {
                return self.list_by_state(state, filter).await;
            }
        }
        let prefix = self.keys.records();
        let end = prefix_end(&prefix);
        let mut from = match &filter.after {
            Some(after) => {
                let mut k = self.keys.record(after.as_str());
                k.push(0);
                k
            }
            None => prefix,
        };
        let page_size = if filter.state.is_some()
            || filter.expired
            || filter.kind.is_some()
            || filter.queue.is_some()
        {
            MAX_BATCH as i64
        } else {
            filter.limit as i64
        };
        let mut out = Vec::new();
        while out.len() < filter.limit {
            let now = now_micros();
            let page = self
                .range(from.clone(), end.clone(), page_size, true, 0)
                .await?;
            let revision = page.header().map_or(0, ResponseHeader::revision);
            let mut runs = Vec::new();
            let mut recs = Vec::new();
            for kv in page.kvs() {
                let Some(run) = self.keys.run_of_record(kv.key()) else {
                    continue;
                };
                let rec = Rec::decode(kv.value())?;
                if rec.state.is_none() {
                    continue;
                }
                runs.push(RunId::new(run)?);
                recs.push((rec, kv.mod_revision()));
            }
            // The block keys at the page's revision: one consistent view.
            let mut ops = Vec::new();
            for run in &runs {
                ops.push(TxnOp::get(
                    self.keys.block(run.as_str()),
                    Some(GetOptions::new().with_revision(revision)),
                ));
            }
            let mut blocks = Vec::with_capacity(runs.len());
            for chunk in ops.chunks(CHUNK * 2) {
                let response = self.txn(Txn::new().and_then(chunk.to_vec())).await?;
                for answer in response.op_responses() {
                    blocks.push(match answer {
                        TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value() == b"h"),
                        _ => None,
                    });
                }
            }
            for ((run, (rec, rev)), block) in runs.iter().zip(recs).zip(blocks) {
                let seen = Seen::of(rec, rev, block);
                let record = self.record(run, &seen, now)?;
                if filter.state.is_none_or(|s| s == record.state)
                    && (!filter.expired || record.is_expired())
                    && filter.keeps(&record.kind, &record.queue)
                    && out.len() < filter.limit
                {
                    out.push(record);
                }
            }
            match next_page(&page) {
                Some(next) => from = next,
                None => break,
            }
        }
        Ok(out)
    }

    /// `list` by state: the state's family in id order, a page of `limit` entries at a time,
    /// each run read with its block in one read; an entry whose run moved on since (the
    /// entry and the record are written together, so only between the range and the read)
    /// is skipped. Work is proportional to what is returned.
    async fn list_by_state(&self, state: RunState, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        let family = self.keys.state_family(state);
        let end = prefix_end(&family);
        let mut from = match &filter.after {
            Some(after) => {
                let mut k = self.keys.state_entry(state, after.as_str());
                k.push(0);
                k
            }
            None => family,
        };
        let mut out = Vec::new();
        while out.len() < filter.limit {
            let want = (filter.limit - out.len()).min(MAX_BATCH);
            let page = self
                .range(from.clone(), end.clone(), want as i64, false, 0)
                .await?;
            let mut runs = Vec::with_capacity(page.kvs().len());
            for kv in page.kvs() {
                if let Some(run) = self.keys.run_of_state_entry(kv.key()) {
                    runs.push(RunId::new(run)?);
                }
            }
            let now = now_micros();
            let ids: Vec<&RunId> = runs.iter().collect();
            let seen = self.read(&ids).await?;
            for (run, item) in runs.iter().zip(&seen) {
                let Ok(record) = self.record(run, item, now) else {
                    continue; // purged in between
                };
                if record.state == state
                    && (!filter.expired || record.is_expired())
                    && filter.keeps(&record.kind, &record.queue)
                {
                    out.push(record);
                }
            }
            match next_page(&page) {
                Some(next) => from = next,
                None => break,
            }
        }
        Ok(out)
    }

    pub(super) async fn count_runs(&self) -> Result<RunCounts> {
        let families = [
            RunState::Runnable,
            RunState::Suspended,
            RunState::Completed,
            RunState::Failed,
            RunState::Cancelled,
        ];
        let mut ops: Vec<TxnOp> = families
            .iter()
            .map(|&s| {
                let family = self.keys.index_family(s);
                Self::count_op(family.clone(), prefix_end(&family))
            })
            .collect();
        // Blocks (held and delayed) and delay markers, counted by etcd: no key is read. A
        // delay written before markers existed counts as held until it expires.
        // The runnable runs of the kinds other than the default, in families of their own.
        for family in [
            self.keys.blocks(),
            self.keys.delays(),
            self.keys.kinds_family(),
            self.keys.priorities_family(),
        ] {
            ops.push(Self::count_op(family.clone(), prefix_end(&family)));
        }
        let response = self.txn(Txn::new().and_then(ops)).await?;
        let blocks = counted(&response, 5);
        let delayed = counted(&response, 6).min(blocks);
        let held = blocks - delayed;
        let runnable = counted(&response, 0) + counted(&response, 7) + counted(&response, 8);
        let cap = |n: u64| n.min(MAX_COUNT);
        let mut counts = RunCounts::default();
        counts.claimable = cap(runnable.saturating_sub(held + delayed));
        counts.held = cap(held);
        counts.delayed = cap(delayed);
        counts.suspended = cap(counted(&response, 1));
        counts.completed = cap(counted(&response, 2));
        counts.failed = cap(counted(&response, 3));
        counts.cancelled = cap(counted(&response, 4));
        Ok(counts)
    }

    pub(super) async fn count_purgeable_runs(&self, older_than: Duration) -> Result<u64> {
        check_purge(older_than, 1)?;
        let ops: Vec<TxnOp> = self
            .purgeable_ranges(older_than)
            .into_iter()
            .map(|(from, to)| Self::count_op(from, to))
            .collect();
        let response = self.txn(Txn::new().and_then(ops)).await?;
        Ok((0..3).map(|i| counted(&response, i)).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use crate::rpc::{DeleteOptions, TxnOp};
    use lease_conformance::fixtures::etcd::{EtcdCluster, HINT, MEMBERS};
    use lease_core::{LeaseStore, ListFilter, RunId, RunState, Ttl, WorkerId};

    /// A prefix written before the state families existed (its records have no state entry,
    /// its binding no flag) gets them at the next connect: `list` by state then finds every
    /// run, in id order, reading only the state's own entries.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn list_by_state_reads_the_state_family_after_a_backfill() {
        let Some(cluster) = lease_conformance::fixtures::required(
            "etcd cluster",
            EtcdCluster::start().map_err(|e| e.to_string()),
            HINT,
        ) else {
            return;
        };
        let endpoints: Vec<String> = (0..MEMBERS).map(|i| cluster.endpoint(i)).collect();
        let config = EtcdConfig::new(endpoints, "states").unwrap();
        let old = EtcdLeaseStore::connect(config.clone()).await.unwrap();
        let runs: Vec<RunId> = (0..30)
            .map(|i| RunId::new(format!("r{i:02}")).unwrap())
            .collect();
        for r in old.create_many(&runs).await.unwrap() {
            r.unwrap();
        }
        let w = WorkerId::new("w").unwrap();
        for run in &runs[..10] {
            let lease = old
                .claim(run, &w, Ttl::from_secs(30).unwrap())
                .await
                .unwrap();
            old.suspend(&lease).await.unwrap();
        }
        // As an older release left it: no state entries, a binding without the flag.
        let family = old.keys.state_family(RunState::Runnable);
        let family = (family[..family.len() - 1].to_vec(), {
            let mut end = family[..family.len() - 1].to_vec();
            end.push(0xff);
            end
        });
        let meta = old.keys.meta();
        let binding = format!("{} 1", old.cluster).into_bytes();
        old.txn(Txn::new().and_then([
            TxnOp::delete(family.0, Some(DeleteOptions::new().with_range(family.1))),
            TxnOp::put(meta, binding, None),
        ]))
        .await
        .unwrap();

        let store = EtcdLeaseStore::connect(config).await.unwrap();
        assert!(store.watch.states.load(Ordering::Relaxed));
        let suspended = store
            .list(
                &ListFilter::default()
                    .with_state(RunState::Suspended)
                    .with_limit(100),
            )
            .await
            .unwrap();
        let ids: Vec<&str> = suspended.iter().map(|r| r.run.as_str()).collect();
        let expected: Vec<&str> = runs[..10].iter().map(RunId::as_str).collect();
        assert_eq!(ids, expected);
        // Paged by the id cursor, in order.
        let page = store
            .list(
                &ListFilter::default()
                    .with_state(RunState::Runnable)
                    .with_limit(5)
                    .with_after(runs[20].clone()),
            )
            .await
            .unwrap();
        let ids: Vec<&str> = page.iter().map(|r| r.run.as_str()).collect();
        assert_eq!(ids, ["r21", "r22", "r23", "r24", "r25"]);
        // A run that changes state moves family with the same write.
        let lease = store.claim(&runs[0], &w, Ttl::from_secs(30).unwrap()).await;
        assert!(lease.is_err(), "suspended runs are not claimable");
        store.resume(&runs[0]).await.unwrap();
        let suspended = store
            .list(
                &ListFilter::default()
                    .with_state(RunState::Suspended)
                    .with_limit(100),
            )
            .await
            .unwrap();
        assert_eq!(suspended.len(), 9);
    }
}
