//! Child processes kept running the way a service manager would: started again whenever they
//! exit (killed by the nemesis, or stopped by an error), until the run stops them.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::process::Command;

use crate::services::signal_group;

/// How a process is started.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) name: String,
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) log: PathBuf,
}

/// A supervised process.
#[derive(Debug)]
pub(crate) struct Supervised {
    pub(crate) name: String,
    pid: Arc<AtomicU32>,
    stopping: Arc<AtomicBool>,
    starts: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Supervised {
    /// Starts `spec` and keeps it running.
    pub(crate) fn start(spec: Spec) -> Supervised {
        let pid = Arc::new(AtomicU32::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let starts = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(keep_running(
            spec.clone(),
            Arc::clone(&pid),
            Arc::clone(&stopping),
            Arc::clone(&starts),
        ));
        Supervised {
            name: spec.name,
            pid,
            stopping,
            starts,
            task,
        }
    }

    /// Sends `signal` to the process (its group), if it runs.
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.pid.load(Ordering::SeqCst);
        if pid != 0 {
            signal_group(pid, signal);
        }
    }

    /// How many times it was started.
    pub(crate) fn starts(&self) -> usize {
        self.starts.load(Ordering::SeqCst)
    }

    /// Stops it: SIGCONT (it may be paused), SIGTERM, then SIGKILL after `grace`.
    pub(crate) async fn stop(mut self, grace: Duration) {
        self.stopping.store(true, Ordering::SeqCst);
        self.signal("CONT");
        self.signal("TERM");
        let deadline = tokio::time::Instant::now() + grace;
        while self.pid.load(Ordering::SeqCst) != 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.signal("KILL");
        let _ = (&mut self.task).await;
    }
}

impl Drop for Supervised {
    /// A run that ends early (an error, SIGINT) leaves no process behind.
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.signal("CONT");
        self.signal("KILL");
    }
}

async fn keep_running(
    spec: Spec,
    pid: Arc<AtomicU32>,
    stopping: Arc<AtomicBool>,
    starts: Arc<AtomicUsize>,
) {
    while !stopping.load(Ordering::SeqCst) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log);
        let (out, err) = match log.and_then(|log| Ok((log.try_clone()?, log))) {
            Ok((out, err)) => (Stdio::from(out), Stdio::from(err)),
            Err(_) => (Stdio::null(), Stdio::null()),
        };
        let child = Command::new(&spec.program)
            .args(&spec.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(true)
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) => {
                eprintln!("campaign: cannot start {}: {e}", spec.name);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        starts.fetch_add(1, Ordering::SeqCst);
        pid.store(child.id().unwrap_or(0), Ordering::SeqCst);
        let _ = child.wait().await;
        pid.store(0, Ordering::SeqCst);
        if stopping.load(Ordering::SeqCst) {
            break;
        }
        // A service manager's restart delay.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
