//! The build-time gate: the derive reads the committed snapshot of its own event type and version
//! (`schemas/<EVENT_TYPE>/v<N>.json`) and reports, as compile errors on the field or attribute
//! at fault, every change it can be sure breaks readers of stored events:
//!
//! - a snapshot property that no field produces any more (after renames, aliases, `skip`);
//! - a new field that payloads written before cannot fill (not `Option`, no `#[serde(default)]`);
//! - a field whose JSON type changed, where the Rust type makes its JSON type certain;
//! - a version with no snapshot below the newest snapshot, or one that leaves a gap.
//!
//! Everything it cannot see (named types, `deny_unknown_fields`, enums, transitive modes,
//! upcasters) is left to the semantic checker, which the snapshot test runs.
//!
//! Where the snapshots are: `schemas/` under the crate's manifest directory; a
//! `#[domain_event(snapshots = "path")]` key relative to the file that holds the derive (as
//! `include_str!` resolves paths); the environment variable `EVENT_SNAPSHOT_DIR`, a path relative
//! to the manifest directory, moves the default, and `EVENT_SNAPSHOT_DIR=off` turns the check off.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use proc_macro2::Span;
use serde_json::Value;
use syn::Type;

use crate::ast::{Event, EventField};
use crate::ctxt::Ctxt;

/// The environment variable that moves the default snapshot directory, or turns the check off.
const DIR_VAR: &str = "EVENT_SNAPSHOT_DIR";
/// A snapshot larger than this is not a payload schema: it is refused, not read into memory.
const MAX_BYTES: u64 = 8 * 1024 * 1024;

/// Compares `event` with its snapshot, recording each finding in `cx`. Returns the snapshot file
/// it read, which the expansion includes so that cargo rebuilds when it changes.
pub(crate) fn check(event: &Event<'_>, cx: &mut Ctxt) -> Option<PathBuf> {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let env = std::env::var(DIR_VAR).ok();
    if env
        .as_deref()
        .is_some_and(|v| v.eq_ignore_ascii_case("off"))
    {
        return None;
    }
    let dir = normalize(&match (&event.snapshots, env) {
        (Some(lit), _) => relative_to_source(lit.span(), &manifest).join(lit.value()),
        (None, Some(path)) => manifest.join(path),
        (None, None) => manifest.join("schemas"),
    });
    let type_dir = dir.join(&event.event_type);
    let shown = |path: &Path| {
        path.strip_prefix(&manifest)
            .unwrap_or(path)
            .display()
            .to_string()
    };
    let versions = versions(&type_dir);
    let version = event.version;
    let at_version = version_span(event);
    let file = type_dir.join(format!("v{version}.json"));
    if !versions.contains(&version) {
        match versions.last() {
            Some(&newest) if newest > version => cx.error_at(
                at_version,
                format!(
                    "{} is at version {version} here, below its newest snapshot v{newest} ({}), and v{version} has no snapshot: a version only goes up. Set version = {} for a new shape (with an upcaster from v{newest}), or record the snapshot of v{version} with `EVENT_SNAPSHOTS=record cargo test`",
                    event.event_type,
                    shown(&type_dir.join(format!("v{newest}.json"))),
                    newest + 1
                ),
            ),
            Some(&newest) if newest + 1 < version => cx.error_at(
                at_version,
                format!(
                    "{} version {version} leaves a gap: the newest snapshot is v{newest} ({}), so v{} was never recorded and stored events could not be upcast through it. Set version = {}, or record the missing versions",
                    event.event_type,
                    shown(&type_dir.join(format!("v{newest}.json"))),
                    newest + 1,
                    newest + 1
                ),
            ),
            // A new event, or the next version: nothing recorded to break.
            _ => {}
        }
        return None;
    }
    let snapshot = match read(&file) {
        Ok(snapshot) => snapshot,
        Err(problem) => {
            cx.error_at(
                event.snapshots.as_ref().map_or_else(|| event.ident.span(), syn::LitStr::span),
                format!(
                    "cannot read the snapshot of {} v{version}, {}: {problem}. Restore it from version control, or record it again with `EVENT_SNAPSHOTS=record cargo test`",
                    event.event_type,
                    shown(&file)
                ),
            );
            return Some(file);
        }
    };
    compare(event, &snapshot, &shown(&file), cx);
    Some(file)
}

/// The directory of the file that holds the derive, where a relative `snapshots` path starts;
/// the manifest directory when the compiler does not say (an editor's macro server).
fn relative_to_source(span: Span, manifest: &Path) -> PathBuf {
    let file = span.unwrap().local_file();
    match file.as_deref().and_then(Path::parent) {
        Some(parent) if parent.is_absolute() => parent.to_path_buf(),
        Some(parent) => manifest.join(parent),
        None => manifest.to_path_buf(),
    }
}

/// `a/b/../c` as `a/c`, without touching the file system, so that messages show plain paths.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The versions recorded in `dir` (`v1.json`, `v2.json`, ...), ascending.
fn versions(dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut versions: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let number = name.strip_prefix('v')?.strip_suffix(".json")?;
            if number.starts_with('0') || !number.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            number.parse().ok()
        })
        .collect();
    versions.sort_unstable();
    versions
}

fn read(file: &Path) -> Result<Value, String> {
    let handle = std::fs::File::open(file).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    handle
        .take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(format!(
            "it is larger than {} MiB, far more than a payload schema",
            MAX_BYTES / 1024 / 1024
        ));
    }
    let value: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("it is not valid JSON ({e})"))?;
    if !value.is_object() {
        return Err("it is not a JSON schema object".to_owned());
    }
    Ok(value)
}

fn version_span(event: &Event<'_>) -> Span {
    event.version_span.unwrap_or_else(|| event.ident.span())
}

/// The findings of one struct against its snapshot.
fn compare(event: &Event<'_>, snapshot: &Value, shown: &str, cx: &mut Ctxt) {
    let properties: BTreeMap<&str, &Value> = match snapshot.get("properties") {
        Some(Value::Object(p)) => p.iter().map(|(k, v)| (k.as_str(), v)).collect(),
        Some(_) => {
            cx.error_at(
                event.snapshots.as_ref().map_or_else(|| event.ident.span(), syn::LitStr::span),
                format!(
                    "the snapshot of {} v{} ({shown}) is not a payload schema: its `properties` is not an object. Restore it from version control, or record it again with `EVENT_SNAPSHOTS=record cargo test`",
                    event.event_type, event.version
                ),
            );
            return;
        }
        // A root that composes or refers to other schemas: only the semantic checker can say
        // which properties it has.
        None if ["$ref", "allOf", "anyOf", "oneOf"]
            .iter()
            .any(|k| snapshot.get(*k).is_some()) =>
        {
            return;
        }
        None => BTreeMap::new(),
    };
    let (event_type, version) = (&event.event_type, event.version);
    let fix = format!(
        "bump the version to {} and add an upcaster from v{version}",
        version + 1
    );
    let read: Vec<&EventField<'_>> = event.fields.iter().filter(|f| !f.serde.skipped).collect();
    let flattened = read.iter().any(|f| f.serde.flatten);

    // Snapshot properties that nothing reads any more. A flattened field may read any of them:
    // the semantic checker judges those.
    if !flattened {
        let produced: BTreeSet<&str> = read
            .iter()
            .flat_map(|f| {
                std::iter::once(f.serde_name.as_str()).chain(f.aliases.iter().map(String::as_str))
            })
            .collect();
        let now: Vec<&str> = read.iter().map(|f| f.serde_name.as_str()).collect();
        for property in properties.keys().filter(|p| !produced.contains(*p)) {
            cx.error_at(
                event.ident.span(),
                format!(
                    "{event_type} v{version}: the snapshot ({shown}) has the property `{property}`, which no field produces any more (the fields are now: {}); stored v{version} events carry it and would lose it. Restore the field, give the field that replaced it #[serde(alias = \"{property}\")], or {fix}",
                    if now.is_empty() { "none".to_owned() } else { now.join(", ") }
                ),
            );
        }
    }

    for field in read.iter().filter(|f| !f.serde.flatten) {
        let old = std::iter::once(field.serde_name.as_str())
            .chain(field.aliases.iter().map(String::as_str))
            .find_map(|name| properties.get(name).map(|schema| (name, *schema)));
        let Some((old_name, old_schema)) = old else {
            // New: stored events do not have it, so it must fill itself in.
            let optional = is_option(field.ty) || field.serde.default || event.serde_default;
            if !optional {
                cx.error_at(
                    field.ident.span(),
                    format!(
                        "{event_type} v{version}: the field `{}` is new and required, but the snapshot ({shown}) has no such property, so stored v{version} events cannot be read. Make it an Option, give it #[serde(default)], or {fix}",
                        field.serde_name
                    ),
                );
            }
            continue;
        };
        if field.serde.custom {
            continue;
        }
        let (Some(now), Some(before)) = (kinds(field.ty), snapshot_kinds(old_schema)) else {
            continue;
        };
        let lost: Vec<&str> = before
            .iter()
            .map(String::as_str)
            .filter(|k| !now.accepts(k))
            .collect();
        if !lost.is_empty() {
            cx.error_at(
                syn::spanned::Spanned::span(field.ty),
                format!(
                    "{event_type} v{version}: the field `{}` changed its JSON type: the snapshot ({shown}) holds `{old_name}` as {}, the struct now holds {} ({}), so stored v{version} events with {} fail to read. Restore the type, or {fix}",
                    field.serde_name,
                    before.join(" or "),
                    now.describe(),
                    quote::ToTokens::to_token_stream(field.ty).to_string().replace(' ', ""),
                    lost.join(" or ")
                ),
            );
        }
    }
}

fn is_option(ty: &Type) -> bool {
    last_segment(ty).is_some_and(|(name, _)| name == "Option")
}

/// The JSON types a Rust type reads, when its type makes them certain.
struct Kinds {
    kinds: BTreeSet<&'static str>,
    null: bool,
}

impl Kinds {
    fn one(kind: &'static str) -> Option<Kinds> {
        Some(Kinds {
            kinds: BTreeSet::from([kind]),
            null: false,
        })
    }

    fn accepts(&self, kind: &str) -> bool {
        match kind {
            "null" => self.null,
            "integer" => self.kinds.contains("integer") || self.kinds.contains("number"),
            other => self.kinds.contains(other),
        }
    }

    fn describe(&self) -> String {
        let mut all: Vec<&str> = self.kinds.iter().copied().collect();
        if self.null {
            all.push("null");
        }
        all.join(" or ")
    }
}

fn kinds(ty: &Type) -> Option<Kinds> {
    match ty {
        Type::Paren(inner) => kinds(&inner.elem),
        Type::Group(inner) => kinds(&inner.elem),
        Type::Reference(inner) => kinds(&inner.elem),
        Type::Array(_) | Type::Slice(_) => Kinds::one("array"),
        Type::Tuple(tuple) if tuple.elems.is_empty() => Some(Kinds {
            kinds: BTreeSet::new(),
            null: true,
        }),
        Type::Tuple(_) => Kinds::one("array"),
        Type::Path(_) => {
            let (name, arg) = last_segment(ty)?;
            match name.as_str() {
                "i8" | "i16" | "i32" | "i64" | "i128" | "isize" | "u8" | "u16" | "u32" | "u64"
                | "u128" | "usize" => Kinds::one("integer"),
                "f32" | "f64" => Kinds::one("number"),
                "String" | "str" | "char" => Kinds::one("string"),
                "bool" => Kinds::one("boolean"),
                "Vec" | "VecDeque" | "HashSet" | "BTreeSet" | "LinkedList" => Kinds::one("array"),
                "HashMap" | "BTreeMap" => Kinds::one("object"),
                "Box" | "Arc" | "Rc" => kinds(arg?),
                "Option" => {
                    let mut inner = kinds(arg?)?;
                    inner.null = true;
                    Some(inner)
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// The last path segment's name and its first type argument.
fn last_segment(ty: &Type) -> Option<(String, Option<&Type>)> {
    let Type::Path(path) = ty else { return None };
    if path.qself.is_some() {
        return None;
    }
    let last = path.path.segments.last()?;
    let arg = match &last.arguments {
        syn::PathArguments::AngleBracketed(args) => args.args.iter().find_map(|a| match a {
            syn::GenericArgument::Type(t) => Some(t),
            _ => None,
        }),
        _ => None,
    };
    Some((last.ident.to_string(), arg))
}

/// The JSON types a snapshot property accepts, when it says (`"type": "x"` or `["x", "null"]`).
fn snapshot_kinds(schema: &Value) -> Option<Vec<String>> {
    match schema.get("type")? {
        Value::String(kind) => Some(vec![kind.clone()]),
        Value::Array(kinds) => kinds
            .iter()
            .map(|k| k.as_str().map(str::to_owned))
            .collect(),
        _ => None,
    }
}
