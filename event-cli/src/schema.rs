//! `eventctl schema ...`: the compatibility checker on schema files.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};
use event_core::schema::{self, Mode, Report};
use serde_json::Value;

/// `eventctl schema diff`.
#[derive(Debug, Args)]
pub(crate) struct DiffArgs {
    /// The schema readers know now.
    old: PathBuf,
    /// The proposed schema.
    new: PathBuf,
    /// Which readers must keep working: backward (new readers, old data), forward, full.
    #[arg(long, default_value = "backward", value_parser = parse_mode)]
    mode: Mode,
    /// The rule set: strict is Confluent Schema Registry's JSON-schema rules.
    #[arg(long, value_enum, default_value_t = Profile::Strict)]
    profile: Profile,
    /// text for people, json for tools.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Profile {
    /// Confluent Schema Registry's strict JSON-schema rules.
    Strict,
    /// serde's semantics: writers closed, readers open unless additionalProperties is false,
    /// integer formats as ranges.
    Serde,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Format {
    /// Aligned lines for people.
    Text,
    /// One JSON document.
    Json,
}

fn parse_mode(text: &str) -> Result<Mode, String> {
    Mode::parse(text).ok_or_else(|| {
        format!("unknown mode `{text}`: use backward, forward, full, or their _transitive forms, or none")
    })
}

fn read_schema(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// Exit 0 compatible, 1 incompatible; errors (exit 2) are returned.
pub(crate) fn diff(args: DiffArgs) -> anyhow::Result<ExitCode> {
    let old = read_schema(&args.old)?;
    let new = read_schema(&args.new)?;
    let profile = match args.profile {
        Profile::Strict => schema::Profile::Strict,
        Profile::Serde => schema::Profile::Serde,
    };
    let report = schema::check_with(&old, &new, args.mode, profile)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| {
            format!(
                "cannot compare {} with {}",
                args.old.display(),
                args.new.display()
            )
        })?;
    match args.format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "compatible": report.is_compatible(),
                "mode": report.mode,
                "findings": report.findings,
            }))?
        ),
        Format::Text => print_text(&report),
    }
    Ok(if report.is_compatible() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn print_text(report: &Report) {
    let breaking: Vec<_> = report.breaking().collect();
    if breaking.is_empty() {
        println!(
            "compatible ({:?}): {} change(s), none breaks readers",
            report.mode,
            report.findings.len()
        );
    } else {
        println!(
            "incompatible ({:?}): {} change(s) break readers",
            report.mode,
            breaking.len()
        );
    }
    for finding in &report.findings {
        let verdict = match finding.breaks {
            Some(schema::Direction::Backward) => "breaks new readers of old data",
            Some(schema::Direction::Forward) => "breaks old readers of new data",
            None => "compatible",
        };
        let values = match (&finding.old, &finding.new) {
            (Some(o), Some(n)) if o != n => format!(" ({} -> {})", short(o), short(n)),
            (Some(o), None) => format!(" (was {})", short(o)),
            (None, Some(n)) => format!(" (now {})", short(n)),
            _ => String::new(),
        };
        println!(
            "  {:<55} {}{}: {verdict}",
            finding.rule.name(),
            finding.pointer,
            values
        );
    }
    if !breaking.is_empty() {
        println!("to fix: {}", event_core_action());
    }
}

fn event_core_action() -> &'static str {
    "bump the event version and register an upcaster from the previous version, or publish the change as a new event type"
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 60 {
        format!("{}...", text.chars().take(57).collect::<String>())
    } else {
        text
    }
}
