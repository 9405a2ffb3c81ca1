//! The model-based property test on a real Redis (REDIS_URL or a private redis-server).
#[test]
fn redis_store_agrees_with_the_model() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let Some(factory) = runtime.block_on(lease_conformance::fixtures::redis()) else {
        return;
    };
    drop(runtime);
    lease_conformance::model_check::run_model_check(factory, 1_000);
}
