//! Relays on tasks of their own and processes that the test stops, however it ends.

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

/// A child process killed (and waited for) when dropped: when the test ends, however it ends.
#[derive(Debug)]
pub struct Process(pub std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
