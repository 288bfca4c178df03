//! The operators' reads and the audit trail: the back-office search, the dashboard's counts and
//! per-minute series, who consumed an event, and `operation_audit`. Each read is answered from an
//! index (the seed profile's; see [`OutboxSearch`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::dialect::{Backend, Columns, Dialect, Sql};
use super::outbox::{COLUMNS, decode};
use super::{CANCELLED, FAILED, IN_PROGRESS, PENDING, SUCCEEDED, StatusTable};
use crate::row::audit::{AuditEntry, Consumption, NewAuditEntry};
use crate::row::outbox::{GroupCount, MinuteCount, OutboxRecord, OutboxSearch, StatusCounts};
use crate::status::EventStatus;
use crate::table::TableName;

/// A page of the back-office search, newest first by `(create_time, id)`.
pub(crate) async fn search<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    search: &OutboxSearch<'_>,
    limit: i64,
) -> Result<Vec<OutboxRecord>, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!("SELECT {COLUMNS} FROM {table} WHERE 1 = 1"));
    if let Some(event_no) = search.event_no {
        q.push(" AND event_no = ").bind(event_no);
    }
    if let Some((aggregate_type, aggregate_id)) = search.aggregate {
        q.push(" AND aggregate_type = ")
            .bind(aggregate_type)
            .push(" AND aggregate_id = ")
            .bind(aggregate_id);
    }
    if let Some(event_type) = search.event_type {
        q.push(" AND event_type = ").bind(event_type);
    }
    if let Some(topic) = search.topic {
        q.push(" AND topic = ").bind(topic);
    }
    if let Some(trace_id) = search.trace_id {
        q.push(" AND trace_id = ").bind(trace_id);
    }
    if let Some(status) = search.status {
        // Written into the text, so that PostgreSQL can use a partial status index.
        q.push(format!(" AND publish_status = {}", status.code()));
    }
    if let Some(from) = search.from {
        q.push(" AND create_time >= ").bind(from);
    }
    if let Some(to) = search.to {
        q.push(" AND create_time < ").bind(to);
    }
    if let Some((time, id)) = search.before {
        q.push(" AND (create_time < ")
            .bind(time)
            .push(" OR (create_time = ")
            .bind(time)
            .push(" AND id < ")
            .bind(id)
            .push("))");
    }
    q.push(" ORDER BY create_time DESC, id DESC LIMIT ")
        .bind(limit.clamp(1, 1000));
    q.fetch(conn).await?.iter().map(decode::<DB>).collect()
}

/// The rows per status as a dashboard shows them: pending, in-progress and failed rows all (they
/// are the live work, few, on the status index), published and cancelled rows last changed at or
/// after `since` (on the `(status, update_time)` index: the count grows with the window, not with
/// the table).
pub(crate) async fn live_counts<DB: Backend>(
    conn: &mut DB::Connection,
    t: StatusTable<'_>,
    since: DateTime<Utc>,
) -> Result<StatusCounts, sqlx::Error> {
    let StatusTable {
        table,
        status_column,
    } = t;
    let mut counts = StatusCounts::default();
    for code in [PENDING, IN_PROGRESS, FAILED, SUCCEEDED, CANCELLED] {
        let mut q = Sql::<DB>::new(format!(
            "SELECT COUNT(*) AS n FROM {table} WHERE {status_column} = {code} AND deleted = 0"
        ));
        if code == SUCCEEDED || code == CANCELLED {
            q.push(" AND update_time >= ").bind(since);
        }
        let n = match q.fetch(conn).await?.first() {
            Some(row) => Columns::<DB>(row).i64("n")?,
            None => 0,
        };
        if let Ok(status) = EventStatus::from_code(i64::from(code)) {
            counts.add(status, n);
        }
    }
    Ok(counts)
}

/// Failed rows per value of `column` (`topic` or `event_type`), most first.
pub(crate) async fn failed_by<DB: Backend>(
    conn: &mut DB::Connection,
    t: StatusTable<'_>,
    column: &str,
    limit: i64,
) -> Result<Vec<GroupCount>, sqlx::Error> {
    let StatusTable {
        table,
        status_column,
    } = t;
    let mut q = Sql::<DB>::new(format!(
        "SELECT COALESCE({column}, '') AS k, COUNT(*) AS n FROM {table} \
         WHERE {status_column} = {FAILED} AND deleted = 0 \
         GROUP BY COALESCE({column}, '') ORDER BY n DESC, k ASC LIMIT "
    ));
    q.bind(limit);
    let mut groups = Vec::new();
    for row in q.fetch(conn).await? {
        let c = Columns::<DB>(&row);
        groups.push(GroupCount {
            key: c.string("k")?,
            count: c.i64("n")?,
        });
    }
    Ok(groups)
}

/// The expression that gives a time column's minute since the epoch, as an integer.
fn epoch_minute(dialect: Dialect, column: &str) -> String {
    match dialect {
        Dialect::Postgres => format!("CAST(FLOOR(EXTRACT(EPOCH FROM {column}) / 60) AS BIGINT)"),
        Dialect::MySql => format!("CAST(FLOOR(UNIX_TIMESTAMP({column}) / 60) AS SIGNED)"),
        Dialect::Sqlite => format!("(CAST(strftime('%s', {column}) AS INTEGER) / 60)"),
    }
}

/// Published and failed rows per minute of their last change, from `since` on, oldest first;
/// minutes with neither are left out.
pub(crate) async fn per_minute<DB: Backend>(
    conn: &mut DB::Connection,
    t: StatusTable<'_>,
    since: DateTime<Utc>,
) -> Result<Vec<MinuteCount>, sqlx::Error> {
    let StatusTable {
        table,
        status_column,
    } = t;
    let minute = epoch_minute(DB::DIALECT, "update_time");
    // Minute -> (published, failed), in order.
    let mut series: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for code in [SUCCEEDED, FAILED] {
        let mut q = Sql::<DB>::new(format!(
            "SELECT {minute} AS m, COUNT(*) AS n FROM {table} \
             WHERE {status_column} = {code} AND deleted = 0 AND update_time >= "
        ));
        q.bind(since).push(format!(" GROUP BY {minute}"));
        for row in q.fetch(conn).await? {
            let c = Columns::<DB>(&row);
            let slot = series.entry(c.i64("m")?).or_default();
            if code == SUCCEEDED {
                slot.0 += c.i64("n")?;
            } else {
                slot.1 += c.i64("n")?;
            }
        }
    }
    Ok(series
        .into_iter()
        .filter_map(|(m, (published, failed))| {
            Some(MinuteCount {
                minute: DateTime::<Utc>::from_timestamp(m.saturating_mul(60), 0)?,
                published,
                failed,
            })
        })
        .collect())
}

/// Every consumer's record of `event_id` in the inbox table. The key is `(consumer, event_id)`:
/// the consumers are enumerated by a loose index scan (one probe each), then each is probed for
/// the event, so the cost is one index lookup per consumer, not a scan of the inbox.
pub(crate) async fn consumptions<DB: Backend>(
    conn: &mut DB::Connection,
    inbox: &TableName,
    event_id: &str,
) -> Result<Vec<Consumption>, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "WITH RECURSIVE consumers (consumer) AS ( \
           SELECT MIN(consumer) FROM {inbox} \
           UNION ALL \
           SELECT (SELECT MIN(i.consumer) FROM {inbox} i WHERE i.consumer > c.consumer) \
           FROM consumers c WHERE c.consumer IS NOT NULL \
         ) \
         SELECT e.consumer AS consumer, e.consumed_time AS consumed_time, \
           e.deliveries AS deliveries \
         FROM consumers c JOIN {inbox} e ON e.consumer = c.consumer AND e.event_id = "
    ));
    q.bind(event_id).push(" ORDER BY e.consumer");
    let mut out = Vec::new();
    for row in q.fetch(conn).await? {
        let c = Columns::<DB>(&row);
        out.push(Consumption {
            consumer: c.string("consumer")?,
            consumed_time: c.time("consumed_time")?,
            deliveries: i64::from(c.i32("deliveries")?),
        });
    }
    Ok(out)
}

/// How many characters of the affected rows' list are kept.
const AFFECTED_ROWS_CHARS: usize = 60_000;

/// Appends one entry to the audit trail; returns its id.
pub(crate) async fn record_audit<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    entry: &NewAuditEntry,
    now: DateTime<Utc>,
) -> Result<i64, sqlx::Error> {
    let rows = cut(&entry.affected_rows.join(","), AFFECTED_ROWS_CHARS);
    let reason = entry.reason.as_deref().map(|r| cut(r, 1000));
    let (actor, action, target, outcome) = (
        cut(&entry.actor, 128),
        cut(&entry.action, 64),
        cut(&entry.target, 512),
        cut(&entry.outcome, 1000),
    );
    let mut q = Sql::<DB>::new(format!(
        "INSERT INTO {table} (action_time, actor, action, target, affected, affected_rows, \
         reason, outcome) VALUES ("
    ));
    q.bind(now)
        .push(", ")
        .bind(actor.as_str())
        .push(", ")
        .bind(action.as_str())
        .push(", ")
        .bind(target.as_str())
        .push(", ")
        .bind(entry.affected)
        .push(", ")
        .bind(rows.as_str())
        .push(", ")
        .bind(reason.as_deref())
        .push(", ")
        .bind(outcome.as_str())
        .push(")");
    let id = if DB::DIALECT.has_returning() {
        q.push(" RETURNING id");
        q.fetch(conn).await?
    } else {
        q.execute(conn).await?;
        Sql::<DB>::new("SELECT LAST_INSERT_ID() AS id")
            .fetch(conn)
            .await?
    };
    match id.first() {
        Some(row) => Columns::<DB>(row).id("id"),
        None => Err(sqlx::Error::RowNotFound),
    }
}

/// Records what an action started with [`record_audit`] did: the rows it changed and its
/// outcome. Returns whether the entry exists.
pub(crate) async fn settle_audit<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    id: i64,
    affected_rows: &[String],
    outcome: &str,
) -> Result<bool, sqlx::Error> {
    let rows = cut(&affected_rows.join(","), AFFECTED_ROWS_CHARS);
    let outcome = cut(outcome, 1000);
    let mut q = Sql::<DB>::new(format!("UPDATE {table} SET affected = "));
    q.bind(i64::try_from(affected_rows.len()).unwrap_or(i64::MAX))
        .push(", affected_rows = ")
        .bind(rows.as_str())
        .push(", outcome = ")
        .bind(outcome.as_str())
        .push(" WHERE id = ")
        .bind(id);
    Ok(q.execute(conn).await? == 1)
}

/// `text` cut to `chars` characters.
fn cut(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

/// Audit entries, newest first, with ids below `before_id` (`i64::MAX` for the first page).
pub(crate) async fn audit_entries<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    before_id: i64,
    limit: i64,
) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "SELECT id, action_time, actor, action, target, affected, affected_rows, reason, outcome \
         FROM {table} WHERE id < "
    ));
    q.bind(before_id)
        .push(" ORDER BY id DESC LIMIT ")
        .bind(limit.clamp(1, 1000));
    let mut out = Vec::new();
    for row in q.fetch(conn).await? {
        let c = Columns::<DB>(&row);
        out.push(AuditEntry {
            id: c.id("id")?,
            action_time: c.time("action_time")?,
            actor: c.string("actor")?,
            action: c.string("action")?,
            target: c.string("target")?,
            affected: c.i64("affected")?,
            affected_rows: c.opt_string("affected_rows")?,
            reason: c.opt_string("reason")?,
            outcome: c.string("outcome")?,
        });
    }
    Ok(out)
}
