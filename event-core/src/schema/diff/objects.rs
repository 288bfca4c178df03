//! Objects: properties added, removed and renamed, required, additional and unevaluated properties.

use crate::schema::model::{Graph, Kind, NodeId, ObjectNode};
use crate::schema::rule::Rule;

use super::scalars::bound;
use super::{Comparer, Ctx};

impl<'g> Comparer<'g> {
    /// `renames` are (old name, new name) pairs: a field renamed with `#[serde(alias = "old")]`.
    pub(super) fn objects(
        &mut self,
        ctx: &mut Ctx,
        a: &ObjectNode,
        b: &ObjectNode,
        renames: &[(String, String)],
    ) {
        // required
        ctx.enter("required");
        for key in a.properties.keys() {
            if let Some(&schema) = b.properties.get(key) {
                let (was, is) = (a.required.contains(key), b.required.contains(key));
                if was && !is {
                    ctx.add_at(key, Rule::RequiredAttributeRemoved);
                } else if !was && is {
                    let rule = if self.new.nodes[schema].common.default.is_some() {
                        Rule::RequiredAttributeWithDefaultAdded
                    } else {
                        Rule::RequiredAttributeAdded
                    };
                    ctx.add_at(key, rule);
                }
            }
        }
        ctx.leave();

        // properties
        ctx.enter("properties");
        let keys: std::collections::BTreeSet<&String> =
            a.properties.keys().chain(b.properties.keys()).collect();
        for key in keys {
            ctx.enter(key.clone());
            if let Some((_, renamed)) = renames.iter().find(|(old, _)| old == key) {
                // Renamed, and the new name still accepts the old one: compare the two.
                self.compare(
                    ctx,
                    a.properties.get(key).copied(),
                    b.properties.get(renamed).copied(),
                );
                ctx.leave();
                continue;
            }
            if renames.iter().any(|(_, new)| new == key) {
                ctx.leave();
                continue;
            }
            match (
                a.properties.get(key).copied(),
                b.properties.get(key).copied(),
            ) {
                (Some(old), None) => {
                    if object_is_open(self.new, b) {
                        ctx.add(Rule::PropertyRemovedFromOpenContentModel);
                    } else if let Some(partial) = object_partial(self.new, b, key) {
                        let mut sub = ctx.sub();
                        self.compare(&mut sub, Some(old), Some(partial));
                        let ok = sub.is_compatible();
                        ctx.extend(sub.changes);
                        ctx.add(if ok {
                            Rule::PropertyRemovedIsCoveredByPartiallyOpenContentModel
                        } else {
                            Rule::PropertyRemovedNotCoveredByPartiallyOpenContentModel
                        });
                    } else if matches!(self.old.nodes[old].kind, Kind::False) {
                        ctx.add(Rule::PropertyWithFalseRemovedFromClosedContentModel);
                    } else {
                        ctx.add(Rule::PropertyRemovedFromClosedContentModel);
                    }
                }
                (None, Some(new)) => {
                    if !self.writers_closed && object_is_open(self.old, a) {
                        if matches!(self.new.nodes[new].kind, Kind::Empty) {
                            ctx.add(Rule::PropertyWithEmptySchemaAddedToOpenContentModel);
                        } else {
                            ctx.add(Rule::PropertyAddedToOpenContentModel);
                        }
                    } else {
                        if let Some(partial) = object_partial(self.old, a, key) {
                            let mut sub = ctx.sub();
                            self.compare(&mut sub, Some(partial), Some(new));
                            let ok = sub.is_compatible();
                            ctx.extend(sub.changes);
                            ctx.add(if ok {
                                Rule::PropertyAddedIsCoveredByPartiallyOpenContentModel
                            } else {
                                Rule::PropertyAddedNotCoveredByPartiallyOpenContentModel
                            });
                        }
                        if b.required.contains(key) {
                            if self.new.nodes[new].common.default.is_some() {
                                ctx.add(Rule::RequiredPropertyWithDefaultAddedToUnopenContentModel);
                            } else {
                                ctx.add(Rule::RequiredPropertyAddedToUnopenContentModel);
                            }
                        } else {
                            ctx.add(Rule::OptionalPropertyAddedToUnopenContentModel);
                        }
                    }
                }
                (old, new) => self.compare(ctx, old, new),
            }
            ctx.leave();
        }
        ctx.leave();

        // dependencies
        ctx.enter("dependencies");
        let keys: std::collections::BTreeSet<&String> = a
            .property_dependencies
            .keys()
            .chain(b.property_dependencies.keys())
            .collect();
        for key in keys {
            ctx.enter(key.clone());
            match (
                a.property_dependencies.get(key),
                b.property_dependencies.get(key),
            ) {
                (_, None) => ctx.add(Rule::DependencyArrayRemoved),
                (None, Some(_)) => ctx.add(Rule::DependencyArrayAdded),
                (Some(was), Some(is)) if was != is => {
                    if is.is_superset(was) {
                        ctx.add(Rule::DependencyArrayExtended);
                    } else if was.is_superset(is) {
                        ctx.add(Rule::DependencyArrayNarrowed);
                    } else {
                        ctx.add(Rule::DependencyArrayChanged);
                    }
                }
                _ => {}
            }
            ctx.leave();
        }
        let keys: std::collections::BTreeSet<&String> = a
            .schema_dependencies
            .keys()
            .chain(b.schema_dependencies.keys())
            .collect();
        for key in keys {
            ctx.enter(key.clone());
            match (
                a.schema_dependencies.get(key),
                b.schema_dependencies.get(key),
            ) {
                (_, None) => ctx.add(Rule::DependencySchemaRemoved),
                (None, Some(_)) => ctx.add(Rule::DependencySchemaAdded),
                (Some(&old), Some(&new)) => self.compare(ctx, Some(old), Some(new)),
            }
            ctx.leave();
        }
        ctx.leave();

        // additionalProperties. A serde struct never emits undeclared properties: whatever its
        // schema says, it wrote none. (A map's value schema is data, and stays.)
        let (a_permits, a_additional) = if self.writers_closed && a.additional.is_none() {
            (false, None)
        } else {
            (a.permits_additional, a.additional)
        };
        ctx.enter("additionalProperties");
        if a_permits != b.permits_additional {
            ctx.add(if b.permits_additional {
                Rule::AdditionalPropertiesAdded
            } else {
                Rule::AdditionalPropertiesRemoved
            });
        } else if a_additional.is_none() && b.additional.is_some() {
            ctx.add(Rule::AdditionalPropertiesNarrowed);
        } else if a_additional.is_some() && b.additional.is_none() {
            ctx.add(Rule::AdditionalPropertiesExtended);
        } else {
            self.compare(ctx, a_additional, b.additional);
        }
        ctx.leave();

        self.unevaluated(
            ctx,
            "unevaluatedProperties",
            a.unevaluated,
            b.unevaluated,
            [
                Rule::UnevaluatedPropertiesAdded,
                Rule::UnevaluatedPropertiesRemoved,
                Rule::UnevaluatedPropertiesExtended,
                Rule::UnevaluatedPropertiesNarrowed,
            ],
        );

        bound(
            ctx,
            "maxProperties",
            a.max_properties,
            b.max_properties,
            [
                Rule::MaxPropertiesAdded,
                Rule::MaxPropertiesRemoved,
                Rule::MaxPropertiesIncreased,
                Rule::MaxPropertiesDecreased,
            ],
        );
        bound(
            ctx,
            "minProperties",
            a.min_properties,
            b.min_properties,
            [
                Rule::MinPropertiesAdded,
                Rule::MinPropertiesRemoved,
                Rule::MinPropertiesIncreased,
                Rule::MinPropertiesDecreased,
            ],
        );
    }

    /// `unevaluatedItems` / `unevaluatedProperties`; `rules` are added, removed, extended, narrowed.
    pub(super) fn unevaluated(
        &mut self,
        ctx: &mut Ctx,
        keyword: &str,
        a: Option<NodeId>,
        b: Option<NodeId>,
        rules: [Rule; 4],
    ) {
        let [added, removed, extended, narrowed] = rules;
        if a.is_none() && b.is_none() {
            return;
        }
        let is_false = |g: &Graph, id: NodeId| matches!(g.nodes[id].kind, Kind::False);
        let is_empty = |g: &Graph, id: NodeId| matches!(g.nodes[id].kind, Kind::Empty);
        ctx.enter(keyword);
        match (a, b) {
            (None, Some(n)) => ctx.add(if is_false(self.new, n) {
                removed
            } else {
                narrowed
            }),
            (Some(o), None) => ctx.add(if is_false(self.old, o) {
                added
            } else {
                extended
            }),
            (Some(o), Some(n)) => {
                if is_false(self.old, o) && !is_false(self.new, n) {
                    ctx.add(added);
                } else if !is_false(self.old, o) && is_false(self.new, n) {
                    ctx.add(removed);
                } else if is_empty(self.old, o) && !is_empty(self.new, n) {
                    ctx.add(narrowed);
                } else if !is_empty(self.old, o) && is_empty(self.new, n) {
                    ctx.add(extended);
                } else {
                    self.compare(ctx, Some(o), Some(n));
                }
            }
            (None, None) => {}
        }
        ctx.leave();
    }
}

/// Properties of `b` whose `x-aliases` name a property of `a` that `b` no longer has:
/// (old name, new name).
pub(super) fn renames(
    a: &ObjectNode,
    b: &ObjectNode,
    b_raw: &serde_json::Value,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for new_name in b
        .properties
        .keys()
        .filter(|k| !a.properties.contains_key(*k))
    {
        let aliases = b_raw
            .get("properties")
            .and_then(|p| p.get(new_name))
            .and_then(|p| p.get("x-aliases"))
            .and_then(serde_json::Value::as_array);
        for alias in aliases
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_str)
        {
            if a.properties.contains_key(alias) && !b.properties.contains_key(alias) {
                out.push((alias.to_owned(), new_name.clone()));
                break;
            }
        }
    }
    out
}

pub(super) fn object_is_open(graph: &Graph, o: &ObjectNode) -> bool {
    o.pattern_properties.is_empty()
        && o.additional.is_none()
        && o.permits_additional
        && o.unevaluated
            .is_none_or(|u| matches!(graph.nodes[u].kind, Kind::Empty))
}

pub(super) fn object_partial(graph: &Graph, o: &ObjectNode, key: &str) -> Option<NodeId> {
    for (pattern, schema) in &o.pattern_properties {
        if regex_lite::Regex::new(pattern).is_ok_and(|re| re.is_match(key)) {
            return Some(*schema);
        }
    }
    if o.additional.is_some() {
        return o.additional;
    }
    unevaluated_partial(graph, o.permits_additional, o.unevaluated)
}

/// With `additional*` absent, an `unevaluated*` schema other than `true`/`false` is what extra
/// properties or items must match.
pub(super) fn unevaluated_partial(
    graph: &Graph,
    permits_additional: bool,
    unevaluated: Option<NodeId>,
) -> Option<NodeId> {
    unevaluated.filter(|&u| {
        permits_additional && !matches!(graph.nodes[u].kind, Kind::False | Kind::Empty)
    })
}
