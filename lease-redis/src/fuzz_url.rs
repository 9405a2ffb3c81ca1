//! Fuzzing of the URL reader, which runs before any I/O: any text, any bytes and near-valid
//! URLs give a configuration refused with a typed error ([`RedisError::Config`], surfacing as
//! [`Error::Misconfigured`]) or a topology that redis-rs's own URL parser then reads without
//! panicking; `Display` and `Debug` never panic either.

use lease_core::Error;
use proptest::prelude::*;
use redis::IntoConnectionInfo;

use crate::config::{RedisConfig, Topology};
use crate::error::RedisError;

const SCHEMES: &[&str] = &[
    "redis://",
    "rediss://",
    "redis+unix://",
    "unix://",
    "redis+cluster://",
    "rediss+cluster://",
    "redis+sentinel://",
    "rediss+sentinel://",
    "postgres://",
    "REDIS://",
    "redis:/",
    "redis+cluster:",
    "",
];

const PARAMETERS: &[&str] = &[
    "volatile",
    "replicas",
    "replica_timeout_ms",
    "protocol",
    "db",
    "user",
    "pass",
    "password",
    "PASSWORD",
    "volatle",
    "",
];

/// Store URLs near the valid ones: a scheme (or a near miss), user info with stray characters,
/// one or several hosts with ports, a path, parameters known and unknown, and a tail.
fn near_valid_url() -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(SCHEMES.to_vec());
    let userinfo = prop_oneof![
        Just(String::new()),
        "[a-z]{1,5}@",
        "[a-z]{0,5}:[^@]{0,8}@",
        "[a-z]{0,3}:[a-z/#?%@:]{0,6}@",
        ".{0,6}@",
    ];
    let host = prop_oneof![
        Just("127.0.0.1".to_owned()),
        Just("[::1]".to_owned()),
        Just("[::1".to_owned()),
        Just("::1".to_owned()),
        Just("/tmp/s.sock".to_owned()),
        Just(String::new()),
        "[a-z]{1,8}",
        ".{0,6}",
    ];
    let port = prop_oneof![
        Just(String::new()),
        (0u32..70_000).prop_map(|p| format!(":{p}")),
        Just(":".to_owned()),
        Just(":99999999999999999999".to_owned()),
        ":[a-z]{1,3}",
    ];
    let hosts = prop::collection::vec((host, port), 1..4).prop_map(|hosts| {
        hosts
            .into_iter()
            .map(|(h, p)| format!("{h}{p}"))
            .collect::<Vec<_>>()
            .join(",")
    });
    let path = prop_oneof![
        Just(String::new()),
        Just("/".to_owned()),
        "/[a-z0-9]{0,6}",
        "/-?[0-9]{1,25}",
        "/.{0,6}",
        "/[a-z]{1,4}/[0-9a-z]{0,3}(/x)?",
    ];
    let key = prop::sample::select(PARAMETERS.to_vec());
    let value = prop_oneof![
        Just(String::new()),
        Just("true".to_owned()),
        Just("resp3".to_owned()),
        Just("require".to_owned()),
        Just("18446744073709551616".to_owned()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        ".{0,6}",
    ];
    let query = prop::collection::vec((key, value, prop::bool::ANY), 0..4).prop_map(|pairs| {
        if pairs.is_empty() {
            return String::new();
        }
        let pairs: Vec<String> = pairs
            .into_iter()
            .map(|(k, v, eq)| if eq { format!("{k}={v}") } else { k.to_owned() })
            .collect();
        format!("?{}", pairs.join("&"))
    });
    (scheme, userinfo, hosts, path, query, ".{0,2}").prop_map(
        |(scheme, userinfo, hosts, path, query, tail)| {
            format!("{scheme}{userinfo}{hosts}{path}{query}{tail}")
        },
    )
}

/// Cases per property: 1,000, or `PROPTEST_CASES`.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    ProptestConfig {
        cases,
        // A failure prints its minimal input; nothing is written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn check(url: &str) -> Result<(), TestCaseError> {
    let config = RedisConfig::from_url(url);
    let _ = (config.to_string(), format!("{config:?}"));
    match config.check() {
        Err(e) => {
            prop_assert!(matches!(e, RedisError::Config(_)), "{url:?}: {e:?}");
            let e = Error::from(e);
            prop_assert!(matches!(e, Error::Misconfigured { .. }), "{url:?}: {e:?}");
            prop_assert!(!e.is_retryable());
        }
        // What the adapter hands the driver, the driver reads (or refuses) without a panic.
        Ok(()) => match config.topology() {
            Ok(Topology::Single { url }) => {
                let _ = redis::Client::open(url.as_str());
            }
            Ok(Topology::Cluster { nodes, .. }) => {
                prop_assert!(!nodes.is_empty());
                for node in nodes {
                    let _ = node.as_str().into_connection_info();
                }
            }
            Ok(Topology::Sentinel { sentinels, .. }) => prop_assert!(!sentinels.is_empty()),
            Err(e) => prop_assert!(false, "check passed, topology failed: {e:?}"),
        },
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_text_as_a_redis_url_is_read_or_refused_as_misconfigured(url in any::<String>()) {
        check(&url)?;
    }

    #[test]
    fn any_bytes_as_a_redis_url_are_read_or_refused_as_misconfigured(bytes in prop::collection::vec(any::<u8>(), 0..96)) {
        check(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn near_valid_redis_urls_are_read_or_refused_as_misconfigured(url in near_valid_url()) {
        check(&url)?;
    }
}

/// The generator reaches accepted URLs of every shape, not only refusals.
#[test]
fn each_topology_is_read_from_its_url() {
    for url in [
        "redis://127.0.0.1:6379/0?protocol=resp3&replicas=1",
        "rediss://app:s%2Fecret@[::1]:6380",
        "redis+unix:///tmp/s.sock",
        "redis+cluster://a:7000,b:7001?volatile=true",
        "redis+sentinel://a:26379,b/mymaster/2",
    ] {
        let config = RedisConfig::from_url(url);
        assert!(config.check().is_ok(), "{url}: {:?}", config.check());
        check(url).unwrap();
    }
}
