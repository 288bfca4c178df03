//! What serde calls each field, and the aliases it accepts, read from `#[serde(...)]` the way
//! serde reads them, so that the payload schema can say which old names a reader still accepts.
//! Only what this needs is read; serde's own derive validates its attributes.

use syn::{Attribute, LitStr};

/// `#[serde(rename_all = "...")]` on the struct (the deserialize side when split).
pub(crate) fn rename_all(attrs: &[Attribute]) -> Option<String> {
    let mut rule = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename_all") {
                if meta.input.peek(syn::Token![=]) {
                    rule = Some(meta.value()?.parse::<LitStr>()?.value());
                } else {
                    meta.parse_nested_meta(|inner| {
                        let value = inner.value()?.parse::<LitStr>()?.value();
                        if inner.path.is_ident("deserialize") {
                            rule = Some(value);
                        }
                        Ok(())
                    })?;
                }
            } else {
                skip(&meta)?;
            }
            Ok(())
        });
    }
    rule
}

/// The field's name in JSON and its aliases: `#[serde(rename = "..")]`, `#[serde(alias = "..")]`.
pub(crate) fn field(
    attrs: &[Attribute],
    ident: &str,
    rename_all: Option<&str>,
) -> (String, Vec<String>) {
    let mut name = None;
    let mut aliases = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("alias") {
                aliases.push(meta.value()?.parse::<LitStr>()?.value());
            } else if meta.path.is_ident("rename") {
                if meta.input.peek(syn::Token![=]) {
                    name = Some(meta.value()?.parse::<LitStr>()?.value());
                } else {
                    meta.parse_nested_meta(|inner| {
                        let value = inner.value()?.parse::<LitStr>()?.value();
                        if inner.path.is_ident("deserialize") {
                            name = Some(value);
                        }
                        Ok(())
                    })?;
                }
            } else {
                skip(&meta)?;
            }
            Ok(())
        });
    }
    let name = name.unwrap_or_else(|| apply(rename_all, ident));
    (name, aliases)
}

/// Passes over a serde key this reader does not need (`key = value` or `key(...)`).
fn skip(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        meta.value()?.parse::<proc_macro2::TokenStream>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.parse_nested_meta(|inner| {
            if inner.input.peek(syn::Token![=]) {
                inner.value()?.parse::<proc_macro2::TokenTree>()?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// serde's `rename_all` rules, applied to a snake_case field name.
fn apply(rule: Option<&str>, field: &str) -> String {
    let pascal = || {
        field
            .split('_')
            .map(|part| {
                let mut chars = part.chars();
                chars
                    .next()
                    .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                    .unwrap_or_default()
            })
            .collect::<String>()
    };
    match rule {
        Some("lowercase") => field.to_ascii_lowercase(),
        Some("UPPERCASE") => field.to_ascii_uppercase(),
        Some("PascalCase") => pascal(),
        Some("camelCase") => {
            let p = pascal();
            let mut chars = p.chars();
            chars
                .next()
                .map(|c| c.to_ascii_lowercase().to_string() + chars.as_str())
                .unwrap_or_default()
        }
        Some("SCREAMING_SNAKE_CASE") => field.to_ascii_uppercase(),
        Some("kebab-case") => field.replace('_', "-"),
        Some("SCREAMING-KEBAB-CASE") => field.to_ascii_uppercase().replace('_', "-"),
        _ => field.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::apply;

    #[test]
    fn applies_serde_rename_rules() {
        assert_eq!(apply(Some("camelCase"), "amount_minor"), "amountMinor");
        assert_eq!(apply(Some("PascalCase"), "amount_minor"), "AmountMinor");
        assert_eq!(apply(Some("kebab-case"), "amount_minor"), "amount-minor");
        assert_eq!(
            apply(Some("SCREAMING-KEBAB-CASE"), "amount_minor"),
            "AMOUNT-MINOR"
        );
        assert_eq!(
            apply(Some("SCREAMING_SNAKE_CASE"), "amount_minor"),
            "AMOUNT_MINOR"
        );
        assert_eq!(apply(None, "amount_minor"), "amount_minor");
    }
}
