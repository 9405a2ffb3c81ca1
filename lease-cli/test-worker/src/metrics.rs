//! `--metrics ADDR`: the library's metrics in Prometheus text format over plain HTTP.
//!
//! The library reports through the `metrics` facade; this installs the Prometheus recorder and
//! answers every request on ADDR with the current exposition (`GET /metrics` or any path), so a
//! Prometheus server or `curl` can scrape a worker.

use std::net::SocketAddr;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use lease_cli::{usage, Failure};

/// Installs the Prometheus recorder and serves it on `addr` (port 0 picks a free port).
/// Returns the address it listens on.
pub(crate) async fn serve(addr: &str) -> Result<SocketAddr, Failure> {
    let addr: SocketAddr = addr.parse().map_err(|_| {
        usage(format!(
            "--metrics {addr:?} is not an address such as 127.0.0.1:9464"
        ))
    })?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| usage(format!("--metrics cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| usage(format!("--metrics: {e}")))?;
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| usage(format!("--metrics: cannot install the recorder: {e}")))?;
    distribution::observe::describe();
    tokio::spawn(accept(listener, handle));
    Ok(bound)
}

async fn accept(listener: TcpListener, handle: PrometheusHandle) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            // The request itself does not matter: read what arrives with it, then answer.
            let mut request = [0u8; 1024];
            let _ =
                tokio::time::timeout(std::time::Duration::from_secs(1), conn.read(&mut request))
                    .await;
            let body = handle.render();
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes()).await;
            let _ = conn.write_all(body.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}
