//! The trace context a run is created under: the W3C `traceparent` of the span that enqueued
//! it, stored with the run and handed to the attempt that runs it, so that a tracing backend
//! shows the enqueue and the handler in one trace
//! ([`NewRun::with_trace_parent`](crate::NewRun::with_trace_parent),
//! [`Lease::trace_parent`](crate::Lease::trace_parent)).
//!
//! Only the `traceparent` is kept (55 bytes), not `tracestate`: it names the trace and the
//! enqueuing span, which is what a handler's span needs to continue the trace.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::InvalidInput;

/// The length of a version-00 `traceparent`: `00-` + 32 + `-` + 16 + `-` + 2.
pub const TRACE_PARENT_LEN: usize = 55;

/// A W3C trace context `traceparent` header of version `00`:
/// `00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>`, lower-case, the trace and span
/// ids not all zeros.
///
/// ```
/// use lease_core::TraceParent;
/// let parent = TraceParent::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")?;
/// assert_eq!(parent.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert_eq!(parent.span_id(), "00f067aa0ba902b7");
/// assert!(parent.sampled());
/// assert!(TraceParent::new("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_err());
/// # Ok::<(), lease_core::InvalidInput>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TraceParent(Arc<str>);

impl TraceParent {
    /// Checks `header` as a version-00 `traceparent`.
    ///
    /// # Errors
    /// [`InvalidInput::TraceParent`] saying what is wrong.
    pub fn new(header: impl AsRef<str>) -> Result<TraceParent, InvalidInput> {
        let header = header.as_ref();
        let refuse = |why| Err(InvalidInput::TraceParent { why });
        if header.len() != TRACE_PARENT_LEN {
            return refuse("a version-00 traceparent is 55 characters long");
        }
        let parts: Vec<&str> = header.split('-').collect();
        let [version, trace, span, flags] = parts[..] else {
            return refuse("a traceparent has four fields separated by '-'");
        };
        let hex = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if version != "00" {
            return refuse("only version 00 of traceparent is understood");
        }
        if trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
            return refuse("the trace id is 32 hex digits, the span id 16, the flags 2");
        }
        if !(hex(trace) && hex(span) && hex(flags)) {
            return refuse("the ids and flags are lower-case hex digits");
        }
        if trace.bytes().all(|b| b == b'0') || span.bytes().all(|b| b == b'0') {
            return refuse("an all-zero trace id or span id is invalid");
        }
        Ok(TraceParent(Arc::from(header)))
    }

    /// The header's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The trace id: 32 hex digits.
    pub fn trace_id(&self) -> &str {
        &self.0[3..35]
    }

    /// The enqueuing span's id: 16 hex digits.
    pub fn span_id(&self) -> &str {
        &self.0[36..52]
    }

    /// Whether the enqueuer sampled the trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.0[53..55], 16).is_ok_and(|flags| flags & 1 == 1)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceParent({})", self.0)
    }
}

impl FromStr for TraceParent {
    type Err = InvalidInput;

    fn from_str(s: &str) -> Result<TraceParent, InvalidInput> {
        TraceParent::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_version_00_header_is_kept_verbatim_and_read_back() {
        let parent = TraceParent::new(GOOD).unwrap();
        assert_eq!(parent.as_str(), GOOD);
        assert_eq!(parent.to_string(), GOOD);
        assert_eq!(GOOD.parse::<TraceParent>().unwrap(), parent);
        let unsampled = TraceParent::new(GOOD.replace("-01", "-00").as_str()).unwrap();
        assert!(!unsampled.sampled());
    }

    #[test]
    fn malformed_headers_are_refused_with_their_reason() {
        for (header, reason) in [
            ("", "55 characters"),
            (&GOOD[..54], "55 characters"),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version 00",
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
                "lower-case hex",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736x00f067aa0ba902b7-01",
                "four fields",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
                "32 hex digits",
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "all-zero",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "all-zero",
            ),
        ] {
            let refused = TraceParent::new(header).unwrap_err();
            assert!(
                refused.to_string().contains(reason),
                "{header:?}: {refused}"
            );
        }
    }
}
