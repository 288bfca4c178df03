//! Writing events: `flush` into the caller's transaction, `commit` with the caller's state,
//! the choice between the one-trip and the bound commit path, and the row each envelope becomes.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use event_core::{EventEnvelope, EventNo, UnitOfWork};
use sqlx::Transaction;

use crate::config::outbox::CommitPath;
use crate::error::Error;
use crate::row::outbox::{FlushReport, NewOutboxRow};
use crate::sql::dialect::{Backend, Dialect};
use crate::sql::outbox::{self as sql};

use super::Outbox;

/// [`Outbox::commit`]'s state on PostgreSQL.
#[derive(Debug, Default)]
pub(super) struct CommitState {
    /// [`CommitPath::Auto`]'s choice, read on every commit without a lock: [`UNMEASURED`] (0,
    /// the default), [`ONE_TRIP`] or [`BOUND`].
    pub(super) chosen: AtomicU8,
    /// The commits timed on each path until it chooses.
    pub(super) trial: std::sync::Mutex<PathTrial>,
    /// The one-row INSERT statements the bound path prepares (one per event type and route, see
    /// [`sql::one_row_insert`]), at most [`ONE_ROW_STATEMENTS`].
    pub(super) one_row_statements: std::sync::Mutex<HashSet<String>>,
}

/// One-row statements kept per outbox: each is prepared once per pooled connection, and sqlx
/// keeps 100 prepared statements per connection by default. Events of more types than this
/// are written with every value bound, in one statement for all of them.
pub(super) const ONE_ROW_STATEMENTS: usize = 32;

/// Successful commits timed per path while [`CommitPath::Auto`] tries both.
#[derive(Debug, Default)]
pub(super) struct PathTrial {
    one_trip: Vec<Duration>,
    bound: Vec<Duration>,
}

/// Commits timed on each path before [`CommitPath::Auto`] chooses, after [`TRIAL_WARM_UP`]
/// untimed ones.
pub(super) const TRIAL_COMMITS: usize = 12;

/// The first commits on each path, not timed: the bound path's first ones prepare their
/// statement, and the server's caches are cold.
pub(super) const TRIAL_WARM_UP: usize = 2;

pub(super) const UNMEASURED: u8 = 0;

pub(super) const ONE_TRIP: u8 = 1;

pub(super) const BOUND: u8 = 2;

impl<DB: Backend> Outbox<DB> {
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
    pub(super) async fn flush_rows(
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
    /// [`OutboxConfig::commit_state_on_duplicates`](crate::OutboxConfig::commit_state_on_duplicates) keeps the state of a command whose events
    /// were all or partly recorded before.
    ///
    /// On PostgreSQL the events can travel with the `COMMIT`: one round trip writes them and
    /// commits, where [`Outbox::flush`] then `tx.commit()` take two, but the server parses the
    /// statement each time. By default the outbox times its first commits both ways and keeps
    /// to the faster; [`OutboxConfig::commit_path`](crate::OutboxConfig::commit_path) fixes the choice (see [`CommitPath`]).
    /// (Never in a savepoint, nor with [`OutboxConfig::commit_state_on_duplicates`](crate::OutboxConfig::commit_state_on_duplicates), which need
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
    pub(super) fn stored_before(
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
    pub(super) fn next_trial_path(&self) -> bool {
        match self.commit_state.trial.lock() {
            Ok(trial) => trial.one_trip.len() <= trial.bound.len(),
            Err(_) => false,
        }
    }

    /// Records a successful commit's duration on one path; once each path has
    /// [`TRIAL_WARM_UP`] + [`TRIAL_COMMITS`], keeps the faster (see [`faster_path`]) for this
    /// outbox and its clones.
    pub(super) fn record_trial(&self, one_trip: bool, took: Duration) {
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
    pub(super) async fn commit_in_one_trip(
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
    pub(super) async fn commit_bound(
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
    pub(super) fn one_row_insert<'r>(
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
    pub(super) fn committed(&self, rows: &[NewOutboxRow], mut report: FlushReport) -> Commit {
        report.recorded = rows
            .iter()
            .map(|row| EventNo::from_rendered(&row.event_no))
            .collect();
        self.notify_relays();
        Commit::Committed(report)
    }

    /// A commit whose INSERT of `rows` (or its COMMIT) failed with `source`: rolls back, and
    /// answers as the flush's duplicate detection would have.
    pub(super) async fn failed_commit(
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
}

/// What [`Outbox::commit`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[must_use = "`Commit::AlreadyApplied` means the caller's state was not committed either: answer the command as a repeat"]
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

/// [`CommitPath::Auto`]'s choice from the commits timed on each path, first the untimed
/// warm-up ones: [`ONE_TRIP`] when its median is more than 3% below the bound path's, else
/// [`BOUND`] (within 3%, a tie: bound, whose values stay out of the statement log); and the
/// two medians.
pub(super) fn faster_path(
    one_trip: Vec<Duration>,
    bound: Vec<Duration>,
) -> (u8, Duration, Duration) {
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
pub(super) fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn one_slow_commit_does_not_decide_the_median() {
        let micros = |v: &[u64]| v.iter().map(|&v| Duration::from_micros(v)).collect();
        assert_eq!(
            median(micros(&[300, 290, 9_000, 310, 305])),
            Duration::from_micros(305)
        );
        assert_eq!(median(Vec::new()), Duration::ZERO);
    }

    #[test]
    pub(super) fn auto_keeps_the_one_trip_only_when_it_is_clearly_faster() {
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
