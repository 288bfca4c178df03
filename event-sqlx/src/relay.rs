//! The relay: claims committed events under a lease, publishes them, and records the outcome.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::after;
use crate::config::relay::RelayConfig;
use crate::error::{Chain, Error};
use crate::metrics;
use crate::outbox::Outbox;
use crate::publisher::{OutboxMessage, PublishError, Publisher};
use crate::row::outbox::OutboxRecord;
use crate::sql::dialect::Backend;
use crate::sql::outbox::{self as sql, Claim, Failure};
use crate::sql::{retry_rolled_back, retry_transient};

/// The first pause after the broker was found unavailable; it doubles up to
/// [`RelayConfig::outage_pause`].
const OUTAGE_FIRST_PAUSE: Duration = Duration::from_millis(250);

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BatchReport {
    /// Events claimed.
    pub claimed: usize,
    /// Events published and marked.
    pub published: usize,
    /// Events whose publish failed.
    pub failed: usize,
    /// Events published, whose lease had been taken over before they were marked: another relay
    /// may publish them again (consumers deduplicate on eventId).
    pub lease_lost: usize,
    /// Exhausted events cancelled (only with [`RelayConfig::cancel_exhausted`]).
    pub cancelled: usize,
    /// Events given back unpublished, their attempt not counted: the broker was unavailable
    /// ([`PublishError::unavailable`]), or the batch could not finish before its lease ended.
    pub deferred: usize,
}

impl std::ops::AddAssign for BatchReport {
    fn add_assign(&mut self, other: BatchReport) {
        self.claimed += other.claimed;
        self.published += other.published;
        self.failed += other.failed;
        self.lease_lost += other.lease_lost;
        self.cancelled += other.cancelled;
        self.deferred += other.deferred;
    }
}

/// Publishes committed outbox events.
///
/// Several relays may run against one database, in one process or many: a claim leases its
/// events to one relay (`locked_by`, `lock_until`), and per-aggregate order holds across relays.
#[derive(Debug)]
pub struct Relay<DB: Backend, P> {
    outbox: Outbox<DB>,
    publisher: P,
    config: RelayConfig,
    /// Set when [`Relay::run`]'s shutdown completed: the batch in flight has the shutdown grace
    /// left to be acknowledged.
    stopping: tokio::sync::watch::Sender<bool>,
}

impl<DB: Backend> Outbox<DB> {
    /// A relay publishing this outbox's events with `publisher`.
    pub fn relay<P: Publisher>(&self, publisher: P, config: RelayConfig) -> Relay<DB, P> {
        Relay {
            outbox: self.clone(),
            publisher,
            config,
            stopping: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl<DB: Backend, P: Publisher> Relay<DB, P> {
    /// The settings.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// The publisher.
    pub fn publisher(&self) -> &P {
        &self.publisher
    }

    /// Claims one batch, publishes it, and records the outcome. The claim is committed before
    /// publishing starts: no database lock is held while the broker is called.
    pub async fn run_once(&self) -> Result<BatchReport, Error> {
        let batch = self.claim().await?;
        self.deliver(batch).await
    }

    /// Publishes batch after batch until no event is claimable by anyone, and returns what was
    /// done; failed events whose retry is not yet due are left for later.
    ///
    /// While other relays hold live leases, it waits for them and claims again, since the
    /// events that follow theirs in each aggregate become claimable once they are published: of
    /// several relays draining one backlog, none returns while work it could share remains. A
    /// relay that died holds its leases until they expire; `drain` waits that long, and leaves
    /// the expired leases to [`Relay::recover_expired_leases`] ([`Relay::drain_recovering`]
    /// does both).
    ///
    /// On PostgreSQL and MySQL the next batch is claimed while a full one is published and
    /// marked, on a second connection; after a batch that was not full, and on SQLite, which has
    /// one writer, the next claim follows the delivery. On an error, a batch already claimed is
    /// still delivered before the error is returned, so no lease is left held.
    pub async fn drain(&self) -> Result<BatchReport, Error> {
        self.prepare().await;
        let mut total = BatchReport::default();
        let mut batch = self.claim().await?;
        loop {
            while !batch.is_empty() {
                let (next, delivered, overlapped) = self.deliver_and_claim(batch).await;
                match (delivered, next) {
                    (Ok(report), Ok(next)) => {
                        total += report;
                        batch = next;
                    }
                    (Err(e), Ok(next)) => {
                        if matches!(e, Error::BrokerUnavailable { .. }) {
                            self.give_back(&next, "broker unavailable; not published")
                                .await;
                        } else {
                            total += self.deliver(next).await.unwrap_or_default();
                        }
                        return Err(e);
                    }
                    (_, Err(e)) => return Err(e),
                }
                if batch.is_empty() && overlapped {
                    // That claim ran while the last batch was in flight, so it could not yet
                    // take the events that follow it in their aggregates.
                    batch = self.claim().await?;
                }
            }
            // This relay's claim found nothing. Done, unless another relay holds leases (the
            // events after theirs come free when they finish) or is claiming right now.
            if !self.work_remains().await? {
                return Ok(total);
            }
            tokio::select! {
                () = self.outbox.wakeup().notified() => {}
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            batch = self.claim().await?;
        }
    }

    /// Takes the outbox table's statistics when they are missing or stale, so that claims use
    /// their index on a table just filled; a failure is logged, not fatal.
    async fn prepare(&self) {
        if let Err(e) = self.outbox.ensure_statistics().await {
            tracing::warn!(error = %crate::error::Chain(&e), "could not check the outbox table's statistics; claims may be slow on a table just filled");
        }
    }

    /// Whether an event is claimable now, by this relay or another, or another relay holds a
    /// live lease.
    async fn work_remains(&self) -> Result<bool, Error> {
        let mut conn = self.outbox.conn().await?;
        sql::work_remains::<DB>(
            &mut conn,
            &self.outbox.config().table,
            self.outbox.now(),
            self.config.ordered,
            &self.config.instance_id,
        )
        .await
        .map_err(|e| self.outbox.db_error(e))
    }

    /// Whether the next batch is claimed while the previous one is delivered: only where the
    /// database takes concurrent writers.
    fn overlaps() -> bool {
        DB::DIALECT.concurrent_writers()
    }

    /// Delivers `batch` and claims the next one. Returns the next batch, the delivered batch's
    /// report, and whether the claim ran while the batch was in flight.
    ///
    /// The two run at the same time where [`Self::overlaps`] and the batch was full (a backlog:
    /// the next claim will find work); otherwise the claim follows the delivery, so that it also
    /// takes the events that follow the delivered ones in their aggregates, and a quiet outbox
    /// costs one claim per batch, not two.
    async fn deliver_and_claim(
        &self,
        batch: Vec<OutboxRecord>,
    ) -> (
        Result<Vec<OutboxRecord>, Error>,
        Result<BatchReport, Error>,
        bool,
    ) {
        let full = batch.len() >= usize::try_from(self.config.batch_size).unwrap_or(usize::MAX);
        if Self::overlaps() && full {
            let (next, delivered) = tokio::join!(self.claim(), self.deliver(batch));
            (next, delivered, true)
        } else {
            let delivered = self.deliver(batch).await;
            (self.claim().await, delivered, false)
        }
    }

    /// Leases up to a batch of due events to this relay, in one short transaction.
    async fn claim(&self) -> Result<Vec<OutboxRecord>, Error> {
        let claimed_at = self.outbox.now();
        let claim = Claim {
            relay_id: &self.config.instance_id,
            now: claimed_at,
            lease_until: after(claimed_at, self.config.lease),
            limit: i64::from(self.config.batch_size),
            ordered: self.config.ordered,
        };
        let (pool, table) = (self.outbox.pool(), &self.outbox.config().table);
        retry_rolled_back(|| sql::claim::<DB>(pool, table, &claim))
            .await
            .map_err(|e| self.outbox.db_error(e))
    }

    /// Publishes a claimed batch and records each event's outcome, guarded by this relay's lease.
    async fn deliver(&self, records: Vec<OutboxRecord>) -> Result<BatchReport, Error> {
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
                || async {
                    let mut conn = pool.acquire().await?;
                    sql::release::<DB>(&mut conn, table, relay_id, &deferred_ids, &reason, finished)
                        .await
                },
                deadline,
            )
            .await
            .map_err(|e| self.outbox.db_error(e))?;
        }
        let mark_runs = std::sync::atomic::AtomicUsize::new(0);
        let marked = retry_transient(
            || async {
                mark_runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut conn = pool.acquire().await?;
                sql::mark_published::<DB>(&mut conn, table, relay_id, &published, finished).await
            },
            deadline,
        )
        .await
        .map_err(|e| self.outbox.db_error(e))?;
        retry_transient(
            || async {
                let mut conn = pool.acquire().await?;
                sql::mark_failed::<DB>(&mut conn, table, relay_id, &failures, finished).await
            },
            deadline,
        )
        .await
        .map_err(|e| self.outbox.db_error(e))?;
        if !exhausted.is_empty() {
            let cancelled = retry_rolled_back(|| async {
                let mut conn = pool.acquire().await?;
                sql::cancel_exhausted::<DB>(
                    &mut conn,
                    table,
                    &exhausted,
                    "exceeded the maximum retry count; cancelled automatically",
                    finished,
                )
                .await
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
                || async {
                    let mut conn = pool.acquire().await?;
                    sql::count_published_at::<DB>(&mut conn, table, &published, finished).await
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
    async fn publish_under_lease(
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
    fn lease_deadline(&self, records: &[OutboxRecord]) -> Option<Instant> {
        let now = self.outbox.now();
        let earliest = records.iter().filter_map(|r| r.lock_until).min()?;
        let left = (earliest - now).to_std().unwrap_or(Duration::ZERO);
        Some(Instant::now() + left)
    }

    /// Gives a claimed batch back unpublished, its attempt not counted (see
    /// [`BatchReport::deferred`]); a failure is logged, and the leases then expire and are
    /// recovered.
    async fn give_back(&self, records: &[OutboxRecord], reason: &str) {
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
                sql::release::<DB>(&mut conn, table, relay_id, &ids, reason, now).await
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

    /// [`Relay::drain`] for a backlog a dead relay may have left, as `eventctl relay
    /// --until-idle` does: recovers the expired leases first, drains, then recovers the leases
    /// that expired meanwhile and drains again while there are some and they are due at once
    /// (a recovery delay of zero, [`RelayConfig::lease_recovery`]). With a recovery delay, the
    /// events recovered are due after it, for a later call or [`Relay::run`].
    pub async fn drain_recovering(&self) -> Result<BatchReport, Error> {
        self.recover_expired_leases().await?;
        let mut total = self.drain().await?;
        while self.recover_expired_leases().await? > 0 && self.config.recovery_delay.is_zero() {
            total += self.drain().await?;
        }
        Ok(total)
    }

    /// Moves events whose lease expired (their relay died) back to failed, due after the
    /// recovery delay. Returns how many moved.
    pub async fn recover_expired_leases(&self) -> Result<u64, Error> {
        let at = self.outbox.now();
        let (pool, table) = (self.outbox.pool(), &self.outbox.config().table);
        let recovered = retry_rolled_back(|| async {
            let mut conn = pool.acquire().await?;
            sql::recover_expired::<DB>(
                &mut conn,
                table,
                at,
                after(at, self.config.recovery_delay),
                "relay lease expired; waiting to be published again",
            )
            .await
        })
        .await
        .map_err(|e| self.outbox.db_error(e))?;
        if recovered > 0 {
            ::metrics::counter!(metrics::OUTBOX_LEASES_RECOVERED).increment(recovered);
        }
        Ok(recovered)
    }

    /// Samples the backlog gauges (see [`metrics`](crate::metrics)) when the metrics interval
    /// has passed since `last`; a failed sample is logged and tried at the next interval.
    async fn sample_backlog(&self, last: &mut Option<Instant>) {
        let every = self.config.metrics_interval;
        if every.is_zero() || last.is_some_and(|at| at.elapsed() < every) {
            return;
        }
        *last = Some(Instant::now());
        match self.outbox.health().await {
            Ok(health) => metrics::record_health(&health),
            Err(e) => {
                tracing::warn!(relay = %self.config.instance_id, error = %Chain(&e), "could not sample the outbox backlog")
            }
        }
    }

    /// Runs until `shutdown` completes: claims and publishes batch after batch without sleeping
    /// while there are events to claim (claiming the next batch while a full one is delivered,
    /// as [`Relay::drain`] does), otherwise waits for a commit in this process, a
    /// PostgreSQL notification, or the poll interval. Database errors are logged and retried after
    /// the poll interval; the relay does not stop for them.
    ///
    /// While the broker is unavailable, the relay gives each batch back unpublished (its
    /// attempt not counted) and pauses, from a quarter of a second doubling up to
    /// [`RelayConfig::outage_pause`] (5 s by default), before it tries again: it publishes again
    /// within that pause of the broker answering.
    ///
    /// When `shutdown` completes, the batch in flight has [`RelayConfig::shutdown_grace`] (5 s
    /// by default) to be acknowledged; what is not is given back unpublished, as is the batch
    /// claimed next, so `run` returns within the grace plus one database round trip and leaves
    /// no lease held.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> BatchReport {
        self.stopping.send_replace(false);
        self.prepare().await;
        let mut total = BatchReport::default();
        let mut last_recovery: Option<Instant> = None;
        let mut last_sample: Option<Instant> = None;
        let mut batch = Vec::new();
        let mut outage: Option<Duration> = None;
        let mut stopped = false;
        tokio::pin!(shutdown);
        loop {
            self.sample_backlog(&mut last_sample).await;
            if last_recovery.is_none_or(|at| at.elapsed() >= self.config.recover_interval) {
                if last_recovery.is_some() {
                    // A bulk load while the relay runs makes the statistics stale too.
                    self.prepare().await;
                }
                match self.recover_expired_leases().await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(relay = %self.config.instance_id, recovered = n, "recovered expired leases")
                    }
                    Err(e) => {
                        tracing::warn!(relay = %self.config.instance_id, error = %Chain(&e), "lease recovery failed")
                    }
                }
                last_recovery = Some(Instant::now());
            }
            let mut failed = false;
            if batch.is_empty() {
                match self.claim().await {
                    Ok(claimed) => batch = claimed,
                    Err(e) => {
                        tracing::warn!(relay = %self.config.instance_id, error = %Chain(&e), "relay claim failed; retrying");
                        failed = true;
                    }
                }
            }
            if !batch.is_empty() {
                let work = self.deliver_and_claim(std::mem::take(&mut batch));
                tokio::pin!(work);
                let (next, delivered, overlapped) = tokio::select! {
                    done = &mut work => done,
                    () = &mut shutdown => {
                        stopped = true;
                        self.stopping.send_replace(true);
                        work.await
                    }
                };
                match delivered {
                    Ok(report) => {
                        if outage.take().is_some() {
                            tracing::info!(relay = %self.config.instance_id, "the broker answers again; publishing");
                        }
                        total += report;
                    }
                    Err(Error::BrokerUnavailable {
                        claimed,
                        published,
                        failed,
                        deferred,
                        source,
                        ..
                    }) => {
                        total += BatchReport {
                            claimed,
                            published,
                            failed,
                            deferred,
                            ..BatchReport::default()
                        };
                        let pause = match outage {
                            None => {
                                tracing::warn!(relay = %self.config.instance_id, error = %Chain(&*source), deferred, "broker unavailable; events given back unpublished, attempts not counted; pausing until it answers");
                                OUTAGE_FIRST_PAUSE
                            }
                            Some(pause) => (pause * 2).min(self.config.outage_pause),
                        };
                        outage = Some(pause);
                    }
                    Err(e) => {
                        tracing::warn!(relay = %self.config.instance_id, error = %Chain(&e), "relay batch failed; retrying");
                        failed = true;
                    }
                }
                match next {
                    Ok(next) => batch = next,
                    Err(e) => {
                        tracing::warn!(relay = %self.config.instance_id, error = %Chain(&e), "relay claim failed; retrying");
                        failed = true;
                    }
                }
                if stopped {
                    break;
                }
                if let Some(pause) = outage {
                    // Not published while the broker is away: give it back rather than hold it.
                    self.give_back(
                        &std::mem::take(&mut batch),
                        "broker unavailable; not published",
                    )
                    .await;
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(pause) => continue,
                    }
                }
                // A claim that ran while the batch was in flight could not take the events
                // that follow it in their aggregates: claim again at once. One that ran after it
                // and found nothing leaves the relay to wait for the next commit.
                if !failed && (overlapped || !batch.is_empty()) {
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break,
                        () = std::future::ready(()) => continue,
                    }
                }
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = self.outbox.wakeup().notified(), if !failed => {}
                () = tokio::time::sleep(self.config.poll_interval) => {}
            }
        }
        // The batch claimed next was not started: give it back rather than publish it now.
        self.give_back(&batch, "relay stopped before publishing")
            .await;
        total
    }

    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let Some(rate) = self.config.max_rate else {
            return self.publisher.publish(messages).await;
        };
        let pause = Duration::from_secs(1) / rate;
        let mut results = Vec::with_capacity(messages.len());
        for message in messages.chunks(1) {
            results.extend(self.publisher.publish(message).await);
            tokio::time::sleep(pause).await;
        }
        results
    }
}
