//! `eventctl outbox archive` killed mid-run (SIGKILL, a real process) and started again: every
//! row ends in exactly one of the live and archive tables, on every backend.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use event_sqlx::{ChannelPublisher, RelayConfig};
use event_tests::db::{Orders, TestDb};
use event_tests::fixtures::{Order, commit_orders};

const EVENTS: usize = 1500;
const ARCHIVED: &str = "SELECT COUNT(*) FROM biz_outbox_event_archive";
const LIVE: &str = "SELECT COUNT(*) FROM biz_outbox_event";
const DISTINCT: &str = "SELECT COUNT(*) FROM (SELECT event_no FROM biz_outbox_event \
     UNION SELECT event_no FROM biz_outbox_event_archive) u";

async fn a_killed_archive_run_finishes_when_started_again<DB: Orders>(db: &TestDb<DB>) {
    commit_orders(
        &db.outbox,
        (0..EVENTS).map(|i| Order::place(&format!("o-{i}"), 1).unwrap()),
    )
    .await;
    let (publisher, _received) = ChannelPublisher::channel(EVENTS);
    let published = db
        .outbox
        .relay(publisher, RelayConfig::new("r").batch_size(500))
        .drain()
        .await
        .unwrap()
        .published;
    assert_eq!(published, EVENTS);

    let archive = |batch: &str| {
        Command::new(env!("CARGO_BIN_EXE_eventctl"))
            .args(["outbox", "archive", "--database-url", &db.url])
            .args(["--older-than", "0s", "--batch", batch])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    // Batches of two: the run takes a while, and the kill lands between or inside batches.
    let mut victim = archive("2");
    let started = Instant::now();
    loop {
        let archived = DB::count(db.pool(), ARCHIVED).await.unwrap();
        if archived >= 20 {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) || victim.try_wait().unwrap().is_some() {
            let _ = victim.kill();
            let _ = victim.wait();
            panic!(
                "the archive run never got going, or finished before the kill ({archived} archived)"
            );
        }
        // Polling the other process, with the deadline above.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    victim.kill().unwrap();
    victim.wait().unwrap();

    let (live, archived) = (
        DB::count(db.pool(), LIVE).await.unwrap(),
        DB::count(db.pool(), ARCHIVED).await.unwrap(),
    );
    assert!(
        live > 0 && archived > 0,
        "killed mid-run: {live} live, {archived} archived"
    );
    assert_eq!(
        live + archived,
        EVENTS as i64,
        "each row in exactly one table"
    );
    assert_eq!(DB::count(db.pool(), DISTINCT).await.unwrap(), EVENTS as i64);

    let status = archive("500").wait().unwrap();
    assert!(status.success());
    assert_eq!(DB::count(db.pool(), ARCHIVED).await.unwrap(), EVENTS as i64);
    assert_eq!(DB::count(db.pool(), LIVE).await.unwrap(), 0);
    assert_eq!(DB::count(db.pool(), DISTINCT).await.unwrap(), EVENTS as i64);
}

event_tests::on_every_backend!(multi_thread: a_killed_archive_run_finishes_when_started_again);
