//! Committing state and events together, on real PostgreSQL, MariaDB and SQLite: each scenario
//! runs on a fresh database of every backend (PostgreSQL on both commit paths).

use event_core::{Aggregate, EventContext, UnitOfWork};
use event_sqlx::{ChannelPublisher, CommitPath, Error, EventStatus, OutboxConfig, RelayConfig};
use event_tests::db::{Orders, TestDb, postgres_with};
use event_tests::fixtures::{NoteAdded, Order, context, place};

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
    let mut retried = Order::loaded("o-1", 1, false);
    retried.pay(999_999).unwrap();
    retried.note("retried");
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
    let mut again = Order::loaded("o-1", 3, true);
    again.note("again");
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
    let mut stale = Order::loaded(id, 0, false);
    stale.note("late");
    stale
}

async fn a_stale_aggregate_version_is_a_sequence_conflict<DB: Orders>(db: &TestDb<DB>) {
    place(db, "o-3", false).await;
    let mut stale = loaded_as_new("o-3");
    let err = save(&db.outbox, &mut stale, "NOTED", 2).await.unwrap_err();
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

/// The `orders` row's status of `id`.
async fn order_status<DB: Orders>(db: &TestDb<DB>, id: &str) -> Option<String> {
    DB::order_status(db.pool(), id).await.unwrap()
}

/// Commits `order`'s events through `outbox` with its row (`status`, `version`) in one
/// transaction: a command's state and events.
async fn save<DB: Orders>(
    outbox: &event_sqlx::Outbox<DB>,
    order: &mut Order,
    status: &str,
    version: i64,
) -> Result<event_sqlx::Commit, Error> {
    let mut uow = UnitOfWork::new(context());
    uow.collect(order).unwrap();
    let mut tx = outbox.pool().begin().await.unwrap();
    DB::save_order(&mut tx, &order.id, status, version)
        .await
        .unwrap();
    outbox.commit(tx, uow).await
}

/// Pays `id` as loaded at version 1 (placed, not paid), writing `status` with it.
async fn pay_from_version_1<DB: Orders>(
    outbox: &event_sqlx::Outbox<DB>,
    id: &str,
    status: &str,
    amount_minor: i64,
) -> Result<event_sqlx::Commit, Error> {
    let mut order = Order::loaded(id, 1, false);
    order.pay(amount_minor).unwrap();
    save(outbox, &mut order, status, 2).await
}

/// The commit rule for repeated and stale commands: state commits only with its events.
async fn a_command_applied_before_commits_nothing<DB: Orders>(db: &TestDb<DB>) {
    // An exact retry: the same command after it committed.
    place(db, "o-retry", false).await;
    let first = pay_from_version_1(&db.outbox, "o-retry", "PAID", 1000)
        .await
        .unwrap();
    assert!(matches!(first, event_sqlx::Commit::Committed(ref r) if r.recorded.len() == 1));
    let stored = db.outbox.by_event_no("ORDER_PAID:o-retry").await.unwrap();
    let retry = pay_from_version_1(&db.outbox, "o-retry", "PAID (retried)", 1000)
        .await
        .unwrap();
    assert!(retry.already_applied(), "{retry:?}");
    assert_eq!(
        retry.report().already_recorded[0].as_str(),
        "ORDER_PAID:o-retry"
    );
    assert_eq!(
        order_status(db, "o-retry").await.as_deref(),
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
        pay_from_version_1(&db.outbox, "o-race", "PAID 1000", 1000)
            .await
            .unwrap(),
        pay_from_version_1(&db.outbox, "o-race", "PAID 999", 999)
            .await
            .unwrap(),
    );
    assert!(!a.already_applied() && b.already_applied(), "{a:?} {b:?}");
    assert_eq!(
        order_status(db, "o-race").await.as_deref(),
        Some("PAID 1000")
    );

    // A stale command with another event number: a sequence conflict, nothing committed.
    let mut stale = loaded_as_new("o-race");
    let err = save(&db.outbox, &mut stale, "NOTED", 2).await.unwrap_err();
    assert!(matches!(err, Error::SequenceConflict { .. }), "{err}");
    assert_eq!(
        order_status(db, "o-race").await.as_deref(),
        Some("PAID 1000")
    );

    // Part recorded before, part new: a stale command; nothing committed.
    let mut order = Order::loaded("o-race", 1, false);
    order.pay(1000).unwrap();
    order.note("thanks");
    let err = save(&db.outbox, &mut order, "PAID AND NOTED", 3)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::PartlyRecorded { event_no, new: 1, .. } if event_no == "ORDER_PAID:o-race"),
        "{err}"
    );
    assert_eq!(
        order_status(db, "o-race").await.as_deref(),
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
    let kept = pay_from_version_1(&lenient, "o-race", "PAID AGAIN", 1000)
        .await
        .unwrap();
    assert!(matches!(kept, event_sqlx::Commit::Committed(ref r) if r.already_recorded.len() == 1));
    assert_eq!(
        order_status(db, "o-race").await.as_deref(),
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
    order.note(&"x".repeat(100));
    let err = save(&small, &mut order, "PLACED", 1).await.unwrap_err();
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

/// Sequences start at 1: an envelope built by hand at sequence 0 is refused with its aggregate
/// and event named, and nothing of the transaction is written.
async fn an_event_at_sequence_zero_is_refused_and_nothing_is_written<DB: Orders>(db: &TestDb<DB>) {
    let mut order = Order::place("o-zero", 1).unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    let mut envelopes = uow.commit();
    envelopes[0].aggregate_sequence = 0;
    let mut tx = db.pool().begin().await.unwrap();
    DB::save_order(&mut tx, "o-zero", "PLACED", 1)
        .await
        .unwrap();
    let err = db.outbox.flush(&mut tx, &envelopes).await.unwrap_err();
    assert!(
        matches!(&err, Error::SequenceZero { aggregate_id, .. } if aggregate_id == "o-zero"),
        "{err}"
    );
    assert!(
        err.to_string().contains("sequences start at 1")
            && err.to_string().contains("UnitOfWork::collect"),
        "{err}"
    );
    drop(tx);
    assert_eq!(DB::count_orders(db.pool()).await.unwrap(), 0);
    assert!(
        db.outbox
            .by_aggregate("ORDER", "o-zero")
            .await
            .unwrap()
            .is_empty()
    );
}

/// Aggregate ids, and so event numbers, that differ only in letter case, an accent or a trailing
/// space name different orders: each commit records its own event, none is taken for a repeat of
/// another (MySQL and MariaDB compare text case- and accent-insensitively, and ignore trailing
/// spaces, unless the column says otherwise).
async fn event_numbers_that_differ_only_in_case_accent_or_trailing_space_are_different_events<
    DB: Orders,
>(
    db: &TestDb<DB>,
) {
    let ids = ["o-abc", "o-ABC", "o-e", "o-\u{e9}", "o-x", "o-x "];
    for id in ids {
        let mut order = Order::place(id, 10).unwrap();
        let mut uow = UnitOfWork::new(context());
        uow.collect(&mut order).unwrap();
        let commit = db
            .outbox
            .commit(db.pool().begin().await.unwrap(), uow)
            .await
            .unwrap();
        assert!(!commit.already_applied(), "{id:?} taken for a repeat");
        assert_eq!(commit.report().recorded.len(), 1, "{id:?}");
    }
    for id in ids {
        let stored = db.outbox.by_aggregate("ORDER", id).await.unwrap();
        let numbers: Vec<&str> = stored.iter().map(|e| e.event_no.as_str()).collect();
        assert_eq!(
            numbers,
            vec![format!("ORDER_PLACED:ORDER:{id}:1")],
            "{id:?}"
        );
        let by_no = db
            .outbox
            .by_event_no(&format!("ORDER_PLACED:ORDER:{id}:1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(by_no.aggregate_id, id);
    }
}

// The commit rules on every backend, and on PostgreSQL twice: with the events bound as
// parameters, and with them sent in the COMMIT's message (one trip).
event_tests::on_every_backend!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    postgres = postgres_with(CommitPath::Bound),
    postgres_one_trip = postgres_with(CommitPath::OneTrip),
    mysql = TestDb::mysql(),
    sqlite = TestDb::sqlite();
    state_and_events_commit_or_roll_back_together,
    a_duplicate_event_no_is_absorbed_and_changes_nothing,
    a_stale_aggregate_version_is_a_sequence_conflict,
    a_sequence_conflict_names_the_row_that_conflicted,
    a_command_applied_before_commits_nothing,
    an_oversized_payload_is_rejected_and_nothing_is_written,
    event_numbers_that_differ_only_in_case_accent_or_trailing_space_are_different_events,
    an_event_at_sequence_zero_is_refused_and_nothing_is_written,
);

/// The unit of work of placing order `id` with a note of `text`: two events.
fn placed_with_note(id: &str, text: &str) -> UnitOfWork {
    let mut order = Order::place(id, 7).unwrap();
    order.record(NoteAdded { text: text.into() }).unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    uow
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
    let pool = db.one_connection().await;
    let hostile_topic = r"t'o\pic'); DELETE FROM biz_outbox_event; --";
    let outbox = event_sqlx::Outbox::new(
        pool.clone(),
        OutboxConfig::new()
            .commit_path(CommitPath::Bound)
            .route("ORDER_PLACED", event_sqlx::Route::topic(hostile_topic)),
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
    let pool = db.one_connection().await;
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
    let _ = bound
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
    let _ = auto.commit(pool.begin().await.unwrap(), uow).await.unwrap();
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
