//! The operator's commands as processes: `eventctl reconcile` finds withheld events and
//! `--republish` sends them; `eventctl messages` changes rows only under the seed's guards;
//! `eventctl quarantine requeue` has a running consumer replay an entry with its own handler.

// A panic is how a test fails.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use event_core::{EventContext, EventEnvelope, UnitOfWork};
use event_sqlx::{
    ChannelPublisher, Consumer, Delivered, HandlerError, MessageEvent, MessageStore, NatsPublisher,
    OutboxConfig, RelayConfig, Route,
};
use event_tests::any_broker::durable;
use event_tests::any_broker::stream_for;
use event_tests::db::{TestDb, nats_url, reachable, unique};
use event_tests::fixtures::{Order, OrderPlaced, commit_orders};
use event_tests::wait;

fn eventctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_eventctl"))
        .args(args)
        .output()
        .expect("run eventctl")
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

async fn place_orders(db: &TestDb<sqlx::Sqlite>, count: usize) {
    commit_orders(
        &db.outbox,
        (0..count).map(|i| Order::place(&format!("o-{i}"), 100).unwrap()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_reports_withheld_events_and_republish_makes_it_clean() {
    let db = TestDb::sqlite().await.unwrap();
    place_orders(&db, 12).await;
    let (publisher, mut received) = ChannelPublisher::channel(64);
    db.outbox
        .relay(publisher, RelayConfig::new("relay"))
        .drain()
        .await
        .unwrap();
    let billing = Consumer::new(db.pool().clone(), "billing", "1.0.0")
        .on(async |_tx: &mut sqlx::SqliteConnection, _placed: Delivered<OrderPlaced>| Ok(()));
    let mut withheld = BTreeSet::new();
    while let Ok(message) = received.try_recv() {
        if ["o-3", "o-8"].contains(&message.envelope.aggregate_id.as_str()) {
            withheld.insert(message.envelope.event_id.to_string());
            continue;
        }
        let body = serde_json::to_vec(&message.envelope).unwrap();
        billing.receive(&body, None).await.unwrap();
    }

    let url = db.url.as_str();
    let base = [
        "reconcile",
        "--outbox-url",
        url,
        "--consumer-url",
        url,
        "--consumer",
        "billing",
        "--since",
        "1h",
        "--grace",
        "0s",
    ];
    let out = eventctl(&[&base[..], &["--json"]].concat());
    assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stderr));
    let report = json(&out);
    assert_eq!(report["totals"]["published"], 12, "{report}");
    assert_eq!(report["totals"]["missing"], 2, "{report}");
    let missing: BTreeSet<String> = report["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["eventNo"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(missing, withheld);

    // The human report names them too.
    let out = eventctl(&base);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 1);
    assert!(text.contains("2 missing"), "{text}");
    for event_no in &withheld {
        assert!(text.contains(event_no.as_str()), "{text}");
    }

    // --republish sends exactly those; the consumer applies them; the next run is clean.
    let file = std::env::temp_dir().join(format!("reconcile-{}.jsonl", unique("r")));
    let target = format!("jsonl:{}", file.display());
    let out = eventctl(&[&base[..], &["--republish", &target]].concat());
    assert_eq!(
        code(&out),
        1,
        "it reports what it found before republishing"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("republished 2 missing events: 2 accepted"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let lines = std::fs::read_to_string(&file).unwrap();
    let mut resent = BTreeSet::new();
    for line in lines.lines() {
        let envelope: EventEnvelope = serde_json::from_str(line).unwrap();
        resent.insert(envelope.event_id.to_string());
        billing.receive(line.as_bytes(), None).await.unwrap();
    }
    assert_eq!(resent, withheld);
    let out = eventctl(&base);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("12 consumed, 0 quarantined, 0 missing"));

    // Bad input: an unknown database scheme is exit 2 with the fix.
    let out = eventctl(&[
        "reconcile",
        "--outbox-url",
        "redis://x",
        "--consumer-url",
        url,
        "--consumer",
        "billing",
    ]);
    assert_eq!(code(&out), 2);
    let _ = std::fs::remove_file(&file);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_commands_change_rows_under_their_guards() {
    let db = TestDb::sqlite().await.unwrap();
    let store = MessageStore::new(db.pool().clone()).max_retry_count(1);
    let mut uow = UnitOfWork::new(EventContext::new("order-service"));
    for i in 0..3 {
        uow.collect(&mut Order::place(&format!("m-{i}"), 1).unwrap())
            .unwrap();
    }
    let envelopes = uow.commit();
    for envelope in &envelopes {
        assert!(
            store
                .create(&MessageEvent::from_envelope(envelope))
                .await
                .unwrap()
        );
    }
    // One fails (claimed, then failed).
    let first = store.pending(1).await.unwrap().remove(0);
    assert!(store.claim(&first).await.unwrap());
    assert!(
        store
            .fail(first.id, "downstream timeout", Duration::from_secs(600))
            .await
            .unwrap()
    );
    let url = db.url.as_str();
    let with = |args: &[&str]| eventctl(&[args, &["--database-url", url]].concat());

    let out = with(&["messages", "status", "--json"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let status = json(&out);
    assert_eq!(status["counts"]["pending"], 2, "{status}");
    assert_eq!(status["counts"]["failed"], 1, "{status}");

    let out = with(&[
        "messages",
        "check",
        "--max-failed",
        "0",
        "--max-pending",
        "5",
    ]);
    assert_eq!(code(&out), 1);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FAIL failed: 1 (at most 0)"), "{text}");
    assert!(text.contains("ok   pending: 2 (at most 5)"), "{text}");
    let out = with(&["messages", "check"]);
    assert_eq!(code(&out), 2, "no threshold is bad input");

    let out = with(&["messages", "failed", "--json"]);
    assert_eq!(json(&out)[0]["event_no"], first.event_no.as_str());

    // Retry: only a failed message; cancel: only pending or failed, with a reason.
    let pending_no = store.pending(1).await.unwrap().remove(0).event_no;
    let out = with(&["messages", "retry", &pending_no]);
    assert_eq!(code(&out), 1, "a pending message is not retried");
    let out = with(&["messages", "retry", &first.event_no]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let retried = store.by_event_no(&first.event_no).await.unwrap().unwrap();
    assert_eq!(retried.event_status, event_sqlx::EventStatus::Pending);
    assert_eq!(retried.retry_count, 0);
    let out = with(&[
        "messages",
        "cancel",
        &pending_no,
        "--reason",
        "duplicate order",
    ]);
    assert_eq!(code(&out), 0);
    let cancelled = store.by_event_no(&pending_no).await.unwrap().unwrap();
    assert_eq!(cancelled.event_status, event_sqlx::EventStatus::Cancelled);
    assert_eq!(cancelled.fail_reason.as_deref(), Some("duplicate order"));
    let out = with(&["messages", "cancel", &pending_no, "--reason", "again"]);
    assert_eq!(code(&out), 1, "a cancelled message stays as it is");
    let out = with(&["messages", "show", "no-such-event"]);
    assert_eq!(code(&out), 1);
    let out = with(&["messages", "check", "--max-failed", "0"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stdout));
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_entry_is_replayed_by_the_running_consumer() {
    let url = nats_url();
    let Some(publisher) = reachable("NATS", &url, NatsPublisher::connect(&url).await) else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let topic = unique("ops").replace('_', "-");
    let stream = stream_for(&publisher, &topic).await.unwrap();
    let route = Route::topic(topic.clone()).routing_key("order.placed");
    let outbox = event_sqlx::Outbox::new(
        db.pool().clone(),
        OutboxConfig::new().route("ORDER_PLACED", route),
    );
    commit_orders(
        &outbox,
        (0..5).map(|i| Order::place(&format!("o-{i}"), 100).unwrap()),
    )
    .await;
    sqlx::query("CREATE TABLE bill (order_id TEXT PRIMARY KEY)")
        .execute(db.pool())
        .await
        .unwrap();

    // The consumer's handler is broken for o-2 until the fix; it runs in its own task.
    let broken = Arc::new(AtomicBool::new(true));
    let flag = Arc::clone(&broken);
    let billing = Consumer::new(db.pool().clone(), "billing", "1.0.0").on(
        async move |tx: &mut sqlx::SqliteConnection, placed: Delivered<OrderPlaced>| {
            if placed.order_id == "o-2" && flag.load(Ordering::SeqCst) {
                return Err(HandlerError::Permanent("no price list for o-2".into()));
            }
            sqlx::query("INSERT INTO bill (order_id) VALUES (?)")
                .bind(&placed.order_id)
                .execute(&mut *tx)
                .await?;
            Ok(())
        },
    );
    let subscription = durable(&publisher, &stream, "billing", &format!("{topic}.>")).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        subscription
            .run(&billing, async {
                let _ = stopped.await;
            })
            .await
    });
    outbox
        .relay(publisher.clone(), RelayConfig::new("relay"))
        .drain()
        .await
        .unwrap();

    let bills = || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM bill")
            .fetch_one(db.pool())
            .await
            .unwrap()
    };
    let wait_for = async |what: &str, want: i64| {
        wait::until(Duration::from_secs(30), async || match bills().await {
            have if have == want => Ok(()),
            have => Err(format!("{what}: {have} bills")),
        })
        .await
    };
    wait_for("the consumer applied the other four", 4).await;
    let dburl = db.url.as_str();
    let with = |args: &[&str]| eventctl(&[args, &["--database-url", dburl]].concat());

    let out = with(&["quarantine", "list", "--consumer", "billing", "--json"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let entries = json(&out);
    assert_eq!(entries.as_array().unwrap().len(), 1, "{entries}");
    assert_eq!(entries[0]["failure_class"], "permanent");
    let id = entries[0]["id"].as_i64().unwrap().to_string();
    let out = with(&["quarantine", "show", &id]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("no price list for o-2"));
    let out = with(&["quarantine", "check", "--max-entries", "0"]);
    assert_eq!(code(&out), 1);

    // No filter and no --all: refused, nothing changes.
    let out = with(&["quarantine", "requeue", "--consumer", "billing"]);
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--all"));

    // The fix is deployed; the operator requeues; the running consumer replays it.
    broken.store(false, Ordering::SeqCst);
    let out = with(&[
        "quarantine",
        "requeue",
        "--consumer",
        "billing",
        "--event-type",
        "ORDER_PLACED",
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("requeued 1 entries of billing"));
    wait_for("the running consumer replayed the requeued entry", 5).await;
    wait::until(Duration::from_secs(30), async || {
        let out = with(&["quarantine", "list", "--status", "replayed", "--json"]);
        match json(&out).as_array().map(Vec::len) {
            Some(1) => Ok(()),
            _ => Err("the entry was not marked replayed".to_owned()),
        }
    })
    .await;
    let out = with(&["quarantine", "check", "--max-entries", "0"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stdout));
    let out = with(&["quarantine", "cancel", &id, "--reason", "too late"]);
    assert_eq!(code(&out), 1, "a replayed entry is not cancelled");

    let _ = stop.send(());
    running.await.unwrap().unwrap();
    publisher.jetstream().delete_stream(&stream).await.unwrap();
    db.cleanup().await;
}
