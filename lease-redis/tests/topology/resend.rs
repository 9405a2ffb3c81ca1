//! A write sent twice is applied once: a TCP proxy between the store and Redis loses the reply
//! of a script the server ran, then either resets the client's connection (the driver's resend
//! territory) or sends the same bytes again itself (a resend the driver never saw).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_conformance::fixtures::{free_port, unique_namespace, RedisOptions};
use lease_core::{End, Ending, LeaseStore, RunState};
use lease_redis::FencedScript;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{connect, raw, retrying, run, say, server, ttl, worker};

/// What the proxy does to the next script call it forwards.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Forward everything.
    Pass,
    /// Forward the script, let the server run it, then reset the client's connection before
    /// the reply reaches it.
    Reset,
    /// Forward the script, drop its reply, and send the same bytes again on a new server
    /// connection, whose reply the client gets.
    Resend,
}

/// A proxy on `port` in front of `127.0.0.1:target`.
struct Proxy {
    mode: Arc<Mutex<Mode>>,
}

impl Proxy {
    async fn start(port: u16, target: u16) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let mode = Arc::new(Mutex::new(Mode::Pass));
        let shared = mode.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, target, shared.clone()));
            }
        });
        Proxy { mode }
    }

    /// Applies `mode` to the next script call only.
    fn arm(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }
}

async fn forward(mut client: TcpStream, target: u16, mode: Arc<Mutex<Mode>>) {
    let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", target)).await else {
        return;
    };
    let (mut up, mut down) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        tokio::select! {
            read = client.read(&mut up) => {
                let Ok(n) = read else { return };
                if n == 0 {
                    return;
                }
                let chunk = up[..n].to_vec();
                let script = chunk.windows(7).any(|w| w == b"EVALSHA");
                let armed = {
                    let mut mode = mode.lock().unwrap();
                    let armed = *mode;
                    if script && armed != Mode::Pass {
                        *mode = Mode::Pass;
                        armed
                    } else {
                        Mode::Pass
                    }
                };
                if upstream.write_all(&chunk).await.is_err() {
                    return;
                }
                match armed {
                    Mode::Pass => {}
                    Mode::Reset => {
                        // The server runs the script; its reply never reaches the client.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        let _ = client.set_zero_linger();
                        return;
                    }
                    Mode::Resend => {
                        // The first reply is read and thrown away, then the same bytes go
                        // again on a new connection.
                        let _ = upstream.read(&mut down).await;
                        let Ok(again) = TcpStream::connect(("127.0.0.1", target)).await else {
                            return;
                        };
                        upstream = again;
                        if upstream.write_all(&chunk).await.is_err() {
                            return;
                        }
                    }
                }
            }
            read = upstream.read(&mut down) => {
                let Ok(n) = read else { return };
                if n == 0 || client.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// A one-node Redis Cluster (every slot on one master) that announces the proxy's port, so
/// the cluster client's every connection goes through the proxy.
#[tokio::test]
async fn a_script_whose_reply_was_lost_on_a_cluster_connection_is_applied_once() {
    let proxy_port = free_port();
    let bus = free_port().to_string();
    let announced = proxy_port.to_string();
    let Some(node) = server(
        RedisOptions::default()
            .with_bind(&["127.0.0.1"])
            .with_args(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                &bus,
                "--cluster-announce-ip",
                "127.0.0.1",
                "--cluster-announce-port",
                &announced,
            ]),
    ) else {
        return;
    };
    node.command(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"])
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !node
        .command(&["CLUSTER", "INFO"])
        .unwrap()
        .contains("cluster_state:ok")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the cluster is not ok"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let proxy = Proxy::start(proxy_port, node.port()).await;
    let ns = unique_namespace("resent");
    let store = connect(&format!("redis+cluster://127.0.0.1:{proxy_port}"), &ns)
        .await
        .unwrap();
    let r = run("r");
    store.create(&r).await.unwrap();
    let lease = store.claim(&r, &worker("a"), ttl(60_000)).await.unwrap();

    // Once unarmed, so the server has the script (a first EVALSHA would answer NOSCRIPT).
    store.append(&lease, b"warm-up").await.unwrap();
    proxy.arm(Mode::Reset);
    let answer = store.append(&lease, b"the effect").await;
    match &answer {
        Ok(entry) => assert_eq!(entry.seq, 2, "a resend answered another entry"),
        Err(e) => assert!(e.is_retryable(), "{e:?}"),
    }
    // The reset connection is made anew by the first call that needs it (that call may fail,
    // retryably).
    let journal = retrying(Duration::from_secs(5), "read the journal", || {
        store.journal(&r)
    })
    .await;
    say(&format!(
        "cluster, reply lost and connection reset: append answered {answer:?}; the journal \
         holds {} entr{}",
        journal.len(),
        if journal.len() == 1 { "y" } else { "ies" }
    ));
    assert_eq!(
        journal
            .iter()
            .map(|e| e.payload.as_slice())
            .collect::<Vec<_>>(),
        [&b"warm-up"[..], b"the effect"],
        "the script ran twice, or not at all"
    );
}

/// Every fenced write the proxy sends twice, under one call, answers its first result and
/// changes nothing the second time: an append (one more journal entry, its seq), a fenced script
/// (its own key written once, its first return value), an `end_many` (`Ok`, not "already
/// completed").
#[tokio::test]
async fn a_resent_fenced_write_answers_its_first_result_and_changes_nothing() {
    let Some(redis) = server(RedisOptions::default()) else {
        return;
    };
    let proxy_port = free_port();
    let proxy = Proxy::start(proxy_port, redis.port()).await;
    let ns = unique_namespace("resend");
    let store = connect(&format!("redis://127.0.0.1:{proxy_port}"), &ns)
        .await
        .unwrap();
    let r = run("r");
    store.create(&r).await.unwrap();
    let lease = store.claim(&r, &worker("a"), ttl(60_000)).await.unwrap();

    // Each write once unarmed first, so the server has its script (a first EVALSHA would
    // answer NOSCRIPT, and the resend would test nothing).
    store.append(&lease, b"warm-up").await.unwrap();
    proxy.arm(Mode::Resend);
    let entry = store.append(&lease, b"the effect").await.unwrap();
    assert_eq!(entry.seq, 2, "the resend appended again");
    assert_eq!(store.journal(&r).await.unwrap().len(), 2);

    let outbox = store.script_key(&r, "outbox");
    let push = FencedScript::new("return redis.call('RPUSH', KEYS[1], ARGV[1])");
    let warm = store.script_key(&r, "warm-up");
    let _: i64 = store
        .fenced_script(&lease, &push, &[&warm], &["x"])
        .await
        .unwrap();
    proxy.arm(Mode::Resend);
    let len: i64 = store
        .fenced_script(&lease, &push, &[&outbox], &["receipt"])
        .await
        .unwrap();
    let mut direct = raw(&redis.url()).await;
    let stored: i64 = redis::cmd("LLEN")
        .arg(&outbox)
        .query_async(&mut direct)
        .await
        .unwrap();
    assert_eq!((len, stored), (1, 1), "the snippet ran twice");

    let other = run("other");
    store.create(&other).await.unwrap();
    let other_lease = store
        .claim(&other, &worker("a"), ttl(60_000))
        .await
        .unwrap();
    store
        .end_many(&[Ending::new(other_lease, End::Complete)])
        .await
        .unwrap();
    proxy.arm(Mode::Resend);
    let ended = store
        .end_many(&[Ending::new(lease.clone(), End::Complete)])
        .await
        .unwrap();
    assert!(
        matches!(ended[..], [Ok(())]),
        "the resend answered {ended:?} for the end it applied"
    );
    assert_eq!(store.inspect(&r).await.unwrap().state, RunState::Completed);

    // A batch that finds one lease ended already (by another call) and ends another: its
    // resend answers Ok for the one it ended, LeaseEnded for the other.
    let (before, fresh) = (run("ended-before"), run("ended-by-the-batch"));
    let mut batch = Vec::new();
    for id in [&before, &fresh] {
        store.create(id).await.unwrap();
        batch.push(store.claim(id, &worker("a"), ttl(60_000)).await.unwrap());
    }
    store.complete(&batch[0]).await.unwrap();
    proxy.arm(Mode::Resend);
    let mixed = store
        .end_many(&[
            Ending::new(batch[0].clone(), End::Complete),
            Ending::new(batch[1].clone(), End::Complete),
        ])
        .await
        .unwrap();
    assert!(
        matches!(
            &mixed[..],
            [Err(lease_core::Error::LeaseEnded { fence, .. }), Ok(())] if *fence == batch[0].fence().get()
        ),
        "the resent mixed batch answered {mixed:?}"
    );

    // A single end (the fenced script's end path), resent.
    let single = run("single");
    store.create(&single).await.unwrap();
    let single_lease = store
        .claim(&single, &worker("a"), ttl(60_000))
        .await
        .unwrap();
    proxy.arm(Mode::Resend);
    let completed = store.complete(&single_lease).await;
    assert!(
        completed.is_ok(),
        "the resent complete answered {completed:?}"
    );
    assert_eq!(
        store.inspect(&single).await.unwrap().state,
        RunState::Completed
    );

    // A single release, resent: applied once (the attempt given back once, one history entry),
    // answered Ok; a new call under the same lease (the caller's own retry) learns it ended.
    let released = run("released");
    store.create(&released).await.unwrap();
    let released_lease = store
        .claim(&released, &worker("a"), ttl(60_000))
        .await
        .unwrap();
    proxy.arm(Mode::Resend);
    let release = store.release(&released_lease).await;
    assert!(release.is_ok(), "the resent release answered {release:?}");
    let record = store.inspect(&released).await.unwrap();
    assert_eq!(
        (
            record.state,
            record.owner.as_ref(),
            record.attempts,
            record.history.as_ref().map(Vec::len)
        ),
        (RunState::Runnable, None, 0, Some(1)),
        "the resent release applied twice: {record:?}"
    );
    let again = store.release(&released_lease).await;
    assert!(
        matches!(
            again,
            Err(lease_core::Error::LeaseEnded { fence, ended: lease_core::Ended::Released, .. })
                if fence == released_lease.fence().get()
        ),
        "a new release call answered {again:?}"
    );
    say(&format!(
        "resent by a proxy: append seq {}, journal 2 entries (one warm-up); fenced script returned {len}, \
         list length {stored}; end_many {ended:?}; mixed batch {mixed:?}; complete {completed:?}; \
         release {release:?}, then a new release call {again:?}",
        entry.seq
    ));
}
