//! CPU time spent on the benchmark's path, from the kernel's per-process accounting in
//! `/proc`: the database server, the broker and this process (relays, consumers and producers
//! run in it). CPU seconds per 1,000 events vary less than rates on a shared machine, since they
//! do not count the time a process waited for a core.

use std::collections::BTreeMap;

use serde::Serialize;

/// The processes counted, by their command name (`/proc/<pid>/comm`).
const DATABASES: [&str; 3] = ["postgres", "mariadbd", "mysqld"];
const BROKERS: [&str; 5] = [
    "nats-server",
    "beam.smp",
    "erl_child_setup",
    "epmd",
    "tansu",
];

/// CPU seconds each group of processes has used so far.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot(BTreeMap<&'static str, f64>);

impl Snapshot {
    /// Reads every process's user and system time, with that of its children that ended (a
    /// database backend that exits during the run is counted in its parent's).
    pub(crate) fn take() -> Snapshot {
        let ticks = clock_ticks();
        let me = std::process::id().to_string();
        let mut groups = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Snapshot(groups);
        };
        for entry in entries.flatten() {
            let pid = entry.file_name();
            let Some(pid) = pid
                .to_str()
                .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some((name, seconds)) = parse_stat(&stat, ticks) else {
                continue;
            };
            let group = if pid == me {
                "toolkit"
            } else if DATABASES.contains(&name) {
                "database"
            } else if BROKERS.contains(&name) {
                "broker"
            } else {
                continue;
            };
            *groups.entry(group).or_insert(0.0) += seconds;
        }
        Snapshot(groups)
    }

    /// CPU seconds per 1,000 `events` since `earlier`.
    pub(crate) fn per_thousand_since(&self, earlier: &Snapshot, events: usize) -> PerThousand {
        let used = |group: &str| {
            let now = self.0.get(group).copied().unwrap_or(0.0);
            let then = earlier.0.get(group).copied().unwrap_or(0.0);
            (now - then).max(0.0) * 1000.0 / events.max(1) as f64
        };
        let (database, broker, toolkit) = (used("database"), used("broker"), used("toolkit"));
        PerThousand {
            database,
            broker,
            toolkit,
            total: database + broker + toolkit,
        }
    }
}

/// CPU seconds per 1,000 events, by process group.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct PerThousand {
    pub(crate) database: f64,
    pub(crate) broker: f64,
    pub(crate) toolkit: f64,
    pub(crate) total: f64,
}

/// The command name and CPU seconds (utime + stime + cutime + cstime) of one `/proc/<pid>/stat`.
fn parse_stat(stat: &str, ticks: f64) -> Option<(&str, f64)> {
    // `pid (comm) state ppid ...`: the name may hold spaces and parentheses, so it ends at the
    // last ')'.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?;
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // After the name: state is field 3 of the line, utime 14 ... cstime 17.
    let time = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let total = time(14)? + time(15)? + time(16)? + time(17)?;
    Some((name, total as f64 / ticks))
}

/// The unit of `/proc/<pid>/stat`'s times, in ticks per second (`getconf CLK_TCK`; 100 on
/// Linux's common architectures).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|&ticks| ticks > 0.0)
            .unwrap_or(100.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_four_times_after_a_name_with_spaces() {
        let line = "42 (a (b) c) S 1 42 42 0 -1 4194560 10 0 0 0 150 50 7 3 20 0 1 0";
        let (name, seconds) = parse_stat(line, 100.0).unwrap();
        assert_eq!(name, "a (b) c");
        assert!((seconds - 2.1).abs() < 1e-9, "{seconds}");
        assert!(parse_stat("42 (x) S 1", 100.0).is_none());
    }

    #[test]
    fn this_process_is_counted() {
        let before = Snapshot::take();
        // Busy for a fifth of a second of wall time: at least a few ticks of CPU time.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        let used = Snapshot::take().per_thousand_since(&before, 1000);
        assert!(used.toolkit > 0.0, "{used:?}");
        assert!(used.total >= used.toolkit, "{used:?}");
    }
}
