//! Cross-crate tests of the workspace and the fixtures they share.
//!
//! The Rust examples of the README and of the guide (`docs/src`) are compiled and run here as
//! doctests, so the documentation cannot drift from the code.

pub mod any_broker;
pub mod db;
pub mod fixtures;
pub mod proxy;
pub mod tansu;
pub mod wait;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The guide's chapters: their Rust examples run too.
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../docs/src/event-model.md")]
    struct EventModel;
    #[doc = include_str!("../docs/src/schema.md")]
    struct Schema;
    #[doc = include_str!("../docs/src/outbox.md")]
    struct Outbox;
    #[doc = include_str!("../docs/src/testing.md")]
    struct Testing;
    #[doc = include_str!("../docs/src/operations.md")]
    struct Operations;
    #[doc = include_str!("../docs/src/performance.md")]
    struct Performance;
    #[doc = include_str!("../docs/src/development.md")]
    struct Development;
}
