//! Searching the outbox, and one aggregate's events in order.

use askama::Template;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use event_sqlx::EventStatus;
use serde::Deserialize;

use crate::console::store::Search;
use crate::console::view::{self, Row, link};

use super::{Chrome, Fail, PAGE, Shared, chrome, given, render};

// ---------------------------------------------------------------------------------------------
// Search

/// A search's query string.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct SearchParams {
    pub(super) no: Option<String>,
    pub(super) aggregate_type: Option<String>,
    pub(super) aggregate_id: Option<String>,
    pub(super) event_type: Option<String>,
    pub(super) topic: Option<String>,
    pub(super) trace_id: Option<String>,
    pub(super) status: Option<String>,
    pub(super) from: Option<String>,
    pub(super) to: Option<String>,
    pub(super) before: Option<String>,
}

impl SearchParams {
    pub(super) fn search(&self) -> Result<Search, Fail> {
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
    pub(super) fn query(&self, status: Option<&str>) -> Vec<(&'static str, String)> {
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
    pub(super) fn query_string(&self) -> String {
        self.link("", None, &[]).trim_start_matches('?').to_owned()
    }

    pub(super) fn link(&self, path: &str, status: Option<&str>, extra: &[(&str, &str)]) -> String {
        let query = self.query(status);
        let mut pairs: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
        pairs.extend_from_slice(extra);
        link(path, &pairs)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.query(None).iter().all(|(_, v)| v.is_empty())
    }
}

pub(crate) struct StatusOption {
    pub(super) value: &'static str,
    pub(super) label: &'static str,
    pub(super) selected: bool,
}

pub(super) fn status_options(selected: Option<&str>) -> Vec<StatusOption> {
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
pub(super) struct SearchPage {
    pub(super) chrome: Chrome,
    pub(super) form: SearchParams,
    pub(super) statuses: Vec<StatusOption>,
    pub(super) searched: bool,
    pub(super) rows: Vec<Row>,
    pub(super) next: Option<String>,
    pub(super) bulk: Option<String>,
    pub(super) error: Option<String>,
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
    pub(super) kind: Option<String>,
    pub(super) id: Option<String>,
}

#[derive(Template)]
#[template(path = "console/aggregate.html")]
pub(super) struct AggregatePage {
    pub(super) chrome: Chrome,
    pub(super) kind: String,
    pub(super) id: String,
    pub(super) rows: Vec<Row>,
    pub(super) head: Option<String>,
    pub(super) blocked: usize,
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
