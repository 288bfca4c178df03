//! Compares two schema graphs, rule by rule, the way Confluent Schema Registry's JSON-schema diff
//! does: the changes that a reader on the new schema sees when it reads data written with the old
//! one.

use std::collections::{HashMap, HashSet};

use crate::schema::model::{Criterion, Graph, Kind, NodeId};
use crate::schema::rule::Rule;

mod arrays;
mod combined;
mod objects;
mod scalars;

use objects::renames;
use scalars::{numbers, strings};

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

/// At most [`SAMPLE`] of `changes`, the breaking ones first.
fn sample(changes: &[Change]) -> Vec<Change> {
    if changes.len() <= SAMPLE {
        return changes.to_vec();
    }
    let breaking = changes.iter().filter(|c| !c.rule.is_compatible());
    let rest = changes.iter().filter(|c| c.rule.is_compatible());
    breaking.chain(rest).take(SAMPLE).cloned().collect()
}

#[cfg(test)]
mod bounded;
