//! How to reach Postgres: URL, schema, pool size and timeouts.

use std::fmt;
use std::time::Duration;

use crate::error::redact;

/// The schema a store uses unless told otherwise.
pub const DEFAULT_SCHEMA: &str = "lease";

/// Connection settings for a [`PostgresLeaseStore`](crate::PostgresLeaseStore).
///
/// `Debug` and `Display` print the URL with its password replaced by `******`.
///
/// ```
/// use std::time::Duration;
/// use lease_postgres::PostgresConfig;
/// let config = PostgresConfig::from_url("postgres://app:s3cret@db.internal/engine")
///     .with_schema("tenant_a")
///     .with_max_connections(16)
///     .with_acquire_timeout(Duration::from_secs(2));
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
#[derive(Clone)]
pub struct PostgresConfig {
    pub(crate) url: String,
    pub(crate) schema: String,
    pub(crate) max_connections: u32,
    pub(crate) acquire_timeout: Duration,
    pub(crate) migrate: bool,
}

impl PostgresConfig {
    /// Settings for the database at `url` (`postgres://user:password@host:port/db?...`), with
    /// schema [`DEFAULT_SCHEMA`], 10 connections, a 5 s acquire timeout and migrations on.
    /// The URL is parsed when connecting.
    pub fn from_url(url: impl Into<String>) -> PostgresConfig {
        PostgresConfig {
            url: url.into(),
            schema: DEFAULT_SCHEMA.to_owned(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            migrate: true,
        }
    }

    /// Keeps the store's tables in `schema` (created if missing), so several tenants or test
    /// cases share a database without seeing each other. 1 to 63 bytes; any characters.
    pub fn with_schema(mut self, schema: impl Into<String>) -> PostgresConfig {
        self.schema = schema.into();
        self
    }

    /// The most connections the store's pool opens (at least 1).
    pub fn with_max_connections(mut self, max: u32) -> PostgresConfig {
        self.max_connections = max.max(1);
        self
    }

    /// How long an operation waits for a pooled connection (or for a new connection to be
    /// made) before failing with a retryable [`Error::Unavailable`](lease_core::Error::Unavailable).
    pub fn with_acquire_timeout(mut self, timeout: Duration) -> PostgresConfig {
        self.acquire_timeout = timeout;
        self
    }

    /// Whether connecting runs the embedded migrations (default `true`). Turn off when the
    /// schema is managed elsewhere.
    pub fn with_migrations(mut self, migrate: bool) -> PostgresConfig {
        self.migrate = migrate;
        self
    }

    /// The schema the store uses.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The URL with its password replaced by `******`.
    pub fn redacted_url(&self) -> String {
        redact(&self.url)
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &self.redacted_url())
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("migrate", &self.migrate)
            .finish()
    }
}

impl fmt::Display for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (schema {})", self.redacted_url(), self.schema)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_hide_the_password() {
        let config = PostgresConfig::from_url("postgres://app:hunter2@localhost:5432/db");
        for shown in [format!("{config:?}"), config.to_string()] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("app:******@localhost"), "{shown}");
        }
    }
}
