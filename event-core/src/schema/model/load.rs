//! Loading a schema document into a [`Graph`]: references resolved, keywords read per kind,
//! canonical value sets for enums and constants.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use crate::schema::validate::kind_of;
use crate::schema::{MAX_DEPTH, SchemaError};

use super::{ArrayNode, Common, Criterion, Kind, Node, NodeId, NumberNode, ObjectNode, StringNode};

pub(super) struct Loader<'a> {
    pub(super) document: &'a Value,
    pub(super) modern: bool,
    pub(super) serde: bool,
    pub(super) nodes: Vec<Node>,
    pub(super) by_pointer: HashMap<String, NodeId>,
    /// Nodes whose schema is still being read: a `$ref` to one of them is a cycle.
    pub(super) building: Vec<NodeId>,
}

pub(super) const OBJECT_KEYWORDS: &[&str] = &[
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "minProperties",
    "maxProperties",
    "propertyNames",
    "unevaluatedProperties",
];

pub(super) const ARRAY_KEYWORDS: &[&str] = &[
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedItems",
];

pub(super) const NUMBER_KEYWORDS: &[&str] = &[
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];

pub(super) const STRING_KEYWORDS: &[&str] = &["minLength", "maxLength", "pattern"];

pub(super) fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

pub(super) fn unescape(segment: &str) -> String {
    segment.replace("~1", "/").replace("~0", "~")
}

impl Loader<'_> {
    pub(super) fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// The node for the schema at `pointer`, read once: a second `$ref` to it, or a cycle back
    /// to it, gets the same node.
    pub(super) fn node(
        &mut self,
        value: &Value,
        pointer: &str,
        depth: usize,
    ) -> Result<NodeId, SchemaError> {
        if let Some(&id) = self.by_pointer.get(pointer) {
            return Ok(id);
        }
        if depth > MAX_DEPTH {
            return Err(SchemaError::TooDeep {
                pointer: format!("#{pointer}"),
                limit: MAX_DEPTH,
            });
        }
        // Reserve the slot first, so that a $ref cycle back here finds it.
        let id = self.push(Node {
            common: Common::default(),
            kind: Kind::Empty,
            raw: value.clone(),
        });
        self.by_pointer.insert(pointer.to_owned(), id);
        self.building.push(id);
        let built = self.build(value, pointer, depth);
        self.building.pop();
        match built? {
            Built::Node(node) => {
                self.nodes[id] = *node;
                Ok(id)
            }
            // A `$ref` to a schema still being read is a cycle: this position is that node.
            Built::Alias(target) if target == id || self.building.contains(&target) => {
                self.by_pointer.insert(pointer.to_owned(), target);
                Ok(target)
            }
            // Otherwise the slot becomes the finished target, so that anything that already
            // points at the slot sees the same schema.
            Built::Alias(target) => {
                self.nodes[id] = self.nodes[target].clone();
                Ok(id)
            }
        }
    }

    pub(super) fn build(
        &mut self,
        value: &Value,
        pointer: &str,
        depth: usize,
    ) -> Result<Built, SchemaError> {
        let map = match value {
            Value::Bool(true) => return Ok(Built::Node(Box::new(self.plain(Kind::Empty, value)))),
            Value::Bool(false) => return Ok(Built::Node(Box::new(self.plain(Kind::False, value)))),
            Value::Object(map) => map,
            other => {
                return Err(SchemaError::NotASchema {
                    pointer: format!("#{pointer}"),
                    found: kind_of(other),
                });
            }
        };
        if let Some(reference) = map.get("$ref") {
            let Some(reference) = reference.as_str() else {
                return Err(SchemaError::BadKeyword {
                    pointer: format!("#{pointer}/$ref"),
                    problem: "must be a string".into(),
                });
            };
            let target = self.resolve(reference, pointer, depth)?;
            return Ok(Built::Alias(target));
        }
        let common = Common {
            id: map
                .get("$id")
                .or_else(|| map.get("id"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            title: map.get("title").and_then(Value::as_str).map(str::to_owned),
            description: map
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_owned),
            default: map.get("default").cloned(),
        };

        let mut parts: Vec<Kind> = Vec::new();
        if let Some(values) = map.get("enum") {
            let Some(values) = values.as_array() else {
                return Err(SchemaError::BadKeyword {
                    pointer: format!("#{pointer}/enum"),
                    problem: "must be an array".into(),
                });
            };
            parts.push(Kind::Enum(values.clone()));
        }
        if let Some(value) = map.get("const") {
            parts.push(Kind::Const(value.clone()));
        }
        for criterion in [Criterion::All, Criterion::Any, Criterion::One] {
            if let Some(list) = map.get(criterion.keyword()) {
                let Some(list) = list.as_array() else {
                    return Err(SchemaError::BadKeyword {
                        pointer: format!("#{pointer}/{}", criterion.keyword()),
                        problem: "must be an array of schemas".into(),
                    });
                };
                let mut subs = Vec::with_capacity(list.len());
                for (i, sub) in list.iter().enumerate() {
                    subs.push(self.node(
                        sub,
                        &format!("{pointer}/{}/{i}", criterion.keyword()),
                        depth + 1,
                    )?);
                }
                parts.push(Kind::Combined(criterion, subs));
            }
        }
        if let Some(not) = map.get("not") {
            parts.push(Kind::Not(self.node(
                not,
                &format!("{pointer}/not"),
                depth + 1,
            )?));
        }
        match map.get("type") {
            Some(Value::String(name)) => parts.push(self.typed(name, map, pointer, depth)?),
            Some(Value::Array(names)) => {
                let mut typed = Vec::with_capacity(names.len());
                for name in names {
                    let Some(name) = name.as_str() else {
                        return Err(SchemaError::BadKeyword {
                            pointer: format!("#{pointer}/type"),
                            problem: "must be a type name or an array of them".into(),
                        });
                    };
                    typed.push(self.typed(name, map, pointer, depth)?);
                }
                if typed.len() == 1 {
                    parts.extend(typed);
                } else {
                    let subs = typed
                        .into_iter()
                        .map(|kind| self.push(self.plain(kind, value)))
                        .collect();
                    parts.push(Kind::Combined(Criterion::Any, subs));
                }
            }
            Some(_) => {
                return Err(SchemaError::BadKeyword {
                    pointer: format!("#{pointer}/type"),
                    problem: "must be a type name or an array of them".into(),
                });
            }
            None => {
                // No explicit type: the keywords present say which types are constrained.
                for (name, keywords) in [
                    ("array", ARRAY_KEYWORDS),
                    ("object", OBJECT_KEYWORDS),
                    ("number", NUMBER_KEYWORDS),
                    ("string", STRING_KEYWORDS),
                ] {
                    if keywords.iter().any(|k| map.contains_key(*k)) {
                        parts.push(self.typed(name, map, pointer, depth)?);
                    }
                }
            }
        }
        let kind = match parts.len() {
            0 => Kind::Empty,
            1 => parts.remove(0),
            _ => {
                let subs = parts
                    .into_iter()
                    .map(|kind| self.push(self.plain(kind, value)))
                    .collect();
                Kind::Combined(Criterion::All, subs)
            }
        };
        Ok(Built::Node(Box::new(Node {
            common,
            kind,
            raw: value.clone(),
        })))
    }

    pub(super) fn plain(&self, kind: Kind, raw: &Value) -> Node {
        Node {
            common: Common::default(),
            kind,
            raw: raw.clone(),
        }
    }

    pub(super) fn resolve(
        &mut self,
        reference: &str,
        from: &str,
        depth: usize,
    ) -> Result<NodeId, SchemaError> {
        let Some(fragment) = reference.strip_prefix('#') else {
            return Err(SchemaError::UnresolvedRef {
                reference: reference.to_owned(),
                pointer: format!("#{from}"),
            });
        };
        let mut target = self.document;
        for segment in fragment.split('/').skip(1) {
            let segment = unescape(segment);
            target = match target {
                Value::Object(map) => map.get(&segment),
                Value::Array(list) => segment.parse::<usize>().ok().and_then(|i| list.get(i)),
                _ => None,
            }
            .ok_or_else(|| SchemaError::UnresolvedRef {
                reference: reference.to_owned(),
                pointer: format!("#{from}"),
            })?;
        }
        let fragment = fragment.trim_end_matches('/').to_owned();
        self.node(target, &fragment, depth + 1)
    }

    pub(super) fn typed(
        &mut self,
        name: &str,
        map: &serde_json::Map<String, Value>,
        pointer: &str,
        depth: usize,
    ) -> Result<Kind, SchemaError> {
        let uint = |key: &str| map.get(key).and_then(Value::as_u64);
        let num = |key: &str| map.get(key).and_then(Value::as_f64);
        Ok(match name {
            "null" => Kind::Null,
            "boolean" => Kind::Boolean,
            "string" => Kind::String(StringNode {
                min_length: uint("minLength"),
                max_length: uint("maxLength"),
                pattern: map
                    .get("pattern")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            }),
            "integer" | "number" => {
                // Under the serde profile an integer format is the range of its Rust type.
                let (low, high) = match map.get("format").and_then(Value::as_str) {
                    Some(format) if self.serde && name == "integer" => format_range(format),
                    _ => (None, None),
                };
                let tighter = |a: Option<f64>, b: Option<f64>, max: bool| match (a, b) {
                    (Some(a), Some(b)) => Some(if max { a.min(b) } else { a.max(b) }),
                    (a, b) => a.or(b),
                };
                Kind::Number(NumberNode {
                    integer: name == "integer",
                    minimum: tighter(num("minimum"), low, false),
                    maximum: tighter(num("maximum"), high, true),
                    // Draft-04's boolean form only marks minimum/maximum exclusive.
                    exclusive_minimum: num("exclusiveMinimum"),
                    exclusive_maximum: num("exclusiveMaximum"),
                    multiple_of: num("multipleOf"),
                })
            }
            "object" => Kind::Object(Box::new(self.object(map, pointer, depth)?)),
            "array" => Kind::Array(Box::new(self.array(map, pointer, depth)?)),
            other => {
                return Err(SchemaError::BadKeyword {
                    pointer: format!("#{pointer}/type"),
                    problem: format!(
                        "`{other}` is not a JSON schema type (null, boolean, object, array, number, integer, string)"
                    ),
                });
            }
        })
    }

    pub(super) fn child_map(
        &mut self,
        map: &serde_json::Map<String, Value>,
        key: &str,
        pointer: &str,
        depth: usize,
    ) -> Result<BTreeMap<String, NodeId>, SchemaError> {
        let mut out = BTreeMap::new();
        if let Some(Value::Object(children)) = map.get(key) {
            for (name, child) in children {
                let id = self.node(
                    child,
                    &format!("{pointer}/{key}/{}", escape(name)),
                    depth + 1,
                )?;
                out.insert(name.clone(), id);
            }
        }
        Ok(out)
    }

    pub(super) fn object(
        &mut self,
        map: &serde_json::Map<String, Value>,
        pointer: &str,
        depth: usize,
    ) -> Result<ObjectNode, SchemaError> {
        let properties = self.child_map(map, "properties", pointer, depth)?;
        let pattern_properties = self
            .child_map(map, "patternProperties", pointer, depth)?
            .into_iter()
            .collect();
        let (permits_additional, additional) = match map.get("additionalProperties") {
            None | Some(Value::Bool(true)) => (true, None),
            Some(Value::Bool(false)) => (false, None),
            Some(schema) => (
                true,
                Some(self.node(
                    schema,
                    &format!("{pointer}/additionalProperties"),
                    depth + 1,
                )?),
            ),
        };
        let required = map
            .get("required")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let mut property_dependencies = BTreeMap::new();
        let mut schema_dependencies = BTreeMap::new();
        for key in ["dependencies", "dependentRequired", "dependentSchemas"] {
            if let Some(Value::Object(deps)) = map.get(key) {
                for (name, dep) in deps {
                    match dep {
                        Value::Array(list) => {
                            property_dependencies.insert(
                                name.clone(),
                                list.iter()
                                    .filter_map(Value::as_str)
                                    .map(str::to_owned)
                                    .collect(),
                            );
                        }
                        schema => {
                            let id = self.node(
                                schema,
                                &format!("{pointer}/{key}/{}", escape(name)),
                                depth + 1,
                            )?;
                            schema_dependencies.insert(name.clone(), id);
                        }
                    }
                }
            }
        }
        let unevaluated = match map.get("unevaluatedProperties") {
            Some(schema) => Some(self.node(
                schema,
                &format!("{pointer}/unevaluatedProperties"),
                depth + 1,
            )?),
            None => None,
        };
        Ok(ObjectNode {
            properties,
            required,
            permits_additional,
            additional,
            pattern_properties,
            property_dependencies,
            schema_dependencies,
            unevaluated,
            min_properties: map.get("minProperties").and_then(Value::as_u64),
            max_properties: map.get("maxProperties").and_then(Value::as_u64),
        })
    }

    pub(super) fn array(
        &mut self,
        map: &serde_json::Map<String, Value>,
        pointer: &str,
        depth: usize,
    ) -> Result<ArrayNode, SchemaError> {
        let mut all_items = None;
        let mut item_schemas = Vec::new();
        let mut permits_additional = true;
        let mut additional = None;
        let tuple_key = if self.modern { "prefixItems" } else { "items" };
        if let Some(Value::Array(list)) = map.get(tuple_key) {
            for (i, item) in list.iter().enumerate() {
                item_schemas.push(self.node(
                    item,
                    &format!("{pointer}/{tuple_key}/{i}"),
                    depth + 1,
                )?);
            }
        }
        let (all_key, additional_key) = if self.modern {
            if map.contains_key("prefixItems") {
                (None, Some("items"))
            } else {
                (Some("items"), None)
            }
        } else {
            (Some("items"), Some("additionalItems"))
        };
        if let Some(key) = all_key
            && let Some(items) = map.get(key)
            && !items.is_array()
        {
            all_items = Some(self.node(items, &format!("{pointer}/{key}"), depth + 1)?);
        }
        if let Some(key) = additional_key {
            match map.get(key) {
                None | Some(Value::Bool(true)) => {}
                Some(Value::Bool(false)) => permits_additional = false,
                Some(schema) => {
                    additional = Some(self.node(schema, &format!("{pointer}/{key}"), depth + 1)?)
                }
            }
        }
        let unevaluated = match map.get("unevaluatedItems") {
            Some(schema) => {
                Some(self.node(schema, &format!("{pointer}/unevaluatedItems"), depth + 1)?)
            }
            None => None,
        };
        Ok(ArrayNode {
            all_items,
            item_schemas,
            permits_additional,
            additional,
            unevaluated,
            min_items: map.get("minItems").and_then(Value::as_u64),
            max_items: map.get("maxItems").and_then(Value::as_u64),
            unique_items: map
                .get("uniqueItems")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            min_contains: map.get("minContains").and_then(Value::as_u64),
            max_contains: map.get("maxContains").and_then(Value::as_u64),
        })
    }
}

pub(super) enum Built {
    Node(Box<Node>),
    Alias(NodeId),
}

/// The range of the integer formats schemars writes for Rust's integer types.
pub(super) fn format_range(format: &str) -> (Option<f64>, Option<f64>) {
    let bits = |b: i32| 2f64.powi(b);
    match format {
        "int8" => (Some(-bits(7)), Some(bits(7) - 1.0)),
        "int16" => (Some(-bits(15)), Some(bits(15) - 1.0)),
        "int32" => (Some(-bits(31)), Some(bits(31) - 1.0)),
        "int64" | "int" => (Some(-bits(63)), Some(bits(63) - 1.0)),
        "int128" => (Some(-bits(127)), Some(bits(127) - 1.0)),
        "uint8" => (Some(0.0), Some(bits(8) - 1.0)),
        "uint16" => (Some(0.0), Some(bits(16) - 1.0)),
        "uint32" => (Some(0.0), Some(bits(32) - 1.0)),
        "uint64" | "uint" => (Some(0.0), Some(bits(64) - 1.0)),
        "uint128" => (Some(0.0), Some(bits(128) - 1.0)),
        _ => (None, None),
    }
}

/// Value sets written three ways mean one thing: `const: v`, `enum: [..]`, and a `oneOf` /
/// `anyOf` whose members are each a `const` or an `enum` (what schemars writes for an enum whose
/// variants have doc comments). Each becomes an `enum`, keeping a common `type` and the
/// annotations, so that documenting a variant is not a type change.
pub(super) fn canonical_value_sets(value: &Value) -> Value {
    match value {
        Value::Array(items) => Value::Array(items.iter().map(canonical_value_sets).collect()),
        Value::Object(map) => {
            let mut out: serde_json::Map<String, Value> = map
                .iter()
                .map(|(k, v)| (k.clone(), canonical_value_sets(v)))
                .collect();
            if let Some(value) = out.remove("const") {
                out.insert("enum".to_owned(), Value::Array(vec![value]));
            }
            for keyword in ["oneOf", "anyOf"] {
                let Some(Value::Array(members)) = out.get(keyword) else {
                    continue;
                };
                let mut values = Vec::new();
                let mut types: Vec<Value> = Vec::new();
                let all_value_sets = !members.is_empty()
                    && members.iter().all(|m| {
                        let Some(set) = m.get("enum").and_then(Value::as_array) else {
                            return false;
                        };
                        let only_annotations = m.as_object().is_some_and(|o| {
                            o.keys().all(|k| {
                                matches!(
                                    k.as_str(),
                                    "enum"
                                        | "type"
                                        | "title"
                                        | "description"
                                        | "default"
                                        | "examples"
                                        | "deprecated"
                                )
                            })
                        });
                        values.extend(set.iter().cloned());
                        let t = m.get("type").cloned().unwrap_or(Value::Null);
                        if !types.contains(&t) {
                            types.push(t);
                        }
                        only_annotations
                    });
                if all_value_sets {
                    out.remove(keyword);
                    out.insert("enum".to_owned(), Value::Array(values));
                    if let [Value::String(t)] = types.as_slice()
                        && !out.contains_key("type")
                    {
                        out.insert("type".to_owned(), Value::String(t.clone()));
                    }
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}
