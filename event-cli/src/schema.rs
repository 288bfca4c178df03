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

/// `eventctl schema check`.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The snapshot directory, holding DIR/EVENT_TYPE/vN.json.
    #[arg(long, default_value = "schemas")]
    dir: PathBuf,
    /// Also fail when a snapshot that existed at this git revision was removed or edited in a
    /// breaking way.
    #[arg(long, value_name = "GIT_REV")]
    against: Option<String>,
}

/// Exit 0 when every snapshot holds, 1 when one does not, 2 when one cannot be read or is not a
/// schema; other errors (exit 2) are returned.
pub(crate) fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    use event_core::schema::snapshot;
    if !args.dir.is_dir() {
        anyhow::bail!(
            "{} is not a directory of snapshots (<dir>/<EVENT_TYPE>/v<N>.json)",
            args.dir.display()
        );
    }
    let mut report = snapshot::check_dir(&args.dir);
    if let Some(rev) = &args.against {
        for (path, before) in snapshots_at(&args.dir, rev)? {
            report.checked += 1;
            report
                .problems
                .extend(snapshot::check_unchanged(&path, &before));
        }
    }
    print!("{report}");
    Ok(if report.has_unreadable() {
        ExitCode::from(2)
    } else if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The snapshot files under `dir` at git revision `rev`, with their content then.
fn snapshots_at(dir: &Path, rev: &str) -> anyhow::Result<Vec<(PathBuf, Value)>> {
    let git = |args: &[&str]| -> anyhow::Result<String> {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .context("cannot run git")?;
        if !out.status.success() {
            anyhow::bail!(
                "git {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    git(&[
        "rev-parse",
        "--verify",
        "--quiet",
        &format!("{rev}^{{commit}}"),
    ])
    .map_err(|_| anyhow::anyhow!("`{rev}` is not a git revision here"))?;
    let root = PathBuf::from(git(&["rev-parse", "--show-toplevel"])?.trim());
    let mut out = Vec::new();
    for file in git(&["ls-tree", "-r", "--name-only", "--full-tree", rev])?.lines() {
        let path = root.join(file);
        let inside = path
            .strip_prefix(&root)
            .ok()
            .zip(
                std::fs::canonicalize(dir)
                    .ok()
                    .and_then(|d| d.strip_prefix(&root).ok().map(Path::to_path_buf)),
            )
            .is_some_and(|(file, dir)| file.starts_with(&dir));
        let is_snapshot = path.extension().is_some_and(|e| e == "json")
            && path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('v'));
        if inside && is_snapshot {
            let text = git(&["show", &format!("{rev}:{file}")])?;
            let before = serde_json::from_str(&text)
                .with_context(|| format!("{file} at {rev} is not JSON"))?;
            out.push((path, before));
        }
    }
    Ok(out)
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

/// `eventctl schema asyncapi`.
#[derive(Debug, clap::Args)]
pub(crate) struct AsyncApiArgs {
    /// The snapshot directory, holding DIR/EVENT_TYPE/vN.json: every version of every event.
    #[arg(long, default_value = "schemas")]
    dir: PathBuf,
    /// The service's name, the document's title.
    #[arg(long)]
    title: String,
    /// The service's version, the document's `info.version`.
    #[arg(long, default_value = "1.0.0")]
    service_version: String,
    /// The broker: nats, amqp (RabbitMQ) or kafka.
    #[arg(long, default_value = "nats", value_parser = |s: &str| s.parse::<event_sqlx::asyncapi::Protocol>())]
    protocol: event_sqlx::asyncapi::Protocol,
    /// The wire format the relay publishes (`eventctl relay --format`): envelope, binary or
    /// structured.
    #[arg(long, default_value = "envelope", value_parser = |s: &str| s.parse::<event_sqlx::WireFormat>().map_err(|e| e.to_string()))]
    format: event_sqlx::WireFormat,
    /// A route, as the outbox has it: EVENT_TYPE=TOPIC or EVENT_TYPE=TOPIC:ROUTING_KEY (repeat
    /// for more). Event types without one take the default route (`<aggregate>.event`, the
    /// type in lowercase with dots).
    #[arg(long, value_name = "EVENT_TYPE=TOPIC[:KEY]")]
    route: Vec<String>,
    /// The broker's address, `host:port`, written as the document's server.
    #[arg(long)]
    server: Option<String>,
    /// Write the document to this file instead of standard output.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Writes the AsyncAPI document of the snapshots; exit 0, or 2 on bad input.
pub(crate) fn asyncapi(args: AsyncApiArgs) -> anyhow::Result<ExitCode> {
    use event_sqlx::asyncapi::AsyncApi;
    if !args.dir.is_dir() {
        anyhow::bail!(
            "{} is not a directory of snapshots (<dir>/<EVENT_TYPE>/v<N>.json)",
            args.dir.display()
        );
    }
    let mut config = event_sqlx::OutboxConfig::new();
    for route in &args.route {
        let Some((event_type, target)) = route.split_once('=') else {
            anyhow::bail!(
                "--route {route}: write EVENT_TYPE=TOPIC or EVENT_TYPE=TOPIC:ROUTING_KEY"
            );
        };
        let route = match target.split_once(':') {
            Some((topic, key)) => event_sqlx::Route::topic(topic).routing_key(key),
            None => event_sqlx::Route::topic(target),
        };
        config = config.route(event_type, route);
    }
    let mut document = AsyncApi::new(&args.title, &args.service_version)
        .protocol(args.protocol)
        .format(args.format)
        .snapshots(&args.dir);
    if let Some(server) = &args.server {
        document = document.server(server);
    }
    let document = document.document(&config)?;
    let text = serde_json::to_string_pretty(&document)? + "\n";
    match args.out {
        Some(path) => std::fs::write(&path, text)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?,
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}
