//! The model-based property test on a real Redis (REDIS_URL or a private redis-server), on a
//! Redis Cluster and through Sentinel with `replicas=1`.

use std::sync::Arc;

use lease_conformance::StoreFactory;

fn check(factory: impl std::future::Future<Output = Option<Arc<dyn StoreFactory>>>, cases: u32) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let Some(factory) = runtime.block_on(factory) else {
        return;
    };
    drop(runtime);
    lease_conformance::model_check::run_model_check(factory, cases);
}

#[test]
fn redis_store_agrees_with_the_model() {
    check(lease_conformance::fixtures::redis(), 1_000);
}

#[test]
fn redis_cluster_store_agrees_with_the_model() {
    check(lease_conformance::fixtures::redis_cluster(), 1_000);
}

#[test]
fn redis_sentinel_store_agrees_with_the_model() {
    check(lease_conformance::fixtures::redis_sentinel(), 1_000);
}
