//! The operators' reads and the audit trail on PostgreSQL, MySQL/MariaDB and SQLite: the
//! keyset search under each filter and across pages, the live counts, failures per type and
//! topic, the per-minute series, who consumed an event, and audit entries newest first.

// A panic is how a test fails.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;

use chrono::{TimeDelta, Utc};
use event_sqlx::{
    AuditLog, Backend, ChannelPublisher, EventStatus, Inbox, NewAuditEntry, OutboxSearch,
    RelayConfig,
};
use event_tests::db::TestDb;
use event_tests::fixtures::{Order, Refusing, commit_orders};

async fn operators_read_what_happened<DB: Backend>(db: TestDb<DB>) {
    commit_orders(
        &db.outbox,
        (1..=3).map(|i| Order::paid(&format!("o-{i}"), 100)),
    )
    .await;
    let (channel, mut received) = ChannelPublisher::channel(100);
    db.outbox
        .relay(Refusing::new(channel, &["o-1"]), RelayConfig::new("relay"))
        .drain()
        .await
        .unwrap();
    received.close();
    let o1 = db.outbox.by_aggregate("ORDER", "o-1").await.unwrap();
    let (placed_1, paid_1) = (o1[0].event_no.clone(), o1[1].event_no.clone());

    // Search under each filter.
    let search = |s: OutboxSearch<'static>| s;
    let found = db
        .outbox
        .search(
            &search(OutboxSearch::default()).event_no(leak(&placed_1)),
            10,
        )
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].event_no, placed_1);
    let found = db
        .outbox
        .search(&OutboxSearch::default().aggregate("ORDER", "o-1"), 10)
        .await
        .unwrap();
    let numbers: Vec<&str> = found.iter().map(|r| r.event_no.as_str()).collect();
    assert_eq!(
        numbers,
        vec![paid_1.as_str(), placed_1.as_str()],
        "newest first"
    );
    let failed = db
        .outbox
        .search(&OutboxSearch::default().status(EventStatus::Failed), 10)
        .await
        .unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].event_no, placed_1);
    let paid = db
        .outbox
        .search(&OutboxSearch::default().event_type("ORDER_PAID"), 10)
        .await
        .unwrap();
    assert_eq!(paid.len(), 3);
    let now = Utc::now();
    let none = db
        .outbox
        .search(
            &OutboxSearch::default().created(Some(now + TimeDelta::hours(1)), None),
            10,
        )
        .await
        .unwrap();
    assert!(none.is_empty());

    // Pages of 2 cover the 6 events once each, newest first.
    let mut seen = Vec::new();
    let mut page = OutboxSearch::default();
    loop {
        let rows = db.outbox.search(&page, 2).await.unwrap();
        if rows.is_empty() {
            break;
        }
        seen.extend(rows.iter().map(|r| (r.create_time, r.id)));
        page = page.after_row(rows.last().unwrap());
    }
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 6);
    assert!(
        seen.windows(2).all(|w| w[0] > w[1]),
        "newest first: {seen:?}"
    );

    // Counts, failures, the per-minute series.
    let since = now - TimeDelta::hours(1);
    let counts = db.outbox.live_counts(since).await.unwrap();
    assert_eq!(
        (
            counts.pending,
            counts.failed,
            counts.succeeded,
            counts.in_progress
        ),
        (1, 1, 4, 0),
        "{counts:?}"
    );
    let by_type = db.outbox.failed_counts(false, 10).await.unwrap();
    assert_eq!(by_type.len(), 1);
    assert_eq!(
        (by_type[0].key.as_str(), by_type[0].count),
        ("ORDER_PLACED", 1)
    );
    let series = db.outbox.per_minute(since).await.unwrap();
    assert_eq!(
        series.iter().map(|m| m.published).sum::<i64>(),
        4,
        "{series:?}"
    );
    assert_eq!(
        series.iter().map(|m| m.failed).sum::<i64>(),
        1,
        "{series:?}"
    );
    assert!(
        series
            .iter()
            .all(|m| m.minute >= since - TimeDelta::minutes(1) && m.minute <= Utc::now())
    );

    // Who consumed an event: two consumers (the second delivery to billing is a duplicate).
    let envelope = db
        .outbox
        .by_event_no(&paid_1)
        .await
        .unwrap()
        .unwrap()
        .envelope()
        .unwrap();
    for consumer in ["billing", "shipping", "billing"] {
        Inbox::new(db.pool().clone(), consumer)
            .handle(&envelope, async |_tx| Ok::<_, std::convert::Infallible>(()))
            .await
            .unwrap();
    }
    let other = db
        .outbox
        .by_event_no(&placed_1)
        .await
        .unwrap()
        .unwrap()
        .envelope()
        .unwrap();
    Inbox::new(db.pool().clone(), "audit-log")
        .handle(&other, async |_tx| Ok::<_, std::convert::Infallible>(()))
        .await
        .unwrap();
    let consumed = event_sqlx::consumptions(db.pool(), &paid_1).await.unwrap();
    let names: Vec<(&str, i64)> = consumed
        .iter()
        .map(|c| (c.consumer.as_str(), c.deliveries))
        .collect();
    assert_eq!(names, vec![("billing", 1), ("shipping", 1)]);
    assert!(
        event_sqlx::consumptions(db.pool(), "nothing")
            .await
            .unwrap()
            .is_empty()
    );

    // The audit trail, newest first, with long text cut to its columns.
    let audit = AuditLog::new(db.pool().clone());
    let mut ids = Vec::new();
    for (i, reason) in ["first", &"x".repeat(5000)].into_iter().enumerate() {
        let id = audit
            .record(&NewAuditEntry {
                actor: "alice".into(),
                action: "outbox.retry".into(),
                target: format!("target-{i}"),
                affected: 1,
                affected_rows: vec![placed_1.clone()],
                reason: Some(reason.to_owned()),
                outcome: "done".into(),
            })
            .await
            .unwrap();
        ids.push(id);
    }
    let entries = audit.entries(i64::MAX, 10).await.unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(
        vec![entries[1].id, entries[0].id],
        ids,
        "record returns each entry's id"
    );
    assert_eq!(entries[0].target, "target-1");
    assert_eq!(entries[0].reason.as_deref().map(str::len), Some(1000));
    assert_eq!(entries[1].affected_rows.as_deref(), Some(placed_1.as_str()));
    let older = audit.entries(entries[0].id, 10).await.unwrap();
    assert_eq!(older.len(), 1);
    assert_eq!(older[0].target, "target-0");
    // An entry written before its action is settled with what the action did.
    let rows = vec!["a".to_owned(), "b".to_owned()];
    assert!(
        audit
            .settle(ids[0], &rows, "two rows retried")
            .await
            .unwrap()
    );
    assert!(!audit.settle(ids[1] + 1000, &rows, "nothing").await.unwrap());
    let settled = audit.entries(ids[0] + 1, 1).await.unwrap();
    assert_eq!(settled[0].id, ids[0]);
    assert_eq!(
        (
            settled[0].affected,
            settled[0].affected_rows.as_deref(),
            settled[0].outcome.as_str()
        ),
        (2, Some("a,b"), "two rows retried")
    );
    db.cleanup().await;
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

#[tokio::test]
async fn postgres() {
    if let Some(db) = TestDb::postgres().await {
        operators_read_what_happened(db).await;
    }
}

#[tokio::test]
async fn mysql() {
    if let Some(db) = TestDb::mysql().await {
        operators_read_what_happened(db).await;
    }
}

#[tokio::test]
async fn sqlite() {
    operators_read_what_happened(TestDb::sqlite().await.unwrap()).await;
}
