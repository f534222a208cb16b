//! Compile-time errors of the macros, each under the user's offending tokens (`tests/ui/*.rs`
//! with reviewed `.stderr` files), and programs that must compile (`tests/ui/pass/`). Paths are
//! relative to this package, `tests/`.
//!
//! The `.stderr` files hold rustc's exact wording, which changes between compiler releases, so the
//! suite runs on the release they are written for, stable 1.95, and shows as ignored on any other
//! compiler. CI (`.ci/run`) runs on 1.95.0 so that it is never ignored there.

#[rustversion::attr(
    not(stable(1.95)),
    ignore = "the ui .stderr files are written for rustc 1.95; run on 1.95 to check them"
)]
#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
    t.pass("ui/pass/*.rs");
}
