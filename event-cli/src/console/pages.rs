//! The pages and the actions. Every action checks, in this order: not read-only, a live session
//! (its cookie), the form's CSRF token against the session's, the reason when one is required;
//! then applies the change with the same guards as the CLI and writes it to the audit trail.

use std::net::SocketAddr;
use std::sync::Arc;

use askama::Template;
use axum::Form;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use chrono::{DateTime, TimeDelta, Utc};
use event_sqlx::{
    EventStatus, FailureClass, GroupCount, MessageRecord, NewAuditEntry, QuarantineCount,
    QuarantineRecord, QuarantineStatus, StatusCounts,
};
use serde::Deserialize;

use super::App;
use super::auth::Session;
use super::store::Search;
use super::view::{self, Chart, Row, When, link};

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
// Overview

pub(crate) struct LeaseView {
    relay: String,
    events: i64,
    expiry: When,
    state: &'static str,
}

pub(crate) struct QuarantineCountView {
    consumer: String,
    status: &'static str,
    entries: i64,
    link: String,
}

impl QuarantineCountView {
    fn new(c: QuarantineCount) -> QuarantineCountView {
        QuarantineCountView {
            link: link(
                "/quarantine",
                &[("consumer", &c.consumer), ("status", c.status.name())],
            ),
            consumer: c.consumer,
            status: c.status.name(),
            entries: c.entries,
        }
    }
}

#[derive(Template)]
#[template(path = "console/overview.html")]
struct OverviewPage {
    chrome: Chrome,
    outbox: StatusCounts,
    messages: StatusCounts,
    backlog: i64,
    oldest: Option<String>,
    expired_leases: i64,
    leases: Vec<LeaseView>,
    by_topic: Vec<GroupCount>,
    by_type: Vec<GroupCount>,
    chart: Chart,
    quarantine: Vec<QuarantineCountView>,
    quarantined: i64,
    quarantine_error: Option<String>,
    window: String,
}

pub(crate) async fn overview(State(app): Shared, headers: HeaderMap) -> Result<Response, Fail> {
    let now = Utc::now();
    let since = now - TimeDelta::minutes(WINDOW_MINUTES);
    let store = &app.store;
    let (health, outbox, by_topic, by_type, series, leases, messages) = tokio::try_join!(
        store.health(),
        store.live_counts(since),
        store.failed_counts(true),
        store.failed_counts(false),
        store.per_minute(since),
        store.leases(),
        store.message_counts(since),
    )?;
    let (quarantine, quarantined, quarantine_error) = match app.consumers.quarantine_counts().await
    {
        Ok(counts) => {
            let quarantined = counts
                .iter()
                .filter(|c| c.status == QuarantineStatus::Quarantined)
                .map(|c| c.entries)
                .sum();
            let views = counts.into_iter().map(QuarantineCountView::new).collect();
            (views, quarantined, None)
        }
        Err(e) => (
            Vec::new(),
            0,
            Some(crate::output::chain(&anyhow::Error::new(e))),
        ),
    };
    let page = OverviewPage {
        chrome: chrome(&app, &headers),
        backlog: outbox.pending + outbox.in_progress + outbox.failed,
        oldest: health
            .oldest_pending_seconds
            .map(|s| view::relative(now - TimeDelta::seconds(s), now)),
        expired_leases: health.expired_leases,
        leases: leases
            .into_iter()
            .map(|l| LeaseView {
                state: if l.latest_expiry <= now {
                    "expired"
                } else if l.earliest_expiry <= now {
                    "partly expired"
                } else {
                    "live"
                },
                expiry: When::new(l.earliest_expiry, now),
                relay: l.relay,
                events: l.events,
            })
            .collect(),
        outbox,
        messages,
        by_topic,
        by_type,
        chart: view::chart(&series, now, WINDOW_MINUTES),
        quarantine,
        quarantined,
        quarantine_error,
        window: format!("{} h", WINDOW_MINUTES / 60),
    };
    Ok(render(&page))
}

// ---------------------------------------------------------------------------------------------
// Search

/// A search's query string.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct SearchParams {
    no: Option<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    event_type: Option<String>,
    topic: Option<String>,
    trace_id: Option<String>,
    status: Option<String>,
    from: Option<String>,
    to: Option<String>,
    before: Option<String>,
}

impl SearchParams {
    fn search(&self) -> Result<Search, Fail> {
        let aggregate = match (given(&self.aggregate_type), given(&self.aggregate_id)) {
            (Some(t), Some(i)) => Some((t.to_owned(), i.to_owned())),
            (None, None) => None,
            _ => {
                return Err(Fail::BadInput(
                    "an aggregate is found by its type and its id: give both".into(),
                ));
            }
        };
        let status = match given(&self.status) {
            Some(name) => Some(view::parse_status(name).ok_or_else(|| {
                Fail::BadInput(format!(
                    "unknown status `{name}`: use pending, in_progress, published, failed or cancelled"
                ))
            })?),
            None => None,
        };
        let time = |v: &Option<String>| -> Result<Option<DateTime<Utc>>, Fail> {
            given(v)
                .map(view::parse_time)
                .transpose()
                .map_err(Fail::BadInput)
        };
        let before = match given(&self.before) {
            Some(c) => Some(view::parse_cursor(c).ok_or_else(|| {
                Fail::BadInput("the page cursor is damaged: start the search again".into())
            })?),
            None => None,
        };
        Ok(Search {
            event_no: given(&self.no).map(str::to_owned),
            aggregate,
            event_type: given(&self.event_type).map(str::to_owned),
            topic: given(&self.topic).map(str::to_owned),
            trace_id: given(&self.trace_id).map(str::to_owned),
            status,
            from: time(&self.from)?,
            to: time(&self.to)?,
            before,
        })
    }

    /// The query string, without the page cursor, with `status` replaced when given.
    fn query(&self, status: Option<&str>) -> Vec<(&'static str, String)> {
        let v = |o: &Option<String>| given(o).unwrap_or_default().to_owned();
        vec![
            ("no", v(&self.no)),
            ("aggregate_type", v(&self.aggregate_type)),
            ("aggregate_id", v(&self.aggregate_id)),
            ("event_type", v(&self.event_type)),
            ("topic", v(&self.topic)),
            ("trace_id", v(&self.trace_id)),
            (
                "status",
                status.map(str::to_owned).unwrap_or_else(|| v(&self.status)),
            ),
            ("from", v(&self.from)),
            ("to", v(&self.to)),
        ]
    }

    /// The query string alone (`k=v&...`), without the page cursor.
    fn query_string(&self) -> String {
        self.link("", None, &[]).trim_start_matches('?').to_owned()
    }

    fn link(&self, path: &str, status: Option<&str>, extra: &[(&str, &str)]) -> String {
        let query = self.query(status);
        let mut pairs: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
        pairs.extend_from_slice(extra);
        link(path, &pairs)
    }

    fn is_empty(&self) -> bool {
        self.query(None).iter().all(|(_, v)| v.is_empty())
    }
}

pub(crate) struct StatusOption {
    value: &'static str,
    label: &'static str,
    selected: bool,
}

fn status_options(selected: Option<&str>) -> Vec<StatusOption> {
    [
        EventStatus::Pending,
        EventStatus::InProgress,
        EventStatus::Succeeded,
        EventStatus::Failed,
        EventStatus::Cancelled,
    ]
    .into_iter()
    .map(|s| StatusOption {
        value: view::status_value(s),
        label: view::status(s).0,
        selected: selected == Some(view::status_value(s)),
    })
    .collect()
}

#[derive(Template)]
#[template(path = "console/search.html")]
struct SearchPage {
    chrome: Chrome,
    form: SearchParams,
    statuses: Vec<StatusOption>,
    searched: bool,
    rows: Vec<Row>,
    next: Option<String>,
    bulk: Option<String>,
    error: Option<String>,
}

pub(crate) async fn search(
    State(app): Shared,
    headers: HeaderMap,
    Query(params): Query<SearchParams>,
) -> Result<Response, Fail> {
    let now = Utc::now();
    let mut page = SearchPage {
        chrome: chrome(&app, &headers),
        statuses: status_options(given(&params.status)),
        searched: !params.is_empty(),
        rows: Vec::new(),
        next: None,
        bulk: None,
        error: None,
        form: params.clone(),
    };
    let search = match params.search() {
        Ok(search) => search,
        Err(Fail::BadInput(message)) => {
            page.error = Some(message);
            return Ok((StatusCode::BAD_REQUEST, render(&page)).into_response());
        }
        Err(other) => return Err(other),
    };
    let mut records = app.store.search(&search, PAGE + 1).await?;
    if records.len() > PAGE as usize {
        records.truncate(PAGE as usize);
        if let Some(last) = records.last() {
            page.next = Some(params.link("/search", None, &[("before", &view::cursor(last))]));
        }
    }
    if records
        .iter()
        .any(|r| r.publish_status == EventStatus::Failed)
    {
        page.bulk = Some(params.link("/bulk-retry", Some("failed"), &[]));
    }
    page.rows = records.iter().map(|r| Row::new(r, now)).collect();
    Ok(render(&page))
}

// ---------------------------------------------------------------------------------------------
// Aggregate timeline

#[derive(Deserialize)]
pub(crate) struct AggregateParams {
    #[serde(rename = "type")]
    kind: Option<String>,
    id: Option<String>,
}

#[derive(Template)]
#[template(path = "console/aggregate.html")]
struct AggregatePage {
    chrome: Chrome,
    kind: String,
    id: String,
    rows: Vec<Row>,
    head: Option<String>,
    blocked: usize,
}

pub(crate) async fn aggregate(
    State(app): Shared,
    headers: HeaderMap,
    Query(params): Query<AggregateParams>,
) -> Result<Response, Fail> {
    let (Some(kind), Some(id)) = (given(&params.kind), given(&params.id)) else {
        return Err(Fail::BadInput(
            "give the aggregate's type and id: /aggregate?type=ORDER&id=o-123".into(),
        ));
    };
    let now = Utc::now();
    let records = app.store.aggregate(kind, id).await?;
    if records.is_empty() {
        return Err(Fail::NotFound(format!(
            "the outbox holds no event of {kind} {id} (archived events are in biz_outbox_event_archive)"
        )));
    }
    let mut rows: Vec<Row> = records.iter().map(|r| Row::new(r, now)).collect();
    // The head: the earliest event not yet published or cancelled. The ordered relay publishes
    // nothing after it until it is published, so every later unpublished event waits on it.
    let head = rows.iter().position(|r| r.unpublished);
    let mut blocked = 0;
    let mut head_no = None;
    if let Some(h) = head {
        blocked = rows[h + 1..].iter().filter(|r| r.unpublished).count();
        rows[h].blocking = true;
        head_no = Some(rows[h].event_no.clone());
    }
    let page = AggregatePage {
        chrome: chrome(&app, &headers),
        kind: kind.to_owned(),
        id: id.to_owned(),
        rows,
        head: head_no,
        blocked,
    };
    Ok(render(&page))
}

// ---------------------------------------------------------------------------------------------
// Event detail

#[derive(Deserialize)]
pub(crate) struct EventParams {
    no: Option<String>,
}

pub(crate) struct Step {
    label: &'static str,
    at: Option<When>,
    note: String,
}

pub(crate) struct ConsumptionView {
    consumer: String,
    at: When,
    deliveries: i64,
}

pub(crate) struct EntryView {
    id: i64,
    consumer: String,
    consumer_version: String,
    event_id: String,
    event_link: String,
    event_type: String,
    class: &'static str,
    status: &'static str,
    reason: String,
    retries: i32,
    owner: String,
    body: String,
    body_big: bool,
    first: When,
    last: When,
    replayed: Option<When>,
    can_requeue: bool,
    can_cancel: bool,
}

impl EntryView {
    fn new(e: QuarantineRecord, now: DateTime<Utc>) -> EntryView {
        let body = match serde_json::from_str::<serde_json::Value>(&e.body) {
            Ok(v) => view::pretty(&v),
            Err(_) => e.body.clone(),
        };
        EntryView {
            id: e.id,
            event_link: link("/event", &[("no", &e.event_id)]),
            consumer: e.consumer,
            consumer_version: e.consumer_version,
            event_id: e.event_id,
            event_type: e.event_type.unwrap_or_default(),
            class: e.failure_class.name(),
            status: e.status.name(),
            reason: e.reason,
            retries: e.retry_count,
            owner: e.owner.unwrap_or_default(),
            body_big: body.len() > 600,
            body,
            first: When::new(e.first_failure_time, now),
            last: When::new(e.last_failure_time, now),
            replayed: When::opt(e.replay_time, now),
            can_requeue: e.status == QuarantineStatus::Quarantined,
            can_cancel: matches!(
                e.status,
                QuarantineStatus::Quarantined | QuarantineStatus::Requeued
            ),
        }
    }
}

#[derive(Template)]
#[template(path = "console/event.html")]
struct EventPage {
    chrome: Chrome,
    row: Row,
    event_version: i32,
    source: String,
    channel: String,
    routing_key: String,
    trace_id: String,
    trace_link: String,
    envelope: String,
    payload: String,
    payload_big: bool,
    headers: String,
    history: Vec<Step>,
    consumptions: Vec<ConsumptionView>,
    consumption_error: Option<String>,
    entries: Vec<EntryView>,
    can_cancel: bool,
}

pub(crate) async fn event(
    State(app): Shared,
    headers: HeaderMap,
    Query(params): Query<EventParams>,
) -> Result<Response, Fail> {
    let Some(no) = given(&params.no) else {
        return Err(Fail::BadInput(
            "give the event number: /event?no=ORDER_PAID:o-123".into(),
        ));
    };
    let now = Utc::now();
    let Some(r) = app.store.event(no).await? else {
        return Err(Fail::NotFound(format!(
            "no outbox event has event number {no} (archived events are in biz_outbox_event_archive)"
        )));
    };
    let (consumptions, consumption_error) = match app.consumers.consumptions(no).await {
        Ok(list) => (
            list.into_iter()
                .map(|c| ConsumptionView {
                    at: When::new(c.consumed_time, now),
                    consumer: c.consumer,
                    deliveries: c.deliveries,
                })
                .collect(),
            None,
        ),
        Err(e) => (
            Vec::new(),
            Some(crate::output::chain(&anyhow::Error::new(e))),
        ),
    };
    let entries = app
        .consumers
        .quarantined(None, None, None, Some(no), 0, PAGE)
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|e| EntryView::new(e, now))
        .collect();
    let envelope = match r.envelope() {
        Ok(envelope) => serde_json::to_value(&envelope)
            .map(|v| view::pretty(&v))
            .unwrap_or_else(|e| format!("the envelope cannot be shown: {e}")),
        Err(e) => format!("the row does not make a valid envelope: {e}"),
    };
    let payload = view::pretty(&r.event_payload);
    let mut history = vec![Step {
        label: "recorded",
        at: Some(When::new(r.create_time, now)),
        note: format!("by {}", r.event_source),
    }];
    if r.last_publish_time.is_some() || r.retry_count > 0 {
        history.push(Step {
            label: "last attempt",
            at: When::opt(r.last_publish_time, now),
            note: if r.retry_count > 0 {
                format!("{} failed attempts so far", r.retry_count)
            } else {
                String::new()
            },
        });
    }
    if let (Some(by), EventStatus::InProgress) = (&r.locked_by, r.publish_status) {
        history.push(Step {
            label: "claimed",
            at: When::opt(r.lock_until, now),
            note: format!("by relay {by}; lease until this time"),
        });
    }
    if r.publish_status == EventStatus::Failed {
        history.push(Step {
            label: "next retry",
            at: When::opt(r.next_retry_time, now),
            note: if r.retry_count >= r.max_retry_count {
                "retries used up: retry it by hand or cancel it".to_owned()
            } else {
                String::new()
            },
        });
    }
    if let Some(at) = r.published_time {
        history.push(Step {
            label: "published",
            at: Some(When::new(at, now)),
            note: String::new(),
        });
    }
    history.push(Step {
        label: "last change",
        at: Some(When::new(r.update_time, now)),
        note: format!("now {}", view::status(r.publish_status).0),
    });
    let trace_id = r.trace_id.clone().unwrap_or_default();
    let page = EventPage {
        chrome: chrome(&app, &headers),
        event_version: r.event_version,
        source: r.event_source.clone(),
        channel: r.publish_channel.clone(),
        routing_key: r.routing_key.clone().unwrap_or_default(),
        trace_link: link("/search", &[("trace_id", &trace_id)]),
        trace_id,
        envelope,
        payload_big: payload.len() > 2000,
        payload,
        headers: r
            .event_headers
            .as_ref()
            .map(view::pretty)
            .unwrap_or_default(),
        history,
        consumptions,
        consumption_error,
        entries,
        can_cancel: matches!(r.publish_status, EventStatus::Pending | EventStatus::Failed),
        row: Row::new(&r, now),
    };
    Ok(render(&page))
}

// ---------------------------------------------------------------------------------------------
// Quarantine

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct QuarantineParams {
    consumer: Option<String>,
    status: Option<String>,
    class: Option<String>,
    after: Option<i64>,
}

#[derive(Template)]
#[template(path = "console/quarantine.html")]
struct QuarantinePage {
    chrome: Chrome,
    counts: Vec<QuarantineCountView>,
    entries: Vec<EntryView>,
    consumer: String,
    status: String,
    class: String,
    next: Option<String>,
}

pub(crate) async fn quarantine(
    State(app): Shared,
    headers: HeaderMap,
    Query(params): Query<QuarantineParams>,
) -> Result<Response, Fail> {
    let now = Utc::now();
    let status = match given(&params.status) {
        Some(name) => Some(QuarantineStatus::from_name(name).ok_or_else(|| {
            Fail::BadInput(format!(
                "unknown status `{name}`: use quarantined, requeued, replayed or cancelled"
            ))
        })?),
        None => None,
    };
    let class = match given(&params.class) {
        Some(name) => {
            Some(FailureClass::from_name(name).map_err(|e| Fail::BadInput(e.to_string()))?)
        }
        None => None,
    };
    let consumer = given(&params.consumer);
    let counts = app.consumers.quarantine_counts().await?;
    let mut entries = app
        .consumers
        .quarantined(
            consumer,
            status,
            class,
            None,
            params.after.unwrap_or(0),
            PAGE + 1,
        )
        .await?;
    let mut next = None;
    if entries.len() > PAGE as usize {
        entries.truncate(PAGE as usize);
        if let Some(last) = entries.last() {
            let after = last.id.to_string();
            next = Some(link(
                "/quarantine",
                &[
                    ("consumer", consumer.unwrap_or_default()),
                    ("status", given(&params.status).unwrap_or_default()),
                    ("class", given(&params.class).unwrap_or_default()),
                    ("after", &after),
                ],
            ));
        }
    }
    let page = QuarantinePage {
        chrome: chrome(&app, &headers),
        counts: counts.into_iter().map(QuarantineCountView::new).collect(),
        entries: entries
            .into_iter()
            .map(|e| EntryView::new(e, now))
            .collect(),
        consumer: consumer.unwrap_or_default().to_owned(),
        status: given(&params.status).unwrap_or_default().to_owned(),
        class: given(&params.class).unwrap_or_default().to_owned(),
        next,
    };
    Ok(render(&page))
}

// ---------------------------------------------------------------------------------------------
// Message table

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct MessageParams {
    no: Option<String>,
    biz_type: Option<String>,
    biz_id: Option<String>,
}

pub(crate) struct MessageView {
    event_no: String,
    event_type: String,
    biz: String,
    status: &'static str,
    status_class: &'static str,
    retries: String,
    created: When,
    next_retry: Option<When>,
    fail_reason: String,
    payload: String,
    can_retry: bool,
    can_cancel: bool,
}

impl MessageView {
    fn new(m: MessageRecord, now: DateTime<Utc>) -> MessageView {
        let (status, status_class) = view::status(m.event_status);
        MessageView {
            biz: format!("{} {}", m.biz_type, m.biz_id),
            status,
            status_class,
            retries: format!("{}/{}", m.retry_count, m.max_retry_count),
            created: When::new(m.create_time, now),
            next_retry: When::opt(m.next_retry_time, now),
            fail_reason: m.fail_reason.unwrap_or_default(),
            payload: view::pretty(&m.event_payload),
            can_retry: m.event_status == EventStatus::Failed,
            can_cancel: matches!(m.event_status, EventStatus::Pending | EventStatus::Failed),
            event_no: m.event_no,
            event_type: m.event_type,
        }
    }
}

#[derive(Template)]
#[template(path = "console/messages.html")]
struct MessagesPage {
    chrome: Chrome,
    counts: StatusCounts,
    rows: Vec<MessageView>,
    heading: String,
    form: MessageParams,
    window: String,
}

pub(crate) async fn messages(
    State(app): Shared,
    headers: HeaderMap,
    Query(params): Query<MessageParams>,
) -> Result<Response, Fail> {
    let now = Utc::now();
    let counts = app
        .store
        .message_counts(now - TimeDelta::minutes(WINDOW_MINUTES))
        .await?;
    let (heading, rows) = if let Some(no) = given(&params.no) {
        (
            format!("Message {no}"),
            app.store.message(no).await?.into_iter().collect(),
        )
    } else {
        match (given(&params.biz_type), given(&params.biz_id)) {
            (Some(t), Some(i)) => (
                format!("Messages of {t} {i}"),
                app.store.messages_of(t, i).await?,
            ),
            (None, None) => (
                "Failed messages, most recently failed first".to_owned(),
                app.store.failed_messages(PAGE).await?,
            ),
            _ => {
                return Err(Fail::BadInput(
                    "a business object is found by its type and its id: give both".into(),
                ));
            }
        }
    };
    let page = MessagesPage {
        chrome: chrome(&app, &headers),
        counts,
        rows: rows.into_iter().map(|m| MessageView::new(m, now)).collect(),
        heading,
        form: params,
        window: format!("{} h", WINDOW_MINUTES / 60),
    };
    Ok(render(&page))
}

// ---------------------------------------------------------------------------------------------
// Audit

#[derive(Deserialize)]
pub(crate) struct AuditParams {
    before: Option<i64>,
}

pub(crate) struct AuditView {
    at: When,
    actor: String,
    action: String,
    target: String,
    affected: i64,
    rows: String,
    reason: String,
    outcome: String,
}

#[derive(Template)]
#[template(path = "console/audit.html")]
struct AuditPage {
    chrome: Chrome,
    entries: Vec<AuditView>,
    next: Option<String>,
}

pub(crate) async fn audit(
    State(app): Shared,
    headers: HeaderMap,
    Query(params): Query<AuditParams>,
) -> Result<Response, Fail> {
    let now = Utc::now();
    let mut entries = app
        .store
        .audit_entries(params.before.unwrap_or(i64::MAX), PAGE + 1)
        .await?;
    let mut next = None;
    if entries.len() > PAGE as usize {
        entries.truncate(PAGE as usize);
        if let Some(last) = entries.last() {
            next = Some(format!("/audit?before={}", last.id));
        }
    }
    let page = AuditPage {
        chrome: chrome(&app, &headers),
        entries: entries
            .into_iter()
            .map(|e| AuditView {
                at: When::new(e.action_time, now),
                actor: e.actor,
                action: e.action,
                target: e.target,
                affected: e.affected,
                rows: e.affected_rows.unwrap_or_default(),
                reason: e.reason.unwrap_or_default(),
                outcome: e.outcome,
            })
            .collect(),
        next,
    };
    Ok(render(&page))
}

// ---------------------------------------------------------------------------------------------
// Login

#[derive(Deserialize)]
pub(crate) struct LoginParams {
    next: Option<String>,
}

#[derive(Template)]
#[template(path = "console/login.html")]
struct LoginPage {
    chrome: Chrome,
    next: String,
    error: Option<String>,
}

/// A path on this console to go back to, or `/`: never another site (`//host`, `/\\host`), and
/// nothing but visible ASCII, so it is always a valid `Location` header.
fn local(next: Option<&str>) -> String {
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
    user: Option<String>,
    secret: Option<String>,
    next: Option<String>,
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
    csrf: Option<String>,
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

// ---------------------------------------------------------------------------------------------
// Actions

fn csrf_refused() -> String {
    "the form's CSRF token does not match your session; nothing was changed: reload the page and submit it again".into()
}

/// The operator allowed to act, or why not.
fn authorize(app: &App, headers: &HeaderMap, csrf: Option<&str>) -> Result<Session, Fail> {
    if app.read_only {
        return Err(Fail::Forbidden(
            "this console is read-only; nothing was changed".into(),
        ));
    }
    let Some(session) = session(app, headers) else {
        return Err(Fail::Unauthorized(
            "actions need a login; nothing was changed: log in at /login and submit again".into(),
        ));
    };
    if !session.csrf_matches(csrf.unwrap_or_default()) {
        return Err(Fail::Forbidden(csrf_refused()));
    }
    Ok(session)
}

fn reason(reason: &Option<String>) -> Result<String, Fail> {
    given(reason).map(str::to_owned).ok_or_else(|| {
        Fail::BadInput(
            "a reason is required (it is stored with the change); nothing was changed".into(),
        )
    })
}

#[derive(Template)]
#[template(path = "console/done.html")]
struct DonePage {
    chrome: Chrome,
    ok: bool,
    message: String,
    back: String,
}

/// What an action did (or why the guards left everything as it was), for the audit trail and
/// the result page.
struct Change {
    /// The rows changed: none when the guards refused.
    rows: Vec<String>,
    outcome: String,
    back: String,
}

impl Change {
    /// A change of the one row `row`: `did` when `changed`, else `why_not`.
    fn one(row: String, changed: bool, (did, why_not): (String, String), back: String) -> Change {
        Change {
            rows: if changed { vec![row] } else { Vec::new() },
            outcome: if changed { did } else { why_not },
            back,
        }
    }
}

/// What an audit entry says until its action has settled it: a console that stops (or loses the
/// database) between the action and [`done`] leaves this, so the trail never misses a change.
const UNSETTLED: &str = "started; no outcome was recorded (the console stopped or lost the database mid-action): check the rows";

/// Writes the audit entry of an action about to run, before it runs. Nothing is changed when
/// this fails.
async fn start(
    app: &App,
    session: &Session,
    action: &str,
    target: String,
    reason: Option<&str>,
) -> Result<i64, Fail> {
    let entry = NewAuditEntry {
        actor: session.user.clone(),
        action: action.to_owned(),
        target,
        affected: 0,
        affected_rows: Vec::new(),
        reason: reason.map(str::to_owned),
        outcome: UNSETTLED.to_owned(),
    };
    app.store.audit(&entry).await.map_err(|e| {
        Fail::Database(format!(
            "nothing was changed: the audit trail cannot be written ({})",
            crate::output::chain(&anyhow::Error::new(e))
        ))
    })
}

/// Settles audit entry `audit` with what the action did, then shows it: 200 when rows changed,
/// 409 when the guards left everything as it was.
async fn done(
    app: &App,
    headers: &HeaderMap,
    audit: i64,
    change: Change,
) -> Result<Response, Fail> {
    let ok = !change.rows.is_empty();
    app.store
        .settle_audit(audit, &change.rows, &change.outcome)
        .await
        .map_err(|e| {
            Fail::Database(format!(
                "{}; but its audit entry {audit} could not be completed and still says it started: {}",
                change.outcome,
                crate::output::chain(&anyhow::Error::new(e))
            ))
        })?;
    let page = DonePage {
        chrome: chrome(app, headers),
        ok,
        message: change.outcome,
        back: change.back,
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    Ok((status, render(&page)).into_response())
}

#[derive(Deserialize)]
pub(crate) struct EventAction {
    csrf: Option<String>,
    no: Option<String>,
    reason: Option<String>,
}

fn event_no(form: &EventAction) -> Result<String, Fail> {
    given(&form.no)
        .map(str::to_owned)
        .ok_or_else(|| Fail::BadInput("the form names no event number".into()))
}

/// The actions on one event of the outbox or the message table.
#[derive(Debug, Clone, Copy)]
enum EventVerb {
    OutboxRetry,
    OutboxCancel,
    MessageRetry,
    MessageCancel,
}

impl EventVerb {
    fn action(self) -> &'static str {
        match self {
            EventVerb::OutboxRetry => "outbox.retry",
            EventVerb::OutboxCancel => "outbox.cancel",
            EventVerb::MessageRetry => "message.retry",
            EventVerb::MessageCancel => "message.cancel",
        }
    }

    fn cancels(self) -> bool {
        matches!(self, EventVerb::OutboxCancel | EventVerb::MessageCancel)
    }
}

/// Runs `verb` on the event the form names: a cancel needs a reason, a retry takes one.
async fn act_on_event(
    app: &App,
    headers: &HeaderMap,
    form: EventAction,
    verb: EventVerb,
) -> Result<Response, Fail> {
    let session = authorize(app, headers, form.csrf.as_deref())?;
    let no = event_no(&form)?;
    let why = if verb.cancels() {
        Some(reason(&form.reason)?)
    } else {
        given(&form.reason).map(str::to_owned)
    };
    let audit = start(app, &session, verb.action(), no.clone(), why.as_deref()).await?;
    let why = why.unwrap_or_default();
    let (changed, did, why_not, back) = match verb {
        EventVerb::OutboxRetry => (
            app.store.retry(&no).await?,
            format!("{no} was put back to pending"),
            format!(
                "{no} was not changed: it does not exist or it is not failed (only failed events can be retried)"
            ),
            link("/event", &[("no", &no)]),
        ),
        EventVerb::OutboxCancel => (
            app.store.cancel(&no, &why).await?,
            format!("{no} was cancelled"),
            format!(
                "{no} was not changed: it does not exist or it is not pending or failed (published, in-progress and cancelled events stay as they are)"
            ),
            link("/event", &[("no", &no)]),
        ),
        EventVerb::MessageRetry => (
            app.store.retry_message(&no).await?,
            format!("message {no} was put back to pending"),
            format!("message {no} was not changed: it does not exist or it is not failed"),
            link("/messages", &[("no", &no)]),
        ),
        EventVerb::MessageCancel => (
            app.store.cancel_message(&no, &why).await?,
            format!("message {no} was cancelled"),
            format!(
                "message {no} was not changed: it does not exist or it is not pending or failed"
            ),
            link("/messages", &[("no", &no)]),
        ),
    };
    done(
        app,
        headers,
        audit,
        Change::one(no, changed, (did, why_not), back),
    )
    .await
}

pub(crate) async fn outbox_retry(
    State(app): Shared,
    headers: HeaderMap,
    Form(form): Form<EventAction>,
) -> Result<Response, Fail> {
    act_on_event(&app, &headers, form, EventVerb::OutboxRetry).await
}

pub(crate) async fn outbox_cancel(
    State(app): Shared,
    headers: HeaderMap,
    Form(form): Form<EventAction>,
) -> Result<Response, Fail> {
    act_on_event(&app, &headers, form, EventVerb::OutboxCancel).await
}

pub(crate) async fn message_retry(
    State(app): Shared,
    headers: HeaderMap,
    Form(form): Form<EventAction>,
) -> Result<Response, Fail> {
    act_on_event(&app, &headers, form, EventVerb::MessageRetry).await
}

pub(crate) async fn message_cancel(
    State(app): Shared,
    headers: HeaderMap,
    Form(form): Form<EventAction>,
) -> Result<Response, Fail> {
    act_on_event(&app, &headers, form, EventVerb::MessageCancel).await
}

#[derive(Deserialize)]
pub(crate) struct SkipAction {
    csrf: Option<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    reason: Option<String>,
}

pub(crate) async fn outbox_skip(
    State(app): Shared,
    headers: HeaderMap,
    Form(form): Form<SkipAction>,
) -> Result<Response, Fail> {
    let session = authorize(&app, &headers, form.csrf.as_deref())?;
    let (Some(kind), Some(id)) = (given(&form.aggregate_type), given(&form.aggregate_id)) else {
        return Err(Fail::BadInput(
            "the form names no aggregate type and id".into(),
        ));
    };
    let why = reason(&form.reason)?;
    let audit = start(
        &app,
        &session,
        "outbox.skip",
        format!("{kind} {id}"),
        Some(&why),
    )
    .await?;
    let skipped = app.store.skip(kind, id, &why).await?;
    let outcome = match &skipped {
        Some(no) => format!("skipped {no}; the rest of {kind} {id} can now be published"),
        None => format!("{kind} {id} has no pending or failed event to skip; nothing was changed"),
    };
    let change = Change {
        rows: skipped.into_iter().collect(),
        outcome,
        back: link("/aggregate", &[("type", kind), ("id", id)]),
    };
    done(&app, &headers, audit, change).await
}

#[derive(Template)]
#[template(path = "console/confirm.html")]
struct ConfirmPage {
    chrome: Chrome,
    count: usize,
    capped: bool,
    filter: String,
    summary: String,
    back: String,
}

fn summary(params: &SearchParams) -> String {
    let parts: Vec<String> = params
        .query(Some("failed"))
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k} = {v}"))
        .collect();
    parts.join(", ")
}

pub(crate) async fn bulk_retry_confirm(
    State(app): Shared,
    headers: HeaderMap,
    Query(params): Query<SearchParams>,
) -> Result<Response, Fail> {
    let mut params = params;
    params.status = Some("failed".into());
    params.before = None;
    let search = params.search()?;
    let count = app.store.search(&search, BULK_MAX).await?.len();
    let page = ConfirmPage {
        chrome: chrome(&app, &headers),
        count,
        capped: count >= BULK_MAX as usize,
        summary: summary(&params),
        back: params.link("/search", None, &[]),
        filter: params.query_string(),
    };
    Ok(render(&page))
}

#[derive(Deserialize)]
pub(crate) struct BulkAction {
    csrf: Option<String>,
    filter: Option<String>,
    expected: Option<u32>,
    reason: Option<String>,
}

pub(crate) async fn outbox_bulk_retry(
    State(app): Shared,
    headers: HeaderMap,
    Form(form): Form<BulkAction>,
) -> Result<Response, Fail> {
    let session = authorize(&app, &headers, form.csrf.as_deref())?;
    let why = reason(&form.reason)?;
    let mut params: SearchParams =
        serde_urlencoded::from_str(form.filter.as_deref().unwrap_or_default()).map_err(|e| {
            Fail::BadInput(format!(
                "the form's filter is damaged ({e}): start from the search again"
            ))
        })?;
    params.status = Some("failed".into());
    params.before = None;
    let search = params.search()?;
    let expected = form.expected.unwrap_or(0).min(BULK_MAX);
    if expected == 0 {
        return Err(Fail::BadInput(
            "the confirmation names no row count: start from the search again".into(),
        ));
    }
    let audit = start(
        &app,
        &session,
        "outbox.bulk_retry",
        summary(&params),
        Some(&why),
    )
    .await?;
    // At most as many as were confirmed: rows that failed since are left for another look.
    let records = app.store.search(&search, expected).await?;
    let mut retried = Vec::new();
    for r in &records {
        if app.store.retry(&r.event_no).await? {
            retried.push(r.event_no.clone());
        }
    }
    let change = Change {
        outcome: format!(
            "{} of {} failed events matching {} were put back to pending",
            retried.len(),
            records.len(),
            summary(&params)
        ),
        rows: retried,
        back: params.link("/search", None, &[]),
    };
    done(&app, &headers, audit, change).await
}

#[derive(Deserialize)]
pub(crate) struct EntryAction {
    csrf: Option<String>,
    id: Option<i64>,
    reason: Option<String>,
}

fn entry_id(form: &EntryAction) -> Result<i64, Fail> {
    form.id
        .ok_or_else(|| Fail::BadInput("the form names no quarantine entry".into()))
}

pub(crate) async fn quarantine_requeue(
    State(app): Shared,
    headers: HeaderMap,
    Form(form): Form<EntryAction>,
) -> Result<Response, Fail> {
    let session = authorize(&app, &headers, form.csrf.as_deref())?;
    let id = entry_id(&form)?;
    let Some(e) = app.consumers.entry(id).await? else {
        return Err(Fail::NotFound(format!("no quarantine entry has id {id}")));
    };
    let reason = given(&form.reason);
    let target = format!("entry {id} ({} of {})", e.event_id, e.consumer);
    let audit = start(&app, &session, "quarantine.requeue", target, reason).await?;
    let requeued = if e.status == QuarantineStatus::Quarantined {
        app.consumers.requeue(&e.consumer, &e.event_id).await? > 0
    } else {
        false
    };
    let words = (
        format!(
            "entry {id} ({} of {}) was requeued: the running consumer replays it on its next loop",
            e.event_id, e.consumer
        ),
        format!(
            "entry {id} ({} of {}) is {}: only quarantined entries can be requeued; nothing was changed",
            e.event_id,
            e.consumer,
            if e.status == QuarantineStatus::Quarantined {
                "no longer quarantined"
            } else {
                e.status.name()
            }
        ),
    );
    let back = link("/quarantine", &[("consumer", &e.consumer)]);
    done(
        &app,
        &headers,
        audit,
        Change::one(id.to_string(), requeued, words, back),
    )
    .await
}

pub(crate) async fn quarantine_cancel(
    State(app): Shared,
    headers: HeaderMap,
    Form(form): Form<EntryAction>,
) -> Result<Response, Fail> {
    let session = authorize(&app, &headers, form.csrf.as_deref())?;
    let id = entry_id(&form)?;
    let why = reason(&form.reason)?;
    let audit = start(
        &app,
        &session,
        "quarantine.cancel",
        format!("entry {id}"),
        Some(&why),
    )
    .await?;
    let changed = app.consumers.cancel_entry(id, &why).await?;
    let words = (
        format!("entry {id} was cancelled: it is never replayed"),
        format!(
            "entry {id} was not changed: it does not exist or was already replayed or cancelled"
        ),
    );
    let change = Change::one(id.to_string(), changed, words, "/quarantine".into());
    done(&app, &headers, audit, change).await
}

// ---------------------------------------------------------------------------------------------
// Static

pub(crate) async fn stylesheet() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("../../templates/console/console.css"),
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
