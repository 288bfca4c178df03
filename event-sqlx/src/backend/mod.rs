//! Everything that touches SQL. One trait, [`Backend`], implemented for each database by one
//! macro, so that every statement is written once with concrete sqlx types; where the databases
//! differ (claiming, and detecting duplicates on insert) the [`Dialect`] says which SQL to use.
//!
//! Only validated [`TableName`]s and fixed fragments are ever placed in SQL text; every value is a
//! bind parameter.

use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::Pool;

use crate::record::{NewOutboxRow, OutboxRecord};
use crate::{EventStatus, TableName};

#[macro_use]
mod imp;
pub(crate) mod message;

/// The SQL dialect of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MySQL 8 / MariaDB 10.11.
    MySql,
    /// SQLite.
    Sqlite,
}

/// A claim of a batch under a lease.
#[derive(Debug, Clone)]
#[doc(hidden)]
#[allow(unreachable_pub)] // unnameable outside: `backend` is private
pub struct Claim<'a> {
    pub(crate) relay_id: &'a str,
    pub(crate) now: DateTime<Utc>,
    pub(crate) lease_until: DateTime<Utc>,
    pub(crate) limit: i64,
    pub(crate) ordered: bool,
}

/// A failed publish to record.
#[derive(Debug, Clone)]
#[doc(hidden)]
#[allow(unreachable_pub)] // unnameable outside: `backend` is private
pub struct Failure {
    pub(crate) id: i64,
    pub(crate) next_retry_time: DateTime<Utc>,
    pub(crate) reason: String,
}

/// The read queries of the seed's Outbox model.
#[derive(Debug, Clone)]
#[doc(hidden)]
#[allow(unreachable_pub)] // unnameable outside: `backend` is private
pub enum Select<'a> {
    Pending {
        limit: i64,
    },
    DueRetries {
        now: DateTime<Utc>,
        limit: i64,
    },
    LeaseExpired {
        now: DateTime<Utc>,
        limit: i64,
    },
    ByAggregate {
        aggregate_type: &'a str,
        aggregate_id: &'a str,
    },
    ByEventNo {
        event_no: &'a str,
    },
    FailedByTopic {
        topic: &'a str,
        limit: i64,
    },
    ManyFailures {
        min_retries: i32,
        limit: i64,
    },
    /// The earliest unpublished, unclaimed event of an aggregate (its head).
    Head {
        aggregate_type: &'a str,
        aggregate_id: &'a str,
    },
    /// Published events matching a replay filter, by id after `after_id`.
    Published {
        aggregate: Option<(&'a str, &'a str)>,
        event_type: Option<&'a str>,
        from: Option<DateTime<Utc>>,
        to: Option<DateTime<Utc>>,
        after_id: i64,
        limit: i64,
    },
}

/// A database the outbox runs on: PostgreSQL, MySQL/MariaDB or SQLite.
///
/// Sealed: the SQL of each backend lives in this crate.
pub trait Backend: sqlx::Database + sealed::Sealed {
    /// The dialect.
    const DIALECT: Dialect;

    #[doc(hidden)]
    fn migrate<'a>(
        pool: &'a Pool<Self>,
    ) -> impl Future<Output = Result<(), sqlx::migrate::MigrateError>> + Send + 'a;

    #[doc(hidden)]
    fn insert_outbox<'a>(
        conn: &'a mut Self::Connection,
        table: &'a TableName,
        rows: &'a [NewOutboxRow],
    ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn aggregate_version<'a>(
        conn: &'a mut Self::Connection,
        table: &'a TableName,
        aggregate_type: &'a str,
        aggregate_id: &'a str,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn claim<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        claim: &'a Claim<'a>,
    ) -> impl Future<Output = Result<Vec<OutboxRecord>, sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn mark_published<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        relay_id: &'a str,
        ids: &'a [i64],
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn mark_failed<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        relay_id: &'a str,
        failures: &'a [Failure],
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn cancel_exhausted<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        ids: &'a [i64],
        reason: &'a str,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn recover_expired<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        now: DateTime<Utc>,
        retry_at: DateTime<Utc>,
        reason: &'a str,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn select<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        select: &'a Select<'a>,
    ) -> impl Future<Output = Result<Vec<OutboxRecord>, sqlx::Error>> + Send + 'a;

    /// Row counts per status; `status_column` is `publish_status` or `event_status`.
    #[doc(hidden)]
    fn status_counts<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        status_column: &'static str,
        event_type: Option<&'a str>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> impl Future<Output = Result<Vec<(EventStatus, i64)>, sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn cancel<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        id: i64,
        reason: &'a str,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Records `(consumer, event_id)` in the inbox table on `conn`; false when it was there.
    #[doc(hidden)]
    fn insert_consumed<'a>(
        conn: &'a mut Self::Connection,
        table: &'a TableName,
        consumer: &'a str,
        envelope: &'a event_core::EventEnvelope,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// PostgreSQL: `pg_notify(channel)` in the transaction on `conn`, delivered on commit.
    /// Elsewhere nothing.
    #[doc(hidden)]
    fn notify_commit<'a>(
        conn: &'a mut Self::Connection,
        channel: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// The highest aggregate sequence `consumer` applied for an aggregate, other than `except`.
    #[doc(hidden)]
    fn last_applied_sequence<'a>(
        conn: &'a mut Self::Connection,
        table: &'a TableName,
        consumer: &'a str,
        envelope: &'a event_core::EventEnvelope,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn quarantine_upsert<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        entry: &'a crate::consumer::NewQuarantine,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn quarantine_select<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        consumer: &'a str,
        status: i16,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<crate::consumer::QuarantineRecord>, sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn quarantine_mark_replayed<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        id: i64,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn prune_consumed<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        older_than: DateTime<Utc>,
        limit: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn retry<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        id: i64,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;
}

mod sealed {
    pub trait Sealed {}
}

/// Every column, in the order rows are decoded.
pub(crate) const COLUMNS: &str = "id, event_no, aggregate_type, aggregate_id, aggregate_sequence, \
    event_type, event_version, event_source, publish_channel, topic, routing_key, event_payload, \
    event_headers, publish_status, retry_count, max_retry_count, next_retry_time, locked_by, \
    lock_until, last_publish_time, published_time, fail_reason, trace_id, remark, version, \
    create_time, update_time";

/// The columns a flush writes.
pub(crate) const INSERT_COLUMNS: &str = "event_no, aggregate_type, aggregate_id, \
    aggregate_sequence, event_type, event_version, event_source, publish_channel, topic, \
    routing_key, event_payload, event_headers, publish_status, retry_count, max_retry_count, \
    trace_id, create_time, update_time";

/// Statements are kept well under every backend's bind-parameter limit (SQLite: 32766).
pub(crate) const ROWS_PER_INSERT: usize = 500;

/// Appends `(v1, v2, ...)`, every value bound: the list of an `IN`.
pub(crate) fn push_list<'t, DB, T>(
    q: &mut sqlx::QueryBuilder<DB>,
    values: impl IntoIterator<Item = T>,
) where
    DB: sqlx::Database,
    T: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
{
    q.push("(");
    let mut list = q.separated(", ");
    for value in values {
        list.push_bind(value);
    }
    q.push(")");
}

/// Runs `op` again, up to three times, when the database rolled it back as a deadlock victim or
/// for a serialization failure (SQLSTATE 40001 or 40P01): the statement or transaction left no
/// trace, so running it again is safe. InnoDB picks such victims among relays whose claims and
/// marks lock neighbouring index entries.
pub(crate) async fn retry_rolled_back<T, F, Fut>(mut op: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut attempt: u64 = 0;
    loop {
        match op().await {
            Err(e) if attempt < 3 && rolled_back(&e) => {
                attempt += 1;
                tracing::debug!(error = %e, attempt, "rolled back by the database; running it again");
                tokio::time::sleep(std::time::Duration::from_millis(5 * attempt)).await;
            }
            result => return result,
        }
    }
}

fn rolled_back(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "40001" || code == "40P01")
}

/// The ORDER BY of a claim, in the order of an index so that the scan stops after `limit` rows
/// instead of sorting the backlog or walking the published history: the partial index
/// `outbox_idx_claimable (id)` on PostgreSQL; `idx_status_retry_time`, whose entries end with the
/// row id, on MySQL and SQLite. SQLite's planner, without statistics, would otherwise sort every
/// pending row, and with statistics taken on a fresh backlog, scan the published rows by id.
pub(crate) fn claim_order(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => " ORDER BY o.id",
        Dialect::MySql | Dialect::Sqlite => {
            " ORDER BY o.publish_status, o.next_retry_time, o.retry_count, o.id"
        }
    }
}

/// What makes a row claimable (`o` is the row): pending, or failed with retries left; and due.
/// The first two terms are the predicate of the partial index `outbox_idx_claimable`.
pub(crate) const CLAIMABLE: &str = "o.publish_status IN (0, 3) AND o.deleted = 0 \
    AND (o.publish_status = 0 OR o.retry_count < o.max_retry_count)";

/// Per-aggregate order: no earlier event of the same aggregate is still unpublished.
pub(crate) const NO_EARLIER_UNPUBLISHED: &str = " AND NOT EXISTS (SELECT 1 FROM {t} p \
    WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id \
    AND p.aggregate_sequence < o.aggregate_sequence AND p.publish_status IN (0, 1, 3) \
    AND p.deleted = 0)";

#[cfg(feature = "postgres")]
impl_backend!(
    postgres,
    sqlx::Postgres,
    Dialect::Postgres,
    id = i64,
    status = i16,
    "../migrations/postgres"
);
#[cfg(feature = "mysql")]
impl_backend!(
    mysql,
    sqlx::MySql,
    Dialect::MySql,
    id = u64,
    status = i64,
    "../migrations/mysql"
);
#[cfg(feature = "sqlite")]
impl_backend!(
    sqlite,
    sqlx::Sqlite,
    Dialect::Sqlite,
    id = i64,
    status = i64,
    "../migrations/sqlite"
);
