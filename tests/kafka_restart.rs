//! A Kafka-protocol broker restarted mid-run: Tansu with durable storage (S3, against a local
//! moto server) is killed (SIGKILL) while a relay publishes and a batched consumer group
//! consumes, then started again on the same storage. Every event is applied exactly once.
//!
//! Needs the Tansu binary (`bash .ci/kafka-broker` fetches it; `EVENT_TEST_TANSU_BIN` points at
//! another) and `moto_server` (`pip install 'moto[server]==5.2.5'`), which `.ci/run` installs.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use event_sqlx::{
    Consumer, Delivered, KafkaPublisher, KafkaSubscription, Outbox, OutboxConfig, RelayConfig,
    Route,
};
use event_tests::db::{TestDb, services_required, unique};
use event_tests::fixtures::{Order, OrderPlaced, commit_orders};
use event_tests::tansu::{self, Process};
use event_tests::wait;
use sqlx::PgConnection;

fn moto_bin() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("moto_server"))
        .find(|p| p.exists())
}

async fn listening(port: u16, what: &str) {
    wait::until(Duration::from_secs(60), async || {
        TcpStream::connect(("127.0.0.1", port))
            .map(|_| ())
            .map_err(|e| format!("{what} on {port}: {e}"))
    })
    .await;
}

fn tansu(bin: &PathBuf, port: u16, s3: u16) -> Process {
    let url = format!("tcp://127.0.0.1:{port}");
    Process(
        Command::new(bin)
            .args(["broker", "--storage-engine", "s3://tansu/"])
            .args(["--listener-url", &url, "--advertised-listener-url", &url])
            .env("AWS_ENDPOINT", format!("http://127.0.0.1:{s3}"))
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

async fn applied(db: &TestDb<sqlx::Postgres>) -> (i64, i64) {
    sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT event_id) FROM applied")
        .fetch_one(db.pool())
        .await
        .unwrap()
}

async fn place_orders(outbox: &Outbox<sqlx::Postgres>, from: usize, to: usize) {
    commit_orders(
        outbox,
        (from..to).map(|i| Order::place(&format!("o-{i}"), i as i64).unwrap()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_run_applies_every_event_once() {
    let (Some(tansu_bin), Some(moto)) = (tansu::bin(), moto_bin()) else {
        assert!(
            !services_required(),
            "needs Tansu (bash .ci/kafka-broker) and moto_server (pip install 'moto[server]==5.2.5')"
        );
        eprintln!("skipped: Tansu or moto_server is not installed");
        return;
    };
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    sqlx::raw_sql(
        "CREATE TABLE applied (pos BIGSERIAL PRIMARY KEY, aggregate_id TEXT NOT NULL, \
         event_id TEXT NOT NULL)",
    )
    .execute(db.pool())
    .await
    .unwrap();

    // S3 storage, and its bucket.
    let s3 = event_tests::db::free_port();
    let _moto = Process(
        Command::new(moto)
            .args(["-H", "127.0.0.1", "-p", &s3.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    listening(s3, "moto").await;
    let mut http = TcpStream::connect(("127.0.0.1", s3)).unwrap();
    write!(
        http,
        "PUT /tansu HTTP/1.1\r\nHost: 127.0.0.1:{s3}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    http.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let port = event_tests::db::free_port();
    let mut broker = tansu(&tansu_bin, port, s3);
    listening(port, "Tansu").await;
    let bootstrap = format!("127.0.0.1:{port}");
    let topic = unique("restart").replace('_', "-");
    let publisher = KafkaPublisher::connect(&bootstrap).await.unwrap();
    publisher.ensure_topic(&topic, 3).await.unwrap();
    let outbox = Outbox::new(
        db.pool().clone(),
        OutboxConfig::new().route("ORDER_PLACED", Route::topic(topic.clone())),
    );
    let subscription = KafkaSubscription::with_config(
        &bootstrap,
        &unique("billing"),
        &[topic.as_str()],
        &[("session.timeout.ms", "6000")],
    )
    .await
    .unwrap()
    .batch(20);
    let consumer = Consumer::new(db.pool().clone(), "billing", "1.0.0").on(
        async |tx: &mut PgConnection, placed: Delivered<OrderPlaced>| {
            sqlx::query("INSERT INTO applied (aggregate_id, event_id) VALUES ($1, $2)")
                .bind(&placed.envelope.aggregate_id)
                .bind(placed.envelope.event_id.as_str())
                .execute(&mut *tx)
                .await?;
            Ok(())
        },
    );
    let relay = outbox.relay(
        publisher,
        RelayConfig::new("relay")
            .batch_size(20)
            .lease(Duration::from_secs(120))
            .poll_interval(Duration::from_millis(50)),
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let relaying = relay.run(until_stopped(stopped.clone()));
    let consuming = subscription.run(&consumer, until_stopped(stopped.clone()));
    let scenario = async {
        place_orders(&outbox, 0, 100).await;
        wait::until(Duration::from_secs(60), async || match applied(&db).await {
            (n, _) if n >= 50 => Ok(()),
            (n, _) => Err(format!("{n} applied before the restart")),
        })
        .await;
        // The broker dies; events keep being committed; it comes back on the same storage.
        broker.0.kill().unwrap();
        broker.0.wait().unwrap();
        place_orders(&outbox, 100, 200).await;
        broker = tansu(&tansu_bin, port, s3);
        listening(port, "Tansu after the restart").await;
        wait::until(Duration::from_secs(120), async || {
            match applied(&db).await {
                (n, _) if n >= 200 => Ok(()),
                (n, _) => Err(format!("{n} of 200 applied after the restart")),
            }
        })
        .await;
        let _ = stop.send(true);
    };
    let (_, consumed, ()) = tokio::join!(relaying, consuming, scenario);
    consumed.unwrap();
    assert_eq!(
        applied(&db).await,
        (200, 200),
        "each event applied once: rows, distinct events"
    );
    drop(broker);
    db.cleanup().await;
}
