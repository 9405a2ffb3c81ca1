//! The operator's calls by run id (resume, force-release, cancel), and the reads (inspect,
//! list, count) and retention (purge) of [`RedisLeaseStore`]: its [`LeaseStore`] methods call
//! these.

use std::time::Duration;

use lease_core::backend::{check_create_batch, check_list, check_purge};
use lease_core::{EndedStates, Error, ListFilter, Result, RunId, RunRecord, RunState};

use crate::call::Call;
use crate::keys::{self, Class};
use crate::link::lock;
use crate::reply::Reply;
use crate::store::{
    RedisLeaseStore, KIND_RESENDS, LIST_SCAN, PURGE_SCAN, PURGE_SCRIPT_RUNS, SCRIPTS,
};

impl RedisLeaseStore {
    pub(crate) async fn resume_run(&self, run: &RunId) -> Result<RunRecord> {
        let encoded = keys::encode(run.as_str());
        let (reply, ack, _) = self
            .write_kinded("resume", &Class::default(), |kind| {
                let mut call = Call::new(&SCRIPTS.resume);
                call.key(self.keys.runs())
                    .key(self.keys.claimable_of(kind))
                    .key(self.keys.failures())
                    .key(self.keys.ended())
                    .key(self.keys.suspended())
                    .key(self.keys.attempts())
                    .key(self.keys.kinds())
                    .key(self.keys.unique())
                    .key(self.keys.unique_of())
                    .key(self.keys.waits())
                    .key(self.keys.deadlines())
                    .arg(&encoded)
                    .arg(kind.arg());
                call
            })
            .await?;
        match reply.status()? {
            "ok" => {
                ack.confirm()?;
                self.record(run, &reply)
            }
            "none" => Err(Error::NotFound { run: run.clone() }),
            "refused" => Err(Error::NotSuspended {
                run: run.clone(),
                state: reply.state(1)?,
            }),
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }

    pub(crate) async fn inspect_run(&self, run: &RunId) -> Result<RunRecord> {
        let mut call = Call::new(&SCRIPTS.inspect);
        call.key(self.keys.runs())
            .key(self.keys.failures())
            .key(self.keys.attempts())
            .key(self.keys.payloads())
            .key(self.keys.kinds())
            .key(self.keys.ended())
            .key(self.keys.history())
            .key(self.keys.waits())
            .key(self.keys.resumed())
            .arg(keys::encode(run.as_str()));
        let reply = self.read("inspect", &call).await?;
        match reply.status()? {
            "ok" => {
                let mut record = self
                    .record(run, &reply)?
                    .with_payload(reply.payload(2 + Reply::RECORD_FIELDS)?.map(|p| p.to_vec()))
                    .with_history(reply.history(3 + Reply::RECORD_FIELDS)?)
                    .with_trace_parent(reply.trace_parent(5 + Reply::RECORD_FIELDS)?);
                record.resumed = reply.resumed(4 + Reply::RECORD_FIELDS)?;
                Ok(record)
            }
            "none" => Err(Error::NotFound { run: run.clone() }),
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }

    pub(crate) async fn inspect_runs(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        check_create_batch(runs)?; // the batch rule: at most MAX_BATCH ids
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let mut call = Call::new(&SCRIPTS.inspect_many);
        call.key(self.keys.runs())
            .key(self.keys.failures())
            .key(self.keys.attempts())
            .key(self.keys.payloads())
            .key(self.keys.kinds())
            .key(self.keys.ended())
            .key(self.keys.waits())
            .key(self.keys.resumed());
        for run in runs {
            call.arg(keys::encode(run.as_str()));
        }
        let reply = self.read("inspect_many", &call).await?;
        if reply.len() != runs.len() + 1 {
            return Err(reply.bad("expected the time and one record per run").into());
        }
        let now = reply.time(0)?;
        runs.iter()
            .enumerate()
            .map(|(i, run)| {
                let one = reply.nested(i + 1)?;
                Ok(if one.len() == 0 {
                    Err(Error::NotFound { run: run.clone() })
                } else {
                    let mut record = one
                        .record(run.clone(), 0, now)?
                        .with_payload(one.payload(Reply::RECORD_FIELDS)?.map(|p| p.to_vec()))
                        .with_trace_parent(one.trace_parent(Reply::RECORD_FIELDS + 2)?);
                    record.resumed = one.resumed(Reply::RECORD_FIELDS + 1)?;
                    Ok(record)
                })
            })
            .collect()
    }

    pub(crate) async fn list_runs(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        check_list(filter)?;
        let kind = filter
            .kind
            .as_ref()
            .map(|kind| format!("={}", keys::kind_arg(kind)))
            .unwrap_or_default();
        let queue = filter
            .queue
            .as_ref()
            .map(|queue| format!("={queue}"))
            .unwrap_or_default();
        let mut after = filter
            .after
            .as_ref()
            .map(|run| keys::encode(run.as_str()))
            .unwrap_or_default();
        let mut out = Vec::new();
        // Page through the ids, LIST_SCAN at a time, so no one script call scans the whole
        // namespace however selective the filter is.
        while out.len() < filter.limit {
            let mut call = Call::new(&SCRIPTS.list);
            call.key(self.keys.ids())
                .key(self.keys.runs())
                .key(self.keys.failures())
                .key(self.keys.attempts())
                .key(self.keys.kinds())
                .key(self.keys.ended())
                .key(self.keys.waits())
                .arg(&after)
                .arg(filter.limit - out.len())
                .arg(filter.state.map_or("", RunState::as_str))
                .arg(if filter.expired { "1" } else { "0" })
                .arg(LIST_SCAN)
                .arg(&kind)
                .arg(&queue);
            let reply = self.read("list", &call).await?;
            let now = reply.time(0)?;
            let stride = 1 + Reply::RECORD_FIELDS; // the id, then the record
            if reply.len() < 2 || (reply.len() - 2) % stride != 0 {
                return Err(reply
                    .bad("expected a cursor and records of an id and ten fields")
                    .into());
            }
            for i in (2..reply.len()).step_by(stride) {
                out.push(reply.record(keys::decode(reply.str(i)?)?, i + 1, now)?);
            }
            let cursor = reply.str(1)?;
            if cursor.is_empty() {
                break;
            }
            after = cursor.to_owned();
        }
        Ok(out)
    }

    /// Folds the purged runs' fences an older release kept (a hash, one field per purged id)
    /// into the fence floor, a page per call, and leaves the format marker in their place
    /// (`lua/fold_tombstones.lua`); refuses a namespace whose marker names a later format than
    /// [`FORMAT`](crate::keys::FORMAT), and raises an earlier one's. Runs at connect, before
    /// the store serves: a namespace written by the older release keeps its guarantee, and its
    /// storage shrinks to one key.
    pub(crate) async fn fold_tombstones(&self) -> Result<()> {
        let mut cursor = "0".to_owned();
        loop {
            let mut call = Call::new(&SCRIPTS.fold_tombstones);
            call.key(self.keys.tombstones())
                .key(self.keys.floor())
                .arg(&cursor)
                .arg(crate::keys::FORMAT)
                .arg(crate::keys::FORMAT_MARKER);
            let (reply, ack) = self.write("fold_tombstones", &call).await?;
            if reply.str(0)? == "newer" {
                return Err(crate::error::RedisError::Config(format!(
                    "namespace {:?} is at {:?}, newer than this release's format {}: a later \
                     release wrote it; upgrade this program (or use another namespace) before \
                     it reads or writes the runs there",
                    self.config().namespace(),
                    reply.str(1)?,
                    crate::keys::FORMAT
                ))
                .into());
            }
            if reply.parse::<u8>(1)? == 1 {
                ack.confirm()?;
            }
            match reply.str(0)? {
                "done" => return Ok(()),
                next => cursor = next.to_owned(),
            }
        }
    }

    /// Where the next purge of `states` looks from in the ended index (see
    /// [`purge_runs`](RedisLeaseStore::purge_runs)).
    fn purge_from(&self, states: EndedStates) -> (String, String) {
        let from = lock(&self.purge_from);
        from.get(&states.bits())
            .cloned()
            .unwrap_or_else(|| ("-inf".to_owned(), String::new()))
    }

    fn set_purge_from(&self, states: EndedStates, score: &str, member: &str) {
        let mut from = lock(&self.purge_from);
        from.insert(states.bits(), (score.to_owned(), member.to_owned()));
    }

    /// Purges runs ended in `states`: see [`LeaseStore::purge_ended`]. The ended index holds
    /// every ended state in one order, so a purge of some states passes over the others; it
    /// looks at most [`PURGE_SCAN`] entries per script call, and remembers (in this store,
    /// per set of states) where the entries it passed over end, so that the next purge of the
    /// same states starts after them: failed runs kept for a week do not make the purge of
    /// completed runs read them again every minute.
    pub(crate) async fn purge_runs(
        &self,
        states: EndedStates,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<RunId>> {
        check_purge(older_than, max)?;
        let age_ms = older_than.as_millis() as u64; // at most MAX_PURGE_AGE, checked
        let mut purged = Vec::new();
        // Script calls of at most PURGE_SCRIPT_RUNS runs, so one never holds the server for
        // more than a few milliseconds whatever `max` is.
        while purged.len() < max {
            let chunk = (max - purged.len()).min(PURGE_SCRIPT_RUNS);
            // Two calls: the candidates (a read), then their removal with every key declared
            // (a Cluster checks declared keys), each run checked again under the write.
            let (score, member) = self.purge_from(states);
            let mut due = Call::new(&SCRIPTS.purge_due);
            due.key(self.keys.ended())
                .key(self.keys.runs())
                .arg(age_ms)
                .arg(chunk)
                .arg(states.bits())
                .arg(score.as_str())
                .arg(member.as_str())
                .arg(PURGE_SCAN);
            let reply = self.read("purge_due", &due).await?;
            if states != EndedStates::ALL {
                self.set_purge_from(states, reply.str(0)?, reply.str(1)?);
            }
            // The candidates follow where to look from and whether the scan stopped at its
            // bound (entries of other states passed over: more may be due).
            let more = reply.str(2)? == "1";
            let found = reply.len().saturating_sub(3);
            if found == 0 {
                if more {
                    continue;
                }
                break;
            }
            let candidates = (3..found + 3)
                .map(|i| {
                    let encoded = reply.str(i)?;
                    Ok((encoded.to_owned(), keys::decode(encoded)?))
                })
                .collect::<Result<Vec<_>>>()?;
            let removed = self.remove_ended(age_ms, &candidates).await?;
            purged.extend(removed);
            if found < chunk && !more {
                break;
            }
        }
        Ok(purged)
    }

    /// Removes those of `runs` (at most [`PURGE_SCRIPT_RUNS`] a script call) that ended at
    /// least `age_ms` ago, in one script with every key declared (a Cluster checks declared
    /// keys), each run checked again under the write; the ids removed.
    async fn remove_ended(&self, age_ms: u64, runs: &[(String, RunId)]) -> Result<Vec<RunId>> {
        let mut removed = Vec::new();
        for chunk in runs.chunks(PURGE_SCRIPT_RUNS) {
            let mut call = Call::new(&SCRIPTS.purge);
            call.key(self.keys.runs())
                .key(self.keys.ended())
                .key(self.keys.ids())
                .key(self.keys.floor())
                .key(self.keys.failures())
                .key(self.keys.claimable())
                .key(self.keys.attempts())
                .key(self.keys.cancelled())
                .key(self.keys.payloads())
                .key(self.keys.kinds())
                .key(self.keys.history())
                .key(self.keys.unique())
                .key(self.keys.unique_of())
                .key(self.keys.waits())
                .key(self.keys.deadlines())
                .key(self.keys.resumed())
                .arg(age_ms);
            for (encoded, run) in chunk {
                call.key(self.keys.journal(run))
                    .key(self.keys.calls(run))
                    .key(self.keys.journal_keys(run))
                    .arg(encoded.as_str());
            }
            let (reply, ack) = self.write("purge", &call).await?;
            let gone = (0..reply.len())
                .map(|i| Ok(keys::decode(reply.str(i)?)?))
                .collect::<Result<Vec<RunId>>>()?;
            if !gone.is_empty() {
                ack.confirm()?;
            }
            removed.extend(gone);
        }
        Ok(removed)
    }

    /// Removes those of `runs` that ended, whatever their age: see
    /// [`LeaseStore::purge_ids`].
    pub(crate) async fn purge_ids_now(&self, runs: &[RunId]) -> Result<Vec<RunId>> {
        lease_core::backend::check_create_batch(runs)?;
        let mut seen = std::collections::HashSet::new();
        let runs: Vec<(String, RunId)> = runs
            .iter()
            .filter(|run| seen.insert(*run))
            .map(|run| (keys::encode(run.as_str()), run.clone()))
            .collect();
        self.remove_ended(0, &runs).await
    }

    pub(crate) async fn count_runs(&self) -> Result<lease_core::RunCounts> {
        // The kinds first, then one count over every kind's index, which checks that no kind
        // was added in between (else it is read again).
        let mut tries = 0;
        let reply = loop {
            let classes = self.created_classes().await?;
            let mut call = Call::new(&SCRIPTS.count);
            call.key(self.keys.claimable())
                .key(self.keys.delayed())
                .key(self.keys.suspended())
                .key(self.keys.ended())
                .key(self.keys.failures())
                .key(self.keys.cancelled())
                .key(self.keys.kind_set())
                .arg(classes.len())
                .arg(lease_core::LONGEST_HELD_SCAN);
            for class in &classes {
                call.key(self.keys.claimable_of(class));
            }
            call.key(self.keys.runs()).key(self.keys.deadlines());
            let reply = self.read("count", &call).await?;
            if reply.str(0).ok() != Some("kinds") {
                break reply;
            }
            tries += 1;
            if tries > KIND_RESENDS {
                return Err(reply.bad("kinds kept being added during the count").into());
            }
        };
        let figure =
            |i: usize| -> Result<u64> { Ok(reply.parse::<u64>(i)?.min(lease_core::MAX_COUNT)) };
        let mut counts = lease_core::RunCounts::default();
        counts.claimable = figure(0)?;
        counts.held = figure(1)?;
        counts.delayed = figure(2)?;
        counts.suspended = figure(3)?;
        counts.completed = figure(4)?;
        counts.failed = figure(5)?;
        counts.cancelled = figure(6)?;
        counts.oldest_claimable_age = match reply.str(7)? {
            "" => None,
            _ => Some(Duration::from_micros(reply.parse::<u64>(7)?)),
        };
        counts.longest_held = match reply.str(8)? {
            "" => None,
            _ => Some(Duration::from_micros(reply.parse::<u64>(8)?)),
        };
        Ok(counts)
    }

    /// Every class but the default (the default kind at priority 0 in the default queue) that a
    /// run was created with: the kinds set, which never shrinks (`lua/kinds.lua`).
    async fn created_classes(&self) -> Result<Vec<Class>> {
        let mut names = Call::new(&SCRIPTS.kinds);
        names.key(self.keys.kind_set());
        let names = self.read("kinds", &names).await?;
        Ok((0..names.len())
            .map(|i| names.class(i))
            .collect::<Result<Vec<_>, _>>()?)
    }

    /// Stores `queue` as paused or not (`lua/pause_queue.lua`), confirmed as a create is.
    pub(crate) async fn set_paused(
        &self,
        queue: &lease_core::Queue,
        paused: bool,
    ) -> Result<lease_core::QueueState> {
        let mut call = Call::new(&SCRIPTS.pause_queue);
        call.key(self.keys.queues())
            .arg(queue.as_str())
            .arg(if paused { "1" } else { "0" });
        let (reply, ack) = self.write("pause_queue", &call).await?;
        if reply.len() != 2 {
            return Err(reply.bad("expected a flag and a time").into());
        }
        let state =
            lease_core::QueueState::new(queue.clone(), reply.str(0)? == "1", Some(reply.time(1)?));
        ack.confirm()?;
        tracing::info!(%queue, paused, "queue state stored");
        Ok(state)
    }

    /// Wakes the idle workers of the kinds with runs in `queue`: one message per class of the
    /// queue (the classes every create records), as the scripts' `wake` sends them. A hint:
    /// a message lost, or refused by the user's ACL, costs a worker its fallback poll.
    pub(crate) async fn wake_queue(&self, queue: &lease_core::Queue) -> Result<()> {
        let classes = std::iter::once(Class::default()).chain(self.created_classes().await?);
        let prefix = format!("{}:claimable", self.keys.tag());
        for class in classes.filter(|class| class.queue == *queue) {
            let key = self.keys.claimable_of(&class);
            let suffix = key.strip_prefix(&prefix).unwrap_or_default();
            let mut publish = redis::cmd("PUBLISH");
            publish
                .arg(self.keys.wake_channel())
                .arg(format!("{suffix} 0"));
            if let Err(e) = self.link.command(&publish).await {
                tracing::debug!(error = %e, %queue, "a resumed queue's wake-up was not sent");
                break;
            }
        }
        Ok(())
    }

    /// Every queue ever paused or resumed (`lua/queues.lua`), and every queue with runnable
    /// runs (never paused: no time), by name.
    pub(crate) async fn queue_states(&self) -> Result<Vec<lease_core::QueueState>> {
        let mut call = Call::new(&SCRIPTS.queues);
        call.key(self.keys.queues());
        let reply = self.read("queues", &call).await?;
        if reply.len() % 3 != 0 {
            return Err(reply.bad("expected groups of name, flag, time").into());
        }
        let mut states = (0..reply.len())
            .step_by(3)
            .map(|i| {
                let queue = lease_core::Queue::new(reply.str(i)?)
                    .map_err(|e| reply.bad(format!("element {i}: {e}")))?;
                Ok(lease_core::QueueState::new(
                    queue,
                    reply.str(i + 1)? == "1",
                    Some(reply.time(i + 2)?),
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        // The queues with runnable runs: those with a claimable index of one of their classes
        // (every class a run was created with is in the kinds set), one EXISTS per queue.
        let mut indexes: std::collections::BTreeMap<lease_core::Queue, Vec<String>> =
            std::collections::BTreeMap::new();
        for class in std::iter::once(Class::default()).chain(self.created_classes().await?) {
            let key = self.keys.claimable_of(&class);
            indexes.entry(class.queue).or_default().push(key);
        }
        for (queue, keys) in indexes {
            if states.iter().any(|s| s.queue == queue) {
                continue;
            }
            let mut exists = redis::cmd("EXISTS");
            exists.arg(&keys);
            match self.link.command(&exists).await? {
                redis::Value::Int(0) => {}
                redis::Value::Int(_) => {
                    states.push(lease_core::QueueState::new(queue, false, None))
                }
                other => {
                    return Err(Error::backend(
                        crate::error::BACKEND,
                        format!("EXISTS answered {other:?}"),
                    ))
                }
            }
        }
        states.sort_by(|a, b| a.queue.cmp(&b.queue));
        states.truncate(lease_core::MAX_QUEUES_LISTED);
        Ok(states)
    }

    pub(crate) async fn count_kinds_runs(&self) -> Result<Vec<lease_core::KindCounts>> {
        // As count_runs: the classes first, then one read of their indexes, which checks that
        // no class was added in between (else they are read again).
        let mut tries = 0;
        let (classes, reply) = loop {
            let created = self.created_classes().await?;
            let mut call = Call::new(&SCRIPTS.count_kinds);
            call.key(self.keys.kind_set()).arg(created.len());
            let classes: Vec<Class> = std::iter::once(Class::default()).chain(created).collect();
            for class in &classes {
                call.key(self.keys.claimable_of(class));
            }
            let reply = self.read("count_kinds", &call).await?;
            if reply.str(0).ok() != Some("kinds") {
                break (classes, reply);
            }
            tries += 1;
            if tries > KIND_RESENDS {
                return Err(reply.bad("kinds kept being added during the count").into());
            }
        };
        if reply.len() != 3 * classes.len() {
            return Err(reply.bad("not three figures per class").into());
        }
        // kind -> (runnable, claimable, lag): a kind's classes (its priorities) added up.
        let mut by_kind: std::collections::BTreeMap<lease_core::Kind, (u64, u64, Option<u64>)> =
            std::collections::BTreeMap::new();
        for (i, class) in classes.into_iter().enumerate() {
            let figures = by_kind.entry(class.kind).or_default();
            figures.0 += reply.parse::<u64>(3 * i)?;
            figures.1 += reply.parse::<u64>(3 * i + 1)?;
            if !reply.str(3 * i + 2)?.is_empty() {
                let lag = reply.parse::<u64>(3 * i + 2)?;
                figures.2 = Some(figures.2.map_or(lag, |l| l.max(lag)));
            }
        }
        Ok(by_kind
            .into_iter()
            .filter(|(_, (runnable, _, _))| *runnable > 0)
            .take(lease_core::MAX_KINDS_COUNTED)
            .map(|(kind, (runnable, claimable, lag))| {
                let cap = |n: u64| n.min(lease_core::MAX_COUNT);
                lease_core::KindCounts::new(
                    kind,
                    cap(runnable),
                    cap(claimable),
                    lag.map(Duration::from_micros),
                )
            })
            .collect())
    }

    pub(crate) async fn count_purgeable_runs(&self, older_than: Duration) -> Result<u64> {
        check_purge(older_than, 1)?;
        let mut call = Call::new(&SCRIPTS.count_purgeable);
        call.key(self.keys.ended())
            .arg(older_than.as_millis() as u64);
        let reply = self.read("count_purgeable", &call).await?;
        Ok(reply.parse(0)?)
    }

    pub(crate) async fn force_release_run(&self, run: &RunId) -> Result<RunRecord> {
        let encoded = keys::encode(run.as_str());
        let (reply, ack, _) = self
            .write_kinded("force_release", &Class::default(), |kind| {
                let mut call = Call::new(&SCRIPTS.force_release);
                call.key(self.keys.runs())
                    .key(self.keys.claimable_of(kind))
                    .key(self.keys.failures())
                    .key(self.keys.delayed())
                    .key(self.keys.attempts())
                    .key(self.keys.kinds())
                    .key(self.keys.ended())
                    .key(self.keys.history())
                    .arg(&encoded)
                    .arg(kind.arg());
                call
            })
            .await?;
        match reply.status()? {
            "ok" => {
                ack.confirm()?;
                self.record(run, &reply)
            }
            "none" => Err(Error::NotFound { run: run.clone() }),
            "refused" => match reply.state(1)? {
                RunState::Suspended => Err(Error::Suspended { run: run.clone() }),
                RunState::Completed => Err(Error::Completed { run: run.clone() }),
                RunState::Failed => Err(Error::Failed { run: run.clone() }),
                RunState::Cancelled => Err(Error::Cancelled { run: run.clone() }),
                state => Err(reply.bad(format!("refused a run in state {state}")).into()),
            },
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }

    pub(crate) async fn cancel_run(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        lease_core::backend::check_reason(reason)?;
        let encoded = keys::encode(run.as_str());
        let (reply, ack, _) = self
            .write_kinded("cancel", &Class::default(), |kind| {
                let mut call = Call::new(&SCRIPTS.cancel);
                call.key(self.keys.runs())
                    .key(self.keys.claimable_of(kind))
                    .key(self.keys.failures())
                    .key(self.keys.delayed())
                    .key(self.keys.suspended())
                    .key(self.keys.ended())
                    .key(self.keys.cancelled())
                    .key(self.keys.attempts())
                    .key(self.keys.kinds())
                    .key(self.keys.history())
                    .key(self.keys.waits())
                    .key(self.keys.deadlines())
                    .arg(&encoded)
                    .arg(reason)
                    .arg(kind.arg());
                call
            })
            .await?;
        match reply.status()? {
            "ok" => {
                // Also for a run cancelled before (a retried cancel): it must be on the
                // replicas as if this call had cancelled it.
                ack.confirm()?;
                self.record(run, &reply)
            }
            "none" => Err(Error::NotFound { run: run.clone() }),
            "refused" => match reply.state(1)? {
                RunState::Completed => Err(Error::Completed { run: run.clone() }),
                state => Err(reply
                    .bad(format!("refused to cancel a run in state {state}"))
                    .into()),
            },
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }
}
