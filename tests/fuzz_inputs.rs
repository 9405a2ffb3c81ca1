//! Inputs that cross the library's boundary, fuzzed with proptest: the TOML configuration, the
//! environment overlay, store URLs as the facade checks them before connecting, namespaces, and
//! run and worker ids. Each input gives a typed error or a valid value, never a panic, and a
//! valid value holds what the input said.
//!
//! The case counts are small enough for the whole file to run in seconds in `cargo test`
//! (`bash scripts/test.sh`); raise them with `PROPTEST_CASES=100000` for a longer run.

use std::time::Duration;

use distribution::{check_namespace, Backend, Config, ConfigError, InvalidInput, RunId, WorkerId};
use lease_conformance::fuzz;
use proptest::prelude::*;

/// The identifier rule of the contract (`lease_core::RunId`), written independently of `lease-core`'s check.
fn valid_id(id: &str) -> bool {
    (1..=255).contains(&id.len()) && !id.chars().any(char::is_control)
}

fn check_id(id: &str) -> Result<(), TestCaseError> {
    for result in [
        RunId::new(id).map(|r| r.as_str().to_owned()),
        WorkerId::new(id).map(|w| w.as_str().to_owned()),
    ] {
        match result {
            Ok(kept) => {
                prop_assert!(valid_id(id), "accepted {id:?}");
                prop_assert_eq!(kept, id);
            }
            Err(e) => {
                prop_assert!(!valid_id(id), "refused {id:?}: {e}");
                prop_assert!(
                    matches!(
                        e,
                        InvalidInput::EmptyId { .. }
                            | InvalidInput::IdTooLong { .. }
                            | InvalidInput::ControlCharacter { .. }
                    ),
                    "{e:?}"
                );
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
    Ok(())
}

/// Ids near the limits: around 255 bytes, multi-byte characters across the boundary, control
/// characters anywhere.
fn near_valid_id() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "a", "é", "€", "😀", "\u{0}", "\n", "\u{7f}", "\u{85}", "\u{200b}", " ", "-", "{", "}", ":",
    ]);
    (prop::collection::vec(piece, 0..140), 0usize..260).prop_map(|(pieces, pad)| {
        let mut id = "x".repeat(pad);
        for p in pieces {
            id.push_str(p);
        }
        id
    })
}

/// The one namespace rule of every backend, written independently of the facade's check.
fn valid_namespace(ns: &str) -> bool {
    (1..=63).contains(&ns.len())
        && ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

fn check_config_error(e: &ConfigError) -> Result<(), TestCaseError> {
    prop_assert!(
        matches!(
            e,
            ConfigError::File { .. }
                | ConfigError::BadSetting { .. }
                | ConfigError::MalformedUrl { .. }
                | ConfigError::UnknownScheme { .. }
                | ConfigError::NoStore
        ),
        "a configuration error is decided without connecting: {e:?}"
    );
    prop_assert!(!e.to_string().is_empty());
    Ok(())
}

/// A parsed configuration can be shown and its backend decided, without a panic.
fn check_config(config: &Config) -> Result<(), TestCaseError> {
    let _ = (format!("{config}"), format!("{config:?}"));
    if let Err(e) = config.backend() {
        check_config_error(&e)?;
    }
    Ok(())
}

/// A TOML value of any kind, valid or not for the key it is given to.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        Just("18446744073709551616".to_owned()),
        Just("4294967296".to_owned()),
        Just("0".to_owned()),
        Just("1".to_owned()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        any::<bool>().prop_map(|b| b.to_string()),
        any::<String>().prop_map(|s| format!("{s:?}")),
        url().prop_map(|s| format!("'{}'", s.replace('\'', ""))),
        Just("[1, 2]".to_owned()),
        Just("{ a = 1 }".to_owned()),
        Just("1979-05-27T07:32:00Z".to_owned()),
        ".{0,8}",
    ]
}

/// A TOML document of known and unknown keys with values of every kind.
fn toml_document() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "store",
        "ttl_ms",
        "heartbeat_ms",
        "namespace",
        "replicas",
        "replica_timeout_ms",
        "sync_replicas",
        "max_connections",
        "ttl",
        "Store",
        "\"store\"",
        "password",
        "[section]\nstore",
    ]);
    prop::collection::vec((key, toml_value()), 0..6).prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect()
    })
}

/// Schemes of every backend, and near misses.
const SCHEMES: &[&str] = &[
    "memory:",
    "memory",
    "memory://",
    "postgres://",
    "postgresql://",
    "redis://",
    "rediss://",
    "redis+cluster://",
    "rediss+cluster://",
    "redis+sentinel://",
    "rediss+sentinel://",
    "redis+unix://",
    "unix://",
    "mysql://",
    "REDIS://",
    "redis:/",
    "",
];

/// Parameters of both adapters, and near misses.
const PARAMETERS: &[&str] = &[
    "volatile",
    "replicas",
    "replica_timeout_ms",
    "protocol",
    "sync_replicas",
    "sync_timeout_ms",
    "lock_wait_ms",
    "sslmode",
    "password",
    "pass",
    "db",
    "options[a]",
    "volatle",
    "",
];

/// Store URLs near the valid ones, for every backend.
fn url() -> impl Strategy<Value = String> {
    fuzz::near_valid_url(SCHEMES, PARAMETERS)
}

fn check_store(store: &str) -> Result<(), TestCaseError> {
    let config = Config::default().with_store(store);
    check_config(&config)?;
    if let Ok(backend) = config.backend() {
        // Schemes are case-insensitive (RFC 3986 3.1).
        let scheme = store
            .split(':')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let expected = match backend {
            Backend::Memory => "memory",
            Backend::Postgres => "postgres",
            Backend::Redis => "redis",
            other => return Err(TestCaseError::fail(format!("{store:?}: {other:?}"))),
        };
        prop_assert!(
            scheme.starts_with(expected),
            "{store:?} selected {backend:?}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(fuzz::proptest_config())]

    #[test]
    fn any_text_as_an_id_is_refused_by_its_rule_or_kept(id in any::<String>()) {
        check_id(&id)?;
    }

    #[test]
    fn ids_near_the_limits_are_refused_by_their_rule_or_kept(id in near_valid_id()) {
        check_id(&id)?;
    }

    #[test]
    fn any_text_as_a_namespace_follows_the_one_rule(ns in prop_oneof![any::<String>(), "[a-zA-Z0-9_.{}: -]{0,70}"]) {
        let checked = check_namespace(&ns);
        prop_assert_eq!(checked.is_ok(), valid_namespace(&ns), "{:?}", ns);
        if let Err(e) = checked {
            prop_assert!(
                matches!(e, ConfigError::BadSetting { ref key, .. } if key == "namespace"),
                "{:?}",
                e
            );
        }
        let config = Config::default().with_store("memory:").with_namespace(ns.clone());
        prop_assert_eq!(config.backend().is_ok(), valid_namespace(&ns));
    }

    #[test]
    fn any_text_as_toml_gives_a_config_or_a_typed_error(text in any::<String>()) {
        match Config::from_toml(&text) {
            Ok(config) => check_config(&config)?,
            Err(e) => check_config_error(&e)?,
        }
    }

    #[test]
    fn any_bytes_as_toml_give_a_config_or_a_typed_error(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        match Config::from_toml(&String::from_utf8_lossy(&bytes)) {
            Ok(config) => check_config(&config)?,
            Err(e) => check_config_error(&e)?,
        }
    }

    /// Known and unknown keys with values of every kind: unknown keys and bad values are
    /// refused; accepted numbers are the ones written.
    #[test]
    fn toml_documents_near_the_valid_ones_give_a_config_or_a_typed_error(text in toml_document()) {
        match Config::from_toml(&text) {
            Ok(config) => {
                check_config(&config)?;
                for line in text.lines() {
                    if let Some(ms) = line.strip_prefix("ttl_ms = ").and_then(|v| v.parse::<u64>().ok()) {
                        // The last ttl_ms wins only if TOML allowed a repeat; it does not.
                        prop_assert_eq!(config.ttl.as_millis(), ms, "{}", text);
                    }
                    if let Some(ms) = line.strip_prefix("heartbeat_ms = ").and_then(|v| v.parse::<u64>().ok()) {
                        prop_assert_eq!(config.heartbeat, Some(Duration::from_millis(ms)));
                    }
                }
            }
            Err(e) => check_config_error(&e)?,
        }
    }

    /// The environment overlay: any value of any variable is kept or refused naming it.
    #[test]
    fn any_environment_value_gives_a_config_or_names_the_variable(
        key in prop::sample::select(vec![
            "LEASE_STORE", "LEASE_TTL_MS", "LEASE_HEARTBEAT_MS", "LEASE_NAMESPACE",
            "LEASE_REPLICAS", "LEASE_REPLICA_TIMEOUT_MS", "LEASE_SYNC_REPLICAS",
            "LEASE_MAX_CONNECTIONS",
        ]),
        value in prop_oneof![any::<String>(), any::<u64>().prop_map(|n| n.to_string()), Just(" 5 ".to_owned()), Just("18446744073709551616".to_owned())],
    ) {
        let var = |k: &str| (k == key).then(|| value.clone());
        match Config::default().with_vars(var) {
            Ok(config) => check_config(&config)?,
            Err(e) => {
                prop_assert!(matches!(e, ConfigError::BadSetting { key: ref named, .. } if named == key), "{e:?}");
            }
        }
    }

    #[test]
    fn any_text_as_a_store_url_selects_a_backend_or_gives_a_typed_error(store in any::<String>()) {
        check_store(&store)?;
    }

    #[test]
    fn store_urls_near_the_valid_ones_select_a_backend_or_give_a_typed_error(store in url()) {
        check_store(&store)?;
    }
}
