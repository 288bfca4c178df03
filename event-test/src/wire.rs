//! What goes on the wire, ready for a snapshot: the stored row and the published message with
//! what changes from run to run redacted.

use event_sqlx::{OutboxMessage, OutboxRecord};
use serde_json::{Value, json};

/// Placeholder for a time.
const TIME: &str = "[time]";

/// An outbox row as stored, every column, with the row id, the times and the relay's id
/// redacted: what a snapshot of the stored envelope compares. Event numbers, headers and
/// trace ids come from the test's own context, so they are kept.
pub fn stored(record: &OutboxRecord) -> Value {
    let mut value = serde_json::to_value(record).unwrap_or(Value::Null);
    if let Value::Object(row) = &mut value {
        row.insert("id".into(), json!("[id]"));
        for column in [
            "create_time",
            "update_time",
            "next_retry_time",
            "lock_until",
            "last_publish_time",
            "published_time",
        ] {
            if row.get(column).is_some_and(|v| !v.is_null()) {
                row.insert(column.into(), json!(TIME));
            }
        }
        if row.get("locked_by").is_some_and(|v| !v.is_null()) {
            row.insert("locked_by".into(), json!("[relay]"));
        }
    }
    value
}

/// A message as the relay hands it to a broker: the route, the broker's deduplication id, and
/// the body (the envelope's JSON), with the time redacted.
pub fn published(message: &OutboxMessage) -> Value {
    let mut body = serde_json::to_value(&message.envelope).unwrap_or(Value::Null);
    if let Value::Object(envelope) = &mut body {
        envelope.insert("occurredAt".into(), json!(TIME));
    }
    json!({
        "channel": message.channel,
        "topic": message.topic,
        "routingKey": message.routing_key,
        "messageId": message.message_id,
        "body": body,
    })
}

/// Asserts that `value` (usually [`wire::stored`](stored) or [`wire::published`](published))
/// matches the committed snapshot of that name, with `insta`: `cargo insta review` (or
/// `INSTA_UPDATE=always`) records it, CI compares it.
///
/// ```no_run
/// # async fn demo(h: &event_test::Harness<sqlx::Sqlite>) -> Result<(), event_sqlx::Error> {
/// let row = h.outbox().by_event_no("ORDER_PAID:o-1").await?.expect("stored");
/// event_test::assert_wire_snapshot!("order_paid_stored", event_test::wire::stored(&row));
/// event_test::assert_wire_snapshot!("order_paid_published", event_test::wire::published(&h.published()[0]));
/// # Ok(()) }
/// ```
#[macro_export]
macro_rules! assert_wire_snapshot {
    ($name:expr, $value:expr $(,)?) => {
        $crate::__insta::assert_json_snapshot!($name, $value)
    };
}
