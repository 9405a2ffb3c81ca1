//! Bulk actions over HTTP, on the memory store: a bulk cancel, retry or purge answers a
//! confirmation page first and changes nothing; the confirmation's button, sent back with the
//! count it showed, acts on exactly the runs of the filter the action applies to; without the
//! token, from another site or with actions off, nothing changes.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use common::{get, request, section, serve, snapshot, text_of, token};
use lease_core::{
    End, Error, Kind, LeaseStore, LeaseStoreExt, NewRun, RunId, RunState, Ttl, WorkerId,
};
use lease_runtime::MemoryLeaseStore;

fn id(run: &str) -> RunId {
    RunId::new(run).unwrap()
}

fn ttl() -> Ttl {
    Ttl::from_secs(600).unwrap()
}

/// Mail runs in every state (mail-2 held by worker-a, whose lease is returned), and two sms
/// runs: mail-1 claimable, mail-2 held, mail-3 failed, mail-4 completed, mail-5 cancelled,
/// susp-1 (mail) suspended, sms-1 claimable, sms-2 failed.
async fn seeded() -> (Arc<dyn LeaseStore>, lease_core::Lease) {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let mail = Kind::new("mail").unwrap();
    let sms = Kind::new("sms").unwrap();
    for (run, kind) in [
        ("mail-1", &mail),
        ("mail-2", &mail),
        ("mail-3", &mail),
        ("mail-4", &mail),
        ("mail-5", &mail),
        ("susp-1", &mail),
        ("sms-1", &sms),
        ("sms-2", &sms),
    ] {
        store
            .create_with(&NewRun::new(id(run)).with_kind(kind.clone()))
            .await
            .unwrap();
    }
    let w = WorkerId::new("worker-a").unwrap();
    let held = store.claim(&id("mail-2"), &w, ttl()).await.unwrap();
    for run in ["mail-3", "sms-2"] {
        let lease = store.claim(&id(run), &w, ttl()).await.unwrap();
        store.fail(&lease, "smtp said no").await.unwrap();
    }
    let lease = store.claim(&id("mail-4"), &w, ttl()).await.unwrap();
    store.complete(&lease).await.unwrap();
    store.cancel(&id("mail-5"), "duplicate").await.unwrap();
    let lease = store.claim(&id("susp-1"), &w, ttl()).await.unwrap();
    store.end_one(&lease, End::Suspend).await.unwrap();
    (store, held)
}

fn with_actions() -> lease_ui::Options {
    lease_ui::Options::default().with_actions(true)
}

#[tokio::test]
async fn a_bulk_cancel_asks_first_then_cancels_exactly_the_matching_runs() {
    let (store, held) = seeded().await;
    let app = Router::new().nest("/admin", lease_ui::router(store.clone(), with_actions()));
    let port = serve(app).await;

    let runs = get(port, "/admin/runs?kind=mail").await;
    assert!(runs.contains("action=\"bulk/cancel\""), "{runs}");
    assert!(
        !runs.contains(">sms-1</a>"),
        "the filter shows mail runs only: {runs}"
    );
    let token = token(&runs);
    let before = snapshot(&store).await;

    // The first POST shows the confirmation and changes nothing.
    let form = format!("token={token}&kind=mail&reason=mail+outage");
    let (status, page) = request(port, "POST", "/admin/bulk/cancel", &form, &[]).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(text_of(&page, "matched"), "4", "{page}");
    assert!(page.contains("kind mail"), "the filter in words: {page}");
    for run in ["mail-1", "mail-2", "mail-3", "susp-1"] {
        assert!(
            page.contains(&format!(">{run}</a>")),
            "{run} listed: {page}"
        );
    }
    for run in ["mail-4", "mail-5", "sms-1"] {
        assert!(
            !page.contains(&format!(">{run}</a>")),
            "{run} not listed: {page}"
        );
    }
    assert!(page.contains("action=\"bulk/cancel\""), "{page}");
    assert!(page.contains("name=\"seen\" value=\"4\""), "{page}");
    assert!(page.contains("name=\"confirm\" value=\"yes\""), "{page}");
    assert!(page.contains("name=\"kind\" value=\"mail\""), "{page}");
    assert!(
        page.contains("<code class=\"reason\">mail outage</code>"),
        "{page}"
    );
    assert!(page.contains(&format!("name=\"token\" value=\"{token}\"")));
    assert_eq!(
        snapshot(&store).await,
        before,
        "the confirmation page changed the store"
    );

    // A GET changes nothing either.
    let (status, _) = request(port, "GET", "/admin/bulk/cancel?kind=mail", "", &[]).await;
    assert_eq!(status, 405);
    assert_eq!(snapshot(&store).await, before);

    // A confirmation of another count (the set changed since the page) does nothing.
    let stale = format!("{form}&confirm=yes&seen=3");
    let (status, page) = request(port, "POST", "/admin/bulk/cancel", &stale, &[]).await;
    assert_eq!(status, 409, "{page}");
    assert!(page.contains("id=\"changed\""), "{page}");
    assert!(page.contains("showed 3 runs, 4 match now"), "{page}");
    assert_eq!(snapshot(&store).await, before);

    // The confirmation acts on exactly those four.
    let confirmed = format!("{form}&confirm=yes&seen=4");
    let (status, page) = request(port, "POST", "/admin/bulk/cancel", &confirmed, &[]).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(text_of(&page, "done"), "4", "{page}");
    assert_eq!(text_of(&page, "refused"), "0", "{page}");
    let after = snapshot(&store).await;
    for (b, a) in before.iter().zip(&after) {
        if ["mail-1", "mail-2", "mail-3", "susp-1"].contains(&b.0.as_str()) {
            assert_eq!(a.1, RunState::Cancelled, "{a:?}");
            assert_eq!(a.3.as_deref(), Some("mail outage"), "{a:?}");
        } else {
            assert_eq!(a, b, "a run outside the filter changed");
        }
    }
    // The held run's holder is fenced out.
    assert!(matches!(
        store.renew(&held).await,
        Err(Error::LeaseEnded { .. })
    ));
}

#[tokio::test]
async fn a_bulk_action_is_refused_without_the_token_from_another_site_or_with_actions_off() {
    let (store, _) = seeded().await;
    let port = serve(lease_ui::router(store.clone(), with_actions())).await;
    let token = token(&get(port, "/runs").await);
    let before = snapshot(&store).await;
    let confirmed = "kind=mail&reason=x&confirm=yes&seen=4";
    for (form, headers, why) in [
        (
            confirmed.to_owned(),
            vec![],
            "did not carry this dashboard's token",
        ),
        (
            format!("token={}&{confirmed}", "0".repeat(64)),
            vec![],
            "did not carry this dashboard's token",
        ),
        (
            format!("token={token}&{confirmed}"),
            vec![("Origin", "http://evil.example")],
            "another site",
        ),
        (
            format!("token={token}&{confirmed}"),
            vec![("Sec-Fetch-Site", "cross-site")],
            "another site",
        ),
    ] {
        for action in ["cancel", "purge", "retry"] {
            let path = format!("/bulk/{action}");
            let (status, answer) = request(port, "POST", &path, &form, &headers).await;
            assert_eq!(status, 403, "{form} {headers:?}: {answer}");
            assert!(answer.contains(why), "{answer}");
        }
    }
    assert_eq!(snapshot(&store).await, before);

    // Read-only: no bulk form, and a bulk POST is refused.
    let port = serve(lease_ui::router(
        store.clone(),
        lease_ui::Options::default(),
    ))
    .await;
    let runs = get(port, "/runs?kind=mail").await;
    assert!(!runs.contains("bulk/"), "{runs}");
    for action in ["cancel", "purge", "retry"] {
        let form = format!("token={token}&{confirmed}");
        let (status, answer) = request(port, "POST", &format!("/bulk/{action}"), &form, &[]).await;
        assert_eq!(status, 403, "{answer}");
        assert!(answer.contains("Actions are off"), "{answer}");
    }
    assert_eq!(snapshot(&store).await, before);
}

#[tokio::test]
async fn a_bulk_purge_deletes_only_ended_runs() {
    let (store, _) = seeded().await;
    let port = serve(lease_ui::router(store.clone(), with_actions())).await;
    let token = token(&get(port, "/runs").await);

    // The runnable ones are no purge's business: nothing to confirm.
    let form = format!("token={token}&state=runnable");
    let (status, page) = request(port, "POST", "/bulk/purge", &form, &[]).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(text_of(&page, "matched"), "0", "{page}");
    assert!(!page.contains("id=\"confirm\""), "{page}");

    let form = format!("token={token}");
    let (status, page) = request(port, "POST", "/bulk/purge", &form, &[]).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(text_of(&page, "matched"), "4", "{page}");
    let before = snapshot(&store).await;
    assert_eq!(before.len(), 8);
    let (status, page) = request(
        port,
        "POST",
        "/bulk/purge",
        &format!("{form}&confirm=yes&seen=4"),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(text_of(&page, "done"), "4", "{page}");
    for run in ["mail-3", "mail-4", "mail-5", "sms-2"] {
        assert!(
            matches!(store.inspect(&id(run)).await, Err(Error::NotFound { .. })),
            "{run} purged"
        );
    }
    let kept: Vec<_> = before
        .into_iter()
        .filter(|r| {
            !matches!(
                r.1,
                RunState::Completed | RunState::Failed | RunState::Cancelled
            )
        })
        .collect();
    assert_eq!(kept.len(), 4);
    assert_eq!(snapshot(&store).await, kept, "only the ended runs went");
}

#[tokio::test]
async fn a_bulk_retry_resumes_failed_and_suspended_runs_only() {
    let (store, _) = seeded().await;
    let port = serve(lease_ui::router(store.clone(), with_actions())).await;
    let token = token(&get(port, "/runs").await);
    let form = format!("token={token}&kind=mail");
    let (_, page) = request(port, "POST", "/bulk/retry", &form, &[]).await;
    assert_eq!(text_of(&page, "matched"), "2", "{page}");
    assert!(
        page.contains("Cancelled and completed runs cannot be run again"),
        "{page}"
    );
    assert!(
        page.contains("1 failed") && page.contains("1 suspended"),
        "{page}"
    );
    let before = snapshot(&store).await;
    let (_, page) = request(
        port,
        "POST",
        "/bulk/retry",
        &format!("{form}&confirm=yes&seen=2"),
        &[],
    )
    .await;
    assert_eq!(text_of(&page, "done"), "2", "{page}");
    for run in ["mail-3", "susp-1"] {
        let r = store.inspect(&id(run)).await.unwrap();
        assert_eq!(
            (r.state, r.attempts, r.failure),
            (RunState::Runnable, 0, None),
            "{run}"
        );
    }
    for (b, a) in before.iter().zip(snapshot(&store).await) {
        if b.0 != "mail-3" && b.0 != "susp-1" {
            assert_eq!(&a, b, "a run outside the set changed");
        }
    }
}

#[tokio::test]
async fn an_age_filter_takes_only_runs_created_long_enough_ago() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    for run in ["old-1", "old-2"] {
        store.create(&id(run)).await.unwrap();
    }
    // The memory store's clock is tokio's: three hours pass for it.
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(3 * 3600)).await;
    tokio::time::resume();
    store.create(&id("new-1")).await.unwrap();
    let port = serve(lease_ui::router(store.clone(), with_actions())).await;

    let runs = get(port, "/runs?age=2&unit=hours").await;
    assert!(
        runs.contains(">old-1</a>") && runs.contains(">old-2</a>"),
        "{runs}"
    );
    assert!(!runs.contains(">new-1</a>"), "{runs}");
    let (status, page) = request(port, "GET", "/runs?age=2&unit=fortnights", "", &[]).await;
    assert_eq!(status, 400, "{page}");
    assert!(page.contains("needs its unit"), "{page}");

    let form = format!("token={}&age=2&unit=hours&reason=stale", token(&runs));
    let (_, page) = request(port, "POST", "/bulk/cancel", &form, &[]).await;
    assert_eq!(text_of(&page, "matched"), "2", "{page}");
    assert!(page.contains("created more than 2 hours ago"), "{page}");
    let (_, page) = request(
        port,
        "POST",
        "/bulk/cancel",
        &format!("{form}&confirm=yes&seen=2"),
        &[],
    )
    .await;
    assert_eq!(text_of(&page, "done"), "2", "{page}");
    let states: Vec<_> = snapshot(&store)
        .await
        .into_iter()
        .map(|r| (r.0, r.1))
        .collect();
    assert_eq!(
        states,
        [
            ("new-1".to_owned(), RunState::Runnable),
            ("old-1".to_owned(), RunState::Cancelled),
            ("old-2".to_owned(), RunState::Cancelled),
        ]
    );
}

#[tokio::test]
async fn a_bulk_action_takes_at_most_a_thousand_runs_and_says_so() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let ids: Vec<RunId> = (0..1_005).map(|i| id(&format!("r-{i:04}"))).collect();
    for chunk in ids.chunks(500) {
        for result in store.create_many(chunk).await.unwrap() {
            result.unwrap();
        }
    }
    let port = serve(lease_ui::router(store.clone(), with_actions())).await;
    let form = format!("token={}&reason=too+many", token(&get(port, "/runs").await));
    let (_, page) = request(port, "POST", "/bulk/cancel", &form, &[]).await;
    assert_eq!(text_of(&page, "matched"), "1000", "{page}");
    assert!(
        section(&page, "more").contains("More than 1000 runs match"),
        "{page}"
    );
    let (_, page) = request(
        port,
        "POST",
        "/bulk/cancel",
        &format!("{form}&confirm=yes&seen=1000"),
        &[],
    )
    .await;
    assert_eq!(text_of(&page, "done"), "1000", "{page}");
    let runnable: Vec<String> = snapshot(&store)
        .await
        .into_iter()
        .filter(|r| r.1 == RunState::Runnable)
        .map(|r| r.0)
        .collect();
    assert_eq!(runnable, ["r-1000", "r-1001", "r-1002", "r-1003", "r-1004"]);
}
