//! Operating the outbox: migrate, inspect, retry, cancel, skip (the relay is `relay.rs`).

use std::process::ExitCode;

use chrono::{TimeDelta, Utc};
use clap::{Args, Subcommand};
use event_sqlx::{Backend, Lease, Outbox, OutboxRecord};

use crate::check::{Backlog, BacklogLimits};
use crate::db::DbArgs;
use crate::db::with_outbox;
use crate::output;

/// `eventctl migrate`.
#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The outbox table's indexes: `seed` (the seed's twelve) or `lean` (PostgreSQL only: four
    /// touched by the producer's insert; the lookups by trace id, event type and topic move to
    /// the archive table). Migrating again with the other profile switches back.
    #[arg(long, value_enum, default_value_t = Profile::Seed)]
    index_profile: Profile,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Profile {
    Seed,
    Lean,
}

pub(crate) async fn migrate(args: &MigrateArgs) -> anyhow::Result<ExitCode> {
    let profile = match args.index_profile {
        Profile::Seed => event_sqlx::IndexProfile::Seed,
        Profile::Lean => event_sqlx::IndexProfile::Lean,
    };
    if profile == event_sqlx::IndexProfile::Lean
        && !matches!(
            crate::db::kind(&args.db.database_url)?,
            crate::db::Kind::Postgres
        )
    {
        anyhow::bail!(
            "--index-profile lean exists for PostgreSQL only; migrate MySQL and SQLite with --index-profile seed (the default)"
        );
    }
    with_outbox!(&args.db, |outbox| {
        let config = outbox.config().clone().index_profile(profile);
        event_sqlx::Outbox::new(outbox.pool().clone(), config)
            .migrate()
            .await?;
    });
    println!("event tables are up to date ({profile:?} index profile)");
    Ok(ExitCode::SUCCESS)
}

/// `eventctl outbox ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum OutboxCommand {
    /// Backlog, lag and counts per status, for one event type or all, over a time range.
    Status {
        #[command(flatten)]
        db: DbArgs,
        /// Only this event type.
        #[arg(long)]
        event_type: Option<String>,
        /// How far back, in hours (1 to 87600, ten years).
        #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(i64).range(1..=87_600))]
        hours: i64,
    },
    /// For cron jobs and probes: exit 0 when every threshold holds, 1 when one is crossed (one
    /// line per threshold either way), 2 when the database cannot be read.
    Check {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        limits: BacklogLimits,
    },
    /// Move published and cancelled events older than a retention to biz_outbox_event_archive,
    /// in batches, beside live relays.
    Archive(crate::archive::ArchiveArgs),
    /// Pending events, oldest first.
    Pending {
        #[command(flatten)]
        db: DbArgs,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Failed events: of one topic, or with at least N retries.
    Failed {
        #[command(flatten)]
        db: DbArgs,
        /// Only this topic.
        #[arg(long)]
        topic: Option<String>,
        /// Only events with at least this many retries.
        #[arg(long, default_value_t = 0)]
        min_retries: u16,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// The leases each relay holds, and the events whose lease expired (their relay died).
    Stuck {
        #[command(flatten)]
        db: DbArgs,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Every event of one aggregate.
    Aggregate {
        #[command(flatten)]
        db: DbArgs,
        /// Aggregate type, e.g. ORDER.
        aggregate_type: String,
        /// Aggregate id.
        aggregate_id: String,
    },
    /// One event, every column.
    Show {
        #[command(flatten)]
        db: DbArgs,
        /// The event number.
        event_no: String,
    },
    /// Put a failed event back to pending for another round of attempts.
    Retry {
        #[command(flatten)]
        db: DbArgs,
        /// The event number.
        event_no: String,
    },
    /// Cancel a pending or failed event.
    Cancel {
        #[command(flatten)]
        db: DbArgs,
        /// The event number.
        event_no: String,
        /// Why (stored in fail_reason).
        #[arg(long)]
        reason: String,
    },
    /// Cancel the earliest unpublished event of a blocked aggregate, so the rest can be published.
    Skip {
        #[command(flatten)]
        db: DbArgs,
        /// Aggregate type.
        aggregate_type: String,
        /// Aggregate id.
        aggregate_id: String,
        /// Why (stored in fail_reason).
        #[arg(long)]
        reason: String,
    },
}

impl OutboxCommand {
    fn db(&self) -> &DbArgs {
        match self {
            OutboxCommand::Status { db, .. }
            | OutboxCommand::Check { db, .. }
            | OutboxCommand::Pending { db, .. }
            | OutboxCommand::Failed { db, .. }
            | OutboxCommand::Stuck { db, .. }
            | OutboxCommand::Aggregate { db, .. }
            | OutboxCommand::Show { db, .. }
            | OutboxCommand::Retry { db, .. }
            | OutboxCommand::Cancel { db, .. }
            | OutboxCommand::Skip { db, .. } => db,
            OutboxCommand::Archive(args) => &args.db,
        }
    }
}

pub(crate) async fn outbox(command: OutboxCommand) -> anyhow::Result<ExitCode> {
    let db = command.db().clone();
    with_outbox!(&db, |outbox| run_outbox(&outbox, command).await)
}

async fn run_outbox<DB: Backend>(
    outbox: &Outbox<DB>,
    command: OutboxCommand,
) -> anyhow::Result<ExitCode> {
    let json = command.db().json;
    match command {
        OutboxCommand::Status {
            event_type, hours, ..
        } => {
            let to = Utc::now() + TimeDelta::minutes(1);
            let from = to - TimeDelta::hours(hours.max(1));
            let counts = outbox
                .status_counts(event_type.as_deref(), from..to)
                .await?;
            let oldest = outbox.pending(1).await?.into_iter().next();
            let lag_seconds = oldest
                .as_ref()
                .map(|r| (Utc::now() - r.create_time).num_milliseconds() as f64 / 1000.0);
            let stuck = outbox.lease_expired(1000).await?.len();
            let leases = outbox.leases().await?;
            if json {
                output::json(&serde_json::json!({
                    "counts": counts,
                    "backlog": counts.pending + counts.failed + counts.in_progress,
                    "oldestPendingAgeSeconds": lag_seconds,
                    "expiredLeases": stuck,
                    "leases": leases,
                }))?;
            } else {
                println!(
                    "last {hours} h{}: {} pending, {} in progress, {} published, {} failed, {} cancelled",
                    event_type.map(|t| format!(" of {t}")).unwrap_or_default(),
                    counts.pending,
                    counts.in_progress,
                    counts.succeeded,
                    counts.failed,
                    counts.cancelled
                );
                match lag_seconds {
                    Some(lag) => println!("oldest pending event: {lag:.1} s old"),
                    None => println!("no pending event"),
                }
                println!("expired leases: {stuck}");
                print_leases(&leases);
            }
        }
        OutboxCommand::Check { limits, .. } => {
            let health = outbox.health().await?;
            let backlog = Backlog {
                oldest_pending_seconds: health.oldest_pending_seconds,
                pending: health.pending,
                failed: health.failed,
                stuck: health.expired_leases,
                stuck_name: "expired leases",
            };
            return limits.report(&backlog, &health, json);
        }
        OutboxCommand::Archive(args) => return crate::archive::outbox(outbox, &args).await,
        OutboxCommand::Pending { limit, .. } => print_records(&outbox.pending(limit).await?, json)?,
        OutboxCommand::Failed {
            topic,
            min_retries,
            limit,
            ..
        } => {
            let records = match topic {
                Some(topic) => outbox.failed_by_topic(&topic, limit).await?,
                None => outbox.many_failures(min_retries, limit).await?,
            };
            print_records(&records, json)?;
        }
        OutboxCommand::Stuck { limit, .. } => {
            let leases = outbox.leases().await?;
            let expired = outbox.lease_expired(limit).await?;
            if json {
                output::json(&serde_json::json!({ "leases": leases, "expired": expired }))?;
            } else {
                print_leases(&leases);
                println!("events whose lease expired:");
                print_records(&expired, false)?;
            }
        }
        OutboxCommand::Aggregate {
            aggregate_type,
            aggregate_id,
            ..
        } => {
            print_records(
                &outbox.by_aggregate(&aggregate_type, &aggregate_id).await?,
                json,
            )?;
        }
        OutboxCommand::Show { event_no, .. } => match outbox.by_event_no(&event_no).await? {
            Some(record) => output::json(&record)?,
            None => {
                eprintln!("eventctl: no outbox event has event_no {event_no}");
                return Ok(ExitCode::from(1));
            }
        },
        OutboxCommand::Retry { event_no, .. } => {
            return report_action(
                outbox.retry(&event_no).await?,
                &event_no,
                "put back to pending",
                "it is not failed (only failed events can be retried)",
                json,
            );
        }
        OutboxCommand::Cancel {
            event_no, reason, ..
        } => {
            return report_action(
                outbox.cancel(&event_no, &reason).await?,
                &event_no,
                "cancelled",
                "it is not pending or failed (published, in-progress and cancelled events stay as they are)",
                json,
            );
        }
        OutboxCommand::Skip {
            aggregate_type,
            aggregate_id,
            reason,
            ..
        } => {
            match outbox
                .skip_head(&aggregate_type, &aggregate_id, &reason)
                .await?
            {
                Some(event_no) => {
                    if json {
                        output::json(&serde_json::json!({ "skipped": event_no }))?;
                    } else {
                        println!(
                            "skipped {event_no}; the rest of {aggregate_type} {aggregate_id} can now be published"
                        );
                    }
                }
                None => {
                    eprintln!(
                        "eventctl: {aggregate_type} {aggregate_id} has no pending or failed event to skip"
                    );
                    return Ok(ExitCode::from(1));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn report_action(
    done: bool,
    event_no: &str,
    verb: &str,
    why_not: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    if json {
        output::json(&serde_json::json!({ "eventNo": event_no, "changed": done }))?;
    } else if done {
        println!("{event_no}: {verb}");
    } else {
        eprintln!("eventctl: {event_no} was not changed: it does not exist or {why_not}");
    }
    Ok(if done {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The leases per relay, as a table: a relay whose leases are past expiry has died or stalled.
fn print_leases(leases: &[Lease]) {
    if leases.is_empty() {
        println!("no relay holds a lease");
        return;
    }
    let now = Utc::now();
    let rows: Vec<Vec<String>> = leases
        .iter()
        .map(|l| {
            vec![
                l.relay.clone(),
                l.events.to_string(),
                output::time(Some(l.earliest_expiry)),
                output::time(Some(l.latest_expiry)),
                if l.latest_expiry <= now {
                    "expired".to_owned()
                } else if l.earliest_expiry <= now {
                    "partly expired".to_owned()
                } else {
                    "live".to_owned()
                },
            ]
        })
        .collect();
    output::table(
        &["RELAY", "EVENTS", "FIRST_EXPIRY", "LAST_EXPIRY", "STATE"],
        &rows,
    );
}

fn print_records(records: &[OutboxRecord], json: bool) -> anyhow::Result<()> {
    if json {
        return output::json(&records);
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                r.event_no.clone(),
                r.event_type.clone(),
                format!(
                    "{}/{}#{}",
                    r.aggregate_type, r.aggregate_id, r.aggregate_sequence
                ),
                r.publish_status.to_string(),
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
            "AGGREGATE",
            "STATUS",
            "RETRIES",
            "NEXT_RETRY",
            "FAIL_REASON",
        ],
        &rows,
    );
    println!("({} events)", records.len());
    Ok(())
}

/// `eventctl archive ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum ArchiveCommand {
    /// Delete archived outbox and message rows older than a retention, in batches.
    Purge(crate::archive::PurgeArgs),
}

pub(crate) async fn archive(command: ArchiveCommand) -> anyhow::Result<ExitCode> {
    let ArchiveCommand::Purge(args) = command;
    let db = args.db.clone();
    with_outbox!(&db, |outbox| crate::archive::purge(&outbox, &args).await)
}
