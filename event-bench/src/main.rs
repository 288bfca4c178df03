//! The benchmark harness. Every figure is a ratio against a baseline measured in the same run on
//! the same database, because the machine is noisy. Each mode is a module; without a mode flag
//! it runs the outbox benchmark ([`outbox`]):
//! `cargo run --release -p event-bench -- --backend all` writes `benches/results/outbox.json`.

mod archive;
mod backlog;
mod charts;
mod console;
mod cpu;
mod delivery;
mod derive_build;
mod outbox;
mod producer;
mod reconcile;
mod schema;
mod settle;
mod sql;
mod throughput;
mod wal;
mod wire;

use std::path::PathBuf;

use clap::Parser;

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
    /// profile, against a one-column, one-index row and a four-column, one-index one
    /// (benches/results/producer.json); this many transactions per variant.
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
    /// Instead of the outbox: the cost of each wire format (the envelope, CloudEvents binary and
    /// structured) in a relay's drain and a batched consumer, a backlog of this many events per
    /// broker and format (benches/results/wire-formats.json).
    #[arg(long)]
    wire_formats: Option<usize>,
    /// With --throughput or --wire-formats: which brokers (`all`, or a comma-separated list of nats, rabbitmq,
    /// kafka).
    #[arg(long, default_value = "all")]
    brokers: String,
    /// With --throughput: only the latency runs (at 500 events/s and at saturation), without
    /// the backlog runs.
    #[arg(long, conflicts_with = "backlog_only")]
    latency_only: bool,
    /// With --throughput: only the backlog runs, without the latency runs.
    #[arg(long)]
    backlog_only: bool,
    /// With --throughput: the outbox table in the lean index profile (PostgreSQL), written to
    /// benches/results/throughput-lean.json.
    #[arg(long)]
    lean: bool,
    /// With --throughput: the relays' claims and marks wait for the disk
    /// (`RelayConfig::synchronous_commit(true)`); the results are written beside the
    /// default run's, with `-sync` in the file name.
    #[arg(long)]
    relay_synchronous_commit: bool,
    /// With --throughput: the relays' `RelayConfig::linger`, in milliseconds (10 by default, as
    /// the relay's own default).
    #[arg(long, default_value_t = 10)]
    relay_linger_ms: u64,
    /// With --throughput: the consumers' `Consumer::concurrency`, the transactions a batch is
    /// applied in at once (1, one at a time, by default, as the consumer's own default).
    #[arg(long, default_value_t = 1)]
    consumer_concurrency: u64,
    /// With --throughput: how `Outbox::commit` sends the producers' events on PostgreSQL
    /// (`auto`, `one-trip` or `bound`; see `OutboxConfig::commit_path`).
    #[arg(long, default_value = "auto", value_parser = ["auto", "one-trip", "bound"])]
    commit_path: String,
    /// With --throughput: the producer counts of the saturation runs (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4, 16])]
    saturating_producers: Vec<usize>,
    /// Draws the performance chapter's charts from `benches/results` into this directory.
    #[arg(long)]
    charts: Option<PathBuf>,
    /// Runs the harness (producers, relays, consumers, baselines) on Tokio's current-thread
    /// runtime instead of one worker thread per core; with --throughput the results are written
    /// beside the default run's, with `-current-thread` in the file name.
    #[arg(long)]
    current_thread: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = if args.current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    if let Some(dir) = &args.charts {
        return charts::run(dir);
    }
    if let Some(types) = args.schema_types {
        return schema::schema_bench(types);
    }
    if let Some(events) = args.delivery {
        return delivery::run(events).await;
    }
    if args.archive {
        return archive::archive_bench(&args).await;
    }
    if let Some(transactions) = args.producer {
        return producer::run(transactions).await;
    }
    if let Some(events) = args.throughput {
        let profile = if args.lean {
            event_sqlx::IndexProfile::Lean
        } else {
            event_sqlx::IndexProfile::Seed
        };
        let runs = throughput::Runs {
            backlog: !args.latency_only,
            latency: !args.backlog_only,
            saturating_producers: args.saturating_producers.clone(),
        };
        throughput::RELAY_LINGER_MS
            .store(args.relay_linger_ms, std::sync::atomic::Ordering::Relaxed);
        throughput::CONSUMER_CONCURRENCY.store(
            args.consumer_concurrency,
            std::sync::atomic::Ordering::Relaxed,
        );
        let commit_path = match args.commit_path.as_str() {
            "one-trip" => event_sqlx::CommitPath::OneTrip,
            "bound" => event_sqlx::CommitPath::Bound,
            _ => event_sqlx::CommitPath::Auto,
        };
        throughput::COMMIT_PATH
            .set(commit_path)
            .map_err(|_| anyhow::anyhow!("the commit path was set twice"))?;
        throughput::RELAY_SYNCHRONOUS_COMMIT.store(
            args.relay_synchronous_commit,
            std::sync::atomic::Ordering::Relaxed,
        );
        return throughput::run(events, &args.brokers, runs, profile).await;
    }
    if let Some(events) = args.wire_formats {
        return wire::run(events, &args.brokers).await;
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
    outbox::run(&args).await
}

/// Writes a benchmark's report to `path` (under `benches/results`) and prints it.
pub(crate) fn write_result(
    path: impl AsRef<std::path::Path>,
    report: &serde_json::Value,
) -> anyhow::Result<()> {
    let path = path.as_ref();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(path, format!("{text}\n"))?;
    println!("{text}");
    Ok(())
}

pub(crate) fn machine() -> String {
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
