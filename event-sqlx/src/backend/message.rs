//! The statements of the seed's message event table (`biz_message_event`), per backend.

use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::Pool;

use super::Backend;
use crate::TableName;
use crate::message::{MessageRecord, NewMessage};

/// The read queries of the seed's message event model.
#[doc(hidden)]
#[allow(unreachable_pub)] // unnameable outside: `backend` is private
#[derive(Debug, Clone)]
pub enum MessageSelect<'a> {
    Pending { limit: i64 },
    DueRetries { now: DateTime<Utc>, limit: i64 },
    ByBiz { biz_type: &'a str, biz_id: &'a str },
    ByEventNo { event_no: &'a str },
    ManyFailures { min_retries: i32, limit: i64 },
}

/// The message event table's statements.
pub trait MessageBackend: Backend {
    #[doc(hidden)]
    fn insert_message<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        message: &'a NewMessage,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn select_messages<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        select: &'a MessageSelect<'a>,
    ) -> impl Future<Output = Result<Vec<MessageRecord>, sqlx::Error>> + Send + 'a;

    /// `write` is one of the seed's guarded single-row writes.
    #[doc(hidden)]
    fn write_message<'a>(
        pool: &'a Pool<Self>,
        table: &'a TableName,
        write: MessageWrite<'a>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;
}

/// The seed's writes to one message row; each checks the state it expects.
#[doc(hidden)]
#[allow(unreachable_pub)] // unnameable outside: `backend` is private
#[derive(Debug, Clone)]
pub enum MessageWrite<'a> {
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
    /// 超过最大重试次数: failed with no retries left -> cancelled.
    CancelExhausted {
        id: i64,
        reason: &'a str,
        now: DateTime<Utc>,
    },
}

macro_rules! impl_message_backend {
    ($module:ident, $db:ty, id = $id:ty, status = $status:ty) => {
        mod $module {
            use std::future::Future;

            use sqlx::{Pool, QueryBuilder, Row};

            use super::{MessageBackend, MessageSelect, MessageWrite};
            use crate::backend::{Dialect, imp::status_of};
            use crate::message::{MessageRecord, NewMessage, MESSAGE_COLUMNS};
            use crate::{Backend, TableName};

            impl MessageBackend for $db {
                fn insert_message<'a>(
                    pool: &'a Pool<$db>,
                    table: &'a TableName,
                    m: &'a NewMessage,
                ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a {
                    async move {
                        let mut q = QueryBuilder::<$db>::new(format!(
                            "INSERT INTO {table} (event_no, event_type, biz_type, biz_id, event_source, \
                             event_payload, event_status, retry_count, max_retry_count, trace_id, \
                             create_time, update_time) VALUES ("
                        ));
                        let mut values = q.separated(", ");
                        values
                            .push_bind(m.event_no.as_str())
                            .push_bind(m.event_type.as_str())
                            .push_bind(m.biz_type.as_str())
                            .push_bind(m.biz_id.as_str())
                            .push_bind(m.event_source.as_str())
                            .push_bind(sqlx::types::Json(&m.event_payload))
                            .push_bind(0_i16)
                            .push_bind(0_i32)
                            .push_bind(m.max_retry_count)
                            .push_bind(m.trace_id.as_deref())
                            .push_bind(m.now)
                            .push_bind(m.now);
                        q.push(")");
                        // The seed's idempotent write. A duplicate never overwrites the payload,
                        // status or retry count.
                        if <$db as Backend>::DIALECT == Dialect::MySql {
                            q.push(" ON DUPLICATE KEY UPDATE update_time = VALUES(update_time)");
                            // 1 row inserted; 0 or 2 when the key existed.
                            Ok(q.build().execute(pool).await?.rows_affected() == 1)
                        } else {
                            q.push(" ON CONFLICT (event_no) DO NOTHING");
                            Ok(q.build().execute(pool).await?.rows_affected() == 1)
                        }
                    }
                }

                fn select_messages<'a>(
                    pool: &'a Pool<$db>,
                    table: &'a TableName,
                    select: &'a MessageSelect<'a>,
                ) -> impl Future<Output = Result<Vec<MessageRecord>, sqlx::Error>> + Send + 'a {
                    async move {
                        let mut q = QueryBuilder::<$db>::new(format!(
                            "SELECT {MESSAGE_COLUMNS} FROM {table} WHERE "
                        ));
                        match select {
                            MessageSelect::Pending { limit } => {
                                q.push("deleted = 0 AND event_status = 0 ORDER BY create_time ASC, id ASC LIMIT ")
                                    .push_bind(*limit);
                            }
                            MessageSelect::DueRetries { now, limit } => {
                                q.push("deleted = 0 AND event_status = 3 AND retry_count < max_retry_count AND next_retry_time <= ")
                                    .push_bind(*now)
                                    .push(" ORDER BY next_retry_time ASC LIMIT ")
                                    .push_bind(*limit);
                            }
                            MessageSelect::ByBiz { biz_type, biz_id } => {
                                q.push("deleted = 0 AND biz_type = ")
                                    .push_bind(*biz_type)
                                    .push(" AND biz_id = ")
                                    .push_bind(*biz_id)
                                    .push(" ORDER BY create_time ASC, id ASC");
                            }
                            MessageSelect::ByEventNo { event_no } => {
                                q.push("event_no = ").push_bind(*event_no);
                            }
                            MessageSelect::ManyFailures { min_retries, limit } => {
                                q.push("deleted = 0 AND event_status = 3 AND retry_count >= ")
                                    .push_bind(*min_retries)
                                    .push(" ORDER BY update_time DESC LIMIT ")
                                    .push_bind(*limit);
                            }
                        }
                        let rows = q.build().fetch_all(pool).await?;
                        rows.iter().map(decode_message).collect()
                    }
                }

                fn write_message<'a>(
                    pool: &'a Pool<$db>,
                    table: &'a TableName,
                    write: MessageWrite<'a>,
                ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
                    async move {
                        let mut q = QueryBuilder::<$db>::new(format!("UPDATE {table} SET "));
                        match write {
                            MessageWrite::Claim { id, version, now } => {
                                q.push("event_status = 1, last_handle_time = ")
                                    .push_bind(now)
                                    .push(", version = version + 1, update_time = ")
                                    .push_bind(now)
                                    .push(" WHERE id = ")
                                    .push_bind(id)
                                    .push(" AND version = ")
                                    .push_bind(version)
                                    .push(" AND event_status IN (0, 3) AND deleted = 0");
                            }
                            MessageWrite::Succeed { id, now } => {
                                q.push("event_status = 2, success_time = ")
                                    .push_bind(now)
                                    .push(", fail_reason = NULL, update_time = ")
                                    .push_bind(now)
                                    .push(" WHERE id = ")
                                    .push_bind(id)
                                    .push(" AND event_status = 1 AND deleted = 0");
                            }
                            MessageWrite::Fail { id, reason, next_retry_time, now } => {
                                q.push("event_status = 3, retry_count = retry_count + 1, next_retry_time = ")
                                    .push_bind(next_retry_time)
                                    .push(", fail_reason = ")
                                    .push_bind(reason)
                                    .push(", update_time = ")
                                    .push_bind(now)
                                    .push(" WHERE id = ")
                                    .push_bind(id)
                                    .push(" AND event_status = 1 AND retry_count < max_retry_count AND deleted = 0");
                            }
                            MessageWrite::CancelExhausted { id, reason, now } => {
                                q.push("event_status = 4, fail_reason = ")
                                    .push_bind(reason)
                                    .push(", update_time = ")
                                    .push_bind(now)
                                    .push(" WHERE id = ")
                                    .push_bind(id)
                                    .push(" AND event_status = 3 AND retry_count >= max_retry_count AND deleted = 0");
                            }
                        }
                        Ok(q.build().execute(pool).await?.rows_affected())
                    }
                }
            }

            fn decode_message(row: &<$db as sqlx::Database>::Row) -> Result<MessageRecord, sqlx::Error> {
                let id: $id = row.try_get("id")?;
                let status: $status = row.try_get("event_status")?;
                let payload: sqlx::types::Json<serde_json::Value> = row.try_get("event_payload")?;
                Ok(MessageRecord {
                    id: i64::try_from(id).map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                    event_no: row.try_get("event_no")?,
                    event_type: row.try_get("event_type")?,
                    biz_type: row.try_get("biz_type")?,
                    biz_id: row.try_get("biz_id")?,
                    event_source: row.try_get("event_source")?,
                    event_payload: payload.0,
                    event_status: status_of(i64::from(status))?,
                    retry_count: row.try_get("retry_count")?,
                    max_retry_count: row.try_get("max_retry_count")?,
                    next_retry_time: row.try_get("next_retry_time")?,
                    last_handle_time: row.try_get("last_handle_time")?,
                    success_time: row.try_get("success_time")?,
                    fail_reason: row.try_get("fail_reason")?,
                    trace_id: row.try_get("trace_id")?,
                    remark: row.try_get("remark")?,
                    version: row.try_get("version")?,
                    create_time: row.try_get("create_time")?,
                    update_time: row.try_get("update_time")?,
                })
            }
        }
    };
}

#[cfg(feature = "postgres")]
impl_message_backend!(postgres, sqlx::Postgres, id = i64, status = i16);
#[cfg(feature = "mysql")]
impl_message_backend!(mysql, sqlx::MySql, id = u64, status = i64);
#[cfg(feature = "sqlite")]
impl_message_backend!(sqlite, sqlx::Sqlite, id = i64, status = i64);
