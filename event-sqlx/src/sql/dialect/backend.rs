//! [`Backend`]: binding values, running statements and reading columns with each database's
//! concrete sqlx types, through one macro, `impl_backend!`, expanded once per database.
// The macros are expanded by the database features; a build with only broker features has none.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused_macros)
)]

use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::{Pool, QueryBuilder};

use super::{Dialect, Sql, Value};

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
    /// Binds `ids` as one array (PostgreSQL; the others push them as a list).
    #[doc(hidden)]
    fn push_id_array(q: &mut QueryBuilder<Self>, ids: &[i64]);
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

/// The length PostgreSQL assumes for an array it does not know when it plans a statement for
/// every value (a generic plan).
#[cfg(feature = "postgres")]
const PLANNED_ARRAY_LEN: usize = 10;

/// `ids` for `= ANY(...)`, at least [`PLANNED_ARRAY_LEN`] long, the last id repeated (which
/// changes no membership). PostgreSQL keeps planning a prepared statement afresh for each run
/// while the plan for the values given looks cheaper than the plan for every value; it costs
/// `id = ANY($1)` by the array's length, so shorter arrays (the marks of small batches) were
/// planned every time, each planning costing about half of what the UPDATE itself cost. Padded,
/// the statement is planned once per connection.
#[cfg(feature = "postgres")]
fn planned_ids(ids: &[i64]) -> Vec<i64> {
    let mut padded = ids.to_vec();
    if let Some(&last) = ids.last() {
        padded.resize(ids.len().max(PLANNED_ARRAY_LEN), last);
    }
    padded
}

macro_rules! id_array {
    (array, $q:ident, $ids:ident) => {{
        $q.push_bind(planned_ids($ids));
    }};
    (list, $q:ident, $ids:ident) => {{
        for (i, id) in $ids.iter().enumerate() {
            if i > 0 {
                $q.push(", ");
            }
            $q.push_bind(*id);
        }
    }};
}

/// Implements [`Backend`] for one database: `id` is the Rust type of its `BIGINT` ids, `status`
/// that of its `TINYINT` status columns, `migrations` the folder its migrations are embedded from.
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

            fn push_id_array(q: &mut QueryBuilder<$db>, ids: &[i64]) {
                id_array!($strings, q, ids);
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
