//! Thresholds for cron jobs and probes: `eventctl outbox|messages|quarantine check`.

use std::process::ExitCode;
use std::time::Duration;

use crate::output;

/// One threshold: a value read from the database and the most it may be.
pub(crate) struct Threshold {
    name: &'static str,
    value: i64,
    limit: i64,
    shown: String,
}

impl Threshold {
    /// `value` may be at most `limit`.
    pub(crate) fn count(name: &'static str, value: i64, limit: i64) -> Threshold {
        Threshold {
            name,
            value,
            limit,
            shown: limit.to_string(),
        }
    }

    /// An age in seconds that may be at most `limit`.
    pub(crate) fn age(name: &'static str, seconds: i64, limit: Duration) -> Threshold {
        Threshold {
            name,
            value: seconds,
            limit: i64::try_from(limit.as_secs()).unwrap_or(i64::MAX),
            shown: humantime::format_duration(limit).to_string(),
        }
    }

    fn holds(&self) -> bool {
        self.value <= self.limit
    }
}

/// Prints one line per threshold (or JSON with `health` beside them) and returns exit 0 when
/// every one holds, 1 when one is crossed. No threshold at all is bad input: `flags` names them.
pub(crate) fn report(
    thresholds: Vec<Option<Threshold>>,
    health: &impl serde::Serialize,
    json: bool,
    flags: &str,
) -> anyhow::Result<ExitCode> {
    let checks: Vec<Threshold> = thresholds.into_iter().flatten().collect();
    if checks.is_empty() {
        anyhow::bail!("nothing to check: give at least one of {flags}");
    }
    let healthy = checks.iter().all(Threshold::holds);
    if json {
        let list: Vec<serde_json::Value> = checks
            .iter()
            .map(|c| {
                serde_json::json!({ "check": c.name, "value": c.value, "limit": c.limit, "ok": c.holds() })
            })
            .collect();
        output::json(&serde_json::json!({
            "healthy": healthy,
            "health": health,
            "checks": list,
        }))?;
    } else {
        for c in &checks {
            let verdict = if c.holds() { "ok  " } else { "FAIL" };
            println!("{verdict} {}: {} (at most {})", c.name, c.value, c.shown);
        }
    }
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
