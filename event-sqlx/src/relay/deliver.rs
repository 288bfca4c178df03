//! One batch: claim it under a lease, publish it within the lease, mark what the broker accepted
//! and give back what it did not.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use tokio::time::Instant;

use crate::clock::after;
use crate::error::{Chain, Error};
use crate::metrics;
use crate::publisher::{OutboxMessage, PublishError, Publisher};
use crate::row::outbox::OutboxRecord;
use crate::sql::dialect::Backend;
use crate::sql::outbox::{self as sql, Claim, Failure};
use crate::sql::{Reused, retry_rolled_back, retry_transient, spares_a_connection};

use super::{BatchReport, Relay};

impl<DB: Backend, P: Publisher> Relay<DB, P> {
    /// Whether the next batch is claimed while the previous one is delivered: only where the
    /// database takes concurrent writers.
    pub(super) fn overlaps() -> bool {
        DB::DIALECT.concurrent_writers()
    }

    /// Delivers `batch` and claims the next one. Returns the next batch, the delivered batch's
    /// report, and whether the claim ran while the batch was in flight.
    ///
    /// The two run at the same time where [`Self::overlaps`] and the batch was full (a backlog:
    /// the next claim will find work); otherwise the claim follows the delivery, so that it also
    /// takes the events that follow the delivered ones in their aggregates, and a quiet outbox
    /// costs one claim per batch, not two. With `linger`, after a batch that was not full and
    /// was claimed while keeping up, the claim starts no sooner than
    /// [`RelayConfig::linger`](crate::RelayConfig::linger) after the delivery did.
    pub(super) async fn deliver_and_claim(
        &self,
        batch: Vec<OutboxRecord>,
        linger: bool,
    ) -> (
        Result<Vec<OutboxRecord>, Error>,
        Result<BatchReport, Error>,
        bool,
    ) {
        let full = batch.len() >= usize::try_from(self.config.batch_size).unwrap_or(usize::MAX);
        if Self::overlaps() && full {
            let (next, delivered) = tokio::join!(self.claim_in_backlog(), self.deliver(batch));
            (next, delivered, true)
        } else {
            let started = tokio::time::Instant::now();
            // The longest any event of the batch waited from its commit to its claim.
            let waited = batch
                .iter()
                .filter_map(|r| r.last_publish_time.map(|claimed| claimed - r.create_time))
                .max()
                .and_then(|waited| waited.to_std().ok())
                .unwrap_or_default();
            let linger = if linger && self.config.keeping_up(waited) {
                self.config.linger
            } else {
                std::time::Duration::ZERO
            };
            let (delivered, mut conn) = self.deliver_keeping(batch).await;
            let linger = linger.saturating_sub(started.elapsed());
            if !linger.is_zero() {
                // Held while lingering only if the pool can spare another: it may be small.
                // Kept, it saves the next claim the pool's two checks of a connection, a round
                // trip each.
                if !spares_a_connection(self.outbox.pool()) {
                    conn = None;
                }
                let mut stopping = self.stopping.subscribe();
                tokio::select! {
                    () = tokio::time::sleep(linger) => {}
                    _ = stopping.wait_for(|stopping| *stopping) => {}
                }
            }
            (self.claim_on(conn, false).await, delivered, false)
        }
    }

    /// Leases up to a batch of due events to this relay, in one short transaction.
    pub(super) async fn claim(&self) -> Result<Vec<OutboxRecord>, Error> {
        self.claim_on(None, false).await
    }

    /// [`Self::claim`] beside the delivery of a full batch, where a backlog is likely beyond
    /// it (on MySQL it may keep the server's isolation, see `Claim::in_backlog`).
    async fn claim_in_backlog(&self) -> Result<Vec<OutboxRecord>, Error> {
        self.claim_on(None, true).await
    }

    /// [`Self::claim`] on `conn` when given (the connection the last batch's marks used), else
    /// on a fresh one; `in_backlog` as [`Self::claim_in_backlog`].
    pub(super) async fn claim_on(
        &self,
        conn: Option<PoolConnection<DB>>,
        in_backlog: bool,
    ) -> Result<Vec<OutboxRecord>, Error> {
        let claimed_at = self.outbox.now();
        let claim = Claim {
            relay_id: &self.config.instance_id,
            now: claimed_at,
            lease_until: after(claimed_at, self.config.lease),
            limit: i64::from(self.config.batch_size),
            order: self.outbox.aggregate_order(self.config.ordered),
            synchronous_commit: self.config.synchronous_commit,
            without_gap_locks: self.outbox.claims_without_gap_locks(),
            in_backlog,
        };
        let (pool, table) = (self.outbox.pool(), &self.outbox.config().table);
        let conn = Reused::new(conn);
        retry_rolled_back(|| {
            conn.run(pool, async |conn| {
                sql::claim::<DB>(conn, table, &claim).await
            })
        })
        .await
        .map_err(|e| self.outbox.db_error(e))
    }

    /// Publishes a claimed batch and records each event's outcome, guarded by this relay's lease.
    pub(super) async fn deliver(&self, records: Vec<OutboxRecord>) -> Result<BatchReport, Error> {
        self.deliver_keeping(records).await.0
    }

    /// [`Self::deliver`], returning also the connection its last write used, for the claim that
    /// follows.
    pub(super) async fn deliver_keeping(
        &self,
        records: Vec<OutboxRecord>,
    ) -> (Result<BatchReport, Error>, Option<PoolConnection<DB>>) {
        let conn = Reused::new(None);
        let delivered = self.deliver_on(records, &conn).await;
        (delivered, conn.into_inner())
    }

    /// [`Self::deliver`], its writes one after another on `conn`.
    async fn deliver_on(
        &self,
        records: Vec<OutboxRecord>,
        conn: &Reused<DB>,
    ) -> Result<BatchReport, Error> {
        let table = &self.outbox.config().table;
        let mut report = BatchReport {
            claimed: records.len(),
            ..BatchReport::default()
        };
        if records.is_empty() {
            return Ok(report);
        }
        ::metrics::histogram!(metrics::OUTBOX_BATCH_SIZE).record(records.len() as f64);
        metrics::count_by_type(metrics::OUTBOX_CLAIMED, records.iter());
        metrics::count_by_type(
            metrics::OUTBOX_RETRIED,
            records.iter().filter(|r| r.retry_count > 0),
        );

        let mut messages = Vec::with_capacity(records.len());
        let mut ids = Vec::with_capacity(records.len());
        let mut unreadable = Vec::new();
        for record in &records {
            match OutboxMessage::from_record(record) {
                Ok(message) => {
                    ids.push(record);
                    messages.push(message);
                }
                Err(e) => unreadable.push((record, PublishError::new(e))),
            }
        }

        let (results, lease_end) = self.publish_under_lease(&records, &messages).await;
        let results = results.unwrap_or_else(|| {
            let e = PublishError::unavailable(
                "the batch did not finish before its lease ended",
                format!(
                    "not acknowledged within the lease of {} s",
                    self.config.lease.as_secs_f64()
                ),
            );
            messages.iter().map(|_| Err(e.clone())).collect()
        });
        let finished = self.outbox.now();
        let mut deferred = Vec::new();
        let mut failures = Vec::new();
        let mut exhausted = Vec::new();
        let outcomes = ids
            .into_iter()
            .zip(results.into_iter().map(Some).chain(std::iter::repeat(None)))
            .map(|(record, result)| {
                let result = result
                    .unwrap_or_else(|| Err(PublishError::new("the publisher returned no result")));
                (record, result)
            })
            .chain(unreadable.into_iter().map(|(r, e)| (r, Err(e))));
        let mut published_records = Vec::new();
        let mut failed_records = Vec::new();
        for (record, result) in outcomes {
            let span = tracing::debug_span!(
                "outbox.publish",
                relay = %self.config.instance_id,
                event_id = %record.event_no,
                event_type = %record.event_type,
                trace_id = record.trace_id.as_deref().unwrap_or(""),
            );
            let _entered = span.enter();
            match result {
                Ok(()) => {
                    tracing::debug!("published");
                    published_records.push(record);
                }
                Err(error) if error.is_unavailable() => {
                    tracing::debug!(reason = error.reason(), "broker unavailable; given back");
                    deferred.push((record.id, error));
                }
                Err(error) => {
                    tracing::debug!(reason = error.reason(), "publish failed");
                    failed_records.push(record);
                    let failures_so_far = u32::try_from(record.retry_count).unwrap_or(0) + 1;
                    if i64::from(failures_so_far) >= i64::from(record.max_retry_count)
                        && self.config.cancel_exhausted
                        && !self.config.critical.contains(&record.event_type)
                    {
                        exhausted.push(record.id);
                    }
                    failures.push(Failure {
                        id: record.id,
                        next_retry_time: after(
                            finished,
                            self.config.backoff.delay(failures_so_far),
                        ),
                        reason: error.reason().to_owned(),
                    });
                }
            }
        }
        let published: Vec<i64> = published_records.iter().map(|r| r.id).collect();
        let relay_id = self.config.instance_id.as_str();
        let sync = self.config.synchronous_commit;
        let pool = self.outbox.pool();
        // The batch is published: its marks are tried again on fresh connections while the
        // lease holds, so that a dropped connection does not send it all a second time.
        let deadline = Some(lease_end);
        let outage = deferred.first().map(|(_, e)| e.clone());
        let deferred_ids: Vec<i64> = deferred.iter().map(|(id, _)| *id).collect();
        if let Some(outage) = &outage {
            let reason = format!(
                "broker unavailable, not counted as an attempt: {}",
                outage.reason()
            );
            let reason = reason.chars().take(1000).collect::<String>();
            retry_transient(
                || {
                    conn.run(pool, async |conn| {
                        sql::release::<DB>(
                            conn,
                            table,
                            relay_id,
                            &deferred_ids,
                            &reason,
                            finished,
                            sync,
                        )
                        .await
                    })
                },
                deadline,
            )
            .await
            .map_err(|e| self.outbox.db_error(e))?;
        }
        let mark_runs = std::sync::atomic::AtomicUsize::new(0);
        // Nothing to write takes no connection.
        let marked = if published.is_empty() {
            0
        } else {
            retry_transient(
                || {
                    mark_runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    conn.run(pool, async |conn| {
                        sql::mark_published::<DB>(conn, table, relay_id, &published, finished, sync)
                            .await
                    })
                },
                deadline,
            )
            .await
            .map_err(|e| self.outbox.db_error(e))?
        };
        if !failures.is_empty() {
            retry_transient(
                || {
                    conn.run(pool, async |conn| {
                        sql::mark_failed::<DB>(conn, table, relay_id, &failures, finished).await
                    })
                },
                deadline,
            )
            .await
            .map_err(|e| self.outbox.db_error(e))?;
        }
        if !exhausted.is_empty() {
            let cancelled = retry_rolled_back(|| {
                conn.run(pool, async |conn| {
                    sql::cancel_exhausted::<DB>(
                        conn,
                        table,
                        &exhausted,
                        "exceeded the maximum retry count; cancelled automatically",
                        finished,
                    )
                    .await
                })
            })
            .await
            .map_err(|e| self.outbox.db_error(e))?;
            report.cancelled = usize::try_from(cancelled).unwrap_or(usize::MAX);
        }
        // A mark retried after its answer was lost finds the rows its first run marked no
        // longer held: they are published by this relay, not lost to another.
        let retried = mark_runs.load(std::sync::atomic::Ordering::Relaxed) > 1;
        let marked = if retried && (marked as usize) < published.len() {
            retry_transient(
                || {
                    conn.run(pool, async |conn| {
                        sql::count_published_at::<DB>(conn, table, &published, finished).await
                    })
                },
                deadline,
            )
            .await
            .unwrap_or(marked)
            .max(marked)
        } else {
            marked
        };
        report.published = usize::try_from(marked).unwrap_or(0);
        report.lease_lost = published.len() - report.published.min(published.len());
        report.failed = failures.len();
        report.deferred = deferred_ids.len();
        metrics::count_by_type(metrics::OUTBOX_PUBLISHED, published_records.iter().copied());
        metrics::count_by_type(metrics::OUTBOX_FAILED, failed_records.iter().copied());
        for record in &published_records {
            let latency = (finished - record.create_time)
                .num_microseconds()
                .unwrap_or(0);
            ::metrics::histogram!(metrics::OUTBOX_PUBLISH_LATENCY, "topic" => record.topic.clone().unwrap_or_default())
                .record(latency.max(0) as f64 / 1e6);
        }
        if report.cancelled > 0 {
            ::metrics::counter!(metrics::OUTBOX_CANCELLED).increment(report.cancelled as u64);
        }
        if report.lease_lost > 0 {
            ::metrics::counter!(metrics::OUTBOX_LEASE_LOST).increment(report.lease_lost as u64);
        }
        if report.lease_lost > 0 {
            tracing::warn!(
                relay = relay_id,
                count = report.lease_lost,
                "published events whose lease had expired; another relay may publish them again"
            );
        }
        if report.deferred > 0 {
            ::metrics::counter!(metrics::OUTBOX_DEFERRED).increment(report.deferred as u64);
        }
        match outage {
            Some(source) => Err(Error::BrokerUnavailable {
                relay: relay_id.to_owned(),
                claimed: report.claimed,
                published: report.published,
                failed: report.failed,
                deferred: report.deferred,
                source: Box::new(source),
            }),
            None => Ok(report),
        }
    }

    /// Publishes `messages` while renewing the lease of `records` every third of the lease
    /// (the heartbeat), so that a slow broker does not let the lease expire under a batch still
    /// in flight. Stops publishing, and returns no results, when the lease is about to end
    /// without having been renewed (the database is unreachable): the batch is then left to be
    /// given back or recovered, and no relay publishes past its lease. Returns when the lease
    /// now ends.
    pub(super) async fn publish_under_lease(
        &self,
        records: &[OutboxRecord],
        messages: &[OutboxMessage],
    ) -> (Option<Vec<Result<(), PublishError>>>, Instant) {
        let lease = self.config.lease;
        let lease_end = std::sync::Mutex::new(
            self.lease_deadline(records)
                .unwrap_or_else(|| Instant::now() + lease),
        );
        let end = || {
            *lease_end
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let ids: Vec<i64> = records.iter().map(|r| r.id).collect();
        let beat = lease / 3;
        // Renews the batch's leases for a whole lease from now, and on success moves the end.
        let renew = async || {
            let started = Instant::now();
            let until = after(self.outbox.now(), lease);
            let renewal = async {
                let mut conn = self.outbox.pool().acquire().await?;
                sql::renew_leases::<DB>(
                    &mut conn,
                    &self.outbox.config().table,
                    &self.config.instance_id,
                    &ids,
                    until,
                )
                .await
            };
            let renewed = tokio::time::timeout(beat, renewal).await;
            // Extended only while every row is still this relay's: one recovered meanwhile
            // lets the watchdog stop the batch.
            if let Ok(Ok(held)) = renewed
                && usize::try_from(held).is_ok_and(|held| held == ids.len())
            {
                *lease_end
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = started + lease;
            }
            renewed
        };
        // A claim that took most of the lease (a slow database, a large backlog) leaves too
        // little of it to publish in: renew it first, or the watchdog gives the batch back at
        // once, claim after claim.
        if end().saturating_duration_since(Instant::now()) < lease / 2 {
            let _ = renew().await;
        }
        let heartbeat = async {
            loop {
                // A third of the lease after it was last set: at once for a batch claimed while
                // the one before it was in flight.
                let renew_at = end().checked_sub(lease - beat).unwrap_or_else(Instant::now);
                tokio::time::sleep_until(renew_at).await;
                match renew().await {
                    Ok(Ok(_held)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(relay = %self.config.instance_id, error = %Chain(&e), "could not renew the lease of the batch in flight");
                        tokio::time::sleep(beat / 5).await;
                    }
                    Err(_) => {
                        tracing::warn!(relay = %self.config.instance_id, "the database did not answer the lease renewal in time");
                    }
                }
            }
        };
        // Stops a fifth of the lease before it ends, to leave time to give the batch back.
        let margin = lease / 5;
        let watchdog = async {
            loop {
                let at = end();
                tokio::time::sleep_until(at.checked_sub(margin).unwrap_or(at)).await;
                if end() == at {
                    return;
                }
            }
        };
        let grace = self.config.shutdown_grace;
        let mut stopping = self.stopping.subscribe();
        let stopped = async {
            let _ = stopping.wait_for(|stopping| *stopping).await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            results = self.publish(messages) => (Some(results), end()),
            () = stopped => {
                tracing::warn!(relay = %self.config.instance_id, events = messages.len(), "shutting down: the batch in flight was not acknowledged within the shutdown grace; giving it back");
                (None, end())
            }
            () = watchdog => {
                tracing::warn!(relay = %self.config.instance_id, events = messages.len(), "the batch did not finish before its lease ended; giving it back");
                (None, end())
            }
            () = heartbeat => (None, end()),
        }
    }

    /// When the earliest lease of `records` expires, on the runtime's clock.
    pub(super) fn lease_deadline(&self, records: &[OutboxRecord]) -> Option<Instant> {
        let now = self.outbox.now();
        let earliest = records.iter().filter_map(|r| r.lock_until).min()?;
        let left = (earliest - now).to_std().unwrap_or(Duration::ZERO);
        Some(Instant::now() + left)
    }

    /// Gives a claimed batch back unpublished, its attempt not counted (see
    /// [`BatchReport::deferred`]); a failure is logged, and the leases then expire and are
    /// recovered.
    pub(super) async fn give_back(&self, records: &[OutboxRecord], reason: &str) {
        if records.is_empty() {
            return;
        }
        let ids: Vec<i64> = records.iter().map(|r| r.id).collect();
        let (pool, table) = (self.outbox.pool(), &self.outbox.config().table);
        let relay_id = self.config.instance_id.as_str();
        let now = self.outbox.now();
        let released = retry_transient(
            || async {
                let mut conn = pool.acquire().await?;
                sql::release::<DB>(
                    &mut conn,
                    table,
                    relay_id,
                    &ids,
                    reason,
                    now,
                    self.config.synchronous_commit,
                )
                .await
            },
            self.lease_deadline(records),
        )
        .await;
        match released {
            Ok(n) => {
                ::metrics::counter!(metrics::OUTBOX_DEFERRED).increment(n);
            }
            Err(e) => {
                let e = self.outbox.db_error(e);
                tracing::warn!(relay = relay_id, error = %Chain(&e), "could not give back a claimed batch; its leases expire and are recovered");
            }
        }
    }
}
