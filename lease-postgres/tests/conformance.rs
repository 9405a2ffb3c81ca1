//! Runs the whole conformance suite against Postgres.
lease_conformance::conformance_tests!(lease_conformance::fixtures::postgres());
