//! The seed's message event table (`biz_message_event`): internal asynchronous work with the same
//! pending / in progress / succeeded / failed / cancelled cycle as the outbox.

use std::ops::RangeBounds;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::Pool;
use sqlx::pool::PoolConnection;

use crate::clock::{self, Clock, SharedClock};
use crate::error::Error;
use crate::row::message::{MessageEvent, MessageRecord, NewMessage};
use crate::row::outbox::StatusCounts;
use crate::sql::StatusTable;
use crate::sql::dialect::Backend;
use crate::sql::message::{self as sql, MessageSelect, MessageWrite};
use crate::table::TableName;

/// What [`MessageStore::health`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageHealth {
    /// Messages waiting to be handled.
    pub pending: i64,
    /// Messages whose last handling failed.
    pub failed: i64,
    /// Messages in progress for longer than the threshold given.
    pub stuck: i64,
    /// How long the oldest pending message has waited, in seconds.
    pub oldest_pending_seconds: Option<i64>,
}

/// The message event table on one database.
#[derive(Debug)]
pub struct MessageStore<DB: Backend> {
    pool: Pool<DB>,
    table: TableName,
    archive: TableName,
    max_retry_count: i32,
    clock: SharedClock,
}

impl<DB: Backend> MessageStore<DB> {
    /// The seed's `biz_message_event` over `pool`, with 3 retries per message.
    pub fn new(pool: Pool<DB>) -> MessageStore<DB> {
        MessageStore {
            pool,
            table: TableName::new("biz_message_event").unwrap_or_else(|_| unreachable!()),
            archive: TableName::new("biz_message_event_archive").unwrap_or_else(|_| unreachable!()),
            max_retry_count: 3,
            clock: clock::system(),
        }
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
        self.pool.acquire().await.map_err(|e| self.db_error(e))
    }

    /// Uses another table with the same columns.
    pub fn table(mut self, table: TableName) -> Self {
        self.table = table;
        self
    }

    /// Archives to another table with the same columns.
    pub fn archive_table(mut self, table: TableName) -> Self {
        self.archive = table;
        self
    }

    /// How many succeeded or cancelled messages last updated more than `older_than` ago a
    /// [`MessageStore::archive`] would move now.
    pub async fn archivable(&self, older_than: std::time::Duration) -> Result<u64, Error> {
        let cutoff = clock::before(self.now(), older_than);
        crate::archive::archivable(&self.pool, self.archived(), cutoff).await
    }

    /// Moves succeeded and cancelled messages last updated more than `older_than` ago to the
    /// archive table (`biz_message_event_archive`), `batch` per transaction, as
    /// [`Outbox::archive`](crate::Outbox::archive) does for the outbox.
    pub async fn archive(
        &self,
        older_than: std::time::Duration,
        batch: u32,
        progress: impl FnMut(u64),
    ) -> Result<crate::archive::ArchiveReport, Error> {
        let cutoff = clock::before(self.now(), older_than);
        crate::archive::run(&self.pool, self.archived(), cutoff, batch, progress).await
    }

    /// Deletes archived messages last updated more than `older_than` ago; returns how many.
    pub async fn purge_archive(
        &self,
        older_than: std::time::Duration,
        batch: u32,
    ) -> Result<u64, Error> {
        let cutoff = clock::before(self.now(), older_than);
        crate::archive::purge(&self.pool, &self.archive, cutoff, batch).await
    }

    fn archived(&self) -> crate::sql::archive::Archived<'_> {
        crate::sql::archive::Archived {
            live: &self.table,
            archive: &self.archive,
            columns: sql::COLUMNS,
            status_column: "event_status",
        }
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
    pub async fn create(&self, message: &MessageEvent) -> Result<bool, Error> {
        for (column, value, max) in [
            ("event_no", &message.event_no, 64),
            ("event_type", &message.event_type, 64),
            ("biz_type", &message.biz_type, 64),
            ("biz_id", &message.biz_id, 64),
            ("event_source", &message.event_source, 64),
        ] {
            if value.is_empty() || value.len() > max {
                return Err(Error::ValueTooLong {
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
            now: self.now(),
        };
        let mut conn = self.conn().await?;
        sql::insert::<DB>(&mut conn, &self.table, &row)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// Pending messages, oldest first (查询待处理消息).
    pub async fn pending(&self, limit: u32) -> Result<Vec<MessageRecord>, Error> {
        self.select(MessageSelect::Pending {
            limit: i64::from(limit),
        })
        .await
    }

    /// Failed messages with retries left whose retry time has come (查询到期可重试消息).
    pub async fn due_retries(&self, limit: u32) -> Result<Vec<MessageRecord>, Error> {
        self.select(MessageSelect::DueRetries {
            now: self.now(),
            limit: i64::from(limit),
        })
        .await
    }

    /// Every message of one business object, oldest first (根据业务对象查询事件).
    pub async fn by_biz(&self, biz_type: &str, biz_id: &str) -> Result<Vec<MessageRecord>, Error> {
        self.select(MessageSelect::ByBiz { biz_type, biz_id }).await
    }

    /// One message by event number (根据事件编号查询详情).
    pub async fn by_event_no(&self, event_no: &str) -> Result<Option<MessageRecord>, Error> {
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
    ) -> Result<Vec<MessageRecord>, Error> {
        self.select(MessageSelect::ManyFailures {
            min_retries: i32::from(min_retries),
            limit: i64::from(limit),
        })
        .await
    }

    /// Rows per status as a dashboard shows them: every pending, in-progress and failed row,
    /// and the succeeded and cancelled rows last changed at or after `since`.
    pub async fn live_counts(&self, since: DateTime<Utc>) -> Result<StatusCounts, Error> {
        let mut conn = self.conn().await?;
        let t = StatusTable::messages(&self.table);
        crate::sql::operations::live_counts::<DB>(&mut conn, t, since)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// Counts per status for messages of one type or all, created within `created`: any range
    /// of times (`..` for every row) (统计事件处理状态).
    pub async fn status_counts(
        &self,
        event_type: Option<&str>,
        created: impl RangeBounds<DateTime<Utc>>,
    ) -> Result<StatusCounts, Error> {
        let mut conn = self.conn().await?;
        let t = StatusTable::messages(&self.table);
        crate::sql::status_counts::<DB>(&mut conn, t, event_type, created)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// Claims a message read as `record` (抢占): true only for the one instance whose update
    /// found it pending or failed at the version it read.
    pub async fn claim(&self, record: &MessageRecord) -> Result<bool, Error> {
        self.write(MessageWrite::Claim {
            id: record.id,
            version: record.version,
            now: self.now(),
        })
        .await
    }

    /// Marks a claimed message succeeded (标记处理成功).
    pub async fn succeed(&self, id: i64) -> Result<bool, Error> {
        self.write(MessageWrite::Succeed {
            id,
            now: self.now(),
        })
        .await
    }

    /// Marks a claimed message failed, due again after `retry_after` (标记处理失败). False when it
    /// was not in progress or had no retries left.
    pub async fn fail(
        &self,
        id: i64,
        reason: &str,
        retry_after: std::time::Duration,
    ) -> Result<bool, Error> {
        let at = self.now();
        let reason: String = reason.chars().take(1000).collect();
        self.write(MessageWrite::Fail {
            id,
            reason: &reason,
            next_retry_time: clock::after(at, retry_after),
            now: at,
        })
        .await
    }

    /// Cancels a failed message that used up its retries (超过最大重试次数后停止重试).
    pub async fn cancel_exhausted(&self, id: i64, reason: &str) -> Result<bool, Error> {
        self.write(MessageWrite::CancelExhausted {
            id,
            reason,
            now: self.now(),
        })
        .await
    }

    /// Cancels a failed message whatever its retries (a handler's permanent failure).
    pub async fn cancel_failed(&self, id: i64, reason: &str) -> Result<bool, Error> {
        self.write(MessageWrite::CancelFailed {
            id,
            reason,
            now: self.now(),
        })
        .await
    }

    /// Puts a failed message back to pending, due now, with its retries counted afresh (an
    /// operator's retry). False when it does not exist or is not failed.
    pub async fn retry(&self, event_no: &str) -> Result<bool, Error> {
        self.write(MessageWrite::Retry {
            event_no,
            now: self.now(),
        })
        .await
    }

    /// Cancels a pending or failed message with the operator's reason. False when it does not
    /// exist or is in progress, succeeded or cancelled.
    pub async fn cancel(&self, event_no: &str, reason: &str) -> Result<bool, Error> {
        let reason: String = reason.chars().take(1000).collect();
        self.write(MessageWrite::Cancel {
            event_no,
            reason: &reason,
            now: self.now(),
        })
        .await
    }

    /// Pending and failed counts, messages in progress for longer than `stuck_after` (their
    /// worker died or hangs), and the oldest pending message's age: a few status-index queries,
    /// cheap enough for a probe.
    pub async fn health(&self, stuck_after: std::time::Duration) -> Result<MessageHealth, Error> {
        let now = self.now();
        let mut conn = self.conn().await?;
        let (pending, failed, stuck, oldest) =
            sql::health::<DB>(&mut conn, &self.table, clock::before(now, stuck_after))
                .await
                .map_err(|e| self.db_error(e))?;
        Ok(MessageHealth {
            pending,
            failed,
            stuck,
            oldest_pending_seconds: oldest.map(|at| (now - at).num_seconds().max(0)),
        })
    }

    async fn select(&self, select: MessageSelect<'_>) -> Result<Vec<MessageRecord>, Error> {
        let mut conn = self.conn().await?;
        sql::select::<DB>(&mut conn, &self.table, &select)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// One guarded write. The outcome of handled work (succeeded, failed, cancelled) is tried
    /// again on fresh connections for up to 30 s when the connection drops, so a message handled
    /// is not left in progress; each write checks the state it expects, so a try whose commit
    /// reached the database and whose answer was lost changes nothing the second time. A claim
    /// is not tried again: a lost claim is someone else's to take.
    async fn write(&self, write: MessageWrite<'_>) -> Result<bool, Error> {
        let deadline = (!matches!(write, MessageWrite::Claim { .. }))
            .then(|| tokio::time::Instant::now() + std::time::Duration::from_secs(30));
        let (pool, table) = (&self.pool, &self.table);
        let affected = crate::sql::retry_transient(
            || {
                let write = write.clone();
                async move {
                    let mut conn = pool.acquire().await?;
                    sql::write::<DB>(&mut conn, table, write).await
                }
            },
            deadline,
        )
        .await
        .map_err(|e| self.db_error(e))?;
        Ok(affected == 1)
    }

    fn db_error(&self, source: sqlx::Error) -> Error {
        Error::database(&self.table, source)
    }
}

impl<DB: Backend> Clone for MessageStore<DB> {
    fn clone(&self) -> Self {
        MessageStore {
            pool: self.pool.clone(),
            table: self.table.clone(),
            archive: self.archive.clone(),
            max_retry_count: self.max_retry_count,
            clock: Arc::clone(&self.clock),
        }
    }
}
