//! The seed's message event table on real PostgreSQL, MariaDB and SQLite.

use std::time::Duration;

use event_sqlx::{EventStatus, ManualClock, MessageEvent, MessageStore};
use event_tests::db::{Orders, TestDb};
use serde_json::json;

fn message(no: &str, biz_id: &str) -> MessageEvent {
    MessageEvent {
        event_no: no.into(),
        event_type: "ORDER_CREATED".into(),
        biz_type: "ORDER".into(),
        biz_id: biz_id.into(),
        event_source: "order-service".into(),
        payload: json!({"orderId": biz_id, "orderAmount": 199.0}),
        trace_id: Some("trace-1".into()),
    }
}

async fn messages_follow_the_seed_cycle<DB: Orders>(db: &TestDb<DB>) {
    let clock = ManualClock::starting_now();
    let store = MessageStore::new(db.pool().clone()).clock(clock.clone());
    assert!(store.create(&message("EVT1", "ORDER1")).await.unwrap());
    let mut again = message("EVT1", "ORDER1");
    again.payload = json!({"overwritten": true});
    assert!(
        !store.create(&again).await.unwrap(),
        "the second create is a no-op"
    );
    assert!(store.create(&message("EVT2", "ORDER1")).await.unwrap());

    let first = store.by_event_no("EVT1").await.unwrap().unwrap();
    assert_eq!(
        first.event_payload["orderId"], "ORDER1",
        "a duplicate never overwrites"
    );
    assert_eq!(
        (first.event_status, first.retry_count, first.max_retry_count),
        (EventStatus::Pending, 0, 3)
    );
    let pending = store.pending(10).await.unwrap();
    assert_eq!(
        pending
            .iter()
            .map(|m| m.event_no.as_str())
            .collect::<Vec<_>>(),
        vec!["EVT1", "EVT2"]
    );
    assert_eq!(store.by_biz("ORDER", "ORDER1").await.unwrap().len(), 2);

    // Two workers read the same row; only one claim wins.
    assert!(store.claim(&first).await.unwrap());
    assert!(
        !store.claim(&first).await.unwrap(),
        "the second claim finds it taken"
    );
    // Only an in-progress message can succeed.
    let second = store.by_event_no("EVT2").await.unwrap().unwrap();
    assert!(!store.succeed(second.id).await.unwrap());
    assert!(store.succeed(first.id).await.unwrap());
    let done = store.by_event_no("EVT1").await.unwrap().unwrap();
    assert_eq!(done.event_status, EventStatus::Succeeded);
    assert!(done.success_time.is_some() && done.last_handle_time.is_some());
    assert_eq!(done.version, 1);

    // Fail until the retries are used up, then cancel.
    for attempt in 1..=3 {
        let current = store.by_event_no("EVT2").await.unwrap().unwrap();
        assert!(store.claim(&current).await.unwrap(), "attempt {attempt}");
        assert!(
            store
                .fail(current.id, "inventory service timed out", Duration::ZERO)
                .await
                .unwrap()
        );
    }
    let exhausted = store.by_event_no("EVT2").await.unwrap().unwrap();
    assert_eq!(
        (exhausted.event_status, exhausted.retry_count),
        (EventStatus::Failed, 3)
    );
    assert!(
        store.due_retries(10).await.unwrap().is_empty(),
        "no retries left"
    );
    assert_eq!(store.many_failures(3, 10).await.unwrap().len(), 1);
    assert!(
        store.claim(&exhausted).await.unwrap(),
        "an operator may still claim it by hand"
    );
    assert!(
        !store
            .fail(exhausted.id, "again", Duration::ZERO)
            .await
            .unwrap(),
        "past max retries the fail write does not apply"
    );
    // EVT1 succeeded; EVT2 is in progress after the operator's claim.
    let counts = store
        .status_counts(Some("ORDER_CREATED"), ..)
        .await
        .unwrap();
    assert_eq!((counts.succeeded, counts.in_progress), (1, 1));

    assert!(store.create(&message("EVT3", "ORDER2")).await.unwrap());
    let third = store.by_event_no("EVT3").await.unwrap().unwrap();
    assert!(store.claim(&third).await.unwrap());
    assert!(
        store
            .fail(third.id, "timeout", Duration::from_secs(60))
            .await
            .unwrap()
    );
    clock.advance(Duration::from_secs(59));
    assert!(
        store.due_retries(10).await.unwrap().is_empty(),
        "not due yet"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(store.due_retries(10).await.unwrap().len(), 1);
    let store = store.max_retry_count(1);
    assert!(store.create(&message("EVT4", "ORDER3")).await.unwrap());
    let fourth = store.by_event_no("EVT4").await.unwrap().unwrap();
    assert!(store.claim(&fourth).await.unwrap());
    assert!(
        store
            .fail(fourth.id, "timeout", Duration::ZERO)
            .await
            .unwrap()
    );
    assert!(
        store
            .cancel_exhausted(fourth.id, "exceeded the maximum retry count")
            .await
            .unwrap()
    );
    let cancelled = store.by_event_no("EVT4").await.unwrap().unwrap();
    assert_eq!(cancelled.event_status, EventStatus::Cancelled);
    assert!(
        !store.cancel_exhausted(third.id, "x").await.unwrap(),
        "retries left: not cancelled"
    );
}

event_tests::on_every_backend!(messages_follow_the_seed_cycle);
