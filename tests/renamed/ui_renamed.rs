//! `event-core/tests/ui/pass/renamed`: the derive used through a renamed `event-core`, in a crate where
//! `::event_core` does not exist.

#[test]
fn ui_renamed() {
    let t = trybuild::TestCases::new();
    t.pass("../../event-core/tests/ui/pass/renamed/*.rs");
}
