//! The dashboard of a lease store as an [`axum::Router`]: [`router`] gives the pages (an
//! overview with the counts, the queues and the runs that need a look; the runs, paged, by
//! state, kind, queue and age; each run's record, signals, attempts and journal; the queues
//! with their depth and lag; the schedules' last and next ticks; the live workers) and, when
//! [`Options::with_actions`] allows them, the cancel, resume and force-release forms of a run,
//! the pause and resume of a queue, and the bulk retry, cancel and purge of a filtered set of
//! runs behind a confirmation page. Nest it under any path of your own app, behind your own
//! middleware (authentication, CSRF, rate limits); `lease ui` serves the same router on its
//! own.
//!
//! ```no_run
//! # async fn serve(store: std::sync::Arc<dyn lease_core::LeaseStore>) -> std::io::Result<()> {
//! use axum::Router;
//!
//! // Your app, with the dashboard under /admin, read-only (Options::default()).
//! let app: Router = Router::new()
//!     .route("/", axum::routing::get(|| async { "my app" }))
//!     .nest("/admin", lease_ui::router(store, lease_ui::Options::default()));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await
//! # }
//! ```
//!
//! Server-rendered HTML (no script, no build step); pages refresh themselves with a
//! `<meta http-equiv="refresh">`, and their links are relative to where the router is nested
//! (a `<base>` element from the request's original path). Every answer forbids framing,
//! scripts, caching and referrers.
//!
//! Read-only unless [`Options::with_actions`]. Then the pages carry action forms, each with a
//! token drawn from the OS's random source when the router was built; a POST without that
//! token, or sent from another site (`Origin`, `Sec-Fetch-Site`), is refused with 403 and
//! changes nothing. A bulk action (at most 1,000 runs, the first by id) answers first a page
//! that says how many runs match and what will happen, and acts only when that page's button
//! is sent back with the count it showed, then says how many were done and why the others
//! were refused. Every action, accepted or refused, is logged (`tracing`, and standard
//! error). The store is named on the pages as its `Display` shows it: passwords redacted.
//!
//! "Retry" is the store's `resume`: a failed or suspended run runs again with a fresh attempt
//! budget. No store operation runs a cancelled or completed run again under its id, so the
//! dashboard offers none.

mod bulk;
mod filter;
mod fleet;
mod guard;
mod html;
mod pages;
mod queues;
mod run;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Extension, OriginalUri, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use lease_core::{Error, LeaseStore, ListFilter, RunId, RunState};
use serde::Deserialize;

struct Ui {
    store: Arc<dyn LeaseStore>,
    /// The store as the pages name it: the redacted URL and the namespace.
    name: String,
    /// The action token, when actions are on.
    actions: Option<guard::Token>,
    refresh: u32,
    /// The host names answered besides `localhost` and IP literals, in lower case; `None`:
    /// every host (the embedding app decides).
    hosts: Option<Vec<String>>,
}

type Shared = Arc<Ui>;

/// What [`router`] serves. [`Options::default`] is read-only, refreshes pages every 5 seconds,
/// answers every `Host` (your app's own middleware decides who reaches it) and names the store
/// by its `Display`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Options {
    actions: bool,
    refresh: u32,
    hosts: Option<Vec<String>>,
    name: Option<String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            actions: false,
            refresh: 5,
            hosts: None,
            name: None,
        }
    }
}

impl Options {
    /// Serves the action forms (a run's cancel, resume and force-release; a queue's pause and
    /// resume; the bulk retry, cancel and purge of the runs a filter names, each confirmed on
    /// a page of its own first), and accepts them when sent with the router's token from the
    /// same site. Each is logged. Put your own authentication in front.
    #[must_use]
    pub fn with_actions(mut self, on: bool) -> Options {
        self.actions = on;
        self
    }

    /// Seconds between a page's own refreshes (0: never; at most 3600).
    #[must_use]
    pub fn with_refresh(mut self, seconds: u32) -> Options {
        self.refresh = seconds.min(3600);
        self
    }

    /// Answers only requests whose `Host` is `localhost`, an IP address, or one of `names`
    /// (421 otherwise), so that a web page whose name was pointed at the server's address
    /// (DNS rebinding) cannot read the dashboard. What `lease ui` does.
    #[must_use]
    pub fn with_allowed_hosts(mut self, names: impl IntoIterator<Item = String>) -> Options {
        self.hosts = Some(
            names
                .into_iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect(),
        );
        self
    }

    /// How the pages name the store (default: its `Display`, passwords redacted). Keep
    /// secrets out of it.
    #[must_use]
    pub fn with_store_name(mut self, name: impl Into<String>) -> Options {
        self.name = Some(name.into());
        self
    }
}

/// The dashboard of `store` as a router, to nest under any path of an app
/// (`Router::nest("/admin", lease_ui::router(store, options))`: the overview is then at
/// `/admin`, the runs at `/admin/runs`; axum routes no `/admin/`) or to serve as it is. With
/// actions on, serve it with `into_make_service_with_connect_info::<SocketAddr>()` to have the
/// client's address in the action log (it says `unknown` otherwise).
pub fn router(store: Arc<dyn LeaseStore>, options: Options) -> Router {
    let name = options.name.unwrap_or_else(|| store.to_string());
    let state = Arc::new(Ui {
        store,
        name,
        actions: if options.actions {
            guard::Token::new()
        } else {
            None
        },
        refresh: options.refresh,
        hosts: options.hosts,
    });
    Router::new()
        .route("/", get(overview))
        .route("/runs", get(list))
        .route("/runs/{run}", get(run_page))
        .route("/runs/{run}/{action}", post(guard::act))
        .route("/bulk/{action}", post(bulk::bulk))
        .route("/queues", get(queues::queues_page))
        .route("/queues/{queue}/{action}", post(guard::queue_act))
        .route("/schedules", get(fleet::schedules_page))
        .route("/workers", get(fleet::workers_page))
        .fallback(|| async { refused(StatusCode::NOT_FOUND, "No such page.") })
        .method_not_allowed_fallback(|| async {
            refused(
                StatusCode::METHOD_NOT_ALLOWED,
                "Not with this method: actions are forms that POST.",
            )
        })
        .layer(axum::middleware::from_fn_with_state(state.clone(), context))
        .with_state(state)
}

/// Where the router is nested (`/admin`; empty at the root), from the request's original path:
/// what the pages' `<base>` and the redirects start with.
#[derive(Clone, Debug)]
struct Base(String);

/// Who sent the request, for the action log.
#[derive(Clone, Debug)]
struct Peer(String);

/// The base path from the original path and the path this router sees (`/admin/runs` and
/// `/runs` give `/admin`; `/admin` and `/` too).
fn base_of(original: &str, seen: &str) -> String {
    let base = original
        .strip_suffix(seen)
        .unwrap_or_else(|| if seen == "/" { original } else { "" });
    base.trim_end_matches('/').to_owned()
}

/// Before every handler: refuses a request whose `Host` is not `localhost`, an IP address, or
/// an allowed name (with any port), when [`Options::with_allowed_hosts`] asked for it (a
/// browser sends the name it resolved, so a page of another site rebound to this address names
/// its own and is refused before any store read); then notes the base path and the peer.
async fn context(
    State(ui): State<Shared>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(hosts) = &ui.hosts {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !host_allowed(host, hosts) {
            return refused(
                StatusCode::MISDIRECTED_REQUEST,
                "This dashboard does not answer to that host name: allow it (lease ui --allow-host NAME).",
            );
        }
    }
    let seen = request.uri().path().to_owned();
    let original = request
        .extensions()
        .get::<OriginalUri>()
        .map_or_else(|| seen.clone(), |o| o.0.path().to_owned());
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_owned(), |c| c.0.to_string());
    request
        .extensions_mut()
        .insert(Base(base_of(&original, &seen)));
    request.extensions_mut().insert(Peer(peer));
    next.run(request).await
}

/// Whether `host` (a `Host` header: a name or address, and maybe a port) names this server.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        return rest
            .split_once(']')
            .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok());
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    let name = name.to_ascii_lowercase();
    !name.is_empty()
        && (name == "localhost"
            || name.parse::<std::net::Ipv4Addr>().is_ok()
            || allowed.contains(&name))
}

/// A page with the headers every answer carries: no caching, no framing, no script, forms
/// only to this server, no referrer.
fn page(status: StatusCode, ui: &Ui, base: &Base, title: &str, body: &str) -> Response {
    let mut response = (
        status,
        Html(html::page(title, ui.refresh, &ui.name, &base.0, body)),
    )
        .into_response();
    harden(response.headers_mut());
    response
}

fn harden(headers: &mut HeaderMap) {
    let set = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'self'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

/// A short plain answer for what is not a page: an unknown path, a refused action.
fn refused(status: StatusCode, message: &str) -> Response {
    let mut response = (status, format!("{message}\n")).into_response();
    harden(response.headers_mut());
    response
}

/// A store error as a page: not found 404, bad input 400, a refusal 409, the rest 502.
fn store_error(ui: &Ui, base: &Base, e: &Error) -> Response {
    let status = match e {
        Error::NotFound { .. } => StatusCode::NOT_FOUND,
        Error::InvalidInput(_) => StatusCode::BAD_REQUEST,
        Error::Unavailable { .. } | Error::Backend { .. } => StatusCode::BAD_GATEWAY,
        _ => StatusCode::CONFLICT,
    };
    let body = format!("<p id=\"error\">{}</p>", html::esc(&e.to_string()));
    page(status, ui, base, "error", &body)
}

async fn overview(State(ui): State<Shared>, Extension(base): Extension<Base>) -> Response {
    let store = &ui.store;
    let filter =
        |state: RunState, limit: usize| ListFilter::new().with_state(state).with_limit(limit);
    let read = async {
        Ok::<_, Error>(pages::Overview {
            counts: store.count().await?,
            runnable: store
                .list(&filter(RunState::Runnable, pages::RUNNABLE_SCAN))
                .await?,
            failed: store.list(&filter(RunState::Failed, pages::SHOWN)).await?,
            suspended: store
                .list(&filter(RunState::Suspended, pages::SHOWN))
                .await?,
            queues: match store.queues().await {
                Ok(queues) => Some(queues),
                Err(Error::InvalidInput(lease_core::InvalidInput::Unsupported { .. })) => None,
                Err(e) => return Err(e),
            },
        })
    };
    match read.await {
        Ok(o) => page(StatusCode::OK, &ui, &base, "overview", &pages::overview(&o)),
        Err(e) => store_error(&ui, &base, &e),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    #[serde(flatten)]
    filter: filter::FilterFields,
    #[serde(default)]
    after: Option<String>,
}

async fn list(
    State(ui): State<Shared>,
    Extension(base): Extension<Base>,
    Query(q): Query<ListQuery>,
) -> Response {
    let filter = match filter::RunFilter::parse(&q.filter) {
        Ok(f) => f,
        Err(why) => {
            let body = format!("<p id=\"error\">{}</p>", html::esc(&why));
            return page(StatusCode::BAD_REQUEST, &ui, &base, "error", &body);
        }
    };
    let after = match q
        .after
        .filter(|s| !s.is_empty())
        .map(RunId::new)
        .transpose()
    {
        Ok(after) => after,
        Err(e) => return store_error(&ui, &base, &Error::from(e)),
    };
    let found = filter::find(
        &*ui.store,
        &filter,
        &[filter.state],
        after.as_ref(),
        pages::LIST_PAGE,
    )
    .await;
    match found {
        Ok(found) => {
            let token = ui.actions.as_ref().map(guard::Token::as_str);
            let body = pages::list(&found, &filter, after.as_ref(), token);
            page(StatusCode::OK, &ui, &base, "runs", &body)
        }
        Err(e) => store_error(&ui, &base, &e),
    }
}

async fn run_page(
    State(ui): State<Shared>,
    Extension(base): Extension<Base>,
    Path(run): Path<String>,
) -> Response {
    let ui = &*ui;
    let read = async {
        let run = RunId::new(&run)?;
        let record = ui.store.inspect(&run).await?;
        let journal = ui.store.journal(&run).await?;
        Ok::<_, Error>((record, journal))
    };
    match read.await {
        Ok((record, journal)) => {
            let token = ui.actions.as_ref().map(guard::Token::as_str);
            let body = run::run_page(&record, &journal, token);
            page(StatusCode::OK, ui, &base, record.run.as_str(), &body)
        }
        Err(e) => store_error(ui, &base, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_to_loopback_names_addresses_and_allowed_hosts_only() {
        let allowed = vec!["dash.internal".to_owned()];
        for host in [
            "127.0.0.1:7070",
            "localhost:7070",
            "LOCALHOST",
            "[::1]:7070",
            "10.0.0.5:80",
            "dash.internal:7070",
            "Dash.Internal",
        ] {
            assert!(host_allowed(host, &allowed), "{host}");
        }
        for host in [
            "",
            "evil.example:7070",
            "localhost.evil.example",
            "127.0.0.1.nip.io:7070",
            "[evil]:7070",
            ":7070",
        ] {
            assert!(!host_allowed(host, &allowed), "{host}");
        }
    }

    #[test]
    fn the_base_is_where_the_router_is_nested() {
        assert_eq!(base_of("/admin/runs/x", "/runs/x"), "/admin");
        assert_eq!(base_of("/admin", "/"), "/admin");
        assert_eq!(base_of("/admin/", "/"), "/admin");
        assert_eq!(base_of("/runs", "/runs"), "");
        assert_eq!(base_of("/", "/"), "");
        assert_eq!(base_of("/a/b/", "/"), "/a/b");
    }
}
