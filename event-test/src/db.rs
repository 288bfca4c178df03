//! The database a test runs on when it names none: SQLite in memory, private to the test.

use event_sqlx::{Error, Outbox, OutboxConfig};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

/// A fresh SQLite database in memory with the toolkit's tables (outbox, message events, inbox,
/// quarantine, archives), private to the caller: two calls give two databases.
///
/// Its connections share one database, which lives as long as the pool: the pool keeps one
/// connection open and never retires it. Create the service's own tables on it, then build the
/// service's consumers and stores with it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = event_test::memory_database().await?;
/// sqlx::query("CREATE TABLE bill (order_id TEXT PRIMARY KEY)").execute(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn memory_database() -> Result<SqlitePool, Error> {
    // `:memory:` names a new shared-cache database for each options value, so every pool gets
    // its own and its connections see one database.
    let options: SqliteConnectOptions = "sqlite::memory:".parse().map_err(opening)?;
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options)
        .await
        .map_err(opening)?;
    Outbox::new(pool.clone(), OutboxConfig::new())
        .migrate()
        .await?;
    Ok(pool)
}

fn opening(source: sqlx::Error) -> Error {
    Error::Database {
        table: "(an in-memory SQLite database)".to_owned(),
        source,
    }
}
