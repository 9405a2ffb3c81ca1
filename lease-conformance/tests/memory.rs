//! The whole conformance suite against the embedded memory store.
lease_conformance::conformance_tests!(lease_conformance::fixtures::memory());
