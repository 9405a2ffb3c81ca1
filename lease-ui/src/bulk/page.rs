//! The bulk action's pages: the confirmation (how many runs, in which states, what will
//! happen, the first of them, and the button that carries the filter, the count and the
//! token) and the outcome (how many done, how many refused and why).

use std::collections::BTreeMap;
use std::fmt::Write;

use lease_core::RunRecord;

use super::apply::Outcome;
use super::{Bulk, BULK_MAX};
use crate::filter::{Found, RunFilter, SCAN_MAX};
use crate::html::{esc, run_link, table};
use crate::pages;

/// How many of the runs a confirmation or a result page lists.
const LISTED: usize = 50;

/// How many of `runs` are in each state, in words: `3 failed, 1 suspended`; runnable runs say
/// how many are held.
fn by_state(runs: &[RunRecord]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for r in runs {
        *counts.entry(pages::shown_state(r).0).or_default() += 1;
    }
    counts
        .iter()
        .map(|(state, n)| format!("<span class=\"by-state\">{n} {state}</span>"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn listed(runs: &[RunRecord]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .take(LISTED)
        .map(|r| {
            vec![
                run_link(r.run.as_str()),
                pages::state_cell(r),
                esc(r.kind.as_str()),
                esc(r.queue.as_str()),
                crate::html::age(r),
            ]
        })
        .collect();
    let mut out = table(&["run", "state", "kind", "queue", "created"], &rows, "");
    if runs.len() > LISTED {
        let _ = write!(
            out,
            "<p><small>The first {LISTED} of {} by id.</small></p>",
            runs.len()
        );
    }
    out
}

/// The confirmation page: the count, the states, what will happen, the runs, and the button
/// that carries the filter, the count and the token.
pub(super) fn confirmation(
    action: Bulk,
    filter: &RunFilter,
    found: &Found,
    reason: &str,
    token: &str,
    notice: &str,
) -> String {
    let n = found.runs.len();
    let name = action.as_str();
    let mut body = format!("<h2>Confirm: {name} {n} runs</h2>");
    if !notice.is_empty() {
        let _ = write!(
            body,
            "<p id=\"changed\" class=\"notice\">{}</p>",
            esc(notice)
        );
    }
    let states: Vec<&str> = action.states().iter().map(|s| s.as_str()).collect();
    let states = match states.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    let _ = write!(
        body,
        "<p id=\"bulk-count\"><span id=\"matched\">{n}</span> runs match <q>{}</q> and are {} \
         (what {name} acts on){}.</p>",
        esc(&filter.describe()),
        states,
        if n > 0 {
            format!(": {}", by_state(&found.runs))
        } else {
            String::new()
        },
    );
    if found.more {
        let _ = write!(
            body,
            "<p id=\"more\" class=\"notice\">More than {BULK_MAX} runs match: this action takes \
             the first {BULK_MAX} by id. Run it again for the rest.</p>"
        );
    }
    if found.cut {
        let _ = write!(
            body,
            "<p id=\"cut\" class=\"notice\">The search stopped after reading {SCAN_MAX} runs of a \
             state without finding {BULK_MAX}: more may match beyond them, and are not counted.</p>"
        );
    }
    if filter.age.is_some() {
        body.push_str(
            "<p><small>A run whose creation time the store does not keep never matches an \
             age.</small></p>",
        );
    }
    let _ = write!(body, "<p>{}</p>", esc(action.explain()));
    if n == 0 {
        let _ = write!(
            body,
            "<p class=\"empty\">Nothing to do.</p><p><a href=\"runs?{}\">back to the runs</a></p>",
            esc(&filter.query())
        );
        return body;
    }
    body.push_str(&listed(&found.runs));
    let reason_field = if action == Bulk::Cancel {
        format!(
            "<p>reason: <code class=\"reason\">{0}</code></p>\
             <input type=\"hidden\" name=\"reason\" value=\"{0}\">",
            esc(reason)
        )
    } else {
        String::new()
    };
    let _ = write!(
        body,
        "<form class=\"bulk\" method=\"post\" action=\"bulk/{name}\">{}{reason_field}\
         <input type=\"hidden\" name=\"token\" value=\"{}\">\
         <input type=\"hidden\" name=\"seen\" value=\"{n}\">\
         <input type=\"hidden\" name=\"confirm\" value=\"yes\">\
         <button id=\"confirm\">{name} these {n} runs</button> \
         <a href=\"runs?{}\">back to the runs</a></form>",
        filter.hidden(),
        esc(token),
        esc(&filter.query()),
    );
    body
}

/// The outcome page: how many done, how many refused and why, every run accounted for.
pub(super) fn result(action: Bulk, filter: &RunFilter, total: usize, outcome: &Outcome) -> String {
    let done = outcome.done.len();
    let refused: usize = outcome.refused.values().map(Vec::len).sum();
    let mut body = format!(
        "<h2>{} <span id=\"done\">{done}</span> of {total} runs</h2>\
         <p id=\"accounted\">Of the {total} runs matching <q>{}</q>: {done} {}, \
         <span id=\"refused\">{refused}</span> refused.</p>",
        capitalized(action.done()),
        esc(&filter.describe()),
        action.done(),
    );
    if !outcome.refused.is_empty() {
        let rows: Vec<Vec<String>> = outcome
            .refused
            .iter()
            .map(|(why, runs)| {
                let shown: Vec<String> =
                    runs.iter().take(10).map(|r| run_link(r.as_str())).collect();
                let more = if runs.len() > 10 { " …" } else { "" };
                vec![
                    format!("<span class=\"why\">{}</span>", esc(why)),
                    runs.len().to_string(),
                    format!("{}{more}", shown.join(" ")),
                ]
            })
            .collect();
        body.push_str("<h2 id=\"refusals\">Refused</h2>");
        body.push_str(&table(&["why", "runs", "the first of them"], &rows, ""));
    }
    if done > 0 {
        let shown: Vec<String> = outcome
            .done
            .iter()
            .take(LISTED)
            .map(|r| {
                if action == Bulk::Purge {
                    format!("<code>{}</code>", esc(r.as_str()))
                } else {
                    run_link(r.as_str())
                }
            })
            .collect();
        let more = if done > LISTED { " …" } else { "" };
        let _ = write!(
            body,
            "<h2 id=\"done-runs\">{}</h2><p>{}{more}</p>",
            capitalized(action.done()),
            shown.join(" ")
        );
    }
    let _ = write!(
        body,
        "<p><a href=\"runs?{}\">back to the runs</a></p>",
        esc(&filter.query())
    );
    body
}

fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map_or_else(String::new, |c| c.to_uppercase().chain(chars).collect())
}
