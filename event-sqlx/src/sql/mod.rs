//! Layer 2: every statement the toolkit runs, one module per table family, written once for all
//! three databases. [`dialect`] owns what differs between them.
//!
//! Only validated table names and fixed fragments are placed in SQL text (status codes are
//! formatted from [`EventStatus`], never written as numbers); every value is a bind parameter.

pub(crate) mod archive;
pub(crate) mod dialect;
pub(crate) mod inbox;
pub(crate) mod message;
pub(crate) mod operations;
pub(crate) mod outbox;
pub(crate) mod profile;

use std::future::Future;
use std::ops::{Bound, RangeBounds};

use chrono::{DateTime, Utc};

use crate::table::TableName;
use dialect::{Backend, Columns, Sql};

use crate::error::{connection_lost, rolled_back};
use crate::row::outbox::StatusCounts;
use crate::status::EventStatus;

pub(crate) const PENDING: i16 = EventStatus::Pending.code();
pub(crate) const IN_PROGRESS: i16 = EventStatus::InProgress.code();
pub(crate) const SUCCEEDED: i16 = EventStatus::Succeeded.code();
pub(crate) const FAILED: i16 = EventStatus::Failed.code();
pub(crate) const CANCELLED: i16 = EventStatus::Cancelled.code();

/// `(c1, c2, ...)`: the status codes as the list of an `IN`, written into the SQL text so that
/// PostgreSQL can match the predicate of a partial index.
pub(crate) fn codes(statuses: &[EventStatus]) -> String {
    let codes: Vec<String> = statuses.iter().map(|s| s.code().to_string()).collect();
    format!("({})", codes.join(", "))
}

/// A pooled connection handed from one statement to the next. Taking a connection from the
/// pool and giving it back cost a round trip each (sqlx checks it both ways), more than a short
/// statement; statements that follow one another use the connection the last one left.
///
/// A connection is kept only after its statement succeeded: one whose statement failed, or was
/// cancelled, goes back to the pool, which checks it, and the next statement takes a fresh one.
#[derive(Debug)]
pub(crate) struct Reused<DB: sqlx::Database>(
    std::sync::Mutex<Option<sqlx::pool::PoolConnection<DB>>>,
);

impl<DB: sqlx::Database> Reused<DB> {
    /// Starting with `conn`, if any.
    pub(crate) fn new(conn: Option<sqlx::pool::PoolConnection<DB>>) -> Self {
        Reused(std::sync::Mutex::new(conn))
    }

    /// The kept connection, or a fresh one from `pool`.
    async fn take(
        &self,
        pool: &sqlx::Pool<DB>,
    ) -> Result<sqlx::pool::PoolConnection<DB>, sqlx::Error> {
        let kept = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        match kept {
            Some(conn) => Ok(conn),
            None => pool.acquire().await,
        }
    }

    /// Keeps `conn` for the next statement (one already kept goes back to the pool).
    fn keep(&self, conn: sqlx::pool::PoolConnection<DB>) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(conn);
    }

    /// Runs `statement` on the kept connection, or a fresh one from `pool`, and keeps the
    /// connection when it succeeded.
    pub(crate) async fn run<T>(
        &self,
        pool: &sqlx::Pool<DB>,
        statement: impl AsyncFnOnce(&mut sqlx::pool::PoolConnection<DB>) -> Result<T, sqlx::Error>,
    ) -> Result<T, sqlx::Error> {
        let mut conn = self.take(pool).await?;
        let done = statement(&mut conn).await?;
        self.keep(conn);
        Ok(done)
    }

    /// The kept connection, if any.
    pub(crate) fn into_inner(self) -> Option<sqlx::pool::PoolConnection<DB>> {
        self.0
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether `pool` has a connection to spare beside those in use: an idle one, or room to open
/// one. A connection held while nothing runs on it (a busy consumer's between transactions, a
/// lingering relay's) is held only then, so that the other users of a small pool do not wait.
pub(crate) fn spares_a_connection<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> bool {
    pool.num_idle() > 0 || pool.size() < pool.options().get_max_connections()
}

/// Runs `delete`, one bounded DELETE of at most `limit` rows, on a fresh connection each time,
/// until it deletes fewer than `limit`: locks stay short however much there is to delete.
/// Returns how many rows it deleted in all.
pub(crate) async fn delete_in_batches<DB: Backend>(
    pool: &sqlx::Pool<DB>,
    limit: i64,
    mut delete: impl AsyncFnMut(&mut DB::Connection, i64) -> Result<u64, sqlx::Error>,
) -> Result<u64, sqlx::Error> {
    let limit = limit.max(1);
    let mut total = 0;
    loop {
        let mut conn = pool.acquire().await?;
        let deleted = delete(&mut conn, limit).await?;
        total += deleted;
        if deleted < u64::try_from(limit).unwrap_or(u64::MAX) {
            return Ok(total);
        }
    }
}

/// Runs `op` again, up to three times, when the database rolled it back as a deadlock victim or
/// for a serialization failure: the statement or transaction left no trace, so running it again
/// is safe. InnoDB picks such victims among relays whose claims and marks lock neighbouring index
/// entries.
pub(crate) async fn retry_rolled_back<T, F, Fut>(op: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    retry_transient(op, None).await
}

/// Runs `op` again when it failed in a way that left no trace: rolled back as a deadlock victim
/// or for a serialization failure (up to three times), or, until `deadline`, because the
/// connection dropped, was reset, timed out or was ended by the server (each try acquires a
/// fresh connection; backoff from 50 ms to 2 s). Each `op` must be one statement or one
/// transaction, so that a failed try changed nothing.
pub(crate) async fn retry_transient<T, F, Fut>(
    mut op: F,
    deadline: Option<tokio::time::Instant>,
) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let (mut victims, mut lost) = (0_u64, 0_u32);
    loop {
        match op().await {
            Err(e) if victims < 3 && rolled_back(&e) => {
                victims += 1;
                tracing::debug!(error = %e, attempt = victims, "rolled back by the database; running it again");
                tokio::time::sleep(std::time::Duration::from_millis(5 * victims)).await;
            }
            Err(e)
                if connection_lost(&e)
                    && deadline.is_some_and(|d| tokio::time::Instant::now() < d) =>
            {
                lost += 1;
                let pause = std::time::Duration::from_millis(50 << lost.min(5)).min(
                    deadline.map_or(std::time::Duration::ZERO, |d| {
                        d.saturating_duration_since(tokio::time::Instant::now())
                    }),
                );
                tracing::warn!(error = %e, attempt = lost, "lost the database connection; trying again on a fresh one");
                tokio::time::sleep(pause).await;
            }
            result => return result,
        }
    }
}

/// A table whose rows carry a status: the outbox (`publish_status`) or the message table
/// (`event_status`). The dashboards' counts read either the same way.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StatusTable<'t> {
    pub(crate) table: &'t TableName,
    pub(crate) status_column: &'static str,
}

impl<'t> StatusTable<'t> {
    /// The outbox table `table`.
    pub(crate) fn outbox(table: &'t TableName) -> Self {
        StatusTable {
            table,
            status_column: "publish_status",
        }
    }

    /// The message table `table`.
    pub(crate) fn messages(table: &'t TableName) -> Self {
        StatusTable {
            table,
            status_column: "event_status",
        }
    }
}

/// Row counts per status of `t` for rows of `event_type` (or any) created within `created`.
pub(crate) async fn status_counts<DB: Backend>(
    conn: &mut DB::Connection,
    t: StatusTable<'_>,
    event_type: Option<&str>,
    created: impl RangeBounds<DateTime<Utc>>,
) -> Result<StatusCounts, sqlx::Error> {
    let StatusTable {
        table,
        status_column,
    } = t;
    let mut q = Sql::<DB>::new(format!(
        "SELECT {status_column} AS status, COUNT(*) AS total_count FROM {table} WHERE deleted = 0"
    ));
    if let Some(event_type) = event_type {
        q.push(" AND event_type = ").bind(event_type);
    }
    match created.start_bound().cloned() {
        Bound::Included(from) => q.push(" AND create_time >= ").bind(from),
        Bound::Excluded(from) => q.push(" AND create_time > ").bind(from),
        Bound::Unbounded => &mut q,
    };
    match created.end_bound().cloned() {
        Bound::Included(to) => q.push(" AND create_time <= ").bind(to),
        Bound::Excluded(to) => q.push(" AND create_time < ").bind(to),
        Bound::Unbounded => &mut q,
    };
    q.push(format!(
        " GROUP BY {status_column} ORDER BY {status_column} ASC"
    ));
    let mut counts = StatusCounts::default();
    for row in q.fetch(conn).await? {
        let c = Columns::<DB>(&row);
        counts.add(c.status("status")?, c.i64("total_count")?);
    }
    Ok(counts)
}
