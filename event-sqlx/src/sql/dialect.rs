//! The three databases: what differs between PostgreSQL, MySQL/MariaDB and SQLite, all here.
//!
//! The statements in the sibling modules are written once, as plain generic Rust over
//! [`Backend`]. What they cannot write generically lives in this module:
//! - [`Dialect`] says which SQL shape a database takes (claims, upserts, limited deletes, how a
//!   unique key is named in its errors);
//! - [`Backend`] binds values, runs statements and reads columns with each database's concrete
//!   sqlx types (ids are `BIGINT UNSIGNED` on MySQL, statuses `SMALLINT` on PostgreSQL), through
//!   one short macro, [`impl_backend!`], expanded once per database.

use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::{Pool, QueryBuilder};

use crate::status::EventStatus;

/// The SQL dialect of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MySQL 8 / MariaDB 10.11.
    MySql,
    /// SQLite.
    Sqlite,
}

impl Dialect {
    /// Whether `UPDATE ... RETURNING` exists: a claim is then one statement.
    pub(crate) fn has_returning(self) -> bool {
        matches!(self, Dialect::Postgres | Dialect::Sqlite)
    }

    /// Whether the database takes writers concurrently (SQLite has one writer).
    pub(crate) fn concurrent_writers(self) -> bool {
        !matches!(self, Dialect::Sqlite)
    }

    /// The row lock a claim's candidate query takes, so that concurrent relays pass over each
    /// other's rows instead of waiting.
    pub(crate) fn skip_locked(self) -> &'static str {
        match self {
            Dialect::Postgres | Dialect::MySql => " FOR UPDATE SKIP LOCKED",
            Dialect::Sqlite => "",
        }
    }

    /// How a claim's UPDATE names the rows its subquery picks: `(open, close)` around the
    /// subquery. On PostgreSQL `id = ANY(ARRAY(subquery))` runs the subquery once, as an
    /// InitPlan: written `id IN (subquery)`, a planner whose statistics say the backlog is empty
    /// (taken before it grew) runs the subquery again for every pending row, and one claim over a
    /// backlog of thousands takes minutes. SQLite builds `IN (subquery)` once.
    pub(crate) fn claimed_ids(self) -> (&'static str, &'static str) {
        match self {
            Dialect::Postgres => ("id = ANY(ARRAY(", "))"),
            Dialect::MySql | Dialect::Sqlite => ("id IN (", ")"),
        }
    }

    /// How to begin a transaction that reads, then writes: SQLite takes the write lock at once
    /// (`BEGIN IMMEDIATE`), since a read transaction that later writes while another writer
    /// committed fails as `database is locked` instead of waiting.
    pub(crate) fn begin_writing(self) -> Option<&'static str> {
        match self {
            Dialect::Sqlite => Some("BEGIN IMMEDIATE"),
            Dialect::Postgres | Dialect::MySql => None,
        }
    }

    /// The statement that makes the rest of a transaction plan each statement for its values.
    /// PostgreSQL switches a prepared statement to a generic plan after five runs; for an
    /// `id IN (<1000 values>)` against a table of millions, the generic plan scans the table
    /// where the values' plan reads 1000 index entries.
    pub(crate) fn plan_for_values(self) -> Option<&'static str> {
        match self {
            Dialect::Postgres => Some("SET LOCAL plan_cache_mode = force_custom_plan"),
            Dialect::MySql | Dialect::Sqlite => None,
        }
    }

    /// The guard on the status column of an UPDATE that names its rows by id (a claim, the
    /// relay's marks). The unary `+` keeps the planner from answering it from a status index, or
    /// a partial index over some statuses, instead of looking the ids up: on PostgreSQL, whose
    /// statistics count few live rows in those indexes, a scan of one otherwise visits every dead
    /// entry earlier claims and marks left behind (3,042 for 4 live rows, measured in a claim),
    /// at every statement until vacuum.
    pub(crate) fn status_guard(self, column: &str) -> String {
        match self {
            Dialect::Sqlite | Dialect::Postgres => format!("+{column}"),
            Dialect::MySql => column.to_owned(),
        }
    }

    /// The ORDER BY of a claim, in the order of an index so that the scan stops after `limit` rows
    /// instead of sorting the backlog or walking the published history: the partial index
    /// `outbox_idx_claimable (id)` on PostgreSQL; `idx_status_retry_time`, whose entries end with
    /// the row id, on MySQL and SQLite. SQLite's planner, without statistics, would otherwise sort
    /// every pending row, and with statistics taken on a fresh backlog, scan the published rows by
    /// id.
    pub(crate) fn claim_order(self) -> &'static str {
        match self {
            Dialect::Postgres => " ORDER BY o.id",
            Dialect::MySql | Dialect::Sqlite => {
                " ORDER BY o.publish_status, o.next_retry_time, o.retry_count, o.id"
            }
        }
    }

    /// `SELECT 1 ... WHERE `: a query of one row when its condition holds, of none otherwise.
    pub(crate) fn select_one_where(self) -> &'static str {
        match self {
            Dialect::MySql => "SELECT 1 FROM DUAL WHERE ",
            Dialect::Postgres | Dialect::Sqlite => "SELECT 1 WHERE ",
        }
    }

    /// The tail of an INSERT that leaves an existing row with the same `key` untouched.
    ///
    /// MySQL has no `ON CONFLICT`; there the duplicate "updates" `touch` to itself. sqlx connects
    /// to MySQL with CLIENT_FOUND_ROWS, under which that reports 1 row like an insert would, so
    /// `touch` must change the row: callers pass an expression such as `deliveries = deliveries
    /// + 1`, and a duplicate then reports 2.
    pub(crate) fn insert_ignoring_duplicate(self, key: &str, touch: &str) -> String {
        match self {
            Dialect::MySql => format!(" ON DUPLICATE KEY UPDATE {touch}"),
            Dialect::Postgres | Dialect::Sqlite => format!(" ON CONFLICT ({key}) DO NOTHING"),
        }
    }

    /// The tail of an INSERT that, on a duplicate `key`, updates the existing row: each
    /// `(column, merge)` says how the column takes the new value.
    pub(crate) fn upsert(self, table: &str, key: &str, sets: &[(&str, Merge)]) -> String {
        let sets: Vec<String> = sets
            .iter()
            .map(|&(column, merge)| {
                let (old, new) = match self {
                    Dialect::MySql => (column.to_owned(), format!("VALUES({column})")),
                    Dialect::Postgres | Dialect::Sqlite => {
                        (format!("{table}.{column}"), format!("excluded.{column}"))
                    }
                };
                match merge {
                    Merge::New => format!("{column} = {new}"),
                    Merge::Add => format!("{column} = {old} + {new}"),
                    Merge::Set(value) => format!("{column} = {value}"),
                }
            })
            .collect();
        match self {
            Dialect::MySql => format!(" ON DUPLICATE KEY UPDATE {}", sets.join(", ")),
            Dialect::Postgres | Dialect::Sqlite => {
                format!(" ON CONFLICT ({key}) DO UPDATE SET {}", sets.join(", "))
            }
        }
    }

    /// A `DELETE` of at most a limit of rows, as `(head, tail)`: the statement is `head`, the
    /// condition, ` LIMIT `, the limit, then `tail`. MySQL takes `LIMIT` on a DELETE; PostgreSQL
    /// and SQLite delete by their physical row id from a limited SELECT.
    pub(crate) fn limited_delete(self, table: &str) -> (String, &'static str) {
        match self {
            Dialect::MySql => (format!("DELETE FROM {table} WHERE "), ""),
            Dialect::Postgres => (
                format!("DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table} WHERE "),
                ")",
            ),
            Dialect::Sqlite => (
                format!("DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE "),
                ")",
            ),
        }
    }

    /// The statement that refreshes the planner's statistics of `table`, where the claim's plan
    /// depends on them: PostgreSQL picks the claim's partial index only when it knows how few
    /// rows are claimable, MySQL its status index. SQLite's claim is written in index order and
    /// needs none.
    pub(crate) fn analyze(self, table: &str) -> Option<String> {
        match self {
            Dialect::Postgres => Some(format!("ANALYZE {table}")),
            Dialect::MySql => Some(format!("ANALYZE TABLE {table}")),
            Dialect::Sqlite => None,
        }
    }

    /// The start of a query of one row when the statistics of the table (its name bound next)
    /// are missing or stale: never taken, by hand or by the server's background work
    /// (PostgreSQL's autovacuum), or taken before most of its rows were written (a bulk load
    /// that autovacuum has not caught up with). Other databases keep statistics as rows change,
    /// or need none.
    pub(crate) fn stale_statistics(self) -> Option<&'static str> {
        match self {
            Dialect::Postgres => {
                Some("SELECT 1 FROM pg_stat_user_tables WHERE relid = to_regclass(")
            }
            Dialect::MySql | Dialect::Sqlite => None,
        }
    }

    /// A statement run once on a database before its migrations: SQLite switches the file to
    /// WAL, so that relays read while the service writes and a commit appends to one log
    /// instead of rewriting a rollback journal. The setting stays with the file.
    pub(crate) fn before_migrations(self) -> Option<&'static str> {
        match self {
            Dialect::Sqlite => Some("PRAGMA journal_mode = WAL"),
            Dialect::Postgres | Dialect::MySql => None,
        }
    }

    /// The name of the unique key a duplicate violated, as the migrations name it, or `None`
    /// when `error` is not a unique violation. PostgreSQL names the index; MySQL names the key
    /// in its message (`... for key 'uk_aggregate_sequence'`, qualified by the table on MySQL 8);
    /// SQLite names only the columns, which are mapped back to the key that has them.
    pub(crate) fn violated_key(self, error: &sqlx::Error) -> Option<String> {
        let db = error.as_database_error()?;
        if !db.is_unique_violation() {
            return None;
        }
        match self {
            Dialect::Postgres => db.constraint().map(str::to_owned),
            Dialect::MySql => {
                let message = db.message();
                let key = message.rsplit_once("for key '")?.1.trim_end_matches('\'');
                Some(key.rsplit('.').next().unwrap_or(key).to_owned())
            }
            Dialect::Sqlite => {
                let columns = db.message().strip_prefix("UNIQUE constraint failed: ")?;
                let columns: Vec<&str> = columns
                    .split(", ")
                    .map(|c| c.rsplit('.').next().unwrap_or(c))
                    .collect();
                SQLITE_UNIQUE_KEYS
                    .iter()
                    .find(|(key_columns, _)| *key_columns == columns.as_slice())
                    .map(|(_, name)| (*name).to_owned())
            }
        }
    }

    /// The values of the duplicate key, where the database's error carries them: PostgreSQL's
    /// detail `Key (a, b, c)=(x, y, z) already exists.` gives `x, y, z`; MySQL's message
    /// `Duplicate entry 'x-y-z' for key ...` gives `x-y-z`. SQLite carries none.
    pub(crate) fn duplicate_values(self, error: &sqlx::Error) -> Option<String> {
        let db = error.as_database_error()?;
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => {
                let detail = db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?
                    .detail()?;
                let values = detail.split_once(")=(")?.1;
                Some(values.rsplit_once(") already exists")?.0.to_owned())
            }
            Dialect::MySql => {
                let message = db.message();
                let values = message.strip_prefix("Duplicate entry '")?;
                Some(values.rsplit_once("' for key")?.0.to_owned())
            }
            _ => None,
        }
    }
}

/// How an upsert updates a column of the row that was already there.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Merge {
    /// Takes the new value.
    New,
    /// Adds the new value to the old one.
    Add,
    /// Takes a fixed value (a status code).
    Set(i16),
}

/// The unique keys of the SQLite migrations, by their columns: SQLite's error names only the
/// columns.
const SQLITE_UNIQUE_KEYS: &[(&[&str], &str)] = &[
    (&["event_no"], "outbox_uk_event_no"),
    (
        &["aggregate_type", "aggregate_id", "aggregate_sequence"],
        "outbox_uk_aggregate_sequence",
    ),
    (&["consumer", "event_id"], "quarantine_uk_consumer_event"),
];

/// A value bound into a statement. Statements are generic; each backend binds these with its
/// own sqlx types.
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
#[allow(unreachable_pub)] // unnameable outside: only the sealed Backend takes it
pub enum Value<'a> {
    I64(i64),
    I32(i32),
    I16(i16),
    Str(&'a str),
    OptStr(Option<&'a str>),
    Time(DateTime<Utc>),
    OptTime(Option<DateTime<Utc>>),
    Json(&'a serde_json::Value),
}

impl Value<'_> {
    /// Appends this value to `out` as a PostgreSQL literal, for a statement sent in the simple
    /// query protocol, which takes no bound values. Text is an escape string (`E'...'`), whose
    /// meaning does not depend on `standard_conforming_strings`: backslashes and quotes are
    /// doubled, and nothing else in it is special. Returns `false`, leaving `out` unusable, for
    /// text holding a NUL, which no PostgreSQL text can hold (bound, it fails the statement).
    pub(crate) fn push_pg_literal(&self, out: &mut String) -> bool {
        use std::fmt::Write;
        fn text(out: &mut String, s: &str) -> bool {
            if s.contains('\0') {
                return false;
            }
            out.reserve(s.len() + 3);
            out.push_str("E'");
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\'' => out.push_str("''"),
                    c => out.push(c),
                }
            }
            out.push('\'');
            true
        }
        // Microseconds, cut as sqlx's binary encoding cuts them.
        let time = |out: &mut String, t: &DateTime<Utc>| {
            let _ = write!(out, "'{}'", t.format("%Y-%m-%dT%H:%M:%S%.6f+00:00"));
        };
        match self {
            Value::I64(v) => {
                let _ = write!(out, "{v}");
            }
            Value::I32(v) => {
                let _ = write!(out, "{v}");
            }
            Value::I16(v) => {
                let _ = write!(out, "{v}");
            }
            Value::Str(s) | Value::OptStr(Some(s)) => return text(out, s),
            Value::Time(t) | Value::OptTime(Some(t)) => time(out, t),
            Value::OptStr(None) | Value::OptTime(None) => out.push_str("NULL"),
            // serde_json escapes every control character: the text holds no NUL.
            Value::Json(v) => return text(out, &v.to_string()),
        }
        true
    }
}

macro_rules! value_from {
    ($($ty:ty => $variant:ident),* $(,)?) => {$(
        impl<'a> From<$ty> for Value<'a> {
            fn from(value: $ty) -> Value<'a> {
                Value::$variant(value)
            }
        }
    )*};
}

value_from!(
    i64 => I64,
    i32 => I32,
    i16 => I16,
    &'a str => Str,
    Option<&'a str> => OptStr,
    DateTime<Utc> => Time,
    Option<DateTime<Utc>> => OptTime,
    &'a serde_json::Value => Json,
);

impl<'a> From<&'a String> for Value<'a> {
    fn from(value: &'a String) -> Value<'a> {
        Value::Str(value)
    }
}

impl From<EventStatus> for Value<'_> {
    fn from(status: EventStatus) -> Self {
        Value::I16(status.code())
    }
}

/// A statement being written: SQL text, with every value bound.
#[doc(hidden)]
#[allow(unreachable_pub)] // unnameable outside: only the sealed Backend takes it
pub struct Sql<DB: Backend>(pub(crate) QueryBuilder<DB>);

impl<DB: Backend> Sql<DB> {
    /// A statement starting with `text`.
    pub(crate) fn new(text: impl Into<String>) -> Sql<DB> {
        Sql(QueryBuilder::new(text))
    }

    /// Appends SQL text: only fixed fragments and validated table names, never a value.
    pub(crate) fn push(&mut self, text: impl std::fmt::Display) -> &mut Self {
        self.0.push(text);
        self
    }

    /// Appends a placeholder bound to `value`.
    pub(crate) fn bind<'v>(&mut self, value: impl Into<Value<'v>>) -> &mut Self {
        DB::bind(&mut self.0, value.into());
        self
    }

    /// Appends `(v1, v2, ...)`, every value bound: the list of an `IN`.
    pub(crate) fn list<'v, V: Into<Value<'v>>>(
        &mut self,
        values: impl IntoIterator<Item = V>,
    ) -> &mut Self {
        self.push("(");
        for (i, value) in values.into_iter().enumerate() {
            if i > 0 {
                self.push(", ");
            }
            self.bind(value);
        }
        self.push(")")
    }

    /// Appends a membership test in `values` for the column before it: ` = ANY($n)` with one
    /// array bound on PostgreSQL, ` IN (...)` with each value bound elsewhere. `values` must not
    /// be empty.
    pub(crate) fn in_strs(&mut self, values: &[&str]) -> &mut Self {
        self.push(match DB::DIALECT {
            Dialect::Postgres => " = ANY(",
            Dialect::MySql | Dialect::Sqlite => " IN (",
        });
        self.str_array(values).push(")")
    }

    /// Appends one bound array of `values` (PostgreSQL only: elsewhere the values as a list).
    pub(crate) fn str_array(&mut self, values: &[&str]) -> &mut Self {
        DB::push_str_array(&mut self.0, values);
        self
    }

    /// Runs the statement on `conn`; the number of rows it changed.
    pub(crate) async fn execute(self, conn: &mut DB::Connection) -> Result<u64, sqlx::Error> {
        DB::execute(conn, self).await
    }

    /// Runs the query on `conn`; its rows.
    pub(crate) async fn fetch(
        self,
        conn: &mut DB::Connection,
    ) -> Result<Vec<DB::Row>, sqlx::Error> {
        DB::fetch_all(conn, self).await
    }
}

/// Reads typed columns of one row by name.
pub(crate) struct Columns<'r, DB: Backend>(pub(crate) &'r DB::Row);

impl<DB: Backend> Columns<'_, DB> {
    pub(crate) fn id(&self, column: &str) -> Result<i64, sqlx::Error> {
        DB::read_id(self.0, column)
    }
    pub(crate) fn i64(&self, column: &str) -> Result<i64, sqlx::Error> {
        DB::read_i64(self.0, column)
    }
    pub(crate) fn opt_i64(&self, column: &str) -> Result<Option<i64>, sqlx::Error> {
        DB::read_opt_i64(self.0, column)
    }
    pub(crate) fn i32(&self, column: &str) -> Result<i32, sqlx::Error> {
        DB::read_i32(self.0, column)
    }
    pub(crate) fn code(&self, column: &str) -> Result<i64, sqlx::Error> {
        DB::read_code(self.0, column)
    }
    pub(crate) fn string(&self, column: &str) -> Result<String, sqlx::Error> {
        DB::read_string(self.0, column)
    }
    pub(crate) fn opt_string(&self, column: &str) -> Result<Option<String>, sqlx::Error> {
        DB::read_opt_string(self.0, column)
    }
    pub(crate) fn time(&self, column: &str) -> Result<DateTime<Utc>, sqlx::Error> {
        DB::read_time(self.0, column)
    }
    pub(crate) fn opt_time(&self, column: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        DB::read_opt_time(self.0, column)
    }
    pub(crate) fn json(&self, column: &str) -> Result<serde_json::Value, sqlx::Error> {
        DB::read_json(self.0, column)
    }
    pub(crate) fn opt_json(&self, column: &str) -> Result<Option<serde_json::Value>, sqlx::Error> {
        DB::read_opt_json(self.0, column)
    }
    pub(crate) fn status(&self, column: &str) -> Result<EventStatus, sqlx::Error> {
        EventStatus::from_code(self.code(column)?).map_err(|e| sqlx::Error::Decode(Box::new(e)))
    }
}

/// A database the toolkit runs on: PostgreSQL, MySQL/MariaDB or SQLite.
///
/// Sealed: its methods bind, run and read with each database's concrete sqlx types, and are not
/// part of the public API.
pub trait Backend: sqlx::Database + sealed::Sealed {
    /// The dialect.
    const DIALECT: Dialect;

    #[doc(hidden)]
    fn migrate(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<(), sqlx::migrate::MigrateError>> + Send + '_;
    #[doc(hidden)]
    fn bind(q: &mut QueryBuilder<Self>, value: Value<'_>);
    #[doc(hidden)]
    fn push_str_array(q: &mut QueryBuilder<Self>, values: &[&str]);
    #[doc(hidden)]
    fn execute(
        conn: &mut Self::Connection,
        sql: Sql<Self>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + '_;
    #[doc(hidden)]
    fn fetch_all(
        conn: &mut Self::Connection,
        sql: Sql<Self>,
    ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send + '_;
    /// Runs `statement`, its placeholders bound to `values` in order, as a prepared statement
    /// (cached per connection); the count of rows it changed.
    #[doc(hidden)]
    fn execute_values<'c>(
        conn: &'c mut Self::Connection,
        statement: String,
        values: &[Value<'_>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'c;
    /// Runs `script`, statements separated by `;` with every value a literal, in one round trip
    /// (the simple query protocol). The first failing statement ends it.
    #[doc(hidden)]
    fn execute_script(
        conn: &mut Self::Connection,
        script: String,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_;
    /// How deep in transactions sqlx has `conn`: 0 outside one, 1 in a transaction, more in its
    /// savepoints.
    #[doc(hidden)]
    fn transaction_depth(conn: &Self::Connection) -> usize;
    #[doc(hidden)]
    fn read_id(row: &Self::Row, column: &str) -> Result<i64, sqlx::Error>;
    #[doc(hidden)]
    fn read_code(row: &Self::Row, column: &str) -> Result<i64, sqlx::Error>;
    #[doc(hidden)]
    fn read_i64(row: &Self::Row, column: &str) -> Result<i64, sqlx::Error>;
    #[doc(hidden)]
    fn read_opt_i64(row: &Self::Row, column: &str) -> Result<Option<i64>, sqlx::Error>;
    #[doc(hidden)]
    fn read_i32(row: &Self::Row, column: &str) -> Result<i32, sqlx::Error>;
    #[doc(hidden)]
    fn read_string(row: &Self::Row, column: &str) -> Result<String, sqlx::Error>;
    #[doc(hidden)]
    fn read_opt_string(row: &Self::Row, column: &str) -> Result<Option<String>, sqlx::Error>;
    #[doc(hidden)]
    fn read_time(row: &Self::Row, column: &str) -> Result<DateTime<Utc>, sqlx::Error>;
    #[doc(hidden)]
    fn read_opt_time(row: &Self::Row, column: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error>;
    #[doc(hidden)]
    fn read_json(row: &Self::Row, column: &str) -> Result<serde_json::Value, sqlx::Error>;
    #[doc(hidden)]
    fn read_opt_json(
        row: &Self::Row,
        column: &str,
    ) -> Result<Option<serde_json::Value>, sqlx::Error>;
}

mod sealed {
    pub trait Sealed {}
}

/// Implements [`Backend`] for one database: `id` is the Rust type of its `BIGINT` ids, `status`
/// that of its `TINYINT` status columns, `migrations` the folder its migrations are embedded from.
/// One bound `text[]` (PostgreSQL), or, where there are no arrays, the values as a list.
macro_rules! str_array {
    (array, $q:ident, $values:ident) => {{
        $q.push_bind(
            $values
                .iter()
                .map(|v| (*v).to_owned())
                .collect::<Vec<String>>(),
        );
    }};
    (list, $q:ident, $values:ident) => {{
        for (i, value) in $values.iter().enumerate() {
            if i > 0 {
                $q.push(", ");
            }
            $q.push_bind(*value);
        }
    }};
}

macro_rules! impl_backend {
    ($db:ty, $dialect:expr, id = $id:ty, status = $status:ty, migrations = $migrations:literal, strings = $strings:ident) => {
        impl sealed::Sealed for $db {}

        impl Backend for $db {
            const DIALECT: Dialect = $dialect;

            async fn migrate(pool: &Pool<$db>) -> Result<(), sqlx::migrate::MigrateError> {
                if let Some(statement) = Self::DIALECT.before_migrations() {
                    if let Err(e) = sqlx::raw_sql(statement).execute(pool).await {
                        tracing::warn!(error = %e, statement, "could not prepare the database; continuing");
                    }
                }
                let mut migrator = sqlx::migrate!($migrations);
                // Our own history table: the application's `_sqlx_migrations` is left alone, and
                // its migrations do not look missing to us (nor ours to it).
                migrator.dangerous_set_table_name("event_toolkit_migrations");
                migrator.set_ignore_missing(true);
                migrator.run(pool).await
            }

            fn push_str_array(q: &mut QueryBuilder<$db>, values: &[&str]) {
                str_array!($strings, q, values);
            }

            fn bind(q: &mut QueryBuilder<$db>, value: Value<'_>) {
                match value {
                    Value::I64(v) => q.push_bind(v),
                    Value::I32(v) => q.push_bind(v),
                    Value::I16(v) => q.push_bind(v),
                    Value::Str(v) => q.push_bind(v),
                    Value::OptStr(v) => q.push_bind(v),
                    Value::Time(v) => q.push_bind(v),
                    Value::OptTime(v) => q.push_bind(v),
                    Value::Json(v) => q.push_bind(sqlx::types::Json(v)),
                };
            }

            async fn execute(conn: &mut Self::Connection, mut sql: Sql<$db>) -> Result<u64, sqlx::Error> {
                Ok(sql.0.build().execute(conn).await?.rows_affected())
            }

            async fn fetch_all(conn: &mut Self::Connection, mut sql: Sql<$db>) -> Result<Vec<Self::Row>, sqlx::Error> {
                sql.0.build().fetch_all(conn).await
            }

            fn execute_values<'c>(
                conn: &'c mut Self::Connection,
                statement: String,
                values: &[Value<'_>],
            ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'c {
                use sqlx::Arguments as _;
                let mut args = <$db as sqlx::Database>::Arguments::default();
                let added = values.iter().try_for_each(|value| match *value {
                    Value::I64(v) => args.add(v),
                    Value::I32(v) => args.add(v),
                    Value::I16(v) => args.add(v),
                    Value::Str(v) => args.add(v),
                    Value::OptStr(v) => args.add(v),
                    Value::Time(v) => args.add(v),
                    Value::OptTime(v) => args.add(v),
                    Value::Json(v) => args.add(sqlx::types::Json(v)),
                });
                async move {
                    added.map_err(sqlx::Error::Encode)?;
                    // Only the toolkit's own statements come here: fixed text, validated table
                    // names, and literals written by `Value::push_pg_literal`.
                    let query = sqlx::query_with(sqlx::AssertSqlSafe(statement), args);
                    Ok(query.execute(conn).await?.rows_affected())
                }
            }

            async fn execute_script(conn: &mut Self::Connection, script: String) -> Result<(), sqlx::Error> {
                // Only the toolkit's own scripts come here: fixed text, validated table names,
                // and values written by `Value::push_pg_literal`.
                sqlx::raw_sql(sqlx::AssertSqlSafe(script)).execute(conn).await.map(|_| ())
            }

            fn transaction_depth(conn: &Self::Connection) -> usize {
                use sqlx_core::transaction::TransactionManager;
                <$db as sqlx::Database>::TransactionManager::get_transaction_depth(conn)
            }

            fn read_id(row: &Self::Row, column: &str) -> Result<i64, sqlx::Error> {
                let id: $id = sqlx::Row::try_get(row, column)?;
                i64::try_from(id).map_err(|e| sqlx::Error::Decode(Box::new(e)))
            }
            fn read_code(row: &Self::Row, column: &str) -> Result<i64, sqlx::Error> {
                Ok(i64::from(sqlx::Row::try_get::<$status, _>(row, column)?))
            }
            fn read_i64(row: &Self::Row, column: &str) -> Result<i64, sqlx::Error> {
                sqlx::Row::try_get(row, column)
            }
            fn read_opt_i64(row: &Self::Row, column: &str) -> Result<Option<i64>, sqlx::Error> {
                sqlx::Row::try_get(row, column)
            }
            fn read_i32(row: &Self::Row, column: &str) -> Result<i32, sqlx::Error> {
                sqlx::Row::try_get(row, column)
            }
            fn read_string(row: &Self::Row, column: &str) -> Result<String, sqlx::Error> {
                sqlx::Row::try_get(row, column)
            }
            fn read_opt_string(row: &Self::Row, column: &str) -> Result<Option<String>, sqlx::Error> {
                sqlx::Row::try_get(row, column)
            }
            fn read_time(row: &Self::Row, column: &str) -> Result<DateTime<Utc>, sqlx::Error> {
                sqlx::Row::try_get(row, column)
            }
            fn read_opt_time(row: &Self::Row, column: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
                sqlx::Row::try_get(row, column)
            }
            fn read_json(row: &Self::Row, column: &str) -> Result<serde_json::Value, sqlx::Error> {
                Ok(sqlx::Row::try_get::<sqlx::types::Json<serde_json::Value>, _>(row, column)?.0)
            }
            fn read_opt_json(row: &Self::Row, column: &str) -> Result<Option<serde_json::Value>, sqlx::Error> {
                let value: Option<sqlx::types::Json<serde_json::Value>> = sqlx::Row::try_get(row, column)?;
                Ok(value.map(|v| v.0))
            }
        }
    };
}

#[cfg(feature = "postgres")]
impl_backend!(
    sqlx::Postgres,
    Dialect::Postgres,
    id = i64,
    status = i16,
    migrations = "migrations/postgres",
    strings = array
);
#[cfg(feature = "mysql")]
impl_backend!(
    sqlx::MySql,
    Dialect::MySql,
    id = u64,
    status = i64,
    migrations = "migrations/mysql",
    strings = list
);
#[cfg(feature = "sqlite")]
impl_backend!(
    sqlx::Sqlite,
    Dialect::Sqlite,
    id = i64,
    status = i64,
    migrations = "migrations/sqlite",
    strings = list
);

#[cfg(test)]
mod tests {
    use super::Value;
    use chrono::{TimeZone, Utc};

    fn literal(value: Value<'_>) -> Option<String> {
        let mut out = String::new();
        value.push_pg_literal(&mut out).then_some(out)
    }

    #[test]
    fn pg_literals_escape_what_an_escape_string_gives_meaning_to() {
        assert_eq!(
            literal(Value::Str(r"it's \ here")).unwrap(),
            r"E'it''s \\ here'"
        );
        assert_eq!(literal(Value::Str("")).unwrap(), "E''");
        assert_eq!(literal(Value::OptStr(None)).unwrap(), "NULL");
        assert_eq!(literal(Value::I64(-42)).unwrap(), "-42");
        let time = Utc.timestamp_opt(1_700_000_000, 123_456_789).unwrap();
        assert_eq!(
            literal(Value::Time(time)).unwrap(),
            "'2023-11-14T22:13:20.123456+00:00'"
        );
        let json = serde_json::json!({"text": "a'b\\c\u{0}"});
        assert_eq!(
            literal(Value::Json(&json)).unwrap(),
            r#"E'{"text":"a''b\\\\c\\u0000"}'"#
        );
        assert_eq!(literal(Value::Str("nul\0")), None);
    }
}
