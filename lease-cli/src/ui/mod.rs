//! `lease ui`: a web dashboard of one store, served by this binary.
//!
//! Server-rendered HTML (no script, no build step) over axum, the HTTP crate of the tokio
//! project, already in the build through the etcd client's gRPC stack. Pages refresh
//! themselves with a `<meta http-equiv="refresh">`.
//!
//! Read-only unless started with `--allow-actions`. Then a run's page carries cancel, resume
//! and force-release forms, each with a token drawn from the OS's random source when the
//! server started; a POST without that token, or sent from another site (`Origin`,
//! `Sec-Fetch-Site`), is refused with 403 and changes nothing. Every action, accepted or
//! refused, is logged. The store URL reaches the page only redacted.

mod html;
mod pages;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Form, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use distribution::{Backend, Config, Error, Kind, LeaseStore, ListFilter, RunId, RunState};
use lease_cli::{exit, usage, Failure};
use serde::Deserialize;

#[derive(clap::Args)]
pub(crate) struct UiArgs {
    /// The address to serve on (port 0: a free port). Loopback unless told otherwise: another
    /// address serves every run's record to whoever reaches it. The address is printed.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Serve cancel, resume and force-release buttons on a run's page, and accept them when
    /// sent with the page's token. Each is logged.
    #[arg(long)]
    allow_actions: bool,
    /// Seconds between a page's own refreshes, 0 to 3600 (0: never).
    #[arg(long, value_name = "SECONDS", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(0..=3600))]
    refresh: u32,
    /// A host name the dashboard answers to besides `localhost` and IP addresses (repeat for
    /// several). A request naming another host is refused, so that a web page whose name
    /// was pointed at this address (DNS rebinding) cannot read the dashboard.
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_hosts: Vec<String>,
}

/// The secret a page's action forms carry. Never logged: its `Debug` shows nothing of it.
struct Token(String);

impl Token {
    fn new() -> Result<Token, Failure> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| Failure {
            code: exit::FAILURE,
            message: format!("cannot draw the page token from the OS: {e}"),
        })?;
        Ok(Token(bytes.iter().map(|b| format!("{b:02x}")).collect()))
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

struct Ui {
    store: Arc<dyn LeaseStore>,
    /// The store as the pages name it: the redacted URL and the namespace.
    name: String,
    /// The action token, when actions are on.
    actions: Option<Token>,
    refresh: u32,
    /// The host names answered besides `localhost` and IP literals, in lower case.
    hosts: Vec<String>,
}

type Shared = Arc<Ui>;

pub(crate) async fn ui(config: &Config, args: UiArgs) -> Result<(), Failure> {
    if config.backend()? == Backend::Memory {
        return Err(usage(
            "lease ui shows a store other processes share; memory: lives inside this one \
             process: name one with --store or LEASE_STORE (postgres://, redis:// or etcd://)",
        ));
    }
    let store = crate::ops::read_only(config).await?;
    let name = match &config.namespace {
        Some(ns) => format!("{} namespace {ns}", distribution::redact_url(&config.store)),
        None => distribution::redact_url(&config.store),
    };
    let actions = if args.allow_actions {
        Some(Token::new()?)
    } else {
        None
    };
    let state = Arc::new(Ui {
        store,
        name,
        actions,
        refresh: args.refresh,
        hosts: args
            .allow_hosts
            .iter()
            .map(|h| h.trim().to_ascii_lowercase())
            .collect(),
    });
    let app = Router::new()
        .route("/", get(overview))
        .route("/runs", get(list))
        .route("/runs/{run}", get(run_page))
        .route("/runs/{run}/{action}", post(act))
        .fallback(|| async { refused(StatusCode::NOT_FOUND, "No such page.") })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            known_host,
        ))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| usage(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener.local_addr().map_err(|e| Failure {
        code: exit::FAILURE,
        message: format!("cannot read the listening address: {e}"),
    })?;
    if !addr.ip().is_loopback() {
        eprintln!("lease ui: warning: {addr} is not a loopback address: whoever reaches it sees every run");
    }
    println!(
        "lease ui: serving http://{addr}/ ({})",
        if args.allow_actions {
            "actions on"
        } else {
            "read-only"
        }
    );
    let shutdown = crate::schedule::shutdown_on_signals()?;
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move { shutdown.cancelled().await })
    .await
    .map_err(|e| Failure {
        code: exit::FAILURE,
        message: format!("the dashboard's server stopped: {e}"),
    })
}

/// Refuses a request whose `Host` is not `localhost`, an IP address, or a name given with
/// `--allow-host` (with any port): a browser sends the name it resolved, so a page of another
/// site rebound to this address names its own and is refused before any store read.
async fn known_host(
    State(ui): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if host_allowed(host, &ui.hosts) {
        return next.run(request).await;
    }
    refused(
        StatusCode::MISDIRECTED_REQUEST,
        "This dashboard does not answer to that host name: start lease ui with --allow-host NAME to use it.",
    )
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
fn page(status: StatusCode, ui: &Ui, title: &str, body: &str) -> Response {
    let mut response =
        (status, Html(html::page(title, ui.refresh, &ui.name, body))).into_response();
    harden(response.headers_mut());
    response
}

fn harden(headers: &mut HeaderMap) {
    let set = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
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
fn store_error(ui: &Ui, e: &Error) -> Response {
    let status = match e {
        Error::NotFound { .. } => StatusCode::NOT_FOUND,
        Error::InvalidInput(_) => StatusCode::BAD_REQUEST,
        Error::Unavailable { .. } | Error::Backend { .. } => StatusCode::BAD_GATEWAY,
        _ => StatusCode::CONFLICT,
    };
    let body = format!("<p id=\"error\">{}</p>", html::esc(&e.to_string()));
    page(status, ui, "error", &body)
}

async fn overview(State(ui): State<Shared>) -> Response {
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
                Err(Error::InvalidInput(distribution::InvalidInput::Unsupported { .. })) => None,
                Err(e) => return Err(e),
            },
        })
    };
    match read.await {
        Ok(o) => page(StatusCode::OK, &ui, "overview", &pages::overview(&o)),
        Err(e) => store_error(&ui, &e),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    after: Option<String>,
}

async fn list(State(ui): State<Shared>, Query(q): Query<ListQuery>) -> Response {
    let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty());
    let (state, kind, after) = (nonempty(q.state), nonempty(q.kind), nonempty(q.after));
    let parsed = (|| {
        let state = state.as_deref().map(str::parse::<RunState>).transpose()?;
        let kind_id = kind.as_deref().map(Kind::new).transpose()?;
        let after_id = after.as_deref().map(RunId::new).transpose()?;
        Ok::<_, distribution::InvalidInput>((state, kind_id, after_id))
    })();
    let (state_filter, kind_id, after_id) = match parsed {
        Ok(p) => p,
        Err(e) => return store_error(&ui, &Error::from(e)),
    };
    let filter = ListFilter::new()
        .with_state(state_filter)
        .with_kind(kind_id)
        .with_after(after_id)
        .with_limit(pages::LIST_PAGE);
    match ui.store.list(&filter).await {
        Ok(runs) => {
            let body = pages::list(&runs, state_filter, kind.as_deref(), after.as_deref());
            page(StatusCode::OK, &ui, "runs", &body)
        }
        Err(e) => store_error(&ui, &e),
    }
}

async fn run_page(State(ui): State<Shared>, Path(run): Path<String>) -> Response {
    let ui = &*ui;
    let read = async {
        let run = RunId::new(&run)?;
        let record = ui.store.inspect(&run).await?;
        let journal = ui.store.journal(&run).await?;
        Ok::<_, Error>((record, journal))
    };
    match read.await {
        Ok((record, journal)) => {
            let token = ui.actions.as_ref().map(|t| t.0.as_str());
            let body = pages::run_page(&record, &journal, token);
            page(StatusCode::OK, ui, record.run.as_str(), &body)
        }
        Err(e) => store_error(ui, &e),
    }
}

#[derive(Deserialize)]
struct ActionForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    reason: String,
}

/// Logs an action, accepted or refused, on stderr (whatever the log filter) and through
/// tracing: when, from where, which, on what run, and how it ended.
fn audit(peer: SocketAddr, run: &str, action: &str, outcome: &str) {
    let now = chrono::DateTime::<chrono::Utc>::from(std::time::SystemTime::now())
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    eprintln!("lease ui: {now} {peer} {action:?} on run {run:?}: {outcome}");
    tracing::info!(%peer, run, action, outcome, "lease ui action");
}

/// Whether the request came from another site: an `Origin` that is not this server, or a
/// browser's `Sec-Fetch-Site` saying so.
fn cross_site(headers: &HeaderMap) -> bool {
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

async fn act(
    State(ui): State<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((run, action)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    let Some(token) = &ui.actions else {
        audit(peer, &run, &action, "refused: actions are off");
        return refused(
            StatusCode::FORBIDDEN,
            "Actions are off: this lease ui was started without --allow-actions.",
        );
    };
    if cross_site(&headers) {
        audit(peer, &run, &action, "refused: sent from another site");
        return refused(
            StatusCode::FORBIDDEN,
            "Refused: the request came from another site.",
        );
    }
    if !token.matches(&form.token) {
        audit(peer, &run, &action, "refused: without the page's token");
        return refused(
            StatusCode::FORBIDDEN,
            "Refused: the request did not carry this dashboard's token (reload the run's page).",
        );
    }
    let id = match RunId::new(&run) {
        Ok(id) => id,
        Err(e) => return store_error(&ui, &Error::from(e)),
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
    match done {
        Ok(what) => {
            audit(peer, &run, &action, what);
            Redirect::to(&format!("/runs/{}", html::segment(&run))).into_response()
        }
        Err(e) => {
            audit(peer, &run, &action, &format!("refused by the store: {e}"));
            store_error(&ui, &e)
        }
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
