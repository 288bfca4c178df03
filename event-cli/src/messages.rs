//! `eventctl messages`: the message event table (biz_message_event), with the same exit codes
//! and `--json` as `eventctl outbox`.

use std::process::ExitCode;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use clap::Subcommand;
use event_sqlx::{Backend, MessageRecord, MessageStore};

use crate::check::{Backlog, BacklogLimits};
use crate::db::DbArgs;
use crate::db::with_outbox;
use crate::output;

/// `eventctl messages ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum MessagesCommand {
    /// Counts per status over a time range, the oldest pending message, and stuck ones.
    Status {
        #[command(flatten)]
        db: DbArgs,
        /// Only this event type.
        #[arg(long)]
        event_type: Option<String>,
        /// How far back, in hours (1 to 87600, ten years).
        #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(i64).range(1..=87_600))]
        hours: i64,
        /// A message in progress for longer than this counts as stuck (its worker died or hangs).
        #[arg(long, default_value = "10m", value_parser = crate::args::duration)]
        stuck_after: Duration,
    },
    /// For cron jobs and probes: exit 0 when every threshold holds, 1 when one is crossed (one
    /// line per threshold either way), 2 when the database cannot be read.
    Check {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        limits: BacklogLimits,
        /// A message in progress for longer than this counts as stuck.
        #[arg(long, default_value = "10m", value_parser = crate::args::duration)]
        stuck_after: Duration,
    },
    /// Pending messages, oldest first.
    Pending {
        #[command(flatten)]
        db: DbArgs,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Failed messages with at least N retries, most recent first.
    Failed {
        #[command(flatten)]
        db: DbArgs,
        /// Only messages with at least this many retries.
        #[arg(long, default_value_t = 0)]
        min_retries: u16,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// One message, every column.
    Show {
        #[command(flatten)]
        db: DbArgs,
        /// The event number.
        event_no: String,
    },
    /// Put a failed message back to pending, due now, its retries counted afresh.
    Retry {
        #[command(flatten)]
        db: DbArgs,
        /// The event number.
        event_no: String,
    },
    /// Cancel a pending or failed message.
    Cancel {
        #[command(flatten)]
        db: DbArgs,
        /// The event number.
        event_no: String,
        /// Why (stored in fail_reason).
        #[arg(long)]
        reason: String,
    },
    /// Move succeeded and cancelled messages older than a retention to biz_message_event_archive,
    /// in batches, beside live workers.
    Archive(crate::archive::ArchiveArgs),
}

impl MessagesCommand {
    fn db(&self) -> &DbArgs {
        match self {
            MessagesCommand::Status { db, .. }
            | MessagesCommand::Check { db, .. }
            | MessagesCommand::Pending { db, .. }
            | MessagesCommand::Failed { db, .. }
            | MessagesCommand::Show { db, .. }
            | MessagesCommand::Retry { db, .. }
            | MessagesCommand::Cancel { db, .. } => db,
            MessagesCommand::Archive(args) => &args.db,
        }
    }
}

pub(crate) async fn run(command: MessagesCommand) -> anyhow::Result<ExitCode> {
    let db = command.db().clone();
    with_outbox!(&db, |outbox| {
        let store = MessageStore::new(outbox.pool().clone());
        run_messages(&store, command).await
    })
}

async fn run_messages<DB: Backend>(
    store: &MessageStore<DB>,
    command: MessagesCommand,
) -> anyhow::Result<ExitCode> {
    let json = command.db().json;
    match command {
        MessagesCommand::Status {
            event_type,
            hours,
            stuck_after,
            ..
        } => {
            let to = Utc::now() + TimeDelta::minutes(1);
            let from = to - TimeDelta::hours(hours.max(1));
            let counts = store.status_counts(event_type.as_deref(), from..to).await?;
            let health = store.health(stuck_after).await?;
            if json {
                output::json(&serde_json::json!({ "counts": counts, "health": health }))?;
            } else {
                println!(
                    "last {hours} h{}: {} pending, {} in progress, {} succeeded, {} failed, {} cancelled",
                    event_type.map(|t| format!(" of {t}")).unwrap_or_default(),
                    counts.pending,
                    counts.in_progress,
                    counts.succeeded,
                    counts.failed,
                    counts.cancelled
                );
                match health.oldest_pending_seconds {
                    Some(age) => println!("oldest pending message: {age} s old"),
                    None => println!("no pending message"),
                }
                println!(
                    "in progress for more than {}: {}",
                    humantime::format_duration(stuck_after),
                    health.stuck
                );
            }
        }
        MessagesCommand::Check {
            limits,
            stuck_after,
            ..
        } => {
            let health = store.health(stuck_after).await?;
            let backlog = Backlog {
                oldest_pending_seconds: health.oldest_pending_seconds,
                pending: health.pending,
                failed: health.failed,
                stuck: health.stuck,
                stuck_name: "stuck in progress",
            };
            return limits.report(&backlog, &health, json);
        }
        MessagesCommand::Pending { limit, .. } => {
            print_messages(&store.pending(limit).await?, json)?
        }
        MessagesCommand::Failed {
            min_retries, limit, ..
        } => print_messages(&store.many_failures(min_retries, limit).await?, json)?,
        MessagesCommand::Show { event_no, .. } => match store.by_event_no(&event_no).await? {
            Some(record) => output::json(&record)?,
            None => {
                eprintln!("eventctl: no message has event_no {event_no}");
                return Ok(ExitCode::from(1));
            }
        },
        MessagesCommand::Retry { event_no, .. } => {
            return crate::ops::report_action(
                store.retry(&event_no).await?,
                &event_no,
                "put back to pending",
                "it is not failed (only failed messages can be retried)",
                json,
            );
        }
        MessagesCommand::Cancel {
            event_no, reason, ..
        } => {
            return crate::ops::report_action(
                store.cancel(&event_no, &reason).await?,
                &event_no,
                "cancelled",
                "it is not pending or failed (in-progress, succeeded and cancelled messages stay as they are)",
                json,
            );
        }
        MessagesCommand::Archive(args) => return crate::archive::messages(store, &args).await,
    }
    Ok(ExitCode::SUCCESS)
}

fn print_messages(records: &[MessageRecord], json: bool) -> anyhow::Result<()> {
    if json {
        return output::json(&records);
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                r.event_no.clone(),
                r.event_type.clone(),
                format!("{}/{}", r.biz_type, r.biz_id),
                r.event_status.to_string(),
                format!("{}/{}", r.retry_count, r.max_retry_count),
                output::time(r.next_retry_time),
                r.fail_reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    output::table(
        &[
            "EVENT_NO",
            "TYPE",
            "BIZ",
            "STATUS",
            "RETRIES",
            "NEXT_RETRY",
            "FAIL_REASON",
        ],
        &rows,
    );
    println!("({} messages)", records.len());
    Ok(())
}
