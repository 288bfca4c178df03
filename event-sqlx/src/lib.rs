//! Storage and delivery of domain events on sqlx: the transactional outbox of the seeds
//! (`biz_outbox_event`), the message event table (`biz_message_event`) and the consumer inbox
//! (`consumed_event`).

mod status;
mod table;

pub use status::{EventStatus, StatusError};
pub use table::{TableName, TableNameError};
