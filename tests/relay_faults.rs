//! The relay under faults, on real PostgreSQL, MariaDB and SQLite: a lease renewed while a slow
//! broker holds a batch, a dead relay's events published again within the default lease and
//! recovery, an outage that gives a batch back without spending its retries, and a shutdown that
//! does not wait on a broker that never answers. Time in the database is a `ManualClock` the test
//! moves.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use event_sqlx::{
    ChannelPublisher, Clock, Error, EventStatus, ManualClock, OutboxMessage, PublishError,
    Publisher, RelayConfig,
};
use event_tests::db::{Orders, TestDb};
use event_tests::fixtures::{Order, commit_orders};
use event_tests::wait;

/// Places `count` orders `{prefix}{i}`, one event each.
async fn place_orders<DB: Orders>(db: &TestDb<DB>, prefix: &str, count: usize) {
    commit_orders(
        &db.outbox,
        (0..count).map(|i| Order::place(&format!("{prefix}{i}"), 100).unwrap()),
    )
    .await;
}

/// A broker that hangs: says when a publish has begun, then answers nothing until released.
#[derive(Clone)]
struct Held {
    inner: ChannelPublisher,
    entered: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Semaphore>,
}

impl Held {
    fn new() -> (Held, tokio::sync::mpsc::Receiver<OutboxMessage>) {
        let (inner, received) = ChannelPublisher::channel(1024);
        let held = Held {
            inner,
            entered: Arc::new(tokio::sync::Notify::new()),
            release: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        (held, received)
    }
}

impl Publisher for Held {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        self.entered.notify_one();
        let _permit = self.release.acquire().await.expect("released");
        self.inner.publish(messages).await
    }
}

/// A broker that is unreachable while `down` is set.
struct Flaky {
    inner: ChannelPublisher,
    down: Arc<AtomicBool>,
}

impl Publisher for Flaky {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        if self.down.load(Ordering::SeqCst) {
            let e = PublishError::unavailable("test broker", "connection refused");
            return messages.iter().map(|_| Err(e.clone())).collect();
        }
        self.inner.publish(messages).await
    }
}

/// The rows of orders `{prefix}0..count`, in order.
async fn rows<DB: Orders>(
    db: &TestDb<DB>,
    prefix: &str,
    count: usize,
) -> Vec<event_sqlx::OutboxRecord> {
    let mut rows = Vec::new();
    for i in 0..count {
        rows.extend(
            db.outbox
                .by_aggregate("ORDER", &format!("{prefix}{i}"))
                .await
                .unwrap(),
        );
    }
    rows
}

async fn a_slow_batch_keeps_its_lease_by_heartbeat<DB: Orders>(db: &TestDb<DB>) {
    place_orders(db, "o-h", 5).await;
    let clock = ManualClock::starting_now();
    let outbox = db.outbox.clone().with_clock(clock.clone());
    let (held, _received) = Held::new();
    let slow = outbox.relay(
        held.clone(),
        RelayConfig::new("slow").lease(Duration::from_secs(3)),
    );
    let slow = tokio::spawn(async move { slow.run_once().await.unwrap() });
    tokio::time::timeout(Duration::from_secs(30), held.entered.notified())
        .await
        .expect("the slow relay claimed its batch and began to publish");

    // Far past the lease it claimed with: the heartbeat moves the lease on from the clock's
    // new time (every third of the lease, 1 s here), so no other relay may take the batch.
    clock.advance(Duration::from_secs(60));
    wait::until(Duration::from_secs(10), async || {
        let leases = outbox.leases().await.map_err(|e| e.to_string())?;
        match leases.as_slice() {
            [lease]
                if lease.relay == "slow"
                    && lease.events == 5
                    && lease.earliest_expiry > clock.now() =>
            {
                Ok(())
            }
            other => Err(format!(
                "the lease was not renewed past the moved clock: {other:?}"
            )),
        }
    })
    .await;
    let (other, _) = ChannelPublisher::channel(16);
    let rescuer = outbox.relay(other, RelayConfig::new("rescuer"));
    assert_eq!(rescuer.recover_expired_leases().await.unwrap(), 0);
    assert_eq!(rescuer.run_once().await.unwrap().claimed, 0);

    held.release.add_permits(1);
    let report = slow.await.unwrap();
    assert_eq!((report.published, report.lease_lost), (5, 0), "{report:?}");
    for row in rows(db, "o-h", 5).await {
        assert_eq!(row.publish_status, EventStatus::Succeeded);
        assert_eq!(row.retry_count, 0, "{}: no attempt was lost", row.event_no);
    }
}

async fn a_dead_relays_events_go_out_within_the_default_lease_and_recovery<DB: Orders>(
    db: &TestDb<DB>,
) {
    place_orders(db, "o-d", 5).await;
    let clock = ManualClock::starting_now();
    let outbox = db.outbox.clone().with_clock(clock.clone());
    let (held, _received) = Held::new();
    let dying = outbox.relay(held.clone(), RelayConfig::new("dying"));
    let dying = tokio::spawn(async move { dying.run_once().await });
    tokio::time::timeout(Duration::from_secs(30), held.entered.notified())
        .await
        .expect("the relay claimed its batch and began to publish");
    // Killed mid-batch: its leases stay, no heartbeat renews them.
    dying.abort();
    let _ = dying.await;

    let (publisher, mut received) = ChannelPublisher::channel(64);
    let rescuer = outbox.relay(publisher, RelayConfig::new("rescuer"));
    // With the defaults: a 15 s lease, recovered by a pass every 5 s, due 5 s later.
    clock.advance(Duration::from_secs(14));
    assert_eq!(
        rescuer.recover_expired_leases().await.unwrap(),
        0,
        "still leased at 14 s"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        outbox.lease_expired(10).await.unwrap().len(),
        5,
        "expired at 15 s"
    );
    // The worst case: the next recovery pass comes a whole interval later, at 20 s; the events
    // are due 5 s after it.
    clock.advance(Duration::from_secs(5));
    assert_eq!(rescuer.recover_expired_leases().await.unwrap(), 5);
    assert_eq!(
        rescuer.run_once().await.unwrap().claimed,
        0,
        "not yet due at 20 s"
    );
    clock.advance(Duration::from_secs(5));
    let report = rescuer.run_once().await.unwrap();
    assert_eq!(
        report.published, 5,
        "published 25 s after the claim: {report:?}"
    );
    let mut delivered = 0;
    while received.try_recv().is_ok() {
        delivered += 1;
    }
    assert_eq!(delivered, 5);
}

/// After a relay died mid-batch and its lease ran out, `drain` leaves its events alone (they
/// wait for a recovery pass) and `drain_recovering` publishes them, as `--until-idle` does.
async fn drain_recovering_finishes_what_a_dead_relay_left<DB: Orders>(db: &TestDb<DB>) {
    place_orders(db, "o-r", 4).await;
    let clock = ManualClock::starting_now();
    let outbox = db.outbox.clone().with_clock(clock.clone());
    let (held, _received) = Held::new();
    let dying = outbox.relay(held.clone(), RelayConfig::new("dying"));
    let dying = tokio::spawn(async move { dying.run_once().await });
    tokio::time::timeout(Duration::from_secs(30), held.entered.notified())
        .await
        .expect("the relay claimed its batch and began to publish");
    dying.abort();
    let _ = dying.await;
    clock.advance(Duration::from_secs(16));

    let (publisher, mut received) = ChannelPublisher::channel(64);
    let rescuer = outbox.relay(
        publisher,
        RelayConfig::new("rescuer").lease_recovery(Duration::from_secs(5), Duration::ZERO),
    );
    assert_eq!(
        rescuer.drain().await.unwrap().published,
        0,
        "drain does not recover leases"
    );
    let report = rescuer.drain_recovering().await.unwrap();
    assert_eq!(report.published, 4, "{report:?}");
    let mut delivered = 0;
    while received.try_recv().is_ok() {
        delivered += 1;
    }
    assert_eq!(delivered, 4);
    assert!(outbox.lease_expired(10).await.unwrap().is_empty());
}

async fn an_outage_gives_the_batch_back_without_spending_retries<DB: Orders>(db: &TestDb<DB>) {
    place_orders(db, "o-u", 4).await;
    let down = Arc::new(AtomicBool::new(true));
    let (inner, mut received) = ChannelPublisher::channel(64);
    let relay = db.outbox.relay(
        Flaky {
            inner,
            down: Arc::clone(&down),
        },
        RelayConfig::new("flaky"),
    );
    for _ in 0..3 {
        let e = relay.run_once().await.unwrap_err();
        let Error::BrokerUnavailable {
            claimed,
            published,
            failed,
            deferred,
            ..
        } = &e
        else {
            panic!("an outage, not a failure: {e:?}");
        };
        assert_eq!((*claimed, *published, *deferred, *failed), (4, 0, 4, 0));
        assert!(e.is_transient());
        assert!(e.to_string().contains("given back"), "{e}");
    }
    for row in rows(db, "o-u", 4).await {
        assert_eq!(
            (
                row.publish_status,
                row.retry_count,
                row.locked_by.as_deref()
            ),
            (EventStatus::Pending, 0, None),
            "{}: given back as it was",
            row.event_no
        );
        assert!(
            row.fail_reason
                .as_deref()
                .is_some_and(|r| r.contains("broker unavailable")),
            "{:?}",
            row.fail_reason
        );
    }
    down.store(false, Ordering::SeqCst);
    let report = relay.run_once().await.unwrap();
    assert_eq!(
        report.published, 4,
        "published as soon as the broker answers"
    );
    for row in rows(db, "o-u", 4).await {
        assert_eq!(
            (row.publish_status, row.retry_count),
            (EventStatus::Succeeded, 0)
        );
    }
    let mut delivered = 0;
    while received.try_recv().is_ok() {
        delivered += 1;
    }
    assert_eq!(delivered, 4);
}

async fn a_failed_event_given_back_stays_failed_with_its_count<DB: Orders>(db: &TestDb<DB>) {
    place_orders(db, "o-f", 1).await;
    // A rejection first: counted, with backoff.
    let (closed, receiver) = ChannelPublisher::channel(1);
    drop(receiver);
    let clock = ManualClock::starting_now();
    let outbox = db.outbox.clone().with_clock(clock.clone());
    let rejected = outbox
        .relay(closed, RelayConfig::new("r"))
        .run_once()
        .await
        .unwrap();
    assert_eq!(rejected.failed, 1);
    clock.advance(Duration::from_secs(24 * 3600));
    // Then an outage: not counted.
    let (inner, _received) = ChannelPublisher::channel(4);
    let down = Arc::new(AtomicBool::new(true));
    let flaky = outbox.relay(
        Flaky {
            inner,
            down: Arc::clone(&down),
        },
        RelayConfig::new("flaky"),
    );
    assert!(matches!(
        flaky.run_once().await,
        Err(Error::BrokerUnavailable { .. })
    ));
    let row = rows(db, "o-f", 1).await.remove(0);
    assert_eq!(
        (row.publish_status, row.retry_count),
        (EventStatus::Failed, 1),
        "still failed once"
    );
    down.store(false, Ordering::SeqCst);
    assert_eq!(
        flaky.run_once().await.unwrap().published,
        1,
        "and still due"
    );
}

async fn shutdown_gives_back_a_batch_the_broker_never_acknowledges<DB: Orders>(db: &TestDb<DB>) {
    place_orders(db, "o-s", 3).await;
    let (held, _received) = Held::new();
    let relay = db.outbox.relay(
        held.clone(),
        RelayConfig::new("stopping").shutdown_grace(Duration::from_millis(200)),
    );
    let (stop, running) = event_tests::background::relay(relay);
    tokio::time::timeout(Duration::from_secs(30), held.entered.notified())
        .await
        .expect("the relay began to publish");
    stop.send(()).unwrap();
    // The broker never answers: the relay stops after its grace, not when the broker does.
    let report = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("run returned within its shutdown grace")
        .unwrap();
    assert_eq!((report.published, report.deferred), (0, 3), "{report:?}");
    for row in rows(db, "o-s", 3).await {
        assert_eq!(
            (
                row.publish_status,
                row.retry_count,
                row.locked_by.as_deref()
            ),
            (EventStatus::Pending, 0, None),
            "{}: given back, no lease left held",
            row.event_no
        );
    }
}

event_tests::on_every_backend!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    postgres = TestDb::postgres(), mysql = TestDb::mysql(), sqlite = TestDb::sqlite();
    a_slow_batch_keeps_its_lease_by_heartbeat,
    a_dead_relays_events_go_out_within_the_default_lease_and_recovery,
    drain_recovering_finishes_what_a_dead_relay_left,
    an_outage_gives_the_batch_back_without_spending_retries,
    a_failed_event_given_back_stays_failed_with_its_count,
    shutdown_gives_back_a_batch_the_broker_never_acknowledges,
);
