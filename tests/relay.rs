//! The relay on real PostgreSQL, MariaDB and SQLite: every event published once in aggregate
//! order by relays working together, retries on schedule, blocked aggregates, expired leases,
//! marks that ride out deadlocks and killed connections, and wake-ups by notification.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use event_core::UnitOfWork;
use event_sqlx::{
    Backoff, ChannelPublisher, Clock, CommitPath, EventStatus, ManualClock, OutboxConfig,
    OutboxMessage, PublishError, Publisher, RelayConfig,
};
use event_tests::db::{
    MYSQL_STATUS_INDEX, Orders, TestDb, mysql_with_status_index, postgres_lean, postgres_with,
};
use event_tests::fixtures::{Order, context, place};

/// Fails every event whose event number is listed; sends the rest into a channel.
struct Selective {
    inner: ChannelPublisher,
    fail: HashSet<String>,
    attempts: AtomicUsize,
}

impl Publisher for Selective {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut results = Vec::new();
        for message in messages {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            if self.fail.contains(message.envelope.event_id.as_str()) {
                results.push(Err(PublishError::new("broker rejected the message")));
            } else {
                results.extend(self.inner.publish(std::slice::from_ref(message)).await);
            }
        }
        results
    }
}

/// A broker that hangs: says when a publish has begun, then accepts nothing until released.
struct Held {
    inner: ChannelPublisher,
    entered: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Semaphore>,
}

impl Publisher for Held {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        self.entered.notify_one();
        let _permit = self.release.acquire().await.expect("released");
        self.inner.publish(messages).await
    }
}

/// Runs `relays` concurrently until `expected` events were published or 90 s passed.
async fn drain<DB: Orders, P: Publisher + 'static>(
    db: &TestDb<DB>,
    relays: Vec<event_sqlx::Relay<DB, P>>,
    expected: usize,
) where
    event_sqlx::Relay<DB, P>: Send + Sync,
{
    let published = Arc::new(AtomicUsize::new(0));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let mut tasks = Vec::new();
    for relay in relays {
        let published = Arc::clone(&published);
        tasks.push(tokio::spawn(async move {
            while published.load(Ordering::SeqCst) < expected
                && tokio::time::Instant::now() < deadline
            {
                let report = relay.run_once().await.expect("relay batch");
                published.fetch_add(report.published, Ordering::SeqCst);
                if report.claimed == 0 {
                    // Polling: the other relays hold what is left; the deadline bounds it.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let _ = db;
    assert_eq!(
        published.load(Ordering::SeqCst),
        expected,
        "every event published once"
    );
}

async fn place_many<DB: Orders>(db: &TestDb<DB>, aggregates: usize, events_each: usize) {
    // Events of many aggregates, committed in chunks like a busy service would.
    for chunk in (0..aggregates).collect::<Vec<_>>().chunks(100) {
        let mut tx = db.pool().begin().await.unwrap();
        let mut uow = UnitOfWork::new(context());
        for &i in chunk {
            let id = format!("o-{i}");
            let mut order = Order::place(&id, i as i64).unwrap();
            for n in 1..events_each {
                order.note(&format!("note {n}"));
            }
            uow.collect(&mut order).unwrap();
            DB::save_order(&mut tx, &id, "PLACED", events_each as i64)
                .await
                .unwrap();
        }
        let _ = db.outbox.commit(tx, uow).await.unwrap();
    }
}

/// Everything the channel holds, checked to arrive in sequence within each aggregate: the event
/// ids in arrival order, and each aggregate's last sequence.
fn in_aggregate_order(
    received: &mut tokio::sync::mpsc::Receiver<OutboxMessage>,
) -> (Vec<String>, HashMap<String, u64>) {
    let mut ids = Vec::new();
    let mut last_sequence: HashMap<String, u64> = HashMap::new();
    while let Ok(message) = received.try_recv() {
        let envelope = message.envelope;
        let last = last_sequence
            .entry(envelope.aggregate_id.clone())
            .or_insert(0);
        assert_eq!(
            envelope.aggregate_sequence,
            *last + 1,
            "order broken for {}",
            envelope.aggregate_id
        );
        *last = envelope.aggregate_sequence;
        ids.push(envelope.event_id.to_string());
    }
    (ids, last_sequence)
}

async fn four_relays_publish_every_event_exactly_once_in_aggregate_order<DB: Orders>(
    db: &TestDb<DB>,
) where
    event_sqlx::Relay<DB, ChannelPublisher>: Send + Sync,
{
    let (aggregates, each) = (1000, 3);
    place_many(db, aggregates, each).await;
    let (publisher, mut received) = ChannelPublisher::channel(aggregates * each + 1);
    let relays = (0..4)
        .map(|i| {
            db.outbox.relay(
                publisher.clone(),
                RelayConfig::new(format!("relay-{i}")).batch_size(100),
            )
        })
        .collect();
    drop(publisher);
    drain(db, relays, aggregates * each).await;

    let (ids, last_sequence) = in_aggregate_order(&mut received);
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "an event was published twice");
    assert_eq!(ids.len(), aggregates * each);
    assert!(last_sequence.values().all(|&s| s == each as u64));
    let counts = db.outbox.status_counts(None, ..).await.unwrap();
    assert_eq!(counts.succeeded, (aggregates * each) as i64);
    assert_eq!(counts.total(), counts.succeeded);
}

/// `drain` publishes everything claimable, in aggregate order, even when the batch claimed while
/// the previous one was in flight could not yet take the next events of a long aggregate; a
/// failed event holds back only its own aggregate, and is left for its retry.
async fn drain_publishes_every_claimable_event_in_aggregate_order<DB: Orders>(db: &TestDb<DB>) {
    let (aggregates, each) = (50, 6);
    place_many(db, aggregates, each).await;
    let mut long = Order::place("o-long", 1).unwrap();
    for n in 1..40 {
        long.note(&format!("note {n}"));
    }
    let mut tx = db.pool().begin().await.unwrap();
    DB::save_order(&mut tx, "o-long", "PLACED", 40)
        .await
        .unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut long).unwrap();
    let _ = db.outbox.commit(tx, uow).await.unwrap();

    let (inner, mut received) = ChannelPublisher::channel(1000);
    let publisher = Selective {
        inner,
        fail: HashSet::from(["ORDER_PLACED:ORDER:o-7:1".to_owned()]),
        attempts: AtomicUsize::new(0),
    };
    let relay = db
        .outbox
        .relay(publisher, RelayConfig::new("drainer").batch_size(16));
    let report = relay.drain().await.unwrap();
    let expected = aggregates * each + 40 - each;
    assert_eq!(report.published, expected, "{report:?}");
    assert_eq!(report.failed, 1, "{report:?}");
    assert_eq!(report.claimed, expected + 1, "{report:?}");

    let (ids, last_sequence) = in_aggregate_order(&mut received);
    assert_eq!(ids.len(), expected);
    assert_eq!(last_sequence.get("o-long"), Some(&40));
    assert_eq!(
        last_sequence.get("o-7"),
        None,
        "o-7 is held back by its failed head"
    );
    assert_eq!(db.outbox.pending(100).await.unwrap().len(), each - 1);
    // The failed head is not due yet: nothing more to claim.
    assert_eq!(
        relay.drain().await.unwrap(),
        event_sqlx::BatchReport::default()
    );
}

/// Two relays drain one small backlog together: neither returns while the other still holds
/// events whose successors it could publish, and whichever returns first finds everything
/// published. Each event is published once, and each relay's leases show while it holds them.
async fn relays_draining_together_finish_only_when_nothing_is_left<DB: Orders>(db: &TestDb<DB>)
where
    event_sqlx::Relay<DB, ChannelPublisher>: Send + Sync + 'static,
{
    let (aggregates, each) = (30, 4);
    place_many(db, aggregates, each).await;
    let (publisher, mut received) = ChannelPublisher::channel(1000);
    let relay = |name: &str| {
        let relay = db
            .outbox
            .relay(publisher.clone(), RelayConfig::new(name).batch_size(200));
        tokio::spawn(async move { relay.drain().await.unwrap() })
    };
    let (mut a, mut b) = (relay("a"), relay("b"));
    let (first, other) = tokio::select! {
        done = &mut a => (done.unwrap(), b),
        done = &mut b => (done.unwrap(), a),
    };
    let counts = db.counts().await;
    assert_eq!(
        counts.succeeded,
        (aggregates * each) as i64,
        "the first relay to return left work behind: {counts:?} (it published {first:?})"
    );
    let other = other.await.unwrap();
    assert_eq!(first.published + other.published, aggregates * each);
    let (ids, _) = in_aggregate_order(&mut received);
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(
        (ids.len(), distinct.len()),
        (aggregates * each, aggregates * each),
        "each event published once"
    );
    assert!(db.outbox.leases().await.unwrap().is_empty());
}

async fn failures_are_retried_on_schedule_then_stay_failed<DB: Orders>(db: &TestDb<DB>) {
    let clock = ManualClock::starting_now();
    let outbox = event_sqlx::Outbox::new(
        db.pool().clone(),
        OutboxConfig::new().max_retry_count(3).clock(clock.clone()),
    );
    let mut order = Order::place("o-f", 1).unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    let tx = db.pool().begin().await.unwrap();
    let _ = outbox.commit(tx, uow).await.unwrap();

    let event_no = "ORDER_PLACED:ORDER:o-f:1";
    let (inner, _received) = ChannelPublisher::channel(8);
    let publisher = Selective {
        inner,
        fail: HashSet::from([event_no.to_owned()]),
        attempts: AtomicUsize::new(0),
    };
    let schedule = [60, 300, 1800].map(Duration::from_secs);
    let relay = outbox.relay(
        publisher,
        RelayConfig::new("r1").backoff(Backoff::schedule(schedule).jitter(0.0)),
    );
    for (failure, delay) in schedule.iter().enumerate() {
        let report = relay.run_once().await.unwrap();
        assert_eq!(
            (report.claimed, report.failed),
            (1, 1),
            "attempt {}",
            failure + 1
        );
        let row = outbox.by_event_no(event_no).await.unwrap().unwrap();
        assert_eq!(row.publish_status, EventStatus::Failed);
        assert_eq!(row.retry_count, failure as i32 + 1);
        assert_eq!(
            row.fail_reason.as_deref(),
            Some("broker rejected the message")
        );
        assert!(row.locked_by.is_none() && row.lock_until.is_none());
        let next = row.next_retry_time.unwrap();
        assert_eq!(
            (next - row.update_time).to_std().unwrap(),
            *delay,
            "retry {} is scheduled {delay:?} after the failure",
            failure + 1
        );
        // Not due yet, a second before: nothing to claim. Due on the second, while retries
        // remain.
        clock.advance(*delay - Duration::from_secs(1));
        assert_eq!(relay.run_once().await.unwrap().claimed, 0);
        assert!(outbox.due_retries(10).await.unwrap().is_empty());
        clock.advance(Duration::from_secs(1));
        let retries_left = failure + 1 < schedule.len();
        assert_eq!(
            outbox.due_retries(10).await.unwrap().len(),
            usize::from(retries_left)
        );
    }
    // Retries used up: it stays failed, visible, and is never claimed again.
    assert_eq!(relay.run_once().await.unwrap().claimed, 0);
    assert_eq!(relay.publisher().attempts.load(Ordering::SeqCst), 3);
    let row = outbox.by_event_no(event_no).await.unwrap().unwrap();
    assert_eq!(
        (row.publish_status, row.retry_count),
        (EventStatus::Failed, 3)
    );
    assert!(outbox.due_retries(10).await.unwrap().is_empty());
    let many = outbox.many_failures(3, 10).await.unwrap();
    assert_eq!(
        many.iter().map(|r| r.event_no.as_str()).collect::<Vec<_>>(),
        vec![event_no]
    );
    assert_eq!(
        outbox
            .failed_by_topic("order.event", 10)
            .await
            .unwrap()
            .len(),
        1
    );

    // An operator retry gives it one more round.
    assert!(outbox.retry(event_no).await.unwrap());
    assert_eq!(relay.run_once().await.unwrap().claimed, 1);
}

async fn exhausted_events_are_cancelled_only_when_asked_and_never_when_critical<DB: Orders>(
    db: &TestDb<DB>,
) {
    let outbox = db.outbox.clone();
    place(db, "o-c", true).await;
    let (inner, _received) = ChannelPublisher::channel(8);
    let publisher = Selective {
        inner,
        fail: HashSet::from([
            "ORDER_PLACED:ORDER:o-c:1".to_owned(),
            "ORDER_PAID:o-c".to_owned(),
        ]),
        attempts: AtomicUsize::new(0),
    };
    let relay = outbox.relay(
        publisher,
        RelayConfig::new("r1")
            .unordered()
            .cancel_exhausted()
            .critical("ORDER_PAID")
            .backoff(Backoff::schedule([Duration::ZERO]).jitter(0.0)),
    );
    // The rows were written with the default of 5 retries; with no backoff each batch is a retry.
    for _ in 0..6 {
        relay.run_once().await.unwrap();
    }
    let placed = outbox
        .by_event_no("ORDER_PLACED:ORDER:o-c:1")
        .await
        .unwrap()
        .unwrap();
    let paid = outbox.by_event_no("ORDER_PAID:o-c").await.unwrap().unwrap();
    assert_eq!(placed.publish_status, EventStatus::Cancelled);
    assert_eq!(
        paid.publish_status,
        EventStatus::Failed,
        "critical events are never auto-cancelled"
    );
    assert_eq!(paid.retry_count, 5);
}

async fn a_blocked_aggregate_holds_back_only_itself<DB: Orders>(db: &TestDb<DB>) {
    place(db, "o-bad", true).await;
    for i in 0..10 {
        place(db, &format!("o-good-{i}"), true).await;
    }
    let (inner, mut received) = ChannelPublisher::channel(64);
    let publisher = Selective {
        inner,
        fail: HashSet::from(["ORDER_PLACED:ORDER:o-bad:1".to_owned()]),
        attempts: AtomicUsize::new(0),
    };
    let relay = db.outbox.relay(
        publisher,
        RelayConfig::new("r1").backoff(Backoff::schedule([Duration::ZERO]).jitter(0.0)),
    );
    for _ in 0..8 {
        relay.run_once().await.unwrap();
    }
    let mut published = Vec::new();
    while let Ok(m) = received.try_recv() {
        published.push(m.envelope.event_id.to_string());
    }
    assert_eq!(
        published.len(),
        20,
        "every other aggregate was published: {published:?}"
    );
    assert!(published.iter().all(|id| !id.contains("o-bad")));
    let bad = db.outbox.by_aggregate("ORDER", "o-bad").await.unwrap();
    assert_eq!(bad[0].publish_status, EventStatus::Failed);
    assert_eq!(bad[0].retry_count, 5, "the head used up its retries");
    assert_eq!(
        bad[1].publish_status,
        EventStatus::Pending,
        "held back behind its head"
    );
    let failed = db.outbox.failed_by_topic("order.event", 10).await.unwrap();
    assert_eq!(failed.len(), 1);

    // The operator skips the poisoned head; the aggregate moves on.
    let skipped = db
        .outbox
        .skip_head("ORDER", "o-bad", "skipped by operator")
        .await
        .unwrap();
    assert_eq!(skipped.as_deref(), Some("ORDER_PLACED:ORDER:o-bad:1"));
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    let bad = db.outbox.by_aggregate("ORDER", "o-bad").await.unwrap();
    assert_eq!(
        (bad[0].publish_status, bad[1].publish_status),
        (EventStatus::Cancelled, EventStatus::Succeeded)
    );
    assert_eq!(
        received.try_recv().unwrap().envelope.event_id.as_str(),
        "ORDER_PAID:o-bad"
    );
}

async fn expired_leases_are_recovered_and_published_by_another_relay<DB: Orders>(db: &TestDb<DB>)
where
    event_sqlx::Relay<DB, Held>: Send + Sync,
{
    for i in 0..5 {
        place(db, &format!("o-l{i}"), false).await;
    }
    let clock = ManualClock::starting_now();
    let outbox = db.outbox.clone().with_clock(clock.clone());
    let (inner, mut received) = ChannelPublisher::channel(64);
    let (entered, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Semaphore::new(0)),
    );
    let stuck = outbox.relay(
        Held {
            inner: inner.clone(),
            entered: Arc::clone(&entered),
            release: Arc::clone(&release),
        },
        RelayConfig::new("stuck").lease(Duration::from_secs(120)),
    );
    let stuck = tokio::spawn(async move { stuck.run_once().await.unwrap() });
    tokio::time::timeout(Duration::from_secs(30), entered.notified())
        .await
        .expect("the stuck relay claimed its batch and began to publish");
    assert!(outbox.lease_expired(10).await.unwrap().is_empty());
    let leases = outbox.leases().await.unwrap();
    assert_eq!(
        leases
            .iter()
            .map(|l| (l.relay.as_str(), l.events))
            .collect::<Vec<_>>(),
        vec![("stuck", 5)]
    );
    assert!(leases[0].earliest_expiry > clock.now());
    clock.advance(Duration::from_secs(121));
    assert_eq!(outbox.lease_expired(10).await.unwrap().len(), 5);

    let rescuer = outbox.relay(
        inner,
        RelayConfig::new("rescuer").lease_recovery(Duration::ZERO, Duration::ZERO),
    );
    assert_eq!(rescuer.recover_expired_leases().await.unwrap(), 5);
    let report = rescuer.run_once().await.unwrap();
    assert_eq!(report.published, 5);

    release.add_permits(1);
    let late = stuck.await.unwrap();
    assert_eq!((late.claimed, late.published, late.lease_lost), (5, 0, 5));
    for i in 0..5 {
        let row = db
            .outbox
            .by_aggregate("ORDER", &format!("o-l{i}"))
            .await
            .unwrap()
            .remove(0);
        assert_eq!(row.publish_status, EventStatus::Succeeded);
        assert_eq!(
            row.retry_count, 1,
            "the lease expiry counted as one failed attempt"
        );
    }
    let mut delivered = 0;
    while received.try_recv().is_ok() {
        delivered += 1;
    }
    assert_eq!(
        delivered, 10,
        "at least once: the stuck relay's late publishes arrive too"
    );
}

// Bound on PostgreSQL, as the commit rules (tests/commit.rs).
event_tests::on_every_backend!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    postgres = postgres_with(CommitPath::Bound), postgres_lean = postgres_lean(),
    mysql = TestDb::mysql(), mysql_status_index = mysql_with_status_index(),
    sqlite = TestDb::sqlite();
    four_relays_publish_every_event_exactly_once_in_aggregate_order,
    drain_publishes_every_claimable_event_in_aggregate_order,
    relays_draining_together_finish_only_when_nothing_is_left,
    failures_are_retried_on_schedule_then_stay_failed,
    exhausted_events_are_cancelled_only_when_asked_and_never_when_critical,
    a_blocked_aggregate_holds_back_only_itself,
    expired_leases_are_recovered_and_published_by_another_relay,
);

/// Lets the first batch through only when told: the test acts between claim and mark.
struct Gate {
    inner: ChannelPublisher,
    reached: tokio::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    go: tokio::sync::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}

impl Publisher for Gate {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        if let Some(reached) = self.reached.lock().await.take() {
            let _ = reached.send(());
        }
        if let Some(go) = self.go.lock().await.take() {
            let _ = go.await;
        }
        self.inner.publish(messages).await
    }
}

/// A relay whose mark PostgreSQL rolls back as a deadlock victim runs the mark again and
/// reports its batch published, instead of failing the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_relay_runs_a_mark_again_after_a_deadlock() {
    use std::str::FromStr;
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    place(&db, "o-a", false).await;
    place(&db, "o-b", false).await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM biz_outbox_event ORDER BY id")
        .fetch_all(db.pool())
        .await
        .unwrap();
    // The relay's sessions look for deadlocks after 2 s of waiting, the blocker's only after a
    // minute: the relay is the victim.
    let options = sqlx::postgres::PgConnectOptions::from_str(&db.url)
        .unwrap()
        .options([("deadlock_timeout", "2s")]);
    let outbox = event_sqlx::Outbox::new(
        sqlx::PgPool::connect_with(options).await.unwrap(),
        OutboxConfig::new(),
    );
    let (inner, mut received) = ChannelPublisher::channel(8);
    let (reached, reached_rx) = tokio::sync::oneshot::channel();
    let (go, go_rx) = tokio::sync::oneshot::channel();
    let gate = Gate {
        inner,
        reached: tokio::sync::Mutex::new(Some(reached)),
        go: tokio::sync::Mutex::new(Some(go_rx)),
    };
    let relay = outbox.relay(gate, RelayConfig::new("victim"));
    let running = tokio::spawn(async move { relay.run_once().await });
    reached_rx.await.unwrap();

    let mut blocker = db.pool().begin().await.unwrap();
    sqlx::query("SET LOCAL deadlock_timeout = '60s'")
        .execute(&mut *blocker)
        .await
        .unwrap();
    sqlx::query("SELECT id FROM biz_outbox_event WHERE id = $1 FOR UPDATE")
        .bind(ids[1])
        .fetch_one(&mut *blocker)
        .await
        .unwrap();
    go.send(()).unwrap();
    // The mark takes the first row, then waits for the second.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE 'UPDATE biz_outbox_event SET publish_status = 2%'",
        )
        .fetch_one(db.pool())
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the mark never waited"
        );
        // Polling the other session, with the deadline above.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Close the cycle: the blocker waits for the first row until the relay's mark is rolled back.
    sqlx::query("UPDATE biz_outbox_event SET remark = 'blocker' WHERE id = $1")
        .bind(ids[0])
        .execute(&mut *blocker)
        .await
        .unwrap();
    blocker.commit().await.unwrap();

    let report = running.await.unwrap().expect("the mark is run again");
    assert_eq!(report.published, 2, "{report:?}");
    assert_eq!(report.lease_lost, 0, "{report:?}");
    assert!(received.try_recv().is_ok() && received.try_recv().is_ok());
    assert!(db.outbox.pending(10).await.unwrap().is_empty());
    db.cleanup().await;
}

/// The relay's connection is killed while it marks a published batch: the mark runs again on a
/// fresh connection as soon as the database answers, so every event is published once and no
/// aggregate waits for a lease to expire. `kill` names how the database ends the session
/// (`pg_terminate_backend`, `KILL`); `waiting_mark` finds the session of the blocked mark.
async fn a_killed_connection_during_the_mark_is_ridden_out<DB: Orders>(
    db: &TestDb<DB>,
    lock_row: &'static str,
    waiting_mark: &'static str,
    kill: &'static str,
) where
    event_sqlx::Relay<DB, Gate>: Send + Sync + 'static,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    const EVENTS: usize = 20;
    for i in 0..EVENTS {
        place(db, &format!("o-k{i:02}"), false).await;
    }
    let (inner, mut received) = ChannelPublisher::channel(EVENTS * 2);
    let (reached, reached_rx) = tokio::sync::oneshot::channel();
    let (go, go_rx) = tokio::sync::oneshot::channel();
    let gate = Gate {
        inner,
        reached: tokio::sync::Mutex::new(Some(reached)),
        go: tokio::sync::Mutex::new(Some(go_rx)),
    };
    let relay = db.outbox.relay(gate, RelayConfig::new("marker"));
    let running = tokio::spawn(async move { relay.run_once().await });
    reached_rx.await.unwrap();

    // Claimed and being published: another session locks one of the rows, so the mark waits.
    let mut blocker = db.pool().begin().await.unwrap();
    sqlx::query(lock_row)
        .bind("ORDER_PLACED:ORDER:o-k07:1")
        .execute(&mut *blocker)
        .await
        .unwrap();
    go.send(()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let session = loop {
        let found: Option<i64> = sqlx::query_scalar(waiting_mark)
            .fetch_optional(db.pool())
            .await
            .unwrap();
        if let Some(session) = found {
            break session;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the mark never waited"
        );
        // Polling the other session, with the deadline above.
        tokio::task::yield_now().await;
    };
    // The database ends the relay's session mid-mark; then the lock goes away.
    // The session id is a number the database gave: nothing from outside reaches the SQL.
    sqlx::query(sqlx::AssertSqlSafe(
        kill.replace("{session}", &session.to_string()),
    ))
    .execute(db.pool())
    .await
    .unwrap();
    blocker.rollback().await.unwrap();

    let report = running
        .await
        .unwrap()
        .expect("the mark rides out the lost connection");
    assert_eq!(
        (report.claimed, report.published, report.lease_lost),
        (EVENTS, EVENTS, 0),
        "{report:?}"
    );
    let mut seen = HashSet::new();
    while let Ok(message) = received.try_recv() {
        assert!(
            seen.insert(message.envelope.event_id.to_string()),
            "published twice: {}",
            message.envelope.event_id
        );
    }
    assert_eq!(seen.len(), EVENTS);
    assert!(
        db.outbox.leases().await.unwrap().is_empty(),
        "nothing left leased"
    );
    assert!(db.outbox.pending(10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_relay_rides_out_a_killed_connection_while_marking() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    a_killed_connection_during_the_mark_is_ridden_out(
        &db,
        "UPDATE biz_outbox_event SET remark = 'blocker' WHERE event_no = $1",
        "SELECT pid::int8 FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' \
         AND query LIKE 'UPDATE biz_outbox_event SET publish_status = 2%' LIMIT 1",
        "SELECT pg_terminate_backend({session})",
    )
    .await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_relay_rides_out_a_killed_connection_while_marking() {
    let Some(db) = TestDb::mysql().await else {
        return;
    };
    a_killed_connection_during_the_mark_is_ridden_out(
        &db,
        "UPDATE biz_outbox_event SET remark = 'blocker' WHERE event_no = ?",
        "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() \
         AND ID <> CONNECTION_ID() \
         AND INFO LIKE 'UPDATE biz_outbox_event SET publish_status = 2%' LIMIT 1",
        "KILL CONNECTION {session}",
    )
    .await;
    db.cleanup().await;
}

/// Copies the event of the order `o-template` into `count` events (up to 100,000), numbered
/// `n` from 0: the aggregate id and sequence are SQL expressions of `n`, the status and next
/// retry time those given. One statement, digits cross-joined for `n`.
async fn copy_template(
    db: &TestDb<sqlx::MySql>,
    count: i64,
    (aggregate_id, sequence): (&str, &str),
    status: EventStatus,
    next_retry_time: Option<chrono::DateTime<chrono::Utc>>,
) {
    let digit = "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
        UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
        UNION ALL SELECT 8 UNION ALL SELECT 9)";
    let statement = format!(
        "INSERT INTO biz_outbox_event (event_no, aggregate_type, aggregate_id, \
         aggregate_sequence, event_type, event_version, event_source, publish_channel, topic, \
         routing_key, event_payload, event_headers, publish_status, next_retry_time) \
         SELECT CONCAT({aggregate_id}, ':', {sequence}), t.aggregate_type, {aggregate_id}, \
         {sequence}, t.event_type, t.event_version, t.event_source, t.publish_channel, t.topic, \
         t.routing_key, t.event_payload, t.event_headers, ?, ? \
         FROM biz_outbox_event t, (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS n \
         FROM {digit} a, {digit} b, {digit} c, {digit} e, {digit} f) numbers \
         WHERE t.aggregate_id = 'o-template' AND numbers.n < ?"
    );
    sqlx::query(sqlx::AssertSqlSafe(statement))
        .bind(status.code())
        .bind(next_retry_time)
        .bind(count)
        .execute(db.pool())
        .await
        .unwrap();
}

/// A drain by a relay on a pool of one connection: the events it claimed, and the index entries
/// its session read in order (`Handler_read_next`).
async fn mysql_drain_reads(db: &TestDb<sqlx::MySql>) -> (usize, u64) {
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap();
    let read_next = async || -> u64 {
        let (_, value): (String, String) =
            sqlx::query_as("SHOW SESSION STATUS LIKE 'Handler_read_next'")
                .fetch_one(&pool)
                .await
                .unwrap();
        value.parse().unwrap()
    };
    let before = read_next().await;
    let outbox = event_sqlx::Outbox::new(pool.clone(), OutboxConfig::new());
    let (publisher, _received) = ChannelPublisher::channel(100);
    let report = outbox
        .relay(publisher, RelayConfig::new("r"))
        .drain()
        .await
        .unwrap();
    let read = read_next().await - before;
    pool.close().await;
    (report.claimed, read)
}

/// MySQL has no partial index. With the migrations' indexes the claim looks up each
/// candidate's previous event, so a long published history costs nothing; after a cancelled
/// previous event it walks the earlier events through `uk_aggregate_sequence`, however many were
/// published. With an index that leads with `(aggregate_type, aggregate_id, publish_status)`, a
/// relay finds it and probes each unpublished status instead: no walk at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_claim_reads_only_unpublished_events_with_the_status_index() {
    let Some(db) = TestDb::mysql().await else {
        return;
    };
    place(&db, "o-template", false).await;
    // One order with a history of 20,000 published events and a new one; 20,000 other orders
    // whose event failed and is due tomorrow, so that no status index is the cheaper way to
    // the long order's earlier events.
    let long = ("'o-long'", "n + 1");
    copy_template(&db, 20_000, long, EventStatus::Succeeded, None).await;
    let one = |sequence: &'static str| ("'o-long'", sequence);
    copy_template(&db, 1, one("20001"), EventStatus::Pending, None).await;
    let tomorrow = chrono::Utc::now() + chrono::Duration::days(1);
    let others = ("CONCAT('o-', n)", "1");
    copy_template(&db, 20_000, others, EventStatus::Failed, Some(tomorrow)).await;
    sqlx::query("ANALYZE TABLE biz_outbox_event")
        .execute(db.pool())
        .await
        .unwrap();
    let (claimed, after_published) = mysql_drain_reads(&db).await;
    assert_eq!(claimed, 2, "the template's event and the long order's last");
    assert!(
        after_published < 1_000,
        "the drain read {after_published} index entries: the previous event, published, was \
         expected to decide"
    );

    copy_template(&db, 1, one("20002"), EventStatus::Cancelled, None).await;
    copy_template(&db, 1, one("20003"), EventStatus::Pending, None).await;
    let (claimed, after_cancelled) = mysql_drain_reads(&db).await;
    assert_eq!(claimed, 1, "the event after the cancelled one");
    assert!(
        after_cancelled >= 20_000,
        "the check read {after_cancelled} entries: after a cancelled event it was expected to \
         walk the 20,001 published events"
    );

    sqlx::query(MYSQL_STATUS_INDEX)
        .execute(db.pool())
        .await
        .unwrap();
    copy_template(&db, 1, one("20004"), EventStatus::Cancelled, None).await;
    copy_template(&db, 1, one("20005"), EventStatus::Pending, None).await;
    let (claimed, with_index) = mysql_drain_reads(&db).await;
    assert_eq!(claimed, 1, "the event after the second cancelled one");
    assert!(
        with_index < 1_000,
        "with the status index the drain read {with_index} index entries; without it, \
         {after_cancelled}"
    );
    let unpublished: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM biz_outbox_event WHERE aggregate_id = 'o-long' \
         AND publish_status NOT IN (2, 4)",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        unpublished, 0,
        "every event of the long order published or cancelled"
    );
    db.cleanup().await;
}

/// Marks `o-g:1` deleted.
const DELETE_G1: &str =
    "UPDATE biz_outbox_event SET deleted = 1 WHERE aggregate_id = 'o-g' AND aggregate_sequence = 1";

/// The events before a drain in `claims_as_the_earlier_events_decide`, beside the order
/// `o-template`: aggregate, sequence, status, and whether it is due only tomorrow.
const EARLIER_EVENTS: [(&str, i64, EventStatus, bool); 17] = {
    use EventStatus::{Cancelled, Failed, Pending, Succeeded};
    [
        // After a cancelled event, behind a published one: goes.
        ("a", 1, Succeeded, false),
        ("a", 2, Cancelled, false),
        ("a", 3, Pending, false),
        // After a cancelled event, behind a failed one: waits.
        ("b", 1, Failed, true),
        ("b", 2, Cancelled, false),
        ("b", 3, Pending, false),
        // Right behind a failed one: waits.
        ("c", 1, Failed, true),
        ("c", 2, Pending, false),
        // The first event archived: goes.
        ("d", 2, Pending, false),
        // Behind a published one: goes, and so does the next in the same drain.
        ("e", 1, Succeeded, false),
        ("e", 2, Pending, false),
        ("e", 3, Pending, false),
        // Behind a deleted one: goes (the deleted one is not published either).
        ("g", 1, Pending, false),
        ("g", 2, Pending, false),
        // Right behind a published event that an unordered relay published past a failed one:
        // goes where the previous event decides, waits where the unpublished events are read.
        ("h", 1, Failed, true),
        ("h", 2, Succeeded, false),
        ("h", 3, Pending, false),
    ]
};

/// A claim decides each candidate by its previous event when the table has no index of the
/// unpublished events per aggregate (MySQL's migrations; PostgreSQL's lean profile reads back to
/// the nearest earlier event that is neither cancelled nor deleted, which decides alike):
/// published lets it go, unpublished holds it back, and past a cancelled, deleted or absent
/// (archived) one the earlier events decide. `EARLIER_EVENTS` are in the outbox, and `o-g:1`
/// is deleted ([`DELETE_G1`]); `past_published` tells whether a candidate behind a published
/// event goes although an earlier one is unpublished (`o-h`).
async fn claims_as_the_earlier_events_decide<DB: Orders>(db: &TestDb<DB>, past_published: bool) {
    let (publisher, mut received) = ChannelPublisher::channel(100);
    let report = db
        .outbox
        .relay(publisher, RelayConfig::new("r"))
        .drain()
        .await
        .unwrap();
    let mut published = Vec::new();
    while let Ok(message) = received.try_recv() {
        let envelope = message.envelope;
        published.push(format!(
            "{}:{}",
            envelope.aggregate_id, envelope.aggregate_sequence
        ));
    }
    published.sort();
    let mut expected = vec!["o-a:3", "o-d:2", "o-e:2", "o-e:3", "o-g:2", "o-template:1"];
    if past_published {
        expected.insert(5, "o-h:3");
    }
    assert_eq!(published, expected, "{report:?}");
}

/// [`claims_as_the_earlier_events_decide`] on MySQL.
async fn mysql_claims_as_the_earlier_events_decide(db: TestDb<sqlx::MySql>, past_published: bool) {
    place(&db, "o-template", false).await;
    let tomorrow = chrono::Utc::now() + chrono::Duration::days(1);
    for (aggregate, sequence, status, due_tomorrow) in EARLIER_EVENTS {
        let id = format!("'o-{aggregate}'");
        let sequence = sequence.to_string();
        copy_template(
            &db,
            1,
            (id.as_str(), sequence.as_str()),
            status,
            due_tomorrow.then_some(tomorrow),
        )
        .await;
    }
    sqlx::query(DELETE_G1).execute(db.pool()).await.unwrap();
    claims_as_the_earlier_events_decide(&db, past_published).await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_claims_as_the_earlier_events_decide_by_the_previous_event() {
    if let Some(db) = TestDb::mysql().await {
        mysql_claims_as_the_earlier_events_decide(db, true).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_claims_as_the_earlier_events_decide_with_the_status_index() {
    if let Some(db) = mysql_with_status_index().await {
        mysql_claims_as_the_earlier_events_decide(db, false).await;
    }
}

/// PostgreSQL's lean profile has no partial index of the unpublished events per aggregate: a
/// relay finds that when it starts and decides by the nearest earlier event that counts. With
/// the migrations' indexes, the partial index decides (`o-h:3` waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claims_as_the_earlier_events_decide_in_either_profile() {
    for lean in [true, false] {
        let db = if lean {
            postgres_lean().await
        } else {
            TestDb::postgres().await
        };
        let Some(db) = db else {
            return;
        };
        place(&db, "o-template", false).await;
        let tomorrow = chrono::Utc::now() + chrono::Duration::days(1);
        for (aggregate, sequence, status, due_tomorrow) in EARLIER_EVENTS {
            sqlx::query(
                "INSERT INTO biz_outbox_event (event_no, aggregate_type, aggregate_id, \
                 aggregate_sequence, event_type, event_version, event_source, publish_channel, \
                 topic, routing_key, event_payload, event_headers, publish_status, \
                 next_retry_time) \
                 SELECT $1 || ':' || $2, t.aggregate_type, $1, $2, t.event_type, \
                 t.event_version, t.event_source, t.publish_channel, t.topic, t.routing_key, \
                 t.event_payload, t.event_headers, $3, $4 \
                 FROM biz_outbox_event t WHERE t.aggregate_id = 'o-template'",
            )
            .bind(format!("o-{aggregate}"))
            .bind(sequence)
            .bind(status.code())
            .bind(due_tomorrow.then_some(tomorrow))
            .execute(db.pool())
            .await
            .unwrap();
        }
        sqlx::query(DELETE_G1).execute(db.pool()).await.unwrap();
        claims_as_the_earlier_events_decide(&db, lean).await;
        db.cleanup().await;
    }
}

/// Without the status index, a candidate with no previous event (here the aggregate's first)
/// has its earlier events walked on `uk_aggregate_sequence`, which stops at the candidate: it is
/// claimed without reading any of the events after it. (Left to choose, MariaDB walks
/// `idx_aggregate`, every event of the aggregate, for each candidate that passes the check.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_claim_reads_none_of_an_aggregates_later_events() {
    let Some(db) = TestDb::mysql().await else {
        return;
    };
    place(&db, "o-template", false).await;
    // The long order's first event is pending; 20,000 after it failed and are due tomorrow.
    copy_template(&db, 1, ("'o-long'", "1"), EventStatus::Pending, None).await;
    let tomorrow = chrono::Utc::now() + chrono::Duration::days(1);
    let later = ("'o-long'", "n + 2");
    copy_template(&db, 20_000, later, EventStatus::Failed, Some(tomorrow)).await;
    sqlx::query("ANALYZE TABLE biz_outbox_event")
        .execute(db.pool())
        .await
        .unwrap();
    let (claimed, read) = mysql_drain_reads(&db).await;
    assert_eq!(
        claimed, 2,
        "the template's event and the long order's first"
    );
    assert!(
        read < 1_000,
        "the drain read {read} index entries: the check walked the long order's later events"
    );
    let first: i16 = sqlx::query_scalar(
        "SELECT publish_status FROM biz_outbox_event WHERE aggregate_id = 'o-long' \
         AND aggregate_sequence = 1",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        first,
        EventStatus::Succeeded.code(),
        "the first event published"
    );
    db.cleanup().await;
}

/// A named lock the test holds, and a trigger that makes each UPDATE of the outbox matching
/// `when` (a condition on `OLD` and `NEW`) wait for it: a relay's statement held open inside its
/// transaction, with whatever locks it took.
struct LockGate {
    name: String,
    holder: sqlx::pool::PoolConnection<sqlx::MySql>,
    pool: sqlx::MySqlPool,
}

impl LockGate {
    async fn close(db: &TestDb<sqlx::MySql>, when: &str) -> LockGate {
        let name = event_tests::db::unique("gate");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE TRIGGER hold_at_the_gate BEFORE UPDATE ON biz_outbox_event FOR EACH ROW \
             BEGIN IF {when} THEN DO GET_LOCK('{name}', 60); DO RELEASE_LOCK('{name}'); \
             END IF; END"
        )))
        .execute(db.pool())
        .await
        .unwrap();
        let mut holder = db.pool().acquire().await.unwrap();
        let held: i64 = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
            .bind(&name)
            .fetch_one(&mut *holder)
            .await
            .unwrap();
        assert_eq!(held, 1, "the test holds the gate");
        LockGate {
            name,
            holder,
            pool: db.pool().clone(),
        }
    }

    /// How many statements wait at the gate.
    async fn waiting(&self) -> Result<i64, String> {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() \
             AND STATE = 'User lock'",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(|e| e.to_string())
    }

    /// Commits order `id` once one `statement` waits at the gate, then opens it. Were the
    /// gap where new events go locked, the INSERT would wait for the statement, which waits
    /// for the test: the deadline turns that into a failure.
    async fn commit_beside(mut self, db: &TestDb<sqlx::MySql>, id: &str, statement: &str) {
        event_tests::wait::until(Duration::from_secs(30), async || {
            match self.waiting().await? {
                1 => Ok(()),
                n => Err(format!("{n} statements wait at the gate")),
            }
        })
        .await;
        let committed = tokio::time::timeout(Duration::from_secs(20), place(db, id, false)).await;
        let still_waiting = self.waiting().await.unwrap();
        let _: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
            .bind(&self.name)
            .fetch_one(&mut *self.holder)
            .await
            .unwrap();
        assert!(
            committed.is_ok(),
            "the producer's commit waited for the relay's {statement} to commit"
        );
        assert_eq!(
            still_waiting, 1,
            "the {statement} was still open when the producer committed"
        );
    }
}

/// A claim that reads to the end of the claimable events locks only the rows it leases: under
/// MySQL's default `REPEATABLE READ` it also locked the gap where every new pending event goes,
/// and each producer's INSERT waited until the claim committed. The claim is held open inside
/// its transaction at a [`LockGate`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_claim_in_progress_does_not_hold_back_a_producers_insert() {
    let Some(db) = TestDb::mysql().await else {
        return;
    };
    place(&db, "o-1", false).await;
    let gate = LockGate::close(&db, "NEW.publish_status = 1 AND OLD.publish_status <> 1").await;
    let (publisher, mut received) = ChannelPublisher::channel(10);
    let relay = db.outbox.relay(publisher, RelayConfig::new("gated"));
    let draining = tokio::spawn(async move { relay.drain().await });
    gate.commit_beside(&db, "o-2", "claim").await;

    let report = draining.await.unwrap().unwrap();
    assert_eq!(report.published, 2, "{report:?}");
    let mut orders: Vec<String> = std::iter::from_fn(|| received.try_recv().ok())
        .map(|m| m.envelope.aggregate_id)
        .collect();
    orders.sort();
    assert_eq!(orders, ["o-1", "o-2"]);
    db.cleanup().await;
}

/// A relay's lease recovery, like its claim, locks only the rows it moves, even run before the
/// relay starts: under MySQL's default `REPEATABLE READ` its range on the status index also
/// locked the gap before the first leased row, where every new pending event goes, and a
/// producer's INSERT waited for it. The recovery is held open at a [`LockGate`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_lease_recovery_in_progress_does_not_hold_back_a_producers_insert() {
    let Some(db) = TestDb::mysql().await else {
        return;
    };
    place(&db, "o-dead", false).await;
    // The event a relay that died had leased: in progress, its lease over an hour ago.
    let leased = sqlx::query(
        "UPDATE biz_outbox_event SET publish_status = 1, locked_by = 'dead', \
         lock_until = NOW(6) - INTERVAL 1 HOUR WHERE aggregate_id = 'o-dead'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    assert_eq!(leased.rows_affected(), 1);
    let gate = LockGate::close(&db, "OLD.publish_status = 1 AND NEW.publish_status = 3").await;
    // A relay's recovery before anything else, as `eventctl relay --until-idle` runs it.
    let (publisher, mut received) = ChannelPublisher::channel(10);
    let relay = Arc::new(db.outbox.relay(
        publisher,
        RelayConfig::new("rescuer").lease_recovery(Duration::from_secs(3600), Duration::ZERO),
    ));
    let recovering = tokio::spawn({
        let relay = Arc::clone(&relay);
        async move { relay.recover_expired_leases().await }
    });
    gate.commit_beside(&db, "o-new", "lease recovery").await;
    assert_eq!(recovering.await.unwrap().unwrap(), 1);

    // Both are published: the recovered event (due at once) and the new one.
    let report = relay.drain().await.unwrap();
    assert_eq!(report.published, 2, "{report:?}");
    let mut orders: Vec<String> = std::iter::from_fn(|| received.try_recv().ok())
        .map(|m| m.envelope.aggregate_id)
        .collect();
    orders.sort();
    assert_eq!(orders, ["o-dead", "o-new"]);
    db.cleanup().await;
}

/// A relay takes the statistics of an outbox table that never had any (just filled, before
/// autovacuum): without them PostgreSQL may plan the claim through every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_relay_takes_statistics_of_a_table_that_has_none() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let analyzed = async || -> bool {
        sqlx::query_scalar(
            "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables \
             WHERE relname = 'biz_outbox_event'",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    assert!(analyzed().await, "migrate takes them");
    sqlx::query("SELECT pg_stat_reset_single_table_counters('biz_outbox_event'::regclass)")
        .execute(db.pool())
        .await
        .unwrap();
    assert!(!analyzed().await);
    place(&db, "o-s", false).await;
    let (publisher, _received) = ChannelPublisher::channel(8);
    db.outbox
        .relay(publisher, RelayConfig::new("r"))
        .drain()
        .await
        .unwrap();
    assert!(analyzed().await, "the relay took them on start");
    db.cleanup().await;
}

/// A PostgreSQL outbox whose statistics are those `migrate` took of the empty table, with
/// `orders` orders committed since and autovacuum off for the table, so that nothing takes them
/// again behind the test's back.
async fn postgres_filled_after_its_statistics(orders: usize) -> Option<TestDb<sqlx::Postgres>> {
    postgres_filled_after_its_statistics_with(orders, 1).await
}

/// [`postgres_filled_after_its_statistics`], `events_each` events per order.
async fn postgres_filled_after_its_statistics_with(
    orders: usize,
    events_each: usize,
) -> Option<TestDb<sqlx::Postgres>> {
    let db = TestDb::postgres().await?;
    sqlx::raw_sql("ALTER TABLE biz_outbox_event SET (autovacuum_enabled = false)")
        .execute(db.pool())
        .await
        .unwrap();
    place_many(&db, orders, events_each).await;
    Some(db)
}

/// A relay started right after a bulk commit takes the statistics again, whether or not the
/// server has counted the new rows yet (it counts them up to a second late): the table grew from
/// empty to over a megabyte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_statistics_taken_before_a_bulk_commit_are_stale() {
    let Some(db) = postgres_filled_after_its_statistics(8_000).await else {
        return;
    };
    assert!(
        db.outbox.ensure_statistics().await.unwrap(),
        "statistics of the empty table were kept for a table of 8,000 rows"
    );
    let tuples: f32 =
        sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE relname = 'biz_outbox_event'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert!(tuples > 7_000.0, "ANALYZE counted {tuples} rows");
    assert!(!db.outbox.ensure_statistics().await.unwrap(), "fresh now");
    db.cleanup().await;
}

/// A running relay takes the statistics again as a new outbox fills: PostgreSQL keeps the plan it
/// made for a prepared claim or mark while the table was empty (a scan of every row) until the
/// statistics change, so without this each claim and mark costs more as the table grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_running_relay_takes_statistics_again_as_the_table_fills() {
    let Some(db) = postgres_filled_after_its_statistics(0).await else {
        return;
    };
    let tuples = async || -> f32 {
        sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE relname = 'biz_outbox_event'")
            .fetch_one(db.pool())
            .await
            .unwrap()
    };
    assert!(tuples().await < 1.0, "migrate took them of the empty table");
    let orders = 3_000;
    let (publisher, mut received) = ChannelPublisher::channel(orders + 1);
    // Lease recovery (which once took them too) does not come round during the test.
    let config = RelayConfig::new("r").lease_recovery(Duration::from_secs(600), Duration::ZERO);
    let (stop, running) = event_tests::background::relay(db.outbox.relay(publisher, config));
    // The relay is past its start once it has published a first event.
    place(&db, "o-first", false).await;
    tokio::time::timeout(Duration::from_secs(30), received.recv())
        .await
        .expect("the first event was not published within 30 s")
        .expect("the relay stopped");
    place_many(&db, orders, 1).await;
    // Waiting for the relay: the statistics counted the new rows, or the deadline passed.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while tuples().await < 2_000.0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let counted = tuples().await;
    // Stopped only once every event is out: a relay stopped earlier gives its next batch back.
    let mut published = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while published < orders {
        match tokio::time::timeout_at(deadline, received.recv()).await {
            Ok(Some(_)) => published += 1,
            _ => break,
        }
    }
    let _ = stop.send(());
    let report = running.await.unwrap();
    assert_eq!(report.published, orders + 1, "{report:?}");
    assert!(
        counted >= 2_000.0,
        "a relay that published {orders} events into an empty table left its statistics at \
         {counted} rows"
    );
    while received.try_recv().is_ok() {
        published += 1;
    }
    assert_eq!(published, orders);
    db.cleanup().await;
}

/// The claim's per-aggregate check probes the index once per candidate whatever the planner's
/// statistics say: with statistics of the empty table and a backlog of 3,000, an anti join
/// would read the unpublished index once per candidate (500 x 3,000 entries). The backlog is
/// each order's second event, its first published by hand (a first event has nothing to check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claim_does_not_depend_on_the_statistics() {
    let Some(db) = postgres_filled_after_its_statistics_with(3_000, 2).await else {
        return;
    };
    sqlx::query("UPDATE biz_outbox_event SET publish_status = 2 WHERE aggregate_sequence = 1")
        .execute(db.pool())
        .await
        .unwrap();
    let stats: (f32, i32) = sqlx::query_as(
        "SELECT reltuples, relpages FROM pg_class WHERE relname = 'biz_outbox_event'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        stats,
        (0.0, 0),
        "the statistics are those of the empty table"
    );
    sqlx::query(
        "SELECT pg_stat_reset_single_table_counters('outbox_idx_unpublished_aggregate'::regclass)",
    )
    .execute(db.pool())
    .await
    .unwrap();
    // Its own pool, closed after the claim: a backend that ends reports its counters.
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let outbox = event_sqlx::Outbox::new(pool.clone(), OutboxConfig::new());
    let (publisher, _received) = ChannelPublisher::channel(1000);
    let relay = outbox.relay(publisher, RelayConfig::new("r").batch_size(500));
    assert_eq!(
        relay.run_once().await.unwrap().published,
        500,
        "one batch claimed"
    );
    pool.close().await;
    let read = async || -> (i64, i64) {
        sqlx::query_as(
            "SELECT idx_scan, idx_tup_read FROM pg_stat_user_indexes \
             WHERE indexrelname = 'outbox_idx_unpublished_aggregate'",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    let (scans, tuples) = event_tests::wait::until(Duration::from_secs(10), async || {
        let (scans, tuples) = read().await;
        if scans >= 500 {
            Ok((scans, tuples))
        } else {
            Err(format!("{scans} scans of the unpublished index reported"))
        }
    })
    .await;
    assert!(
        tuples < 5_000,
        "{scans} probes read {tuples} index entries: the check read the backlog per candidate"
    );
    db.cleanup().await;
}

/// The durability each relay write on PostgreSQL ran under, as a trigger saw it inside the
/// write's own transaction: `(status written, synchronous_commit)`, in order; `None` without
/// a server.
async fn relay_writes_durability(synchronous_commit: Option<bool>) -> Option<Vec<(i16, String)>> {
    let db = TestDb::postgres().await?;
    sqlx::raw_sql(
        "CREATE TABLE relay_write (id BIGSERIAL PRIMARY KEY, status SMALLINT NOT NULL, \
           synchronous_commit TEXT NOT NULL);
         CREATE FUNCTION record_relay_write() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO relay_write (status, synchronous_commit)
             VALUES (NEW.publish_status, current_setting('synchronous_commit'));
           RETURN NEW;
         END $$;
         CREATE TRIGGER relay_write AFTER UPDATE ON biz_outbox_event
           FOR EACH ROW EXECUTE FUNCTION record_relay_write();",
    )
    .execute(db.pool())
    .await
    .unwrap();
    place(&db, "o-durable", false).await;
    // One connection: the relay's writes and the check after them share it.
    let pool = db.one_connection().await;
    let outbox = event_sqlx::Outbox::new(pool.clone(), OutboxConfig::new());
    let (publisher, _received) = ChannelPublisher::channel(8);
    let mut config = RelayConfig::new("r");
    if let Some(wait) = synchronous_commit {
        config = config.synchronous_commit(wait);
    }
    let report = outbox.relay(publisher, config).run_once().await.unwrap();
    assert_eq!(report.published, 1);
    let after: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        after, "on",
        "the relay left its setting on the pooled connection"
    );
    pool.close().await;
    let writes = sqlx::query_as("SELECT status, synchronous_commit FROM relay_write ORDER BY id")
        .fetch_all(db.pool())
        .await
        .unwrap();
    db.cleanup().await;
    Some(writes)
}

/// By default the relay's claim and mark commit without waiting for the disk (their loss in a
/// crash only publishes the event again), each for its own transaction alone: the pooled
/// connection is left as it was. `synchronous_commit(true)` makes them wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_relay_writes_wait_for_the_disk_only_when_asked() {
    let Some(default) = relay_writes_durability(None).await else {
        return;
    };
    let (claimed, published) = (
        EventStatus::InProgress.code(),
        EventStatus::Succeeded.code(),
    );
    let off = |status| (status, "off".to_owned());
    let on = |status| (status, "on".to_owned());
    assert_eq!(default, [off(claimed), off(published)]);
    assert_eq!(
        relay_writes_durability(Some(true)).await,
        Some(vec![on(claimed), on(published)])
    );
}

/// The mark of a small batch (a quiet outbox publishes a few events per batch) is planned once
/// per connection, not at every batch: PostgreSQL plans a prepared statement afresh each time
/// while the plan for the values given looks cheaper than the plan for any value, and it costs
/// `id = ANY($1)` by the array's length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_marks_of_small_batches_are_planned_once_per_connection() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    // A published history, counted: on a table the server believes tiny every plan is cheap.
    sqlx::query(
        "INSERT INTO biz_outbox_event (event_no, aggregate_type, aggregate_id, \
           aggregate_sequence, event_type, event_version, event_source, publish_channel, topic, \
           routing_key, event_payload, publish_status, max_retry_count) \
         SELECT 'history-' || g, 'ORDER', 'history-' || g, 1, 'ORDER_PLACED', 1, 'test', 'mq', \
           'orders', 'order.placed', '{}', $1, 3 FROM generate_series(1, 20000) g",
    )
    .bind(EventStatus::Succeeded.code())
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::raw_sql("ANALYZE biz_outbox_event")
        .execute(db.pool())
        .await
        .unwrap();
    // One connection: the relay's statements and the look at their plans share it.
    let pool = db.one_connection().await;
    let outbox = event_sqlx::Outbox::new(pool.clone(), OutboxConfig::new());
    let (publisher, _received) = ChannelPublisher::channel(64);
    let relay = outbox.relay(publisher, RelayConfig::new("quiet"));
    let batches = 12;
    for i in 0..batches {
        // Batches of one to three events.
        let events = 1 + i % 3;
        for k in 0..events {
            place(&db, &format!("o-quiet-{i}-{k}"), false).await;
        }
        let report = relay.run_once().await.unwrap();
        assert_eq!(report.published, usize::try_from(events).unwrap());
    }
    let (generic, custom): (i64, i64) = sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE $1",
    )
    .bind(format!(
        "UPDATE biz_outbox_event SET publish_status = {}%",
        EventStatus::Succeeded.code()
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    db.cleanup().await;
    // PostgreSQL tries five plans for the values given before it compares.
    assert!(
        custom <= 5 && generic + custom == batches,
        "the marks of {batches} small batches were planned {custom} times for their values, \
         {generic} times for any value"
    );
}

/// A commit in one process wakes the relay of another at once, through PostgreSQL LISTEN/NOTIFY,
/// long before its poll interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_notify_wakes_a_relay_in_another_process() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let config = OutboxConfig::new().notify_postgres(event_tests::db::unique("outbox"));
    let writer = event_sqlx::Outbox::new(db.pool().clone(), config.clone());
    // Another process: its own pool, its own relay, polling only every minute.
    let reader_pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let reader = event_sqlx::Outbox::new(reader_pool.clone(), config);
    let listener = reader.listen_for_commits().await.unwrap();
    let (publisher, mut received) = ChannelPublisher::channel(8);
    let relay = reader.relay(
        publisher,
        RelayConfig::new("listener").poll_interval(Duration::from_secs(60)),
    );
    // Commits come only once the relay has made its first (empty) claim and is waiting: then
    // only the notification can wake it before its 60 s poll.
    let (stop, running) = running_relay(&db, relay).await;

    let mut order = Order::place("o-notify", 1).unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    let _ = writer
        .commit(db.pool().begin().await.unwrap(), uow)
        .await
        .unwrap();
    let message = tokio::time::timeout(Duration::from_secs(5), received.recv())
        .await
        .expect("woken by NOTIFY, not by the 60 s poll")
        .unwrap();
    assert_eq!(message.envelope.aggregate_id, "o-notify");

    let _ = stop.send(());
    running.await.unwrap();
    listener.abort();
    reader_pool.close().await;
    let err = event_sqlx::Outbox::new(db.pool().clone(), OutboxConfig::new())
        .listen_for_commits()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("notify_postgres"), "{err}");
    db.cleanup().await;
}

/// Runs `relay` in a task of its own until the returned sender is used, once it has made its
/// first claim on `db` (and, finding nothing, waits).
async fn running_relay<P: Publisher + 'static>(
    db: &TestDb<sqlx::Postgres>,
    relay: event_sqlx::Relay<sqlx::Postgres, P>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<event_sqlx::BatchReport>,
) {
    let (stop, running) = event_tests::background::relay(relay);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let claimed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND state = 'idle' AND query LIKE 'UPDATE biz_outbox_event SET publish_status = 1%'",
        )
        .fetch_one(db.pool())
        .await
        .unwrap();
        if claimed > 0 {
            return (stop, running);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the relay never made its first claim"
        );
        tokio::task::yield_now().await;
    }
}

/// A running relay woken by one commit publishes all of it, in order, without waiting for its
/// poll: a claim takes only the first unpublished event of each aggregate, and the claim that
/// follows a batch that was not full takes the next ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_woken_relay_publishes_each_aggregates_events_without_polling() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let outbox = event_sqlx::Outbox::new(db.pool().clone(), OutboxConfig::new());
    let (publisher, mut received) = ChannelPublisher::channel(16);
    let relay = outbox.relay(
        publisher,
        RelayConfig::new("woken")
            .batch_size(50)
            .poll_interval(Duration::from_secs(60)),
    );
    let (stop, running) = running_relay(&db, relay).await;

    let mut uow = UnitOfWork::new(context());
    for id in ["o-a", "o-b"] {
        let mut order = Order::place(id, 1).unwrap();
        order.pay(1).unwrap();
        uow.collect(&mut order).unwrap();
    }
    let _ = outbox
        .commit(db.pool().begin().await.unwrap(), uow)
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let message = tokio::time::timeout(Duration::from_secs(5), received.recv())
            .await
            .expect("published at once, not at the 60 s poll")
            .unwrap();
        seen.push((
            message.envelope.aggregate_id.clone(),
            message.envelope.event_type.clone(),
        ));
    }
    for id in ["o-a", "o-b"] {
        let types: Vec<&str> = seen
            .iter()
            .filter(|(aggregate, _)| aggregate == id)
            .map(|(_, event_type)| event_type.as_str())
            .collect();
        assert_eq!(types, ["ORDER_PLACED", "ORDER_PAID"], "{seen:?}");
    }

    let _ = stop.send(());
    let report = running.await.unwrap();
    assert_eq!(report.published, 4, "{report:?}");
    db.cleanup().await;
}

/// The claim time of the one event of `order`.
async fn claimed_at<DB: Orders>(db: &TestDb<DB>, order: &str) -> chrono::DateTime<chrono::Utc> {
    let records = db.outbox.by_aggregate("ORDER", order).await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    records[0].last_publish_time.expect("the event was claimed")
}

/// With a linger, the commits that follow a batch that was not full wait for it and go out in
/// one claim, which starts at least the linger after the claim before it; without one, each
/// would wake the relay for a claim of its own at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_relay_claims_the_commits_that_follow_a_batch_together() {
    let Some(db) = TestDb::sqlite().await else {
        return;
    };
    let linger = Duration::from_secs(1);
    let (publisher, mut received) = ChannelPublisher::channel(16);
    let relay = db.outbox.relay(
        publisher,
        RelayConfig::new("lingering")
            .batch_size(50)
            .linger(linger)
            .poll_interval(Duration::from_secs(60)),
    );
    let (stop, running) = event_tests::background::relay(relay);
    let next = async |received: &mut tokio::sync::mpsc::Receiver<OutboxMessage>| {
        tokio::time::timeout(Duration::from_secs(30), received.recv())
            .await
            .expect("published within 30 s")
            .expect("the relay stopped")
            .envelope
            .aggregate_id
    };
    place(&db, "o-first", false).await;
    assert_eq!(next(&mut received).await, "o-first");
    let followers = ["o-2", "o-3", "o-4", "o-5", "o-6"];
    for id in followers {
        place(&db, id, false).await;
    }
    let mut seen = Vec::new();
    for _ in followers {
        seen.push(next(&mut received).await);
    }
    assert_eq!(seen, followers);
    let first = claimed_at(&db, "o-first").await;
    let mut claims = HashSet::new();
    for id in followers {
        claims.insert(claimed_at(&db, id).await);
    }
    assert_eq!(
        claims.len(),
        1,
        "claimed in {} claims: {claims:?}",
        claims.len()
    );
    let second = claims.into_iter().next().unwrap();
    assert!(
        second - first >= chrono::Duration::from_std(linger).unwrap(),
        "the second claim came {} after the first, within the linger of {linger:?}",
        second - first
    );
    let _ = stop.send(());
    let report = running.await.unwrap();
    assert_eq!(report.published, 6, "{report:?}");
    db.cleanup().await;
}

/// Commits one order placed and noted twice: three events of one aggregate, which a relay
/// claims one at a time, in order.
async fn commit_three_events_of_one_order(outbox: &event_sqlx::Outbox<sqlx::Sqlite>) {
    let mut order = Order::place("o-long", 1).unwrap();
    order.note("first note");
    order.note("second note");
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    let tx = outbox.pool().begin().await.unwrap();
    let _ = outbox.commit(tx, uow).await.unwrap();
}

/// A relay behind a backlog claims again at once after a batch that was not full: here the
/// events of one aggregate, committed ten minutes before the relay starts, one claim each in
/// aggregate order. Lingering a minute after each, it would take two minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_behind_a_backlog_does_not_linger() {
    let Some(db) = TestDb::sqlite().await else {
        return;
    };
    let clock = ManualClock::starting_now();
    let outbox =
        event_sqlx::Outbox::new(db.pool().clone(), OutboxConfig::new().clock(clock.clone()));
    commit_three_events_of_one_order(&outbox).await;
    clock.advance(Duration::from_secs(600));

    let (publisher, mut received) = ChannelPublisher::channel(16);
    let relay = outbox.relay(
        publisher,
        RelayConfig::new("behind")
            .batch_size(50)
            .linger(Duration::from_secs(60))
            .poll_interval(Duration::from_secs(60)),
    );
    let (stop, running) = event_tests::background::relay(relay);
    let mut sequences = Vec::new();
    for _ in 0..3 {
        let message = tokio::time::timeout(Duration::from_secs(30), received.recv())
            .await
            .expect("published within 30 s: the relay lingered behind its backlog")
            .expect("the relay stopped");
        sequences.push(message.envelope.aggregate_sequence);
    }
    assert_eq!(sequences, [1, 2, 3]);
    let _ = stop.send(());
    let report = running.await.unwrap();
    assert_eq!(report.published, 3, "{report:?}");
    db.cleanup().await;
}

/// A drain never lingers: the events of one aggregate just committed, one claim each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_does_not_linger() {
    let Some(db) = TestDb::sqlite().await else {
        return;
    };
    commit_three_events_of_one_order(&db.outbox).await;
    let (publisher, _received) = ChannelPublisher::channel(16);
    let relay = db.outbox.relay(
        publisher,
        RelayConfig::new("draining").linger(Duration::from_secs(60)),
    );
    let report = tokio::time::timeout(Duration::from_secs(30), relay.drain())
        .await
        .expect("drained within 30 s: the drain lingered")
        .unwrap();
    assert_eq!((report.claimed, report.published), (3, 3), "{report:?}");
    db.cleanup().await;
}

/// A relay stops at once while it lingers, however long the linger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_relay_stops_without_waiting_out_its_linger() {
    let Some(db) = TestDb::sqlite().await else {
        return;
    };
    let (publisher, mut received) = ChannelPublisher::channel(16);
    let relay = db.outbox.relay(
        publisher,
        RelayConfig::new("lingering")
            .linger(Duration::from_secs(60))
            .poll_interval(Duration::from_secs(60)),
    );
    let (stop, running) = event_tests::background::relay(relay);
    place(&db, "o-1", false).await;
    tokio::time::timeout(Duration::from_secs(30), received.recv())
        .await
        .expect("published within 30 s")
        .expect("the relay stopped");
    // The relay now lingers a minute before its next claim.
    let _ = stop.send(());
    let report = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the relay did not stop within 10 s of its shutdown")
        .unwrap();
    assert_eq!(report.published, 1, "{report:?}");
    db.cleanup().await;
}

/// While it lingers, a relay keeps the connection of its last write for its next claim when
/// the pool can spare another (giving a connection back and taking one again cost a round trip
/// each); from a pool of one it gives it back, as the application may need it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_relay_keeps_its_connection_when_the_pool_can_spare_one() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let mut releases = Vec::new();
    for max_connections in [4, 1] {
        let (pool, released) = db.counting_pool(max_connections).await;
        let outbox = event_sqlx::Outbox::new(pool.clone(), OutboxConfig::new());
        let (publisher, mut received) = ChannelPublisher::channel(16);
        let relay = outbox.relay(
            publisher,
            RelayConfig::new("lingering")
                .linger(Duration::from_millis(100))
                .poll_interval(Duration::from_secs(60)),
        );
        let (stop, running) = event_tests::background::relay(relay);
        // One event at a time: each batch is followed by a linger, then a claim that finds
        // nothing.
        for i in 0..10 {
            let id = format!("o-{max_connections}-{i}");
            event_tests::fixtures::commit_orders(&outbox, [Order::place(&id, 1).unwrap()]).await;
            let message = tokio::time::timeout(Duration::from_secs(30), received.recv())
                .await
                .expect("published within 30 s")
                .expect("the relay stopped");
            assert_eq!(message.envelope.aggregate_id, id);
        }
        let _ = stop.send(());
        let report = running.await.unwrap();
        assert_eq!(report.published, 10, "{report:?}");
        releases.push(released.load(Ordering::Relaxed));
        pool.close().await;
    }
    // One fewer per linger with four (seen: 25 against 34, three runs), give or take a
    // claim that finds the next event already committed.
    let (kept, small) = (releases[0], releases[1]);
    assert!(
        kept + 6 <= small,
        "{kept} connections given back to a pool of four, {small} to a pool of one: the 10 \
         lingers should have kept theirs with four"
    );
    db.cleanup().await;
}
