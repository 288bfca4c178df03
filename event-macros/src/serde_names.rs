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

/// What serde does with one field, as far as the payload's JSON shape goes.
pub(crate) struct FieldSerde {
    /// Its name in JSON: `#[serde(rename = "..")]`, or the field's name after `rename_all`.
    pub(crate) name: String,
    /// Other names it is read from: `#[serde(alias = "..")]`.
    pub(crate) aliases: Vec<String>,
    /// `#[serde(skip)]` or `skip_deserializing`: never read from the payload.
    pub(crate) skipped: bool,
    /// `#[serde(flatten)]`: its fields are the payload's own.
    pub(crate) flatten: bool,
    /// `#[serde(default)]` or `default = ".."`: a payload without it still reads.
    pub(crate) default: bool,
    /// `with`, `deserialize_with` or `serialize_with`: its JSON shape is not its Rust type's.
    pub(crate) custom: bool,
}

/// Reads a field's `#[serde(...)]` (and `#[schemars(with = ..)]`, which changes its schema).
pub(crate) fn field(attrs: &[Attribute], ident: &str, rename_all: Option<&str>) -> FieldSerde {
    let mut name = None;
    let mut out = FieldSerde {
        name: String::new(),
        aliases: Vec::new(),
        skipped: false,
        flatten: false,
        default: false,
        custom: false,
    };
    for attr in attrs.iter().filter(|a| a.path().is_ident("schemars")) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("with") || meta.path.is_ident("schema_with") {
                out.custom = true;
            }
            skip(&meta)
        });
    }
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("alias") {
                out.aliases.push(meta.value()?.parse::<LitStr>()?.value());
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
                let is = |key: &str| meta.path.is_ident(key);
                out.skipped |= is("skip") || is("skip_deserializing");
                out.flatten |= is("flatten");
                out.default |= is("default");
                out.custom |= is("with") || is("deserialize_with") || is("serialize_with");
                skip(&meta)?;
            }
            Ok(())
        });
    }
    out.name = name.unwrap_or_else(|| apply(rename_all, ident));
    out
}

/// `#[serde(default)]` on the struct: every missing field reads as its default.
pub(crate) fn container_default(attrs: &[Attribute]) -> bool {
    let mut default = false;
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("default") {
                default = true;
            }
            skip(&meta)
        });
    }
    default
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
