//! What operators, the console and alerts read: rows by state, aggregate or event number,
//! counts, health, search, leases and failures.

use std::ops::RangeBounds;

use chrono::{DateTime, Utc};

use crate::error::Error;
use crate::row::outbox::{
    GroupCount, Lease, MinuteCount, OutboxHealth, OutboxRecord, OutboxSearch, StatusCounts,
};
use crate::sql::dialect::Backend;
use crate::sql::outbox::{self as sql, Select};
use crate::sql::{StatusTable, operations};

use super::Outbox;

impl<DB: Backend> Outbox<DB> {
    /// Pending events, oldest first (the seed's 查询待发布事件).
    pub async fn pending(&self, limit: u32) -> Result<Vec<OutboxRecord>, Error> {
        self.select(Select::Pending {
            limit: i64::from(limit),
        })
        .await
    }

    /// Failed events with retries left whose retry time has come, earliest first.
    pub async fn due_retries(&self, limit: u32) -> Result<Vec<OutboxRecord>, Error> {
        self.select(Select::DueRetries {
            now: self.now(),
            limit: i64::from(limit),
        })
        .await
    }

    /// Events whose relay lease has expired, e.g. after a relay crashed.
    pub async fn lease_expired(&self, limit: u32) -> Result<Vec<OutboxRecord>, Error> {
        self.select(Select::LeaseExpired {
            now: self.now(),
            limit: i64::from(limit),
        })
        .await
    }

    /// Every event of one aggregate, in sequence order.
    pub async fn by_aggregate(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<Vec<OutboxRecord>, Error> {
        self.select(Select::ByAggregate {
            aggregate_type,
            aggregate_id,
        })
        .await
    }

    /// One event by its event number.
    pub async fn by_event_no(&self, event_no: &str) -> Result<Option<OutboxRecord>, Error> {
        Ok(self
            .select(Select::ByEventNo { event_no })
            .await?
            .into_iter()
            .next())
    }

    /// Row counts per status for events of one type or all, created within `created`: any
    /// range of times (`..` for every row, `from..to`, `from..`).
    ///
    /// ```no_run
    /// # async fn demo(outbox: event_sqlx::Outbox<sqlx::Sqlite>) -> Result<(), event_sqlx::Error> {
    /// let all = outbox.status_counts(None, ..).await?;
    /// let hour_ago = chrono::Utc::now() - chrono::TimeDelta::hours(1);
    /// let paid_last_hour = outbox.status_counts(Some("ORDER_PAID"), hour_ago..).await?;
    /// # Ok(()) }
    /// ```
    pub async fn status_counts(
        &self,
        event_type: Option<&str>,
        created: impl RangeBounds<DateTime<Utc>>,
    ) -> Result<StatusCounts, Error> {
        let mut conn = self.conn().await?;
        let t = StatusTable::outbox(&self.config.table);
        crate::sql::status_counts::<DB>(&mut conn, t, event_type, created)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// What a probe or an alert reads: pending, failed and expired-lease counts, and the age of
    /// the oldest pending event. Each count is answered from a status index, not a scan.
    pub async fn health(&self) -> Result<OutboxHealth, Error> {
        let now = self.now();
        let mut conn = self.conn().await?;
        let (pending, failed, expired_leases, oldest) =
            sql::health::<DB>(&mut conn, &self.config.table, now)
                .await
                .map_err(|e| self.db_error(e))?;
        Ok(OutboxHealth {
            pending,
            failed,
            expired_leases,
            oldest_pending_seconds: oldest.map(|at| (now - at).num_seconds().max(0)),
        })
    }

    /// A page of the back-office search (see [`OutboxSearch`] for the index each filter uses),
    /// newest first, at most `limit` (1 to 1000) rows.
    pub async fn search(
        &self,
        search: &OutboxSearch<'_>,
        limit: u32,
    ) -> Result<Vec<OutboxRecord>, Error> {
        let mut conn = self.conn().await?;
        crate::sql::operations::search::<DB>(
            &mut conn,
            &self.config.table,
            search,
            i64::from(limit),
        )
        .await
        .map_err(|e| self.db_error(e))
    }

    /// Rows per status as a dashboard shows them: every pending, in-progress and failed row,
    /// and the published and cancelled rows last changed at or after `since`.
    pub async fn live_counts(&self, since: DateTime<Utc>) -> Result<StatusCounts, Error> {
        let mut conn = self.conn().await?;
        let t = StatusTable::outbox(&self.config.table);
        operations::live_counts::<DB>(&mut conn, t, since)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// Failed events per topic (`by_topic`) or per event type, most first, at most `limit`.
    pub async fn failed_counts(
        &self,
        by_topic: bool,
        limit: u32,
    ) -> Result<Vec<GroupCount>, Error> {
        let mut conn = self.conn().await?;
        let column = if by_topic { "topic" } else { "event_type" };
        let t = StatusTable::outbox(&self.config.table);
        operations::failed_by::<DB>(&mut conn, t, column, i64::from(limit))
            .await
            .map_err(|e| self.db_error(e))
    }

    /// Events published and events failed per minute since `since`, oldest minute first, by
    /// the time their row last changed (minutes with neither are left out). A failed event
    /// published later counts as published.
    pub async fn per_minute(&self, since: DateTime<Utc>) -> Result<Vec<MinuteCount>, Error> {
        let mut conn = self.conn().await?;
        let t = StatusTable::outbox(&self.config.table);
        operations::per_minute::<DB>(&mut conn, t, since)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// The events each relay holds under lease (in progress), with when the leases expire: a
    /// relay whose leases are past expiry has died or stalled.
    pub async fn leases(&self) -> Result<Vec<Lease>, Error> {
        let mut conn = self.conn().await?;
        sql::leases::<DB>(&mut conn, &self.config.table)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// Failed events of one topic, most recently updated first.
    pub async fn failed_by_topic(
        &self,
        topic: &str,
        limit: u32,
    ) -> Result<Vec<OutboxRecord>, Error> {
        self.select(Select::FailedByTopic {
            topic,
            limit: i64::from(limit),
        })
        .await
    }

    /// Failed events with at least `min_retries` retries, most recently updated first.
    pub async fn many_failures(
        &self,
        min_retries: u16,
        limit: u32,
    ) -> Result<Vec<OutboxRecord>, Error> {
        self.select(Select::ManyFailures {
            min_retries: i32::from(min_retries),
            limit: i64::from(limit),
        })
        .await
    }

    pub(crate) async fn select(&self, select: Select<'_>) -> Result<Vec<OutboxRecord>, Error> {
        let mut conn = self.conn().await?;
        sql::select::<DB>(&mut conn, &self.config.table, &select)
            .await
            .map_err(|e| self.db_error(e))
    }
}
