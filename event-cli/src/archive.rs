//! `eventctl outbox archive`, `eventctl messages archive` and `eventctl archive purge`: final rows
//! older than a retention move to the archive tables in batches, with progress on a terminal.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use event_sqlx::{ArchiveReport, Backend, MessageStore, Outbox};

use crate::db::DbArgs;
use crate::output;

/// Options of an archive run.
#[derive(Debug, Args)]
pub(crate) struct ArchiveArgs {
    #[command(flatten)]
    pub(crate) db: DbArgs,
    /// Move final rows last updated longer ago than this (e.g. 7d).
    #[arg(long, value_parser = crate::args::duration)]
    older_than: Duration,
    /// Rows per transaction (1 to 10000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch: u32,
    /// Count what would move, and move nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Options of `eventctl archive purge`.
#[derive(Debug, Args)]
pub(crate) struct PurgeArgs {
    #[command(flatten)]
    pub(crate) db: DbArgs,
    /// Delete archived rows last updated longer ago than this (e.g. 90d).
    #[arg(long, value_parser = crate::args::duration)]
    older_than: Duration,
    /// Rows per statement (1 to 10000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch: u32,
}

/// Shows progress: a bar with rate and ETA on a terminal, a plain line per few seconds otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    started: Instant,
    last_line: Instant,
    what: String,
}

impl Progress {
    fn new(what: &str, total: u64, json: bool) -> Progress {
        let bar = (!json && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:30}] {pos}/{len} rows, {per_sec}, ETA {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_message(what.to_owned());
            bar
        });
        Progress {
            bar,
            started: Instant::now(),
            last_line: Instant::now(),
            what: what.to_owned(),
        }
    }

    fn update(&mut self, moved: u64) {
        match &self.bar {
            Some(bar) => bar.set_position(moved),
            None if self.last_line.elapsed() >= Duration::from_secs(5) => {
                self.last_line = Instant::now();
                let rate = moved as f64 / self.started.elapsed().as_secs_f64().max(0.001);
                eprintln!("{}: {moved} rows moved, {rate:.0} rows/s", self.what);
            }
            None => {}
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Archives the outbox or the message table, as `archive` and `archivable` say.
async fn run(
    what: &str,
    json: bool,
    dry_run: bool,
    archivable: u64,
    archive: impl AsyncFnOnce(&mut Progress) -> Result<ArchiveReport, event_sqlx::Error>,
) -> anyhow::Result<ExitCode> {
    if dry_run {
        if json {
            output::json(&serde_json::json!({ "table": what, "wouldMove": archivable }))?;
        } else {
            println!(
                "{what}: {archivable} rows would move to the archive (dry run: nothing moved)"
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut progress = Progress::new(what, archivable, json);
    let started = Instant::now();
    let report = archive(&mut progress).await;
    progress.finish();
    let report = report?;
    if json {
        output::json(&report)?;
    } else {
        println!(
            "{}: {} rows moved to {} in {} batches ({:.1} s), last updated before {}",
            report.table,
            report.moved,
            report.archive,
            report.batches,
            started.elapsed().as_secs_f64(),
            report.cutoff.format("%Y-%m-%d %H:%M:%S UTC")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `eventctl outbox archive`.
pub(crate) async fn outbox<DB: Backend>(
    outbox: &Outbox<DB>,
    args: &ArchiveArgs,
) -> anyhow::Result<ExitCode> {
    let archivable = outbox.archivable(args.older_than).await?;
    run(
        outbox.config().table_name().as_str(),
        args.db.json,
        args.dry_run,
        archivable,
        async |progress: &mut Progress| {
            outbox
                .archive(args.older_than, args.batch, |moved| progress.update(moved))
                .await
        },
    )
    .await
}

/// `eventctl messages archive`.
pub(crate) async fn messages<DB: Backend>(
    store: &MessageStore<DB>,
    args: &ArchiveArgs,
) -> anyhow::Result<ExitCode> {
    let archivable = store.archivable(args.older_than).await?;
    run(
        "biz_message_event",
        args.db.json,
        args.dry_run,
        archivable,
        async |progress: &mut Progress| {
            store
                .archive(args.older_than, args.batch, |moved| progress.update(moved))
                .await
        },
    )
    .await
}

/// `eventctl archive purge`: both archive tables.
pub(crate) async fn purge<DB: Backend>(
    outbox: &Outbox<DB>,
    args: &PurgeArgs,
) -> anyhow::Result<ExitCode> {
    let store = MessageStore::new(outbox.pool().clone());
    let events = outbox.purge_archive(args.older_than, args.batch).await?;
    let messages = store.purge_archive(args.older_than, args.batch).await?;
    if args.db.json {
        output::json(&serde_json::json!({ "outboxRows": events, "messageRows": messages }))?;
    } else {
        println!(
            "purged {events} archived outbox rows and {messages} archived message rows last updated more than {} ago",
            humantime::format_duration(args.older_than)
        );
    }
    Ok(ExitCode::SUCCESS)
}
