//! What the dashboard's HTTP tests share: a server on a free port, one request at a time, the
//! page's action token, and the store's runs as a comparable snapshot.

#![allow(dead_code)] // each test binary uses its part

use std::sync::Arc;

use axum::Router;
use lease_core::{LeaseStore, ListFilter, RunState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves `app` on a free loopback port; the port.
pub(crate) async fn serve(app: Router) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

/// One HTTP/1.1 request to `port` naming `127.0.0.1:{port}` as its host, with `headers`; the
/// status and the whole answer.
pub(crate) async fn request(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let host = format!("127.0.0.1:{port}");
    request_to(port, &host, method, path, body, headers).await
}

/// [`request`] naming `host` as its host.
pub(crate) async fn request_to(
    port: u16,
    host: &str,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"));
    (status, answer)
}

/// A GET that must answer 200; the page.
pub(crate) async fn get(port: u16, path: &str) -> String {
    let (status, page) = request(port, "GET", path, "", &[]).await;
    assert_eq!(status, 200, "GET {path}: {page}");
    page
}

/// The action token a page's forms carry.
pub(crate) fn token(page: &str) -> String {
    let tag = "name=\"token\" value=\"";
    let at = page
        .find(tag)
        .unwrap_or_else(|| panic!("no token on {page}"))
        + tag.len();
    page[at..at + page[at..].find('"').unwrap()].to_owned()
}

/// The text of the element whose id is `id` up to its first `<`: `<span id="matched">3</span>`
/// gives `3`.
pub(crate) fn text_of<'a>(page: &'a str, id: &str) -> &'a str {
    let tag = format!("id=\"{id}\">");
    let at = page
        .find(&tag)
        .unwrap_or_else(|| panic!("no element {id} on {page}"))
        + tag.len();
    &page[at..at + page[at..].find('<').unwrap()]
}

/// The part of `page` from the element whose id is `id` to the next `<h2`.
pub(crate) fn section<'a>(page: &'a str, id: &str) -> &'a str {
    let at = page
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no section {id} on {page}"));
    let rest = &page[at..];
    let end = rest[1..].find("<h2").map_or(rest.len(), |e| e + 1);
    &rest[..end]
}

/// Each run's id, state, owner and reason, by id.
pub(crate) async fn snapshot(
    store: &Arc<dyn LeaseStore>,
) -> Vec<(String, RunState, Option<String>, Option<String>)> {
    store
        .list(&ListFilter::new().with_limit(lease_core::MAX_LIST))
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                r.run.as_str().to_owned(),
                r.state,
                r.owner.map(|w| w.as_str().to_owned()),
                r.failure,
            )
        })
        .collect()
}
