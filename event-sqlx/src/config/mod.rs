//! Layer 1: settings of the outbox, the relay and retries.

pub(crate) mod backoff;
pub(crate) mod outbox;
pub(crate) mod relay;
