//! A run's own page: its record, its signals (the wait under way and how the last one
//! ended), its attempts with the journal entries each wrote, its journal's last entries, and
//! with actions on, the buttons its state allows.

use std::fmt::Write;

use lease_core::{JournalEntry, RunRecord, RunState};

use crate::html::{clip, esc, instant, relative, segment, span, table};
use crate::pages::state_cell;

/// How many of a run's last journal entries its page shows.
pub(crate) const JOURNAL_SHOWN: usize = 200;
/// How many characters of a payload or journal entry a page shows.
const PAYLOAD_CHARS: usize = 2_000;

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
    if let Some(parent) = &r.trace_parent {
        // The trace the run was enqueued in: its id is what a tracing backend searches by.
        rows.push((
            "trace",
            format!(
                "<code class=\"trace\" title=\"traceparent {}\">{}</code>",
                esc(parent.as_str()),
                esc(parent.trace_id())
            ),
        ));
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

    body.push_str(&signals(r));
    body.push_str(&attempts(r, journal));

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

/// What the run waited for and how its last wait ended: the store keeps the wait under way
/// (`RunRecord::wait`) and the answer to the last one (`RunRecord::resumed`), not earlier
/// signals.
fn signals(r: &RunRecord) -> String {
    let mut rows: Vec<(&str, String)> = Vec::new();
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
        let answer = if wait.timed_out(r.observed_at) {
            "<span class=\"timed-out\">timed out</span>: a signal is refused now, and the next \
             claim takes the run and ends the wait as timed out"
                .to_owned()
        } else {
            format!(
                "a signal whose token names this run, <code>{}</code> and fence {} answers it \
                 (<code>lease signal TOKEN</code>), once; the run is then claimable, with a \
                 fresh attempt budget",
                esc(wait.name.as_str()),
                wait.fence.get()
            )
        };
        rows.push(("answer", answer));
    }
    match &r.resumed {
        Some(lease_core::WaitEnd::Signalled(s)) => rows.push((
            "last wait",
            format!(
                "signal <span class=\"signal\">{}</span> answered the wait of fence {}, arrived \
                 {} <small>({})</small>, with {} bytes: {}",
                esc(s.name.as_str()),
                s.fence.get(),
                instant(s.at),
                relative(r, s.at),
                s.payload().len(),
                shown_bytes(s.payload())
            ),
        )),
        Some(lease_core::WaitEnd::TimedOut { name, fence, at }) => rows.push((
            "last wait",
            format!(
                "for signal <span class=\"signal\">{}</span> (the wait of fence {}), \
                 <span class=\"timed-out\">timed out</span> at {}",
                esc(name.as_str()),
                fence.get(),
                instant(*at)
            ),
        )),
        _ => {}
    }
    let suspended = r.history.as_ref().map_or(0, |h| {
        h.iter()
            .filter(|a| a.outcome == lease_core::AttemptOutcome::Suspended)
            .count()
    });
    if suspended > 0 {
        rows.push((
            "suspended attempts",
            format!("{suspended} of the attempts below ended by suspending the run"),
        ));
    }
    let mut out = String::from("<h2 id=\"signals\">Signals</h2>");
    if rows.is_empty() {
        out.push_str(
            "<p class=\"empty\">No wait: the run waits for no signal, and the store keeps no \
             answer to an earlier wait (it forgets it once the run waits again, and a run that \
             never waited has none).</p>",
        );
        return out;
    }
    out.push_str("<table id=\"wait\"><tbody>");
    for (name, value) in rows {
        let _ = write!(out, "<tr><th>{name}</th><td>{value}</td></tr>");
    }
    out.push_str(
        "</tbody></table><p><small>The store keeps the wait under way and how the last one \
         ended; earlier signals are not kept.</small></p>",
    );
    out
}

/// The run's last attempts, newest first: who held it under which fence, when, how each
/// ended and with what error, and how many journal entries it wrote.
fn attempts(r: &RunRecord, journal: &[JournalEntry]) -> String {
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
            let written = journal.iter().filter(|e| e.fence == a.fence).count();
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
                format!("<span class=\"written\">{written}</span>"),
            ]
        })
        .collect();
    let kept = format!(
        "The store keeps the last {} attempts.",
        lease_core::MAX_HISTORY
    );
    format!(
        "<h2 id=\"attempts\">Attempts</h2><p id=\"attempt-summary\">Latest fence \
         <span class=\"fence\">{}</span>; the attempt budget has counted <span \
         class=\"budget\">{}</span> since the run was created or last resumed (voluntary ends \
         are refunded). <small>Newest first. {kept}</small></p>{}",
        r.fence.get(),
        r.attempts,
        table(
            &[
                "attempt",
                "fence",
                "worker",
                "claimed (store clock)",
                "took",
                "outcome",
                "error",
                "journal entries",
            ],
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
