//! The model-based property test on the memory store.
#[test]
fn memory_store_agrees_with_the_model() {
    lease_conformance::model_check::run_model_check(
        std::sync::Arc::new(lease_conformance::fixtures::MemoryFactory),
        1_000,
    );
}
