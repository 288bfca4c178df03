//! The actions: retry, cancel and skip on the outbox and the message table, bulk retry, and
//! requeue and cancel in the quarantine. Each is authorized, guarded and audited.

use std::sync::Arc;

use askama::Template;
use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use event_sqlx::{NewAuditEntry, QuarantineStatus};
use serde::Deserialize;

use crate::console::App;
use crate::console::auth::Session;
use crate::console::view::link;

use super::{BULK_MAX, Chrome, Fail, SearchParams, Shared, chrome, given, render, session};

// ---------------------------------------------------------------------------------------------
// Actions

pub(super) fn csrf_refused() -> String {
    "the form's CSRF token does not match your session; nothing was changed: reload the page and submit it again".into()
}

/// The operator allowed to act, or why not.
pub(super) fn authorize(
    app: &App,
    headers: &HeaderMap,
    csrf: Option<&str>,
) -> Result<Session, Fail> {
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

pub(super) fn reason(reason: &Option<String>) -> Result<String, Fail> {
    given(reason).map(str::to_owned).ok_or_else(|| {
        Fail::BadInput(
            "a reason is required (it is stored with the change); nothing was changed".into(),
        )
    })
}

#[derive(Template)]
#[template(path = "console/done.html")]
pub(super) struct DonePage {
    pub(super) chrome: Chrome,
    pub(super) ok: bool,
    pub(super) message: String,
    pub(super) back: String,
}

/// What an action did (or why the guards left everything as it was), for the audit trail and
/// the result page.
pub(super) struct Change {
    /// The rows changed: none when the guards refused.
    pub(super) rows: Vec<String>,
    pub(super) outcome: String,
    pub(super) back: String,
}

impl Change {
    /// A change of the one row `row`: `did` when `changed`, else `why_not`.
    pub(super) fn one(
        row: String,
        changed: bool,
        (did, why_not): (String, String),
        back: String,
    ) -> Change {
        Change {
            rows: if changed { vec![row] } else { Vec::new() },
            outcome: if changed { did } else { why_not },
            back,
        }
    }
}

/// What an audit entry says until its action has settled it: a console that stops (or loses the
/// database) between the action and [`done`] leaves this, so the trail never misses a change.
pub(super) const UNSETTLED: &str = "started; no outcome was recorded (the console stopped or lost the database mid-action): check the rows";

/// Writes the audit entry of an action about to run, before it runs. Nothing is changed when
/// this fails.
pub(super) async fn start(
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
pub(super) async fn done(
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
    pub(super) csrf: Option<String>,
    pub(super) no: Option<String>,
    pub(super) reason: Option<String>,
}

pub(super) fn event_no(form: &EventAction) -> Result<String, Fail> {
    given(&form.no)
        .map(str::to_owned)
        .ok_or_else(|| Fail::BadInput("the form names no event number".into()))
}

/// The actions on one event of the outbox or the message table.
#[derive(Debug, Clone, Copy)]
pub(crate) enum EventVerb {
    OutboxRetry,
    OutboxCancel,
    MessageRetry,
    MessageCancel,
}

impl EventVerb {
    pub(super) fn action(self) -> &'static str {
        match self {
            EventVerb::OutboxRetry => "outbox.retry",
            EventVerb::OutboxCancel => "outbox.cancel",
            EventVerb::MessageRetry => "message.retry",
            EventVerb::MessageCancel => "message.cancel",
        }
    }

    pub(super) fn cancels(self) -> bool {
        matches!(self, EventVerb::OutboxCancel | EventVerb::MessageCancel)
    }
}

/// Runs `verb` on the event the form names: a cancel needs a reason, a retry takes one.
pub(super) async fn act_on_event(
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

/// The route of the action `verb` on one event: a form post, authorized, guarded and audited
/// by [`act_on_event`].
pub(crate) fn event_action(verb: EventVerb) -> MethodRouter<Arc<App>> {
    post(
        move |State(app): Shared, headers: HeaderMap, Form(form): Form<EventAction>| async move {
            act_on_event(&app, &headers, form, verb).await
        },
    )
}

#[derive(Deserialize)]
pub(crate) struct SkipAction {
    pub(super) csrf: Option<String>,
    pub(super) aggregate_type: Option<String>,
    pub(super) aggregate_id: Option<String>,
    pub(super) reason: Option<String>,
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
pub(super) struct ConfirmPage {
    pub(super) chrome: Chrome,
    pub(super) count: usize,
    pub(super) capped: bool,
    pub(super) filter: String,
    pub(super) summary: String,
    pub(super) back: String,
}

pub(super) fn summary(params: &SearchParams) -> String {
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
    pub(super) csrf: Option<String>,
    pub(super) filter: Option<String>,
    pub(super) expected: Option<u32>,
    pub(super) reason: Option<String>,
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
    pub(super) csrf: Option<String>,
    pub(super) id: Option<i64>,
    pub(super) reason: Option<String>,
}

pub(super) fn entry_id(form: &EntryAction) -> Result<i64, Fail> {
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
