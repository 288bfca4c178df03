//! The consumer's per-aggregate order guard (`Consumer::in_order`) on real PostgreSQL, MariaDB and SQLite: an event that
//! arrives before its aggregate's previous sequence was applied is given back, not applied and
//! not recorded; events without a handler are recorded so that sequences have no holes; a
//! quarantined predecessor settles the order; a predecessor that never comes is skipped after a
//! bounded wait, measured on a clock the test moves.

use std::sync::Mutex;
use std::time::Duration;

use event_core::{EventContext, EventEnvelope, UnitOfWork};
use event_sqlx::{Consumer, Delivered, HandlerError, ManualClock, Processed, Received};
use event_tests::db::{Orders, TestDb};
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

async fn inbox_rows<DB: Orders>(db: &TestDb<DB>) -> i64 {
    DB::count(db.pool(), "SELECT COUNT(*) FROM consumed_event")
        .await
        .unwrap()
}

async fn an_early_event_waits_for_its_predecessor<DB: Orders>(db: &TestDb<DB>) {
    let bodies = bodies();
    let applied = Applied::default();
    // Placed orders and notes; payments have no handler.
    let consumer = Consumer::new(db.pool().clone(), "view", "1.0.0")
        .in_order()
        .on(
            async |_tx: &mut DB::Connection, e: Delivered<OrderPlaced>| {
                push(&applied, &e.envelope);
                Ok(())
            },
        )
        .on(async |_tx: &mut DB::Connection, e: Delivered<NoteAdded>| {
            push(&applied, &e.envelope);
            Ok(())
        });
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
    let consumer = Consumer::new(db.pool().clone(), "view", "1.0.0")
        .in_order()
        .reject_stale()
        .on(
            async |_tx: &mut DB::Connection, e: Delivered<OrderPlaced>| {
                push(&applied, &e.envelope);
                Ok(())
            },
        )
        .on(async |_tx: &mut DB::Connection, e: Delivered<NoteAdded>| {
            push(&applied, &e.envelope);
            Ok(())
        });
    let receive = async |i: usize| consumer.receive(&bodies[i], None).await.unwrap();
    // Without the guard, the note would be applied and the placement refused as stale.
    assert_eq!(receive(NOTE_3).await, Processed::Early { waits_for: 1 });
    assert_eq!(receive(PLACED_1).await, Processed::Applied);
    assert_eq!(receive(PAID_2).await, Processed::Ignored);
    assert_eq!(receive(NOTE_3).await, Processed::Applied);
    assert_eq!(applied_of(&applied, "o-1"), [1, 3]);
    assert!(consumer.quarantined(10).await.unwrap().is_empty());
}

event_tests::on_every_backend!(
    an_early_event_waits_for_its_predecessor,
    a_batch_applies_what_is_in_sequence_and_gives_back_the_rest,
    a_quarantined_predecessor_settles_the_order,
    a_predecessor_that_never_comes_is_skipped_after_the_wait,
    stale_events_are_not_refused_when_they_came_in_order,
);
