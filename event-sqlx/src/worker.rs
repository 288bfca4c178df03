//! The message-event worker (seed 000): internal asynchronous work from `biz_message_event`,
//! claimed one row at a time under the seed's state and version guard, handled by event type
//! with bounded concurrency.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use crate::config::backoff::Backoff;
use crate::error::{Chain, Error, HandlerError};
use crate::message::MessageStore;
use crate::row::message::MessageRecord;
use crate::sql::dialect::Backend;

type Handler = Arc<
    dyn Fn(MessageRecord) -> Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>
        + Send
        + Sync,
>;

/// Runs handlers for the message events in a [`MessageStore`].
pub struct MessageWorker<DB: Backend> {
    store: MessageStore<DB>,
    handlers: HashMap<String, Handler>,
    concurrency: usize,
    batch: u32,
    backoff: Backoff,
    poll_interval: Duration,
    critical: HashSet<String>,
    cancel_exhausted: bool,
}

impl<DB: Backend> std::fmt::Debug for MessageWorker<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageWorker")
            .field("event_types", &self.handlers.keys().collect::<Vec<_>>())
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Claimed by this worker.
    pub claimed: usize,
    /// Handled successfully.
    pub succeeded: usize,
    /// Failed, to be retried when due.
    pub failed: usize,
    /// Cancelled after their last retry.
    pub cancelled: usize,
    /// Taken by another worker first.
    pub lost_claims: usize,
}

impl<DB: Backend> MessageWorker<DB> {
    /// A worker over `store`: 4 handlers at a time, 100 rows a round, the default backoff,
    /// exhausted messages left failed.
    pub fn new(store: MessageStore<DB>) -> MessageWorker<DB> {
        MessageWorker {
            store,
            handlers: HashMap::new(),
            concurrency: 4,
            batch: 100,
            backoff: Backoff::default(),
            poll_interval: Duration::from_secs(1),
            critical: HashSet::new(),
            cancel_exhausted: false,
        }
    }

    /// Handles `event_type` with `handler`. Its errors follow the crate's [`HandlerError`]
    /// convention: a transient failure or a bug marks the message failed, retried on the backoff
    /// schedule while retries remain (a bug is logged as an error); a permanent failure marks it
    /// failed and cancels it at once, except for critical types, which stay failed for an
    /// operator.
    pub fn handle<F, Fut>(mut self, event_type: impl Into<String>, handler: F) -> Self
    where
        F: Fn(MessageRecord) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        self.handlers.insert(
            event_type.into(),
            Arc::new(move |record| Box::pin(handler(record))),
        );
        self
    }

    /// At most `n` handlers run at once.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Rows looked at per round.
    pub fn batch_size(mut self, n: u32) -> Self {
        self.batch = n.max(1);
        self
    }

    /// When failed messages are retried.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long an idle worker waits between rounds.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Cancels messages that used up their retries, except critical types.
    pub fn cancel_exhausted(mut self) -> Self {
        self.cancel_exhausted = true;
        self
    }

    /// Marks `event_type` critical: never cancelled automatically (payments, refunds, stock).
    pub fn critical(mut self, event_type: impl Into<String>) -> Self {
        self.critical.insert(event_type.into());
        self
    }

    /// One round: pending and due messages of the handled types are claimed one by one (the
    /// seed's guarded UPDATE; only the worker whose update changed the row runs it), handled
    /// with bounded concurrency, and marked.
    pub async fn run_once(&self) -> Result<WorkerReport, Error> {
        let mut candidates = self.store.pending(self.batch).await?;
        candidates.extend(self.store.due_retries(self.batch).await?);
        candidates.retain(|m| self.handlers.contains_key(&m.event_type));
        let mut report = WorkerReport::default();
        let mut claimed = Vec::new();
        for record in candidates {
            if self.store.claim(&record).await? {
                claimed.push(record);
            } else {
                report.lost_claims += 1;
            }
        }
        report.claimed = claimed.len();
        let results: Vec<(MessageRecord, Result<(), HandlerError>)> =
            futures_util::stream::iter(claimed)
                .map(|record| {
                    let handler = Arc::clone(&self.handlers[&record.event_type]);
                    async move {
                        let outcome = handler(record.clone()).await;
                        (record, outcome)
                    }
                })
                .buffer_unordered(self.concurrency)
                .collect()
                .await;
        for (record, outcome) in results {
            match outcome {
                Ok(()) => {
                    if self.store.succeed(record.id).await? {
                        report.succeeded += 1;
                        count(&record, "succeeded");
                    }
                }
                Err(error) => {
                    if let HandlerError::Bug(_) = &error {
                        tracing::error!(event_no = %record.event_no, %error, "message handler reported a bug; retried on the backoff schedule");
                    }
                    let failures = u32::try_from(record.retry_count).unwrap_or(0) + 1;
                    self.store
                        .fail(record.id, error.message(), self.backoff.delay(failures))
                        .await?;
                    report.failed += 1;
                    count(&record, "failed");
                    let exhausted = i64::from(failures) >= i64::from(record.max_retry_count);
                    let critical = self.critical.contains(&record.event_type);
                    let cancelled = match error {
                        HandlerError::Permanent(_) if !critical => {
                            self.store
                                .cancel_failed(
                                    record.id,
                                    "the handler reported a permanent failure",
                                )
                                .await?
                        }
                        _ if exhausted && self.cancel_exhausted && !critical => {
                            self.store
                                .cancel_exhausted(
                                    record.id,
                                    "exceeded the maximum retry count; cancelled automatically",
                                )
                                .await?
                        }
                        _ => false,
                    };
                    if cancelled {
                        report.cancelled += 1;
                        count(&record, "cancelled");
                    }
                }
            }
        }
        Ok(report)
    }

    /// Runs rounds until `shutdown` completes; the round in flight is finished first. Database
    /// errors are logged and retried after the poll interval.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> WorkerReport {
        let mut total = WorkerReport::default();
        tokio::pin!(shutdown);
        loop {
            match self.run_once().await {
                Ok(report) => {
                    total.claimed += report.claimed;
                    total.succeeded += report.succeeded;
                    total.failed += report.failed;
                    total.cancelled += report.cancelled;
                    total.lost_claims += report.lost_claims;
                    if report.claimed > 0 {
                        tokio::select! {
                            biased;
                            () = &mut shutdown => return total,
                            () = std::future::ready(()) => continue,
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %Chain(&e), "message worker round failed; retrying")
                }
            }
            tokio::select! {
                () = &mut shutdown => return total,
                () = tokio::time::sleep(self.poll_interval) => {}
            }
        }
    }
}

impl<DB: Backend> Clone for MessageWorker<DB> {
    fn clone(&self) -> Self {
        MessageWorker {
            store: self.store.clone(),
            handlers: self.handlers.clone(),
            concurrency: self.concurrency,
            batch: self.batch,
            backoff: self.backoff.clone(),
            poll_interval: self.poll_interval,
            critical: self.critical.clone(),
            cancel_exhausted: self.cancel_exhausted,
        }
    }
}

/// Counts one of the worker's outcomes for `record` (see [`metrics`](crate::metrics)).
fn count(record: &MessageRecord, outcome: &'static str) {
    ::metrics::counter!(
        crate::metrics::MESSAGE_PROCESSED,
        "biz_type" => record.biz_type.clone(),
        "outcome" => outcome
    )
    .increment(1);
}
