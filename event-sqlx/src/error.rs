//! The errors of the outbox and the relay.

/// Why an outbox operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// A payload is larger than the configured maximum; nothing was written.
    #[error(
        "the payload of {event_type} {event_no} is {size} bytes, over the {max}-byte limit; nothing was written. Keep payloads to the snapshot consumers need (large data belongs in the business table), or raise OutboxConfig::max_payload_bytes"
    )]
    PayloadTooLarge {
        /// The event number.
        event_no: String,
        /// The event type.
        event_type: String,
        /// The serialized size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// A value does not fit its column; nothing was written.
    #[error(
        "{column} of event {event_no} is {len} bytes, over the column's {max}; nothing was written. {hint}"
    )]
    ValueTooLong {
        /// The column.
        column: &'static str,
        /// The event number.
        event_no: String,
        /// The value's length.
        len: usize,
        /// The column width.
        max: usize,
        /// How to fix it.
        hint: &'static str,
    },
    /// Another event already holds this aggregate sequence.
    #[error(
        "aggregate {aggregate_type} {aggregate_id} already has an event at one of the sequences {sequences}: another transaction recorded events for it first, or it was loaded at a stale version. Reload the aggregate (its version is Outbox::aggregate_version) and retry the command"
    )]
    SequenceConflict {
        /// Aggregate type.
        aggregate_type: String,
        /// Aggregate id.
        aggregate_id: String,
        /// The sequences written.
        sequences: String,
    },
    /// The database is unreachable or refused the statement.
    #[error("database error on {table}: {source}")]
    Database {
        /// The table.
        table: String,
        /// What sqlx reported.
        #[source]
        source: sqlx::Error,
    },
    /// A feature was used without the setting it needs.
    #[error("{0}")]
    Misconfigured(&'static str),
    /// Running the migrations failed.
    #[error("applying the event tables' migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored row could not be read back.
    #[error(transparent)]
    Record(#[from] crate::record::RecordError),
}
