//! The dashboard nested in an app of its own: `Router::nest("/admin", lease_ui::router(…))`
//! answers 200 on its pages under `/admin`, its links and redirects stay under `/admin`, the
//! app's own routes are untouched, and an action needs the page's token.

mod common;

use std::sync::Arc;

use axum::Router;
use common::{request_to, serve};
use lease_core::{LeaseStore, RunId, RunState, Ttl, WorkerId};
use lease_runtime::MemoryLeaseStore;

/// One HTTP/1.1 request to `port` for the app's own host name; the status and the whole answer.
async fn request(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    request_to(port, "shop.example", method, path, body, &[]).await
}

async fn store() -> Arc<dyn LeaseStore> {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    for id in ["order-1", "order-2"] {
        store.create(&RunId::new(id).unwrap()).await.unwrap();
    }
    store
}

#[tokio::test]
async fn nested_under_admin_the_pages_answer_and_link_under_admin() {
    let store = store().await;
    let app = Router::new()
        .route("/", axum::routing::get(|| async { "the shop" }))
        .nest(
            "/admin",
            lease_ui::router(store, lease_ui::Options::default()),
        );
    let port = serve(app).await;

    let (status, page) = request(port, "GET", "/admin", "").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("<base href=\"/admin/\">"), "{page}");
    assert!(page.contains("href=\"runs?state=failed\""), "{page}");
    assert!(page.contains("<h1><a href=\"/admin\">"), "{page}");
    let (status, page) = request(port, "GET", "/admin/runs", "").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("href=\"runs/order-1\""), "{page}");
    let (status, page) = request(port, "GET", "/admin/runs/order-2", "").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("id=\"run\">order-2<"), "{page}");
    // Read-only by default: no forms, and a POST changes nothing.
    assert!(!page.contains("action-cancel"), "{page}");
    let (status, _) = request(port, "POST", "/admin/runs/order-2/cancel", "reason=x").await;
    assert_eq!(status, 403);
    // Any Host is answered: the app's own middleware decides who reaches it.
    let (status, page) = request(port, "GET", "/", "").await;
    assert_eq!((status, page.ends_with("the shop")), (200, true), "{page}");
    let (status, _) = request(port, "GET", "/admin/nothing-here", "").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn with_actions_a_form_with_the_token_acts_and_redirects_under_admin() {
    let store = store().await;
    let lease = store
        .claim(
            &RunId::new("order-1").unwrap(),
            &WorkerId::new("w").unwrap(),
            Ttl::from_secs(60).unwrap(),
        )
        .await
        .unwrap();
    let options = lease_ui::Options::default()
        .with_actions(true)
        .with_allowed_hosts(["shop.example".to_owned()]);
    let app = Router::new().nest("/admin", lease_ui::router(store.clone(), options));
    let port = serve(app).await;
    let (status, page) = request(port, "GET", "/admin/runs/order-1", "").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("action=\"runs/order-1/cancel\""), "{page}");
    let tag = "name=\"token\" value=\"";
    let at = page.find(tag).expect("the page's token") + tag.len();
    let token = &page[at..at + 64];
    let (status, _) = request(port, "POST", "/admin/runs/order-1/cancel", "reason=x").await;
    assert_eq!(status, 403, "without the token");
    let (status, answer) = request(
        port,
        "POST",
        "/admin/runs/order-1/cancel",
        &format!("token={token}&reason=out+of+stock"),
    )
    .await;
    assert_eq!(status, 303, "{answer}");
    assert!(answer.contains("location: /admin/runs/order-1"), "{answer}");
    let record = store.inspect(lease.run()).await.unwrap();
    assert_eq!(record.state, RunState::Cancelled);
}
