//! The `#[derive(DomainEvent)]` and `#[derive(Aggregate)]` macros.
//!
//! Use it through `event_core` (`use event_core::DomainEvent;`): the generated code refers to the
//! runtime by absolute paths into that crate. The derive works in stages, one module each:
//! `ast` reads the input into a model and collects every error it finds, `template` parses the
//! `event_no` template, `snapshot` compares the model with the committed snapshot of its event
//! type and version, and `expand` writes the impl.

mod aggregate;
mod ast;
mod case;
mod ctxt;
mod expand;
mod serde_names;
mod snapshot;
mod template;

use proc_macro::TokenStream;

/// Derives `event_core::DomainEvent`. See the `event_core::DomainEvent` documentation.
#[proc_macro_derive(DomainEvent, attributes(domain_event))]
pub fn derive_domain_event(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    expand::derive(&input).into()
}

/// Derives `event_core::Aggregate`. See the `event_core::Aggregate` documentation.
#[proc_macro_derive(Aggregate, attributes(aggregate))]
pub fn derive_aggregate(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    aggregate::derive(&input).into()
}
