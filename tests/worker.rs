//! The message-event worker on real PostgreSQL, MariaDB and SQLite.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use event_sqlx::{Backoff, EventStatus, HandlerError, MessageEvent, MessageStore, MessageWorker};
use event_tests::db::{Orders, TestDb};

fn message(no: &str, event_type: &str) -> MessageEvent {
    MessageEvent {
        event_no: no.into(),
        event_type: event_type.into(),
        biz_type: "ORDER".into(),
        biz_id: no.into(),
        event_source: "order-service".into(),
        payload: serde_json::json!({"n": no}),
        trace_id: None,
    }
}

async fn handles_retries_and_cancels_like_the_seed<DB: Orders>(db: &TestDb<DB>) {
    let store = MessageStore::new(db.pool().clone());
    for i in 0..20 {
        store
            .create(&message(&format!("OK-{i}"), "SEND_RECEIPT"))
            .await
            .unwrap();
    }
    store.create(&message("FLAKY", "SYNC_STOCK")).await.unwrap();
    store.create(&message("PAY", "PAY_SUCCESS")).await.unwrap();
    store.create(&message("MAIL", "SEND_MAIL")).await.unwrap();
    store.create(&message("NOBODY", "UNHANDLED")).await.unwrap();
    store.create(&message("BAD", "IMPORT_ROW")).await.unwrap();

    let handled = Arc::new(AtomicUsize::new(0));
    let flaky_calls = Arc::new(AtomicUsize::new(0));
    let worker = {
        let handled = Arc::clone(&handled);
        let flaky_calls = Arc::clone(&flaky_calls);
        MessageWorker::new(store.clone())
            .concurrency(3)
            .backoff(Backoff::schedule([Duration::ZERO]).jitter(0.0))
            .cancel_exhausted()
            .critical("PAY_SUCCESS")
            .handle("SEND_RECEIPT", move |_m| {
                let handled = Arc::clone(&handled);
                async move {
                    handled.fetch_add(1, Ordering::SeqCst);
                    // Let the other handlers in the round interleave with this one.
                    tokio::task::yield_now().await;
                    Ok(())
                }
            })
            .handle("SYNC_STOCK", move |_m| {
                let calls = flaky_calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if calls < 2 {
                        Err(HandlerError::Transient(
                            "stock service timed out".to_owned(),
                        ))
                    } else {
                        Ok(())
                    }
                }
            })
            .handle("PAY_SUCCESS", |_m| async {
                Err(HandlerError::Transient("payment gateway down".to_owned()))
            })
            .handle("SEND_MAIL", |_m| async {
                Err(HandlerError::Transient("mailbox full".to_owned()))
            })
            .handle("IMPORT_ROW", |_m| async {
                Err(HandlerError::Permanent("row 7 has no price".to_owned()))
            })
    };

    // Two workers race over the same rows: the claim guard lets one of them run each message.
    for _ in 0..6 {
        let (a, b) = tokio::join!(worker.run_once(), worker.run_once());
        let (a, b) = (a.unwrap(), b.unwrap());
        if a.claimed + b.claimed == 0 {
            break;
        }
    }
    assert_eq!(
        handled.load(Ordering::SeqCst),
        20,
        "each receipt handled exactly once"
    );
    assert_eq!(
        flaky_calls.load(Ordering::SeqCst),
        3,
        "failed twice, retried, succeeded"
    );

    let status = async |no: &str| store.by_event_no(no).await.unwrap().unwrap();
    assert_eq!(status("OK-7").await.event_status, EventStatus::Succeeded);
    let flaky = status("FLAKY").await;
    assert_eq!(
        (flaky.event_status, flaky.retry_count),
        (EventStatus::Succeeded, 2)
    );
    let pay = status("PAY").await;
    assert_eq!(
        (pay.event_status, pay.retry_count),
        (EventStatus::Failed, 3),
        "critical: stays failed for a person"
    );
    assert_eq!(pay.fail_reason.as_deref(), Some("payment gateway down"));
    let mail = status("MAIL").await;
    assert_eq!(
        mail.event_status,
        EventStatus::Cancelled,
        "not critical: cancelled after its last retry"
    );
    let bad = status("BAD").await;
    assert_eq!(
        (bad.event_status, bad.retry_count),
        (EventStatus::Cancelled, 1),
        "a permanent failure is not retried"
    );
    assert_eq!(
        status("NOBODY").await.event_status,
        EventStatus::Pending,
        "no handler: left alone"
    );

    // Shutdown: `run` returns when asked, with nothing in flight.
    let report = worker.run(std::future::ready(())).await;
    assert_eq!(report.claimed, 0);
}

event_tests::on_every_backend!(multi_thread: handles_retries_and_cancels_like_the_seed);
