//! Riding out a database or broker that is not answering yet: trying again with a growing
//! pause, up to a deadline, and saying on stderr what is awaited.

use std::time::Duration;

use tokio::time::Instant;

/// A server that accepted the connection and said nothing within the connect timeout: it may
/// be starting, or the network may be holding its packets.
#[derive(Debug)]
pub(crate) struct NoAnswer(pub(crate) Duration);

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no answer within {} (--connect-timeout); is it the database's address, and is the database up?",
            humantime::format_duration(self.0)
        )
    }
}

impl std::error::Error for NoAnswer {}

/// Whether `error` may pass with time: a connection refused, dropped or unanswered, a server
/// starting up or shutting down, an unreachable broker. A login the database or broker refused,
/// an unknown database, a bad option do not.
pub(crate) fn may_pass(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<event_sqlx::Error>()
            .is_some_and(|e| e.is_transient() && !e.is_refused_login())
            || cause
                .downcast_ref::<sqlx::Error>()
                .is_some_and(event_sqlx::Error::is_transient_sqlx)
            || cause.is::<NoAnswer>()
    })
}

/// Runs `attempt` until it succeeds, fails for a reason that does not pass with time, or
/// `max_wait` has gone by (then its last error is returned; at once when `max_wait` is zero).
/// Each failure that may pass is shown on stderr after `who: `, with the pause before the next
/// try (0.1 s, doubling up to 5 s).
pub(crate) async fn retry<T, F, Fut>(
    who: &str,
    max_wait: Duration,
    mut attempt: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let deadline = Instant::now() + max_wait;
    let mut pause = Duration::from_millis(100);
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(e) if may_pass(&e) && Instant::now() + pause < deadline => {
                eprintln!(
                    "{who}: {}; trying again in {} (--max-wait {})",
                    crate::output::chain(&e),
                    humantime::format_duration(pause),
                    humantime::format_duration(max_wait)
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(e) if may_pass(&e) && !max_wait.is_zero() => {
                return Err(e.context(format!(
                    "gave up after trying for {} (--max-wait)",
                    humantime::format_duration(max_wait)
                )));
            }
            Err(e) => return Err(e),
        }
    }
}
