//! The library's metrics in Prometheus text format over HTTP (`lease worker --metrics-addr`,
//! `lease-test-worker --metrics`).
//!
//! The library reports through the `metrics` facade; this installs the Prometheus recorder
//! with the exporter's own HTTP listener, which answers `GET` on any path (`/metrics` too) with
//! the current exposition, so a Prometheus server or `curl` can scrape a worker.

use std::net::SocketAddr;

use metrics_exporter_prometheus::PrometheusBuilder;

use crate::{usage, Failure};

/// Installs the Prometheus recorder and its listener on `addr` (port 0 picks a free port),
/// given by the flag `flag` (named in the messages). Returns the address it listens on.
/// Call it inside a Tokio runtime, once per process.
///
/// # Errors
/// A usage failure for an address that does not parse or cannot be bound.
pub async fn serve(flag: &str, addr: &str) -> Result<SocketAddr, Failure> {
    let mut addr: SocketAddr = addr.parse().map_err(|_| {
        usage(format!(
            "{flag} {addr:?} is not an address such as 127.0.0.1:9464"
        ))
    })?;
    if addr.port() == 0 {
        // The exporter binds the address it is given and does not say which port 0 became:
        // find a free port first.
        let probe = std::net::TcpListener::bind(addr)
            .map_err(|e| usage(format!("{flag} cannot listen on {addr}: {e}")))?;
        addr = probe
            .local_addr()
            .map_err(|e| usage(format!("{flag}: {e}")))?;
    }
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| usage(format!("{flag} cannot serve on {addr}: {e}")))?;
    distribution::observe::describe();
    Ok(addr)
}
