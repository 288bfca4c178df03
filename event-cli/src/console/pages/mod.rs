//! The pages and the actions. Every action checks, in this order: not read-only, a live session
//! (its cookie), the form's CSRF token against the session's, the reason when one is required;
//! then applies the change with the same guards as the CLI and writes it to the audit trail.

use std::sync::Arc;

use askama::Template;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use chrono::Utc;

use crate::console::App;
use crate::console::auth::Session;

mod actions;
mod event;
mod lists;
mod login;
mod overview;
mod search;

pub(crate) use actions::*;
pub(crate) use event::*;
pub(crate) use lists::*;
pub(crate) use login::*;
pub(crate) use overview::*;
pub(crate) use search::*;

type Shared = State<Arc<App>>;

/// The session cookie.
const COOKIE: &str = "eventctl_session";
/// Rows per page.
const PAGE: u32 = 50;
/// The most rows one bulk retry touches.
const BULK_MAX: u32 = 1000;
/// The overview's window for published and cancelled counts and the chart.
const WINDOW_MINUTES: i64 = 180;

/// What every page shows around its content.
pub(crate) struct Chrome {
    pub(crate) user: Option<String>,
    pub(crate) csrf: String,
    pub(crate) can_act: bool,
    pub(crate) read_only: bool,
    pub(crate) now: String,
    pub(crate) database: String,
}

fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

fn session(app: &App, headers: &HeaderMap) -> Option<Session> {
    session_id(headers).and_then(|id| app.gate.session(&id))
}

fn chrome(app: &App, headers: &HeaderMap) -> Chrome {
    let session = session(app, headers);
    Chrome {
        can_act: session.is_some() && !app.read_only,
        user: session.as_ref().map(|s| s.user.clone()),
        csrf: session.map(|s| s.csrf).unwrap_or_default(),
        read_only: app.read_only,
        database: app.database.clone(),
        ..Chrome::anonymous()
    }
}

impl Chrome {
    /// No one logged in, no database named: what an error page shows.
    fn anonymous() -> Chrome {
        Chrome {
            user: None,
            csrf: String::new(),
            can_act: false,
            read_only: false,
            now: Utc::now().format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            database: String::new(),
        }
    }
}

/// Why a request was not served.
pub(crate) enum Fail {
    BadInput(String),
    NotFound(String),
    Unauthorized(String),
    Forbidden(String),
    TooMany(String),
    Database(String),
}

impl From<event_sqlx::Error> for Fail {
    fn from(e: event_sqlx::Error) -> Self {
        Fail::Database(crate::output::chain(&anyhow::Error::new(e)))
    }
}

#[derive(Template)]
#[template(path = "console/error.html")]
struct ErrorPage {
    chrome: Chrome,
    title: &'static str,
    message: String,
}

impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        let (status, title, message) = match self {
            Fail::BadInput(m) => (StatusCode::BAD_REQUEST, "Bad input", m),
            Fail::NotFound(m) => (StatusCode::NOT_FOUND, "Not found", m),
            Fail::Unauthorized(m) => (StatusCode::UNAUTHORIZED, "Log in first", m),
            Fail::Forbidden(m) => (StatusCode::FORBIDDEN, "Refused", m),
            Fail::TooMany(m) => (StatusCode::TOO_MANY_REQUESTS, "Too many attempts", m),
            Fail::Database(m) => (StatusCode::SERVICE_UNAVAILABLE, "Database error", m),
        };
        let page = ErrorPage {
            chrome: Chrome::anonymous(),
            title,
            message,
        };
        (status, render(&page)).into_response()
    }
}

fn render(page: &impl Template) -> Response {
    match page.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the page could not be rendered: {e}"),
        )
            .into_response(),
    }
}

/// An empty form value as absent.
fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

// ---------------------------------------------------------------------------------------------
// Static

pub(crate) async fn stylesheet() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("../../../templates/console/console.css"),
    )
        .into_response()
}

pub(crate) async fn not_found() -> Fail {
    Fail::NotFound("no such page: start from the overview at /".into())
}

#[cfg(test)]
mod tests {
    use super::local;

    #[test]
    fn only_local_visible_paths_are_gone_back_to() {
        assert_eq!(local(Some("/search?no=a")), "/search?no=a");
        for bad in [
            "//evil.example",
            "/\\evil",
            "https://evil.example",
            "/\r\nSet-Cookie: x",
            "/é",
            "",
        ] {
            assert_eq!(local(Some(bad)), "/", "{bad:?}");
        }
        assert_eq!(local(None), "/");
    }
}
