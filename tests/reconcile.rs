//! End-to-end reconciliation on every backend: it finds exactly the events a test withheld from
//! the consumer and the one the consumer quarantined, counts events still within the grace
//! period as in flight, and after the missing ones are republished and the quarantined one
//! requeued and replayed by the consumer, the next reconciliation is clean.

use std::collections::BTreeSet;
use std::time::Duration;

use event_sqlx::{
    ChannelPublisher, Consumer, Delivered, HandlerError, ManualClock, OutboxMessage, Processed,
    Quarantine, QuarantineFilter, QuarantineStatus, Reconcile, RelayConfig,
};
use event_tests::db::{Orders, TestDb};
use event_tests::fixtures::{Order, OrderPlaced, commit_orders};

const ORDERS: usize = 20;
const WITHHELD: [&str; 3] = ["o-1", "o-7", "o-13"];
const BROKEN: &str = "o-5";

fn body(message: &OutboxMessage) -> Vec<u8> {
    serde_json::to_vec(&message.envelope).unwrap()
}

async fn reconciliation_finds_what_was_withheld<DB: Orders>(db: &TestDb<DB>) {
    commit_orders(
        &db.outbox,
        (0..ORDERS).map(|i| Order::place(&format!("o-{i}"), 100).unwrap()),
    )
    .await;
    let (publisher, mut received) = ChannelPublisher::channel(ORDERS * 2);
    let relay = db.outbox.relay(publisher, RelayConfig::new("relay"));
    assert_eq!(relay.drain().await.unwrap().published, ORDERS);

    // The consumer's handler is broken for one order; three events never reach it.
    let billing = Consumer::new(db.pool().clone(), "billing", "1.0.0").on(
        async |_tx: &mut DB::Connection, placed: Delivered<OrderPlaced>| {
            if placed.order_id == BROKEN {
                return Err(HandlerError::Permanent("no price list for o-5".into()));
            }
            Ok(())
        },
    );
    let mut withheld = BTreeSet::new();
    let mut broken = String::new();
    while let Ok(message) = received.try_recv() {
        let aggregate = message.envelope.aggregate_id.as_str();
        if WITHHELD.contains(&aggregate) {
            withheld.insert(message.envelope.event_id.to_string());
            continue;
        }
        if aggregate == BROKEN {
            broken = message.envelope.event_id.to_string();
        }
        billing.receive(&body(&message), None).await.unwrap();
    }
    assert_eq!(withheld.len(), WITHHELD.len());

    // Just after publishing, within the grace period, the withheld events may be on their way.
    let soon = db.outbox.clone().with_clock(ManualClock::new(
        chrono::Utc::now() + chrono::TimeDelta::minutes(1),
    ));
    let options = Reconcile::consumer("billing").grace(Duration::from_secs(300));
    let report = soon.reconcile(db.pool(), &options).await.unwrap();
    assert_eq!(report.totals.published, ORDERS as u64, "{report:?}");
    assert_eq!(report.totals.in_flight, 3, "{report:?}");
    assert_eq!(report.totals.missing, 0, "{report:?}");

    // Past the grace period they are missing: exactly those, and the quarantined one.
    let later = ManualClock::new(chrono::Utc::now() + chrono::TimeDelta::minutes(10));
    let outbox = db.outbox.clone().with_clock(later);
    let report = outbox
        .reconcile(db.pool(), &options.clone().page(4))
        .await
        .unwrap();
    let missing: BTreeSet<String> = report.missing.iter().map(|e| e.event_no.clone()).collect();
    assert_eq!(missing, withheld, "{report:?}");
    assert_eq!(report.totals.missing, 3);
    assert_eq!(report.totals.consumed, (ORDERS - 4) as u64);
    assert_eq!(report.totals.quarantined, 1);
    assert_eq!(report.quarantined[0].event_no, broken);
    assert_eq!(
        report.quarantined[0].quarantine,
        Some(QuarantineStatus::Quarantined)
    );
    assert_eq!(report.per_type["ORDER_PLACED"], report.totals);
    assert!(!report.is_clean());

    // A consumer of other event types only, or a window before the events, sees none of them.
    let other = outbox
        .reconcile(db.pool(), &options.clone().event_type("ORDER_PAID"))
        .await
        .unwrap();
    assert_eq!(other.totals.published, 0);

    // Republish the missing: they reach the consumer, which applies them.
    let (publisher, mut again) = ChannelPublisher::channel(ORDERS);
    let report = outbox
        .reconcile_and_republish(db.pool(), &options, &publisher)
        .await
        .unwrap();
    let republished = report.republished.unwrap();
    assert_eq!((republished.selected, republished.accepted), (3, 3));
    let mut resent = BTreeSet::new();
    while let Ok(message) = again.try_recv() {
        assert!(
            message.is_republish(),
            "a republish has a message id of its own"
        );
        resent.insert(message.envelope.event_id.to_string());
        assert_eq!(
            billing.receive(&body(&message), None).await.unwrap(),
            Processed::Applied
        );
    }
    assert_eq!(resent, withheld);

    // The fix is deployed and the operator requeues the entry; the consumer replays it.
    let requeued = Quarantine::new(db.pool().clone())
        .requeue("billing", &QuarantineFilter::default())
        .await
        .unwrap();
    assert_eq!(requeued, 1);
    let fixed = Consumer::new(db.pool().clone(), "billing", "1.0.1")
        .on(async |_tx: &mut DB::Connection, _placed: Delivered<OrderPlaced>| Ok(()));
    assert_eq!(fixed.replay_requeued().await.unwrap(), 1);
    assert_eq!(fixed.replay_requeued().await.unwrap(), 0, "replayed once");

    let report = outbox.reconcile(db.pool(), &options).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.totals.consumed, ORDERS as u64);

    // An entry requeued for a consumer that has no handler for its type goes back to the
    // quarantine with the reason, instead of being requeued for ever.
    let strict = Consumer::new(db.pool().clone(), "audit", "1.0.0")
        .unknown_events(event_sqlx::UnknownEvents::Quarantine)
        .on(
            async |_tx: &mut DB::Connection, _paid: Delivered<event_tests::fixtures::OrderPaid>| {
                Ok(())
            },
        );
    let (publisher, mut again) = ChannelPublisher::channel(ORDERS);
    outbox
        .republish(
            &event_sqlx::Republish {
                aggregate: Some(("ORDER", "o-2")),
                ..Default::default()
            },
            &publisher,
        )
        .await
        .unwrap();
    let message = again.try_recv().unwrap();
    assert!(matches!(
        strict.receive(&body(&message), None).await.unwrap(),
        Processed::Quarantined(_)
    ));
    let quarantine = Quarantine::new(db.pool().clone());
    assert_eq!(
        quarantine
            .requeue("audit", &QuarantineFilter::default())
            .await
            .unwrap(),
        1
    );
    assert_eq!(strict.replay_requeued().await.unwrap(), 0);
    assert_eq!(strict.replay_requeued().await.unwrap(), 0);
    let entry = quarantine
        .entries(Some("audit"), None, &QuarantineFilter::default(), 0, 10)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(entry.status, QuarantineStatus::Quarantined);
    assert!(
        entry
            .reason
            .contains("has no handler for event type ORDER_PLACED"),
        "{}",
        entry.reason
    );
}

event_tests::on_every_backend!(multi_thread: reconciliation_finds_what_was_withheld);
