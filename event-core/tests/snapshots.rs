//! Snapshots: recorded on request only, never in CI, and the check of the code against them.

// A panic is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use event_core::schema::Mode;
use event_core::schema::snapshot::{
    Problem, Record, Registered, check_registered, read_snapshot, snapshot_path,
};
use event_core::{DomainEvent, Upcast, Upcasters};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "ORDER_SHIPPED", version = 1, aggregate = "ORDER")]
struct OrderShippedV1 {
    order_id: String,
}

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "ORDER_SHIPPED", version = 2, aggregate = "ORDER")]
struct OrderShipped {
    order_id: String,
    carrier: String,
}

impl Upcast for OrderShipped {
    type Previous = OrderShippedV1;
    fn upcast(v1: OrderShippedV1) -> OrderShipped {
        OrderShipped {
            order_id: v1.order_id,
            carrier: "unknown".into(),
        }
    }
}

event_core::register_upcaster!(OrderShipped);

fn registered<E: DomainEvent>(mode: Mode) -> Registered {
    Registered {
        event_type: E::EVENT_TYPE.into(),
        version: E::EVENT_VERSION,
        rust_type: std::any::type_name::<E>().into(),
        compatibility: mode,
        schema: serde_json::to_value(E::event_schema()).unwrap(),
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("snapshots-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn missing_snapshots_are_recorded_only_on_request_and_never_in_ci() {
    let dir = temp_dir("record");
    let events = [registered::<OrderShippedV1>(Mode::BackwardTransitive)];

    let report = check_registered(&events, &dir, &Upcasters::new(), Record::No);
    assert!(
        matches!(&report.problems[..], [Problem::Missing { version: 1, .. }]),
        "{report}"
    );
    assert!(
        report
            .to_string()
            .contains("EVENT_SNAPSHOTS=record cargo test"),
        "{report}"
    );

    let report = check_registered(&events, &dir, &Upcasters::new(), Record::RefusedInCi);
    assert!(
        report
            .to_string()
            .contains("nothing is recorded when CI is set"),
        "{report}"
    );
    assert!(!snapshot_path(&dir, "ORDER_SHIPPED", 1).exists());

    let report = check_registered(&events, &dir, &Upcasters::new(), Record::Yes);
    assert!(report.is_ok(), "{report}");
    assert_eq!(
        report.recorded,
        vec![snapshot_path(&dir, "ORDER_SHIPPED", 1)]
    );
    let written = read_snapshot(&report.recorded[0]).unwrap();
    assert_eq!(written["x-event-snapshot"]["eventType"], "ORDER_SHIPPED");
    assert_eq!(
        written["x-event-snapshot"]["compatibility"],
        "BACKWARD_TRANSITIVE"
    );
    assert_eq!(written["x-event-type"], "ORDER_SHIPPED");

    let report = check_registered(&events, &dir, &Upcasters::new(), Record::No);
    assert!(report.is_ok() && report.recorded.is_empty(), "{report}");
}

#[test]
fn a_breaking_change_under_the_same_version_is_caught() {
    let dir = temp_dir("same-version");
    check_registered(
        &[registered::<OrderShippedV1>(Mode::Backward)],
        &dir,
        &Upcasters::new(),
        Record::Yes,
    );
    // The code now says v1 has a required `carrier`: readers of v1 data would fail.
    let mut edited = registered::<OrderShipped>(Mode::Backward);
    edited.version = 1;
    let report = check_registered(&[edited], &dir, &Upcasters::new(), Record::No);
    assert!(
        matches!(
            &report.problems[..],
            [Problem::ChangedUnderSameVersion { version: 1, .. }]
        ),
        "{report}"
    );
    assert!(report.to_string().contains("bump the version"), "{report}");
}

#[test]
fn a_new_version_must_keep_its_mode_unless_an_upcaster_covers_it() {
    let dir = temp_dir("new-version");
    check_registered(
        &[registered::<OrderShippedV1>(Mode::BackwardTransitive)],
        &dir,
        &Upcasters::new(),
        Record::Yes,
    );
    let events = [registered::<OrderShipped>(Mode::BackwardTransitive)];

    let report = check_registered(&events, &dir, &Upcasters::new(), Record::Yes);
    assert!(
        matches!(
            &report.problems[..],
            [Problem::BreaksEarlierVersion {
                version: 2,
                earlier: 1,
                ..
            }]
        ),
        "{report}"
    );
    assert!(
        report
            .to_string()
            .contains("REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL"),
        "{report}"
    );
    assert!(report.to_string().contains("register_upcaster"), "{report}");

    let upcasters = Upcasters::new().with::<OrderShipped>().unwrap();
    let report = check_registered(&events, &dir, &upcasters, Record::No);
    assert!(report.is_ok(), "{report}");
}

#[test]
fn two_types_cannot_claim_one_version() {
    let mut twin = registered::<OrderShipped>(Mode::Backward);
    twin.rust_type = "other::OrderShipped".into();
    let events = [registered::<OrderShipped>(Mode::Backward), twin];
    let report = check_registered(&events, &temp_dir("dup"), &Upcasters::new(), Record::No);
    assert!(
        report
            .problems
            .iter()
            .any(|p| matches!(p, Problem::Duplicate { version: 2, .. })),
        "{report}"
    );
}

#[test]
fn an_unreadable_snapshot_is_reported() {
    let dir = temp_dir("unreadable");
    std::fs::create_dir_all(dir.join("ORDER_SHIPPED")).unwrap();
    std::fs::write(snapshot_path(&dir, "ORDER_SHIPPED", 1), "{ not json").unwrap();
    let report = check_registered(
        &[registered::<OrderShippedV1>(Mode::Backward)],
        &dir,
        &Upcasters::new(),
        Record::No,
    );
    assert!(report.to_string().contains("not JSON"), "{report}");
}

/// The one line an application puts in its test suite, against the snapshots committed in
/// `event-core/tests/schemas` for the events of this file.
#[test]
fn every_event_in_this_program_matches_its_committed_snapshots() {
    event_core::schema::assert_snapshots("tests/schemas");
    let stored: event_core::EventEnvelope = serde_json::from_value(serde_json::json!({
        "eventId": "ORDER_SHIPPED:o-1", "eventType": "ORDER_SHIPPED", "eventVersion": 1,
        "aggregateType": "ORDER", "aggregateId": "o-1", "aggregateSequence": 3,
        "occurredAt": "2026-01-01T00:00:00Z", "traceId": null, "headers": {},
        "payload": {"order_id": "o-1"}
    }))
    .unwrap();
    let shipped: OrderShipped = Upcasters::registered().decode(&stored).unwrap();
    assert_eq!(shipped.carrier, "unknown");
    let missing = Upcasters::new()
        .decode::<OrderShipped>(&stored)
        .unwrap_err();
    assert!(
        missing
            .to_string()
            .contains("no upcaster from ORDER_SHIPPED v1 to v2"),
        "{missing}"
    );
}
