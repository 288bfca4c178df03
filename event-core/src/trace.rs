//! W3C trace context (`traceparent`), so events join the trace of the request that caused them.

use std::fmt;
use std::str::FromStr;

/// A validated W3C `traceparent` header: `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`.
///
/// ```
/// use event_core::Traceparent;
///
/// let tp: Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse()?;
/// assert_eq!(tp.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert!("00-xyz".parse::<Traceparent>().is_err());
/// # Ok::<(), event_core::TraceparentError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Traceparent(String);

/// Why a `traceparent` value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid traceparent `{value}`: {reason}; expected `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>` (W3C Trace Context)"
)]
pub struct TraceparentError {
    value: String,
    reason: &'static str,
}

impl Traceparent {
    /// The 32-hex-digit trace id.
    pub fn trace_id(&self) -> &str {
        &self.0[3..35]
    }

    /// The header value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for Traceparent {
    type Err = TraceparentError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let fail = |reason| TraceparentError {
            value: value.chars().take(80).collect(),
            reason,
        };
        let parts: Vec<&str> = value.trim().split('-').collect();
        let [version, trace_id, parent_id, flags, ..] = parts[..] else {
            return Err(fail("it does not have four `-`-separated parts"));
        };
        let lower_hex = |s: &str, len: usize| {
            s.len() == len
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if !lower_hex(version, 2) || version == "ff" {
            return Err(fail(
                "the version is not two lowercase hex digits other than ff",
            ));
        }
        if version == "00" && parts.len() != 4 {
            return Err(fail("version 00 has exactly four parts"));
        }
        if !lower_hex(trace_id, 32) || trace_id.bytes().all(|b| b == b'0') {
            return Err(fail(
                "the trace id is not 32 lowercase hex digits, not all zero",
            ));
        }
        if !lower_hex(parent_id, 16) || parent_id.bytes().all(|b| b == b'0') {
            return Err(fail(
                "the parent id is not 16 lowercase hex digits, not all zero",
            ));
        }
        if !lower_hex(flags, 2) {
            return Err(fail("the flags are not two lowercase hex digits"));
        }
        Ok(Traceparent(format!(
            "{version}-{trace_id}-{parent_id}-{flags}"
        )))
    }
}

impl fmt::Display for Traceparent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
