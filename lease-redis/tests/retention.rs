//! Retention that deletes, on a private redis-server: purged runs leave nothing under the
//! namespace but a bounded set of keys (the fence floor among them), and a namespace an older
//! release wrote, with a hash of per-run tombstones, is folded into the floor at connect.

use std::time::Duration;

use lease_conformance::fixtures::{unavailable, unique_namespace, RedisServer};
use lease_core::{LeaseStore, RunId, Ttl, WorkerId};
use lease_redis::{RedisConfig, RedisLeaseStore};
use redis::aio::MultiplexedConnection;
use support::entries;

mod support;

const HINT: &str = "install redis-server (apt-get install redis-server)";

fn server() -> Option<RedisServer> {
    match RedisServer::start_with(true, None) {
        Ok(server) => Some(server),
        Err(why) => unavailable("redis-server", why, HINT),
    }
}

async fn connect(url: &str, namespace: &str) -> lease_core::Result<RedisLeaseStore> {
    let config = RedisConfig::from_url(url)
        .with_namespace(namespace)
        .with_response_timeout(Duration::from_secs(5));
    RedisLeaseStore::connect(config).await
}

async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// 300 runs with payloads, journals, idempotency keys, kinds, a failure and a cancel, all
/// purged: at most 30 entries are left under the namespace (the floor, the creation counter,
/// the kinds seen, the format marker), none of them a run's; and the purged id created again
/// is claimed above its last fence.
#[tokio::test]
async fn purged_runs_leave_no_keys_or_fields_behind() {
    let Some(server) = server() else { return };
    let ns = unique_namespace("retention");
    let store = connect(&server.url(), &ns).await.unwrap();
    let mut conn = raw(&server.url()).await;
    let churned = lease_conformance::churn_and_purge(&store, 300).await;
    let left = entries(&mut conn, &ns).await;
    let total: u64 = left.values().sum();
    eprintln!("entries left after 300 runs were purged: {total} {left:?}");
    assert!(total <= 30, "{total} entries left: {left:?}");
    let floor: String = redis::cmd("GET")
        .arg(format!("{{lease:{ns}}}:floor"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        floor.parse::<u64>().unwrap() >= churned.fence,
        "floor {floor}"
    );
    lease_conformance::a_churned_id_comes_back_above_its_fence(&store, &churned).await;
}

/// A namespace an older release wrote keeps per-run tombstones in a hash: connecting folds
/// them into the floor (every id starts above the highest), deletes them, and leaves a string
/// in their place, so the older release's create fails loudly instead of reading nothing.
#[tokio::test]
async fn an_older_releases_tombstones_are_folded_into_the_floor() {
    let Some(server) = server() else { return };
    let ns = unique_namespace("tombs");
    let mut conn = raw(&server.url()).await;
    let tomb = format!("{{lease:{ns}}}:tomb");
    // 2,000 tombstones: more than one HSCAN page; the highest fence on an id of its own.
    let mut fields: Vec<(String, String)> = (0..2000)
        .map(|i| (format!("{:x}", 0x1000 + i), (i % 7 + 1).to_string()))
        .collect();
    fields.push(("6f6c64".to_owned(), "41".to_owned())); // "old" at fence 41
    let _: () = redis::cmd("HSET")
        .arg(&tomb)
        .arg(&fields)
        .query_async(&mut conn)
        .await
        .unwrap();
    let store = connect(&server.url(), &ns).await.unwrap();
    let kind: String = redis::cmd("TYPE")
        .arg(&tomb)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        kind, "string",
        "the tombstones are gone, the marker is there"
    );
    let floor: String = redis::cmd("GET")
        .arg(format!("{{lease:{ns}}}:floor"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(floor, "41");
    let old = RunId::new("old").unwrap();
    assert_eq!(store.create(&old).await.unwrap().fence.get(), 41);
    let lease = store
        .claim(
            &old,
            &WorkerId::new("w").unwrap(),
            Ttl::from_millis(60_000).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(lease.fence().get(), 42);
    // What the older release's create did first, refused on the marker.
    let refused: redis::RedisResult<Option<String>> = redis::cmd("HGET")
        .arg(&tomb)
        .arg("6f6c64")
        .query_async(&mut conn)
        .await;
    let err = refused.unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    // A second connect finds the marker and changes nothing.
    drop(connect(&server.url(), &ns).await.unwrap());
    let again: String = redis::cmd("GET")
        .arg(format!("{{lease:{ns}}}:floor"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(again, "41");
}

/// The format marker names the namespace's format: a later release's (format 6 and up) is
/// refused at connect, naming it, with nothing written; an earlier one's (format 2, before
/// queues were in the class; format 3, before waits for signals; format 4, before trace
/// parents) is read as this one and raised, its runs claimed from the default queue, without
/// a trace parent.
#[tokio::test]
async fn a_newer_format_is_refused_and_an_older_one_raised() {
    let Some(server) = server() else { return };
    let ns = unique_namespace("format");
    let mut conn = raw(&server.url()).await;
    let tomb = format!("{{lease:{ns}}}:tomb");
    let store = connect(&server.url(), &ns).await.unwrap();
    store.create(&RunId::new("before").unwrap()).await.unwrap();
    let marker = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        let tomb = tomb.clone();
        async move {
            redis::cmd("GET")
                .arg(&tomb)
                .query_async::<String>(&mut conn)
                .await
                .unwrap()
        }
    };
    assert!(marker(&mut conn).await.starts_with("format 5: "));

    let later = "format 6: a later release's records";
    let _: () = redis::cmd("SET")
        .arg(&tomb)
        .arg(later)
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = connect(&server.url(), &ns).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, lease_core::Error::Misconfigured { .. })
            && text.contains("newer than this release's format 5")
            && text.contains(later)
            && text.contains(&ns),
        "{text}"
    );
    assert_eq!(marker(&mut conn).await, later, "nothing written");

    let mut store = None;
    for earlier in [
        "format 2: purged runs raise the fence floor (:floor); no tombstones",
        "format 3: purged runs raise the fence floor (:floor); no tombstones; queues in the class",
        "format 4: purged runs raise the fence floor (:floor); no tombstones; queues in the class; \
         waits for signals (:wait, :deadlines, :resumed)",
    ] {
        let _: () = redis::cmd("SET")
            .arg(&tomb)
            .arg(earlier)
            .query_async(&mut conn)
            .await
            .unwrap();
        store = Some(connect(&server.url(), &ns).await.unwrap());
        assert!(
            marker(&mut conn).await.starts_with("format 5: "),
            "{earlier:?} raised"
        );
    }
    let store = store.expect("connected");
    let leases = store
        .claim_next_in(
            &lease_core::Queue::default(),
            &lease_core::Kind::default(),
            &WorkerId::new("w").unwrap(),
            Ttl::from_millis(60_000).unwrap(),
            10,
        )
        .await
        .unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].run().as_str(), "before");
    assert_eq!(leases[0].trace_parent(), None);
}

/// A purge of completed runs behind more failed runs than one script call looks at (2,000)
/// still reaches them, and the next purge of completed runs does not look at the failed ones
/// again: the store remembers where the entries it passed over end. Counted with Redis's own
/// command statistics: the second purge reads far fewer run records than the first.
#[tokio::test]
async fn a_purge_of_some_states_passes_over_the_others_once() {
    let Some(server) = server() else { return };
    let ns = unique_namespace("purge-states");
    let store = connect(&server.url(), &ns).await.unwrap();
    let mut conn = raw(&server.url()).await;
    let w = WorkerId::new("w").unwrap();
    let ttl = Ttl::from_secs(60).unwrap();
    let end_all = |prefix: &'static str, n: usize, end: lease_core::End| {
        let (store, w) = (store.clone(), w.clone());
        async move {
            for chunk in 0..n.div_ceil(500) {
                let ids: Vec<RunId> = (chunk * 500..((chunk + 1) * 500).min(n))
                    .map(|i| RunId::new(format!("{prefix}-{i:05}")).unwrap())
                    .collect();
                for r in store.create_many(&ids).await.unwrap() {
                    r.unwrap();
                }
                let leases = store.claim_next(&w, ttl, ids.len()).await.unwrap();
                assert_eq!(leases.len(), ids.len());
                let endings: Vec<_> = leases
                    .into_iter()
                    .map(|lease| lease_core::Ending::new(lease, end.clone()))
                    .collect();
                for r in store.end_many(&endings).await.unwrap() {
                    r.unwrap();
                }
            }
        }
    };
    end_all("failed", 4_500, lease_core::End::Fail("boom".into())).await;
    end_all("done", 40, lease_core::End::Complete).await;
    let completed = lease_core::EndedStates::COMPLETED;
    let hgets = |conn: &mut MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn)
                .await
                .unwrap();
            info.lines()
                .find_map(|l| l.strip_prefix("cmdstat_hget:calls="))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |n| n.parse::<u64>().unwrap())
        }
    };
    let before = hgets(&mut conn).await;
    let first = store
        .purge_ended(completed, Duration::ZERO, 30)
        .await
        .unwrap();
    let first_reads = hgets(&mut conn).await - before;
    assert_eq!(first.len(), 30, "{first:?}");
    assert!(first.iter().all(|id| id.as_str().starts_with("done-")));
    assert!(
        first_reads >= 4_500,
        "the first purge looks at every failed run: {first_reads} records read"
    );
    let before = hgets(&mut conn).await;
    let rest = store
        .purge_ended(completed, Duration::ZERO, 30)
        .await
        .unwrap();
    let rest_reads = hgets(&mut conn).await - before;
    assert_eq!(rest.len(), 10, "{rest:?}");
    assert!(
        rest_reads < 200,
        "the second purge starts after the failed runs: {rest_reads} records read"
    );
    let counts = store.count().await.unwrap();
    assert_eq!((counts.completed, counts.failed), (0, 4_500));
}
