//! Fenced writes: ends (one or a batch) and journal appends.

use std::time::Duration;

use crate::rpc::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use lease_core::{
    End, Ending, Error, Fence, IdempotencyKey, JournalEntry, Lease, Result, RunId, StoreTime,
};

use super::grants::delay_bucket;
use super::{judged, now_micros, EtcdLeaseStore, Plan, Seen, ROUNDS};
use crate::codec::{decode_entry, encode_entry};
use crate::error::BACKEND;
use lease_core::machine::{Applied, Op};
use lease_runtime::observe::count_stale;

impl EtcdLeaseStore {
    /// The end of a lease (`end` already checked), planned against what was read.
    pub(super) fn end_plan(
        &self,
        lease: &Lease,
        end: &End,
        delay_lease: i64,
        seen: &Seen,
        now: u64,
    ) -> Result<Plan<()>> {
        let run = lease.run();
        // The end as the machine makes it: the attempt archived, the state, the refund of a
        // voluntary end, the reason; then etcd's timing.
        let (mut new, applied) = count_stale(judged::step(run, seen, Op::End { lease, end }, now))?;
        let Applied::Ended { journal } = applied else {
            unreachable!("an end answers Ended")
        };
        // Timed by etcd on the bucket's grid: the run is claimable from then, not earlier.
        let delay = delay_secs(end) * 1_000_000;
        // A delay longer than `max_lease` is timed in links: the first now, the rest re-armed.
        let link = if delay > 0 {
            self.link(delay_secs(end) as i64) as u64 * 1_000_000
        } else {
            0
        };
        new.rest = (delay - link) / 1000;
        new.since = now + link;
        new.not_before = if delay > 0 { now + delay } else { 0 };
        let mut extra = Vec::new();
        let mut bytes = 0;
        if let Some(payload) = journal {
            new.journal_len += 1;
            bytes = payload.len();
            extra.push(TxnOp::put(
                self.keys.entry(run.as_str(), new.journal_len),
                encode_entry(new.fence, now, payload),
                None,
            ));
        }
        if delay > 0 {
            // The block key replaces the deleted one: the delay is timed by etcd.
            extra.extend(self.put_delay(run.as_str(), delay_lease));
        } else {
            extra.extend(self.delete_block(run.as_str()));
        }
        let mut plan = self.plan(run.as_str(), seen, &new, extra, ());
        plan.bytes += bytes;
        Ok(plan)
    }

    pub(super) async fn end_each(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        let delays: Vec<i64> = ends
            .iter()
            .map(|e| match delay_secs(&e.end) {
                0 => 0,
                secs => self.link(secs as i64),
            })
            .collect();
        let wanted: Vec<i64> = delays.iter().copied().filter(|&s| s > 0).collect();
        let mut granted = self.grant(&wanted).await?.into_iter();
        let leases: Vec<i64> = delays
            .iter()
            .map(|&s| {
                if s > 0 {
                    granted.next().unwrap_or(0)
                } else {
                    0
                }
            })
            .collect();
        let runs: Vec<&RunId> = ends.iter().map(|e| e.lease.run()).collect();
        self.decide(&runs, |i, seen, now| {
            self.end_plan(&ends[i].lease, &ends[i].end, leases[i], seen, now)
        })
        .await
    }

    pub(super) async fn end_one(&self, lease: &Lease, end: End) -> Result<()> {
        self.end_each(&[Ending::new(lease.clone(), end)])
            .await?
            .pop()
            .expect("one result")
    }

    /// Appends `payload` under `lease`; with a key, once: a key already used answers its entry.
    pub(super) async fn append_entry(
        &self,
        lease: &Lease,
        key: Option<&IdempotencyKey>,
        payload: &[u8],
    ) -> Result<JournalEntry> {
        let run = lease.run();
        let Some(key) = key else {
            return self
                .decide_one(run, |seen, now| {
                    self.append_plan(lease, None, payload, seen, now)
                })
                .await;
        };
        let index = self.keys.idempotency(run.as_str(), key.as_str());
        let reads = || {
            [
                TxnOp::get(self.keys.record(run.as_str()), None),
                TxnOp::get(self.keys.block(run.as_str()), None),
                TxnOp::get(index.clone(), None),
            ]
        };
        // One read of the record, its block and the key; then the append, whose compares
        // are that the record is as read and the key unused. When they fail, the same
        // transaction reads all three again: a key another call wrote in between answers at
        // once (that call's entry), and only a record changed by an unkeyed write is decided
        // again.
        let mut response = self.txn(Txn::new().and_then(reads())).await?;
        for round in 0..ROUNDS {
            if round > 0 {
                tokio::time::sleep(Duration::from_millis(round as u64)).await;
            }
            let answers = response.op_responses();
            let seen = Seen::parse(answers.first(), answers.get(1))?;
            if let Some(seq) = used_seq(answers.get(2)) {
                return self.keyed_answer(lease, &seen, seq).await;
            }
            let plan = self.append_plan(lease, Some(&index), payload, &seen, now_micros())?;
            response = self
                .txn(
                    Txn::new()
                        .when(plan.compares)
                        .and_then(plan.ops)
                        .or_else(reads()),
                )
                .await?;
            if response.succeeded() {
                return Ok(plan.out);
            }
        }
        Err(Error::unavailable(
            BACKEND,
            "the run kept changing under this append; retry",
        ))
    }

    /// The append of one entry, planned against what was read.
    fn append_plan(
        &self,
        lease: &Lease,
        index: Option<&Vec<u8>>,
        payload: &[u8],
        seen: &Seen,
        now: u64,
    ) -> Result<Plan<JournalEntry>> {
        let run = lease.run();
        let rec = seen.writable(lease)?;
        let mut new = rec.clone();
        new.journal_len += 1;
        let seq = new.journal_len;
        let mut extra = vec![TxnOp::put(
            self.keys.entry(run.as_str(), seq),
            encode_entry(rec.fence, now, payload),
            None,
        )];
        let mut compares = Vec::new();
        if let Some(index) = index {
            extra.push(TxnOp::put(index.clone(), seq.to_be_bytes().to_vec(), None));
            compares.push(Compare::create_revision(index.clone(), CompareOp::Equal, 0));
        }
        let out = JournalEntry::new(
            seq,
            lease.fence(),
            payload.to_vec(),
            StoreTime::from_micros(now),
        );
        let mut plan = self.plan(run.as_str(), seen, &new, extra, out);
        plan.compares.extend(compares);
        plan.bytes += payload.len();
        Ok(plan)
    }

    /// The entry a used key names, once the fence is checked: a used key never lets a stale
    /// or forged fence through (entries never change until purge).
    async fn keyed_answer(&self, lease: &Lease, seen: &Seen, seq: u64) -> Result<JournalEntry> {
        let run = lease.run();
        if lease.fence().get() != seen.live(run)?.fence {
            seen.writable(lease)?;
        }
        let entry = self.keys.entry(run.as_str(), seq);
        let got = self
            .call("a read", move |mut l| {
                let entry = entry.clone();
                async move { l.kv.get(entry, None).await }
            })
            .await?;
        let kv = got
            .kvs()
            .first()
            .ok_or_else(|| Error::backend(BACKEND, "an idempotency key names a missing entry"))?;
        let (fence, at, payload) = decode_entry(kv.value())?;
        Ok(JournalEntry::new(
            seq,
            Fence::new(fence)?,
            payload,
            StoreTime::from_micros(at),
        ))
    }
}

/// The seq a used idempotency key holds.
fn used_seq(answer: Option<&TxnOpResponse>) -> Option<u64> {
    match answer {
        Some(TxnOpResponse::Get(get)) => get
            .kvs()
            .first()
            .and_then(|kv| <[u8; 8]>::try_from(kv.value()).ok().map(u64::from_be_bytes)),
        _ => None,
    }
}

/// The seconds etcd delays `end` by: its delay rounded up to the delay grid (0: none).
fn delay_secs(end: &End) -> u64 {
    match end.delay_millis() {
        0 => 0,
        ms => delay_bucket(ms.div_ceil(1000)),
    }
}
