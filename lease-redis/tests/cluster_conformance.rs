//! The whole conformance suite against a 3-master Redis Cluster on loopback
//! (`REDIS_CLUSTER_URL`, or private redis-servers joined by `redis-cli --cluster create`).
lease_conformance::conformance_tests!(lease_conformance::fixtures::redis_cluster());
