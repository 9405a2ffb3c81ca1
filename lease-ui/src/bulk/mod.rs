//! Bulk actions on the runs a filter names: retry, cancel or purge, at most [`BULK_MAX`] runs
//! at a time. The runs page's forms post the filter to `bulk/{action}`, which answers a
//! confirmation page (how many runs, in which states, what will happen, and the first of
//! them) and changes nothing; its button posts the filter again with the count it showed and
//! `confirm=yes`, and only then is the set read again and, if it still has that many runs,
//! acted on, run by run (a purge in one call), with every run accounted for: done, or refused
//! with the store's reason, grouped.
//!
//! What each does, with the store's operations only:
//! - **retry** is [`resume`](lease_core::LeaseStore::resume), the contract's only way to run
//!   a run again: a failed or suspended run becomes claimable at once with a fresh attempt
//!   budget (a suspended run waiting for a signal stops waiting, with no answer). A cancelled
//!   or completed run cannot be run again under its id: no store operation does it.
//! - **cancel** is [`cancel`](lease_core::LeaseStore::cancel) of each runnable (held
//!   included: its holder is fenced out), suspended or failed run, with the form's reason.
//! - **purge** is [`purge_ids`](lease_core::LeaseStore::purge_ids) of the completed, failed
//!   and cancelled runs: deleted with their journals; the count is what the store removed.

mod apply;
mod page;

use axum::extract::{Extension, Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use lease_core::RunState;
use serde::Deserialize;

use crate::filter::{find, FilterFields, RunFilter};
use crate::guard::{audit, check};
use crate::html::esc;
use crate::{page, refused, store_error, Base, Peer, Shared};
use apply::apply;
use page::{confirmation, result};

/// The most runs one bulk action takes: the first this many by id (a purge's batch bound).
pub(crate) const BULK_MAX: usize = lease_core::MAX_BATCH;

/// A bulk action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bulk {
    Retry,
    Cancel,
    Purge,
}

impl Bulk {
    pub(crate) const ALL: [Bulk; 3] = [Bulk::Retry, Bulk::Cancel, Bulk::Purge];

    fn parse(name: &str) -> Option<Bulk> {
        Bulk::ALL.into_iter().find(|b| b.as_str() == name)
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Bulk::Retry => "retry",
            Bulk::Cancel => "cancel",
            Bulk::Purge => "purge",
        }
    }

    /// The states of the runs it acts on; runs of the filter in other states are left alone.
    pub(crate) fn states(self) -> &'static [RunState] {
        match self {
            Bulk::Retry => &[RunState::Failed, RunState::Suspended],
            Bulk::Cancel => &[RunState::Runnable, RunState::Suspended, RunState::Failed],
            Bulk::Purge => &[RunState::Completed, RunState::Failed, RunState::Cancelled],
        }
    }

    fn done(self) -> &'static str {
        match self {
            Bulk::Retry => "retried",
            Bulk::Cancel => "cancelled",
            Bulk::Purge => "purged",
        }
    }

    /// What it does to each run, for the confirmation page.
    pub(crate) fn explain(self) -> &'static str {
        match self {
            Bulk::Retry => {
                "Each failed or suspended run is resumed: claimable at once, with a fresh attempt \
                 budget; a failed run's reason is cleared, and a run waiting for a signal stops \
                 waiting without an answer. Cancelled and completed runs cannot be run again: no \
                 store operation re-runs an ended run under its id, so they are not counted."
            }
            Bulk::Cancel => {
                "Each runnable, suspended or failed run is cancelled with the reason below, for \
                 good: never claimed again. A held run's holder is fenced out at its next write. \
                 Completed and cancelled runs are not counted."
            }
            Bulk::Purge => {
                "Each completed, failed or cancelled run is deleted with its journal: nothing of \
                 it is kept. Runs that have not ended are not counted, and the store removes none \
                 that is not ended when it acts."
            }
        }
    }
}

/// The bulk form: the filter, the token, the reason of a cancel, and the confirmation.
#[derive(Deserialize)]
pub(crate) struct BulkForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    confirm: String,
    #[serde(default)]
    seen: String,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    queue: Option<String>,
    #[serde(default)]
    age: Option<String>,
    #[serde(default)]
    unit: Option<String>,
}

/// The runs the filter names that `action` acts on: the filter's state if the action takes
/// it, else the action's states.
fn states_of(action: Bulk, filter: &RunFilter) -> Vec<Option<RunState>> {
    action
        .states()
        .iter()
        .filter(|s| filter.state.is_none_or(|f| f == **s))
        .map(|s| Some(*s))
        .collect()
}

/// `POST bulk/{action}`: the confirmation page, or with `confirm=yes` and the count it
/// showed, the action and its outcome.
pub(crate) async fn bulk(
    State(ui): State<Shared>,
    Extension(base): Extension<Base>,
    Extension(Peer(peer)): Extension<Peer>,
    Path(action): Path<String>,
    headers: HeaderMap,
    Form(form): Form<BulkForm>,
) -> Response {
    let fields = FilterFields {
        state: form.state.clone(),
        kind: form.kind.clone(),
        queue: form.queue.clone(),
        age: form.age.clone(),
        unit: form.unit.clone(),
    };
    let parsed = RunFilter::parse(&fields);
    let target = match &parsed {
        Ok(filter) => format!("runs matching {:?}", filter.describe()),
        Err(_) => "runs matching a bad filter".to_owned(),
    };
    let bulk_action = format!("bulk {action}");
    if let Some(refusal) = check(&ui, &peer, &target, &bulk_action, &headers, &form.token) {
        return refusal;
    }
    let Some(action) = Bulk::parse(&action) else {
        return refused(StatusCode::NOT_FOUND, "No such bulk action.");
    };
    let filter = match parsed {
        Ok(filter) => filter,
        Err(why) => return bad_request(&ui, &base, &why),
    };
    let reason = form.reason.trim();
    if action == Bulk::Cancel {
        if reason.is_empty() {
            return bad_request(&ui, &base, "A cancel needs a reason.");
        }
        if let Err(e) = lease_core::backend::check_reason(reason) {
            return bad_request(&ui, &base, &e.to_string());
        }
    }
    let found = match find(
        &*ui.store,
        &filter,
        &states_of(action, &filter),
        None,
        BULK_MAX,
    )
    .await
    {
        Ok(found) => found,
        Err(e) => return store_error(&ui, &base, &e),
    };
    let token = ui.actions.as_ref().map_or("", |t| t.as_str());
    let ask = |status: StatusCode, notice: &str| {
        let body = confirmation(action, &filter, &found, reason, token, notice);
        page(
            status,
            &ui,
            &base,
            &format!("{} runs?", action.as_str()),
            &body,
        )
    };
    if form.confirm != "yes" {
        audit(
            &peer,
            &target,
            &bulk_action,
            &format!("asked to confirm {} runs", found.runs.len()),
        );
        return ask(StatusCode::OK, "");
    }
    let Ok(seen) = form.seen.parse::<usize>() else {
        return bad_request(&ui, &base, "The confirmation carries no count of runs.");
    };
    if seen != found.runs.len() {
        audit(
            &peer,
            &target,
            &bulk_action,
            &format!(
                "refused: the set changed ({seen} runs confirmed, {} now)",
                found.runs.len()
            ),
        );
        let notice = format!(
            "The set changed since the confirmation page: it showed {seen} runs, {} match now. \
             Nothing was done: confirm again.",
            found.runs.len()
        );
        return ask(StatusCode::CONFLICT, &notice);
    }
    let outcome = apply(&*ui.store, action, &found.runs, reason).await;
    for run in &outcome.done {
        audit(
            &peer,
            &format!("run {:?}", run.as_str()),
            &bulk_action,
            action.done(),
        );
    }
    for (why, runs) in &outcome.refused {
        for run in runs {
            audit(
                &peer,
                &format!("run {:?}", run.as_str()),
                &bulk_action,
                &format!("refused: {why}"),
            );
        }
    }
    audit(
        &peer,
        &target,
        &bulk_action,
        &format!(
            "{} of {} runs {}, {} refused",
            outcome.done.len(),
            found.runs.len(),
            action.done(),
            found.runs.len() - outcome.done.len()
        ),
    );
    let body = result(action, &filter, found.runs.len(), &outcome);
    page(StatusCode::OK, &ui, &base, action.done(), &body)
}

fn bad_request(ui: &crate::Ui, base: &Base, why: &str) -> Response {
    let body = format!("<p id=\"error\">{}</p>", esc(why));
    page(StatusCode::BAD_REQUEST, ui, base, "error", &body)
}
