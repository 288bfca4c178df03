//! Compile-time behaviour of `#[derive(DomainEvent)]`: what compiles and the exact errors of what
//! does not. Refresh the expected output with `TRYBUILD=overwrite cargo test -p event-tests --test ui`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
    t.compile_fail("ui/fail/*.rs");
}
