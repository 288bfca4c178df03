//! What operators change: archive and purge, cancel, retry, skipping a stuck head, republish.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::clock::{self};
use crate::error::Error;
use crate::publisher::{OutboxMessage, Publisher};
use crate::row::outbox::OutboxRecord;
use crate::sql::dialect::Backend;
use crate::sql::outbox::{self as sql, Select};

use super::Outbox;

impl<DB: Backend> Outbox<DB> {
    /// How many published or cancelled events last updated more than `older_than` ago an
    /// [`Outbox::archive`] would move now.
    pub async fn archivable(&self, older_than: Duration) -> Result<u64, Error> {
        let cutoff = clock::before(self.now(), older_than);
        crate::archive::archivable(&self.pool, self.archived(), cutoff).await
    }

    /// Moves published and cancelled events last updated more than `older_than` ago to the
    /// archive table (`biz_outbox_event_archive`), `batch` per transaction: each copies the rows,
    /// then deletes the same ids. Pending, in-progress, failed and leased events are never
    /// touched, so it runs beside live relays; a run that dies leaves every row in exactly one of
    /// the two tables, and running it again finishes the work. `progress` gets the rows moved so
    /// far after each batch.
    ///
    /// An archived event is not a duplicate any more for a command retried later: keep the
    /// retention longer than any retry or replay window.
    pub async fn archive(
        &self,
        older_than: Duration,
        batch: u32,
        progress: impl FnMut(u64),
    ) -> Result<crate::archive::ArchiveReport, Error> {
        let cutoff = clock::before(self.now(), older_than);
        crate::archive::run(&self.pool, self.archived(), cutoff, batch, progress).await
    }

    /// Deletes archived events last updated more than `older_than` ago, `batch` at a time;
    /// returns how many.
    pub async fn purge_archive(&self, older_than: Duration, batch: u32) -> Result<u64, Error> {
        let cutoff = clock::before(self.now(), older_than);
        crate::archive::purge(&self.pool, &self.config.archive_table, cutoff, batch).await
    }

    pub(super) fn archived(&self) -> crate::sql::archive::Archived<'_> {
        crate::sql::archive::Archived {
            live: &self.config.table,
            archive: &self.config.archive_table,
            columns: sql::COLUMNS,
            status_column: "publish_status",
        }
    }

    /// Cancels a pending or failed event; true when it was cancelled. Published, in-progress and
    /// already cancelled events are left alone (the seed's state guard).
    pub async fn cancel(&self, event_no: &str, reason: &str) -> Result<bool, Error> {
        let Some(record) = self.by_event_no(event_no).await? else {
            return Ok(false);
        };
        let affected = self.cancel_row(record.id, reason).await?;
        Ok(affected == 1)
    }

    /// Puts a failed event back to pending for another round of attempts; true when it moved.
    pub async fn retry(&self, event_no: &str) -> Result<bool, Error> {
        let Some(record) = self.by_event_no(event_no).await? else {
            return Ok(false);
        };
        let mut conn = self.conn().await?;
        let affected = sql::retry::<DB>(&mut conn, &self.config.table, record.id, self.now())
            .await
            .map_err(|e| self.db_error(e))?;
        if affected == 1 {
            self.notify_relays();
        }
        Ok(affected == 1)
    }

    /// Cancels the head of a blocked aggregate (its earliest pending or failed event) so that
    /// the events after it can be published. Returns the event number skipped.
    pub async fn skip_head(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        reason: &str,
    ) -> Result<Option<String>, Error> {
        let head = self
            .select(Select::Head {
                aggregate_type,
                aggregate_id,
            })
            .await?
            .into_iter()
            .next();
        let Some(head) = head else {
            return Ok(None);
        };
        let affected = self.cancel_row(head.id, reason).await?;
        if affected == 1 {
            self.notify_relays();
            Ok(Some(head.event_no))
        } else {
            Ok(None)
        }
    }

    /// Publishes already published events again through `publisher`: those of one aggregate, of
    /// one event type, or created in a time range (the filters combine), a page of 500 at a time.
    ///
    /// Each goes out under a message id of its own (see [`OutboxMessage::message_id`]), so a
    /// broker that deduplicates (JetStream) delivers it even inside its duplicate window. The
    /// rows are left as they are; consumers' inboxes absorb what they already applied.
    pub async fn republish<P: Publisher>(
        &self,
        filter: &Republish<'_>,
        publisher: &P,
    ) -> Result<RepublishReport, Error> {
        let run = self.now().timestamp_micros();
        let mut report = RepublishReport::default();
        let mut after_id = 0;
        loop {
            let page = self
                .select(Select::Published {
                    aggregate: filter.aggregate,
                    event_type: filter.event_type,
                    from: filter.from,
                    to: filter.to,
                    after_id,
                    limit: 500,
                })
                .await?;
            let Some(last) = page.last() else {
                return Ok(report);
            };
            after_id = last.id;
            let mut page = page;
            self.stamp_cancelled_predecessors(&mut page).await?;
            Self::republish_records(&page, run, publisher, &mut report).await?;
        }
    }

    /// Adds to `records`, about to be sent again, the header a relay's claim adds to an event
    /// whose previous sequence was cancelled ([`PREVIOUS_SEQUENCE_HEADER`]), so that in-order
    /// consumers fed by the republish do not wait for the cancelled ones; and, as a claim does,
    /// drops a header of that name that the rows themselves carry.
    ///
    /// [`PREVIOUS_SEQUENCE_HEADER`]: crate::PREVIOUS_SEQUENCE_HEADER
    pub(crate) async fn stamp_cancelled_predecessors(
        &self,
        records: &mut [OutboxRecord],
    ) -> Result<(), Error> {
        records.iter_mut().for_each(sql::clear_previous);
        if records.iter().all(|r| r.aggregate_sequence <= 1) {
            return Ok(());
        }
        let mut conn = self.conn().await?;
        sql::stamp_cancelled_predecessors::<DB>(&mut conn, &self.config.table, records)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// Sends `records` again through `publisher` as the republish `run`, counting into `report`.
    pub(crate) async fn republish_records<P: Publisher>(
        records: &[OutboxRecord],
        run: i64,
        publisher: &P,
        report: &mut RepublishReport,
    ) -> Result<(), Error> {
        report.selected += records.len();
        let messages = records
            .iter()
            .map(|record| Ok(OutboxMessage::from_record(record)?.republished(run)))
            .collect::<Result<Vec<_>, Error>>()?;
        for result in publisher.publish(&messages).await {
            match result {
                Ok(()) => report.accepted += 1,
                Err(e) => {
                    report.failed += 1;
                    if report.first_failure.is_none() {
                        report.first_failure = Some(e.reason().to_owned());
                    }
                }
            }
        }
        Ok(())
    }

    /// Pending or failed -> cancelled, with the operator's reason cut to the column.
    pub(super) async fn cancel_row(&self, id: i64, reason: &str) -> Result<u64, Error> {
        let reason: String = reason.chars().take(1000).collect();
        let mut conn = self.conn().await?;
        sql::cancel::<DB>(&mut conn, &self.config.table, id, &reason, self.now())
            .await
            .map_err(|e| self.db_error(e))
    }
}

/// What [`Outbox::republish`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RepublishReport {
    /// Published events the filter selected.
    pub selected: usize,
    /// Accepted by the broker (acknowledged, confirmed).
    pub accepted: usize,
    /// Refused or not acknowledged.
    pub failed: usize,
    /// The reason of the first failure.
    pub first_failure: Option<String>,
}

/// Which published events [`Outbox::republish`] sends again; unset filters match everything.
/// Built like [`OutboxSearch`](crate::OutboxSearch) and [`QuarantineFilter`](crate::QuarantineFilter):
/// `Republish::default().event_type("ORDER_PAID")`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Republish<'a> {
    /// One aggregate: (type, id).
    pub aggregate: Option<(&'a str, &'a str)>,
    /// One event type.
    pub event_type: Option<&'a str>,
    /// Created at or after.
    pub from: Option<DateTime<Utc>>,
    /// Created before.
    pub to: Option<DateTime<Utc>>,
}

impl<'a> Republish<'a> {
    /// Only the events of one aggregate.
    pub fn aggregate(mut self, aggregate_type: &'a str, aggregate_id: &'a str) -> Self {
        self.aggregate = Some((aggregate_type, aggregate_id));
        self
    }

    /// Only events of `event_type`.
    pub fn event_type(mut self, event_type: &'a str) -> Self {
        self.event_type = Some(event_type);
        self
    }

    /// Only events created in `[from, to)`; either end may be open.
    pub fn created(mut self, from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Self {
        self.from = from;
        self.to = to;
        self
    }
}
