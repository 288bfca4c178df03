//! The checker's cost is bounded by the size of its input: shared definitions are compared
//! once, enums as sets, tagged unions by their tags, and anything past the work limit is an
//! error rather than a runaway.

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use serde_json::{Value, json};

use super::Comparer;
use crate::schema::Profile;
use crate::schema::model::{Graph, Kind};

/// Nodes, enum values and subschemas: what the work is measured against.
fn size(graph: &Graph) -> u64 {
    graph
        .nodes
        .iter()
        .map(|node| {
            1 + match &node.kind {
                Kind::Enum(values) => values.len() as u64,
                Kind::Combined(_, subs) => subs.len() as u64,
                _ => 0,
            }
        })
        .sum()
}

fn compare(old: &Value, new: &Value) -> (usize, u64, u64) {
    let (a, b) = (
        Graph::load(old, Profile::Strict).unwrap(),
        Graph::load(new, Profile::Strict).unwrap(),
    );
    let (changes, work) = Comparer::new(&a, &b, Profile::Strict)
        .changes_and_work()
        .unwrap();
    (changes.len(), work, size(&a) + size(&b))
}

/// `d_i` has two properties that both refer to `d_(i-1)`: 2^levels paths reach the leaf.
fn layered(levels: usize, leaf: &str) -> Value {
    let mut definitions = serde_json::Map::new();
    definitions.insert("d0".into(), json!({ "type": leaf }));
    for i in 1..=levels {
        let below = format!("#/definitions/d{}", i - 1);
        definitions.insert(
            format!("d{i}"),
            json!({
                "type": "object",
                "properties": { "a": { "$ref": below }, "b": { "$ref": below } }
            }),
        );
    }
    json!({ "definitions": definitions, "$ref": format!("#/definitions/d{levels}") })
}

#[test]
fn a_change_under_a_25_level_shared_definition_is_found_at_once() {
    let (old, new) = (layered(25, "string"), layered(25, "integer"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(compare(&old, &new));
    });
    // 2^25 paths lead to the leaf; the comparison visits each pair of definitions once.
    let (changes, work, size) = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the comparison finishes");
    assert!((1..1000).contains(&changes), "{changes} changes");
    assert!(work < 20 * size, "work {work} for input size {size}");
    let report = super::super::check(
        &layered(25, "string"),
        &layered(25, "integer"),
        super::super::Mode::Backward,
    )
    .unwrap();
    assert!(!report.is_compatible());
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.rule.name() == "TYPE_CHANGED")
    );
}

#[test]
fn past_the_work_limit_the_comparison_gives_up_with_an_error() {
    // Untagged objects that all differ: every pair must be compared.
    let anyof = |n: usize, prefix: &str| {
        let branches: Vec<Value> = (0..n)
            .map(|i| {
                let name = format!("{prefix}{i}");
                json!({ "type": "object", "required": [name], "properties": { name: { "type": "string" } } })
            })
            .collect();
        json!({ "anyOf": branches })
    };
    let (a, b) = (
        Graph::load(&anyof(200, "a"), Profile::Strict).unwrap(),
        Graph::load(&anyof(200, "b"), Profile::Strict).unwrap(),
    );
    let error = Comparer::new(&a, &b, Profile::Strict)
        .with_limit(10_000)
        .changes()
        .unwrap_err();
    assert!(
        error.to_string().contains("schema too complex to check"),
        "{error}"
    );
}

/// A schema with shared definitions (some recursive, some reached twice), big enums and
/// many-branch tagged unions; `tweak` picks which leaves differ in the second copy.
fn generated(definitions: usize, enum_size: usize, branches: usize, tweak: u64) -> Value {
    let flip = |i: usize| tweak >> (i % 64) & 1 == 1;
    let mut defs = serde_json::Map::new();
    defs.insert(
        "d0".into(),
        json!({ "type": if flip(0) { "integer" } else { "string" } }),
    );
    for i in 1..definitions {
        let below = format!("#/definitions/d{}", i - 1);
        let me = format!("#/definitions/d{i}");
        defs.insert(
            format!("d{i}"),
            json!({
                "type": "object",
                "properties": {
                    "left": { "$ref": below },
                    "right": { "$ref": below },
                    "self": { "$ref": me },
                    "n": { "type": if flip(i) { "number" } else { "integer" } }
                }
            }),
        );
    }
    let values: Vec<Value> = (0..enum_size)
        .filter(|v| !(flip(v % 7) && v % 97 == 0))
        .map(|v| json!(format!("v{v}")))
        .collect();
    let variants: Vec<Value> = (0..branches)
        .map(|b| {
            let mut properties = json!({
                "kind": { "const": format!("k{b}") },
                "amount": { "type": "integer" }
            });
            if flip(b) && b % 13 == 0 {
                properties["amount"] = json!({ "type": "string" });
            }
            json!({ "type": "object", "properties": properties, "required": ["kind"] })
        })
        .collect();
    json!({
        "definitions": defs,
        "type": "object",
        "properties": {
            "tree": { "$ref": format!("#/definitions/d{}", definitions - 1) },
            "status": { "enum": values },
            "payment": { "anyOf": variants }
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn work_is_bounded_by_the_input_size(
        definitions in 1usize..25,
        enum_size in 0usize..3000,
        branches in 1usize..400,
        old_tweak in any::<u64>(),
        new_tweak in any::<u64>(),
    ) {
        let old = generated(definitions, enum_size, branches, old_tweak);
        let new = generated(definitions, enum_size, branches, new_tweak);
        let (_, work, size) = compare(&old, &new);
        prop_assert!(work <= 16 * size + 64, "work {} for input size {}", work, size);
    }
}
