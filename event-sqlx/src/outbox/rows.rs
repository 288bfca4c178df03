//! The row each envelope becomes, checked before any write, and the error a write's unique key
//! refusal becomes.

//! The outbox: events written in the business transaction, and the seed's queries over them.

use super::Outbox;
use crate::error::Error;
use crate::row::outbox::{FlushReport, NewOutboxRow};
use crate::sql::dialect::Backend;
use crate::sql::outbox::{self as sql};
use event_core::EventEnvelope;
use std::collections::HashSet;

impl<DB: Backend> Outbox<DB> {
    /// The rows of `envelopes`, each validated, the second of two with one event number left
    /// out and reported as already recorded.
    pub(super) fn rows_for(
        &self,
        envelopes: &[EventEnvelope],
    ) -> Result<(Vec<NewOutboxRow>, FlushReport), Error> {
        let mut seen = HashSet::with_capacity(envelopes.len());
        let mut rows = Vec::with_capacity(envelopes.len());
        let mut report = FlushReport::default();
        for envelope in envelopes {
            let row = self.row_for(envelope)?;
            if seen.insert(envelope.event_id.as_str()) {
                rows.push(row);
            } else {
                report.already_recorded.push(envelope.event_id.clone());
            }
        }
        Ok((rows, report))
    }

    /// A flush's error: a sequence conflict names the row the unique key refused.
    pub(super) async fn write_error(
        &self,
        conn: &mut DB::Connection,
        source: sqlx::Error,
        rows: &[NewOutboxRow],
    ) -> Error {
        let conflict = sql::sequence_conflict::<DB>(conn, &self.config.table, rows, &source).await;
        self.conflict_error(source, rows, conflict)
    }

    /// The error of a write a unique key refused: a sequence conflict naming `rows[index]`, or
    /// the database's error.
    pub(super) fn conflict_error(
        &self,
        source: sqlx::Error,
        rows: &[NewOutboxRow],
        index: Option<usize>,
    ) -> Error {
        match index {
            Some(index) => {
                let row = &rows[index.min(rows.len() - 1)];
                Error::SequenceConflict {
                    aggregate_type: row.aggregate_type.clone(),
                    aggregate_id: row.aggregate_id.clone(),
                    sequence: row.aggregate_sequence,
                    event_no: row.event_no.clone(),
                }
            }
            None => self.db_error(source),
        }
    }

    pub(super) fn row_for(&self, envelope: &EventEnvelope) -> Result<NewOutboxRow, Error> {
        let event_no = envelope.event_id.as_str();
        let too_long = |column, len, max, hint| Error::ValueTooLong {
            column,
            event_no: event_no.chars().take(80).collect(),
            len,
            max,
            hint,
        };
        let source = envelope.headers.source.as_deref().unwrap_or_default();
        let route = self
            .config
            .route_for(&envelope.aggregate_type, &envelope.event_type);
        let checks: [(&'static str, usize, usize, &'static str); 10] = [
            (
                "event_no",
                event_no.len(),
                64,
                "build event numbers with EventNo::from_rendered, which bounds them",
            ),
            (
                "event_type",
                envelope.event_type.len(),
                64,
                "use a shorter event type",
            ),
            (
                "aggregate_type",
                envelope.aggregate_type.len(),
                64,
                "use a shorter aggregate type",
            ),
            (
                "aggregate_id",
                envelope.aggregate_id.len(),
                64,
                "use a shorter aggregate id",
            ),
            (
                "event_source",
                source.len(),
                64,
                "use a shorter service name in EventContext::new",
            ),
            (
                "trace_id",
                envelope.trace_id.as_deref().map_or(0, str::len),
                128,
                "use a shorter trace id",
            ),
            (
                "publish_channel",
                route.channel.len(),
                32,
                "configure a shorter channel in the route",
            ),
            (
                "topic",
                route.topic.as_deref().map_or(0, str::len),
                128,
                "configure a shorter topic in the route",
            ),
            (
                "routing_key",
                route.routing_key.as_deref().map_or(0, str::len),
                128,
                "configure a shorter routing key in the route",
            ),
            (
                "event_no",
                usize::from(event_no.is_empty()),
                0,
                "an event number cannot be empty",
            ),
        ];
        for (column, len, max, hint) in checks {
            if len > max {
                return Err(too_long(column, len, max, hint));
            }
        }
        if source.is_empty() {
            return Err(too_long(
                "event_source",
                0,
                64,
                "it is empty: create the unit of work with EventContext::new(\"your-service\")",
            ));
        }
        if envelope.aggregate_sequence == 0 {
            // A relay takes sequence 1 for its aggregate's first event, with nothing before it
            // to wait for.
            return Err(Error::SequenceZero {
                aggregate_type: envelope.aggregate_type.chars().take(80).collect(),
                aggregate_id: envelope.aggregate_id.chars().take(80).collect(),
                event_no: event_no.chars().take(80).collect(),
            });
        }
        let size = json_len(&envelope.payload);
        if size > self.config.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                event_no: event_no.to_owned(),
                event_type: envelope.event_type.clone(),
                size,
                max: self.config.max_payload_bytes,
            });
        }
        let headers = serde_json::to_value(&envelope.headers).unwrap_or(serde_json::Value::Null);
        Ok(NewOutboxRow {
            event_no: event_no.to_owned(),
            aggregate_type: envelope.aggregate_type.clone(),
            aggregate_id: envelope.aggregate_id.clone(),
            aggregate_sequence: i64::try_from(envelope.aggregate_sequence).unwrap_or(i64::MAX),
            event_type: envelope.event_type.clone(),
            event_version: i32::try_from(envelope.event_version).unwrap_or(i32::MAX),
            event_source: source.to_owned(),
            publish_channel: route.channel,
            topic: route.topic,
            routing_key: route.routing_key,
            event_payload: envelope.payload.clone(),
            event_headers: headers,
            max_retry_count: self.config.max_retry_count,
            trace_id: envelope.trace_id.clone(),
            create_time: envelope.occurred_at,
        })
    }
}

/// The length of `value` serialized as JSON, without allocating it.
pub(super) fn json_len(value: &serde_json::Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    match serde_json::to_writer(&mut counter, value) {
        Ok(()) => counter.0,
        Err(_) => usize::MAX,
    }
}
