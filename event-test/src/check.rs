//! What every recorded or published payload goes through: a serde round trip, the event's
//! derived schema and its committed snapshot. And the JSON matching and diffs the assertions
//! print.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use event_core::EventEnvelope;
use serde_json::Value;

/// Where the committed schema snapshots are: `EVENT_SNAPSHOT_DIR` or `schemas`, under the
/// crate being tested, as the derive reads them.
pub(crate) fn default_snapshot_dir() -> PathBuf {
    under_crate(
        std::env::var_os("EVENT_SNAPSHOT_DIR")
            .map_or_else(|| PathBuf::from("schemas"), PathBuf::from),
    )
}

/// `dir` taken from the crate being tested when it is relative.
pub(crate) fn under_crate(dir: PathBuf) -> PathBuf {
    match std::env::var_os("CARGO_MANIFEST_DIR") {
        Some(root) if dir.is_relative() => PathBuf::from(root).join(dir),
        _ => dir,
    }
}

/// Checks payloads against their event's schema and snapshot, compiling each schema once.
#[derive(Default)]
pub(crate) struct PayloadChecks {
    dir: Option<PathBuf>,
    validators: HashMap<(String, u32), Vec<(String, jsonschema::Validator)>>,
}

impl PayloadChecks {
    pub(crate) fn new(dir: Option<PathBuf>) -> PayloadChecks {
        PayloadChecks {
            dir,
            validators: HashMap::new(),
        }
    }

    /// What is wrong with `envelope`'s payload, one line per problem.
    pub(crate) fn problems(&mut self, envelope: &EventEnvelope) -> Vec<String> {
        let mut problems = Vec::new();
        let Some(registration) = event_core::registered_events()
            .find(|r| r.event_type == envelope.event_type && r.version == envelope.event_version)
        else {
            problems.push(format!(
                "{} v{} is not a derived event in this program: derive DomainEvent for it, or record the version the derive declares",
                envelope.event_type, envelope.event_version
            ));
            return problems;
        };
        match (registration.roundtrip)(&envelope.payload) {
            Ok(back) if back == envelope.payload => {}
            Ok(back) => problems.push(format!(
                "the payload of {} changes on a serde round trip (a field skipped, renamed or defaulted on one side):\n{}",
                envelope.event_id,
                diff(&pretty(&envelope.payload), &pretty(&back), "recorded", "read back")
            )),
            Err(e) => problems.push(format!("the payload of {} {e}", envelope.event_id)),
        }
        let key = (envelope.event_type.clone(), envelope.event_version);
        if !self.validators.contains_key(&key) {
            let mut validators = Vec::new();
            match jsonschema::validator_for(&(registration.schema)()) {
                Ok(v) => validators.push((
                    format!("the schema derived for {}", registration.rust_type),
                    v,
                )),
                Err(e) => problems.push(format!(
                    "the derived schema of {} does not compile: {e}",
                    registration.rust_type
                )),
            }
            if let Some(dir) = &self.dir {
                let path = event_core::schema::snapshot::snapshot_path(dir, &key.0, key.1);
                if path.is_file() {
                    match event_core::schema::snapshot::read_snapshot(&path) {
                        Ok(snapshot) => match jsonschema::validator_for(&snapshot) {
                            Ok(v) => validators.push((format!("the snapshot {}", shown(&path)), v)),
                            Err(e) => problems.push(format!(
                                "the snapshot {} does not compile as a JSON schema: {e}",
                                shown(&path)
                            )),
                        },
                        Err(e) => problems.push(format!("{e}")),
                    }
                }
            }
            self.validators.insert(key.clone(), validators);
        }
        for (name, validator) in self.validators.get(&key).into_iter().flatten() {
            for error in validator.iter_errors(&envelope.payload).take(10) {
                let at = error.instance_path().to_string();
                problems.push(format!(
                    "the payload of {} does not match {name}: at `{}`: {error}",
                    envelope.event_id,
                    if at.is_empty() { "/" } else { &at }
                ));
            }
        }
        problems
    }
}

fn shown(path: &Path) -> String {
    match std::env::var_os("CARGO_MANIFEST_DIR") {
        Some(root) => path
            .strip_prefix(root)
            .unwrap_or(path)
            .display()
            .to_string(),
        None => path.display().to_string(),
    }
}

/// Where `actual` differs from `expected`, which it must contain: every key of an expected
/// object present with a matching value, arrays element by element, other values equal.
/// Returns the JSON pointer of the first difference and what differs.
pub(crate) fn contains(actual: &Value, expected: &Value) -> Result<(), String> {
    fn walk(actual: &Value, expected: &Value, at: &mut String) -> Result<(), String> {
        match (expected, actual) {
            (Value::Object(want), Value::Object(have)) => {
                for (key, want) in want {
                    let len = at.len();
                    let _ = write!(at, "/{}", key.replace('~', "~0").replace('/', "~1"));
                    match have.get(key) {
                        Some(have) => walk(have, want, at)?,
                        None => return Err(format!("`{at}` is missing")),
                    }
                    at.truncate(len);
                }
                Ok(())
            }
            (Value::Array(want), Value::Array(have)) => {
                if want.len() != have.len() {
                    return Err(format!(
                        "`{}` has {} elements, expected {}",
                        if at.is_empty() { "/" } else { at },
                        have.len(),
                        want.len()
                    ));
                }
                for (i, (want, have)) in want.iter().zip(have).enumerate() {
                    let len = at.len();
                    let _ = write!(at, "/{i}");
                    walk(have, want, at)?;
                    at.truncate(len);
                }
                Ok(())
            }
            (want, have) if numbers_equal(want, have) || want == have => Ok(()),
            (want, have) => Err(format!(
                "`{}` is {have}, expected {want}",
                if at.is_empty() { "/" } else { at }
            )),
        }
    }
    walk(actual, expected, &mut String::new())
}

fn numbers_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        _ => false,
    }
}

/// `actual` cut down to the keys `shape` names (recursively into objects), so that a diff
/// against a partial expectation shows only what was asked for.
pub(crate) fn project(actual: &Value, shape: &Value) -> Value {
    match (actual, shape) {
        (Value::Object(have), Value::Object(want)) => Value::Object(
            want.iter()
                .filter_map(|(k, w)| have.get(k).map(|h| (k.clone(), project(h, w))))
                .collect(),
        ),
        (Value::Array(have), Value::Array(want)) if have.len() == want.len() => {
            Value::Array(have.iter().zip(want).map(|(h, w)| project(h, w)).collect())
        }
        _ => actual.clone(),
    }
}

pub(crate) fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    text.push('\n');
    text
}

/// A unified diff of two texts, `-` for `old`, `+` for `new`.
pub(crate) fn diff(old: &str, new: &str, old_name: &str, new_name: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(4)
        .header(old_name, new_name)
        .to_string()
}
