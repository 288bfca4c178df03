//! One consumer, many event types: a typed handler per event type, and what the handler sees.

use std::marker::PhantomData;
use std::ops::Deref;

use event_core::{DomainEvent, EventContext, EventEnvelope, Upcasters};

use crate::error::HandlerError;
use crate::sql::dialect::Backend;

mod boxed;

pub use boxed::{BoxRoutes, SendBatchHandler, SendHandler, SendRoutes};

/// An event as a handler receives it: the payload, decoded as the newest version of `E`
/// (older versions upcast), and the envelope it came in, with its id, type, version,
/// aggregate, sequence, `occurredAt`, headers and trace.
///
/// It dereferences to the event, so `paid.order_id` reads the payload's field.
///
/// ```
/// # use event_sqlx::Delivered;
/// # fn demo(paid: Delivered<serde_json::Value>) {
/// // Events the handler records carry the cause's tenant, correlation and trace.
/// let context = paid.context("invoice-service");
/// # let _ = context;
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered<E> {
    /// The payload, as the newest version of the event type.
    pub event: E,
    /// The envelope as it arrived (its payload as stored, before any upcasting).
    pub envelope: EventEnvelope,
}

impl<E> Delivered<E> {
    /// The context for events caused by this one, recorded by `source` (your service):
    /// [`EventContext::caused_by`].
    pub fn context(&self, source: impl Into<String>) -> EventContext {
        EventContext::caused_by(source, &self.envelope)
    }

    /// The event, without the envelope.
    pub fn into_event(self) -> E {
        self.event
    }
}

impl<E> Deref for Delivered<E> {
    type Target = E;

    fn deref(&self) -> &E {
        &self.event
    }
}

/// The envelope decoded for a handler of `E` (upcast to its newest version); a payload that
/// cannot be decoded is a permanent failure.
fn decode<E: DomainEvent>(
    envelope: &EventEnvelope,
    upcasters: &Upcasters,
) -> Result<Delivered<E>, HandlerError> {
    let event: E = upcasters
        .decode(envelope)
        .map_err(|e| HandlerError::Permanent(e.to_string()))?;
    Ok(Delivered {
        event,
        envelope: envelope.clone(),
    })
}

/// [`decode`] for each envelope of a batch.
fn decode_all<E: DomainEvent>(
    envelopes: &[&EventEnvelope],
    upcasters: &Upcasters,
) -> Result<Vec<Delivered<E>>, HandlerError> {
    envelopes.iter().map(|e| decode(e, upcasters)).collect()
}

/// What a consumer does with an event type it has no handler for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UnknownEvents {
    /// Acknowledge it without an effect: the stream carries events for other consumers too.
    /// The default. A consumer that keeps each aggregate's order records it in its inbox, so
    /// that the aggregate's next sequence finds it.
    #[default]
    Ignore,
    /// Put it in the quarantine as a permanent failure, for an operator: every event on the
    /// consumer's subjects or queue should be handled.
    Quarantine,
}

/// A consumer's handlers, one per event type: built by [`Consumer::on`], never by hand.
///
/// [`Consumer::on`]: crate::Consumer::on
#[doc(hidden)]
pub trait Routes<DB: Backend> {
    /// Whether one of the handlers takes `event_type`.
    fn handles(&self, event_type: &str) -> bool;

    /// The event types handled, last added first.
    fn event_types(&self, into: &mut Vec<&'static str>);

    /// Decodes the envelope for its handler and runs it on `conn`; a payload that cannot be
    /// decoded is a permanent failure.
    #[allow(async_fn_in_trait)] // implemented only here; a caller's future is Send when its handlers' are
    async fn dispatch(
        &self,
        conn: &mut DB::Connection,
        envelope: &EventEnvelope,
        upcasters: &Upcasters,
    ) -> Result<(), HandlerError>;

    /// Whether `event_type` goes to a batch handler ([`Consumer::on_batch`]).
    ///
    /// [`Consumer::on_batch`]: crate::Consumer::on_batch
    fn takes_batches(&self, event_type: &str) -> bool;

    /// Runs the batch handler of the envelopes' type (all of one type) on all of them at once.
    #[allow(async_fn_in_trait)] // as above
    async fn dispatch_batch(
        &self,
        conn: &mut DB::Connection,
        envelopes: &[&EventEnvelope],
        upcasters: &Upcasters,
    ) -> Result<(), HandlerError>;
}

/// No handlers.
#[derive(Debug, Clone, Copy, Default)]
#[doc(hidden)]
pub struct NoRoutes;

impl<DB: Backend> Routes<DB> for NoRoutes {
    fn handles(&self, _event_type: &str) -> bool {
        false
    }

    fn event_types(&self, _into: &mut Vec<&'static str>) {}

    async fn dispatch(
        &self,
        _conn: &mut DB::Connection,
        envelope: &EventEnvelope,
        _upcasters: &Upcasters,
    ) -> Result<(), HandlerError> {
        Err(HandlerError::Permanent(format!(
            "no handler for event type {}",
            envelope.event_type
        )))
    }

    fn takes_batches(&self, _event_type: &str) -> bool {
        false
    }

    async fn dispatch_batch(
        &self,
        _conn: &mut DB::Connection,
        envelopes: &[&EventEnvelope],
        _upcasters: &Upcasters,
    ) -> Result<(), HandlerError> {
        Err(HandlerError::Permanent(format!(
            "no batch handler for event type {}",
            envelopes.first().map_or("", |e| e.event_type.as_str())
        )))
    }
}

/// The handler of `E`, then the handlers added before it.
#[derive(Clone)]
#[doc(hidden)]
pub struct On<E, H, Next> {
    handler: H,
    next: Next,
    event: PhantomData<fn() -> E>,
}

impl<E, H, Next> On<E, H, Next> {
    pub(crate) fn new(handler: H, next: Next) -> Self {
        On {
            handler,
            next,
            event: PhantomData,
        }
    }
}

impl<DB, E, H, Next> Routes<DB> for On<E, H, Next>
where
    DB: Backend,
    E: DomainEvent,
    H: AsyncFn(&mut DB::Connection, Delivered<E>) -> Result<(), HandlerError>,
    Next: Routes<DB>,
{
    fn handles(&self, event_type: &str) -> bool {
        event_type == E::EVENT_TYPE || self.next.handles(event_type)
    }

    fn event_types(&self, into: &mut Vec<&'static str>) {
        into.push(E::EVENT_TYPE);
        self.next.event_types(into);
    }

    async fn dispatch(
        &self,
        conn: &mut DB::Connection,
        envelope: &EventEnvelope,
        upcasters: &Upcasters,
    ) -> Result<(), HandlerError> {
        if envelope.event_type != E::EVENT_TYPE {
            return self.next.dispatch(conn, envelope, upcasters).await;
        }
        let delivered = decode::<E>(envelope, upcasters)?;
        (self.handler)(conn, delivered).await
    }

    fn takes_batches(&self, event_type: &str) -> bool {
        event_type != E::EVENT_TYPE && self.next.takes_batches(event_type)
    }

    async fn dispatch_batch(
        &self,
        conn: &mut DB::Connection,
        envelopes: &[&EventEnvelope],
        upcasters: &Upcasters,
    ) -> Result<(), HandlerError> {
        match envelopes.first() {
            Some(first) if first.event_type == E::EVENT_TYPE => {
                for envelope in envelopes {
                    self.dispatch(conn, envelope, upcasters).await?;
                }
                Ok(())
            }
            _ => self.next.dispatch_batch(conn, envelopes, upcasters).await,
        }
    }
}

/// The batch handler of `E`, then the handlers added before it.
#[derive(Clone)]
#[doc(hidden)]
pub struct OnBatch<E, H, Next> {
    handler: H,
    next: Next,
    event: PhantomData<fn() -> E>,
}

impl<E, H, Next> OnBatch<E, H, Next> {
    pub(crate) fn new(handler: H, next: Next) -> Self {
        OnBatch {
            handler,
            next,
            event: PhantomData,
        }
    }
}

impl<DB, E, H, Next> Routes<DB> for OnBatch<E, H, Next>
where
    DB: Backend,
    E: DomainEvent,
    H: AsyncFn(&mut DB::Connection, Vec<Delivered<E>>) -> Result<(), HandlerError>,
    Next: Routes<DB>,
{
    fn handles(&self, event_type: &str) -> bool {
        event_type == E::EVENT_TYPE || self.next.handles(event_type)
    }

    fn event_types(&self, into: &mut Vec<&'static str>) {
        into.push(E::EVENT_TYPE);
        self.next.event_types(into);
    }

    async fn dispatch(
        &self,
        conn: &mut DB::Connection,
        envelope: &EventEnvelope,
        upcasters: &Upcasters,
    ) -> Result<(), HandlerError> {
        if envelope.event_type != E::EVENT_TYPE {
            return self.next.dispatch(conn, envelope, upcasters).await;
        }
        self.dispatch_batch(conn, &[envelope], upcasters).await
    }

    fn takes_batches(&self, event_type: &str) -> bool {
        event_type == E::EVENT_TYPE || self.next.takes_batches(event_type)
    }

    async fn dispatch_batch(
        &self,
        conn: &mut DB::Connection,
        envelopes: &[&EventEnvelope],
        upcasters: &Upcasters,
    ) -> Result<(), HandlerError> {
        match envelopes.first() {
            Some(first) if first.event_type == E::EVENT_TYPE => {
                let events = decode_all::<E>(envelopes, upcasters)?;
                (self.handler)(conn, events).await
            }
            _ => self.next.dispatch_batch(conn, envelopes, upcasters).await,
        }
    }
}
