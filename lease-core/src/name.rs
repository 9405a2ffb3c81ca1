//! The one rule of a short name, which kinds ([`Kind`](crate::Kind)) and queues
//! ([`Queue`](crate::Queue)) share: 1 to a bound of bytes of UTF-8, no control character (so
//! a backend may separate names with one), and the traits every such name has.

use crate::error::InvalidInput;

/// Checks `name` against the rule: `empty` when it is empty, `too_long(len)` when it is over
/// `max` bytes, [`InvalidInput::ControlCharacter`] naming `what` and the offending byte.
pub(crate) fn check(
    name: &str,
    max: usize,
    what: &'static str,
    empty: InvalidInput,
    too_long: impl FnOnce(usize) -> InvalidInput,
) -> Result<(), InvalidInput> {
    if name.is_empty() {
        return Err(empty);
    }
    if name.len() > max {
        return Err(too_long(name.len()));
    }
    if let Some((at, _)) = name.char_indices().find(|(_, c)| c.is_control()) {
        return Err(InvalidInput::ControlCharacter { what, at });
    }
    Ok(())
}

/// `Display` (the name), `Debug` (the name quoted), `FromStr`, `TryFrom<&str>` (both through
/// `new`) and `AsRef<str>` for a short name `$name(Arc<str>)`.
macro_rules! name_traits {
    ($name:ident) => {
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = InvalidInput;
            fn from_str(s: &str) -> Result<$name, InvalidInput> {
                $name::new(s)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = InvalidInput;
            fn try_from(s: &str) -> Result<$name, InvalidInput> {
                $name::new(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}
pub(crate) use name_traits;
