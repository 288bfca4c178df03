//! A batch of messages through a consumer: one transaction for the batch, bisected on failure,
//! in per-aggregate order, and `.on_batch` handlers.

use event_core::EventEnvelope;
use tracing::Instrument;

use crate::error::Error;
use crate::inbox::in_sequence;
use crate::metrics;
use crate::route::{Routes, UnknownEvents};
use crate::sql::dialect::Backend;
use crate::sql::inbox::{self as sql};

use super::{Consumer, Processed, Received, parent_span_id};

/// How a batch transaction ended.
pub(super) enum BatchRun {
    /// Committed: the outcome of each event, in order.
    Committed(Vec<Processed>),
    /// The handler of the event at this index failed; nothing was committed.
    FailedAt(usize),
    /// A batch handler failed on the events in this range (some event of it); nothing was
    /// committed.
    FailedRun(usize, usize),
}

impl<DB: Backend, R: Routes<DB>> Consumer<DB, R> {
    /// Processes a batch of messages in as few transactions as it can, and returns the outcome of
    /// each, in order; acknowledge them all when it returns `Ok`.
    ///
    /// The events are recorded in the inbox with one multi-row insert, which tells which were
    /// consumed before (those are duplicates, their handler does not run); each new event's
    /// handler then runs in order in the same transaction, and one commit ends it. A failing
    /// handler does not poison its batch: the transaction is rolled back, the events before it
    /// are applied again in a batch of their own, the failing one goes down the one-event path
    /// (retried if transient, quarantined if permanent, the consumer stopped if a bug), and the
    /// rest continue in a new batch, so the order of each aggregate's events holds. A database
    /// error on the batch, or a concurrent consumer of the same name on MySQL, falls back to one
    /// event at a time.
    ///
    /// Bodies that are not envelopes, and events no handler takes, are handled one by one as by
    /// [`Consumer::receive`]; so is every event of a consumer that [rejects stale
    /// events](Consumer::reject_stale), whose guard reads the aggregate's last applied sequence
    /// before each event.
    ///
    /// With [`Consumer::concurrency`] above 1 (PostgreSQL), the batch is first split by
    /// aggregate into that many lanes, each applied as above in its own transactions, all at
    /// once; it returns when every lane has ended.
    ///
    /// An event that comes twice in one batch is processed once: the repeat is a
    /// [`Processed::Duplicate`], or [`Processed::Early`] when its first occurrence is (give both
    /// back).
    ///
    /// On `Err` (a bug, or a database down for longer than the retries), do not acknowledge the
    /// batch: what was committed before the error is found a duplicate when delivered again.
    pub async fn receive_batch(&self, messages: &[Received<'_>]) -> Result<Vec<Processed>, Error> {
        if let [one] = messages {
            return Ok(vec![self.receive(one.body, one.message_id).await?]);
        }
        let mut outcomes: Vec<Option<Processed>> = vec![None; messages.len()];
        let mut batch: Vec<(usize, EventEnvelope)> = Vec::with_capacity(messages.len());
        let mut first = std::collections::HashMap::with_capacity(messages.len());
        // The same event again in one batch (a broker delivering it again while the first
        // delivery waited, unprocessed, in the consumer's buffer): each repeat with the index of
        // its first occurrence.
        let mut repeats: Vec<(usize, usize)> = Vec::new();
        for (i, message) in messages.iter().enumerate() {
            match serde_json::from_slice::<EventEnvelope>(message.body) {
                Ok(envelope)
                    if self.batches(&envelope.event_type) && !self.inbox.rejects_stale() =>
                {
                    match first.entry(envelope.event_id.to_string()) {
                        std::collections::hash_map::Entry::Vacant(entry) => {
                            entry.insert(i);
                            batch.push((i, envelope));
                        }
                        std::collections::hash_map::Entry::Occupied(entry) => {
                            repeats.push((i, *entry.get()));
                        }
                    }
                }
                _ => outcomes[i] = Some(self.receive(message.body, message.message_id).await?),
            }
        }
        let span = tracing::info_span!(
            "event.consume_batch",
            consumer = self.name(),
            size = batch.len()
        );
        self.apply_lanes(batch, messages, &mut outcomes)
            .instrument(span)
            .await?;
        // The first occurrence decides: a repeat is a duplicate, unless the first came early.
        // Then the repeat is early too, and given back with it: acknowledging it would, on a
        // broker that acknowledges a message whichever delivery the ack names (JetStream), take
        // the event for done while it was never applied.
        for (i, at) in repeats {
            outcomes[i] = Some(match &outcomes[at] {
                Some(Processed::Early { waits_for }) => Processed::Early {
                    waits_for: *waits_for,
                },
                _ => Processed::Duplicate,
            });
        }
        Ok(outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or(Processed::Ignored))
            .collect())
    }

    /// Applies `batch` in up to [`Consumer::concurrency`] lanes at once, each aggregate's events
    /// in one lane in their order, and returns when every lane has ended. A lane's error is
    /// returned once the others have ended too, so that nothing is left running.
    async fn apply_lanes(
        &self,
        batch: Vec<(usize, EventEnvelope)>,
        messages: &[Received<'_>],
        outcomes: &mut [Option<Processed>],
    ) -> Result<(), Error> {
        // `Consumer::concurrency` leaves 1 where lanes cannot run at once.
        let lanes = self.lanes.min(batch.len());
        if lanes <= 1 {
            return self.apply_batch(&batch, messages, outcomes).await;
        }
        let mut split: Vec<Vec<(usize, EventEnvelope)>> = vec![Vec::new(); lanes];
        for (i, envelope) in batch {
            let lane = lane_of(&envelope, lanes);
            split[lane].push((i, envelope));
        }
        let runs = split
            .iter()
            .filter(|lane| !lane.is_empty())
            .map(|lane| async {
                let mut own = vec![None; messages.len()];
                self.apply_batch(lane, messages, &mut own)
                    .await
                    .map(|()| own)
            });
        let mut failed = None;
        for run in futures_util::future::join_all(runs).await {
            match run {
                Ok(own) => {
                    for (slot, outcome) in outcomes.iter_mut().zip(own) {
                        if outcome.is_some() {
                            *slot = outcome;
                        }
                    }
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Applies `batch` (readable envelopes this consumer handles, with their index in
    /// `messages`), splitting it at each failing event.
    pub(super) async fn apply_batch(
        &self,
        batch: &[(usize, EventEnvelope)],
        messages: &[Received<'_>],
        outcomes: &mut [Option<Processed>],
    ) -> Result<(), Error> {
        let mut rest = batch;
        while !rest.is_empty() {
            let started = std::time::Instant::now();
            let run = match self.try_batch(rest).await {
                Ok(run) => run,
                Err(e) => {
                    tracing::debug!(consumer = self.name(), error = %e, "batch failed on the database; one event at a time");
                    return self.one_by_one(rest, messages, outcomes).await;
                }
            };
            match run {
                BatchRun::Committed(processed) => {
                    self.count_batch(rest, &processed, started);
                    for ((i, _), outcome) in rest.iter().zip(processed) {
                        outcomes[*i] = Some(outcome);
                    }
                    return Ok(());
                }
                BatchRun::FailedRun(a, b) => {
                    let (before, tail) = rest.split_at(a);
                    self.commit_before(before, messages, outcomes, started)
                        .await?;
                    let (run, after) = tail.split_at(b - a);
                    self.bisect(run, messages, outcomes).await?;
                    rest = after;
                }
                BatchRun::FailedAt(k) => {
                    let (before, failing) = rest.split_at(k);
                    self.commit_before(before, messages, outcomes, started)
                        .await?;
                    let (i, _) = &failing[0];
                    let message = &messages[*i];
                    outcomes[*i] = Some(self.receive(message.body, message.message_id).await?);
                    rest = &failing[1..];
                }
            }
        }
        Ok(())
    }

    /// Applies the events before a failure again, as a batch of their own.
    pub(super) async fn commit_before(
        &self,
        before: &[(usize, EventEnvelope)],
        messages: &[Received<'_>],
        outcomes: &mut [Option<Processed>],
        started: std::time::Instant,
    ) -> Result<(), Error> {
        if before.is_empty() {
            return Ok(());
        }
        match self.try_batch(before).await {
            Ok(BatchRun::Committed(processed)) => {
                self.count_batch(before, &processed, started);
                for ((i, _), outcome) in before.iter().zip(processed) {
                    outcomes[*i] = Some(outcome);
                }
                Ok(())
            }
            // Failed on a second run where it passed the first: a handler that is not
            // deterministic, or the database. One at a time, then.
            _ => self.one_by_one(before, messages, outcomes).await,
        }
    }

    /// Isolates the failing event of a batch handler's run: halves, each in its own
    /// transaction, in order, until a failing event is alone; that one takes the one-event path.
    pub(super) async fn bisect(
        &self,
        run: &[(usize, EventEnvelope)],
        messages: &[Received<'_>],
        outcomes: &mut [Option<Processed>],
    ) -> Result<(), Error> {
        // Ranges still to apply, the next one last.
        let mut ranges = vec![(0, run.len())];
        while let Some((lo, hi)) = ranges.pop() {
            let part = &run[lo..hi];
            if part.len() == 1 {
                self.one_by_one(part, messages, outcomes).await?;
                continue;
            }
            let started = std::time::Instant::now();
            match self.try_batch(part).await {
                Ok(BatchRun::Committed(processed)) => {
                    self.count_batch(part, &processed, started);
                    for ((i, _), outcome) in part.iter().zip(processed) {
                        outcomes[*i] = Some(outcome);
                    }
                }
                _ => {
                    let mid = lo + part.len() / 2;
                    ranges.push((mid, hi));
                    ranges.push((lo, mid));
                }
            }
        }
        Ok(())
    }

    /// Whether events of `event_type` go into a batch transaction: those a handler takes, and,
    /// when the order guard is on, those recorded without an effect.
    pub(super) fn batches(&self, event_type: &str) -> bool {
        self.routes.handles(event_type)
            || (self.order.is_some() && self.unknown == UnknownEvents::Ignore)
    }

    /// Which events of a batch the order guard lets through: each aggregate's applied sequence
    /// read once, then carried along the batch. Returns the indices of those ready, and marks
    /// the others early in `processed`; `gaps` gets those applied past a missing predecessor.
    pub(super) async fn order_batch(
        &self,
        tx: &mut DB::Connection,
        envelopes: &[&EventEnvelope],
        processed: &mut [Processed],
        gaps: &mut Vec<(usize, Option<u64>)>,
    ) -> Result<Vec<usize>, sqlx::Error> {
        use std::collections::HashMap;
        let mut aggregates: Vec<(&str, &str)> = envelopes
            .iter()
            .filter(|e| e.aggregate_sequence > 1)
            .map(|e| (e.aggregate_type.as_str(), e.aggregate_id.as_str()))
            .collect();
        aggregates.sort_unstable();
        aggregates.dedup();
        let last = sql::last_applied_sequences::<DB>(
            tx,
            self.inbox.table_name(),
            self.name(),
            &aggregates,
        )
        .await?;
        let mut known: HashMap<(&str, &str), Option<u64>> = HashMap::new();
        let mut ready = Vec::with_capacity(envelopes.len());
        for (k, envelope) in envelopes.iter().enumerate() {
            let check = self.order_check(envelope).unwrap_or_default();
            let aggregate = (
                envelope.aggregate_type.as_str(),
                envelope.aggregate_id.as_str(),
            );
            let known = known.entry(aggregate).or_insert_with(|| {
                last.get(&(aggregate.0.to_owned(), aggregate.1.to_owned()))
                    .and_then(|&last| u64::try_from(last).ok())
                    .max(check.settled)
            });
            let sequence = envelope.aggregate_sequence;
            if in_sequence(envelope, *known) || check.accept_gap {
                if !in_sequence(envelope, *known) {
                    gaps.push((k, *known));
                }
                *known = Some(known.map_or(sequence, |known| known.max(sequence)));
                ready.push(k);
            } else {
                processed[k] = Processed::Early {
                    waits_for: known.map_or(1, |last| last + 1),
                };
            }
        }
        Ok(ready)
    }

    /// One transaction over `batch`: the multi-row inbox insert, then each new event's handler.
    pub(super) async fn try_batch(
        &self,
        batch: &[(usize, EventEnvelope)],
    ) -> Result<BatchRun, sqlx::Error> {
        let mut conn = self.inbox.connection().await?;
        let run = self.try_batch_on(conn.get(), batch).await;
        if run.is_ok() {
            // Committed, or rolled back after a handler failed: the connection is clean.
            self.inbox.give_back(conn);
        } else {
            conn.release();
        }
        run
    }

    /// [`Self::try_batch`] on `conn`.
    async fn try_batch_on(
        &self,
        conn: &mut sqlx::pool::PoolConnection<DB>,
        batch: &[(usize, EventEnvelope)],
    ) -> Result<BatchRun, sqlx::Error> {
        let envelopes: Vec<&EventEnvelope> = batch.iter().map(|(_, e)| e).collect();
        let mut processed = vec![Processed::Duplicate; batch.len()];
        let mut gaps = Vec::new();
        // Without the order guard, which reads before it records, the transaction opens with
        // the inbox insert in one message where it can (every event new, on PostgreSQL).
        if self.order.is_none() {
            let failed = match sql::begin_recording::<DB>(
                conn,
                self.inbox.table_name(),
                self.name(),
                &envelopes,
                self.inbox.now(),
            )
            .await
            {
                Ok(Some(tx)) => {
                    let fresh = (0..envelopes.len()).collect();
                    return self
                        .handle_batch(tx, &envelopes, processed, fresh, gaps)
                        .await;
                }
                Ok(None) => None,
                Err(failed) => Some(failed),
            };
            if let Some(failed) = failed {
                sql::recording_failed::<DB>(conn, failed).await?;
            }
        }
        let mut tx = sqlx::Connection::begin(&mut **conn).await?;
        let ready: Vec<usize> = if self.order.is_some() {
            self.order_batch(&mut tx, &envelopes, &mut processed, &mut gaps)
                .await?
        } else {
            (0..envelopes.len()).collect()
        };
        let to_insert: Vec<&EventEnvelope> = ready.iter().map(|k| envelopes[*k]).collect();
        let new = if to_insert.is_empty() {
            std::collections::HashSet::new()
        } else {
            sql::insert_consumed_batch::<DB>(
                &mut tx,
                self.inbox.table_name(),
                self.name(),
                &to_insert,
                self.inbox.now(),
            )
            .await?
        };
        let fresh = ready
            .into_iter()
            .filter(|k| new.contains(envelopes[*k].event_id.as_str()))
            .collect();
        self.handle_batch(tx, &envelopes, processed, fresh, gaps)
            .await
    }

    /// The rest of [`Self::try_batch_on`], once the new events are recorded in `tx`: each
    /// handler of the `fresh` events (indices into `envelopes`), then the commit.
    async fn handle_batch(
        &self,
        mut tx: sqlx::Transaction<'_, DB>,
        envelopes: &[&EventEnvelope],
        mut processed: Vec<Processed>,
        fresh: Vec<usize>,
        gaps: Vec<(usize, Option<u64>)>,
    ) -> Result<BatchRun, sqlx::Error> {
        let mut at = 0;
        while at < fresh.len() {
            let k = fresh[at];
            let envelope = envelopes[k];
            if !self.routes.handles(&envelope.event_type) {
                // Recorded without an effect, for the order guard.
                processed[k] = Processed::Ignored;
                at += 1;
                continue;
            }
            if self.routes.takes_batches(&envelope.event_type) {
                // The run of new events of this type that follow: one call.
                let mut end = at + 1;
                while end < fresh.len() && envelopes[fresh[end]].event_type == envelope.event_type {
                    end += 1;
                }
                let run: Vec<&EventEnvelope> =
                    fresh[at..end].iter().map(|k| envelopes[*k]).collect();
                let span = tracing::info_span!(
                    "event.consume",
                    consumer = self.name(),
                    event_type = %envelope.event_type,
                    events = run.len(),
                );
                let handled = self
                    .routes
                    .dispatch_batch(&mut tx, &run, &self.upcasters)
                    .instrument(span)
                    .await;
                if handled.is_err() {
                    tx.rollback().await?;
                    return Ok(BatchRun::FailedRun(k, fresh[end - 1] + 1));
                }
                for k in &fresh[at..end] {
                    processed[*k] = Processed::Applied;
                }
                at = end;
                continue;
            }
            let span = tracing::info_span!(
                "event.consume",
                consumer = self.name(),
                event_id = %envelope.event_id,
                event_type = %envelope.event_type,
                trace_id = envelope.trace_id.as_deref().unwrap_or(""),
                parent_id = parent_span_id(envelope).unwrap_or(""),
            );
            let handled = self
                .routes
                .dispatch(&mut tx, envelope, &self.upcasters)
                .instrument(span)
                .await;
            if handled.is_err() {
                tx.rollback().await?;
                return Ok(BatchRun::FailedAt(k));
            }
            processed[k] = Processed::Applied;
            at += 1;
        }
        tx.commit().await?;
        let now = self.inbox.now();
        for (envelope, outcome) in envelopes.iter().zip(&processed) {
            match outcome {
                Processed::Early { .. } => self.waiting.early(envelope, now),
                _ => self.waiting.done(envelope),
            }
        }
        for (k, last_applied) in gaps {
            self.report_gap(envelopes[k], last_applied);
        }
        Ok(BatchRun::Committed(processed))
    }

    pub(super) async fn one_by_one(
        &self,
        batch: &[(usize, EventEnvelope)],
        messages: &[Received<'_>],
        outcomes: &mut [Option<Processed>],
    ) -> Result<(), Error> {
        for (i, _) in batch {
            let message = &messages[*i];
            outcomes[*i] = Some(self.receive(message.body, message.message_id).await?);
        }
        Ok(())
    }

    pub(super) fn count_batch(
        &self,
        batch: &[(usize, EventEnvelope)],
        processed: &[Processed],
        started: std::time::Instant,
    ) {
        for ((_, envelope), outcome) in batch.iter().zip(processed) {
            let labels = [
                ("consumer", self.name().to_owned()),
                ("event_type", envelope.event_type.clone()),
                ("outcome", outcome.name().to_owned()),
            ];
            ::metrics::counter!(metrics::CONSUMER_EVENTS, &labels).increment(1);
        }
        ::metrics::histogram!(metrics::CONSUMER_BATCH_SIZE, "consumer" => self.name().to_owned())
            .record(batch.len() as f64);
        ::metrics::histogram!(metrics::CONSUMER_BATCH_SECONDS, "consumer" => self.name().to_owned())
            .record(started.elapsed().as_secs_f64());
    }
}

/// The lane of an event's aggregate among `lanes`: the same for every event of the aggregate.
fn lane_of(envelope: &EventEnvelope, lanes: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    envelope.aggregate_type.hash(&mut hasher);
    envelope.aggregate_id.hash(&mut hasher);
    (hasher.finish() % lanes as u64) as usize
}
