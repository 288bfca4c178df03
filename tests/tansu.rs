//! Tansu, a Kafka-protocol broker, run by a test on ports of its own: the binary
//! `.ci/kafka-broker` installs (`EVENT_TEST_TANSU_BIN` names another), and a guard that kills
//! the broker when the test ends, however it ends.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The Tansu binary, if it is installed.
pub fn bin() -> Option<PathBuf> {
    let path = std::env::var_os("EVENT_TEST_TANSU_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(cache.join("event-toolkit/tansu-0.6.0/tansu"))
        })?;
    path.exists().then_some(path)
}

pub use crate::background::Process;

/// Tansu with memory storage listening on `port` and telling clients to connect to
/// `advertised` (a fault proxy in front of it, say).
pub fn in_memory(bin: &PathBuf, port: u16, advertised: u16) -> Process {
    Process(
        Command::new(bin)
            .args(["broker", "--storage-engine", "memory://tansu/"])
            .args(["--listener-url", &format!("tcp://127.0.0.1:{port}")])
            .args([
                "--advertised-listener-url",
                &format!("tcp://127.0.0.1:{advertised}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start Tansu"),
    )
}
