//! Arrays: items, prefix items, additional and unevaluated items, and their bounds.

use crate::schema::model::{ArrayNode, Graph, Kind, NodeId};
use crate::schema::rule::Rule;

use super::objects::unevaluated_partial;
use super::scalars::bound;
use super::{Comparer, Ctx};

impl<'g> Comparer<'g> {
    pub(super) fn arrays(&mut self, ctx: &mut Ctx, a: &ArrayNode, b: &ArrayNode) {
        ctx.enter("items");
        self.compare(ctx, a.all_items, b.all_items);
        ctx.leave();

        let common = a.item_schemas.len().min(b.item_schemas.len());
        for index in 0..common {
            ctx.enter(format!("items/{index}"));
            self.compare(
                ctx,
                Some(a.item_schemas[index]),
                Some(b.item_schemas[index]),
            );
            ctx.leave();
        }
        for (index, &old) in a.item_schemas.iter().enumerate().skip(common) {
            ctx.enter(format!("items/{index}"));
            if array_is_open(self.new, b) {
                ctx.add(Rule::ItemRemovedFromOpenContentModel);
            } else if let Some(partial) = array_partial(self.new, b) {
                let mut sub = ctx.sub();
                self.compare(&mut sub, Some(old), Some(partial));
                let ok = sub.is_compatible();
                ctx.extend(sub.changes);
                ctx.add(if ok {
                    Rule::ItemRemovedIsCoveredByPartiallyOpenContentModel
                } else {
                    Rule::ItemRemovedNotCoveredByPartiallyOpenContentModel
                });
            } else if matches!(self.old.nodes[old].kind, Kind::False) {
                ctx.add(Rule::ItemWithFalseRemovedFromClosedContentModel);
            } else {
                ctx.add(Rule::ItemRemovedFromClosedContentModel);
            }
            ctx.leave();
        }
        for (index, &new) in b.item_schemas.iter().enumerate().skip(common) {
            ctx.enter(format!("items/{index}"));
            if array_is_open(self.old, a) {
                if matches!(self.new.nodes[new].kind, Kind::Empty) {
                    ctx.add(Rule::ItemWithEmptySchemaAddedToOpenContentModel);
                } else {
                    ctx.add(Rule::ItemAddedToOpenContentModel);
                }
            } else if let Some(partial) = array_partial(self.old, a) {
                let mut sub = ctx.sub();
                self.compare(&mut sub, Some(partial), Some(new));
                let ok = sub.is_compatible();
                ctx.extend(sub.changes);
                ctx.add(if ok {
                    Rule::ItemAddedIsCoveredByPartiallyOpenContentModel
                } else {
                    Rule::ItemAddedNotCoveredByPartiallyOpenContentModel
                });
            } else {
                ctx.add(Rule::ItemAddedToClosedContentModel);
            }
            ctx.leave();
        }

        ctx.enter("additionalItems");
        if a.permits_additional != b.permits_additional {
            ctx.add(if a.permits_additional {
                Rule::AdditionalItemsRemoved
            } else {
                Rule::AdditionalItemsAdded
            });
        } else if a.additional.is_none() && b.additional.is_some() {
            ctx.add(Rule::AdditionalItemsNarrowed);
        } else if a.additional.is_some() && b.additional.is_none() {
            ctx.add(Rule::AdditionalItemsExtended);
        } else {
            self.compare(ctx, a.additional, b.additional);
        }
        ctx.leave();

        self.unevaluated(
            ctx,
            "unevaluatedItems",
            a.unevaluated,
            b.unevaluated,
            [
                Rule::UnevaluatedItemsAdded,
                Rule::UnevaluatedItemsRemoved,
                Rule::UnevaluatedItemsExtended,
                Rule::UnevaluatedItemsNarrowed,
            ],
        );

        bound(
            ctx,
            "maxItems",
            a.max_items,
            b.max_items,
            [
                Rule::MaxItemsAdded,
                Rule::MaxItemsRemoved,
                Rule::MaxItemsIncreased,
                Rule::MaxItemsDecreased,
            ],
        );
        bound(
            ctx,
            "minItems",
            a.min_items,
            b.min_items,
            [
                Rule::MinItemsAdded,
                Rule::MinItemsRemoved,
                Rule::MinItemsIncreased,
                Rule::MinItemsDecreased,
            ],
        );
        if a.unique_items != b.unique_items {
            ctx.add_at(
                "uniqueItems",
                if a.unique_items {
                    Rule::UniqueItemsRemoved
                } else {
                    Rule::UniqueItemsAdded
                },
            );
        }
        bound(
            ctx,
            "maxContains",
            a.max_contains,
            b.max_contains,
            [
                Rule::MaxContainsAdded,
                Rule::MaxContainsRemoved,
                Rule::MaxContainsIncreased,
                Rule::MaxContainsDecreased,
            ],
        );
        bound(
            ctx,
            "minContains",
            a.min_contains,
            b.min_contains,
            [
                Rule::MinContainsAdded,
                Rule::MinContainsRemoved,
                Rule::MinContainsIncreased,
                Rule::MinContainsDecreased,
            ],
        );
    }
}

pub(super) fn array_is_open(graph: &Graph, a: &ArrayNode) -> bool {
    a.permits_additional
        && a.additional.is_none()
        && a.unevaluated
            .is_none_or(|u| matches!(graph.nodes[u].kind, Kind::Empty))
}

pub(super) fn array_partial(graph: &Graph, a: &ArrayNode) -> Option<NodeId> {
    if a.additional.is_some() {
        return a.additional;
    }
    unevaluated_partial(graph, a.permits_additional, a.unevaluated)
}
