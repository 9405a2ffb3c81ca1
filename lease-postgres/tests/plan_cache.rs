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

use lease_conformance::fixtures::{postgres_url, unique_namespace};
use lease_core::{Kind, LeaseStore, NewRun, RunId};
use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore};

/// The kind the probe claims from: a value that shows in a plan only if the plan was made for it.
const PROBE_KIND: &str = "kind-seen-by-the-planner";

const TYPES: &str = "text, bigint, bigint, bigint, text";

/// The text of `EXPLAIN (VERBOSE)` of the prepared claim after `runs` executions under
/// `plan_cache_mode` `mode`, in a transaction that is rolled back.
async fn plan_after(store: &PostgresLeaseStore, mode: &str, runs: usize) -> String {
    let statement =
        lease_postgres::render_sql(include_str!("../sql/claim_next.sql"), store.schema());
    let args = format!("'probe', 60000, 3, 16, '{PROBE_KIND}'");
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
