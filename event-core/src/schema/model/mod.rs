//! A JSON schema read into a graph of typed nodes, the way a validator sees it: each keyword group
//! (`type`, `enum`, `const`, `not`, `allOf`/`anyOf`/`oneOf`) becomes a node, several groups on one
//! schema combine as an `allOf`, a `type` array becomes an `anyOf`, and `$ref` points at the node
//! of its target, so a recursive schema is a cycle in the graph, not an infinite tree.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use super::SchemaError;

mod load;

use load::{Loader, canonical_value_sets};

/// An index into [`Graph::nodes`].
pub(crate) type NodeId = usize;

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Common {
    pub(crate) id: Option<String>,
    pub(crate) title: Option<String>,
    pub(crate) description: Option<String>,
    pub(crate) default: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Criterion {
    All,
    Any,
    One,
}

impl Criterion {
    pub(crate) fn keyword(self) -> &'static str {
        match self {
            Criterion::All => "allOf",
            Criterion::Any => "anyOf",
            Criterion::One => "oneOf",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ObjectNode {
    pub(crate) properties: BTreeMap<String, NodeId>,
    pub(crate) required: BTreeSet<String>,
    pub(crate) permits_additional: bool,
    pub(crate) additional: Option<NodeId>,
    pub(crate) pattern_properties: Vec<(String, NodeId)>,
    pub(crate) property_dependencies: BTreeMap<String, BTreeSet<String>>,
    pub(crate) schema_dependencies: BTreeMap<String, NodeId>,
    pub(crate) unevaluated: Option<NodeId>,
    pub(crate) min_properties: Option<u64>,
    pub(crate) max_properties: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ArrayNode {
    pub(crate) all_items: Option<NodeId>,
    pub(crate) item_schemas: Vec<NodeId>,
    pub(crate) permits_additional: bool,
    pub(crate) additional: Option<NodeId>,
    pub(crate) unevaluated: Option<NodeId>,
    pub(crate) min_items: Option<u64>,
    pub(crate) max_items: Option<u64>,
    pub(crate) unique_items: bool,
    pub(crate) min_contains: Option<u64>,
    pub(crate) max_contains: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NumberNode {
    pub(crate) integer: bool,
    pub(crate) minimum: Option<f64>,
    pub(crate) maximum: Option<f64>,
    pub(crate) exclusive_minimum: Option<f64>,
    pub(crate) exclusive_maximum: Option<f64>,
    pub(crate) multiple_of: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StringNode {
    pub(crate) min_length: Option<u64>,
    pub(crate) max_length: Option<u64>,
    pub(crate) pattern: Option<String>,
}

/// What a node accepts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    /// `{}` or `true`: anything.
    Empty,
    /// `false`: nothing.
    False,
    Null,
    Boolean,
    String(StringNode),
    Number(NumberNode),
    Object(Box<ObjectNode>),
    Array(Box<ArrayNode>),
    Enum(Vec<Value>),
    Const(Value),
    Not(NodeId),
    Combined(Criterion, Vec<NodeId>),
}

impl Kind {
    /// Which kind of schema this is, for "the type changed" comparisons.
    pub(crate) fn class(&self) -> u8 {
        match self {
            Kind::Empty => 0,
            Kind::False => 1,
            Kind::Null => 2,
            Kind::Boolean => 3,
            Kind::String(_) => 4,
            Kind::Number(_) => 5,
            Kind::Object(_) => 6,
            Kind::Array(_) => 7,
            Kind::Enum(_) => 8,
            Kind::Const(_) => 9,
            Kind::Not(_) => 10,
            Kind::Combined(..) => 11,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub(crate) common: Common,
    pub(crate) kind: Kind,
    /// The JSON the node was read from, to tell duplicate subschemas apart from distinct ones.
    pub(crate) raw: Value,
}

/// A schema read into nodes; [`Graph::root`] is the schema itself.
#[derive(Debug, Clone)]
pub(crate) struct Graph {
    pub(crate) nodes: Vec<Node>,
    pub(crate) root: NodeId,
}

impl Graph {
    /// Reads `document`. Draft-04 to draft-07 and 2019-09 / 2020-12 are understood; `$ref` must
    /// be a JSON pointer into the same document (`#/definitions/..`, `#/$defs/..`, `#`).
    pub(crate) fn load(document: &Value, profile: super::Profile) -> Result<Graph, SchemaError> {
        super::validate::validate(document)?;
        let modern = document
            .get("$schema")
            .and_then(Value::as_str)
            .is_some_and(|s| s.contains("2020-12") || s.contains("2019-09"));
        let serde = profile == super::Profile::Serde;
        let canonical = serde.then(|| canonical_value_sets(document));
        let document = canonical.as_ref().unwrap_or(document);
        let mut loader = Loader {
            document,
            modern,
            serde,
            nodes: Vec::new(),
            by_pointer: HashMap::new(),
            building: Vec::new(),
        };
        let root = loader.node(document, "", 0)?;
        Ok(Graph {
            nodes: loader.nodes,
            root,
        })
    }
}
