//! The whole conformance suite against a private three-member etcd cluster (`ETCD_ENDPOINTS`,
//! or members started from the installed `etcd`), at etcd's pace: whole-second TTLs from 1 s.
lease_conformance::conformance_tests!(lease_conformance::fixtures::etcd::etcd());
