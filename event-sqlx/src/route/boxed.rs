//! A consumer whose type can be named: its handlers behind one boxed, `Send` dispatch.
//!
//! `.on(handler)` keeps every handler's concrete type, which is what makes dispatch free, and
//! what a `struct` field or a function's return type cannot spell. [`Consumer::boxed`] puts the
//! handlers behind a [`BoxRoutes`], so the consumer is a `BoxConsumer<DB>`: stored, returned,
//! and spawned. Boxing asks for what a spawned task needs and an `AsyncFn` bound cannot say: that
//! each handler's future is `Send`, which [`SendHandler`] and [`SendBatchHandler`] check.
//!
//! [`Consumer::boxed`]: crate::Consumer::boxed

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use event_core::{DomainEvent, EventEnvelope, Upcasters};

use super::{Delivered, NoRoutes, On, OnBatch, Routes, decode, decode_all};
use crate::error::HandlerError;
use crate::sql::dialect::Backend;

/// A handler of `E` whose future is `Send`: an `async fn(&mut DB::Connection, Delivered<E>)`
/// item, or an async closure that captures nothing. Implemented for every such function; it is
/// what [`Consumer::boxed`](crate::Consumer::boxed) asks of `.on` handlers.
#[diagnostic::on_unimplemented(
    message = "this handler's future cannot be boxed as `Send`",
    label = "`Consumer::boxed` takes `async fn` handlers, or async closures that capture nothing",
    note = "a closure that captures state: make it an `async fn`, or keep the consumer's concrete type and spawn it where it is built"
)]
pub trait SendHandler<'c, C: 'c, E>: Fn(&'c mut C, Delivered<E>) -> Self::Future {
    /// The handler's future.
    type Future: Future<Output = Result<(), HandlerError>> + Send + 'c;
}

impl<'c, C: 'c, E, F, Fut> SendHandler<'c, C, E> for F
where
    F: Fn(&'c mut C, Delivered<E>) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'c,
{
    type Future = Fut;
}

/// A batch handler of `E` whose future is `Send`, as [`SendHandler`] for `.on_batch`.
#[diagnostic::on_unimplemented(
    message = "this batch handler's future cannot be boxed as `Send`",
    label = "`Consumer::boxed` takes `async fn` handlers, or async closures that capture nothing",
    note = "a closure that captures state: make it an `async fn`, or keep the consumer's concrete type and spawn it where it is built"
)]
pub trait SendBatchHandler<'c, C: 'c, E>: Fn(&'c mut C, Vec<Delivered<E>>) -> Self::Future {
    /// The handler's future.
    type Future: Future<Output = Result<(), HandlerError>> + Send + 'c;
}

impl<'c, C: 'c, E, F, Fut> SendBatchHandler<'c, C, E> for F
where
    F: Fn(&'c mut C, Vec<Delivered<E>>) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'c,
{
    type Future = Fut;
}

/// Calls `handler` through its [`SendHandler`] bound alone, where its `AsyncFn` bound would make
/// the call ambiguous.
fn call<'c, C, E, H: SendHandler<'c, C, E>>(
    handler: &H,
    conn: &'c mut C,
    delivered: Delivered<E>,
) -> H::Future {
    handler(conn, delivered)
}

/// [`call`] for a batch handler.
fn call_batch<'c, C, E, H: SendBatchHandler<'c, C, E>>(
    handler: &H,
    conn: &'c mut C,
    events: Vec<Delivered<E>>,
) -> H::Future {
    handler(conn, events)
}

type Dispatch<'a> = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'a>>;

/// Handlers whose dispatch is `Send`: what [`Consumer::boxed`](crate::Consumer::boxed) boxes.
/// Implemented for the handlers `.on` and `.on_batch` build when each is a [`SendHandler`] or a
/// [`SendBatchHandler`].
#[diagnostic::on_unimplemented(
    message = "the handlers of this consumer cannot be boxed: each must be an `async fn` (or an async closure that captures nothing) whose future is `Send`"
)]
pub trait SendRoutes<DB: Backend>: Routes<DB> + Send + Sync + 'static {
    /// [`Routes::dispatch`], as a `Send` future.
    fn dispatch_send<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        envelope: &'a EventEnvelope,
        upcasters: &'a Upcasters,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a;

    /// [`Routes::dispatch_batch`], as a `Send` future.
    fn dispatch_batch_send<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        envelopes: &'a [&'a EventEnvelope],
        upcasters: &'a Upcasters,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a;
}

impl<DB: Backend> SendRoutes<DB> for NoRoutes {
    async fn dispatch_send<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        envelope: &'a EventEnvelope,
        upcasters: &'a Upcasters,
    ) -> Result<(), HandlerError> {
        Routes::<DB>::dispatch(self, conn, envelope, upcasters).await
    }

    async fn dispatch_batch_send<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        envelopes: &'a [&'a EventEnvelope],
        upcasters: &'a Upcasters,
    ) -> Result<(), HandlerError> {
        Routes::<DB>::dispatch_batch(self, conn, envelopes, upcasters).await
    }
}

impl<DB, E, H, Next> SendRoutes<DB> for On<E, H, Next>
where
    DB: Backend,
    E: DomainEvent + Send + 'static,
    H: AsyncFn(&mut DB::Connection, Delivered<E>) -> Result<(), HandlerError>
        + for<'c> SendHandler<'c, DB::Connection, E>
        + Send
        + Sync
        + 'static,
    Next: SendRoutes<DB>,
{
    async fn dispatch_send<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        envelope: &'a EventEnvelope,
        upcasters: &'a Upcasters,
    ) -> Result<(), HandlerError> {
        if envelope.event_type != E::EVENT_TYPE {
            return self.next.dispatch_send(conn, envelope, upcasters).await;
        }
        let delivered = decode::<E>(envelope, upcasters)?;
        call(&self.handler, conn, delivered).await
    }

    async fn dispatch_batch_send<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        envelopes: &'a [&'a EventEnvelope],
        upcasters: &'a Upcasters,
    ) -> Result<(), HandlerError> {
        match envelopes.first() {
            Some(first) if first.event_type == E::EVENT_TYPE => {
                for envelope in envelopes {
                    self.dispatch_send(conn, envelope, upcasters).await?;
                }
                Ok(())
            }
            _ => {
                self.next
                    .dispatch_batch_send(conn, envelopes, upcasters)
                    .await
            }
        }
    }
}

impl<DB, E, H, Next> SendRoutes<DB> for OnBatch<E, H, Next>
where
    DB: Backend,
    E: DomainEvent + Send + 'static,
    H: AsyncFn(&mut DB::Connection, Vec<Delivered<E>>) -> Result<(), HandlerError>
        + for<'c> SendBatchHandler<'c, DB::Connection, E>
        + Send
        + Sync
        + 'static,
    Next: SendRoutes<DB>,
{
    async fn dispatch_send<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        envelope: &'a EventEnvelope,
        upcasters: &'a Upcasters,
    ) -> Result<(), HandlerError> {
        if envelope.event_type != E::EVENT_TYPE {
            return self.next.dispatch_send(conn, envelope, upcasters).await;
        }
        let events = decode_all::<E>(&[envelope], upcasters)?;
        call_batch(&self.handler, conn, events).await
    }

    async fn dispatch_batch_send<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        envelopes: &'a [&'a EventEnvelope],
        upcasters: &'a Upcasters,
    ) -> Result<(), HandlerError> {
        match envelopes.first() {
            Some(first) if first.event_type == E::EVENT_TYPE => {
                let events = decode_all::<E>(envelopes, upcasters)?;
                call_batch(&self.handler, conn, events).await
            }
            _ => {
                self.next
                    .dispatch_batch_send(conn, envelopes, upcasters)
                    .await
            }
        }
    }
}

/// The object-safe face of [`SendRoutes`], with boxed futures.
trait ErasedRoutes<DB: Backend>: Send + Sync {
    fn handles(&self, event_type: &str) -> bool;
    fn event_types(&self, into: &mut Vec<&'static str>);
    fn takes_batches(&self, event_type: &str) -> bool;
    fn dispatch<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        envelope: &'a EventEnvelope,
        upcasters: &'a Upcasters,
    ) -> Dispatch<'a>;
    fn dispatch_batch<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        envelopes: &'a [&'a EventEnvelope],
        upcasters: &'a Upcasters,
    ) -> Dispatch<'a>;
}

impl<DB: Backend, R: SendRoutes<DB>> ErasedRoutes<DB> for R {
    fn handles(&self, event_type: &str) -> bool {
        Routes::handles(self, event_type)
    }

    fn event_types(&self, into: &mut Vec<&'static str>) {
        Routes::event_types(self, into)
    }

    fn takes_batches(&self, event_type: &str) -> bool {
        Routes::takes_batches(self, event_type)
    }

    fn dispatch<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        envelope: &'a EventEnvelope,
        upcasters: &'a Upcasters,
    ) -> Dispatch<'a> {
        Box::pin(self.dispatch_send(conn, envelope, upcasters))
    }

    fn dispatch_batch<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        envelopes: &'a [&'a EventEnvelope],
        upcasters: &'a Upcasters,
    ) -> Dispatch<'a> {
        Box::pin(self.dispatch_batch_send(conn, envelopes, upcasters))
    }
}

/// A consumer's handlers behind one pointer: the routes of a `BoxConsumer`. Cloning it
/// shares the handlers.
pub struct BoxRoutes<DB: Backend>(Arc<dyn ErasedRoutes<DB>>);

impl<DB: Backend> BoxRoutes<DB> {
    pub(crate) fn new(routes: impl SendRoutes<DB>) -> BoxRoutes<DB> {
        BoxRoutes(Arc::new(routes))
    }
}

impl<DB: Backend> Clone for BoxRoutes<DB> {
    fn clone(&self) -> Self {
        BoxRoutes(Arc::clone(&self.0))
    }
}

impl<DB: Backend> std::fmt::Debug for BoxRoutes<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut types = Vec::new();
        self.0.event_types(&mut types);
        f.debug_tuple("BoxRoutes").field(&types).finish()
    }
}

impl<DB: Backend> Routes<DB> for BoxRoutes<DB> {
    fn handles(&self, event_type: &str) -> bool {
        self.0.handles(event_type)
    }

    fn event_types(&self, into: &mut Vec<&'static str>) {
        self.0.event_types(into)
    }

    async fn dispatch(
        &self,
        conn: &mut DB::Connection,
        envelope: &EventEnvelope,
        upcasters: &Upcasters,
    ) -> Result<(), HandlerError> {
        self.0.dispatch(conn, envelope, upcasters).await
    }

    fn takes_batches(&self, event_type: &str) -> bool {
        self.0.takes_batches(event_type)
    }

    async fn dispatch_batch(
        &self,
        conn: &mut DB::Connection,
        envelopes: &[&EventEnvelope],
        upcasters: &Upcasters,
    ) -> Result<(), HandlerError> {
        self.0.dispatch_batch(conn, envelopes, upcasters).await
    }
}
