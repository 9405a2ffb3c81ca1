//! How to reach Redis: URL, namespace, durability opt-out, timeouts.

use std::fmt;
use std::time::Duration;

use crate::error::RedisError;

/// Where and how a [`RedisLeaseStore`](crate::RedisLeaseStore) connects.
///
/// Built from a URL (`redis://[user:password@]host[:port][/db][?volatile=true]`, or `rediss://`
/// for TLS with rustls), then adjusted with the `with_*` methods. `Debug` and `Display` print
/// the password as `******`.
///
/// ```
/// use lease_redis::RedisConfig;
/// let config = RedisConfig::from_url("redis://:hunter2@localhost:6379/0").with_namespace("billing");
/// assert!(!format!("{config:?}").contains("hunter2"));
/// assert_eq!(config.namespace(), "billing");
/// ```
#[derive(Clone)]
pub struct RedisConfig {
    /// The URL without our own query parameters (`volatile`), handed to redis-rs.
    url: String,
    namespace: String,
    volatile: bool,
    /// A query parameter we could not read, reported at connect.
    problem: Option<String>,
    response_timeout: Duration,
    connect_timeout: Duration,
}

impl RedisConfig {
    /// The namespace used unless [`with_namespace`](RedisConfig::with_namespace) says otherwise.
    pub const DEFAULT_NAMESPACE: &'static str = "default";
    /// How long a command may wait for its reply unless configured otherwise.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
    /// How long a connection attempt may take unless configured otherwise.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

    /// A configuration for `url`. The query parameter `volatile=true` opts in to servers that
    /// do not persist writes (see [`with_volatile`](RedisConfig::with_volatile)); other
    /// parameters are passed to redis-rs. The URL is checked at connect.
    pub fn from_url(url: impl AsRef<str>) -> RedisConfig {
        let url = url.as_ref();
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, Some(query)),
            None => (url, None),
        };
        let mut volatile = false;
        let mut problem = None;
        let mut kept = Vec::new();
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            match pair.split_once('=').unwrap_or((pair, "")) {
                ("volatile", "true" | "1" | "yes") => volatile = true,
                ("volatile", "false" | "0" | "no") => volatile = false,
                ("volatile", other) => {
                    problem = Some(format!(
                        "volatile={other:?} in the URL: expected true or false"
                    ))
                }
                _ if pair.is_empty() => {}
                _ => kept.push(pair),
            }
        }
        let url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        RedisConfig {
            url,
            namespace: Self::DEFAULT_NAMESPACE.to_owned(),
            volatile,
            problem,
            response_timeout: Self::DEFAULT_RESPONSE_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// Uses `namespace` (1 to 64 ASCII letters, digits, `_`, `-`, `.`; checked at connect) as
    /// the key prefix, so tenants sharing a server never see each other's runs.
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> RedisConfig {
        self.namespace = namespace.into();
        self
    }

    /// Accepts (`true`) or refuses (`false`, the default) a server that does not persist
    /// writes. On such a server a restart resets every fence, so a new claim can reissue a
    /// fence that an old holder still carries.
    pub fn with_volatile(mut self, volatile: bool) -> RedisConfig {
        self.volatile = volatile;
        self
    }

    /// How long a command waits for its reply before failing with a retryable error.
    pub fn with_response_timeout(mut self, timeout: Duration) -> RedisConfig {
        self.response_timeout = timeout;
        self
    }

    /// How long a connection attempt may take before failing with a retryable error.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> RedisConfig {
        self.connect_timeout = timeout;
        self
    }

    /// The namespace (key prefix).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Whether a non-persistent server is accepted.
    pub fn is_volatile(&self) -> bool {
        self.volatile
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    pub(crate) fn check(&self) -> Result<(), RedisError> {
        match &self.problem {
            Some(problem) => Err(RedisError::Config(problem.clone())),
            None => crate::keys::check_namespace(&self.namespace),
        }
    }

    /// The URL with any password replaced by `******`.
    pub(crate) fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }
}

/// `url` with the password of its user info (`user:password@`) replaced by `******`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Not a URL we understand: show nothing of it rather than risk a secret.
        return "<unparsable url>".to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or("", |(user, _)| user);
            format!("{scheme}://{user}:******@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url())
            .field("namespace", &self.namespace)
            .field("volatile", &self.volatile)
            .field("response_timeout", &self.response_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl fmt::Display for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (namespace {})", self.redacted_url(), self.namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_hide_the_password() {
        for url in [
            "redis://:s3cr%40t@localhost:6379/0",
            "redis://user:s3cr%40t@localhost:6379",
            "rediss://s3cr%40t@host?volatile=true",
        ] {
            let config = RedisConfig::from_url(url);
            for shown in [format!("{config:?}"), config.to_string()] {
                assert!(!shown.contains("s3cr"), "{shown}");
                assert!(shown.contains("******"), "{shown}");
            }
        }
    }

    #[test]
    fn volatile_is_read_from_the_url_and_removed() {
        let config = RedisConfig::from_url("redis://h:1/2?volatile=true&protocol=resp3");
        assert!(config.is_volatile());
        assert_eq!(config.url(), "redis://h:1/2?protocol=resp3");
        assert!(!RedisConfig::from_url("redis://h").is_volatile());
        assert!(RedisConfig::from_url("redis://h?volatile=perhaps")
            .check()
            .is_err());
        assert!(RedisConfig::from_url("redis://h")
            .with_namespace("a{b")
            .check()
            .is_err());
    }
}
