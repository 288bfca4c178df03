//! The `event_no` template: literal text with `{field}` placeholders, `{{` and `}}` for braces.

/// One piece of a parsed template.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Text copied as it is.
    Literal(String),
    /// A field of the struct, rendered with `Display`.
    Field(String),
}

/// Parses a template, or says what is wrong with it and how to fix it.
pub(crate) fn parse(template: &str) -> Result<Vec<Segment>, String> {
    if template.is_empty() {
        return Err("the event_no template is empty; write one such as \"ORDER_PAID:{order_id}\", or remove `event_no` to use the default `{EVENT_TYPE}:{aggregate_type}:{aggregate_id}:{aggregate_sequence}`".to_owned());
    }
    let mut segments = Vec::new();
    let mut literal = String::new();
    let mut chars = template.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '{' if chars.peek().map(|&(_, n)| n) == Some('{') => {
                chars.next();
                literal.push('{');
            }
            '{' => {
                let mut name = String::new();
                let mut closed = false;
                for (_, n) in chars.by_ref() {
                    if n == '}' {
                        closed = true;
                        break;
                    }
                    if n == '{' {
                        return Err(format!(
                            "unbalanced braces in the event_no template: `{{` at byte {at} is not closed before the next `{{`; close it with `}}`, or write `{{{{` for a literal brace"
                        ));
                    }
                    name.push(n);
                }
                if !closed {
                    return Err(format!(
                        "unbalanced braces in the event_no template: `{{` at byte {at} is never closed; close it with `}}`, or write `{{{{` for a literal brace"
                    ));
                }
                let name = name.trim();
                if name.is_empty() {
                    return Err("empty `{}` in the event_no template: name a field inside the braces, e.g. `{order_id}`".to_owned());
                }
                if !is_identifier(name) {
                    return Err(format!(
                        "`{{{name}}}` in the event_no template is not a field name: placeholders name a field of this struct, e.g. `{{order_id}}`; format specs are not supported"
                    ));
                }
                if !literal.is_empty() {
                    segments.push(Segment::Literal(std::mem::take(&mut literal)));
                }
                let name = name.strip_prefix("r#").unwrap_or(name);
                segments.push(Segment::Field(name.to_owned()));
            }
            '}' if chars.peek().map(|&(_, n)| n) == Some('}') => {
                chars.next();
                literal.push('}');
            }
            '}' => {
                return Err(format!(
                    "unbalanced braces in the event_no template: `}}` at byte {at} has no opening `{{`; remove it, or write `}}}}` for a literal brace"
                ));
            }
            other => literal.push(other),
        }
    }
    if !literal.is_empty() {
        segments.push(Segment::Literal(literal));
    }
    Ok(segments)
}

fn is_identifier(name: &str) -> bool {
    let name = name.strip_prefix("r#").unwrap_or(name);
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_literals_and_escapes() {
        assert_eq!(
            parse("ORDER_PAID:{order_id}").as_deref(),
            Ok(&[
                Segment::Literal("ORDER_PAID:".into()),
                Segment::Field("order_id".into())
            ][..])
        );
        assert_eq!(
            parse("{{x}}-{a}{b}").as_deref(),
            Ok(&[
                Segment::Literal("{x}-".into()),
                Segment::Field("a".into()),
                Segment::Field("b".into())
            ][..])
        );
    }

    #[test]
    fn rejects_bad_templates() {
        for bad in [
            "", "{", "a{b", "}", "a}b", "{}", "{ }", "{a{b}}", "{a:?}", "{0}",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
