//! The statements of a consumer's tables: the inbox (`consumed_event`) and the quarantine
//! (`quarantined_event`).

use chrono::{DateTime, Utc};
use event_core::EventEnvelope;

use super::dialect::{Backend, Columns, Dialect, Merge, Sql, Value};
use crate::row::quarantine::{NewQuarantine, QuarantineFilter, QuarantineRecord};
use crate::status::{FailureClass, QuarantineStatus};
use crate::table::TableName;

const QUARANTINED: i16 = QuarantineStatus::Quarantined.code();
const REQUEUED: i16 = QuarantineStatus::Requeued.code();
const REPLAYED: i16 = QuarantineStatus::Replayed.code();
const CANCELLED: i16 = QuarantineStatus::Cancelled.code();

/// `INSERT INTO <inbox> (...) VALUES `, for rows pushed by [`push_consumed_row`].
fn insert_consumed_head(table: &TableName) -> String {
    format!(
        "INSERT INTO {table} (consumer, event_id, consumed_time, aggregate_type, aggregate_id, \
         aggregate_sequence) VALUES "
    )
}

/// One inbox row's values, in [`insert_consumed_head`]'s column order: consumer, event id, now,
/// aggregate type, id, sequence.
fn consumed_values<'a>(
    consumer: &'a str,
    envelope: &'a EventEnvelope,
    now: DateTime<Utc>,
) -> [Value<'a>; 6] {
    [
        Value::Str(consumer),
        Value::Str(envelope.event_id.as_str()),
        Value::Time(now),
        Value::Str(&envelope.aggregate_type),
        Value::Str(&envelope.aggregate_id),
        Value::I64(i64::try_from(envelope.aggregate_sequence).unwrap_or(i64::MAX)),
    ]
}

/// `(consumer, event id, now, aggregate type, id, sequence)`: one inbox row, its values bound.
fn push_consumed_row<DB: Backend>(
    q: &mut Sql<DB>,
    consumer: &str,
    envelope: &EventEnvelope,
    now: DateTime<Utc>,
) {
    q.push("(");
    for (k, value) in consumed_values(consumer, envelope, now)
        .into_iter()
        .enumerate()
    {
        if k > 0 {
            q.push(", ");
        }
        q.bind(value);
    }
    q.push(")");
}

/// Records `(consumer, event_id)` on `conn`; false when it was there (seed 003's inbox write;
/// never `INSERT IGNORE`, which also swallows other errors). The caller rolls a duplicate back.
pub(crate) async fn insert_consumed<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    consumer: &str,
    envelope: &EventEnvelope,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let mut q = Sql::<DB>::new(insert_consumed_head(table));
    push_consumed_row(&mut q, consumer, envelope, now);
    q.push(
        DB::DIALECT.insert_ignoring_duplicate("consumer, event_id", "deliveries = deliveries + 1"),
    );
    Ok(q.execute(conn).await? == 1)
}

/// Records every envelope of a batch as consumed by `consumer` in one statement and returns
/// the event ids that were new; the others had been consumed before. The ids must be distinct.
///
/// PostgreSQL and SQLite: one multi-row `INSERT ... ON CONFLICT DO NOTHING RETURNING event_id`.
/// MySQL has no `RETURNING`: the consumed ones are read with `FOR UPDATE` (which also locks the
/// gaps of the missing ones), then the new ones inserted; a concurrent consumer of the same name
/// that inserted one in between makes the insert fail, and the caller falls back to one event at
/// a time.
pub(crate) async fn insert_consumed_batch<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    consumer: &str,
    envelopes: &[&EventEnvelope],
    now: DateTime<Utc>,
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    let mut new: Vec<&EventEnvelope> = envelopes.to_vec();
    if DB::DIALECT == Dialect::MySql {
        let ids: Vec<&str> = envelopes.iter().map(|e| e.event_id.as_str()).collect();
        let consumed: std::collections::HashSet<String> =
            select_consumed::<DB>(conn, table, consumer, &ids, " FOR UPDATE")
                .await?
                .into_iter()
                .collect();
        new.retain(|e| !consumed.contains(e.event_id.as_str()));
        if new.is_empty() {
            return Ok(std::collections::HashSet::new());
        }
    }
    let mut q = Sql::<DB>::new(insert_consumed_head(table));
    for (i, envelope) in new.iter().enumerate() {
        if i > 0 {
            q.push(", ");
        }
        push_consumed_row(&mut q, consumer, envelope, now);
    }
    if DB::DIALECT == Dialect::MySql {
        q.execute(conn).await?;
        return Ok(new.iter().map(|e| e.event_id.to_string()).collect());
    }
    q.push(" ON CONFLICT (consumer, event_id) DO NOTHING RETURNING event_id");
    q.fetch(conn)
        .await?
        .iter()
        .map(|row| Columns::<DB>(row).string("event_id"))
        .collect()
}

/// PostgreSQL: opens a transaction on `conn` and records every envelope as consumed by
/// `consumer` in the same message (`BEGIN; INSERT ...`, the values as literals in the simple
/// query protocol): one round trip where `BEGIN` and [`insert_consumed_batch`] take two.
///
/// Returns the open transaction when every event was new, and `None`, sending nothing, when
/// the statement does not apply (another database, more events than one statement takes, text
/// holding a NUL, which has no literal). On `Err` the connection may be in an aborted
/// transaction that sqlx does not count: pass the error to [`recording_failed`] before anything
/// else uses the connection. The ids must be distinct.
pub(crate) async fn begin_recording<'c, DB: Backend>(
    conn: &'c mut sqlx::pool::PoolConnection<DB>,
    table: &TableName,
    consumer: &str,
    envelopes: &[&EventEnvelope],
    now: DateTime<Utc>,
) -> Result<Option<sqlx::Transaction<'c, DB>>, sqlx::Error> {
    /// The largest batch a subscription takes.
    const MAX_ROWS: usize = 1000;
    if DB::DIALECT != Dialect::Postgres || envelopes.is_empty() || envelopes.len() > MAX_ROWS {
        return Ok(None);
    }
    let mut script = String::with_capacity(160 + envelopes.len() * 120);
    script.push_str("BEGIN; ");
    script.push_str(&insert_consumed_head(table));
    for (i, envelope) in envelopes.iter().enumerate() {
        script.push_str(if i == 0 { "(" } else { ", (" });
        for (k, value) in consumed_values(consumer, envelope, now).iter().enumerate() {
            if k > 0 {
                script.push_str(", ");
            }
            if !value.push_pg_literal(&mut script) {
                return Ok(None);
            }
        }
        script.push(')');
    }
    sqlx::Connection::begin_with(&mut **conn, sqlx::AssertSqlSafe(script))
        .await
        .map(Some)
}

/// After [`begin_recording`] failed with `failed`: ends the transaction its message opened
/// (which sqlx does not count), and returns `Ok` when an event had been consumed before (the
/// INSERT hit the inbox's key), so that the caller records the events its usual way, which
/// tells which were new. Any other error is returned; a connection that could not end the
/// transaction is closed instead of going back to the pool.
pub(crate) async fn recording_failed<DB: Backend>(
    conn: &mut sqlx::pool::PoolConnection<DB>,
    failed: sqlx::Error,
) -> Result<(), sqlx::Error> {
    if let Err(e) = DB::execute_script(&mut **conn, "ROLLBACK".to_owned()).await {
        conn.close_on_drop();
        return Err(e);
    }
    if failed
        .as_database_error()
        .is_some_and(|db| db.is_unique_violation())
    {
        return Ok(());
    }
    Err(failed)
}

/// The highest aggregate sequence `consumer` applied for the envelope's aggregate, other than
/// the envelope itself.
pub(crate) async fn last_applied_sequence<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    consumer: &str,
    envelope: &EventEnvelope,
) -> Result<Option<i64>, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "SELECT MAX(aggregate_sequence) AS last_sequence FROM {table} WHERE consumer = "
    ));
    q.bind(consumer)
        .push(" AND aggregate_type = ")
        .bind(envelope.aggregate_type.as_str())
        .push(" AND aggregate_id = ")
        .bind(envelope.aggregate_id.as_str())
        .push(" AND event_id <> ")
        .bind(envelope.event_id.as_str());
    match q.fetch(conn).await?.first() {
        Some(row) => Columns::<DB>(row).opt_i64("last_sequence"),
        None => Ok(None),
    }
}

/// The highest aggregate sequence `consumer` applied for each of `aggregates` (type, id) that
/// it applied any event of: one grouped query over the inbox's aggregate index.
pub(crate) async fn last_applied_sequences<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    consumer: &str,
    aggregates: &[(&str, &str)],
) -> Result<std::collections::HashMap<(String, String), i64>, sqlx::Error> {
    let mut last = std::collections::HashMap::new();
    if aggregates.is_empty() {
        return Ok(last);
    }
    let mut q = Sql::<DB>::new(format!(
        "SELECT aggregate_type, aggregate_id, MAX(aggregate_sequence) AS last_sequence \
         FROM {table} WHERE consumer = "
    ));
    q.bind(consumer).push(" AND (");
    for (i, (aggregate_type, aggregate_id)) in aggregates.iter().enumerate() {
        if i > 0 {
            q.push(" OR ");
        }
        q.push("(aggregate_type = ")
            .bind(*aggregate_type)
            .push(" AND aggregate_id = ")
            .bind(*aggregate_id)
            .push(")");
    }
    q.push(") GROUP BY aggregate_type, aggregate_id");
    for row in q.fetch(conn).await? {
        let c = Columns::<DB>(&row);
        if let Some(sequence) = c.opt_i64("last_sequence")? {
            last.insert(
                (c.string("aggregate_type")?, c.string("aggregate_id")?),
                sequence,
            );
        }
    }
    Ok(last)
}

/// Deletes at most `limit` of `consumer`'s inbox records consumed before `older_than`: one bounded batch, so
/// locks stay short however large the backlog.
pub(crate) async fn prune_consumed<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    consumer: &str,
    older_than: DateTime<Utc>,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let (head, tail) = DB::DIALECT.limited_delete(table.as_str());
    let mut q = Sql::<DB>::new(head);
    q.push("consumer = ")
        .bind(consumer)
        .push(" AND consumed_time < ")
        .bind(older_than)
        .push(" LIMIT ")
        .bind(limit)
        .push(tail);
    q.execute(conn).await
}

/// Writes a quarantine entry; an event already quarantined counts its attempts, keeps its
/// first failure time, and is quarantined again.
pub(crate) async fn quarantine<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    e: &NewQuarantine,
) -> Result<(), sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "INSERT INTO {table} (consumer, consumer_version, event_id, event_type, body, \
         failure_class, reason, retry_count, owner, status, first_failure_time, \
         last_failure_time) VALUES ("
    ));
    q.bind(&e.consumer)
        .push(", ")
        .bind(&e.consumer_version)
        .push(", ")
        .bind(&e.event_id)
        .push(", ")
        .bind(e.event_type.as_deref())
        .push(", ")
        .bind(&e.body)
        .push(", ")
        .bind(e.failure_class.name())
        .push(", ")
        .bind(&e.reason)
        .push(", ")
        .bind(e.retry_count)
        .push(", ")
        .bind(e.owner.as_deref())
        .push(", ")
        .bind(QUARANTINED)
        .push(", ")
        .bind(e.now)
        .push(", ")
        .bind(e.now)
        .push(")");
    q.push(DB::DIALECT.upsert(
        table.as_str(),
        "consumer, event_id",
        &[
            ("retry_count", Merge::Add),
            ("reason", Merge::New),
            ("failure_class", Merge::New),
            ("consumer_version", Merge::New),
            ("body", Merge::New),
            ("last_failure_time", Merge::New),
            ("status", Merge::Set(QUARANTINED)),
        ],
    ));
    q.execute(conn).await?;
    Ok(())
}

fn decode<DB: Backend>(row: &DB::Row) -> Result<QuarantineRecord, sqlx::Error> {
    let c = Columns::<DB>(row);
    let decode_error = |e: Box<dyn std::error::Error + Send + Sync>| sqlx::Error::Decode(e);
    Ok(QuarantineRecord {
        id: c.id("id")?,
        consumer: c.string("consumer")?,
        consumer_version: c.string("consumer_version")?,
        event_id: c.string("event_id")?,
        event_type: c.opt_string("event_type")?,
        body: c.string("body")?,
        failure_class: FailureClass::from_name(&c.string("failure_class")?)
            .map_err(|e| decode_error(Box::new(e)))?,
        reason: c.string("reason")?,
        retry_count: c.i32("retry_count")?,
        owner: c.opt_string("owner")?,
        status: QuarantineStatus::from_code(c.code("status")?)
            .map_err(|e| decode_error(Box::new(e)))?,
        first_failure_time: c.time("first_failure_time")?,
        last_failure_time: c.time("last_failure_time")?,
        replay_time: c.opt_time("replay_time")?,
    })
}

const QUARANTINE_COLUMNS: &str = "id, consumer, consumer_version, event_id, event_type, body, \
    failure_class, reason, retry_count, owner, status, first_failure_time, last_failure_time, \
    replay_time";

/// Which entries: of one consumer (or all), in one status (or any), matching `filter`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Selection<'a> {
    pub(crate) consumer: Option<&'a str>,
    pub(crate) status: Option<QuarantineStatus>,
    pub(crate) filter: QuarantineFilter<'a>,
}

/// Appends ` AND ...` for each condition of `selection`.
fn push_selection<DB: Backend>(q: &mut Sql<DB>, selection: &Selection<'_>) {
    if let Some(consumer) = selection.consumer {
        q.push(" AND consumer = ").bind(consumer);
    }
    if let Some(status) = selection.status {
        q.push(" AND status = ").bind(status.code());
    }
    let filter = &selection.filter;
    if let Some(event_id) = filter.event_id {
        q.push(" AND event_id = ").bind(event_id);
    }
    if let Some(event_type) = filter.event_type {
        q.push(" AND event_type = ").bind(event_type);
    }
    if let Some(class) = filter.failure_class {
        q.push(" AND failure_class = ").bind(class.name());
    }
    if let Some(from) = filter.from {
        q.push(" AND first_failure_time >= ").bind(from);
    }
    if let Some(to) = filter.to {
        q.push(" AND first_failure_time < ").bind(to);
    }
}

/// A page of the entries `selection` names, by id after `after_id`.
pub(crate) async fn select_quarantined<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    selection: &Selection<'_>,
    after_id: i64,
    limit: i64,
) -> Result<Vec<QuarantineRecord>, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "SELECT {QUARANTINE_COLUMNS} FROM {table} WHERE id > "
    ));
    q.bind(after_id);
    push_selection(&mut q, selection);
    q.push(" ORDER BY id ASC LIMIT ").bind(limit);
    q.fetch(conn).await?.iter().map(decode::<DB>).collect()
}

/// One entry by its id.
pub(crate) async fn quarantine_entry<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    id: i64,
) -> Result<Option<QuarantineRecord>, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "SELECT {QUARANTINE_COLUMNS} FROM {table} WHERE id = "
    ));
    q.bind(id);
    q.fetch(conn).await?.first().map(decode::<DB>).transpose()
}

/// Quarantined -> requeued, for the quarantined entries of `selection`: the running consumer
/// replays them on its next loop.
pub(crate) async fn requeue<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    selection: &Selection<'_>,
) -> Result<u64, sqlx::Error> {
    let selection = Selection {
        status: Some(QuarantineStatus::Quarantined),
        ..*selection
    };
    let mut q = Sql::<DB>::new(format!(
        "UPDATE {table} SET status = {REQUEUED} WHERE 1 = 1"
    ));
    push_selection(&mut q, &selection);
    q.execute(conn).await
}

/// Quarantined or requeued -> cancelled, for one entry, with the operator's reason.
pub(crate) async fn cancel_quarantined<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    id: i64,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let from = [QUARANTINED, REQUEUED];
    move_entry::<DB>(
        conn,
        table,
        id,
        &from,
        CANCELLED,
        ("replay_time", now),
        Some(reason),
    )
    .await
}

/// One entry from a status among `from` to `to`, stamping a time column (`(column, now)`) and,
/// when given, storing `reason`: every move an operator or a consumer makes of one entry. The
/// `from` guard makes a move that lost a race change nothing (0 rows).
async fn move_entry<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    id: i64,
    from: &[i16],
    to: i16,
    (time_column, now): (&str, DateTime<Utc>),
    reason: Option<&str>,
) -> Result<u64, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "UPDATE {table} SET status = {to}, {time_column} = "
    ));
    q.bind(now);
    if let Some(reason) = reason {
        q.push(", reason = ").bind(reason);
    }
    let from: Vec<String> = from.iter().map(i16::to_string).collect();
    q.push(" WHERE id = ")
        .bind(id)
        .push(format!(" AND status IN ({})", from.join(", ")));
    q.execute(conn).await
}

/// Entries per consumer and status.
pub(crate) async fn quarantine_counts<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
) -> Result<Vec<(String, QuarantineStatus, i64)>, sqlx::Error> {
    let q = Sql::<DB>::new(format!(
        "SELECT consumer, status, COUNT(*) AS n FROM {table} GROUP BY consumer, status \
         ORDER BY consumer, status"
    ));
    q.fetch(conn)
        .await?
        .iter()
        .map(|row| {
            let c = Columns::<DB>(row);
            let status = QuarantineStatus::from_code(c.code("status")?)
                .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
            Ok((c.string("consumer")?, status, c.i64("n")?))
        })
        .collect()
}

/// Deletes at most `limit` replayed or cancelled entries whose last change is before `before`.
pub(crate) async fn prune_quarantine<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    before: DateTime<Utc>,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let (head, tail) = DB::DIALECT.limited_delete(table.as_str());
    let mut q = Sql::<DB>::new(head);
    q.push(format!(
        "status IN ({REPLAYED}, {CANCELLED}) AND replay_time < "
    ))
    .bind(before)
    .push(" LIMIT ")
    .bind(limit)
    .push(tail);
    q.execute(conn).await
}

/// Requeued -> quarantined again, with the reason: the consumer could not replay it.
pub(crate) async fn unrequeue<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    id: i64,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let time = ("last_failure_time", now);
    move_entry::<DB>(
        conn,
        table,
        id,
        &[REQUEUED],
        QUARANTINED,
        time,
        Some(reason),
    )
    .await
}

/// Quarantined or requeued -> replayed, for one entry.
pub(crate) async fn mark_replayed<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    id: i64,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let from = [QUARANTINED, REQUEUED];
    move_entry::<DB>(conn, table, id, &from, REPLAYED, ("replay_time", now), None).await
}

/// Which of `event_ids` `consumer` has not recorded as consumed. PostgreSQL and SQLite answer
/// with the missing ones alone (an anti-join over one bound array, or one JSON array), so a
/// healthy page sends nothing back; on MySQL the consumed ones are read and taken away.
pub(crate) async fn unconsumed_among<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    consumer: &str,
    event_ids: &[&str],
) -> Result<Vec<String>, sqlx::Error> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = match DB::DIALECT {
        Dialect::Postgres => {
            let mut q = Sql::<DB>::new("SELECT u.event_id FROM unnest(".to_owned());
            q.str_array(event_ids).push(") AS u(event_id)");
            q
        }
        Dialect::Sqlite => {
            // One JSON array bound, read back as rows: one value to bind however long the page.
            let list =
                serde_json::to_string(event_ids).map_err(|e| sqlx::Error::Encode(e.into()))?;
            let mut q = Sql::<DB>::new("SELECT u.value AS event_id FROM json_each(".to_owned());
            q.bind(list.as_str()).push(") AS u");
            q
        }
        Dialect::MySql => {
            let consumed: std::collections::HashSet<String> =
                consumed_among::<DB>(conn, table, consumer, event_ids)
                    .await?
                    .into_iter()
                    .collect();
            return Ok(event_ids
                .iter()
                .filter(|id| !consumed.contains(**id))
                .map(|id| (*id).to_owned())
                .collect());
        }
    };
    let key = match DB::DIALECT {
        Dialect::Sqlite => "u.value",
        Dialect::Postgres | Dialect::MySql => "u.event_id",
    };
    q.push(format!(
        " WHERE NOT EXISTS (SELECT 1 FROM {table} c WHERE c.consumer = "
    ))
    .bind(consumer)
    .push(format!(" AND c.event_id = {key})"));
    q.fetch(conn)
        .await?
        .iter()
        .map(|row| Columns::<DB>(row).string("event_id"))
        .collect()
}

/// Which of `event_ids` `consumer` recorded as consumed.
pub(crate) async fn consumed_among<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    consumer: &str,
    event_ids: &[&str],
) -> Result<Vec<String>, sqlx::Error> {
    select_consumed::<DB>(conn, table, consumer, event_ids, "").await
}

/// Which of `event_ids` `consumer` consumed, the statement ending in `tail` (` FOR UPDATE`).
async fn select_consumed<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    consumer: &str,
    event_ids: &[&str],
    tail: &str,
) -> Result<Vec<String>, sqlx::Error> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = Sql::<DB>::new(format!("SELECT event_id FROM {table} WHERE consumer = "));
    q.bind(consumer)
        .push(" AND event_id")
        .in_strs(event_ids)
        .push(tail);
    q.fetch(conn)
        .await?
        .iter()
        .map(|row| Columns::<DB>(row).string("event_id"))
        .collect()
}

/// Which of `event_ids` are in `consumer`'s quarantine, with their status.
pub(crate) async fn quarantined_among<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    consumer: &str,
    event_ids: &[&str],
) -> Result<Vec<(String, QuarantineStatus)>, sqlx::Error> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = Sql::<DB>::new(format!(
        "SELECT event_id, status FROM {table} WHERE consumer = "
    ));
    q.bind(consumer).push(" AND event_id").in_strs(event_ids);
    q.fetch(conn)
        .await?
        .iter()
        .map(|row| {
            let c = Columns::<DB>(row);
            let status = QuarantineStatus::from_code(c.code("status")?)
                .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
            Ok((c.string("event_id")?, status))
        })
        .collect()
}
