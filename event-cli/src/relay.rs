//! `eventctl relay`: the relay as a process, to a broker or to stdout, until idle or until a
//! signal, riding out broker outages.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use event_sqlx::{Backend, Outbox, RelayConfig};

use crate::db::DbArgs;
use crate::db::{self, with_outbox};

/// `eventctl relay`.
#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Where to publish: `stdout`; `jsonl:PATH` to append JSON lines to a file;
    /// `nats://HOST:PORT` for NATS JetStream (subject `<topic>.<routing key>`, Nats-Msg-Id = event
    /// number); `amqp://USER:PASS@HOST:PORT/VHOST` for RabbitMQ (exchange = topic, with
    /// publisher confirms); `kafka://HOST:PORT[,HOST:PORT...]` for Kafka (topic = topic, key =
    /// aggregate id, idempotent producer).
    #[arg(long, default_value = "stdout")]
    publisher: String,
    #[command(flatten)]
    target: crate::publish::TargetArgs,
    /// Serve Prometheus metrics (the relay's counters, latency histogram and backlog gauges) on
    /// this address, e.g. `127.0.0.1:9464`, at any path.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// How often the backlog gauges (pending, failed, stuck, oldest pending age) are sampled.
    #[arg(long, default_value = "15s", value_parser = crate::args::duration)]
    metrics_interval: Duration,
    /// This relay's id, the `locked_by` of its leases. Unique per running relay.
    #[arg(long)]
    instance_id: Option<String>,
    /// Events claimed per batch (1 to 5000).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=5000))]
    batch_size: u32,
    /// Lease length in seconds. The relay renews the lease of a batch in flight every third of
    /// it, so it bounds how long a relay that dies leaves its events held, not how long a
    /// publish may take.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=315_360_000))]
    lease_secs: u64,
    /// After a lease expired (its relay died), how long the event waits before it is published
    /// again: `5s`, `1m`, `0` for at once.
    #[arg(long, default_value = "5s", value_parser = crate::args::duration)]
    recovery_delay: Duration,
    /// How often a running relay looks for expired leases.
    #[arg(long, default_value = "5s", value_parser = crate::args::duration)]
    recovery_interval: Duration,
    /// Publish at most this many events a second.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_rate: Option<u32>,
    /// Publish without per-aggregate ordering.
    #[arg(long)]
    unordered: bool,
    /// Make every claim and mark wait for the database's disk flush (PostgreSQL; MySQL and
    /// SQLite always wait). By default they do not: one lost in a database crash only
    /// publishes its events again, which consumers deduplicate.
    #[arg(long)]
    synchronous_commit: bool,
    /// After a batch that was not full, wait this long for more commits before claiming again
    /// (up to `1m`), while the relay keeps up: longer batches, less work per event, up to this
    /// much latency. `0` claims again at once. Not with --until-idle, which never waits.
    #[arg(long, default_value = "10ms", value_parser = crate::args::duration)]
    linger: Duration,
    /// Stop once nothing is left to claim, instead of waiting for more. Exits 1, with the
    /// count, if events this relay claimed are still in progress when it stops.
    #[arg(long)]
    until_idle: bool,
    /// How long to keep trying a database or broker that is not reachable yet at startup
    /// (refused, silent, starting up), and with --until-idle a database that drops connections
    /// or stops answering while it drains, before giving up with exit 2; `0` to give up at
    /// once.
    #[arg(long, default_value = "2m", value_parser = crate::args::duration)]
    max_wait: Duration,
}

pub(crate) async fn relay(args: RelayArgs) -> anyhow::Result<ExitCode> {
    let mut db = args.db.clone();
    // A relay started with (or before) its database waits for it.
    db.max_wait = args.max_wait;
    with_outbox!(&db, |outbox| run_relay(outbox, &args).await)
}

async fn run_relay<DB: Backend>(outbox: Outbox<DB>, args: &RelayArgs) -> anyhow::Result<ExitCode> {
    let instance = args
        .instance_id
        .clone()
        .unwrap_or_else(|| format!("eventctl-{}", std::process::id()));
    let mut config = RelayConfig::new(instance.clone())
        .batch_size(args.batch_size)
        .lease(Duration::from_secs(args.lease_secs.max(1)))
        .lease_recovery(args.recovery_interval, args.recovery_delay);
    if let Some(rate) = args.max_rate {
        config = config.max_rate(rate);
    }
    if args.unordered {
        config = config.unordered();
    }
    config = config
        .synchronous_commit(args.synchronous_commit)
        .linger(args.linger);
    config = config.metrics_interval(args.metrics_interval);
    if let Some(address) = args.metrics_listen {
        use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
        const SECONDS: &[f64] = &[
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0, 300.0,
        ];
        const EVENTS: &[f64] = &[1.0, 10.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0];
        PrometheusBuilder::new()
            .with_http_listener(address)
            .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), SECONDS)?
            .set_buckets_for_metric(
                Matcher::Full(event_sqlx::metrics::OUTBOX_BATCH_SIZE.to_owned()),
                EVENTS,
            )?
            .install()
            .with_context(|| format!("cannot serve metrics on {address}"))?;
        event_sqlx::metrics::describe();
        eprintln!("relay {instance}: serving Prometheus metrics on http://{address}/metrics");
    }
    let publisher = crate::outage::retry("eventctl", args.max_wait, || {
        crate::publish::Target::open(&args.publisher, &args.target)
    })
    .await?;
    relay_to(outbox, args, config, publisher, &instance).await
}

/// Runs the relay with `publisher` until stopped, or with --until-idle until nothing is left.
async fn relay_to<DB: Backend, P: event_sqlx::Publisher>(
    outbox: Outbox<DB>,
    args: &RelayArgs,
    config: RelayConfig,
    publisher: P,
    instance: &str,
) -> anyhow::Result<ExitCode> {
    let instance = instance.to_owned();
    let relay = outbox.relay(publisher, config);
    eprintln!(
        "relay {instance}: publishing from {}",
        db::redact(&args.db.database_url)
    );
    let total = if args.until_idle {
        let recovered = relay.recover_expired_leases().await?;
        if recovered > 0 {
            eprintln!(
                "relay {instance}: recovered {recovered} events whose lease had expired; they are due again in {} (--recovery-delay)",
                humantime::format_duration(args.recovery_delay)
            );
        }
        let mut total = drain_through_outages(&relay, &instance, args.max_wait).await?;
        // Leases that expired while it drained (the drain waits out other relays' live leases:
        // one that died leaves them): recover them, and publish them too when due at once.
        loop {
            let recovered = relay.recover_expired_leases().await?;
            if recovered == 0 {
                break;
            }
            eprintln!(
                "relay {instance}: recovered {recovered} more events whose lease had expired"
            );
            if !args.recovery_delay.is_zero() {
                break;
            }
            total += drain_through_outages(&relay, &instance, args.max_wait).await?;
        }
        total
    } else {
        relay.run(shutdown_signal()).await
    };
    eprintln!(
        "relay {instance}: stopped; {} claimed, {} published, {} failed",
        total.claimed, total.published, total.failed
    );
    let held: i64 = outbox
        .leases()
        .await?
        .iter()
        .filter(|lease| lease.relay == instance)
        .map(|lease| lease.events)
        .sum();
    if held > 0 {
        eprintln!(
            "relay {instance}: {held} events it claimed are still in progress; their lease expires and another relay publishes them (eventctl outbox stuck shows them)"
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Drains, going on through errors that may pass (a dropped connection, a database restarting)
/// for up to `max_wait` in all.
async fn drain_through_outages<DB: Backend, P: event_sqlx::Publisher>(
    relay: &event_sqlx::Relay<DB, P>,
    instance: &str,
    max_wait: Duration,
) -> anyhow::Result<event_sqlx::BatchReport> {
    crate::outage::retry(&format!("relay {instance}"), max_wait, || async {
        Ok(relay.drain().await?)
    })
    .await
}

pub(crate) async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
