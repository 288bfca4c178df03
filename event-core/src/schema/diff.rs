//! Compares two schema graphs, rule by rule, the way Confluent Schema Registry's JSON-schema diff
//! does: the changes that a reader on the new schema sees when it reads data written with the old
//! one.

use std::collections::{HashMap, HashSet};

use super::model::{ArrayNode, Criterion, Graph, Kind, NodeId, NumberNode, ObjectNode, StringNode};
use super::rule::Rule;

/// One change, at a JSON pointer into the schemas (`#/properties/amount/maximum`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Change {
    pub(crate) rule: Rule,
    pub(crate) path: String,
}

/// Where changes are being collected, and the path to the current position.
#[derive(Debug, Default)]
struct Ctx {
    path: Vec<String>,
    changes: Vec<Change>,
}

impl Ctx {
    fn sub(&self) -> Ctx {
        Ctx {
            path: self.path.clone(),
            changes: Vec::new(),
        }
    }

    fn pointer(&self) -> String {
        format!("#/{}", self.path.join("/"))
    }

    fn add(&mut self, rule: Rule) {
        let path = self.pointer();
        self.changes.push(Change { rule, path });
    }

    fn add_at(&mut self, attribute: &str, rule: Rule) {
        self.path.push(attribute.to_owned());
        self.add(rule);
        self.path.pop();
    }

    fn extend(&mut self, changes: Vec<Change>) {
        self.changes.extend(changes);
    }

    /// Adds changes computed relative to a pair, under the current path.
    fn extend_rebased(&mut self, relative: &[Change]) {
        let prefix = self.pointer();
        for change in relative {
            let path = if self.path.is_empty() {
                change.path.clone()
            } else if change.path.len() <= 2 {
                prefix.clone()
            } else {
                format!("{prefix}/{}", &change.path[2..])
            };
            self.changes.push(Change {
                rule: change.rule,
                path,
            });
        }
    }

    fn is_compatible(&self) -> bool {
        self.changes.iter().all(|c| c.rule.is_compatible())
    }

    fn enter(&mut self, segment: impl Into<String>) {
        self.path.push(segment.into());
    }

    fn leave(&mut self) {
        self.path.pop();
    }
}

/// The comparison of one old graph with one new graph. Each pair of nodes is compared once: the
/// result is kept, and a pair met again while it is still being compared (a recursive schema) is
/// taken as compatible, so every comparison terminates.
pub(crate) struct Comparer<'g> {
    old: &'g Graph,
    new: &'g Graph,
    /// Inside an odd number of `not`s the two graphs are swapped; pairs are keyed with it.
    swapped: bool,
    /// Serde's writers emit only the fields they declare: the old (writing) side is closed.
    writers_closed: bool,
    memo: HashMap<(bool, NodeId, NodeId), Vec<Change>>,
    in_progress: HashSet<(bool, NodeId, NodeId)>,
    /// Units of work done: one per pair of nodes compared, one per enum value or subschema
    /// looked at. Bounded by [`WORK_LIMIT`].
    work: u64,
    limit: u64,
}

/// The most work one comparison may do before it gives up with [`SchemaError::TooComplex`]:
/// far above any real schema (an event's schema takes a few hundred; the 25-level shared
/// definition test under two hundred), far below what takes a CI runner down (a million units
/// are a few seconds and a few hundred MB at most).
///
/// [`SchemaError::TooComplex`]: super::SchemaError::TooComplex
pub(crate) const WORK_LIMIT: u64 = 1_000_000;

/// A shared definition reached again contributes at most this many of its changes at the new
/// place (its breaking ones first): every change is reported where the definition was first
/// met, and a sample elsewhere, so that a definition reached by exponentially many paths costs
/// as much as one reached once.
const SAMPLE: usize = 8;

impl<'g> Comparer<'g> {
    pub(crate) fn new(old: &'g Graph, new: &'g Graph, profile: super::Profile) -> Comparer<'g> {
        Comparer {
            old,
            new,
            swapped: false,
            writers_closed: profile == super::Profile::Serde,
            memo: HashMap::new(),
            in_progress: HashSet::new(),
            work: 0,
            limit: WORK_LIMIT,
        }
    }

    /// Gives up after `limit` units of work instead of [`WORK_LIMIT`].
    #[cfg(test)]
    pub(crate) fn with_limit(mut self, limit: u64) -> Self {
        self.limit = limit;
        self
    }

    /// Every change from the old root to the new root, and the work it took; an error when the
    /// work passed the limit.
    pub(crate) fn changes(self) -> Result<Vec<Change>, super::SchemaError> {
        self.changes_and_work().map(|(changes, _)| changes)
    }

    /// [`Comparer::changes`] and the units of work spent.
    pub(crate) fn changes_and_work(mut self) -> Result<(Vec<Change>, u64), super::SchemaError> {
        let mut ctx = Ctx::default();
        self.compare(&mut ctx, Some(self.old.root), Some(self.new.root));
        if self.work > self.limit {
            return Err(super::SchemaError::TooComplex { limit: self.limit });
        }
        Ok((ctx.changes, self.work))
    }

    /// Counts `units` of work; false once the limit is passed, and every comparison then
    /// returns at once.
    fn spend(&mut self, units: usize) -> bool {
        self.work = self
            .work
            .saturating_add(u64::try_from(units).unwrap_or(u64::MAX));
        self.work <= self.limit
    }

    fn compare(&mut self, ctx: &mut Ctx, old: Option<NodeId>, new: Option<NodeId>) {
        let (old, new) = match (old, new) {
            (None, None) => return,
            (None, Some(_)) => return ctx.add(Rule::SchemaAdded),
            (Some(_), None) => return ctx.add(Rule::SchemaRemoved),
            (Some(old), Some(new)) => (old, new),
        };
        if !self.spend(1) {
            return;
        }
        let key = (self.swapped, old, new);
        if let Some(known) = self.memo.get(&key) {
            // Reached again: a sample, its breaking changes first (see SAMPLE).
            let sample = sample(known);
            return ctx.extend_rebased(&sample);
        }
        if !self.in_progress.insert(key) {
            return;
        }
        let mut pair = Ctx::default();
        self.compare_nodes(&mut pair, old, new);
        self.in_progress.remove(&key);
        ctx.extend_rebased(&pair.changes);
        self.memo.insert(key, pair.changes);
    }

    fn compare_nodes(&mut self, ctx: &mut Ctx, old: NodeId, new: NodeId) {
        let (o, n) = (&self.old.nodes[old], &self.new.nodes[new]);
        match (&o.kind, &n.kind) {
            (Kind::Combined(..), Kind::Combined(..)) => {}
            (_, Kind::Combined(criterion, subs)) => {
                let (criterion, subs) = (*criterion, subs.clone());
                if subs.len() == 1 {
                    let mut sub = ctx.sub();
                    self.compare(&mut sub, Some(old), Some(subs[0]));
                    if sub.is_compatible() {
                        return ctx.extend(sub.changes);
                    }
                } else if matches!(criterion, Criterion::Any | Criterion::One) {
                    for candidate in subs {
                        let mut sub = ctx.sub();
                        self.compare(&mut sub, Some(old), Some(candidate));
                        if sub.is_compatible() {
                            ctx.extend(sub.changes);
                            return ctx.add(Rule::SumTypeExtended);
                        }
                    }
                }
            }
            (Kind::Combined(_, subs), _) if subs.len() == 1 => {
                let only = subs[0];
                let mut sub = ctx.sub();
                self.compare(&mut sub, Some(only), Some(new));
                if sub.is_compatible() {
                    return ctx.extend(sub.changes);
                }
            }
            (Kind::Combined(Criterion::All, subs), _) => {
                // Data valid for all the conjuncts is valid for any one of them: the new schema
                // may keep just one.
                for candidate in subs.clone() {
                    let mut sub = ctx.sub();
                    self.compare(&mut sub, Some(candidate), Some(new));
                    if sub.is_compatible() {
                        ctx.extend(sub.changes);
                        return ctx.add(Rule::ProductTypeNarrowed);
                    }
                }
            }
            _ => {}
        }
        let (o, n) = (&self.old.nodes[old], &self.new.nodes[new].clone());
        if o.kind.class() != n.kind.class() {
            if !(matches!(o.kind, Kind::False) || matches!(n.kind, Kind::Empty)) {
                ctx.add(Rule::TypeChanged);
            }
            return;
        }
        if o.common.id != n.common.id {
            ctx.add(Rule::IdChanged);
        }
        if o.common.title != n.common.title {
            ctx.add(Rule::TitleChanged);
        }
        if o.common.description != n.common.description {
            ctx.add(Rule::DescriptionChanged);
        }
        if o.common.default != n.common.default {
            ctx.add(Rule::DefaultChanged);
        }
        match (o.kind.clone(), n.kind.clone()) {
            (Kind::String(a), Kind::String(b)) => strings(ctx, &a, &b),
            (Kind::Number(a), Kind::Number(b)) => numbers(ctx, &a, &b),
            (Kind::Enum(a), Kind::Enum(b)) => {
                if !self.spend(a.len() + b.len()) {
                    return;
                }
                // As sets, numbers by value: 1 and 1.0 are one value.
                let (a_set, b_set) = (value_set(&a), value_set(&b));
                let a_in_b = a_set.is_subset(&b_set);
                let b_in_a = b_set.is_subset(&a_set);
                if !(a_in_b && b_in_a) {
                    if a_in_b {
                        ctx.add_at("enum", Rule::EnumArrayExtended);
                    } else if b_in_a {
                        ctx.add_at("enum", Rule::EnumArrayNarrowed);
                    } else {
                        ctx.add_at("enum", Rule::EnumArrayChanged);
                    }
                }
            }
            (Kind::Const(a), Kind::Const(b)) if a != b => {
                ctx.add_at("const", Rule::EnumArrayChanged)
            }
            (Kind::Not(a), Kind::Not(b)) => {
                ctx.enter("not");
                let mut sub = ctx.sub();
                // What the old schema excluded must still be excluded: compare them reversed.
                self.swap();
                self.compare(&mut sub, Some(b), Some(a));
                self.swap();
                ctx.add(if sub.is_compatible() {
                    Rule::NotTypeNarrowed
                } else {
                    Rule::NotTypeExtended
                });
                ctx.leave();
            }
            (Kind::Combined(ca, sa), Kind::Combined(cb, sb)) => {
                self.combined(ctx, ca, &sa, cb, &sb)
            }
            (Kind::Object(a), Kind::Object(b)) => {
                let renames = if self.writers_closed {
                    renames(&a, &b, &n.raw)
                } else {
                    Vec::new()
                };
                self.objects(ctx, &a, &b, &renames)
            }
            (Kind::Array(a), Kind::Array(b)) => self.arrays(ctx, &a, &b),
            _ => {}
        }
    }

    fn swap(&mut self) {
        std::mem::swap(&mut self.old, &mut self.new);
        self.swapped = !self.swapped;
    }

    fn combined(
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
    fn match_subschemas(
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

    /// Whether old subschema `i` (the `r`th unmatched) and the new subschema `new` (the `k`th
    /// free) are compatible, compared once and remembered in `edges`.
    fn edge(
        &mut self,
        ctx: &mut Ctx,
        ca: Criterion,
        edges: &mut HashMap<(usize, usize), Option<Vec<Change>>>,
        (r, k): (usize, usize),
        (i, old): (usize, NodeId),
        new: NodeId,
    ) -> bool {
        if let Some(known) = edges.get(&(r, k)) {
            return known.is_some();
        }
        let (o, n) = (&self.old.nodes[old].kind, &self.new.nodes[new].kind);
        let combined = |kind: &Kind| matches!(kind, Kind::Combined(..));
        if !combined(o)
            && !combined(n)
            && o.class() != n.class()
            && !matches!(o, Kind::False)
            && !matches!(n, Kind::Empty)
        {
            // Different types: incompatible, as `compare_nodes` would find; cheap enough to tell
            // again than to remember.
            self.spend(1);
            return false;
        }
        ctx.enter(format!("{}/{i}", ca.keyword()));
        let mut sub = ctx.sub();
        self.compare(&mut sub, Some(old), Some(new));
        ctx.leave();
        let compatible = sub.is_compatible();
        edges.insert((r, k), compatible.then_some(sub.changes));
        compatible
    }

    /// Kuhn's augmenting path from unmatched old subschema `r`, comparing edges as it goes.
    #[allow(clippy::too_many_arguments)]
    fn augment(
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

    /// `renames` are (old name, new name) pairs: a field renamed with `#[serde(alias = "old")]`.
    fn objects(
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
    fn unevaluated(
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

    fn arrays(&mut self, ctx: &mut Ctx, a: &ArrayNode, b: &ArrayNode) {
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

/// Properties of `b` whose `x-aliases` name a property of `a` that `b` no longer has:
/// (old name, new name).
fn renames(a: &ObjectNode, b: &ObjectNode, b_raw: &serde_json::Value) -> Vec<(String, String)> {
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

/// Subschemas without duplicates (by their JSON), in order.
fn distinct(graph: &Graph, ids: &[NodeId]) -> Vec<NodeId> {
    let mut seen = HashSet::with_capacity(ids.len());
    ids.iter()
        .copied()
        .filter(|&id| seen.insert(serde_json::to_string(&graph.nodes[id].raw).unwrap_or_default()))
        .collect()
}

/// The values of an `enum`, as a set: numbers by value (1 and 1.0 are one value), the rest by
/// their JSON.
fn value_set(values: &[serde_json::Value]) -> HashSet<String> {
    values
        .iter()
        .map(|v| match v.as_f64() {
            Some(number) if v.is_number() => format!("n:{number:?}"),
            _ => format!("j:{v}"),
        })
        .collect()
}

/// An object subschema's discriminator: its first property (by name) whose value is fixed by
/// `const` or a one-value `enum`, and that value. Two subschemas with the same property fixed
/// to different values accept different data.
fn discriminator(raw: &serde_json::Value) -> Option<(String, String)> {
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

/// At most [`SAMPLE`] of `changes`, the breaking ones first.
fn sample(changes: &[Change]) -> Vec<Change> {
    if changes.len() <= SAMPLE {
        return changes.to_vec();
    }
    let breaking = changes.iter().filter(|c| !c.rule.is_compatible());
    let rest = changes.iter().filter(|c| c.rule.is_compatible());
    breaking.chain(rest).take(SAMPLE).cloned().collect()
}

fn object_is_open(graph: &Graph, o: &ObjectNode) -> bool {
    o.pattern_properties.is_empty()
        && o.additional.is_none()
        && o.permits_additional
        && o.unevaluated
            .is_none_or(|u| matches!(graph.nodes[u].kind, Kind::Empty))
}

fn object_partial(graph: &Graph, o: &ObjectNode, key: &str) -> Option<NodeId> {
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
fn unevaluated_partial(
    graph: &Graph,
    permits_additional: bool,
    unevaluated: Option<NodeId>,
) -> Option<NodeId> {
    unevaluated.filter(|&u| {
        permits_additional && !matches!(graph.nodes[u].kind, Kind::False | Kind::Empty)
    })
}

fn array_is_open(graph: &Graph, a: &ArrayNode) -> bool {
    a.permits_additional
        && a.additional.is_none()
        && a.unevaluated
            .is_none_or(|u| matches!(graph.nodes[u].kind, Kind::Empty))
}

fn array_partial(graph: &Graph, a: &ArrayNode) -> Option<NodeId> {
    if a.additional.is_some() {
        return a.additional;
    }
    unevaluated_partial(graph, a.permits_additional, a.unevaluated)
}

/// A numeric bound; `rules` are added, removed, increased, decreased.
fn bound<T: PartialOrd + Copy>(
    ctx: &mut Ctx,
    attribute: &str,
    a: Option<T>,
    b: Option<T>,
    rules: [Rule; 4],
) {
    let [added, removed, increased, decreased] = rules;
    match (a, b) {
        (None, Some(_)) => ctx.add_at(attribute, added),
        (Some(_), None) => ctx.add_at(attribute, removed),
        (Some(a), Some(b)) if a < b => ctx.add_at(attribute, increased),
        (Some(a), Some(b)) if a > b => ctx.add_at(attribute, decreased),
        _ => {}
    }
}

fn strings(ctx: &mut Ctx, a: &StringNode, b: &StringNode) {
    bound(
        ctx,
        "maxLength",
        a.max_length,
        b.max_length,
        [
            Rule::MaxLengthAdded,
            Rule::MaxLengthRemoved,
            Rule::MaxLengthIncreased,
            Rule::MaxLengthDecreased,
        ],
    );
    bound(
        ctx,
        "minLength",
        a.min_length,
        b.min_length,
        [
            Rule::MinLengthAdded,
            Rule::MinLengthRemoved,
            Rule::MinLengthIncreased,
            Rule::MinLengthDecreased,
        ],
    );
    match (&a.pattern, &b.pattern) {
        (None, Some(_)) => ctx.add_at("pattern", Rule::PatternAdded),
        (Some(_), None) => ctx.add_at("pattern", Rule::PatternRemoved),
        (Some(x), Some(y)) if x != y => ctx.add_at("pattern", Rule::PatternChanged),
        _ => {}
    }
}

fn numbers(ctx: &mut Ctx, a: &NumberNode, b: &NumberNode) {
    bound(
        ctx,
        "maximum",
        a.maximum,
        b.maximum,
        [
            Rule::MaximumAdded,
            Rule::MaximumRemoved,
            Rule::MaximumIncreased,
            Rule::MaximumDecreased,
        ],
    );
    bound(
        ctx,
        "minimum",
        a.minimum,
        b.minimum,
        [
            Rule::MinimumAdded,
            Rule::MinimumRemoved,
            Rule::MinimumIncreased,
            Rule::MinimumDecreased,
        ],
    );
    bound(
        ctx,
        "exclusiveMaximum",
        a.exclusive_maximum,
        b.exclusive_maximum,
        [
            Rule::ExclusiveMaximumAdded,
            Rule::ExclusiveMaximumRemoved,
            Rule::ExclusiveMaximumIncreased,
            Rule::ExclusiveMaximumDecreased,
        ],
    );
    bound(
        ctx,
        "exclusiveMinimum",
        a.exclusive_minimum,
        b.exclusive_minimum,
        [
            Rule::ExclusiveMinimumAdded,
            Rule::ExclusiveMinimumRemoved,
            Rule::ExclusiveMinimumIncreased,
            Rule::ExclusiveMinimumDecreased,
        ],
    );
    match (a.multiple_of, b.multiple_of) {
        (None, Some(_)) => ctx.add_at("multipleOf", Rule::MultipleOfAdded),
        (Some(_), None) => ctx.add_at("multipleOf", Rule::MultipleOfRemoved),
        (Some(x), Some(y)) if x != y => {
            let divides = |big: f64, small: f64| small != 0.0 && (big / small).fract() == 0.0;
            let rule = if divides(y, x) {
                Rule::MultipleOfExpanded
            } else if divides(x, y) {
                Rule::MultipleOfReduced
            } else {
                Rule::MultipleOfChanged
            };
            ctx.add_at("multipleOf", rule);
        }
        _ => {}
    }
    if a.integer != b.integer {
        ctx.add(if a.integer {
            Rule::TypeExtended
        } else {
            Rule::TypeNarrowed
        });
    }
}

#[cfg(test)]
mod bounded {
    //! The checker's cost is bounded by the size of its input: shared definitions are compared
    //! once, enums as sets, tagged unions by their tags, and anything past the work limit is an
    //! error rather than a runaway.

    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::super::Profile;
    use super::super::model::{Graph, Kind};
    use super::Comparer;

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
}
