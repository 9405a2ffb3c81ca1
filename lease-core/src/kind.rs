//! A run's kind: which handler runs it, and which index a claim takes it from.

use crate::limits::MAX_KIND_BYTES;
use std::sync::Arc;

use crate::error::InvalidInput;

/// The kind of a run created without one, and the kind [`claim_next`] claims.
///
/// [`claim_next`]: crate::LeaseStore::claim_next
pub const DEFAULT_KIND: &str = "default";

/// A run's kind ([`NewRun::with_kind`](crate::NewRun::with_kind)): a short name, 1 to
/// [`MAX_KIND_BYTES`] bytes of UTF-8 without control characters, fixed when the run is created.
///
/// A claim by kind ([`claim_next_kind`](crate::LeaseStore::claim_next_kind)) takes only runs of
/// that kind, through an index of its own, so a `Worker` (`lease-runtime`) serving `email`
/// never claims, and never reads past, a `charge` run. A run created without a kind is of the
/// [`DEFAULT_KIND`], the kind [`claim_next`](crate::LeaseStore::claim_next) claims.
///
/// ```
/// use lease_core::{InvalidInput, Kind};
/// let kind = Kind::new("charge")?;
/// assert_eq!(kind.as_str(), "charge");
/// assert!(Kind::default().is_default());
/// assert!(matches!(Kind::new("x".repeat(65)), Err(InvalidInput::KindTooLong { len: 65, .. })));
/// # Ok::<(), InvalidInput>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Kind(Arc<str>);

impl Kind {
    /// Validates `kind`: 1 to [`MAX_KIND_BYTES`] bytes of UTF-8, no control characters.
    ///
    /// # Errors
    /// [`InvalidInput::EmptyKind`], [`InvalidInput::KindTooLong`] or
    /// [`InvalidInput::ControlCharacter`], naming the offending byte.
    pub fn new(kind: impl AsRef<str>) -> Result<Kind, InvalidInput> {
        let kind = kind.as_ref();
        crate::name::check(
            kind,
            MAX_KIND_BYTES,
            "kind",
            InvalidInput::EmptyKind {
                max: MAX_KIND_BYTES,
            },
            |len| InvalidInput::KindTooLong {
                len,
                max: MAX_KIND_BYTES,
            },
        )?;
        Ok(Kind(Arc::from(kind)))
    }

    /// The kind as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether it is the [`DEFAULT_KIND`].
    pub fn is_default(&self) -> bool {
        &*self.0 == DEFAULT_KIND
    }
}

impl Default for Kind {
    /// The [`DEFAULT_KIND`].
    fn default() -> Kind {
        Kind(Arc::from(DEFAULT_KIND))
    }
}

crate::name::name_traits!(Kind);

/// The runnable runs of one kind (claimable, held or delayed), as
/// [`count_kinds`](crate::LeaseStore::count_kinds) read them on the store's clock: what waits
/// for the workers that serve the kind. Each figure is exact up to
/// [`MAX_COUNT`](crate::MAX_COUNT).
///
/// Backends build it with [`KindCounts::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KindCounts {
    /// The kind.
    pub kind: Kind,
    /// Its runnable runs: claimable, held or delayed.
    pub runnable: u64,
    /// Those claimable now (unowned past any delay, or whose lease expired).
    pub claimable: u64,
    /// The kind's queue lag: how long its longest-waiting claimable run has been claimable,
    /// on the store's clock; `None` when none is.
    pub oldest_claimable_age: Option<std::time::Duration>,
}

impl KindCounts {
    /// `runnable` runs of `kind`, `claimable` of them claimable, the longest for `lag`.
    pub fn new(
        kind: Kind,
        runnable: u64,
        claimable: u64,
        lag: Option<std::time::Duration>,
    ) -> KindCounts {
        KindCounts {
            kind,
            runnable,
            claimable,
            oldest_claimable_age: lag,
        }
    }
}

/// Refuses runs of a kind other than the default, for a backend that has no index per kind yet:
/// nothing is written.
///
/// # Errors
/// [`InvalidInput::Unsupported`] naming kinds.
pub fn refuse_kinds<'a>(kinds: impl IntoIterator<Item = &'a Kind>) -> Result<(), InvalidInput> {
    if kinds.into_iter().any(|k| !k.is_default()) {
        return Err(InvalidInput::Unsupported {
            operation: "run kinds other than the default",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_are_exact() {
        assert!(Kind::new("k".repeat(64)).is_ok());
        assert_eq!(
            Kind::new("k".repeat(65)).unwrap_err(),
            InvalidInput::KindTooLong { len: 65, max: 64 }
        );
        assert_eq!(
            Kind::new("").unwrap_err(),
            InvalidInput::EmptyKind { max: 64 }
        );
        assert_eq!(
            Kind::new("a\tb").unwrap_err(),
            InvalidInput::ControlCharacter {
                what: "kind",
                at: 1
            }
        );
        assert_eq!(Kind::new("default").unwrap(), Kind::default());
        assert!(!Kind::new("Default").unwrap().is_default());
    }
}
