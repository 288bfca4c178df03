//! The outbox's index profiles: `migrate` with the lean profile on PostgreSQL takes the seed's
//! operational indexes off the table (the archive gets the lookups), the relay, lease recovery,
//! health and archiving still work on it, and migrating with the seed's profile restores them.
//! MySQL and SQLite refuse the lean profile with a clear error.

use std::time::Duration;

use event_core::{EventContext, UnitOfWork};
use event_sqlx::{ChannelPublisher, IndexProfile, ManualClock, Outbox, OutboxConfig, RelayConfig};
use event_tests::db::TestDb;
use event_tests::fixtures::Order;

async fn indexes(db: &TestDb<sqlx::Postgres>, table: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT indexname::text FROM pg_indexes WHERE tablename = $1 ORDER BY 1")
        .bind(table)
        .fetch_all(db.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn the_lean_profile_keeps_four_indexes_on_the_insert_and_switches_back() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let seed = indexes(&db, "biz_outbox_event").await;
    assert!(seed.contains(&"outbox_idx_trace_id".to_owned()), "{seed:?}");

    let clock = ManualClock::starting_now();
    let lean = Outbox::new(
        db.pool().clone(),
        OutboxConfig::new()
            .index_profile(IndexProfile::Lean)
            .clock(clock.clone()),
    );
    lean.migrate().await.unwrap();
    lean.migrate().await.unwrap(); // idempotent
    let on_table = indexes(&db, "biz_outbox_event").await;
    for gone in [
        "outbox_idx_trace_id",
        "outbox_idx_event_type_create_time",
        "outbox_idx_topic_create_time",
        "outbox_idx_aggregate",
        "outbox_idx_create_time",
        "outbox_idx_status_retry_time",
        "outbox_idx_status_lock_until",
        "outbox_idx_status_update_time",
        "outbox_idx_unpublished_aggregate",
    ] {
        assert!(
            !on_table.contains(&gone.to_owned()),
            "{gone} in {on_table:?}"
        );
    }
    for kept in [
        "biz_outbox_event_pkey",
        "outbox_uk_event_no",
        "outbox_uk_aggregate_sequence",
        "outbox_idx_claimable",
        "outbox_lean_idx_in_progress",
        "outbox_lean_idx_failed_retry",
        "outbox_lean_idx_final_update_time",
    ] {
        assert!(
            on_table.contains(&kept.to_owned()),
            "{kept} not in {on_table:?}"
        );
    }
    let archive = indexes(&db, "biz_outbox_event_archive").await;
    assert!(
        archive.contains(&"outbox_archive_idx_trace_id".to_owned()),
        "{archive:?}"
    );

    // The toolkit's own work on the lean table: commit, relay, health, archive.
    let mut uow = UnitOfWork::new(EventContext::new("order-service"));
    for i in 0..30 {
        uow.collect(&mut Order::place(&format!("o-{i}"), i).unwrap())
            .unwrap();
    }
    let _ = lean
        .commit(db.pool().begin().await.unwrap(), uow)
        .await
        .unwrap();
    assert_eq!(lean.health().await.unwrap().pending, 30);
    let (publisher, mut received) = ChannelPublisher::channel(100);
    let report = lean
        .relay(publisher, RelayConfig::new("relay").batch_size(7))
        .drain()
        .await
        .unwrap();
    assert_eq!(report.published, 30);
    let mut seen = 0;
    while received.try_recv().is_ok() {
        seen += 1;
    }
    assert_eq!(seen, 30);
    assert_eq!(lean.health().await.unwrap().pending, 0);
    clock.advance(Duration::from_secs(3600));
    let archived = lean
        .archive(Duration::from_secs(60), 10, |_| {})
        .await
        .unwrap();
    assert_eq!(archived.moved, 30, "{archived:?}");

    // Back to the seed's profile.
    db.outbox.migrate().await.unwrap();
    let restored = indexes(&db, "biz_outbox_event").await;
    assert_eq!(restored, seed);
    db.cleanup().await;
}

#[tokio::test]
async fn the_lean_profile_is_refused_where_it_does_not_exist() {
    if let Some(db) = TestDb::mysql().await {
        let lean = Outbox::new(
            db.pool().clone(),
            OutboxConfig::new().index_profile(IndexProfile::Lean),
        );
        let error = lean.migrate().await.unwrap_err().to_string();
        assert!(error.contains("PostgreSQL only"), "{error}");
        db.cleanup().await;
    }
    let db = TestDb::sqlite().await.unwrap();
    let lean = Outbox::new(
        db.pool().clone(),
        OutboxConfig::new().index_profile(IndexProfile::Lean),
    );
    let error = lean.migrate().await.unwrap_err().to_string();
    assert!(error.contains("IndexProfile::Seed"), "{error}");
    db.cleanup().await;
}
