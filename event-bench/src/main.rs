//! The benchmark harness. Every figure is a ratio against a baseline measured in the same run on
//! the same database, because the machine is noisy:
//!
//! - a business transaction (one UPDATE, one INSERT) with 1 and with 10 outbox events, against
//!   the same transaction without; and, as the floor any extra write costs, with a `SELECT 1`;
//! - the relay draining a backlog, against a naive relay that follows the seed's one-row SQL
//!   literally, and against the raw multi-row INSERT rate of the same rows;
//! - the relay's batch latency with 10k and with 1M published rows in the table.
//!
//! `cargo run --release -p event-bench -- --backend all` writes `benches/results/outbox.json`.

mod console;
mod delivery;
mod derive_build;
mod producer;
mod reconcile;
mod settle;
mod sql;
mod throughput;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use clap::Parser;
use event_core::{Aggregate, EventContext, RecordedEvents, UnitOfWork};
use event_sqlx::{OutboxMessage, PublishError, Publisher, RelayConfig};
use event_tests::db::TestDb;
use event_tests::fixtures::{NoteAdded, Order};
use serde::Serialize;

use crate::sql::{BenchDb, RawRow};

#[derive(Debug, Parser)]
struct Args {
    /// sqlite, postgres, mysql or all.
    #[arg(long, default_value = "all")]
    backend: String,
    /// Business transactions per variant in the overhead benchmark.
    #[arg(long, default_value_t = 600)]
    transactions: usize,
    /// Backlog the relay drains.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Published rows in the table for the large claim measurement.
    #[arg(long, default_value_t = 1_000_000)]
    published: i64,
    /// Events the relay claims per batch in the drain.
    #[arg(long, default_value_t = 500)]
    batch: u32,
    /// Where to write the results.
    #[arg(long, default_value = "benches/results/outbox.json")]
    out: PathBuf,
    /// Instead of the outbox: check this many event types with 3 versions each.
    #[arg(long)]
    schema_types: Option<usize>,
    /// Instead of the outbox: send this many events end to end through each broker.
    #[arg(long)]
    delivery: Option<usize>,
    /// Instead of the outbox: archive `--published` rows, against the raw INSERT rate, and a
    /// relay's drain with and without the archiver running (benches/results/archive.json).
    #[arg(long)]
    archive: bool,
    /// Instead of the outbox: reconcile `--published` events per side against one keyset scan of
    /// both tables (benches/results/reconcile.json).
    #[arg(long)]
    reconcile: bool,
    /// Instead of the outbox: compile a crate of this many derived events with their snapshots
    /// and without (benches/results/derive-build.json).
    #[arg(long)]
    derive_build: Option<usize>,
    /// Instead of the outbox: batched consumers end to end, a committed backlog of this many
    /// events per broker and consumer batch size, and latency at 500 events/s and at saturation
    /// (benches/results/throughput.json).
    #[arg(long)]
    throughput: Option<usize>,
    /// Instead of the outbox: a business transaction with one outbox event under each index
    /// profile, against a one-column, one-index row (benches/results/producer.json); this many
    /// transactions per variant.
    #[arg(long)]
    producer: Option<usize>,
    /// Instead of the outbox: this many rows in a PostgreSQL outbox, each console page through
    /// `eventctl console` against the same statements run directly (benches/results/console.json).
    #[arg(long)]
    console: Option<i64>,
    /// Instead of the outbox: the test kit's `Harness::settle` over these backlog sizes
    /// (comma-separated), in memory and on an SQLite file (benches/results/settle.json).
    #[arg(long, value_delimiter = ',')]
    settle: Option<Vec<usize>>,
    /// With --throughput: which brokers (`all`, or a comma-separated list of nats, rabbitmq,
    /// kafka).
    #[arg(long, default_value = "all")]
    brokers: String,
}

/// A publisher that accepts everything after serializing it, as a real one would.
struct Serializing;

impl Publisher for Serializing {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        messages
            .iter()
            .map(|m| {
                std::hint::black_box(serde_json::to_vec(&m.envelope).map_err(PublishError::new))
                    .map(drop)
            })
            .collect()
    }
}

#[derive(Debug, Default, Serialize)]
struct BackendResult {
    backend: String,
    tx_without_outbox_us: f64,
    tx_with_1_event_us: f64,
    tx_with_10_events_us: f64,
    tx_with_select_1_us: f64,
    overhead_1_event: f64,
    overhead_10_events: f64,
    overhead_select_1: f64,
    raw_insert_events_per_s: f64,
    relay_drain_events_per_s: f64,
    naive_relay_events_per_s: f64,
    drain_vs_naive: f64,
    drain_vs_raw_insert: f64,
    batch_latency_10k_published_ms: f64,
    batch_latency_large_published_ms: f64,
    large_published_rows: i64,
    batch_latency_ratio: f64,
    /// PostgreSQL: batch latency on the large table filled after its statistics were taken
    /// empty (as after `migrate`), never analyzed since.
    stale_statistics_batch_latency_ms: Option<f64>,
    /// The same after `Outbox::ensure_statistics`, as a relay runs it on start.
    relay_start_batch_latency_ms: Option<f64>,
    /// The same after an explicit ANALYZE: the baseline.
    analyzed_batch_latency_ms: Option<f64>,
    /// `relay_start` over `analyzed`.
    relay_start_vs_analyzed: Option<f64>,
    /// `stale_statistics` over `analyzed`.
    stale_vs_analyzed: Option<f64>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    if let Some(types) = args.schema_types {
        return schema_bench(types);
    }
    if let Some(events) = args.delivery {
        return delivery::run(events).await;
    }
    if args.archive {
        return archive_bench(&args).await;
    }
    if let Some(transactions) = args.producer {
        return producer::run(transactions).await;
    }
    if let Some(events) = args.throughput {
        return throughput::run(events, &args.brokers).await;
    }
    if let Some(sizes) = &args.settle {
        return settle::run(sizes).await;
    }
    if let Some(rows) = args.console {
        return console::run(rows).await;
    }
    if let Some(events) = args.derive_build {
        return derive_build::run(events);
    }
    if args.reconcile {
        return reconcile::run(&args.backend, args.published).await;
    }
    let mut results = Vec::new();
    let all = args.backend == "all";
    if all || args.backend == "sqlite" {
        let db = TestDb::sqlite().await.context("SQLite")?;
        results.push(bench("sqlite", &db, &args).await?);
        db.cleanup().await;
    }
    if all || args.backend == "postgres" {
        let db = TestDb::postgres()
            .await
            .context("PostgreSQL is unreachable")?;
        results.push(bench("postgres", &db, &args).await?);
        db.cleanup().await;
    }
    if all || args.backend == "mysql" {
        let db = TestDb::mysql()
            .await
            .context("MariaDB/MySQL is unreachable")?;
        results.push(bench("mysql", &db, &args).await?);
        db.cleanup().await;
    }
    let machine = machine();
    let report = serde_json::json!({
        "machine": machine,
        "measuredAt": Utc::now(),
        "events": args.events,
        "transactionsPerVariant": args.transactions,
        "relayBatch": args.batch,
        "results": results,
    });
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    println!("\nmachine: {machine}");
    println!(
        "| backend | outbox overhead, 1 event | 10 events | `SELECT 1` instead (floor) | drain vs naive relay | drain vs raw INSERT | batch latency at {} vs 10k published |",
        args.published
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &results {
        println!(
            "| {} | {:+.1}% ({:.0} -> {:.0} µs) | {:+.1}% | {:+.1}% | {:.1}x ({:.0} vs {:.0} ev/s) | {:.0}% ({:.0} vs {:.0} ev/s) | {:.2}x ({:.2} vs {:.2} ms) |",
            r.backend,
            r.overhead_1_event * 100.0,
            r.tx_without_outbox_us,
            r.tx_with_1_event_us,
            r.overhead_10_events * 100.0,
            r.overhead_select_1 * 100.0,
            r.drain_vs_naive,
            r.relay_drain_events_per_s,
            r.naive_relay_events_per_s,
            r.drain_vs_raw_insert * 100.0,
            r.relay_drain_events_per_s,
            r.raw_insert_events_per_s,
            r.batch_latency_ratio,
            r.batch_latency_large_published_ms,
            r.batch_latency_10k_published_ms,
        );
    }
    println!("\nwritten to {}", args.out.display());
    Ok(())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb / 1024 / 1024)
        .unwrap_or(0);
    format!("{cores} cores ({cpu}), {mem} GiB")
}

async fn bench<DB: BenchDb>(
    name: &str,
    db: &TestDb<DB>,
    args: &Args,
) -> anyhow::Result<BackendResult>
where
    event_sqlx::Relay<DB, Serializing>: Send,
{
    eprintln!("== {name}");
    DB::setup(db.pool()).await?;
    let mut r = BackendResult {
        backend: name.to_owned(),
        ..BackendResult::default()
    };

    // (a) The business transaction with 0, 1 and 10 outbox events, interleaved in rounds so that
    // drift in the machine's load hits every variant alike.
    let rounds = 6;
    let per_round = (args.transactions / rounds).max(1);
    // The fourth variant adds a trivial `SELECT 1` instead of events: the floor that any extra
    // statement in the transaction costs on this machine, one more round trip.
    let mut totals = [Duration::ZERO; 4];
    let mut serial = 0usize;
    for round in 0..=rounds {
        for (variant, events) in [0usize, 1, 10, 0].into_iter().enumerate() {
            let started = Instant::now();
            for _ in 0..per_round {
                serial += 1;
                let mut tx = db.pool().begin().await?;
                DB::business_write(&mut tx, (serial % 1000) as i64).await?;
                if variant == 3 {
                    DB::trivial_statement(&mut tx).await?;
                }
                if events > 0 {
                    let mut order = Order {
                        id: format!("tx-{serial}"),
                        paid: false,
                        events: RecordedEvents::new(),
                    };
                    for _ in 0..events {
                        order.record(NoteAdded {
                            text: "note".into(),
                        })?;
                    }
                    let mut uow = UnitOfWork::new(EventContext::new("bench"));
                    uow.collect(&mut order)?;
                    db.outbox.flush(&mut tx, &uow.commit()).await?;
                }
                tx.commit().await?;
            }
            if round > 0 {
                // Round 0 warms up.
                totals[variant] += started.elapsed();
            }
        }
    }
    let n = (per_round * rounds) as f64;
    r.tx_without_outbox_us = totals[0].as_secs_f64() * 1e6 / n;
    r.tx_with_1_event_us = totals[1].as_secs_f64() * 1e6 / n;
    r.tx_with_10_events_us = totals[2].as_secs_f64() * 1e6 / n;
    r.tx_with_select_1_us = totals[3].as_secs_f64() * 1e6 / n;
    r.overhead_select_1 = r.tx_with_select_1_us / r.tx_without_outbox_us - 1.0;
    r.overhead_1_event = r.tx_with_1_event_us / r.tx_without_outbox_us - 1.0;
    r.overhead_10_events = r.tx_with_10_events_us / r.tx_without_outbox_us - 1.0;
    eprintln!(
        "   transactions: {:.0} / {:.0} / {:.0} µs, with SELECT 1 {:.0} µs",
        r.tx_without_outbox_us, r.tx_with_1_event_us, r.tx_with_10_events_us, r.tx_with_select_1_us
    );

    // (b) The raw multi-row INSERT of a backlog, then the relay draining it.
    DB::truncate(db.pool()).await?;
    let rows = backlog("E", args.events, 0);
    let now = event_now();
    let started = Instant::now();
    for chunk in rows.chunks(5000) {
        DB::raw_insert(db.pool(), chunk, now).await?;
    }
    r.raw_insert_events_per_s = args.events as f64 / started.elapsed().as_secs_f64();
    DB::analyze(db.pool()).await?;
    let relay = db.outbox.relay(
        Serializing,
        RelayConfig::new("bench").batch_size(args.batch),
    );
    let started = Instant::now();
    let drained = relay.drain().await?.published;
    anyhow::ensure!(
        drained == args.events,
        "the relay drained {drained} of {} events",
        args.events
    );
    r.relay_drain_events_per_s = args.events as f64 / started.elapsed().as_secs_f64();
    eprintln!(
        "   raw insert {:.0}/s, relay drain {:.0}/s",
        r.raw_insert_events_per_s, r.relay_drain_events_per_s
    );

    // The naive relay on a fresh backlog of the same shape, for at most 20 s.
    let naive_rows = backlog("N", 20_000, 1_000_000);
    for chunk in naive_rows.chunks(5000) {
        DB::raw_insert(db.pool(), chunk, event_now()).await?;
    }
    DB::analyze(db.pool()).await?;
    let started = Instant::now();
    let mut naive = 0;
    while started.elapsed() < Duration::from_secs(20) {
        let published = DB::naive_relay_round(db.pool()).await?;
        if published == 0 {
            break;
        }
        naive += published;
    }
    r.naive_relay_events_per_s = naive as f64 / started.elapsed().as_secs_f64();
    r.drain_vs_naive = r.relay_drain_events_per_s / r.naive_relay_events_per_s;
    r.drain_vs_raw_insert = r.relay_drain_events_per_s / r.raw_insert_events_per_s;
    eprintln!("   naive relay {:.0}/s", r.naive_relay_events_per_s);

    // (c) Batch latency with 10k, then with many, published rows in the table.
    DB::truncate(db.pool()).await?;
    DB::fill_published(db.pool(), 0, 10_000).await?;
    r.batch_latency_10k_published_ms = batch_latency(db, "C", 2_000_000).await?;
    eprintln!("   filling {} published rows", args.published);
    DB::fill_published(db.pool(), 10_000, args.published - 10_000).await?;
    r.large_published_rows = args.published;
    r.batch_latency_large_published_ms = batch_latency(db, "D", 3_000_000).await?;
    r.batch_latency_ratio = r.batch_latency_large_published_ms / r.batch_latency_10k_published_ms;
    eprintln!(
        "   batch latency {:.2} ms -> {:.2} ms",
        r.batch_latency_10k_published_ms, r.batch_latency_large_published_ms
    );

    // (d) PostgreSQL: the table's statistics taken while it was empty (as `migrate` leaves
    // them), then filled in bulk before autovacuum could look: what the claim costs then, after
    // a relay's start has taken fresh statistics, and with ANALYZE run by hand.
    if <DB as event_sqlx::Backend>::DIALECT == event_sqlx::Dialect::Postgres {
        DB::truncate(db.pool()).await?;
        DB::raw(
            db.pool(),
            "ALTER TABLE biz_outbox_event SET (autovacuum_enabled = false)",
        )
        .await?;
        DB::analyze(db.pool()).await?;
        eprintln!("   filling {} published rows, not analyzed", args.published);
        DB::fill_published(db.pool(), 0, args.published).await?;
        // One claim, cut off after a minute: on stale statistics one can take minutes.
        let stale = first_batch_within(db, "S", 4_000_000, Duration::from_secs(60)).await?;
        let took = db.outbox.ensure_statistics().await?;
        anyhow::ensure!(took, "a relay's start did not find the statistics stale");
        let relay_start = batch_latency_unsettled(db, "T", 5_000_000).await?;
        DB::analyze(db.pool()).await?;
        let analyzed = batch_latency_unsettled(db, "U", 6_000_000).await?;
        DB::raw(
            db.pool(),
            "ALTER TABLE biz_outbox_event RESET (autovacuum_enabled)",
        )
        .await?;
        r.stale_statistics_batch_latency_ms = Some(stale);
        r.relay_start_batch_latency_ms = Some(relay_start);
        r.analyzed_batch_latency_ms = Some(analyzed);
        r.relay_start_vs_analyzed = Some(relay_start / analyzed);
        r.stale_vs_analyzed = Some(stale / analyzed);
        eprintln!(
            "   stale statistics {stale:.2} ms, after a relay's start {relay_start:.2} ms, analyzed {analyzed:.2} ms"
        );
    }
    Ok(r)
}

/// The time of one relay batch of 100 over a fresh backlog, or `limit` if it takes longer (the
/// batch is then abandoned; its database session is ended).
async fn first_batch_within<DB: BenchDb>(
    db: &TestDb<DB>,
    prefix: &str,
    offset: usize,
    limit: Duration,
) -> anyhow::Result<f64> {
    let rows = backlog(prefix, 100, offset);
    DB::raw_insert(db.pool(), &rows, event_now()).await?;
    let relay = db
        .outbox
        .relay(Serializing, RelayConfig::new("first").batch_size(100));
    let started = Instant::now();
    match tokio::time::timeout(limit, relay.run_once()).await {
        Ok(report) => {
            report?;
            Ok(started.elapsed().as_secs_f64() * 1000.0)
        }
        Err(_) => {
            DB::raw(
                db.pool(),
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()",
            )
            .await?;
            Ok(limit.as_secs_f64() * 1000.0)
        }
    }
}

/// [`batch_latency`] without the maintenance after the fill: the statistics stay as they are.
async fn batch_latency_unsettled<DB: BenchDb>(
    db: &TestDb<DB>,
    prefix: &str,
    offset: usize,
) -> anyhow::Result<f64> {
    let rows = backlog(prefix, 22 * 100, offset);
    for chunk in rows.chunks(1000) {
        DB::raw_insert(db.pool(), chunk, event_now()).await?;
    }
    measure_batches(db).await
}

/// The median time of one relay batch of 100 (claim, publish, mark) over 2000 pending events,
/// after two batches that warm the caches.
async fn batch_latency<DB: BenchDb>(
    db: &TestDb<DB>,
    prefix: &str,
    offset: usize,
) -> anyhow::Result<f64> {
    let (warm_up, measured) = (2, 20);
    let rows = backlog(prefix, (warm_up + measured) * 100, offset);
    for chunk in rows.chunks(1000) {
        DB::raw_insert(db.pool(), chunk, event_now()).await?;
    }
    DB::settle(db.pool()).await?;
    measure_batches(db).await
}

/// The median time of one relay batch of 100 over 20 batches, after two that warm the caches.
async fn measure_batches<DB: BenchDb>(db: &TestDb<DB>) -> anyhow::Result<f64> {
    let (warm_up, measured) = (2, 20);
    let relay = db
        .outbox
        .relay(Serializing, RelayConfig::new("latency").batch_size(100));
    let mut times = Vec::new();
    for batch in 0..warm_up + measured {
        let started = Instant::now();
        let report = relay.run_once().await?;
        if batch >= warm_up {
            // The first batches after a bulk fill meet cold caches on every run alike.
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        anyhow::ensure!(
            report.published == 100,
            "a batch published {}",
            report.published
        );
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// `count` events over `count / 10` aggregates, ten each, interleaved as a busy service commits.
fn backlog(prefix: &str, count: usize, offset: usize) -> Vec<RawRow> {
    let aggregates = (count / 10).max(1);
    (0..count)
        .map(|k| RawRow {
            event_no: format!("{prefix}-{}", k + offset),
            aggregate_id: format!("{prefix}-a{}", (k % aggregates) + offset),
            sequence: (k / aggregates) as i64 + 1,
        })
        .collect()
}

fn event_now() -> chrono::DateTime<Utc> {
    let now = Utc::now();
    chrono::DurationRound::duration_trunc(now, chrono::TimeDelta::microseconds(1)).unwrap_or(now)
}

/// Archiving, per backend: the rate of moving `--published` final rows to the archive against
/// the raw multi-row INSERT rate of rows of the same shape, and a relay's drain rate while the
/// archiver runs against its rate alone, all measured in one run on one fresh database.
async fn archive_bench(args: &Args) -> anyhow::Result<()> {
    let mut results = Vec::new();
    let all = args.backend == "all";
    if all || args.backend == "sqlite" {
        let db = TestDb::sqlite().await.context("SQLite")?;
        results.push(archive_one("sqlite", &db, args).await?);
        db.cleanup().await;
    }
    if all || args.backend == "postgres" {
        let db = TestDb::postgres()
            .await
            .context("PostgreSQL is unreachable")?;
        results.push(archive_one("postgres", &db, args).await?);
        db.cleanup().await;
    }
    if all || args.backend == "mysql" {
        let db = TestDb::mysql()
            .await
            .context("MariaDB/MySQL is unreachable")?;
        results.push(archive_one("mysql", &db, args).await?);
        db.cleanup().await;
    }
    let report = serde_json::json!({
        "machine": machine(),
        "measuredAt": Utc::now(),
        "publishedRows": args.published,
        "results": results,
    });
    std::fs::create_dir_all("benches/results")?;
    std::fs::write(
        "benches/results/archive.json",
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// Rows per archive transaction: `eventctl outbox archive`'s default. (The raw INSERT baseline
/// writes 5000 rows per transaction; larger archive batches hold SQLite's one write lock longer
/// and cost a relay beside them more than they gain.)
const ARCHIVE_BATCH: u32 = 1000;

async fn archive_one<DB: BenchDb>(
    name: &str,
    db: &TestDb<DB>,
    args: &Args,
) -> anyhow::Result<serde_json::Value>
where
    event_sqlx::Relay<DB, Serializing>: Send,
{
    eprintln!("== {name}: archive");
    let rows = usize::try_from(args.published).unwrap_or(1_000_000);
    // The raw multi-row INSERT of as many rows of the same shape, into the same table: the
    // baseline. Inserting into a table as large as the one archived from, not a small one, is
    // what makes the two rates comparable.
    let raw = backlog("R", rows, 0);
    let started = Instant::now();
    for chunk in raw.chunks(5000) {
        DB::raw_insert(db.pool(), chunk, event_now()).await?;
    }
    let raw_rate = raw.len() as f64 / started.elapsed().as_secs_f64();
    DB::truncate(db.pool()).await?;

    // Archiving alone.
    DB::fill_published(db.pool(), 0, args.published).await?;
    DB::settle(db.pool()).await?;
    let started = Instant::now();
    let report = db
        .outbox
        .archive(Duration::ZERO, ARCHIVE_BATCH, |_| {})
        .await?;
    let archive_secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        report.moved == rows as u64,
        "archived {} of {rows}",
        report.moved
    );
    let archive_rate = report.moved as f64 / archive_secs;
    eprintln!("   raw insert {raw_rate:.0}/s, archive {archive_rate:.0}/s");

    // A relay's drain alone, then while the archiver moves another full history.
    DB::fill_published(db.pool(), 1_000_000_000, args.published).await?;
    DB::settle(db.pool()).await?;
    let drain = async |prefix: &str, offset: usize| -> anyhow::Result<f64> {
        let pending = backlog(prefix, 50_000, offset);
        for chunk in pending.chunks(5000) {
            DB::raw_insert(db.pool(), chunk, event_now()).await?;
        }
        let relay = db.outbox.relay(
            Serializing,
            RelayConfig::new("drain").batch_size(args.batch),
        );
        let started = Instant::now();
        let published = relay.drain().await?.published;
        anyhow::ensure!(published == pending.len(), "drained {published}");
        Ok(published as f64 / started.elapsed().as_secs_f64())
    };
    let alone = drain("A", 10_000_000).await?;
    let archiver = {
        let outbox = db.outbox.clone();
        tokio::spawn(async move { outbox.archive(Duration::ZERO, ARCHIVE_BATCH, |_| {}).await })
    };
    let beside = drain("B", 20_000_000).await?;
    let archived_beside = archiver.await??.moved;
    eprintln!("   drain alone {alone:.0}/s, beside the archiver {beside:.0}/s");
    Ok(serde_json::json!({
        "backend": name,
        "rawInsertRowsPerSecond": raw_rate,
        "archiveRowsPerSecond": archive_rate,
        "archiveVsRawInsert": archive_rate / raw_rate,
        "drainAlonePerSecond": alone,
        "drainBesideArchiverPerSecond": beside,
        "drainBesideVsAlone": beside / alone,
        "archivedBesideTheDrain": archived_beside,
        "archiveBatch": ARCHIVE_BATCH,
    }))
}

/// How the checker's time grows with the input: enums of 10k to 200k values (one value
/// removed), and anyOf lists of 300 to 3,000 subschemas, tagged (one variant added) and untagged
/// (every subschema's title changed), each against parsing the same two documents in the same
/// run. Near-linear growth keeps `checkVsParse` roughly flat as the size grows twentyfold.
fn checker_scaling() -> anyhow::Result<serde_json::Value> {
    use event_core::schema::{Mode, check};
    use serde_json::json;
    let measure =
        |old: &serde_json::Value, new: &serde_json::Value| -> anyhow::Result<serde_json::Value> {
            let (old_text, new_text) = (old.to_string(), new.to_string());
            let started = Instant::now();
            let parsed: (serde_json::Value, serde_json::Value) = (
                serde_json::from_str(&old_text)?,
                serde_json::from_str(&new_text)?,
            );
            let parse = started.elapsed().as_secs_f64();
            let started = Instant::now();
            let report = check(&parsed.0, &parsed.1, Mode::Backward)?;
            let seconds = started.elapsed().as_secs_f64();
            Ok(json!({
                "seconds": seconds,
                "parseSeconds": parse,
                "checkVsParse": seconds / parse,
                "compatible": report.is_compatible(),
            }))
        };
    let mut enums = serde_json::Map::new();
    for n in [10_000_usize, 50_000, 200_000] {
        let values = |skip: usize| -> Vec<String> {
            (0..n)
                .filter(|&i| i != skip)
                .map(|i| format!("v{i}"))
                .collect()
        };
        let result = measure(
            &json!({ "enum": values(n) }),
            &json!({ "enum": values(n / 2) }),
        )?;
        enums.insert(n.to_string(), result);
    }
    let mut tagged = serde_json::Map::new();
    let mut untagged = serde_json::Map::new();
    for n in [300_usize, 1_000, 3_000] {
        let variants = |count: usize| -> Vec<serde_json::Value> {
            (0..count)
                .map(|i| json!({
                    "type": "object",
                    "properties": { "kind": { "const": format!("k{i}") }, "amount": { "type": "integer" } },
                    "required": ["kind"]
                }))
                .collect()
        };
        tagged.insert(
            n.to_string(),
            measure(
                &json!({ "anyOf": variants(n) }),
                &json!({ "anyOf": variants(n + 1) }),
            )?,
        );
        let titled = |prefix: &str| -> Vec<serde_json::Value> {
            (0..n)
                .map(|i| json!({ "type": "string", "title": format!("{prefix}{i}") }))
                .collect()
        };
        untagged.insert(
            n.to_string(),
            measure(
                &json!({ "anyOf": titled("old") }),
                &json!({ "anyOf": titled("new") }),
            )?,
        );
    }
    let growth = |table: &serde_json::Map<String, serde_json::Value>, small: &str, big: &str| {
        table[big]["seconds"].as_f64().unwrap_or(0.0)
            / table[small]["seconds"].as_f64().unwrap_or(1.0)
    };
    Ok(json!({
        "enum": enums,
        "enumGrowth10kTo200k": growth(&enums, "10000", "200000"),
        "anyOfTagged": tagged,
        "anyOfTaggedGrowth300To3000": growth(&tagged, "300", "3000"),
        "anyOfUntagged": untagged,
        "anyOfUntaggedGrowth300To3000": growth(&untagged, "300", "3000"),
    }))
}

/// Checks `types` event types with 3 versions each (BACKWARD_TRANSITIVE, serde profile), against
/// the baseline of parsing the same schema texts, measured in the same run.
fn schema_bench(types: usize) -> anyhow::Result<()> {
    use event_core::schema::{Mode, Profile, check_history};
    let version = |t: usize, v: usize| {
        let mut properties = serde_json::Map::new();
        for f in 0..(8 + v) {
            properties.insert(
                format!("field_{f}"),
                serde_json::json!({"type": "string", "maxLength": 64}),
            );
        }
        properties.insert(
            "amount".into(),
            serde_json::json!({"type": "integer", "format": if v < 2 { "int32" } else { "int64" }}),
        );
        properties.insert(
            "address".into(),
            serde_json::json!({"$ref": "#/$defs/Address"}),
        );
        serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": format!("Event{t}"),
            "type": "object",
            "properties": properties,
            "required": ["field_0", "amount"],
            "$defs": {"Address": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": ["string", "null"]}}}}
        })
        .to_string()
    };
    let texts: Vec<Vec<String>> = (0..types)
        .map(|t| (0..3).map(|v| version(t, v)).collect())
        .collect();

    let started = Instant::now();
    let mut parsed = 0;
    for history in &texts {
        for text in history {
            let value: serde_json::Value = serde_json::from_str(text)?;
            parsed += usize::from(value.is_object());
        }
    }
    let parse = started.elapsed();

    let started = Instant::now();
    let mut compatible = 0;
    for history in &texts {
        let values: Vec<serde_json::Value> = history
            .iter()
            .map(|t| serde_json::from_str(t))
            .collect::<Result<_, _>>()?;
        if check_history(&values, Mode::BackwardTransitive, Profile::Serde)?.is_compatible() {
            compatible += 1;
        }
    }
    let check = started.elapsed();
    anyhow::ensure!(
        parsed == types * 3 && compatible == types,
        "{compatible} of {types} histories compatible"
    );
    let scaling = checker_scaling()?;
    let report = serde_json::json!({
        "machine": machine(),
        "measuredAt": Utc::now(),
        "scaling": scaling,
        "eventTypes": types,
        "versionsEach": 3,
        "checkSeconds": check.as_secs_f64(),
        "parseOnlySeconds": parse.as_secs_f64(),
        "checkVsParse": check.as_secs_f64() / parse.as_secs_f64(),
        "perEventTypeMicros": check.as_secs_f64() * 1e6 / types as f64,
    });
    std::fs::create_dir_all("benches/results")?;
    std::fs::write(
        "benches/results/schema.json",
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
