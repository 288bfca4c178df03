//! The overview: counts by state, the chart of the last hour, leases, failures and quarantine.

use askama::Template;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use chrono::{TimeDelta, Utc};
use event_sqlx::{GroupCount, QuarantineCount, QuarantineStatus, StatusCounts};

use crate::console::view::{self, Chart, When, link};

use super::{Chrome, Fail, Shared, WINDOW_MINUTES, chrome, render};

// ---------------------------------------------------------------------------------------------
// Overview

pub(crate) struct LeaseView {
    pub(super) relay: String,
    pub(super) events: i64,
    pub(super) expiry: When,
    pub(super) state: &'static str,
}

pub(crate) struct QuarantineCountView {
    pub(super) consumer: String,
    pub(super) status: &'static str,
    pub(super) entries: i64,
    pub(super) link: String,
}

impl QuarantineCountView {
    pub(super) fn new(c: QuarantineCount) -> QuarantineCountView {
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
pub(super) struct OverviewPage {
    pub(super) chrome: Chrome,
    pub(super) outbox: StatusCounts,
    pub(super) messages: StatusCounts,
    pub(super) backlog: i64,
    pub(super) oldest: Option<String>,
    pub(super) expired_leases: i64,
    pub(super) leases: Vec<LeaseView>,
    pub(super) by_topic: Vec<GroupCount>,
    pub(super) by_type: Vec<GroupCount>,
    pub(super) chart: Chart,
    pub(super) quarantine: Vec<QuarantineCountView>,
    pub(super) quarantined: i64,
    pub(super) quarantine_error: Option<String>,
    pub(super) window: String,
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
