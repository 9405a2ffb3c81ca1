//! Fuzzing of the URL reader, which runs before any I/O: any text, any bytes and near-valid
//! URLs give a configuration refused with a typed error ([`RedisError::Config`], surfacing as
//! [`Error::Misconfigured`]) or a topology that redis-rs's own URL parser then reads without
//! panicking; `Display` and `Debug` never panic either.

use lease_conformance::fuzz;
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

fn near_valid_url() -> impl Strategy<Value = String> {
    fuzz::near_valid_url(SCHEMES, PARAMETERS)
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
    #![proptest_config(fuzz::proptest_config())]

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
