//! A claimed run's payload is the payload of the life it claimed. A TCP proxy between the store
//! and a private redis-server holds back the reply of a `claim_next` script call the server has
//! run (the deterministic hook: the server answered, the client has not heard), while another
//! client cancels the run, purges it (age 0) and creates it again with another payload. The
//! lease then handed out must carry the payload of the run it claimed, never the new life's:
//! otherwise the handler runs the new life's job once under the dead lease and again under the
//! new life's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_conformance::fixtures::{free_port, unavailable, unique_namespace, RedisServer};
use lease_core::{Error, Kind, LeaseStore, NewRun, RunId, Ttl, WorkerId};
use lease_redis::{RedisConfig, RedisLeaseStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

fn server() -> Option<RedisServer> {
    match RedisServer::start() {
        Ok(server) => Some(server),
        Err(why) => unavailable(
            "redis-server",
            why,
            "install redis-server (bash scripts/test.sh does it)",
        ),
    }
}

async fn connect(url: &str, namespace: &str) -> RedisLeaseStore {
    let config = RedisConfig::from_url(url)
        .with_namespace(namespace)
        .with_response_timeout(Duration::from_secs(10));
    RedisLeaseStore::connect(config).await.expect("connect")
}

fn run(id: &str) -> RunId {
    RunId::new(id).unwrap()
}

fn ttl() -> Ttl {
    Ttl::from_millis(60_000).unwrap()
}

/// The hook: the next script call's reply is held once the server has begun to answer it
/// (so the script ran), `ran` is told, and the reply goes on to the client when `go` is.
struct Hold {
    ran: oneshot::Sender<()>,
    go: oneshot::Receiver<()>,
}

/// A proxy on a free port in front of `127.0.0.1:target`; returns its port and the slot where
/// a test arms the [`Hold`] for the next script call.
async fn proxy(target: u16) -> (u16, Arc<Mutex<Option<Hold>>>) {
    let port = free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let armed: Arc<Mutex<Option<Hold>>> = Arc::new(Mutex::new(None));
    let shared = armed.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(forward(client, target, shared.clone()));
        }
    });
    (port, armed)
}

async fn forward(mut client: TcpStream, target: u16, armed: Arc<Mutex<Option<Hold>>>) {
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
                let chunk = &up[..n];
                let hold = if chunk.windows(7).any(|w| w == b"EVALSHA") {
                    armed.lock().unwrap().take()
                } else {
                    None
                };
                if upstream.write_all(chunk).await.is_err() {
                    return;
                }
                if let Some(Hold { ran, go }) = hold {
                    // The first bytes of the reply: the script has run on the server.
                    let Ok(n) = upstream.read(&mut down).await else { return };
                    if n == 0 {
                        return;
                    }
                    let _ = ran.send(());
                    let _ = go.await;
                    if client.write_all(&down[..n]).await.is_err() {
                        return;
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

/// The run is cancelled, purged at age 0 and created again with another payload between the
/// server's run of the claiming script and the client's reading of its reply. The batch
/// `claim_next` hands out carries the first life's payload (or leaves the run out), never the
/// second's; the second life is claimed afterwards under a higher fence with its own payload.
/// Before, `claim_next` read the payloads with an `HMGET` after its script, and handed the
/// dead lease the new life's payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_run_carries_the_payload_of_the_life_it_claimed() {
    let Some(server) = server() else { return };
    let ns = unique_namespace("claim-life");
    let (port, armed) = proxy(server.port()).await;
    let direct = connect(&server.url(), &ns).await;
    let proxied = connect(&format!("redis://127.0.0.1:{port}"), &ns).await;
    let kind = Kind::new("mail").unwrap();
    let worker = WorkerId::new("w").unwrap();
    // Loads the script, so the call the hook holds is the one that claims.
    assert!(proxied
        .claim_next_kind(&kind, &worker, ttl(), 5)
        .await
        .unwrap()
        .is_empty());

    let id = run("job");
    direct
        .create_with(
            &NewRun::new(id.clone())
                .with_kind(kind.clone())
                .with_payload(b"first life".to_vec()),
        )
        .await
        .unwrap();
    let plain = run("plain");
    direct
        .create_with(&NewRun::new(plain.clone()).with_kind(kind.clone()))
        .await
        .unwrap();

    let (ran_tx, ran) = oneshot::channel();
    let (go, go_rx) = oneshot::channel();
    *armed.lock().unwrap() = Some(Hold {
        ran: ran_tx,
        go: go_rx,
    });
    let claiming = {
        let (proxied, kind, worker) = (proxied.clone(), kind.clone(), worker.clone());
        tokio::spawn(async move { proxied.claim_next_kind(&kind, &worker, ttl(), 5).await })
    };
    tokio::time::timeout(Duration::from_secs(10), ran)
        .await
        .expect("the claiming script was not sent")
        .unwrap();

    // Between the claim and its reply: the first life ends and a second begins.
    direct.cancel(&id, "superseded").await.unwrap();
    let purged = direct.purge(Duration::ZERO, 10).await.unwrap();
    assert!(purged.contains(&id), "{purged:?}");
    direct
        .create_with(
            &NewRun::new(id.clone())
                .with_kind(kind.clone())
                .with_payload(b"second life".to_vec()),
        )
        .await
        .unwrap();
    go.send(()).unwrap();

    let leases = claiming.await.unwrap().unwrap();
    let first = leases.iter().find(|lease| lease.run() == &id);
    if let Some(first) = first {
        assert_eq!(
            first.payload(),
            Some(&b"first life"[..]),
            "the first life's lease (fence {}) was handed the payload {:?}",
            first.fence(),
            first.payload().map(String::from_utf8_lossy)
        );
    }
    let other = leases
        .iter()
        .find(|lease| lease.run() == &plain)
        .expect("the other run of the batch is handed out");
    assert_eq!(other.payload(), None);

    // The second life is claimed on its own, above the first life's fence, with its payload.
    let second = direct.claim(&id, &worker, ttl()).await.unwrap();
    assert_eq!(second.payload(), Some(&b"second life"[..]));
    if let Some(first) = first {
        assert!(second.fence() > first.fence(), "{second:?} after {first:?}");
        // The dead lease writes nothing.
        let err = direct.complete(first).await.unwrap_err();
        assert!(matches!(err, Error::StaleFence { .. }), "{err:?}");
    }
}
