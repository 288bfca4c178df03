//! Outbox settings: tables, routes, limits.

use std::collections::HashMap;

use crate::clock::{Clock, SharedClock};
use crate::table::TableName;

/// Where an event type is published: the `publish_channel`, `topic` and `routing_key` columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The publish channel, e.g. `MQ`, `HTTP`, `EVENT_BUS` (at most 32 bytes).
    pub channel: String,
    /// The topic, exchange or subject (at most 128 bytes).
    pub topic: Option<String>,
    /// The routing key or tag (at most 128 bytes).
    pub routing_key: Option<String>,
}

impl Route {
    /// A route on the `MQ` channel to `topic` (the RabbitMQ exchange, the NATS subject prefix or
    /// the Kafka topic), with no routing key; add one with [`Route::routing_key`].
    ///
    /// ```
    /// use event_sqlx::{OutboxConfig, Route};
    ///
    /// let config = OutboxConfig::new()
    ///     .route("ORDER_PLACED", Route::topic("orders").routing_key("order.placed"));
    /// # let _ = config;
    /// ```
    pub fn topic(topic: impl Into<String>) -> Route {
        Route {
            channel: "MQ".to_owned(),
            topic: Some(topic.into()),
            routing_key: None,
        }
    }

    /// This route with `routing_key`: RabbitMQ's routing key, the last part of the NATS subject.
    #[must_use]
    pub fn routing_key(mut self, routing_key: impl Into<String>) -> Route {
        self.routing_key = Some(routing_key.into());
        self
    }

    /// This route on `channel` instead of `MQ` (e.g. `HTTP`, `EVENT_BUS`).
    #[must_use]
    pub fn channel(mut self, channel: impl Into<String>) -> Route {
        self.channel = channel.into();
        self
    }

    /// The route used when none is configured for an event type: channel `MQ`, topic
    /// `<aggregate type, lowercase>.event`, routing key `<event type, lowercase, `_` as `.`>`.
    /// `ORDER` / `ORDER_CREATED` gives `order.event` / `order.created`, as in the seed.
    pub fn default_for(aggregate_type: &str, event_type: &str) -> Route {
        Route {
            channel: "MQ".to_owned(),
            topic: Some(format!("{}.event", aggregate_type.to_ascii_lowercase())),
            routing_key: Some(event_type.to_ascii_lowercase().replace('_', ".")),
        }
    }
}

/// Which indexes the outbox table carries, chosen when [`Outbox::migrate`] runs.
///
/// [`Outbox::migrate`]: crate::Outbox::migrate
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IndexProfile {
    /// The seed's indexes, all twelve: every seed query, live or historical, on an index. The
    /// default.
    #[default]
    Seed,
    /// PostgreSQL only: the producer's insert touches four indexes (the primary key, the two
    /// unique keys, and the partial index of claimable events the relay claims with). The
    /// status indexes become partial over in-progress, failed and final rows, which a new row is
    /// not, so only the relay's updates maintain them. The lookups by trace id, event type and
    /// topic, and by creation time, leave the outbox table: the archive table gets those
    /// indexes, and on the outbox they scan (fine for the live rows of a table that is archived
    /// regularly). The partial index of unpublished events per aggregate goes too: a claim
    /// keeps each aggregate's order by reading the candidate's nearest earlier event that is
    /// neither cancelled nor deleted, backwards on the unique key `(aggregate_type,
    /// aggregate_id, aggregate_sequence)` (see the guide's "Order per aggregate"), so unordered
    /// relays belong on a table of their own.
    Lean,
}

/// How [`Outbox::commit`](crate::Outbox::commit) sends the events on PostgreSQL (MySQL and
/// SQLite always bind them, then commit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CommitPath {
    /// The default: the faster of the two for this database. The outbox's first 28 successful
    /// commits alternate between them, and the last 12 on each path are timed; from then on it
    /// (and its clones) keep to the one with the shorter median (bound when the two are
    /// within 3%), and
    /// [`Outbox::commit_path`](crate::Outbox::commit_path) tells which. One trip wins when the
    /// database's round trip costs more than parsing the INSERT (usually over a network);
    /// bound wins over a fast loopback.
    #[default]
    Auto,
    /// The events' INSERT travels in the `COMMIT`'s message, its values as literals: one round
    /// trip per commit, and the server parses and plans the statement each time. sqlx's
    /// statement log then shows the values: at debug level, and at warn level when the commit is
    /// slower than the connection's slow-statement threshold
    /// (`ConnectOptions::log_slow_statements`; one second by default).
    OneTrip,
    /// A prepared INSERT with bound values, then the `COMMIT`: two round trips, and the events'
    /// own values (numbers, aggregate ids, payloads, headers, trace ids) never reach sqlx's
    /// statement log. Choose this when payloads must never reach the application's logs.
    ///
    /// A commit of one event (what most commands record) writes the values its event type
    /// shares (aggregate and event type, version, source, route, retry limit) as literals and
    /// binds only the event's own seven: one prepared statement per event type, for the first
    /// 32 such statements of an outbox; events of further types are written with every value
    /// bound, in one statement for all of them. sqlx keeps 100 prepared statements per
    /// connection by default (`PgConnectOptions::statement_cache_capacity`).
    Bound,
}

/// How the outbox writes events.
#[derive(Debug, Clone)]
pub struct OutboxConfig {
    pub(crate) table: TableName,
    pub(crate) archive_table: TableName,
    pub(crate) max_payload_bytes: usize,
    pub(crate) max_retry_count: i32,
    pub(crate) routes: HashMap<String, Route>,
    pub(crate) notify_channel: Option<String>,
    pub(crate) clock: SharedClock,
    pub(crate) commit_state_on_duplicates: bool,
    pub(crate) commit_path: CommitPath,
    pub(crate) index_profile: IndexProfile,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            table: TableName::new("biz_outbox_event").unwrap_or_else(|_| unreachable!()),
            archive_table: TableName::new("biz_outbox_event_archive")
                .unwrap_or_else(|_| unreachable!()),
            max_payload_bytes: 256 * 1024,
            max_retry_count: 5,
            routes: HashMap::new(),
            notify_channel: None,
            clock: crate::clock::system(),
            commit_state_on_duplicates: false,
            commit_path: CommitPath::Auto,
            index_profile: IndexProfile::Seed,
        }
    }
}

impl OutboxConfig {
    /// The seed's table `biz_outbox_event`, payloads up to 256 KiB, 5 retries, default routes.
    pub fn new() -> OutboxConfig {
        OutboxConfig::default()
    }

    /// Uses another table, with the same columns (and collations) as the migrations create.
    pub fn table(mut self, table: TableName) -> Self {
        self.table = table;
        self
    }

    /// The indexes [`Outbox::migrate`](crate::Outbox::migrate) leaves on the outbox table:
    /// the seed's (the default) or, on PostgreSQL, the lean profile for a cheaper producer
    /// write. Migrating with the other profile later switches back.
    pub fn index_profile(mut self, profile: IndexProfile) -> Self {
        self.index_profile = profile;
        self
    }

    /// Archives to another table, with the same columns (and collations) as the migrations create.
    pub fn archive_table(mut self, table: TableName) -> Self {
        self.archive_table = table;
        self
    }

    /// Rejects, writing nothing, a flush with a payload larger than `bytes` (serialized JSON).
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// The `max_retry_count` written with each event.
    pub fn max_retry_count(mut self, retries: u16) -> Self {
        self.max_retry_count = i32::from(retries);
        self
    }

    /// Publishes `event_type` on `route` instead of its default route.
    pub fn route(mut self, event_type: impl Into<String>, route: Route) -> Self {
        self.routes.insert(event_type.into(), route);
        self
    }

    /// PostgreSQL: announces each flush on the LISTEN/NOTIFY `channel` when its transaction
    /// commits, so that relays in other processes (see `Outbox::listen_for_commits`) publish at
    /// once instead of at their next poll. Ignored on MySQL and SQLite.
    pub fn notify_postgres(mut self, channel: impl Into<String>) -> Self {
        self.notify_channel = Some(channel.into());
        self
    }

    /// Reads the time from `clock` instead of the system clock: the outbox's writes and queries,
    /// and its relays' claims, leases and retry times. For tests (see [`ManualClock`]).
    ///
    /// [`ManualClock`]: crate::ManualClock
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = std::sync::Arc::new(clock);
        self
    }

    /// Makes [`Outbox::commit`] commit the caller's state even when some or all of the unit of
    /// work's events had been recorded before (they are reported in
    /// [`FlushReport::already_recorded`] and left as stored). Off by default: then such a
    /// command commits nothing, because its state would land without the events describing it.
    ///
    /// [`Outbox::commit`]: crate::Outbox::commit
    /// [`FlushReport::already_recorded`]: crate::FlushReport::already_recorded
    pub fn commit_state_on_duplicates(mut self) -> Self {
        self.commit_state_on_duplicates = true;
        self
    }

    /// PostgreSQL: how [`Outbox::commit`] sends the events (see [`CommitPath`]; measured by
    /// default).
    ///
    /// [`Outbox::commit`]: crate::Outbox::commit
    pub fn commit_path(mut self, path: CommitPath) -> Self {
        self.commit_path = path;
        self
    }

    /// The table events are written to.
    pub fn table_name(&self) -> &TableName {
        &self.table
    }

    pub(crate) fn route_for(&self, aggregate_type: &str, event_type: &str) -> Route {
        self.routes
            .get(event_type)
            .cloned()
            .unwrap_or_else(|| Route::default_for(aggregate_type, event_type))
    }
}
