//! `eventctl relay --metrics-listen` serves Prometheus text: the published counter and the
//! oldest-pending gauge move as events are committed and relayed, and SIGTERM stops the relay
//! cleanly. The shipped alert rules pass `promtool check rules` and use only metric names the
//! library records, as does the Grafana dashboard.

// A panic is how a test fails.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use event_core::{EventContext, UnitOfWork};
use event_sqlx::ManualClock;
use event_tests::db::TestDb;
use event_tests::fixtures::Order;
use event_tests::wait;

/// One scrape: each sample's series (name and labels) and value; None while nothing listens.
fn scrape(port: u16) -> Option<BTreeMap<String, f64>> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    Some(
        body.lines()
            .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                Some((series.to_owned(), value.parse().ok()?))
            })
            .collect(),
    )
}

fn sum(samples: &BTreeMap<String, f64>, name: &str) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| series.as_str() == name || series.starts_with(&format!("{name}{{")))
        .map(|(_, value)| value)
        .sum()
}

/// Kills the process if the test fails before it stops it.
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_as_events_are_committed_and_relayed() {
    let db = TestDb::sqlite().await.unwrap();
    let port = event_tests::db::free_port();
    let file = std::env::temp_dir().join(format!("metrics-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let relay = Command::new(env!("CARGO_BIN_EXE_eventctl"))
        .args(["relay", "--database-url", &db.url])
        .args(["--publisher", &format!("jsonl:{}", file.display())])
        .args(["--metrics-listen", &format!("127.0.0.1:{port}")])
        .args([
            "--metrics-interval",
            "20ms",
            "--batch-size",
            "2",
            "--max-rate",
            "10",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start eventctl relay");
    let mut relay = KillOnDrop(Some(relay));

    // Up, sampled, and nothing pending yet.
    let before = wait::until(Duration::from_secs(30), async || match scrape(port) {
        Some(samples) if samples.contains_key("event_outbox_oldest_pending_age_seconds") => {
            Ok(samples)
        }
        _ => Err("the relay never served its sampled metrics".to_owned()),
    })
    .await;
    assert_eq!(sum(&before, "event_outbox_oldest_pending_age_seconds"), 0.0);
    assert_eq!(sum(&before, "event_outbox_published_total"), 0.0);

    // Ten events that occurred ten minutes ago, so the gauge is plain to see.
    let ten_minutes_ago = chrono::Utc::now() - chrono::TimeDelta::minutes(10);
    let producer = db
        .outbox
        .clone()
        .with_clock(ManualClock::new(ten_minutes_ago));
    let tx = db.pool().begin().await.unwrap();
    let mut uow = UnitOfWork::new(EventContext::new("order-service").occurred_at(ten_minutes_ago));
    for i in 0..10 {
        let mut order = Order::place(&format!("o-{i}"), 1).unwrap();
        uow.collect(&mut order).unwrap();
    }
    let _ = producer.commit(tx, uow).await.unwrap();

    // The relay samples the backlog while it publishes (10 a second), then publishes them all.
    let mut oldest_seen = 0.0_f64;
    let mut pending_seen = 0.0_f64;
    let after = wait::until(Duration::from_secs(60), async || {
        let samples = scrape(port).expect("the relay stopped serving metrics");
        oldest_seen = oldest_seen.max(sum(&samples, "event_outbox_oldest_pending_age_seconds"));
        pending_seen = pending_seen.max(sum(&samples, "event_outbox_backlog{status=\"pending\"}"));
        if sum(&samples, "event_outbox_published_total") == 10.0
            && sum(&samples, "event_outbox_oldest_pending_age_seconds") == 0.0
        {
            Ok(samples)
        } else {
            Err(format!("the relay did not publish the events: {samples:?}"))
        }
    })
    .await;
    assert!(
        (590.0..3600.0).contains(&oldest_seen),
        "the oldest-pending gauge showed the ten-minute-old events: {oldest_seen}"
    );
    assert!(
        pending_seen >= 1.0,
        "the pending backlog was seen: {pending_seen}"
    );
    assert_eq!(
        after
            .get("event_outbox_published_total{topic=\"order.event\",event_type=\"ORDER_PLACED\"}"),
        Some(&10.0),
        "{after:?}"
    );
    assert_eq!(sum(&after, "event_outbox_claimed_total"), 10.0);
    assert_eq!(sum(&after, "event_outbox_failed_total"), 0.0);
    assert_eq!(
        sum(&after, "event_outbox_publish_latency_seconds_count"),
        10.0
    );
    assert!(
        sum(&after, "event_outbox_publish_latency_seconds_sum") >= 10.0 * 590.0,
        "latency counts from the commit: {after:?}"
    );
    assert_eq!(db.counts().await.succeeded, 10);

    // SIGTERM: the relay finishes and exits 0.
    let status = Command::new("kill")
        .args(["-TERM", &relay.0.as_ref().unwrap().id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = relay.0.take().unwrap().wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("10 published"), "{stderr}");
    let _ = std::fs::remove_file(&file);
    db.cleanup().await;
}

/// Every metric name an expression uses, roughly: identifiers starting with `event_`.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("event_") {
        let start = i + at;
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(text.len(), |n| start + n);
        if boundary {
            names.push(text[start..end].to_owned());
        }
        i = end;
    }
    names
}

fn known(name: &str) -> bool {
    use event_sqlx::metrics::*;
    let all = [
        OUTBOX_CLAIMED,
        OUTBOX_PUBLISHED,
        OUTBOX_FAILED,
        OUTBOX_RETRIED,
        OUTBOX_CANCELLED,
        OUTBOX_LEASE_LOST,
        OUTBOX_LEASES_RECOVERED,
        OUTBOX_BATCH_SIZE,
        OUTBOX_PUBLISH_LATENCY,
        OUTBOX_BACKLOG,
        OUTBOX_OLDEST_PENDING_AGE,
        CONSUMER_EVENTS,
        CONSUMER_HANDLE_SECONDS,
        CONSUMER_REQUEUED_REPLAYED,
        MESSAGE_PROCESSED,
    ];
    all.iter().any(|m| {
        name == *m
            || [
                format!("{m}_bucket"),
                format!("{m}_count"),
                format!("{m}_sum"),
            ]
            .iter()
            .any(|n| n == name)
    })
}

#[test]
fn alert_rules_and_dashboard_use_the_recorded_metrics() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let rules = std::fs::read_to_string(format!("{root}/deploy/prometheus/alerts.yml")).unwrap();
    let dashboard = std::fs::read_to_string(format!("{root}/deploy/grafana/outbox.json")).unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let exprs: Vec<String> = parsed["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    for (file, text) in [
        ("alerts.yml", rules.clone()),
        ("outbox.json", exprs.join("\n")),
    ] {
        let names = metric_names(&text);
        assert!(!names.is_empty(), "{file} uses no metric");
        for name in names {
            // `event_outbox` and friends in prose are not metric names; the rest must be known.
            if name.matches('_').count() >= 2 {
                assert!(
                    known(&name),
                    "{file} uses `{name}`, which the library does not record"
                );
            }
        }
    }

    // promtool, from the distribution's `prometheus` package (.ci/run installs it).
    match Command::new("promtool")
        .args([
            "check",
            "rules",
            &format!("{root}/deploy/prometheus/alerts.yml"),
        ])
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "promtool check rules: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => assert!(
            !event_tests::db::services_required(),
            "promtool is needed to check the alert rules (Debian package prometheus): {e}"
        ),
    }
}
