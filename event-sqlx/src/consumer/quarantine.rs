//! The quarantine: what a consumer could not apply, how it is stored, listed and replayed, and
//! pruning the inbox.

use event_core::{DomainEvent, EventEnvelope};

use crate::error::{Error, HandlerError};
use crate::metrics;
use crate::route::{Delivered, NoRoutes, On, Routes, UnknownEvents};
use crate::row::quarantine::{NewQuarantine, QuarantineFilter, QuarantineRecord};
use crate::sql::dialect::Backend;
use crate::sql::inbox::{self as sql, Selection};
use crate::status::{FailureClass, QuarantineStatus};

use super::{Consumer, Processed};

impl<DB: Backend, R> Consumer<DB, R> {
    /// Quarantined events of this consumer, oldest first.
    pub async fn quarantined(&self, limit: u32) -> Result<Vec<QuarantineRecord>, Error> {
        self.quarantine_page(
            QuarantineStatus::Quarantined,
            &QuarantineFilter::default(),
            0,
            limit,
        )
        .await
    }

    /// Entries of this consumer's quarantine in `status` (still quarantined, or replayed) that
    /// `filter` selects, oldest first, at most `limit`.
    pub async fn quarantine_entries(
        &self,
        status: QuarantineStatus,
        filter: &QuarantineFilter<'_>,
        limit: u32,
    ) -> Result<Vec<QuarantineRecord>, Error> {
        self.quarantine_page(status, filter, 0, limit).await
    }

    /// Processes the oldest `limit` quarantined events again with `handler` (after a fix), which gets each as a [`Delivered`] like an `.on` handler,, and
    /// marks each one replayed once it is applied or found already applied. Idempotent: the inbox
    /// keeps a replayed event from having its effect twice. Returns how many were replayed.
    pub async fn replay<E: DomainEvent>(
        &self,
        limit: u32,
        handler: impl AsyncFn(&mut DB::Connection, Delivered<E>) -> Result<(), HandlerError>,
    ) -> Result<usize, Error> {
        let page = self.quarantined(limit).await?;
        self.replay_records(page, &Self::single(&handler)).await
    }

    /// [`Consumer::replay`] for every quarantined event that `filter` selects (one by its
    /// `event_id`, those of one event type, one failure class, a time range), however many
    /// there are: the database selects them, a page at a time.
    pub async fn replay_matching<E: DomainEvent>(
        &self,
        filter: &QuarantineFilter<'_>,
        handler: impl AsyncFn(&mut DB::Connection, Delivered<E>) -> Result<(), HandlerError>,
    ) -> Result<usize, Error> {
        self.replay_with(
            QuarantineStatus::Quarantined,
            filter,
            &Self::single(&handler),
        )
        .await
    }

    /// A route for one ad hoc handler.
    pub(super) fn single<E: DomainEvent>(
        handler: &impl AsyncFn(&mut DB::Connection, Delivered<E>) -> Result<(), HandlerError>,
    ) -> impl Routes<DB> {
        On::new(handler, NoRoutes)
    }

    pub(super) async fn replay_with(
        &self,
        status: QuarantineStatus,
        filter: &QuarantineFilter<'_>,
        routes: &impl Routes<DB>,
    ) -> Result<usize, Error> {
        const PAGE: u32 = 100;
        let (mut replayed, mut after_id) = (0, 0);
        loop {
            let page = self.quarantine_page(status, filter, after_id, PAGE).await?;
            let Some(last) = page.last() else {
                return Ok(replayed);
            };
            after_id = last.id;
            let full = page.len() == PAGE as usize;
            replayed += self.replay_records(page, routes).await?;
            if !full {
                return Ok(replayed);
            }
        }
    }

    pub(super) async fn replay_records(
        &self,
        records: Vec<QuarantineRecord>,
        routes: &impl Routes<DB>,
    ) -> Result<usize, Error> {
        let mut replayed = 0;
        for record in records {
            let outcome = self
                .process_with(
                    record.body.as_bytes(),
                    Some(&record.event_id),
                    routes,
                    UnknownEvents::Ignore,
                    false,
                )
                .await?;
            let mut conn = self.conn().await?;
            match outcome {
                Processed::Applied | Processed::Duplicate => {
                    sql::mark_replayed::<DB>(
                        &mut conn,
                        &self.quarantine,
                        record.id,
                        self.inbox.now(),
                    )
                    .await
                    .map_err(|e| Error::database(&self.quarantine, e))?;
                    replayed += 1;
                }
                // Requeued for a consumer that has no handler for it: back to the quarantine,
                // saying why, rather than requeued for ever.
                Processed::Ignored if record.status == QuarantineStatus::Requeued => {
                    let reason = format!(
                        "requeued, but consumer {} has no handler for event type {}; it stays quarantined",
                        self.name(),
                        record.event_type.as_deref().unwrap_or("(unreadable)")
                    );
                    sql::unrequeue::<DB>(
                        &mut conn,
                        &self.quarantine,
                        record.id,
                        &reason,
                        self.inbox.now(),
                    )
                    .await
                    .map_err(|e| Error::database(&self.quarantine, e))?;
                }
                _ => {}
            }
        }
        Ok(replayed)
    }

    pub(super) async fn quarantine_page(
        &self,
        status: QuarantineStatus,
        filter: &QuarantineFilter<'_>,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<QuarantineRecord>, Error> {
        let selection = Selection {
            consumer: Some(self.name()),
            status: Some(status),
            filter: *filter,
        };
        let mut conn = self.conn().await?;
        sql::select_quarantined::<DB>(
            &mut conn,
            &self.quarantine,
            &selection,
            after_id,
            i64::from(limit),
        )
        .await
        .map_err(|e| Error::database(&self.quarantine, e))
    }

    /// Deletes this consumer's inbox records older than `retention`, in batches of `batch`, and
    /// returns how many (see [`Inbox::prune`](crate::Inbox::prune)).
    pub async fn prune_inbox(
        &self,
        retention: std::time::Duration,
        batch: u32,
    ) -> Result<u64, Error> {
        self.inbox.prune(retention, batch).await
    }

    pub(super) async fn quarantine_envelope(
        &self,
        envelope: &EventEnvelope,
        body: &[u8],
        class: FailureClass,
        reason: String,
        attempts: u32,
    ) -> Result<Processed, Error> {
        let quarantined = self
            .quarantine(
                envelope.event_id.to_string(),
                Some(envelope.event_type.clone()),
                body,
                class,
                reason,
                attempts,
            )
            .await?;
        // A quarantined event settles its aggregate's order: the next sequence goes on.
        self.waiting.settle(envelope);
        Ok(quarantined)
    }

    pub(super) async fn quarantine(
        &self,
        event_id: String,
        event_type: Option<String>,
        body: &[u8],
        class: FailureClass,
        reason: String,
        attempts: u32,
    ) -> Result<Processed, Error> {
        let reason: String = reason.chars().take(1000).collect();
        let entry = NewQuarantine {
            consumer: self.name().to_owned(),
            consumer_version: self.version.clone(),
            event_id: event_id.chars().take(64).collect(),
            event_type,
            body: String::from_utf8_lossy(body).into_owned(),
            failure_class: class,
            reason: reason.clone(),
            retry_count: i32::try_from(attempts).unwrap_or(i32::MAX),
            owner: self.owner.clone(),
            now: self.inbox.now(),
        };
        let mut conn = self.conn().await?;
        sql::quarantine::<DB>(&mut conn, &self.quarantine, &entry)
            .await
            .map_err(|e| {
                Error::stopped(
                    self.name(),
                    format!("cannot quarantine {event_id}"),
                    Error::database(&self.quarantine, e),
                )
            })?;
        tracing::warn!(consumer = self.name(), event_id = %entry.event_id, %reason, "event quarantined");
        Ok(Processed::Quarantined(reason))
    }
}

impl<DB: Backend, R: Routes<DB>> Consumer<DB, R> {
    /// Processes the quarantined events that `filter` selects again with the consumer's own
    /// handlers (after a fix), however many there are, and marks each one replayed once it is
    /// applied or found already applied. Returns how many were replayed.
    pub async fn replay_quarantined(&self, filter: &QuarantineFilter<'_>) -> Result<usize, Error> {
        self.replay_with(QuarantineStatus::Quarantined, filter, &self.routes)
            .await
    }

    /// Replays, with the consumer's own handlers, the entries an operator requeued
    /// ([`Quarantine::requeue`](crate::Quarantine::requeue), `eventctl quarantine requeue`), and
    /// marks each one replayed, or quarantined again if it still fails. The subscriptions' `run`
    /// loops call it between drains; a custom loop calls it now and then (it is one indexed
    /// query when nothing is requeued). Returns how many were replayed.
    pub async fn replay_requeued(&self) -> Result<usize, Error> {
        let replayed = self
            .replay_with(
                QuarantineStatus::Requeued,
                &QuarantineFilter::default(),
                &self.routes,
            )
            .await?;
        if replayed > 0 {
            ::metrics::counter!(metrics::CONSUMER_REQUEUED_REPLAYED, "consumer" => self.name().to_owned())
                .increment(replayed as u64);
            tracing::info!(
                consumer = self.name(),
                replayed,
                "replayed requeued quarantine entries"
            );
        }
        Ok(replayed)
    }

    /// The event types the handlers take.
    pub fn event_types(&self) -> Vec<&'static str> {
        let mut types = Vec::new();
        self.routes.event_types(&mut types);
        types.reverse();
        types
    }
}
