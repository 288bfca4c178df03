//! Writes the `DomainEvent` impl from the validated model.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::DeriveInput;

use crate::ast::Event;
use crate::ctxt::Ctxt;
use crate::template::Segment;

/// The whole derive: read, validate, expand; on error the errors plus a fallback impl.
pub(crate) fn derive(input: &DeriveInput) -> TokenStream {
    let mut cx = Ctxt::default();
    let event = Event::from_syn(input, &mut cx);
    let snapshot = crate::snapshot::check(&event, &mut cx);
    // The snapshot and the variable that moves or disables the check are part of the input:
    // cargo rebuilds the crate when either changes.
    let file = snapshot.and_then(|path| {
        let path = path.to_str()?.to_owned();
        Some(quote! { const _: &[u8] = ::core::include_bytes!(#path); })
    });
    let depend = quote! {
        const _: ::core::option::Option<&str> = ::core::option_env!("EVENT_SNAPSHOT_DIR");
        #file
    };
    match cx.check() {
        Ok(()) => {
            let implementation = impl_domain_event(&event);
            quote! { #implementation #depend }
        }
        Err(errors) => {
            let fallback = fallback(input, &event);
            quote! { #errors #fallback #depend }
        }
    }
}

fn impl_domain_event(event: &Event<'_>) -> TokenStream {
    let ident = event.ident;
    let krate = &event.krate;
    let private = quote!(#krate::__private);
    let event_type = &event.event_type;
    let version = event.version;

    let aggregate_type = match &event.aggregate {
        Some(aggregate) => quote!(#private::Option::Some(#aggregate)),
        None => quote!(#private::Option::None),
    };

    let aggregate_id = match event.aggregate_id {
        Some(index) => {
            let field = &event.fields[index];
            let name = field.ident;
            // Spanned on the field's type, so that a type without `Display` is reported there.
            let render = quote_spanned! {field.ty_span()=>
                #private::render_aggregate_id(&self.#name)
            };
            quote!(#private::Option::Some(#render))
        }
        None => quote!(#private::Option::None),
    };

    let event_no = match &event.event_no {
        Some(segments) => {
            let pushes = segments.iter().map(|segment| match segment {
                Segment::Literal(text) => quote! {
                    #private::String::push_str(&mut rendered, #text);
                },
                Segment::Field(name) => {
                    let field = event
                        .fields
                        .iter()
                        .find(|f| crate::ast::unraw(f.ident) == *name)
                        .map(|f| (f.ident, f.ty_span()));
                    match field {
                        Some((ident, span)) => quote_spanned! {span=>
                            #private::render_template_field(&mut rendered, &self.#ident);
                        },
                        // Unreachable after validation; kept total so expansion never panics.
                        None => quote!(),
                    }
                }
            });
            quote! {
                let mut rendered = #private::String::new();
                #(#pushes)*
                #private::Option::Some(#krate::EventNo::from_rendered(&rendered))
            }
        }
        None => quote!(#private::Option::None),
    };

    let compatibility = &event.compatibility;
    let aliased: Vec<TokenStream> = event
        .fields
        .iter()
        .filter(|f| !f.aliases.is_empty())
        .map(|f| {
            let name = &f.serde_name;
            let aliases = &f.aliases;
            quote!((#name, &[#(#aliases),*]))
        })
        .collect();
    let aliases = if aliased.is_empty() {
        quote!()
    } else {
        quote! {
            fn serde_aliases() -> &'static [(&'static str, &'static [&'static str])] {
                &[#(#aliased),*]
            }
        }
    };
    quote! {
        #[automatically_derived]
        impl #krate::DomainEvent for #ident {
            const EVENT_TYPE: &'static str = #event_type;
            const EVENT_VERSION: u32 = #version;
            const AGGREGATE_TYPE: #private::Option<&'static str> = #aggregate_type;

            fn aggregate_id(&self) -> #private::Option<#private::String> {
                #aggregate_id
            }

            fn event_no(&self) -> #private::Option<#krate::EventNo> {
                #event_no
            }

            #aliases
        }

        // Every derived event is registered, so that the snapshot check cannot miss one.
        #private::inventory::submit! {
            #private::EventRegistration {
                event_type: <#ident as #krate::DomainEvent>::EVENT_TYPE,
                version: <#ident as #krate::DomainEvent>::EVENT_VERSION,
                rust_type: ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#ident)),
                compatibility: #compatibility,
                schema: #private::event_schema_value::<#ident>,
                roundtrip: #private::event_roundtrip::<#ident>,
            }
        }
    }
}

/// An impl that compiles whatever was wrong, so that the errors above are the only ones shown.
fn fallback(input: &DeriveInput, event: &Event<'_>) -> TokenStream {
    // A generic type would need bounds we cannot guess, and a union cannot have the serde and
    // schemars impls the trait requires: for those the errors stand alone.
    let generic = !input.generics.params.is_empty() || input.generics.where_clause.is_some();
    if generic || matches!(input.data, syn::Data::Union(_)) {
        return TokenStream::new();
    }
    let ident = event.ident;
    let krate = &event.krate;
    let private = quote!(#krate::__private);
    quote! {
        #[automatically_derived]
        impl #krate::DomainEvent for #ident {
            const EVENT_TYPE: &'static str = "INVALID";
            const EVENT_VERSION: u32 = 1;
            const AGGREGATE_TYPE: #private::Option<&'static str> = #private::Option::None;

            fn aggregate_id(&self) -> #private::Option<#private::String> {
                #private::Option::None
            }

            fn event_no(&self) -> #private::Option<#krate::EventNo> {
                #private::Option::None
            }
        }
    }
}
