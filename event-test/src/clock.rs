//! The one clock a test moves.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use event_sqlx::{Clock, ManualClock};

/// A clock that stands still until the test moves it, and that moves itself when the code
/// under test waits on it.
///
/// Give it to the outbox, the relay (through the outbox), the consumers and the message store:
/// they all read one time, so that [`TestClock::advance`] makes retries due, leases expire and
/// events old enough for retention at once. A consumer's pause between transient retries
/// ([`Clock::sleep`]) moves this clock by the pause and returns at once, as tokio's paused time
/// would: a handler that fails twice costs no real time.
///
/// Clones share one time.
///
/// ```
/// use std::time::Duration;
/// use event_sqlx::Clock;
/// use event_test::TestClock;
///
/// let clock = TestClock::new();
/// let start = clock.now();
/// clock.advance(Duration::from_secs(90));
/// assert_eq!((clock.now() - start).num_seconds(), 90);
/// ```
#[derive(Debug, Clone)]
pub struct TestClock {
    inner: ManualClock,
}

impl TestClock {
    /// A clock showing the system's time now, rounded up to the next second: times the tests
    /// compute from it are whole seconds, and events stamped with the system's time while the
    /// test starts are not in the clock's future.
    pub fn new() -> TestClock {
        let now = Utc::now();
        let start = now
            .duration_trunc(TimeDelta::seconds(1))
            .map_or(now, |second| second + TimeDelta::seconds(1));
        TestClock::starting_at(start)
    }

    /// A clock showing `start`.
    pub fn starting_at(start: DateTime<Utc>) -> TestClock {
        TestClock {
            inner: ManualClock::new(start),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.inner.advance(by);
    }

    /// Sets the clock to `to`, if that is later than now: time does not go back.
    pub fn advance_to(&self, to: DateTime<Utc>) {
        if to > self.inner.now() {
            self.inner.set(to);
        }
    }
}

impl Default for TestClock {
    fn default() -> Self {
        TestClock::new()
    }
}

impl Clock for TestClock {
    fn now(&self) -> DateTime<Utc> {
        self.inner.now()
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        self.inner.advance(duration);
        Box::pin(std::future::ready(()))
    }
}
