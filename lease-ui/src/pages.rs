//! The dashboard's pages, rendered from what the store answered: the overview, a list of
//! runs, and a run's own page. Pure functions of their input, so the tests can read them
//! without a server.

use std::fmt::Write;

use lease_core::{JournalEntry, RunCounts, RunRecord, RunState, MAX_COUNT};

use super::html::{clip, esc, instant, relative, run_link, segment, span, table};

/// How many runnable runs the overview reads to find the held ones and the expired leases.
pub(crate) const RUNNABLE_SCAN: usize = 1_000;
/// How many failed and suspended runs the overview shows.
pub(crate) const SHOWN: usize = 50;
/// How many runs a list page shows.
pub(crate) const LIST_PAGE: usize = 100;
/// How many of a run's last journal entries its page shows.
pub(crate) const JOURNAL_SHOWN: usize = 200;
/// How many characters of a reason a table shows (a run's page shows all of it).
const REASON_CHARS: usize = 300;
/// How many characters of a payload or journal entry a page shows.
const PAYLOAD_CHARS: usize = 2_000;

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

fn state_cell(r: &RunRecord) -> String {
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

    let _ = write!(body, "<h2 id=\"queues\">Queues</h2>");
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

/// A page of runs, with the filter that chose them and a link to the next page.
pub(crate) fn list(
    runs: &[RunRecord],
    state: Option<RunState>,
    kind: Option<&str>,
    after: Option<&str>,
) -> String {
    let mut body = String::from("<h2>Runs</h2><form method=\"get\" action=\"runs\">state ");
    body.push_str("<select name=\"state\"><option value=\"\">any</option>");
    for s in [
        RunState::Runnable,
        RunState::Suspended,
        RunState::Completed,
        RunState::Failed,
        RunState::Cancelled,
    ] {
        let selected = if state == Some(s) { " selected" } else { "" };
        let _ = write!(
            body,
            "<option value=\"{0}\"{selected}>{0}</option>",
            s.as_str()
        );
    }
    let _ = write!(
        body,
        "</select> kind <input name=\"kind\" value=\"{}\" size=\"16\"> <button>show</button></form>",
        esc(kind.unwrap_or(""))
    );
    if let Some(after) = after {
        let _ = write!(body, "<p><small>After {}.</small></p>", esc(after));
    }
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                run_link(r.run.as_str()),
                state_cell(r),
                esc(r.kind.as_str()),
                r.priority.to_string(),
                esc(r.owner.as_ref().map_or("", |w| w.as_str())),
                r.fence.get().to_string(),
                r.attempts.to_string(),
                esc(&clip(r.failure.as_deref().unwrap_or(""), REASON_CHARS)),
            ]
        })
        .collect();
    body.push_str(&table(
        &[
            "run", "state", "kind", "priority", "owner", "fence", "attempts", "reason",
        ],
        &rows,
        "No run matches.",
    ));
    if runs.len() >= LIST_PAGE {
        let last = runs.last().expect("a full page").run.as_str();
        let mut next = format!("runs?after={}", segment(last));
        if let Some(s) = state {
            let _ = write!(next, "&state={}", s.as_str());
        }
        if let Some(k) = kind {
            let _ = write!(next, "&kind={}", segment(k));
        }
        let _ = write!(
            body,
            "<p><a id=\"next\" href=\"{}\">next page</a></p>",
            esc(&next)
        );
    }
    body
}

/// A run's page: its record, its journal's last entries, and (with actions on) its buttons.
pub(crate) fn run_page(r: &RunRecord, journal: &[JournalEntry], token: Option<&str>) -> String {
    let mut body = format!(
        "<h2>Run <code id=\"run\">{}</code></h2>",
        esc(r.run.as_str())
    );
    let mut rows = vec![
        ("state", state_cell(r)),
        ("kind", esc(r.kind.as_str())),
        ("queue", esc(r.queue.as_str())),
        ("priority", r.priority.to_string()),
        (
            "fence",
            format!("<span class=\"fence\">{}</span>", r.fence.get()),
        ),
        ("attempts", r.attempts.to_string()),
        ("heartbeats", r.heartbeats.to_string()),
    ];
    for (name, at) in [
        ("created", r.created_at),
        ("claimed", r.claimed_at),
        ("renewed", r.renewed_at),
        ("ended", r.ended_at),
    ] {
        if let Some(at) = at {
            rows.push((
                name,
                format!("{} <small>({})</small>", instant(at), relative(r, at)),
            ));
        }
    }
    if let Some(d) = r.held_for() {
        rows.push((
            "held for",
            format!("<span class=\"held-for\">{}</span>", span(d)),
        ));
    }
    if let Some(owner) = &r.owner {
        let label = if r.is_expired() {
            "last holder"
        } else {
            "holder"
        };
        rows.push((
            label,
            format!("<span class=\"holder\">{}</span>", esc(owner.as_str())),
        ));
    }
    if let Some(at) = r.expires_at {
        rows.push((
            "lease expires",
            format!("{} <small>({})</small>", instant(at), relative(r, at)),
        ));
    }
    if let Some(at) = r.not_before {
        rows.push((
            "claimable from",
            format!("{} <small>({})</small>", instant(at), relative(r, at)),
        ));
    }
    if let Some(wait) = &r.wait {
        let until = match wait.deadline {
            Some(at) => format!("until {} <small>({})</small>", instant(at), relative(r, at)),
            None => "without a timeout".to_owned(),
        };
        rows.push((
            "waits for",
            format!(
                "signal <span class=\"signal\">{}</span> (the wait of fence {}), {until}",
                esc(wait.name.as_str()),
                wait.fence.get()
            ),
        ));
    }
    match &r.resumed {
        Some(lease_core::WaitEnd::Signalled(s)) => rows.push((
            "last wait",
            format!(
                "signal <span class=\"signal\">{}</span> arrived {} <small>({})</small>: {}",
                esc(s.name.as_str()),
                instant(s.at),
                relative(r, s.at),
                shown_bytes(s.payload())
            ),
        )),
        Some(lease_core::WaitEnd::TimedOut { name, at, .. }) => rows.push((
            "last wait",
            format!(
                "for signal <span class=\"signal\">{}</span>, timed out at {}",
                esc(name.as_str()),
                instant(*at)
            ),
        )),
        _ => {}
    }
    if let Some(reason) = &r.failure {
        rows.push((
            "reason",
            format!("<pre class=\"reason\">{}</pre>", esc(reason)),
        ));
    }
    if let Some(payload) = &r.payload {
        rows.push(("payload", shown_bytes(payload)));
    }
    rows.push(("read at (store clock)", instant(r.observed_at)));
    body.push_str("<table id=\"record\"><tbody>");
    for (name, value) in rows {
        let _ = write!(body, "<tr><th>{name}</th><td>{value}</td></tr>");
    }
    body.push_str("</tbody></table>");

    if let Some(token) = token {
        body.push_str(&actions(r, token));
    }

    body.push_str(&attempts(r));

    let shown = &journal[journal.len().saturating_sub(JOURNAL_SHOWN)..];
    let _ = write!(body, "<h2 id=\"journal\">Journal</h2>");
    if shown.len() < journal.len() {
        let _ = write!(
            body,
            "<p><small>The last {} of {} entries.</small></p>",
            shown.len(),
            journal.len()
        );
    }
    let entries: Vec<Vec<String>> = shown
        .iter()
        .map(|e| {
            vec![
                e.seq.to_string(),
                e.fence.get().to_string(),
                instant(e.written_at),
                shown_bytes(&e.payload),
            ]
        })
        .collect();
    body.push_str(&table(
        &["seq", "fence", "written at (store clock)", "payload"],
        &entries,
        "The journal is empty.",
    ));
    body
}

/// The run's last attempts, newest first: who held it under which fence, when, how each
/// ended and with what error.
fn attempts(r: &RunRecord) -> String {
    let Some(history) = &r.history else {
        return String::from(
            "<h2 id=\"attempts\">Attempts</h2><p class=\"empty\">This store keeps no attempt history.</p>",
        );
    };
    let rows: Vec<Vec<String>> = history
        .iter()
        .rev()
        .map(|a| {
            let took = match (a.claimed_at, a.ended_at) {
                (Some(c), Some(e)) => span(e.saturating_since(c)),
                (Some(c), None) => format!("{} so far", span(r.observed_at.saturating_since(c))),
                _ => String::new(),
            };
            vec![
                a.attempt.to_string(),
                format!("<span class=\"fence\">{}</span>", a.fence.get()),
                format!("<span class=\"holder\">{}</span>", esc(a.worker.as_str())),
                a.claimed_at.map(instant).unwrap_or_default(),
                took,
                format!("<span class=\"outcome {0}\">{0}</span>", a.outcome.as_str()),
                a.error
                    .as_deref()
                    .map(|e| format!("<pre class=\"reason\">{}</pre>", esc(e)))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    format!(
        "<h2 id=\"attempts\">Attempts</h2><p><small>The last {} attempts, newest first.</small></p>{}",
        lease_core::MAX_HISTORY,
        table(
            &["attempt", "fence", "worker", "claimed (store clock)", "took", "outcome", "error"],
            &rows,
            "Never claimed.",
        )
    )
}

/// Bytes as escaped text when they are UTF-8, else their size and first bytes in hex.
fn shown_bytes(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => format!("<pre>{}</pre>", esc(&clip(text, PAYLOAD_CHARS))),
        Err(_) => {
            let hex = super::html::hex(&bytes[..bytes.len().min(64)]);
            let more = if bytes.len() > 64 { "…" } else { "" };
            format!(
                "<small>{} bytes, not UTF-8:</small> <code>{hex}{more}</code>",
                bytes.len()
            )
        }
    }
}

/// The action buttons a run's state allows, each a form carrying the page's token.
fn actions(r: &RunRecord, token: &str) -> String {
    let action = |name: &str, label: &str, extra: &str| {
        format!(
            "<form class=\"action\" method=\"post\" action=\"runs/{}/{name}\">\
             <input type=\"hidden\" name=\"token\" value=\"{}\">{extra}\
             <button id=\"action-{name}\">{label}</button></form>",
            esc(&segment(r.run.as_str())),
            esc(token),
        )
    };
    let mut out = String::from("<h2 id=\"actions\">Actions</h2><p>");
    if !matches!(r.state, RunState::Completed | RunState::Cancelled) {
        out.push_str(&action(
            "cancel",
            "cancel",
            "<input name=\"reason\" placeholder=\"reason\" required maxlength=\"4096\"> ",
        ));
    }
    if matches!(r.state, RunState::Suspended | RunState::Failed) {
        out.push_str(&action("resume", "resume", ""));
    }
    if r.state == RunState::Runnable && r.owner.is_some() {
        out.push_str(&action("release", "force-release", ""));
    }
    out.push_str("</p>");
    out
}
