//! The event number: an event's global idempotency key.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// An event's global idempotency key, stored in the `event_no` column and sent as `eventId`.
///
/// It must be derived from the business identity of the event, so that a retried command renders
/// the same number and the unique key on `event_no` absorbs the duplicate. It comes either from
/// the derive's `event_no` template (`"ORDER_PAID:{order_id}"`) or, without a template, from the
/// unit of work as `{EVENT_TYPE}:{aggregate_type}:{aggregate_id}:{aggregate_sequence}`.
///
/// # Length bound
/// The column is `VARCHAR(64)`, so an event number is at most [`EventNo::MAX_LEN`] bytes (and so at
/// most 64 characters on every database). A rendering that fits is kept as it is. A longer one
/// becomes a readable prefix plus a hash of the full text:
///
/// ```text
/// <the longest prefix of at most 47 bytes that ends on a character boundary> "#" <16 hex digits>
/// ```
///
/// where the hex digits are the first 8 bytes of the SHA-256 digest of the full rendered text
/// (UTF-8), in lowercase. The result depends on nothing but the text, so it is the same on every
/// machine, platform and run.
///
/// ```
/// use event_core::EventNo;
///
/// assert_eq!(EventNo::from_rendered("ORDER_PAID:42").as_str(), "ORDER_PAID:42");
///
/// let long = format!("ORDER_PAID:{}", "9".repeat(80));
/// let no = EventNo::from_rendered(&long);
/// assert_eq!(no.as_str().len(), 64);
/// assert!(no.as_str().starts_with("ORDER_PAID:999"));
/// assert_eq!(no, EventNo::from_rendered(&long));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventNo(String);

impl EventNo {
    /// The longest event number, in bytes: the width of the `event_no` column.
    pub const MAX_LEN: usize = 64;

    /// Bytes of readable prefix kept when a rendering is too long: 64 - 1 (`#`) - 16 (hex digits).
    const PREFIX_LEN: usize = Self::MAX_LEN - 1 - 2 * Self::HASH_BYTES;
    const HASH_BYTES: usize = 8;

    /// Builds an event number from its full rendering, shortening it as described above when it
    /// is longer than [`EventNo::MAX_LEN`] bytes.
    pub fn from_rendered(rendered: &str) -> EventNo {
        if rendered.len() <= Self::MAX_LEN {
            return EventNo(rendered.to_owned());
        }
        let mut cut = Self::PREFIX_LEN;
        while !rendered.is_char_boundary(cut) {
            cut -= 1;
        }
        let digest = Sha256::digest(rendered.as_bytes());
        let mut out = String::with_capacity(Self::MAX_LEN);
        out.push_str(&rendered[..cut]);
        out.push('#');
        for byte in &digest[..Self::HASH_BYTES] {
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
        EventNo(out)
    }

    /// The event number as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The event number as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Display for EventNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for EventNo {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl schemars::JsonSchema for EventNo {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EventNo".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "minLength": 1,
            "maxLength": EventNo::MAX_LEN,
            "description": "The event number: the event's global idempotency key, at most 64 bytes."
        })
    }
}
