//! `eventctl outbox check`, the probe for cron jobs and alerts, on every backend: exit 0 while
//! each threshold holds, 1 with one line per threshold once one is crossed.

use std::process::Command;

use event_sqlx::{OutboxMessage, PublishError, Publisher, RelayConfig};
use event_tests::db::{Orders, TestDb};
use event_tests::fixtures::{Order, commit_orders};

/// A broker that refuses everything.
struct Refusing;

impl Publisher for Refusing {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        messages
            .iter()
            .map(|_| Err(PublishError::new("broker down")))
            .collect()
    }
}

fn check(db_url: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_eventctl"))
        .args(["outbox", "check", "--database-url", db_url])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

async fn thresholds_give_the_exit_code<DB: Orders>(db: &TestDb<DB>)
where
    event_sqlx::Relay<DB, Refusing>: Send,
{
    let (code, out) = check(&db.url, &["--max-pending", "0", "--max-failed", "0"]);
    assert_eq!(code, 0, "an empty outbox is healthy: {out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("ok")).count(),
        2,
        "{out}"
    );

    commit_orders(
        &db.outbox,
        (0..5).map(|i| Order::place(&format!("o-{i}"), 1).unwrap()),
    )
    .await;
    let (code, out) = check(
        &db.url,
        &["--max-pending", "4", "--max-oldest-pending", "1h"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL pending: 5 (at most 4)"), "{out}");
    assert!(out.contains("ok   oldest pending age (s)"), "{out}");

    // Two fail to publish: failed now, pending no longer.
    let relay = db
        .outbox
        .relay(Refusing, RelayConfig::new("r").batch_size(2));
    relay.run_once().await.unwrap();
    let (code, out) = check(
        &db.url,
        &[
            "--max-pending",
            "3",
            "--max-failed",
            "1",
            "--max-stuck",
            "0",
            "--json",
        ],
    );
    assert_eq!(code, 1, "{out}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["healthy"], false);
    assert_eq!(report["health"]["pending"], 3);
    assert_eq!(report["health"]["failed"], 2);
    let failed = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "failed")
        .unwrap();
    assert_eq!(
        (failed["value"].as_i64(), failed["ok"].as_bool()),
        (Some(2), Some(false))
    );

    let (code, out) = check(&db.url, &[]);
    assert_eq!(code, 2, "no threshold is bad input: {out}");
}

event_tests::on_every_backend!(thresholds_give_the_exit_code);
