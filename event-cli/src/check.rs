//! Thresholds for cron jobs and probes: `eventctl outbox|messages|quarantine check`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::output;

/// The thresholds of a table of work (the outbox, the message table): `--max-oldest-pending`,
/// `--max-pending`, `--max-failed`, `--max-stuck`.
#[derive(Debug, Clone, Args)]
pub(crate) struct BacklogLimits {
    /// Crossed when the oldest pending row has waited longer than this (e.g. 5m).
    #[arg(long, value_parser = crate::args::duration)]
    max_oldest_pending: Option<Duration>,
    /// Crossed when more rows than this are pending.
    #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
    max_pending: Option<i64>,
    /// Crossed when more rows than this are failed.
    #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
    max_failed: Option<i64>,
    /// Crossed when more rows than this are stuck: held by a lease that expired (outbox), in
    /// progress past --stuck-after (messages).
    #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
    max_stuck: Option<i64>,
}

/// What a backlog's health sample read.
pub(crate) struct Backlog {
    pub(crate) oldest_pending_seconds: Option<i64>,
    pub(crate) pending: i64,
    pub(crate) failed: i64,
    pub(crate) stuck: i64,
    /// How stuck rows are named in the report.
    pub(crate) stuck_name: &'static str,
}

impl BacklogLimits {
    /// Checks `backlog` against the limits given and reports as [`report`] does.
    pub(crate) fn report(
        &self,
        backlog: &Backlog,
        health: &impl serde::Serialize,
        json: bool,
    ) -> anyhow::Result<ExitCode> {
        let oldest = backlog.oldest_pending_seconds.unwrap_or(0);
        report(
            vec![
                self.max_oldest_pending
                    .map(|l| Threshold::age("oldest pending age (s)", oldest, l)),
                self.max_pending
                    .map(|l| Threshold::count("pending", backlog.pending, l)),
                self.max_failed
                    .map(|l| Threshold::count("failed", backlog.failed, l)),
                self.max_stuck
                    .map(|l| Threshold::count(backlog.stuck_name, backlog.stuck, l)),
            ],
            health,
            json,
            "--max-oldest-pending, --max-pending, --max-failed, --max-stuck",
        )
    }
}

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
