//! The processes a campaign starts: producers that commit events through the outbox, and
//! consumers that apply them through the inbox, recording each effect in `campaign_effect`
//! (which has no unique key, so a duplicate effect shows).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use event_core::{Aggregate, EventContext, EventEnvelope, RecordedEvents, UnitOfWork};
use event_sqlx::{
    Backend, Commit, Consumer, Delivered, HandlerError, JetStreamSubscription, KafkaSubscription,
    Outbox, OutboxConfig, RabbitMqSubscription, Route,
};
use event_tests::fixtures::{NoteAdded, Order, OrderPlaced};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use sqlx::pool::PoolOptions;

use crate::pair::{Broker, CONSUMER, QUEUE, STREAM, TOPIC};

/// Ends when the process gets SIGTERM or SIGINT.
pub(crate) async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// `event-campaign producer`.
#[derive(Debug, clap::Args)]
pub(crate) struct ProducerArgs {
    /// The database.
    #[arg(long)]
    db: String,
    /// This producer's name: its aggregates are `<id>-o-<n>` and `<id>-O-<n>`.
    #[arg(long)]
    id: String,
    /// How many aggregates of each spelling it writes to.
    #[arg(long, default_value_t = 100)]
    aggregates: u64,
    /// Events a second.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// Where each acknowledged commit's event numbers are appended, one a line.
    #[arg(long)]
    acked: PathBuf,
}

/// Routes every order event to the campaign's topic.
pub(crate) fn outbox_config() -> OutboxConfig {
    let route = |key: &str| Route::topic(TOPIC).routing_key(key);
    OutboxConfig::new()
        .route("ORDER_PLACED", route("order.placed"))
        .route("NOTE_ADDED", route("order.note"))
}

pub(crate) async fn producer(args: ProducerArgs) -> anyhow::Result<ExitCode> {
    if args.db.starts_with("mysql:") {
        produce::<sqlx::MySql>(&args).await
    } else {
        produce::<sqlx::Postgres>(&args).await
    }
}

async fn produce<DB: Backend>(args: &ProducerArgs) -> anyhow::Result<ExitCode>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let pool = PoolOptions::<DB>::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy(&args.db)
        .context("a database URL")?;
    let outbox = Outbox::new(pool.clone(), outbox_config());
    let mut acked = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.acked)
        .with_context(|| format!("cannot open {}", args.acked.display()))?;
    let mut rng = ChaCha8Rng::seed_from_u64(u64::from(std::process::id()));
    let per_commit = 4u64;
    let pause = Duration::from_secs_f64(per_commit as f64 / f64::from(args.rate.max(1)));
    let mut ticks = tokio::time::interval(pause);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = terminated();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return Ok(ExitCode::SUCCESS),
            _ = ticks.tick() => {}
        }
        let mut ids: Vec<String> = (0..per_commit)
            .map(|_| {
                let n = rng.next_u64();
                // Pairs of aggregates whose ids differ only in letter case: different orders on
                // every backend, each with its own events and effects.
                let o = if n & 1 == 0 { "o" } else { "O" };
                format!("{}-{o}-{}", args.id, (n >> 1) % args.aggregates.max(1))
            })
            .collect();
        ids.sort();
        ids.dedup();
        let committed = tokio::time::timeout(Duration::from_secs(20), commit(&outbox, &ids)).await;
        match committed {
            Ok(Ok(recorded)) => {
                let mut lines = String::new();
                for no in recorded {
                    lines.push_str(&no);
                    lines.push('\n');
                }
                acked.write_all(lines.as_bytes())?;
            }
            // The outcome is unknown: the next commit reads each aggregate's version again.
            Ok(Err(e)) => eprintln!("producer {}: commit failed: {e:#}", args.id),
            Err(_) => eprintln!("producer {}: commit timed out", args.id),
        }
    }
}

/// One transaction: the next event of each aggregate (placed first, then notes).
async fn commit<DB: Backend>(outbox: &Outbox<DB>, ids: &[String]) -> anyhow::Result<Vec<String>> {
    let mut tx = outbox.pool().begin().await?;
    let mut uow = UnitOfWork::new(EventContext::new("campaign-producer"));
    for id in ids {
        let version = outbox.aggregate_version(&mut tx, "ORDER", id).await?;
        let mut order = if version == 0 {
            Order::place(id, 100)?
        } else {
            let mut order = Order {
                id: id.clone(),
                paid: false,
                events: RecordedEvents::loaded_at(version),
            };
            order.record(NoteAdded {
                text: format!("note {}", version + 1),
            })?;
            order
        };
        uow.collect(&mut order)?;
    }
    match outbox.commit(tx, uow).await? {
        Commit::Committed(report) => Ok(report
            .recorded
            .iter()
            .map(|no| no.as_str().to_owned())
            .collect()),
        Commit::AlreadyApplied(_) => Ok(Vec::new()),
    }
}

/// `event-campaign consumer`.
#[derive(Debug, clap::Args)]
pub(crate) struct ConsumerArgs {
    /// The database.
    #[arg(long)]
    db: String,
    /// The broker.
    #[arg(long, value_enum)]
    broker: Broker,
    /// The broker's URL (Kafka: bootstrap `host:port`).
    #[arg(long)]
    broker_url: String,
    /// Messages per batch transaction.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Transactions a batch is applied in at once (`Consumer::concurrency`).
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// This process's name, recorded with each effect.
    #[arg(long)]
    process: String,
}

/// What a consumer writes for each event it applies.
pub(crate) trait Effects: Backend {
    fn record<'a>(
        conn: &'a mut Self::Connection,
        envelope: &'a EventEnvelope,
        process: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;
}

macro_rules! effects {
    ($db:ty, $sql:literal) => {
        impl Effects for $db {
            fn record<'a>(
                conn: &'a mut Self::Connection,
                envelope: &'a EventEnvelope,
                process: &'a str,
            ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a {
                async move {
                    sqlx::query($sql)
                        .bind(CONSUMER)
                        .bind(envelope.event_id.as_str())
                        .bind(&envelope.aggregate_id)
                        .bind(envelope.aggregate_sequence as i64)
                        .bind(process)
                        .execute(&mut *conn)
                        .await?;
                    Ok(())
                }
            }
        }
    };
}

effects!(
    sqlx::Postgres,
    "INSERT INTO campaign_effect (consumer, event_id, aggregate_id, sequence, process) VALUES ($1, $2, $3, $4, $5)"
);
effects!(
    sqlx::MySql,
    "INSERT INTO campaign_effect (consumer, event_id, aggregate_id, sequence, process) VALUES (?, ?, ?, ?, ?)"
);

/// The effects table, created once by the run.
pub(crate) fn effects_ddl(mysql: bool) -> &'static str {
    if mysql {
        "CREATE TABLE campaign_effect (pos BIGINT AUTO_INCREMENT PRIMARY KEY, consumer VARCHAR(64) NOT NULL, \
         event_id VARCHAR(128) NOT NULL, aggregate_id VARCHAR(64) NOT NULL, sequence BIGINT NOT NULL, \
         process VARCHAR(32) NOT NULL) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
    } else {
        "CREATE TABLE campaign_effect (pos BIGSERIAL PRIMARY KEY, consumer TEXT NOT NULL, \
         event_id TEXT NOT NULL, aggregate_id TEXT NOT NULL, sequence BIGINT NOT NULL, process TEXT NOT NULL)"
    }
}

pub(crate) async fn consumer(args: ConsumerArgs) -> anyhow::Result<ExitCode> {
    if args.db.starts_with("mysql:") {
        consume::<sqlx::MySql>(&args).await
    } else {
        consume::<sqlx::Postgres>(&args).await
    }
}

async fn consume<DB: Effects>(args: &ConsumerArgs) -> anyhow::Result<ExitCode> {
    let pool = PoolOptions::<DB>::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy(&args.db)
        .context("a database URL")?;
    let process = args.process.as_str();
    let consumer = Consumer::new(pool, CONSUMER, "1.0.0")
        .in_order()
        .concurrency(args.concurrency)
        .on(async |tx: &mut DB::Connection, e: Delivered<OrderPlaced>| {
            DB::record(tx, &e.envelope, process)
                .await
                .map_err(HandlerError::from)
        })
        .on(async |tx: &mut DB::Connection, e: Delivered<NoteAdded>| {
            DB::record(tx, &e.envelope, process)
                .await
                .map_err(HandlerError::from)
        });
    let report = match args.broker {
        Broker::Jetstream => {
            let subscription = JetStreamSubscription::connect(
                &args.broker_url,
                STREAM,
                CONSUMER,
                &format!("{TOPIC}.>"),
                Duration::from_secs(10),
            )
            .await?
            .batch(args.batch);
            subscription.run(&consumer, terminated()).await
        }
        Broker::Rabbitmq => {
            let subscription =
                RabbitMqSubscription::connect(&args.broker_url, TOPIC, QUEUE, "order.*")
                    .await?
                    .batch(args.batch);
            subscription.run(&consumer, terminated()).await
        }
        Broker::Kafka => {
            let subscription = KafkaSubscription::subscribe(&args.broker_url, CONSUMER, &[TOPIC])
                .await?
                .batch(args.batch);
            subscription.run(&consumer, terminated()).await
        }
    };
    match report {
        Ok(report) => {
            eprintln!("consumer {process}: stopped; {report:?}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("consumer {process}: {:#}", anyhow::Error::new(e));
            Ok(ExitCode::from(1))
        }
    }
}
