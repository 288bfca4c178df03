//! The outbox: events written in the business transaction, and the seed's queries over them.

use std::collections::HashSet;
use std::ops::RangeBounds;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use event_core::{EventEnvelope, EventNo, UnitOfWork};
use sqlx::pool::PoolConnection;
use sqlx::{Pool, Transaction};
use tokio::sync::Notify;

use crate::clock::{self, Clock};
use crate::config::outbox::{CommitPath, OutboxConfig};
use crate::error::Error;
use crate::publisher::{OutboxMessage, Publisher};
use crate::row::outbox::{
    FlushReport, GroupCount, Lease, MinuteCount, NewOutboxRow, OutboxHealth, OutboxRecord,
    OutboxSearch, StatusCounts,
};
use crate::sql::dialect::{Backend, Dialect};
use crate::sql::outbox::{self as sql, Select};

/// The transactional outbox on one database.
///
/// A repository saves its state and calls [`Outbox::commit`] with the same transaction: state and
/// events commit together, or, when the transaction is dropped, neither does. A [`Relay`]
/// (from [`Outbox::relay`]) then publishes the committed events.
///
/// [`Relay`]: crate::Relay
pub struct Outbox<DB: Backend> {
    pool: Pool<DB>,
    config: Arc<OutboxConfig>,
    wakeup: Arc<Notify>,
    /// What [`CommitPath::Auto`] timed and chose, and the one-row statements in use, shared
    /// with clones.
    commit_state: Arc<CommitState>,
}

/// [`Outbox::commit`]'s state on PostgreSQL.
#[derive(Debug, Default)]
struct CommitState {
    /// [`CommitPath::Auto`]'s choice, read on every commit without a lock: [`UNMEASURED`] (0,
    /// the default), [`ONE_TRIP`] or [`BOUND`].
    chosen: AtomicU8,
    /// The commits timed on each path until it chooses.
    trial: std::sync::Mutex<PathTrial>,
    /// The one-row INSERT statements the bound path prepares (one per event type and route, see
    /// [`sql::one_row_insert`]), at most [`ONE_ROW_STATEMENTS`].
    one_row_statements: std::sync::Mutex<HashSet<String>>,
}

/// One-row statements kept per outbox: each is prepared once per pooled connection, and sqlx
/// keeps 100 prepared statements per connection by default. Events of more types than this
/// are written with every value bound, in one statement for all of them.
const ONE_ROW_STATEMENTS: usize = 32;

/// Successful commits timed per path while [`CommitPath::Auto`] tries both.
#[derive(Debug, Default)]
struct PathTrial {
    one_trip: Vec<Duration>,
    bound: Vec<Duration>,
}

/// Commits timed on each path before [`CommitPath::Auto`] chooses, after [`TRIAL_WARM_UP`]
/// untimed ones.
const TRIAL_COMMITS: usize = 12;

/// The first commits on each path, not timed: the bound path's first ones prepare their
/// statement, and the server's caches are cold.
const TRIAL_WARM_UP: usize = 2;

const UNMEASURED: u8 = 0;
const ONE_TRIP: u8 = 1;
const BOUND: u8 = 2;

impl<DB: Backend> Clone for Outbox<DB> {
    fn clone(&self) -> Self {
        Outbox {
            pool: self.pool.clone(),
            config: Arc::clone(&self.config),
            wakeup: Arc::clone(&self.wakeup),
            commit_state: Arc::clone(&self.commit_state),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Outbox<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("dialect", &DB::DIALECT)
            .field("table", &self.config.table)
            .finish_non_exhaustive()
    }
}

impl<DB: Backend> Outbox<DB> {
    /// The outbox over `pool`.
    pub fn new(pool: Pool<DB>, config: OutboxConfig) -> Outbox<DB> {
        Outbox {
            pool,
            config: Arc::new(config),
            wakeup: Arc::new(Notify::new()),
            commit_state: Arc::default(),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// The settings.
    pub fn config(&self) -> &OutboxConfig {
        &self.config
    }

    /// The way [`Outbox::commit`] sends events on PostgreSQL: the configured
    /// [`CommitPath`], or with [`CommitPath::Auto`] the path its first commits measured as the
    /// faster (`Auto` until then, and on MySQL and SQLite).
    pub fn commit_path(&self) -> CommitPath {
        match (
            self.config.commit_path,
            self.commit_state.chosen.load(Ordering::Relaxed),
        ) {
            (CommitPath::Auto, ONE_TRIP) => CommitPath::OneTrip,
            (CommitPath::Auto, BOUND) => CommitPath::Bound,
            (path, _) => path,
        }
    }

    /// This outbox reading the time from `clock` (see [`OutboxConfig::clock`]); its relays too.
    /// Relays already made keep the clock they had.
    pub fn with_clock(mut self, clock: impl Clock) -> Outbox<DB> {
        self.config = Arc::new(OutboxConfig::clone(&self.config).clock(clock));
        self
    }

    /// The current time of the outbox's clock, as stored.
    pub(crate) fn now(&self) -> DateTime<Utc> {
        clock::stored_now(&*self.config.clock)
    }

    /// A connection from the pool.
    pub(crate) async fn conn(&self) -> Result<PoolConnection<DB>, Error> {
        self.pool.acquire().await.map_err(|e| self.db_error(e))
    }

    /// Creates the event tables (`biz_outbox_event`, `biz_message_event`, `consumed_event`) if
    /// they are missing. The migrations keep their own history table, `event_toolkit_migrations`,
    /// so they live beside the application's own sqlx migrations. On SQLite it also switches the
    /// database file to WAL journaling (a setting kept in the file), so that relays read while
    /// the service writes.
    ///
    /// It also takes the planner's statistics of the outbox table (PostgreSQL, MySQL), so that
    /// the relay's claim uses its index even on a table just filled.
    ///
    /// Then it gives the outbox table the indexes of the configured [`IndexProfile`]
    /// (`OutboxConfig::index_profile`); asking for the lean profile on MySQL or SQLite is an
    /// error that says so, after the migrations ran.
    ///
    /// [`IndexProfile`]: crate::IndexProfile
    pub async fn migrate(&self) -> Result<(), Error> {
        DB::migrate(&self.pool).await.map_err(Error::Migrate)?;
        let profile = self.config.index_profile;
        let default = OutboxConfig::new();
        if profile != crate::config::outbox::IndexProfile::Seed
            && (self.config.table != default.table
                || self.config.archive_table != default.archive_table)
        {
            // Index names are global in a PostgreSQL schema: the profile's statements name the
            // migrations' indexes, which belong to the migrations' tables.
            return Err(Error::Misconfigured(
                "index profiles apply to the tables the migrations create (biz_outbox_event, biz_outbox_event_archive); manage the indexes of another table yourself",
            ));
        }
        let Some(statements) = crate::sql::profile::statements(
            DB::DIALECT,
            profile,
            self.config.table.as_str(),
            self.config.archive_table.as_str(),
        ) else {
            return Err(Error::Misconfigured(
                "the lean index profile exists for PostgreSQL only: migrate MySQL and SQLite with IndexProfile::Seed (the default)",
            ));
        };
        let custom = self.config.table != default.table;
        let mut conn = self.conn().await?;
        // Another table than the migrations' keeps the indexes it was created with.
        for statement in statements.into_iter().filter(|_| !custom) {
            crate::sql::dialect::Sql::<DB>::new(statement)
                .execute(&mut conn)
                .await
                .map_err(|e| self.db_error(e))?;
        }
        drop(conn);
        self.analyze().await
    }

    /// Takes the planner's statistics of the outbox table (`ANALYZE`; nothing on SQLite, whose
    /// claim does not depend on them). Run it after loading or archiving many rows; relays take
    /// them on start when they are missing or stale ([`Outbox::ensure_statistics`]).
    pub async fn analyze(&self) -> Result<(), Error> {
        let mut conn = self.conn().await?;
        sql::analyze::<DB>(&mut conn, &self.config.table)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// Takes the outbox table's statistics when they are missing or stale (PostgreSQL: never
    /// taken, or more than 10,000 rows written since, as after a bulk load or a backlog that
    /// autovacuum has not caught up with); otherwise one cheap catalog query. Returns whether it
    /// took them. Relays call it when they start.
    pub async fn ensure_statistics(&self) -> Result<bool, Error> {
        let mut conn = self.conn().await?;
        if !sql::stale_statistics::<DB>(&mut conn, &self.config.table)
            .await
            .map_err(|e| self.db_error(e))?
        {
            return Ok(false);
        }
        tracing::info!(table = %self.config.table, "the outbox table's statistics are missing or stale; taking them");
        sql::analyze::<DB>(&mut conn, &self.config.table)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(true)
    }

    /// Writes `envelopes` to the outbox on `conn`, normally the business transaction, with one
    /// multi-row statement per 500 events.
    ///
    /// An event whose event number is already in the outbox is reported in
    /// [`FlushReport::already_recorded`] and its stored row is left exactly as it was. Every
    /// envelope is validated before anything is written: one that is too large or does not fit
    /// its columns fails the whole flush and nothing is written.
    pub async fn flush(
        &self,
        conn: &mut DB::Connection,
        envelopes: &[EventEnvelope],
    ) -> Result<FlushReport, Error> {
        let (rows, report) = self.rows_for(envelopes)?;
        self.flush_rows(conn, rows, report).await
    }

    /// [`Outbox::flush`] of rows already made by [`Outbox::rows_for`].
    async fn flush_rows(
        &self,
        conn: &mut DB::Connection,
        rows: Vec<NewOutboxRow>,
        mut report: FlushReport,
    ) -> Result<FlushReport, Error> {
        if rows.is_empty() {
            return Ok(report);
        }
        let inserted = match sql::insert::<DB>(conn, &self.config.table, &rows).await {
            Ok(inserted) => inserted,
            Err(e) => return Err(self.write_error(conn, e, &rows).await),
        };
        if !inserted.is_empty()
            && let Some(channel) = &self.config.notify_channel
        {
            sql::notify_commit::<DB>(conn, channel)
                .await
                .map_err(|e| self.db_error(e))?;
        }
        let inserted: HashSet<&str> = inserted.iter().map(String::as_str).collect();
        for row in &rows {
            let no = EventNo::from_rendered(&row.event_no);
            if inserted.contains(row.event_no.as_str()) {
                report.recorded.push(no);
            } else {
                report.already_recorded.push(no);
            }
        }
        Ok(report)
    }

    /// The rows of `envelopes`, each validated, the second of two with one event number left
    /// out and reported as already recorded.
    fn rows_for(
        &self,
        envelopes: &[EventEnvelope],
    ) -> Result<(Vec<NewOutboxRow>, FlushReport), Error> {
        let mut seen = HashSet::with_capacity(envelopes.len());
        let mut rows = Vec::with_capacity(envelopes.len());
        let mut report = FlushReport::default();
        for envelope in envelopes {
            let row = self.row_for(envelope)?;
            if seen.insert(envelope.event_id.as_str()) {
                rows.push(row);
            } else {
                report.already_recorded.push(envelope.event_id.clone());
            }
        }
        Ok((rows, report))
    }

    /// Flushes the unit of work's events into `tx` and commits `tx` with them, or rolls it back
    /// when the command had already been applied; wakes this process's relays.
    ///
    /// State is committed only together with the events that describe it:
    /// - every event is new: state and events commit ([`Commit::Committed`]);
    /// - every event was already recorded (a retried command, or a concurrent command that did
    ///   the same thing from the same stale state): nothing is committed, the caller's state
    ///   changes included, and the result is [`Commit::AlreadyApplied`]. The command succeeded
    ///   before; answer as for a success;
    /// - some events were recorded before and others are new: the command ran on a stale state.
    ///   Nothing is committed: [`Error::PartlyRecorded`];
    /// - an event takes a sequence another event holds: [`Error::SequenceConflict`].
    ///
    /// After either error, reload the aggregate and run the command again.
    /// [`OutboxConfig::commit_state_on_duplicates`] keeps the state of a command whose events
    /// were all or partly recorded before.
    ///
    /// On PostgreSQL the events can travel with the `COMMIT`: one round trip writes them and
    /// commits, where [`Outbox::flush`] then `tx.commit()` take two, but the server parses the
    /// statement each time. By default the outbox times its first commits both ways and keeps
    /// to the faster; [`OutboxConfig::commit_path`] fixes the choice (see [`CommitPath`]).
    /// (Never in a savepoint, nor with [`OutboxConfig::commit_state_on_duplicates`], which need
    /// the flush's duplicate detection inside the transaction.)
    pub async fn commit(
        &self,
        mut tx: Transaction<'_, DB>,
        uow: UnitOfWork,
    ) -> Result<Commit, Error> {
        let envelopes = uow.commit();
        let (rows, report) = self.rows_for(&envelopes)?;
        if DB::DIALECT == Dialect::Postgres
            && !self.config.commit_state_on_duplicates
            && DB::transaction_depth(&tx) == 1
            && sql::fit_one_statement(&rows)
        {
            let path = self.commit_path();
            let one_trip = match path {
                CommitPath::Auto => self.next_trial_path(),
                path => path == CommitPath::OneTrip,
            };
            // Text holding a NUL has no literal: bound, where the database reports it.
            let script = one_trip
                .then(|| sql::literal_insert(&self.config.table, &rows))
                .flatten()
                .and_then(|insert| {
                    sql::insert_and_commit_script(insert, self.config.notify_channel.as_deref())
                });
            let started = std::time::Instant::now();
            let (result, timed_one_trip) = match script {
                Some(script) => (
                    self.commit_in_one_trip(tx, script, rows, report).await,
                    true,
                ),
                None => (self.commit_bound(tx, rows, report).await, false),
            };
            if path == CommitPath::Auto && matches!(result, Ok(Commit::Committed(_))) {
                self.record_trial(timed_one_trip, started.elapsed());
            }
            return result;
        }
        let report = self.flush_rows(&mut tx, rows, report).await?;
        // Duplicates within this unit of work are not news of an earlier command.
        let stored_before: Vec<&EventNo> = report
            .already_recorded
            .iter()
            .filter(|no| !report.recorded.contains(no))
            .collect();
        if !stored_before.is_empty() && !self.config.commit_state_on_duplicates {
            let first = stored_before[0].clone();
            tx.rollback().await.map_err(|e| self.db_error(e))?;
            let aggregate = envelopes
                .iter()
                .find(|e| e.event_id == first)
                .map(|e| (e.aggregate_type.clone(), e.aggregate_id.clone()));
            return Self::stored_before(report, &first, aggregate);
        }
        tx.commit().await.map_err(|e| self.db_error(e))?;
        if !report.recorded.is_empty() {
            self.notify_relays();
        }
        Ok(Commit::Committed(report))
    }

    /// What a rolled-back commit answers when some of its events were recorded before: `first`
    /// of them, of `aggregate` (type, id).
    fn stored_before(
        report: FlushReport,
        first: &EventNo,
        aggregate: Option<(String, String)>,
    ) -> Result<Commit, Error> {
        if report.recorded.is_empty() {
            return Ok(Commit::AlreadyApplied(report));
        }
        let (aggregate_type, aggregate_id) = aggregate.unwrap_or_default();
        Err(Error::PartlyRecorded {
            aggregate_type,
            aggregate_id,
            event_no: first.to_string(),
            new: report.recorded.len(),
        })
    }

    /// [`CommitPath::Auto`] before it has chosen: whether this commit tries the one-trip path
    /// (the path with fewer timed commits so far).
    fn next_trial_path(&self) -> bool {
        match self.commit_state.trial.lock() {
            Ok(trial) => trial.one_trip.len() <= trial.bound.len(),
            Err(_) => false,
        }
    }

    /// Records a successful commit's duration on one path; once each path has
    /// [`TRIAL_WARM_UP`] + [`TRIAL_COMMITS`], keeps the faster (see [`faster_path`]) for this
    /// outbox and its clones.
    fn record_trial(&self, one_trip: bool, took: Duration) {
        let Ok(mut trial) = self.commit_state.trial.lock() else {
            return;
        };
        if self.commit_state.chosen.load(Ordering::Relaxed) != UNMEASURED {
            return;
        }
        if one_trip {
            trial.one_trip.push(took);
        } else {
            trial.bound.push(took);
        }
        let enough = TRIAL_WARM_UP + TRIAL_COMMITS;
        if trial.one_trip.len() < enough || trial.bound.len() < enough {
            return;
        }
        let PathTrial { one_trip, bound } = std::mem::take(&mut *trial);
        let (chosen, one_trip, bound) = faster_path(one_trip, bound);
        self.commit_state.chosen.store(chosen, Ordering::Relaxed);
        tracing::debug!(
            table = %self.config.table,
            one_trip_us = one_trip.as_micros() as u64,
            bound_us = bound.as_micros() as u64,
            chosen = if chosen == ONE_TRIP { "one trip" } else { "bound" },
            "timed both ways of sending events with the commit"
        );
    }

    /// [`Outbox::commit`] on PostgreSQL: `script` inserts `rows`, commits, and opens an empty
    /// transaction in place of the committed one, which sqlx rolls back when the connection is
    /// next used (or returned to its pool). A duplicate fails the INSERT, which ends the script
    /// before its COMMIT: the transaction is rolled back, and which events were stored before
    /// is read afterwards.
    async fn commit_in_one_trip(
        &self,
        mut tx: Transaction<'_, DB>,
        script: String,
        rows: Vec<NewOutboxRow>,
        report: FlushReport,
    ) -> Result<Commit, Error> {
        match DB::execute_script(&mut tx, script).await {
            Ok(()) => {
                drop(tx);
                Ok(self.committed(&rows, report))
            }
            // The INSERT failed, and the transaction is aborted; or the COMMIT failed (a
            // deferred constraint of the caller's, a serialization failure), and it has ended
            // already, so that the ROLLBACK only draws a warning from the server.
            Err(source) => self.failed_commit(tx, source, rows, report).await,
        }
    }

    /// [`Outbox::commit`] on PostgreSQL with [`CommitPath::Bound`]: a plain INSERT of `rows`
    /// with bound values, then the COMMIT. A duplicate fails the INSERT (cheaper than `ON
    /// CONFLICT` on every commit); the transaction is rolled back, and which events were stored
    /// before is read afterwards.
    async fn commit_bound(
        &self,
        mut tx: Transaction<'_, DB>,
        rows: Vec<NewOutboxRow>,
        report: FlushReport,
    ) -> Result<Commit, Error> {
        let mut written = match self.one_row_insert(&rows) {
            Some((statement, values)) => sql::insert_one::<DB>(&mut tx, statement, &values).await,
            None => sql::insert_plain::<DB>(&mut tx, &self.config.table, &rows).await,
        };
        if written.is_ok()
            && let Some(channel) = &self.config.notify_channel
        {
            written = sql::notify_commit::<DB>(&mut tx, channel).await;
        }
        match written {
            Ok(()) => {
                tx.commit().await.map_err(|e| self.db_error(e))?;
                Ok(self.committed(&rows, report))
            }
            Err(source) => self.failed_commit(tx, source, rows, report).await,
        }
    }

    /// The one-row INSERT of `rows` (see [`sql::one_row_insert`]) when they are one row and its
    /// statement is one of the [`ONE_ROW_STATEMENTS`] this outbox keeps.
    fn one_row_insert<'r>(
        &self,
        rows: &'r [NewOutboxRow],
    ) -> Option<(String, [crate::sql::dialect::Value<'r>; sql::OWN_VALUES])> {
        let [row] = rows else { return None };
        let (statement, values) = sql::one_row_insert(&self.config.table, row)?;
        let mut kept = self.commit_state.one_row_statements.lock().ok()?;
        if !kept.contains(&statement) {
            if kept.len() >= ONE_ROW_STATEMENTS {
                return None;
            }
            kept.insert(statement.clone());
        }
        Some((statement, values))
    }

    /// A commit of `rows` done: all of them recorded; the relays woken.
    fn committed(&self, rows: &[NewOutboxRow], mut report: FlushReport) -> Commit {
        report.recorded = rows
            .iter()
            .map(|row| EventNo::from_rendered(&row.event_no))
            .collect();
        self.notify_relays();
        Commit::Committed(report)
    }

    /// A commit whose INSERT of `rows` (or its COMMIT) failed with `source`: rolls back, and
    /// answers as the flush's duplicate detection would have.
    async fn failed_commit(
        &self,
        tx: Transaction<'_, DB>,
        source: sqlx::Error,
        rows: Vec<NewOutboxRow>,
        mut report: FlushReport,
    ) -> Result<Commit, Error> {
        if let Err(e) = tx.rollback().await {
            tracing::debug!(error = %e, "rolling back after a failed commit");
        }
        if DB::DIALECT.violated_key(&source).is_none() {
            return Err(self.db_error(source));
        }
        // A unique key refused a row: its event number (a command applied before), or its
        // aggregate sequence (a stale command), or both. Which of the events are stored now
        // decides, as the flush's duplicate detection would have.
        let numbers: Vec<&str> = rows.iter().map(|row| row.event_no.as_str()).collect();
        let mut conn = self.conn().await?;
        let stored: HashSet<String> =
            sql::stored_event_nos::<DB>(&mut conn, &self.config.table, &numbers)
                .await
                .map_err(|e| self.db_error(e))?
                .into_iter()
                .collect();
        // A sequence conflict on a row that is new; with nothing stored, whatever the key said.
        let conflict = sql::sequence_conflict::<DB>(&mut conn, &self.config.table, &rows, &source)
            .await
            .filter(|&i| !stored.contains(&rows[i.min(rows.len() - 1)].event_no));
        drop(conn);
        if stored.is_empty() || conflict.is_some() {
            return Err(self.conflict_error(source, &rows, conflict));
        }
        let mut first: Option<&NewOutboxRow> = None;
        for row in &rows {
            let no = EventNo::from_rendered(&row.event_no);
            if stored.contains(&row.event_no) {
                first.get_or_insert(row);
                report.already_recorded.push(no);
            } else {
                report.recorded.push(no);
            }
        }
        let first = first.unwrap_or(&rows[0]);
        Self::stored_before(
            report,
            &EventNo::from_rendered(&first.event_no),
            Some((first.aggregate_type.clone(), first.aggregate_id.clone())),
        )
    }

    /// Wakes this process's relays, e.g. after committing a flush done with [`Outbox::flush`].
    pub fn notify_relays(&self) {
        self.wakeup.notify_one();
    }

    pub(crate) fn wakeup(&self) -> &Arc<Notify> {
        &self.wakeup
    }

    /// The sequence of the aggregate's last recorded event (0 when it has none): the version to
    /// load it at (`RecordedEvents::loaded_at`).
    pub async fn aggregate_version(
        &self,
        conn: &mut DB::Connection,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<u64, Error> {
        let mut version =
            sql::aggregate_version::<DB>(conn, &self.config.table, aggregate_type, aggregate_id)
                .await
                .map_err(|e| self.db_error(e))?;
        if version == 0 {
            // Every event of it may have been archived.
            version = sql::aggregate_version::<DB>(
                conn,
                &self.config.archive_table,
                aggregate_type,
                aggregate_id,
            )
            .await
            .map_err(|e| Error::database(&self.config.archive_table, e))?;
        }
        Ok(u64::try_from(version).unwrap_or(0))
    }

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
        let created = (created.start_bound().cloned(), created.end_bound().cloned());
        let mut conn = self.conn().await?;
        let rows = crate::sql::status_counts::<DB>(
            &mut conn,
            &self.config.table,
            "publish_status",
            event_type,
            created,
        )
        .await
        .map_err(|e| self.db_error(e))?;
        let mut counts = StatusCounts::default();
        for (status, count) in rows {
            counts.add(status, count);
        }
        Ok(counts)
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
        crate::sql::operations::live_counts::<DB>(
            &mut conn,
            &self.config.table,
            "publish_status",
            since,
        )
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
        crate::sql::operations::failed_by::<DB>(
            &mut conn,
            &self.config.table,
            "publish_status",
            column,
            i64::from(limit),
        )
        .await
        .map_err(|e| self.db_error(e))
    }

    /// Events published and events failed per minute since `since`, oldest minute first, by
    /// the time their row last changed (minutes with neither are left out). A failed event
    /// published later counts as published.
    pub async fn per_minute(&self, since: DateTime<Utc>) -> Result<Vec<MinuteCount>, Error> {
        let mut conn = self.conn().await?;
        crate::sql::operations::per_minute::<DB>(
            &mut conn,
            &self.config.table,
            "publish_status",
            since,
        )
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

    /// How many published or cancelled events last updated more than `older_than` ago an
    /// [`Outbox::archive`] would move now.
    pub async fn archivable(&self, older_than: Duration) -> Result<u64, Error> {
        let cutoff = clock::before(self.now(), older_than);
        crate::archive::archivable(&self.pool, self.archived(), cutoff).await
    }

    /// Moves published and cancelled events last updated more than `older_than` ago to the
    /// archive table (`biz_outbox_event_archive`), `batch` per transaction: each copies the rows,
    /// then deletes the same ids. Pending, in-progress, failed and leased events are never
    /// touched, so it runs beside live relays; a run that dies leaves every row in exactly one of
    /// the two tables, and running it again finishes the work. `progress` gets the rows moved so
    /// far after each batch.
    ///
    /// An archived event is not a duplicate any more for a command retried later: keep the
    /// retention longer than any retry or replay window.
    pub async fn archive(
        &self,
        older_than: Duration,
        batch: u32,
        progress: impl FnMut(u64),
    ) -> Result<crate::archive::ArchiveReport, Error> {
        let cutoff = clock::before(self.now(), older_than);
        crate::archive::run(&self.pool, self.archived(), cutoff, batch, progress).await
    }

    /// Deletes archived events last updated more than `older_than` ago, `batch` at a time;
    /// returns how many.
    pub async fn purge_archive(&self, older_than: Duration, batch: u32) -> Result<u64, Error> {
        let cutoff = clock::before(self.now(), older_than);
        crate::archive::purge(&self.pool, &self.config.archive_table, cutoff, batch).await
    }

    fn archived(&self) -> crate::sql::archive::Archived<'_> {
        crate::sql::archive::Archived {
            live: &self.config.table,
            archive: &self.config.archive_table,
            columns: sql::COLUMNS,
            status_column: "publish_status",
        }
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

    /// Cancels a pending or failed event; true when it was cancelled. Published, in-progress and
    /// already cancelled events are left alone (the seed's state guard).
    pub async fn cancel(&self, event_no: &str, reason: &str) -> Result<bool, Error> {
        let Some(record) = self.by_event_no(event_no).await? else {
            return Ok(false);
        };
        let affected = self.cancel_row(record.id, reason).await?;
        Ok(affected == 1)
    }

    /// Puts a failed event back to pending for another round of attempts; true when it moved.
    pub async fn retry(&self, event_no: &str) -> Result<bool, Error> {
        let Some(record) = self.by_event_no(event_no).await? else {
            return Ok(false);
        };
        let mut conn = self.conn().await?;
        let affected = sql::retry::<DB>(&mut conn, &self.config.table, record.id, self.now())
            .await
            .map_err(|e| self.db_error(e))?;
        if affected == 1 {
            self.notify_relays();
        }
        Ok(affected == 1)
    }

    /// Cancels the head of a blocked aggregate (its earliest pending or failed event) so that
    /// the events after it can be published. Returns the event number skipped.
    pub async fn skip_head(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        reason: &str,
    ) -> Result<Option<String>, Error> {
        let head = self
            .select(Select::Head {
                aggregate_type,
                aggregate_id,
            })
            .await?
            .into_iter()
            .next();
        let Some(head) = head else {
            return Ok(None);
        };
        let affected = self.cancel_row(head.id, reason).await?;
        if affected == 1 {
            self.notify_relays();
            Ok(Some(head.event_no))
        } else {
            Ok(None)
        }
    }

    /// Publishes already published events again through `publisher`: those of one aggregate, of
    /// one event type, or created in a time range (the filters combine), a page of 500 at a time.
    ///
    /// Each goes out under a message id of its own (see [`OutboxMessage::message_id`]), so a
    /// broker that deduplicates (JetStream) delivers it even inside its duplicate window. The
    /// rows are left as they are; consumers' inboxes absorb what they already applied.
    pub async fn republish<P: Publisher>(
        &self,
        filter: &Republish<'_>,
        publisher: &P,
    ) -> Result<RepublishReport, Error> {
        let run = self.now().timestamp_micros();
        let mut report = RepublishReport::default();
        let mut after_id = 0;
        loop {
            let page = self
                .select(Select::Published {
                    aggregate: filter.aggregate,
                    event_type: filter.event_type,
                    from: filter.from,
                    to: filter.to,
                    after_id,
                    limit: 500,
                })
                .await?;
            let Some(last) = page.last() else {
                return Ok(report);
            };
            after_id = last.id;
            Self::republish_records(&page, run, publisher, &mut report).await?;
        }
    }

    /// Sends `records` again through `publisher` as the republish `run`, counting into `report`.
    pub(crate) async fn republish_records<P: Publisher>(
        records: &[OutboxRecord],
        run: i64,
        publisher: &P,
        report: &mut RepublishReport,
    ) -> Result<(), Error> {
        report.selected += records.len();
        let messages = records
            .iter()
            .map(|record| Ok(OutboxMessage::from_record(record)?.republished(run)))
            .collect::<Result<Vec<_>, Error>>()?;
        for result in publisher.publish(&messages).await {
            match result {
                Ok(()) => report.accepted += 1,
                Err(e) => {
                    report.failed += 1;
                    if report.first_failure.is_none() {
                        report.first_failure = Some(e.reason().to_owned());
                    }
                }
            }
        }
        Ok(())
    }

    pub(crate) async fn select(&self, select: Select<'_>) -> Result<Vec<OutboxRecord>, Error> {
        let mut conn = self.conn().await?;
        sql::select::<DB>(&mut conn, &self.config.table, &select)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// Pending or failed -> cancelled, with the operator's reason cut to the column.
    async fn cancel_row(&self, id: i64, reason: &str) -> Result<u64, Error> {
        let reason: String = reason.chars().take(1000).collect();
        let mut conn = self.conn().await?;
        sql::cancel::<DB>(&mut conn, &self.config.table, id, &reason, self.now())
            .await
            .map_err(|e| self.db_error(e))
    }

    pub(crate) fn db_error(&self, source: sqlx::Error) -> Error {
        Error::database(&self.config.table, source)
    }

    /// A flush's error: a sequence conflict names the row the unique key refused.
    async fn write_error(
        &self,
        conn: &mut DB::Connection,
        source: sqlx::Error,
        rows: &[NewOutboxRow],
    ) -> Error {
        let conflict = sql::sequence_conflict::<DB>(conn, &self.config.table, rows, &source).await;
        self.conflict_error(source, rows, conflict)
    }

    /// The error of a write a unique key refused: a sequence conflict naming `rows[index]`, or
    /// the database's error.
    fn conflict_error(
        &self,
        source: sqlx::Error,
        rows: &[NewOutboxRow],
        index: Option<usize>,
    ) -> Error {
        match index {
            Some(index) => {
                let row = &rows[index.min(rows.len() - 1)];
                Error::SequenceConflict {
                    aggregate_type: row.aggregate_type.clone(),
                    aggregate_id: row.aggregate_id.clone(),
                    sequence: row.aggregate_sequence,
                    event_no: row.event_no.clone(),
                }
            }
            None => self.db_error(source),
        }
    }

    fn row_for(&self, envelope: &EventEnvelope) -> Result<NewOutboxRow, Error> {
        let event_no = envelope.event_id.as_str();
        let too_long = |column, len, max, hint| Error::ValueTooLong {
            column,
            event_no: event_no.chars().take(80).collect(),
            len,
            max,
            hint,
        };
        let source = envelope.headers.source.as_deref().unwrap_or_default();
        let route = self
            .config
            .route_for(&envelope.aggregate_type, &envelope.event_type);
        let checks: [(&'static str, usize, usize, &'static str); 10] = [
            (
                "event_no",
                event_no.len(),
                64,
                "build event numbers with EventNo::from_rendered, which bounds them",
            ),
            (
                "event_type",
                envelope.event_type.len(),
                64,
                "use a shorter event type",
            ),
            (
                "aggregate_type",
                envelope.aggregate_type.len(),
                64,
                "use a shorter aggregate type",
            ),
            (
                "aggregate_id",
                envelope.aggregate_id.len(),
                64,
                "use a shorter aggregate id",
            ),
            (
                "event_source",
                source.len(),
                64,
                "use a shorter service name in EventContext::new",
            ),
            (
                "trace_id",
                envelope.trace_id.as_deref().map_or(0, str::len),
                128,
                "use a shorter trace id",
            ),
            (
                "publish_channel",
                route.channel.len(),
                32,
                "configure a shorter channel in the route",
            ),
            (
                "topic",
                route.topic.as_deref().map_or(0, str::len),
                128,
                "configure a shorter topic in the route",
            ),
            (
                "routing_key",
                route.routing_key.as_deref().map_or(0, str::len),
                128,
                "configure a shorter routing key in the route",
            ),
            (
                "event_no",
                usize::from(event_no.is_empty()),
                0,
                "an event number cannot be empty",
            ),
        ];
        for (column, len, max, hint) in checks {
            if len > max {
                return Err(too_long(column, len, max, hint));
            }
        }
        if source.is_empty() {
            return Err(too_long(
                "event_source",
                0,
                64,
                "it is empty: create the unit of work with EventContext::new(\"your-service\")",
            ));
        }
        let size = json_len(&envelope.payload);
        if size > self.config.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                event_no: event_no.to_owned(),
                event_type: envelope.event_type.clone(),
                size,
                max: self.config.max_payload_bytes,
            });
        }
        let headers = serde_json::to_value(&envelope.headers).unwrap_or(serde_json::Value::Null);
        Ok(NewOutboxRow {
            event_no: event_no.to_owned(),
            aggregate_type: envelope.aggregate_type.clone(),
            aggregate_id: envelope.aggregate_id.clone(),
            aggregate_sequence: i64::try_from(envelope.aggregate_sequence).unwrap_or(i64::MAX),
            event_type: envelope.event_type.clone(),
            event_version: i32::try_from(envelope.event_version).unwrap_or(i32::MAX),
            event_source: source.to_owned(),
            publish_channel: route.channel,
            topic: route.topic,
            routing_key: route.routing_key,
            event_payload: envelope.payload.clone(),
            event_headers: headers,
            max_retry_count: self.config.max_retry_count,
            trace_id: envelope.trace_id.clone(),
            create_time: envelope.occurred_at,
        })
    }
}

/// The length of `value` serialized as JSON, without allocating it.
fn json_len(value: &serde_json::Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    match serde_json::to_writer(&mut counter, value) {
        Ok(()) => counter.0,
        Err(_) => usize::MAX,
    }
}

/// What [`Outbox::commit`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Commit {
    /// The caller's state and the events committed together.
    Committed(FlushReport),
    /// Every event had been recorded before: the command was applied already (a retry, or a
    /// concurrent command that did the same). Nothing was committed, the caller's state changes
    /// included.
    AlreadyApplied(FlushReport),
}

impl Commit {
    /// What the flush found.
    pub fn report(&self) -> &FlushReport {
        match self {
            Commit::Committed(report) | Commit::AlreadyApplied(report) => report,
        }
    }

    /// Whether the command had been applied before, so that nothing was committed.
    pub fn already_applied(&self) -> bool {
        matches!(self, Commit::AlreadyApplied(_))
    }
}

/// What [`Outbox::republish`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RepublishReport {
    /// Published events the filter selected.
    pub selected: usize,
    /// Accepted by the broker (acknowledged, confirmed).
    pub accepted: usize,
    /// Refused or not acknowledged.
    pub failed: usize,
    /// The reason of the first failure.
    pub first_failure: Option<String>,
}

/// Which published events [`Outbox::republish`] sends again; unset filters match everything.
/// Built like [`OutboxSearch`] and [`QuarantineFilter`](crate::QuarantineFilter):
/// `Republish::default().event_type("ORDER_PAID")`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Republish<'a> {
    /// One aggregate: (type, id).
    pub aggregate: Option<(&'a str, &'a str)>,
    /// One event type.
    pub event_type: Option<&'a str>,
    /// Created at or after.
    pub from: Option<DateTime<Utc>>,
    /// Created before.
    pub to: Option<DateTime<Utc>>,
}

impl<'a> Republish<'a> {
    /// Only the events of one aggregate.
    pub fn aggregate(mut self, aggregate_type: &'a str, aggregate_id: &'a str) -> Self {
        self.aggregate = Some((aggregate_type, aggregate_id));
        self
    }

    /// Only events of `event_type`.
    pub fn event_type(mut self, event_type: &'a str) -> Self {
        self.event_type = Some(event_type);
        self
    }

    /// Only events created in `[from, to)`; either end may be open.
    pub fn created(mut self, from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Self {
        self.from = from;
        self.to = to;
        self
    }
}

#[cfg(feature = "postgres")]
impl Outbox<sqlx::Postgres> {
    /// Wakes this process's relays whenever a flush configured with
    /// [`OutboxConfig::notify_postgres`] commits, in any process: LISTENs on the channel in a
    /// background task, reconnecting as sqlx's listener does. Returns that task.
    pub async fn listen_for_commits(&self) -> Result<tokio::task::JoinHandle<()>, Error> {
        let Some(channel) = self.config.notify_channel.clone() else {
            return Err(Error::Misconfigured(
                "listen_for_commits needs a channel: set one with OutboxConfig::notify_postgres(\"channel\")",
            ));
        };
        let mut listener = sqlx::postgres::PgListener::connect_with(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        listener
            .listen(&channel)
            .await
            .map_err(|e| self.db_error(e))?;
        let wakeup = Arc::clone(&self.wakeup);
        Ok(tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok(_) => wakeup.notify_one(),
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN for outbox commits failed; relays fall back to polling");
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                }
            }
        }))
    }
}

/// [`CommitPath::Auto`]'s choice from the commits timed on each path, first the untimed
/// warm-up ones: [`ONE_TRIP`] when its median is more than 3% below the bound path's, else
/// [`BOUND`] (within 3%, a tie: bound, whose values stay out of the statement log); and the
/// two medians.
fn faster_path(one_trip: Vec<Duration>, bound: Vec<Duration>) -> (u8, Duration, Duration) {
    let timed = |mut commits: Vec<Duration>| {
        let warm_up = TRIAL_WARM_UP.min(commits.len());
        median(commits.split_off(warm_up))
    };
    let (one_trip, bound) = (timed(one_trip), timed(bound));
    let chosen = if one_trip.as_secs_f64() < 0.97 * bound.as_secs_f64() {
        ONE_TRIP
    } else {
        BOUND
    };
    (chosen, one_trip, bound)
}

/// The median of `samples` (the upper one of an even count); zero for none.
fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_slow_commit_does_not_decide_the_median() {
        let micros = |v: &[u64]| v.iter().map(|&v| Duration::from_micros(v)).collect();
        assert_eq!(
            median(micros(&[300, 290, 9_000, 310, 305])),
            Duration::from_micros(305)
        );
        assert_eq!(median(Vec::new()), Duration::ZERO);
    }

    #[test]
    fn auto_keeps_the_one_trip_only_when_it_is_clearly_faster() {
        let commits = |warm_up: u64, timed: u64| {
            let mut v = vec![Duration::from_micros(warm_up); TRIAL_WARM_UP];
            v.extend(vec![Duration::from_micros(timed); TRIAL_COMMITS]);
            v
        };
        // The bound path's slow first commits (its statement prepared) do not decide.
        assert_eq!(faster_path(commits(500, 500), commits(5_000, 400)).0, BOUND);
        assert_eq!(
            faster_path(commits(500, 380), commits(500, 400)).0,
            ONE_TRIP
        );
        // Within 3%: bound.
        assert_eq!(faster_path(commits(500, 390), commits(500, 400)).0, BOUND);
        assert_eq!(faster_path(commits(500, 400), commits(500, 400)).0, BOUND);
    }
}
