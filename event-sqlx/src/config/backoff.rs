//! When failed work is tried again: a schedule of delays with jitter.

use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

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

/// When a retry is due, for tests and tools: `failed_at` plus the schedule's delay.
pub fn due_after(failed_at: DateTime<Utc>, backoff: &Backoff, failures: u32) -> DateTime<Utc> {
    crate::clock::after(failed_at, backoff.delay(failures))
}
