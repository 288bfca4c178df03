//! Every consumer's quarantine (`quarantined_event`), for operators: list, show, requeue for the
//! running consumer, cancel, count, prune. No handler code: replaying is the consumer's job
//! ([`Consumer::replay_requeued`](crate::Consumer::replay_requeued)).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::Pool;
use sqlx::pool::PoolConnection;

use crate::clock::{self, Clock, SharedClock};
use crate::error::Error;
use crate::row::quarantine::{QuarantineFilter, QuarantineRecord};
use crate::sql::dialect::Backend;
use crate::sql::inbox::{self as sql, Selection};
use crate::status::QuarantineStatus;
use crate::table::TableName;

/// How many entries one consumer has in one status.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct QuarantineCount {
    /// The consumer.
    pub consumer: String,
    /// The status.
    pub status: QuarantineStatus,
    /// How many entries.
    pub entries: i64,
}

/// The quarantine table of every consumer on one database.
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), event_sqlx::Error> {
/// use event_sqlx::{Quarantine, QuarantineFilter};
///
/// let quarantine = Quarantine::new(pool);
/// // After the fix is deployed: the running `billing` consumer replays these on its next loop.
/// let requeued = quarantine
///     .requeue("billing", &QuarantineFilter::default().event_type("ORDER_PAID"))
///     .await?;
/// # let _ = requeued;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Quarantine<DB: Backend> {
    pool: Pool<DB>,
    table: TableName,
    clock: SharedClock,
}

impl<DB: Backend> Clone for Quarantine<DB> {
    fn clone(&self) -> Self {
        Quarantine {
            pool: self.pool.clone(),
            table: self.table.clone(),
            clock: Arc::clone(&self.clock),
        }
    }
}

impl<DB: Backend> Quarantine<DB> {
    /// The seed's `quarantined_event` over `pool`.
    pub fn new(pool: Pool<DB>) -> Quarantine<DB> {
        Quarantine {
            pool,
            table: TableName::new("quarantined_event").unwrap_or_else(|_| unreachable!()),
            clock: clock::system(),
        }
    }

    /// Uses another table with the same columns.
    pub fn table(mut self, table: TableName) -> Self {
        self.table = table;
        self
    }

    /// Reads the time from `clock` instead of the system clock (see [`ManualClock`]).
    ///
    /// [`ManualClock`]: crate::ManualClock
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    fn now(&self) -> DateTime<Utc> {
        clock::stored_now(&*self.clock)
    }

    async fn conn(&self) -> Result<PoolConnection<DB>, Error> {
        self.pool
            .acquire()
            .await
            .map_err(|e| Error::database(&self.table, e))
    }

    /// Entries of `consumer` (or every consumer) in `status` (or any) that `filter` selects,
    /// by id after `after_id` (0 for the first page), at most `limit`: pass the last id of a
    /// page to read the next.
    pub async fn entries(
        &self,
        consumer: Option<&str>,
        status: Option<QuarantineStatus>,
        filter: &QuarantineFilter<'_>,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<QuarantineRecord>, Error> {
        let selection = Selection {
            consumer,
            status,
            filter: *filter,
        };
        let mut conn = self.conn().await?;
        sql::select_quarantined::<DB>(
            &mut conn,
            &self.table,
            &selection,
            after_id,
            i64::from(limit),
        )
        .await
        .map_err(|e| Error::database(&self.table, e))
    }

    /// One entry by its id.
    pub async fn entry(&self, id: i64) -> Result<Option<QuarantineRecord>, Error> {
        let mut conn = self.conn().await?;
        sql::quarantine_entry::<DB>(&mut conn, &self.table, id)
            .await
            .map_err(|e| Error::database(&self.table, e))
    }

    /// Marks the quarantined entries of `consumer` that `filter` selects as requeued: the
    /// running consumer replays them with its own handlers on its next loop, and marks each
    /// replayed, or quarantined again if it still fails. Returns how many were requeued.
    pub async fn requeue(
        &self,
        consumer: &str,
        filter: &QuarantineFilter<'_>,
    ) -> Result<u64, Error> {
        let selection = Selection {
            consumer: Some(consumer),
            status: None,
            filter: *filter,
        };
        let mut conn = self.conn().await?;
        sql::requeue::<DB>(&mut conn, &self.table, &selection)
            .await
            .map_err(|e| Error::database(&self.table, e))
    }

    /// Cancels a quarantined or requeued entry: it is never replayed. `reason` replaces the
    /// stored failure reason (keep the old one in it when it matters). False when the entry
    /// does not exist or was already replayed or cancelled.
    pub async fn cancel(&self, id: i64, reason: &str) -> Result<bool, Error> {
        let reason: String = reason.chars().take(1000).collect();
        let mut conn = self.conn().await?;
        let changed =
            sql::cancel_quarantined::<DB>(&mut conn, &self.table, id, &reason, self.now())
                .await
                .map_err(|e| Error::database(&self.table, e))?;
        Ok(changed == 1)
    }

    /// Entries per consumer and status.
    pub async fn counts(&self) -> Result<Vec<QuarantineCount>, Error> {
        let mut conn = self.conn().await?;
        let rows = sql::quarantine_counts::<DB>(&mut conn, &self.table)
            .await
            .map_err(|e| Error::database(&self.table, e))?;
        Ok(rows
            .into_iter()
            .map(|(consumer, status, entries)| QuarantineCount {
                consumer,
                status,
                entries,
            })
            .collect())
    }

    /// Deletes replayed and cancelled entries settled more than `older_than` ago, in batches of
    /// `batch`, and returns how many. Entries still quarantined or requeued are never deleted.
    pub async fn prune(&self, older_than: std::time::Duration, batch: u32) -> Result<u64, Error> {
        let before = clock::before(self.now(), older_than);
        let table = &self.table;
        crate::sql::delete_in_batches(&self.pool, i64::from(batch), async |conn, limit| {
            sql::prune_quarantine::<DB>(conn, table, before, limit).await
        })
        .await
        .map_err(|e| Error::database(table, e))
    }
}
