//! The consumer inbox (seed 003): a handler's writes and the record that it consumed the event
//! commit together, so a redelivered event has its effect once.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use event_core::EventEnvelope;
use sqlx::Pool;

use crate::clock::{self, Clock, SharedClock};
use crate::sql::dialect::Backend;
use crate::sql::inbox as sql;
use crate::table::TableName;

/// What became of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled<T> {
    /// The handler ran and its writes committed with the inbox record.
    Applied(T),
    /// The consumer had already consumed this event: the handler did not run. Acknowledge it.
    Duplicate,
    /// A later event of the same aggregate was already applied (only with
    /// [`Inbox::reject_stale`]): the handler did not run.
    Stale {
        /// The sequence already applied.
        last_applied: u64,
    },
}

/// Why a delivery was not handled. Nothing of it was committed.
#[derive(Debug, thiserror::Error)]
pub enum InboxError<E> {
    /// The handler failed; its writes were rolled back, and the event can be delivered again.
    #[error("handler failed: {0}")]
    Handler(E),
    /// The database failed.
    #[error("inbox database error on {table}")]
    Database {
        /// The inbox table.
        table: String,
        /// What sqlx reported.
        #[source]
        source: sqlx::Error,
    },
}

/// The inbox of one consumer, in `consumed_event`.
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool, envelope: event_core::EventEnvelope) -> Result<(), Box<dyn std::error::Error>> {
/// use event_sqlx::{Handled, Inbox};
///
/// let inbox = Inbox::new(pool, "invoice-service");
/// let outcome = inbox
///     .handle(&envelope, async |tx: &mut sqlx::SqliteConnection| {
///         sqlx::query("INSERT INTO invoice (order_id) VALUES (?)")
///             .bind(&envelope.aggregate_id)
///             .execute(&mut *tx)
///             .await?;
///         Ok::<_, sqlx::Error>(())
///     })
///     .await?;
/// if outcome == Handled::Duplicate {
///     // Already applied: acknowledge the redelivery and move on.
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Inbox<DB: Backend> {
    pool: Pool<DB>,
    consumer: String,
    table: TableName,
    reject_stale: bool,
    clock: SharedClock,
}

impl<DB: Backend> Inbox<DB> {
    /// The inbox of `consumer` (e.g. `invoice-service`) in the seed's `consumed_event`.
    pub fn new(pool: Pool<DB>, consumer: impl Into<String>) -> Inbox<DB> {
        Inbox {
            pool,
            consumer: consumer.into(),
            table: TableName::new("consumed_event").unwrap_or_else(|_| unreachable!()),
            reject_stale: false,
            clock: clock::system(),
        }
    }

    /// Reads the time from `clock` instead of the system clock (see [`ManualClock`]).
    ///
    /// [`ManualClock`]: crate::ManualClock
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The current time of the inbox's clock, as stored.
    pub(crate) fn now(&self) -> DateTime<Utc> {
        clock::stored_now(&*self.clock)
    }

    /// Refuses an event older than one already applied for the same aggregate (seed 003: keep a
    /// sequence per aggregate and reject regressive updates). For consumers that set state from
    /// each event; a consumer that accumulates must see every event and leaves this off.
    pub fn reject_stale(mut self) -> Self {
        self.reject_stale = true;
        self
    }

    /// Uses another table with the same columns.
    pub fn table(mut self, table: TableName) -> Self {
        self.table = table;
        self
    }

    /// The consumer's name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Deletes this consumer's records consumed more than `retention` ago, in batches of
    /// `batch` (one short statement each), and returns how many. Keep the retention longer than
    /// any redelivery or replay window: an event redelivered after its record is gone would be
    /// applied again.
    pub async fn prune(
        &self,
        retention: std::time::Duration,
        batch: u32,
    ) -> Result<u64, crate::error::Error> {
        let before = clock::before(self.now(), retention);
        let (table, consumer) = (&self.table, self.consumer.as_str());
        crate::sql::delete_in_batches(&self.pool, i64::from(batch), async |conn, limit| {
            sql::prune_consumed::<DB>(conn, table, consumer, before, limit).await
        })
        .await
        .map_err(|e| crate::error::Error::database(table, e))
    }

    pub(crate) fn table_name(&self) -> &TableName {
        &self.table
    }

    pub(crate) fn rejects_stale(&self) -> bool {
        self.reject_stale
    }

    pub(crate) fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// Runs `handler` on a transaction that also records the event as consumed, and commits both;
    /// when the event was consumed before, the handler does not run. If the handler fails,
    /// nothing is committed.
    pub async fn handle<T, E>(
        &self,
        envelope: &EventEnvelope,
        handler: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, E>,
    ) -> Result<Handled<T>, InboxError<E>> {
        let db = |source| InboxError::Database {
            table: self.table.to_string(),
            source,
        };
        let mut tx = self.pool.begin().await.map_err(db)?;
        let first =
            sql::insert_consumed::<DB>(&mut tx, &self.table, &self.consumer, envelope, self.now())
                .await
                .map_err(db)?;
        if !first {
            tx.rollback().await.map_err(db)?;
            return Ok(Handled::Duplicate);
        }
        if self.reject_stale {
            let last =
                sql::last_applied_sequence::<DB>(&mut tx, &self.table, &self.consumer, envelope)
                    .await
                    .map_err(db)?;
            if let Some(last) = last
                .and_then(|last| u64::try_from(last).ok())
                .filter(|&last| last > envelope.aggregate_sequence)
            {
                tx.rollback().await.map_err(db)?;
                return Ok(Handled::Stale { last_applied: last });
            }
        }
        let value = handler(&mut tx).await.map_err(InboxError::Handler)?;
        tx.commit().await.map_err(db)?;
        Ok(Handled::Applied(value))
    }
}

impl<DB: Backend> Clone for Inbox<DB> {
    fn clone(&self) -> Self {
        Inbox {
            pool: self.pool.clone(),
            consumer: self.consumer.clone(),
            table: self.table.clone(),
            reject_stale: self.reject_stale,
            clock: Arc::clone(&self.clock),
        }
    }
}
