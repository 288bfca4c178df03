//! The operators' audit trail (`operation_audit`): what the web console changed, who changed it,
//! when, on which rows and why.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::Pool;

use crate::clock::{self, Clock, SharedClock};
use crate::error::Error;
use crate::row::audit::{AuditEntry, Consumption, NewAuditEntry};
use crate::sql::dialect::Backend;
use crate::sql::operations as sql;
use crate::table::TableName;

/// The audit trail on one database. Entries are only ever added.
#[derive(Debug)]
pub struct AuditLog<DB: Backend> {
    pool: Pool<DB>,
    table: TableName,
    clock: SharedClock,
}

impl<DB: Backend> Clone for AuditLog<DB> {
    fn clone(&self) -> Self {
        AuditLog {
            pool: self.pool.clone(),
            table: self.table.clone(),
            clock: Arc::clone(&self.clock),
        }
    }
}

impl<DB: Backend> AuditLog<DB> {
    /// `operation_audit` over `pool` (created by [`Outbox::migrate`](crate::Outbox::migrate)).
    pub fn new(pool: Pool<DB>) -> AuditLog<DB> {
        AuditLog {
            pool,
            table: TableName::new("operation_audit").unwrap_or_else(|_| unreachable!()),
            clock: clock::system(),
        }
    }

    /// Reads the time from `clock` instead of the system clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    fn now(&self) -> DateTime<Utc> {
        clock::stored_now(&*self.clock)
    }

    /// Appends `entry` and returns its id. Text longer than its column is cut.
    ///
    /// To record an action so that the trail never misses one that happened, append the entry
    /// before acting, with an outcome that says it started, then [`AuditLog::settle`] it with
    /// what the action did: a process that dies in between leaves the entry saying so.
    pub async fn record(&self, entry: &NewAuditEntry) -> Result<i64, Error> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| Error::database(&self.table, e))?;
        sql::record_audit::<DB>(&mut conn, &self.table, entry, self.now())
            .await
            .map_err(|e| Error::database(&self.table, e))
    }

    /// Sets what the action recorded as entry `id` did: the rows it changed and its outcome.
    /// False when no entry has that id.
    pub async fn settle(
        &self,
        id: i64,
        affected_rows: &[String],
        outcome: &str,
    ) -> Result<bool, Error> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| Error::database(&self.table, e))?;
        sql::settle_audit::<DB>(&mut conn, &self.table, id, affected_rows, outcome)
            .await
            .map_err(|e| Error::database(&self.table, e))
    }

    /// Entries newest first, with ids below `before_id` (`i64::MAX` for the first page), at
    /// most `limit` (1 to 1000).
    pub async fn entries(&self, before_id: i64, limit: u32) -> Result<Vec<AuditEntry>, Error> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| Error::database(&self.table, e))?;
        sql::audit_entries::<DB>(&mut conn, &self.table, before_id, i64::from(limit))
            .await
            .map_err(|e| Error::database(&self.table, e))
    }
}

/// Every consumer's record of having consumed `event_id`, from the inbox table
/// (`consumed_event`) on `pool`: one index probe per consumer.
pub async fn consumptions<DB: Backend>(
    pool: &Pool<DB>,
    event_id: &str,
) -> Result<Vec<Consumption>, Error> {
    let table = TableName::new("consumed_event").unwrap_or_else(|_| unreachable!());
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| Error::database(&table, e))?;
    sql::consumptions::<DB>(&mut conn, &table, event_id)
        .await
        .map_err(|e| Error::database(&table, e))
}
