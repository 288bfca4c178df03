//! NATS goes down in the middle of a run and comes back: every event arrives, once, and the outage
//! spends no event's retries. The test runs
//! its own nats-server (the shared one stays up for the other tests).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use event_sqlx::{Backoff, EventStatus, NatsPublisher, Outbox, OutboxConfig, RelayConfig, Route};
use event_tests::any_broker::stream_messages;
use event_tests::db::{TestDb, services_required, unique};
use event_tests::fixtures::{Order, commit_orders};

const NATS_SERVER: &str = "/usr/sbin/nats-server";
const EVENTS: usize = 30;

fn start(port: u16, store: &std::path::Path) -> Child {
    Command::new(NATS_SERVER)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nats-server")
}

async fn wait_until_listening(port: u16) {
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        // Polling the server's start, 100 tries at the most.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("nats-server did not listen on {port}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_published_across_a_broker_outage_arrive_once() {
    if !std::path::Path::new(NATS_SERVER).exists() {
        assert!(
            !services_required(),
            "{NATS_SERVER} is needed for this test"
        );
        eprintln!("skipping: {NATS_SERVER} is not installed");
        return;
    }
    let port = event_tests::db::free_port();
    let store = std::env::temp_dir().join(unique("nats-store"));
    let mut server = start(port, &store);
    wait_until_listening(port).await;
    let url = format!("nats://127.0.0.1:{port}");
    let publisher = NatsPublisher::connect(&url)
        .await
        .unwrap()
        .ack_timeout(Duration::from_millis(500));
    publisher
        .ensure_stream("OUTAGE", vec!["outage.>".into()])
        .await
        .unwrap();

    let db = TestDb::sqlite().await.unwrap();
    let route = Route::topic("outage").routing_key("order.placed");
    let outbox = Outbox::new(
        db.pool().clone(),
        OutboxConfig::new()
            .route("ORDER_PLACED", route)
            .max_retry_count(50),
    );
    commit_orders(
        &outbox,
        (0..EVENTS).map(|i| Order::place(&format!("o-{i}"), 1).unwrap()),
    )
    .await;
    let relay = outbox.relay(
        publisher.clone(),
        RelayConfig::new("relay")
            .batch_size(10)
            .backoff(Backoff::schedule([Duration::from_millis(200)]).jitter(0.0)),
    );

    // Ten go out; then the broker dies.
    assert_eq!(relay.run_once().await.unwrap().published, 10);
    server.kill().unwrap();
    server.wait().unwrap();
    let down = relay.run_once().await.unwrap_err();
    let event_sqlx::Error::BrokerUnavailable {
        claimed,
        published,
        failed,
        deferred,
        ..
    } = &down
    else {
        panic!("a broker that is down is an outage, not a failure of the events: {down:?}");
    };
    assert_eq!(
        (*claimed, *published, *failed, *deferred),
        (10, 0, 0, 10),
        "{down:?}"
    );
    assert!(down.is_transient());
    let rows = outbox.pending(100).await.unwrap();
    assert_eq!(rows.len(), EVENTS - 10, "given back as pending: {rows:?}");
    assert!(
        rows.iter()
            .all(|r| r.retry_count == 0 && r.locked_by.is_none()),
        "the outage spent no retry and left no lease: {rows:?}"
    );
    assert!(
        outbox
            .failed_by_topic("outage", 100)
            .await
            .unwrap()
            .is_empty(),
        "nothing failed"
    );

    // The broker comes back with its stream; the relay's retries deliver the rest.
    let mut server = start(port, &store);
    wait_until_listening(port).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let counts = outbox.status_counts(None, ..).await.unwrap();
        if counts.succeeded == EVENTS as i64 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all published after the broker came back: {counts:?}"
        );
        let _ = relay.run_once().await;
        // Polling the broker's return, with the deadline above.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        stream_messages(&publisher, "OUTAGE").await,
        EVENTS as u64,
        "every event in the stream exactly once"
    );
    for i in 0..EVENTS {
        let row = outbox
            .by_aggregate("ORDER", &format!("o-{i}"))
            .await
            .unwrap()
            .remove(0);
        assert_eq!(row.publish_status, EventStatus::Succeeded);
        assert_eq!(row.retry_count, 0, "o-{i}: the outage was not counted");
    }

    server.kill().unwrap();
    server.wait().unwrap();
    let _ = std::fs::remove_dir_all(&store);
    db.cleanup().await;
}
