//! Fuzzing of the URL reader, which runs before any I/O: any text, any bytes and near-valid
//! URLs give a configuration refused with a typed error ([`PgError::Config`], surfacing as
//! [`Error::Misconfigured`]) or one set of sqlx connect options per host (sqlx's own URL parser
//! included); `Display` and `Debug` never panic either.

use lease_conformance::fuzz;
use lease_core::Error;
use proptest::prelude::*;

use crate::config::PostgresConfig;
use crate::error::PgError;

const SCHEMES: &[&str] = &[
    "postgres://",
    "postgresql://",
    "POSTGRES://",
    "postgres:/",
    "postgres:",
    "redis://",
    "",
];

const PARAMETERS: &[&str] = &[
    "sync_replicas",
    "sync_timeout_ms",
    "lock_wait_ms",
    "sslmode",
    "sslrootcert",
    "statement-cache-capacity",
    "application_name",
    "options",
    "options[search_path]",
    "host",
    "port",
    "user",
    "password",
    "dbname",
    "pass",
    "PASSWORD",
    "lock_wait",
    "",
];

fn near_valid_url() -> impl Strategy<Value = String> {
    fuzz::near_valid_url(SCHEMES, PARAMETERS)
}

fn check(url: &str) -> Result<(), TestCaseError> {
    let config = PostgresConfig::from_url(url);
    let _ = (config.to_string(), format!("{config:?}"));
    match config.parse() {
        Err(e) => {
            prop_assert!(matches!(e, PgError::Config(_)), "{url:?}: {e:?}");
            let e = Error::from(e);
            prop_assert!(matches!(e, Error::Misconfigured { .. }), "{url:?}: {e:?}");
            prop_assert!(!e.is_retryable());
        }
        Ok(parsed) => {
            prop_assert!(!parsed.hosts.is_empty(), "{url:?}");
            prop_assert!(parsed.sync_timeout >= std::time::Duration::from_millis(1));
            prop_assert!(parsed.lock_wait >= std::time::Duration::from_millis(1));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(fuzz::proptest_config())]

    #[test]
    fn any_text_as_a_postgres_url_is_read_or_refused_as_misconfigured(url in any::<String>()) {
        check(&url)?;
    }

    #[test]
    fn any_bytes_as_a_postgres_url_are_read_or_refused_as_misconfigured(bytes in prop::collection::vec(any::<u8>(), 0..96)) {
        check(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn near_valid_postgres_urls_are_read_or_refused_as_misconfigured(url in near_valid_url()) {
        check(&url)?;
    }
}

/// The generator reaches accepted URLs of every shape, not only refusals.
#[test]
fn each_shape_is_read_from_its_url() {
    for url in [
        "postgres://app:s%2Fecret@127.0.0.1:5432/db?sslmode=disable&lock_wait_ms=500",
        "postgresql://app@[::1]/db",
        "postgres://app@h1:5432,h2:5433/db?sync_replicas=1",
        "postgres://app@%2Ftmp%2Fpg/db",
    ] {
        assert!(
            PostgresConfig::from_url(url).parse().is_ok(),
            "{url}: {:?}",
            PostgresConfig::from_url(url).parse().err()
        );
        check(url).unwrap();
    }
}
