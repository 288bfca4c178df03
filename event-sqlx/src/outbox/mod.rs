//! The outbox: events written in the business transaction, and the seed's queries over them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use chrono::{DateTime, Utc};
use sqlx::Pool;
use sqlx::pool::PoolConnection;
use tokio::sync::Notify;

use crate::clock::{self, Clock};
use crate::config::outbox::{CommitPath, OutboxConfig};
use crate::error::Error;
use crate::sql::dialect::{Backend, Dialect};
use crate::sql::outbox::{self as sql};

mod commit;
mod operate;
mod reads;
mod rows;

pub use commit::Commit;
use commit::CommitState;
pub use operate::{Republish, RepublishReport};

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
    /// How ordered claims check each aggregate's order on the table's indexes
    /// ([`sql::AggregateOrder::code`], see [`Outbox::detect_order_index`]), as relays last found.
    ordered_claim: Arc<AtomicU8>,
    /// MySQL: whether claims run at `READ COMMITTED`, locking no gaps (see
    /// [`Outbox::detect_claim_isolation`]), as relays last found.
    claims_without_gap_locks: Arc<AtomicBool>,
}

impl<DB: Backend> Clone for Outbox<DB> {
    fn clone(&self) -> Self {
        Outbox {
            pool: self.pool.clone(),
            config: Arc::clone(&self.config),
            wakeup: Arc::clone(&self.wakeup),
            commit_state: Arc::clone(&self.commit_state),
            ordered_claim: Arc::clone(&self.ordered_claim),
            claims_without_gap_locks: Arc::clone(&self.claims_without_gap_locks),
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
            ordered_claim: Arc::new(AtomicU8::new(sql::AggregateOrder::OneProbe.code())),
            claims_without_gap_locks: Arc::new(AtomicBool::new(false)),
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
            (CommitPath::Auto, commit::ONE_TRIP) => CommitPath::OneTrip,
            (CommitPath::Auto, commit::BOUND) => CommitPath::Bound,
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
    /// taken, or taken when the table was less than half its size, as before a bulk load or a
    /// backlog that autovacuum has not caught up with, or a new outbox filling); otherwise one
    /// cheap catalog query, and nothing at all on MySQL and SQLite. Returns whether it took them.
    /// Relays call it when they start and, while they claim events, at most once a second.
    pub async fn ensure_statistics(&self) -> Result<bool, Error> {
        if DB::DIALECT.stale_statistics().is_none() {
            // Nothing to check on this database: no connection taken.
            return Ok(false);
        }
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

    /// Looks at the outbox table's indexes for the cheapest way for claims to check each
    /// aggregate's order, and returns it. On PostgreSQL, with the migrations' partial index of
    /// unpublished events per aggregate, one probe of it; without it (the lean profile), a
    /// backward read of the unique key `(aggregate_type, aggregate_id, aggregate_sequence)`
    /// from the candidate to its nearest earlier event that is neither cancelled nor deleted,
    /// which decides. On MySQL and MariaDB, with an index that leads with `(aggregate_type,
    /// aggregate_id, publish_status)`, one probe per unpublished status on it; with
    /// `uk_aggregate_sequence` as the migrations create it, a lookup of the candidate's
    /// previous event, and a walk of its earlier events only when that one was cancelled,
    /// deleted or archived; otherwise a walk of the aggregate's events, published ones
    /// included, so a claim slows in proportion to the longest history among the aggregates it
    /// considers. One catalog query; nothing on SQLite, whose partial index answers from the
    /// unpublished events alone. Relays call it when they start.
    pub(crate) async fn detect_order_index(&self) -> Result<sql::AggregateOrder, Error> {
        if DB::DIALECT == Dialect::Sqlite {
            return Ok(sql::AggregateOrder::OneProbe);
        }
        let mut conn = self.conn().await?;
        let order = sql::ordered_claim::<DB>(&mut conn, &self.config.table)
            .await
            .map_err(|e| self.db_error(e))?;
        self.ordered_claim.store(order.code(), Ordering::Relaxed);
        Ok(order)
    }

    /// MySQL: whether claims may run at `READ COMMITTED`, so that a claim locks only the rows
    /// it leases and not the gap where producers insert new events (under the server's default
    /// `REPEATABLE READ` every producer's INSERT waited for any claim that read to the end of the
    /// claimable rows). Yes unless the server writes its binary log as statements. One query of
    /// two server variables; nothing on PostgreSQL and SQLite. Relays call it when they start;
    /// until then claims keep the server's default.
    pub(crate) async fn detect_claim_isolation(&self) -> Result<bool, Error> {
        if DB::DIALECT.begin_without_gap_locks().is_none() {
            return Ok(false);
        }
        let mut conn = self.conn().await?;
        let without = sql::claims_without_gap_locks::<DB>(&mut conn)
            .await
            .map_err(|e| self.db_error(e))?;
        self.claims_without_gap_locks
            .store(without, Ordering::Relaxed);
        Ok(without)
    }

    /// Whether claims run without gap locks (see [`Outbox::detect_claim_isolation`]).
    pub(crate) fn claims_without_gap_locks(&self) -> bool {
        self.claims_without_gap_locks.load(Ordering::Relaxed)
    }

    /// How a claim checks each aggregate's order: not at all unless `ordered`, otherwise as
    /// the table's indexes allow (see [`Outbox::detect_order_index`]).
    pub(crate) fn aggregate_order(&self, ordered: bool) -> sql::AggregateOrder {
        if ordered {
            sql::AggregateOrder::from_code(self.ordered_claim.load(Ordering::Relaxed))
        } else {
            sql::AggregateOrder::Unordered
        }
    }

    /// Wakes this process's relays, e.g. after committing a flush done with [`Outbox::flush`].
    pub fn notify_relays(&self) {
        self.wakeup.notify_one();
    }

    pub(crate) fn wakeup(&self) -> &Arc<Notify> {
        &self.wakeup
    }

    pub(crate) fn db_error(&self, source: sqlx::Error) -> Error {
        Error::database(&self.config.table, source)
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
