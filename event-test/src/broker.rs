//! A broker in memory behind the [`Publisher`] trait, with faults on demand.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use event_sqlx::{OutboxMessage, PublishError, Publisher};

/// A broker in memory: every message the relay publishes to it is accepted (the relay then
/// marks it published) and queued for each consumer of the [`Harness`](crate::Harness), as
/// separate durable subscriptions to one stream would be. Clones share one broker.
///
/// Its faults apply to the next messages published, in the order they were asked for:
///
/// ```
/// let broker = event_test::MemoryBroker::new();
/// broker.reject_next(2);          // a refusal: counts as a failed attempt, retried with backoff
/// broker.unavailable_next(1);     // an outage: given back, the attempt not counted
/// broker.duplicate_next(1);       // accepted, and delivered twice to every consumer
/// broker.crash_relay_after_next_publish(); // accepted, then the relay dies before its mark
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryBroker {
    state: Arc<Mutex<State>>,
    crashed: Arc<tokio::sync::Notify>,
}

#[derive(Debug, Default)]
struct State {
    published: Vec<OutboxMessage>,
    queues: Vec<VecDeque<Delivery>>,
    faults: VecDeque<(Fault, u64)>,
    crash_after_publish: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Reject,
    Unavailable,
    Duplicate,
}

/// A message queued for one consumer.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub(crate) message: OutboxMessage,
    pub(crate) body: Vec<u8>,
}

impl MemoryBroker {
    /// An empty broker.
    pub fn new() -> MemoryBroker {
        MemoryBroker::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Refuses the next `n` messages ([`PublishError::new`]): each counts as a failed attempt
    /// of its event, retried with the relay's backoff while retries remain.
    pub fn reject_next(&self, n: u64) -> &Self {
        self.state().faults.push_back((Fault::Reject, n));
        self
    }

    /// Answers the next `n` messages as unreachable ([`PublishError::unavailable`]): the relay
    /// gives them back unpublished, their attempt not counted.
    pub fn unavailable_next(&self, n: u64) -> &Self {
        self.state().faults.push_back((Fault::Unavailable, n));
        self
    }

    /// Delivers each of the next `n` messages twice to every consumer, as a broker redelivering
    /// after a lost acknowledgement does.
    pub fn duplicate_next(&self, n: u64) -> &Self {
        self.state().faults.push_back((Fault::Duplicate, n));
        self
    }

    /// Accepts the next batch the relay publishes, then stops the relay before it marks the
    /// batch published, as a relay process killed at that moment: its events stay leased
    /// until the lease expires, then are recovered and published again. The harness replaces
    /// the dead relay with a new one (a new instance id).
    pub fn crash_relay_after_next_publish(&self) -> &Self {
        self.state().crash_after_publish = true;
        self
    }

    /// Every message accepted so far, in order: republishes and duplicates included.
    pub fn published(&self) -> Vec<OutboxMessage> {
        self.state().published.clone()
    }

    /// How many faults asked for are still to happen.
    pub fn faults_left(&self) -> u64 {
        let state = self.state();
        state.faults.iter().map(|(_, n)| n).sum::<u64>() + u64::from(state.crash_after_publish)
    }

    pub(crate) fn subscribe(&self) -> usize {
        let mut state = self.state();
        state.queues.push(VecDeque::new());
        state.queues.len() - 1
    }

    pub(crate) fn take(&self, queue: usize, max: usize) -> Vec<Delivery> {
        let mut state = self.state();
        let Some(queue) = state.queues.get_mut(queue) else {
            return Vec::new();
        };
        let n = queue.len().min(max);
        queue.drain(..n).collect()
    }

    /// Puts deliveries back: at the front (not acknowledged, delivered again next) or at the
    /// back (given back to wait, after what is queued).
    pub(crate) fn give_back(&self, queue: usize, deliveries: Vec<Delivery>, front: bool) {
        let mut state = self.state();
        if let Some(queue) = state.queues.get_mut(queue) {
            if front {
                for delivery in deliveries.into_iter().rev() {
                    queue.push_front(delivery);
                }
            } else {
                queue.extend(deliveries);
            }
        }
    }

    pub(crate) fn queued(&self, queue: usize) -> Vec<Delivery> {
        self.state()
            .queues
            .get(queue)
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Completes once a relay crashed in a publish ([`MemoryBroker::crash_relay_after_next_publish`]).
    pub(crate) async fn relay_crashed(&self) {
        self.crashed.notified().await;
    }

    fn next_fault(state: &mut State) -> Option<Fault> {
        while let Some((_, 0)) = state.faults.front() {
            state.faults.pop_front();
        }
        let (fault, left) = state.faults.front_mut()?;
        let fault = *fault;
        *left = left.saturating_sub(1);
        if *left == 0 {
            state.faults.pop_front();
        }
        Some(fault)
    }

    fn accept(&self, messages: &[OutboxMessage]) -> (Vec<Result<(), PublishError>>, bool) {
        let mut state = self.state();
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            let fault = MemoryBroker::next_fault(&mut state);
            match fault {
                Some(Fault::Reject) => {
                    results.push(Err(PublishError::new(
                        "refused by the test broker (MemoryBroker::reject_next)",
                    )));
                    continue;
                }
                Some(Fault::Unavailable) => {
                    results.push(Err(PublishError::unavailable(
                        "the test broker is unavailable",
                        "MemoryBroker::unavailable_next",
                    )));
                    continue;
                }
                Some(Fault::Duplicate) | None => {}
            }
            let body = match serde_json::to_vec(&message.envelope) {
                Ok(body) => body,
                Err(e) => {
                    results.push(Err(PublishError::with_source(
                        "cannot serialize the envelope",
                        e,
                    )));
                    continue;
                }
            };
            let copies = if fault == Some(Fault::Duplicate) {
                2
            } else {
                1
            };
            state.published.push(message.clone());
            for queue in &mut state.queues {
                for _ in 0..copies {
                    queue.push_back(Delivery {
                        message: message.clone(),
                        body: body.clone(),
                    });
                }
            }
            results.push(Ok(()));
        }
        let crash = std::mem::take(&mut state.crash_after_publish);
        (results, crash)
    }
}

impl Publisher for MemoryBroker {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let (results, crash) = self.accept(messages);
        if crash {
            self.crashed.notify_one();
            // The relay process is dead: it never learns the outcome.
            std::future::pending::<()>().await;
        }
        results
    }
}
