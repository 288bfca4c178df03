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

macro_rules! on_every_backend {
    ($($backend:ident),*) => {$(
        #[tokio::test]
        async fn $backend() {
            if let Some(db) = TestDb::$backend().await {
                effects_happen_once(&db).await;
                db.cleanup().await;
            }
        }
    )*};
}

on_every_backend!(postgres, mysql, sqlite);
