//! Relays running on tasks of their own, stopped by the test.

use event_sqlx::{Backend, BatchReport, Publisher, Relay};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Runs `relay` on a task of its own until the returned sender is used or dropped; the task
/// gives back what the run did.
pub fn relay<DB: Backend, P: Publisher + 'static>(
    relay: Relay<DB, P>,
) -> (oneshot::Sender<()>, JoinHandle<BatchReport>)
where
    Relay<DB, P>: Send + Sync + 'static,
{
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    (stop, task)
}
