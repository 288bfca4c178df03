//! End-to-end reconciliation (seed 003): were the events the producer published consumed?
//!
//! The producer's published events are read in keyset pages of key columns (no payload), and
//! each page is looked up in the consumer's inbox and quarantine by their unique keys while the
//! next page is read, so the memory used is two pages plus the listed findings, however many
//! rows each side holds.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Pool;

use crate::clock::before;
use crate::error::Error;
use crate::outbox::{Outbox, RepublishReport};
use crate::publisher::{ChannelPublisher, Publisher};
use crate::sql::dialect::Backend;
use crate::sql::inbox as inbox_sql;
use crate::sql::outbox::{self as outbox_sql, PublishedKey, Select};
use crate::status::QuarantineStatus;
use crate::table::TableName;

/// What to reconcile: one consumer, over a window of published events.
#[derive(Clone)]
pub struct Reconcile {
    consumer: String,
    event_types: Vec<String>,
    since: Duration,
    grace: Duration,
    page: u32,
    list_limit: usize,
    inbox: TableName,
    quarantine: TableName,
    progress: Option<Arc<dyn Fn(u64) + Send + Sync>>,
}

impl std::fmt::Debug for Reconcile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconcile")
            .field("consumer", &self.consumer)
            .field("event_types", &self.event_types)
            .field("since", &self.since)
            .field("grace", &self.grace)
            .field("page", &self.page)
            .finish_non_exhaustive()
    }
}

impl Reconcile {
    /// Reconciles `consumer` (its name in `consumed_event`) against the events created in the
    /// last 24 hours and published more than 5 minutes ago, of every type, in pages of 1000,
    /// listing at most 1000 findings of each kind (all are counted).
    pub fn consumer(consumer: impl Into<String>) -> Reconcile {
        Reconcile {
            consumer: consumer.into(),
            event_types: Vec::new(),
            since: Duration::from_secs(24 * 3600),
            grace: Duration::from_secs(300),
            page: 1000,
            list_limit: 1000,
            inbox: TableName::new("consumed_event").unwrap_or_else(|_| unreachable!()),
            quarantine: TableName::new("quarantined_event").unwrap_or_else(|_| unreachable!()),
            progress: None,
        }
    }

    /// Only events of `event_type` (call again for more).
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_types.push(event_type.into());
        self
    }

    /// Events created within `since` of now.
    pub fn since(mut self, since: Duration) -> Self {
        self.since = since;
        self
    }

    /// Events published less than `grace` ago may still be on their way: they are counted as in
    /// flight, not missing.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Events read per page (1 to 5000; a value outside is taken as the nearest).
    pub fn page(mut self, page: u32) -> Self {
        self.page = page.clamp(1, 5000);
        self
    }

    /// Lists at most `limit` missing and `limit` quarantined events in the report.
    pub fn list_limit(mut self, limit: usize) -> Self {
        self.list_limit = limit;
        self
    }

    /// The consumer's inbox and quarantine tables, when not the seed's.
    pub fn tables(mut self, inbox: TableName, quarantine: TableName) -> Self {
        self.inbox = inbox;
        self.quarantine = quarantine;
        self
    }

    /// Called after each page with the number of published events checked so far.
    pub fn progress(mut self, progress: impl Fn(u64) + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(progress));
        self
    }
}

/// One published event a reconciliation reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconciledEvent {
    /// The event number (the envelope's eventId).
    pub event_no: String,
    /// The event type.
    pub event_type: String,
    /// When it was published.
    pub published_time: Option<DateTime<Utc>>,
    /// Its quarantine status, for a quarantined event.
    pub quarantine: Option<QuarantineStatus>,
}

/// Totals of one event type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileTotals {
    /// Published events checked.
    pub published: u64,
    /// Recorded as consumed.
    pub consumed: u64,
    /// In the quarantine, not consumed (quarantined or requeued; cancelled ones too).
    pub quarantined: u64,
    /// Neither consumed nor quarantined, published before the grace period.
    pub missing: u64,
    /// Neither, but published within the grace period: maybe still on their way.
    pub in_flight: u64,
}

impl std::ops::AddAssign for ReconcileTotals {
    fn add_assign(&mut self, other: Self) {
        self.published += other.published;
        self.consumed += other.consumed;
        self.quarantined += other.quarantined;
        self.missing += other.missing;
        self.in_flight += other.in_flight;
    }
}

/// What a reconciliation found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileReport {
    /// The consumer.
    pub consumer: String,
    /// Events created from this time...
    pub from: Option<DateTime<Utc>>,
    /// ...to this time were checked.
    pub to: Option<DateTime<Utc>>,
    /// Totals over every type.
    pub totals: ReconcileTotals,
    /// Totals per event type.
    pub per_type: BTreeMap<String, ReconcileTotals>,
    /// The missing events, up to the list limit.
    pub missing: Vec<ReconciledEvent>,
    /// The quarantined events, up to the list limit.
    pub quarantined: Vec<ReconciledEvent>,
    /// What republishing the missing events did, when asked.
    pub republished: Option<RepublishReport>,
}

impl ReconcileReport {
    /// Whether every published event outside the grace period was consumed.
    pub fn is_clean(&self) -> bool {
        self.totals.missing == 0 && self.totals.quarantined == 0
    }
}

impl<DB: Backend> Outbox<DB> {
    /// Compares the events this outbox published with what the consumer recorded in its inbox
    /// and quarantine on `consumer_pool` (the same database or another, of any backend), and
    /// reports each published event the consumer never saw, each quarantined one, and totals per
    /// event type.
    pub async fn reconcile<C: Backend>(
        &self,
        consumer_pool: &Pool<C>,
        options: &Reconcile,
    ) -> Result<ReconcileReport, Error> {
        self.reconcile_with::<C, ChannelPublisher>(consumer_pool, options, None)
            .await
    }

    /// [`Outbox::reconcile`], and sends each missing event again through `publisher`, as
    /// [`Outbox::republish`] does: under a message id of its own, the row left as it is.
    pub async fn reconcile_and_republish<C: Backend, P: Publisher>(
        &self,
        consumer_pool: &Pool<C>,
        options: &Reconcile,
        publisher: &P,
    ) -> Result<ReconcileReport, Error> {
        self.reconcile_with(consumer_pool, options, Some(publisher))
            .await
    }

    async fn reconcile_with<C: Backend, P: Publisher>(
        &self,
        consumer_pool: &Pool<C>,
        options: &Reconcile,
        publisher: Option<&P>,
    ) -> Result<ReconcileReport, Error> {
        let now = self.now();
        let from = before(now, options.since);
        let settled = before(now, options.grace);
        let run = now.timestamp_micros();
        let mut report = ReconcileReport {
            consumer: options.consumer.clone(),
            from: Some(from),
            to: Some(now),
            republished: publisher.map(|_| RepublishReport::default()),
            ..ReconcileReport::default()
        };
        // Each page is looked up in the consumer's tables while the next one is read from the
        // outbox, on another connection.
        let window = Window { from, to: now };
        let mut page = self.published_page(options, window, 0).await?;
        while let Some(last) = page.last() {
            let full = page.len() == options.page as usize;
            let after_id = last.id;
            let (next, found) = tokio::join!(
                async {
                    if full {
                        self.published_page(options, window, after_id).await
                    } else {
                        Ok(Vec::new())
                    }
                },
                lookup(consumer_pool, options, &page)
            );
            let (unseen, quarantined) = found?;
            let mut to_republish = Vec::new();
            for key in &page {
                let mut totals = ReconcileTotals {
                    published: 1,
                    ..ReconcileTotals::default()
                };
                let event = || ReconciledEvent {
                    event_no: key.event_no.clone(),
                    event_type: key.event_type.clone(),
                    published_time: key.published_time,
                    quarantine: quarantined.get(&key.event_no).copied(),
                };
                if !unseen.contains(&key.event_no) {
                    totals.consumed = 1;
                } else if quarantined.contains_key(&key.event_no) {
                    totals.quarantined = 1;
                    if report.quarantined.len() < options.list_limit {
                        report.quarantined.push(event());
                    }
                } else if key.published_time.is_some_and(|at| at >= settled) {
                    totals.in_flight = 1;
                } else {
                    totals.missing = 1;
                    if report.missing.len() < options.list_limit {
                        report.missing.push(event());
                    }
                    to_republish.push(key.id);
                }
                report.totals += totals;
                *report.per_type.entry(key.event_type.clone()).or_default() += totals;
            }
            if let (Some(publisher), false) = (publisher, to_republish.is_empty()) {
                let mut records = self.select(Select::ByIds { ids: &to_republish }).await?;
                self.stamp_cancelled_predecessors(&mut records).await?;
                let republished = report.republished.get_or_insert_default();
                Self::republish_records(&records, run, publisher, republished).await?;
            }
            if let Some(progress) = &options.progress {
                progress(report.totals.published);
            }
            page = next?;
        }
        Ok(report)
    }

    /// A keyset page of published keys in `window`, after `after_id`.
    async fn published_page(
        &self,
        options: &Reconcile,
        window: Window,
        after_id: i64,
    ) -> Result<Vec<PublishedKey>, Error> {
        let mut conn = self.conn().await?;
        outbox_sql::published_keys::<DB>(
            &mut conn,
            &self.config().table,
            &options.event_types,
            window.from,
            window.to,
            after_id,
            i64::from(options.page),
        )
        .await
        .map_err(|e| self.db_error(e))
    }
}

/// Events created in `[from, to)`.
#[derive(Debug, Clone, Copy)]
struct Window {
    from: DateTime<Utc>,
    to: DateTime<Utc>,
}

/// Which of `page` the consumer has not recorded as consumed, and which of those it quarantined:
/// the quarantine is asked only about what the inbox lacks (nothing, in a healthy system).
async fn lookup<C: Backend>(
    consumer_pool: &Pool<C>,
    options: &Reconcile,
    page: &[PublishedKey],
) -> Result<(HashSet<String>, HashMap<String, QuarantineStatus>), Error> {
    let ids: Vec<&str> = page.iter().map(|k| k.event_no.as_str()).collect();
    let mut conn = consumer_pool
        .acquire()
        .await
        .map_err(|e| Error::database(&options.inbox, e))?;
    let unseen: HashSet<String> =
        inbox_sql::unconsumed_among::<C>(&mut conn, &options.inbox, &options.consumer, &ids)
            .await
            .map_err(|e| Error::database(&options.inbox, e))?
            .into_iter()
            .collect();
    let unseen_ids: Vec<&str> = unseen.iter().map(String::as_str).collect();
    let quarantined = inbox_sql::quarantined_among::<C>(
        &mut conn,
        &options.quarantine,
        &options.consumer,
        &unseen_ids,
    )
    .await
    .map_err(|e| Error::database(&options.quarantine, e))?
    .into_iter()
    .collect();
    Ok((unseen, quarantined))
}
