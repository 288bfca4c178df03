//! The crate's modules import only downward: each `crate::<module>` path in the code (comments
//! aside) names a module of the same layer or a lower one, modules of one layer import each
//! other without a circle, and nothing reaches a type through the crate root's re-exports.
//!
//! The layers, as lib.rs draws them:
//!   L5 brokers; L4 relay, worker, consumer, route; L3 outbox, message, inbox, publisher;
//!   L2 sql; L1 row, config, metrics; L0 status, table, clock, error.

// A panic is how a test fails.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const LAYERS: &[(&str, u8)] = &[
    ("status", 0),
    ("table", 0),
    ("clock", 0),
    ("error", 0),
    ("row", 1),
    ("config", 1),
    ("metrics", 1),
    ("wire", 1),
    ("telemetry", 1),
    ("quarantine", 3),
    ("reconcile", 3),
    ("sql", 2),
    ("outbox", 3),
    ("message", 3),
    ("inbox", 3),
    ("publisher", 3),
    ("archive", 3),
    ("audit", 3),
    ("asyncapi", 3),
    ("relay", 4),
    ("worker", 4),
    ("consumer", 4),
    ("route", 4),
    ("brokers", 5),
];

fn layer(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a source file belongs to: `src/sql/outbox.rs` is in `sql`.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next().unwrap();
    first
        .as_os_str()
        .to_string_lossy()
        .trim_end_matches(".rs")
        .to_owned()
}

/// Every `crate::<name>` in the code of `text`, comments left out.
fn crate_paths(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `crate::{a, b}` names each of a, b.
            if name.is_empty() && after.starts_with('{') {
                let group = after[1..].split('}').next().unwrap_or("");
                for part in group.split(',') {
                    let part = part.trim().split("::").next().unwrap_or("").to_owned();
                    if !part.is_empty() {
                        names.push(part);
                    }
                }
            } else {
                names.push(name);
            }
            rest = after;
        }
    }
    names
}

#[test]
fn modules_import_only_downward_and_without_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut problems = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(&src, file);
        if module == "lib" {
            continue;
        }
        let Some(from) = layer(&module) else {
            problems.push(format!(
                "{}: module `{module}` has no layer: add it to lib.rs's drawing and to LAYERS",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for name in crate_paths(&text) {
            if name.is_empty() || name == "self" {
                continue;
            }
            let Some(to) = layer(&name) else {
                problems.push(format!(
                    "{}: `crate::{name}` goes through the crate root; import it from its module",
                    file.display()
                ));
                continue;
            };
            if to > from {
                problems.push(format!(
                    "{}: `{module}` (L{from}) imports `{name}` (L{to}), a layer above it",
                    file.display()
                ));
            }
            if to == from && name != module {
                edges.entry(module.clone()).or_default().insert(name);
            }
        }
    }
    // No circle among modules of one layer.
    fn reaches(
        edges: &BTreeMap<String, BTreeSet<String>>,
        from: &str,
        target: &str,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in edges.get(from).into_iter().flatten() {
            if next == target || (seen.insert(next.clone()) && reaches(edges, next, target, seen)) {
                return true;
            }
        }
        false
    }
    for module in edges.keys() {
        if reaches(&edges, module, module, &mut BTreeSet::new()) {
            problems.push(format!(
                "`{module}` imports a module that imports it back: {edges:?}"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "imports against the layering:\n{}",
        problems.join("\n")
    );
    // The check saw the crate: every layered module is there.
    let seen: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    for (module, _) in LAYERS {
        assert!(seen.contains(*module), "no source for module `{module}`");
    }
}

#[test]
fn the_check_catches_an_upward_import() {
    assert_eq!(
        crate_paths("use crate::relay::Relay; // crate::ignored\nuse crate::{row::x, sql};"),
        vec!["relay", "row", "sql"]
    );
}
