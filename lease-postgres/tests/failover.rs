//! Failover on loopback: a primary and a streaming standby (`pg_basebackup -R`), run as the
//! `postgres` OS user on free ports. The standby is cut off, a claim is made on the primary,
//! the primary crashes and the standby is promoted. Without synchronous replication the
//! promoted standby would hand the same fence out again; it is on a new timeline, which the
//! store refuses until a rebind; with `sync_replicas=1` the claim is never handed out, the new
//! timeline is taken for a failover, and no fence repeats. A load variant
//! takes eight workers through a failover. Batches (`end_many`, `create_many`) answer only once
//! the synchronous standby has their one commit.
//!
//! These tests always start their own servers. A server that cannot be started fails the test;
//! `LEASE_TEST_SKIP_SERVERS=1` skips instead.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_conformance::fixtures::{unique_namespace, PostgresServer};
use lease_core::{Error, LeaseStore, RunId};
use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore};

mod support;
use support::{caught_up, execute, id, or_fail, ttl, worker};

/// A primary and its streaming standby; with `sync`, `synchronous_standby_names = '*'` is set
/// before the base backup, so the standby carries it too (as a promoted standby would).
async fn primary_and_standby(sync: bool) -> Option<(PostgresServer, PostgresServer)> {
    let primary = or_fail(PostgresServer::start(), "a primary")?;
    if sync {
        execute(
            &primary.url(),
            "ALTER SYSTEM SET synchronous_standby_names = '*'",
        )
        .await;
        execute(&primary.url(), "SELECT pg_reload_conf()").await;
    }
    let standby = or_fail(PostgresServer::standby_of(&primary), "a standby")?;
    caught_up(&primary.url(), 1).await;
    Some((primary, standby))
}

fn both(primary: &PostgresServer, standby: &PostgresServer, query: &str) -> String {
    format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres{query}",
        primary.port(),
        standby.port()
    )
}

/// The fixture servers run with `fsync` off for speed: the tests accept that explicitly.
fn config(url: &str, schema: &str) -> PostgresConfig {
    PostgresConfig::from_url(url)
        .with_volatile(true)
        .with_schema(schema)
        .with_acquire_timeout(Duration::from_secs(1))
        .with_sync_timeout(Duration::from_secs(1))
}

/// What the deterministic schedule observed.
#[derive(Debug)]
struct Observed {
    /// The claim made on the primary while the standby was cut off.
    on_old_primary: Result<u64, Error>,
    /// The first answer of the promoted standby to the same claim.
    on_new_primary: Result<u64, Error>,
}

/// The schedule: claim (fence 1, replicated), cut the standby, let the lease expire, claim again
/// on the primary, crash the primary, start the standby without its primary and promote it,
/// claim again through the same store, which follows the hosts to the new primary.
async fn promote_after_a_cut(
    primary: &PostgresServer,
    standby: &PostgresServer,
    sync_replicas: u32,
    schema: &str,
) -> Observed {
    let url = both(primary, standby, &format!("?sync_replicas={sync_replicas}"));
    let store = PostgresLeaseStore::connect(config(&url, schema))
        .await
        .unwrap();
    let run = id("order-failover");
    store.create(&run).await.unwrap();
    let first = store.claim(&run, &worker("a"), ttl(300)).await.unwrap();
    assert_eq!(first.fence().get(), 1);
    caught_up(&primary.url(), 1).await; // the standby holds fence 1

    standby.stop().unwrap(); // the replication link is cut
    tokio::time::sleep(Duration::from_millis(350)).await; // a's lease expires
    let on_old_primary = store
        .claim(&run, &worker("b"), ttl(60_000))
        .await
        .map(|l| l.fence().get());

    primary.kill().unwrap();
    standby.forget_primary().unwrap();
    standby.start_again().unwrap();
    standby.promote().unwrap();

    let promoted = format!("127.0.0.1:{}", standby.port());
    let deadline = Instant::now() + Duration::from_secs(30);
    let on_new_primary = loop {
        match store.claim(&run, &worker("c"), ttl(60_000)).await {
            Ok(lease) => break Ok(lease.fence().get()),
            // Until the store has moved, errors come from the dead primary or the standby in
            // recovery; the answer that counts names the promoted server.
            Err(e) if e.is_retryable() && !e.to_string().contains(&promoted) => {
                assert!(
                    Instant::now() < deadline,
                    "never reached the new primary: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => break Err(e),
        }
    };
    Observed {
        on_old_primary,
        on_new_primary,
    }
}

/// With asynchronous replication the promoted standby lacks the claim the old primary
/// acknowledged (fence 2) and would hand the same fence to another worker. It is on a new
/// timeline, so the store refuses it (before, it handed fence 2 out again: the loss this test
/// saw) until an operator rebinds the schema; the next claim is then above 2^32 and the holder
/// of the lost fence 2 would be refused by the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_replication_promotion_is_refused_until_rebound() {
    let Some((primary, standby)) = primary_and_standby(false).await else {
        return;
    };
    let schema = unique_namespace("failover_async");
    let observed = promote_after_a_cut(&primary, &standby, 0, &schema).await;
    eprintln!("asynchronous standby: {observed:?}");
    let old = observed
        .on_old_primary
        .expect("the old primary hands out fence 2");
    assert_eq!(old, 2);
    let refused = observed
        .on_new_primary
        .expect_err("the promoted standby must not hand fence 2 out again");
    assert!(
        matches!(
            refused,
            Error::Misconfigured {
                backend: "postgres",
                ..
            }
        ),
        "{refused:?}"
    );
    let text = refused.to_string();
    assert!(
        text.contains("is on timeline 2") && text.contains("lease pg-rebind"),
        "{text}"
    );
    lease_postgres::PostgresLeaseStore::rebind(config(&standby.url(), &schema))
        .await
        .unwrap();
    let plain = PostgresLeaseStore::connect(config(&standby.url(), &schema))
        .await
        .unwrap();
    let next = plain
        .claim(&id("order-failover"), &worker("c"), ttl(60_000))
        .await
        .unwrap();
    assert!(
        next.fence().get() > lease_postgres::REBIND_FENCE_STEP + 1,
        "fence {}: a fence the old history issued",
        next.fence()
    );
}

/// With `sync_replicas=1` the claim on the cut-off primary is refused as retryable
/// `Unavailable` (never handed out), the promoted standby refuses too while no synchronous
/// standby streams from it, and the only fences ever handed out are distinct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_replicas_never_hands_out_a_fence_a_promotion_can_lose() {
    let Some((primary, standby)) = primary_and_standby(true).await else {
        return;
    };
    let schema = unique_namespace("failover_sync");
    let observed = promote_after_a_cut(&primary, &standby, 1, &schema).await;
    eprintln!("synchronous standby, sync_replicas=1: {observed:?}");
    let refused = observed.on_old_primary.unwrap_err();
    assert!(
        matches!(
            refused,
            Error::Unavailable {
                backend: "postgres",
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(
        refused.to_string().contains("synchronous standby"),
        "{refused}"
    );
    let refused = observed.on_new_primary.unwrap_err();
    assert!(
        matches!(
            refused,
            Error::Unavailable {
                backend: "postgres",
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(
        refused
            .to_string()
            .contains("only 0 synchronous standby(s) stream"),
        "{refused}"
    );

    // The refused claim's fence died with the old primary; nobody ever held it. An operator
    // who accepts running without a standby (synchronous_standby_names cleared, or every
    // commit would wait for a standby that is not there) now gets the next fence, which was
    // never issued.
    execute(
        &standby.url(),
        "ALTER SYSTEM SET synchronous_standby_names = ''",
    )
    .await;
    execute(&standby.url(), "SELECT pg_reload_conf()").await;
    let plain = PostgresLeaseStore::connect(config(&standby.url(), &schema))
        .await
        .unwrap();
    let run = id("order-failover");
    assert_eq!(plain.inspect(&run).await.unwrap().fence.get(), 1);
    let next = plain.claim(&run, &worker("d"), ttl(60_000)).await.unwrap();
    let handed_out = [1, next.fence().get()];
    assert_eq!(handed_out, [1, 2], "no fence was handed out twice");
}

/// One worker task's record of what it was handed and what it wrote.
#[derive(Default)]
struct Tally {
    /// (run, fence, when the claim returned)
    claims: Vec<(String, u64, Instant)>,
    /// (run, fence) whose ledger write was acknowledged
    effects: Vec<(String, u64)>,
}

/// Eight workers claim four runs over and over, writing one ledger row per lease in a fenced
/// transaction, through a crash of the primary and the promotion of its synchronous standby
/// (which then gets a synchronous standby of its own). Every fence handed out after the
/// failover is greater than every fence handed out before it, no (run, fence) is handed out
/// twice, every acknowledged ledger write survives, and the ledger has no double effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_keep_fences_unique_through_a_synchronous_failover() {
    let Some((primary, standby)) = primary_and_standby(true).await else {
        return;
    };
    let schema = unique_namespace("failover_load");
    let url = both(&primary, &standby, "?sync_replicas=1");
    let setup = PostgresLeaseStore::connect(config(&url, &schema))
        .await
        .unwrap();
    let runs: Vec<RunId> = (0..4).map(|i| id(&format!("job-{i}"))).collect();
    for run in &runs {
        setup.create(run).await.unwrap();
    }
    let ledger = format!("\"{schema}\".ledger");
    sqlx::query(&format!(
        "CREATE TABLE {ledger} (run_id TEXT NOT NULL, fence BIGINT NOT NULL, worker TEXT NOT NULL)"
    ))
    .execute(setup.pool())
    .await
    .unwrap();

    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = stop_flag();
    let mut tasks = Vec::new();
    for w in 0..8 {
        let store = PostgresLeaseStore::connect(config(&url, &schema).with_max_connections(2))
            .await
            .unwrap();
        let (tally, stop, run, ledger) = (
            tally.clone(),
            stop.clone(),
            runs[w % runs.len()].clone(),
            ledger.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let me = worker(&format!("w{w}"));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let lease = match store.claim(&run, &me, ttl(300)).await {
                    Ok(lease) => lease,
                    Err(Error::Held { .. }) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                    Err(e) if e.is_retryable() => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    Err(e) => panic!("worker w{w}: unexpected refusal {e:?}"),
                };
                let fence = lease.fence().get();
                tally
                    .lock()
                    .unwrap()
                    .claims
                    .push((run.to_string(), fence, Instant::now()));
                let written = async {
                    let mut tx = store.fenced_transaction(&lease).await?;
                    sqlx::query(&format!("INSERT INTO {ledger} VALUES ($1, $2, $3)"))
                        .bind(run.as_str())
                        .bind(fence as i64)
                        .bind(me.as_str())
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| Error::backend("postgres", e))?;
                    tx.commit().await
                }
                .await;
                if written.is_ok() {
                    tally.lock().unwrap().effects.push((run.to_string(), fence));
                }
                // Best effort: a failed release expires by TTL.
                let _ = store.release(&lease).await;
            }
        }));
    }

    // Before: every run has been through a few leases.
    let per_run = |tally: &Tally, since: Option<Instant>| {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for (run, _, at) in &tally.claims {
            if since.is_none_or(|s| *at > s) {
                *counts.entry(run.clone()).or_default() += 1;
            }
        }
        counts
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while per_run(&tally.lock().unwrap(), None)
        .values()
        .filter(|&&n| n >= 3)
        .count()
        < 4
    {
        assert!(Instant::now() < deadline, "the workers made no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let killed_at = Instant::now();
    primary.kill().unwrap();
    standby.promote().unwrap();
    // The new primary gets a synchronous standby of its own, so leases can be handed out again.
    let second = or_fail(PostgresServer::standby_of(&standby), "a second standby")
        .expect("a second standby");
    let promoted_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(60);
    while per_run(&tally.lock().unwrap(), Some(promoted_at))
        .values()
        .filter(|&&n| n >= 2)
        .count()
        < 4
    {
        assert!(
            Instant::now() < deadline,
            "the workers did not recover after the failover"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }

    let tally = std::mem::take(&mut *tally.lock().unwrap());
    let mut seen = HashSet::new();
    for (run, fence, _) in &tally.claims {
        assert!(
            seen.insert((run.clone(), *fence)),
            "fence {fence} of {run} was handed out twice"
        );
    }
    for run in &runs {
        let before = tally
            .claims
            .iter()
            .filter(|(r, _, at)| r == run.as_str() && *at < killed_at)
            .map(|(_, f, _)| *f)
            .max()
            .unwrap();
        let after = tally
            .claims
            .iter()
            .filter(|(r, _, at)| r == run.as_str() && *at > promoted_at)
            .map(|(_, f, _)| *f)
            .min()
            .unwrap();
        assert!(
            after > before,
            "{run}: fence {after} after the failover is not above {before} before it"
        );
    }
    let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT run_id, fence FROM {ledger} ORDER BY run_id, fence"
    ))
    .fetch_all(&sqlx::PgPool::connect(&standby.url()).await.unwrap())
    .await
    .unwrap();
    let mut effects = HashSet::new();
    for (run, fence) in &rows {
        assert!(
            effects.insert((run.clone(), *fence as u64)),
            "double effect: {run} under fence {fence} twice in {rows:?}"
        );
    }
    for acked in &tally.effects {
        assert!(
            effects.contains(acked),
            "an acknowledged ledger write was lost in the failover: {acked:?}"
        );
    }
    eprintln!(
        "load failover: {} leases handed out, {} acknowledged effects, {} ledger rows",
        tally.claims.len(),
        tally.effects.len(),
        rows.len()
    );
    drop(second);
}

fn stop_flag() -> Arc<std::sync::atomic::AtomicBool> {
    Arc::new(std::sync::atomic::AtomicBool::new(false))
}

/// With `sync_replicas=1`, `end_many` and `create_many` answer only once the synchronous standby
/// has their commit: with it streaming they succeed, and the standby holds the ends and the
/// journaled effect; with it cut off, each batch is a retryable `Unavailable` as a whole (its
/// commit stands on the primary but may be lost on failover), never per-item `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_replicas_reports_a_batch_only_once_the_standby_has_it() {
    use lease_core::{End, Ending, RunState};
    let Some((primary, standby)) = primary_and_standby(true).await else {
        return;
    };
    let schema = unique_namespace("failover_batch");
    let url = lease_conformance::fixtures::with_params(&primary.url(), "sync_replicas=1");
    let store = PostgresLeaseStore::connect(config(&url, &schema))
        .await
        .unwrap();
    let runs: Vec<RunId> = (0..4).map(|i| id(&format!("batch-{i}"))).collect();
    let created = store.create_many(&runs).await.unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let leases = store
        .claim_next(&worker("a"), ttl(60_000), 4)
        .await
        .unwrap();
    assert_eq!(leases.len(), 4);
    let ended = store
        .end_many(&[
            Ending::new(leases[0].clone(), End::CompleteWith(b"effect".to_vec())),
            Ending::new(leases[1].clone(), End::Release),
        ])
        .await
        .unwrap();
    assert!(ended.iter().all(Result::is_ok), "{ended:?}");
    // Acknowledged: the standby (read directly, it is read-only) has both ends and the effect.
    let standby_pool = sqlx::PgPool::connect(&standby.url()).await.unwrap();
    let states: Vec<(String, String)> = sqlx::query_as(&format!(
        "SELECT run_id, state FROM \"{schema}\".runs ORDER BY run_id"
    ))
    .fetch_all(&standby_pool)
    .await
    .unwrap();
    assert_eq!(states[0], (runs[0].to_string(), "completed".to_owned()));
    assert_eq!(states[1], (runs[1].to_string(), "runnable".to_owned()));
    let effects: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{schema}\".journal WHERE payload = 'effect'"
    ))
    .fetch_one(&standby_pool)
    .await
    .unwrap();
    assert_eq!(effects, 1);
    standby_pool.close().await;

    standby.stop().unwrap();
    let started = Instant::now();
    let err = store
        .end_many(&[
            Ending::new(leases[2].clone(), End::Complete),
            Ending::new(leases[3].clone(), End::Suspend),
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unavailable {
                backend: "postgres",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("synchronous standby"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let err = store.create_many(&[id("batch-new")]).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    // The unacknowledged ends did commit on the primary: a retry recognises them.
    let primary_only = PostgresLeaseStore::connect(config(&primary.url(), &schema))
        .await
        .unwrap();
    assert_eq!(
        primary_only.inspect(&runs[2]).await.unwrap().state,
        RunState::Completed
    );
}
