//! Layer 1: the rows of the toolkit's tables as Rust values, read and written by the SQL layer.

pub(crate) mod audit;
pub(crate) mod message;
pub(crate) mod outbox;
pub(crate) mod quarantine;
