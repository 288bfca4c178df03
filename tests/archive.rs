//! Archive and retention on real PostgreSQL, MariaDB and SQLite: final rows move to the archive
//! tables in batches beside a live relay, nothing that is not final ever moves, and every row is
//! in exactly one of the two tables.

use std::time::Duration;

use event_sqlx::{ChannelPublisher, MessageEvent, MessageStore, RelayConfig};
use event_tests::db::{Orders, TestDb};
use event_tests::fixtures::{Order, Refusing, commit_orders};

const ORDERS: usize = 60;

const FINAL_LIVE: &str = "SELECT COUNT(*) FROM biz_outbox_event WHERE publish_status IN (2, 4)";
const NOT_FINAL_ARCHIVED: &str =
    "SELECT COUNT(*) FROM biz_outbox_event_archive WHERE publish_status NOT IN (2, 4)";
const LIVE: &str = "SELECT COUNT(*) FROM biz_outbox_event";
const ARCHIVED: &str = "SELECT COUNT(*) FROM biz_outbox_event_archive";
const DISTINCT: &str = "SELECT COUNT(*) FROM (SELECT event_no FROM biz_outbox_event \
     UNION SELECT event_no FROM biz_outbox_event_archive) u";

async fn archiving_beside_a_live_relay_loses_nothing<DB: Orders>(db: &TestDb<DB>)
where
    event_sqlx::Relay<DB, Refusing<ChannelPublisher>>: Send + Sync + 'static,
{
    commit_orders(
        &db.outbox,
        (0..ORDERS).map(|i| Order::paid(&format!("o-{i}"), 1)),
    )
    .await;
    let events = ORDERS * 2;
    // Three orders' events keep failing: their heads stay failed, their payments pending.
    let (inner, _received) = ChannelPublisher::channel(events * 2);
    let relay = db.outbox.relay(
        Refusing::new(inner, &["o-3", "o-30", "o-59"]),
        RelayConfig::new("live").batch_size(7),
    );
    let (stop, running) = event_tests::background::relay(relay);
    // Archive over and over while the relay publishes, until everything publishable is gone.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut moved = 0;
    while moved < (events - 6) as u64 {
        moved += db
            .outbox
            .archive(Duration::ZERO, 5, |_| {})
            .await
            .unwrap()
            .moved;
        assert!(
            DB::count(db.pool(), NOT_FINAL_ARCHIVED).await.unwrap() == 0,
            "only final rows are archived"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "moved {moved} of {}",
            events - 6
        );
        tokio::task::yield_now().await;
    }
    let _ = stop.send(());
    running.await.unwrap();

    assert_eq!(moved, (events - 6) as u64);
    assert_eq!(DB::count(db.pool(), FINAL_LIVE).await.unwrap(), 0);
    assert_eq!(DB::count(db.pool(), NOT_FINAL_ARCHIVED).await.unwrap(), 0);
    assert_eq!(
        DB::count(db.pool(), LIVE).await.unwrap(),
        6,
        "the failed heads and the payments behind them stay"
    );
    assert_eq!(
        DB::count(db.pool(), ARCHIVED).await.unwrap() + DB::count(db.pool(), LIVE).await.unwrap(),
        events as i64
    );
    assert_eq!(
        DB::count(db.pool(), DISTINCT).await.unwrap(),
        events as i64,
        "each event in exactly one table"
    );
    // The version of an aggregate whose events are all archived still counts them.
    let mut conn = db.pool().acquire().await.unwrap();
    assert_eq!(
        db.outbox
            .aggregate_version(&mut conn, "ORDER", "o-1")
            .await
            .unwrap(),
        2
    );
    drop(conn);
    // A second run finds nothing left; purging with a long retention keeps the archive.
    assert_eq!(
        db.outbox
            .archive(Duration::ZERO, 5, |_| {})
            .await
            .unwrap()
            .moved,
        0
    );
    assert_eq!(
        db.outbox
            .purge_archive(Duration::from_secs(3600), 10)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        db.outbox.purge_archive(Duration::ZERO, 10).await.unwrap(),
        (events - 6) as u64
    );
    assert_eq!(DB::count(db.pool(), ARCHIVED).await.unwrap(), 0);
}

async fn only_handled_messages_are_archived<DB: Orders>(db: &TestDb<DB>) {
    let store = MessageStore::new(db.pool().clone());
    for n in 0..6 {
        store
            .create(&MessageEvent {
                event_no: format!("MSG-{n}"),
                event_type: "SEND_RECEIPT".into(),
                biz_type: "ORDER".into(),
                biz_id: format!("o-{n}"),
                event_source: "order-service".into(),
                payload: serde_json::json!({"n": n}),
                trace_id: None,
            })
            .await
            .unwrap();
    }
    // Two succeed, one is in progress, one failed, two stay pending.
    for n in 0..4 {
        let record = store
            .by_event_no(&format!("MSG-{n}"))
            .await
            .unwrap()
            .unwrap();
        assert!(store.claim(&record).await.unwrap());
        match n {
            0 | 1 => assert!(store.succeed(record.id).await.unwrap()),
            2 => {}
            _ => assert!(
                store
                    .fail(record.id, "mailbox full", Duration::from_secs(60))
                    .await
                    .unwrap()
            ),
        }
    }
    assert_eq!(store.archivable(Duration::ZERO).await.unwrap(), 2);
    let report = store.archive(Duration::ZERO, 1, |_| {}).await.unwrap();
    assert_eq!((report.moved, report.batches), (2, 2));
    for n in 0..6 {
        let live = store.by_event_no(&format!("MSG-{n}")).await.unwrap();
        assert_eq!(live.is_none(), n < 2, "MSG-{n}");
    }
}

event_tests::on_every_backend!(multi_thread: archiving_beside_a_live_relay_loses_nothing);
event_tests::on_every_backend!(only_handled_messages_are_archived);
