//! The database a test runs on when it names none: SQLite in memory, private to the test.

use event_sqlx::Error;
#[cfg(feature = "sqlite")]
use event_sqlx::{Outbox, OutboxConfig};
#[cfg(feature = "sqlite")]
use sqlx::SqlitePool;
#[cfg(feature = "sqlite")]
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
#[cfg(feature = "sqlite")]
pub async fn memory_database() -> Result<SqlitePool, Error> {
    let paused = PausedTime::probe();
    let opened = open().await;
    paused.check()?;
    opened
}

#[cfg(feature = "sqlite")]
async fn open() -> Result<SqlitePool, Error> {
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

#[cfg(feature = "sqlite")]
fn opening(source: sqlx::Error) -> Error {
    Error::Database {
        table: "(an in-memory SQLite database)".to_owned(),
        source,
    }
}

/// Tells whether tokio's time is paused (`#[tokio::test(start_paused = true)]`), under which
/// sqlx's own timeouts fire as soon as the runtime waits for the database (it idles while
/// SQLite works on its own thread, and the paused clock jumps to the next timer). Compares the
/// time tokio's clock and the system's moved across real work: without pausing they are the
/// same clock.
pub(crate) struct PausedTime {
    tokio: tokio::time::Instant,
    system: std::time::Instant,
}

impl PausedTime {
    pub(crate) fn probe() -> PausedTime {
        PausedTime {
            tokio: tokio::time::Instant::now(),
            system: std::time::Instant::now(),
        }
    }

    /// `Err` naming the fix when the two clocks parted since the probe.
    pub(crate) fn check(&self) -> Result<(), Error> {
        let real = self.system.elapsed();
        let tokio = self.tokio.elapsed();
        // Ahead: the paused clock jumped to a timer. Behind: it stood still while work took
        // real time.
        let ahead = tokio > real * 2 + std::time::Duration::from_millis(50);
        let behind = real > std::time::Duration::from_millis(2) && tokio < real / 2;
        let parted = ahead || behind;
        if parted {
            Err(Error::Misconfigured(PAUSED))
        } else {
            Ok(())
        }
    }
}

const PAUSED: &str = "tokio's time is paused (#[tokio::test(start_paused = true)]): sqlx's own timeouts fire as soon as the test waits for the database. Run the test under #[tokio::test] and move time with the harness's clock (Harness::advance, Harness::run_for, TestClock)";
