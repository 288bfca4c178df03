//! The compatibility checker: laws that hold for every schema, termination on recursive and
//! adversarial input, and clear errors for bad input. (Agreement with Confluent's own examples is
//! checked by `.ci/run` with `shared/conformance`.)

// A panic is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use event_core::schema::{Mode, Profile, SchemaError, changes, check, check_history};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Random schemas over the keywords the checker knows.
fn schema() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!({"type": "string"})),
        (0u64..20).prop_map(|n| json!({"type": "string", "maxLength": n})),
        Just(json!({"type": "integer"})),
        (-5i64..5).prop_map(|n| json!({"type": "number", "minimum": n})),
        Just(json!({"type": "boolean"})),
        Just(json!({"type": "null"})),
        Just(json!({})),
        Just(json!(true)),
        Just(json!(false)),
        prop::collection::vec(0i64..4, 1..4).prop_map(|v| json!({"enum": v})),
        Just(json!({"type": ["string", "null"]})),
    ];
    leaf.prop_recursive(4, 48, 4, |inner| {
        prop_oneof![
            (prop::collection::btree_map("[a-d]", inner.clone(), 0..4), prop::bool::ANY, prop::collection::vec("[a-d]", 0..3))
                .prop_map(|(props, closed, required)| {
                    json!({"type": "object", "properties": props, "additionalProperties": !closed, "required": required})
                }),
            inner.clone().prop_map(|items| json!({"type": "array", "items": items})),
            prop::collection::vec(inner.clone(), 1..4).prop_map(|v| json!({"type": "array", "items": v, "additionalItems": false})),
            prop::collection::vec(inner.clone(), 1..4).prop_map(|v| json!({"oneOf": v})),
            prop::collection::vec(inner.clone(), 1..4).prop_map(|v| json!({"anyOf": v})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|v| json!({"allOf": v})),
            inner.prop_map(|s| json!({"not": s})),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_schema_is_fully_compatible_with_itself(s in schema()) {
        let report = check(&s, &s, Mode::Full).unwrap();
        prop_assert!(report.is_compatible(), "{s}: {:?}", report.findings);
    }

    #[test]
    fn forward_is_backward_reversed(a in schema(), b in schema()) {
        let forward = check(&a, &b, Mode::Forward).unwrap().is_compatible();
        let backward = check(&b, &a, Mode::Backward).unwrap().is_compatible();
        prop_assert_eq!(forward, backward);
    }

    #[test]
    fn full_is_backward_and_forward(a in schema(), b in schema()) {
        let full = check(&a, &b, Mode::Full).unwrap().is_compatible();
        let both = check(&a, &b, Mode::Backward).unwrap().is_compatible()
            && check(&a, &b, Mode::Forward).unwrap().is_compatible();
        prop_assert_eq!(full, both);
    }
}

fn recursive(leaf: &str) -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": "#/$defs/Node",
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "value": {"type": leaf},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                    "parent": {"$ref": "#/$defs/Node"}
                },
                "additionalProperties": false
            }
        }
    })
}

#[test]
fn recursive_schemas_terminate_and_changes_deep_inside_are_found() {
    let v1 = recursive("string");
    assert!(
        check(&v1, &v1, Mode::FullTransitive)
            .unwrap()
            .is_compatible()
    );
    let v2 = recursive("integer");
    let report = check(&v1, &v2, Mode::Backward).unwrap();
    assert!(!report.is_compatible());
    assert!(
        report
            .breaking()
            .any(|f| f.rule.name() == "TYPE_CHANGED" && f.pointer == "#/properties/value")
    );
}

#[test]
fn recursion_through_not_and_refs_to_refs_terminate() {
    let cyclic = json!({
        "$ref": "#/definitions/a",
        "definitions": {
            "a": {"not": {"$ref": "#/definitions/b"}},
            "b": {"anyOf": [{"$ref": "#/definitions/a"}, {"type": "string"}]},
            "c": {"$ref": "#/definitions/d"},
            "d": {"$ref": "#/definitions/a"}
        }
    });
    assert!(check(&cyclic, &cyclic, Mode::Full).unwrap().is_compatible());
    let other = json!({"not": {"type": "integer"}});
    check(&cyclic, &other, Mode::Full).unwrap();
    // A cycle of references alone names no schema: bad input, not "accepts everything".
    for empty in [
        json!({"$ref": "#"}),
        json!({"definitions": {"c": {"$ref": "#/definitions/c"}}, "type": "object"}),
    ] {
        let err = check(&empty, &empty, Mode::Full).unwrap_err();
        assert!(err.to_string().contains("leads back to itself"), "{err}");
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let err = check(&json!(42), &json!({}), Mode::Backward).unwrap_err();
    assert!(matches!(err, SchemaError::NotASchema { .. }), "{err}");
    assert!(err.to_string().contains("not a schema"));

    let err = check(
        &json!({"$ref": "http://example.com/x.json"}),
        &json!({}),
        Mode::Backward,
    )
    .unwrap_err();
    assert!(matches!(err, SchemaError::UnresolvedRef { .. }), "{err}");

    let err = check(&json!({"type": "strnig"}), &json!({}), Mode::Backward).unwrap_err();
    assert!(
        err.to_string()
            .contains("`strnig` is not a JSON schema type"),
        "{err}"
    );

    let mut deep = json!({"type": "string"});
    for _ in 0..200 {
        deep = json!({"type": "array", "items": deep});
    }
    let err = check(&deep, &deep, Mode::Backward).unwrap_err();
    assert!(
        matches!(err, SchemaError::TooDeep { limit: 64, .. }),
        "{err}"
    );
}

#[test]
fn findings_carry_rule_pointer_values_direction_and_action() {
    let v1 = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}});
    let v2 = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}}});
    let report = check(&v1, &v2, Mode::Full).unwrap();
    let decreased = report
        .findings
        .iter()
        .find(|f| f.rule.name() == "MAX_LENGTH_DECREASED")
        .unwrap();
    assert_eq!(decreased.pointer, "#/properties/name/maxLength");
    assert_eq!(
        (decreased.old.clone(), decreased.new.clone()),
        (Some(json!(10)), Some(json!(5)))
    );
    assert_eq!(
        decreased.breaks,
        Some(event_core::schema::Direction::Backward)
    );
    assert!(decreased.action.unwrap().contains("upcaster"));
    // Seen from the other side, the same change is a compatible increase.
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.rule.name() == "MAX_LENGTH_INCREASED" && f.breaks.is_none())
    );
    assert_eq!(changes(&v1, &v2).unwrap().len(), 1);
}

#[test]
fn transitive_modes_check_every_earlier_version() {
    let v1 = json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": false});
    let v2 = json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "additionalProperties": false});
    let v3 = json!({"type": "object", "properties": {"b": {"type": "string"}}, "additionalProperties": false});
    // v3 drops `a`, which v1 and v2 writers wrote into a closed model.
    assert!(
        !check_history(
            &[v1.clone(), v2.clone(), v3.clone()],
            Mode::Backward,
            Profile::Strict
        )
        .unwrap()
        .is_compatible()
    );
    let v3b = v2.clone();
    assert!(
        check_history(&[v1, v2, v3b], Mode::BackwardTransitive, Profile::Strict)
            .unwrap()
            .is_compatible()
    );
    assert_eq!(Mode::parse("full-transitive"), Some(Mode::FullTransitive));
    assert_eq!(Mode::parse("sideways"), None);
}
