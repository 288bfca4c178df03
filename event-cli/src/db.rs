//! Opening the database named by a URL, whatever its backend.

use std::time::Duration;

use anyhow::{Context, bail};
use event_sqlx::{Backend, Outbox, OutboxConfig};
use sqlx::pool::PoolOptions;

use clap::Args;

/// Where the outbox is.
#[derive(Debug, Clone, Args)]
pub(crate) struct DbArgs {
    /// postgres://..., mysql://... or sqlite://FILE
    #[arg(long, env = "EVENT_DATABASE_URL")]
    pub(crate) database_url: String,
    /// How long to wait for the database to accept a connection (and for a free connection of
    /// the pool) before giving up with exit 2.
    #[arg(long, default_value = "10s", value_parser = crate::args::duration)]
    pub(crate) connect_timeout: std::time::Duration,
    /// How long one statement may run before the database cancels it (PostgreSQL, MariaDB;
    /// MySQL 8 for reads); `0` for no limit.
    #[arg(long, default_value = "60s", value_parser = crate::args::duration)]
    pub(crate) statement_timeout: std::time::Duration,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// How long [`open`] keeps trying a database that is not reachable yet (refused, silent,
    /// starting up): zero, the default, for commands that answer at once; `eventctl relay`
    /// sets its `--max-wait`.
    #[arg(skip)]
    pub(crate) max_wait: Duration,
}

/// Which backend a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Postgres,
    MySql,
    Sqlite,
}

pub(crate) fn kind(url: &str) -> anyhow::Result<Kind> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or_default();
    Ok(match scheme {
        "postgres" | "postgresql" => Kind::Postgres,
        "mysql" | "mariadb" => Kind::MySql,
        "sqlite" => Kind::Sqlite,
        _ => bail!(
            "unsupported database URL `{}`: use postgres://USER@HOST/DB, mysql://USER@HOST/DB or sqlite://FILE",
            redact(url)
        ),
    })
}

/// The URL without its secrets, for messages (see [`event_sqlx::redact_url`]).
pub(crate) fn redact(url: &str) -> String {
    event_sqlx::redact_url(url)
}

/// Opens the outbox at `args.database_url`, with the connect and statement timeouts of `args`:
/// a server that accepts the connection and never answers gives an error within the connect
/// timeout, not a hang. A database that is not reachable yet is tried again for up to
/// `args.max_wait`, each failure shown on stderr.
pub(crate) async fn open<DB: Backend>(args: &DbArgs) -> anyhow::Result<Outbox<DB>>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    crate::outage::retry("eventctl", args.max_wait, || open_once(args)).await
}

/// One attempt of [`open`].
async fn open_once<DB: Backend>(args: &DbArgs) -> anyhow::Result<Outbox<DB>>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let url = args.database_url.as_str();
    let url = if url.starts_with("sqlite://") && !url.contains("mode=") {
        // An operator pointing at a file that does not exist almost certainly mistyped it.
        let path = url.trim_start_matches("sqlite://");
        if !std::path::Path::new(path).exists() {
            bail!(
                "the SQLite file {path} does not exist: check the path (eventctl migrate creates the tables in an existing or new file with sqlite://{path}?mode=rwc)"
            );
        }
        url.to_owned()
    } else {
        url.to_owned()
    };
    let timeout = args.connect_timeout.max(Duration::from_millis(1));
    let timed_out = || {
        anyhow::Error::new(crate::outage::NoAnswer(timeout))
            .context(format!("cannot connect to {}", redact(&url)))
    };
    // One direct connection first: its error says why (refused, auth, unknown database), where
    // the pool would only report a timeout.
    let probe = tokio::time::timeout(timeout, <DB::Connection as sqlx::Connection>::connect(&url))
        .await
        .map_err(|_| timed_out())?
        .with_context(|| format!("cannot connect to {}", redact(&url)))?;
    let _ = sqlx::Connection::close(probe).await;
    let setup = statement_timeout(kind(&url)?, args.statement_timeout);
    let pool = PoolOptions::<DB>::new()
        .max_connections(4)
        .acquire_timeout(timeout)
        .after_connect(move |conn, _meta| {
            let setup = setup.clone();
            Box::pin(async move {
                for statement in setup {
                    // MySQL 8 and MariaDB name the setting differently: the other one fails.
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
                        .execute(&mut *conn)
                        .await;
                }
                Ok(())
            })
        })
        .connect(&url);
    let pool = tokio::time::timeout(timeout, pool)
        .await
        .map_err(|_| timed_out())?
        .with_context(|| format!("cannot connect to {}", redact(&url)))?;
    Ok(Outbox::new(pool, OutboxConfig::new()))
}

/// The statements that set a session's statement timeout, by backend.
fn statement_timeout(kind: Kind, timeout: Duration) -> Vec<String> {
    let millis = timeout.as_millis();
    match kind {
        Kind::Postgres => vec![format!("SET statement_timeout = {millis}")],
        Kind::MySql => vec![
            format!("SET SESSION max_statement_time = {}", timeout.as_secs_f64()),
            format!("SET SESSION max_execution_time = {millis}"),
        ],
        Kind::Sqlite => Vec::new(),
    }
}

/// Runs `$body` with `$outbox` bound to the outbox of the URL's backend.
macro_rules! with_outbox {
    ($db:expr, |$outbox:ident| $body:expr) => {
        match $crate::db::kind(&$db.database_url)? {
            $crate::db::Kind::Postgres => {
                let $outbox = $crate::db::open::<sqlx::Postgres>($db).await?;
                $body
            }
            $crate::db::Kind::MySql => {
                let $outbox = $crate::db::open::<sqlx::MySql>($db).await?;
                $body
            }
            $crate::db::Kind::Sqlite => {
                let $outbox = $crate::db::open::<sqlx::Sqlite>($db).await?;
                $body
            }
        }
    };
}
pub(crate) use with_outbox;
