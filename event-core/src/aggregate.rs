//! Aggregates record events as their state changes.

use crate::{DomainEvent, EventNo};

/// The longest aggregate id, in bytes: the width of the `aggregate_id` column.
pub const MAX_AGGREGATE_ID_LEN: usize = 64;

/// An aggregate: a consistency boundary whose state changes produce events.
///
/// State stays in the application's own tables; the aggregate keeps the events it recorded in a
/// [`RecordedEvents`] until a [`UnitOfWork`](crate::UnitOfWork) collects them.
///
/// ```
/// use event_core::{Aggregate, DomainEvent, RecordedEvents, RecordError};
///
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
/// #[domain_event(aggregate = "ORDER")]
/// struct OrderPaid { #[domain_event(aggregate_id)] order_id: String, amount_minor: i64 }
///
/// #[derive(Aggregate)]
/// #[aggregate(type = "ORDER")]
/// struct Order { #[aggregate(id)] id: String, paid: bool, events: RecordedEvents }
///
/// impl Order {
///     fn pay(&mut self, amount_minor: i64) -> Result<(), RecordError> {
///         if self.paid { return Ok(()); }
///         self.paid = true;
///         self.record(OrderPaid { order_id: self.id.clone(), amount_minor })
///     }
/// }
///
/// let mut order = Order { id: "o-1".into(), paid: false, events: RecordedEvents::loaded_at(4) };
/// order.pay(1999)?;
/// assert_eq!(order.events.pending_len(), 1);
/// # Ok::<(), RecordError>(())
/// ```
pub trait Aggregate {
    /// The aggregate type, e.g. `ORDER`. Events that declare an aggregate must declare this one.
    const AGGREGATE_TYPE: &'static str;

    /// The aggregate's id, at most 64 bytes.
    fn aggregate_id(&self) -> String;

    /// Where the aggregate keeps its recorded, not yet collected, events.
    fn recorded_events(&mut self) -> &mut RecordedEvents;

    /// Records `event` as the aggregate's next event.
    ///
    /// Fails, recording nothing, when the event declares another aggregate type or carries another
    /// aggregate id, or when its payload cannot be serialized.
    fn record<E: DomainEvent>(&mut self, event: E) -> Result<(), RecordError>
    where
        Self: Sized,
    {
        if let Some(declared) = E::AGGREGATE_TYPE
            && declared != Self::AGGREGATE_TYPE
        {
            return Err(RecordError::AggregateTypeMismatch {
                event_type: E::EVENT_TYPE,
                declared,
                aggregate: Self::AGGREGATE_TYPE,
            });
        }
        let aggregate_id = self.aggregate_id();
        if let Some(carried) = event.aggregate_id()
            && carried != aggregate_id
        {
            return Err(RecordError::AggregateIdMismatch {
                event_type: E::EVENT_TYPE,
                carried,
                aggregate_id,
            });
        }
        let payload = serde_json::to_value(&event).map_err(|source| RecordError::Payload {
            event_type: E::EVENT_TYPE,
            source,
        })?;
        self.recorded_events().pending.push(PendingEvent {
            event_type: E::EVENT_TYPE,
            event_version: E::EVENT_VERSION,
            event_no: event.event_no(),
            payload,
        });
        Ok(())
    }
}

/// The events an aggregate recorded since it was loaded, and the version it was loaded at.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordedEvents {
    version: u64,
    pending: Vec<PendingEvent>,
}

/// A recorded event waiting to be collected by a unit of work.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PendingEvent {
    pub(crate) event_type: &'static str,
    pub(crate) event_version: u32,
    pub(crate) event_no: Option<EventNo>,
    pub(crate) payload: serde_json::Value,
}

impl RecordedEvents {
    /// For a new aggregate: its first event gets sequence 1.
    pub fn new() -> RecordedEvents {
        RecordedEvents::default()
    }

    /// For an aggregate loaded at `version` (the sequence of its last event): its next event gets
    /// `version + 1`.
    pub fn loaded_at(version: u64) -> RecordedEvents {
        RecordedEvents {
            version,
            pending: Vec::new(),
        }
    }

    /// The sequence of the aggregate's last collected event (its loaded version until then).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// How many recorded events wait to be collected.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// The recorded events' types, in order.
    pub fn pending_types(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.pending.iter().map(|p| p.event_type)
    }

    pub(crate) fn take(&mut self) -> (u64, Vec<PendingEvent>) {
        let taken = std::mem::take(&mut self.pending);
        let from = self.version;
        self.version += taken.len() as u64;
        (from, taken)
    }

    pub(crate) fn pending(&self) -> &[PendingEvent] {
        &self.pending
    }
}

/// Why an event could not be recorded or collected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The event declares an aggregate type other than the aggregate it was recorded on.
    #[error(
        "`{event_type}` belongs to aggregate `{declared}` but was recorded on a `{aggregate}`: record it on a `{declared}` aggregate, or change its `aggregate` attribute"
    )]
    AggregateTypeMismatch {
        /// The event type.
        event_type: &'static str,
        /// The aggregate type the event declares.
        declared: &'static str,
        /// The aggregate type it was recorded on.
        aggregate: &'static str,
    },
    /// The event's aggregate id field differs from the aggregate's id.
    #[error(
        "`{event_type}` carries aggregate id `{carried}` but was recorded on aggregate `{aggregate_id}`: record it on the aggregate it names"
    )]
    AggregateIdMismatch {
        /// The event type.
        event_type: &'static str,
        /// The id in the event.
        carried: String,
        /// The aggregate's id.
        aggregate_id: String,
    },
    /// The payload could not be serialized as JSON.
    #[error("the payload of `{event_type}` cannot be serialized as JSON: {source}")]
    Payload {
        /// The event type.
        event_type: &'static str,
        /// What serde reported.
        #[source]
        source: serde_json::Error,
    },
    /// The aggregate's id is empty or longer than the column allows.
    #[error(
        "aggregate `{aggregate_type}` has id `{aggregate_id}`, which is {problem}: aggregate ids are 1 to 64 bytes"
    )]
    InvalidAggregateId {
        /// The aggregate type.
        aggregate_type: &'static str,
        /// The id, cut to 80 characters.
        aggregate_id: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The event_no template rendered an empty string.
    #[error(
        "the event_no of `{event_type}` rendered empty: its template fields must not all be empty, since the event number is the idempotency key"
    )]
    EmptyEventNo {
        /// The event type.
        event_type: &'static str,
    },
}
