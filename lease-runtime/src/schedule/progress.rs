//! What a schedule's lease run records: where the schedule started, and the last tick a holder
//! enqueued or was about to, so that no holder enqueues a tick twice, whatever retention does
//! with the tick runs in between.
//!
//! The lease run's journal holds, each entry written under the holder's fence:
//! - first, the schedule's start (Unix seconds, in decimal): written once, by the first
//!   holder ever;
//! - then `through {tick}`, written by the holder **before** it creates the runs of a batch
//!   ending at `tick`. A holder taking over enqueues only ticks after the highest recorded:
//!   those at or before it were created by an earlier holder, and may have run, ended and
//!   been purged since (a tick run purged inside the catch-up window is not in the store to
//!   refuse a second create). A holder that stopped between the record and the create leaves
//!   ticks that no one creates: a tick runs at most once.
//!
//! The journal grows by one entry per batch; after [`ROTATE_AFTER`] entries the holder starts
//! the lease run afresh: it completes it, removes it ([`purge_ids`](LeaseStore::purge_ids)),
//! and creates it again with the start and the last tick as its payload (`start {s} through
//! {t}`). A holder that finds the lease run completed finishes such a restart from what the
//! completed run recorded. So a schedule's records stay within a thousand entries, however
//! long it runs.

use lease_core::{Error, LeaseStore, NewRun, Result, RunId};

/// How many journal entries a schedule's lease run holds before its holder starts it afresh.
pub(super) const ROTATE_AFTER: usize = 1_000;

/// What a schedule's lease run records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Progress {
    /// When the schedule started (Unix seconds), if recorded.
    pub(super) started: Option<u64>,
    /// The highest tick a holder recorded before creating its batch.
    pub(super) through: Option<u64>,
    /// The journal's entries.
    pub(super) entries: usize,
}

impl Progress {
    /// Reads the lease run's payload and journal.
    pub(super) async fn read(leases: &dyn LeaseStore, run: &RunId) -> Result<Progress> {
        let record = leases.inspect(run).await?;
        let journal = leases.journal(run).await?;
        let mut progress = Progress {
            entries: journal.len(),
            ..Progress::default()
        };
        if let Some(payload) = &record.payload {
            progress.note_payload(&text(payload, run)?, run)?;
        }
        for (i, entry) in journal.iter().enumerate() {
            let entry = text(&entry.payload, run)?;
            if let Some(tick) = entry.strip_prefix("through ") {
                progress.note_through(number(tick, run)?);
            } else if i == 0 && progress.started.is_none() {
                progress.started = Some(number(&entry, run)?);
            } else {
                return Err(not_a_schedule(run));
            }
        }
        Ok(progress)
    }

    fn note_payload(&mut self, payload: &str, run: &RunId) -> Result<()> {
        let mut words = payload.split(' ');
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("start"), Some(start), None, None) => {
                self.started = Some(number(start, run)?);
            }
            (Some("start"), Some(start), Some("through"), Some(tick)) => {
                self.started = Some(number(start, run)?);
                self.note_through(number(tick, run)?);
            }
            _ => return Err(not_a_schedule(run)),
        }
        Ok(())
    }

    fn note_through(&mut self, tick: u64) {
        self.through = Some(self.through.map_or(tick, |t| t.max(tick)));
    }

    /// The payload a restarted lease run carries.
    pub(super) fn payload(started: u64, through: Option<u64>) -> String {
        match through {
            Some(t) => format!("start {started} through {t}"),
            None => format!("start {started}"),
        }
    }
}

/// Starts the lease run afresh from `progress` (see the module docs): removes the completed
/// run and creates it again with its start and last tick as payload. Refused by another holder
/// doing the same first (`AlreadyExists`): that is fine, it carries the same record.
pub(super) async fn restart(
    leases: &dyn LeaseStore,
    run: &RunId,
    started: u64,
    through: Option<u64>,
) -> Result<()> {
    leases.purge_ids(std::slice::from_ref(run)).await?;
    let new =
        NewRun::new(run.clone()).with_payload(Progress::payload(started, through).into_bytes());
    match leases.create_with(&new).await {
        Ok(_) | Err(Error::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

fn text(bytes: &[u8], run: &RunId) -> Result<String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| not_a_schedule(run))
}

fn number(s: &str, run: &RunId) -> Result<u64> {
    s.parse().map_err(|_| not_a_schedule(run))
}

fn not_a_schedule(run: &RunId) -> Error {
    Error::backend(
        "schedule",
        format!("the lease run {run} does not hold a schedule's records"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryLeaseStore;
    use lease_core::{LeaseStore, Ttl, WorkerId};

    #[tokio::test]
    async fn a_lease_runs_records_read_back_from_its_journal_and_payload() {
        let store = MemoryLeaseStore::new();
        let run = RunId::new("tick").unwrap();
        store.create(&run).await.unwrap();
        assert_eq!(
            Progress::read(&store, &run).await.unwrap(),
            Progress::default()
        );
        let lease = store
            .claim(
                &run,
                &WorkerId::new("w").unwrap(),
                Ttl::from_secs(30).unwrap(),
            )
            .await
            .unwrap();
        for entry in ["100", "through 105", "through 110", "through 107"] {
            store.append(&lease, entry.as_bytes()).await.unwrap();
        }
        let progress = Progress::read(&store, &run).await.unwrap();
        assert_eq!(
            progress,
            Progress {
                started: Some(100),
                through: Some(110),
                entries: 4
            }
        );
        store.complete(&lease).await.unwrap();
        restart(&store, &run, 100, progress.through).await.unwrap();
        let fresh = Progress::read(&store, &run).await.unwrap();
        assert_eq!(
            fresh,
            Progress {
                started: Some(100),
                through: Some(110),
                entries: 0
            }
        );
        let other = RunId::new("not-a-schedule").unwrap();
        store
            .create_with(&NewRun::new(other.clone()).with_payload(b"hello".to_vec()))
            .await
            .unwrap();
        let e = Progress::read(&store, &other).await.unwrap_err();
        assert!(
            e.to_string().contains("does not hold a schedule's records"),
            "{e}"
        );
    }
}
