//! The one URL redactor of the workspace: every store URL that reaches a `Debug`, a `Display`,
//! an error or a log line goes through [`redact_url`] first.
//!
//! The `url` crate reads one host and one strict syntax; the adapters also accept host lists
//! (`redis+cluster://u:p@h1:1,h2:2`, `postgres://u:p@h1:5432,h2:5432/db`) and people write
//! passwords with a raw `/`, `?` or `#` in them, which the `url` crate (and so both drivers)
//! would read as the start of a path, query or fragment. So the redactor finds the parts
//! itself, reads each query key with the `url` crate's form decoding (as both drivers do, so
//! `?pa%73sword=` is recognised), and where a URL can be read two ways it masks what is secret
//! under either reading.

use url::form_urlencoded;

/// What a secret is replaced with.
pub const REDACTED: &str = "******";

/// What [`redact_url`] prints for an input it cannot read as a URL: none of it is shown, since
/// nothing says where a secret would be.
pub const UNPARSEABLE_URL: &str = "<unparseable URL, not shown>";

/// A query key holding one of these words (in any case) has its value masked.
const SECRET_WORDS: [&str; 4] = ["pass", "secret", "token", "key"];

/// `url` with every secret replaced by [`REDACTED`]: the password of the user info, a user
/// info without a password (`redis://TOKEN@host`; except on `postgres://`, where it is a role
/// name), the value of every query parameter whose key contains `pass`, `secret`, `token` or
/// `key` in any case, and any fragment. An input that is not a URL gives [`UNPARSEABLE_URL`].
///
/// Host lists (Redis Cluster and Sentinel, Postgres) and socket URLs (`redis+unix:///path`,
/// `unix:///path`) are read too. When a raw `/`, `?` or `#` comes before an `@`, the URL can be
/// read as the drivers read it (the user info ends at the first of those) or as a password
/// holding them (the user info ends at the last `@`); whatever is secret under either reading
/// is masked.
///
/// # Examples
///
/// ```
/// use lease_core::redact_url;
/// assert_eq!(redact_url("redis://:hun%2Fter2@h:6379/0"), "redis://:******@h:6379/0");
/// assert_eq!(redact_url("redis://:hun/ter2@h:6379"), "redis://:******@h:6379");
/// assert_eq!(
///     redact_url("postgres://app@db/x?sslmode=disable&PASSWORD=hunter2"),
///     "postgres://app@db/x?sslmode=disable&PASSWORD=******"
/// );
/// assert_eq!(
///     redact_url("redis+sentinel://u:hunter2@s1:26379,s2:26379/orders"),
///     "redis+sentinel://u:******@s1:26379,s2:26379/orders"
/// );
/// assert_eq!(redact_url("redis+unix:///tmp/r.sock?pass=hunter2"), "redis+unix:///tmp/r.sock?pass=******");
/// assert_eq!(redact_url("memory:"), "memory:");
/// assert_eq!(redact_url("not a url :hunter2@"), lease_core::UNPARSEABLE_URL);
/// ```
pub fn redact_url(url: &str) -> String {
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return UNPARSEABLE_URL.to_owned();
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return opaque(url);
    };
    if !is_scheme(scheme) {
        return UNPARSEABLE_URL.to_owned();
    }
    // A Postgres user name is a role; elsewhere a lone user info is a password or token.
    let name_is_secret = !matches!(scheme, "postgres" | "postgresql");
    let mut secret = vec![false; rest.len()];
    // As the drivers read it: the authority ends at the first '/', '?' or '#'.
    let end = authority_end(rest, 0);
    if let Some(at) = rest[..end].rfind('@') {
        mark_userinfo(&mut secret, rest, at, name_is_secret);
    }
    mark_query_and_fragment(&mut secret, rest, end);
    // As a password with a raw '/', '?' or '#' would mean it: the user info ends at the last
    // '@'. (A user info never starts with '/': `redis+unix:///a@b.sock` has none.)
    if let Some(at) = rest
        .rfind('@')
        .filter(|&at| at > end && !rest.starts_with('/'))
    {
        mark_userinfo(&mut secret, rest, at, name_is_secret);
        mark_query_and_fragment(&mut secret, rest, authority_end(rest, at + 1));
    }
    format!("{scheme}://{}", render(rest, &secret))
}

/// A URL without `//`: only a bare scheme (`memory:`) is shown.
fn opaque(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(parsed)
            if parsed.cannot_be_a_base()
                && parsed.path().is_empty()
                && parsed.query().is_none()
                && parsed.fragment().is_none() =>
        {
            parsed.to_string()
        }
        _ => UNPARSEABLE_URL.to_owned(),
    }
}

/// RFC 3986: a letter, then letters, digits, `+`, `-`, `.`.
fn is_scheme(scheme: &str) -> bool {
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Where the authority starting at `from` ends: the first `/`, `?` or `#`, or the end.
fn authority_end(rest: &str, from: usize) -> usize {
    rest[from..]
        .find(['/', '?', '#'])
        .map_or(rest.len(), |i| from + i)
}

/// Marks the secret part of the user info `rest[..at]`.
fn mark_userinfo(secret: &mut [bool], rest: &str, at: usize, name_is_secret: bool) {
    let userinfo = &rest[..at];
    match userinfo.find(':') {
        Some(colon) => mark(secret, colon + 1, at),
        None if name_is_secret => mark(secret, 0, at),
        None => {}
    }
}

/// Marks the values of secret-looking query parameters after `from`, and the whole fragment
/// (no driver reads one; a `#` in a password or value would put the rest of it there).
fn mark_query_and_fragment(secret: &mut [bool], rest: &str, from: usize) {
    let fragment = rest[from..].find('#').map(|i| from + i);
    let query_end = fragment.unwrap_or(rest.len());
    if let Some(question) = rest[from..query_end].find('?') {
        let mut start = from + question + 1;
        for pair in rest[start..query_end].split('&') {
            if let Some(eq) = pair.find('=') {
                let key: String = form_urlencoded::parse(&pair.as_bytes()[..eq])
                    .map(|(k, v)| format!("{k}{v}"))
                    .collect();
                if looks_secret(&key) {
                    mark(secret, start + eq + 1, start + pair.len());
                }
            }
            start += pair.len() + 1;
        }
    }
    if let Some(hash) = fragment {
        mark(secret, hash + 1, rest.len());
    }
}

fn looks_secret(key: &str) -> bool {
    let key = key.to_lowercase();
    SECRET_WORDS.iter().any(|word| key.contains(word))
}

fn mark(secret: &mut [bool], from: usize, to: usize) {
    secret[from..to].iter_mut().for_each(|s| *s = true);
}

/// `rest` with each run of secret bytes replaced by one [`REDACTED`]. Runs start and end at
/// ASCII delimiters, so they fall on character boundaries.
fn render(rest: &str, secret: &[bool]) -> String {
    let mut out = String::with_capacity(rest.len());
    let mut in_secret = false;
    for (i, c) in rest.char_indices() {
        if secret[i] {
            if !in_secret {
                out.push_str(REDACTED);
            }
            in_secret = true;
        } else {
            out.push(c);
            in_secret = false;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_conformance::fuzz::secret;
    use proptest::prelude::*;

    #[test]
    fn the_urls_of_issue_14() {
        for (url, shown) in [
            (
                "redis+unix:///tmp/r.sock?pass=hunter2",
                "redis+unix:///tmp/r.sock?pass=******",
            ),
            ("redis://:hun/ter2@h:6379", "redis://:******@h:6379"),
            ("redis://:hun#ter2@h:6379", "redis://:******"),
            ("redis://:hun?ter2@h:6379", "redis://:******@h:6379"),
            (
                "postgres://app@db/x?password=hunter2",
                "postgres://app@db/x?password=******",
            ),
            ("postgres://app:hun/ter2@db/x", "postgres://app:******@db/x"),
            (
                "postgres://app@db/x?PASSWORD=hunter2",
                "postgres://app@db/x?PASSWORD=******",
            ),
            (
                "redis://h:6379?api_token=hunter2&replicas=1",
                "redis://h:6379?api_token=******&replicas=1",
            ),
            (
                "postgres://app@db/x?secret_key=hunter2",
                "postgres://app@db/x?secret_key=******",
            ),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn every_shape_the_adapters_accept() {
        for (url, shown) in [
            ("redis://h:6379/0", "redis://h:6379/0"),
            ("redis://:pw@h", "redis://:******@h"),
            ("redis://user:pw@h", "redis://user:******@h"),
            (
                "rediss://tok%40en@h?volatile=true",
                "rediss://******@h?volatile=true",
            ),
            ("redis://user:@h", "redis://user:@h"),
            (
                "redis+cluster://u:p@h1:1,h2:2?replicas=1",
                "redis+cluster://u:******@h1:1,h2:2?replicas=1",
            ),
            (
                "rediss+cluster://:p@[::1]:1,h2:2",
                "rediss+cluster://:******@[::1]:1,h2:2",
            ),
            (
                "redis+sentinel://u:p@s1:1,s2:2/SERVICE/3",
                "redis+sentinel://u:******@s1:1,s2:2/SERVICE/3",
            ),
            (
                "rediss+sentinel://:p@s1:1/SERVICE",
                "rediss+sentinel://:******@s1:1/SERVICE",
            ),
            (
                "postgres://u:p@h1:5432,h2:5432/db?sync_replicas=1",
                "postgres://u:******@h1:5432,h2:5432/db?sync_replicas=1",
            ),
            ("postgresql://app@db/x", "postgresql://app@db/x"),
            (
                "unix:///run/redis.sock?db=2&user=u&pass=p",
                "unix:///run/redis.sock?db=2&user=u&pass=******",
            ),
            ("redis+unix:///tmp/a@b.sock", "redis+unix:///tmp/a@b.sock"),
            (
                "postgres://app@db/x?pa%73sword=p&Api-Key=k",
                "postgres://app@db/x?pa%73sword=******&Api-Key=******",
            ),
            ("rediss://h#insecure", "rediss://h#******"),
            (
                "postgres://app@db/x?password=hun@ter2",
                "postgres://app@db/x?password=******",
            ),
            ("redis://:p@ss@h", "redis://:******@h"),
            ("memory:", "memory:"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn what_is_not_a_url_is_not_shown() {
        for url in [
            "hunter2",
            "memory",
            "memory:hunter2",
            "not a url :hunter2@",
            "redis://h\n:hunter2@",
            "://:hunter2@h",
            "re dis://:hunter2@h",
            "1redis://:hunter2@h",
            "",
        ] {
            assert_eq!(redact_url(url), UNPARSEABLE_URL, "{url:?}");
        }
    }

    fn encoded(s: &str) -> String {
        form_urlencoded::byte_serialize(s.as_bytes()).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn no_secret_survives_in_any_position((secret, words) in secret(), encode in any::<bool>(), position in 0usize..17) {
            let s = if encode { encoded(&secret) } else { secret.clone() };
            let url = match position {
                0 => format!("redis://:{s}@h:6379/0"),
                1 => format!("redis://user:{s}@h:6379"),
                2 => format!("rediss://{}@h:6379", encoded(&secret)),
                3 => format!("redis+unix:///tmp/r.sock?db=1&pass={s}"),
                4 => format!("redis://h:6379?password={s}"),
                5 => format!("redis+cluster://u:{s}@h1:1,h2:2?replicas=1"),
                6 => format!("rediss+sentinel://:{s}@s1:1,s2:2/SERVICE"),
                7 => format!("postgres://app:{s}@db:5432/x"),
                8 => format!("postgres://app@db/x?sslmode=disable&password={s}"),
                9 => format!("postgres://app@db/x?pass={s}"),
                10 => format!("postgres://app@db/x?PASSWORD={s}"),
                11 => format!("postgres://app@db/x?api_token={s}&sslmode=disable"),
                12 => format!("redis://h?secret_key={s}"),
                13 => format!("postgres://app:{s}@h1:5432,h2:5432/db?sync_replicas=1"),
                14 => format!("unix:///run/r.sock?pass={s}"),
                15 => format!("redis+sentinel://u:{s}@s1:1,s2:2/SERVICE/2?protocol=resp3"),
                _ => format!("postgresql://app@db/x?Secret={s}#{s}"),
            };
            let shown = redact_url(&url);
            for word in &words {
                prop_assert!(!shown.contains(word.as_str()), "{url} -> {shown}");
                prop_assert!(!shown.contains(&encoded(word)), "{url} -> {shown}");
            }
        }
    }
}
