//! The seed's message event table (`biz_message_event`): internal asynchronous work with the same
//! pending / in progress / succeeded / failed / cancelled cycle as the outbox.

use chrono::{DateTime, TimeDelta, Utc};
use event_core::EventEnvelope;
use serde_json::Value;
use sqlx::Pool;

use crate::backend::message::{MessageBackend, MessageSelect, MessageWrite};
use crate::outbox::now;
use crate::record::StatusCounts;
use crate::{EventStatus, OutboxError, TableName};

/// Every column of `biz_message_event`, in decode order.
pub(crate) const MESSAGE_COLUMNS: &str = "id, event_no, event_type, biz_type, biz_id, \
    event_source, event_payload, event_status, retry_count, max_retry_count, next_retry_time, \
    last_handle_time, success_time, fail_reason, trace_id, remark, version, create_time, update_time";

/// One row of `biz_message_event`, every column.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MessageRecord {
    /// Primary key.
    pub id: i64,
    /// The event number, unique.
    pub event_no: String,
    /// Event type, e.g. ORDER_CREATED.
    pub event_type: String,
    /// Business type, e.g. ORDER.
    pub biz_type: String,
    /// Business id.
    pub biz_id: String,
    /// Source service.
    pub event_source: String,
    /// Payload.
    pub event_payload: Value,
    /// Status.
    pub event_status: EventStatus,
    /// Retries so far.
    pub retry_count: i32,
    /// Maximum retries.
    pub max_retry_count: i32,
    /// When the next retry is due.
    pub next_retry_time: Option<DateTime<Utc>>,
    /// Last handled.
    pub last_handle_time: Option<DateTime<Utc>>,
    /// When it succeeded.
    pub success_time: Option<DateTime<Utc>>,
    /// Last failure.
    pub fail_reason: Option<String>,
    /// Trace id.
    pub trace_id: Option<String>,
    /// Remark.
    pub remark: Option<String>,
    /// Optimistic lock version, bumped by every claim.
    pub version: i32,
    /// Created at.
    pub create_time: DateTime<Utc>,
    /// Updated at.
    pub update_time: DateTime<Utc>,
}

/// A message event to create.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageEvent {
    /// The event number: derive it from the business action, so that creating twice is a no-op.
    pub event_no: String,
    /// Event type.
    pub event_type: String,
    /// Business type.
    pub biz_type: String,
    /// Business id.
    pub biz_id: String,
    /// Source service.
    pub event_source: String,
    /// Payload: the minimal snapshot the handler needs.
    pub payload: Value,
    /// Trace id.
    pub trace_id: Option<String>,
}

impl MessageEvent {
    /// The message for an envelope: biz type and id are its aggregate's.
    pub fn from_envelope(envelope: &EventEnvelope) -> MessageEvent {
        MessageEvent {
            event_no: envelope.event_id.to_string(),
            event_type: envelope.event_type.clone(),
            biz_type: envelope.aggregate_type.clone(),
            biz_id: envelope.aggregate_id.clone(),
            event_source: envelope.headers.source.clone().unwrap_or_default(),
            payload: envelope.payload.clone(),
            trace_id: envelope.trace_id.clone(),
        }
    }
}

#[doc(hidden)]
#[allow(unreachable_pub)] // unnameable outside: only the sealed backend takes it
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub(crate) event_no: String,
    pub(crate) event_type: String,
    pub(crate) biz_type: String,
    pub(crate) biz_id: String,
    pub(crate) event_source: String,
    pub(crate) event_payload: Value,
    pub(crate) max_retry_count: i32,
    pub(crate) trace_id: Option<String>,
    pub(crate) now: DateTime<Utc>,
}

/// The message event table on one database.
#[derive(Debug)]
pub struct MessageStore<DB: MessageBackend> {
    pool: Pool<DB>,
    table: TableName,
    max_retry_count: i32,
}

impl<DB: MessageBackend> MessageStore<DB> {
    /// The seed's `biz_message_event` over `pool`, with 3 retries per message.
    pub fn new(pool: Pool<DB>) -> MessageStore<DB> {
        MessageStore {
            pool,
            table: TableName::new("biz_message_event").unwrap_or_else(|_| unreachable!()),
            max_retry_count: 3,
        }
    }

    /// Uses another table with the same columns.
    pub fn table(mut self, table: TableName) -> Self {
        self.table = table;
        self
    }

    /// The `max_retry_count` written with each new message.
    pub fn max_retry_count(mut self, retries: u16) -> Self {
        self.max_retry_count = i32::from(retries);
        self
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// Creates a message; false when one with the same event number already exists (nothing is
    /// overwritten: not the payload, status or retry count).
    pub async fn create(&self, message: &MessageEvent) -> Result<bool, OutboxError> {
        for (column, value, max) in [
            ("event_no", &message.event_no, 64),
            ("event_type", &message.event_type, 64),
            ("biz_type", &message.biz_type, 64),
            ("biz_id", &message.biz_id, 64),
            ("event_source", &message.event_source, 64),
        ] {
            if value.is_empty() || value.len() > max {
                return Err(OutboxError::ValueTooLong {
                    column,
                    event_no: message.event_no.chars().take(80).collect(),
                    len: value.len(),
                    max,
                    hint: "message columns take 1 to 64 bytes",
                });
            }
        }
        let row = NewMessage {
            event_no: message.event_no.clone(),
            event_type: message.event_type.clone(),
            biz_type: message.biz_type.clone(),
            biz_id: message.biz_id.clone(),
            event_source: message.event_source.clone(),
            event_payload: message.payload.clone(),
            max_retry_count: self.max_retry_count,
            trace_id: message.trace_id.clone(),
            now: now(),
        };
        DB::insert_message(&self.pool, &self.table, &row)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// Pending messages, oldest first (查询待处理消息).
    pub async fn pending(&self, limit: u32) -> Result<Vec<MessageRecord>, OutboxError> {
        self.select(MessageSelect::Pending {
            limit: i64::from(limit),
        })
        .await
    }

    /// Failed messages with retries left whose retry time has come (查询到期可重试消息).
    pub async fn due_retries(&self, limit: u32) -> Result<Vec<MessageRecord>, OutboxError> {
        self.select(MessageSelect::DueRetries {
            now: now(),
            limit: i64::from(limit),
        })
        .await
    }

    /// Every message of one business object, oldest first (根据业务对象查询事件).
    pub async fn by_biz(
        &self,
        biz_type: &str,
        biz_id: &str,
    ) -> Result<Vec<MessageRecord>, OutboxError> {
        self.select(MessageSelect::ByBiz { biz_type, biz_id }).await
    }

    /// One message by event number (根据事件编号查询详情).
    pub async fn by_event_no(&self, event_no: &str) -> Result<Option<MessageRecord>, OutboxError> {
        Ok(self
            .select(MessageSelect::ByEventNo { event_no })
            .await?
            .into_iter()
            .next())
    }

    /// Failed messages with at least `min_retries` retries, most recent first (查询失败次数较多的消息).
    pub async fn many_failures(
        &self,
        min_retries: u16,
        limit: u32,
    ) -> Result<Vec<MessageRecord>, OutboxError> {
        self.select(MessageSelect::ManyFailures {
            min_retries: i32::from(min_retries),
            limit: i64::from(limit),
        })
        .await
    }

    /// Counts per status for messages created in `[from, to)` (统计事件处理状态).
    pub async fn status_counts(
        &self,
        event_type: Option<&str>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<StatusCounts, OutboxError> {
        let rows = DB::status_counts(
            &self.pool,
            &self.table,
            "event_status",
            event_type,
            from,
            to,
        )
        .await
        .map_err(|e| self.db_error(e))?;
        let mut counts = StatusCounts::default();
        for (status, count) in rows {
            counts.add(status, count);
        }
        Ok(counts)
    }

    /// Claims a message read as `record` (抢占): true only for the one instance whose update
    /// found it pending or failed at the version it read.
    pub async fn claim(&self, record: &MessageRecord) -> Result<bool, OutboxError> {
        self.write(MessageWrite::Claim {
            id: record.id,
            version: record.version,
            now: now(),
        })
        .await
    }

    /// Marks a claimed message succeeded (标记处理成功).
    pub async fn succeed(&self, id: i64) -> Result<bool, OutboxError> {
        self.write(MessageWrite::Succeed { id, now: now() }).await
    }

    /// Marks a claimed message failed, due again after `retry_after` (标记处理失败). False when it
    /// was not in progress or had no retries left.
    pub async fn fail(
        &self,
        id: i64,
        reason: &str,
        retry_after: std::time::Duration,
    ) -> Result<bool, OutboxError> {
        let at = now();
        let reason: String = reason.chars().take(1000).collect();
        self.write(MessageWrite::Fail {
            id,
            reason: &reason,
            next_retry_time: at + TimeDelta::from_std(retry_after).unwrap_or(TimeDelta::MAX),
            now: at,
        })
        .await
    }

    /// Cancels a failed message that used up its retries (超过最大重试次数后停止重试).
    pub async fn cancel_exhausted(&self, id: i64, reason: &str) -> Result<bool, OutboxError> {
        self.write(MessageWrite::CancelExhausted {
            id,
            reason,
            now: now(),
        })
        .await
    }

    async fn select(&self, select: MessageSelect<'_>) -> Result<Vec<MessageRecord>, OutboxError> {
        DB::select_messages(&self.pool, &self.table, &select)
            .await
            .map_err(|e| self.db_error(e))
    }

    async fn write(&self, write: MessageWrite<'_>) -> Result<bool, OutboxError> {
        let affected = DB::write_message(&self.pool, &self.table, write)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(affected == 1)
    }

    fn db_error(&self, source: sqlx::Error) -> OutboxError {
        OutboxError::Database {
            table: self.table.to_string(),
            source,
        }
    }
}

impl<DB: MessageBackend> Clone for MessageStore<DB> {
    fn clone(&self) -> Self {
        MessageStore {
            pool: self.pool.clone(),
            table: self.table.clone(),
            max_retry_count: self.max_retry_count,
        }
    }
}
