//! One event: its row, its steps, where it was consumed and its quarantine entries.

use askama::Template;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use chrono::{DateTime, Utc};
use event_sqlx::{EventStatus, QuarantineFilter, QuarantineRecord, QuarantineStatus};
use serde::Deserialize;

use crate::console::store::QuarantineQuery;
use crate::console::view::{self, Row, When, link};

use super::{Chrome, Fail, PAGE, Shared, chrome, given, render};

// ---------------------------------------------------------------------------------------------
// Event detail

#[derive(Deserialize)]
pub(crate) struct EventParams {
    pub(super) no: Option<String>,
}

pub(crate) struct Step {
    pub(super) label: &'static str,
    pub(super) at: Option<When>,
    pub(super) note: String,
}

pub(crate) struct ConsumptionView {
    pub(super) consumer: String,
    pub(super) at: When,
    pub(super) deliveries: i64,
}

pub(crate) struct EntryView {
    pub(super) id: i64,
    pub(super) consumer: String,
    pub(super) consumer_version: String,
    pub(super) event_id: String,
    pub(super) event_link: String,
    pub(super) event_type: String,
    pub(super) class: &'static str,
    pub(super) status: &'static str,
    pub(super) reason: String,
    pub(super) retries: i32,
    pub(super) owner: String,
    pub(super) body: String,
    pub(super) body_big: bool,
    pub(super) first: When,
    pub(super) last: When,
    pub(super) replayed: Option<When>,
    pub(super) can_requeue: bool,
    pub(super) can_cancel: bool,
}

impl EntryView {
    pub(super) fn new(e: QuarantineRecord, now: DateTime<Utc>) -> EntryView {
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
pub(super) struct EventPage {
    pub(super) chrome: Chrome,
    pub(super) row: Row,
    pub(super) event_version: i32,
    pub(super) source: String,
    pub(super) channel: String,
    pub(super) routing_key: String,
    pub(super) trace_id: String,
    pub(super) trace_link: String,
    pub(super) envelope: String,
    pub(super) payload: String,
    pub(super) payload_big: bool,
    pub(super) headers: String,
    pub(super) history: Vec<Step>,
    pub(super) consumptions: Vec<ConsumptionView>,
    pub(super) consumption_error: Option<String>,
    pub(super) entries: Vec<EntryView>,
    pub(super) can_cancel: bool,
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
        .quarantined(QuarantineQuery {
            filter: QuarantineFilter::default().event_id(no),
            limit: PAGE,
            ..QuarantineQuery::default()
        })
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
