//! The crate's one error type. Each variant that wraps another error keeps it as its `source`, so
//! a report (`anyhow`'s `{:#}`, or walking `Error::source`) shows every cause once.

/// A boxed error from a broker client or a user's handler, kept as a source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why an operation of the outbox, the relay, the message store, a consumer or a broker failed.
///
/// Recording an event (`event_core::RecordError`) converts into it, so a repository function
/// uses `?` on the unit of work and on the outbox alike:
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # mod demo {
/// use event_core::{Aggregate, EventContext, UnitOfWork};
/// use event_sqlx::{Commit, Error, Outbox};
///
/// async fn save(
///     outbox: &Outbox<sqlx::Sqlite>,
///     tx: sqlx::Transaction<'_, sqlx::Sqlite>,
///     order: &mut impl Aggregate,
/// ) -> Result<Commit, Error> {
///     let mut uow = UnitOfWork::new(EventContext::new("order-service"));
///     uow.collect(order)?; // an event_core::RecordError
///     outbox.commit(tx, uow).await // an event_sqlx::Error
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A payload is larger than the configured maximum; nothing was written.
    #[error(
        "the payload of {event_type} {event_no} is {size} bytes, over the {max}-byte limit; nothing was written. Keep payloads to the snapshot consumers need (large data belongs in the business table), or raise OutboxConfig::max_payload_bytes"
    )]
    PayloadTooLarge {
        /// The event number.
        event_no: String,
        /// The event type.
        event_type: String,
        /// The serialized size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// A value does not fit its column; nothing was written.
    #[error(
        "{column} of event {event_no} is {len} bytes, over the column's {max}; nothing was written. {hint}"
    )]
    ValueTooLong {
        /// The column.
        column: &'static str,
        /// The event number.
        event_no: String,
        /// The value's length.
        len: usize,
        /// The column width.
        max: usize,
        /// How to fix it.
        hint: &'static str,
    },
    /// An event at aggregate sequence 0: sequences start at 1 (the unit of work numbers them
    /// from the aggregate's version plus one). Nothing was written.
    #[error(
        "event {event_no} of aggregate {aggregate_type} {aggregate_id} is at sequence 0, and sequences start at 1; nothing was written. Record events through UnitOfWork::collect, which numbers them from the aggregate's version plus one"
    )]
    SequenceZero {
        /// Aggregate type.
        aggregate_type: String,
        /// Aggregate id.
        aggregate_id: String,
        /// The event number.
        event_no: String,
    },
    /// Another event already holds this aggregate sequence: the unique key on
    /// `(aggregate_type, aggregate_id, aggregate_sequence)` refused the row named here.
    #[error(
        "aggregate {aggregate_type} {aggregate_id} already has an event at sequence {sequence} (event {event_no} was refused): another transaction recorded events for it first, or it was loaded at a stale version. Reload the aggregate (its version is Outbox::aggregate_version) and retry the command"
    )]
    SequenceConflict {
        /// Aggregate type.
        aggregate_type: String,
        /// Aggregate id.
        aggregate_id: String,
        /// The sequence that was taken.
        sequence: i64,
        /// The event number of the refused row.
        event_no: String,
    },
    /// Some events of a unit of work had been recorded before and others were new: the command
    /// ran on a stale state, part of which another command had already applied. Nothing was
    /// committed.
    #[error(
        "event {event_no} of {aggregate_type} {aggregate_id} was recorded before, while {new} other events of the same unit of work are new: the command ran on a stale state. Nothing was committed; reload the aggregate and retry the command"
    )]
    PartlyRecorded {
        /// Aggregate type of the event found recorded.
        aggregate_type: String,
        /// Aggregate id of the event found recorded.
        aggregate_id: String,
        /// The event found recorded.
        event_no: String,
        /// How many events were new.
        new: usize,
    },
    /// The table does not exist: the migrations have not run on this database.
    #[error(
        "table {table} does not exist: create the event tables first (Outbox::migrate, or `eventctl migrate --database-url ...`)"
    )]
    MissingTable {
        /// The table.
        table: String,
        /// What sqlx reported.
        #[source]
        source: sqlx::Error,
    },
    /// The database is unreachable or refused the statement.
    #[error("database error on {table}")]
    Database {
        /// The table.
        table: String,
        /// What sqlx reported.
        #[source]
        source: sqlx::Error,
    },
    /// A feature was used without the setting it needs.
    #[error("{0}")]
    Misconfigured(&'static str),
    /// Running the migrations failed.
    #[error("applying the event tables' migrations failed")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// A stored row could not be read back.
    #[error(transparent)]
    UnreadableRow(#[from] UnreadableRow),
    /// An event could not be recorded on its aggregate or in its unit of work
    /// (`Aggregate::record`, `UnitOfWork::collect`): the message names the mistake.
    #[error(transparent)]
    Recording(#[from] event_core::RecordError),
    /// A broker could not be reached or set up.
    #[error("{broker} at {address}: {action}")]
    Broker {
        /// `NATS`, `RabbitMQ`, ...
        broker: &'static str,
        /// The address connected to, its password (if any) shown as `***`.
        address: String,
        /// What was being done, e.g. `cannot create stream ORDERS`.
        action: String,
        /// What the broker client reported.
        #[source]
        source: BoxError,
    },
    /// The broker was unavailable for a relay's batch (a lost connection, no acknowledgement in
    /// time): the events not published were given back with their attempt not counted, and the
    /// relay tries again once the broker answers. Transient.
    #[error(
        "relay {relay}: the broker is unavailable; {deferred} events were given back unpublished, their attempt not counted, and are published once it answers"
    )]
    BrokerUnavailable {
        /// The relay.
        relay: String,
        /// Events the batch claimed.
        claimed: usize,
        /// Events published before the outage (and marked).
        published: usize,
        /// Events the broker refused, counted as failed attempts.
        failed: usize,
        /// Events given back unpublished.
        deferred: usize,
        /// The first outage reported by the publisher (a `PublishError`).
        #[source]
        source: BoxError,
    },
    /// A consumer must stop: its handler reported a bug, or its database or broker is gone. The
    /// message in hand was not acknowledged, so the broker delivers it again after the fix.
    #[error("consumer {consumer} stopped: {reason}")]
    ConsumerStopped {
        /// The consumer.
        consumer: String,
        /// Why, in a sentence.
        reason: String,
        /// The error behind it: the handler's, the database's or the broker's.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// A database error on `table`.
    pub(crate) fn database(table: impl std::fmt::Display, source: sqlx::Error) -> Error {
        let table = table.to_string();
        if missing_table(&source) {
            return Error::MissingTable { table, source };
        }
        Error::Database { table, source }
    }

    /// A broker error.
    #[allow(dead_code)] // used by whichever broker features are on
    pub(crate) fn broker(
        broker: &'static str,
        address: &str,
        action: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Error {
        Error::Broker {
            broker,
            address: redact_url(address),
            action: action.into(),
            source: source.into(),
        }
    }

    /// Whether trying again later may succeed: the database connection dropped or timed out, the
    /// server ended the session or rolled the statement back (a deadlock victim), or a broker was
    /// unreachable. Bad input, a missing table and a refused statement are not transient.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Database { source, .. } => Error::is_transient_sqlx(source),
            Error::Broker { .. } | Error::BrokerUnavailable { .. } => true,
            _ => false,
        }
    }

    /// Whether a broker refused the login: RabbitMQ's ACCESS_REFUSED or NOT_ALLOWED (the user,
    /// the password or the virtual host in the URL), NATS's authorization violation. Trying
    /// again with the same URL does not help, so a process that is starting can stop at once
    /// (as `eventctl relay` does). [`Error::is_transient`] still says true of it: a running
    /// relay or subscription that reconnects outlasts credentials being changed.
    pub fn is_refused_login(&self) -> bool {
        match self {
            Error::Broker { source, .. } => refused_login(source.as_ref()),
            _ => false,
        }
    }

    /// What [`Error::is_transient`] says of a database error, for a sqlx error in hand (from a
    /// connection of one's own, say, while a service starts before its database): the
    /// connection was refused, dropped or timed out, the server is starting up or shutting
    /// down, or it rolled the statement back. A refused login, an unknown database and a bad
    /// statement are not transient.
    pub fn is_transient_sqlx(error: &sqlx::Error) -> bool {
        connection_lost(error) || rolled_back(error)
    }

    /// The consumer `consumer` stops for `reason`, caused by `source`.
    pub(crate) fn stopped(
        consumer: &str,
        reason: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Error {
        Error::ConsumerStopped {
            consumer: consumer.to_owned(),
            reason: reason.into(),
            source: source.into(),
        }
    }
}

/// How a handler failed: the convention every handler of the crate follows (consumers and the
/// message worker).
///
/// A database error converts into `Transient` (`?` on a sqlx call), since a database that is
/// down or deadlocked is usually back on the next attempt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// A dependency is down or slow: try again later.
    #[error("transient: {0}")]
    Transient(String),
    /// This event can never be processed as it is (bad input): quarantine it (a consumer), or
    /// stop retrying it (the message worker).
    #[error("permanent: {0}")]
    Permanent(String),
    /// The code is wrong: stop consuming until it is fixed, then replay.
    #[error("bug: {0}")]
    Bug(String),
}

impl HandlerError {
    /// The message without the class.
    pub fn message(&self) -> &str {
        match self {
            HandlerError::Transient(m) | HandlerError::Permanent(m) | HandlerError::Bug(m) => m,
        }
    }
}

/// A handler that writes through the toolkit (a cascade: `Outbox::flush` of the events the
/// handler records, a `MessageStore` write) can use `?`: an error that passes (the database
/// down, a deadlock) is transient, any other (an event refused by the outbox) permanent.
impl From<Error> for HandlerError {
    fn from(error: Error) -> Self {
        let message = Chain(&error).to_string();
        if error.is_transient() {
            HandlerError::Transient(message)
        } else {
            HandlerError::Permanent(message)
        }
    }
}

/// A handler that records events (a cascade) can use `?` on `Aggregate::record` and
/// `UnitOfWork::collect`: their errors are mistakes in the code (an event on the wrong
/// aggregate, an empty event number), so they stop the consumer as a bug.
impl From<event_core::RecordError> for HandlerError {
    fn from(error: event_core::RecordError) -> Self {
        HandlerError::Bug(error.to_string())
    }
}

impl From<sqlx::Error> for HandlerError {
    fn from(error: sqlx::Error) -> Self {
        HandlerError::Transient(error.to_string())
    }
}

/// Whether `error` says the connection or the server failed, not the statement: the socket broke
/// or timed out, the pool found no connection in time, or the server ended the session (SQLSTATE
/// class 08; PostgreSQL 57P01..57P03: an administrator's `pg_terminate_backend`, a crash or a
/// restart; MySQL 70100: `KILL`). The statement may run again on a fresh connection.
pub(crate) fn connection_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03" | "70100")
        }),
        _ => false,
    }
}

/// `url` with its secrets shown as `***`, for errors and logs: the password of its user
/// (`amqp://guest:***@host:5672/%2f`), a NATS token in the user's place (`nats://***@host`,
/// and so for `tls://`, `ws://` and `wss://`), and the value of a query parameter whose name
/// holds `password`, `secret` or `token` (`postgres://app@db/orders?password=***`: PostgreSQL
/// takes the password there too). Everything else is shown as given, so the message still
/// names the server.
///
/// ```
/// assert_eq!(
///     event_sqlx::redact_url("postgres://app:s3cret@db:5432/orders?sslmode=require"),
///     "postgres://app:***@db:5432/orders?sslmode=require"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|at| at + 3) else {
        return url.to_owned();
    };
    // The credentials end at the last `@` before the path.
    let authority_end = url[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |at| scheme_end + at);
    let mut shown = url[..scheme_end].to_owned();
    match url[scheme_end..authority_end].rfind('@') {
        Some(at) => {
            let at = scheme_end + at;
            match url[scheme_end..at].split_once(':') {
                Some((user, _)) => shown.push_str(&format!("{user}:***")),
                // NATS takes a token where other schemes take a user name.
                None if ["nats://", "tls://", "ws://", "wss://"].contains(&&url[..scheme_end]) => {
                    shown.push_str("***");
                }
                None => shown.push_str(&url[scheme_end..at]),
            }
            shown.push_str(&url[at..authority_end]);
        }
        None => shown.push_str(&url[scheme_end..authority_end]),
    }
    let rest = &url[authority_end..];
    let (before_fragment, fragment) = rest.split_at(rest.find('#').unwrap_or(rest.len()));
    match before_fragment.split_once('?') {
        Some((path, query)) => {
            shown.push_str(path);
            shown.push('?');
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if secret_key(key) => format!("{key}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            shown.push_str(&pairs.join("&"));
        }
        None => shown.push_str(before_fragment),
    }
    shown.push_str(fragment);
    shown
}

/// Whether a query parameter of this name carries a secret.
fn secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "secret", "token"]
        .iter()
        .any(|word| key.contains(word))
}

/// Whether `error`, a broker client's, says the broker refused the login: RabbitMQ's
/// ACCESS_REFUSED (user or password) or NOT_ALLOWED (virtual host), NATS's authorization
/// violation or failed authentication.
fn refused_login(error: &(dyn std::error::Error + 'static)) -> bool {
    #[cfg(feature = "rabbitmq")]
    if let Some(error) = error.downcast_ref::<lapin::Error>()
        && let lapin::ErrorKind::ProtocolError(amqp) = error.kind()
    {
        use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
        return matches!(
            amqp.kind(),
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)
                | AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED)
        );
    }
    #[cfg(feature = "nats")]
    if let Some(error) = error.downcast_ref::<async_nats::ConnectError>() {
        use async_nats::ConnectErrorKind;
        return matches!(
            error.kind(),
            ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication
        );
    }
    let _ = error;
    false
}

/// Whether `error` says a table does not exist: PostgreSQL 42P01, MySQL 42S02, SQLite's
/// `no such table`.
fn missing_table(error: &sqlx::Error) -> bool {
    error.as_database_error().is_some_and(|db| {
        db.code()
            .is_some_and(|code| code == "42P01" || code == "42S02")
            || db.message().starts_with("no such table")
    })
}

/// Whether the database rolled the statement or transaction back as a deadlock victim or for a
/// serialization failure (SQLSTATE 40001 or 40P01): it left no trace, so running it again is
/// safe.
pub(crate) fn rolled_back(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "40001" || code == "40P01")
}

/// Shows an error and each of its sources once, `: `-separated: what logs print.
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// A stored row that cannot be turned back into an envelope.
#[derive(Debug, thiserror::Error)]
#[error(
    "outbox row {id} ({event_no}) has {problem}: repair the row, or cancel it with `eventctl outbox cancel {event_no}`"
)]
pub struct UnreadableRow {
    pub(crate) id: i64,
    pub(crate) event_no: String,
    pub(crate) problem: String,
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn a_password_in_an_address_is_never_shown() {
        for (url, shown) in [
            (
                "amqp://guest:s3cret@127.0.0.1:5672/%2f",
                "amqp://guest:***@127.0.0.1:5672/%2f",
            ),
            ("nats://app:p%40ss@nats:4222", "nats://app:***@nats:4222"),
            // A NATS user without a password is a token.
            ("nats://s3cret@nats:4222", "nats://***@nats:4222"),
            ("tls://s3cret@nats:4222", "tls://***@nats:4222"),
            ("amqp://guest@h:5672/%2f", "amqp://guest@h:5672/%2f"),
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            // An `@` in the path is not a user's.
            ("amqp://h:5672/vhost@x", "amqp://h:5672/vhost@x"),
            ("127.0.0.1:9092", "127.0.0.1:9092"),
            ("sqlite::memory:", "sqlite::memory:"),
            ("sqlite://orders.db?mode=rwc", "sqlite://orders.db?mode=rwc"),
            // Passwords in the query, as PostgreSQL takes them, whatever else is there.
            (
                "postgres://app@db/orders?password=s3cret&sslmode=require",
                "postgres://app@db/orders?password=***&sslmode=require",
            ),
            (
                "postgres://app:pw@db/orders?application_name=a@b&sslPassword=s3cret#x",
                "postgres://app:***@db/orders?application_name=a@b&sslPassword=***#x",
            ),
            (
                "mysql://root@h/test?auth_token=s3cret",
                "mysql://root@h/test?auth_token=***",
            ),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
