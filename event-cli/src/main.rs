//! `eventctl`: the command line for event schemas and outbox operations.
//!
//! Exit codes: 0 success, 1 a check found a problem, 2 bad input or a tool error.

mod archive;
mod args;
mod check;
mod console;
mod db;
mod demo;
mod messages;
mod ops;
mod outage;
mod output;
mod publish;
mod quarantine;
mod reconcile;
mod relay;
mod schema;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Domain events: schemas, the outbox and its relay.
#[derive(Debug, Parser)]
#[command(name = "eventctl", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run an order service on an SQLite file: place and pay orders, relay the events, print them.
    Demo(demo::DemoArgs),
    /// Create the event tables (biz_outbox_event, biz_message_event, consumed_event).
    Migrate(ops::MigrateArgs),
    /// Publish committed outbox events until stopped (Ctrl-C or SIGTERM finish the batch in flight).
    Relay(relay::RelayArgs),
    /// Inspect and repair the outbox.
    #[command(subcommand)]
    Outbox(ops::OutboxCommand),
    /// The message event table (biz_message_event).
    #[command(subcommand)]
    Messages(messages::MessagesCommand),
    /// Consumers' quarantine (quarantined_event): list, show, requeue for the running consumer,
    /// cancel, check, prune.
    #[command(subcommand)]
    Quarantine(quarantine::QuarantineCommand),
    /// Consumers' inbox (consumed_event): retention.
    #[command(subcommand)]
    Inbox(quarantine::InboxCommand),
    /// Compare what the outbox published with what a consumer consumed (seed 003's end-to-end
    /// reconciliation): exit 0 clean, 1 events missing or quarantined, 2 an error.
    Reconcile(reconcile::ReconcileArgs),
    /// The archive tables.
    #[command(subcommand)]
    Archive(ops::ArchiveCommand),
    /// Event schemas.
    #[command(subcommand)]
    Schema(SchemaCommand),
    /// Serve the web console: overview, search, aggregate timeline, event detail, quarantine,
    /// message table, and guarded actions written to an audit trail.
    Console(console::ConsoleArgs),
}

#[derive(Debug, Subcommand)]
enum SchemaCommand {
    /// Compare two schema files: exit 0 compatible, 1 incompatible, 2 bad input.
    Diff(schema::DiffArgs),
    /// Check a snapshot directory: each event's newest version against its history, and
    /// (with --against) snapshots removed or edited since a git revision.
    Check(schema::CheckArgs),
    /// Write the AsyncAPI 3.0 document of a service's events from its snapshot directory: every
    /// event type and version, channels from the routes, the wire format's headers.
    Asyncapi(schema::AsyncApiArgs),
    /// Print the JSON schema of the event envelope, the shape every transport and table carries.
    Envelope {
        /// Write it to this file instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EVENTCTL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    // The relay runs on one thread: its tasks and the broker client's hand each other every
    // message, and on a multi-thread runtime each hand-over can wake another worker (see the
    // performance chapter, "One thread for the event path"). The console serves requests on
    // every core.
    let runtime = match &cli.command {
        Command::Relay(_) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    }
    .enable_all()
    .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("eventctl: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("eventctl: {}", output::chain(&error));
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Demo(args) => demo::run(args).await,
        Command::Migrate(args) => ops::migrate(&args).await,
        Command::Relay(args) => relay::relay(args).await,
        Command::Outbox(command) => ops::outbox(command).await,
        Command::Messages(command) => messages::run(command).await,
        Command::Archive(command) => ops::archive(command).await,
        Command::Quarantine(command) => quarantine::run(command).await,
        Command::Inbox(command) => quarantine::inbox(command).await,
        Command::Reconcile(args) => reconcile::run(args).await,
        Command::Console(args) => console::run(args).await,
        Command::Schema(SchemaCommand::Diff(args)) => schema::diff(args),
        Command::Schema(SchemaCommand::Check(args)) => schema::check(args),
        Command::Schema(SchemaCommand::Asyncapi(args)) => schema::asyncapi(args),
        Command::Schema(SchemaCommand::Envelope { out }) => {
            let schema = event_core::EventEnvelope::json_schema();
            let text = serde_json::to_string_pretty(&schema)? + "\n";
            match out {
                Some(path) => std::fs::write(&path, text)
                    .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?,
                None => print!("{text}"),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every subcommand's arguments are consistent (unique names, valid defaults): clap checks
    /// this only when a subcommand runs, so check them all here.
    #[test]
    fn every_subcommand_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
