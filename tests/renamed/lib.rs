//! Holds the renamed-runtime trybuild case; see `event-core/tests/ui/pass/renamed`.
