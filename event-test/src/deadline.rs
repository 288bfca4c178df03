//! A deadline in real time that tokio's paused clock does not move.

use std::sync::mpsc;
use std::time::Duration;

use tokio::sync::watch;

/// Passes `after` a span of real time: a thread waits for it (or for the deadline to be
/// dropped, whichever comes first) and then wakes whoever awaits [`Deadline::expired`].
pub(crate) struct Deadline {
    passed: watch::Receiver<bool>,
    _cancel: mpsc::Sender<()>,
}

impl Deadline {
    pub(crate) fn start(after: Duration) -> Deadline {
        let (cancel, cancelled) = mpsc::channel::<()>();
        let (pass, passed) = watch::channel(false);
        // Without a thread there is no deadline; the step budget still bounds the work.
        let _ = std::thread::Builder::new()
            .name("event-test-deadline".into())
            .spawn(move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = cancelled.recv_timeout(after) {
                    let _ = pass.send(true);
                }
            });
        Deadline {
            passed,
            _cancel: cancel,
        }
    }

    /// Completes when the deadline passed; never if it cannot.
    pub(crate) async fn expired(&self) {
        let mut passed = self.passed.clone();
        if passed.wait_for(|passed| *passed).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
