//! Settling: relay rounds and delivery rounds until nothing is left, time jumps to each next due
//! moment, and the account of what is left when it stops.

use std::time::Duration;

use chrono::{DateTime, Utc};
use event_sqlx::{Backend, Clock, Error, EventStatus, OutboxSearch, Processed, Received};

use crate::broker::Delivery;
use crate::deadline::Deadline;

use super::{Harness, Settled, Stop, Undelivered, Unsettled};

impl<DB: Backend> Harness<DB> {
    /// Runs the relay, the consumers and the workers until nothing is left to do at the
    /// harness's current time: no event pending, leased or due for a retry, no message
    /// undelivered, no handler running, events committed by handlers included.
    ///
    /// Time does not move (see [`Harness::run_for`]): when what is left waits for time (a retry
    /// not yet due, the lease of a crashed relay), for a predecessor that does not come, or the
    /// deadline or the step budget runs out, the error lists it: which rows in which state,
    /// which messages for which consumer, what was running.
    pub async fn settle(&mut self) -> Result<Settled, Unsettled> {
        let deadline = Deadline::start(self.deadline);
        self.settle_until(&deadline, Settled::default()).await
    }

    /// [`Harness::settle`], letting up to `duration` of time pass: whenever what is left waits
    /// for time, the clock jumps to the next moment something is due (a retry, a lease's end)
    /// and the pipeline runs again. A whole backoff schedule or a crashed relay's lease runs out
    /// in milliseconds of real time. It returns once everything settled, the clock at the last
    /// moment something fell due; when what is left falls due after `duration`, the clock
    /// ends `duration` later.
    pub async fn run_for(&mut self, duration: Duration) -> Result<Settled, Unsettled> {
        let end = after(self.clock.now(), duration);
        let deadline = Deadline::start(self.deadline);
        let mut settled = Settled::default();
        loop {
            match self.settle_until(&deadline, settled).await {
                Ok(done) => return Ok(done),
                Err(unsettled) if unsettled.stop == Stop::Idle => {
                    let now = self.clock.now();
                    let next = unsettled
                        .next_due()
                        .map(|at| at.max(after(now, Duration::from_millis(1))));
                    match next {
                        Some(at) if at <= end => {
                            self.clock.advance_to(at);
                            settled = unsettled.progress;
                        }
                        Some(_) => {
                            // Due later than the time given: that time passes, nothing more.
                            self.clock.advance_to(end);
                            return Err(unsettled);
                        }
                        // Nothing falls due by itself: no time needs to pass.
                        None => return Err(unsettled),
                    }
                }
                Err(unsettled) => return Err(unsettled),
            }
        }
    }

    pub(super) async fn settle_until(
        &mut self,
        deadline: &Deadline,
        mut settled: Settled,
    ) -> Result<Settled, Unsettled> {
        loop {
            let mut progressed = false;
            progressed |= self.relay_round(deadline, &mut settled).await?;
            for i in 0..self.consumers.len() {
                progressed |= self.deliver_round(i, deadline, &mut settled).await?;
            }
            for i in 0..self.workers.len() {
                let worker = &self.workers[i];
                let report = tokio::select! {
                    report = worker.run_once() => report,
                    () = deadline.expired() => {
                        return Err(self.unsettled(Stop::Deadline(self.deadline), Some("the message worker".into()), settled).await);
                    }
                };
                settled.steps += 1;
                match report {
                    Ok(report) => progressed |= report.claimed > 0,
                    Err(e) => {
                        return Err(self
                            .unsettled(
                                Stop::Failed(format!("the message worker failed: {}", chain(&e))),
                                None,
                                settled,
                            )
                            .await);
                    }
                }
            }
            if !progressed {
                let left = self.unsettled(Stop::Idle, None, settled).await;
                if left.is_empty() {
                    return Ok(left.progress);
                }
                return Err(left);
            }
            if settled.steps >= self.step_budget {
                return Err(self
                    .unsettled(Stop::Budget(self.step_budget), None, settled)
                    .await);
            }
        }
    }

    /// Recovers expired leases, then publishes batch after batch while the relay claims some.
    pub(super) async fn relay_round(
        &mut self,
        deadline: &Deadline,
        settled: &mut Settled,
    ) -> Result<bool, Unsettled> {
        let mut progressed = false;
        match self.relay.recover_expired_leases().await {
            Ok(n) => progressed |= n > 0,
            Err(e) => {
                return Err(self
                    .unsettled(
                        Stop::Failed(format!("lease recovery failed: {}", chain(&e))),
                        None,
                        *settled,
                    )
                    .await);
            }
        }
        loop {
            let outcome = tokio::select! {
                report = self.relay.run_once() => Some(report),
                () = self.broker.relay_crashed() => None,
                () = deadline.expired() => {
                    let running = format!("relay {} publishing a batch", self.relay.config().instance_id());
                    return Err(self.unsettled(Stop::Deadline(self.deadline), Some(running), *settled).await);
                }
            };
            settled.steps += 1;
            match outcome {
                None => {
                    // The relay died between the broker's ack and its mark.
                    settled.relay_crashes += 1;
                    self.generation += 1;
                    self.relay = self.new_relay();
                    progressed = true;
                }
                Some(Ok(report)) => {
                    if report.claimed == 0 {
                        return Ok(progressed);
                    }
                    settled.published += report.published;
                    progressed = true;
                }
                Some(Err(Error::BrokerUnavailable { .. })) => {
                    // Given back unpublished; the fault is spent, the next claim goes on.
                    progressed = true;
                }
                Some(Err(e)) => {
                    return Err(self
                        .unsettled(
                            Stop::Failed(format!("the relay failed: {}", chain(&e))),
                            None,
                            *settled,
                        )
                        .await);
                }
            }
            if settled.steps >= self.step_budget {
                return Err(self
                    .unsettled(Stop::Budget(self.step_budget), None, *settled)
                    .await);
            }
        }
    }

    /// Delivers one batch of consumer `i`'s queue. Early events go back to the end of the
    /// queue; on an error the batch goes back unacknowledged.
    pub(super) async fn deliver_round(
        &mut self,
        i: usize,
        deadline: &Deadline,
        settled: &mut Settled,
    ) -> Result<bool, Unsettled> {
        let queue = self.consumers[i].queue;
        let mut batch = self.broker.take(queue, self.batch);
        if batch.is_empty() {
            return Ok(false);
        }
        let stop_after = self.consumers[i].stop_after.take();
        let processed_part = stop_after.map_or(batch.len(), |k| k.min(batch.len()));
        let outcome = {
            let subscribed = &self.consumers[i];
            let received: Vec<Received<'_>> = batch[..processed_part]
                .iter()
                .map(|d| Received {
                    body: &d.body,
                    message_id: Some(&d.message.message_id),
                })
                .collect();
            tokio::select! {
                outcome = subscribed.consumer.receive(&received) => Some(outcome),
                () = deadline.expired() => None,
            }
        };
        settled.steps += 1;
        let name = self.consumers[i].consumer.name().to_owned();
        let outcomes = match outcome {
            None => {
                let ids: Vec<String> = batch
                    .iter()
                    .map(|d| d.message.envelope.event_id.to_string())
                    .collect();
                self.broker.give_back(queue, batch, true);
                let running = format!("consumer {name} handling {}", ids.join(", "));
                return Err(self
                    .unsettled(Stop::Deadline(self.deadline), Some(running), *settled)
                    .await);
            }
            Some(Err(e)) => {
                self.broker.give_back(queue, batch, true);
                return Err(self
                    .unsettled(
                        Stop::Failed(format!("consumer {name} stopped: {}", chain(&e))),
                        None,
                        *settled,
                    )
                    .await);
            }
            Some(Ok(outcomes)) => outcomes,
        };
        let mut progressed = false;
        let mut early: Vec<Delivery> = Vec::new();
        let subscribed = &mut self.consumers[i];
        for (delivery, processed) in batch[..processed_part].iter().zip(outcomes) {
            if let Processed::Early { .. } = processed {
                if stop_after.is_none() {
                    early.push(delivery.clone());
                }
                subscribed
                    .received
                    .push((delivery.message.envelope.clone(), processed));
                continue;
            }
            progressed = true;
            settled.delivered += 1;
            subscribed
                .received
                .push((delivery.message.envelope.clone(), processed));
        }
        if stop_after.is_some() {
            // Stopped before acknowledging: the whole batch is delivered again.
            settled.consumer_stops += 1;
            self.broker
                .give_back(queue, std::mem::take(&mut batch), true);
            return Ok(true);
        }
        self.broker.give_back(queue, early, false);
        Ok(progressed)
    }

    /// What is left: outbox rows not yet published, messages not yet delivered.
    pub(super) async fn unsettled(
        &self,
        stop: Stop,
        running: Option<String>,
        progress: Settled,
    ) -> Unsettled {
        let mut rows = Vec::new();
        let mut problems = Vec::new();
        for status in [
            EventStatus::Pending,
            EventStatus::InProgress,
            EventStatus::Failed,
        ] {
            match self
                .outbox
                .search(&OutboxSearch::default().status(status), 100)
                .await
            {
                Ok(found) => rows.extend(found.into_iter().filter(|r| {
                    r.publish_status != EventStatus::Failed || r.retry_count < r.max_retry_count
                })),
                Err(e) => problems.push(format!("could not read the outbox: {}", chain(&e))),
            }
        }
        rows.sort_by_key(|r| r.id);
        let mut undelivered = Vec::new();
        for subscribed in &self.consumers {
            for delivery in self.broker.queued(subscribed.queue) {
                let waits_for = subscribed
                    .received
                    .iter()
                    .rev()
                    .find(|(e, _)| e.event_id == delivery.message.envelope.event_id)
                    .and_then(|(_, p)| match p {
                        Processed::Early { waits_for } => Some(*waits_for),
                        _ => None,
                    });
                undelivered.push(Undelivered {
                    consumer: subscribed.consumer.name().to_owned(),
                    envelope: delivery.message.envelope,
                    waits_for,
                });
            }
        }
        Unsettled {
            stop,
            now: self.clock.now(),
            rows,
            undelivered,
            running,
            problems,
            progress,
        }
    }
}

pub(super) fn after(at: DateTime<Utc>, by: Duration) -> DateTime<Utc> {
    chrono::TimeDelta::from_std(by)
        .ok()
        .and_then(|by| at.checked_add_signed(by))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

pub(super) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
