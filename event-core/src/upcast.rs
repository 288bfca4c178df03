//! Upcasters: stored events of an older version read as the newest type.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::{DecodeError, DomainEvent, EventEnvelope};

/// Turns the previous version of an event into this one.
///
/// ```
/// use event_core::{DomainEvent, EventEnvelope, Upcast, Upcasters};
///
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
/// #[domain_event(event_type = "ORDER_PAID", version = 1)]
/// struct OrderPaidV1 { order_id: String, amount: f64 }
///
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
/// #[domain_event(event_type = "ORDER_PAID", version = 2)]
/// struct OrderPaid { order_id: String, amount_minor: i64, currency: String }
///
/// impl Upcast for OrderPaid {
///     type Previous = OrderPaidV1;
///     fn upcast(v1: OrderPaidV1) -> OrderPaid {
///         OrderPaid { order_id: v1.order_id, amount_minor: (v1.amount * 100.0).round() as i64, currency: "EUR".into() }
///     }
/// }
///
/// let upcasters = Upcasters::new().with::<OrderPaid>()?;
/// # let stored: EventEnvelope = serde_json::from_value(serde_json::json!({
/// #   "eventId": "e", "eventType": "ORDER_PAID", "eventVersion": 1, "aggregateType": "ORDER",
/// #   "aggregateId": "o-1", "aggregateSequence": 1, "occurredAt": "2026-01-01T00:00:00Z",
/// #   "traceId": null, "headers": {}, "payload": {"order_id": "o-1", "amount": 19.99}}))?;
/// // `stored` holds version 1; the consumer reads version 2.
/// let paid: OrderPaid = upcasters.decode(&stored)?;
/// assert_eq!(paid.amount_minor, 1999);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Upcast: DomainEvent {
    /// The version before this one: same event type, version one less.
    type Previous: DomainEvent;

    /// The conversion.
    fn upcast(previous: Self::Previous) -> Self;
}

type Step = Arc<dyn Fn(Value) -> Result<Value, String> + Send + Sync>;

/// The upcasters a reader applies, by event type and version.
#[derive(Clone, Default)]
pub struct Upcasters {
    /// (event type, from version) -> the step to from + 1.
    steps: BTreeMap<(String, u32), Step>,
}

impl std::fmt::Debug for Upcasters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.steps.keys()).finish()
    }
}

/// Why an event could not be upcast.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpcastError {
    /// No upcaster is registered for one step of the chain.
    #[error(
        "no upcaster from {event_type} v{from} to v{to}: implement Upcast for the v{to} type (type Previous = the v{from} type) and register it with Upcasters::with, or with event_core::register_upcaster!"
    )]
    MissingStep {
        /// The event type.
        event_type: String,
        /// The version with no step onwards.
        from: u32,
        /// The version after it.
        to: u32,
    },
    /// The stored event is newer than the reader.
    #[error(
        "{event_type} v{stored} is newer than this reader's v{reader}: deploy the consumer with the new version before the producer (BACKWARD compatibility)"
    )]
    NewerThanReader {
        /// The event type.
        event_type: String,
        /// The stored version.
        stored: u32,
        /// The reader's version.
        reader: u32,
    },
    /// An upcaster failed on the payload.
    #[error("upcasting {event_type} v{from} (event {event_id}) failed: {reason}")]
    Failed {
        /// The event type.
        event_type: String,
        /// The version being upcast.
        from: u32,
        /// The event.
        event_id: String,
        /// What went wrong.
        reason: String,
    },
    /// A registered upcaster does not go from version N to N+1 of one event type.
    #[error(
        "{upcaster} cannot upcast {previous} v{from} to {event_type} v{to}: an upcaster goes from version N to N+1 of the same event type"
    )]
    NotOneStep {
        /// The type implementing Upcast.
        upcaster: &'static str,
        /// Its previous type's event type.
        previous: &'static str,
        /// The previous version.
        from: u32,
        /// Its event type.
        event_type: &'static str,
        /// Its version.
        to: u32,
    },
    /// Decoding the newest version failed.
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// An upcaster registered with [`register_upcaster!`](crate::register_upcaster).
#[doc(hidden)]
pub struct UpcasterRegistration {
    pub event_type: &'static str,
    pub from: u32,
    pub step: fn(Value) -> Result<Value, String>,
}

inventory::collect!(UpcasterRegistration);

/// The step of `E`, as a plain function for registration.
#[doc(hidden)]
pub fn step_of<E: Upcast>(payload: Value) -> Result<Value, String> {
    let previous: E::Previous = serde_json::from_value(payload).map_err(|e| e.to_string())?;
    serde_json::to_value(E::upcast(previous)).map_err(|e| e.to_string())
}

/// Registers `E`'s upcaster for every reader in the program ([`Upcasters::registered`]) and for
/// the snapshot check, which then accepts a breaking change from the previous version.
///
/// ```
/// use event_core::{DomainEvent, Upcast, Upcasters};
///
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
/// #[domain_event(event_type = "NOTE_ADDED", version = 1)]
/// struct NoteAddedV1 { text: String }
///
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
/// #[domain_event(event_type = "NOTE_ADDED", version = 2)]
/// struct NoteAdded { text: String, pinned: bool }
///
/// impl Upcast for NoteAdded {
///     type Previous = NoteAddedV1;
///     fn upcast(v1: NoteAddedV1) -> NoteAdded { NoteAdded { text: v1.text, pinned: false } }
/// }
///
/// event_core::register_upcaster!(NoteAdded);
///
/// assert!(Upcasters::registered().covers("NOTE_ADDED", 1, 2));
/// ```
#[macro_export]
macro_rules! register_upcaster {
    ($event:ty) => {
        $crate::__private::inventory::submit! {
            $crate::UpcasterRegistration {
                event_type: <<$event as $crate::Upcast>::Previous as $crate::DomainEvent>::EVENT_TYPE,
                from: <<$event as $crate::Upcast>::Previous as $crate::DomainEvent>::EVENT_VERSION,
                step: $crate::__private::step_of::<$event>,
            }
        }
    };
}

impl Upcasters {
    /// No upcasters.
    pub fn new() -> Upcasters {
        Upcasters::default()
    }

    /// Every upcaster registered with [`register_upcaster!`](crate::register_upcaster).
    pub fn registered() -> Upcasters {
        let mut upcasters = Upcasters::new();
        for registration in inventory::iter::<UpcasterRegistration> {
            let step = registration.step;
            upcasters.steps.insert(
                (registration.event_type.to_owned(), registration.from),
                Arc::new(step),
            );
        }
        upcasters
    }

    /// Adds `E`'s upcaster from `E::Previous`.
    pub fn with<E: Upcast + 'static>(mut self) -> Result<Upcasters, UpcastError> {
        let from = <E::Previous as DomainEvent>::EVENT_VERSION;
        if <E::Previous as DomainEvent>::EVENT_TYPE != E::EVENT_TYPE
            || from.checked_add(1) != Some(E::EVENT_VERSION)
        {
            return Err(UpcastError::NotOneStep {
                upcaster: std::any::type_name::<E>(),
                previous: <E::Previous as DomainEvent>::EVENT_TYPE,
                from,
                event_type: E::EVENT_TYPE,
                to: E::EVENT_VERSION,
            });
        }
        self.steps
            .insert((E::EVENT_TYPE.to_owned(), from), Arc::new(step_of::<E>));
        Ok(self)
    }

    /// Adds an upcaster working on the JSON payload, from `from` to `from + 1` of `event_type`:
    /// for versions whose Rust type is gone.
    pub fn with_json(
        mut self,
        event_type: &str,
        from: u32,
        step: impl Fn(Value) -> Result<Value, String> + Send + Sync + 'static,
    ) -> Upcasters {
        self.steps
            .insert((event_type.to_owned(), from), Arc::new(step));
        self
    }

    /// Whether every step from `from` to `to` of `event_type` is registered.
    pub fn covers(&self, event_type: &str, from: u32, to: u32) -> bool {
        (from..to).all(|v| self.steps.contains_key(&(event_type.to_owned(), v)))
    }

    /// The envelope upcast to version `to` through the registered steps.
    pub fn upcast(&self, envelope: &EventEnvelope, to: u32) -> Result<EventEnvelope, UpcastError> {
        if envelope.event_version > to {
            return Err(UpcastError::NewerThanReader {
                event_type: envelope.event_type.clone(),
                stored: envelope.event_version,
                reader: to,
            });
        }
        let mut upcast = envelope.clone();
        while upcast.event_version < to {
            let from = upcast.event_version;
            let step = self
                .steps
                .get(&(upcast.event_type.clone(), from))
                .ok_or_else(|| UpcastError::MissingStep {
                    event_type: upcast.event_type.clone(),
                    from,
                    to: from + 1,
                })?;
            upcast.payload = step(std::mem::take(&mut upcast.payload)).map_err(|reason| {
                UpcastError::Failed {
                    event_type: upcast.event_type.clone(),
                    from,
                    event_id: upcast.event_id.to_string(),
                    reason,
                }
            })?;
            upcast.event_version = from + 1;
        }
        Ok(upcast)
    }

    /// Decodes the envelope as `E`, upcasting an older version first.
    pub fn decode<E: DomainEvent>(&self, envelope: &EventEnvelope) -> Result<E, UpcastError> {
        if envelope.event_type != E::EVENT_TYPE {
            return Err(DecodeError::TypeMismatch {
                expected: E::EVENT_TYPE,
                found: envelope.event_type.clone(),
            }
            .into());
        }
        Ok(self.upcast(envelope, E::EVENT_VERSION)?.decode()?)
    }
}
