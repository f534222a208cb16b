//! Compile-time errors of the macros, each under the user's offending tokens (`tests/ui/*.rs`
//! with reviewed `.stderr` files), and programs that must compile (`tests/ui/pass/`).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
