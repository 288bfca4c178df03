//! The cost of each wire format (benches/results/wire-formats.json): per broker, a committed
//! backlog on PostgreSQL drained by one relay publishing in each format, then consumed by a
//! batched subscription, against the toolkit's own envelope measured in the same run.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Instant;

use anyhow::Context;
use event_sqlx::{RelayConfig, WireFormat};
use serde::Serialize;

use crate::backlog::{commit_backlog, until_applied};
use crate::throughput::{batch_consumer, setup};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Figures {
    broker: &'static str,
    format: &'static str,
    events: usize,
    relay_drain_events_per_s: f64,
    consumer_events_per_s: f64,
    /// Against the envelope on the same broker in this run: 1.0 is as fast.
    relay_vs_envelope: f64,
    consumer_vs_envelope: f64,
    relay_samples: Vec<f64>,
    consumer_samples: Vec<f64>,
}

const FORMATS: [WireFormat; 3] = [
    WireFormat::Envelope,
    WireFormat::CloudEventsBinary,
    WireFormat::CloudEventsStructured,
];

/// Rounds per format: the formats take turns, so that a slow moment of the machine falls on
/// each of them alike, and each figure is the median of its rounds.
const ROUNDS: usize = 3;

pub(crate) async fn run(events: usize, brokers: &str) -> anyhow::Result<()> {
    let mut figures = Vec::new();
    for broker in ["nats", "rabbitmq", "kafka"] {
        if brokers != "all" && !brokers.split(',').any(|b| b == broker) {
            continue;
        }
        let mut samples: Vec<(Vec<f64>, Vec<f64>)> = vec![Default::default(); FORMATS.len()];
        for round in 0..ROUNDS {
            for (format, (relay, consumer)) in FORMATS.iter().zip(&mut samples) {
                let (r, c) = measure(broker, *format, events)
                    .await
                    .with_context(|| format!("{broker}, {format}, round {}", round + 1))?;
                eprintln!(
                    "{broker} {format} round {}: relay {r:.0}/s, consumer {c:.0}/s",
                    round + 1
                );
                relay.push(r);
                consumer.push(c);
            }
        }
        let medians: Vec<(f64, f64)> = samples
            .iter()
            .map(|(r, c)| (median(r), median(c)))
            .collect();
        let (relay_base, consumer_base) = medians[0];
        for ((format, (relay, consumer)), (relay_samples, consumer_samples)) in
            FORMATS.iter().zip(medians).zip(samples)
        {
            let f = Figures {
                broker,
                format: format.name(),
                events,
                relay_drain_events_per_s: relay,
                consumer_events_per_s: consumer,
                relay_vs_envelope: relay / relay_base,
                consumer_vs_envelope: consumer / consumer_base,
                relay_samples,
                consumer_samples,
            };
            eprintln!("{f:?}");
            figures.push(f);
        }
    }
    let report = serde_json::json!({
        "machine": crate::machine(),
        "measuredAt": chrono::Utc::now(),
        "what": format!("a committed backlog on PostgreSQL: one relay (batches of 500) publishing in each wire format, then a subscription (batches of 500, batch handler) consuming it; rates in events/s, each the median of {ROUNDS} rounds in which the formats take turns; ratios against the envelope on the same broker in the same run"),
        "figures": figures,
    });
    crate::write_result("benches/results/wire-formats.json", &report)?;
    Ok(())
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// The relay's drain rate and the consumer's rate for `events` in `format` on `broker`.
async fn measure(
    broker: &'static str,
    format: WireFormat,
    events: usize,
) -> anyhow::Result<(f64, f64)> {
    let s = setup(broker, 500, event_sqlx::IndexProfile::Seed).await?;
    commit_backlog(&s.outbox, events).await?;
    let relay = s.outbox.relay(
        s.publisher.clone().wire_format(format),
        // A drain between batches waits a poll interval when a claim came back short: keep
        // that out of the rate, as the delivery benchmark does.
        RelayConfig::new("bench-relay")
            .batch_size(500)
            .poll_interval(std::time::Duration::from_millis(5)),
    );
    let started = Instant::now();
    let report = relay.drain().await?;
    let relay_rate = events as f64 / started.elapsed().as_secs_f64();
    anyhow::ensure!(
        report.published == events,
        "published {} of {events}",
        report.published
    );

    let applied = Arc::new(AtomicUsize::new(0));
    let consumer = batch_consumer(s.db.pool(), Arc::clone(&applied), Arc::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let consuming = s.subscription.run(&consumer, async move {
        let mut stopped = stopped;
        let _ = stopped.wait_for(|s| *s).await;
    });
    let watch = async {
        let elapsed = until_applied(&applied, events, started).await;
        let _ = stop.send(true);
        elapsed
    };
    let (consumed, elapsed) = tokio::join!(consuming, watch);
    consumed?;
    let consumer_rate = events as f64 / elapsed?.as_secs_f64();
    s.db.cleanup().await;
    Ok((relay_rate, consumer_rate))
}
