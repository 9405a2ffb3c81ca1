//! Validated identifiers for runs and workers.

use crate::limits::MAX_ID_BYTES;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::InvalidInput;

/// Checks the identifier rules shared by [`RunId`], [`WorkerId`] and unique keys.
pub(crate) fn validate(what: &'static str, id: &str) -> Result<(), InvalidInput> {
    if id.is_empty() {
        return Err(InvalidInput::EmptyId { what });
    }
    if id.len() > MAX_ID_BYTES {
        return Err(InvalidInput::IdTooLong {
            what,
            len: id.len(),
        });
    }
    if let Some((at, _)) = id.char_indices().find(|(_, c)| c.is_control()) {
        return Err(InvalidInput::ControlCharacter { what, at });
    }
    Ok(())
}

macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Validates `id`: 1 to 255 bytes of UTF-8, no control characters.
            ///
            /// # Errors
            /// [`InvalidInput::EmptyId`], [`InvalidInput::IdTooLong`] or
            /// [`InvalidInput::ControlCharacter`], naming the offending byte.
            pub fn new(id: impl AsRef<str>) -> Result<Self, InvalidInput> {
                let id = id.as_ref();
                validate($what, id)?;
                Ok(Self(Arc::from(id)))
            }

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl FromStr for $name {
            type Err = InvalidInput;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = InvalidInput;
            fn try_from(s: &str) -> Result<Self, Self::Error> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidInput;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                Self::new(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

identifier!(
    /// The caller's identifier of a run: 1 to 255 bytes of UTF-8 without control characters.
    ///
    /// Cloning is cheap (a reference count).
    ///
    /// ```
    /// use lease_core::{InvalidInput, RunId};
    /// let run = RunId::new("order-42").unwrap();
    /// assert_eq!(run.as_str(), "order-42");
    /// assert!(matches!(RunId::new(""), Err(InvalidInput::EmptyId { .. })));
    /// ```
    RunId,
    "run id"
);

identifier!(
    /// The identifier of a worker, recorded as a lease's owner: 1 to 255 bytes of UTF-8 without
    /// control characters.
    WorkerId,
    "worker id"
);

identifier!(
    /// The caller's key for one effect of a run, so that a retried write applies once:
    /// [`append_keyed`](crate::LeaseStore::append_keyed) stores it with the journal entry, and
    /// the same key again answers that entry instead of appending another. 1 to 255 bytes of
    /// UTF-8 without control characters; unique per run (a step name, an outbox message id).
    ///
    /// ```
    /// use lease_core::IdempotencyKey;
    /// let key = IdempotencyKey::new("charge-card").unwrap();
    /// assert_eq!(key.as_str(), "charge-card");
    /// ```
    IdempotencyKey,
    "idempotency key"
);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn boundaries_are_exact() {
        assert!(RunId::new("a".repeat(255)).is_ok());
        assert_eq!(
            RunId::new("a".repeat(256)).unwrap_err(),
            InvalidInput::IdTooLong {
                what: "run id",
                len: 256
            }
        );
        // 85 three-byte characters are 255 bytes; one more is 258.
        assert!(WorkerId::new("€".repeat(85)).is_ok());
        assert!(matches!(
            WorkerId::new("€".repeat(86)),
            Err(InvalidInput::IdTooLong { len: 258, .. })
        ));
        assert_eq!(
            RunId::new("ab\ncd").unwrap_err(),
            InvalidInput::ControlCharacter {
                what: "run id",
                at: 2
            }
        );
        assert!(matches!(
            WorkerId::new(""),
            Err(InvalidInput::EmptyId { what: "worker id" })
        ));
    }

    proptest! {
        #[test]
        fn accepts_exactly_the_valid_ids(s in "\\PC{0,300}|[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}a-z]{0,8}") {
            let valid = !s.is_empty() && s.len() <= MAX_ID_BYTES && !s.chars().any(char::is_control);
            match RunId::new(&s) {
                Ok(id) => { prop_assert!(valid); prop_assert_eq!(id.as_str(), s.as_str()); }
                Err(_) => prop_assert!(!valid),
            }
        }
    }
}
