//! `eventctl`: the command line for event schemas and outbox operations.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Domain events: schemas and outbox operations.
#[derive(Debug, Parser)]
#[command(name = "eventctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Event schemas.
    #[command(subcommand)]
    Schema(SchemaCommand),
}

#[derive(Debug, Subcommand)]
enum SchemaCommand {
    /// Print the JSON schema of the event envelope, the shape every transport and table carries.
    Envelope,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("eventctl: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Schema(SchemaCommand::Envelope) => {
            let schema = event_core::EventEnvelope::json_schema();
            println!("{}", serde_json::to_string_pretty(&schema)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}
