//! The read-decide-compare loop under every write: reads of records and blocks, plans, and
//! their conditional commits in nested transactions.

use std::time::Duration;

use crate::rpc::{
    Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use lease_core::{Error, Result, RunId};

use std::sync::atomic::Ordering;

use super::{
    now_micros, EtcdLeaseStore, Floor, Plan, Seen, CHUNK, CHUNK_BYTES, MAX_TXN_OPS, ROUNDS,
};
use crate::codec::Rec;
use crate::error::BACKEND;

impl EtcdLeaseStore {
    /// Reads the records and block keys of `runs` (chunked; each chunk one consistent read).
    pub(super) async fn read(&self, runs: &[&RunId]) -> Result<Vec<Seen>> {
        let chunks = futures_util::future::try_join_all(
            runs.chunks(CHUNK).map(|chunk| self.read_chunk(chunk)),
        )
        .await?;
        let seen: Vec<Seen> = chunks.into_iter().flatten().collect();
        if seen.len() != runs.len() {
            return Err(Error::backend(BACKEND, "etcd answered a read short"));
        }
        Ok(seen)
    }

    pub(super) async fn read_chunk(&self, chunk: &[&RunId]) -> Result<Vec<Seen>> {
        let mut ops = Vec::with_capacity(chunk.len() * 2);
        for run in chunk {
            ops.push(TxnOp::get(self.keys.record(run.as_str()), None));
            ops.push(TxnOp::get(self.keys.block(run.as_str()), None));
        }
        let response = self.txn(Txn::new().and_then(ops)).await?;
        response
            .op_responses()
            .chunks(2)
            .map(|pair| Seen::parse(pair.first(), pair.get(1)))
            .collect()
    }

    /// Runs each plan as its own conditional write, chunked into nested transactions; returns
    /// which held their compares.
    pub(super) async fn execute<T>(&self, plans: Vec<Plan<T>>) -> Result<Vec<Option<T>>> {
        let mut chunks: Vec<Vec<Plan<T>>> = Vec::new();
        let mut chunk: Vec<Plan<T>> = Vec::new();
        let (mut bytes, mut ops) = (0, 0);
        for plan in plans {
            let cost = plan.ops.len() + plan.compares.len() + 1 + usize::from(plan.wake.is_some());
            if !chunk.is_empty() && (ops + cost > MAX_TXN_OPS || bytes + plan.bytes > CHUNK_BYTES) {
                chunks.push(std::mem::take(&mut chunk));
                bytes = 0;
                ops = 0;
            }
            bytes += plan.bytes;
            ops += cost;
            chunk.push(plan);
        }
        if !chunk.is_empty() {
            chunks.push(chunk);
        }
        // Chunks are independent commits (each item is judged on its own): sent together.
        let outs =
            futures_util::future::try_join_all(chunks.into_iter().map(|c| self.commit(c))).await?;
        Ok(outs.into_iter().flatten().collect())
    }

    pub(super) async fn commit<T>(&self, chunk: Vec<Plan<T>>) -> Result<Vec<Option<T>>> {
        if chunk.len() == 1 {
            let plan = chunk.into_iter().next().expect("one plan");
            let mut ops = plan.ops;
            ops.extend(plan.wake.map(|(kind, ms)| self.wake_op(&kind, ms)));
            let response = self
                .txn(Txn::new().when(plan.compares).and_then(ops))
                .await?;
            return Ok(vec![response.succeeded().then_some(plan.out)]);
        }
        let mut outs = Vec::with_capacity(chunk.len());
        let mut nested = Vec::with_capacity(chunk.len());
        // One put per kind, beside the nested transactions (etcd refuses a key put twice in
        // one request), whether or not each one's compare holds: a wake-up is a hint, and an
        // item whose compare failed is decided again and wakes again.
        let mut wakes: std::collections::BTreeMap<String, u64> = Default::default();
        for plan in chunk {
            nested.push(TxnOp::txn(
                Txn::new().when(plan.compares).and_then(plan.ops),
            ));
            outs.push(plan.out);
            if let Some((kind, ms)) = plan.wake {
                let soonest = wakes.entry(kind).or_insert(ms);
                *soonest = (*soonest).min(ms);
            }
        }
        let items = nested.len();
        nested.extend(wakes.iter().map(|(kind, ms)| self.wake_op(kind, *ms)));
        let response = self.txn(Txn::new().and_then(nested)).await?;
        let mut answers = response.op_responses();
        answers.truncate(items);
        if answers.len() != outs.len() {
            return Err(Error::backend(BACKEND, "etcd answered a batch short"));
        }
        Ok(outs
            .into_iter()
            .zip(answers)
            .map(|(out, answer)| match answer {
                TxnOpResponse::Txn(inner) if inner.succeeded() => Some(out),
                _ => None,
            })
            .collect())
    }

    /// Reads, decides and writes each run until its compares hold: the heart of every write.
    /// `plan` sees the run as read and either refuses (a verdict) or plans a write; a write
    /// whose compares failed (the run changed in between) is read and decided again.
    pub(super) async fn decide<T>(
        &self,
        runs: &[&RunId],
        mut plan: impl FnMut(usize, &Seen, u64) -> Result<Plan<T>>,
    ) -> Result<Vec<Result<T>>> {
        self.decide_at(runs, false, |i, seen, now, _| plan(i, seen, now))
            .await
    }

    /// [`decide`](Self::decide), the fence floor read afresh each round (with `floor`) and
    /// handed to `plan`, whose write compares it (see [`floor_unchanged`](Self::floor_unchanged)).
    pub(super) async fn decide_at<T>(
        &self,
        runs: &[&RunId],
        floor: bool,
        mut plan: impl FnMut(usize, &Seen, u64, Floor) -> Result<Plan<T>>,
    ) -> Result<Vec<Result<T>>> {
        let mut results: Vec<Option<Result<T>>> = (0..runs.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..runs.len()).collect();
        for round in 0..ROUNDS {
            if round > 0 {
                tokio::time::sleep(Duration::from_millis(round as u64)).await;
            }
            let now = now_micros();
            let ids: Vec<&RunId> = pending.iter().map(|&i| runs[i]).collect();
            let at = if floor {
                self.floor().await?
            } else {
                Floor::default()
            };
            let seen = self.read(&ids).await?;
            let mut plans = Vec::new();
            let mut planned = Vec::new();
            for (&i, item) in pending.iter().zip(&seen) {
                match plan(i, item, now, at) {
                    Ok(p) => {
                        plans.push(p);
                        planned.push(i);
                    }
                    Err(refusal) => results[i] = Some(Err(refusal)),
                }
            }
            let outs = self.execute(plans).await?;
            let mut again = Vec::new();
            for (i, out) in planned.into_iter().zip(outs) {
                match out {
                    Some(out) => results[i] = Some(Ok(out)),
                    None => again.push(i),
                }
            }
            pending = again;
            if pending.is_empty() {
                break;
            }
        }
        Ok(results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(Error::unavailable(
                        BACKEND,
                        "the run kept changing under this write; retry",
                    ))
                })
            })
            .collect())
    }

    pub(super) async fn decide_one<T>(
        &self,
        run: &RunId,
        mut plan: impl FnMut(&Seen, u64) -> Result<Plan<T>>,
    ) -> Result<T> {
        self.decide(&[run], |_, seen, now| plan(seen, now))
            .await?
            .pop()
            .expect("one result per run")
    }

    /// The fence floor as it stands: the highest fence of any purged run, and the revision
    /// that wrote it (0: never written, floor 0).
    pub(super) async fn floor(&self) -> Result<Floor> {
        let response = self
            .txn(Txn::new().and_then([TxnOp::get(self.keys.floor(), None)]))
            .await?;
        let mut floor = Floor::default();
        if let Some(TxnOpResponse::Get(get)) = response.op_responses().first() {
            if let Some(kv) = get.kvs().first() {
                floor.fence = std::str::from_utf8(kv.value())
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| Error::backend(BACKEND, "the fence floor is not a number"))?;
                floor.rev = kv.mod_revision();
            }
        }
        Ok(floor)
    }

    /// The compare that the fence floor is still `floor`.
    pub(super) fn floor_unchanged(&self, floor: Floor) -> Compare {
        Compare::mod_revision(self.keys.floor(), CompareOp::Equal, floor.rev)
    }

    /// The compare that the record is as read.
    pub(super) fn unchanged(&self, run: &str, seen: &Seen) -> Compare {
        let key = self.keys.record(run);
        if seen.rev == 0 {
            Compare::create_revision(key, CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(key, CompareOp::Equal, seen.rev)
        }
    }

    /// The ops that replace `old` with `new` (record and index).
    pub(super) fn rewrite(&self, run: &str, old: Option<&Rec>, new: &Rec) -> Vec<TxnOp> {
        let mut ops = vec![TxnOp::put(self.keys.record(run), new.encode(), None)];
        let position = |rec: &Rec| {
            rec.state.map(|s| {
                self.keys
                    .index(s, rec.kind.as_deref(), rec.priority, rec.since, run)
            })
        };
        let (from, to) = (old.and_then(position), position(new));
        if from != to {
            if let Some(from) = from {
                ops.push(TxnOp::delete(from, None));
            }
            if let Some(to) = to {
                ops.push(TxnOp::put(to, Vec::new(), None));
            }
        }
        // The runs of each state by id, for `list` by state: moved when the state changes.
        let (was, is) = (old.and_then(|r| r.state), new.state);
        if was != is {
            if let Some(was) = was {
                ops.push(TxnOp::delete(self.keys.state_entry(was, run), None));
            }
            if let Some(is) = is {
                ops.push(TxnOp::put(self.keys.state_entry(is, run), Vec::new(), None));
            }
        }
        ops
    }

    pub(super) fn plan<T>(
        &self,
        run: &str,
        seen: &Seen,
        new: &Rec,
        extra: Vec<TxnOp>,
        out: T,
    ) -> Plan<T> {
        let old = seen.rec.as_ref().filter(|r| r.state.is_some());
        let mut ops = self.rewrite(run, old, new);
        let bytes = extra.len() * 64;
        ops.extend(extra);
        // A run that becomes claimable (created, released, given back with a delay,
        // resumed, force-released) wakes its kind's workers; a claim, a renewal, a moved
        // index entry do not.
        let claimable =
            |r: &Rec| r.state == Some(lease_core::RunState::Runnable) && r.owner.is_none();
        let wake = (claimable(new) && !old.is_some_and(claimable)).then(|| {
            let kind = new
                .kind
                .clone()
                .unwrap_or_else(|| lease_core::DEFAULT_KIND.to_owned());
            (kind, new.since.saturating_sub(now_micros()) / 1000)
        });
        Plan {
            compares: vec![self.unchanged(run, seen)],
            ops,
            bytes,
            out,
            wake,
        }
    }

    /// The put of `kind`'s wake key: the milliseconds until its run is claimable.
    fn wake_op(&self, kind: &str, ms: u64) -> TxnOp {
        TxnOp::put(self.keys.wake(kind), ms.to_string(), None)
    }

    pub(super) fn put_block(&self, run: &str, held: bool, lease: i64) -> TxnOp {
        let value = if held { b"h".to_vec() } else { b"d".to_vec() };
        TxnOp::put(
            self.keys.block(run),
            value,
            Some(PutOptions::new().with_lease(lease)),
        )
    }

    /// A delay's block and its marker, both on the delay's lease.
    pub(super) fn put_delay(&self, run: &str, lease: i64) -> [TxnOp; 2] {
        [
            self.put_block(run, false, lease),
            TxnOp::put(
                self.keys.delay(run),
                Vec::new(),
                Some(PutOptions::new().with_lease(lease)),
            ),
        ]
    }

    /// Deletes the block and the delay marker, whichever exists.
    pub(super) fn delete_block(&self, run: &str) -> [TxnOp; 2] {
        [
            TxnOp::delete(self.keys.block(run), None),
            TxnOp::delete(self.keys.delay(run), None),
        ]
    }

    /// The record as etcd judges it at `now`: an expiry etcd has not yet reached is shown
    /// Ranges `[from, to)`, up to `limit` keys (0: all), keys only unless `values`.
    pub(super) async fn range(
        &self,
        from: Vec<u8>,
        to: Vec<u8>,
        limit: i64,
        values: bool,
        revision: i64,
    ) -> Result<crate::rpc::GetResponse> {
        let mut options = GetOptions::new().with_range(to).with_limit(limit);
        if !values {
            options = options.with_keys_only();
        }
        if revision > 0 {
            options = options.with_revision(revision);
        }
        self.guard().await?;
        let floor = self.floor.load(Ordering::SeqCst);
        let response = self
            .call("a range read", move |mut l| {
                let (from, options) = (from.clone(), options.clone());
                async move { l.kv.get(from, Some(options)).await }
            })
            .await?;
        self.check_header(response.header(), floor)?;
        Ok(response)
    }

    /// How many keys `[from, to)` holds.
    pub(super) fn count_op(from: Vec<u8>, to: Vec<u8>) -> TxnOp {
        TxnOp::get(
            from,
            Some(GetOptions::new().with_range(to).with_count_only()),
        )
    }
}

/// Where the next page of a range starts: just past its last key, if etcd said there is more.
pub(super) fn next_page(page: &crate::rpc::GetResponse) -> Option<Vec<u8>> {
    match page.kvs().last() {
        Some(last) if page.more() => {
            let mut from = last.key().to_vec();
            from.push(0);
            Some(from)
        }
        _ => None,
    }
}

pub(super) fn counted(response: &TxnResponse, i: usize) -> u64 {
    match response.op_responses().get(i) {
        Some(TxnOpResponse::Get(get)) => get.count().max(0) as u64,
        _ => 0,
    }
}
