//! The statements of the seed's message event table (`biz_message_event`).

use chrono::{DateTime, Utc};

use super::dialect::{Backend, Columns, Dialect, Sql};
use super::{CANCELLED, FAILED, IN_PROGRESS, PENDING, SUCCEEDED, codes};
use crate::row::message::{MessageRecord, NewMessage};
use crate::status::EventStatus::{self, Failed, Pending};
use crate::table::TableName;

/// Every column of `biz_message_event`, in decode order.
pub(crate) const COLUMNS: &str = "id, event_no, event_type, biz_type, biz_id, \
    event_source, event_payload, event_status, retry_count, max_retry_count, next_retry_time, \
    last_handle_time, success_time, fail_reason, trace_id, remark, version, create_time, update_time";

/// The read queries of the seed's message event model.
#[derive(Debug, Clone)]
pub(crate) enum MessageSelect<'a> {
    Pending { limit: i64 },
    DueRetries { now: DateTime<Utc>, limit: i64 },
    ByBiz { biz_type: &'a str, biz_id: &'a str },
    ByEventNo { event_no: &'a str },
    ManyFailures { min_retries: i32, limit: i64 },
}

/// The seed's writes to one message row; each checks the state it expects.
#[derive(Debug, Clone)]
pub(crate) enum MessageWrite<'a> {
    /// 抢占: pending or failed -> in progress, when the version is still the one read.
    Claim {
        id: i64,
        version: i32,
        now: DateTime<Utc>,
    },
    /// 标记成功: in progress -> succeeded.
    Succeed { id: i64, now: DateTime<Utc> },
    /// 标记失败: in progress -> failed, while retries remain.
    Fail {
        id: i64,
        reason: &'a str,
        next_retry_time: DateTime<Utc>,
        now: DateTime<Utc>,
    },
    /// Failed -> cancelled, whatever the retries left: a permanent failure.
    CancelFailed {
        id: i64,
        reason: &'a str,
        now: DateTime<Utc>,
    },
    /// An operator's retry: failed -> pending, due now, its retries counted afresh.
    Retry {
        event_no: &'a str,
        now: DateTime<Utc>,
    },
    /// An operator's cancel: pending or failed -> cancelled, with the reason.
    Cancel {
        event_no: &'a str,
        reason: &'a str,
        now: DateTime<Utc>,
    },
    /// 超过最大重试次数: failed with no retries left -> cancelled.
    CancelExhausted {
        id: i64,
        reason: &'a str,
        now: DateTime<Utc>,
    },
}

fn decode<DB: Backend>(row: &DB::Row) -> Result<MessageRecord, sqlx::Error> {
    let c = Columns::<DB>(row);
    Ok(MessageRecord {
        id: c.id("id")?,
        event_no: c.string("event_no")?,
        event_type: c.string("event_type")?,
        biz_type: c.string("biz_type")?,
        biz_id: c.string("biz_id")?,
        event_source: c.string("event_source")?,
        event_payload: c.json("event_payload")?,
        event_status: c.status("event_status")?,
        retry_count: c.i32("retry_count")?,
        max_retry_count: c.i32("max_retry_count")?,
        next_retry_time: c.opt_time("next_retry_time")?,
        last_handle_time: c.opt_time("last_handle_time")?,
        success_time: c.opt_time("success_time")?,
        fail_reason: c.opt_string("fail_reason")?,
        trace_id: c.opt_string("trace_id")?,
        remark: c.opt_string("remark")?,
        version: c.i32("version")?,
        create_time: c.time("create_time")?,
        update_time: c.time("update_time")?,
    })
}

/// The seed's idempotent write: false when the event number exists. A duplicate never
/// overwrites the payload, status or retry count.
pub(crate) async fn insert<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    m: &NewMessage,
) -> Result<bool, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "INSERT INTO {table} (event_no, event_type, biz_type, biz_id, event_source, \
         event_payload, event_status, retry_count, max_retry_count, trace_id, \
         create_time, update_time) VALUES ("
    ));
    q.bind(&m.event_no)
        .push(", ")
        .bind(&m.event_type)
        .push(", ")
        .bind(&m.biz_type)
        .push(", ")
        .bind(&m.biz_id)
        .push(", ")
        .bind(&m.event_source)
        .push(", ")
        .bind(&m.event_payload)
        .push(", ")
        .bind(EventStatus::Pending)
        .push(", ")
        .bind(0_i32)
        .push(", ")
        .bind(m.max_retry_count)
        .push(", ")
        .bind(m.trace_id.as_deref())
        .push(", ")
        .bind(m.now)
        .push(", ")
        .bind(m.now)
        .push(")");
    match DB::DIALECT {
        Dialect::Postgres | Dialect::Sqlite => {
            q.push(DB::DIALECT.insert_ignoring_duplicate("event_no", ""));
            Ok(q.execute(conn).await? == 1)
        }
        // MySQL has no ON CONFLICT, and its ON DUPLICATE KEY UPDATE can only report a duplicate
        // by changing the row. The plain INSERT fails on the key instead, and MySQL rolls back
        // that statement only.
        Dialect::MySql => match q.execute(conn).await {
            Ok(inserted) => Ok(inserted == 1),
            Err(e)
                if DB::DIALECT
                    .violated_key(&e)
                    .is_some_and(|key| key.ends_with("uk_event_no")) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        },
    }
}

/// One of the seed's read queries.
pub(crate) async fn select<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    select: &MessageSelect<'_>,
) -> Result<Vec<MessageRecord>, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!("SELECT {COLUMNS} FROM {table} WHERE "));
    match *select {
        MessageSelect::Pending { limit } => {
            q.push(format!(
                "deleted = 0 AND event_status = {PENDING} ORDER BY create_time ASC, id ASC LIMIT "
            ))
            .bind(limit);
        }
        MessageSelect::DueRetries { now, limit } => {
            q.push(format!(
                "deleted = 0 AND event_status = {FAILED} AND retry_count < max_retry_count \
                 AND next_retry_time <= "
            ))
            .bind(now)
            .push(" ORDER BY next_retry_time ASC LIMIT ")
            .bind(limit);
        }
        MessageSelect::ByBiz { biz_type, biz_id } => {
            q.push("deleted = 0 AND biz_type = ")
                .bind(biz_type)
                .push(" AND biz_id = ")
                .bind(biz_id)
                .push(" ORDER BY create_time ASC, id ASC");
        }
        MessageSelect::ByEventNo { event_no } => {
            q.push("event_no = ").bind(event_no);
        }
        MessageSelect::ManyFailures { min_retries, limit } => {
            q.push(format!(
                "deleted = 0 AND event_status = {FAILED} AND retry_count >= "
            ))
            .bind(min_retries)
            .push(" ORDER BY update_time DESC LIMIT ")
            .bind(limit);
        }
    }
    q.fetch(conn).await?.iter().map(decode::<DB>).collect()
}

/// One of the seed's guarded single-row writes; the number of rows it changed (0 or 1).
pub(crate) async fn write<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    write: MessageWrite<'_>,
) -> Result<u64, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!("UPDATE {table} SET "));
    match write {
        MessageWrite::Claim { id, version, now } => {
            q.push(format!("event_status = {IN_PROGRESS}, last_handle_time = "))
                .bind(now)
                .push(", version = version + 1, update_time = ")
                .bind(now)
                .push(" WHERE id = ")
                .bind(id)
                .push(" AND version = ")
                .bind(version)
                .push(format!(
                    " AND event_status IN {} AND deleted = 0",
                    codes(&[Pending, Failed])
                ));
        }
        MessageWrite::Succeed { id, now } => {
            q.push(format!("event_status = {SUCCEEDED}, success_time = "))
                .bind(now)
                .push(", fail_reason = NULL, update_time = ")
                .bind(now)
                .push(" WHERE id = ")
                .bind(id)
                .push(format!(" AND event_status = {IN_PROGRESS} AND deleted = 0"));
        }
        MessageWrite::Fail {
            id,
            reason,
            next_retry_time,
            now,
        } => {
            q.push(format!(
                "event_status = {FAILED}, retry_count = retry_count + 1, next_retry_time = "
            ))
            .bind(next_retry_time)
            .push(", fail_reason = ")
            .bind(reason)
            .push(", update_time = ")
            .bind(now)
            .push(" WHERE id = ")
            .bind(id)
            .push(format!(
                " AND event_status = {IN_PROGRESS} AND retry_count < max_retry_count \
                 AND deleted = 0"
            ));
        }
        MessageWrite::CancelFailed { id, reason, now } => {
            q.push(format!("event_status = {CANCELLED}, fail_reason = "))
                .bind(reason)
                .push(", update_time = ")
                .bind(now)
                .push(" WHERE id = ")
                .bind(id)
                .push(format!(" AND event_status = {FAILED} AND deleted = 0"));
        }
        MessageWrite::Retry { event_no, now } => {
            q.push(format!(
                "event_status = {PENDING}, retry_count = 0, next_retry_time = NULL, \
                 version = version + 1, update_time = "
            ))
            .bind(now)
            .push(" WHERE event_no = ")
            .bind(event_no)
            .push(format!(" AND event_status = {FAILED} AND deleted = 0"));
        }
        MessageWrite::Cancel {
            event_no,
            reason,
            now,
        } => {
            q.push(format!("event_status = {CANCELLED}, fail_reason = "))
                .bind(reason)
                .push(", version = version + 1, update_time = ")
                .bind(now)
                .push(" WHERE event_no = ")
                .bind(event_no)
                .push(format!(
                    " AND event_status IN {} AND deleted = 0",
                    codes(&[Pending, Failed])
                ));
        }
        MessageWrite::CancelExhausted { id, reason, now } => {
            q.push(format!("event_status = {CANCELLED}, fail_reason = "))
                .bind(reason)
                .push(", update_time = ")
                .bind(now)
                .push(" WHERE id = ")
                .bind(id)
                .push(format!(
                    " AND event_status = {FAILED} AND retry_count >= max_retry_count \
                     AND deleted = 0"
                ));
        }
    }
    q.execute(conn).await
}

/// Pending and failed counts, messages in progress since before `stuck_before`, and the oldest
/// pending message's creation time: each answered from the status index.
pub(crate) async fn health<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    stuck_before: DateTime<Utc>,
) -> Result<(i64, i64, i64, Option<DateTime<Utc>>), sqlx::Error> {
    let mut counts = [0_i64; 3];
    for (slot, status) in [(0, PENDING), (1, FAILED)] {
        let q = Sql::<DB>::new(format!(
            "SELECT COUNT(*) AS n FROM {table} WHERE event_status = {status} AND deleted = 0"
        ));
        if let Some(row) = q.fetch(conn).await?.first() {
            counts[slot] = Columns::<DB>(row).i64("n")?;
        }
    }
    let mut q = Sql::<DB>::new(format!(
        "SELECT COUNT(*) AS n FROM {table} WHERE event_status = {IN_PROGRESS} AND deleted = 0 \
         AND last_handle_time < "
    ));
    q.bind(stuck_before);
    if let Some(row) = q.fetch(conn).await?.first() {
        counts[2] = Columns::<DB>(row).i64("n")?;
    }
    let q = Sql::<DB>::new(format!(
        "SELECT MIN(create_time) AS oldest FROM {table} WHERE event_status = {PENDING} \
         AND deleted = 0"
    ));
    let oldest = match q.fetch(conn).await?.first() {
        Some(row) => Columns::<DB>(row).opt_time("oldest")?,
        None => None,
    };
    Ok((counts[0], counts[1], counts[2], oldest))
}
