//! Signing in and out.

use std::net::SocketAddr;

use askama::Template;
use axum::Form;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::csrf_refused;
use super::{COOKIE, Chrome, Fail, Shared, chrome, render, session_id};

// ---------------------------------------------------------------------------------------------
// Login

#[derive(Deserialize)]
pub(crate) struct LoginParams {
    pub(super) next: Option<String>,
}

#[derive(Template)]
#[template(path = "console/login.html")]
pub(super) struct LoginPage {
    pub(super) chrome: Chrome,
    pub(super) next: String,
    pub(super) error: Option<String>,
}

/// A path on this console to go back to, or `/`: never another site (`//host`, `/\\host`), and
/// nothing but visible ASCII, so it is always a valid `Location` header.
pub(super) fn local(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.contains('\\')
                && n.len() <= 2000
                && n.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            n.to_owned()
        }
        _ => "/".to_owned(),
    }
}

pub(crate) async fn login_form(
    State(app): Shared,
    headers: HeaderMap,
    Query(params): Query<LoginParams>,
) -> Response {
    render(&LoginPage {
        chrome: chrome(&app, &headers),
        next: local(params.next.as_deref()),
        error: None,
    })
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    pub(super) user: Option<String>,
    pub(super) secret: Option<String>,
    pub(super) next: Option<String>,
}

pub(crate) async fn login(
    State(app): Shared,
    ConnectInfo(client): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Result<Response, Fail> {
    if app.read_only {
        return Err(Fail::Forbidden(
            "this console is read-only: there is nothing to log in for".into(),
        ));
    }
    let client = client.ip();
    if app.gate.locked_out(client) {
        return Err(Fail::TooMany(
            "too many wrong logins from your address: wait a minute and try again".into(),
        ));
    }
    let next = local(form.next.as_deref());
    let user = form.user.unwrap_or_default();
    let secret = form.secret.unwrap_or_default();
    let Some(name) = app.credentials.check(&user, &secret) else {
        app.gate.failed(client);
        let page = LoginPage {
            chrome: chrome(&app, &headers),
            next,
            error: Some("wrong user or secret".into()),
        };
        return Ok((StatusCode::UNAUTHORIZED, render(&page)).into_response());
    };
    app.gate.succeeded(client);
    let id = app
        .gate
        .open(name)
        .map_err(|e| Fail::Database(e.to_string()))?;
    let cookie = format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict");
    let mut response = Redirect::to(&next).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    Ok(response)
}

#[derive(Deserialize)]
pub(crate) struct CsrfForm {
    pub(super) csrf: Option<String>,
}

pub(crate) async fn logout(
    State(app): Shared,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response, Fail> {
    let Some(id) = session_id(&headers) else {
        return Ok(Redirect::to("/").into_response());
    };
    match app.gate.session(&id) {
        Some(s) if s.csrf_matches(form.csrf.as_deref().unwrap_or_default()) => app.gate.close(&id),
        Some(_) => return Err(Fail::Forbidden(csrf_refused())),
        None => {}
    }
    let mut response = Redirect::to("/").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("eventctl_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    Ok(response)
}
