#![doc = include_str!("../README.md")]

// The layers, each importing only from those below it:
//   L5  brokers                                   NATS JetStream, RabbitMQ, Kafka
//   L4  relay, worker, consumer, route            loops that claim, publish, handle
//   L3  outbox, message, inbox, quarantine,       one store per table family; where events go
//       publisher, archive, reconcile,
//       asyncapi                                  the AsyncAPI document of the routes
//   L2  sql (dialect, outbox, message, inbox)     every statement; dialect owns the differences
//   L1  row, config, metrics, wire, telemetry     rows as Rust values; settings; metric names;
//                                                 the wire formats (envelope, CloudEvents)
//   L0  status, table, clock, error               states, names, time, the error type

mod clock;
mod error;
mod status;
mod table;

mod config;
pub mod metrics;
mod row;
pub mod telemetry;
pub mod wire;

mod sql;

mod archive;
pub mod asyncapi;
mod audit;
mod inbox;
mod message;
mod outbox;
mod publisher;
mod quarantine;
mod reconcile;

mod consumer;
mod relay;
mod route;
mod worker;

mod brokers;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{BoxError, Error, HandlerError, UnreadableRow, redact_url};
pub use wire::{PREVIOUS_SEQUENCE_HEADER, UnknownWireFormat, WireFormat};

/// The old name of [`UnreadableRow`], which `event_core::RecordError` (recording an event on an
/// aggregate) made ambiguous.
#[deprecated(
    since = "0.1.0",
    note = "renamed `UnreadableRow`: a stored row that cannot be read back"
)]
pub type RecordError = UnreadableRow;
pub use status::{EventStatus, FailureClass, FailureClassError, QuarantineStatus, StatusError};
pub use table::{TableName, TableNameError};

pub use config::backoff::{Backoff, due_after};
pub use config::outbox::{CommitPath, IndexProfile, OutboxConfig, Route};
pub use config::relay::RelayConfig;
pub use row::audit::{AuditEntry, Consumption, NewAuditEntry};
pub use row::message::{MessageEvent, MessageRecord};
pub use row::outbox::{
    FlushReport, GroupCount, Lease, MinuteCount, OutboxHealth, OutboxRecord, OutboxSearch,
    StatusCounts,
};
pub use row::quarantine::{QuarantineFilter, QuarantineRecord};

pub use sql::dialect::{Backend, Dialect};

pub use archive::ArchiveReport;
pub use audit::{AuditLog, consumptions};
pub use inbox::{Handled, Inbox, InboxError};
pub use message::{MessageHealth, MessageStore};
pub use outbox::{Commit, Outbox, Republish, RepublishReport};
pub use publisher::{ChannelPublisher, JsonLinesPublisher, OutboxMessage, PublishError, Publisher};
pub use quarantine::{Quarantine, QuarantineCount};
pub use reconcile::{Reconcile, ReconcileReport, ReconcileTotals, ReconciledEvent};

pub use consumer::{BoxConsumer, Consumer, Processed, Received};
pub use relay::{BatchReport, Relay};
pub use route::{BoxRoutes, Delivered, SendBatchHandler, SendHandler, SendRoutes, UnknownEvents};
#[doc(hidden)]
pub use route::{NoRoutes, On, OnBatch, Routes};
pub use worker::{MessageWorker, WorkerReport};

pub use brokers::ConsumeReport;
#[cfg(feature = "nats")]
pub use brokers::{JetStreamSubscription, NatsPublisher};
#[cfg(feature = "kafka")]
pub use brokers::{KafkaPublisher, KafkaSubscription};
#[cfg(feature = "rabbitmq")]
pub use brokers::{RabbitMqPublisher, RabbitMqSubscription};
