//! A relay process killed mid-batch (SIGKILL, a real process) leaves leases that expire; another
//! relay recovers them and publishes every event: none is lost. On every backend.

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use event_core::{EventContext, UnitOfWork};
use event_sqlx::{ChannelPublisher, ManualClock, RelayConfig};
use event_tests::db::{Orders, TestDb};
use event_tests::fixtures::Order;

const ORDERS: usize = 150;
const EVENTS: usize = ORDERS * 2;

fn published_ids(path: &Path) -> HashSet<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        // A line cut short by the kill was never acknowledged; the event is still in progress.
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|v| v["eventId"].as_str().map(str::to_owned))
        .collect()
}

async fn killed_relay_loses_nothing<DB: Orders>(db: &TestDb<DB>) {
    let tx = db.pool().begin().await.unwrap();
    let mut uow = UnitOfWork::new(EventContext::new("order-service"));
    for i in 0..ORDERS {
        let mut order = Order::place(&format!("o-{i}"), 1).unwrap();
        order.note("gift wrap");
        uow.collect(&mut order).unwrap();
    }
    let _ = db.outbox.commit(tx, uow).await.unwrap();

    let file = std::env::temp_dir().join(format!(
        "relay-kill-{}-{}.jsonl",
        std::process::id(),
        db.url.len()
    ));
    let _ = std::fs::remove_file(&file);
    let mut victim = Command::new(env!("CARGO_BIN_EXE_eventctl"))
        .args([
            "relay",
            "--database-url",
            &db.url,
            "--instance-id",
            "victim",
        ])
        .args(["--publisher", &format!("jsonl:{}", file.display())])
        .args([
            "--lease-secs",
            "2",
            "--batch-size",
            "40",
            "--max-rate",
            "200",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start eventctl relay");

    // Kill it once it has published some events and holds a lease on others.
    let started = Instant::now();
    loop {
        let counts = db.counts().await;
        if published_ids(&file).len() >= 10 && counts.in_progress > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the relay process never got going"
        );
        // Polling the other process, with the deadline above.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    victim.kill().expect("SIGKILL the relay");
    victim.wait().unwrap();

    let counts = db.counts().await;
    assert!(
        counts.in_progress > 0,
        "the killed relay left its leases behind: {counts:?}"
    );
    assert!(counts.succeeded < EVENTS as i64);
    let by_victim = published_ids(&file);

    // An operator sees which relay holds them.
    let out = Command::new(env!("CARGO_BIN_EXE_eventctl"))
        .args(["outbox", "stuck", "--database-url", &db.url, "--json"])
        .output()
        .expect("run eventctl outbox stuck");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stuck: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stuck["leases"][0]["relay"], "victim", "{stuck}");
    assert_eq!(stuck["leases"][0]["events"], counts.in_progress, "{stuck}");

    // The leases expire (the rescuer's clock is past them); another relay recovers them and
    // publishes everything that is left.
    let later = ManualClock::new(chrono::Utc::now() + chrono::TimeDelta::seconds(3));
    let (publisher, mut received) = ChannelPublisher::channel(EVENTS * 2);
    let rescuer = db.outbox.clone().with_clock(later).relay(
        publisher,
        RelayConfig::new("rescuer").lease_recovery(Duration::ZERO, Duration::ZERO),
    );
    assert!(rescuer.recover_expired_leases().await.unwrap() > 0);
    rescuer.drain().await.unwrap();

    let mut all = by_victim.clone();
    while let Ok(message) = received.try_recv() {
        all.insert(message.envelope.event_id.to_string());
    }
    assert_eq!(
        all.len(),
        EVENTS,
        "every event was published by one relay or the other"
    );
    let counts = db.counts().await;
    assert_eq!(counts.succeeded, EVENTS as i64, "{counts:?}");
    let _ = std::fs::remove_file(&file);
}

event_tests::on_every_backend!(multi_thread: killed_relay_loses_nothing);
