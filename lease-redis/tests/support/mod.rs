//! What the Redis tests share: counting what a namespace holds, and what the server ran.
//! Each test binary that includes this uses some of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};

use redis::aio::MultiplexedConnection;

/// Every key under the namespace's hash tag with its number of entries: a field of a hash, a
/// member of a set or sorted set, an element of a list; 1 for a string.
pub(crate) async fn entries(conn: &mut MultiplexedConnection, ns: &str) -> BTreeMap<String, u64> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{lease:{ns}}}*"))
        .query_async(conn)
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(conn)
            .await
            .unwrap();
        let count = match kind.as_str() {
            "string" => None,
            "hash" => Some("HLEN"),
            "set" => Some("SCARD"),
            "zset" => Some("ZCARD"),
            "list" => Some("LLEN"),
            other => panic!("{key} is a {other}"),
        };
        let n: u64 = match count {
            None => 1,
            Some(command) => redis::cmd(command)
                .arg(&key)
                .query_async(conn)
                .await
                .unwrap(),
        };
        out.insert(key, n);
    }
    out
}

/// `cmdstat_<name>` → (calls, usec), from `INFO commandstats` (a script's commands are counted
/// too, and its usec includes theirs).
pub(crate) async fn commandstats(conn: &mut MultiplexedConnection) -> HashMap<String, (u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| -> Option<u64> {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
                    .parse()
                    .ok()
            };
            Some((name.to_owned(), (field("calls")?, field("usec")?)))
        })
        .collect()
}

/// Zeroes the server's command statistics (`CONFIG RESETSTAT`).
pub(crate) async fn reset(conn: &mut MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}
