//! The unit of work: collects recorded events from aggregates and hands them over on commit.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};

use crate::aggregate::MAX_AGGREGATE_ID_LEN;
use crate::{
    Aggregate, EventEnvelope, EventHeaders, EventNo, RecordError, Traceparent, TraceparentError,
};

/// Where events come from and what they carry besides their payload: source service, tenant,
/// correlation, causation and trace.
///
/// ```
/// use event_core::EventContext;
///
/// let context = EventContext::new("order-service")
///     .tenant_id("acme")
///     .correlation_id("checkout-7")
///     .traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")?;
/// # Ok::<(), event_core::TraceparentError>(())
/// ```
#[derive(Debug, Clone)]
pub struct EventContext {
    source: String,
    headers: EventHeaders,
    trace_id: Option<String>,
    occurred_at: Option<DateTime<Utc>>,
}

impl EventContext {
    /// Events recorded by the service `source` (the `event_source` column), e.g. `order-service`.
    pub fn new(source: impl Into<String>) -> EventContext {
        let source = source.into();
        EventContext {
            headers: EventHeaders {
                source: Some(source.clone()),
                ..EventHeaders::default()
            },
            source,
            trace_id: None,
            occurred_at: None,
        }
    }

    /// The context for events caused by handling `cause`: same tenant and trace, the same
    /// correlation id (or `cause`'s event id when it had none), and `cause`'s event id as causation.
    pub fn caused_by(source: impl Into<String>, cause: &EventEnvelope) -> EventContext {
        let mut context = EventContext::new(source);
        context.headers.tenant_id = cause.headers.tenant_id.clone();
        context.headers.correlation_id = Some(
            cause
                .headers
                .correlation_id
                .clone()
                .unwrap_or_else(|| cause.event_id.to_string()),
        );
        context.headers.causation_id = Some(cause.event_id.to_string());
        context.headers.traceparent = cause.headers.traceparent.clone();
        context.trace_id = cause.trace_id.clone();
        context
    }

    /// Sets the tenant.
    pub fn tenant_id(mut self, tenant_id: impl Into<String>) -> Self {
        self.headers.tenant_id = Some(tenant_id.into());
        self
    }

    /// Sets the correlation id, shared by every event of one business flow.
    pub fn correlation_id(mut self, correlation_id: impl Into<String>) -> Self {
        self.headers.correlation_id = Some(correlation_id.into());
        self
    }

    /// Sets the causation id: the command or event that caused these events.
    pub fn causation_id(mut self, causation_id: impl Into<String>) -> Self {
        self.headers.causation_id = Some(causation_id.into());
        self
    }

    /// Joins the W3C trace of `traceparent`: the envelopes carry its trace id and the header.
    pub fn traceparent(mut self, traceparent: &str) -> Result<Self, TraceparentError> {
        let parsed: Traceparent = traceparent.parse()?;
        self.trace_id = Some(parsed.trace_id().to_owned());
        self.headers.traceparent = Some(parsed.as_str().to_owned());
        Ok(self)
    }

    /// Sets a trace id directly, for tracing systems other than W3C Trace Context.
    pub fn trace_id(mut self, trace_id: impl Into<String>) -> Self {
        self.trace_id = Some(trace_id.into());
        self
    }

    /// Adds a header of the application's own, carried in [`EventHeaders::extra`].
    ///
    /// `previoussequence` is not one: the outbox's relay sets it itself, on events whose
    /// aggregate's previous events were cancelled, and drops a header of that name added here
    /// (copied from a consumed event, say) when it publishes the event.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.extra.insert(name.into(), value.into());
        self
    }

    /// Stamps every event with `at` instead of the current time (tests, imports).
    pub fn occurred_at(mut self, at: DateTime<Utc>) -> Self {
        self.occurred_at = Some(at);
        self
    }

    /// The source service.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The headers every event gets.
    pub fn headers(&self) -> &EventHeaders {
        &self.headers
    }
}

/// Collects the events recorded on one or more aggregates within one business transaction, and
/// hands their envelopes over only when committed; dropped, it hands over nothing.
///
/// Each event gets its aggregate's next sequence number, continuing from the version the aggregate
/// was loaded at, and the context's time, trace and headers. With `event-sqlx`, the repository
/// writes the committed envelopes to the outbox in the same database transaction as the state.
///
/// ```
/// use event_core::{Aggregate, DomainEvent, EventContext, RecordedEvents, UnitOfWork};
///
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
/// struct OrderPlaced { order_id: String }
///
/// #[derive(Aggregate)]
/// #[aggregate(type = "ORDER")]
/// struct Order { #[aggregate(id)] id: String, events: RecordedEvents }
///
/// let mut order = Order { id: "o-1".into(), events: RecordedEvents::new() };
/// order.record(OrderPlaced { order_id: "o-1".into() })?;
///
/// let mut uow = UnitOfWork::new(EventContext::new("order-service"));
/// uow.collect(&mut order)?;
/// let envelopes = uow.commit();
/// assert_eq!(envelopes[0].aggregate_sequence, 1);
/// assert_eq!(envelopes[0].event_id.as_str(), "ORDER_PLACED:ORDER:o-1:1");
/// # Ok::<(), event_core::RecordError>(())
/// ```
#[derive(Debug)]
#[must_use = "a unit of work hands its events over only when committed"]
pub struct UnitOfWork {
    context: EventContext,
    envelopes: Vec<EventEnvelope>,
}

impl UnitOfWork {
    /// An empty unit of work whose events carry `context`.
    pub fn new(context: EventContext) -> UnitOfWork {
        UnitOfWork {
            context,
            envelopes: Vec::new(),
        }
    }

    /// Takes the events `aggregate` recorded, numbering them from its version, and returns how
    /// many were taken. On error nothing is taken and the aggregate is left as it was.
    pub fn collect<A: Aggregate>(&mut self, aggregate: &mut A) -> Result<usize, RecordError> {
        let aggregate_id = aggregate.aggregate_id();
        check_aggregate_id(A::AGGREGATE_TYPE, &aggregate_id)?;
        let recorded = aggregate.recorded_events();
        if let Some(empty) = recorded
            .pending()
            .iter()
            .find(|p| p.event_no.as_ref().is_some_and(|no| no.as_str().is_empty()))
        {
            return Err(RecordError::EmptyEventNo {
                event_type: empty.event_type,
            });
        }
        let occurred_at = self.occurred_at();
        let (from, pending) = recorded.take();
        let taken = pending.len();
        self.envelopes.reserve(taken);
        for (offset, event) in pending.into_iter().enumerate() {
            let sequence = from + 1 + offset as u64;
            let event_id = event.event_no.unwrap_or_else(|| {
                EventNo::from_rendered(&format!(
                    "{}:{}:{}:{}",
                    event.event_type,
                    A::AGGREGATE_TYPE,
                    aggregate_id,
                    sequence
                ))
            });
            self.envelopes.push(EventEnvelope {
                event_id,
                event_type: event.event_type.to_owned(),
                event_version: event.event_version,
                aggregate_type: A::AGGREGATE_TYPE.to_owned(),
                aggregate_id: aggregate_id.clone(),
                aggregate_sequence: sequence,
                occurred_at,
                trace_id: self.context.trace_id.clone(),
                headers: self.context.headers.clone(),
                payload: event.payload,
            });
        }
        Ok(taken)
    }

    /// The context the events carry.
    pub fn context(&self) -> &EventContext {
        &self.context
    }

    /// The envelopes collected so far.
    pub fn envelopes(&self) -> &[EventEnvelope] {
        &self.envelopes
    }

    /// How many events were collected.
    pub fn len(&self) -> usize {
        self.envelopes.len()
    }

    /// True when no event was collected.
    pub fn is_empty(&self) -> bool {
        self.envelopes.is_empty()
    }

    /// Commits the unit of work, handing over its envelopes in the order they were collected.
    pub fn commit(self) -> Vec<EventEnvelope> {
        self.envelopes
    }

    /// Stores keep microseconds, so events are stamped with microseconds: what is stored and what
    /// was handed over compare equal.
    fn occurred_at(&self) -> DateTime<Utc> {
        let now = self.context.occurred_at.unwrap_or_else(Utc::now);
        now.duration_trunc(TimeDelta::microseconds(1))
            .unwrap_or(now)
    }
}

fn check_aggregate_id(aggregate_type: &'static str, id: &str) -> Result<(), RecordError> {
    let problem = if id.is_empty() {
        "empty"
    } else if id.len() > MAX_AGGREGATE_ID_LEN {
        "longer than 64 bytes"
    } else {
        return Ok(());
    };
    Err(RecordError::InvalidAggregateId {
        aggregate_type,
        aggregate_id: id.chars().take(80).collect(),
        problem,
    })
}
