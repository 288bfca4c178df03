//! `#[derive(Aggregate)]`: the three items of `event_core::Aggregate` that every aggregate
//! writes the same way, read from attributes.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Fields, Ident, LitStr};

use crate::ast::skip_value;
use crate::case;
use crate::ctxt::Ctxt;

const ATTR: &str = "aggregate";

/// The impl, or every mistake in the input as compile errors.
pub(crate) fn derive(input: &DeriveInput) -> TokenStream {
    let mut cx = Ctxt::default();
    let mut aggregate_type: Option<LitStr> = None;
    let mut krate: Option<syn::Path> = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident(ATTR)) {
        let result = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("type") {
                let lit: LitStr = meta.value()?.parse()?;
                if aggregate_type.is_some() {
                    cx.error_spanned_by(&lit, "`type` is given twice; keep one");
                } else if let Err(problem) = case::check_type_name(&lit.value()) {
                    cx.error_spanned_by(&lit, format!("aggregate type {:?} {problem}. An aggregate type matches [A-Za-z][A-Za-z0-9_.-]{{0,63}}, e.g. \"ORDER\"", lit.value()));
                }
                aggregate_type.get_or_insert(lit);
            } else if meta.path.is_ident("crate") {
                let lit: LitStr = meta.value()?.parse()?;
                match lit.parse::<syn::Path>() {
                    Ok(path) => krate = Some(path),
                    Err(_) => cx.error_spanned_by(&lit, format!("`{}` is not a path; write the path of the event_core crate as it is named in this crate, e.g. crate = \"::my_events\"", lit.value())),
                }
            } else {
                cx.error_spanned_by(&meta.path, "unknown aggregate key; the keys are `type` (e.g. type = \"ORDER\") and `crate`");
                return skip_value(&meta);
            }
            Ok(())
        });
        if let Err(error) = result {
            cx.syn_error(error);
        }
    }
    let Some(aggregate_type) = aggregate_type else {
        cx.error_spanned_by(&input.ident, "#[derive(Aggregate)] needs the aggregate type: add #[aggregate(type = \"ORDER\")] above the struct");
        return cx.check().err().unwrap_or_default();
    };

    let (mut id, mut events) = (None::<&Ident>, None::<&Ident>);
    // A field marked #[aggregate(events)] wins over the first field of type RecordedEvents.
    let mut by_type = None::<&Ident>;
    match &input.data {
        Data::Struct(data) => match &data.fields {
            Fields::Named(fields) => {
                for field in &fields.named {
                    let Some(name) = field.ident.as_ref() else {
                        continue;
                    };
                    for attr in field.attrs.iter().filter(|a| a.path().is_ident(ATTR)) {
                        let result = attr.parse_nested_meta(|meta| {
                            let slot = if meta.path.is_ident("id") {
                                &mut id
                            } else if meta.path.is_ident("events") {
                                &mut events
                            } else {
                                cx.error_spanned_by(&meta.path, "unknown aggregate field key; mark the id field #[aggregate(id)] and the RecordedEvents field #[aggregate(events)]");
                                return skip_value(&meta);
                            };
                            if slot.is_some() {
                                cx.error_spanned_by(&meta.path, "this is the second field marked so; mark one");
                            }
                            slot.get_or_insert(name);
                            Ok(())
                        });
                        if let Err(error) = result {
                            cx.syn_error(error);
                        }
                    }
                    let is_recorded_events = matches!(&field.ty, syn::Type::Path(p)
                        if p.path.segments.last().is_some_and(|s| s.ident == "RecordedEvents"));
                    if is_recorded_events {
                        by_type.get_or_insert(name);
                    }
                }
            }
            _ => cx.error_spanned_by(
                &input.ident,
                "#[derive(Aggregate)] needs a struct with named fields",
            ),
        },
        _ => cx.error_spanned_by(
            &input.ident,
            "#[derive(Aggregate)] works on structs; write `impl Aggregate` by hand for an enum",
        ),
    }
    let events = events.or(by_type);
    if let Data::Struct(data) = &input.data
        && matches!(data.fields, Fields::Named(_))
    {
        if id.is_none() {
            cx.error_spanned_by(&input.ident, "#[derive(Aggregate)] needs the id field: mark it #[aggregate(id)] (any Display type, at most 64 bytes rendered)");
        }
        if events.is_none() {
            cx.error_spanned_by(&input.ident, "#[derive(Aggregate)] needs a field of type event_core::RecordedEvents for the recorded events (or one marked #[aggregate(events)])");
        }
    }
    if let Err(errors) = cx.check() {
        return errors;
    }
    let (Some(id), Some(events)) = (id, events) else {
        return TokenStream::new();
    };
    let krate = krate.unwrap_or_else(|| syn::parse_quote!(::event_core));
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    quote! {
        #[automatically_derived]
        impl #impl_generics #krate::Aggregate for #ident #ty_generics #where_clause {
            const AGGREGATE_TYPE: &'static str = #aggregate_type;

            fn aggregate_id(&self) -> ::std::string::String {
                ::std::string::ToString::to_string(&self.#id)
            }

            fn recorded_events(&mut self) -> &mut #krate::RecordedEvents {
                &mut self.#events
            }
        }
    }
}
