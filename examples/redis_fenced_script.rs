//! Your own Redis writes, fenced: a [`FencedScript`] runs your Lua atomically after the lease's
//! fence check, so a worker that lost its run cannot write, even if it does not know yet.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p distribution --example redis_fenced_script
//! ```
//!
//! The store URL is `LEASE_STORE`, or else `REDIS_URL`. The story, checked as it goes (the
//! program exits non-zero if any step answers otherwise):
//!
//! 1. Worker A claims a run with a short TTL (fence 1) and pushes a line to the run's outbox,
//!    a Redis list of the application's, through a fenced script.
//! 2. A pauses (a GC pause, a partition) and stops renewing. Worker B polls `claim` until the
//!    **store's** clock says A's lease expired (the refusal tells how long is left), then
//!    reclaims the run: fence 2.
//! 3. A comes back and runs its script again: refused with
//!    `StaleFence { presented: 1, current: 2 }`, and the script did not run.
//! 4. B pushes its line and completes the run **in the same script**
//!    ([`fenced_script_with_end`](RedisLeaseStore::fenced_script_with_end)): the effect and the
//!    end happen together or not at all.
//! 5. The outbox, as B's script returns it, holds A's line from before the pause and B's
//!    line, nothing else.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distribution::redis::{FencedScript, RedisLeaseStore};
use distribution::{
    connect_store, Config, End, Error, LeaseStore, RunId, RunState, Store, Ttl, WorkerId,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    match story().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("redis_fenced_script: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn story() -> Result<(), BoxError> {
    let mut config = Config::load(None)?; // defaults, then the LEASE_* variables
    if std::env::var_os("LEASE_STORE").is_none() {
        let url = std::env::var("REDIS_URL")
            .map_err(|_| "set REDIS_URL (or LEASE_STORE) to a redis:// URL")?;
        config = config.with_store(url);
    }
    if config.namespace.is_none() {
        config = config.with_namespace("example-fenced-script");
    }
    let store: Arc<RedisLeaseStore> = match connect_store(&config).await? {
        Store::Redis(store) => store,
        _ => return Err(format!("this example needs a redis:// store, not {config}").into()),
    };

    // A fresh run each start, so the example can run again against the same server.
    let millis = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let run = RunId::new(format!("order-{millis:x}-{}", std::process::id()))?;
    store.create(&run).await?;

    // The application's data lives in keys of the run's hash slot, built by the store, so the
    // script also runs on Redis Cluster. The snippet is plain Lua: `KEYS` and `ARGV` are yours.
    let outbox = store.script_key(&run, "outbox");
    let push = FencedScript::new("return redis.call('RPUSH', KEYS[1], ARGV[1])");

    // 1. A claims (fence 1) with a short TTL and writes through the fence.
    let a = store
        .claim(&run, &WorkerId::new("worker-a")?, Ttl::from_millis(300)?)
        .await?;
    let len: i64 = store
        .fenced_script(&a, &push, &[&outbox], &["worker-a: reserved stock"])
        .await?;
    println!(
        "worker-a holds {run} at fence {}; outbox length {len}",
        a.fence()
    );
    expect(
        a.fence().get() == 1 && len == 1,
        "A's claim and first write",
    )?;

    // 2. A pauses. B waits for A's lease to expire on the store's clock: each refused claim
    //    says how long the holder has left, by that clock; no local timer decides it.
    let b_id = WorkerId::new("worker-b")?;
    let b = loop {
        match store.claim(&run, &b_id, Ttl::from_secs(30)?).await {
            Ok(lease) => break lease,
            Err(Error::Held { remaining, .. }) => {
                tokio::time::sleep(
                    remaining.clamp(Duration::from_millis(5), Duration::from_millis(100)),
                )
                .await
            }
            Err(e) => return Err(e.into()),
        }
    };
    println!("worker-b reclaimed {run} at fence {}", b.fence());
    expect(b.fence().get() == 2, "B's claim takes fence 2")?;

    // 3. A comes back and writes as if nothing happened: the fence refuses it, in the store.
    let late = store
        .fenced_script::<i64, _, _>(&a, &push, &[&outbox], &["worker-a: charged card"])
        .await;
    match late {
        Err(Error::StaleFence {
            presented: 1,
            current: 2,
            ..
        }) => println!("worker-a's late script refused: StaleFence {{ presented: 1, current: 2 }}"),
        other => return Err(format!("A's late write: expected StaleFence, got {other:?}").into()),
    }

    // 4. B writes its effect and completes the run in one script. This snippet also returns
    //    the whole outbox as it stands when the script commits.
    let push_and_read = FencedScript::new(
        "redis.call('RPUSH', KEYS[1], ARGV[1])\n\
         return redis.call('LRANGE', KEYS[1], 0, -1)",
    );
    let lines: Vec<String> = store
        .fenced_script_with_end(
            &b,
            &push_and_read,
            &[&outbox],
            &["worker-b: charged card"],
            End::Complete,
        )
        .await?;
    let record = store.inspect(&run).await?;
    println!("worker-b wrote its effect and completed {run} in one script");
    expect(
        record.state == RunState::Completed && record.fence.get() == 2,
        "the run is completed under fence 2",
    )?;

    // 5. The outbox: A's write from before the pause, and B's; A's late write left nothing.
    println!("outbox: {lines:?}");
    expect(
        lines == ["worker-a: reserved stock", "worker-b: charged card"],
        "the outbox holds A's write from before the pause and B's, not A's late one",
    )?;
    println!("ok: the stale holder's script write was refused by the fence");
    Ok(())
}

fn expect(ok: bool, what: &str) -> Result<(), BoxError> {
    if ok {
        Ok(())
    } else {
        Err(format!("not as expected: {what}").into())
    }
}
