//! `lease ui` in a real browser: a Postgres store with runs in every state, the dashboard
//! served by the `lease` binary, and headless Chromium reading its pages (`--dump-dom`) and
//! photographing them (`--screenshot`). Actions are checked with plain HTTP requests: absent
//! and refused without `--allow-actions`, refused without the page's token or from another
//! site, and done (and logged) with it; the queues, workers and schedules pages show their
//! figures, and a bulk cancel answers a confirmation page before it acts.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distribution::{
    Config, Ended, Error, LeaseStore, LeaseStoreExt, NewRun, RunId, RunState, Ttl, WorkerId,
};
use lease_conformance::fixtures::{unavailable, PostgresServer};

const NAMESPACE: &str = "ui_test";
/// A password the store URL carries (the test server trusts every local connection, so it is
/// never checked): no page may show it.
const PASSWORD: &str = "hunter2secret";

fn id(run: &str) -> RunId {
    RunId::new(run).unwrap()
}

fn worker(name: &str) -> WorkerId {
    WorkerId::new(name).unwrap()
}

/// The store URL the dashboard is given: the server's, with a password added.
fn url_with_password(url: &str) -> String {
    url.replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{PASSWORD}@"),
        1,
    )
}

/// Runs in every state: three claimable (one of them an expired lease), two held (the second
/// under fence 2, after a force-release), one delayed, one suspended, one completed, one
/// failed with markup in its reason, one cancelled. Returns held-1's lease.
async fn populate(store: &Arc<dyn LeaseStore>) -> distribution::Lease {
    let long = Ttl::from_secs(600).unwrap();
    for run in [
        "waiting-1",
        "waiting-2",
        "expired-1",
        "held-1",
        "held-2",
        "suspended-1",
        "completed-1",
        "failed-1",
        "cancelled-1",
    ] {
        store.create(&id(run)).await.unwrap();
    }
    store
        .create_with(&NewRun::new(id("delayed-1")).with_delay(Duration::from_secs(3600)))
        .await
        .unwrap();
    // A paused queue with a run waiting in it.
    let mailers = distribution::Queue::new("mailers").unwrap();
    store
        .create_with(&NewRun::new(id("queued-1")).with_queue(mailers.clone()))
        .await
        .unwrap();
    store.pause_queue(&mailers).await.unwrap();
    let held = store
        .claim(&id("held-1"), &worker("worker-a"), long)
        .await
        .unwrap();
    store.append(&held, b"step 1 <done>").await.unwrap();
    store
        .claim(&id("held-2"), &worker("worker-old"), long)
        .await
        .unwrap();
    store.force_release(&id("held-2")).await.unwrap();
    let second = store
        .claim(&id("held-2"), &worker("worker-b"), long)
        .await
        .unwrap();
    assert_eq!(second.fence().get(), 2);
    let lease = store
        .claim(&id("suspended-1"), &worker("w"), long)
        .await
        .unwrap();
    // Suspended waiting for a signal, a day at most.
    let wait = distribution::End::await_signal("approval", std::time::Duration::from_secs(86_400));
    store.end_one(&lease, wait.unwrap()).await.unwrap();
    let lease = store
        .claim(&id("completed-1"), &worker("w"), long)
        .await
        .unwrap();
    store.complete(&lease).await.unwrap();
    // Two attempts: one failed and retried, then the run failed for good.
    let lease = store
        .claim(&id("failed-1"), &worker("worker-a"), long)
        .await
        .unwrap();
    let retried = distribution::End::AttemptFailed {
        retry_after: Duration::ZERO,
        reason: "gateway timeout after 30 s".into(),
    };
    store.end_one(&lease, retried).await.unwrap();
    let lease = store
        .claim(&id("failed-1"), &worker("w"), long)
        .await
        .unwrap();
    store
        .fail(&lease, "card declined: <b>insufficient funds</b>")
        .await
        .unwrap();
    store
        .cancel(&id("cancelled-1"), "duplicate order")
        .await
        .unwrap();
    // A lease of the shortest TTL, waited out on the store's own clock.
    let short = Ttl::from_millis(200).unwrap();
    store
        .claim(&id("expired-1"), &worker("worker-gone"), short)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !store.inspect(&id("expired-1")).await.unwrap().is_expired() {
        assert!(
            Instant::now() < deadline,
            "expired-1's lease did not expire"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    held
}

/// A `lease ui` process and the address it printed.
struct Dashboard {
    child: Child,
    base: String,
}

impl Dashboard {
    fn start(url: &str, extra: &[&str]) -> Dashboard {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lease"))
            .args(["--store", url, "--namespace", NAMESPACE, "ui", "--listen"])
            .arg("127.0.0.1:0")
            .args(["--refresh", "0"])
            .args(extra)
            .env_remove("LEASE_STORE")
            .env_remove("LEASE_NAMESPACE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start lease ui");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let base = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("lease ui printed no address: {line:?}"))
            .trim_end_matches('/')
            .to_owned();
        Dashboard { child, base }
    }

    fn port(&self) -> u16 {
        self.base.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// Stops the server with SIGTERM; its exit status and its stderr.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status, err)
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Headless Chromium, run as root: no sandbox, a profile of its own, a deadline.
fn chromium(profile: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new("timeout")
        .args([
            "120",
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--no-first-run", "--hide-scrollbars"])
        .args(args)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The page's DOM after Chromium loaded it.
fn dom(profile: &Path, url: &str) -> String {
    String::from_utf8(chromium(profile, &["--dump-dom", url]).stdout).unwrap()
}

/// A screenshot of the page at 1280×1100, checked to be a PNG of some substance.
fn screenshot(profile: &Path, url: &str, file: &Path) -> u64 {
    let _ = std::fs::remove_file(file);
    chromium(
        profile,
        &[
            &format!("--screenshot={}", file.display()),
            "--window-size=1280,1100",
            url,
        ],
    );
    let bytes = std::fs::read(file).expect("the screenshot was written");
    assert_eq!(
        &bytes[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        file.display()
    );
    assert!(
        bytes.len() > 20_000,
        "a blank screenshot? {} bytes",
        bytes.len()
    );
    bytes.len() as u64
}

/// The table row of `run` in the section that starts at `section` (an element id).
fn row<'a>(dom: &'a str, section: &str, run: &str) -> &'a str {
    let start = dom
        .find(&format!("id=\"{section}\""))
        .unwrap_or_else(|| panic!("no section {section}"));
    let from = &dom[start..];
    let at = from
        .find(&format!(">{run}</a>"))
        .unwrap_or_else(|| panic!("{run} not in section {section}"));
    let row_start = from[..at].rfind("<tr>").unwrap();
    let row_end = at + from[at..].find("</tr>").unwrap();
    &from[row_start..row_end]
}

fn count(dom: &str, state: &str) -> u64 {
    let tag = format!("id=\"count-{state}\">");
    let at = dom
        .find(&tag)
        .unwrap_or_else(|| panic!("no count of {state}"))
        + tag.len();
    dom[at..at + dom[at..].find('<').unwrap()].parse().unwrap()
}

/// One HTTP/1.1 POST of a form; the status code and the whole answer.
fn post(port: u16, path: &str, form: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let host = format!("127.0.0.1:{port}");
    send(port, "POST", &host, path, form, headers)
}

/// One HTTP/1.1 request naming `host`; the status code and the whole answer.
fn send(
    port: u16,
    method: &str,
    host: &str,
    path: &str,
    form: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
        form.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(form);
    s.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, answer)
}

fn shots_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lease-ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_dashboard_shows_every_state_in_a_browser_and_guards_its_actions() {
    let server = match PostgresServer::start() {
        Ok(server) => server,
        Err(why) => {
            return unavailable::<()>(
                "postgres",
                why,
                "install postgresql (bash scripts/test.sh does it)",
            )
            .unwrap_or(())
        }
    };
    if Command::new("chromium").arg("--version").output().is_err() {
        return unavailable::<()>(
            "chromium",
            "chromium is not on the PATH",
            "install chromium (bash scripts/test.sh does it)",
        )
        .unwrap_or(());
    }
    let url = url_with_password(&server.url());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = Config::default().with_store(&url).with_namespace(NAMESPACE);
    let store = rt.block_on(distribution::connect(&config)).unwrap();
    let held_1 = rt.block_on(populate(&store));
    let profile = tempfile::tempdir().unwrap();
    let shots = shots_dir();

    // Read-only: the overview, a run's page, no action anywhere.
    let ui = Dashboard::start(&url, &[]);
    let overview = dom(profile.path(), &format!("{}/", ui.base));
    for (state, n) in [
        // queued-1 among them: counts tell a paused queue's runs as claimable.
        ("claimable", 4),
        ("held", 2),
        ("delayed", 1),
        ("suspended", 1),
        ("completed", 1),
        ("failed", 1),
        ("cancelled", 1),
    ] {
        assert_eq!(count(&overview, state), n, "count of {state}");
    }
    assert!(overview.contains("Queue lag"), "{overview}");
    assert!(
        overview.contains("The lease held longest has been held <span class=\"longest\">"),
        "{overview}"
    );
    let held = row(&overview, "held", "held-2");
    assert!(held.contains("worker-b"), "held-2's holder: {held}");
    assert!(
        held.contains("<span class=\"fence\">2</span>"),
        "held-2's fence: {held}"
    );
    let held = row(&overview, "held", "held-1");
    assert!(
        held.contains("worker-a") && held.contains(">1</span>"),
        "{held}"
    );
    assert!(
        held.contains("<span class=\"held-for\">"),
        "how long it is held: {held}"
    );
    let expired = row(&overview, "expired", "expired-1");
    assert!(
        expired.contains("worker-gone") && expired.contains("ago"),
        "{expired}"
    );
    let failed = row(&overview, "failed", "failed-1");
    assert!(
        failed.contains("card declined: &lt;b&gt;insufficient funds&lt;/b&gt;"),
        "the failure reason, escaped: {failed}"
    );
    assert!(
        !overview.contains("<b>insufficient"),
        "markup from a reason reached the page"
    );
    let queues = overview
        .split("id=\"queues\"")
        .nth(1)
        .unwrap_or_else(|| panic!("a queues section: {overview}"));
    assert!(
        queues.contains("<span class=\"queue\">mailers</span>")
            && queues.contains("<span class=\"paused\">paused</span>"),
        "the paused queue: {queues}"
    );
    let queued = dom(profile.path(), &format!("{}/runs/queued-1", ui.base));
    assert!(
        queued.contains("<th>queue</th><td>mailers</td>"),
        "{queued}"
    );
    let run = dom(profile.path(), &format!("{}/runs/held-1", ui.base));
    assert!(run.contains("id=\"run\">held-1<"), "{run}");
    assert!(
        run.contains("<span class=\"holder\">worker-a</span>"),
        "{run}"
    );
    assert!(
        run.contains("step 1 &lt;done&gt;"),
        "the journal entry: {run}"
    );
    for time in ["<th>created</th>", "<th>claimed</th>", "<th>held for</th>"] {
        assert!(run.contains(time), "{time} on a held run's page: {run}");
    }
    let failed_page = dom(profile.path(), &format!("{}/runs/failed-1", ui.base));
    assert!(failed_page.contains("<th>ended</th>"), "{failed_page}");
    // Its attempts, newest first, each with its worker, fence, outcome and error.
    let attempts = failed_page
        .split("id=\"attempts\"")
        .nth(1)
        .and_then(|rest| rest.split("id=\"journal\"").next())
        .unwrap_or_else(|| panic!("an attempts section: {failed_page}"));
    let last = attempts.find("card declined: &lt;b&gt;insufficient funds&lt;/b&gt;");
    let first = attempts.find("gateway timeout after 30 s");
    assert!(
        matches!((last, first), (Some(l), Some(f)) if l < f),
        "both errors, newest first: {attempts}"
    );
    for cell in [
        "<span class=\"outcome failed\">failed</span>",
        "<span class=\"outcome retried\">retried</span>",
        "<span class=\"holder\">worker-a</span>",
        "<span class=\"fence\">2</span>",
    ] {
        assert!(attempts.contains(cell), "{cell} in {attempts}");
    }
    for page in [&overview, &run, &failed_page] {
        assert!(
            !page.contains("<form class=\"action\""),
            "an action without --allow-actions"
        );
        assert!(
            !page.contains(PASSWORD),
            "the store password reached a page"
        );
        assert!(page.contains("******"), "the store is named, redacted");
    }
    let listing = dom(profile.path(), &format!("{}/runs?state=failed", ui.base));
    assert!(
        listing.contains(">failed-1</a>") && !listing.contains(">held-1</a>"),
        "{listing}"
    );
    let bad = dom(profile.path(), &format!("{}/runs?state=sideways", ui.base));
    assert!(
        bad.contains("id=\"error\"") && bad.contains("sideways"),
        "{bad}"
    );
    let size = screenshot(
        profile.path(),
        &format!("{}/", ui.base),
        &shots.join("overview.png"),
    );
    eprintln!(
        "screenshot {} ({size} bytes)",
        shots.join("overview.png").display()
    );
    let size = screenshot(
        profile.path(),
        &format!("{}/runs/failed-1", ui.base),
        &shots.join("run.png"),
    );
    eprintln!(
        "screenshot {} ({size} bytes)",
        shots.join("run.png").display()
    );
    // A page of another site rebound to this address (DNS rebinding) names its own host.
    let (status, body) = send(ui.port(), "GET", "evil.example", "/", "", &[]);
    assert_eq!(status, 421, "{body}");
    assert!(
        body.contains("--allow-host") && !body.contains("held-1"),
        "{body}"
    );
    let (status, body) = send(ui.port(), "GET", "localhost", "/runs/held-1", "", &[]);
    assert_eq!(status, 200, "{body}");
    let waiting = dom(profile.path(), &format!("{}/runs/suspended-1", ui.base));
    assert!(
        waiting.contains("waits for")
            && waiting.contains("<span class=\"signal\">approval</span> (the wait of fence 1)"),
        "{waiting}"
    );
    let size = screenshot(
        profile.path(),
        &format!("{}/runs/suspended-1", ui.base),
        &shots.join("run-waiting.png"),
    );
    eprintln!(
        "screenshot {} ({size} bytes)",
        shots.join("run-waiting.png").display()
    );
    // The queues, workers and schedules pages.
    let queues = dom(profile.path(), &format!("{}/queues", ui.base));
    let mailers = row(&queues, "queues", "mailers");
    assert!(
        mailers.contains("<span class=\"paused\">paused</span>")
            && mailers.contains("<span class=\"depth\">1</span>")
            && mailers.contains("<span class=\"lag\">"),
        "the paused queue's depth and lag: {mailers}"
    );
    let workers = dom(profile.path(), &format!("{}/workers", ui.base));
    let worker_a = row(&workers, "workers", "held-1");
    assert!(
        worker_a.contains("worker-a") && worker_a.contains("<span class=\"live\">live</span>"),
        "{worker_a}"
    );
    let gone = row(&workers, "workers", "expired-1");
    assert!(
        gone.contains("worker-gone") && gone.contains("not live"),
        "{gone}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let last = now / 86_400 * 86_400;
    for tick in [last - 86_400, last] {
        rt.block_on(store.create(&id(&format!("nightly@{tick}"))))
            .unwrap();
    }
    let schedules = dom(profile.path(), &format!("{}/schedules", ui.base));
    let nightly = row(&schedules, "schedules", &format!("nightly@{last}"));
    assert!(
        nightly.contains("every <span class=\"every\">1 d 0 h</span>")
            && nightly.contains("class=\"next-tick\""),
        "{nightly}"
    );
    for (page, file) in [
        ("queues", "queues.png"),
        ("workers", "workers.png"),
        ("schedules", "schedules.png"),
    ] {
        let size = screenshot(
            profile.path(),
            &format!("{}/{page}", ui.base),
            &shots.join(file),
        );
        eprintln!("screenshot {} ({size} bytes)", shots.join(file).display());
    }
    let (status, body) = post(ui.port(), "/runs/held-1/cancel", "reason=x", &[]);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("lease ui --allow-actions"), "{body}");
    let (exit, log) = ui.stop();
    assert!(
        exit.success(),
        "lease ui exits 0 on SIGTERM: {exit:?} {log}"
    );
    assert!(
        log.contains("\"cancel\" on run \"held-1\": refused: actions are off"),
        "{log}"
    );
    assert!(!log.contains(PASSWORD), "{log}");
    let record = rt.block_on(store.inspect(&id("held-1"))).unwrap();
    assert_eq!(record.state, RunState::Runnable);
    assert_eq!(record.owner, Some(worker("worker-a")));

    // Actions on: the buttons carry the page's token, and only a request with it acts.
    let ui = Dashboard::start(&url, &["--allow-actions"]);
    let run = dom(profile.path(), &format!("{}/runs/held-1", ui.base));
    assert!(run.contains("id=\"action-cancel\"") && run.contains("id=\"action-release\""));
    let size = screenshot(
        profile.path(),
        &format!("{}/runs/held-1", ui.base),
        &shots.join("run-actions.png"),
    );
    eprintln!(
        "screenshot {} ({size} bytes)",
        shots.join("run-actions.png").display()
    );
    let tag = "name=\"token\" value=\"";
    let at = run.find(tag).expect("the page's token") + tag.len();
    let token = &run[at..at + run[at..].find('"').unwrap()];
    assert_eq!(token.len(), 64, "{token}");
    let (status, body) = post(ui.port(), "/runs/held-1/cancel", "reason=stop", &[]);
    assert_eq!(status, 403, "without a token: {body}");
    assert!(
        body.contains("did not carry this dashboard's token"),
        "{body}"
    );
    let wrong = format!("token={}&reason=stop", "0".repeat(64));
    let (status, body) = post(ui.port(), "/runs/held-1/cancel", &wrong, &[]);
    assert_eq!(status, 403, "a wrong token: {body}");
    let right = format!("token={token}&reason=stopped+from+the+dashboard");
    let origin = [("Origin", "http://evil.example")];
    let (status, body) = post(ui.port(), "/runs/held-1/cancel", &right, &origin);
    assert_eq!(status, 403, "from another site: {body}");
    assert!(body.contains("another site"), "{body}");
    let record = rt.block_on(store.inspect(&id("held-1"))).unwrap();
    assert_eq!(
        record.state,
        RunState::Runnable,
        "refused requests changed nothing"
    );
    let same = format!("http://127.0.0.1:{}", ui.port());
    let (status, body) = post(
        ui.port(),
        "/runs/held-1/cancel",
        &right,
        &[("Origin", &same)],
    );
    assert_eq!(status, 303, "{body}");
    assert!(body.contains("location: /runs/held-1"), "{body}");
    let record = rt.block_on(store.inspect(&id("held-1"))).unwrap();
    assert_eq!(record.state, RunState::Cancelled);
    assert_eq!(
        record.failure.as_deref(),
        Some("stopped from the dashboard")
    );
    // The holder it had is fenced out.
    match rt.block_on(store.renew(&held_1)) {
        Err(Error::LeaseEnded { ended, .. }) => assert_eq!(ended, Ended::Cancelled),
        other => panic!("the cancelled holder's renewal: {other:?}"),
    }
    let page = dom(profile.path(), &format!("{}/runs/held-1", ui.base));
    assert!(page.contains("state-cancelled") && page.contains("stopped from the dashboard"));
    assert!(
        !page.contains("id=\"action-cancel\""),
        "a cancelled run offers no cancel"
    );
    // A bulk cancel of the failed runs: a confirmation page first, then the action.
    let failed = dom(profile.path(), &format!("{}/runs?state=failed", ui.base));
    assert!(failed.contains("id=\"bulk-cancel\""), "{failed}");
    let size = screenshot(
        profile.path(),
        &format!("{}/runs?state=failed", ui.base),
        &shots.join("runs-bulk.png"),
    );
    eprintln!(
        "screenshot {} ({size} bytes)",
        shots.join("runs-bulk.png").display()
    );
    let form = format!("token={token}&state=failed&reason=bulk+from+the+dashboard");
    let (status, body) = post(ui.port(), "/bulk/cancel", &form, &[]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("id=\"matched\">1<"), "{body}");
    let failed_state =
        |rt: &tokio::runtime::Runtime| rt.block_on(store.inspect(&id("failed-1"))).unwrap().state;
    assert_eq!(
        failed_state(&rt),
        RunState::Failed,
        "the confirmation changed nothing"
    );
    let confirmed = format!("{form}&confirm=yes&seen=1");
    let (status, body) = post(ui.port(), "/bulk/cancel", &confirmed, &origin);
    assert_eq!(status, 403, "from another site: {body}");
    assert_eq!(failed_state(&rt), RunState::Failed);
    let (status, body) = post(ui.port(), "/bulk/cancel", &confirmed, &[]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("id=\"done\">1<"), "{body}");
    let record = rt.block_on(store.inspect(&id("failed-1"))).unwrap();
    assert_eq!(record.state, RunState::Cancelled);
    assert_eq!(record.failure.as_deref(), Some("bulk from the dashboard"));
    let (exit, log) = ui.stop();
    assert!(exit.success(), "{exit:?} {log}");
    for line in [
        "\"cancel\" on run \"held-1\": refused: without the page's token",
        "\"cancel\" on run \"held-1\": refused: sent from another site",
        "\"cancel\" on run \"held-1\": cancelled",
        "\"bulk cancel\" on runs matching \"state failed\": asked to confirm 1 runs",
        "\"bulk cancel\" on runs matching \"state failed\": refused: sent from another site",
        "\"bulk cancel\" on run \"failed-1\": cancelled",
    ] {
        assert!(log.contains(line), "the log lacks {line:?}: {log}");
    }
    assert!(!log.contains(token), "the token reached the log");
}
