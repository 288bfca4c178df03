//! `allOf`, `anyOf`, `oneOf` and `not`: how the subschemas of two combined schemas are paired,
//! by tag when a union is tagged, and what a schema that gains or loses a combiner changes.

use std::collections::{HashMap, HashSet};

use crate::schema::model::{Criterion, Graph, Kind, NodeId};
use crate::schema::rule::Rule;

use super::{Change, Comparer, Ctx};

impl<'g> Comparer<'g> {
    pub(super) fn combined(
        &mut self,
        ctx: &mut Ctx,
        ca: Criterion,
        sa: &[NodeId],
        cb: Criterion,
        sb: &[NodeId],
    ) {
        let criterion_change = if ca == cb {
            None
        } else if cb == Criterion::Any {
            Some(Rule::CombinedTypeExtended)
        } else if cb == Criterion::One {
            // A singleton on either side: the subschema matching below decides.
            Some(if sa.len() == 1 || sb.len() == 1 {
                Rule::CombinedTypeExtended
            } else {
                Rule::CombinedTypeChanged
            })
        } else if sa.len() == 1 && sb.len() == 1 {
            Some(Rule::CombinedTypeExtended)
        } else {
            Some(Rule::CombinedTypeChanged)
        };
        if let Some(rule) = criterion_change {
            ctx.add(rule);
            if rule == Rule::CombinedTypeChanged {
                return;
            }
        }
        if !self.spend(sa.len() + sb.len()) {
            return;
        }
        let olds = distinct(self.old, sa);
        let news = distinct(self.new, sb);
        if olds.len() < news.len() {
            ctx.add(if cb == Criterion::All {
                Rule::ProductTypeExtended
            } else {
                Rule::SumTypeExtended
            });
        } else if olds.len() > news.len() {
            // Fewer subschemas narrow what the old combination was: fewer conjuncts accept more.
            ctx.add(if ca == Criterion::All {
                Rule::ProductTypeNarrowed
            } else {
                Rule::SumTypeNarrowed
            });
        }
        let matching = self.match_subschemas(ctx, ca, &olds, &news);
        let matched = matching.len();
        for (_, _, changes) in matching {
            ctx.extend(changes);
        }
        if matched < olds.len().min(news.len()) {
            ctx.add(Rule::CombinedTypeSubschemasChanged);
        }
    }

    /// A maximum matching of old to new subschemas, each pair compatible, with its changes.
    ///
    /// Subschemas written the same on both sides, with no `$ref` inside, match at once. The
    /// rest are compared pairwise, but only where their discriminators agree: two object
    /// subschemas whose properties hold different `const`s accept different data, and are not
    /// compared. A tagged union of thousands of variants costs about as much as its size.
    pub(super) fn match_subschemas(
        &mut self,
        ctx: &mut Ctx,
        ca: Criterion,
        olds: &[NodeId],
        news: &[NodeId],
    ) -> Vec<(usize, usize, Vec<Change>)> {
        let text =
            |g: &Graph, id: NodeId| serde_json::to_string(&g.nodes[id].raw).unwrap_or_default();
        let mut matched: Vec<(usize, usize, Vec<Change>)> = Vec::new();
        let mut new_taken = vec![false; news.len()];
        let mut by_text: HashMap<String, Vec<usize>> = HashMap::new();
        for (j, &n) in news.iter().enumerate() {
            by_text.entry(text(self.new, n)).or_default().push(j);
        }
        let mut rest: Vec<usize> = Vec::new();
        for (i, &o) in olds.iter().enumerate() {
            let written = text(self.old, o);
            let same = (!written.contains("\"$ref\""))
                .then(|| by_text.get_mut(&written))
                .flatten()
                .and_then(|js| {
                    js.iter()
                        .position(|&j| !new_taken[j])
                        .map(|k| js.swap_remove(k))
                });
            match same {
                Some(j) => {
                    new_taken[j] = true;
                    matched.push((i, j, Vec::new()));
                }
                None => rest.push(i),
            }
        }
        let free: Vec<usize> = (0..news.len()).filter(|&j| !new_taken[j]).collect();
        if rest.is_empty() || free.is_empty() {
            return matched;
        }
        // The rest: edges only between pairs of the same type whose discriminators agree (a
        // new `anyOf`/`oneOf` or `true` may accept anything, so it stays a candidate for all).
        let wildcard = |kind: &Kind| matches!(kind, Kind::Combined(..) | Kind::Empty);
        let mut any_new: Vec<usize> = Vec::new();
        let mut by_class: HashMap<u8, Vec<usize>> = HashMap::new();
        let mut untagged: HashMap<u8, Vec<usize>> = HashMap::new();
        let mut by_tag: HashMap<(u8, (String, String)), Vec<usize>> = HashMap::new();
        for (k, &j) in free.iter().enumerate() {
            let node = &self.new.nodes[news[j]];
            if wildcard(&node.kind) {
                any_new.push(k);
                continue;
            }
            let class = node.kind.class();
            by_class.entry(class).or_default().push(k);
            match discriminator(&node.raw) {
                Some(tag) => by_tag.entry((class, tag)).or_default().push(k),
                None => untagged.entry(class).or_default().push(k),
            }
        }
        let candidates: Vec<Vec<usize>> = rest
            .iter()
            .enumerate()
            .map(|(r, &i)| {
                let node = &self.old.nodes[olds[i]];
                let mut list: Vec<usize> = if matches!(node.kind, Kind::Combined(..) | Kind::False)
                {
                    (0..free.len()).collect()
                } else {
                    let class = node.kind.class();
                    let same_type = match discriminator(&node.raw) {
                        Some(tag) => by_tag
                            .get(&(class, tag))
                            .into_iter()
                            .flatten()
                            .chain(untagged.get(&class).into_iter().flatten())
                            .copied()
                            .collect::<Vec<_>>(),
                        None => by_class.get(&class).cloned().unwrap_or_default(),
                    };
                    same_type
                        .into_iter()
                        .chain(any_new.iter().copied())
                        .collect()
                };
                // The subschema at the same place first: lists usually change at their ends.
                if let Some(at) = list.iter().position(|&k| k == r) {
                    list.swap(0, at);
                }
                list
            })
            .collect();
        // Edges are compared when the matching needs them, once each.
        let mut edges: HashMap<(usize, usize), Option<Vec<Change>>> = HashMap::new();
        let mut owner: Vec<Option<usize>> = vec![None; free.len()];
        // First pass: each old subschema takes the first free compatible candidate.
        for (r, &i) in rest.iter().enumerate() {
            for &k in &candidates[r] {
                if owner[k].is_some() {
                    continue;
                }
                if self.edge(ctx, ca, &mut edges, (r, k), (i, olds[i]), news[free[k]]) {
                    owner[k] = Some(r);
                    break;
                }
                if self.work > self.limit {
                    return matched;
                }
            }
        }
        // Then augmenting paths (Kuhn) for the rest, which may move earlier choices.
        let mut taken = vec![false; rest.len()];
        for r in owner.iter().flatten() {
            taken[*r] = true;
        }
        let unmatched: Vec<usize> = (0..rest.len()).filter(|&r| !taken[r]).collect();
        for r in unmatched {
            if self.work > self.limit {
                break;
            }
            let mut seen = vec![false; free.len()];
            self.augment(
                ctx,
                ca,
                r,
                &rest,
                olds,
                news,
                &free,
                &candidates,
                &mut edges,
                &mut seen,
                &mut owner,
            );
        }
        for (k, r) in owner.iter().enumerate() {
            if let Some(r) = *r
                && let Some(Some(changes)) = edges.remove(&(r, k))
            {
                matched.push((rest[r], free[k], changes));
            }
        }
        matched
    }

    /// Kuhn's augmenting path from unmatched old subschema `r`, comparing edges as it goes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn augment(
        &mut self,
        ctx: &mut Ctx,
        ca: Criterion,
        r: usize,
        rest: &[usize],
        olds: &[NodeId],
        news: &[NodeId],
        free: &[usize],
        candidates: &[Vec<usize>],
        edges: &mut HashMap<(usize, usize), Option<Vec<Change>>>,
        seen: &mut [bool],
        owner: &mut [Option<usize>],
    ) -> bool {
        for &k in &candidates[r] {
            if seen[k] || self.work > self.limit {
                continue;
            }
            if !self.edge(
                ctx,
                ca,
                edges,
                (r, k),
                (rest[r], olds[rest[r]]),
                news[free[k]],
            ) {
                continue;
            }
            seen[k] = true;
            let taken_by = owner[k];
            if taken_by.is_none_or(|other| {
                self.augment(
                    ctx, ca, other, rest, olds, news, free, candidates, edges, seen, owner,
                )
            }) {
                owner[k] = Some(r);
                return true;
            }
        }
        false
    }
}

/// Subschemas without duplicates (by their JSON), in order.
pub(super) fn distinct(graph: &Graph, ids: &[NodeId]) -> Vec<NodeId> {
    let mut seen = HashSet::with_capacity(ids.len());
    ids.iter()
        .copied()
        .filter(|&id| seen.insert(serde_json::to_string(&graph.nodes[id].raw).unwrap_or_default()))
        .collect()
}

/// An object subschema's discriminator: its first property (by name) whose value is fixed by
/// `const` or a one-value `enum`, and that value. Two subschemas with the same property fixed
/// to different values accept different data.
pub(super) fn discriminator(raw: &serde_json::Value) -> Option<(String, String)> {
    let properties = raw.get("properties")?.as_object()?;
    let mut names: Vec<&String> = properties.keys().collect();
    names.sort();
    names.into_iter().find_map(|name| {
        let schema = properties.get(name)?;
        let fixed = schema.get("const").or_else(|| {
            schema
                .get("enum")
                .and_then(serde_json::Value::as_array)
                .filter(|values| values.len() == 1)
                .and_then(|values| values.first())
        })?;
        Some((name.clone(), fixed.to_string()))
    })
}
