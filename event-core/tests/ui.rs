//! Compile-time behaviour of `#[derive(DomainEvent)]`: what compiles and the exact errors of what
//! does not. Refresh the expected output after an intended change with
//! `TRYBUILD=overwrite cargo test -p event-core --test ui`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
