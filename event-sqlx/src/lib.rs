//! Storage and delivery of domain events on sqlx: the transactional outbox of the seeds
//! (`biz_outbox_event`), its relay, the message event table (`biz_message_event`) and the
//! consumer inbox (`consumed_event`), on PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use event_sqlx::{JsonLinesPublisher, Outbox, OutboxConfig, RelayConfig};
//!
//! let pool = sqlx::SqlitePool::connect("sqlite://orders.db?mode=rwc").await?;
//! let outbox = Outbox::new(pool.clone(), OutboxConfig::new());
//! outbox.migrate().await?;
//!
//! // In a command handler: state and events in one transaction.
//! # let uow = event_core::UnitOfWork::new(event_core::EventContext::new("order-service"));
//! let mut tx = pool.begin().await?;
//! // ... UPDATE orders ... in tx ...
//! let report = outbox.commit(tx, uow).await?;
//!
//! // In the background: publish what was committed.
//! let relay = outbox.relay(JsonLinesPublisher::stdout(), RelayConfig::new("relay-1"));
//! relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await;
//! # Ok(()) }
//! ```

mod backend;
mod brokers;
mod config;
mod consumer;
mod error;
mod inbox;
mod message;
mod outbox;
mod publisher;
mod record;
mod relay;
mod status;
mod table;
mod worker;

pub use backend::message::MessageBackend;
pub use backend::{Backend, Dialect};
pub use brokers::{BrokerError, ConsumeReport};
#[cfg(feature = "nats")]
pub use brokers::{JetStreamSubscription, NatsPublisher};
#[cfg(feature = "rabbitmq")]
pub use brokers::{RabbitMqPublisher, RabbitMqSubscription};
pub use config::{OutboxConfig, Route};
pub use consumer::{Consumer, ConsumerStopped, HandlerError, Processed, QuarantineRecord};
pub use error::OutboxError;
pub use inbox::{Handled, Inbox, InboxError};
pub use message::{MessageEvent, MessageRecord, MessageStore};
pub use outbox::{Outbox, Republish};
pub use publisher::{ChannelPublisher, JsonLinesPublisher, OutboxMessage, PublishError, Publisher};
pub use record::{FlushReport, OutboxRecord, RecordError, StatusCounts};
pub use relay::{Backoff, BatchReport, Relay, RelayConfig, due_after};
pub use status::{EventStatus, StatusError};
pub use table::{TableName, TableNameError};
pub use worker::{MessageWorker, WorkerReport};
