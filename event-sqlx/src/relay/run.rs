//! The relay as a long-running task: woken by commits or its poll interval, recovering expired
//! leases, sampling the backlog, and pausing through broker outages.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::after;
use crate::error::{Chain, Error};
use crate::metrics;
use crate::publisher::Publisher;
use crate::sql::dialect::Backend;
use crate::sql::outbox::{self as sql};
use crate::sql::retry_rolled_back;

use super::{BatchReport, OUTAGE_FIRST_PAUSE, Relay};

/// How often a running relay that has claimed events since it last looked checks whether the
/// outbox table has outgrown its statistics (one catalog query; `ANALYZE` only when the table has
/// doubled, see [`Outbox::ensure_statistics`](crate::Outbox::ensure_statistics)).
///
/// On PostgreSQL this keeps the claims and marks on their indexes while a table fills: a
/// prepared statement is planned once for all values after a few runs, and that plan is kept
/// until the table's statistics change. Planned while the table held a page or two, it scans the
/// whole table, and each claim and mark then costs time in proportion to the table (2.5 ms at
/// 3,400 rows, growing). Taking the statistics again makes the server plan them afresh.
const STATISTICS_CHECK: Duration = Duration::from_secs(1);

impl<DB: Backend, P: Publisher> Relay<DB, P> {
    /// Moves events whose lease expired (their relay died) back to failed, due after the
    /// recovery delay. Returns how many moved.
    pub async fn recover_expired_leases(&self) -> Result<u64, Error> {
        if !self
            .isolation_read
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            self.detect_claim_isolation().await;
        }
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
                self.outbox.claims_without_gap_locks(),
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
    pub(super) async fn sample_backlog(&self, last: &mut Option<Instant>) {
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
    /// [`RelayConfig::outage_pause`](crate::RelayConfig::outage_pause) (5 s by default), before it tries again: it publishes again
    /// within that pause of the broker answering.
    ///
    /// When `shutdown` completes, the batch in flight has [`RelayConfig::shutdown_grace`](crate::RelayConfig::shutdown_grace) (5 s
    /// by default) to be acknowledged; what is not is given back unpublished, as is the batch
    /// claimed next, so `run` returns within the grace plus one database round trip and leaves
    /// no lease held.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> BatchReport {
        self.stopping.send_replace(false);
        self.start().await;
        let mut total = BatchReport::default();
        let mut last_recovery: Option<Instant> = None;
        let mut last_sample: Option<Instant> = None;
        let mut statistics_checked = (Instant::now(), 0);
        let mut batch = Vec::new();
        let mut outage: Option<Duration> = None;
        let mut stopped = false;
        tokio::pin!(shutdown);
        loop {
            self.sample_backlog(&mut last_sample).await;
            // A table filling while the relay runs (a bulk load, or a new outbox taking its
            // first events) outgrows its statistics.
            if total.claimed > statistics_checked.1
                && statistics_checked.0.elapsed() >= STATISTICS_CHECK
            {
                self.prepare().await;
                statistics_checked = (Instant::now(), total.claimed);
            }
            if last_recovery.is_none_or(|at| at.elapsed() >= self.config.recover_interval) {
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
                let work = self.deliver_and_claim(std::mem::take(&mut batch), true);
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
}
