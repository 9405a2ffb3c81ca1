//! The benchmarks of a run's life against a real server (figures in BENCHMARKS.md):
//! `cargo test --release -p lease-postgres --test purge_load -- --ignored --nocapture`. Ignored in
//! `cargo test`: the purge benchmark creates and completes 100,000 runs first.
lease_conformance::life_benchmarks!(lease_conformance::fixtures::postgres());

/// Retention that deletes, at scale: a million runs created, completed and purged 1,000 at a
/// time; the runs table's rows and the schema's tables' size (with indexes and TOAST) every
/// 100,000 runs. `LEASE_FLAT_RUNS` sets the total.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run with --ignored --release"]
async fn a_million_runs_purged_leave_the_tables_flat() {
    use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore};
    let Some(url) = lease_conformance::fixtures::postgres_url().await else {
        return;
    };
    let total = std::env::var("LEASE_FLAT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let schema = lease_conformance::fixtures::unique_namespace("lease_flat");
    let store = PostgresLeaseStore::connect(PostgresConfig::from_url(&url).with_schema(&schema))
        .await
        .unwrap();
    let pool = store.pool().clone();
    // Rows and on-disk size (tables, indexes, TOAST) of the schema's tables, then the same
    // after a plain VACUUM of the three tables a run touches, which is what autovacuum does to
    // them between samples at a steady rate (it visits a database once a minute: 100,000 runs
    // a minute is 1,700 runs a second). Flat means the size after each VACUUM stays put: the
    // space of purged rows is used again.
    let measure = || {
        let pool = pool.clone();
        let schema = schema.clone();
        async move {
            let size = || async {
                sqlx::query_as::<_, (i64, i64)>(&format!(
                    "SELECT (SELECT count(*) FROM \"{schema}\".runs) \
                          + (SELECT count(*) FROM \"{schema}\".journal) \
                          + (SELECT count(*) FROM \"{schema}\".run_payloads), \
                            (SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c \
                             JOIN pg_namespace n ON n.oid = c.relnamespace \
                             WHERE n.nspname = $1 AND c.relkind = 'r')"
                ))
                .bind(&schema)
                .fetch_one(&pool)
                .await
                .unwrap()
            };
            let (rows, before) = size().await;
            // On a connection of its own: the store's sessions bound their lock waits, and a
            // VACUUM may wait for autovacuum's.
            let mut conn = pool.acquire().await.unwrap();
            sqlx::raw_sql("SET lock_timeout = 0; SET statement_timeout = 0")
                .execute(&mut *conn)
                .await
                .unwrap();
            for table in ["runs", "journal", "run_payloads"] {
                sqlx::query(&format!("VACUUM \"{schema}\".{table}"))
                    .execute(&mut *conn)
                    .await
                    .unwrap();
            }
            conn.detach();
            let (_, after) = size().await;
            format!(
                "{rows} rows, {} kB on disk, {} kB after VACUUM",
                before / 1024,
                after / 1024
            )
        }
    };
    for line in lease_conformance::churn_in_batches(&store, total, 1_000, 100_000, measure).await {
        eprintln!("flat: {line}");
    }
}
