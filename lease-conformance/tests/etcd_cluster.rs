//! The three-member etcd fixture: it starts healthy, a SIGKILLed leader is replaced by an
//! election among the other two, and the killed member comes back and follows.
#![cfg(feature = "etcd")]

use std::time::{Duration, Instant};

use lease_conformance::fixtures::etcd::{EtcdCluster, ELECTION_TIMEOUT, HINT, MEMBERS};
use lease_conformance::fixtures::required;

#[test]
fn a_killed_leader_is_replaced_and_rejoins_as_a_follower() {
    let Some(mut cluster) = required(
        "three-member etcd cluster",
        EtcdCluster::start().map_err(|e| e.to_string()),
        HINT,
    ) else {
        return;
    };
    let statuses = cluster.statuses().unwrap();
    assert_eq!(
        statuses.len(),
        MEMBERS,
        "every member answers: {statuses:?}"
    );
    let old = cluster.leader(Duration::from_secs(5)).unwrap();
    let old_term = statuses.iter().map(|s| s.raft_term).max().unwrap();
    let old_id = statuses.iter().find(|s| s.member == old).unwrap().id;

    let killed_at = Instant::now();
    cluster.kill(old);
    assert!(!cluster.is_running(old));
    let new = cluster
        .leader(Duration::from_secs(10))
        .expect("the two survivors elect a leader");
    let elected_in = killed_at.elapsed();
    assert_ne!(new, old, "a killed member cannot lead");
    let survivors = cluster.statuses().unwrap();
    assert_eq!(survivors.len(), MEMBERS - 1, "{survivors:?}");
    assert!(
        survivors
            .iter()
            .all(|s| s.leader != old_id && s.raft_term > old_term),
        "a new term, without the old leader: {survivors:?} (term was {old_term})"
    );
    eprintln!("new leader m{new} after {elected_in:?} (election timeout {ELECTION_TIMEOUT:?})");

    cluster
        .restart(old)
        .expect("the killed member restarts on its data");
    assert!(cluster.is_running(old));
    let leader = cluster.leader(Duration::from_secs(10)).unwrap();
    let all = cluster.statuses().unwrap();
    assert_eq!(all.len(), MEMBERS, "{all:?}");
    let back = all.iter().find(|s| s.member == old).unwrap();
    assert_eq!(
        back.leader,
        all.iter().find(|s| s.member == leader).unwrap().id,
        "the restarted member follows the cluster's leader: {all:?}"
    );
}
