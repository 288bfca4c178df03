//! `eventctl quarantine` and `eventctl inbox`: consumers' quarantine and inbox, for operators.
//! No handler code runs here: a requeued entry is replayed by the running consumer.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use event_sqlx::{
    Backend, FailureClass, Inbox, Quarantine, QuarantineFilter, QuarantineRecord, QuarantineStatus,
};

use crate::check::{self, Threshold};
use crate::db::DbArgs;
use crate::db::with_outbox;
use crate::output;

/// Which entries.
#[derive(Debug, Clone, Args)]
pub(crate) struct Selector {
    /// Only this event (its eventId).
    #[arg(long)]
    event_id: Option<String>,
    /// Only this event type.
    #[arg(long)]
    event_type: Option<String>,
    /// Only this failure class: transient, permanent, bug, stale, ...
    #[arg(long, value_parser = failure_class)]
    failure_class: Option<FailureClass>,
}

impl Selector {
    fn filter(&self) -> QuarantineFilter<'_> {
        QuarantineFilter {
            event_id: self.event_id.as_deref(),
            event_type: self.event_type.as_deref(),
            failure_class: self.failure_class,
            from: None,
            to: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.event_id.is_none() && self.event_type.is_none() && self.failure_class.is_none()
    }
}

fn failure_class(name: &str) -> Result<FailureClass, String> {
    FailureClass::from_name(name).map_err(|e| e.to_string())
}

fn status(name: &str) -> Result<QuarantineStatus, String> {
    QuarantineStatus::from_name(name).ok_or_else(|| {
        format!(
            "unknown quarantine status `{name}`: use quarantined, requeued, replayed or cancelled"
        )
    })
}

/// `eventctl quarantine ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum QuarantineCommand {
    /// Entries per consumer and status.
    Status {
        #[command(flatten)]
        db: DbArgs,
    },
    /// For cron jobs and probes: exit 0 when the quarantine holds at most N entries waiting
    /// (quarantined or requeued), of one consumer or all, 1 when it holds more.
    Check {
        #[command(flatten)]
        db: DbArgs,
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
        /// Crossed when more entries than this wait for a fix.
        #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
        max_entries: Option<i64>,
    },
    /// Entries, oldest first: of one consumer or all, in one status (default: quarantined).
    List {
        #[command(flatten)]
        db: DbArgs,
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
        /// quarantined, requeued, replayed or cancelled.
        #[arg(long, default_value = "quarantined", value_parser = status)]
        status: QuarantineStatus,
        #[command(flatten)]
        selector: Selector,
        /// Entries after this id (the last id of the previous page).
        #[arg(long, default_value_t = 0)]
        after_id: i64,
        /// At most this many.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
    },
    /// One entry, every column, the body included.
    Show {
        #[command(flatten)]
        db: DbArgs,
        /// The entry's id (from `list`).
        id: i64,
    },
    /// Mark quarantined entries of a consumer for replay: the running consumer replays them with
    /// its own handlers on its next loop, and quarantines again any that still fail.
    Requeue {
        #[command(flatten)]
        db: DbArgs,
        /// The consumer whose entries to requeue.
        #[arg(long)]
        consumer: String,
        #[command(flatten)]
        selector: Selector,
        /// Requeue every quarantined entry of the consumer (needed when no filter is given).
        #[arg(long)]
        all: bool,
    },
    /// Cancel an entry: it is never replayed.
    Cancel {
        #[command(flatten)]
        db: DbArgs,
        /// The entry's id.
        id: i64,
        /// Why (replaces the stored reason).
        #[arg(long)]
        reason: String,
    },
    /// Delete replayed and cancelled entries settled longer ago than a retention.
    Prune {
        #[command(flatten)]
        db: DbArgs,
        /// Retention, e.g. 30d.
        #[arg(long, value_parser = crate::args::duration)]
        older_than: Duration,
        /// Rows per delete statement.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch: u32,
    },
}

impl QuarantineCommand {
    fn db(&self) -> &DbArgs {
        match self {
            QuarantineCommand::Status { db }
            | QuarantineCommand::Check { db, .. }
            | QuarantineCommand::List { db, .. }
            | QuarantineCommand::Show { db, .. }
            | QuarantineCommand::Requeue { db, .. }
            | QuarantineCommand::Cancel { db, .. }
            | QuarantineCommand::Prune { db, .. } => db,
        }
    }
}

pub(crate) async fn run(command: QuarantineCommand) -> anyhow::Result<ExitCode> {
    let db = command.db().clone();
    with_outbox!(&db, |outbox| {
        let quarantine = Quarantine::new(outbox.pool().clone());
        run_quarantine(&quarantine, command).await
    })
}

async fn run_quarantine<DB: Backend>(
    quarantine: &Quarantine<DB>,
    command: QuarantineCommand,
) -> anyhow::Result<ExitCode> {
    let json = command.db().json;
    match command {
        QuarantineCommand::Status { .. } => {
            let counts = quarantine.counts().await?;
            if json {
                output::json(&counts)?;
            } else if counts.is_empty() {
                println!("the quarantine is empty");
            } else {
                let rows: Vec<Vec<String>> = counts
                    .iter()
                    .map(|c| {
                        vec![
                            c.consumer.clone(),
                            c.status.to_string(),
                            c.entries.to_string(),
                        ]
                    })
                    .collect();
                output::table(&["CONSUMER", "STATUS", "ENTRIES"], &rows);
            }
        }
        QuarantineCommand::Check {
            consumer,
            max_entries,
            ..
        } => {
            let counts = quarantine.counts().await?;
            let waiting: i64 = counts
                .iter()
                .filter(|c| consumer.as_deref().is_none_or(|name| c.consumer == name))
                .filter(|c| {
                    matches!(
                        c.status,
                        QuarantineStatus::Quarantined | QuarantineStatus::Requeued
                    )
                })
                .map(|c| c.entries)
                .sum();
            return check::report(
                vec![max_entries.map(|l| Threshold::count("quarantined entries", waiting, l))],
                &counts,
                json,
                "--max-entries",
            );
        }
        QuarantineCommand::List {
            consumer,
            status,
            selector,
            after_id,
            limit,
            ..
        } => {
            let entries = quarantine
                .entries(
                    consumer.as_deref(),
                    Some(status),
                    &selector.filter(),
                    after_id,
                    limit,
                )
                .await?;
            print_entries(&entries, json)?;
        }
        QuarantineCommand::Show { id, .. } => match quarantine.entry(id).await? {
            Some(entry) => output::json(&entry)?,
            None => {
                eprintln!("eventctl: no quarantine entry has id {id}");
                return Ok(ExitCode::from(1));
            }
        },
        QuarantineCommand::Requeue {
            consumer,
            selector,
            all,
            ..
        } => {
            if selector.is_empty() && !all {
                anyhow::bail!(
                    "requeue which entries of {consumer}? give --event-id, --event-type or --failure-class, or --all for every quarantined entry"
                );
            }
            let requeued = quarantine.requeue(&consumer, &selector.filter()).await?;
            if json {
                output::json(&serde_json::json!({ "consumer": consumer, "requeued": requeued }))?;
            } else if requeued > 0 {
                println!(
                    "requeued {requeued} entries of {consumer}; the running consumer replays them on its next loop (eventctl quarantine list --consumer {consumer} --status requeued shows those still waiting)"
                );
            } else {
                eprintln!("eventctl: {consumer} has no quarantined entry matching the filter");
                return Ok(ExitCode::from(1));
            }
        }
        QuarantineCommand::Cancel { id, reason, .. } => {
            return crate::ops::report_action(
                quarantine.cancel(id, &reason).await?,
                &format!("quarantine entry {id}"),
                "cancelled",
                "it was already replayed or cancelled",
                json,
            );
        }
        QuarantineCommand::Prune {
            older_than, batch, ..
        } => {
            let deleted = quarantine.prune(older_than, batch).await?;
            if json {
                output::json(&serde_json::json!({ "deleted": deleted }))?;
            } else {
                println!(
                    "deleted {deleted} replayed or cancelled entries settled more than {} ago",
                    humantime::format_duration(older_than)
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_entries(entries: &[QuarantineRecord], json: bool) -> anyhow::Result<()> {
    if json {
        return output::json(&entries);
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.id.to_string(),
                e.consumer.clone(),
                e.event_id.clone(),
                e.event_type.clone().unwrap_or_default(),
                e.failure_class.to_string(),
                e.status.to_string(),
                e.retry_count.to_string(),
                output::time(Some(e.last_failure_time)),
                e.reason.chars().take(80).collect(),
            ]
        })
        .collect();
    output::table(
        &[
            "ID",
            "CONSUMER",
            "EVENT_ID",
            "TYPE",
            "CLASS",
            "STATUS",
            "TRIES",
            "LAST_FAILURE",
            "REASON",
        ],
        &rows,
    );
    println!("({} entries)", entries.len());
    Ok(())
}

/// `eventctl inbox ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum InboxCommand {
    /// Delete a consumer's inbox records (consumed_event) older than a retention. Keep it longer
    /// than any redelivery or replay window: an event redelivered after its record is gone is
    /// applied again.
    Prune {
        #[command(flatten)]
        db: DbArgs,
        /// The consumer.
        #[arg(long)]
        consumer: String,
        /// Retention, e.g. 30d.
        #[arg(long, value_parser = crate::args::duration)]
        older_than: Duration,
        /// Rows per delete statement.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch: u32,
    },
}

pub(crate) async fn inbox(command: InboxCommand) -> anyhow::Result<ExitCode> {
    let InboxCommand::Prune {
        db,
        consumer,
        older_than,
        batch,
    } = command;
    let deleted = with_outbox!(&db, |outbox| {
        Inbox::new(outbox.pool().clone(), consumer.clone())
            .prune(older_than, batch)
            .await?
    });
    if db.json {
        output::json(&serde_json::json!({ "consumer": consumer, "deleted": deleted }))?;
    } else {
        println!(
            "deleted {deleted} inbox records of {consumer} consumed more than {} ago",
            humantime::format_duration(older_than)
        );
    }
    Ok(ExitCode::SUCCESS)
}
