//! Error accumulation, so that one compile reports every mistake in the input at once.

use std::fmt::Display;

use proc_macro2::TokenStream;
use quote::ToTokens;

/// Collects errors while the input is read and validated.
#[derive(Default)]
pub(crate) struct Ctxt {
    errors: Vec<syn::Error>,
}

impl Ctxt {
    /// Records an error spanned on `tokens`.
    pub(crate) fn error_spanned_by<T: ToTokens, M: Display>(&mut self, tokens: T, message: M) {
        self.errors.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error at `span`.
    pub(crate) fn error_at<M: Display>(&mut self, span: proc_macro2::Span, message: M) {
        self.errors.push(syn::Error::new(span, message));
    }

    /// Records an error that syn already produced.
    pub(crate) fn syn_error(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    /// `Ok` when nothing was recorded, otherwise every error as one `compile_error!` stream.
    pub(crate) fn check(self) -> Result<(), TokenStream> {
        let mut errors = self.errors.into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for error in errors {
            combined.combine(error);
        }
        Err(combined.to_compile_error())
    }
}
