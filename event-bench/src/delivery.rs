//! End to end: commit -> outbox -> relay -> broker -> consumer -> invoice, on PostgreSQL, through
//! NATS JetStream and RabbitMQ. Throughput and commit-to-consume latency, against the broker's
//! own raw publish rate (acks/confirms awaited, pipelined) measured in the same run.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use event_core::{EventContext, UnitOfWork};
use event_sqlx::{
    Consumer, Delivered, HandlerError, JetStreamSubscription, NatsPublisher, Outbox, OutboxConfig,
    Publisher, RabbitMqPublisher, RabbitMqSubscription, RelayConfig, Route, Routes,
};
use event_tests::any_broker::stream_for;
use event_tests::db::{TestDb, amqp_url, nats_url, unique};
use event_tests::fixtures::{Order, OrderPlaced};
use serde::Serialize;

#[derive(Debug, Serialize)]
struct Figures {
    broker: &'static str,
    events: usize,
    end_to_end_events_per_s: f64,
    raw_publish_per_s: f64,
    end_to_end_vs_raw_publish: f64,
    latency_p50_ms: f64,
    latency_p99_ms: f64,
}

/// The size of each raw message, about an envelope's.
const RAW_BYTES: usize = 300;

pub(crate) async fn run(events: usize) -> anyhow::Result<()> {
    let mut results = Vec::new();
    for broker in ["nats", "rabbitmq"] {
        let figures = one(broker, events)
            .await
            .with_context(|| format!("{broker} run"))?;
        eprintln!("{figures:?}");
        results.push(figures);
    }
    let report = serde_json::json!({
        "machine": crate::machine(),
        "measuredAt": Utc::now(),
        "store": "PostgreSQL",
        "results": results,
    });
    crate::write_result("benches/results/delivery.json", &report)?;
    Ok(())
}

async fn one(broker: &'static str, events: usize) -> anyhow::Result<Figures> {
    let db = TestDb::postgres()
        .await
        .context("PostgreSQL is unreachable")?;
    let pool = db.pool().clone();
    sqlx::raw_sql("CREATE TABLE invoice (order_id TEXT PRIMARY KEY, amount_minor BIGINT NOT NULL)")
        .execute(&pool)
        .await?;
    let topic = unique("bench").replace('_', "-");
    let route = Route::topic(topic.clone()).routing_key("order.placed");
    let outbox = Outbox::new(
        pool.clone(),
        OutboxConfig::new().route("ORDER_PLACED", route),
    );
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(events)));
    let handler = {
        let latencies = Arc::clone(&latencies);
        async move |tx: &mut sqlx::PgConnection,
                    placed: Delivered<OrderPlaced>|
                    -> Result<(), HandlerError> {
            sqlx::query("INSERT INTO invoice (order_id, amount_minor) VALUES ($1, $2)")
                .bind(&placed.order_id)
                .bind(placed.amount_minor)
                .execute(&mut *tx)
                .await?;
            // The order id carries its commit time, in microseconds since the epoch.
            let committed: i64 = placed
                .order_id
                .rsplit('-')
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            let latency = (Utc::now().timestamp_micros() - committed) as f64 / 1000.0;
            latencies
                .lock()
                .map_err(|e| HandlerError::Bug(e.to_string()))?
                .push(latency);
            Ok(())
        }
    };
    let consumer = Consumer::new(pool.clone(), "invoice-service", "bench").on(handler);

    let (raw_rate, consumed, elapsed) = match broker {
        "nats" => {
            let publisher = NatsPublisher::connect(&nats_url()).await?;
            let stream = stream_for(&publisher, &topic).await?;
            // Raw: the broker's own pipelined publish with acks, same message size.
            let raw_rate = crate::throughput::raw_publish(broker, events, RAW_BYTES).await?;
            let subscription = Drained::JetStream(Box::new(
                JetStreamSubscription::durable(
                    &publisher,
                    &stream,
                    "invoice-service",
                    &format!("{topic}.order.placed"),
                    Duration::from_secs(30),
                )
                .await?,
            ));
            let js = publisher.jetstream().clone();
            let (consumed, elapsed) = pipeline(&outbox, publisher, events, async || {
                subscription.drain(&consumer).await
            })
            .await?;
            js.delete_stream(&stream).await?;
            (raw_rate, consumed, elapsed)
        }
        _ => {
            let publisher = RabbitMqPublisher::connect(&amqp_url()).await?;
            publisher.declare_exchange(&topic).await?;
            let subscription = Drained::RabbitMq(Box::new(
                RabbitMqSubscription::bind(
                    &publisher,
                    &topic,
                    &format!("{topic}-invoices"),
                    "order.*",
                )
                .await?,
            ));
            // The raw messages are stored in a queue too, so both sides pay for persistence.
            let cleanup = RabbitMqPublisher::connect(&amqp_url()).await?;
            let raw_rate = crate::throughput::raw_publish(broker, events, RAW_BYTES).await?;
            let (consumed, elapsed) = pipeline(&outbox, publisher, events, async || {
                subscription.drain(&consumer).await
            })
            .await?;
            cleanup
                .channel()
                .queue_delete(
                    lapin::types::ShortString::from(format!("{topic}-invoices").as_str()),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await?;
            (raw_rate, consumed, elapsed)
        }
    };
    anyhow::ensure!(consumed == events, "consumed {consumed} of {events}");
    let mut latencies = latencies
        .lock()
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .clone();
    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
    let rate = events as f64 / elapsed.as_secs_f64();
    let figures = Figures {
        broker,
        events,
        end_to_end_events_per_s: rate,
        raw_publish_per_s: raw_rate,
        end_to_end_vs_raw_publish: rate / raw_rate,
        latency_p50_ms: percentile(0.50),
        latency_p99_ms: percentile(0.99),
    };
    db.cleanup().await;
    Ok(figures)
}

/// The subscription of one run, drained until it has been quiet for 200 ms.
enum Drained {
    JetStream(Box<JetStreamSubscription>),
    RabbitMq(Box<RabbitMqSubscription>),
}

impl Drained {
    /// How many events one drain applied.
    async fn drain<R: Routes<sqlx::Postgres>>(
        &self,
        consumer: &Consumer<sqlx::Postgres, R>,
    ) -> Result<usize, event_sqlx::Error> {
        let idle = Duration::from_millis(200);
        let report = match self {
            Drained::JetStream(s) => s.drain(consumer, idle).await?,
            Drained::RabbitMq(s) => s.drain(consumer, idle).await?,
        };
        Ok(report.applied)
    }
}

/// Commits `events` orders one transaction each while a relay publishes and `consume` drains,
/// until every event is consumed. Returns how many and how long from the first commit.
async fn pipeline<P: Publisher + 'static>(
    outbox: &Outbox<sqlx::Postgres>,
    publisher: P,
    events: usize,
    consume: impl AsyncFn() -> Result<usize, event_sqlx::Error>,
) -> anyhow::Result<(usize, Duration)>
where
    event_sqlx::Relay<sqlx::Postgres, P>: Send + Sync,
{
    let relay = outbox.relay(
        publisher,
        RelayConfig::new("bench-relay")
            .batch_size(200)
            .poll_interval(Duration::from_millis(5)),
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let relay_task = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stop_rx.await;
            })
            .await
    });
    let started = Instant::now();
    // Four producers, one transaction per event, like four request handlers.
    let producers: Vec<_> = (0..4)
        .map(|p| {
            let outbox = outbox.clone();
            tokio::spawn(async move {
                for i in (p..events).step_by(4) {
                    // The commit time travels in the order id, for the latency measurement.
                    let id = format!("o{i}-{}", Utc::now().timestamp_micros());
                    let mut order =
                        Order::place(&id, i as i64).map_err(|e| anyhow::anyhow!("{e}"))?;
                    let mut uow = UnitOfWork::new(EventContext::new("bench"));
                    uow.collect(&mut order)
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    let _ = outbox.commit(outbox.pool().begin().await?, uow).await?;
                }
                Ok::<(), anyhow::Error>(())
            })
        })
        .collect();
    let mut consumed = 0;
    let deadline = Instant::now() + Duration::from_secs(300);
    while consumed < events && Instant::now() < deadline {
        consumed += consume().await?;
    }
    let elapsed = started.elapsed();
    for producer in producers {
        producer.await??;
    }
    let _ = stop_tx.send(());
    relay_task.await?;
    Ok((consumed, elapsed))
}
