//! `eventctl reconcile`: were the events the producer published consumed? A thin layer over
//! [`event_sqlx::Outbox::reconcile`].

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use event_sqlx::{Backend, Outbox, Reconcile, ReconcileReport};
use sqlx::Pool;

use crate::db::DbArgs;
use crate::db::with_outbox;
use crate::output;

/// `eventctl reconcile`.
#[derive(Debug, Args)]
pub(crate) struct ReconcileArgs {
    /// The producer's database, with the outbox: postgres://..., mysql://... or sqlite://FILE.
    #[arg(long, env = "EVENT_OUTBOX_URL")]
    outbox_url: String,
    /// The consumer's database, with its inbox and quarantine (the same URL when they share one).
    #[arg(long, env = "EVENT_CONSUMER_URL")]
    consumer_url: String,
    /// The consumer's name in consumed_event.
    #[arg(long)]
    consumer: String,
    /// Only events of this type (repeat for more).
    #[arg(long)]
    event_type: Vec<String>,
    /// Events created within this long of now, e.g. 24h.
    #[arg(long, default_value = "24h", value_parser = crate::args::duration)]
    since: Duration,
    /// Events published less than this long ago may still be on their way: counted, not reported.
    #[arg(long, default_value = "5m", value_parser = crate::args::duration)]
    grace: Duration,
    /// Send each missing event again through this publisher (as `eventctl relay --publisher`
    /// takes it): under a message id of its own, the outbox row left as it is.
    #[arg(long)]
    republish: Option<String>,
    #[command(flatten)]
    target: crate::publish::TargetArgs,
    /// List at most this many missing and this many quarantined events (all are counted).
    #[arg(long, default_value_t = 100)]
    list: usize,
    /// Published events read per page.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=5000))]
    page: u32,
    /// How long to wait for each database to accept a connection.
    #[arg(long, default_value = "10s", value_parser = crate::args::duration)]
    connect_timeout: Duration,
    /// How long one statement may run (PostgreSQL, MariaDB); `0` for no limit.
    #[arg(long, default_value = "60s", value_parser = crate::args::duration)]
    statement_timeout: Duration,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

impl ReconcileArgs {
    fn db(&self, url: &str) -> DbArgs {
        DbArgs {
            database_url: url.to_owned(),
            connect_timeout: self.connect_timeout,
            statement_timeout: self.statement_timeout,
            json: self.json,
            max_wait: Duration::ZERO,
        }
    }

    fn options(&self) -> Reconcile {
        let mut options = Reconcile::consumer(&self.consumer)
            .since(self.since)
            .grace(self.grace)
            .page(self.page)
            .list_limit(self.list);
        for event_type in &self.event_type {
            options = options.event_type(event_type);
        }
        if shows_progress(self) {
            options = options.progress(|checked| eprint!("\rchecked {checked} published events"));
        }
        options
    }
}

pub(crate) async fn run(args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    let producer = args.db(&args.outbox_url);
    let consumer = args.db(&args.consumer_url);
    let report = with_outbox!(&producer, |outbox| {
        with_outbox!(&consumer, |inbox| reconcile(&outbox, inbox.pool(), &args)
            .await?)
    });
    print(&report, &args)
}

async fn reconcile<P: Backend, C: Backend>(
    outbox: &Outbox<P>,
    consumer: &Pool<C>,
    args: &ReconcileArgs,
) -> anyhow::Result<ReconcileReport> {
    let options = args.options();
    let report = match &args.republish {
        Some(target) => {
            let publisher = crate::publish::Target::open(target, &args.target).await?;
            outbox
                .reconcile_and_republish(consumer, &options, &publisher)
                .await?
        }
        None => outbox.reconcile(consumer, &options).await?,
    };
    if shows_progress(args) {
        eprintln!();
    }
    Ok(report)
}

/// A count of checked events on a terminal, updated after each page.
fn shows_progress(args: &ReconcileArgs) -> bool {
    !args.json && std::io::IsTerminal::is_terminal(&std::io::stderr())
}

fn print(report: &ReconcileReport, args: &ReconcileArgs) -> anyhow::Result<ExitCode> {
    if args.json {
        output::json(report)?;
    } else {
        let t = &report.totals;
        println!(
            "consumer {}: {} published events checked (created {} to {}): {} consumed, {} quarantined, {} missing, {} in flight (published within --grace {})",
            report.consumer,
            t.published,
            output::time(report.from),
            output::time(report.to),
            t.consumed,
            t.quarantined,
            t.missing,
            t.in_flight,
            humantime::format_duration(args.grace)
        );
        let rows: Vec<Vec<String>> = report
            .per_type
            .iter()
            .map(|(event_type, t)| {
                vec![
                    event_type.clone(),
                    t.published.to_string(),
                    t.consumed.to_string(),
                    t.quarantined.to_string(),
                    t.missing.to_string(),
                    t.in_flight.to_string(),
                ]
            })
            .collect();
        if !rows.is_empty() {
            output::table(
                &[
                    "EVENT_TYPE",
                    "PUBLISHED",
                    "CONSUMED",
                    "QUARANTINED",
                    "MISSING",
                    "IN_FLIGHT",
                ],
                &rows,
            );
        }
        for (title, list, total) in [
            ("missing", &report.missing, t.missing),
            ("quarantined", &report.quarantined, t.quarantined),
        ] {
            if list.is_empty() {
                continue;
            }
            println!("{title} ({} of {total} listed):", list.len());
            for event in list.iter() {
                println!(
                    "  {} {} published {}{}",
                    event.event_no,
                    event.event_type,
                    output::time(event.published_time),
                    event
                        .quarantine
                        .map(|s| format!(" ({s})"))
                        .unwrap_or_default()
                );
            }
        }
        if let Some(republished) = &report.republished {
            println!(
                "republished {} missing events: {} accepted, {} failed{}",
                republished.selected,
                republished.accepted,
                republished.failed,
                republished
                    .first_failure
                    .as_ref()
                    .map(|r| format!(" (first failure: {r})"))
                    .unwrap_or_default()
            );
        }
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
