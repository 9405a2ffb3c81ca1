//! The run record's facts (`lua/common.lua`): what is fixed at a run's creation (its flags: of
//! the default class, no payload; its class otherwise) and spares the hot scripts a look-up. A record written before flags were
//! kept must read and run exactly as before, by looking the facts up; a record with them must
//! not be looked up at all; and the applied-calls bookkeeping that the ends no longer drop must
//! still answer a resend. On private redis-servers.

use std::time::Duration;

use lease_conformance::fixtures::{unavailable, unique_namespace, RedisServer};
use lease_core::{End, Ending, Kind, LeaseStore, NewRun, RunId, RunState, Ttl, WorkerId};
use lease_redis::{RedisConfig, RedisLeaseStore};
use redis::aio::MultiplexedConnection;

const HINT: &str = "install redis-server (apt-get install redis-server)";

fn server() -> Option<RedisServer> {
    match RedisServer::start_with(true, None) {
        Ok(server) => Some(server),
        Err(why) => unavailable("redis-server", why, HINT),
    }
}

async fn connect(url: &str, namespace: &str) -> RedisLeaseStore {
    let config = RedisConfig::from_url(url)
        .with_namespace(namespace)
        .with_response_timeout(Duration::from_secs(5));
    RedisLeaseStore::connect(config).await.expect("connect")
}

async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn run(id: &str) -> RunId {
    RunId::new(id).unwrap()
}

fn worker() -> WorkerId {
    WorkerId::new("w").unwrap()
}

fn ttl() -> Ttl {
    Ttl::from_millis(60_000).unwrap()
}

fn hex(id: &str) -> String {
    id.bytes().map(|b| format!("{b:02x}")).collect()
}

async fn record(conn: &mut MultiplexedConnection, ns: &str, id: &str) -> String {
    redis::cmd("HGET")
        .arg(format!("{{lease:{ns}}}:runs"))
        .arg(hex(id))
        .query_async(conn)
        .await
        .unwrap()
}

/// The record's facts: its flags after byte 2, then any class after byte 3 (`None` without
/// them).
fn flags(record: &str) -> Option<&str> {
    record.split_once('\u{2}').map(|(_, facts)| facts)
}

/// Writes the record of `id` back without its facts, as a version before them wrote it.
async fn strip_flags(conn: &mut MultiplexedConnection, ns: &str, id: &str) {
    let old = record(conn, ns, id).await;
    // A run of another kind with a payload has no flag to strip.
    let without = old
        .split_once('\u{2}')
        .map_or(old.as_str(), |(without, _)| without);
    let _: () = redis::cmd("HSET")
        .arg(format!("{{lease:{ns}}}:runs"))
        .arg(hex(id))
        .arg(without)
        .query_async(conn)
        .await
        .unwrap();
}

/// `HGET` calls the server has run so far (inside scripts too), from `INFO commandstats`.
async fn hgets(conn: &mut MultiplexedConnection) -> u64 {
    calls(conn, "hget").await
}

/// `HGET`s and `HMGET`s the server has run since `before` (from [`reads`] then).
async fn reads_since(conn: &mut MultiplexedConnection, before: (u64, u64)) -> (u64, u64) {
    let now = reads(conn).await;
    (now.0 - before.0, now.1 - before.1)
}

/// `HGET`s and `HMGET`s the server has run so far (inside scripts too).
async fn reads(conn: &mut MultiplexedConnection) -> (u64, u64) {
    (hgets(conn).await, calls(conn, "hmget").await)
}

/// Calls of `command` the server has run so far (inside scripts too).
async fn calls(conn: &mut MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map(|rest| rest.split(',').next().unwrap().parse().unwrap())
        .unwrap_or(0)
}

/// Creation writes the facts it knows: the flags 'd' (the default class) and 'n' (no payload),
/// and the class of a run of another kind or priority; claims, renewals and ends keep them.
#[tokio::test]
async fn creation_writes_the_facts_and_every_write_keeps_them() {
    let Some(server) = server() else { return };
    let ns = unique_namespace("flags");
    let store = connect(&server.url(), &ns).await;
    let mut conn = raw(&server.url()).await;
    let mail = Kind::new("mail").unwrap();
    store.create(&run("plain")).await.unwrap();
    store
        .create_with(&NewRun::new(run("carrying")).with_payload(b"".to_vec()))
        .await
        .unwrap();
    store
        .create_many_with(&[
            NewRun::new(run("kinded")).with_kind(mail.clone()),
            NewRun::new(run("both"))
                .with_kind(mail.clone())
                .with_priority(3)
                .with_payload(b"x".to_vec()),
        ])
        .await
        .unwrap();
    let facts = [
        ("plain", "dn"),
        ("carrying", "d"),
        ("kinded", "n\u{3}mail"),
        ("both", "\u{3}mail\n3"),
    ];
    for (id, want) in facts {
        let rec = record(&mut conn, &ns, id).await;
        assert_eq!(flags(&rec), Some(want), "{id}: {rec:?}");
    }

    let lease = store.claim(&run("plain"), &worker(), ttl()).await.unwrap();
    assert_eq!(flags(&record(&mut conn, &ns, "plain").await), Some("dn"));
    let lease = store.renew(&lease).await.unwrap();
    assert_eq!(flags(&record(&mut conn, &ns, "plain").await), Some("dn"));
    store.release(&lease).await.unwrap();
    assert_eq!(flags(&record(&mut conn, &ns, "plain").await), Some("dn"));
    let both = store.claim(&run("both"), &worker(), ttl()).await.unwrap();
    let both = store.renew(&both).await.unwrap();
    assert_eq!(both.payload(), Some(&b"x"[..]));
    store.release(&both).await.unwrap();
    let taken = store.claim_next(&worker(), ttl(), 10).await.unwrap();
    assert_eq!(taken.len(), 2, "plain and carrying: {taken:?}");
    let kinded = store
        .claim_next_kind(&mail, &worker(), ttl(), 10)
        .await
        .unwrap();
    assert_eq!(kinded.len(), 2, "both, then kinded: {kinded:?}");
    assert_eq!(kinded[0].run().as_str(), "both", "priority 3 first");
    let mut ends: Vec<Ending> = taken
        .into_iter()
        .chain(kinded)
        .map(|lease| Ending::new(lease, End::Complete))
        .collect();
    ends.rotate_left(1);
    for result in store.end_many(&ends).await.unwrap() {
        result.unwrap();
    }
    for (id, want) in facts {
        let rec = record(&mut conn, &ns, id).await;
        assert_eq!(flags(&rec), Some(want), "{id} after its end: {rec:?}");
        assert_eq!(
            store.inspect(&run(id)).await.unwrap().state,
            RunState::Completed,
            "{id}"
        );
    }
    let read = store.inspect(&run("both")).await.unwrap();
    assert_eq!((&read.kind, read.priority), (&mail, 3), "{read:?}");
}

/// A claim → renew → release of a default-class run without a payload reads its record and
/// nothing else: no kind, no payload looked up. Only the history (the release writes its
/// attempt) is read besides. A record without flags looks both up.
#[tokio::test]
async fn a_flagged_record_spares_the_kind_and_payload_look_ups() {
    let Some(server) = server() else { return };
    let ns = unique_namespace("flag-cost");
    let store = connect(&server.url(), &ns).await;
    let mut conn = raw(&server.url()).await;
    let cycle = |id: RunId| {
        let store = &store;
        async move {
            let lease = store.claim(&id, &worker(), ttl()).await.unwrap();
            let lease = store.renew(&lease).await.unwrap();
            store.release(&lease).await.unwrap();
        }
    };
    store.create(&run("new")).await.unwrap();
    store.create(&run("old")).await.unwrap();
    cycle(run("new")).await; // the scripts loaded, outside the count
    strip_flags(&mut conn, &ns, "old").await;

    let before = hgets(&mut conn).await;
    cycle(run("new")).await;
    let flagged = hgets(&mut conn).await - before;
    // claim: the record; renew: the record; release: the record and the history.
    assert_eq!(flagged, 4, "HGETs of a flagged record's cycle");

    let before = hgets(&mut conn).await;
    cycle(run("old")).await;
    let unflagged = hgets(&mut conn).await - before;
    // Besides: the claim's kind and payload, the release's kind.
    assert_eq!(unflagged, 7, "HGETs of an unflagged record's cycle");

    // A run of another kind with a payload, claimed through its kind's index: its class is in
    // its record, so only the payload is looked up; without the facts, the release looks the
    // class up too.
    let mail = Kind::new("mail").unwrap();
    let kinded_cycle = || {
        let (store, mail) = (&store, &mail);
        async move {
            let taken = store
                .claim_next_kind(mail, &worker(), ttl(), 1)
                .await
                .unwrap();
            assert_eq!(taken[0].payload(), Some(&b"p"[..]));
            let lease = store.renew(&taken[0]).await.unwrap();
            store.release(&lease).await.unwrap();
        }
    };
    store
        .create_with(
            &NewRun::new(run("mail"))
                .with_kind(mail.clone())
                .with_payload(b"p".to_vec()),
        )
        .await
        .unwrap();
    kinded_cycle().await; // the script loaded, outside the count
    let before = reads(&mut conn).await;
    kinded_cycle().await;
    // claim_next: its queue's pause, the record and the payload, in its script; renew: the
    // record; release: the record and the history.
    assert_eq!(
        reads_since(&mut conn, before).await,
        (6, 0),
        "HGETs and HMGETs of a kinded record's cycle"
    );
    strip_flags(&mut conn, &ns, "mail").await;
    let before = reads(&mut conn).await;
    kinded_cycle().await;
    // One more: the kind, looked up in the kinds hash.
    assert_eq!(
        reads_since(&mut conn, before).await,
        (7, 0),
        "HGETs and HMGETs of an old kinded record's cycle"
    );
}

/// A `claim_next` batch reads the payloads of the runs it takes in its claiming script, one
/// command for the whole batch, and each lease gets its own run's payload byte-exact: an empty
/// one as empty, none as none, whether its record carries the facts or not. A record whose
/// facts say it has no payload is not looked up.
#[tokio::test]
async fn a_batch_reads_its_payloads_in_its_claiming_script() {
    let Some(server) = server() else { return };
    let ns = unique_namespace("flag-batch");
    let store = connect(&server.url(), &ns).await;
    let mut conn = raw(&server.url()).await;
    let batch = Kind::new("batch").unwrap();
    let payload_of = |i: usize| match i % 4 {
        0 => None,
        1 => Some(Vec::new()),
        _ => Some(format!("payload {i} ").repeat(i).into_bytes()),
    };
    let runs: Vec<NewRun> = (0..12)
        .map(|i| {
            let new = NewRun::new(run(&format!("b-{i:02}"))).with_kind(batch.clone());
            match payload_of(i) {
                Some(bytes) => new.with_payload(bytes),
                None => new,
            }
        })
        .collect();
    for created in store.create_many_with(&runs).await.unwrap() {
        created.unwrap();
    }
    // Two records written before the facts: one with a payload, one without.
    strip_flags(&mut conn, &ns, "b-02").await;
    strip_flags(&mut conn, &ns, "b-04").await;
    // The script loaded, outside the count.
    assert!(store
        .claim_next_kind(&Kind::new("warm").unwrap(), &worker(), ttl(), 1)
        .await
        .unwrap()
        .is_empty());
    let before = reads(&mut conn).await;
    let scripts = calls(&mut conn, "evalsha").await;
    let taken = store
        .claim_next_kind(&batch, &worker(), ttl(), 12)
        .await
        .unwrap();
    assert_eq!(taken.len(), 12);
    assert_eq!(
        calls(&mut conn, "evalsha").await - scripts,
        1,
        "commands of a batch of 12"
    );
    for lease in &taken {
        let i: usize = lease.run().as_str()[2..].parse().unwrap();
        assert_eq!(
            lease.payload(),
            payload_of(i).as_deref(),
            "{}'s payload",
            lease.run()
        );
    }
    // The queue's pause, the 12 records, then in the same script the payloads of the 9 runs
    // that have one and of the unflagged record without one (which answers none); none of the
    // 2 flagged 'n'.
    assert_eq!(
        reads_since(&mut conn, before).await,
        (23, 0),
        "HGETs and HMGETs of a batch of 12"
    );
}

/// A record written before flags were kept, of another kind and with a payload, still runs
/// by looking them up: a claim that presumes the default kind learns the run's kind and claims
/// it, the payload is handed over byte-exact, and a batch end and a single end find the run's
/// index. An unflagged default-class record without a payload reads no payload.
#[tokio::test]
async fn a_record_without_flags_looks_the_facts_up() {
    let Some(server) = server() else { return };
    let ns = unique_namespace("no-flags");
    let store = connect(&server.url(), &ns).await;
    let mut conn = raw(&server.url()).await;
    let mail = Kind::new("mail").unwrap();
    store
        .create_with(
            &NewRun::new(run("old-mail"))
                .with_kind(mail.clone())
                .with_payload(b"to: a@b".to_vec()),
        )
        .await
        .unwrap();
    store.create(&run("old-plain")).await.unwrap();
    strip_flags(&mut conn, &ns, "old-mail").await;
    strip_flags(&mut conn, &ns, "old-plain").await;

    let lease = store
        .claim(&run("old-mail"), &worker(), ttl())
        .await
        .unwrap();
    assert_eq!(lease.payload(), Some(&b"to: a@b"[..]));
    store.release(&lease).await.unwrap();
    let read = store.inspect(&run("old-mail")).await.unwrap();
    assert_eq!(read.kind, mail, "{read:?}");
    assert_eq!(read.payload.as_deref(), Some(&b"to: a@b"[..]));
    assert!(
        store
            .claim_next(&worker(), ttl(), 10)
            .await
            .unwrap()
            .iter()
            .all(|l| l.run().as_str() == "old-plain"),
        "the default kind's claim_next took a run of another kind"
    );
    let again = store
        .claim_next_kind(&mail, &worker(), ttl(), 10)
        .await
        .unwrap();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].payload(), Some(&b"to: a@b"[..]));
    let ended = store
        .end_many(&[Ending::new(again[0].clone(), End::Complete)])
        .await
        .unwrap();
    assert!(matches!(ended[..], [Ok(())]), "{ended:?}");
    assert_eq!(
        store.inspect(&run("old-mail")).await.unwrap().state,
        RunState::Completed
    );
    let plain = store.inspect(&run("old-plain")).await.unwrap();
    assert_eq!(plain.payload, None, "{plain:?}");
    assert_eq!(flags(&record(&mut conn, &ns, "old-mail").await), None);
}

/// The keys `fenced.lua` declares for run `id` in namespace `ns`, in its order.
fn fenced_keys(ns: &str, id: &str) -> Vec<String> {
    let tag = format!("{{lease:{ns}}}");
    let id = hex(id);
    [
        format!("{tag}:runs"),
        format!("{tag}:j:{id}"),
        format!("{tag}:claimable"),
        format!("{tag}:k:{id}"),
        format!("{tag}:ended"),
        format!("{tag}:suspended"),
        format!("{tag}:attempts"),
        format!("{tag}:kind"),
        format!("{tag}:hist"),
    ]
    .into()
}

/// An append resent after its lease ended (suspended here; a reply lost, the same call sent again
/// late) answers its first result, and appends nothing: the end no longer drops the lease's
/// applied calls. A new call under the ended lease is refused; after the next claim, an append
/// under the new fence drops the old calls, and the old call resent is refused by the fence.
#[tokio::test]
async fn an_append_resent_after_its_lease_ended_answers_its_first_result() {
    let Some(server) = server() else { return };
    let ns = unique_namespace("late-resend");
    let store = connect(&server.url(), &ns).await;
    let mut conn = raw(&server.url()).await;
    let id = run("r");
    store.create(&id).await.unwrap();
    let lease = store.claim(&id, &worker(), ttl()).await.unwrap();
    let fenced = redis::Script::new(&format!(
        "{}{}",
        lease_redis::script_prelude(),
        include_str!("../lua/fenced.lua")
    ));
    let append = |call: &'static str, fence: u64| {
        let mut invocation = fenced.prepare_invoke();
        for key in fenced_keys(&ns, "r") {
            invocation.key(key);
        }
        invocation
            .arg("append")
            .arg(hex("r"))
            .arg(fence)
            .arg(b"the effect".to_vec())
            .arg(call)
            .arg("");
        invocation
    };
    let first: Vec<redis::Value> = append("call-1", lease.fence().get())
        .invoke_async(&mut conn)
        .await
        .unwrap();
    store.suspend(&lease).await.unwrap();
    let resent: Vec<redis::Value> = append("call-1", lease.fence().get())
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(resent, first, "the late resend answered otherwise");
    assert_eq!(store.journal(&id).await.unwrap().len(), 1, "appended twice");
    let new_call: Vec<redis::Value> = append("call-2", lease.fence().get())
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        new_call.first(),
        Some(&redis::Value::BulkString(b"verdict".to_vec())),
        "a new call under an ended lease: {new_call:?}"
    );

    store.resume(&id).await.unwrap();
    let next = store.claim(&id, &worker(), ttl()).await.unwrap();
    store.append(&next, b"the next lease's").await.unwrap();
    let stale: Vec<redis::Value> = append("call-1", lease.fence().get())
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        stale.first(),
        Some(&redis::Value::BulkString(b"verdict".to_vec())),
        "the old call under a moved fence: {stale:?}"
    );
    assert_eq!(store.journal(&id).await.unwrap().len(), 2);
}

/// A wait flags the record 'w' (the one fact set after creation): only a run that has waited
/// has its last wait's end read by its claims. A record written before the facts gets the flag
/// alone, which leaves its class and payload looked up as before, and its claims carry the
/// signal; a record that never waited reads no more than before.
#[tokio::test]
async fn a_wait_flags_the_record_and_only_a_flagged_claim_reads_its_end() {
    use lease_core::{LeaseStoreExt, SignalExt, SignalToken, WaitEnd};
    let Some(server) = server() else { return };
    let ns = unique_namespace("flag-wait");
    let store = connect(&server.url(), &ns).await;
    let mut conn = raw(&server.url()).await;
    let mail = Kind::new("mail").unwrap();
    store.create(&run("new")).await.unwrap();
    store
        .create_with(
            &NewRun::new(run("old"))
                .with_kind(mail.clone())
                .with_payload(b"p".to_vec()),
        )
        .await
        .unwrap();
    strip_flags(&mut conn, &ns, "old").await;
    for (id, before, after) in [("new", "dn", "wdn"), ("old", "", "w")] {
        let lease = store.claim(&run(id), &worker(), ttl()).await.unwrap();
        assert_eq!(lease.resumed(), None);
        let rec = record(&mut conn, &ns, id).await;
        assert_eq!(flags(&rec).unwrap_or(""), before, "{id}: {rec:?}");
        let token = SignalToken::for_lease(&lease, "approval", store.signal_key()).unwrap();
        store
            .end_one(
                &lease,
                End::await_signal("approval", Duration::from_secs(60)).unwrap(),
            )
            .await
            .unwrap();
        let rec = record(&mut conn, &ns, id).await;
        assert_eq!(flags(&rec), Some(after), "{id} waited: {rec:?}");
        assert!(!store.signal(&token, b"\0yes\x1f").await.unwrap().duplicate);
        let lease = store.claim(&run(id), &worker(), ttl()).await.unwrap();
        assert_eq!(
            lease
                .resumed()
                .and_then(WaitEnd::signal)
                .map(|s| s.payload()),
            Some(&b"\0yes\x1f"[..]),
            "{id}"
        );
        if id == "old" {
            // Its class and payload, looked up as before.
            assert_eq!(
                (lease.kind(), lease.payload()),
                (&mail, Some(&b"p"[..])),
                "{id}"
            );
        }
        store.end_one(&lease, End::Complete).await.unwrap();
        assert_eq!(flags(&record(&mut conn, &ns, id).await), Some(after));
    }
}

/// A run's trace parent is kept in the payloads hash, field `t:<id>`, and flagged `t` in its
/// record: a run created without one has neither, and nothing is looked up for it; a record
/// without the flag (as every record created before trace parents were kept) reads as none
/// even beside a stray field; a stored text that is not a traceparent is reported as an
/// unexpected reply (a corrupt record), not a panic; and purge removes the field with the run.
#[tokio::test]
async fn a_trace_parent_is_kept_flagged_beside_the_payload_and_purged_with_its_run() {
    let Some(server) = server() else { return };
    let ns = unique_namespace("trace");
    let store = connect(&server.url(), &ns).await;
    let mut conn = raw(&server.url()).await;
    let payloads = format!("{{lease:{ns}}}:payload");
    let parent =
        lease_core::TraceParent::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .unwrap();
    store
        .create_with(&NewRun::new(run("traced")).with_trace_parent(parent.clone()))
        .await
        .unwrap();
    for created in store
        .create_many_with(&[
            NewRun::new(run("both"))
                .with_payload(b"p".to_vec())
                .with_trace_parent(parent.clone()),
            NewRun::new(run("plain")),
        ])
        .await
        .unwrap()
    {
        created.unwrap();
    }
    let field = |id: &str| format!("t:{}", hex(id));
    let stored = |conn: &mut MultiplexedConnection, id: &str| {
        let (mut conn, payloads, field) = (conn.clone(), payloads.clone(), field(id));
        async move {
            redis::cmd("HGET")
                .arg(&payloads)
                .arg(&field)
                .query_async::<Option<String>>(&mut conn)
                .await
                .unwrap()
        }
    };
    for (id, want_flags, want) in [
        ("traced", "dnt", Some(parent.as_str())),
        ("both", "dt", Some(parent.as_str())),
        ("plain", "dn", None),
    ] {
        assert_eq!(
            flags(&record(&mut conn, &ns, id).await),
            Some(want_flags),
            "{id}"
        );
        assert_eq!(stored(&mut conn, id).await.as_deref(), want, "{id}");
    }

    // An older record: no flag 't', whatever the hash holds.
    let _: () = redis::cmd("HSET")
        .arg(&payloads)
        .arg(field("plain"))
        .arg(parent.as_str())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        store.inspect(&run("plain")).await.unwrap().trace_parent,
        None
    );
    let _: () = redis::cmd("HDEL")
        .arg(&payloads)
        .arg(field("plain"))
        .query_async(&mut conn)
        .await
        .unwrap();

    // A corrupt stored value: refused as a reply this adapter does not understand.
    let _: () = redis::cmd("HSET")
        .arg(&payloads)
        .arg(field("traced"))
        .arg("00-not-a-trace-parent")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = store.inspect(&run("traced")).await.unwrap_err();
    assert!(err.to_string().contains("not a trace parent"), "{err:?}");
    let many = store.inspect_many(&[run("traced")]).await;
    assert!(
        many.as_ref()
            .is_err_and(|err| err.to_string().contains("not a trace parent")),
        "{many:?}"
    );
    let _: () = redis::cmd("HSET")
        .arg(&payloads)
        .arg(field("traced"))
        .arg(parent.as_str())
        .query_async(&mut conn)
        .await
        .unwrap();

    // Ended and purged: the trace parents go with the runs.
    let leases = store.claim_next(&worker(), ttl(), 10).await.unwrap();
    assert_eq!(leases.len(), 3, "{leases:?}");
    for lease in &leases {
        let want = (lease.run().as_str() != "plain").then_some(&parent);
        assert_eq!(lease.trace_parent(), want, "{}", lease.run());
        store.complete(lease).await.unwrap();
    }
    let mut purged = store.purge(Duration::ZERO, 10).await.unwrap();
    purged.sort();
    assert_eq!(purged, [run("both"), run("plain"), run("traced")]);
    for id in ["traced", "both", "plain"] {
        assert_eq!(
            stored(&mut conn, id).await,
            None,
            "{id}'s trace parent purged"
        );
    }
    let left: u64 = redis::cmd("HLEN")
        .arg(&payloads)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 0, "nothing of the runs left in the payloads hash");
}
