//! What runs the runs: the live workers, read from the leases of the runnable runs (one row
//! per worker id: how many leases it holds, its latest heartbeat, whether any lease is still
//! live), and the schedules, read from the runs a `Scheduler` (`lease-runtime`) enqueues.
//!
//! A scheduler creates one run per tick with the id `{name}@{tick}`, the tick in Unix seconds
//! (`Scheduler::tick_run`); its own lease run lives in a namespace of its own (`lease
//! schedule` uses `{namespace}_schedules`), so the runs store shows the ticks only. The page
//! groups the runs whose ids have that form by name: the last tick the store holds, and the
//! spacing of the ticks, from which the next is told for a schedule of fixed interval (ticks
//! on multiples of it since the epoch, as `Schedule::every` makes them). The id's form is
//! parsed here ([`tick_of`]): lease-ui depends on `lease-core` only.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::Response;
use lease_core::{Error, LeaseStore, ListFilter, RunRecord, RunState, StoreTime};

use crate::html::{esc, instant, run_link, span, table};
use crate::pages::shown_state;
use crate::{page, store_error, Base, Shared};

/// How many runs one `list` call of these pages reads.
const PAGE: usize = 1_000;
/// How many runnable runs the workers page reads (by id).
pub(crate) const WORKER_SCAN: usize = 10_000;
/// How many runs the schedules page reads (by id, every state).
pub(crate) const SCHEDULE_SCAN: usize = 20_000;
/// How many of a worker's runs its row links.
const RUNS_SHOWN: usize = 5;
/// How many of a schedule's latest ticks its spacing is read from.
const TICKS_READ: usize = 50;

/// Up to `max` runs by id (of `state`, or every state), and whether there were more.
async fn read_all(
    store: &dyn LeaseStore,
    state: Option<RunState>,
    max: usize,
) -> Result<(Vec<RunRecord>, bool), Error> {
    let mut runs: Vec<RunRecord> = Vec::new();
    loop {
        let filter = ListFilter::new()
            .with_state(state)
            .with_after(runs.last().map(|r| r.run.clone()))
            .with_limit(PAGE);
        let page = store.list(&filter).await?;
        let full = page.len() == PAGE;
        runs.extend(page);
        if !full {
            return Ok((runs, false));
        }
        if runs.len() >= max {
            return Ok((runs, true));
        }
    }
}

/// One worker, from the leases it holds or held last.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct WorkerRow {
    pub(crate) worker: String,
    /// Leases not expired.
    pub(crate) live: usize,
    /// Leases expired and not yet claimed again.
    pub(crate) expired: usize,
    /// Its latest heartbeat: the latest renewal of its leases, or claim of one never renewed.
    pub(crate) last_beat: Option<StoreTime>,
    /// When its last lease to expire expires.
    pub(crate) expires: Option<StoreTime>,
    /// Its first runs by id, with their fences and whether the lease expired.
    pub(crate) runs: Vec<(String, u64, bool)>,
}

impl WorkerRow {
    pub(crate) fn is_live(&self) -> bool {
        self.live > 0
    }
}

/// The workers holding or last holding `runs` (runnable runs), live ones first, then by id.
pub(crate) fn workers(runs: &[RunRecord]) -> Vec<WorkerRow> {
    let mut by: BTreeMap<&str, WorkerRow> = BTreeMap::new();
    for r in runs {
        let Some(owner) = &r.owner else { continue };
        let row = by.entry(owner.as_str()).or_insert_with(|| WorkerRow {
            worker: owner.as_str().to_owned(),
            live: 0,
            expired: 0,
            last_beat: None,
            expires: None,
            runs: Vec::new(),
        });
        let expired = r.is_expired();
        if expired {
            row.expired += 1;
        } else {
            row.live += 1;
        }
        let beat = r.renewed_at.or(r.claimed_at);
        row.last_beat = row.last_beat.max(beat);
        row.expires = row.expires.max(r.expires_at);
        if row.runs.len() < RUNS_SHOWN {
            row.runs
                .push((r.run.as_str().to_owned(), r.fence.get(), expired));
        }
    }
    let mut rows: Vec<WorkerRow> = by.into_values().collect();
    rows.sort_by(|a, b| b.is_live().cmp(&a.is_live()).then(a.worker.cmp(&b.worker)));
    rows
}

/// `at` against `now`, both on the store's clock: `in 4.2 s` or `1.3 s ago`.
fn from_now(now: StoreTime, at: StoreTime) -> String {
    if at >= now {
        format!("in {}", span(at.saturating_since(now)))
    } else {
        format!("{} ago", span(now.saturating_since(at)))
    }
}

pub(crate) async fn workers_page(
    State(ui): State<Shared>,
    Extension(base): Extension<Base>,
) -> Response {
    let (runs, more) = match read_all(&*ui.store, Some(RunState::Runnable), WORKER_SCAN).await {
        Ok(read) => read,
        Err(e) => return store_error(&ui, &base, &e),
    };
    let now = runs.first().map(|r| r.observed_at);
    let body = render_workers(&workers(&runs), now, more);
    page(StatusCode::OK, &ui, &base, "workers", &body)
}

/// The workers page: `now` is the store's clock when the runs were read.
pub(crate) fn render_workers(rows: &[WorkerRow], now: Option<StoreTime>, more: bool) -> String {
    let mut body = String::from("<h2 id=\"workers\">Workers</h2>");
    let at = |t: Option<StoreTime>| match (t, now) {
        (Some(t), Some(now)) => format!("{} <small>({})</small>", instant(t), from_now(now, t)),
        (Some(t), None) => instant(t),
        (None, _) => "-".to_owned(),
    };
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|w| {
            let (class, live) = if w.is_live() {
                ("live", "live")
            } else {
                ("not-live", "not live: every lease expired")
            };
            let runs: Vec<String> = w
                .runs
                .iter()
                .map(|(run, fence, expired)| {
                    let gone = if *expired { ", expired" } else { "" };
                    format!("{} <small>(fence {fence}{gone})</small>", run_link(run))
                })
                .collect();
            let more = if w.live + w.expired > w.runs.len() {
                " …"
            } else {
                ""
            };
            vec![
                format!("<span class=\"holder\">{}</span>", esc(&w.worker)),
                format!("<span class=\"{class}\">{live}</span>"),
                format!("<span class=\"leases\">{}</span>", w.live),
                w.expired.to_string(),
                at(w.last_beat),
                at(w.expires),
                format!("{}{more}", runs.join("<br>")),
            ]
        })
        .collect();
    body.push_str(&table(
        &[
            "worker",
            "live",
            "leases held",
            "leases expired",
            "latest heartbeat (store clock)",
            "last lease expires",
            "runs",
        ],
        &table_rows,
        "No worker holds a lease.",
    ));
    let scanned = if more {
        format!(" Read from the first {WORKER_SCAN} runnable runs by id: there are more.")
    } else {
        String::new()
    };
    let _ = write!(
        body,
        "<p><small>Workers as the runs' leases name them: a worker that holds nothing is not in \
         the store. Its heartbeat is its latest lease renewal (or claim, for a lease never \
         renewed); a worker whose leases have all expired is not live.{scanned}</small></p>"
    );
    body
}

/// The schedule name and tick (Unix seconds) of a tick run's id, `{name}@{tick}`, as
/// `Scheduler::tick_run` (`lease-runtime`) makes it; `None` for any other id.
pub(crate) fn tick_of(id: &str) -> Option<(&str, u64)> {
    let (name, digits) = id.rsplit_once('@')?;
    let tick: u64 = digits.parse().ok()?;
    // Only the decimal form the scheduler writes: no sign, no leading zero.
    (!name.is_empty() && tick.to_string() == digits).then_some((name, tick))
}

/// A schedule as its tick runs tell it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ScheduleRow {
    pub(crate) name: String,
    /// Its tick runs in the store, by how each is shown (`claimable`, `completed`, …).
    pub(crate) states: BTreeMap<&'static str, usize>,
    /// The latest tick, its run's id and how the run is shown.
    pub(crate) last: (u64, String, &'static str),
    /// The ticks' spacing, when they sit on multiples of one interval since the epoch.
    pub(crate) every: Option<u64>,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The schedules whose tick runs are among `runs`, by name.
pub(crate) fn schedules(runs: &[RunRecord]) -> Vec<ScheduleRow> {
    let mut ticks: BTreeMap<&str, Vec<(u64, &RunRecord)>> = BTreeMap::new();
    for r in runs {
        if let Some((name, tick)) = tick_of(r.run.as_str()) {
            ticks.entry(name).or_default().push((tick, r));
        }
    }
    ticks
        .into_iter()
        .map(|(name, mut ticks)| {
            ticks.sort_by_key(|(t, _)| *t);
            let mut states = BTreeMap::new();
            for (_, r) in &ticks {
                *states.entry(shown_state(r).0).or_default() += 1;
            }
            let latest = &ticks[ticks.len().saturating_sub(TICKS_READ)..];
            let step = latest.windows(2).map(|w| w[1].0 - w[0].0).fold(0, gcd);
            let every = (step > 0 && latest.iter().all(|(t, _)| t % step == 0)).then_some(step);
            let (tick, r) = ticks[ticks.len() - 1];
            ScheduleRow {
                name: name.to_owned(),
                states,
                last: (tick, r.run.as_str().to_owned(), shown_state(r).0),
                every,
            }
        })
        .collect()
}

/// Unix seconds as an RFC 3339 instant in UTC.
fn unix(secs: u64) -> String {
    i64::try_from(secs)
        .ok()
        .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
        .map_or_else(
            || format!("{secs} s"),
            |at| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        )
}

/// The next tick of `row` after `now` (Unix seconds), and how many ticks are missing between
/// the last one in the store and `now`; `None` without a fixed interval.
pub(crate) fn next_tick(row: &ScheduleRow, now: u64) -> Option<(u64, u64)> {
    let every = row.every?;
    let last = row.last.0;
    let next = (now.max(last) / every + 1) * every;
    let missed = now.saturating_sub(last) / every;
    Some((next, missed))
}

pub(crate) async fn schedules_page(
    State(ui): State<Shared>,
    Extension(base): Extension<Base>,
) -> Response {
    let (runs, more) = match read_all(&*ui.store, None, SCHEDULE_SCAN).await {
        Ok(read) => read,
        Err(e) => return store_error(&ui, &base, &e),
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let body = render_schedules(&schedules(&runs), now, more);
    page(StatusCode::OK, &ui, &base, "schedules", &body)
}

/// The schedules page; `now` is this host's clock in Unix seconds (the ticks are the
/// schedulers' hosts' UTC).
pub(crate) fn render_schedules(rows: &[ScheduleRow], now: u64, more: bool) -> String {
    let mut body = String::from("<h2 id=\"schedules\">Schedules</h2>");
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|s| {
            let states: Vec<String> = s.states.iter().map(|(st, n)| format!("{n} {st}")).collect();
            let (tick, run, state) = &s.last;
            let age = span(Duration::from_secs(now.saturating_sub(*tick)));
            let (every, next) = match (s.every, next_tick(s, now)) {
                (Some(every), Some((next, missed))) => {
                    let when = format!(
                        "<span class=\"next-tick\">{}</span> <small>(in {})</small>",
                        unix(next),
                        span(Duration::from_secs(next.saturating_sub(now)))
                    );
                    let behind = if missed > 0 {
                        format!(
                            "<br><span class=\"overdue\">{missed} ticks due since the last one are not \
                             in the store: is a scheduler running?</span>"
                        )
                    } else {
                        String::new()
                    };
                    (
                        format!("every <span class=\"every\">{}</span>", span(Duration::from_secs(every))),
                        format!("{when}{behind}"),
                    )
                }
                _ => (
                    "irregular (a cron schedule?) or one tick".to_owned(),
                    "cannot tell from the store".to_owned(),
                ),
            };
            vec![
                format!("<span class=\"schedule\">{}</span>", esc(&s.name)),
                states.join(", "),
                format!(
                    "<span class=\"last-tick\">{}</span> <small>({age} ago)</small><br>{} <small>({state})</small>",
                    unix(*tick),
                    run_link(run)
                ),
                every,
                next,
            ]
        })
        .collect();
    body.push_str(&table(
        &[
            "schedule",
            "tick runs in the store",
            "last tick (UTC)",
            "interval (from the ticks)",
            "next tick",
        ],
        &table_rows,
        "No run has a schedule's tick id (name@unix-seconds).",
    ));
    let scanned = if more {
        format!(" Read from the first {SCHEDULE_SCAN} runs by id: there are more.")
    } else {
        String::new()
    };
    let _ = write!(
        body,
        "<p><small>A scheduler enqueues one run per tick, with the id \
         <code>name@unix-seconds</code>; a run of that form created otherwise is counted too. \
         The interval is read from the spacing of a schedule's last {TICKS_READ} ticks, and the \
         next tick is told only for ticks on whole multiples of it (<code>lease schedule \
         --every</code>); a cron schedule's is not. Ticks are the schedulers' clocks' UTC, \
         compared with this server's. Purged tick runs are not counted; who holds a \
         schedule's lease is in its own namespace (<code>NAMESPACE_schedules</code>).{scanned}</small></p>"
    );
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_ids_parse_only_in_the_schedulers_form() {
        assert_eq!(
            tick_of("nightly@1796169600"),
            Some(("nightly", 1_796_169_600))
        );
        assert_eq!(tick_of("a@b@60"), Some(("a@b", 60)));
        for other in [
            "nightly",
            "@60",
            "n@",
            "n@-60",
            "n@060",
            "n@6x",
            "n@99999999999999999999",
        ] {
            assert_eq!(tick_of(other), None, "{other}");
        }
    }

    #[test]
    fn the_next_tick_follows_the_interval_and_counts_missed_ones() {
        let row = |last: u64, every: Option<u64>| ScheduleRow {
            name: "s".into(),
            states: BTreeMap::new(),
            last: (last, format!("s@{last}"), "completed"),
            every,
        };
        assert_eq!(next_tick(&row(600, Some(60)), 630), Some((660, 0)));
        assert_eq!(next_tick(&row(600, Some(60)), 900), Some((960, 5)));
        assert_eq!(next_tick(&row(600, None), 630), None);
    }
}
