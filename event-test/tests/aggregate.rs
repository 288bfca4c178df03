//! Given / when / then on an aggregate: the envelopes a command records, its errors, and the
//! checks every recorded payload goes through.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::panic::{AssertUnwindSafe, catch_unwind};

use event_core::{Aggregate, DomainEvent, EventContext, RecordError, RecordedEvents};
use event_test::{AggregateTest, Expected};
use serde_json::json;

#[derive(
    Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent,
)]
#[domain_event(aggregate = "ORDER")]
struct OrderPlaced {
    #[domain_event(aggregate_id)]
    order_id: String,
    lines: Vec<String>,
}

#[derive(
    Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent,
)]
#[domain_event(aggregate = "ORDER", event_no = "ORDER_PAID:{order_id}")]
struct OrderPaid {
    #[domain_event(aggregate_id)]
    order_id: String,
    amount_minor: i64,
}

/// A payload whose serde attributes lose a field on the way back: its round trip differs.
#[derive(
    Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent,
)]
#[domain_event(aggregate = "ORDER")]
struct OrderNoted {
    #[domain_event(aggregate_id)]
    order_id: String,
    #[serde(skip_deserializing, default)]
    note: String,
}

/// A payload its own schema does not describe: the schema says at least 1, the command writes 0.
#[derive(
    Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent,
)]
#[domain_event(aggregate = "ORDER")]
struct OrderDiscounted {
    #[domain_event(aggregate_id)]
    order_id: String,
    #[schemars(range(min = 1))]
    percent: u32,
}

#[derive(Debug, thiserror::Error)]
enum OrderError {
    #[error("order {0} is not placed yet")]
    NotPlaced(String),
    #[error(transparent)]
    Record(#[from] RecordError),
}

impl PartialEq for OrderError {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

#[derive(Debug, Aggregate)]
#[aggregate(type = "ORDER")]
struct Order {
    #[aggregate(id)]
    id: String,
    placed: bool,
    paid: bool,
    events: RecordedEvents,
}

impl Order {
    fn new(id: &str) -> Order {
        Order {
            id: id.into(),
            placed: false,
            paid: false,
            events: RecordedEvents::new(),
        }
    }

    fn place(&mut self, lines: &[&str]) -> Result<(), OrderError> {
        self.placed = true;
        self.record(OrderPlaced {
            order_id: self.id.clone(),
            lines: lines.iter().map(|l| (*l).to_owned()).collect(),
        })?;
        Ok(())
    }

    fn pay(&mut self, amount_minor: i64) -> Result<(), OrderError> {
        if !self.placed {
            return Err(OrderError::NotPlaced(self.id.clone()));
        }
        if self.paid {
            return Ok(());
        }
        self.paid = true;
        self.record(OrderPaid {
            order_id: self.id.clone(),
            amount_minor,
        })?;
        Ok(())
    }

    /// Records, then fails: what it recorded must not count.
    fn pay_and_fail(&mut self) -> Result<(), OrderError> {
        self.record(OrderPaid {
            order_id: self.id.clone(),
            amount_minor: 1,
        })?;
        Err(OrderError::NotPlaced(self.id.clone()))
    }
}

fn panic_message(f: impl FnOnce()) -> String {
    let panic = catch_unwind(AssertUnwindSafe(f)).expect_err("the assertion should fail");
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[test]
fn events_are_asserted_as_the_envelopes_the_repository_would_store() {
    let context = EventContext::new("order-service")
        .tenant_id("acme")
        .correlation_id("checkout-7")
        .causation_id("cmd-42");
    let mut test = AggregateTest::new(Order::new("o-1")).context(context);
    test.given(|o| o.place(&["book"]));
    assert_eq!(test.version(), 1);

    test.when(|o| o.pay(1999))
        .then_ok()
        .then_types(&["ORDER_PAID"])
        .then_events([Expected::event(OrderPaid {
            order_id: "o-1".into(),
            amount_minor: 1999,
        })
        .event_no("ORDER_PAID:o-1")
        .sequence(2)
        .aggregate("ORDER", "o-1")
        .header("tenantId", "acme")
        .header("causationId", "cmd-42")
        .header("correlationId", "checkout-7")
        .header("source", "order-service")]);
    // The test goes on from where the command left the aggregate.
    test.when(|o| o.pay(1999)).then_ok().then_no_events();
    assert!(test.aggregate().paid);
    assert_eq!(test.version(), 2);
    assert_eq!(test.history().len(), 2);
}

#[test]
fn a_partial_payload_matches_the_fields_it_names() {
    let mut test = AggregateTest::new(Order::new("o-2"));
    test.when(|o| o.place(&["book", "pen"]))
        .then_events([
            Expected::like::<OrderPlaced>(json!({ "lines": ["book", "pen"] }))
                .event_no("ORDER_PLACED:ORDER:o-2:1"),
        ]);

    let message = panic_message(|| {
        let mut test = AggregateTest::new(Order::new("o-3"));
        test.when(|o| o.place(&["book"]))
            .then_events([Expected::like::<OrderPlaced>(json!({ "lines": ["pen"] }))]);
    });
    assert!(
        message.contains("`/payload/lines/0` is \"book\", expected \"pen\""),
        "{message}"
    );
    // A readable diff of what was expected and what was recorded.
    let changed: Vec<&str> = message
        .lines()
        .filter(|l| l.starts_with(['-', '+']) && !l.starts_with("---") && !l.starts_with("+++"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .map(|l| {
            if l.contains("pen") {
                "-pen"
            } else if l.contains("book") {
                "+book"
            } else {
                "other"
            }
        })
        .collect();
    assert_eq!(changed, ["-pen", "+book"], "{message}");
}

#[test]
fn a_wrong_count_or_type_shows_every_envelope() {
    let message = panic_message(|| {
        let mut test = AggregateTest::new(Order::new("o-4"));
        test.given(|o| o.place(&["book"]));
        test.when(|o| o.pay(5)).then_events([
            Expected::of_type::<OrderPaid>(),
            Expected::of_type::<OrderPlaced>(),
        ]);
    });
    assert!(message.contains("expected 2 event(s), got 1"), "{message}");
    assert!(message.contains("ORDER_PAID:o-4"), "{message}");
}

#[test]
fn a_failed_command_is_asserted_and_its_events_discarded() {
    let mut test = AggregateTest::new(Order::new("o-5"));
    test.when(|o| o.pay(100))
        .then_error_eq(&OrderError::NotPlaced("o-5".into()))
        .then_error_contains("is not placed")
        .then_error(|e| matches!(e, OrderError::NotPlaced(_)))
        .then_no_events();

    test.given(|o| o.place(&["book"]));
    let then = test.when(|o| o.pay_and_fail());
    then.then_error(|e| matches!(e, OrderError::NotPlaced(_)));
    // Recorded before it failed, then rolled back: shown, not kept.
    assert_eq!(then.events().len(), 1);
    drop(then);
    assert_eq!(test.version(), 1);
    assert_eq!(test.history().len(), 1);
    test.when(|o| o.pay(7))
        .then_events([Expected::of_type::<OrderPaid>().sequence(2)]);
}

#[test]
fn expecting_an_error_from_a_command_that_succeeded_fails_at_the_test_line() {
    let message = panic_message(|| {
        let mut test = AggregateTest::new(Order::new("o-6"));
        test.given(|o| o.place(&[]));
        test.when(|o| o.pay(1)).then_error(|_| true);
    });
    assert!(
        message.contains("expected the command to fail, it succeeded"),
        "{message}"
    );

    // The panic points at the caller: #[track_caller] all the way.
    let location = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen = location.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        *seen.lock().unwrap() = info.location().map(|l| (l.file().to_owned(), l.line()));
    }));
    let line = line!() + 3;
    let _ = catch_unwind(|| {
        let mut test = AggregateTest::new(Order::new("o-7"));
        test.when(|o| o.pay(1)).then_ok();
    });
    std::panic::set_hook(previous);
    let location = location.lock().unwrap().clone().expect("a panic location");
    assert!(location.0.ends_with("tests/aggregate.rs"), "{location:?}");
    assert_eq!(location.1, line);
}

#[test]
fn a_payload_that_changes_on_a_round_trip_fails() {
    let message = panic_message(|| {
        let mut test = AggregateTest::new(Order::new("o-8"));
        test.when(|o| {
            let order_id = o.id.clone();
            o.record(OrderNoted {
                order_id,
                note: "gift".into(),
            })
        })
        .then_ok();
    });
    assert!(
        message.contains("changes on a serde round trip"),
        "{message}"
    );
    assert!(message.contains("\"note\": \"gift\""), "{message}");
}

#[test]
fn a_payload_its_schema_does_not_describe_fails_even_without_an_assertion() {
    let message = panic_message(|| {
        let mut test = AggregateTest::new(Order::new("o-9"));
        // No assertion: the end of the statement reports it.
        let _ = test.when(|o| {
            let order_id = o.id.clone();
            o.record(OrderDiscounted {
                order_id,
                percent: 0,
            })
        });
    });
    assert!(
        message.contains("does not match the schema derived for"),
        "{message}"
    );
    assert!(message.contains("at `/percent`"), "{message}");
}

#[test]
fn a_payload_its_committed_snapshot_does_not_describe_fails() {
    // A committed snapshot stricter than the code: v1 of ORDER_PAID took amounts up to 100.
    let dir = std::env::temp_dir().join(format!("event-test-snapshots-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("ORDER_PAID")).unwrap();
    let mut snapshot = serde_json::to_value(OrderPaid::event_schema()).unwrap();
    snapshot["properties"]["amount_minor"]["maximum"] = json!(100);
    std::fs::write(
        dir.join("ORDER_PAID/v1.json"),
        serde_json::to_string_pretty(&snapshot).unwrap(),
    )
    .unwrap();

    let mut test = AggregateTest::new(Order::new("o-10")).snapshots(&dir);
    test.given(|o| o.place(&[]));
    test.when(|o| o.pay(100)).then_ok();
    let message = panic_message(|| {
        test.when(|o| {
            o.paid = false;
            o.pay(101)
        })
        .then_ok();
    });
    assert!(message.contains("does not match the snapshot"), "{message}");
    assert!(message.contains("ORDER_PAID/v1.json"), "{message}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn an_async_command_is_tested_the_same_way() {
    let mut test = AggregateTest::new(Order::new("o-11"));
    test.given(|o| o.place(&["book"]));
    test.when_async(async |o: &mut Order| {
        tokio::task::yield_now().await;
        o.pay(42)
    })
    .await
    .then_events([Expected::like::<OrderPaid>(json!({ "amount_minor": 42 }))]);
}
