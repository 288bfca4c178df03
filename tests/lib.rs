//! Cross-crate tests of the workspace and the fixtures they share.
//!
//! The Rust examples of the README and of the guide (`docs/src`) are compiled and run here as
//! doctests, so the documentation cannot drift from the code.

pub mod any_broker;
pub mod background;
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
    #[doc = include_str!("../docs/src/cloudevents.md")]
    struct CloudEvents;
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
/// `#[test attribute] name = opener, ...;` instead names each module and the expression that
/// opens its database (an `Option<TestDb<_>>` future), for a backend configured differently:
/// a module per opener, with a test per scenario.
///
/// ```text
/// event_tests::on_every_backend!(effects_happen_once, duplicates_are_absorbed);
/// event_tests::on_every_backend!(multi_thread: relay_beside_the_archiver);
/// event_tests::on_every_backend!(#[tokio::test] one_trip = postgres_with(CommitPath::OneTrip);
///     state_and_events_commit_or_roll_back_together);
/// ```
#[macro_export]
macro_rules! on_every_backend {
    (#[$test:meta] $($module:ident = $open:expr),+ ; $($scenario:ident),* $(,)?) => {
        $crate::on_every_backend!(@modules #[$test] [$($scenario),*] $($module = $open),+);
    };
    (@modules #[$test:meta] [$($scenario:ident),*] $module:ident = $open:expr $(, $rest:ident = $rest_open:expr)*) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[$test]
                async fn $scenario() {
                    if let Some(db) = $open.await {
                        super::$scenario(&db).await;
                        db.cleanup().await;
                    }
                }
            )*
        }
        $crate::on_every_backend!(@modules #[$test] [$($scenario),*] $($rest = $rest_open),*);
    };
    (@modules #[$test:meta] [$($scenario:ident),*]) => {};
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
