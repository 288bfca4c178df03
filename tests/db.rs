//! Fresh databases for tests: PostgreSQL and MariaDB get a new database per test, SQLite a new
//! file. Addresses come from `EVENT_TEST_POSTGRES_URL` and `EVENT_TEST_MYSQL_URL`; with
//! `EVENT_TEST_REQUIRE_SERVICES=1` an unreachable service fails the test instead of skipping it.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use event_sqlx::{Backend, Outbox, OutboxConfig};
use sqlx::pool::PoolOptions;
use sqlx::{MySql, Pool, Postgres, Sqlite};

/// The PostgreSQL server tests use.
pub fn postgres_url() -> String {
    std::env::var("EVENT_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The MySQL/MariaDB server tests use.
pub fn mysql_url() -> String {
    std::env::var("EVENT_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// Whether an unreachable service fails the run.
pub fn services_required() -> bool {
    std::env::var("EVENT_TEST_REQUIRE_SERVICES").is_ok_and(|v| v == "1" || v == "true")
}

/// A database made for one test, with the event tables migrated and a business table `orders`.
pub struct TestDb<DB: Backend> {
    /// The outbox on it.
    pub outbox: Outbox<DB>,
    /// Its URL, for other processes.
    pub url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    Server {
        admin_url: String,
        name: String,
        postgres: bool,
    },
    File(PathBuf),
}

fn unique_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "evt_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        nanos % 100_000
    )
}

fn unreachable(service: &str, url: &str, error: impl std::fmt::Display) -> Option<()> {
    let message = format!("{service} at {url} is unreachable ({error})");
    if services_required() {
        panic!(
            "{message}; EVENT_TEST_REQUIRE_SERVICES=1 makes this a failure. Start the service (see docs/src/development.md) or point the URL variable at one."
        );
    }
    eprintln!("skipping: {message}; set EVENT_TEST_REQUIRE_SERVICES=1 to fail instead");
    None
}

/// Replaces the database name (the path) of a URL.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{}", &base[..host_end], name);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

impl TestDb<Postgres> {
    /// A fresh PostgreSQL database, or `None` when the server is unreachable and not required.
    pub async fn postgres() -> Option<TestDb<Postgres>> {
        TestDb::on_server("PostgreSQL", postgres_url(), true, "").await
    }

    /// A pool of one connection to this database: every statement on the same session, so
    /// that what the session keeps (prepared statements, their plans) can be read back.
    pub async fn one_connection(&self) -> sqlx::PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&self.url)
            .await
            .unwrap()
    }
}

impl TestDb<Postgres> {
    /// A pool of at most `max_connections` on this database, and how many connections it has
    /// been given back (sqlx checks each one it gets back with a round trip).
    pub async fn counting_pool(
        &self,
        max_connections: u32,
    ) -> (sqlx::PgPool, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let released = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = std::sync::Arc::clone(&released);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(max_connections)
            .after_release(move |_, _| {
                counter.fetch_add(1, Ordering::Relaxed);
                Box::pin(async { Ok(true) })
            })
            .connect(&self.url)
            .await
            .unwrap();
        (pool, released)
    }
}

impl TestDb<MySql> {
    /// A fresh MySQL/MariaDB database, or `None` when the server is unreachable and not required.
    pub async fn mysql() -> Option<TestDb<MySql>> {
        TestDb::on_server("MySQL/MariaDB", mysql_url(), false, " ENGINE=InnoDB").await
    }
}

impl<DB: Backend> TestDb<DB>
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    /// A new database on the server at `admin_url`, with the `orders` table (`table_options`
    /// appended to its DDL).
    async fn on_server(
        service: &str,
        admin_url: String,
        postgres: bool,
        table_options: &str,
    ) -> Option<TestDb<DB>> {
        let admin: Pool<DB> = match Pool::connect(&admin_url).await {
            Ok(pool) => pool,
            Err(e) => return unreachable(service, &admin_url, e).and(None),
        };
        let name = unique_name();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await
            .expect("create the test database");
        admin.close().await;
        let url = with_database(&admin_url, &name);
        let cleanup = Cleanup::Server {
            admin_url,
            name,
            postgres,
        };
        let orders = format!(
            "CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL, version BIGINT NOT NULL){table_options}"
        );
        Some(TestDb::open(url, cleanup, orders).await)
    }
}

impl TestDb<Sqlite> {
    /// A fresh SQLite file.
    pub async fn sqlite() -> Option<TestDb<Sqlite>> {
        let path = std::env::temp_dir().join(format!("{}.db", unique_name()));
        let url = format!("sqlite://{}?mode=rwc", path.display());
        Some(TestDb::open(url, Cleanup::File(path), "CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL)".to_owned()).await)
    }
}

impl<DB: Backend> TestDb<DB> {
    /// The outbox's rows per status, all of them.
    pub async fn counts(&self) -> event_sqlx::StatusCounts {
        self.outbox
            .status_counts(None, ..)
            .await
            .expect("status counts")
    }

    async fn open(url: String, cleanup: Cleanup, orders_ddl: String) -> TestDb<DB>
    where
        for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
    {
        let pool: Pool<DB> = PoolOptions::new()
            .max_connections(12)
            .connect(&url)
            .await
            .expect("connect to the fresh test database");
        sqlx::raw_sql(sqlx::AssertSqlSafe(orders_ddl))
            .execute(&pool)
            .await
            .expect("create the orders table");
        let outbox = Outbox::new(pool, OutboxConfig::new());
        outbox.migrate().await.expect("migrate the event tables");
        TestDb {
            outbox,
            url,
            cleanup,
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<DB> {
        self.outbox.pool()
    }

    /// Drops the database or deletes the file.
    pub async fn cleanup(self) {
        self.outbox.pool().close().await;
        match self.cleanup {
            Cleanup::Server {
                admin_url,
                name,
                postgres,
            } => {
                let sql = if postgres {
                    format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                } else {
                    format!("DROP DATABASE IF EXISTS {name}")
                };
                if postgres {
                    if let Ok(admin) = sqlx::PgPool::connect(&admin_url).await {
                        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                            .execute(&admin)
                            .await;
                    }
                } else if let Ok(admin) = sqlx::MySqlPool::connect(&admin_url).await {
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&admin)
                        .await;
                }
            }
            Cleanup::File(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
        }
    }
}

/// The application's side of the tests: a tiny `orders` repository, per backend.
pub trait Orders: Backend {
    /// Inserts or updates an order inside the caller's transaction.
    fn save_order<'a>(
        conn: &'a mut Self::Connection,
        id: &'a str,
        status: &'a str,
        version: i64,
    ) -> impl Future<Output = sqlx::Result<()>> + Send + 'a;

    /// How many orders exist.
    fn count_orders(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<i64>> + Send + '_;

    /// The number a `SELECT COUNT(*) ...` answers.
    fn count<'a>(
        pool: &'a Pool<Self>,
        query: &'static str,
    ) -> impl Future<Output = sqlx::Result<i64>> + Send + 'a;

    /// Runs one statement of the test's own, on `pool`.
    fn run_sql(
        pool: &Pool<Self>,
        statement: String,
    ) -> impl Future<Output = sqlx::Result<()>> + Send + '_;

    /// The status an order has, if it exists.
    fn order_status<'a>(
        pool: &'a Pool<Self>,
        id: &'a str,
    ) -> impl Future<Output = sqlx::Result<Option<String>>> + Send + 'a;
}

macro_rules! impl_orders {
    ($db:ty, $upsert:literal, $status:literal) => {
        impl Orders for $db {
            fn save_order<'a>(
                conn: &'a mut Self::Connection,
                id: &'a str,
                status: &'a str,
                version: i64,
            ) -> impl Future<Output = sqlx::Result<()>> + Send + 'a {
                async move {
                    sqlx::query($upsert)
                        .bind(id)
                        .bind(status)
                        .bind(version)
                        .execute(&mut *conn)
                        .await?;
                    Ok(())
                }
            }

            fn count_orders(
                pool: &Pool<Self>,
            ) -> impl Future<Output = sqlx::Result<i64>> + Send + '_ {
                async move {
                    sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM orders")
                        .fetch_one(pool)
                        .await
                }
            }

            fn count<'a>(
                pool: &'a Pool<Self>,
                query: &'static str,
            ) -> impl Future<Output = sqlx::Result<i64>> + Send + 'a {
                async move { sqlx::query_scalar::<_, i64>(query).fetch_one(pool).await }
            }

            fn run_sql(
                pool: &Pool<Self>,
                statement: String,
            ) -> impl Future<Output = sqlx::Result<()>> + Send + '_ {
                async move {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
                        .execute(pool)
                        .await?;
                    Ok(())
                }
            }

            fn order_status<'a>(
                pool: &'a Pool<Self>,
                id: &'a str,
            ) -> impl Future<Output = sqlx::Result<Option<String>>> + Send + 'a {
                async move {
                    sqlx::query_scalar::<_, String>($status)
                        .bind(id)
                        .fetch_optional(pool)
                        .await
                }
            }
        }
    };
}

impl_orders!(
    Postgres,
    "INSERT INTO orders (id, status, version) VALUES ($1, $2, $3) ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, version = EXCLUDED.version",
    "SELECT status FROM orders WHERE id = $1"
);
impl_orders!(
    MySql,
    "INSERT INTO orders (id, status, version) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE status = VALUES(status), version = VALUES(version)",
    "SELECT status FROM orders WHERE id = ?"
);
impl_orders!(
    Sqlite,
    "INSERT INTO orders (id, status, version) VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version",
    "SELECT status FROM orders WHERE id = ?"
);

/// The NATS server tests use.
pub fn nats_url() -> String {
    std::env::var("EVENT_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// The RabbitMQ server tests use.
pub fn amqp_url() -> String {
    std::env::var("EVENT_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// The Kafka-protocol broker tests use (`.ci/run` starts one there).
pub fn kafka_url() -> String {
    std::env::var("EVENT_TEST_KAFKA_URL").unwrap_or_else(|_| "127.0.0.1:19092".to_owned())
}

/// `Some(value)`, or `None` after saying why the test is skipped; a failure instead under
/// `EVENT_TEST_REQUIRE_SERVICES=1`.
pub fn reachable<T, E: std::fmt::Display>(
    service: &str,
    url: &str,
    result: Result<T, E>,
) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(e) => unreachable(service, url, e).and(None),
    }
}

/// A name no other test run uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", unique_name())
}

/// A fresh PostgreSQL database whose outbox commits on `path`.
pub async fn postgres_with(path: event_sqlx::CommitPath) -> Option<TestDb<Postgres>> {
    let mut db = TestDb::postgres().await?;
    db.outbox = event_sqlx::Outbox::new(
        db.pool().clone(),
        event_sqlx::OutboxConfig::new().commit_path(path),
    );
    Some(db)
}

/// PostgreSQL with the outbox migrated to the lean index profile.
pub async fn postgres_lean() -> Option<TestDb<Postgres>> {
    let mut db = TestDb::postgres().await?;
    db.outbox = event_sqlx::Outbox::new(
        db.pool().clone(),
        event_sqlx::OutboxConfig::new().index_profile(event_sqlx::IndexProfile::Lean),
    );
    db.outbox
        .migrate()
        .await
        .expect("the lean profile is migrated");
    Some(db)
}

/// The index DDL that lets a MySQL or MariaDB relay check each aggregate's order from its
/// unpublished events alone (the guide's "Order per aggregate").
pub const MYSQL_STATUS_INDEX: &str = "ALTER TABLE biz_outbox_event ADD KEY \
    idx_unpublished_aggregate (aggregate_type, aggregate_id, publish_status, deleted, aggregate_sequence)";

/// MySQL or MariaDB with [`MYSQL_STATUS_INDEX`] added to the migrated outbox.
pub async fn mysql_with_status_index() -> Option<TestDb<sqlx::MySql>> {
    let db = TestDb::mysql().await?;
    sqlx::query(MYSQL_STATUS_INDEX)
        .execute(db.pool())
        .await
        .expect("the status index is added");
    Some(db)
}

/// A TCP port on 127.0.0.1 that nothing listened on a moment ago, for a process the test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("no free port on 127.0.0.1")
}
