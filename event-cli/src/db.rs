//! Opening the database named by a URL, whatever its backend.

use anyhow::{Context, bail};
use event_sqlx::{Backend, Outbox, OutboxConfig};
use sqlx::pool::PoolOptions;

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

/// The URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

pub(crate) async fn open<DB: Backend>(url: &str) -> anyhow::Result<Outbox<DB>> {
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
    // One direct connection first: its error says why (refused, auth, unknown database), where
    // the pool would only report a timeout.
    let probe = <DB::Connection as sqlx::Connection>::connect(&url)
        .await
        .with_context(|| format!("cannot connect to {}", redact(&url)))?;
    let _ = sqlx::Connection::close(probe).await;
    let pool = PoolOptions::<DB>::new()
        .max_connections(4)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect(&url)
        .await
        .with_context(|| format!("cannot connect to {}", redact(&url)))?;
    Ok(Outbox::new(pool, OutboxConfig::new()))
}
