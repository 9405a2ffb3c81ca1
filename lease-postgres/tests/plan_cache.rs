//! The claim statement is planned once per session, not once per call.
//!
//! A prepared statement gets custom plans (made for its arguments) for its first five runs;
//! from then on the server keeps its generic plan unless that one is costed higher than the
//! custom plans were. `claim_next.sql` once took its limit and kind straight from its
//! parameters, so a custom plan (which sees `LIMIT 3`) was costed a hundred times below the
//! generic one (which assumes a tenth of the table), and the server planned the statement on
//! every call: ~0.9 ms of server time a call, the largest single item of a claimed job's cost
//! (BENCHMARKS.md). The statement now reads them through sub-selects, which no plan sees
//! through, so both plans cost the same and the generic one is kept.
//!
//! A generic plan costs a limit it cannot see as a tenth of the table, so on a large queue its
//! estimate passes `jit_above_cost`, and a server with JIT on compiled the statement on every
//! call (~450 ms a call on 600,000 runs, found by peer-bench's hub row). The store's own
//! sessions therefore start with `jit = off`; the caller's sessions keep the server's setting.

use lease_conformance::fixtures::{postgres_url, unique_namespace};
use lease_core::{Kind, LeaseStore, NewRun, RunId, Ttl, WorkerId};
use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore};

/// The kind the probe claims from: a value that shows in a plan only if the plan was made for it.
const PROBE_KIND: &str = "kind-seen-by-the-planner";

const TYPES: &str = "text, bigint, bigint, bigint, text, text";

/// The text of `EXPLAIN (VERBOSE)` of the prepared claim after `runs` executions under
/// `plan_cache_mode` `mode`, in a transaction that is rolled back.
async fn plan_after(store: &PostgresLeaseStore, mode: &str, runs: usize) -> String {
    let statement =
        lease_postgres::render_sql(include_str!("../sql/claim_next.sql"), store.schema());
    let args = format!("'probe', 60000, 3, 16, '{PROBE_KIND}', 'default'");
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(&format!("SET LOCAL plan_cache_mode = {mode}"))
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(&format!("PREPARE probe ({TYPES}) AS {statement}"))
        .execute(&mut *tx)
        .await
        .unwrap();
    for _ in 0..runs {
        sqlx::query(&format!("EXECUTE probe ({args})"))
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    let lines: Vec<String> =
        sqlx::query_scalar(&format!("EXPLAIN (VERBOSE) EXECUTE probe ({args})"))
            .fetch_all(&mut *tx)
            .await
            .unwrap();
    // A prepared statement outlives the transaction; the session goes back to the pool.
    sqlx::query("DEALLOCATE probe")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    lines.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_next_keeps_its_generic_plan() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let config = PostgresConfig::from_url(&url).with_schema(unique_namespace("lease_plans"));
    let store = PostgresLeaseStore::connect(config).await.unwrap();
    // The statistics of a queue: runnable runs of the kind claimed from, analyzed.
    let kind = Kind::new(PROBE_KIND).unwrap();
    let runs: Vec<NewRun> = (0..5_000)
        .map(|i| NewRun::new(RunId::new(format!("run-{i:04}")).unwrap()).with_kind(kind.clone()))
        .collect();
    for chunk in runs.chunks(1_000) {
        let created = store.create_many_with(chunk).await.unwrap();
        assert!(created.iter().all(Result::is_ok), "{created:?}");
    }
    sqlx::query(&format!("ANALYZE \"{}\".runs", store.schema()))
        .execute(store.pool())
        .await
        .unwrap();

    // The probe can tell the plans apart: a custom plan holds the kind's value.
    let custom = plan_after(&store, "force_custom_plan", 0).await;
    assert!(
        custom.contains(PROBE_KIND),
        "a custom plan is made for the kind claimed from:\n{custom}"
    );
    let generic = plan_after(&store, "force_generic_plan", 0).await;
    assert!(
        !generic.contains(PROBE_KIND),
        "the generic plan holds no argument:\n{generic}"
    );

    // Left to choose, as on the store's sessions, the server uses the generic plan once the
    // five custom ones are made, whatever the arguments say.
    let chosen = plan_after(&store, "auto", 6).await;
    assert!(
        !chosen.contains(PROBE_KIND),
        "after six runs the server still makes a plan per call:\n{chosen}"
    );
}

/// What `jit` was in the session of each statement that updated `runs` in the namespace, as a
/// statement trigger recorded it, oldest first.
async fn jit_seen(store: &PostgresLeaseStore) -> Vec<String> {
    sqlx::query_scalar(&format!(
        "SELECT setting FROM \"{}\".jit_seen ORDER BY seq",
        store.schema()
    ))
    .fetch_all(store.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stores_sessions_never_compile_a_statement() {
    let Some(url) = postgres_url().await else {
        return;
    };
    // The URL asks for JIT, whatever the server's default: the caller's sessions have it, and
    // the store's own must not.
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}options[jit]=on");
    let config = PostgresConfig::from_url(&url).with_schema(unique_namespace("lease_jit"));
    let store = PostgresLeaseStore::connect(config).await.unwrap();
    let s = format!("\"{}\"", store.schema());
    // The observable: a trigger on the runs table records the `jit` in force in the session
    // of every statement that updates it, the store's own statements included.
    for statement in [
        format!("CREATE TABLE {s}.jit_seen (seq BIGSERIAL PRIMARY KEY, setting TEXT NOT NULL)"),
        format!(
            "CREATE FUNCTION {s}.note_jit() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN INSERT INTO {s}.jit_seen (setting) VALUES (current_setting('jit')); \
             RETURN NULL; END $$"
        ),
        format!(
            "CREATE TRIGGER note_jit AFTER UPDATE ON {s}.runs \
             FOR EACH STATEMENT EXECUTE FUNCTION {s}.note_jit()"
        ),
    ] {
        sqlx::query(&statement)
            .execute(store.pool())
            .await
            .expect(&statement);
    }
    store
        .create(&RunId::new("jit-probe").unwrap())
        .await
        .unwrap();
    let worker = WorkerId::new("jit-worker").unwrap();
    let claimed = store
        .claim_next(&worker, Ttl::from_secs(30).unwrap(), 4)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    let seen = jit_seen(&store).await;
    assert!(
        !seen.is_empty() && seen.iter().all(|jit| jit == "off"),
        "claim_next ran in a session with jit = {seen:?}; the store's sessions start with it off"
    );

    // The caller's own statement on the caller's pool keeps the server's setting.
    sqlx::query(&format!("UPDATE {s}.runs SET heartbeats = heartbeats"))
        .execute(store.pool())
        .await
        .unwrap();
    let seen = jit_seen(&store).await;
    assert_eq!(
        seen.last().map(String::as_str),
        Some("on"),
        "the caller's session lost the jit its URL asked for: {seen:?}"
    );
}
