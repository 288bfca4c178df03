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

/// Runs each scenario, an `async fn` taking a `&TestDb<DB>` for any backend, on a fresh
/// PostgreSQL, MySQL/MariaDB and SQLite database: a module per scenario, named after it, with a
/// test per backend (`postgres`, `mysql`, `sqlite`). A server that is unreachable skips its test,
/// unless `EVENT_TEST_REQUIRE_SERVICES=1`. `multi_thread:` first runs them on two worker threads,
/// for scenarios that spawn.
///
/// ```text
/// event_tests::on_every_backend!(effects_happen_once, duplicates_are_absorbed);
/// event_tests::on_every_backend!(multi_thread: relay_beside_the_archiver);
/// ```
#[macro_export]
macro_rules! on_every_backend {
    (@each #[$test:meta]; $($scenario:ident),*) => {$(
        mod $scenario {
            $crate::on_every_backend!(@one #[$test] $scenario postgres);
            $crate::on_every_backend!(@one #[$test] $scenario mysql);
            $crate::on_every_backend!(@one #[$test] $scenario sqlite);
        }
    )*};
    (@one #[$test:meta] $scenario:ident $backend:ident) => {
        #[$test]
        async fn $backend() {
            if let Some(db) = $crate::db::TestDb::$backend().await {
                super::$scenario(&db).await;
                db.cleanup().await;
            }
        }
    };
    (multi_thread: $($scenario:ident),* $(,)?) => {
        $crate::on_every_backend!(@each #[tokio::test(flavor = "multi_thread", worker_threads = 2)]; $($scenario),*);
    };
    ($($scenario:ident),* $(,)?) => {
        $crate::on_every_backend!(@each #[tokio::test]; $($scenario),*);
    };
}
