//! What a schema must look like before it is compared: every keyword the checker reads has a
//! value of the right JSON type, every subschema is an object or a boolean, and no `$ref` chain
//! loops back on itself without a schema in between. A document that fails is bad input, named
//! by a JSON pointer to the keyword at fault.

use std::collections::HashSet;

use serde_json::Value;

use super::{MAX_DEPTH, SchemaError};

/// Keywords whose value is one subschema.
const ONE_SCHEMA: &[&str] = &[
    "additionalProperties",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
];
/// Keywords whose value is an object of subschemas.
const SCHEMA_MAP: &[&str] = &[
    "properties",
    "patternProperties",
    "definitions",
    "$defs",
    "dependentSchemas",
];
/// Keywords whose value is a non-empty array of subschemas.
const SCHEMA_LIST: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];
/// Keywords whose value is a number.
const NUMBERS: &[&str] = &["minimum", "maximum", "multipleOf"];
/// Keywords whose value is a non-negative integer.
const COUNTS: &[&str] = &[
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
];
/// Keywords whose value is a string.
const STRINGS: &[&str] = &[
    "$ref",
    "$id",
    "$schema",
    "$anchor",
    "$comment",
    "pattern",
    "format",
    "title",
    "description",
];
const TYPES: &[&str] = &[
    "null", "boolean", "object", "array", "number", "integer", "string",
];

/// Checks `document` (see the module's documentation).
pub(crate) fn validate(document: &Value) -> Result<(), SchemaError> {
    schema(document, "", 0)?;
    ref_cycles(document)
}

fn bad(pointer: &str, keyword: &str, problem: &str) -> SchemaError {
    SchemaError::BadKeyword {
        pointer: format!("#{pointer}/{keyword}"),
        problem: problem.to_owned(),
    }
}

/// How an error names the JSON kind of `value`: "a string", "an object", ...
pub(super) fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

fn schema(value: &Value, pointer: &str, depth: usize) -> Result<(), SchemaError> {
    if depth > MAX_DEPTH {
        return Err(SchemaError::TooDeep {
            pointer: format!("#{pointer}"),
            limit: MAX_DEPTH,
        });
    }
    let map = match value {
        Value::Bool(_) => return Ok(()),
        Value::Object(map) => map,
        other => {
            return Err(SchemaError::NotASchema {
                pointer: format!("#{pointer}"),
                found: kind_of(other),
            });
        }
    };
    for (keyword, value) in map {
        let keyword = keyword.as_str();
        let here = format!("{pointer}/{}", escape(keyword));
        if ONE_SCHEMA.contains(&keyword) {
            schema(value, &here, depth + 1)?;
        } else if SCHEMA_MAP.contains(&keyword) {
            let Some(members) = value.as_object() else {
                return Err(bad(
                    pointer,
                    keyword,
                    "must be an object whose values are schemas",
                ));
            };
            for (name, sub) in members {
                schema(sub, &format!("{here}/{}", escape(name)), depth + 1)?;
            }
        } else if SCHEMA_LIST.contains(&keyword) {
            let Some(list) = value.as_array().filter(|l| !l.is_empty()) else {
                return Err(bad(
                    pointer,
                    keyword,
                    "must be a non-empty array of schemas",
                ));
            };
            for (i, sub) in list.iter().enumerate() {
                schema(sub, &format!("{here}/{i}"), depth + 1)?;
            }
        } else if keyword == "items" {
            match value {
                Value::Array(list) => {
                    for (i, sub) in list.iter().enumerate() {
                        schema(sub, &format!("{here}/{i}"), depth + 1)?;
                    }
                }
                other => schema(other, &here, depth + 1)?,
            }
        } else if keyword == "type" {
            let names: Vec<&Value> = match value {
                Value::Array(list) if !list.is_empty() => list.iter().collect(),
                Value::String(_) => vec![value],
                _ => {
                    return Err(bad(
                        pointer,
                        keyword,
                        "must be a type name or a non-empty array of them",
                    ));
                }
            };
            for name in names {
                if !name.as_str().is_some_and(|n| TYPES.contains(&n)) {
                    return Err(bad(
                        pointer,
                        keyword,
                        &format!(
                            "`{}` is not a JSON schema type: the types are null, boolean, object, array, number, integer and string",
                            name.as_str()
                                .map_or_else(|| name.to_string(), str::to_owned)
                        ),
                    ));
                }
            }
        } else if keyword == "required" {
            if !value
                .as_array()
                .is_some_and(|l| l.iter().all(Value::is_string))
            {
                return Err(bad(pointer, keyword, "must be an array of property names"));
            }
        } else if keyword == "enum" {
            if !value.is_array() {
                return Err(bad(pointer, keyword, "must be an array"));
            }
        } else if keyword == "dependencies" || keyword == "dependentRequired" {
            let Some(members) = value.as_object() else {
                return Err(bad(
                    pointer,
                    keyword,
                    "must be an object of property-name arrays or schemas",
                ));
            };
            for (name, dependency) in members {
                match dependency {
                    Value::Array(list) if list.iter().all(Value::is_string) => {}
                    Value::Object(_) | Value::Bool(_) if keyword == "dependencies" => {
                        schema(dependency, &format!("{here}/{}", escape(name)), depth + 1)?
                    }
                    _ => {
                        return Err(bad(
                            &here,
                            &escape(name),
                            "must be an array of property names or a schema",
                        ));
                    }
                }
            }
        } else if NUMBERS.contains(&keyword) {
            if !value.is_number() {
                return Err(bad(pointer, keyword, "must be a number"));
            }
        } else if keyword == "exclusiveMinimum" || keyword == "exclusiveMaximum" {
            // A number, or in draft-04 a boolean.
            if !(value.is_number() || value.is_boolean()) {
                return Err(bad(pointer, keyword, "must be a number"));
            }
        } else if COUNTS.contains(&keyword) {
            if !value.is_u64() {
                return Err(bad(pointer, keyword, "must be a non-negative integer"));
            }
        } else if keyword == "uniqueItems" {
            if !value.is_boolean() {
                return Err(bad(pointer, keyword, "must be true or false"));
            }
        } else if STRINGS.contains(&keyword) && !value.is_string() {
            return Err(bad(pointer, keyword, "must be a string"));
        }
    }
    Ok(())
}

/// A `$ref` whose chain of references, through schemas that hold nothing but a reference, comes
/// back to where it started: it names no schema at all.
fn ref_cycles(document: &Value) -> Result<(), SchemaError> {
    fn only_a_ref(value: &Value) -> Option<&str> {
        let map = value.as_object()?;
        let reference = map.get("$ref")?.as_str()?;
        let annotations = ["$ref", "title", "description", "$comment", "$id", "$schema"];
        map.keys()
            .all(|k| annotations.contains(&k.as_str()) || k == "definitions" || k == "$defs")
            .then_some(reference)
    }
    fn target<'a>(document: &'a Value, reference: &str) -> Option<&'a Value> {
        let pointer = reference.strip_prefix('#')?;
        if pointer.is_empty() {
            return Some(document);
        }
        document.pointer(pointer)
    }
    fn walk(
        document: &Value,
        value: &Value,
        pointer: &str,
        depth: usize,
    ) -> Result<(), SchemaError> {
        if depth > MAX_DEPTH {
            return Ok(());
        }
        if let Some(first) = only_a_ref(value) {
            let mut seen: HashSet<&str> = HashSet::new();
            let mut reference = first;
            while let Some(next) = target(document, reference) {
                if !seen.insert(reference) {
                    return Err(SchemaError::BadKeyword {
                        pointer: format!("#{pointer}/$ref"),
                        problem: format!(
                            "`{first}` leads back to itself through references alone: it names no schema; point it at a schema with content"
                        ),
                    });
                }
                match only_a_ref(next) {
                    Some(further) => reference = further,
                    None => break,
                }
            }
        }
        match value {
            Value::Object(map) => {
                for (key, sub) in map {
                    walk(
                        document,
                        sub,
                        &format!("{pointer}/{}", escape(key)),
                        depth + 1,
                    )?;
                }
            }
            Value::Array(list) => {
                for (i, sub) in list.iter().enumerate() {
                    walk(document, sub, &format!("{pointer}/{i}"), depth + 1)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
    walk(document, document, "", 0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::validate;

    #[test]
    fn keywords_of_the_wrong_type_are_named() {
        for (schema, pointer) in [
            (
                json!({"type": "object", "properties": [1, 2]}),
                "#/properties",
            ),
            (json!({"required": 5}), "#/required"),
            (json!({"type": "strnig"}), "#/type"),
            (
                json!({"properties": {"a": {"minLength": -1}}}),
                "#/properties/a/minLength",
            ),
            (json!({"anyOf": []}), "#/anyOf"),
            (json!({"items": [1]}), "#/items/0"),
            (json!({"enum": "a"}), "#/enum"),
            (
                json!({"$defs": {"x": {"uniqueItems": "yes"}}}),
                "#/$defs/x/uniqueItems",
            ),
            (json!({"$ref": "#"}), "#/$ref"),
            (
                json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
                "#/$ref",
            ),
        ] {
            let error = validate(&schema).unwrap_err().to_string();
            assert!(error.starts_with(pointer), "{schema}: {error}");
        }
        assert!(
            validate(&json!([1, 2]))
                .unwrap_err()
                .to_string()
                .contains("not a schema")
        );
    }

    #[test]
    fn real_schemas_pass() {
        for schema in [
            json!(true),
            json!({}),
            json!({"type": ["string", "null"], "maxLength": 3}),
            json!({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}}),
            json!({"exclusiveMinimum": true, "minimum": 0}),
            json!({"dependencies": {"a": ["b"], "c": {"required": ["d"]}}}),
        ] {
            validate(&schema).unwrap();
        }
    }
}
