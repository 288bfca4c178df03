//! The time every statement binds as `now`: the system's, or one a test moves by hand.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};

/// Where the outbox, the relay, the message store and the inbox read the current time.
///
/// Every time written to a row (`create_time`, `lock_until`, `next_retry_time`, ...) and every
/// time a query compares with (is a retry due, has a lease expired) comes from the clock. Tests
/// replace it with a [`ManualClock`] and move time forward instead of sleeping.
pub trait Clock: Debug + Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;

    /// Waits `duration` on this clock: the pause of a consumer between transient retries.
    /// The system clock (and by default any clock) waits on tokio's timer; a test clock may
    /// move its own time instead and return at once.
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that stands still until it is moved: for tests.
///
/// Clones share one time, so a test keeps a clone and advances the clock that the outbox or
/// relay it configured reads.
///
/// ```
/// use std::time::Duration;
/// use event_sqlx::{Clock, ManualClock};
///
/// let clock = ManualClock::starting_now();
/// let before = clock.now();
/// clock.advance(Duration::from_secs(60));
/// assert_eq!((clock.now() - before).num_seconds(), 60);
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl ManualClock {
    /// A clock showing `start`.
    pub fn new(start: DateTime<Utc>) -> ManualClock {
        ManualClock {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// A clock showing the system's time now.
    pub fn starting_now() -> ManualClock {
        ManualClock::new(Utc::now())
    }

    /// Moves the clock forward by `by` (saturating at the latest representable time).
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = now
            .checked_add_signed(TimeDelta::from_std(by).unwrap_or(TimeDelta::MAX))
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
    }

    /// Sets the clock to `to`.
    pub fn set(&self, to: DateTime<Utc>) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A shared clock, as the stores keep it.
pub(crate) type SharedClock = Arc<dyn Clock>;

/// The system clock, shared.
pub(crate) fn system() -> SharedClock {
    Arc::new(SystemClock)
}

/// `clock`'s time as the tables store it: microseconds, UTC.
pub(crate) fn stored_now(clock: &dyn Clock) -> DateTime<Utc> {
    let now = clock.now();
    now.duration_trunc(TimeDelta::microseconds(1))
        .unwrap_or(now)
}

/// `at + by`, saturating instead of overflowing.
pub(crate) fn after(at: DateTime<Utc>, by: Duration) -> DateTime<Utc> {
    at.checked_add_signed(TimeDelta::from_std(by).unwrap_or(TimeDelta::MAX))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `at - by`, saturating instead of overflowing.
pub(crate) fn before(at: DateTime<Utc>, by: Duration) -> DateTime<Utc> {
    at.checked_sub_signed(TimeDelta::from_std(by).unwrap_or(TimeDelta::MAX))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}
