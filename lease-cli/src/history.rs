//! A run's attempt history as `lease inspect` prints it: a `history` list in JSON, lines
//! under the record's table in text.

use std::io::{self, Write};

use distribution::{Attempt, RunRecord};
use serde::Serialize;

use crate::output::rfc3339;

/// One attempt as the CLI prints it (`-o json`: an element of `history`).
#[derive(Serialize)]
pub(crate) struct AttemptView {
    /// The attempt budget's counter after its claim.
    attempt: u64,
    fence: u64,
    worker: String,
    /// When its claim took the run, on the store's clock, microseconds (null: unknown).
    claimed_at_us: Option<u64>,
    /// When it ended, microseconds (null: still held).
    ended_at_us: Option<u64>,
    /// How it ended: `held`, `completed`, `released`, `suspended`, `retried`, `failed`,
    /// `expired`, `force-released` or `cancelled`.
    outcome: &'static str,
    /// The error it gave (retried, failed) or the cancellation's reason.
    error: Option<String>,
}

impl From<&Attempt> for AttemptView {
    fn from(a: &Attempt) -> AttemptView {
        AttemptView {
            attempt: a.attempt,
            fence: a.fence.get(),
            worker: a.worker.to_string(),
            claimed_at_us: a.claimed_at.map(|t| t.as_micros()),
            ended_at_us: a.ended_at.map(|t| t.as_micros()),
            outcome: a.outcome.as_str(),
            error: a.error.clone(),
        }
    }
}

/// The record's history for JSON: null when the command did not read it (or the store keeps
/// none).
pub(crate) fn views(record: &RunRecord) -> Option<Vec<AttemptView>> {
    record
        .history
        .as_ref()
        .map(|h| h.iter().map(AttemptView::from).collect())
}

/// The history under a single record's table, oldest first: one line per attempt, its error
/// quoted with control characters escaped.
pub(crate) fn lines(out: &mut impl Write, record: &RunRecord) -> io::Result<()> {
    let Some(history) = record.history.as_ref().filter(|h| !h.is_empty()) else {
        return Ok(());
    };
    writeln!(
        out,
        "attempts (the last {}, oldest first):",
        distribution::MAX_HISTORY
    )?;
    for a in history {
        write!(
            out,
            "  attempt {} fence {} by {}: {}",
            a.attempt, a.fence, a.worker, a.outcome
        )?;
        if let Some(claimed) = a.claimed_at {
            write!(
                out,
                ", claimed {}",
                rfc3339(claimed, chrono::SecondsFormat::Millis)
            )?;
            if let Some(ended) = a.ended_at {
                let took = ended.saturating_since(claimed);
                write!(out, ", after {:.3} s", took.as_secs_f64())?;
            }
        }
        if let Some(error) = &a.error {
            write!(out, ": {error:?}")?;
        }
        writeln!(out)?;
    }
    Ok(())
}
