//! What the Redis tests share: counting what a namespace holds.

use std::collections::BTreeMap;

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
