//! The seed's queries over the outbox, and republishing by filter, on every backend.

use event_sqlx::Republish;
use event_sqlx::{ChannelPublisher, EventStatus, RelayConfig};
use event_tests::db::{Orders, TestDb};
use event_tests::fixtures::place;

async fn seed_queries_answer_as_documented<DB: Orders>(db: &TestDb<DB>) {
    place(db, "o-q1", true).await;
    place(db, "o-q2", false).await;
    let pending = db.outbox.pending(10).await.unwrap();
    assert_eq!(pending.len(), 3);
    assert!(
        pending
            .windows(2)
            .all(|w| w[0].create_time <= w[1].create_time)
    );
    assert_eq!(db.outbox.pending(2).await.unwrap().len(), 2);
    assert!(db.outbox.by_event_no("nope").await.unwrap().is_none());
    let now = chrono::Utc::now();
    let hour = chrono::TimeDelta::hours(1);
    let counts = db
        .outbox
        .status_counts(Some("ORDER_PLACED"), now - hour..now + hour)
        .await
        .unwrap();
    assert_eq!((counts.pending, counts.total()), (2, 2));
    let none = db
        .outbox
        .status_counts(Some("ORDER_PLACED"), now + hour..now + hour * 2)
        .await
        .unwrap();
    assert_eq!(none.total(), 0);
    assert!(db.outbox.lease_expired(10).await.unwrap().is_empty());
    assert!(db.outbox.due_retries(10).await.unwrap().is_empty());
    assert!(
        !db.outbox
            .cancel("ORDER_PAID:o-q1", "not needed")
            .await
            .unwrap()
            || {
                let row = db
                    .outbox
                    .by_event_no("ORDER_PAID:o-q1")
                    .await
                    .unwrap()
                    .unwrap();
                row.publish_status == EventStatus::Cancelled
                    && row.fail_reason.as_deref() == Some("not needed")
            }
    );
    assert!(
        !db.outbox.cancel("ORDER_PAID:o-q1", "again").await.unwrap(),
        "cancelled only once"
    );
}

async fn published_events_can_be_sent_again_by_filter<DB: Orders>(db: &TestDb<DB>) {
    for i in 0..3 {
        place(db, &format!("o-{i}"), true).await;
    }
    let (publisher, mut received) = ChannelPublisher::channel(64);
    let relay = db.outbox.relay(publisher.clone(), RelayConfig::new("r"));
    relay.drain().await.unwrap();
    while received.try_recv().is_ok() {}

    let one = Republish::default().aggregate("ORDER", "o-1");
    let report = db.outbox.republish(&one, &publisher).await.unwrap();
    assert_eq!((report.selected, report.accepted, report.failed), (2, 2, 0));
    let ids: Vec<String> = std::iter::from_fn(|| received.try_recv().ok())
        .map(|m| m.envelope.event_id.to_string())
        .collect();
    assert_eq!(ids, vec!["ORDER_PLACED:ORDER:o-1:1", "ORDER_PAID:o-1"]);

    let paid = Republish::default().event_type("ORDER_PAID");
    assert_eq!(
        db.outbox
            .republish(&paid, &publisher)
            .await
            .unwrap()
            .accepted,
        3
    );
    while received.try_recv().is_ok() {}
    let future =
        Republish::default().created(Some(chrono::Utc::now() + chrono::TimeDelta::hours(1)), None);
    assert_eq!(
        db.outbox.republish(&future, &publisher).await.unwrap(),
        event_sqlx::RepublishReport::default()
    );
    let all = db
        .outbox
        .republish(&Republish::default(), &publisher)
        .await
        .unwrap();
    assert_eq!((all.selected, all.accepted, all.failed), (6, 6, 0));
    // The rows stay as they were.
    let row = db
        .outbox
        .by_event_no("ORDER_PAID:o-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.publish_status, EventStatus::Succeeded);
}

event_tests::on_every_backend!(
    seed_queries_answer_as_documented,
    published_events_can_be_sent_again_by_filter,
);
