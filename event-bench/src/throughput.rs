//! Batched consumers end to end on PostgreSQL, per broker (benches/results/throughput.json):
//!
//! - backlog: the time to move a committed backlog from the outbox into the consumer's table
//!   (relays and a batched subscription running), per consumer batch size, against the
//!   database's raw multi-row INSERT rate and the broker's raw publish rate, both measured in
//!   the same run;
//! - latency: commit-to-consume p50/p99 at a fixed moderate rate (two paced producers, one event per
//!   transaction) and at saturation (four producers as fast as they go), after one untimed
//!   event has gone through the whole path, with the median time to each stage (claimed,
//!   marked published, consumed) from the outbox's and the inbox's timestamps.
//!
//! Every run reports its CPU seconds per 1,000 events (`cpu`) and PostgreSQL's write-ahead log
//! per event (`wal`), and each baseline its own.
//!
//! Each run starts with a `CHECKPOINT`, so that the server does not flush an earlier run's
//! writes during it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use event_core::{EventContext, UnitOfWork};
use event_sqlx::{
    CommitPath, Consumer, Delivered, HandlerError, IndexProfile, JetStreamSubscription,
    KafkaPublisher, KafkaSubscription, NatsPublisher, Outbox, OutboxConfig, RabbitMqPublisher,
    RabbitMqSubscription, RelayConfig, Route, Routes,
};
use event_tests::any_broker::stream_for;
use event_tests::any_broker::{AnyPublisher, AnySubscription};
use event_tests::db::{TestDb, amqp_url, kafka_url, nats_url, unique};
use event_tests::fixtures::{Order, OrderPlaced};
use serde::Serialize;

use crate::backlog::{commit_backlog, until_applied};
use sqlx::{PgConnection, Postgres};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Backlog {
    broker: &'static str,
    consumer_batch: usize,
    /// `per event` (`Consumer::on`, one INSERT per event) or `batch` (`Consumer::on_batch`, one
    /// multi-row INSERT per batch).
    handler: &'static str,
    events: usize,
    end_to_end_events_per_s: f64,
    raw_publish_per_s: f64,
    raw_multi_row_insert_per_s: f64,
    vs_raw_publish: f64,
    vs_raw_insert: f64,
    /// CPU seconds per 1,000 events moved, by process group (see `cpu`).
    cpu_s_per_1000_events: crate::cpu::PerThousand,
    /// PostgreSQL's write-ahead log per event moved (see `wal`).
    #[serde(skip_serializing_if = "Option::is_none")]
    wal_per_event: Option<crate::wal::PerEvent>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Latency {
    broker: &'static str,
    load: String,
    consumer_batch: usize,
    /// `per event` (`Consumer::on`, one transaction per event) or `batch` (`Consumer::on_batch`,
    /// one transaction per fetched batch).
    handler: &'static str,
    events: usize,
    events_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Medians from the event's creation, from the outbox's and the inbox's timestamps: claimed
    /// by a relay, marked published (after the broker's ack), recorded in the consumer's inbox.
    stages_p50_ms: Stages,
    stages_max_ms: StagesMax,
    /// Events per relay claim that found any (the claims told apart by their claim time).
    events_per_claim: f64,
    /// Events per consumer transaction (told apart by the inbox rows' consumed time, which a
    /// batch's rows share).
    events_per_consumer_transaction: f64,
    /// CPU seconds per 1,000 events, committing included, by process group (see `cpu`).
    cpu_s_per_1000_events: crate::cpu::PerThousand,
    /// PostgreSQL's write-ahead log per event, committing included (see `wal`).
    #[serde(skip_serializing_if = "Option::is_none")]
    wal_per_event: Option<crate::wal::PerEvent>,
    /// At saturation: the same producers' transactions without the toolkit (one row of the
    /// order's size into a plain table, one transaction each) on the same database just before,
    /// and the end-to-end rate against it.
    #[serde(skip_serializing_if = "Option::is_none")]
    raw_transactions_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_raw_transactions: Option<f64>,
    /// At saturation: the same producers committing the same events through `Outbox::commit`
    /// with no relay or consumer running, on a fresh database of its own just before: what the
    /// producers' side alone allows, and the end-to-end rate against it.
    #[serde(skip_serializing_if = "Option::is_none")]
    outbox_transactions_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_outbox_transactions: Option<f64>,
    /// CPU seconds per 1,000 transactions of each of the two baselines above.
    #[serde(skip_serializing_if = "Option::is_none")]
    raw_transactions_cpu: Option<crate::cpu::PerThousand>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outbox_transactions_cpu: Option<crate::cpu::PerThousand>,
    /// The write-ahead log per transaction of each of the two baselines above.
    #[serde(skip_serializing_if = "Option::is_none")]
    raw_transactions_wal: Option<crate::wal::PerEvent>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outbox_transactions_wal: Option<crate::wal::PerEvent>,
}

#[derive(Debug, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
struct Stages {
    claimed: f64,
    marked_published: f64,
    consumed: f64,
    /// Reported beside the stages, in [`Latency::events_per_consumer_transaction`].
    #[serde(skip)]
    events_per_consumer_transaction: f64,
}

/// The longest any event waited from its creation for each stage.
#[derive(Debug, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
struct StagesMax {
    claimed: f64,
    marked_published: f64,
    /// Reported beside the stages, in [`Latency::events_per_claim`].
    #[serde(skip)]
    events_per_claim: f64,
}

/// The consumer's batch size in the latency runs.
const LATENCY_BATCH: usize = 50;

/// Whether the relays' claims and marks wait for the disk (`--relay-synchronous-commit`).
pub(crate) static RELAY_SYNCHRONOUS_COMMIT: AtomicBool = AtomicBool::new(false);

/// The relays' linger in milliseconds (`--relay-linger-ms`).
pub(crate) static RELAY_LINGER_MS: AtomicU64 = AtomicU64::new(0);

/// The consumers' `Consumer::concurrency` (`--consumer-concurrency`).
pub(crate) static CONSUMER_CONCURRENCY: AtomicU64 = AtomicU64::new(1);

/// How `Outbox::commit` sends the producers' events (`--commit-path`; `Auto` when unset).
pub(crate) static COMMIT_PATH: std::sync::OnceLock<CommitPath> = std::sync::OnceLock::new();

/// The outbox settings of every run: `profile`, `--commit-path`, and orders routed to `topic`.
fn outbox_config(profile: IndexProfile, topic: String) -> OutboxConfig {
    OutboxConfig::new()
        .index_profile(profile)
        .commit_path(COMMIT_PATH.get().copied().unwrap_or_default())
        .route(
            "ORDER_PLACED",
            Route::topic(topic).routing_key("order.placed"),
        )
}

/// Which runs of the throughput benchmark to make.
#[derive(Debug, Clone)]
pub(crate) struct Runs {
    /// The committed backlogs, drained end to end.
    pub(crate) backlog: bool,
    /// Commit to consume at 500 events/s and at saturation.
    pub(crate) latency: bool,
    /// The producer counts of the saturation runs.
    pub(crate) saturating_producers: Vec<usize>,
}

pub(crate) async fn run(
    events: usize,
    brokers: &str,
    runs_wanted: Runs,
    profile: IndexProfile,
) -> anyhow::Result<()> {
    let mut backlog = Vec::new();
    let mut latency = Vec::new();
    for broker in ["nats", "rabbitmq", "kafka"] {
        if brokers != "all" && !brokers.split(',').any(|b| b == broker) {
            continue;
        }
        let raw = raw_publish(broker, 20_000, 400)
            .await
            .with_context(|| format!("{broker} raw"))?;
        let runs: &[(usize, bool)] = if broker == "nats" {
            &[
                (1, false),
                (50, false),
                (500, false),
                (50, true),
                (500, true),
            ]
        } else {
            &[(500, false), (500, true)]
        };
        for &(batch, slice) in runs.iter().filter(|_| runs_wanted.backlog) {
            // One transaction per event is two orders of magnitude slower: a tenth of the backlog.
            let n = if batch == 1 { events / 10 } else { events };
            let figures = drain_backlog(broker, batch, slice, n, raw, profile)
                .await
                .with_context(|| format!("{broker} backlog, batch {batch}"))?;
            eprintln!("{figures:?}");
            backlog.push(figures);
        }
        if !runs_wanted.latency {
            continue;
        }
        let figures = latency_run(broker, 2, Some(500.0), false, 5_000, profile)
            .await
            .with_context(|| format!("{broker} at 500/s"))?;
        eprintln!("{figures:?}");
        latency.push(figures);
        // Each producer count with both handlers: one consumer transaction per event costs
        // about what one producer transaction costs, one per fetched batch does not.
        for &producers in &runs_wanted.saturating_producers {
            for slice in [false, true] {
                let handler = if slice { "batch" } else { "per event" };
                let figures = latency_run(broker, producers, None, slice, 20_000, profile)
                    .await
                    .with_context(|| {
                        format!("{broker} saturated by {producers} producers, {handler} handler")
                    })?;
                eprintln!("{figures:?}");
                latency.push(figures);
            }
        }
    }
    let current_thread = tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::CurrentThread;
    let report = serde_json::json!({
        "machine": crate::machine(),
        "measuredAt": Utc::now(),
        "store": "PostgreSQL",
        "indexProfile": format!("{profile:?}"),
        "relaySynchronousCommit": RELAY_SYNCHRONOUS_COMMIT.load(Ordering::Relaxed),
        "relayLingerMs": RELAY_LINGER_MS.load(Ordering::Relaxed),
        "consumerConcurrency": CONSUMER_CONCURRENCY.load(Ordering::Relaxed),
        "commitPath": format!("{:?}", COMMIT_PATH.get().copied().unwrap_or_default()),
        "runtime": if current_thread { "current thread" } else { "multi-thread" },
        "note": "one run; each ratio is against a baseline measured in the same run on the same services",
        "backlog": backlog,
        "latency": latency,
    });
    let file = match profile {
        IndexProfile::Lean => "benches/results/throughput-lean",
        _ => "benches/results/throughput",
    };
    let sync = if RELAY_SYNCHRONOUS_COMMIT.load(Ordering::Relaxed) {
        "-sync"
    } else {
        ""
    };
    let runtime = if current_thread {
        "-current-thread"
    } else {
        ""
    };
    crate::write_result(format!("{file}{sync}{runtime}.json"), &report)?;
    Ok(())
}

/// A database with the consumer's table, an outbox routing orders to `topic`, a publisher and
/// a subscription with `batch`.
pub(crate) struct Setup {
    pub(crate) db: TestDb<Postgres>,
    pub(crate) outbox: Outbox<Postgres>,
    pub(crate) publisher: AnyPublisher,
    pub(crate) subscription: AnySubscription,
}

pub(crate) async fn setup(
    broker: &str,
    batch: usize,
    profile: IndexProfile,
) -> anyhow::Result<Setup> {
    let db = TestDb::postgres()
        .await
        .context("PostgreSQL is unreachable")?;
    sqlx::raw_sql("CREATE TABLE invoice (order_id TEXT PRIMARY KEY, amount_minor BIGINT NOT NULL)")
        .execute(db.pool())
        .await?;
    // The server flushes what earlier runs wrote (a backlog run writes each of 100,000 events
    // several times) now, not during this run.
    if let Err(e) = sqlx::raw_sql("CHECKPOINT").execute(db.pool()).await {
        eprintln!(
            "could not CHECKPOINT before the run ({e}); earlier runs' writes may be flushed during it"
        );
    }
    let topic = unique("tp").replace('_', "-");
    let outbox = Outbox::new(db.pool().clone(), outbox_config(profile, topic.clone()));
    if profile != IndexProfile::Seed {
        outbox.migrate().await?;
    }
    let (publisher, subscription) = match broker {
        "nats" => {
            let publisher = NatsPublisher::connect(&nats_url()).await?;
            let stream = stream_for(&publisher, &topic).await?;
            let subscription = JetStreamSubscription::durable(
                &publisher,
                &stream,
                "invoice-service",
                &format!("{topic}.>"),
                Duration::from_secs(30),
            )
            .await?
            .batch(batch);
            (
                AnyPublisher::Nats(publisher),
                AnySubscription::Nats(subscription),
            )
        }
        "rabbitmq" => {
            let publisher = RabbitMqPublisher::connect(&amqp_url()).await?;
            publisher.declare_exchange(&topic).await?;
            let subscription = RabbitMqSubscription::bind(
                &publisher,
                &topic,
                &format!("{topic}-invoices"),
                "order.*",
            )
            .await?
            .batch(batch);
            (
                AnyPublisher::Rabbit(publisher),
                AnySubscription::Rabbit(subscription),
            )
        }
        _ => {
            let publisher = KafkaPublisher::connect(&kafka_url()).await?;
            publisher.ensure_topic(&topic, 3).await?;
            let subscription =
                KafkaSubscription::subscribe(&kafka_url(), &unique("invoices"), &[topic.as_str()])
                    .await?
                    .batch(batch);
            (
                AnyPublisher::Kafka(publisher),
                AnySubscription::Kafka(subscription),
            )
        }
    };
    Ok(Setup {
        db,
        outbox,
        publisher,
        subscription,
    })
}

/// The consumer: one invoice row per order; records commit-to-consume latency when the order id
/// carries its commit time (`o<i>-<micros>`), and counts what it applied.
fn consumer(
    pool: &sqlx::PgPool,
    applied: Arc<AtomicUsize>,
    latencies: Arc<std::sync::Mutex<Vec<f64>>>,
) -> Consumer<Postgres, impl Routes<Postgres> + Clone + use<>> {
    Consumer::new(pool.clone(), "invoice-service", "bench")
        .concurrency(consumer_concurrency())
        .on(
            async move |tx: &mut PgConnection,
                        placed: Delivered<OrderPlaced>|
                        -> Result<(), HandlerError> {
                sqlx::query("INSERT INTO invoice (order_id, amount_minor) VALUES ($1, $2)")
                    .bind(&placed.order_id)
                    .bind(placed.amount_minor)
                    .execute(&mut *tx)
                    .await?;
                record_latencies(&latencies, [placed.order_id.as_str()])?;
                applied.fetch_add(1, Ordering::Relaxed);
                Ok(())
            },
        )
}

/// `--consumer-concurrency`, as a lane count.
fn consumer_concurrency() -> usize {
    usize::try_from(CONSUMER_CONCURRENCY.load(Ordering::Relaxed)).unwrap_or(1)
}

/// Records commit-to-consume latency for each order id that carries its commit time
/// (`o<i>-<micros>`).
fn record_latencies<'a>(
    latencies: &std::sync::Mutex<Vec<f64>>,
    order_ids: impl IntoIterator<Item = &'a str>,
) -> Result<(), HandlerError> {
    let now = Utc::now().timestamp_micros();
    let mut latencies = latencies
        .lock()
        .map_err(|e| HandlerError::Bug(e.to_string()))?;
    for order_id in order_ids {
        if let Some(committed) = order_id
            .rsplit('-')
            .next()
            .and_then(|t| t.parse::<i64>().ok())
        {
            latencies.push((now - committed) as f64 / 1000.0);
        }
    }
    Ok(())
}

/// The same consumer with a batch handler: one multi-row INSERT for the invoices of a batch,
/// and the latencies recorded as [`consumer`] records them.
pub(crate) fn batch_consumer(
    pool: &sqlx::PgPool,
    applied: Arc<AtomicUsize>,
    latencies: Arc<std::sync::Mutex<Vec<f64>>>,
) -> Consumer<Postgres, impl Routes<Postgres> + Clone + use<>> {
    Consumer::new(pool.clone(), "invoice-service", "bench")
        .concurrency(consumer_concurrency())
        .on_batch(
            async move |tx: &mut PgConnection,
                        placed: Vec<Delivered<OrderPlaced>>|
                        -> Result<(), HandlerError> {
                let mut q = sqlx::QueryBuilder::<Postgres>::new(
                    "INSERT INTO invoice (order_id, amount_minor) ",
                );
                q.push_values(&placed, |mut row, p| {
                    row.push_bind(&p.order_id).push_bind(p.amount_minor);
                });
                q.build().execute(&mut *tx).await?;
                record_latencies(&latencies, placed.iter().map(|p| p.order_id.as_str()))?;
                applied.fetch_add(placed.len(), Ordering::Relaxed);
                Ok(())
            },
        )
}

/// Runs two relays and the subscription until the handler has applied `target` events
/// (`applied` counts them in memory, so that watching costs the database nothing; the table is
/// counted once at the end), then stops them. Returns the time from start.
async fn run_until_applied<R: Routes<Postgres>>(
    s: &Setup,
    consumer: &Consumer<Postgres, R>,
    applied: &AtomicUsize,
    target: usize,
    produce: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<Duration> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let relays: Vec<_> = (0..2)
        .map(|i| {
            s.outbox.relay(
                s.publisher.clone(),
                RelayConfig::new(format!("relay-{i}"))
                    .batch_size(500)
                    .poll_interval(Duration::from_millis(100))
                    .synchronous_commit(RELAY_SYNCHRONOUS_COMMIT.load(Ordering::Relaxed))
                    .linger(Duration::from_millis(
                        RELAY_LINGER_MS.load(Ordering::Relaxed),
                    )),
            )
        })
        .collect();
    let wait_stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let relaying =
        futures_util::future::join_all(relays.iter().map(|r| r.run(wait_stop(stopped.clone()))));
    let consuming = s.subscription.run(consumer, wait_stop(stopped.clone()));
    let watch = async {
        produce.await?;
        let elapsed = until_applied(applied, target, started).await;
        let _ = stop.send(true);
        elapsed
    };
    let (_, consumed, elapsed) = tokio::join!(relaying, consuming, watch);
    consumed?;
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM invoice")
        .fetch_one(s.db.pool())
        .await?;
    anyhow::ensure!(
        rows as usize == target,
        "{rows} invoices for {target} events"
    );
    elapsed
}

async fn drain_backlog(
    broker: &'static str,
    batch: usize,
    slice: bool,
    events: usize,
    raw_publish: f64,
    profile: IndexProfile,
) -> anyhow::Result<Backlog> {
    let s = setup(broker, batch, profile).await?;
    let raw_insert = raw_insert(&s.db, events).await?;
    commit_backlog(&s.outbox, events).await?;
    let applied = Arc::new(AtomicUsize::new(0));
    let wal = crate::wal::Snapshot::take(s.db.pool()).await;
    let cpu = crate::cpu::Snapshot::take();
    let elapsed = if slice {
        let consumer = batch_consumer(s.db.pool(), Arc::clone(&applied), Arc::default());
        run_until_applied(&s, &consumer, &applied, events, async { Ok(()) }).await?
    } else {
        let consumer = consumer(s.db.pool(), Arc::clone(&applied), Arc::default());
        run_until_applied(&s, &consumer, &applied, events, async { Ok(()) }).await?
    };
    let cpu = crate::cpu::Snapshot::take().per_thousand_since(&cpu, events);
    let wal = crate::wal::per_event(wal, crate::wal::Snapshot::take(s.db.pool()).await, events);
    let rate = events as f64 / elapsed.as_secs_f64();
    s.db.cleanup().await;
    Ok(Backlog {
        broker,
        consumer_batch: batch,
        handler: if slice { "batch" } else { "per event" },
        events,
        end_to_end_events_per_s: rate,
        raw_publish_per_s: raw_publish,
        raw_multi_row_insert_per_s: raw_insert,
        vs_raw_publish: rate / raw_publish,
        vs_raw_insert: rate / raw_insert,
        cpu_s_per_1000_events: cpu,
        wal_per_event: wal,
    })
}

/// The database's raw rate: `events` rows into a table like the consumer's, 500 rows per
/// multi-row INSERT, one transaction per statement.
async fn raw_insert(db: &TestDb<Postgres>, events: usize) -> anyhow::Result<f64> {
    sqlx::raw_sql(
        "CREATE TABLE raw_invoice (order_id TEXT PRIMARY KEY, amount_minor BIGINT NOT NULL)",
    )
    .execute(db.pool())
    .await?;
    let started = Instant::now();
    for chunk in (0..events).collect::<Vec<_>>().chunks(500) {
        let mut q = sqlx::QueryBuilder::<Postgres>::new(
            "INSERT INTO raw_invoice (order_id, amount_minor) ",
        );
        q.push_values(chunk, |mut row, i| {
            row.push_bind(format!("o{i}")).push_bind(*i as i64);
        });
        q.build().execute(db.pool()).await?;
    }
    let rate = events as f64 / started.elapsed().as_secs_f64();
    sqlx::raw_sql("DROP TABLE raw_invoice")
        .execute(db.pool())
        .await?;
    Ok(rate)
}

/// The database's own rate for `producers` producers each committing one row per transaction
/// (BEGIN, INSERT of an order-sized row, COMMIT, as `Outbox::commit` runs them), `events` rows
/// in all, on the pool the toolkit uses.
async fn raw_transactions(
    db: &TestDb<Postgres>,
    producers: usize,
    events: usize,
) -> anyhow::Result<Baseline> {
    sqlx::raw_sql(
        "CREATE TABLE raw_order (id BIGSERIAL PRIMARY KEY, order_id TEXT NOT NULL, \
         amount_minor BIGINT NOT NULL, payload JSONB NOT NULL)",
    )
    .execute(db.pool())
    .await?;
    let wal = crate::wal::Snapshot::take(db.pool()).await;
    let cpu = crate::cpu::Snapshot::take();
    let started = Instant::now();
    let work = (0..producers).map(|p| async move {
        for i in (p..events).step_by(producers) {
            let mut tx = db.pool().begin().await?;
            sqlx::query(
                "INSERT INTO raw_order (order_id, amount_minor, payload) VALUES ($1, $2, $3)",
            )
            .bind(format!("o{i}"))
            .bind(i as i64)
            .bind(serde_json::json!({"orderId": format!("o{i}"), "amountMinor": i}))
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
        }
        Ok::<(), anyhow::Error>(())
    });
    for done in futures_util::future::join_all(work).await {
        done?;
    }
    let rate = events as f64 / started.elapsed().as_secs_f64();
    let cpu = crate::cpu::Snapshot::take().per_thousand_since(&cpu, events);
    let wal = crate::wal::per_event(wal, crate::wal::Snapshot::take(db.pool()).await, events);
    sqlx::raw_sql("DROP TABLE raw_order")
        .execute(db.pool())
        .await?;
    Ok(Baseline { rate, cpu, wal })
}

/// The rate of `producers` producers committing `events` events, one per transaction, through
/// `Outbox::commit` with nothing relaying them, on a fresh database of their own.
async fn outbox_transactions(
    producers: usize,
    events: usize,
    profile: IndexProfile,
) -> anyhow::Result<Baseline> {
    let db = TestDb::postgres()
        .await
        .context("PostgreSQL is unreachable")?;
    let outbox = Outbox::new(
        db.pool().clone(),
        outbox_config(profile, "alone".to_owned()),
    );
    if profile != IndexProfile::Seed {
        outbox.migrate().await?;
    }
    let wal = crate::wal::Snapshot::take(db.pool()).await;
    let cpu = crate::cpu::Snapshot::take();
    let started = Instant::now();
    let work = (0..producers).map(|p| {
        let outbox = outbox.clone();
        async move {
            for i in (p..events).step_by(producers) {
                commit_one(&outbox, i).await?;
            }
            Ok::<(), anyhow::Error>(())
        }
    });
    for done in futures_util::future::join_all(work).await {
        done?;
    }
    let rate = events as f64 / started.elapsed().as_secs_f64();
    let cpu = crate::cpu::Snapshot::take().per_thousand_since(&cpu, events);
    let wal = crate::wal::per_event(wal, crate::wal::Snapshot::take(db.pool()).await, events);
    db.cleanup().await;
    Ok(Baseline { rate, cpu, wal })
}

/// A baseline's rate of transactions, and its CPU time and write-ahead log per transaction.
struct Baseline {
    rate: f64,
    cpu: crate::cpu::PerThousand,
    wal: Option<crate::wal::PerEvent>,
}

/// `producers` producers committing one event per transaction, each paced at `rate /
/// producers` per second, or as fast as they go when `rate` is `None`.
async fn latency_run(
    broker: &'static str,
    producers: usize,
    rate: Option<f64>,
    slice: bool,
    events: usize,
    profile: IndexProfile,
) -> anyhow::Result<Latency> {
    let alone = match rate {
        Some(_) => None,
        None => Some(outbox_transactions(producers, events, profile).await?),
    };
    let s = setup(broker, LATENCY_BATCH, profile).await?;
    let raw = match rate {
        Some(_) => None,
        None => Some(raw_transactions(&s.db, producers, events).await?),
    };
    let latencies = Arc::new(std::sync::Mutex::new(Vec::with_capacity(events)));
    let applied = Arc::new(AtomicUsize::new(0));
    let outbox = s.outbox.clone();
    let warmed_up_at = Arc::new(std::sync::OnceLock::new());
    let measured_from = Arc::clone(&warmed_up_at);
    let warmed = Arc::clone(&applied);
    let produce = async move {
        // One event through the whole path first, untimed: connections, the consumer group's
        // join (seconds on Kafka) and the stream's first delivery are set-up, not latency.
        commit_warm_up(&outbox).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while warmed.load(Ordering::Relaxed) == 0 {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the warm-up event was not consumed within a minute"
            );
            // Polling the handler's counter, with the deadline above.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let wal = crate::wal::Snapshot::take(outbox.pool()).await;
        let _ = measured_from.set((Instant::now(), crate::cpu::Snapshot::take(), wal));
        let producing = (0..producers).map(|p| {
            let outbox = outbox.clone();
            async move {
                let mut tick = rate.map(|rate| {
                    tokio::time::interval(Duration::from_secs_f64(producers as f64 / rate))
                });
                for i in (p..events).step_by(producers) {
                    if let Some(tick) = &mut tick {
                        tick.tick().await;
                    }
                    commit_one(&outbox, i).await?;
                }
                Ok::<(), anyhow::Error>(())
            }
        });
        for done in futures_util::future::join_all(producing).await {
            done?;
        }
        Ok(())
    };
    let run_started = Instant::now();
    let elapsed = if slice {
        let consumer = batch_consumer(s.db.pool(), Arc::clone(&applied), Arc::clone(&latencies));
        run_until_applied(&s, &consumer, &applied, events + 1, produce).await?
    } else {
        let consumer = consumer(s.db.pool(), Arc::clone(&applied), Arc::clone(&latencies));
        run_until_applied(&s, &consumer, &applied, events + 1, produce).await?
    };
    let cpu_now = crate::cpu::Snapshot::take();
    let wal_now = crate::wal::Snapshot::take(s.db.pool()).await;
    // The rate, the CPU time and the log count from the end of the warm-up.
    let (warm_up, cpu) = warmed_up_at.get().map_or_else(
        || (Duration::ZERO, cpu_now.per_thousand_since(&cpu_now, events)),
        |(at, cpu, _)| (*at - run_started, cpu_now.per_thousand_since(cpu, events)),
    );
    let wal = warmed_up_at
        .get()
        .and_then(|(_, _, wal)| crate::wal::per_event(*wal, wal_now, events));
    let elapsed = elapsed.saturating_sub(warm_up);
    let load = match rate {
        Some(rate) => format!("{rate} events/s, {producers} producers"),
        None => format!("saturation, {producers} producers"),
    };
    let stages = sqlx::query_as::<_, Stages>(
        "SELECT \
         percentile_cont(0.5) WITHIN GROUP (ORDER BY \
           extract(epoch FROM o.last_publish_time - o.create_time) * 1000) AS claimed, \
         percentile_cont(0.5) WITHIN GROUP (ORDER BY \
           extract(epoch FROM o.published_time - o.create_time) * 1000) AS marked_published, \
         percentile_cont(0.5) WITHIN GROUP (ORDER BY \
           extract(epoch FROM i.consumed_time - o.create_time) * 1000) AS consumed, \
         count(*)::float8 / greatest(count(DISTINCT i.consumed_time), 1) \
           AS events_per_consumer_transaction \
         FROM biz_outbox_event o JOIN consumed_event i ON i.event_id = o.event_no \
         WHERE o.aggregate_id <> 'warm-up'",
    )
    .fetch_one(s.db.pool())
    .await?;
    let stages_max = sqlx::query_as::<_, StagesMax>(
        "SELECT \
         max(extract(epoch FROM last_publish_time - create_time) * 1000)::float8 AS claimed, \
         max(extract(epoch FROM published_time - create_time) * 1000)::float8 AS marked_published, \
         count(*)::float8 / greatest(count(DISTINCT last_publish_time), 1) AS events_per_claim \
         FROM biz_outbox_event WHERE aggregate_id <> 'warm-up'",
    )
    .fetch_one(s.db.pool())
    .await?;
    let mut figures = latency_figures(
        (broker, slice),
        load,
        events,
        elapsed,
        &latencies,
        (stages, stages_max),
        cpu,
    )?;
    figures.wal_per_event = wal;
    if let Some(raw) = raw {
        figures.raw_transactions_per_s = Some(raw.rate);
        figures.vs_raw_transactions = Some(figures.events_per_s / raw.rate);
        figures.raw_transactions_cpu = Some(raw.cpu);
        figures.raw_transactions_wal = raw.wal;
    }
    if let Some(alone) = alone {
        figures.outbox_transactions_per_s = Some(alone.rate);
        figures.vs_outbox_transactions = Some(figures.events_per_s / alone.rate);
        figures.outbox_transactions_cpu = Some(alone.cpu);
        figures.outbox_transactions_wal = alone.wal;
    }
    s.db.cleanup().await;
    Ok(figures)
}

async fn commit_one(outbox: &Outbox<Postgres>, i: usize) -> anyhow::Result<()> {
    // The commit time travels in the order id, for the latency measurement.
    let id = format!("o{i}-{}", Utc::now().timestamp_micros());
    let mut uow = UnitOfWork::new(EventContext::new("bench"));
    uow.collect(&mut Order::place(&id, i as i64).map_err(|e| anyhow::anyhow!("{e}"))?)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let _ = outbox.commit(outbox.pool().begin().await?, uow).await?;
    Ok(())
}

/// An order whose id carries no commit time, so that its latency is not recorded.
async fn commit_warm_up(outbox: &Outbox<Postgres>) -> anyhow::Result<()> {
    let mut uow = UnitOfWork::new(EventContext::new("bench"));
    uow.collect(&mut Order::place("warm-up", 0).map_err(|e| anyhow::anyhow!("{e}"))?)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let _ = outbox.commit(outbox.pool().begin().await?, uow).await?;
    Ok(())
}

fn latency_figures(
    (broker, slice): (&'static str, bool),
    load: String,
    events: usize,
    elapsed: Duration,
    latencies: &std::sync::Mutex<Vec<f64>>,
    (stages_p50_ms, stages_max_ms): (Stages, StagesMax),
    cpu_s_per_1000_events: crate::cpu::PerThousand,
) -> anyhow::Result<Latency> {
    let mut latencies = latencies
        .lock()
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .clone();
    anyhow::ensure!(!latencies.is_empty(), "no latency recorded");
    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
    Ok(Latency {
        broker,
        load,
        consumer_batch: LATENCY_BATCH,
        handler: if slice { "batch" } else { "per event" },
        events,
        events_per_s: events as f64 / elapsed.as_secs_f64(),
        p50_ms: percentile(0.50),
        p99_ms: percentile(0.99),
        events_per_claim: stages_max_ms.events_per_claim,
        events_per_consumer_transaction: stages_p50_ms.events_per_consumer_transaction,
        stages_p50_ms,
        stages_max_ms,
        cpu_s_per_1000_events,
        raw_transactions_per_s: None,
        vs_raw_transactions: None,
        outbox_transactions_per_s: None,
        vs_outbox_transactions: None,
        raw_transactions_cpu: None,
        outbox_transactions_cpu: None,
        wal_per_event: None,
        raw_transactions_wal: None,
        outbox_transactions_wal: None,
    })
}

/// The broker's own publish rate, acks awaited and pipelined, for `messages` messages of
/// `bytes` bytes (an envelope's size) on a topic of their own.
pub(crate) async fn raw_publish(
    broker: &str,
    messages: usize,
    bytes: usize,
) -> anyhow::Result<f64> {
    let payload = vec![b'x'; bytes];
    let topic = unique("raw").replace('_', "-");
    let started;
    match broker {
        "nats" => {
            let publisher = NatsPublisher::connect(&nats_url()).await?;
            let stream = stream_for(&publisher, &topic).await?;
            started = Instant::now();
            // Acks awaited per window of 500, as the publisher does.
            for window in (0..messages).collect::<Vec<_>>().chunks(500) {
                let mut acks = Vec::with_capacity(window.len());
                for i in window {
                    acks.push(
                        publisher
                            .jetstream()
                            .publish(format!("{topic}.raw.{i}"), payload.clone().into())
                            .await?,
                    );
                }
                for ack in acks {
                    ack.await?;
                }
            }
            let elapsed = started.elapsed();
            publisher.jetstream().delete_stream(&stream).await?;
            Ok(messages as f64 / elapsed.as_secs_f64())
        }
        "rabbitmq" => {
            let publisher = RabbitMqPublisher::connect(&amqp_url()).await?;
            publisher.declare_exchange(&topic).await?;
            let queue = format!("{topic}-raw");
            drop(RabbitMqSubscription::bind(&publisher, &topic, &queue, "raw.*").await?);
            started = Instant::now();
            let mut confirms = Vec::with_capacity(messages);
            for _ in 0..messages {
                confirms.push(
                    publisher
                        .channel()
                        .basic_publish(
                            lapin::types::ShortString::from(topic.as_str()),
                            lapin::types::ShortString::from("raw.x"),
                            lapin::options::BasicPublishOptions::default(),
                            &payload,
                            lapin::BasicProperties::default().with_delivery_mode(2),
                        )
                        .await?,
                );
            }
            for confirm in confirms {
                confirm.await?;
            }
            let elapsed = started.elapsed();
            publisher
                .channel()
                .queue_delete(
                    lapin::types::ShortString::from(queue.as_str()),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await?;
            Ok(messages as f64 / elapsed.as_secs_f64())
        }
        _ => {
            use rdkafka::producer::{FutureProducer, FutureRecord};
            let admin = KafkaPublisher::connect(&kafka_url()).await?;
            admin.ensure_topic(&topic, 3).await?;
            // The same idempotent producer settings as the publisher, without the outbox.
            let producer: FutureProducer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", kafka_url())
                .set("enable.idempotence", "true")
                .set("acks", "all")
                .set("linger.ms", "1")
                .create()?;
            started = Instant::now();
            let mut deliveries = Vec::with_capacity(messages);
            for i in 0..messages {
                let key = format!("k{i}");
                let record = FutureRecord::to(&topic).key(&key).payload(&payload);
                deliveries.push(producer.send_result(record).map_err(|(e, _)| e)?);
            }
            for delivery in deliveries {
                delivery.await?.map_err(|(e, _)| e)?;
            }
            Ok(messages as f64 / started.elapsed().as_secs_f64())
        }
    }
}
