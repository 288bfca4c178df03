//! The test kit's harness: time for `Harness::settle` to carry a committed backlog through the
//! real outbox, relay and one consumer, on SQLite in memory (the kit's default) against the same
//! events through the same code on SQLite in a file, measured in the same run
//! (benches/results/settle.json).

use std::time::Instant;

use anyhow::Context;
use event_core::UnitOfWork;
use event_sqlx::{Backend, Consumer, Delivered, OutboxConfig};
use event_test::Harness;
use event_tests::fixtures::{Order, OrderPlaced};
use sqlx::sqlite::SqlitePoolOptions;

/// Commits `events` placed orders, 100 per transaction.
async fn commit<DB: Backend>(h: &Harness<DB>, events: usize) -> anyhow::Result<()> {
    for start in (0..events).step_by(100) {
        let mut uow = UnitOfWork::new(h.context("bench"));
        for i in start..(start + 100).min(events) {
            let mut order = Order::place(&format!("o-{i}"), 1)?;
            uow.collect(&mut order)?;
        }
        let _ = h.outbox().commit(h.pool().begin().await?, uow).await?;
    }
    Ok(())
}

/// Seconds for `settle()` over `events` on `h`, with one consumer that writes a row per event.
async fn settle(mut h: Harness<sqlx::Sqlite>, events: usize) -> anyhow::Result<f64> {
    sqlx::query("CREATE TABLE effect (order_id TEXT NOT NULL)")
        .execute(h.pool())
        .await?;
    h.consumer(Consumer::new(h.pool().clone(), "bench", "1").on(
        async |tx: &mut sqlx::SqliteConnection, placed: Delivered<OrderPlaced>| {
            sqlx::query("INSERT INTO effect (order_id) VALUES (?)")
                .bind(&placed.order_id)
                .execute(&mut *tx)
                .await?;
            Ok(())
        },
    ));
    h.deadline(std::time::Duration::from_secs(600));
    commit(&h, events).await?;
    let started = Instant::now();
    let settled = h.settle().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        settled.published == events,
        "published {} of {events}",
        settled.published
    );
    let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM effect")
        .fetch_one(h.pool())
        .await?;
    anyhow::ensure!(
        effects as usize == events,
        "{effects} effects for {events} events"
    );
    Ok(seconds)
}

pub(crate) async fn run(sizes: &[usize]) -> anyhow::Result<()> {
    let mut results = Vec::new();
    for &events in sizes {
        let memory = settle(Harness::new().await?, events).await?;
        let path = std::env::temp_dir().join(format!(
            "event-bench-settle-{}-{events}.db",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .context("an SQLite file")?;
        let file = settle(Harness::with_pool(pool, OutboxConfig::new()).await?, events).await?;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        println!(
            "settle {events:>6} events: in memory {memory:7.3} s ({:>7.0} events/s), SQLite file {file:7.3} s ({:>7.0} events/s), file / memory {:.2}",
            events as f64 / memory,
            events as f64 / file,
            file / memory
        );
        results.push(serde_json::json!({
            "events": events,
            "memorySeconds": memory,
            "memoryEventsPerSecond": events as f64 / memory,
            "fileSeconds": file,
            "fileEventsPerSecond": events as f64 / file,
            "fileOverMemory": file / memory,
        }));
    }
    let report = serde_json::json!({
        "machine": crate::machine(),
        "measuredAt": chrono::Utc::now(),
        "what": "Harness::settle over a committed backlog: real outbox, relay and one consumer with a row per event, MemoryBroker",
        "results": results,
    });
    crate::write_result("benches/results/settle.json", &report)?;
    Ok(())
}
