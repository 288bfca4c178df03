//! The quarantine, the message table and the audit trail.

use askama::Template;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use chrono::{DateTime, TimeDelta, Utc};
use event_sqlx::{
    EventStatus, FailureClass, MessageRecord, QuarantineFilter, QuarantineStatus, StatusCounts,
};
use serde::Deserialize;

use crate::console::store::QuarantineQuery;
use crate::console::view::{self, When, link};

use super::{Chrome, Fail, PAGE, Shared, WINDOW_MINUTES, chrome, given, render};
use super::{EntryView, QuarantineCountView};

// ---------------------------------------------------------------------------------------------
// Quarantine

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct QuarantineParams {
    pub(super) consumer: Option<String>,
    pub(super) status: Option<String>,
    pub(super) class: Option<String>,
    pub(super) after: Option<i64>,
}

#[derive(Template)]
#[template(path = "console/quarantine.html")]
pub(super) struct QuarantinePage {
    pub(super) chrome: Chrome,
    pub(super) counts: Vec<QuarantineCountView>,
    pub(super) entries: Vec<EntryView>,
    pub(super) consumer: String,
    pub(super) status: String,
    pub(super) class: String,
    pub(super) next: Option<String>,
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
        .quarantined(QuarantineQuery {
            consumer,
            status,
            filter: QuarantineFilter {
                failure_class: class,
                ..QuarantineFilter::default()
            },
            after_id: params.after.unwrap_or(0),
            limit: PAGE + 1,
        })
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
    pub(super) no: Option<String>,
    pub(super) biz_type: Option<String>,
    pub(super) biz_id: Option<String>,
}

pub(crate) struct MessageView {
    pub(super) event_no: String,
    pub(super) event_type: String,
    pub(super) biz: String,
    pub(super) status: &'static str,
    pub(super) status_class: &'static str,
    pub(super) retries: String,
    pub(super) created: When,
    pub(super) next_retry: Option<When>,
    pub(super) fail_reason: String,
    pub(super) payload: String,
    pub(super) can_retry: bool,
    pub(super) can_cancel: bool,
}

impl MessageView {
    pub(super) fn new(m: MessageRecord, now: DateTime<Utc>) -> MessageView {
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
pub(super) struct MessagesPage {
    pub(super) chrome: Chrome,
    pub(super) counts: StatusCounts,
    pub(super) rows: Vec<MessageView>,
    pub(super) heading: String,
    pub(super) form: MessageParams,
    pub(super) window: String,
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
    pub(super) before: Option<i64>,
}

pub(crate) struct AuditView {
    pub(super) at: When,
    pub(super) actor: String,
    pub(super) action: String,
    pub(super) target: String,
    pub(super) affected: i64,
    pub(super) rows: String,
    pub(super) reason: String,
    pub(super) outcome: String,
}

#[derive(Template)]
#[template(path = "console/audit.html")]
pub(super) struct AuditPage {
    pub(super) chrome: Chrome,
    pub(super) entries: Vec<AuditView>,
    pub(super) next: Option<String>,
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
