//! The consumer inbox on real PostgreSQL, MariaDB and SQLite: a redelivered event has its effect
//! once, and a failed handler commits nothing.

use event_core::{EventContext, UnitOfWork};
use event_sqlx::{Handled, Inbox, InboxError};
use event_tests::db::{Orders, TestDb};
use event_tests::fixtures::Order;

async fn effects_happen_once<DB: Orders>(db: &TestDb<DB>) {
    let mut uow = UnitOfWork::new(EventContext::new("order-service"));
    uow.collect(&mut Order::place("o-1", 10).unwrap()).unwrap();
    let envelope = uow.commit().remove(0);
    let inbox = Inbox::new(db.pool().clone(), "invoice-service");

    // A failing handler: nothing is committed, the event stays unconsumed.
    let failed = inbox
        .handle(&envelope, async |tx: &mut DB::Connection| {
            DB::save_order(tx, "invoice-o-1", "INVOICED", 1)
                .await
                .map_err(|e| e.to_string())?;
            Err::<(), _>("downstream timed out".to_owned())
        })
        .await;
    assert!(matches!(failed, Err(InboxError::Handler(ref m)) if m == "downstream timed out"));
    assert_eq!(
        DB::count_orders(db.pool()).await.unwrap(),
        0,
        "the handler's write rolled back"
    );

    // Delivered three times: one invoice.
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let outcome = inbox
            .handle(&envelope, async |tx: &mut DB::Connection| {
                DB::save_order(tx, "invoice-o-1", "INVOICED", 1).await
            })
            .await
            .unwrap();
        outcomes.push(outcome);
    }
    assert_eq!(
        outcomes,
        vec![Handled::Applied(()), Handled::Duplicate, Handled::Duplicate]
    );
    assert_eq!(DB::count_orders(db.pool()).await.unwrap(), 1);

    // Another consumer has its own inbox.
    let other = Inbox::new(db.pool().clone(), "analytics");
    let outcome = other
        .handle(&envelope, async |_tx: &mut DB::Connection| {
            Ok::<_, sqlx::Error>(7)
        })
        .await
        .unwrap();
    assert_eq!(outcome, Handled::Applied(7));
}

/// Event ids that differ only in letter case, an accent or a trailing space are different events
/// to the inbox: each has its effect.
async fn event_ids_that_differ_only_in_case_accent_or_trailing_space_each_apply<DB: Orders>(
    db: &TestDb<DB>,
) {
    let inbox = Inbox::new(db.pool().clone(), "invoice-service");
    for id in ["o-abc", "o-ABC", "o-e", "o-\u{e9}", "o-x", "o-x "] {
        let mut uow = UnitOfWork::new(EventContext::new("order-service"));
        uow.collect(&mut Order::place(id, 10).unwrap()).unwrap();
        let envelope = uow.commit().remove(0);
        let outcome = inbox
            .handle(&envelope, async |_tx: &mut DB::Connection| {
                Ok::<_, sqlx::Error>(())
            })
            .await
            .unwrap();
        assert_eq!(outcome, Handled::Applied(()), "{id:?}");
    }
}

event_tests::on_every_backend!(
    effects_happen_once,
    event_ids_that_differ_only_in_case_accent_or_trailing_space_each_apply
);

mod stale {
    use event_core::{EventContext, UnitOfWork};
    use event_sqlx::{Consumer, Delivered, HandlerError, Processed};
    use event_tests::db::{Orders, TestDb};
    use event_tests::fixtures::{NoteAdded, Order};

    /// Three notes on one order, sequences 1, 2, 3, as envelope bodies.
    fn notes() -> Vec<Vec<u8>> {
        let mut order = Order::loaded("o-9", 0, false);
        for n in 1..=3 {
            order.note(&format!("note {n}"));
        }
        let mut uow = UnitOfWork::new(EventContext::new("order-service"));
        uow.collect(&mut order).unwrap();
        event_tests::fixtures::bodies(uow)
    }

    async fn older_events_are_refused_and_recorded<DB: Orders>(db: &TestDb<DB>) {
        let bodies = notes();
        let guarded = Consumer::new(db.pool().clone(), "order-view", "2.0.0").reject_stale();
        let apply = async |_tx: &mut DB::Connection, _note: Delivered<NoteAdded>| {
            Ok::<(), HandlerError>(())
        };
        // Delivered out of order: 3 first; 2 and 1 then arrive late.
        let outcomes = [
            guarded
                .process::<NoteAdded>(&bodies[2], None, apply)
                .await
                .unwrap(),
            guarded
                .process::<NoteAdded>(&bodies[1], None, apply)
                .await
                .unwrap(),
            guarded
                .process::<NoteAdded>(&bodies[0], None, apply)
                .await
                .unwrap(),
        ];
        assert_eq!(
            outcomes,
            [Processed::Applied, Processed::Stale, Processed::Stale]
        );
        let recorded = guarded.quarantined(10).await.unwrap();
        assert_eq!(recorded.len(), 2);
        assert!(
            recorded
                .iter()
                .all(|r| r.failure_class == event_sqlx::FailureClass::Stale)
        );
        assert!(
            recorded[0]
                .reason
                .contains("arrived after sequence 3 was applied"),
            "{}",
            recorded[0].reason
        );
        // A redelivery of what was applied is still a plain duplicate.
        assert_eq!(
            guarded
                .process::<NoteAdded>(&bodies[2], None, apply)
                .await
                .unwrap(),
            Processed::Duplicate
        );

        // Without the guard every event applies.
        let counting = Consumer::new(db.pool().clone(), "note-counter", "1.0.0");
        for body in bodies.iter().rev() {
            assert_eq!(
                counting
                    .process::<NoteAdded>(body, None, apply)
                    .await
                    .unwrap(),
                Processed::Applied
            );
        }
    }

    event_tests::on_every_backend!(older_events_are_refused_and_recorded);
}

mod replay {
    use event_core::{EventContext, UnitOfWork};
    use event_sqlx::{
        Consumer, Delivered, FailureClass, HandlerError, Processed, QuarantineFilter,
        QuarantineStatus,
    };
    use event_tests::db::{Orders, TestDb};
    use event_tests::fixtures::{NoteAdded, Order};

    /// More quarantined entries than one page of the replay (100).
    const QUARANTINED: usize = 250;

    /// One note on each of `n` orders, as envelope bodies, with their event ids.
    fn notes(n: usize) -> Vec<(String, Vec<u8>)> {
        let mut uow = UnitOfWork::new(EventContext::new("order-service"));
        for i in 0..n {
            let mut order = Order::loaded(&format!("o-{i:03}"), 0, false);
            order.note(&format!("note {i}"));
            uow.collect(&mut order).unwrap();
        }
        uow.commit()
            .iter()
            .map(|e| (e.event_id.to_string(), serde_json::to_vec(e).unwrap()))
            .collect()
    }

    async fn a_match_on_the_last_page_is_replayed<DB: Orders>(db: &TestDb<DB>) {
        let consumer = Consumer::new(db.pool().clone(), "note-view", "1.0.0");
        let refuse = async |_tx: &mut DB::Connection, _note: Delivered<NoteAdded>| {
            Err::<(), _>(HandlerError::Permanent("no view for notes yet".into()))
        };
        let bodies = notes(QUARANTINED);
        for (_, body) in &bodies {
            let outcome = consumer
                .process::<NoteAdded>(body, None, refuse)
                .await
                .unwrap();
            assert!(matches!(outcome, Processed::Quarantined(_)), "{outcome:?}");
        }
        let applied = std::sync::atomic::AtomicUsize::new(0);
        let apply = async |_tx: &mut DB::Connection, _note: Delivered<NoteAdded>| {
            applied.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<(), HandlerError>(())
        };

        // The last entry, beyond the first two pages.
        let (last_id, _) = bodies.last().unwrap();
        let replayed = consumer
            .replay_matching::<NoteAdded>(&QuarantineFilter::default().event_id(last_id), apply)
            .await
            .unwrap();
        assert_eq!(replayed, 1, "the match on the last page is found");
        let left = consumer.quarantined(1000).await.unwrap();
        assert_eq!(left.len(), QUARANTINED - 1);
        assert!(left.iter().all(|r| &r.event_id != last_id));

        // A filter that matches every page replays every match, page after page.
        let filter = QuarantineFilter::default()
            .event_type("NOTE_ADDED")
            .failure_class(FailureClass::Permanent);
        let replayed = consumer
            .replay_matching::<NoteAdded>(&filter, apply)
            .await
            .unwrap();
        assert_eq!(replayed, QUARANTINED - 1);
        assert!(consumer.quarantined(1000).await.unwrap().is_empty());
        let replayed = consumer
            .quarantine_entries(
                QuarantineStatus::Replayed,
                &QuarantineFilter::default(),
                1000,
            )
            .await
            .unwrap();
        assert_eq!(replayed.len(), QUARANTINED);
        assert!(
            replayed
                .iter()
                .all(|r| r.replayed() && r.replay_time.is_some())
        );
        let one = consumer
            .quarantine_entries(
                QuarantineStatus::Replayed,
                &QuarantineFilter::default().event_id(last_id),
                10,
            )
            .await
            .unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(
            applied.load(std::sync::atomic::Ordering::SeqCst),
            QUARANTINED
        );
        // A class that matches nothing replays nothing.
        let stale = QuarantineFilter::default().failure_class(FailureClass::Stale);
        assert_eq!(
            consumer
                .replay_matching::<NoteAdded>(&stale, apply)
                .await
                .unwrap(),
            0
        );
    }

    event_tests::on_every_backend!(a_match_on_the_last_page_is_replayed);
}

mod router {
    use std::sync::Mutex;

    use event_core::{EventContext, UnitOfWork};
    use event_sqlx::{Consumer, Delivered, Processed, UnknownEvents};
    use event_tests::db::{Orders, TestDb};
    use event_tests::fixtures::{Order, OrderPaid, OrderPlaced};

    /// One consumer, three event types, on every backend: each body goes to the handler of its
    /// type with its envelope; a type without a handler follows the policy.
    async fn each_type_reaches_its_handler<DB: Orders>(db: &TestDb<DB>) {
        let mut order = Order::place("o-r", 700).unwrap();
        order.pay(700).unwrap();
        order.note("fragile");
        let mut uow = UnitOfWork::new(EventContext::new("order-service").tenant_id("acme"));
        uow.collect(&mut order).unwrap();
        let bodies = event_tests::fixtures::bodies(uow);

        let seen = Mutex::new(Vec::new());
        let note = |what: String| seen.lock().unwrap().push(what);
        let consumer = Consumer::new(db.pool().clone(), "order-view", "1.0.0")
            .on(
                async |_tx: &mut DB::Connection, e: Delivered<OrderPlaced>| {
                    note(format!(
                        "{} placed {}",
                        e.envelope.aggregate_sequence, e.amount_minor
                    ));
                    Ok(())
                },
            )
            .on(async |_tx: &mut DB::Connection, e: Delivered<OrderPaid>| {
                let tenant = e.context("view").headers().tenant_id.clone();
                note(format!(
                    "{} paid for {tenant:?}",
                    e.envelope.aggregate_sequence
                ));
                Ok(())
            });
        let outcomes = [
            consumer.receive(&bodies[0], None).await.unwrap(),
            consumer.receive(&bodies[1], None).await.unwrap(),
            consumer.receive(&bodies[2], None).await.unwrap(),
        ];
        assert_eq!(
            outcomes,
            [Processed::Applied, Processed::Applied, Processed::Ignored]
        );
        assert_eq!(
            *seen.lock().unwrap(),
            vec!["1 placed 700", "2 paid for Some(\"acme\")"]
        );
        assert_eq!(
            consumer.receive(&bodies[1], None).await.unwrap(),
            Processed::Duplicate
        );

        let strict = Consumer::new(db.pool().clone(), "strict-view", "1.0.0")
            .unknown_events(UnknownEvents::Quarantine)
            .on(async |_tx: &mut DB::Connection, _e: Delivered<OrderPlaced>| Ok(()));
        assert!(matches!(
            strict.receive(&bodies[2], None).await.unwrap(),
            Processed::Quarantined(reason) if reason.contains("no handler for event type NOTE_ADDED")
        ));
    }

    event_tests::on_every_backend!(each_type_reaches_its_handler);
}

/// Bodies that are not events, without a broker message id: each is quarantined under a name
/// of its own, with its body, and the same body again counts as another attempt.
mod unreadable {
    use event_sqlx::{Consumer, Delivered, Processed};
    use event_tests::db::{Orders, TestDb};
    use event_tests::fixtures::OrderPlaced;

    async fn each_body_is_quarantined_under_its_own_name<DB: Orders>(db: &TestDb<DB>) {
        let consumer = Consumer::new(db.pool().clone(), "unreadable-view", "1.0.0")
            .on(async |_tx: &mut DB::Connection, _e: Delivered<OrderPlaced>| Ok(()));
        let bodies: [&[u8]; 3] = [b"not an envelope", b"{\"eventId\": 7}", b"not an envelope "];
        for body in bodies {
            assert!(matches!(
                consumer.receive(body, None).await.unwrap(),
                Processed::Quarantined(_)
            ));
        }
        assert!(matches!(
            consumer.receive(bodies[0], None).await.unwrap(),
            Processed::Quarantined(_)
        ));
        let mut entries = consumer.quarantined(10).await.unwrap();
        entries.sort_by(|a, b| a.body.cmp(&b.body));
        let seen: Vec<(&str, i32)> = entries
            .iter()
            .map(|e| (e.body.as_str(), e.retry_count))
            .collect();
        assert_eq!(
            seen,
            [
                ("not an envelope", 2),
                ("not an envelope ", 1),
                ("{\"eventId\": 7}", 1)
            ]
        );
        for entry in &entries {
            assert!(entry.event_id.starts_with("body:"), "{}", entry.event_id);
            assert_eq!(entry.event_id.len(), 37, "{}", entry.event_id);
        }
    }

    event_tests::on_every_backend!(each_body_is_quarantined_under_its_own_name);
}

/// A batch in one transaction, on every backend: duplicates found by the multi-row insert, a
/// failing event isolated (quarantined) while the others commit, order kept per aggregate.
mod batch {
    use std::sync::Mutex;

    use event_core::{EventContext, UnitOfWork};
    use event_sqlx::{Consumer, Delivered, HandlerError, Processed, QuarantineStatus, Received};
    use event_tests::db::{Orders, TestDb};
    use event_tests::fixtures::{Order, OrderPaid, OrderPlaced};

    /// Each body as a message without a broker id.
    fn received(bodies: &[Vec<u8>]) -> Vec<Received<'_>> {
        bodies
            .iter()
            .map(|b| Received {
                body: b,
                message_id: None,
            })
            .collect()
    }

    /// How many of `outcomes` are `Applied`.
    fn applied(outcomes: &[Processed]) -> usize {
        outcomes
            .iter()
            .filter(|o| **o == Processed::Applied)
            .count()
    }

    async fn a_failing_event_does_not_poison_its_batch<DB: Orders>(db: &TestDb<DB>) {
        // Ten orders placed and paid: twenty events, two per aggregate, in order.
        let mut uow = UnitOfWork::new(EventContext::new("order-service"));
        for i in 0..10 {
            let mut order = Order::place(&format!("o-{i}"), 100 + i).unwrap();
            order.pay(100 + i).unwrap();
            uow.collect(&mut order).unwrap();
        }
        let bodies = event_tests::fixtures::bodies(uow);

        let seen = Mutex::new(Vec::new());
        let note = |what: String| seen.lock().unwrap().push(what);
        let consumer = Consumer::new(db.pool().clone(), "billing", "1.0.0")
            .on(async |tx: &mut DB::Connection, e: Delivered<OrderPlaced>| {
                if e.order_id == "o-3" {
                    return Err(HandlerError::Permanent("o-3 has no customer".into()));
                }
                DB::save_order(tx, &e.order_id, "PLACED", 1).await?;
                note(format!("{} placed", e.order_id));
                Ok(())
            })
            .on(async |tx: &mut DB::Connection, e: Delivered<OrderPaid>| {
                DB::save_order(tx, &e.order_id, "PAID", 2).await?;
                note(format!("{} paid", e.order_id));
                Ok(())
            });

        // o-0 placed was consumed before; the batch also carries one event twice.
        assert_eq!(
            consumer.receive(&bodies[0], None).await.unwrap(),
            Processed::Applied
        );
        let mut batch = received(&bodies);
        batch.push(batch[5]);
        let outcomes = consumer.receive_batch(&batch).await.unwrap();

        assert_eq!(outcomes.len(), 21);
        assert_eq!(
            outcomes[0],
            Processed::Duplicate,
            "consumed before the batch"
        );
        assert!(
            matches!(&outcomes[6], Processed::Quarantined(reason) if reason == "o-3 has no customer"),
            "{:?}",
            outcomes[6]
        );
        assert_eq!(outcomes[20], Processed::Duplicate, "the same event twice");
        assert_eq!(applied(&outcomes), 18, "{outcomes:?}");
        assert_eq!(DB::count_orders(db.pool()).await.unwrap(), 10);
        assert_eq!(
            DB::order_status(db.pool(), "o-3").await.unwrap().as_deref(),
            Some("PAID"),
            "o-3's payment still applies: permanent failures do not stop the aggregate"
        );
        assert_eq!(
            DB::order_status(db.pool(), "o-7").await.unwrap().as_deref(),
            Some("PAID")
        );
        let quarantined = consumer.quarantined(10).await.unwrap();
        assert_eq!(quarantined.len(), 1);
        assert_eq!(quarantined[0].status, QuarantineStatus::Quarantined);
        assert_eq!(quarantined[0].event_type.as_deref(), Some("ORDER_PLACED"));

        // Each aggregate's events were applied in order, placed before paid. (Handlers ran in
        // the rolled-back first try too: the last run of each is the one that committed.)
        let seen = seen.lock().unwrap().clone();
        for i in (0..10).filter(|i| *i != 3) {
            let placed = seen.iter().rposition(|s| *s == format!("o-{i} placed"));
            let paid = seen.iter().rposition(|s| *s == format!("o-{i} paid"));
            assert!(placed.unwrap() < paid.unwrap(), "{seen:?}");
        }

        // Delivered again: every event a duplicate (the quarantined one is in the inbox no more
        // than it was: it was never applied).
        let again = consumer.receive_batch(&batch[..20]).await.unwrap();
        assert_eq!(
            again.iter().filter(|o| **o == Processed::Duplicate).count(),
            19,
            "{again:?}"
        );
    }

    /// A batch handler gets the whole slice in one call; one bad event in it is isolated by
    /// halving, and the others commit.
    async fn a_batch_handler_gets_the_slice_and_a_bad_event_is_isolated<DB: Orders>(
        db: &TestDb<DB>,
    ) {
        let mut uow = UnitOfWork::new(EventContext::new("order-service"));
        for i in 0..40 {
            uow.collect(&mut Order::place(&format!("b-{i}"), 100 + i).unwrap())
                .unwrap();
        }
        let bodies = event_tests::fixtures::bodies(uow);
        let calls = Mutex::new(Vec::new());
        let consumer = Consumer::new(db.pool().clone(), "bulk-billing", "1.0.0").on_batch(
            async |tx: &mut DB::Connection, placed: Vec<Delivered<OrderPlaced>>| {
                calls.lock().unwrap().push(placed.len());
                for e in &placed {
                    if e.order_id == "b-29" {
                        return Err(HandlerError::Permanent("b-29 has no customer".into()));
                    }
                    DB::save_order(tx, &e.order_id, "PLACED", 1).await?;
                }
                Ok(())
            },
        );
        let batch = received(&bodies);
        let outcomes = consumer.receive_batch(&batch).await.unwrap();
        assert!(
            matches!(&outcomes[29], Processed::Quarantined(r) if r == "b-29 has no customer"),
            "{outcomes:?}"
        );
        assert_eq!(applied(&outcomes), 39);
        assert_eq!(
            DB::count_orders(db.pool()).await.unwrap(),
            10 + 39,
            "the ten orders of the test before, and 39 of these"
        );
        let calls = calls.lock().unwrap().clone();
        assert_eq!(
            calls[0], 40,
            "the first call took the whole slice: {calls:?}"
        );
        assert!(calls.len() <= 16, "halving, not one by one: {calls:?}");
    }

    /// A consumer with `concurrency(4)` applies a batch in lanes at once on PostgreSQL (in one
    /// transaction on MySQL and SQLite): each aggregate's events in order, every event once,
    /// and a failing event's lane split around it while the other lanes commit.
    async fn lanes_apply_each_aggregate_in_order<DB: Orders>(db: &TestDb<DB>) {
        let lanes = <DB as sqlx::Database>::NAME == "PostgreSQL";
        let mut uow = UnitOfWork::new(EventContext::new("order-service"));
        for i in 0..8 {
            let mut order = Order::place(&format!("lane-{i}"), 100 + i).unwrap();
            order.pay(100 + i).unwrap();
            uow.collect(&mut order).unwrap();
        }
        let bodies = event_tests::fixtures::bodies(uow);
        let before = DB::count_orders(db.pool()).await.unwrap();

        let seen = Mutex::new(Vec::new());
        let note = |what: String| seen.lock().unwrap().push(what);
        let calls = std::sync::atomic::AtomicUsize::new(0);
        // The first handler waits, inside its lane's transaction, until another handler has
        // started: only a lane running beside it can start one.
        let consumer = Consumer::new(db.pool().clone(), "lane-billing", "1.0.0")
            .concurrency(4)
            .on(async |tx: &mut DB::Connection, e: Delivered<OrderPlaced>| {
                let call = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if call == 0 && lanes {
                    event_tests::wait::until(std::time::Duration::from_secs(10), async || {
                        if calls.load(std::sync::atomic::Ordering::SeqCst) > 1 {
                            Ok(())
                        } else {
                            Err("no other lane started a handler".to_owned())
                        }
                    })
                    .await;
                }
                if e.order_id == "lane-3" {
                    return Err(HandlerError::Permanent("lane-3 has no customer".into()));
                }
                DB::save_order(tx, &e.order_id, "PLACED", 1).await?;
                note(format!("{} placed", e.order_id));
                Ok(())
            })
            .on(async |tx: &mut DB::Connection, e: Delivered<OrderPaid>| {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                DB::save_order(tx, &e.order_id, "PAID", 2).await?;
                note(format!("{} paid", e.order_id));
                Ok(())
            });
        let batch = received(&bodies);
        let outcomes = consumer.receive_batch(&batch).await.unwrap();

        assert!(
            matches!(&outcomes[6], Processed::Quarantined(r) if r == "lane-3 has no customer"),
            "{outcomes:?}"
        );
        assert_eq!(applied(&outcomes), 15, "{outcomes:?}");
        assert_eq!(DB::count_orders(db.pool()).await.unwrap(), before + 8);
        assert_eq!(
            DB::order_status(db.pool(), "lane-3")
                .await
                .unwrap()
                .as_deref(),
            Some("PAID")
        );
        let seen = seen.lock().unwrap().clone();
        for i in (0..8).filter(|i| *i != 3) {
            let placed = seen.iter().rposition(|s| *s == format!("lane-{i} placed"));
            let paid = seen.iter().rposition(|s| *s == format!("lane-{i} paid"));
            assert!(placed.unwrap() < paid.unwrap(), "{seen:?}");
        }

        // Delivered again: every event a duplicate but the quarantined one, which was never
        // applied.
        let again = consumer.receive_batch(&batch).await.unwrap();
        assert_eq!(
            again.iter().filter(|o| **o == Processed::Duplicate).count(),
            15,
            "{again:?}"
        );
    }

    /// Lanes run on PostgreSQL alone; asking for them elsewhere says so once, at build time.
    #[tokio::test]
    async fn concurrency_where_lanes_do_not_run_logs_a_warning() {
        use std::sync::{Arc, Mutex};

        #[derive(Clone, Default)]
        struct Logs(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Logs {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let text = || String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();

        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        let _one = Consumer::new(pool.clone(), "one-lane", "1.0.0").concurrency(1);
        assert_eq!(text(), "");
        let _four = Consumer::new(pool, "four-lanes", "1.0.0").concurrency(4);
        let logged = text();
        assert!(
            logged.contains("WARN")
                && logged.contains("four-lanes")
                && logged.contains("applies on PostgreSQL only"),
            "{logged}"
        );
    }

    /// The batch scenarios on one database: each counts the orders of those before.
    async fn batches_on_one_database<DB: Orders>(db: &TestDb<DB>) {
        a_failing_event_does_not_poison_its_batch(db).await;
        a_batch_handler_gets_the_slice_and_a_bad_event_is_isolated(db).await;
        lanes_apply_each_aggregate_in_order(db).await;
    }

    event_tests::on_every_backend!(batches_on_one_database);
}

/// On PostgreSQL a consumer's transaction opens with its inbox row in one message (`BEGIN;
/// INSERT ...`, the values as literals): text of any kind is stored as it came, an event
/// consumed before still reads as a duplicate, and a consume cancelled while that message
/// waits leaves nothing behind for the connection's next user to commit.
mod one_message {
    use std::time::Duration;

    use event_core::{EventContext, EventEnvelope, UnitOfWork};
    use event_sqlx::{Handled, Inbox};
    use event_tests::db::{Orders, TestDb};
    use event_tests::fixtures::Order;
    use event_tests::wait;
    use sqlx::{PgConnection, Postgres};

    fn placed(id: &str) -> EventEnvelope {
        let mut uow = UnitOfWork::new(EventContext::new("order-service"));
        uow.collect(&mut Order::place(id, 10).unwrap()).unwrap();
        uow.commit().remove(0)
    }

    #[tokio::test]
    async fn text_is_stored_as_it_came_and_a_repeat_is_a_duplicate() {
        let Some(db) = TestDb::postgres().await else {
            return;
        };
        let inbox = Inbox::new(db.pool().clone(), r"invoice's \service");
        let hostile = [
            r"o-'); DELETE FROM consumed_event; --",
            r"o-back\slash\\and\'quote",
            "o-$$dollar$$ E'x' \u{7f} é 中 🧾",
        ];
        for id in hostile {
            let envelope = placed(id);
            for expected in [Handled::Applied(()), Handled::Duplicate] {
                let outcome = inbox
                    .handle(&envelope, async |tx: &mut PgConnection| {
                        <Postgres as Orders>::save_order(tx, &envelope.aggregate_id, "INVOICED", 1)
                            .await
                    })
                    .await
                    .unwrap();
                assert_eq!(outcome, expected, "{id}");
            }
            let stored: (String, String, String) = sqlx::query_as(
                "SELECT consumer, event_id, aggregate_id FROM consumed_event WHERE aggregate_id = $1",
            )
            .bind(id)
            .fetch_one(db.pool())
            .await
            .unwrap();
            assert_eq!(
                stored,
                (
                    r"invoice's \service".to_owned(),
                    envelope.event_id.to_string(),
                    id.to_owned()
                )
            );
        }
        assert_eq!(
            <Postgres as Orders>::count_orders(db.pool()).await.unwrap(),
            3,
            "one effect per event"
        );
        db.cleanup().await;
    }

    #[tokio::test]
    async fn a_cancelled_consume_leaves_no_inbox_row_for_the_next_user_to_commit() {
        let Some(db) = TestDb::postgres().await else {
            return;
        };
        // One connection: whatever the cancelled consume leaves on it, the next user gets.
        let pool = db.one_connection().await;
        let inbox = Inbox::new(pool.clone(), "invoice-service");
        let envelope = placed("o-1");

        // Another session holds the same inbox row, uncommitted: the consume's INSERT waits.
        let mut blocker = db.pool().begin().await.unwrap();
        sqlx::query(
            "INSERT INTO consumed_event (consumer, event_id, consumed_time, aggregate_type, \
             aggregate_id, aggregate_sequence) VALUES ($1, $2, now(), 'ORDER', 'o-1', 1)",
        )
        .bind("invoice-service")
        .bind(envelope.event_id.as_str())
        .execute(&mut *blocker)
        .await
        .unwrap();
        let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
        let consume = tokio::spawn({
            let (inbox, envelope) = (inbox.clone(), envelope.clone());
            async move {
                tokio::select! {
                    _ = cancelled => None,
                    outcome = inbox.handle(&envelope, async |tx: &mut PgConnection| {
                        <Postgres as Orders>::save_order(tx, "invoice-o-1", "INVOICED", 1).await
                    }) => Some(outcome),
                }
            }
        });
        // The consume's session waits on the row lock, inside the message that began its
        // transaction.
        let (pid, query) = wait::until(Duration::from_secs(30), async || {
            sqlx::query_as::<_, (i32, String)>(
                "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO consumed_event%'",
            )
            .fetch_optional(db.pool())
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "no session waits on the inbox row yet".to_owned())
        })
        .await;
        assert!(
            query.starts_with("BEGIN; INSERT INTO consumed_event"),
            "the transaction opens with its inbox row: {query}"
        );
        cancel.send(()).unwrap();
        assert!(consume.await.unwrap().is_none(), "cancelled while waiting");
        // The blocker gives way, so the waiting INSERT goes through on the server.
        blocker.rollback().await.unwrap();

        // The next user of the pool's one connection commits a transaction of its own.
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
        let count = async || -> i64 {
            sqlx::query_scalar("SELECT COUNT(*) FROM consumed_event")
                .fetch_one(db.pool())
                .await
                .unwrap()
        };
        assert_eq!(
            count().await,
            0,
            "the next user's commit committed no inbox row without its effect"
        );
        // The cancelled consume's session ends without committing anything.
        wait::until(Duration::from_secs(30), async || {
            let alive: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1")
                    .bind(pid)
                    .fetch_one(db.pool())
                    .await
                    .map_err(|e| e.to_string())?;
            if alive == 0 {
                Ok(())
            } else {
                Err(format!(
                    "session {pid} still open: the cancelled consume's connection was reused"
                ))
            }
        })
        .await;
        assert_eq!(count().await, 0, "no inbox row without its effect");

        // Delivered again, the event is applied.
        let outcome = inbox
            .handle(&envelope, async |tx: &mut PgConnection| {
                <Postgres as Orders>::save_order(tx, "invoice-o-1", "INVOICED", 1).await
            })
            .await
            .unwrap();
        assert_eq!(outcome, Handled::Applied(()));
        assert_eq!(
            <Postgres as Orders>::count_orders(db.pool()).await.unwrap(),
            1
        );
        pool.close().await;
        db.cleanup().await;
    }
}
