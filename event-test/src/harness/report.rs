//! What a settle returns: [`Settled`], or [`Unsettled`] with every row and message left.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use event_core::EventEnvelope;
use event_sqlx::{EventStatus, OutboxRecord};

use super::settle::after;

/// What [`Harness::settle`](crate::Harness::settle) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settled {
    /// Steps taken: relay batches, consumer batches, worker rounds.
    pub steps: usize,
    /// Events the relay published and marked.
    pub published: usize,
    /// Messages consumers acknowledged (applied, duplicate, ignored, stale, quarantined).
    pub delivered: usize,
    /// Relays that crashed between publish and mark
    /// ([`MemoryBroker::crash_relay_after_next_publish`](crate::MemoryBroker::crash_relay_after_next_publish)).
    pub relay_crashes: usize,
    /// Consumers stopped mid-batch ([`Harness::stop_consumer_mid_batch`](crate::Harness::stop_consumer_mid_batch)).
    pub consumer_stops: usize,
}

/// Why [`Harness::settle`](crate::Harness::settle) stopped before everything settled.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stop {
    /// Nothing more happens at the current time: what is left waits for time to pass, or for
    /// an event that does not come.
    Idle,
    /// The deadline (real time) passed.
    Deadline(Duration),
    /// The step budget ran out.
    Budget(usize),
    /// The relay, a consumer or the worker failed (a consumer's bug, a database error).
    Failed(String),
}

/// A message the broker holds for a consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct Undelivered {
    /// The consumer.
    pub consumer: String,
    /// The message's envelope.
    pub envelope: EventEnvelope,
    /// The sequence it waits for, when the consumer's order guard gave it back.
    pub waits_for: Option<u64>,
}

/// What was left when [`Harness::settle`](crate::Harness::settle) stopped, and why.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Unsettled {
    /// Why it stopped.
    pub stop: Stop,
    /// The harness's time then.
    pub now: DateTime<Utc>,
    /// Outbox rows not yet published: pending, leased, or failed with retries left (at most 100
    /// of each status).
    pub rows: Vec<OutboxRecord>,
    /// Messages not yet delivered.
    pub undelivered: Vec<Undelivered>,
    /// What was running when the deadline passed.
    pub running: Option<String>,
    /// What could not be read about the rest.
    pub problems: Vec<String>,
    /// What was done before it stopped.
    pub progress: Settled,
}

impl Unsettled {
    pub(super) fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.undelivered.is_empty() && self.problems.is_empty()
    }

    /// The next moment something left falls due: a retry, a lease's end; a second from now
    /// for an event given back to wait for its predecessor.
    pub fn next_due(&self) -> Option<DateTime<Utc>> {
        let rows = self.rows.iter().filter_map(|r| match r.publish_status {
            EventStatus::Failed => r.next_retry_time,
            EventStatus::InProgress => r.lock_until,
            _ => None,
        });
        let waiting = self
            .undelivered
            .iter()
            .any(|u| u.waits_for.is_some())
            .then(|| after(self.now, Duration::from_secs(1)));
        rows.chain(waiting).min()
    }
}

impl fmt::Display for Unsettled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = |t: DateTime<Utc>| {
            let secs = (t - self.now).num_milliseconds() as f64 / 1000.0;
            format!("{} ({secs:+} s)", t.format("%H:%M:%S%.3f"))
        };
        match &self.stop {
            Stop::Idle => writeln!(
                f,
                "the pipeline did not settle: nothing more happens at the harness's time {}",
                self.now.format("%H:%M:%S%.3f")
            )?,
            Stop::Deadline(d) => writeln!(
                f,
                "the pipeline did not settle within its deadline of {d:?} (Harness::deadline)"
            )?,
            Stop::Budget(n) => writeln!(
                f,
                "the pipeline did not settle within its step budget of {n} steps (Harness::step_budget): do handlers cause events without end?"
            )?,
            Stop::Failed(why) => writeln!(f, "the pipeline did not settle: {why}")?,
        }
        if let Some(running) = &self.running {
            writeln!(f, "running when it stopped: {running}")?;
        }
        if !self.rows.is_empty() {
            writeln!(f, "outbox rows not published ({}):", self.rows.len())?;
            for r in &self.rows {
                let state = match r.publish_status {
                    EventStatus::Pending => "pending".to_owned(),
                    EventStatus::InProgress => format!(
                        "in progress, leased by {} until {}",
                        r.locked_by.as_deref().unwrap_or("?"),
                        r.lock_until.map_or_else(|| "?".to_owned(), at)
                    ),
                    EventStatus::Failed => format!(
                        "failed {} of {} times, next retry {}",
                        r.retry_count,
                        r.max_retry_count,
                        r.next_retry_time.map_or_else(|| "?".to_owned(), at)
                    ),
                    other => other.name().to_owned(),
                };
                write!(
                    f,
                    "  #{} {} ({} {} #{}): {state}",
                    r.id, r.event_no, r.aggregate_type, r.aggregate_id, r.aggregate_sequence
                )?;
                if let Some(reason) = &r.fail_reason {
                    write!(f, "; last failure: {reason}")?;
                }
                writeln!(f)?;
            }
        }
        if !self.undelivered.is_empty() {
            writeln!(f, "messages not delivered ({}):", self.undelivered.len())?;
            for u in &self.undelivered {
                write!(
                    f,
                    "  to {}: {} ({} {} #{})",
                    u.consumer,
                    u.envelope.event_id,
                    u.envelope.aggregate_type,
                    u.envelope.aggregate_id,
                    u.envelope.aggregate_sequence
                )?;
                if let Some(w) = u.waits_for {
                    write!(f, ", given back to wait for sequence {w}")?;
                }
                writeln!(f)?;
            }
        }
        for problem in &self.problems {
            writeln!(f, "{problem}")?;
        }
        if self.stop == Stop::Idle {
            match self.next_due() {
                Some(due) => write!(
                    f,
                    "the next is due at {}: advance the clock (Harness::advance) or let time pass (Harness::run_for)",
                    at(due)
                )?,
                None => write!(f, "nothing left falls due by itself")?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for Unsettled {}
