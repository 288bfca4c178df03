//! The transactional outbox and its relay, on real PostgreSQL, MariaDB and SQLite: each scenario
//! runs on a fresh database of every backend.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use event_core::{Aggregate, EventContext, RecordedEvents, UnitOfWork};
use event_sqlx::{
    Backoff, ChannelPublisher, Clock, CommitPath, Error, EventStatus, ManualClock, OutboxConfig,
    OutboxMessage, PublishError, Publisher, RelayConfig,
};
use event_tests::db::{Orders, TestDb};
use event_tests::fixtures::{NoteAdded, Order};

fn context() -> EventContext {
    EventContext::new("order-service").tenant_id("acme")
}

/// Places `id` and commits the order row and its event together.
async fn place<DB: Orders>(db: &TestDb<DB>, id: &str, paid: bool) {
    let mut order = Order::place(id, 1000).unwrap();
    if paid {
        order.pay(1000).unwrap();
    }
    let mut tx = db.pool().begin().await.unwrap();
    DB::save_order(&mut tx, id, if paid { "PAID" } else { "PLACED" }, 1)
        .await
        .unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    db.outbox.commit(tx, uow).await.unwrap();
}

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

async fn state_and_events_commit_or_roll_back_together<DB: Orders>(db: &TestDb<DB>) {
    place(db, "o-1", true).await;
    assert_eq!(DB::count_orders(db.pool()).await.unwrap(), 1);
    let events = db.outbox.by_aggregate("ORDER", "o-1").await.unwrap();
    let seen: Vec<(i64, &str, EventStatus)> = events
        .iter()
        .map(|e| (e.aggregate_sequence, e.event_no.as_str(), e.publish_status))
        .collect();
    assert_eq!(
        seen,
        vec![
            (1, "ORDER_PLACED:ORDER:o-1:1", EventStatus::Pending),
            (2, "ORDER_PAID:o-1", EventStatus::Pending)
        ]
    );
    let stored = events[1].envelope().unwrap();
    assert_eq!(stored.headers.tenant_id.as_deref(), Some("acme"));
    assert_eq!(stored.payload["amount_minor"], 1000);
    assert_eq!(events[1].topic.as_deref(), Some("order.event"));
    assert_eq!(events[1].routing_key.as_deref(), Some("order.paid"));
    assert_eq!(events[1].event_source, "order-service");
    assert_eq!(events[1].max_retry_count, 5);

    // Flushed, then dropped without commit: neither the order nor its event remains.
    let mut order = Order::place("o-2", 5).unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    let envelopes = uow.commit();
    {
        let mut tx = db.pool().begin().await.unwrap();
        DB::save_order(&mut tx, "o-2", "PLACED", 1).await.unwrap();
        let report = db.outbox.flush(&mut tx, &envelopes).await.unwrap();
        assert_eq!(report.recorded.len(), 1);
    }
    assert_eq!(DB::count_orders(db.pool()).await.unwrap(), 1);
    assert!(
        db.outbox
            .by_aggregate("ORDER", "o-2")
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_duplicate_event_no_is_absorbed_and_changes_nothing<DB: Orders>(db: &TestDb<DB>) {
    place(db, "o-1", true).await;
    let (publisher, mut received) = ChannelPublisher::channel(16);
    let relay = db.outbox.relay(publisher, RelayConfig::new("r1"));
    // Per-aggregate order: the second event waits until the first is published.
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    assert_eq!(
        received.recv().await.unwrap().envelope.event_type,
        "ORDER_PLACED"
    );
    let before = db
        .outbox
        .by_event_no("ORDER_PAID:o-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(before.publish_status, EventStatus::Succeeded);

    // The retried command: same business identity, so the same event number, another payload.
    let mut retried = Order {
        id: "o-1".into(),
        paid: false,
        events: RecordedEvents::loaded_at(1),
    };
    retried.pay(999_999).unwrap();
    retried
        .record(NoteAdded {
            text: "retried".into(),
        })
        .unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut retried).unwrap();
    let envelopes = uow.commit();
    let mut tx = db.pool().begin().await.unwrap();
    let report = db.outbox.flush(&mut tx, &envelopes[..1]).await.unwrap();
    tx.commit().await.unwrap();
    assert!(report.recorded.is_empty());
    assert_eq!(
        report
            .already_recorded
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>(),
        vec!["ORDER_PAID:o-1"]
    );
    let after = db
        .outbox
        .by_event_no("ORDER_PAID:o-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after, before, "a duplicate never overwrites the stored row");
    assert_eq!(after.event_payload["amount_minor"], 1000);

    // A duplicate inside one flush is absorbed as well.
    let mut tx = db.pool().begin().await.unwrap();
    let both = [envelopes[1].clone(), envelopes[1].clone()];
    let report = db.outbox.flush(&mut tx, &both).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(report.recorded.len(), 1);
    assert_eq!(report.already_recorded.len(), 1);

    // A duplicate beside a new event, after a business write: the new event and the business
    // write commit (on MySQL the rejected first INSERT rolls back only itself).
    let mut again = Order {
        id: "o-1".into(),
        paid: true,
        events: RecordedEvents::loaded_at(3),
    };
    again
        .record(NoteAdded {
            text: "again".into(),
        })
        .unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut again).unwrap();
    let new = uow.commit().remove(0);
    let orders_before = DB::count_orders(db.pool()).await.unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    DB::save_order(&mut tx, "o-2", "PLACED", 1).await.unwrap();
    let report = db
        .outbox
        .flush(&mut tx, &[envelopes[0].clone(), new.clone()])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(report.recorded, vec![new.event_id.clone()]);
    assert_eq!(report.already_recorded, vec![envelopes[0].event_id.clone()]);
    assert_eq!(
        DB::count_orders(db.pool()).await.unwrap(),
        orders_before + 1
    );
    let stored = db
        .outbox
        .by_event_no(new.event_id.as_str())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.aggregate_sequence, 4);
    assert_eq!(
        db.outbox
            .by_event_no("ORDER_PAID:o-1")
            .await
            .unwrap()
            .unwrap(),
        before
    );
}

/// Order `id` loaded as if it had no events yet (a stale version), with a note recorded on it.
fn loaded_as_new(id: &str) -> Order {
    let mut stale = Order {
        id: id.into(),
        paid: false,
        events: RecordedEvents::new(),
    };
    stale
        .record(NoteAdded {
            text: "late".into(),
        })
        .unwrap();
    stale
}

async fn a_stale_aggregate_version_is_a_sequence_conflict<DB: Orders>(db: &TestDb<DB>) {
    place(db, "o-3", false).await;
    let mut stale = loaded_as_new("o-3");
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut stale).unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    DB::save_order(&mut tx, "o-3", "NOTED", 2).await.unwrap();
    let err = db.outbox.commit(tx, uow).await.unwrap_err();
    assert!(matches!(err, Error::SequenceConflict { .. }), "{err}");
    assert!(err.to_string().contains("Reload the aggregate"), "{err}");
    let mut conn = db.pool().acquire().await.unwrap();
    assert_eq!(
        db.outbox
            .aggregate_version(&mut conn, "ORDER", "o-3")
            .await
            .unwrap(),
        1
    );
}

/// Pays `id` as loaded at version 1 (placed, not paid), writing `status` with it.
async fn pay_from_version_1<DB: Orders>(
    outbox: &event_sqlx::Outbox<DB>,
    db: &TestDb<DB>,
    id: &str,
    status: &str,
    amount_minor: i64,
) -> Result<event_sqlx::Commit, Error> {
    let mut order = Order {
        id: id.into(),
        paid: false,
        events: RecordedEvents::loaded_at(1),
    };
    order.pay(amount_minor).unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    DB::save_order(&mut tx, id, status, 2).await.unwrap();
    outbox.commit(tx, uow).await
}

/// The commit rule for repeated and stale commands: state commits only with its events.
async fn a_command_applied_before_commits_nothing<DB: Orders>(db: &TestDb<DB>) {
    // An exact retry: the same command after it committed.
    place(db, "o-retry", false).await;
    let first = pay_from_version_1(&db.outbox, db, "o-retry", "PAID", 1000)
        .await
        .unwrap();
    assert!(matches!(first, event_sqlx::Commit::Committed(ref r) if r.recorded.len() == 1));
    let stored = db.outbox.by_event_no("ORDER_PAID:o-retry").await.unwrap();
    let retry = pay_from_version_1(&db.outbox, db, "o-retry", "PAID (retried)", 1000)
        .await
        .unwrap();
    assert!(retry.already_applied(), "{retry:?}");
    assert_eq!(
        retry.report().already_recorded[0].as_str(),
        "ORDER_PAID:o-retry"
    );
    assert_eq!(
        DB::order_status(db.pool(), "o-retry")
            .await
            .unwrap()
            .as_deref(),
        Some("PAID"),
        "the retry's state change was rolled back"
    );
    assert_eq!(
        db.outbox.by_event_no("ORDER_PAID:o-retry").await.unwrap(),
        stored
    );

    // Two concurrent commands loaded version 1; both pay, so both record ORDER_PAID:o-race at
    // sequence 2. The second finds it recorded: its own state change (another amount) does not
    // land without an event.
    place(db, "o-race", false).await;
    let (a, b) = (
        pay_from_version_1(&db.outbox, db, "o-race", "PAID 1000", 1000)
            .await
            .unwrap(),
        pay_from_version_1(&db.outbox, db, "o-race", "PAID 999", 999)
            .await
            .unwrap(),
    );
    assert!(!a.already_applied() && b.already_applied(), "{a:?} {b:?}");
    assert_eq!(
        DB::order_status(db.pool(), "o-race")
            .await
            .unwrap()
            .as_deref(),
        Some("PAID 1000")
    );

    // A stale command with another event number: a sequence conflict, nothing committed.
    let mut stale = loaded_as_new("o-race");
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut stale).unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    DB::save_order(&mut tx, "o-race", "NOTED", 2).await.unwrap();
    let err = db.outbox.commit(tx, uow).await.unwrap_err();
    assert!(matches!(err, Error::SequenceConflict { .. }), "{err}");
    assert_eq!(
        DB::order_status(db.pool(), "o-race")
            .await
            .unwrap()
            .as_deref(),
        Some("PAID 1000")
    );

    // Part recorded before, part new: a stale command; nothing committed.
    let mut order = Order {
        id: "o-race".into(),
        paid: false,
        events: RecordedEvents::loaded_at(1),
    };
    order.pay(1000).unwrap();
    order
        .record(NoteAdded {
            text: "thanks".into(),
        })
        .unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    DB::save_order(&mut tx, "o-race", "PAID AND NOTED", 3)
        .await
        .unwrap();
    let err = db.outbox.commit(tx, uow).await.unwrap_err();
    assert!(
        matches!(&err, Error::PartlyRecorded { event_no, new: 1, .. } if event_no == "ORDER_PAID:o-race"),
        "{err}"
    );
    assert_eq!(
        DB::order_status(db.pool(), "o-race")
            .await
            .unwrap()
            .as_deref(),
        Some("PAID 1000")
    );
    assert_eq!(
        db.outbox
            .by_aggregate("ORDER", "o-race")
            .await
            .unwrap()
            .len(),
        2,
        "the new note was not written either"
    );

    // Opting in keeps the former behaviour: the duplicate is absorbed, the state commits.
    let lenient = event_sqlx::Outbox::new(
        db.pool().clone(),
        OutboxConfig::new().commit_state_on_duplicates(),
    );
    let kept = pay_from_version_1(&lenient, db, "o-race", "PAID AGAIN", 1000)
        .await
        .unwrap();
    assert!(matches!(kept, event_sqlx::Commit::Committed(ref r) if r.already_recorded.len() == 1));
    assert_eq!(
        DB::order_status(db.pool(), "o-race")
            .await
            .unwrap()
            .as_deref(),
        Some("PAID AGAIN")
    );
}

/// A flush of several aggregates in which a later row takes a stored sequence: the conflict names
/// that row, not the first one, and nothing of the flush is written.
async fn a_sequence_conflict_names_the_row_that_conflicted<DB: Orders>(db: &TestDb<DB>) {
    place(db, "o-taken", false).await;
    let mut fresh = Order::place("o-fresh", 10).unwrap();
    let mut stale = loaded_as_new("o-taken");
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut fresh).unwrap();
    uow.collect(&mut stale).unwrap();
    let err = db
        .outbox
        .commit(db.pool().begin().await.unwrap(), uow)
        .await
        .unwrap_err();
    let Error::SequenceConflict {
        aggregate_type,
        aggregate_id,
        sequence,
        event_no,
    } = &err
    else {
        panic!("expected a sequence conflict, got {err}");
    };
    assert_eq!(
        (aggregate_type.as_str(), aggregate_id.as_str(), *sequence),
        ("ORDER", "o-taken", 1),
        "{err}"
    );
    assert!(event_no.starts_with("NOTE_ADDED:"), "{err}");
    assert!(err.to_string().contains("o-taken"), "{err}");
    assert!(
        db.outbox
            .by_aggregate("ORDER", "o-fresh")
            .await
            .unwrap()
            .is_empty(),
        "nothing of the failed flush is written"
    );
}

async fn an_oversized_payload_is_rejected_and_nothing_is_written<DB: Orders>(db: &TestDb<DB>) {
    let small =
        event_sqlx::Outbox::new(db.pool().clone(), OutboxConfig::new().max_payload_bytes(40));
    let mut order = Order::place("o-big", 1).unwrap();
    order
        .record(NoteAdded {
            text: "x".repeat(100),
        })
        .unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    DB::save_order(&mut tx, "o-big", "PLACED", 1).await.unwrap();
    let err = small.commit(tx, uow).await.unwrap_err();
    assert!(matches!(err, Error::PayloadTooLarge { .. }), "{err}");
    assert!(err.to_string().contains("nothing was written"), "{err}");
    assert_eq!(
        DB::count_orders(db.pool()).await.unwrap(),
        0,
        "the business write rolled back too"
    );
    assert!(
        db.outbox
            .by_aggregate("ORDER", "o-big")
            .await
            .unwrap()
            .is_empty()
    );
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
                order
                    .record(NoteAdded {
                        text: format!("note {n}"),
                    })
                    .unwrap();
            }
            uow.collect(&mut order).unwrap();
            DB::save_order(&mut tx, &id, "PLACED", events_each as i64)
                .await
                .unwrap();
        }
        db.outbox.commit(tx, uow).await.unwrap();
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
        long.record(NoteAdded {
            text: format!("note {n}"),
        })
        .unwrap();
    }
    let mut tx = db.pool().begin().await.unwrap();
    DB::save_order(&mut tx, "o-long", "PLACED", 40)
        .await
        .unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut long).unwrap();
    db.outbox.commit(tx, uow).await.unwrap();

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
    outbox.commit(tx, uow).await.unwrap();

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

async fn seed_queries_answer_as_documented<DB: Orders>(db: &TestDb<DB>) {
    place(db, "o-q1", true).await;
    place(db, "o-q2", false).await;
    let pending = db.outbox.pending(10).await.unwrap();
    assert_eq!(pending.len(), 3);
    assert!(
        pending
            .windows(2)
            .all(|w| w[0].create_time <= w[1].create_time)
    );
    assert_eq!(db.outbox.pending(2).await.unwrap().len(), 2);
    assert!(db.outbox.by_event_no("nope").await.unwrap().is_none());
    let now = chrono::Utc::now();
    let hour = chrono::TimeDelta::hours(1);
    let counts = db
        .outbox
        .status_counts(Some("ORDER_PLACED"), now - hour..now + hour)
        .await
        .unwrap();
    assert_eq!((counts.pending, counts.total()), (2, 2));
    let none = db
        .outbox
        .status_counts(Some("ORDER_PLACED"), now + hour..now + hour * 2)
        .await
        .unwrap();
    assert_eq!(none.total(), 0);
    assert!(db.outbox.lease_expired(10).await.unwrap().is_empty());
    assert!(db.outbox.due_retries(10).await.unwrap().is_empty());
    assert!(
        !db.outbox
            .cancel("ORDER_PAID:o-q1", "not needed")
            .await
            .unwrap()
            || {
                let row = db
                    .outbox
                    .by_event_no("ORDER_PAID:o-q1")
                    .await
                    .unwrap()
                    .unwrap();
                row.publish_status == EventStatus::Cancelled
                    && row.fail_reason.as_deref() == Some("not needed")
            }
    );
    assert!(
        !db.outbox.cancel("ORDER_PAID:o-q1", "again").await.unwrap(),
        "cancelled only once"
    );
}

/// A module `$module` of tests, one per scenario, each on a fresh database from `$open`.
macro_rules! scenarios_on {
    ($module:ident, $open:expr; $($scenario:ident),* $(,)?) => {
        mod $module {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    if let Some(db) = $open.await {
                        super::$scenario(&db).await;
                        db.cleanup().await;
                    }
                }
            )*
        }
    };
}

macro_rules! on_every_backend {
    ($($scenario:ident),* $(,)?) => {
        // Bound on PostgreSQL; the commit rules run again below with the one-trip path.
        scenarios_on!(postgres, postgres_with(CommitPath::Bound); $($scenario),*);
        scenarios_on!(mysql, TestDb::mysql(); $($scenario),*);
        scenarios_on!(sqlite, TestDb::sqlite(); $($scenario),*);
    };
}

/// A fresh PostgreSQL database whose outbox commits on `path`.
async fn postgres_with(path: CommitPath) -> Option<TestDb<sqlx::Postgres>> {
    let mut db = TestDb::postgres().await?;
    db.outbox = event_sqlx::Outbox::new(db.pool().clone(), OutboxConfig::new().commit_path(path));
    Some(db)
}

on_every_backend!(
    state_and_events_commit_or_roll_back_together,
    a_duplicate_event_no_is_absorbed_and_changes_nothing,
    a_stale_aggregate_version_is_a_sequence_conflict,
    a_sequence_conflict_names_the_row_that_conflicted,
    a_command_applied_before_commits_nothing,
    an_oversized_payload_is_rejected_and_nothing_is_written,
    four_relays_publish_every_event_exactly_once_in_aggregate_order,
    drain_publishes_every_claimable_event_in_aggregate_order,
    relays_draining_together_finish_only_when_nothing_is_left,
    failures_are_retried_on_schedule_then_stay_failed,
    exhausted_events_are_cancelled_only_when_asked_and_never_when_critical,
    a_blocked_aggregate_holds_back_only_itself,
    expired_leases_are_recovered_and_published_by_another_relay,
    seed_queries_answer_as_documented,
);

// The commit rules again on PostgreSQL, with the events sent in the COMMIT's message.
scenarios_on!(
    postgres_one_trip, postgres_with(CommitPath::OneTrip);
    state_and_events_commit_or_roll_back_together,
    a_duplicate_event_no_is_absorbed_and_changes_nothing,
    a_stale_aggregate_version_is_a_sequence_conflict,
    a_sequence_conflict_names_the_row_that_conflicted,
    a_command_applied_before_commits_nothing,
    an_oversized_payload_is_rejected_and_nothing_is_written,
);

mod republish {
    use event_sqlx::{ChannelPublisher, EventStatus, RelayConfig, Republish};
    use event_tests::db::{Orders, TestDb};

    async fn published_events_can_be_sent_again_by_filter<DB: Orders>(db: &TestDb<DB>) {
        for i in 0..3 {
            super::place(db, &format!("o-{i}"), true).await;
        }
        let (publisher, mut received) = ChannelPublisher::channel(64);
        let relay = db.outbox.relay(publisher.clone(), RelayConfig::new("r"));
        relay.drain().await.unwrap();
        while received.try_recv().is_ok() {}

        let one = Republish::default().aggregate("ORDER", "o-1");
        let report = db.outbox.republish(&one, &publisher).await.unwrap();
        assert_eq!((report.selected, report.accepted, report.failed), (2, 2, 0));
        let ids: Vec<String> = std::iter::from_fn(|| received.try_recv().ok())
            .map(|m| m.envelope.event_id.to_string())
            .collect();
        assert_eq!(ids, vec!["ORDER_PLACED:ORDER:o-1:1", "ORDER_PAID:o-1"]);

        let paid = Republish::default().event_type("ORDER_PAID");
        assert_eq!(
            db.outbox
                .republish(&paid, &publisher)
                .await
                .unwrap()
                .accepted,
            3
        );
        while received.try_recv().is_ok() {}
        let future = Republish::default()
            .created(Some(chrono::Utc::now() + chrono::TimeDelta::hours(1)), None);
        assert_eq!(
            db.outbox.republish(&future, &publisher).await.unwrap(),
            event_sqlx::RepublishReport::default()
        );
        let all = db
            .outbox
            .republish(&Republish::default(), &publisher)
            .await
            .unwrap();
        assert_eq!((all.selected, all.accepted, all.failed), (6, 6, 0));
        // The rows stay as they were.
        let row = db
            .outbox
            .by_event_no("ORDER_PAID:o-1")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.publish_status, EventStatus::Succeeded);
    }

    macro_rules! on_every_backend {
        ($($backend:ident),*) => {$(
            #[tokio::test]
            async fn $backend() {
                if let Some(db) = TestDb::$backend().await {
                    published_events_can_be_sent_again_by_filter(&db).await;
                    db.cleanup().await;
                }
            }
        )*};
    }

    on_every_backend!(postgres, mysql, sqlite);
}

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

/// The unit of work of placing order `id` with a note of `text`: two events.
fn placed_with_note(id: &str, text: &str) -> UnitOfWork {
    let mut order = Order::place(id, 7).unwrap();
    order.record(NoteAdded { text: text.into() }).unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    uow
}

/// A pool of one connection to `db`.
async fn one_connection(db: &TestDb<sqlx::Postgres>) -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap()
}

/// The INSERT statements prepared on `pool`'s connection (a pool of one).
async fn prepared_outbox_inserts(pool: &sqlx::PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT statement FROM pg_prepared_statements \
         WHERE statement LIKE 'INSERT INTO biz_outbox_event%' ORDER BY statement",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn postgres_commit_of_one_event_binds_only_its_own_values() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let pool = one_connection(&db).await;
    let hostile_topic = r"t'o\pic'); DELETE FROM biz_outbox_event; --";
    let outbox = event_sqlx::Outbox::new(
        pool.clone(),
        OutboxConfig::new().commit_path(CommitPath::Bound).route(
            "ORDER_PLACED",
            event_sqlx::Route {
                channel: "MQ".into(),
                topic: Some(hostile_topic.into()),
                routing_key: None,
            },
        ),
    );
    let commit_one = |id: String, source: String| {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        async move {
            let order = Order::place(&id, 7).unwrap();
            let mut order = order;
            let mut tx = pool.begin().await.unwrap();
            <sqlx::Postgres as Orders>::save_order(&mut tx, &id, "PLACED", 1)
                .await
                .unwrap();
            let mut uow = UnitOfWork::new(EventContext::new(source));
            uow.collect(&mut order).unwrap();
            outbox.commit(tx, uow).await
        }
    };

    // Hostile values the event type shares, written as literals, stored exactly.
    let hostile_source = r"svc\'); DROP TABLE orders; --";
    let commit = commit_one("o-one-1".into(), hostile_source.into())
        .await
        .unwrap();
    assert_eq!(commit.report().recorded.len(), 1, "{commit:?}");
    let stored = outbox.by_aggregate("ORDER", "o-one-1").await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].event_source, hostile_source);
    assert_eq!(stored[0].topic.as_deref(), Some(hostile_topic));
    assert_eq!(stored[0].routing_key, None);
    assert_eq!(stored[0].event_type, "ORDER_PLACED");
    assert_eq!(stored[0].aggregate_sequence, 1);
    assert_eq!(stored[0].max_retry_count, 5);
    assert_eq!(stored[0].create_time, stored[0].update_time);
    assert_eq!(stored[0].envelope().unwrap().payload["amount_minor"], 7);
    let prepared = prepared_outbox_inserts(&pool).await;
    assert_eq!(prepared.len(), 1, "{prepared:?}");
    assert!(prepared[0].contains("$7") && !prepared[0].contains("$8"));

    // The same event again: a command applied before, nothing committed.
    let again = commit_one("o-one-1".into(), hostile_source.into())
        .await
        .unwrap();
    assert!(
        matches!(again, event_sqlx::Commit::AlreadyApplied(_)),
        "{again:?}"
    );

    // A NUL in a shared value has no literal: bound, refused by the database, nothing kept.
    let err = commit_one("o-one-nul".into(), "svc\0".into())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Database { .. }), "{err}");
    assert!(
        outbox
            .by_aggregate("ORDER", "o-one-nul")
            .await
            .unwrap()
            .is_empty()
    );

    // One statement per event type and source, up to 32; events of further ones share a
    // statement with every value bound, so that the connection's prepared statements stay
    // bounded.
    for i in 0..40 {
        let commit = commit_one(format!("o-many-{i}"), format!("svc-{i}"))
            .await
            .unwrap();
        assert_eq!(commit.report().recorded.len(), 1);
        let stored = outbox
            .by_aggregate("ORDER", &format!("o-many-{i}"))
            .await
            .unwrap();
        assert_eq!(stored[0].event_source, format!("svc-{i}"));
    }
    let prepared = prepared_outbox_inserts(&pool).await;
    assert_eq!(prepared.len(), 33, "{prepared:?}");
    assert_eq!(
        prepared.iter().filter(|s| s.contains("$16")).count(),
        1,
        "one statement binds every value"
    );
    pool.close().await;
    db.cleanup().await;
}

/// `migrate` switches an SQLite file to WAL journaling, so that relays read while the service
/// writes.
#[tokio::test]
async fn sqlite_migrate_turns_on_wal() {
    let db = TestDb::sqlite().await.expect("SQLite needs no service");
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    db.cleanup().await;
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
    writer
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
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
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
    outbox
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

/// On PostgreSQL the events travel with the COMMIT, written as literals: values made to break
/// out of a literal are stored exactly; the connection goes back to its pool out of any
/// transaction; a savepoint is released, not committed; a value no literal can hold fails the
/// commit and commits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commit_with_the_events_in_one_trip() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    // One connection: whatever the commit leaves on it, the next transaction meets.
    let pool = one_connection(&db).await;
    let outbox = event_sqlx::Outbox::new(
        pool.clone(),
        OutboxConfig::new().commit_path(CommitPath::OneTrip),
    );
    let hostile_id = r"o'); DELETE FROM biz_outbox_event; --\";
    let hostile_text = "it's \\'; COMMIT; \\\\ \u{1F600} $$ E'\n\t' \u{7f}";
    let mut tx = pool.begin().await.unwrap();
    <sqlx::Postgres as Orders>::save_order(&mut tx, hostile_id, "PLACED", 1)
        .await
        .unwrap();
    let commit = outbox
        .commit(tx, placed_with_note(hostile_id, hostile_text))
        .await
        .unwrap();
    assert_eq!(commit.report().recorded.len(), 2, "{commit:?}");
    let stored = outbox.by_aggregate("ORDER", hostile_id).await.unwrap();
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[1].envelope().unwrap().payload["text"], hostile_text);
    assert_eq!(stored[1].aggregate_id, hostile_id);
    assert_eq!(stored[1].create_time, stored[1].update_time);
    assert!(
        (chrono::Utc::now() - stored[1].create_time)
            .num_seconds()
            .abs()
            < 60
    );
    assert_eq!(
        <sqlx::Postgres as Orders>::order_status(&pool, hostile_id)
            .await
            .unwrap()
            .as_deref(),
        Some("PLACED")
    );

    // The same connection, next: a transaction of its own, which a rollback undoes.
    let mut tx = pool.begin().await.unwrap();
    <sqlx::Postgres as Orders>::save_order(&mut tx, "o-after", "PLACED", 1)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        <sqlx::Postgres as Orders>::order_status(&pool, "o-after")
            .await
            .unwrap(),
        None
    );

    // In a savepoint: released with the events; the outer transaction still decides.
    let mut outer = pool.begin().await.unwrap();
    let mut inner = sqlx::Acquire::begin(&mut *outer).await.unwrap();
    <sqlx::Postgres as Orders>::save_order(&mut inner, "o-nested", "PLACED", 1)
        .await
        .unwrap();
    let mut nested = Order::place("o-nested", 1).unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut nested).unwrap();
    let commit = outbox.commit(inner, uow).await.unwrap();
    assert_eq!(commit.report().recorded.len(), 1);
    outer.rollback().await.unwrap();
    assert!(
        outbox
            .by_aggregate("ORDER", "o-nested")
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        <sqlx::Postgres as Orders>::order_status(&pool, "o-nested")
            .await
            .unwrap(),
        None
    );

    // Bound instead, on request: the same values, stored the same.
    let bound = event_sqlx::Outbox::new(
        pool.clone(),
        OutboxConfig::new().commit_path(CommitPath::Bound),
    );
    let bound_id = format!("{hostile_id}-bound");
    bound
        .commit(
            pool.begin().await.unwrap(),
            placed_with_note(&bound_id, hostile_text),
        )
        .await
        .unwrap();
    let stored_bound = outbox.by_aggregate("ORDER", &bound_id).await.unwrap();
    assert_eq!(stored_bound[1].event_payload, stored[1].event_payload);
    assert_eq!(stored_bound[1].event_headers, stored[1].event_headers);

    // Timed (the default): the first 28 commits alternate between the two paths, each stores
    // its events once with its state, and then the faster is kept.
    let auto = event_sqlx::Outbox::new(pool.clone(), OutboxConfig::new());
    let pending_before = auto.health().await.unwrap().pending;
    for i in 0..28 {
        assert_eq!(
            auto.commit_path(),
            CommitPath::Auto,
            "chosen after {i} commits"
        );
        let id = format!("{hostile_id}-auto-{i}");
        let mut tx = pool.begin().await.unwrap();
        <sqlx::Postgres as Orders>::save_order(&mut tx, &id, "PLACED", 1)
            .await
            .unwrap();
        // A clone's commits count for the outbox it was cloned from.
        let commit = auto
            .clone()
            .commit(tx, placed_with_note(&id, hostile_text))
            .await
            .unwrap();
        assert_eq!(commit.report().recorded.len(), 2, "{commit:?}");
        let stored_auto = auto.by_aggregate("ORDER", &id).await.unwrap();
        assert_eq!(stored_auto.len(), 2, "each event stored once");
        assert_eq!(stored_auto[1].event_payload, stored[1].event_payload);
        assert_eq!(
            <sqlx::Postgres as Orders>::order_status(&pool, &id)
                .await
                .unwrap()
                .as_deref(),
            Some("PLACED")
        );
    }
    let chosen = auto.commit_path();
    assert!(
        matches!(chosen, CommitPath::OneTrip | CommitPath::Bound),
        "{chosen:?}"
    );
    assert_eq!(
        auto.health().await.unwrap().pending,
        pending_before + 56,
        "nothing else written or deleted"
    );
    // The choice holds.
    let mut order = Order::place("o-auto-after", 8).unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    auto.commit(pool.begin().await.unwrap(), uow).await.unwrap();
    assert_eq!(auto.commit_path(), chosen);

    // A NUL, which no PostgreSQL text holds: an error, and nothing committed.
    for (id, text) in [("o-nul\0", "fine"), ("o-nul-text", "a\0b")] {
        let mut order = Order::place(id, 1).unwrap();
        order.record(NoteAdded { text: text.into() }).unwrap();
        let mut tx = pool.begin().await.unwrap();
        <sqlx::Postgres as Orders>::save_order(&mut tx, "o-nul-state", "PLACED", 1)
            .await
            .unwrap();
        let mut uow = UnitOfWork::new(context());
        uow.collect(&mut order).unwrap();
        let err = outbox.commit(tx, uow).await.unwrap_err();
        assert!(matches!(err, Error::Database { .. }), "{err}");
        assert_eq!(
            <sqlx::Postgres as Orders>::order_status(&pool, "o-nul-state")
                .await
                .unwrap(),
            None,
            "{id:?}"
        );
    }
    pool.close().await;
    db.cleanup().await;
}
