//! What the end-to-end benchmarks share: a committed backlog, and waiting for a consumer to
//! apply it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use event_core::{EventContext, UnitOfWork};
use event_sqlx::Outbox;
use event_tests::fixtures::Order;
use sqlx::Postgres;

/// Waits until the handler's counter `applied` reaches `target` (at most ten minutes); the
/// time since `started`.
pub(crate) async fn until_applied(
    applied: &AtomicUsize,
    target: usize,
    started: Instant,
) -> anyhow::Result<Duration> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while applied.load(Ordering::Relaxed) < target {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} of {target} applied after 10 minutes",
            applied.load(Ordering::Relaxed)
        );
        // Polling the handler's counter, with the deadline above.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(started.elapsed())
}

/// Commits `events` orders in transactions of 1000 before anything runs.
pub(crate) async fn commit_backlog(outbox: &Outbox<Postgres>, events: usize) -> anyhow::Result<()> {
    for chunk in (0..events).collect::<Vec<_>>().chunks(1000) {
        let mut uow = UnitOfWork::new(EventContext::new("bench"));
        for i in chunk {
            uow.collect(
                &mut Order::place(&format!("o{i}"), *i as i64)
                    .map_err(|e| anyhow::anyhow!("{e}"))?,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let _ = outbox.commit(outbox.pool().begin().await?, uow).await?;
    }
    Ok(())
}
