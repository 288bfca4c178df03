//! The consumer's per-aggregate order guard (`Consumer::in_order`) on real PostgreSQL, MariaDB and SQLite: an event that
//! arrives before its aggregate's previous sequence was applied is given back, not applied and
//! not recorded; events without a handler are recorded so that sequences have no holes; a
//! quarantined predecessor settles the order; a predecessor that never comes is skipped after a
//! bounded wait, measured on a clock the test moves.

use std::sync::Mutex;
use std::time::Duration;

use event_core::{EventContext, EventEnvelope, UnitOfWork};
use event_sqlx::{
    ChannelPublisher, Consumer, Delivered, HandlerError, ManualClock, OutboxMessage, OutboxRecord,
    PREVIOUS_SEQUENCE_HEADER, Processed, Received, RelayConfig, Republish, Routes,
};
use event_tests::db::{Orders, TestDb, postgres_lean};
use event_tests::fixtures::{NoteAdded, Order, OrderPlaced};

/// `o-1`: placed (1), paid (2), a note (3); `o-2`: placed (1). As envelope bodies.
fn bodies() -> Vec<Vec<u8>> {
    let mut first = Order::place("o-1", 10).unwrap();
    first.pay(10).unwrap();
    first.note("note");
    let mut second = Order::place("o-2", 20).unwrap();
    let mut uow = UnitOfWork::new(EventContext::new("order-service"));
    uow.collect(&mut first).unwrap();
    uow.collect(&mut second).unwrap();
    event_tests::fixtures::bodies(uow)
}

const PLACED_1: usize = 0;
const PAID_2: usize = 1;
const NOTE_3: usize = 2;
const PLACED_O2: usize = 3;

/// What the handlers applied: (aggregate id, sequence), in order.
type Applied = Mutex<Vec<(String, u64)>>;

fn push(applied: &Applied, envelope: &EventEnvelope) {
    applied
        .lock()
        .unwrap()
        .push((envelope.aggregate_id.clone(), envelope.aggregate_sequence));
}

fn applied_of(applied: &Applied, id: &str) -> Vec<u64> {
    applied
        .lock()
        .unwrap()
        .iter()
        .filter(|(a, _)| a == id)
        .map(|(_, s)| *s)
        .collect()
}

/// `consumer` with handlers that record the placed orders and notes they apply in `applied`
/// (payments have none).
fn recording<'a, DB: Orders>(
    consumer: Consumer<DB>,
    applied: &'a Applied,
) -> Consumer<DB, impl Routes<DB> + 'a> {
    consumer
        .on(
            async |_tx: &mut DB::Connection, e: Delivered<OrderPlaced>| {
                push(applied, &e.envelope);
                Ok(())
            },
        )
        .on(async |_tx: &mut DB::Connection, e: Delivered<NoteAdded>| {
            push(applied, &e.envelope);
            Ok(())
        })
}

async fn inbox_rows<DB: Orders>(db: &TestDb<DB>) -> i64 {
    DB::count(db.pool(), "SELECT COUNT(*) FROM consumed_event")
        .await
        .unwrap()
}

async fn an_early_event_waits_for_its_predecessor<DB: Orders>(db: &TestDb<DB>) {
    let bodies = bodies();
    let applied = Applied::default();
    // Placed orders and notes; payments have no handler.
    let consumer = recording(
        Consumer::new(db.pool().clone(), "view", "1.0.0").in_order(),
        &applied,
    );
    let receive = async |i: usize| consumer.receive(&bodies[i], None).await.unwrap();

    assert_eq!(receive(NOTE_3).await, Processed::Early { waits_for: 1 });
    assert_eq!(inbox_rows(db).await, 0, "an early event is not recorded");
    assert_eq!(receive(PLACED_1).await, Processed::Applied);
    assert_eq!(receive(NOTE_3).await, Processed::Early { waits_for: 2 });
    // The payment has no handler: recorded without an effect, so the note finds it.
    assert_eq!(receive(PAID_2).await, Processed::Ignored);
    assert_eq!(receive(NOTE_3).await, Processed::Applied);
    assert_eq!(receive(NOTE_3).await, Processed::Duplicate);
    assert_eq!(applied_of(&applied, "o-1"), [1, 3]);
    assert_eq!(inbox_rows(db).await, 3);

    // A consumer without the guard applies what arrives, as it arrives.
    let unordered = Consumer::new(db.pool().clone(), "feed", "1.0.0").on(
        async |_tx: &mut DB::Connection, e: Delivered<NoteAdded>| {
            push(&applied, &e.envelope);
            Ok(())
        },
    );
    assert_eq!(
        unordered.receive(&bodies[NOTE_3], None).await.unwrap(),
        Processed::Applied
    );
}

async fn a_batch_applies_what_is_in_sequence_and_gives_back_the_rest<DB: Orders>(db: &TestDb<DB>) {
    let bodies = bodies();
    let applied = Applied::default();
    let consumer = Consumer::new(db.pool().clone(), "view", "1.0.0")
        .in_order()
        .on(
            async |_tx: &mut DB::Connection, e: Delivered<OrderPlaced>| {
                push(&applied, &e.envelope);
                Ok(())
            },
        )
        .on_batch(
            async |_tx: &mut DB::Connection, notes: Vec<Delivered<NoteAdded>>| {
                for note in &notes {
                    push(&applied, &note.envelope);
                }
                Ok(())
            },
        );
    let batch = |indices: &[usize]| -> Vec<Received<'_>> {
        indices
            .iter()
            .map(|&i| Received {
                body: &bodies[i],
                message_id: None,
            })
            .collect()
    };
    // The note twice in one batch (delivered again while the first delivery waited in the
    // consumer's buffer): both early, both given back. Acknowledging the repeat as a duplicate
    // would, on JetStream, acknowledge the message itself, and the note would never be applied.
    let outcomes = consumer
        .receive_batch(&batch(&[NOTE_3, NOTE_3]))
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [
            Processed::Early { waits_for: 1 },
            Processed::Early { waits_for: 1 }
        ]
    );
    // o-1's note first, then its placement and payment, then o-2: the note waits for the
    // payment, which comes after it in the batch.
    let outcomes = consumer
        .receive_batch(&batch(&[NOTE_3, PLACED_1, PAID_2, PLACED_O2]))
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [
            Processed::Early { waits_for: 1 },
            Processed::Applied,
            Processed::Ignored,
            Processed::Applied
        ]
    );
    // Delivered again with a redelivery of o-2's: the note goes through.
    let outcomes = consumer
        .receive_batch(&batch(&[NOTE_3, PLACED_O2]))
        .await
        .unwrap();
    assert_eq!(outcomes, [Processed::Applied, Processed::Duplicate]);
    assert_eq!(applied_of(&applied, "o-1"), [1, 3]);
    assert_eq!(applied_of(&applied, "o-2"), [1]);
}

async fn a_quarantined_predecessor_settles_the_order<DB: Orders>(db: &TestDb<DB>) {
    let bodies = bodies();
    let applied = Applied::default();
    let consumer = Consumer::new(db.pool().clone(), "view", "1.0.0")
        .in_order()
        .on(
            async |_tx: &mut DB::Connection, _e: Delivered<OrderPlaced>| {
                Err(HandlerError::Permanent("no customer".into()))
            },
        )
        .on(async |_tx: &mut DB::Connection, e: Delivered<NoteAdded>| {
            push(&applied, &e.envelope);
            Ok(())
        });
    let receive = async |i: usize| consumer.receive(&bodies[i], None).await.unwrap();
    assert_eq!(
        receive(PLACED_1).await,
        Processed::Quarantined("no customer".into())
    );
    assert_eq!(receive(PAID_2).await, Processed::Ignored);
    assert_eq!(receive(NOTE_3).await, Processed::Applied);
    assert_eq!(applied_of(&applied, "o-1"), [3]);
}

async fn a_predecessor_that_never_comes_is_skipped_after_the_wait<DB: Orders>(db: &TestDb<DB>) {
    let bodies = bodies();
    let applied = Applied::default();
    let clock = ManualClock::starting_now();
    let consumer = Consumer::new(db.pool().clone(), "view", "1.0.0")
        .clock(clock.clone())
        .in_order()
        .order_wait(Duration::from_secs(60))
        .on(async |_tx: &mut DB::Connection, e: Delivered<NoteAdded>| {
            push(&applied, &e.envelope);
            Ok(())
        });
    let receive = async || consumer.receive(&bodies[NOTE_3], None).await.unwrap();
    assert_eq!(receive().await, Processed::Early { waits_for: 1 });
    clock.advance(Duration::from_secs(59));
    assert_eq!(receive().await, Processed::Early { waits_for: 1 });
    assert!(applied_of(&applied, "o-1").is_empty());
    clock.advance(Duration::from_secs(1));
    assert_eq!(receive().await, Processed::Applied);
    assert_eq!(applied_of(&applied, "o-1"), [3]);
}

async fn stale_events_are_not_refused_when_they_came_in_order<DB: Orders>(db: &TestDb<DB>) {
    let bodies = bodies();
    let applied = Applied::default();
    let consumer = recording(
        Consumer::new(db.pool().clone(), "view", "1.0.0")
            .in_order()
            .reject_stale(),
        &applied,
    );
    let receive = async |i: usize| consumer.receive(&bodies[i], None).await.unwrap();
    // Without the guard, the note would be applied and the placement refused as stale.
    assert_eq!(receive(NOTE_3).await, Processed::Early { waits_for: 1 });
    assert_eq!(receive(PLACED_1).await, Processed::Applied);
    assert_eq!(receive(PAID_2).await, Processed::Ignored);
    assert_eq!(receive(NOTE_3).await, Processed::Applied);
    assert_eq!(applied_of(&applied, "o-1"), [1, 3]);
    assert!(consumer.quarantined(10).await.unwrap().is_empty());
}

/// o-1's payment and o-2's first two events cancelled in the outbox before a relay publishes:
/// the next event of each tells consumers the last sequence before it that was not cancelled,
/// and an in-order consumer applies it once that one is, one at a time or in a batch, without
/// waiting for the cancelled ones (its clock never moves past the order wait).
async fn a_cancelled_predecessor_does_not_hold_back_the_next_event<DB: Orders>(db: &TestDb<DB>) {
    let mut first = Order::place("o-1", 10).unwrap();
    first.pay(10).unwrap();
    first.note("packed");
    first.note("shipped");
    let mut second = Order::place("o-2", 20).unwrap();
    second.pay(20).unwrap();
    second.note("packed");
    let mut uow = UnitOfWork::new(EventContext::new("order-service"));
    uow.collect(&mut first).unwrap();
    uow.collect(&mut second).unwrap();
    let _ = db
        .outbox
        .commit(db.pool().begin().await.unwrap(), uow)
        .await
        .unwrap();
    for (id, sequences) in [("o-1", &[2][..]), ("o-2", &[1, 2][..])] {
        let events = db.outbox.by_aggregate("ORDER", id).await.unwrap();
        for record in events
            .iter()
            .filter(|r| sequences.contains(&r.aggregate_sequence))
        {
            assert!(
                db.outbox
                    .cancel(&record.event_no, "refunded by hand")
                    .await
                    .unwrap()
            );
        }
    }

    let (publisher, mut received) = ChannelPublisher::channel(16);
    let relay = db.outbox.relay(publisher, RelayConfig::new("relay"));
    assert_eq!(relay.drain().await.unwrap().published, 4);
    drop(relay);
    let mut published = Vec::new();
    while let Ok(message) = received.try_recv() {
        published.push(message.envelope);
    }
    let stamps: Vec<(String, u64, Option<&str>)> = published
        .iter()
        .map(|e| {
            (
                e.aggregate_id.clone(),
                e.aggregate_sequence,
                e.headers
                    .extra
                    .get(PREVIOUS_SEQUENCE_HEADER)
                    .map(String::as_str),
            )
        })
        .collect();
    for expected in [
        ("o-1".to_owned(), 1, None),
        ("o-1".to_owned(), 3, Some("1")),
        ("o-1".to_owned(), 4, None),
        ("o-2".to_owned(), 3, Some("0")),
    ] {
        assert!(stamps.contains(&expected), "{expected:?} in {stamps:?}");
    }
    // Sent again (an operator's republish, reconcile's repair), they carry it too.
    assert_eq!(
        republished(db, 4).await,
        [
            ("o-1".to_owned(), 1, None),
            ("o-1".to_owned(), 3, Some("1".to_owned())),
            ("o-1".to_owned(), 4, None),
            ("o-2".to_owned(), 3, Some("0".to_owned())),
        ]
    );
    let body = |id: &str, sequence: u64| {
        let envelope = published
            .iter()
            .find(|e| e.aggregate_id == id && e.aggregate_sequence == sequence)
            .unwrap();
        serde_json::to_vec(envelope).unwrap()
    };

    let applied = Applied::default();
    let clock = ManualClock::starting_now();
    let consumer = |name: &'static str| {
        recording(
            Consumer::new(db.pool().clone(), name, "1.0.0")
                .clock(clock.clone())
                .in_order()
                .order_wait(Duration::from_secs(60)),
            &applied,
        )
    };
    let one = consumer("one-by-one");
    let receive = async |id: &str, sequence: u64| one.receive(&body(id, sequence), None).await;
    assert_eq!(receive("o-2", 3).await.unwrap(), Processed::Applied);
    assert_eq!(
        receive("o-1", 3).await.unwrap(),
        Processed::Early { waits_for: 1 },
        "the note still waits for the placement, which was not cancelled"
    );
    assert_eq!(receive("o-1", 1).await.unwrap(), Processed::Applied);
    assert_eq!(receive("o-1", 3).await.unwrap(), Processed::Applied);
    assert_eq!(receive("o-1", 4).await.unwrap(), Processed::Applied);
    assert_eq!(applied_of(&applied, "o-1"), [1, 3, 4]);
    assert_eq!(applied_of(&applied, "o-2"), [3]);

    applied.lock().unwrap().clear();
    let batched = consumer("batched");
    let bodies = [
        body("o-1", 1),
        body("o-1", 3),
        body("o-1", 4),
        body("o-2", 3),
    ];
    let messages: Vec<Received<'_>> = bodies
        .iter()
        .map(|body| Received {
            body,
            message_id: None,
        })
        .collect();
    let outcomes = batched.receive_batch(&messages).await.unwrap();
    assert!(
        outcomes.iter().all(|o| *o == Processed::Applied),
        "{outcomes:?}"
    );
    assert_eq!(applied_of(&applied, "o-1"), [1, 3, 4]);
    assert_eq!(applied_of(&applied, "o-2"), [3]);
}

/// (aggregate id, sequence, [`PREVIOUS_SEQUENCE_HEADER`]) of each message `received` holds,
/// sorted.
fn stamps_of(
    received: &mut tokio::sync::mpsc::Receiver<OutboxMessage>,
) -> Vec<(String, u64, Option<String>)> {
    let mut stamps = Vec::new();
    while let Ok(message) = received.try_recv() {
        let e = message.envelope;
        stamps.push((
            e.aggregate_id,
            e.aggregate_sequence,
            e.headers.extra.get(PREVIOUS_SEQUENCE_HEADER).cloned(),
        ));
    }
    stamps.sort();
    stamps
}

/// Sends every published event again, as an operator's republish or reconciliation's repair
/// does, checks that all `events` went, and returns their [`stamps_of`].
async fn republished<DB: Orders>(
    db: &TestDb<DB>,
    events: usize,
) -> Vec<(String, u64, Option<String>)> {
    let (again, mut resent) = ChannelPublisher::channel(16);
    let report = db
        .outbox
        .republish(&Republish::default(), &again)
        .await
        .unwrap();
    assert_eq!(report.accepted, events, "{report:?}");
    stamps_of(&mut resent)
}

/// Commits o-1 placed (1), paid (2) and noted (3) under `context`, then cancels the payment
/// (an operator refunded it by hand); returns the three rows.
async fn paid_by_hand<DB: Orders>(db: &TestDb<DB>, context: EventContext) -> Vec<OutboxRecord> {
    let mut order = Order::place("o-1", 10).unwrap();
    order.pay(10).unwrap();
    order.note("packed");
    let mut uow = UnitOfWork::new(context);
    uow.collect(&mut order).unwrap();
    let _ = db
        .outbox
        .commit(db.pool().begin().await.unwrap(), uow)
        .await
        .unwrap();
    let events = db.outbox.by_aggregate("ORDER", "o-1").await.unwrap();
    assert!(
        db.outbox
            .cancel(&events[1].event_no, "by hand")
            .await
            .unwrap()
    );
    events
}

/// A stamp only where every skipped sequence is known to be cancelled: with o-1's payment
/// cancelled and its placement deleted from the table (as archiving does), the note carries
/// none, and waits for what it cannot see.
async fn no_stamp_past_a_sequence_missing_from_the_outbox<DB: Orders>(db: &TestDb<DB>) {
    let events = paid_by_hand(db, EventContext::new("order-service")).await;
    let (publisher, mut received) = ChannelPublisher::channel(16);
    let relay = db.outbox.relay(publisher, RelayConfig::new("relay"));
    // The placement goes first; then it leaves the table, and the cancelled payment stays.
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    DB::run_sql(
        db.pool(),
        format!("DELETE FROM biz_outbox_event WHERE id = {}", events[0].id),
    )
    .await
    .unwrap();
    assert_eq!(relay.drain().await.unwrap().published, 1);
    drop(relay);
    let mut sequences = Vec::new();
    while let Ok(message) = received.try_recv() {
        let e = message.envelope;
        sequences.push((
            e.aggregate_sequence,
            e.headers.extra.get(PREVIOUS_SEQUENCE_HEADER).cloned(),
        ));
    }
    assert_eq!(sequences, [(1, None), (3, None)]);
}

/// The header is the relay's: one the application put on its events (here on every event of
/// the unit of work, `0`, which would let a consumer apply any of them first) is not published,
/// by a claim or by a republish, and the relay's own stamp replaces it where one is due.
async fn an_application_header_does_not_pass_for_the_relays_stamp<DB: Orders>(db: &TestDb<DB>) {
    let context = EventContext::new("order-service").header(PREVIOUS_SEQUENCE_HEADER, "0");
    let _ = paid_by_hand(db, context).await;
    let expected = [
        ("o-1".to_owned(), 1, None),
        ("o-1".to_owned(), 3, Some("1".to_owned())),
    ];

    let (publisher, mut received) = ChannelPublisher::channel(16);
    let relay = db.outbox.relay(publisher, RelayConfig::new("relay"));
    assert_eq!(relay.drain().await.unwrap().published, 2);
    drop(relay);
    assert_eq!(stamps_of(&mut received), expected);
    assert_eq!(republished(db, 2).await, expected);

    // The application's header itself stays in the table, as it was written.
    let stored = db.outbox.by_aggregate("ORDER", "o-1").await.unwrap();
    assert!(stored.iter().all(|r| {
        r.event_headers
            .as_ref()
            .and_then(|h| h.get(PREVIOUS_SEQUENCE_HEADER))
            .and_then(|v| v.as_str())
            == Some("0")
    }));
}

event_tests::on_every_backend!(
    #[tokio::test]
    postgres = TestDb::postgres(), postgres_lean = postgres_lean(),
    mysql = TestDb::mysql(), sqlite = TestDb::sqlite();
    a_cancelled_predecessor_does_not_hold_back_the_next_event,
    no_stamp_past_a_sequence_missing_from_the_outbox,
    an_application_header_does_not_pass_for_the_relays_stamp,
);

event_tests::on_every_backend!(
    an_early_event_waits_for_its_predecessor,
    a_batch_applies_what_is_in_sequence_and_gives_back_the_rest,
    a_quarantined_predecessor_settles_the_order,
    a_predecessor_that_never_comes_is_skipped_after_the_wait,
    stale_events_are_not_refused_when_they_came_in_order,
);
