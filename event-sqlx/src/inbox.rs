//! The consumer inbox (seed 003): a handler's writes and the record that it consumed the event
//! commit together, so a redelivered event has its effect once.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use event_core::EventEnvelope;
use sqlx::Pool;
use sqlx::pool::PoolConnection;

use crate::clock::{self, Clock, SharedClock};
use crate::sql::dialect::Backend;
use crate::sql::inbox as sql;
use crate::table::TableName;
use crate::wire::PREVIOUS_SEQUENCE_HEADER;

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
    /// The previous sequence of the event's aggregate was not applied yet (only with
    /// [`Inbox::in_order`]): the handler did not run and nothing was recorded. Deliver the
    /// event again later.
    Early {
        /// The highest sequence of the aggregate applied so far, if any.
        last_applied: Option<u64>,
    },
}

/// What the per-aggregate order guard of one delivery knows besides the inbox.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OrderCheck {
    /// A sequence of the aggregate settled without an inbox record (quarantined here).
    pub(crate) settled: Option<u64>,
    /// The event waited long enough: apply it even if its predecessor is missing.
    pub(crate) accept_gap: bool,
}

/// How a guarded delivery went: the outcome, and for an event applied without its
/// predecessor, the highest sequence that had been applied (`Some(None)`: none).
pub(crate) struct Guarded<T> {
    pub(crate) handled: Handled<T>,
    pub(crate) gap: Option<Option<u64>>,
}

/// Whether `envelope` may be applied after `known`, the highest sequence of its aggregate
/// applied (or settled) so far: once its [`predecessor`] is. Sequence 0 (an event of no
/// aggregate) and 1 have no predecessor; an event at or below `known` is late, not early.
pub(crate) fn in_sequence(envelope: &EventEnvelope, known: Option<u64>) -> bool {
    // Sequences 0 and 1 have predecessor 0.
    let before = predecessor(envelope);
    before == 0 || known.is_some_and(|known| known >= before)
}

/// The sequence an event of an ordered aggregate waits for: the one before it, or, when the
/// relay said the events between were cancelled ([`PREVIOUS_SEQUENCE_HEADER`]), the last one
/// that was not (0: none).
pub(crate) fn predecessor(envelope: &EventEnvelope) -> u64 {
    let sequence = envelope.aggregate_sequence;
    envelope
        .headers
        .extra
        .get(PREVIOUS_SEQUENCE_HEADER)
        .and_then(|previous| previous.parse::<u64>().ok())
        .filter(|&previous| previous < sequence)
        .unwrap_or(sequence.saturating_sub(1))
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
    in_order: bool,
    clock: SharedClock,
    kept: Arc<Kept<DB>>,
}

/// The connections an inbox keeps from one transaction to the next while a subscription is
/// busy ([`Inbox::hold`]): taking a connection from the pool and giving it back cost a round
/// trip each (sqlx checks it both ways), as many as the transaction's own `BEGIN` and `COMMIT`.
/// One per transaction that runs at once ([`Inbox::keep_up_to`]).
#[derive(Debug)]
pub(crate) struct Kept<DB: sqlx::Database> {
    /// How many [`Holding`]s are alive, the connections kept for the next transactions, and
    /// how many may be kept.
    slot: std::sync::Mutex<(usize, Vec<PoolConnection<DB>>, usize)>,
}

impl<DB: sqlx::Database> Kept<DB> {
    fn new(capacity: usize) -> Self {
        Kept {
            slot: std::sync::Mutex::new((0, Vec::new(), capacity)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (usize, Vec<PoolConnection<DB>>, usize)> {
        self.slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn capacity(&self) -> usize {
        self.lock().2
    }
}

/// While alive, the inbox keeps its connection between transactions (see [`Inbox::hold`]);
/// dropping the last one gives the kept connections back to the pool.
#[cfg_attr(
    not(any(feature = "nats", feature = "rabbitmq", feature = "kafka")),
    allow(dead_code) // the subscriptions hold it
)]
#[derive(Debug)]
pub(crate) struct Holding<DB: sqlx::Database>(Arc<Kept<DB>>);

impl<DB: sqlx::Database> Drop for Holding<DB> {
    fn drop(&mut self) {
        let released = {
            let mut slot = self.0.lock();
            slot.0 = slot.0.saturating_sub(1);
            if slot.0 == 0 {
                std::mem::take(&mut slot.1)
            } else {
                Vec::new()
            }
        };
        // Back to the pool outside the lock.
        drop(released);
    }
}

/// A pooled connection while one of the inbox's transactions runs on it ([`Inbox::connection`]).
///
/// Its transaction may open in the same message as its first statement
/// ([`sql::begin_recording`]), so that for a moment the server holds a transaction sqlx has
/// not counted; the connection's next user would commit what it holds. Dropped before the
/// transaction ended (its future cancelled), the connection is therefore closed, not given
/// back to the pool. A transaction that ended hands it on with [`Inbox::give_back`] or
/// [`InUse::release`].
#[derive(Debug)]
pub(crate) struct InUse<DB: sqlx::Database>(Option<PoolConnection<DB>>);

impl<DB: sqlx::Database> InUse<DB> {
    /// The connection.
    pub(crate) fn get(&mut self) -> &mut PoolConnection<DB> {
        self.0
            .as_mut()
            .expect("an InUse holds its connection until it is consumed")
    }

    /// Back to the pool, which checks it: after a transaction that failed.
    pub(crate) fn release(mut self) {
        drop(self.0.take());
    }
}

impl<DB: sqlx::Database> Drop for InUse<DB> {
    fn drop(&mut self) {
        if let Some(conn) = &mut self.0 {
            conn.close_on_drop();
        }
    }
}

impl<DB: Backend> Inbox<DB> {
    /// The inbox of `consumer` (e.g. `invoice-service`) in the seed's `consumed_event`.
    pub fn new(pool: Pool<DB>, consumer: impl Into<String>) -> Inbox<DB> {
        Inbox {
            pool,
            consumer: consumer.into(),
            table: TableName::new("consumed_event").unwrap_or_else(|_| unreachable!()),
            reject_stale: false,
            in_order: false,
            clock: clock::system(),
            kept: Arc::new(Kept::new(1)),
        }
    }

    /// Keeps the connection of each transaction that ended cleanly for the next one, until the
    /// returned guard is dropped: for a subscription while messages keep coming, so that a
    /// transaction costs its own statements and not also the pool's checks of the connection.
    /// A connection is kept only while the pool has another to spare (an idle one, or room to
    /// open one), so other users of a small pool are not kept waiting; a transaction that
    /// failed on the database gives its connection back to the pool, which checks it.
    #[cfg_attr(
        not(any(feature = "nats", feature = "rabbitmq", feature = "kafka")),
        allow(dead_code) // the subscriptions hold it
    )]
    pub(crate) fn hold(&self) -> Holding<DB> {
        self.kept.lock().0 += 1;
        Holding(Arc::clone(&self.kept))
    }

    /// Keeps up to `connections` connections while held ([`Inbox::hold`]), one per transaction
    /// that runs at once; 1 unless set.
    pub(crate) fn keep_up_to(self, connections: usize) -> Self {
        Inbox {
            kept: Arc::new(Kept::new(connections.max(1))),
            ..self
        }
    }

    /// A connection for a transaction: one kept from an earlier one, or one from the pool.
    pub(crate) async fn connection(&self) -> Result<InUse<DB>, sqlx::Error> {
        let kept = self.kept.lock().1.pop();
        match kept {
            Some(conn) => Ok(InUse(Some(conn))),
            None => Ok(InUse(Some(self.pool.acquire().await?))),
        }
    }

    /// Gives back the connection of a transaction that ended cleanly (committed or rolled
    /// back): kept for the next one while held and the pool can spare it, else to the pool.
    pub(crate) fn give_back(&self, mut conn: InUse<DB>) {
        let Some(conn) = conn.0.take() else { return };
        let spare = crate::sql::spares_a_connection(&self.pool);
        let released = {
            let mut slot = self.kept.lock();
            if slot.0 > 0 && spare && slot.1.len() < slot.2 {
                slot.1.push(conn);
                None
            } else {
                Some(conn)
            }
        };
        drop(released);
    }

    /// Reads the time from `clock` instead of the system clock (see [`ManualClock`]).
    ///
    /// [`ManualClock`]: crate::ManualClock
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Waits `duration` on the inbox's clock.
    pub(crate) async fn sleep(&self, duration: std::time::Duration) {
        self.clock.sleep(duration).await;
    }

    /// The current time of the inbox's clock, as stored.
    pub(crate) fn now(&self) -> DateTime<Utc> {
        clock::stored_now(&*self.clock)
    }

    /// Refuses an event older than one already applied for the same aggregate (seed 003: keep a
    /// sequence per aggregate and reject regressive updates). For consumers that set state from
    /// each event; a consumer that accumulates must see every event and leaves this off. An
    /// event without a sequence (0: a CloudEvent from another producer without the `sequence`
    /// extension) is never stale.
    pub fn reject_stale(mut self) -> Self {
        self.reject_stale = true;
        self
    }

    /// Applies an aggregate's event only after the previous sequence of that aggregate was
    /// applied: an event that arrives early is not handled and not recorded, and
    /// [`Inbox::handle`] returns [`Handled::Early`] for the caller to deliver it again later.
    /// Every event of the aggregate must pass through this inbox (record the ones without an
    /// effect with a handler that does nothing), or the sequences it sees have holes.
    /// [`Consumer`](crate::Consumer) does this by default, and waits a bounded time.
    pub fn in_order(mut self) -> Self {
        self.in_order = true;
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
        let order = self.in_order.then(OrderCheck::default);
        Ok(self.handle_guarded(envelope, order, handler).await?.handled)
    }

    /// [`Inbox::handle`], with the per-aggregate order guard when `order` is given.
    pub(crate) async fn handle_guarded<T, E>(
        &self,
        envelope: &EventEnvelope,
        order: Option<OrderCheck>,
        handler: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, E>,
    ) -> Result<Guarded<T>, InboxError<E>> {
        let mut conn = self
            .connection()
            .await
            .map_err(|source| self.database(source))?;
        let guarded = self.guarded_on(conn.get(), envelope, order, handler).await;
        if guarded.is_ok() {
            self.give_back(conn);
        } else {
            conn.release();
        }
        guarded
    }

    /// A database error on this inbox's table.
    fn database<E>(&self, source: sqlx::Error) -> InboxError<E> {
        InboxError::Database {
            table: self.table.to_string(),
            source,
        }
    }

    /// [`Inbox::handle_guarded`] on `conn`.
    async fn guarded_on<T, E>(
        &self,
        conn: &mut PoolConnection<DB>,
        envelope: &EventEnvelope,
        order: Option<OrderCheck>,
        handler: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, E>,
    ) -> Result<Guarded<T>, InboxError<E>> {
        let db = |source| self.database(source);
        let failed = match sql::begin_recording::<DB>(
            conn,
            &self.table,
            &self.consumer,
            &[envelope],
            self.now(),
        )
        .await
        {
            Ok(Some(tx)) => return self.guarded_in(tx, envelope, order, handler).await,
            Ok(None) => None,
            Err(failed) => Some(failed),
        };
        if let Some(failed) = failed {
            sql::recording_failed::<DB>(conn, failed)
                .await
                .map_err(db)?;
        }
        let mut tx = sqlx::Connection::begin(&mut **conn).await.map_err(db)?;
        let first =
            sql::insert_consumed::<DB>(&mut tx, &self.table, &self.consumer, envelope, self.now())
                .await
                .map_err(db)?;
        if !first {
            tx.rollback().await.map_err(db)?;
            return Ok(Guarded {
                handled: Handled::Duplicate,
                gap: None,
            });
        }
        self.guarded_in(tx, envelope, order, handler).await
    }

    /// The rest of [`Inbox::guarded_on`], once the event is recorded in `tx` as consumed: the
    /// guards, the handler, the commit.
    async fn guarded_in<T, E>(
        &self,
        mut tx: sqlx::Transaction<'_, DB>,
        envelope: &EventEnvelope,
        order: Option<OrderCheck>,
        handler: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, E>,
    ) -> Result<Guarded<T>, InboxError<E>> {
        let db = |source| self.database(source);
        let done = |handled| Guarded { handled, gap: None };
        let ordered = order.filter(|_| envelope.aggregate_sequence > 1);
        let mut gap = None;
        if self.reject_stale || ordered.is_some() {
            let last =
                sql::last_applied_sequence::<DB>(&mut tx, &self.table, &self.consumer, envelope)
                    .await
                    .map_err(db)?
                    .and_then(|last| u64::try_from(last).ok());
            if self.reject_stale
                && envelope.aggregate_sequence > 0
                && let Some(last) = last.filter(|&last| last > envelope.aggregate_sequence)
            {
                tx.rollback().await.map_err(db)?;
                return Ok(done(Handled::Stale { last_applied: last }));
            }
            if let Some(order) = ordered {
                let known = last.max(order.settled);
                if !in_sequence(envelope, known) {
                    if !order.accept_gap {
                        tx.rollback().await.map_err(db)?;
                        return Ok(done(Handled::Early {
                            last_applied: known,
                        }));
                    }
                    gap = Some(known);
                }
            }
        }
        let value = handler(&mut tx).await.map_err(InboxError::Handler)?;
        tx.commit().await.map_err(db)?;
        Ok(Guarded {
            handled: Handled::Applied(value),
            gap,
        })
    }
}

impl<DB: Backend> Clone for Inbox<DB> {
    fn clone(&self) -> Self {
        Inbox {
            pool: self.pool.clone(),
            consumer: self.consumer.clone(),
            table: self.table.clone(),
            reject_stale: self.reject_stale,
            in_order: self.in_order,
            clock: Arc::clone(&self.clock),
            // Each copy keeps connections of its own.
            kept: Arc::new(Kept::new(self.kept.capacity())),
        }
    }
}
