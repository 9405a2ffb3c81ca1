//! What every action goes through: the per-process token its forms carry, the same-site check,
//! and the audit log; then the single-run actions (cancel, resume, force-release) and the
//! queues' pause and resume. The bulk actions (`bulk.rs`) pass the same [`check`].

use axum::extract::{Extension, Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use lease_core::{Error, Queue, RunId};
use serde::Deserialize;

use crate::{html, refused, store_error, Base, Peer, Shared, Ui};

/// The secret a page's action forms carry. Never logged: its `Debug` shows nothing of it.
pub(crate) struct Token(String);

impl Token {
    /// A token from the OS's random source; `None` when the OS gives none (actions stay off).
    pub(crate) fn new() -> Option<Token> {
        let mut bytes = [0u8; 32];
        match getrandom::fill(&mut bytes) {
            Ok(()) => Some(Token(bytes.iter().map(|b| format!("{b:02x}")).collect())),
            Err(e) => {
                tracing::error!(error = %e, "cannot draw the dashboard's action token from the OS: actions are off");
                None
            }
        }
    }

    /// The token as the forms carry it.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `offered` is the token, compared in time independent of where they differ.
    fn matches(&self, offered: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), offered.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(******)")
    }
}

/// Logs an action, accepted or refused, on stderr (whatever the log filter) and through
/// tracing: when, from where, which, on what (`run "x"`, `queue "q"`, `runs matching …`), and
/// how it ended.
pub(crate) fn audit(peer: &str, target: &str, action: &str, outcome: &str) {
    let now = chrono::DateTime::<chrono::Utc>::from(std::time::SystemTime::now())
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    eprintln!("lease ui: {now} {peer} {action:?} on {target}: {outcome}");
    tracing::info!(%peer, target, action, outcome, "lease ui action");
}

/// Whether the request came from another site: an `Origin` that is not this server, or a
/// browser's `Sec-Fetch-Site` saying so.
pub(crate) fn cross_site(headers: &HeaderMap) -> bool {
    let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = value("sec-fetch-site") {
        if site != "same-origin" && site != "none" {
            return true;
        }
    }
    match (value("origin"), value("host")) {
        (Some(origin), Some(host)) => origin != format!("http://{host}"),
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Lets an action through only with actions on, from this site, with the router's token:
/// `None`; else the refusal (403), logged, and nothing is read or changed.
pub(crate) fn check(
    ui: &Ui,
    peer: &str,
    target: &str,
    action: &str,
    headers: &HeaderMap,
    offered: &str,
) -> Option<Response> {
    let Some(token) = &ui.actions else {
        audit(peer, target, action, "refused: actions are off");
        return Some(refused(
            StatusCode::FORBIDDEN,
            "Actions are off: this dashboard was started without actions (lease ui --allow-actions).",
        ));
    };
    if cross_site(headers) {
        audit(peer, target, action, "refused: sent from another site");
        return Some(refused(
            StatusCode::FORBIDDEN,
            "Refused: the request came from another site.",
        ));
    }
    if !token.matches(offered) {
        audit(peer, target, action, "refused: without the page's token");
        return Some(refused(
            StatusCode::FORBIDDEN,
            "Refused: the request did not carry this dashboard's token (reload the page).",
        ));
    }
    None
}

#[derive(Deserialize)]
pub(crate) struct ActionForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    reason: String,
}

/// `POST runs/{run}/{action}`: cancel, resume or force-release one run, then back to its page.
pub(crate) async fn act(
    State(ui): State<Shared>,
    Extension(base): Extension<Base>,
    Extension(Peer(peer)): Extension<Peer>,
    Path((run, action)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    let target = format!("run {run:?}");
    if let Some(refusal) = check(&ui, &peer, &target, &action, &headers, &form.token) {
        return refusal;
    }
    let id = match RunId::new(&run) {
        Ok(id) => id,
        Err(e) => return store_error(&ui, &base, &Error::from(e)),
    };
    let done = match action.as_str() {
        "cancel" => ui
            .store
            .cancel(&id, &form.reason)
            .await
            .map(|_| "cancelled"),
        "resume" => ui.store.resume(&id).await.map(|_| "resumed"),
        "release" => ui.store.force_release(&id).await.map(|_| "force-released"),
        _ => return refused(StatusCode::NOT_FOUND, "No such action."),
    };
    let back = format!("{}/runs/{}", base.0, html::segment(&run));
    answer(&ui, &base, (&peer, &target, &action), done, &back)
}

/// An action's answer: audited either way, then a redirect to `back` when the store did it, or
/// the store's refusal.
fn answer(
    ui: &Shared,
    base: &Base,
    (peer, target, action): (&str, &str, &str),
    done: Result<&str, Error>,
    back: &str,
) -> Response {
    match done {
        Ok(what) => {
            audit(peer, target, action, what);
            Redirect::to(back).into_response()
        }
        Err(e) => {
            audit(peer, target, action, &format!("refused by the store: {e}"));
            store_error(ui, base, &e)
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct TokenForm {
    #[serde(default)]
    token: String,
}

/// `POST queues/{queue}/{pause|resume}`: pauses or resumes a queue fleet-wide, then back to
/// the queues page.
pub(crate) async fn queue_act(
    State(ui): State<Shared>,
    Extension(base): Extension<Base>,
    Extension(Peer(peer)): Extension<Peer>,
    Path((queue, action)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<TokenForm>,
) -> Response {
    let target = format!("queue {queue:?}");
    if let Some(refusal) = check(&ui, &peer, &target, &action, &headers, &form.token) {
        return refusal;
    }
    let id = match Queue::new(&queue) {
        Ok(id) => id,
        Err(e) => return store_error(&ui, &base, &Error::from(e)),
    };
    let done = match action.as_str() {
        "pause" => ui.store.pause_queue(&id).await.map(|_| "paused"),
        "resume" => ui.store.resume_queue(&id).await.map(|_| "resumed"),
        _ => return refused(StatusCode::NOT_FOUND, "No such action."),
    };
    let back = format!("{}/queues", base.0);
    answer(&ui, &base, (&peer, &target, &action), done, &back)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn the_token_compares_whole_and_never_prints() {
        let token = Token("ab".repeat(32));
        assert!(token.matches(&"ab".repeat(32)));
        assert!(!token.matches(&"ab".repeat(31)));
        assert!(!token.matches(&format!("{}ac", "ab".repeat(31))));
        assert!(!token.matches(""));
        assert_eq!(format!("{token:?}"), "Token(******)");
    }

    #[test]
    fn cross_site_requests_are_told_apart() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, HeaderValue::from_static(v));
            }
            h
        };
        assert!(!cross_site(&headers(&[])));
        assert!(!cross_site(&headers(&[
            ("host", "127.0.0.1:9"),
            ("origin", "http://127.0.0.1:9")
        ])));
        assert!(!cross_site(&headers(&[("sec-fetch-site", "same-origin")])));
        assert!(cross_site(&headers(&[
            ("host", "127.0.0.1:9"),
            ("origin", "http://evil.example")
        ])));
        assert!(cross_site(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(cross_site(&headers(&[("sec-fetch-site", "same-site")])));
        assert!(cross_site(&headers(&[("origin", "null")])));
    }
}
