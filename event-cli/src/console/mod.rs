//! `eventctl console`: a web console over the outbox, the message table, the inbox and the
//! quarantine, for on-call engineers and support staff.
//!
//! Pages are rendered on the server (askama templates, compiled into the binary); no script runs
//! in the browser and nothing is fetched from elsewhere. Reading needs no login; every action
//! needs one (a user from `--auth-file` or the shared token of `EVENTCTL_CONSOLE_TOKEN`), carries
//! the session's CSRF token, and is written to `operation_audit`.

mod auth;
mod pages;
mod store;
mod view;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use axum::Router;
use axum::http::{HeaderName, HeaderValue, header};
use axum::routing::{get, post};
use clap::Args;

use crate::db::DbArgs;
use crate::db::{self, Kind};
use auth::{Credentials, Gate};
use store::{ConsumerStore, Store, Stores};

/// `eventctl console`.
#[derive(Debug, Args)]
pub(crate) struct ConsoleArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Where to listen. Any address other than loopback needs credentials (--auth-file or
    /// EVENTCTL_CONSOLE_TOKEN).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The consumers' database (consumed_event, quarantined_event) when it is not the outbox's.
    #[arg(long, env = "EVENT_CONSUMER_DATABASE_URL")]
    consumer_database_url: Option<String>,
    /// Show everything, change nothing: no action is offered or accepted.
    #[arg(long)]
    read_only: bool,
    /// Operators who may act: one `user:secret` per line (secrets of 16 characters or more).
    /// Or set EVENTCTL_CONSOLE_TOKEN to one shared token; operators then log in with their
    /// name and that token. There is no default.
    #[arg(long)]
    auth_file: Option<PathBuf>,
}

/// What every handler reads.
pub(crate) struct App {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) consumers: Arc<dyn ConsumerStore>,
    pub(crate) credentials: Credentials,
    pub(crate) gate: Gate,
    pub(crate) read_only: bool,
    pub(crate) database: String,
}

async fn open(args: &DbArgs) -> anyhow::Result<(Arc<dyn Store>, Arc<dyn ConsumerStore>)> {
    Ok(match db::kind(&args.database_url)? {
        Kind::Postgres => {
            let s = Arc::new(Stores::new(db::open::<sqlx::Postgres>(args).await?));
            (s.clone(), s)
        }
        Kind::MySql => {
            let s = Arc::new(Stores::new(db::open::<sqlx::MySql>(args).await?));
            (s.clone(), s)
        }
        Kind::Sqlite => {
            let s = Arc::new(Stores::new(db::open::<sqlx::Sqlite>(args).await?));
            (s.clone(), s)
        }
    })
}

/// Runs the console until Ctrl-C or SIGTERM.
pub(crate) async fn run(args: ConsoleArgs) -> anyhow::Result<ExitCode> {
    let credentials = Credentials::load(
        args.auth_file.as_deref(),
        std::env::var(auth::TOKEN_ENV).ok(),
    )?;
    if !args.listen.ip().is_loopback() && !credentials.any() {
        bail!(
            "refusing to serve on {} without credentials: anyone who reaches it could act on the outbox; give --auth-file or set {}, or listen on 127.0.0.1",
            args.listen,
            auth::TOKEN_ENV
        );
    }
    let (store, own_consumers) = open(&args.db).await?;
    let consumers = match &args.consumer_database_url {
        Some(url) => {
            let mut consumer_db = args.db.clone();
            consumer_db.database_url = url.clone();
            open(&consumer_db).await?.1
        }
        None => own_consumers,
    };
    let read_only = args.read_only || !credentials.any();
    if !read_only {
        // Every action is written to the audit table: without it, refuse now, not at 3 a.m.
        store.audit_entries(i64::MAX, 1).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot read the audit table operation_audit ({e}); run `eventctl migrate` on this database first, or start with --read-only"
            )
        })?;
    }
    let app = Arc::new(App {
        store,
        consumers,
        credentials,
        gate: Gate::default(),
        read_only,
        database: db::redact(&args.db.database_url),
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr().unwrap_or(args.listen);
    eprintln!(
        "console: serving {} on http://{address}/{}",
        app.database,
        if args.read_only {
            " (read-only)".to_owned()
        } else if read_only {
            format!(
                " (read-only: no credentials; give --auth-file or set {} to enable actions)",
                auth::TOKEN_ENV
            )
        } else {
            String::new()
        }
    );
    axum::serve(
        listener,
        router(app).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(crate::relay::shutdown_signal())
    .await
    .context("the console's server failed")?;
    Ok(ExitCode::SUCCESS)
}

/// Every page and action.
pub(crate) fn router(app: Arc<App>) -> Router {
    use pages::EventVerb;
    Router::new()
        .route("/", get(pages::overview))
        .route("/search", get(pages::search))
        .route("/aggregate", get(pages::aggregate))
        .route("/event", get(pages::event))
        .route("/quarantine", get(pages::quarantine))
        .route("/messages", get(pages::messages))
        .route("/audit", get(pages::audit))
        .route("/login", get(pages::login_form).post(pages::login))
        .route("/logout", post(pages::logout))
        .route("/bulk-retry", get(pages::bulk_retry_confirm))
        .route(
            "/actions/outbox/retry",
            pages::event_action(EventVerb::OutboxRetry),
        )
        .route(
            "/actions/outbox/cancel",
            pages::event_action(EventVerb::OutboxCancel),
        )
        .route("/actions/outbox/skip", post(pages::outbox_skip))
        .route("/actions/outbox/bulk-retry", post(pages::outbox_bulk_retry))
        .route(
            "/actions/quarantine/requeue",
            post(pages::quarantine_requeue),
        )
        .route("/actions/quarantine/cancel", post(pages::quarantine_cancel))
        .route(
            "/actions/messages/retry",
            pages::event_action(EventVerb::MessageRetry),
        )
        .route(
            "/actions/messages/cancel",
            pages::event_action(EventVerb::MessageCancel),
        )
        .route("/static/console.css", get(pages::stylesheet))
        .fallback(pages::not_found)
        .layer(axum::middleware::map_response(secure_headers))
        .with_state(app)
}

/// The headers every response carries: no script, no framing, no sniffing, no caching.
async fn secure_headers(mut response: axum::response::Response) -> axum::response::Response {
    let headers = response.headers_mut();
    let set = |headers: &mut axum::http::HeaderMap, name: HeaderName, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(
        headers,
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'",
    );
    set(headers, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(headers, header::X_FRAME_OPTIONS, "DENY");
    set(headers, header::REFERRER_POLICY, "no-referrer");
    set(headers, header::CACHE_CONTROL, "no-store");
    response
}
