//! The relay: claims committed events under a lease, publishes them, and records the outcome.

use std::collections::HashSet;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::Instant;

use crate::backend::{Backend, Claim, Dialect, Failure, retry_rolled_back};
use crate::outbox::now;
use crate::publisher::{OutboxMessage, PublishError, Publisher};
use crate::{Outbox, OutboxError, OutboxRecord};

/// When a failed event is tried again: a schedule of delays by attempt, with jitter.
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    schedule: Vec<Duration>,
    jitter: f64,
}

impl Default for Backoff {
    /// 1 min, 5 min, 30 min, then every 2 h, each ±10%.
    fn default() -> Self {
        Backoff {
            schedule: vec![
                Duration::from_secs(60),
                Duration::from_secs(5 * 60),
                Duration::from_secs(30 * 60),
                Duration::from_secs(2 * 60 * 60),
            ],
            jitter: 0.1,
        }
    }
}

impl Backoff {
    /// The delay after the first, second, ... failure; the last delay repeats. An empty schedule
    /// retries at once.
    pub fn schedule(delays: impl IntoIterator<Item = Duration>) -> Backoff {
        Backoff {
            schedule: delays.into_iter().collect(),
            jitter: 0.1,
        }
    }

    /// Exponential delays from `first`, doubling, capped at `max`, for `steps` steps.
    pub fn exponential(first: Duration, max: Duration, steps: u32) -> Backoff {
        Backoff::schedule((0..steps.max(1)).map(|i| first.saturating_mul(1 << i.min(30)).min(max)))
    }

    /// Spreads each delay uniformly over `±fraction` of it (0 for exact delays), so that events
    /// failed together are not all retried at the same instant.
    pub fn jitter(mut self, fraction: f64) -> Backoff {
        self.jitter = fraction.clamp(0.0, 1.0);
        self
    }

    /// The delay after failure number `failures` (from 1).
    pub fn delay(&self, failures: u32) -> Duration {
        let Some(last) = self.schedule.last() else {
            return Duration::ZERO;
        };
        let index = usize::try_from(failures.saturating_sub(1)).unwrap_or(usize::MAX);
        let base = self.schedule.get(index).unwrap_or(last);
        if self.jitter == 0.0 {
            return *base;
        }
        let unit = RandomState::new().hash_one(Instant::now()) as f64 / u64::MAX as f64;
        base.mul_f64(1.0 + self.jitter * (2.0 * unit - 1.0))
    }
}

/// How a relay runs.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub(crate) instance_id: String,
    pub(crate) batch_size: u32,
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) recovery_delay: Duration,
    pub(crate) recover_interval: Duration,
    pub(crate) ordered: bool,
    pub(crate) critical: HashSet<String>,
    pub(crate) cancel_exhausted: bool,
    pub(crate) max_rate: Option<u32>,
}

impl RelayConfig {
    /// A relay named `instance_id` (the `locked_by` of its leases; unique per running relay):
    /// batches of 200, 2-minute leases, per-aggregate order, the default backoff, polling every
    /// second when idle, expired leases recovered every 30 s and retried after 1 minute.
    pub fn new(instance_id: impl Into<String>) -> RelayConfig {
        RelayConfig {
            instance_id: instance_id.into(),
            batch_size: 200,
            lease: Duration::from_secs(120),
            poll_interval: Duration::from_secs(1),
            backoff: Backoff::default(),
            recovery_delay: Duration::from_secs(60),
            recover_interval: Duration::from_secs(30),
            ordered: true,
            critical: HashSet::new(),
            cancel_exhausted: false,
            max_rate: None,
        }
    }

    /// Events claimed per batch.
    pub fn batch_size(mut self, size: u32) -> Self {
        self.batch_size = size.max(1);
        self
    }

    /// How long a claim holds its events. Set it above the longest publish of two batches (on
    /// PostgreSQL and MySQL a batch is claimed while the one before it is still being published):
    /// when it expires, another relay may publish the same events again.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long an idle relay sleeps between polls when nothing wakes it.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// When failed events are retried.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How often expired leases are recovered, and how long after recovery they are retried.
    pub fn lease_recovery(mut self, every: Duration, retry_after: Duration) -> Self {
        self.recover_interval = every;
        self.recovery_delay = retry_after;
        self
    }

    /// Turns per-aggregate ordering off: events are published as soon as they are due, even
    /// while an earlier event of their aggregate is unpublished. More throughput for a single
    /// busy aggregate; consumers must then cope with reordering.
    pub fn unordered(mut self) -> Self {
        self.ordered = false;
        self
    }

    /// Cancels events that used up their retries, except critical event types, which stay failed
    /// for an operator. Off by default: exhausted events stay failed.
    pub fn cancel_exhausted(mut self) -> Self {
        self.cancel_exhausted = true;
        self
    }

    /// Marks `event_type` critical: it is never cancelled automatically.
    pub fn critical(mut self, event_type: impl Into<String>) -> Self {
        self.critical.insert(event_type.into());
        self
    }

    /// Publishes at most `per_second` events a second.
    pub fn max_rate(mut self, per_second: u32) -> Self {
        self.max_rate = Some(per_second.max(1));
        self
    }

    /// The relay's instance id.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }
}

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
}

impl std::ops::AddAssign for BatchReport {
    fn add_assign(&mut self, other: BatchReport) {
        self.claimed += other.claimed;
        self.published += other.published;
        self.failed += other.failed;
        self.lease_lost += other.lease_lost;
        self.cancelled += other.cancelled;
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
}

impl<DB: Backend> Outbox<DB> {
    /// A relay publishing this outbox's events with `publisher`.
    pub fn relay<P: Publisher>(&self, publisher: P, config: RelayConfig) -> Relay<DB, P> {
        Relay {
            outbox: self.clone(),
            publisher,
            config,
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
    pub async fn run_once(&self) -> Result<BatchReport, OutboxError> {
        let batch = self.claim().await?;
        self.deliver(batch).await
    }

    /// Publishes batch after batch until no event is claimable (pending, or failed and due), and
    /// returns what was done; failed events whose retry is not yet due are left for later.
    ///
    /// On PostgreSQL and MySQL the next batch is claimed while the previous one is published and
    /// marked, on a second connection; on SQLite, which has one writer, batches run one after
    /// another. On an error, a batch already claimed is still delivered before the error is
    /// returned, so no lease is left held.
    pub async fn drain(&self) -> Result<BatchReport, OutboxError> {
        let mut total = BatchReport::default();
        let mut batch = self.claim().await?;
        while !batch.is_empty() {
            let (next, delivered) = self.deliver_and_claim(batch).await;
            match (delivered, next) {
                (Ok(report), Ok(next)) => {
                    total += report;
                    batch = next;
                }
                (Err(e), Ok(next)) => {
                    total += self.deliver(next).await.unwrap_or_default();
                    return Err(e);
                }
                (_, Err(e)) => return Err(e),
            }
            if batch.is_empty() && Self::overlaps() {
                // That claim ran while the last batch was in flight, so it could not yet take
                // the events that follow it in their aggregates.
                batch = self.claim().await?;
            }
        }
        Ok(total)
    }

    /// Whether the next batch is claimed while the previous one is delivered: only where the
    /// database takes concurrent writers.
    fn overlaps() -> bool {
        DB::DIALECT != Dialect::Sqlite
    }

    /// Delivers `batch` and claims the next one: at the same time where [`Self::overlaps`],
    /// otherwise one after the other. Returns the next batch and the delivered batch's report.
    async fn deliver_and_claim(
        &self,
        batch: Vec<OutboxRecord>,
    ) -> (
        Result<Vec<OutboxRecord>, OutboxError>,
        Result<BatchReport, OutboxError>,
    ) {
        if Self::overlaps() {
            tokio::join!(self.claim(), self.deliver(batch))
        } else {
            let delivered = self.deliver(batch).await;
            (self.claim().await, delivered)
        }
    }

    /// Leases up to a batch of due events to this relay, in one short transaction.
    async fn claim(&self) -> Result<Vec<OutboxRecord>, OutboxError> {
        let claimed_at = now();
        let claim = Claim {
            relay_id: &self.config.instance_id,
            now: claimed_at,
            lease_until: claimed_at + delta(self.config.lease),
            limit: i64::from(self.config.batch_size),
            ordered: self.config.ordered,
        };
        let (pool, table) = (self.outbox.pool(), &self.outbox.config().table);
        retry_rolled_back(|| DB::claim(pool, table, &claim))
            .await
            .map_err(|e| self.outbox.db_error(e))
    }

    /// Publishes a claimed batch and records each event's outcome, guarded by this relay's lease.
    async fn deliver(&self, records: Vec<OutboxRecord>) -> Result<BatchReport, OutboxError> {
        let table = &self.outbox.config().table;
        let pool = self.outbox.pool();
        let mut report = BatchReport {
            claimed: records.len(),
            ..BatchReport::default()
        };
        if records.is_empty() {
            return Ok(report);
        }

        let mut messages = Vec::with_capacity(records.len());
        let mut ids = Vec::with_capacity(records.len());
        let mut unreadable = Vec::new();
        for record in &records {
            match record.envelope() {
                Ok(envelope) => {
                    ids.push(record);
                    messages.push(OutboxMessage {
                        envelope,
                        channel: record.publish_channel.clone(),
                        topic: record.topic.clone(),
                        routing_key: record.routing_key.clone(),
                        retry_count: u32::try_from(record.retry_count).unwrap_or(0),
                    });
                }
                Err(e) => unreadable.push((record, PublishError::new(e))),
            }
        }

        let results = self.publish(&messages).await;
        let finished = now();
        let mut published = Vec::new();
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
        for (record, result) in outcomes {
            match result {
                Ok(()) => published.push(record.id),
                Err(error) => {
                    let failures_so_far = u32::try_from(record.retry_count).unwrap_or(0) + 1;
                    if i64::from(failures_so_far) >= i64::from(record.max_retry_count)
                        && self.config.cancel_exhausted
                        && !self.config.critical.contains(&record.event_type)
                    {
                        exhausted.push(record.id);
                    }
                    failures.push(Failure {
                        id: record.id,
                        next_retry_time: finished
                            + delta(self.config.backoff.delay(failures_so_far)),
                        reason: error.reason().to_owned(),
                    });
                }
            }
        }
        let relay_id = self.config.instance_id.as_str();
        let marked =
            retry_rolled_back(|| DB::mark_published(pool, table, relay_id, &published, finished))
                .await
                .map_err(|e| self.outbox.db_error(e))?;
        retry_rolled_back(|| DB::mark_failed(pool, table, relay_id, &failures, finished))
            .await
            .map_err(|e| self.outbox.db_error(e))?;
        if !exhausted.is_empty() {
            report.cancelled = usize::try_from(
                retry_rolled_back(|| {
                    DB::cancel_exhausted(
                        pool,
                        table,
                        &exhausted,
                        "exceeded the maximum retry count; cancelled automatically",
                        finished,
                    )
                })
                .await
                .map_err(|e| self.outbox.db_error(e))?,
            )
            .unwrap_or(0);
        }
        report.published = usize::try_from(marked).unwrap_or(0);
        report.lease_lost = published.len() - report.published.min(published.len());
        report.failed = failures.len();
        if report.lease_lost > 0 {
            tracing::warn!(
                relay = relay_id,
                count = report.lease_lost,
                "published events whose lease had expired; another relay may publish them again"
            );
        }
        Ok(report)
    }

    /// Moves events whose lease expired (their relay died) back to failed, due after the
    /// recovery delay. Returns how many moved.
    pub async fn recover_expired_leases(&self) -> Result<u64, OutboxError> {
        let at = now();
        let (pool, table) = (self.outbox.pool(), &self.outbox.config().table);
        retry_rolled_back(|| {
            DB::recover_expired(
                pool,
                table,
                at,
                at + delta(self.config.recovery_delay),
                "relay lease expired; waiting to be published again",
            )
        })
        .await
        .map_err(|e| self.outbox.db_error(e))
    }

    /// Runs until `shutdown` completes: claims and publishes batch after batch without sleeping
    /// while there are events to claim (claiming the next batch while the previous one is
    /// delivered, as [`Relay::drain`] does), otherwise waits for a commit in this process, a
    /// PostgreSQL notification, or the poll interval. Database errors are logged and retried after
    /// the poll interval; the relay does not stop for them. On shutdown the batches in flight are
    /// finished, so no lease is left held.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> BatchReport {
        let mut total = BatchReport::default();
        let mut last_recovery: Option<Instant> = None;
        let mut batch = Vec::new();
        tokio::pin!(shutdown);
        loop {
            if last_recovery.is_none_or(|at| at.elapsed() >= self.config.recover_interval) {
                match self.recover_expired_leases().await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(relay = %self.config.instance_id, recovered = n, "recovered expired leases")
                    }
                    Err(e) => {
                        tracing::warn!(relay = %self.config.instance_id, error = %e, "lease recovery failed")
                    }
                }
                last_recovery = Some(Instant::now());
            }
            let mut failed = false;
            if batch.is_empty() {
                match self.claim().await {
                    Ok(claimed) => batch = claimed,
                    Err(e) => {
                        tracing::warn!(relay = %self.config.instance_id, error = %e, "relay claim failed; retrying");
                        failed = true;
                    }
                }
            }
            if !batch.is_empty() {
                let (next, delivered) = self.deliver_and_claim(std::mem::take(&mut batch)).await;
                match delivered {
                    Ok(report) => total += report,
                    Err(e) => {
                        tracing::warn!(relay = %self.config.instance_id, error = %e, "relay batch failed; retrying");
                        failed = true;
                    }
                }
                match next {
                    Ok(next) => batch = next,
                    Err(e) => {
                        tracing::warn!(relay = %self.config.instance_id, error = %e, "relay claim failed; retrying");
                        failed = true;
                    }
                }
                if !failed {
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
        if !batch.is_empty() {
            match self.deliver(batch).await {
                Ok(report) => total += report,
                Err(e) => {
                    tracing::warn!(relay = %self.config.instance_id, error = %e, "could not finish the last batch; its leases expire and another relay publishes it")
                }
            }
        }
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

fn delta(duration: Duration) -> TimeDelta {
    TimeDelta::from_std(duration).unwrap_or(TimeDelta::MAX)
}

/// When a retry is due, for tests and tools: `failed_at` plus the schedule's delay.
pub fn due_after(failed_at: DateTime<Utc>, backoff: &Backoff, failures: u32) -> DateTime<Utc> {
    failed_at + delta(backoff.delay(failures))
}
