//! The statements of the outbox table (`biz_outbox_event`): the flush, the relay's claim and
//! marks, and the seed's queries.

use chrono::{DateTime, Utc};

use crate::row::outbox::{Lease, OutboxRecord};
use crate::sql::dialect::{Backend, Columns, Dialect, Sql};
use crate::sql::{CANCELLED, FAILED, IN_PROGRESS, PENDING, SUCCEEDED, codes};
use crate::status::EventStatus::{Failed, Pending};
use crate::table::TableName;

mod insert;
mod relay;

pub(crate) use insert::*;
pub(crate) use relay::*;

/// Every column, in the order rows are decoded.
pub(crate) const COLUMNS: &str = "id, event_no, aggregate_type, aggregate_id, aggregate_sequence, \
    event_type, event_version, event_source, publish_channel, topic, routing_key, event_payload, \
    event_headers, publish_status, retry_count, max_retry_count, next_retry_time, locked_by, \
    lock_until, last_publish_time, published_time, fail_reason, trace_id, remark, version, \
    create_time, update_time";

/// The read queries of the seed's Outbox model.
#[derive(Debug, Clone)]
pub(crate) enum Select<'a> {
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
    /// These rows, whatever their state.
    ByIds {
        ids: &'a [i64],
    },
    Published {
        aggregate: Option<(&'a str, &'a str)>,
        event_type: Option<&'a str>,
        from: Option<DateTime<Utc>>,
        to: Option<DateTime<Utc>>,
        after_id: i64,
        limit: i64,
    },
}

pub(crate) fn decode<DB: Backend>(row: &DB::Row) -> Result<OutboxRecord, sqlx::Error> {
    let c = Columns::<DB>(row);
    Ok(OutboxRecord {
        id: c.id("id")?,
        event_no: c.string("event_no")?,
        aggregate_type: c.string("aggregate_type")?,
        aggregate_id: c.string("aggregate_id")?,
        aggregate_sequence: c.i64("aggregate_sequence")?,
        event_type: c.string("event_type")?,
        event_version: c.i32("event_version")?,
        event_source: c.string("event_source")?,
        publish_channel: c.string("publish_channel")?,
        topic: c.opt_string("topic")?,
        routing_key: c.opt_string("routing_key")?,
        event_payload: c.json("event_payload")?,
        event_headers: c.opt_json("event_headers")?,
        publish_status: c.status("publish_status")?,
        retry_count: c.i32("retry_count")?,
        max_retry_count: c.i32("max_retry_count")?,
        next_retry_time: c.opt_time("next_retry_time")?,
        locked_by: c.opt_string("locked_by")?,
        lock_until: c.opt_time("lock_until")?,
        last_publish_time: c.opt_time("last_publish_time")?,
        published_time: c.opt_time("published_time")?,
        fail_reason: c.opt_string("fail_reason")?,
        trace_id: c.opt_string("trace_id")?,
        remark: c.opt_string("remark")?,
        version: c.i32("version")?,
        create_time: c.time("create_time")?,
        update_time: c.time("update_time")?,
    })
}

fn decode_all<DB: Backend>(rows: &[DB::Row]) -> Result<Vec<OutboxRecord>, sqlx::Error> {
    rows.iter().map(decode::<DB>).collect()
}

/// Pending or failed -> cancelled, for one row.
pub(crate) async fn cancel<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    id: i64,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "UPDATE {table} SET publish_status = {CANCELLED}, fail_reason = "
    ));
    q.bind(reason)
        .push(", locked_by = NULL, lock_until = NULL, update_time = ")
        .bind(now)
        .push(" WHERE id = ")
        .bind(id)
        .push(format!(
            " AND deleted = 0 AND publish_status IN {}",
            codes(&[Pending, Failed])
        ));
    q.execute(conn).await
}

/// Failed -> pending: one more round of attempts, due now.
pub(crate) async fn retry<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    id: i64,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "UPDATE {table} SET publish_status = {PENDING}, next_retry_time = NULL, update_time = "
    ));
    q.bind(now)
        .push(" WHERE id = ")
        .bind(id)
        .push(format!(" AND deleted = 0 AND publish_status = {FAILED}"));
    q.execute(conn).await
}

/// One of the seed's read queries.
pub(crate) async fn select<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    select: &Select<'_>,
) -> Result<Vec<OutboxRecord>, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "SELECT {COLUMNS} FROM {table} WHERE deleted = 0 AND "
    ));
    match *select {
        Select::Pending { limit } => {
            q.push(format!(
                "publish_status = {PENDING} ORDER BY create_time ASC, id ASC LIMIT "
            ))
            .bind(limit);
        }
        Select::DueRetries { now, limit } => {
            q.push(format!(
                "publish_status = {FAILED} AND retry_count < max_retry_count AND next_retry_time <= "
            ))
            .bind(now)
            .push(" ORDER BY next_retry_time ASC LIMIT ")
            .bind(limit);
        }
        Select::LeaseExpired { now, limit } => {
            q.push(format!("publish_status = {IN_PROGRESS} AND lock_until <= "))
                .bind(now)
                .push(" ORDER BY lock_until ASC LIMIT ")
                .bind(limit);
        }
        Select::ByAggregate {
            aggregate_type,
            aggregate_id,
        } => {
            q.push("aggregate_type = ")
                .bind(aggregate_type)
                .push(" AND aggregate_id = ")
                .bind(aggregate_id)
                .push(" ORDER BY aggregate_sequence ASC");
        }
        Select::ByEventNo { event_no } => {
            // Cancelled and deleted rows are found by number too: an operator looks them up.
            q = Sql::new(format!("SELECT {COLUMNS} FROM {table} WHERE event_no = "));
            q.bind(event_no);
        }
        Select::ByIds { ids } => {
            q = Sql::new(format!("SELECT {COLUMNS} FROM {table} WHERE id IN "));
            q.list(ids.iter().copied()).push(" ORDER BY id ASC");
        }
        Select::FailedByTopic { topic, limit } => {
            q.push("topic = ")
                .bind(topic)
                .push(format!(
                    " AND publish_status = {FAILED} ORDER BY update_time DESC LIMIT "
                ))
                .bind(limit);
        }
        Select::ManyFailures { min_retries, limit } => {
            q.push(format!("publish_status = {FAILED} AND retry_count >= "))
                .bind(min_retries)
                .push(" ORDER BY update_time DESC LIMIT ")
                .bind(limit);
        }
        Select::Published {
            aggregate,
            event_type,
            from,
            to,
            after_id,
            limit,
        } => {
            q.push(format!("publish_status = {SUCCEEDED} AND id > "))
                .bind(after_id);
            if let Some((aggregate_type, aggregate_id)) = aggregate {
                q.push(" AND aggregate_type = ")
                    .bind(aggregate_type)
                    .push(" AND aggregate_id = ")
                    .bind(aggregate_id);
            }
            if let Some(event_type) = event_type {
                q.push(" AND event_type = ").bind(event_type);
            }
            if let Some(from) = from {
                q.push(" AND create_time >= ").bind(from);
            }
            if let Some(to) = to {
                q.push(" AND create_time < ").bind(to);
            }
            q.push(" ORDER BY id ASC LIMIT ").bind(limit);
        }
        Select::Head {
            aggregate_type,
            aggregate_id,
        } => {
            q.push(format!(
                "publish_status IN {} AND aggregate_type = ",
                codes(&[Pending, Failed])
            ))
            .bind(aggregate_type)
            .push(" AND aggregate_id = ")
            .bind(aggregate_id)
            .push(" ORDER BY aggregate_sequence ASC LIMIT 1");
        }
    }
    decode_all::<DB>(&q.fetch(conn).await?)
}

/// The leases held, per relay.
pub(crate) async fn leases<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
) -> Result<Vec<Lease>, sqlx::Error> {
    let q = Sql::<DB>::new(format!(
        "SELECT COALESCE(locked_by, '') AS relay, COUNT(*) AS events, \
         MIN(lock_until) AS earliest, MAX(lock_until) AS latest FROM {table} \
         WHERE deleted = 0 AND publish_status = {IN_PROGRESS} \
         GROUP BY COALESCE(locked_by, '') ORDER BY relay"
    ));
    let mut leases = Vec::new();
    for row in q.fetch(conn).await? {
        let c = Columns::<DB>(&row);
        let (Some(earliest), Some(latest)) = (c.opt_time("earliest")?, c.opt_time("latest")?)
        else {
            continue;
        };
        leases.push(Lease {
            relay: c.string("relay")?,
            events: c.i64("events")?,
            earliest_expiry: earliest,
            latest_expiry: latest,
        });
    }
    Ok(leases)
}

/// Refreshes the planner's statistics of `table` (see [`Dialect::analyze`]).
pub(crate) async fn analyze<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
) -> Result<(), sqlx::Error> {
    if let Some(statement) = DB::DIALECT.analyze(table.as_str()) {
        Sql::<DB>::new(statement).fetch(conn).await?;
    }
    Ok(())
}

/// Whether `table`'s statistics are missing or stale (see [`Dialect::stale_statistics`]): never
/// taken, or taken when the table was less than half its size (and 16 pages smaller), as
/// before a bulk load or while a new outbox fills. The table's size on disk is read as it is;
/// the server's count of changed rows lags up to a second behind their commit, and on a busy
/// outbox it passes any threshold every few seconds, which would have every relay take the
/// statistics again and again. The claim's per-aggregate check does not depend on them (see
/// [`Dialect::per_row_subquery`]); the plan PostgreSQL keeps for a prepared claim or mark does
/// (made once for all values, it is made again only when the statistics change), and so do the
/// console's and the operators' queries.
pub(crate) async fn stale_statistics<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
) -> Result<bool, sqlx::Error> {
    let Some((before, after)) = DB::DIALECT.stale_statistics() else {
        return Ok(false);
    };
    let mut q = Sql::<DB>::new(before);
    q.bind(table.as_str()).push(after);
    Ok(!q.fetch(conn).await?.is_empty())
}

/// How a claim can check each aggregate's order on `table`'s indexes: on PostgreSQL (see
/// [`ordered_claim_postgres`]) and MySQL (below); SQLite has the migrations' partial index.
pub(crate) async fn ordered_claim<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
) -> Result<AggregateOrder, sqlx::Error> {
    match DB::DIALECT {
        Dialect::Postgres => ordered_claim_postgres::<DB>(conn, table).await,
        Dialect::MySql => ordered_claim_mysql::<DB>(conn, table).await,
        Dialect::Sqlite => Ok(AggregateOrder::OneProbe),
    }
}

/// PostgreSQL: [`AggregateOrder::OneProbe`] when a partial index leads with `(aggregate_type,
/// aggregate_id, aggregate_sequence)`, as the migrations' `outbox_idx_unpublished_aggregate`
/// does; otherwise [`AggregateOrder::NearestEarlier`] when a unique key does, as
/// `outbox_uk_aggregate_sequence` does (the lean profile keeps only that one);
/// [`AggregateOrder::OneProbe`] otherwise. Read from `pg_index`.
async fn ordered_claim_postgres<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
) -> Result<AggregateOrder, sqlx::Error> {
    let mut q = Sql::<DB>::new(
        "SELECT CAST(CASE WHEN i.indpred IS NULL THEN 0 ELSE 1 END AS BIGINT) AS is_partial, \
         CAST(CASE WHEN i.indisunique THEN 1 ELSE 0 END AS BIGINT) AS is_unique \
         FROM pg_index i WHERE i.indrelid = to_regclass(",
    );
    q.bind(table.as_str()).push(
        ") AND pg_get_indexdef(i.indexrelid, 1, true) = 'aggregate_type' \
         AND pg_get_indexdef(i.indexrelid, 2, true) = 'aggregate_id' \
         AND pg_get_indexdef(i.indexrelid, 3, true) = 'aggregate_sequence'",
    );
    let mut order = AggregateOrder::OneProbe;
    for row in q.fetch(conn).await? {
        let columns = Columns::<DB>(&row);
        if columns.i64("is_partial")? == 1 {
            return Ok(AggregateOrder::OneProbe);
        }
        if columns.i64("is_unique")? == 1 {
            order = AggregateOrder::NearestEarlier;
        }
    }
    Ok(order)
}

/// MySQL: how a claim can check each aggregate's order on `table`'s indexes.
/// [`AggregateOrder::ProbePerStatus`] when an index leads with `(aggregate_type, aggregate_id,
/// publish_status)`, the three columns a per-status probe looks up by;
/// [`AggregateOrder::PreviousEvent`] when `uk_aggregate_sequence` is there as the
/// migrations create it, on `(aggregate_type, aggregate_id, aggregate_sequence)`;
/// [`AggregateOrder::OneProbe`] otherwise. Read from `information_schema`, in the table's schema
/// or the connection's database.
async fn ordered_claim_mysql<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
) -> Result<AggregateOrder, sqlx::Error> {
    let mut q = Sql::<DB>::new(
        "SELECT index_name AS name, \
         CAST(SUM(seq_in_index = 3 AND column_name = 'publish_status') AS SIGNED) AS by_status \
         FROM information_schema.statistics WHERE table_schema = ",
    );
    match table.as_str().split_once('.') {
        Some((schema, name)) => q.bind(schema).push(" AND table_name = ").bind(name),
        None => q.push("DATABASE() AND table_name = ").bind(table.as_str()),
    };
    q.push(
        " GROUP BY index_name \
         HAVING SUM(seq_in_index = 1 AND column_name = 'aggregate_type') = 1 \
         AND SUM(seq_in_index = 2 AND column_name = 'aggregate_id') = 1 \
         AND (SUM(seq_in_index = 3 AND column_name = 'publish_status') = 1 \
         OR (index_name = ",
    )
    .bind(SEQUENCE_KEY)
    .push(" AND SUM(seq_in_index = 3 AND column_name = 'aggregate_sequence') = 1))");
    let mut order = AggregateOrder::OneProbe;
    for row in q.fetch(conn).await? {
        if Columns::<DB>(&row).i64("by_status")? > 0 {
            return Ok(AggregateOrder::ProbePerStatus);
        }
        order = AggregateOrder::PreviousEvent;
    }
    Ok(order)
}

/// MySQL: whether a claim's transaction may run at `READ COMMITTED` on this connection's
/// server (see `Dialect::begin_without_gap_locks`): unless the server writes its binary log as
/// statements (`log_bin` on, `binlog_format = STATEMENT`), where InnoDB refuses to write rows at
/// that level and the claim keeps the server's default.
pub(crate) async fn claims_without_gap_locks<DB: Backend>(
    conn: &mut DB::Connection,
) -> Result<bool, sqlx::Error> {
    let q = Sql::<DB>::new(
        "SELECT CAST(@@log_bin = 1 AND UPPER(@@binlog_format) = 'STATEMENT' AS SIGNED) AS statements",
    );
    match q.fetch(conn).await?.first() {
        Some(row) => Ok(Columns::<DB>(row).i64("statements")? == 0),
        None => Ok(false),
    }
}

/// The rows the health of the outbox is read from: pending, failed and expired-lease counts, each
/// answered from the status indexes, and the oldest pending row's creation time.
pub(crate) async fn health<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    now: DateTime<Utc>,
) -> Result<(i64, i64, i64, Option<DateTime<Utc>>), sqlx::Error> {
    let mut counts = [0_i64; 2];
    for (slot, status) in [(0, PENDING), (1, FAILED)] {
        let q = Sql::<DB>::new(format!(
            "SELECT COUNT(*) AS n FROM {table} WHERE publish_status = {status} AND deleted = 0"
        ));
        if let Some(row) = q.fetch(conn).await?.first() {
            counts[slot] = Columns::<DB>(row).i64("n")?;
        }
    }
    let mut q = Sql::<DB>::new(format!(
        "SELECT COUNT(*) AS n FROM {table} WHERE publish_status = {IN_PROGRESS} AND deleted = 0 \
         AND lock_until <= "
    ));
    q.bind(now);
    let expired = match q.fetch(conn).await?.first() {
        Some(row) => Columns::<DB>(row).i64("n")?,
        None => 0,
    };
    let q = Sql::<DB>::new(format!(
        "SELECT MIN(create_time) AS oldest FROM {table} WHERE publish_status = {PENDING} \
         AND deleted = 0"
    ));
    let oldest = match q.fetch(conn).await?.first() {
        Some(row) => Columns::<DB>(row).opt_time("oldest")?,
        None => None,
    };
    Ok((counts[0], counts[1], expired, oldest))
}

/// A published event as reconciliation reads it: the key columns, not the payload.
#[derive(Debug, Clone)]
pub(crate) struct PublishedKey {
    pub(crate) id: i64,
    pub(crate) event_no: String,
    pub(crate) event_type: String,
    pub(crate) published_time: Option<DateTime<Utc>>,
}

/// A keyset page of published events created in `[from, to)`, of `event_types` when not
/// empty, by id after `after_id`.
pub(crate) async fn published_keys<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    event_types: &[String],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    after_id: i64,
    limit: i64,
) -> Result<Vec<PublishedKey>, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "SELECT id, event_no, event_type, published_time FROM {table} \
         WHERE publish_status = {SUCCEEDED} AND id > "
    ));
    q.bind(after_id)
        .push(" AND create_time >= ")
        .bind(from)
        .push(" AND create_time < ")
        .bind(to);
    if !event_types.is_empty() {
        q.push(" AND event_type IN ")
            .list(event_types.iter().map(String::as_str));
    }
    q.push(" ORDER BY id ASC LIMIT ").bind(limit);
    q.fetch(conn)
        .await?
        .iter()
        .map(|row| {
            let c = Columns::<DB>(row);
            Ok(PublishedKey {
                id: c.id("id")?,
                event_no: c.string("event_no")?,
                event_type: c.string("event_type")?,
                published_time: c.opt_time("published_time")?,
            })
        })
        .collect()
}
