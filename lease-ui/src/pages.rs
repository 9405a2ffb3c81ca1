//! The dashboard's pages, rendered from what the store answered: the overview and a list of
//! runs (a run's own page is `run.rs`). Pure functions of their input, so the tests can read
//! them without a server.

use std::fmt::Write;

use lease_core::{RunCounts, RunId, RunRecord, RunState, MAX_COUNT};

use super::bulk::{Bulk, BULK_MAX};
use super::filter::{Found, RunFilter, Unit, SCAN_MAX};
use super::html::{self, clip, esc, instant, relative, run_link, segment, span, table};

/// How many runnable runs the overview reads to find the held ones and the expired leases.
pub(crate) const RUNNABLE_SCAN: usize = 1_000;
/// How many failed and suspended runs the overview shows.
pub(crate) const SHOWN: usize = 50;
/// How many runs a list page shows.
pub(crate) const LIST_PAGE: usize = 100;
/// How many characters of a reason a table shows (a run's page shows all of it).
const REASON_CHARS: usize = 300;

/// A run's part of its life as the dashboard names it, and the CSS class it is shown with:
/// a runnable run is `held`, `expired lease`, `delayed` or `claimable`.
pub(crate) fn shown_state(r: &RunRecord) -> (&'static str, &'static str) {
    match r.state {
        RunState::Runnable if r.owner.is_some() && !r.is_expired() => ("held", "state-held"),
        RunState::Runnable if r.owner.is_some() => ("expired lease", "state-expired"),
        RunState::Runnable if r.not_before.is_some() => ("delayed", "state-delayed"),
        RunState::Runnable => ("claimable", "state-claimable"),
        RunState::Failed => ("failed", "state-failed"),
        RunState::Cancelled => ("cancelled", "state-cancelled"),
        other => (other.as_str(), "state-other"),
    }
}

/// A run's state as a table cell: its name in its class.
pub(crate) fn state_cell(r: &RunRecord) -> String {
    let (name, class) = shown_state(r);
    format!("<span class=\"{class}\">{name}</span>")
}

/// What the overview shows: the counts, and the first runs of the states an operator looks
/// at first.
pub(crate) struct Overview {
    pub counts: RunCounts,
    /// The first [`RUNNABLE_SCAN`] runnable runs by id.
    pub runnable: Vec<RunRecord>,
    pub failed: Vec<RunRecord>,
    pub suspended: Vec<RunRecord>,
    /// The queues with runnable runs or ever paused or resumed; `None` where the store keeps
    /// no queues (etcd).
    pub queues: Option<Vec<lease_core::QueueState>>,
}

pub(crate) fn overview(o: &Overview) -> String {
    let mut body = String::from("<h2>Runs by state</h2>");
    let link = |state: &str| match state {
        "claimable" | "held" | "delayed" => "runs?state=runnable".to_owned(),
        other => format!("runs?state={other}"),
    };
    let rows: Vec<Vec<String>> = o
        .counts
        .by_state()
        .iter()
        .map(|(state, n)| {
            let at_least = if *n >= MAX_COUNT { " or more" } else { "" };
            vec![
                format!("<a href=\"{}\">{state}</a>", esc(&link(state))),
                format!("<span id=\"count-{state}\">{n}</span>{at_least}"),
            ]
        })
        .collect();
    body.push_str(&table(&["state", "runs"], &rows, ""));
    let lag = match (o.counts.oldest_claimable_age, o.counts.claimable) {
        (_, 0) => "No run waits to be claimed.".to_owned(),
        (Some(age), _) => format!(
            "Queue lag: the longest-waiting claimable run has waited <span class=\"lag\">{}</span>.",
            span(age)
        ),
        (None, _) => "This store cannot tell how long runs have waited (etcd).".to_owned(),
    };
    let _ = write!(body, "<p id=\"lag\">{lag}</p>");
    let longest = match (o.counts.longest_held, o.counts.held) {
        (_, 0) => "No lease is held.".to_owned(),
        (Some(held), _) => format!(
            "The lease held longest has been held <span class=\"longest\">{}</span>.",
            span(held)
        ),
        (None, _) => "This store cannot tell how long leases have been held (etcd).".to_owned(),
    };
    let _ = write!(body, "<p id=\"longest-held\">{longest}</p>");

    let _ = write!(
        body,
        "<h2 id=\"queues\">Queues <small><a href=\"queues\">depth and lag</a></small></h2>"
    );
    match &o.queues {
        None => body.push_str("<p>This store keeps no queues but the default (etcd).</p>"),
        Some(queues) => {
            let rows: Vec<Vec<String>> = queues
                .iter()
                .map(|q| {
                    let state = if q.paused { "paused" } else { "running" };
                    vec![
                        format!("<span class=\"queue\">{}</span>", esc(q.queue.as_str())),
                        format!("<span class=\"{state}\">{state}</span>"),
                        q.changed_at
                            .map_or_else(|| "never paused".to_owned(), instant),
                    ]
                })
                .collect();
            body.push_str(&table(
                &["queue", "state", "since (store clock)"],
                &rows,
                "No queue has runs waiting or has been paused.",
            ));
        }
    }

    let scanned = if o.runnable.len() >= RUNNABLE_SCAN {
        format!(" <small>(among the first {RUNNABLE_SCAN} runnable runs by id)</small>")
    } else {
        String::new()
    };
    let held: Vec<Vec<String>> = o
        .runnable
        .iter()
        .filter(|r| r.owner.is_some() && !r.is_expired())
        .map(|r| {
            let expires = r.expires_at.expect("a held run has an expiry");
            vec![
                run_link(r.run.as_str()),
                esc(r.kind.as_str()),
                format!(
                    "<span class=\"holder\">{}</span>",
                    esc(r.owner.as_ref().map_or("", |w| w.as_str()))
                ),
                format!("<span class=\"fence\">{}</span>", r.fence.get()),
                r.attempts.to_string(),
                r.held_for().map_or_else(
                    || "?".to_owned(),
                    |d| format!("<span class=\"held-for\">{}</span>", span(d)),
                ),
                r.heartbeats.to_string(),
                format!(
                    "{} <small>({})</small>",
                    instant(expires),
                    relative(r, expires)
                ),
            ]
        })
        .collect();
    let _ = write!(body, "<h2 id=\"held\">Held runs{scanned}</h2>");
    body.push_str(&table(
        &[
            "run",
            "kind",
            "holder",
            "fence",
            "attempt",
            "held for",
            "heartbeats",
            "lease expires (store clock)",
        ],
        &held,
        "No run is held.",
    ));

    let expired: Vec<Vec<String>> = o
        .runnable
        .iter()
        .filter(|r| r.is_expired())
        .map(|r| {
            let expired = r.expires_at.expect("an expired lease has an expiry");
            vec![
                run_link(r.run.as_str()),
                esc(r.kind.as_str()),
                esc(r.owner.as_ref().map_or("", |w| w.as_str())),
                r.fence.get().to_string(),
                format!(
                    "{} <small>({})</small>",
                    instant(expired),
                    relative(r, expired)
                ),
            ]
        })
        .collect();
    let _ = write!(
        body,
        "<h2 id=\"expired\">Expired leases, not yet claimed again{scanned}</h2>"
    );
    body.push_str(&table(
        &["run", "kind", "last holder", "fence", "expired"],
        &expired,
        "No lease has expired unclaimed.",
    ));

    let _ = write!(body, "<h2 id=\"failed\">Failed runs</h2>");
    body.push_str(&ended_table(&o.failed, "No run has failed."));
    let _ = write!(body, "<h2 id=\"suspended\">Suspended runs</h2>");
    body.push_str(&ended_table(&o.suspended, "No run is suspended."));
    body
}

/// Failed or suspended runs: id, kind, fence, attempts, the reason.
fn ended_table(runs: &[RunRecord], empty: &str) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                run_link(r.run.as_str()),
                esc(r.kind.as_str()),
                r.fence.get().to_string(),
                r.attempts.to_string(),
                match &r.wait {
                    // A suspended run waiting for a signal says which, and until when.
                    Some(w) => format!(
                        "waits for signal <span class=\"signal\">{}</span>{}",
                        esc(w.name.as_str()),
                        w.deadline.map_or_else(
                            || " (no timeout)".to_owned(),
                            |at| format!(" until {}", instant(at))
                        )
                    ),
                    None => format!(
                        "<span class=\"reason\">{}</span>",
                        esc(&clip(r.failure.as_deref().unwrap_or(""), REASON_CHARS))
                    ),
                },
            ]
        })
        .collect();
    let mut out = table(
        &["run", "kind", "fence", "attempts", "reason or wait"],
        &rows,
        empty,
    );
    if runs.len() >= SHOWN {
        let _ = write!(out, "<p><small>The first {SHOWN} by id.</small></p>");
    }
    out
}

/// A page of runs, with the filter that chose them and a link to the next page; with the
/// token, the bulk forms for the runs of that filter.
pub(crate) fn list(
    found: &Found,
    filter: &RunFilter,
    after: Option<&RunId>,
    token: Option<&str>,
) -> String {
    let runs = &found.runs;
    let mut body = String::from(
        "<h2>Runs</h2><form class=\"filter\" method=\"get\" action=\"runs\">state \
         <select name=\"state\"><option value=\"\">any</option>",
    );
    for s in [
        RunState::Runnable,
        RunState::Suspended,
        RunState::Completed,
        RunState::Failed,
        RunState::Cancelled,
    ] {
        let selected = if filter.state == Some(s) {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            body,
            "<option value=\"{0}\"{selected}>{0}</option>",
            s.as_str()
        );
    }
    let (age, unit) = filter
        .age
        .map_or((String::new(), Unit::Hours), |(n, u)| (n.to_string(), u));
    let _ = write!(
        body,
        "</select> kind <input name=\"kind\" value=\"{}\" size=\"14\"> \
         queue <input name=\"queue\" value=\"{}\" size=\"12\"> \
         created more than <input name=\"age\" value=\"{age}\" size=\"4\" inputmode=\"numeric\"> \
         <select name=\"unit\">",
        esc(filter.kind.as_ref().map_or("", |k| k.as_str())),
        esc(filter.queue.as_ref().map_or("", |q| q.as_str())),
    );
    for u in Unit::ALL {
        let selected = if u == unit { " selected" } else { "" };
        let _ = write!(body, "<option{selected}>{}</option>", u.as_str());
    }
    body.push_str("</select> ago <button>show</button></form>");
    if let Some(token) = token {
        body.push_str(&bulk_forms(filter, token));
    }
    if let Some(after) = after {
        let _ = write!(body, "<p><small>After {}.</small></p>", esc(after.as_str()));
    }
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                run_link(r.run.as_str()),
                state_cell(r),
                esc(r.kind.as_str()),
                esc(r.queue.as_str()),
                r.priority.to_string(),
                esc(r.owner.as_ref().map_or("", |w| w.as_str())),
                r.fence.get().to_string(),
                r.attempts.to_string(),
                html::age(r),
                esc(&clip(r.failure.as_deref().unwrap_or(""), REASON_CHARS)),
            ]
        })
        .collect();
    body.push_str(&table(
        &[
            "run", "state", "kind", "queue", "priority", "owner", "fence", "attempts", "created",
            "reason",
        ],
        &rows,
        "No run matches.",
    ));
    if found.cut {
        let _ = write!(
            body,
            "<p id=\"cut\"><small>The search stopped after reading {SCAN_MAX} runs: more may \
             match beyond them.</small></p>"
        );
    }
    if found.more || found.cut {
        if let Some(last) = runs.last() {
            let mut next = format!("runs?after={}", segment(last.run.as_str()));
            let query = filter.query();
            if !query.is_empty() {
                let _ = write!(next, "&{query}");
            }
            let _ = write!(
                body,
                "<p><a id=\"next\" href=\"{}\">next page</a></p>",
                esc(&next)
            );
        }
    }
    body
}

/// The bulk forms for the runs of `filter`: each asks for a confirmation first.
fn bulk_forms(filter: &RunFilter, token: &str) -> String {
    let mut out = format!(
        "<h2 id=\"bulk\">Every run of this filter</h2><p><small>The runs matching <q>{}</q>, \
         at most {BULK_MAX} at a time, the first by id: each button shows how many and what it \
         will do, and asks you to confirm.</small></p><p>",
        esc(&filter.describe())
    );
    for action in Bulk::ALL {
        let name = action.as_str();
        let extra = if action == Bulk::Cancel {
            "<input name=\"reason\" value=\"cancelled from the dashboard\" required maxlength=\"4096\" size=\"26\"> "
        } else {
            ""
        };
        let _ = write!(
            out,
            "<form class=\"action\" method=\"post\" action=\"bulk/{name}\">{}\
             <input type=\"hidden\" name=\"token\" value=\"{}\">{extra}\
             <button id=\"bulk-{name}\">{name}…</button></form>",
            filter.hidden(),
            esc(token),
        );
    }
    out.push_str("</p>");
    out
}
