//! The token a signal presents: which run, which signal, which wait; signed when the store has
//! a key.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::SignalName;
use crate::error::InvalidInput;
use crate::{Fence, Lease, RunId};

/// What every token's text starts with: the format's version.
const PREFIX: &str = "lst1";
/// What the signature covers before the token's body, so a MAC made for anything else under
/// the same secret is never a token's.
const DOMAIN: &[u8] = b"lease signal token v1\0";
/// The shortest secret a [`SignalKey`] takes, in bytes.
const MIN_SECRET: usize = 16;
/// The longest, in bytes.
const MAX_SECRET: usize = 1024;

/// A namespace's secret for signing [`SignalToken`]s (HMAC-SHA-256), configured on the store
/// (each backend's config has `with_signal_key`; the facade's `Config` reads
/// `LEASE_SIGNAL_SECRET`). With one, a token cannot be forged or pointed at another run or
/// wait by anyone who lacks the secret, and [`signal`](super::SignalExt::signal) refuses
/// unsigned tokens. Without one, tokens are not signed: whoever can reach the store can
/// signal any wait, as they could resume any run.
///
/// Its `Debug` never shows the secret.
#[derive(Clone)]
pub struct SignalKey(Arc<[u8]>);

impl SignalKey {
    /// A key of `secret`: 16 to 1024 bytes (32 random bytes is the intended size).
    ///
    /// # Errors
    /// [`InvalidInput::SignalKey`] for a secret too short or too long.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<SignalKey, InvalidInput> {
        let secret = secret.as_ref();
        if !(MIN_SECRET..=MAX_SECRET).contains(&secret.len()) {
            return Err(InvalidInput::SignalKey {
                len: secret.len(),
                min: MIN_SECRET,
                max: MAX_SECRET,
            });
        }
        Ok(SignalKey(secret.into()))
    }

    fn mac(&self, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(DOMAIN);
        mac.update(body);
        mac
    }
}

impl PartialEq for SignalKey {
    fn eq(&self, other: &SignalKey) -> bool {
        // Configuration equality, not an authentication check: verify_slice is that.
        self.0 == other.0
    }
}

impl Eq for SignalKey {}

impl fmt::Debug for SignalKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SignalKey([redacted])")
    }
}

/// Names one wait of one run: the run, the signal and the fence of the lease that suspended
/// it. Taken by the handler before it waits (`RunContext::signal_token` in `lease-runtime`,
/// or [`SignalToken::for_lease`]), handed to whoever answers (a link in an e-mail, a
/// webhook's URL), presented to [`signal`](super::SignalExt::signal).
///
/// Its text (`Display`, `FromStr`) is URL-safe: `lst1.` then the body in base64url, then, when
/// signed, `.` and the HMAC-SHA-256 of the body under the store's [`SignalKey`].
///
/// ```
/// use lease_core::{Fence, RunId, SignalKey, SignalName, SignalToken};
/// let key = SignalKey::new(b"0123456789abcdef0123456789abcdef")?;
/// let token = SignalToken::new(
///     RunId::new("order-7")?,
///     SignalName::new("approval")?,
///     Fence::new(3)?,
///     Some(&key),
/// );
/// let text = token.to_string();
/// assert!(text.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
/// let back: SignalToken = text.parse()?;
/// assert_eq!(back, token);
/// assert!(back.verify(Some(&key)).is_ok());
/// // Another key, or none, does not accept it.
/// let other = SignalKey::new(b"another secret of enough length")?;
/// assert!(back.verify(Some(&other)).is_err());
/// assert!(back.verify(None).is_err());
/// # Ok::<(), lease_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct SignalToken {
    run: RunId,
    name: SignalName,
    fence: Fence,
    mac: Option<[u8; 32]>,
}

impl SignalToken {
    /// The token of the wait of `fence` for `name` on `run`, signed with `key` if there is one.
    pub fn new(run: RunId, name: SignalName, fence: Fence, key: Option<&SignalKey>) -> SignalToken {
        let mut token = SignalToken {
            run,
            name,
            fence,
            mac: None,
        };
        if let Some(key) = key {
            token.mac = Some(key.mac(&token.body()).finalize().into_bytes().into());
        }
        token
    }

    /// The token of the wait `lease` would begin by ending with
    /// [`End::await_signal`](crate::End::await_signal)`(name, …)`, signed with `key` (the
    /// store's [`signal_key`](crate::LeaseStore::signal_key)).
    ///
    /// # Errors
    /// The [`SignalName`] rule's.
    pub fn for_lease(
        lease: &Lease,
        name: &str,
        key: Option<&SignalKey>,
    ) -> Result<SignalToken, InvalidInput> {
        Ok(SignalToken::new(
            lease.run().clone(),
            SignalName::new(name)?,
            lease.fence(),
            key,
        ))
    }

    /// The run it signals.
    pub fn run(&self) -> &RunId {
        &self.run
    }

    /// The signal it delivers.
    pub fn name(&self) -> &SignalName {
        &self.name
    }

    /// The fence of the wait it answers.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// Whether it carries a signature.
    pub fn is_signed(&self) -> bool {
        self.mac.is_some()
    }

    /// Checks its signature against `key` (the store's), in constant time.
    ///
    /// # Errors
    /// [`InvalidInput::SignalToken`]: signed but not by `key`, signed with no key to check
    /// it, or unsigned where `key` requires a signature.
    pub fn verify(&self, key: Option<&SignalKey>) -> Result<(), InvalidInput> {
        let why = match (key, &self.mac) {
            (None, None) => return Ok(()),
            (Some(key), Some(mac)) => match key.mac(&self.body()).verify_slice(mac) {
                Ok(()) => return Ok(()),
                Err(_) => "its signature does not match the store's signal key",
            },
            (Some(_), None) => "it is not signed, and the store's signal key requires a signature",
            (None, Some(_)) => {
                "it is signed, and the store has no signal key to check it with (configure the \
                 key it was signed with: LEASE_SIGNAL_SECRET)"
            }
        };
        Err(InvalidInput::SignalToken { why })
    }

    /// fence (8 bytes, big-endian), the name's length (1 byte), the name, the run id.
    fn body(&self) -> Vec<u8> {
        let (name, run) = (self.name.as_str().as_bytes(), self.run.as_str().as_bytes());
        let mut body = Vec::with_capacity(9 + name.len() + run.len());
        body.extend_from_slice(&self.fence.get().to_be_bytes());
        body.push(name.len() as u8); // at most MAX_SIGNAL_BYTES (64)
        body.extend_from_slice(name);
        body.extend_from_slice(run);
        body
    }

    fn parse_body(body: &[u8]) -> Result<(Fence, SignalName, RunId), &'static str> {
        let (fence, rest) = body.split_at_checked(8).ok_or("its body is too short")?;
        let fence = u64::from_be_bytes(fence.try_into().expect("8 bytes"));
        let fence = Fence::new(fence)
            .ok()
            .filter(|f| *f != Fence::ZERO)
            .ok_or("its fence is out of range")?;
        let (&len, rest) = rest.split_first().ok_or("its body is too short")?;
        let (name, run) = rest
            .split_at_checked(len as usize)
            .ok_or("its body is too short")?;
        let name = std::str::from_utf8(name).map_err(|_| "its signal name is not UTF-8")?;
        let name = SignalName::new(name).map_err(|_| "its signal name is not valid")?;
        let run = std::str::from_utf8(run).map_err(|_| "its run id is not UTF-8")?;
        let run = RunId::new(run).map_err(|_| "its run id is not valid")?;
        Ok((fence, name, run))
    }
}

impl fmt::Display for SignalToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}.{}", URL_SAFE_NO_PAD.encode(self.body()))?;
        if let Some(mac) = &self.mac {
            write!(f, ".{}", URL_SAFE_NO_PAD.encode(mac))?;
        }
        Ok(())
    }
}

impl fmt::Debug for SignalToken {
    // The run, the name and the fence; never the signature (it is what authorizes).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignalToken")
            .field("run", &self.run)
            .field("name", &self.name)
            .field("fence", &self.fence)
            .field("signed", &self.mac.is_some())
            .finish()
    }
}

impl FromStr for SignalToken {
    type Err = InvalidInput;

    /// Reads a token's text. Its signature is checked by
    /// [`verify`](SignalToken::verify) (which [`signal`](super::SignalExt::signal) calls).
    fn from_str(text: &str) -> Result<SignalToken, InvalidInput> {
        let bad = |why| InvalidInput::SignalToken { why };
        let parts: Vec<&str> = text.trim().split('.').collect();
        if parts.first() != Some(&PREFIX) {
            return Err(bad("it does not start with lst1."));
        }
        if parts.len() > 3 {
            return Err(bad("it has more than three parts"));
        }
        let mut parts = parts.into_iter().skip(1);
        let body = parts.next().ok_or_else(|| bad("it has no body"))?;
        let body = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| bad("its body is not base64url"))?;
        let (fence, name, run) = SignalToken::parse_body(&body).map_err(bad)?;
        let mac = match parts.next() {
            None => None,
            Some(mac) => {
                let mac = URL_SAFE_NO_PAD
                    .decode(mac)
                    .map_err(|_| bad("its signature is not base64url"))?;
                Some(
                    <[u8; 32]>::try_from(mac.as_slice())
                        .map_err(|_| bad("its signature is not 32 bytes"))?,
                )
            }
        };
        Ok(SignalToken {
            run,
            name,
            fence,
            mac,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(key: Option<&SignalKey>) -> SignalToken {
        SignalToken::new(
            RunId::new("run/7 ü").unwrap(),
            SignalName::new("approval").unwrap(),
            Fence::new(12).unwrap(),
            key,
        )
    }

    #[test]
    fn a_token_round_trips_through_its_text_signed_or_not() {
        let key = SignalKey::new([7u8; 32]).unwrap();
        for t in [token(None), token(Some(&key))] {
            let back: SignalToken = t.to_string().parse().unwrap();
            assert_eq!(back, t);
            assert_eq!(back.run().as_str(), "run/7 ü");
            assert_eq!(back.fence().get(), 12);
        }
    }

    #[test]
    fn a_re_pointed_token_fails_its_signature() {
        let key = SignalKey::new([7u8; 32]).unwrap();
        let signed = token(Some(&key));
        // The same signature on another fence, name or run.
        for other in [
            SignalToken {
                fence: Fence::new(13).unwrap(),
                ..signed.clone()
            },
            SignalToken {
                name: SignalName::new("approvaL").unwrap(),
                ..signed.clone()
            },
            SignalToken {
                run: RunId::new("run/8 ü").unwrap(),
                ..signed.clone()
            },
        ] {
            let parsed: SignalToken = other.to_string().parse().unwrap();
            let err = parsed.verify(Some(&key)).unwrap_err();
            assert!(err.to_string().contains("does not match"), "{err}");
        }
        assert!(signed.verify(Some(&key)).is_ok());
        let unsigned = token(None);
        let err = unsigned.verify(Some(&key)).unwrap_err();
        assert!(err.to_string().contains("not signed"), "{err}");
    }

    #[test]
    fn malformed_text_is_refused_with_a_reason() {
        for (text, why) in [
            ("", "does not start"),
            ("lst2.AAAA", "does not start"),
            ("lst1", "no body"),
            ("lst1.!!", "not base64url"),
            ("lst1.AAAA", "too short"),
            ("lst1.AAAAAAAAAAAAAA", "fence"),
            ("lst1.AAAAAAAAAAEIYXBwcm92YWxy.AAAA", "32 bytes"),
            ("lst1.AAAAAAAAAAEIYXBwcm92YWxy.a.b", "three parts"),
        ] {
            let err = text.parse::<SignalToken>().unwrap_err();
            assert!(err.to_string().contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_key_is_bounded_and_never_printed() {
        assert!(SignalKey::new([1u8; 15]).is_err());
        assert!(SignalKey::new([1u8; 1025]).is_err());
        let key = SignalKey::new(b"hunter2hunter2hunter2").unwrap();
        assert!(!format!("{key:?}").contains("hunter2"));
        let signed = token(Some(&key));
        assert!(!format!("{signed:?}").contains(&signed.to_string()[40..]));
    }
}
