//! Holds the renamed-runtime trybuild case; see `tests/ui/pass/renamed`.
