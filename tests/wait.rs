//! Waiting for another process, a broker or a database: a condition polled under a deadline,
//! never a sleep that hopes enough time has passed.

use std::time::Duration;

/// Polls `check` every 10 ms until it returns `Ok`, and returns that value. When `timeout`
/// passes first, the test fails with the last `Err`, which says what was seen instead.
pub async fn until<T>(timeout: Duration, mut check: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let seen = match check().await {
            Ok(done) => return done,
            Err(seen) => seen,
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up after {timeout:?}: {seen}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
