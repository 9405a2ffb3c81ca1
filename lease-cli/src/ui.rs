//! `lease ui`: the dashboard (`lease_ui::router`) served on its own, loopback by default,
//! answering only to `localhost`, IP addresses and the names given with `--allow-host`.

use std::net::SocketAddr;

use distribution::{Backend, Config};
use lease_cli::{exit, usage, Failure};

#[derive(clap::Args)]
pub(crate) struct UiArgs {
    /// The address to serve on (port 0: a free port). Loopback unless told otherwise: another
    /// address serves every run's record to whoever reaches it. The address is printed.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Serve cancel, resume and force-release buttons on a run's page, pause and resume on
    /// the queues page, and bulk retry, cancel and purge (each confirmed on a page of its own
    /// first) on the runs page, and accept them when sent with the page's token. Each is
    /// logged.
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
    let options = lease_ui::Options::default()
        .with_actions(args.allow_actions)
        .with_refresh(args.refresh)
        .with_allowed_hosts(args.allow_hosts)
        .with_store_name(name);
    let app = lease_ui::router(store, options);
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
