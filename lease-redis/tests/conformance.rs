//! The whole conformance suite against a real Redis (REDIS_URL or a private redis-server).
lease_conformance::conformance_tests!(lease_conformance::fixtures::redis());
