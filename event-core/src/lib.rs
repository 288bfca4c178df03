#![doc = include_str!("../README.md")]

mod aggregate;
mod envelope;
mod event;
mod event_no;
pub mod schema;
mod trace;
mod uow;
mod upcast;

pub use aggregate::{Aggregate, MAX_AGGREGATE_ID_LEN, RecordError, RecordedEvents};
pub use envelope::{DecodeError, EventEnvelope, EventHeaders};
pub use event::{DomainEvent, EventRegistration, registered_events, schema_settings};
pub use event_no::EventNo;
pub use trace::{Traceparent, TraceparentError};
pub use uow::{EventContext, UnitOfWork};
pub use upcast::{Upcast, UpcastError, UpcasterRegistration, Upcasters};

/// Derives [`DomainEvent`] for a struct with named fields. See [`DomainEvent`] for the attributes.
pub use event_macros::DomainEvent;

/// Derives [`Aggregate`] for a struct with named fields: `#[aggregate(type = "ORDER")]` on the
/// struct, `#[aggregate(id)]` on the id field (any `Display` type) and a field of type
/// [`RecordedEvents`]. See [`Aggregate`] for an example.
pub use event_macros::Aggregate;

/// What generated code uses. Not part of the API: it changes without notice.
#[doc(hidden)]
pub mod __private {
    use std::fmt::{Display, Write};

    pub use core::option::Option;
    pub use std::string::String;

    pub use inventory;

    pub use crate::event::{EventRegistration, event_roundtrip, event_schema_value};
    pub use crate::upcast::step_of;

    /// A field used in an `event_no` template.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be used in an event_no template: it does not implement `Display`",
        label = "this field is named in the event_no template",
        note = "implement `std::fmt::Display` for `{Self}`, or name another field in the template"
    )]
    pub trait TemplateField {
        /// Appends the field's `Display` rendering.
        fn render_into(&self, out: &mut String);
    }

    impl<T: Display + ?Sized> TemplateField for T {
        fn render_into(&self, out: &mut String) {
            // Writing to a String cannot fail.
            let _ = write!(out, "{self}");
        }
    }

    /// A field marked `#[domain_event(aggregate_id)]`.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be an aggregate id: it does not implement `Display`",
        label = "this field is marked #[domain_event(aggregate_id)]",
        note = "implement `std::fmt::Display` for `{Self}`, or mark another field as the aggregate id"
    )]
    pub trait AggregateIdField {
        /// The field's `Display` rendering.
        fn render(&self) -> String;
    }

    impl<T: Display + ?Sized> AggregateIdField for T {
        fn render(&self) -> String {
            self.to_string()
        }
    }

    /// Appends a template field.
    pub fn render_template_field<T: TemplateField + ?Sized>(out: &mut String, value: &T) {
        value.render_into(out);
    }

    /// Renders the aggregate id field.
    pub fn render_aggregate_id<T: AggregateIdField + ?Sized>(value: &T) -> String {
        value.render()
    }
}
