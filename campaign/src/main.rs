//! `event-campaign`: a randomized fault campaign against private databases and brokers.
//!
//! `event-campaign run --pair pg-jetstream --seed 7` starts a PostgreSQL cluster and a NATS server
//! of its own, two producer processes, three `eventctl relay` processes and two consumer
//! processes, every link through a fault proxy; it generates a schedule of faults from the seed,
//! prints it, plays it while the producers commit events, heals everything, waits for the drain
//! and checks the tables: every committed event applied exactly once per consumer, no effect of
//! an uncommitted event, each aggregate's effects in sequence, every event published. A failing
//! run appends its replay line to `failing-seeds.txt`, which the tests replay.
//!
//! `producer` and `consumer` are the roles it starts as child processes.

mod audit;
mod check;
mod pair;
mod roles;
mod run;
mod schedule;
mod services;
mod supervisor;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "event-campaign",
    about = "A randomized fault campaign against private databases and brokers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs one campaign and checks it; exits 1 when a check fails.
    Run(run::RunArgs),
    /// Prints the schedule a seed gives, without running it.
    Schedule(run::ScheduleArgs),
    /// A producer process (started by `run`).
    Producer(roles::ProducerArgs),
    /// A consumer process (started by `run`).
    Consumer(roles::ConsumerArgs),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("event-campaign: cannot start the runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => {
                // SIGINT or SIGTERM ends the run; dropping it stops every process and service.
                tokio::select! {
                    outcome = run::run(args) => outcome,
                    _ = tokio::signal::ctrl_c() => {
                        eprintln!("event-campaign: interrupted; stopping every process");
                        Ok(std::process::ExitCode::from(130))
                    }
                    () = roles::terminated() => {
                        eprintln!("event-campaign: terminated; stopping every process");
                        Ok(std::process::ExitCode::from(143))
                    }
                }
            }
            Command::Schedule(args) => run::print_schedule(args),
            Command::Producer(args) => roles::producer(args).await,
            Command::Consumer(args) => roles::consumer(args).await,
        }
    });
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("event-campaign: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
