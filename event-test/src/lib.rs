//! A test kit for services built on `event-core` and `event-sqlx`.
//!
//! - [`AggregateTest`]: given / when / then on one aggregate, without a database: the events a
//!   command records, as envelopes, each payload checked against its schema and snapshot.
//! - [`ConsumerTest`]: the service's own [`Consumer`](event_sqlx::Consumer) on an SQLite
//!   database in memory ([`memory_database`]): deliver an [`envelope`] once, twice, in a batch,
//!   and see what it did ([`Outcome`]); [`Flaky`] handlers fail on demand.
//! - [`Harness`]: the real outbox, relay and consumers over a [`MemoryBroker`], run until
//!   everything [settled](Harness::settle), with time the test moves ([`TestClock`],
//!   [`Harness::advance`], [`Harness::run_for`]) and faults it injects.
//! - [`wire`] and [`assert_wire_snapshot!`]: what is stored and published, as `insta`
//!   snapshots.
//!
//! Nothing in the kit sleeps: time moves when the test moves it, and waits for real work have a
//! deadline.

mod aggregate;
mod broker;
mod check;
mod clock;
mod consumer;
mod db;
mod deadline;
mod envelope;
mod expect;
mod harness;
pub mod wire;

pub use aggregate::{AggregateTest, Then};
pub use broker::MemoryBroker;
pub use clock::TestClock;
pub use consumer::{ConsumerTest, Flaky, Outcome};
#[cfg(feature = "sqlite")]
pub use db::memory_database;
pub use envelope::{EnvelopeBuilder, envelope};
pub use expect::Expected;
pub use harness::{Harness, Settled, Stop, Undelivered, Unsettled};

#[doc(hidden)]
pub use insta as __insta;
