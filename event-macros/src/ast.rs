//! Reads a `DeriveInput` into the model the expansion works from, validating as it goes.
//!
//! Every problem is recorded in the [`Ctxt`] and reading goes on, so one compile shows them all.

use proc_macro2::{Span, TokenTree};
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Attribute, Data, DeriveInput, Fields, Ident, LitInt, LitStr, Token, Type};

use crate::case;
use crate::ctxt::Ctxt;
use crate::template::{self, Segment};

const ATTR: &str = "domain_event";
const CONTAINER_KEYS: &str =
    "`event_type`, `version`, `aggregate`, `event_no`, `compatibility`, `snapshots`, `crate`";
const MODES: &[&str] = &[
    "NONE",
    "BACKWARD",
    "FORWARD",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "FORWARD_TRANSITIVE",
    "FULL_TRANSITIVE",
];

/// What the derive generates an impl from.
pub(crate) struct Event<'a> {
    pub(crate) ident: &'a Ident,
    pub(crate) event_type: String,
    pub(crate) version: u32,
    pub(crate) aggregate: Option<String>,
    pub(crate) event_no: Option<Vec<Segment>>,
    pub(crate) krate: syn::Path,
    pub(crate) compatibility: String,
    pub(crate) fields: Vec<EventField<'a>>,
    pub(crate) aggregate_id: Option<usize>,
    /// Where `version = N` was written, for errors about it.
    pub(crate) version_span: Option<Span>,
    /// `snapshots = "path"`, as written.
    pub(crate) snapshots: Option<LitStr>,
    /// `#[serde(default)]` on the struct.
    pub(crate) serde_default: bool,
}

/// A named field of the event struct.
pub(crate) struct EventField<'a> {
    pub(crate) ident: &'a Ident,
    pub(crate) ty: &'a Type,
    /// serde's name for it, and the other names it accepts.
    pub(crate) serde_name: String,
    pub(crate) aliases: Vec<String>,
    /// What else serde does with it.
    pub(crate) serde: crate::serde_names::FieldSerde,
}

/// The container attribute's keys as written, before defaults.
#[derive(Default)]
struct ContainerAttrs {
    event_type: Option<(String, LitStr)>,
    version: Option<u32>,
    version_seen: bool,
    version_span: Option<Span>,
    snapshots: Option<LitStr>,
    aggregate: Option<String>,
    event_no: Option<(Vec<Segment>, LitStr)>,
    event_no_seen: bool,
    krate: Option<syn::Path>,
    compatibility: Option<String>,
}

impl<'a> Event<'a> {
    /// Reads and validates `input`, recording every problem in `cx`. The model is returned even
    /// when there are errors, so that the fallback impl can name the type and the runtime crate.
    pub(crate) fn from_syn(input: &'a DeriveInput, cx: &mut Ctxt) -> Event<'a> {
        let attrs = read_container_attrs(&input.attrs, cx);

        if !input.generics.params.is_empty() || input.generics.where_clause.is_some() {
            cx.error_spanned_by(
                &input.generics,
                "#[derive(DomainEvent)] does not support generic structs: an event type has exactly one payload schema. Make the event a concrete struct, e.g. `struct OrderPaid { .. }` with the concrete field types",
            );
        }

        let fields = match &input.data {
            Data::Struct(data) => match &data.fields {
                Fields::Named(named) => named.named.iter().collect::<Vec<_>>(),
                Fields::Unnamed(unnamed) => {
                    cx.error_spanned_by(
                        unnamed,
                        "#[derive(DomainEvent)] does not support tuple structs: a payload is a JSON object whose fields readers rely on by name. Name the fields: `struct Event { field_name: Type, .. }`",
                    );
                    Vec::new()
                }
                Fields::Unit => {
                    cx.error_spanned_by(
                        &input.ident,
                        "#[derive(DomainEvent)] does not support unit structs: a payload is a JSON object. Write `struct Event {}` for an event without fields",
                    );
                    Vec::new()
                }
            },
            Data::Enum(data) => {
                cx.error_spanned_by(
                    data.enum_token,
                    "#[derive(DomainEvent)] does not support enums: each event has its own type, version and schema. Derive DomainEvent on one struct per event (e.g. `struct OrderPaid { .. }`, `struct OrderShipped { .. }`) and keep the enum, if you need one, as a plain serde type",
                );
                Vec::new()
            }
            Data::Union(data) => {
                cx.error_spanned_by(
                    data.union_token,
                    "#[derive(DomainEvent)] does not support unions: a payload must be serializable as JSON. Use a struct with named fields",
                );
                Vec::new()
            }
        };

        let rename_all = crate::serde_names::rename_all(&input.attrs);
        let mut event_fields = Vec::with_capacity(fields.len());
        let mut aggregate_id: Option<usize> = None;
        for field in fields {
            let Some(ident) = field.ident.as_ref() else {
                continue;
            };
            if read_field_attrs(&field.attrs, cx) {
                if aggregate_id.is_some() {
                    cx.error_spanned_by(
                        ident,
                        "two fields are marked #[domain_event(aggregate_id)]: an event belongs to one aggregate. Keep the attribute on one field only",
                    );
                } else {
                    aggregate_id = Some(event_fields.len());
                }
            }
            let serde =
                crate::serde_names::field(&field.attrs, &unraw(ident), rename_all.as_deref());
            event_fields.push(EventField {
                ident,
                ty: &field.ty,
                serde_name: serde.name.clone(),
                aliases: serde.aliases.clone(),
                serde,
            });
        }

        let event_type = match attrs.event_type {
            Some((value, _)) => value,
            None => {
                let name = input.ident.to_string();
                let name = name.strip_prefix("r#").unwrap_or(&name);
                let derived = case::screaming_snake_case(name);
                if let Err(problem) = case::check_type_name(&derived) {
                    cx.error_spanned_by(
                        &input.ident,
                        format!("the default event type `{derived}`, derived from the type name, {problem}. Set one explicitly: #[domain_event(event_type = \"ORDER_PAID\")]"),
                    );
                }
                derived
            }
        };

        if let Some((segments, lit)) = &attrs.event_no {
            for segment in segments {
                if let Segment::Field(name) = segment {
                    let known = event_fields.iter().any(|f| unraw(f.ident) == *name);
                    if !known {
                        let available: Vec<String> =
                            event_fields.iter().map(|f| unraw(f.ident)).collect();
                        let hint = if available.is_empty() {
                            "this struct has no named fields".to_owned()
                        } else {
                            format!("the fields are: {}", available.join(", "))
                        };
                        cx.error_spanned_by(
                            lit,
                            format!("the event_no template names `{{{name}}}`, but the struct has no field `{name}`; {hint}. Use one of them in the template"),
                        );
                    }
                }
            }
        }

        Event {
            ident: &input.ident,
            event_type,
            version: attrs.version.unwrap_or(1),
            aggregate: attrs.aggregate,
            event_no: attrs.event_no.map(|(segments, _)| segments),
            krate: attrs
                .krate
                .unwrap_or_else(|| syn::parse_quote!(::event_core)),
            compatibility: attrs
                .compatibility
                .unwrap_or_else(|| "BACKWARD_TRANSITIVE".to_owned()),
            fields: event_fields,
            aggregate_id,
            version_span: attrs.version_span,
            snapshots: attrs.snapshots,
            serde_default: crate::serde_names::container_default(&input.attrs),
        }
    }
}

/// The field's name as written in a template: `r#type` is `type`.
pub(crate) fn unraw(ident: &Ident) -> String {
    let name = ident.to_string();
    match name.strip_prefix("r#") {
        Some(stripped) => stripped.to_owned(),
        None => name,
    }
}

fn read_container_attrs(attrs: &[Attribute], cx: &mut Ctxt) -> ContainerAttrs {
    let mut out = ContainerAttrs::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident(ATTR)) {
        let result = attr.parse_nested_meta(|meta| {
            let Some(key) = meta.path.get_ident().map(Ident::to_string) else {
                cx.error_spanned_by(&meta.path, format!("unknown domain_event key; the keys are {CONTAINER_KEYS}"));
                return skip_value(&meta);
            };
            match key.as_str() {
                "event_type" => {
                    let duplicate = out.event_type.is_some();
                    if let Some(lit) = string_value(&meta, "event_type", "\"ORDER_PAID\"", cx)? {
                        if duplicate {
                            return duplicate_key(&meta, cx);
                        }
                        let value = lit.value();
                        if let Err(problem) = case::check_type_name(&value) {
                            cx.error_spanned_by(&lit, format!("event_type {} {problem}. An event type matches [A-Za-z][A-Za-z0-9_.-]{{0,63}}, e.g. \"ORDER_PAID\"", shown(&value)));
                        }
                        out.event_type = Some((value, lit));
                    }
                }
                "version" => {
                    if out.version_seen {
                        duplicate_key(&meta, cx)?;
                        return skip_value(&meta);
                    }
                    out.version_seen = true;
                    out.version_span = Some(meta.path.span());
                    out.version = version_value(&meta, cx)?;
                }
                "aggregate" => {
                    let duplicate = out.aggregate.is_some();
                    if let Some(lit) = string_value(&meta, "aggregate", "\"ORDER\"", cx)? {
                        if duplicate {
                            return duplicate_key(&meta, cx);
                        }
                        let value = lit.value();
                        if let Err(problem) = case::check_type_name(&value) {
                            cx.error_spanned_by(&lit, format!("aggregate {} {problem}. An aggregate type matches [A-Za-z][A-Za-z0-9_.-]{{0,63}}, e.g. \"ORDER\"", shown(&value)));
                        }
                        out.aggregate = Some(value);
                    }
                }
                "event_no" => {
                    if out.event_no_seen {
                        duplicate_key(&meta, cx)?;
                        return skip_value(&meta);
                    }
                    out.event_no_seen = true;
                    if let Some(lit) = string_value(&meta, "event_no", "\"ORDER_PAID:{order_id}\"", cx)? {
                        match template::parse(&lit.value()) {
                            Ok(segments) => out.event_no = Some((segments, lit)),
                            Err(problem) => cx.error_spanned_by(&lit, problem),
                        }
                    }
                }
                "crate" => {
                    let duplicate = out.krate.is_some();
                    if let Some(lit) = string_value(&meta, "crate", "\"::event_core\"", cx)? {
                        if duplicate {
                            return duplicate_key(&meta, cx);
                        }
                        match lit.parse::<syn::Path>() {
                            Ok(path) => out.krate = Some(path),
                            Err(_) => cx.error_spanned_by(&lit, format!("`{}` is not a path; write the path of the event_core crate as it is named in this crate, e.g. crate = \"::my_events\"", lit.value())),
                        }
                    }
                }
                "compatibility" => {
                    let duplicate = out.compatibility.is_some();
                    if let Some(lit) = string_value(&meta, "compatibility", "\"BACKWARD_TRANSITIVE\"", cx)? {
                        if duplicate {
                            return duplicate_key(&meta, cx);
                        }
                        let mode = lit.value().to_ascii_uppercase().replace('-', "_");
                        if MODES.contains(&mode.as_str()) {
                            out.compatibility = Some(mode);
                        } else {
                            cx.error_spanned_by(&lit, format!("unknown compatibility mode `{}`; the modes are {}", lit.value(), MODES.join(", ")));
                        }
                    }
                }
                "snapshots" => {
                    let duplicate = out.snapshots.is_some();
                    if let Some(lit) = string_value(&meta, "snapshots", "\"schemas\"", cx)? {
                        if duplicate {
                            return duplicate_key(&meta, cx);
                        }
                        out.snapshots = Some(lit);
                    }
                }
                "aggregate_id" => {
                    cx.error_spanned_by(&meta.path, "`aggregate_id` belongs on a field, not on the struct: put #[domain_event(aggregate_id)] on the field that holds the aggregate's id");
                }
                _ => {
                    let suggestion = closest(&key, &["event_type", "version", "aggregate", "event_no", "compatibility", "snapshots", "crate"])
                        .map(|known| format!("did you mean `{known}`? "))
                        .unwrap_or_default();
                    cx.error_spanned_by(&meta.path, format!("unknown domain_event key `{key}`; {suggestion}the keys are {CONTAINER_KEYS}"));
                    return skip_value(&meta);
                }
            }
            Ok(())
        });
        if let Err(error) = result {
            cx.syn_error(error);
        }
    }
    out
}

/// Reads a field's attributes; true when the field is marked `aggregate_id`.
fn read_field_attrs(attrs: &[Attribute], cx: &mut Ctxt) -> bool {
    let mut aggregate_id = false;
    for attr in attrs.iter().filter(|a| a.path().is_ident(ATTR)) {
        let result = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("aggregate_id") {
                if aggregate_id {
                    return duplicate_key(&meta, cx);
                }
                aggregate_id = true;
                if !meta.input.is_empty() && !meta.input.peek(Token![,]) {
                    cx.error_spanned_by(&meta.path, "`aggregate_id` takes no value: write #[domain_event(aggregate_id)]");
                    return skip_value(&meta);
                }
                Ok(())
            } else {
                let shown = meta
                    .path
                    .get_ident()
                    .map_or_else(|| "this".to_owned(), |i| format!("`{i}`"));
                cx.error_spanned_by(&meta.path, format!("unknown domain_event field key {shown}; the only field key is `aggregate_id`, e.g. #[domain_event(aggregate_id)]"));
                skip_value(&meta)
            }
        });
        if let Err(error) = result {
            cx.syn_error(error);
        }
    }
    aggregate_id
}

fn duplicate_key(meta: &ParseNestedMeta<'_>, cx: &mut Ctxt) -> syn::Result<()> {
    let key = meta
        .path
        .get_ident()
        .map_or_else(String::new, Ident::to_string);
    cx.error_spanned_by(
        &meta.path,
        format!("duplicate domain_event key `{key}`: give it once"),
    );
    Ok(())
}

/// Consumes whatever follows a key (`= value` or `(...)`) so that reading goes on after an error.
pub(crate) fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    let input = meta.input;
    while !input.is_empty() && !input.peek(Token![,]) {
        input.parse::<TokenTree>()?;
    }
    Ok(())
}

/// `key = "string"`. A value of another kind is recorded as an error and skipped.
fn string_value(
    meta: &ParseNestedMeta<'_>,
    key: &str,
    example: &str,
    cx: &mut Ctxt,
) -> syn::Result<Option<LitStr>> {
    if !meta.input.peek(Token![=]) {
        cx.error_spanned_by(
            &meta.path,
            format!("`{key}` needs a value: {key} = {example}"),
        );
        skip_value(meta)?;
        return Ok(None);
    }
    let value = meta.value()?;
    if value.peek(LitStr) {
        return Ok(Some(value.parse()?));
    }
    let span = value.span();
    skip_value(meta)?;
    cx.syn_error(syn::Error::new(
        span,
        format!("`{key}` must be a string literal: {key} = {example}"),
    ));
    Ok(None)
}

/// `version = N` with N a positive integer literal that fits in u32.
fn version_value(meta: &ParseNestedMeta<'_>, cx: &mut Ctxt) -> syn::Result<Option<u32>> {
    if !meta.input.peek(Token![=]) {
        cx.error_spanned_by(&meta.path, "`version` needs a value: version = 2");
        skip_value(meta)?;
        return Ok(None);
    }
    let value = meta.value()?;
    if value.peek(Token![-]) {
        let minus: Token![-] = value.parse()?;
        let number: Option<TokenTree> = value.parse().ok();
        skip_value(meta)?;
        cx.error_spanned_by(
            quote::quote!(#minus #number),
            "event versions start at 1 and cannot be negative: write version = 1 or higher",
        );
        return Ok(None);
    }
    if value.peek(LitInt) {
        let lit: LitInt = value.parse()?;
        return match lit.base10_parse::<u32>() {
            Ok(0) => {
                cx.error_spanned_by(
                    &lit,
                    "event versions start at 1: write version = 1 or higher",
                );
                Ok(None)
            }
            Ok(version) if lit.suffix().is_empty() || lit.suffix() == "u32" => Ok(Some(version)),
            Ok(_) => {
                cx.error_spanned_by(
                    &lit,
                    format!(
                        "version takes a plain integer; remove the `{}` suffix",
                        lit.suffix()
                    ),
                );
                Ok(None)
            }
            Err(_) => {
                cx.error_spanned_by(&lit, format!("version `{}` does not fit in a u32 (1..=4294967295); use a smaller version", lit.base10_digits()));
                Ok(None)
            }
        };
    }
    let span: Span = value.span();
    let hint = if value.peek(LitStr) {
        let lit: LitStr = value.parse()?;
        format!(
            "version must be an integer literal, not a string: write version = {}",
            lit.value()
        )
    } else {
        "version must be an integer literal, e.g. version = 2".to_owned()
    };
    skip_value(meta)?;
    cx.syn_error(syn::Error::new(span, hint));
    Ok(None)
}

impl EventField<'_> {
    /// The span that errors about this field's type point at.
    pub(crate) fn ty_span(&self) -> Span {
        self.ty.span()
    }
}

/// A value as shown in a message: quoted, or the word "value" when there is nothing to quote.
fn shown(value: &str) -> String {
    if value.is_empty() {
        "value".to_owned()
    } else {
        format!("`{value}`")
    }
}

/// The known key closest to a misspelled one, when it is close enough to be what was meant.
fn closest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(distance, k)| *distance <= 2.max(k.len() / 4))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}
