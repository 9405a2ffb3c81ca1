//! An order that waits for a person: the handler sends an approval link and suspends the run
//! until the link is followed, or until a timeout, which cancels the order.
//!
//! ```sh
//! cargo run -p distribution --example approval                  # on the embedded store
//! LEASE_STORE=postgres://… LEASE_SIGNAL_SECRET=… cargo run -p distribution --example approval
//! ```
//!
//! What it shows:
//! - the waiting run holds no lease and no worker slot (`End::await_signal`);
//! - the link carries a signed token (`RunContext::signal_token`) that answers **this** wait
//!   only: following it twice changes nothing the second time, a token re-pointed at another
//!   order is refused by its signature, and after the order moved on the old link is refused;
//! - the resumed attempt reads the decision (`RunContext::signal`) under a higher fence;
//! - an order nobody approves is cancelled when its wait times out
//!   (`RunContext::wait_timed_out`).

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distribution::{
    connect, CancellationToken, Config, End, InsertExt, InsertOpts, JobArgs, Kinds, RunContext,
    SignalExt, SignalKey, SignalToken, Ttl, Worker, WorkerConfig, WorkerId,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// How long a person has to approve an order.
const APPROVAL_TIMEOUT: Duration = Duration::from_secs(2);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Serialize, Deserialize)]
struct Order {
    id: String,
    amount_cents: u64,
}

impl JobArgs for Order {
    const KIND: &'static str = "order";
}

/// What became of each order: the application's own state.
type Ledger = Arc<Mutex<HashMap<String, String>>>;

#[tokio::main]
async fn main() -> ExitCode {
    match approve().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("approval: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn approve() -> Result<(), BoxError> {
    let mut config = Config::load(None)?;
    if config.store.is_empty() {
        config = config.with_store("memory:");
    }
    if config.namespace.is_none() {
        // A namespace of its own each time, so a second start does not meet the first's orders.
        config = config.with_namespace(format!("example_approval_{}", std::process::id()));
    }
    if config.signal_key.is_none() {
        // A demo's secret. A service reads its own from LEASE_SIGNAL_SECRET (the workers and
        // whatever serves the links need the same one).
        config.signal_key = Some(SignalKey::new("a demo secret, not for production")?);
    }
    let store = connect(&config).await?;

    // The "e-mails": each order's approval link, as the handler sent it.
    let (outbox, mut inbox) = mpsc::unbounded_channel::<(String, SignalToken)>();
    let ledger: Ledger = Arc::default();
    let kinds = Kinds::new().job::<Order, _, _>({
        let ledger = ledger.clone();
        move |ctx: RunContext, order: Order| {
            let (ledger, outbox) = (ledger.clone(), outbox.clone());
            async move {
                if let Some(approval) = ctx.signal("approval") {
                    let decision = String::from_utf8_lossy(approval.payload()).into_owned();
                    println!(
                        "{}: {decision} (the attempt under fence {} read it)",
                        order.id,
                        ctx.fence()
                    );
                    ledger.lock().unwrap().insert(order.id, decision);
                    return Ok(End::Complete);
                }
                if ctx.wait_timed_out("approval") {
                    println!("{}: nobody approved it in time; cancelled", order.id);
                    ledger.lock().unwrap().insert(order.id, "cancelled".into());
                    return Ok(End::Complete);
                }
                // First attempt: send the link, then wait without holding a lease.
                let token = ctx.signal_token("approval")?;
                println!(
                    "{}: {} cents; approval link sent: https://shop.example/approve/{token}",
                    order.id, order.amount_cents
                );
                let _ = outbox.send((order.id, token));
                Ok(End::await_signal("approval", APPROVAL_TIMEOUT)?)
            }
        }
    });
    let shutdown = CancellationToken::new();
    let worker = Worker::new(
        store.clone(),
        WorkerId::new("shop-1")?,
        WorkerConfig::new(Ttl::from_secs(10)?),
    )?;
    let stop = shutdown.clone();
    let running = tokio::spawn(async move { worker.run_kinds(kinds, stop).await });

    for (id, amount_cents) in [("order-1", 2500), ("order-2", 990)] {
        let order = Order {
            id: id.to_owned(),
            amount_cents,
        };
        store
            .insert(
                &order,
                InsertOpts::new().with_id(distribution::RunId::new(id)?),
            )
            .await?;
    }

    // The person approves order-1 (and, impatient, follows the link twice); nobody answers
    // for order-2.
    let mut links = HashMap::new();
    while links.len() < 2 {
        let (order, token) = inbox.recv().await.ok_or("the worker stopped")?;
        links.insert(order, token);
    }
    let link = &links["order-1"];
    let first = store.signal(link, b"approved by ana").await?;
    let again = store.signal(link, b"approved by ana").await?;
    println!(
        "order-1: link followed (duplicate: {}), followed again (duplicate: {})",
        first.duplicate, again.duplicate
    );
    // Order-2's link re-pointed at order-1 (order-1's body, order-2's signature): refused.
    let (one, two) = (links["order-1"].to_string(), links["order-2"].to_string());
    let body = one.rsplit_once('.').ok_or("a signed token")?.0;
    let signature = two.rsplit_once('.').ok_or("a signed token")?.1;
    let forged: SignalToken = format!("{body}.{signature}").parse()?;
    if let Err(e) = store.signal(&forged, b"approved by mallory").await {
        println!("a tampered link: {e}");
    }

    // Both orders settle: order-1 approved, order-2 cancelled after its timeout.
    let settled = tokio::time::timeout(APPROVAL_TIMEOUT * 5, async {
        while ledger.lock().unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    shutdown.cancel();
    running.await??;
    settled.map_err(|_| "the orders did not settle")?;
    // After the order moved on, its old link is refused, with the reason.
    if let Err(e) = store.signal(&links["order-2"], b"approved late").await {
        println!("order-2: a late approval: {e}");
    }
    let ledger = ledger.lock().unwrap();
    if ledger["order-1"] != "approved by ana" || ledger["order-2"] != "cancelled" {
        return Err(format!("unexpected outcomes: {ledger:?}").into());
    }
    Ok(())
}
