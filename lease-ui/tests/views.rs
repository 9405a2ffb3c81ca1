//! The queues, schedules and workers pages, and a run's signals and attempts, on a seeded
//! memory store: each answers 200 with the figures the seed makes, every page links every
//! view, and a queue's pause and resume buttons need the token.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use common::{get, request, section, serve, token};
use lease_core::{End, LeaseStore, LeaseStoreExt, NewRun, Queue, RunId, SignalName, Ttl, WorkerId};
use lease_runtime::{CancellationToken, MemoryLeaseStore, Schedule, Scheduler};

fn id(run: &str) -> RunId {
    RunId::new(run).unwrap()
}

fn worker(name: &str) -> WorkerId {
    WorkerId::new(name).unwrap()
}

/// The table row of the cell `>{cell}<` in `page`.
fn row_of<'a>(page: &'a str, cell: &str) -> &'a str {
    let at = page
        .find(&format!(">{cell}<"))
        .unwrap_or_else(|| panic!("no {cell} on {page}"));
    let start = page[..at].rfind("<tr>").unwrap();
    let end = at + page[at..].find("</tr>").unwrap();
    &page[start..end]
}

#[tokio::test]
async fn the_queues_page_shows_each_queue_paused_or_not_with_its_depth_and_lag() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let mailers = Queue::new("mailers").unwrap();
    for run in ["m-held", "m-waiting", "m-delayed", "m-done"] {
        let new = NewRun::new(id(run)).with_queue(mailers.clone());
        let new = if run == "m-delayed" {
            new.with_delay(Duration::from_secs(3600))
        } else {
            new
        };
        store.create_with(&new).await.unwrap();
    }
    let ttl = Ttl::from_secs(600).unwrap();
    store.claim(&id("m-held"), &worker("w"), ttl).await.unwrap();
    let lease = store.claim(&id("m-done"), &worker("w"), ttl).await.unwrap();
    store.complete(&lease).await.unwrap();
    store.create(&id("d-1")).await.unwrap();
    store.pause_queue(&mailers).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let port = serve(lease_ui::router(
        store.clone(),
        lease_ui::Options::default(),
    ))
    .await;
    let page = get(port, "/queues").await;
    let mail = row_of(&page, "mailers");
    assert!(
        mail.contains("<span class=\"paused\">paused</span>"),
        "{mail}"
    );
    // depth 3 (the completed run is not runnable): 1 claimable, 1 held, 1 delayed.
    assert!(
        mail.contains("<span class=\"depth\">3</span></td><td>1</td><td>1</td><td>1</td>"),
        "{mail}"
    );
    assert!(
        mail.contains("<span class=\"lag\">"),
        "the waiting run's lag: {mail}"
    );
    let default = row_of(&page, "default");
    assert!(
        default.contains("<span class=\"running\">running</span>"),
        "{default}"
    );
    assert!(
        default.contains("<span class=\"depth\">1</span>"),
        "{default}"
    );
    assert!(section(&page, "kinds").contains(">default</a>"), "{page}");
    assert!(
        !page.contains("queues/mailers/"),
        "read-only: no button: {page}"
    );

    let port = serve(lease_ui::router(
        store.clone(),
        lease_ui::Options::default().with_actions(true),
    ))
    .await;
    let page = get(port, "/queues").await;
    assert!(page.contains("action=\"queues/mailers/resume\""), "{page}");
    assert!(page.contains("action=\"queues/default/pause\""), "{page}");
    let (status, _) = request(port, "POST", "/queues/mailers/resume", "", &[]).await;
    assert_eq!(status, 403, "without the token");
    let evil = [("Origin", "http://evil.example")];
    let form = format!("token={}", token(&page));
    let (status, _) = request(port, "POST", "/queues/mailers/resume", &form, &evil).await;
    assert_eq!(status, 403, "from another site");
    assert!(store
        .queues()
        .await
        .unwrap()
        .iter()
        .any(|q| q.queue == mailers && q.paused));
    let (status, answer) = request(port, "POST", "/queues/mailers/resume", &form, &[]).await;
    assert_eq!(status, 303, "{answer}");
    assert!(answer.contains("location: /queues"), "{answer}");
    assert!(store
        .queues()
        .await
        .unwrap()
        .iter()
        .any(|q| q.queue == mailers && !q.paused));
}

#[tokio::test]
async fn the_schedules_page_shows_each_schedules_last_and_next_tick() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let leases: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let ttl = Ttl::from_secs(5).unwrap();
    let every = |secs| Schedule::every(Duration::from_secs(secs)).unwrap();
    let make = |name: &str, schedule| {
        Scheduler::new(
            store.clone(),
            leases.clone(),
            name,
            schedule,
            worker("s"),
            ttl,
        )
        .unwrap()
    };
    // Hourly, on time: its three last ticks, the last one completed.
    let hourly = make("hourly", every(3600));
    let last = now / 3600 * 3600;
    for tick in [last - 7200, last - 3600, last] {
        store.create(&hourly.tick_run(tick)).await.unwrap();
    }
    let lease = store
        .claim(&hourly.tick_run(last), &worker("w"), ttl)
        .await
        .unwrap();
    store.complete(&lease).await.unwrap();
    // Every minute, stopped two days ago.
    let stale = make("stale", every(60));
    let stopped = (now - 2 * 86_400) / 60 * 60;
    for tick in [stopped - 60, stopped] {
        store.create(&stale.tick_run(tick)).await.unwrap();
    }
    // At 09:00 UTC on some days (a cron schedule): two ticks three days apart.
    let nine = 1_796_374_800; // 2026-12-04T09:00:00Z
    for tick in [nine, nine + 3 * 86_400] {
        store
            .create(&id(&format!("weekdays@{tick}")))
            .await
            .unwrap();
    }
    store.create(&id("order@home")).await.unwrap();
    // A real scheduler, every second, until it has enqueued two ticks.
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(make("live", every(1)).run(shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let runs = common::snapshot(&store).await;
        if runs.iter().filter(|r| r.0.starts_with("live@")).count() >= 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the scheduler enqueued no two ticks"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    running.await.unwrap().unwrap();

    let port = serve(lease_ui::router(
        store.clone(),
        lease_ui::Options::default(),
    ))
    .await;
    let page = get(port, "/schedules").await;
    let utc = |secs: u64| {
        chrono::DateTime::from_timestamp(secs as i64, 0)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    let hourly = row_of(&page, "hourly");
    assert!(hourly.contains("2 claimable, 1 completed"), "{hourly}");
    assert!(
        hourly.contains(&format!("<span class=\"last-tick\">{}</span>", utc(last))),
        "{hourly}"
    );
    assert!(
        hourly.contains(&format!(">hourly@{last}</a> <small>(completed)")),
        "{hourly}"
    );
    assert!(
        hourly.contains("every <span class=\"every\">1 h 00 min</span>"),
        "{hourly}"
    );
    assert!(
        hourly.contains(&format!(
            "<span class=\"next-tick\">{}</span>",
            utc(last + 3600)
        )),
        "{hourly}"
    );
    assert!(!hourly.contains("overdue"), "{hourly}");
    let stale = row_of(&page, "stale");
    assert!(stale.contains("class=\"overdue\""), "{stale}");
    assert!(
        stale.contains("ticks due since the last one are not in the store"),
        "{stale}"
    );
    let weekdays = row_of(&page, "weekdays");
    assert!(weekdays.contains("irregular"), "{weekdays}");
    assert!(
        weekdays.contains("cannot tell from the store"),
        "{weekdays}"
    );
    let live = row_of(&page, "live");
    assert!(
        live.contains("every <span class=\"every\">1.0 s</span>"),
        "{live}"
    );
    assert!(!page.contains(">order<"), "not a tick id: {page}");
}

#[tokio::test]
async fn the_workers_page_shows_one_row_per_worker_and_which_are_live() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    for run in ["a-1", "a-2", "b-1", "gone-1", "free-1"] {
        store.create(&id(run)).await.unwrap();
    }
    let long = Ttl::from_secs(600).unwrap();
    let a = store
        .claim(&id("a-1"), &worker("worker-a"), long)
        .await
        .unwrap();
    store
        .claim(&id("a-2"), &worker("worker-a"), long)
        .await
        .unwrap();
    store
        .claim(&id("b-1"), &worker("worker-b"), long)
        .await
        .unwrap();
    store
        .claim(
            &id("gone-1"),
            &worker("worker-gone"),
            Ttl::from_secs(1).unwrap(),
        )
        .await
        .unwrap();
    // Two seconds pass for the memory store (its clock is tokio's): worker-gone's lease expires.
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(2)).await;
    tokio::time::resume();
    store.renew(&a).await.unwrap();
    let renewed = store.inspect(&id("a-1")).await.unwrap().renewed_at.unwrap();

    let port = serve(lease_ui::router(
        store.clone(),
        lease_ui::Options::default(),
    ))
    .await;
    let page = get(port, "/workers").await;
    let a = row_of(&page, "worker-a");
    assert!(a.contains("<span class=\"live\">live</span>"), "{a}");
    assert!(
        a.contains("<span class=\"leases\">2</span></td><td>0</td>"),
        "{a}"
    );
    assert!(
        a.contains(&format!("<td>{}", lease_ui_instant(renewed))),
        "latest heartbeat: {a}"
    );
    assert!(a.contains(">a-1</a>") && a.contains(">a-2</a>"), "{a}");
    let b = row_of(&page, "worker-b");
    assert!(b.contains("<span class=\"leases\">1</span>"), "{b}");
    let gone = row_of(&page, "worker-gone");
    assert!(gone.contains("not live"), "{gone}");
    assert!(
        gone.contains("<span class=\"leases\">0</span></td><td>1</td>"),
        "{gone}"
    );
    assert!(gone.contains("fence 1, expired"), "{gone}");
    // Live workers first.
    assert!(page.find("worker-b").unwrap() < page.find("worker-gone").unwrap());
    assert!(!page.contains("free-1"), "an unowned run names no worker");
}

/// A store time as the pages show it.
fn lease_ui_instant(t: lease_core::StoreTime) -> String {
    chrono::DateTime::from_timestamp_micros(t.as_micros() as i64)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[tokio::test]
async fn a_runs_page_shows_its_wait_its_last_signal_and_each_attempts_journal() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let long = Ttl::from_secs(600).unwrap();
    let run = id("approve-7");
    store.create(&run).await.unwrap();
    let lease = store.claim(&run, &worker("w1"), long).await.unwrap();
    store.append(&lease, b"asked <boss>").await.unwrap();
    store.append(&lease, b"waiting").await.unwrap();
    let wait = End::await_signal("approval", Duration::from_secs(3600)).unwrap();
    store.end_one(&lease, wait).await.unwrap();

    let app = Router::new().nest(
        "/admin",
        lease_ui::router(store.clone(), lease_ui::Options::default()),
    );
    let port = serve(app).await;
    let page = get(port, "/admin/runs/approve-7").await;
    let signals = section(&page, "signals");
    assert!(
        signals.contains("<span class=\"signal\">approval</span> (the wait of fence 1)"),
        "{signals}"
    );
    assert!(
        signals.contains("<code>lease signal TOKEN</code>"),
        "{signals}"
    );
    let attempts = section(&page, "attempts");
    assert!(attempts.contains("outcome suspended"), "{attempts}");
    assert!(
        attempts.contains("<span class=\"written\">2</span>"),
        "{attempts}"
    );

    let name = SignalName::new("approval").unwrap();
    store
        .deliver_signal(&run, &name, lease.fence(), b"yes <ok>")
        .await
        .unwrap();
    let lease = store.claim(&run, &worker("w2"), long).await.unwrap();
    store.append(&lease, b"approved").await.unwrap();
    let page = get(port, "/admin/runs/approve-7").await;
    let signals = section(&page, "signals");
    assert!(
        signals
            .contains("signal <span class=\"signal\">approval</span> answered the wait of fence 1"),
        "{signals}"
    );
    assert!(
        signals.contains("yes &lt;ok&gt;"),
        "the payload, escaped: {signals}"
    );
    assert!(!signals.contains("waits for"), "{signals}");
    let attempts = section(&page, "attempts");
    let newest = row_of(attempts, "w2");
    assert!(
        newest.contains("<span class=\"written\">1</span>"),
        "{newest}"
    );
    assert!(attempts.contains("class=\"budget\">1<"), "{attempts}");
    for view in ["queues", "schedules", "workers", "runs"] {
        assert!(
            page.contains(&format!("<a href=\"{view}\">")),
            "{view} in the nav: {page}"
        );
    }
    assert!(page.contains("<base href=\"/admin/\">"), "{page}");
}

#[tokio::test]
async fn every_view_links_every_other_under_a_nest_prefix() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    store.create(&id("r")).await.unwrap();
    let app = Router::new().nest(
        "/ops/lease",
        lease_ui::router(store, lease_ui::Options::default()),
    );
    let port = serve(app).await;
    for path in ["", "/runs", "/runs/r", "/queues", "/schedules", "/workers"] {
        let page = get(port, &format!("/ops/lease{path}")).await;
        assert!(
            page.contains("<base href=\"/ops/lease/\">"),
            "{path}: {page}"
        );
        for view in ["runs", "queues", "schedules", "workers"] {
            assert!(
                page.contains(&format!("<a href=\"{view}\">")),
                "{path} links {view}"
            );
        }
    }
}

#[tokio::test]
async fn a_runs_page_shows_the_trace_it_was_enqueued_in() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let parent =
        lease_core::TraceParent::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .unwrap();
    store
        .create_with(&NewRun::new(id("traced")).with_trace_parent(parent))
        .await
        .unwrap();
    store.create(&id("untraced")).await.unwrap();
    let app = lease_ui::router(store, lease_ui::Options::default());
    let port = serve(app).await;
    let page = get(port, "/runs/traced").await;
    assert!(
        row_of(&page, "trace").contains("4bf92f3577b34da6a3ce929d0e0e4736"),
        "the trace id is shown: {page}"
    );
    let page = get(port, "/runs/untraced").await;
    assert!(
        !page.contains(">trace<"),
        "no trace row without one: {page}"
    );
}
