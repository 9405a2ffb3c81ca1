//! The whole conformance suite through the wrappers a user meets, over the memory store:
//! `Instrumented` (what `distribution::connect` and the `lease` command hand out) around a
//! `FaultyStore` with no fault armed. A trait method a wrapper forgets to forward answers its
//! default (`Unsupported`, or a slower loop), and the scenario that uses it fails here.

use std::sync::Arc;

use lease_conformance::StoreFactory;
use lease_core::LeaseStore;
use lease_runtime::{FaultyStore, Instrumented, MemoryLeaseStore};

struct Wrapped;

#[async_trait::async_trait]
impl StoreFactory for Wrapped {
    async fn fresh(&self) -> Arc<dyn LeaseStore> {
        let faulty: Arc<dyn LeaseStore> =
            Arc::new(FaultyStore::new(Arc::new(MemoryLeaseStore::new())));
        Instrumented::wrap(faulty, "memory")
    }
}

async fn wrapped() -> Option<Arc<dyn StoreFactory>> {
    Some(Arc::new(Wrapped))
}

lease_conformance::conformance_tests!(wrapped());
