//! Schema evolution: a compatibility checker for JSON schemas (draft-07 and 2020-12) whose rules
//! follow Confluent Schema Registry's JSON-schema diff, so that `eventctl schema diff` agrees with
//! it on Confluent's own examples.
//!
//! ```
//! use event_core::schema::{check, Mode};
//! use serde_json::json;
//!
//! let v1 = json!({"type": "object", "properties": {"amount": {"type": "integer"}}, "additionalProperties": false});
//! let v2 = json!({"type": "object", "properties": {"amount": {"type": "string"}}, "additionalProperties": false});
//! let report = check(&v1, &v2, Mode::Backward)?;
//! assert!(!report.is_compatible());
//! assert_eq!(report.findings[0].rule.name(), "TYPE_CHANGED");
//! assert_eq!(report.findings[0].pointer, "#/properties/amount");
//! # Ok::<(), event_core::schema::SchemaError>(())
//! ```

mod diff;
mod model;
mod rule;
pub mod snapshot;
mod validate;

use serde::Serialize;
use serde_json::Value;

/// Nesting deeper than this is rejected: no real schema comes close, and it bounds recursion.
pub const MAX_DEPTH: usize = 64;
pub use rule::Rule;
pub use snapshot::{SnapshotReport, assert_snapshots, check_snapshots};

use diff::Comparer;
use model::Graph;

/// Which readers must keep working.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Mode {
    /// No check.
    None,
    /// Readers on the new schema read data written with the old one (consumers upgrade first).
    Backward,
    /// Readers on the old schema read data written with the new one (producers upgrade first).
    Forward,
    /// Both.
    Full,
    /// Backward against every earlier version.
    BackwardTransitive,
    /// Forward against every earlier version.
    ForwardTransitive,
    /// Full against every earlier version.
    FullTransitive,
}

impl Mode {
    /// Parses `backward`, `FORWARD_TRANSITIVE`, ... (case and `-`/`_` insensitive).
    pub fn parse(text: &str) -> Option<Mode> {
        Some(match text.to_ascii_uppercase().replace('-', "_").as_str() {
            "NONE" => Mode::None,
            "BACKWARD" => Mode::Backward,
            "FORWARD" => Mode::Forward,
            "FULL" => Mode::Full,
            "BACKWARD_TRANSITIVE" => Mode::BackwardTransitive,
            "FORWARD_TRANSITIVE" => Mode::ForwardTransitive,
            "FULL_TRANSITIVE" => Mode::FullTransitive,
            _ => return None,
        })
    }

    fn directions(self) -> &'static [Direction] {
        match self {
            Mode::None => &[],
            Mode::Backward | Mode::BackwardTransitive => &[Direction::Backward],
            Mode::Forward | Mode::ForwardTransitive => &[Direction::Forward],
            Mode::Full | Mode::FullTransitive => &[Direction::Backward, Direction::Forward],
        }
    }
}

/// The rule set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// Confluent Schema Registry's strict JSON-schema rules: a schema without
    /// `additionalProperties: false` may carry any other property, so adding one is a break.
    /// The default for raw schema files.
    #[default]
    Strict,
    /// What serde does: a writer emits only the fields its struct declares, a reader ignores
    /// unknown fields unless `additionalProperties: false` (`deny_unknown_fields`), and integer
    /// formats are the ranges of their Rust types (`u32` -> `u64` widens). The default for the
    /// snapshots of derived events.
    Serde,
}

impl Profile {
    /// Parses `strict` or `serde`.
    pub fn parse(text: &str) -> Option<Profile> {
        match text.to_ascii_lowercase().as_str() {
            "strict" => Some(Profile::Strict),
            "serde" => Some(Profile::Serde),
            _ => None,
        }
    }
}

/// Which readers a change breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// New readers, old data.
    Backward,
    /// Old readers, new data.
    Forward,
}

/// One change found, with where it is, what it was and what to do.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// The rule, e.g. `PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL`.
    #[serde(serialize_with = "rule_name")]
    pub rule: Rule,
    /// Where, as a JSON pointer into the schema.
    pub pointer: String,
    /// Which readers it breaks; `None` when it breaks none.
    pub breaks: Option<Direction>,
    /// The old schema's value at the pointer, when there is one.
    pub old: Option<Value>,
    /// The new schema's value at the pointer, when there is one.
    pub new: Option<Value>,
    /// What to do about it, when it breaks readers.
    pub action: Option<&'static str>,
}

fn rule_name<S: serde::Serializer>(rule: &Rule, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(rule.name())
}

/// The outcome of a check.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The mode checked.
    pub mode: Mode,
    /// Every change found; the breaking ones have `breaks` set.
    pub findings: Vec<Finding>,
}

impl Report {
    /// True when no finding breaks readers.
    pub fn is_compatible(&self) -> bool {
        self.findings.iter().all(|f| f.breaks.is_none())
    }

    /// The findings that break readers.
    pub fn breaking(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.breaks.is_some())
    }
}

/// Why a schema could not be checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// A value where a schema belongs is not a schema.
    #[error("{pointer} is {found}, not a schema: a schema is a JSON object or a boolean")]
    NotASchema {
        /// Where.
        pointer: String,
        /// What was found.
        found: &'static str,
    },
    /// A keyword's value has the wrong shape.
    #[error("{pointer} {problem}")]
    BadKeyword {
        /// Where.
        pointer: String,
        /// What is wrong.
        problem: String,
    },
    /// A `$ref` does not point into the document.
    #[error(
        "{pointer}: $ref `{reference}` does not resolve: only JSON pointers into the same document (#/definitions/.., #/$defs/..) are supported"
    )]
    UnresolvedRef {
        /// The reference.
        reference: String,
        /// Where it is.
        pointer: String,
    },
    /// Comparing the schemas takes more work than the checker allows: a crafted or runaway
    /// schema.
    #[error(
        "schema too complex to check: comparing it took more than {limit} steps; split shared definitions, enums or anyOf/oneOf lists, or check it by hand"
    )]
    TooComplex {
        /// The work limit.
        limit: u64,
    },
    /// Schemas nest deeper than [`MAX_DEPTH`].
    #[error("{pointer}: the schema nests deeper than {limit} levels, the supported limit")]
    TooDeep {
        /// Where the limit was passed.
        pointer: String,
        /// The limit.
        limit: usize,
    },
}

const ACTION: &str = "bump the event version and register an upcaster from the previous version, or publish the change as a new event type";

/// The raw changes from `old` to `new` as Confluent's diff computes them: the rule, and whether a
/// reader on `new` still reads data written with `old`.
pub fn changes(old: &Value, new: &Value) -> Result<Vec<(Rule, String)>, SchemaError> {
    let old = Graph::load(old, Profile::Strict)?;
    let new = Graph::load(new, Profile::Strict)?;
    Ok(Comparer::new(&old, &new, Profile::Strict)
        .changes()?
        .into_iter()
        .map(|c| (c.rule, c.path))
        .collect())
}

/// Checks `new` against `old` in `mode` under the strict profile (a transitive mode checks this
/// one pair; use [`check_history`] for a version history).
pub fn check(old: &Value, new: &Value, mode: Mode) -> Result<Report, SchemaError> {
    check_with(old, new, mode, Profile::Strict)
}

/// Checks `new` against `old` in `mode` under `profile`.
pub fn check_with(
    old: &Value,
    new: &Value,
    mode: Mode,
    profile: Profile,
) -> Result<Report, SchemaError> {
    let old_graph = Graph::load(old, profile)?;
    let new_graph = Graph::load(new, profile)?;
    let mut findings = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for &direction in mode.directions() {
        let found = match direction {
            Direction::Backward => Comparer::new(&old_graph, &new_graph, profile).changes()?,
            Direction::Forward => Comparer::new(&new_graph, &old_graph, profile).changes()?,
        };
        for change in found {
            let (before, after) = match direction {
                Direction::Backward => (old, new),
                Direction::Forward => (new, old),
            };
            let breaks = (!change.rule.is_compatible()).then_some(direction);
            let finding = Finding {
                rule: change.rule,
                old: value_at(before, &change.path),
                new: value_at(after, &change.path),
                pointer: change.path,
                breaks,
                action: breaks.map(|_| ACTION),
            };
            // In FULL mode a compatible change shows up from both sides; keep one.
            if seen.insert((finding.rule, finding.pointer.clone(), finding.breaks)) {
                findings.push(finding);
            }
        }
    }
    Ok(Report { mode, findings })
}

/// Checks the newest of `history` (oldest first) against the versions `mode` names: the one
/// before it, or every earlier one for the transitive modes.
pub fn check_history(
    history: &[Value],
    mode: Mode,
    profile: Profile,
) -> Result<Report, SchemaError> {
    let Some((newest, earlier)) = history.split_last() else {
        return Ok(Report {
            mode,
            findings: Vec::new(),
        });
    };
    let against: Vec<&Value> = match mode {
        Mode::BackwardTransitive | Mode::ForwardTransitive | Mode::FullTransitive => {
            earlier.iter().collect()
        }
        _ => earlier.last().into_iter().collect(),
    };
    let mut findings = Vec::new();
    for old in against {
        findings.extend(check_with(old, newest, mode, profile)?.findings);
    }
    Ok(Report { mode, findings })
}

/// The value of a finding's pointer in a schema, best effort (the pointer follows the schema's
/// structure, so it usually names a keyword that is there).
fn value_at(document: &Value, pointer: &str) -> Option<Value> {
    let mut current = document;
    for segment in pointer
        .trim_start_matches('#')
        .split('/')
        .filter(|s| !s.is_empty())
    {
        current = match current {
            Value::Object(map) => map.get(segment)?,
            Value::Array(list) => list.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(current.clone())
}
