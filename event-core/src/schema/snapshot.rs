//! Snapshots: each released version of each event's schema, kept as
//! `schemas/<EVENT_TYPE>/v<N>.json` in the application's repository, and the check that the
//! code still honours them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Finding, Mode, Profile, SchemaError, check_with};
use crate::{EventRegistration, Upcasters, registered_events};

/// The header key written into every snapshot.
pub const HEADER: &str = "x-event-snapshot";
/// Set to `record` to write missing snapshots (never when `CI` is set).
pub const RECORD_VAR: &str = "EVENT_SNAPSHOTS";

/// What the check found wrong.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Problem {
    /// A registered version has no snapshot.
    Missing {
        /// The event type.
        event_type: String,
        /// The version.
        version: u32,
        /// Where it belongs.
        path: PathBuf,
        /// Why it was not recorded.
        why_not_recorded: &'static str,
    },
    /// The code's schema changed under a released version in a way that is not FULL compatible.
    ChangedUnderSameVersion {
        /// The event type.
        event_type: String,
        /// The version.
        version: u32,
        /// The breaking findings.
        findings: Vec<Finding>,
    },
    /// The newest version breaks its compatibility mode against an earlier version, and no
    /// upcaster covers the gap.
    BreaksEarlierVersion {
        /// The event type.
        event_type: String,
        /// The newest version.
        version: u32,
        /// The earlier version it breaks.
        earlier: u32,
        /// The mode.
        mode: Mode,
        /// The breaking findings.
        findings: Vec<Finding>,
    },
    /// Two Rust types claim the same event type and version.
    Duplicate {
        /// The event type.
        event_type: String,
        /// The version.
        version: u32,
        /// The two types.
        types: (String, String),
    },
    /// A snapshot that existed at the base revision is gone.
    Removed {
        /// The file.
        path: PathBuf,
    },
    /// A snapshot was edited since the base revision in a way its readers notice.
    EditedInPlace {
        /// The file.
        path: PathBuf,
        /// The breaking findings.
        findings: Vec<Finding>,
    },
    /// A snapshot file cannot be read.
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |f: &mut fmt::Formatter<'_>, findings: &[Finding]| -> fmt::Result {
            for finding in findings.iter().filter(|x| x.breaks.is_some()) {
                writeln!(f, "    {} at {}", finding.rule, finding.pointer)?;
            }
            Ok(())
        };
        match self {
            Problem::Missing {
                event_type,
                version,
                path,
                why_not_recorded,
            } => writeln!(
                f,
                "{event_type} v{version}: no snapshot at {}; {why_not_recorded}. Record it with `{RECORD_VAR}=record cargo test`, review it, and commit it",
                path.display()
            ),
            Problem::ChangedUnderSameVersion {
                event_type,
                version,
                findings,
            } => {
                writeln!(
                    f,
                    "{event_type} v{version}: the payload changed under the same version in a way readers of v{version} notice; bump the version (and add an upcaster), or undo the change:"
                )?;
                list(f, findings)
            }
            Problem::BreaksEarlierVersion {
                event_type,
                version,
                earlier,
                mode,
                findings,
            } => {
                writeln!(
                    f,
                    "{event_type} v{version} breaks {mode:?} compatibility with v{earlier}; implement Upcast for v{version} from v{earlier} and register it with event_core::register_upcaster!, or publish the change as a new event type:"
                )?;
                list(f, findings)
            }
            Problem::Duplicate {
                event_type,
                version,
                types,
            } => writeln!(
                f,
                "{event_type} v{version} is derived by both {} and {}: give one of them another version or event type",
                types.0, types.1
            ),
            Problem::Removed { path } => writeln!(
                f,
                "{} was removed: a released version stays readable forever; restore it",
                path.display()
            ),
            Problem::EditedInPlace { path, findings } => {
                writeln!(
                    f,
                    "{} was edited in place in a way readers of that version notice; restore it and release the change as a new version:",
                    path.display()
                )?;
                list(f, findings)
            }
            Problem::Unreadable { path, reason } => writeln!(f, "{}: {reason}", path.display()),
        }
    }
}

/// The outcome of a snapshot check.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SnapshotReport {
    /// Snapshots written by this run.
    pub recorded: Vec<PathBuf>,
    /// Event versions checked.
    pub checked: usize,
    /// What is wrong; empty when all is well.
    pub problems: Vec<Problem>,
}

impl SnapshotReport {
    /// True when nothing is wrong.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// True when a snapshot could not be read or checked at all (bad input, not a
    /// compatibility problem).
    pub fn has_unreadable(&self) -> bool {
        self.problems
            .iter()
            .any(|p| matches!(p, Problem::Unreadable { .. }))
    }
}

impl fmt::Display for SnapshotReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} event versions checked, {} problem(s)",
            self.checked,
            self.problems.len()
        )?;
        for path in &self.recorded {
            writeln!(f, "recorded {}", path.display())?;
        }
        for problem in &self.problems {
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// Checks every event derived in this program against the snapshots in `dir` (relative paths
/// are taken from the crate being tested), panicking with the problems when there are any. The
/// one line for an application's test suite:
///
/// ```no_run
/// #[test]
/// fn event_schemas_are_compatible() {
///     event_core::schema::assert_snapshots("schemas");
/// }
/// ```
#[track_caller]
pub fn assert_snapshots(dir: impl AsRef<Path>) {
    let report = check_snapshots(dir);
    if !report.is_ok() {
        panic!("event schema snapshots:\n{report}");
    }
}

/// Checks every derived event against the snapshots in `dir`, recording missing ones when
/// `EVENT_SNAPSHOTS=record` is set and `CI` is not.
pub fn check_snapshots(dir: impl AsRef<Path>) -> SnapshotReport {
    let dir = dir.as_ref();
    let dir = if dir.is_relative() {
        match std::env::var_os("CARGO_MANIFEST_DIR") {
            Some(root) => PathBuf::from(root).join(dir),
            None => dir.to_path_buf(),
        }
    } else {
        dir.to_path_buf()
    };
    let record = match (std::env::var(RECORD_VAR).as_deref(), std::env::var_os("CI")) {
        (Ok("record"), None) => Record::Yes,
        (Ok("record"), Some(_)) => Record::RefusedInCi,
        _ => Record::No,
    };
    let events: Vec<Registered> = registered_events().map(Registered::from).collect();
    check_registered(&events, &dir, &Upcasters::registered(), record)
}

/// An event version as the check sees it.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct Registered {
    pub event_type: String,
    pub version: u32,
    pub rust_type: String,
    pub compatibility: Mode,
    pub schema: Value,
}

impl From<&EventRegistration> for Registered {
    fn from(r: &EventRegistration) -> Registered {
        Registered {
            event_type: r.event_type.to_owned(),
            version: r.version,
            rust_type: r.rust_type.to_owned(),
            compatibility: Mode::parse(r.compatibility).unwrap_or(Mode::BackwardTransitive),
            schema: (r.schema)(),
        }
    }
}

/// Whether missing snapshots are written.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    Yes,
    No,
    RefusedInCi,
}

/// The check, on explicit inputs.
#[doc(hidden)]
pub fn check_registered(
    events: &[Registered],
    dir: &Path,
    upcasters: &Upcasters,
    record: Record,
) -> SnapshotReport {
    let mut report = SnapshotReport::default();
    let mut by_type: BTreeMap<&str, BTreeMap<u32, &Registered>> = BTreeMap::new();
    for event in events {
        let versions = by_type.entry(event.event_type.as_str()).or_default();
        if let Some(other) = versions.insert(event.version, event)
            && other.rust_type != event.rust_type
        {
            report.problems.push(Problem::Duplicate {
                event_type: event.event_type.clone(),
                version: event.version,
                types: (other.rust_type.clone(), event.rust_type.clone()),
            });
        }
    }
    for (event_type, versions) in by_type {
        let mut history: BTreeMap<u32, Value> = match read_type_dir(&dir.join(event_type)) {
            Ok(history) => history,
            Err(problem) => {
                report.problems.push(problem);
                continue;
            }
        };
        for (&version, event) in &versions {
            report.checked += 1;
            let path = snapshot_path(dir, event_type, version);
            match history.get(&version) {
                Some(snapshot) => {
                    match check_with(snapshot, &event.schema, Mode::Full, Profile::Serde) {
                        Ok(found) if !found.is_compatible() => {
                            report.problems.push(Problem::ChangedUnderSameVersion {
                                event_type: event_type.to_owned(),
                                version,
                                findings: found.findings,
                            })
                        }
                        Ok(_) => {}
                        Err(e) => report.problems.push(unreadable(&path, e)),
                    }
                }
                None if record == Record::Yes => {
                    let upcaster =
                        version > 1 && upcasters.covers(event_type, version - 1, version);
                    match write_snapshot(&path, event, upcaster) {
                        Ok(()) => {
                            report.recorded.push(path);
                            history.insert(version, event.schema.clone());
                        }
                        Err(reason) => report.problems.push(Problem::Unreadable { path, reason }),
                    }
                }
                None => report.problems.push(Problem::Missing {
                    event_type: event_type.to_owned(),
                    version,
                    path,
                    why_not_recorded: if record == Record::RefusedInCi {
                        "nothing is recorded when CI is set"
                    } else {
                        "snapshots are recorded only on request"
                    },
                }),
            }
        }
        // The newest version in code against the earlier versions its mode names.
        if let Some((&newest, event)) = versions.iter().next_back() {
            let earlier: Vec<u32> = history.keys().copied().filter(|&v| v < newest).collect();
            let against: Vec<u32> = match event.compatibility {
                Mode::None => Vec::new(),
                Mode::BackwardTransitive | Mode::ForwardTransitive | Mode::FullTransitive => {
                    earlier
                }
                _ => earlier.last().copied().into_iter().collect(),
            };
            for old in against {
                if upcasters.covers(event_type, old, newest) {
                    continue;
                }
                match check_with(
                    &history[&old],
                    &event.schema,
                    event.compatibility,
                    Profile::Serde,
                ) {
                    Ok(found) if !found.is_compatible() => {
                        report.problems.push(Problem::BreaksEarlierVersion {
                            event_type: event_type.to_owned(),
                            version: newest,
                            earlier: old,
                            mode: event.compatibility,
                            findings: found.findings,
                        })
                    }
                    Ok(_) => {}
                    Err(e) => report
                        .problems
                        .push(unreadable(&snapshot_path(dir, event_type, old), e)),
                }
            }
        }
    }
    report
}

fn unreadable(path: &Path, error: SchemaError) -> Problem {
    Problem::Unreadable {
        path: path.to_path_buf(),
        reason: error.to_string(),
    }
}

/// `dir/<EVENT_TYPE>/v<N>.json`.
pub fn snapshot_path(dir: &Path, event_type: &str, version: u32) -> PathBuf {
    dir.join(event_type).join(format!("v{version}.json"))
}

/// The snapshots of one event type, by version.
pub fn read_type_dir(dir: &Path) -> Result<BTreeMap<u32, Value>, Problem> {
    let mut history = BTreeMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(history),
        Err(e) => {
            return Err(Problem::Unreadable {
                path: dir.to_path_buf(),
                reason: e.to_string(),
            });
        }
    };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    let mut names: BTreeMap<u32, PathBuf> = BTreeMap::new();
    for path in files {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(digits) = name.strip_prefix('v').and_then(|n| n.strip_suffix(".json")) else {
            continue;
        };
        let fail = |reason: String| Problem::Unreadable {
            path: path.clone(),
            reason,
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(fail(
                "is not a snapshot name: name snapshots vN.json, N the event version (1, 2, ...)"
                    .into(),
            ));
        }
        let version = match digits.parse::<u32>() {
            Ok(version) if version >= 1 && !digits.starts_with('0') => version,
            Ok(0) => return Err(fail("version 0 does not exist: versions start at 1".into())),
            Ok(version) => {
                return Err(fail(format!(
                    "write version {version} as v{version}.json, without leading zeros"
                )));
            }
            Err(_) => {
                return Err(fail(format!(
                    "version {digits} is out of range: at most {}",
                    u32::MAX
                )));
            }
        };
        if let Some(other) = names.insert(version, path.clone()) {
            return Err(fail(format!(
                "names version {version}, as {} does: keep one",
                other.display()
            )));
        }
        let schema = read_snapshot(&path)?;
        history.insert(version, schema);
    }
    Ok(history)
}

/// One snapshot file, parsed.
pub fn read_snapshot(path: &Path) -> Result<Value, Problem> {
    let text = std::fs::read_to_string(path).map_err(|e| Problem::Unreadable {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if text.trim().is_empty() {
        return Err(Problem::Unreadable {
            path: path.to_path_buf(),
            reason: "is empty: a snapshot holds the event's JSON schema".into(),
        });
    }
    let value: Value = serde_json::from_str(&text).map_err(|e| Problem::Unreadable {
        path: path.to_path_buf(),
        reason: format!("not JSON: {e}"),
    })?;
    super::validate::validate(&value).map_err(|e| Problem::Unreadable {
        path: path.to_path_buf(),
        reason: format!("not a usable schema: {e}"),
    })?;
    Ok(value)
}

fn write_snapshot(
    path: &Path,
    event: &Registered,
    upcaster_from_previous: bool,
) -> Result<(), String> {
    let mut schema = event.schema.clone();
    if let Value::Object(map) = &mut schema {
        map.insert(
            HEADER.to_owned(),
            json!({
                "eventType": event.event_type,
                "version": event.version,
                "compatibility": event.compatibility,
                "generator": "schemars 1.x, draft 2020-12 (event_core::schema_settings)",
                "profile": "serde",
                "upcasterFromPrevious": upcaster_from_previous,
            }),
        );
    }
    let text = serde_json::to_string_pretty(&schema).map_err(|e| e.to_string())? + "\n";
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    std::fs::write(path, text).map_err(|e| e.to_string())
}

/// The event types of a snapshot directory, by name, with their directories: every
/// subdirectory of `dir`, sorted.
pub fn type_dirs(dir: &Path) -> Result<Vec<(String, PathBuf)>, Problem> {
    let entries = std::fs::read_dir(dir).map_err(|e| Problem::Unreadable {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut types: Vec<(String, PathBuf)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .map(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            (name.to_owned(), p.clone())
        })
        .collect();
    types.sort();
    Ok(types)
}

/// Checks a snapshot directory from the files alone: for each event type, its newest version
/// against the earlier ones its recorded compatibility mode names, skipping versions that
/// recorded upcasters cover.
pub fn check_dir(dir: &Path) -> SnapshotReport {
    let mut report = SnapshotReport::default();
    let types = match type_dirs(dir) {
        Ok(types) => types,
        Err(problem) => {
            report.problems.push(problem);
            return report;
        }
    };
    for (event_type, type_dir) in types {
        let history = match read_type_dir(&type_dir) {
            Ok(history) => history,
            Err(problem) => {
                report.problems.push(problem);
                continue;
            }
        };
        report.checked += history.len();
        let Some((&newest, schema)) = history.iter().next_back() else {
            continue;
        };
        let header = |v: u32, key: &str| {
            history
                .get(&v)
                .and_then(|s| s.get(HEADER))
                .and_then(|h| h.get(key))
                .cloned()
        };
        let mode = header(newest, "compatibility")
            .and_then(|m| m.as_str().and_then(Mode::parse))
            .unwrap_or(Mode::BackwardTransitive);
        let covered = |from: u32| {
            (from + 1..=newest)
                .all(|v| header(v, "upcasterFromPrevious") == Some(Value::Bool(true)))
        };
        let earlier: Vec<u32> = history.keys().copied().filter(|&v| v < newest).collect();
        let against: Vec<u32> = match mode {
            Mode::None => Vec::new(),
            Mode::BackwardTransitive | Mode::ForwardTransitive | Mode::FullTransitive => earlier,
            _ => earlier.last().copied().into_iter().collect(),
        };
        for old in against.into_iter().filter(|&v| !covered(v)) {
            match check_with(&history[&old], schema, mode, Profile::Serde) {
                Ok(found) if !found.is_compatible() => {
                    report.problems.push(Problem::BreaksEarlierVersion {
                        event_type: event_type.clone(),
                        version: newest,
                        earlier: old,
                        mode,
                        findings: found.findings,
                    })
                }
                Ok(_) => {}
                Err(e) => report.problems.push(Problem::Unreadable {
                    path: snapshot_path(dir, &event_type, newest),
                    reason: format!(
                        "cannot be compared with {}: {e}",
                        snapshot_path(dir, &event_type, old).display()
                    ),
                }),
            }
        }
    }
    report
}

/// Compares a snapshot as it was (`before`, e.g. at a git revision) with the file now.
pub fn check_unchanged(path: &Path, before: &Value) -> Option<Problem> {
    if !path.exists() {
        return Some(Problem::Removed {
            path: path.to_path_buf(),
        });
    }
    let now = match read_snapshot(path) {
        Ok(now) => now,
        Err(problem) => return Some(problem),
    };
    match check_with(before, &now, Mode::Full, Profile::Serde) {
        Ok(found) if !found.is_compatible() => Some(Problem::EditedInPlace {
            path: path.to_path_buf(),
            findings: found.findings,
        }),
        Ok(_) => None,
        Err(e) => Some(unreadable(path, e)),
    }
}
