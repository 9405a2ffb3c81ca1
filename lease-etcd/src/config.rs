//! `etcd://` URLs and the adapter's settings.

use std::fmt;
use std::time::Duration;

use lease_core::Error;

use crate::error::BACKEND;

/// The longest any single call to etcd may take before the adapter gives up on it, unless the
/// URL says otherwise (`timeout_ms`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest timeout a configuration may set: an hour.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// How long connecting may take, unless the URL says otherwise (`connect_timeout_ms`).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest etcd times one block unless the URL says otherwise (`max_lease_ms`): a longer
/// TTL or delay is timed in links of at most this (see the crate docs on leader changes).
pub const DEFAULT_MAX_LEASE: Duration = Duration::from_secs(60);

/// The key prefix when the URL names none.
pub const DEFAULT_PREFIX: &str = "lease";

/// Where and how to reach etcd.
///
/// Parsed from `etcd://[user:password@]host:port[,host:port…][/prefix][?param=value&…]`
/// (`etcds://` for TLS, with the `tls` feature). Parameters: `timeout_ms` (each call's
/// client-side bound, default 5000), `connect_timeout_ms` (default 5000), `max_lease_ms` (the
/// longest etcd times one block, whole seconds from 1 s to an hour, default 60000),
/// `wake_ups` (`true` by default; `false`: no watch, the workers poll, as
/// [`with_wake_ups`](EtcdConfig::with_wake_ups) says).
///
/// ```
/// use lease_etcd::EtcdConfig;
/// let config = EtcdConfig::from_url("etcd://app:s3cret@10.0.0.1:2379,10.0.0.2:2379/jobs?timeout_ms=2000")?;
/// assert_eq!(config.endpoints(), ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
/// assert_eq!(config.prefix(), "jobs");
/// assert!(!format!("{config:?}").contains("s3cret"));
/// # Ok::<(), lease_core::Error>(())
/// ```
#[derive(Clone)]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    prefix: String,
    user: Option<(String, String)>,
    timeout: Duration,
    connect_timeout: Duration,
    max_lease: Duration,
    tls: bool,
    wake_ups: bool,
}

impl EtcdConfig {
    /// Settings for `endpoints` (`http://host:port`), under `prefix`, with the defaults.
    ///
    /// # Errors
    /// [`Error::Misconfigured`] for no endpoint or an empty prefix.
    pub fn new(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        prefix: impl Into<String>,
    ) -> Result<EtcdConfig, Error> {
        let config = EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: prefix.into(),
            user: None,
            timeout: DEFAULT_TIMEOUT,
            max_lease: DEFAULT_MAX_LEASE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tls: false,
            wake_ups: true,
        };
        config.validate()?;
        Ok(config)
    }

    /// Parses an `etcd://` URL (see the [type docs](EtcdConfig)).
    ///
    /// # Errors
    /// [`Error::Misconfigured`] naming what is wrong; the password never appears in it.
    pub fn from_url(url: &str) -> Result<EtcdConfig, Error> {
        let bad = |why: String| Error::misconfigured(BACKEND, why);
        let (tls, rest) = if let Some(rest) = url.strip_prefix("etcd://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("etcds://") {
            (true, rest)
        } else {
            return Err(bad(format!(
                "not an etcd URL (etcd://host:port,…/prefix): {}",
                lease_core::redact_url(url)
            )));
        };
        if tls && !cfg!(feature = "tls") {
            return Err(bad(
                "etcds:// needs TLS, which this build leaves out: enable the `tls` feature of \
                 lease-etcd"
                    .into(),
            ));
        }
        // The user info ends at the last '@' before the endpoints; a '/' or '?' before it
        // would make part of the password read as the prefix or the query (or be echoed as an
        // endpoint). It must be percent-encoded, as in any URL.
        if let Some(cut) = rest.find(['/', '?']) {
            if rest[cut..].contains('@') {
                return Err(bad(
                    "a raw '/', '?' or '@' where the user info ends, or an '@' in the prefix or \
                     the parameters: percent-encode '/' as %2F, '?' as %3F and '@' as %40 in a \
                     user name, password or prefix (the URL is not shown: it may hold a password)"
                        .into(),
                ));
            }
        }
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, prefix) = match rest.split_once('/') {
            Some((authority, prefix)) => (authority, prefix),
            None => (rest, ""),
        };
        let (user, hosts) = match authority.rsplit_once('@') {
            Some((user, hosts)) => {
                let (name, password) = user.split_once(':').unwrap_or((user, ""));
                if name.is_empty() {
                    return Err(bad("the URL has a password but no user name".into()));
                }
                (
                    Some((percent_decode(name)?, percent_decode(password)?)),
                    hosts,
                )
            }
            None => (None, authority),
        };
        let scheme = if tls { "https" } else { "http" };
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let Some((name, port)) = host.rsplit_once(':') else {
                return Err(bad(format!("endpoint {host:?} has no port (host:port)")));
            };
            if name.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad(format!("endpoint {host:?} is not host:port")));
            }
            endpoints.push(format!("{scheme}://{host}"));
        }
        let prefix = if prefix.is_empty() {
            DEFAULT_PREFIX.to_string()
        } else {
            percent_decode(prefix.trim_end_matches('/'))?
        };
        let mut config = EtcdConfig {
            endpoints,
            prefix,
            user,
            timeout: DEFAULT_TIMEOUT,
            max_lease: DEFAULT_MAX_LEASE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tls,
            wake_ups: true,
        };
        for pair in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
        {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let millis = || -> Result<Duration, Error> {
                match value.parse::<u64>() {
                    Ok(ms) if (1..=3_600_000).contains(&ms) => Ok(Duration::from_millis(ms)),
                    _ => Err(bad(format!(
                        "{key}={value:?} must be a whole number of milliseconds in 1..=3600000"
                    ))),
                }
            };
            match key {
                "timeout_ms" => config.timeout = millis()?,
                "connect_timeout_ms" => config.connect_timeout = millis()?,
                "max_lease_ms" => config.max_lease = millis()?,
                "wake_ups" => {
                    config.wake_ups = match value {
                        "true" => true,
                        "false" => false,
                        _ => return Err(bad(format!("wake_ups={value:?} must be true or false"))),
                    }
                }
                other => {
                    return Err(bad(format!(
                        "unknown URL parameter {other:?} (known: timeout_ms, \
                         connect_timeout_ms, max_lease_ms, wake_ups)"
                    )))
                }
            }
        }
        config.validate()?;
        Ok(config)
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.endpoints.is_empty() {
            return Err(Error::misconfigured(BACKEND, "no etcd endpoint given"));
        }
        for (name, value) in [
            ("timeout", self.timeout),
            ("connect timeout", self.connect_timeout),
        ] {
            if value < Duration::from_millis(1) || value > MAX_TIMEOUT {
                return Err(Error::misconfigured(
                    BACKEND,
                    format!("the {name} of {value:?} is out of range: it must be 1 ms to 1 hour"),
                ));
            }
        }
        if self.max_lease < Duration::from_secs(1)
            || self.max_lease > MAX_TIMEOUT
            || self.max_lease.subsec_nanos() != 0
        {
            return Err(Error::misconfigured(
                BACKEND,
                format!(
                    "the max lease of {:?} is out of range: it must be whole seconds, 1 s to 1 hour",
                    self.max_lease
                ),
            ));
        }
        if self.prefix.is_empty() || self.prefix.contains('\0') {
            return Err(Error::misconfigured(
                BACKEND,
                "the key prefix must be non-empty and hold no NUL byte",
            ));
        }
        Ok(())
    }

    /// The same settings under another key prefix (each prefix is an independent namespace).
    /// An empty prefix, or one holding a NUL byte, is refused by
    /// [`EtcdLeaseStore::connect`](crate::EtcdLeaseStore::connect) as
    /// [`Error::Misconfigured`].
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> EtcdConfig {
        self.prefix = prefix.into();
        self
    }

    /// The same settings with each call bounded by `timeout` on the client: 1 ms to 1 hour,
    /// checked by [`EtcdLeaseStore::connect`](crate::EtcdLeaseStore::connect), which refuses
    /// anything else as [`Error::Misconfigured`].
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> EtcdConfig {
        self.timeout = timeout;
        self
    }

    /// The same settings with etcd timing one block for at most `max_lease` (whole seconds, 1 s
    /// to 1 hour, checked at connect; default [`DEFAULT_MAX_LEASE`]). A TTL or delay longer
    /// than that is timed in links of at most `max_lease`, each re-armed by the next caller
    /// that reads the run after the link expired, so a leader change (which re-arms every
    /// etcd lease to its full length) delays a run by at most one link, not its whole TTL.
    #[must_use]
    pub fn with_max_lease(mut self, max_lease: Duration) -> EtcdConfig {
        self.max_lease = max_lease;
        self
    }

    /// The longest etcd times one block.
    pub fn max_lease(&self) -> Duration {
        self.max_lease
    }

    /// The same settings, authenticating as `user`.
    #[must_use]
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// The members' client URLs.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key prefix every key of this store starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Each call's client-side bound.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How long connecting may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    pub(crate) fn user(&self) -> Option<&(String, String)> {
        self.user.as_ref()
    }

    pub(crate) fn tls(&self) -> bool {
        self.tls
    }

    /// Whether the store watches its wake keys, so that an idle
    /// [`Worker`](lease_runtime::Worker) claims when a run becomes claimable instead of at its
    /// next poll (on by default). Off: no watch; the workers poll. The writes put the wake
    /// keys either way (other stores of the prefix may be listening).
    pub fn with_wake_ups(mut self, on: bool) -> EtcdConfig {
        self.wake_ups = on;
        self
    }

    /// Whether the store watches its wake keys ([`with_wake_ups`](EtcdConfig::with_wake_ups)).
    pub fn wake_ups(&self) -> bool {
        self.wake_ups
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field(
                "password",
                &self.user.as_ref().map(|_| lease_core::REDACTED),
            )
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_lease", &self.max_lease)
            .finish()
    }
}

impl fmt::Display for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "etcd {} /{}", self.endpoints.join(","), self.prefix)
    }
}

fn percent_decode(text: &str) -> Result<String, Error> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    Error::misconfigured(BACKEND, "a bad %-escape in the URL's user or prefix")
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| Error::misconfigured(BACKEND, "the URL's user or prefix is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(url: &str) -> String {
        match EtcdConfig::from_url(url) {
            Err(e @ Error::Misconfigured { .. }) => e.to_string(),
            other => panic!("{url}: expected Misconfigured, got {other:?}"),
        }
    }

    #[test]
    fn a_url_names_endpoints_prefix_and_bounds() {
        let c = EtcdConfig::from_url("etcd://h1:1,h2:2/a%2Fb?timeout_ms=50&connect_timeout_ms=70")
            .unwrap();
        assert_eq!(c.endpoints(), ["http://h1:1", "http://h2:2"]);
        assert_eq!(c.prefix(), "a/b");
        assert_eq!(c.timeout(), Duration::from_millis(50));
        assert_eq!(c.connect_timeout(), Duration::from_millis(70));
        assert_eq!(
            EtcdConfig::from_url("etcd://h:1").unwrap().prefix(),
            "lease"
        );
    }

    #[test]
    fn max_lease_is_whole_seconds_from_one_second_to_an_hour() {
        let c = EtcdConfig::from_url("etcd://h:1?max_lease_ms=2000").unwrap();
        assert_eq!(c.max_lease(), Duration::from_secs(2));
        assert_eq!(
            EtcdConfig::from_url("etcd://h:1").unwrap().max_lease(),
            DEFAULT_MAX_LEASE
        );
        for bad in [
            "max_lease_ms=1500",
            "max_lease_ms=500",
            "max_lease_ms=0",
            "max_lease_ms=x",
        ] {
            let refused = EtcdConfig::from_url(&format!("etcd://h:1?{bad}"));
            assert!(
                matches!(&refused, Err(Error::Misconfigured { detail, .. }) if detail.to_string().contains("max")),
                "{bad}: {refused:?}"
            );
        }
        let too_long = EtcdConfig::new(["http://h:1"], "p")
            .unwrap()
            .with_max_lease(Duration::from_secs(7200));
        assert!(too_long.validate().is_err());
    }

    /// A password holding a raw '/' or '?' is refused with a message that holds no part of it,
    /// instead of reading its tail as the prefix (shown by `Display`, `Debug` and spans) or
    /// echoing its head as an endpoint.
    #[test]
    fn a_raw_slash_or_question_mark_in_the_password_is_refused_without_showing_it() {
        for url in [
            "etcd://app:hun/ter2@h:2379/jobs",
            "etcd://app:hun?ter2@h:2379/jobs",
            "etcd://app:123/456@h:2379",
            "etcd://app:hun?ter2@h1:1,h2:2",
            "etcd://h:1/jobs?timeout_ms=5@x",
        ] {
            let shown = refusal(url);
            assert!(shown.contains("percent-encode"), "{url}: {shown}");
            for secret in ["hun", "ter2", "123", "456"] {
                assert!(!shown.contains(secret), "{url}: {shown}");
            }
        }
        let c = EtcdConfig::from_url("etcd://app:hun%2Fter%3F2@h:2379/jobs").unwrap();
        assert_eq!(c.prefix(), "jobs");
        assert_eq!(c.user().map(|(_, p)| p.as_str()), Some("hun/ter?2"));
        assert!(!format!("{c:?} {c}").contains("hun"));
    }

    /// A timeout no clock arithmetic can hold (`Duration::MAX`) or under a millisecond is
    /// refused as a configuration error, not a panic at connect.
    #[tokio::test]
    async fn out_of_range_timeouts_are_refused_at_connect() {
        for timeout in [Duration::MAX, Duration::ZERO, Duration::from_secs(7200)] {
            let config = EtcdConfig::from_url("etcd://127.0.0.1:1")
                .unwrap()
                .with_timeout(timeout);
            match crate::EtcdLeaseStore::connect(config).await {
                Err(e @ Error::Misconfigured { .. }) => {
                    assert!(e.to_string().contains("timeout"), "{e}")
                }
                other => panic!("{timeout:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn bad_urls_are_refused_by_name_and_never_show_the_password() {
        assert!(refusal("redis://h:1").contains("not an etcd URL"));
        assert!(refusal("etcd://h").contains("no port"));
        assert!(refusal("etcd://h:0").contains("not host:port"));
        assert!(refusal("etcd://h:1?bogus=1").contains("unknown URL parameter \"bogus\""));
        assert!(refusal("etcd://h:1?timeout_ms=0").contains("timeout_ms"));
        let shown = refusal("etcd://u:hunter2@h:1?nope=1");
        assert!(!shown.contains("hunter2"), "{shown}");
        let shown = refusal("etcdx://u:hunter2@h:1");
        assert!(!shown.contains("hunter2"), "{shown}");
        let c = EtcdConfig::from_url("etcd://u:hunter2@h:1").unwrap();
        assert!(!format!("{c:?} {c}").contains("hunter2"));
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn a_tls_url_without_the_tls_feature_names_it() {
        assert!(refusal("etcds://h:1").contains("`tls` feature"));
    }
}
