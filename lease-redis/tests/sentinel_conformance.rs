//! The whole conformance suite through Redis Sentinel (`REDIS_SENTINEL_URL`, or a private
//! primary, replica and Sentinel), with `replicas=1`: every lease and write acknowledged by the
//! replica.
lease_conformance::conformance_tests!(lease_conformance::fixtures::redis_sentinel());
