//! The model-based property test on a private three-member etcd cluster.

#[test]
fn etcd_store_agrees_with_the_model() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let Some(factory) = runtime.block_on(lease_conformance::fixtures::etcd::etcd()) else {
        return;
    };
    drop(runtime);
    lease_conformance::model_check::run_model_check(factory, 64);
}
