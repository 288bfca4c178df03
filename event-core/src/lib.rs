//! Domain events for Rust: `#[derive(DomainEvent)]`, envelopes, aggregates and the unit of work.
//!
//! - [`DomainEvent`] gives a serde payload struct a stable event type, a version, a deterministic
//!   [`EventNo`] (its idempotency key) and a JSON schema, all checked at compile time.
//! - [`Aggregate`]s record events as their state changes; a [`UnitOfWork`] numbers them per
//!   aggregate, stamps time, trace and headers, and hands the [`EventEnvelope`]s over on commit.
//! - `event-sqlx` writes them to a transactional outbox in the same database transaction as the
//!   state, and relays them to a broker.
//!
//! ```
//! use event_core::{Aggregate, DomainEvent, EventContext, RecordedEvents, UnitOfWork};
//!
//! #[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
//! #[domain_event(event_type = "ORDER_PAID", version = 2, aggregate = "ORDER", event_no = "ORDER_PAID:{order_id}")]
//! pub struct OrderPaid {
//!     #[domain_event(aggregate_id)]
//!     pub order_id: String,
//!     pub amount_minor: i64,
//!     pub currency: String,
//! }
//!
//! struct Order { id: String, paid: bool, events: RecordedEvents }
//!
//! impl Aggregate for Order {
//!     const AGGREGATE_TYPE: &'static str = "ORDER";
//!     fn aggregate_id(&self) -> String { self.id.clone() }
//!     fn recorded_events(&mut self) -> &mut RecordedEvents { &mut self.events }
//! }
//!
//! let mut order = Order { id: "o-1".into(), paid: false, events: RecordedEvents::loaded_at(1) };
//! order.paid = true;
//! order.record(OrderPaid { order_id: "o-1".into(), amount_minor: 1999, currency: "EUR".into() })?;
//!
//! let mut uow = UnitOfWork::new(EventContext::new("order-service").tenant_id("acme"));
//! uow.collect(&mut order)?;
//! let envelopes = uow.commit();
//! assert_eq!(envelopes[0].event_id.as_str(), "ORDER_PAID:o-1");
//! assert_eq!(envelopes[0].aggregate_sequence, 2);
//! let paid: OrderPaid = envelopes[0].decode()?;
//! assert_eq!(paid.amount_minor, 1999);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

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

/// What generated code uses. Not part of the API: it changes without notice.
#[doc(hidden)]
pub mod __private {
    use std::fmt::{Display, Write};

    pub use core::option::Option;
    pub use std::string::String;

    pub use inventory;

    pub use crate::event::{EventRegistration, event_schema_value};
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
