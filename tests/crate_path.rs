//! A crate that reaches idem under another name than `::idem`, without `crate = "…"`, gets one
//! error that says which argument fixes it, not one "cannot find `idem`" per generated path; and
//! with the argument it compiles.
//!
//! trybuild cannot show this (its test crate always depends on `idem` by that name), so the test
//! builds small crates of its own against this checkout, offline, in its own target directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The checkout's root: where the facade package and its lock file are.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| dir.join("idem-macros").is_dir())
        .expect("the checkout's root")
        .to_owned()
}

/// The facade's package name, as a dependency names it.
fn package_name(root: &Path) -> String {
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let package = manifest.split("[package]").nth(1).expect("[package]");
    let line = package
        .lines()
        .find(|l| l.trim_start().starts_with("name"))
        .expect("package name");
    line.split('"').nth(1).expect("quoted name").to_owned()
}

/// Writes a crate of `files` under the test's directory and checks it; the compiler's errors
/// about the crate's own files, one a line.
fn check(name: &str, files: &[(&str, String)]) -> Vec<String> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("crate_path")
        .join(name);
    for (path, text) in files {
        let path = dir.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }
    fs::copy(root().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["check", "--offline", "--quiet", "--message-format=short"])
        .current_dir(&dir)
        .env(
            "CARGO_TARGET_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("crate_path_target"),
        )
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo");
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("src/") && l.contains("error"))
        .map(str::to_owned)
        .collect()
}

/// A package's manifest; the crate checked is a workspace of its own (and of the packages in
/// its directory).
fn manifest(name: &str, dependencies: &str, workspace: bool) -> String {
    let workspace = if workspace { "\n[workspace]\n" } else { "" };
    format!(
        "[package]\nname = \"{name}\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         [dependencies]\n{dependencies}\n{workspace}"
    )
}

fn handler(path: &str, krate: &str) -> String {
    format!(
        "#[{path}::idempotent(scope = \"refund:<order_no>\", key = key{krate})]\n\
         pub async fn refund(order_no: String, key: String) -> Result<u64, {path}::Error> {{\n    \
         Ok(order_no.len() as u64 + key.len() as u64)\n}}\n\nfn main() {{}}\n"
    )
}

#[test]
fn a_renamed_or_re_exported_idem_is_one_error_that_names_crate() {
    let root = root();
    let (root_dir, package) = (root.display().to_string(), package_name(&root));
    let idem = format!("path = \"{root_dir}\", default-features = false");

    // Renamed in Cargo.toml.
    let renamed = |krate: &str| -> Vec<(&str, String)> {
        vec![
            (
                "Cargo.toml",
                manifest(
                    "renamed",
                    &format!("my_idem = {{ package = \"{package}\", {idem} }}"),
                    true,
                ),
            ),
            ("src/main.rs", handler("my_idem", krate)),
        ]
    };
    let errors = check("renamed", &renamed(""));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].starts_with(
            "src/main.rs:1:1: error: idem is a dependency of this crate under the name `my_idem`"
        ) && errors[0].contains("add `crate = \"::my_idem\"`"),
        "{errors:#?}"
    );
    assert_eq!(
        check("renamed", &renamed(", crate = \"::my_idem\"")),
        Vec::<String>::new()
    );

    // Re-exported by another crate.
    let platform = vec![
        (
            "platform/Cargo.toml",
            manifest(
                "platform",
                &format!("idem = {{ package = \"{package}\", {idem} }}"),
                false,
            ),
        ),
        ("platform/src/lib.rs", "pub use idem;\n".to_owned()),
    ];
    let reexported = |krate: &str| -> Vec<(&str, String)> {
        let mut files = platform.clone();
        files.push((
            "Cargo.toml",
            manifest("reexported", "platform = { path = \"platform\" }", true),
        ));
        files.push(("src/main.rs", handler("platform::idem", krate)));
        files
    };
    let errors = check("reexported", &reexported(""));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].starts_with("src/main.rs:1:1: error: idem is not a dependency of this crate")
            && errors[0].contains("`crate = \"other_crate::idem\"`"),
        "{errors:#?}"
    );
    assert_eq!(
        check("reexported", &reexported(", crate = \"platform::idem\"")),
        Vec::<String>::new()
    );
}
