//! Strings and numbers: their bounds, patterns, formats and multiples.

use crate::schema::model::{NumberNode, StringNode};
use crate::schema::rule::Rule;

use super::Ctx;

/// A numeric bound; `rules` are added, removed, increased, decreased.
pub(super) fn bound<T: PartialOrd + Copy>(
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

pub(super) fn strings(ctx: &mut Ctx, a: &StringNode, b: &StringNode) {
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

pub(super) fn numbers(ctx: &mut Ctx, a: &NumberNode, b: &NumberNode) {
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
