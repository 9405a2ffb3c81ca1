//! The queues page: each queue paused or not, its depth (runnable runs: claimable, held,
//! delayed) and its lag (how long its longest-waiting claimable run has waited, on the store's
//! clock), read with one `list` of its runnable runs; the runnable runs of each kind with the
//! kind's lag, from `count_kinds`; and, with actions on, a pause or resume button per queue.

use std::fmt::Write;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::Response;
use lease_core::{Error, InvalidInput, KindCounts, ListFilter, QueueState, RunState};

use crate::html::{esc, instant, segment, span, table};
use crate::{page, store_error, Base, Shared};

/// How many runnable runs of one queue the page reads (by id) to count and time them.
pub(crate) const QUEUE_SCAN: usize = 1_000;
/// How many queues the page reads the runs of (the first by name); the others are named only.
pub(crate) const QUEUES_READ: usize = 50;

/// A queue's runnable runs, as read.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Depth {
    /// Runnable runs read (at most [`QUEUE_SCAN`]).
    pub(crate) runnable: usize,
    pub(crate) claimable: usize,
    pub(crate) held: usize,
    pub(crate) delayed: usize,
    /// The longest wait of a claimable run, where the store can tell.
    pub(crate) lag: Option<Duration>,
}

/// A queue as the page shows it.
pub(crate) struct QueueRow {
    pub(crate) state: QueueState,
    /// `None` for a queue past the first [`QUEUES_READ`].
    pub(crate) depth: Option<Depth>,
}

/// Counts `runs` (a queue's runnable runs) by part of their life, and times the longest wait.
pub(crate) fn depth(runs: &[lease_core::RunRecord]) -> Depth {
    let mut d = Depth {
        runnable: runs.len(),
        ..Depth::default()
    };
    for r in runs {
        if r.owner.is_some() && !r.is_expired() {
            d.held += 1;
        } else if r.owner.is_none() && r.not_before.is_some() {
            d.delayed += 1;
        } else {
            d.claimable += 1;
        }
        if let Some(waited) = r.waiting_for() {
            d.lag = Some(d.lag.map_or(waited, |l| l.max(waited)));
        }
    }
    d
}

pub(crate) async fn queues_page(
    State(ui): State<Shared>,
    Extension(base): Extension<Base>,
) -> Response {
    let store = &ui.store;
    let read = async {
        let queues = match store.queues().await {
            Ok(q) => Some(q),
            Err(Error::InvalidInput(InvalidInput::Unsupported { .. })) => None,
            Err(e) => return Err(e),
        };
        let rows = match queues {
            None => None,
            Some(queues) => {
                let mut rows = Vec::with_capacity(queues.len());
                for (i, state) in queues.into_iter().enumerate() {
                    let depth = if i < QUEUES_READ {
                        let filter = ListFilter::new()
                            .with_state(RunState::Runnable)
                            .with_queue(state.queue.clone())
                            .with_limit(QUEUE_SCAN);
                        Some(depth(&store.list(&filter).await?))
                    } else {
                        None
                    };
                    rows.push(QueueRow { state, depth });
                }
                Some(rows)
            }
        };
        let kinds = match store.count_kinds().await {
            Ok(k) => Some(k),
            Err(Error::InvalidInput(InvalidInput::Unsupported { .. })) => None,
            Err(e) => return Err(e),
        };
        Ok::<_, Error>((rows, kinds))
    };
    let (rows, kinds) = match read.await {
        Ok(r) => r,
        Err(e) => return store_error(&ui, &base, &e),
    };
    let token = ui.actions.as_ref().map(|t| t.as_str());
    let body = render(rows.as_deref(), kinds.as_deref(), token);
    page(StatusCode::OK, &ui, &base, "queues", &body)
}

fn count(n: usize) -> String {
    if n >= QUEUE_SCAN {
        format!("{n} or more")
    } else {
        n.to_string()
    }
}

/// The page: the queues (`None`: the store keeps none), the kinds (`None`: not counted), and
/// with the token, the pause and resume buttons.
pub(crate) fn render(
    queues: Option<&[QueueRow]>,
    kinds: Option<&[KindCounts]>,
    token: Option<&str>,
) -> String {
    let mut body = String::from("<h2 id=\"queues\">Queues</h2>");
    match queues {
        None => body
            .push_str("<p class=\"empty\">This store keeps no queues but the default (etcd).</p>"),
        Some(queues) => {
            let rows: Vec<Vec<String>> = queues
                .iter()
                .map(|q| {
                    let name = q.state.queue.as_str();
                    let state = if q.state.paused { "paused" } else { "running" };
                    let mut row = vec![
                        format!(
                            "<a class=\"queue\" href=\"runs?queue={}\">{}</a>",
                            esc(&segment(name)),
                            esc(name)
                        ),
                        format!("<span class=\"{state}\">{state}</span>"),
                        q.state
                            .changed_at
                            .map_or_else(|| "never paused".to_owned(), instant),
                    ];
                    match &q.depth {
                        Some(d) => {
                            let lag = match (d.lag, d.claimable) {
                                (_, 0) => "none waits".to_owned(),
                                (Some(l), _) => format!("<span class=\"lag\">{}</span>", span(l)),
                                (None, _) => "cannot tell".to_owned(),
                            };
                            row.extend([
                                format!("<span class=\"depth\">{}</span>", count(d.runnable)),
                                count(d.claimable),
                                count(d.held),
                                count(d.delayed),
                                lag,
                            ]);
                        }
                        None => row.extend(std::iter::repeat_n("not read".to_owned(), 5)),
                    }
                    if let Some(token) = token {
                        let (action, label) = if q.state.paused {
                            ("resume", "resume")
                        } else {
                            ("pause", "pause")
                        };
                        row.push(format!(
                            "<form class=\"action\" method=\"post\" action=\"queues/{}/{action}\">\
                             <input type=\"hidden\" name=\"token\" value=\"{}\">\
                             <button class=\"queue-{action}\">{label}</button></form>",
                            esc(&segment(name)),
                            esc(token)
                        ));
                    }
                    row
                })
                .collect();
            let mut headings = vec![
                "queue",
                "state",
                "paused or resumed (store clock)",
                "depth (runnable)",
                "claimable",
                "held",
                "delayed",
                "lag (longest wait)",
            ];
            if token.is_some() {
                headings.push("action");
            }
            body.push_str(&table(
                &headings,
                &rows,
                "No queue has runs waiting or has been paused.",
            ));
            let _ = write!(
                body,
                "<p><small>Depth and lag are read from the first {QUEUE_SCAN} runnable runs of \
                 each queue by id, for the first {QUEUES_READ} queues by name. A paused queue's \
                 runs still count as claimable: no worker claims them until it is resumed. A \
                 queue whose runs are all suspended or ended, never paused, is not listed.</small></p>"
            );
        }
    }
    body.push_str("<h2 id=\"kinds\">Runnable runs by kind</h2>");
    match kinds {
        None => {
            body.push_str("<p class=\"empty\">This store does not count runs by kind (etcd).</p>")
        }
        Some(kinds) => {
            let rows: Vec<Vec<String>> = kinds
                .iter()
                .map(|k| {
                    vec![
                        format!(
                            "<a href=\"runs?state=runnable&amp;kind={}\">{}</a>",
                            esc(&segment(k.kind.as_str())),
                            esc(k.kind.as_str())
                        ),
                        k.runnable.to_string(),
                        k.claimable.to_string(),
                        k.oldest_claimable_age.map_or_else(|| "-".to_owned(), span),
                    ]
                })
                .collect();
            body.push_str(&table(
                &["kind", "runnable", "claimable", "lag (longest wait)"],
                &rows,
                "No run is runnable.",
            ));
        }
    }
    body
}
