//! `lease demo`: the guarantee as a timeline. Worker A claims, is cut off, stops at its local
//! deadline; B reclaims under a higher fence and finishes; A's late write is rejected by fence.

use std::sync::Arc;
use std::time::Duration;

use distribution::testing::{Fault, FaultyStore};
use distribution::{
    connect, CancelReason, Config, Error, LeaseStore, RunId, RunScope, ScopeConfig, Ttl, WorkerId,
};
use tokio::time::Instant;

use lease_cli::{exit, Failure};

/// The side effect both workers try to perform; the journal is the demo's ledger.
const EFFECT: &str = "effect: charge card";

struct Timeline(Instant);

impl Timeline {
    fn say(&self, what: impl std::fmt::Display) {
        println!("{:>7.3}s  {what}", self.0.elapsed().as_secs_f64());
    }
}

fn broken(what: impl Into<String>) -> Failure {
    Failure {
        code: exit::FAILURE,
        message: format!("the demo did not go as the guarantee says: {}", what.into()),
    }
}

pub(crate) async fn run(config: &Config) -> Result<(), Failure> {
    let store = connect(config).await?;
    let ttl = Ttl::from_millis(config.ttl.as_millis().min(1_500))?;
    let run = RunId::new(format!("demo-{}", std::process::id()))?;
    let (a, b) = (WorkerId::new("worker-a")?, WorkerId::new("worker-b")?);
    println!(
        "lease demo on the {store} store: TTL {ttl}, heartbeat every {:?}\n",
        ttl.as_duration() / 3
    );
    let t = Timeline(Instant::now());

    store.create(&run).await?;
    t.say(format!("run {run} created"));
    // A reaches the store through a link we can cut.
    let link = FaultyStore::new(store.clone());
    let scope = RunScope::claim(
        Arc::new(link.clone()) as Arc<dyn LeaseStore>,
        &run,
        &a,
        ttl,
        ScopeConfig::default(),
    )
    .await?;
    t.say(format!("{a} claims {run}: fence {}", scope.fence()));
    scope.append(b"step: reserve stock").await?;
    t.say(format!(
        "{a} writes \"step: reserve stock\" under fence {}: accepted",
        scope.fence()
    ));
    tokio::time::sleep(ttl.as_duration() / 2).await;
    t.say(format!("{a} has heartbeated {} time(s)", scope.renewals()));

    link.set(Fault::Hang);
    t.say(format!(
        "network between {a} and the store is cut (calls hang)"
    ));
    let in_flight = {
        let lease = scope.lease();
        let link = link.clone();
        tokio::spawn(async move { link.append(&lease, EFFECT.as_bytes()).await })
    };
    t.say(format!("{a} sends \"{EFFECT}\" under fence 1: in flight"));

    scope.cancelled().await;
    match scope.cancel_reason() {
        Some((_, reason @ CancelReason::DeadlineExceeded { .. })) => t.say(format!(
            "{a}'s scope is cancelled: {reason}; {a} stops working"
        )),
        other => return Err(broken(format!("A's scope ended with {other:?}"))),
    }

    let b_lease = loop {
        match store.claim(&run, &b, ttl).await {
            Ok(lease) => break lease,
            Err(Error::Held {
                owner, remaining, ..
            }) => {
                t.say(format!(
                    "{b} is refused: held by {owner} for another {remaining:?} (store clock)"
                ));
                tokio::time::sleep(remaining + Duration::from_millis(5)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    t.say(format!(
        "{a}'s lease has expired on the store's clock; {b} claims {run}: fence {}",
        b_lease.fence()
    ));
    store.append(&b_lease, EFFECT.as_bytes()).await?;
    t.say(format!(
        "{b} writes \"{EFFECT}\" under fence {}: accepted",
        b_lease.fence()
    ));
    store.complete(&b_lease).await?;
    t.say(format!("{b} completes {run}"));

    link.set(Fault::Pass);
    t.say(format!(
        "network heals; {a}'s in-flight write reaches the store"
    ));
    match in_flight.await {
        Ok(Err(Error::StaleFence {
            presented, current, ..
        })) => t.say(format!(
            "{a}'s write is rejected: StaleFence {{ presented: {presented}, current: {current} }}"
        )),
        Ok(other) => return Err(broken(format!("A's late write got {other:?}"))),
        Err(e) => return Err(broken(format!("A's write task failed: {e}"))),
    }

    let journal = store.journal(&run).await?;
    println!("\nledger of {run}:");
    for entry in &journal {
        println!(
            "  #{} fence {}  {}",
            entry.seq,
            entry.fence,
            String::from_utf8_lossy(&entry.payload)
        );
    }
    let effects = journal
        .iter()
        .filter(|e| e.payload == EFFECT.as_bytes())
        .count();
    if effects != 1 {
        return Err(broken(format!("{effects} effects in the ledger")));
    }
    println!("exactly one \"{EFFECT}\": the stale worker was fenced out, not merely late.");
    Ok(())
}
