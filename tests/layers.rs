//! The runtime's layering, as ARCHITECTURE.md draws it, checked against the code.
//!
//! ARCHITECTURE.md lists the runtime's modules in order (rows top to bottom, left to right) in
//! the block under "Layers of the runtime": a module may name only modules listed before it.
//! This test reads that list and every `crate::…` path in `idem-runtime/src` (comments aside)
//! and fails on an edge that points the other way, on a module the list does not name, and on
//! a listed module that does not exist. Generated-code shims (`private`) come last: they may
//! name anything, nothing may name them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// The modules of the layer block, in order.
fn documented_order() -> Vec<String> {
    let doc = fs::read_to_string(Path::new(ROOT).join("ARCHITECTURE.md")).unwrap();
    let start = doc
        .find("## Layers of the runtime")
        .expect("ARCHITECTURE.md has a section \"Layers of the runtime\"");
    let block = doc[start..]
        .split("```text\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the section opens with a ```text block");
    let mut order = Vec::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        // `layer   a · b · c      what it is`: the modules sit between the layer's name and the
        // first run of two or more spaces after them.
        let line = line.trim_start();
        let (_layer, rest) = line
            .split_once(char::is_whitespace)
            .unwrap_or_else(|| panic!("a layer line names modules: {line:?}"));
        let modules = rest.trim_start().split("  ").next().unwrap();
        order.extend(modules.split('·').map(|m| m.trim().to_owned()));
    }
    order
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`store/sql.rs` → `store`), `None` for `lib.rs`.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(stem) => Some(stem.to_owned()),
        None => Some(first),
    }
}

/// Names `lib.rs` re-exports from a module (`pub use crate::flow::{begin, …}`), so that
/// `crate::begin` counts as naming `flow`.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let flat = lib.replace('\n', " ");
    for stmt in flat.split(';') {
        let Some(path) = stmt.trim().strip_prefix("pub use crate::") else {
            continue;
        };
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        let items = rest.trim_start_matches(|c: char| c != '{' && !c.is_alphanumeric());
        for item in items.split([',', '{', '}', ' ']).filter(|s| !s.is_empty()) {
            let name = item.rsplit("::").next().unwrap();
            names.insert(name.to_owned(), module.to_owned());
        }
    }
    names
}

/// Every module each module names through a `crate::` path, with where.
fn edges(src: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let lib = fs::read_to_string(src.join("lib.rs")).unwrap();
    let reexports = root_reexports(&lib);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in files {
        let Some(from) = module_of(src, &file) else {
            continue;
        };
        let text = fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for (at, _) in line.match_indices("crate::") {
                let name: String = line[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let to = reexports.get(&name).cloned().unwrap_or(name);
                if to != from && !to.is_empty() {
                    let place = format!("{}:{}", file.strip_prefix(src).unwrap().display(), n + 1);
                    edges
                        .entry(from.clone())
                        .or_default()
                        .entry(to)
                        .or_insert(place);
                }
            }
        }
    }
    edges
}

#[test]
fn every_module_names_only_modules_listed_before_it() {
    let order = documented_order();
    let src = Path::new(ROOT).join("idem-runtime/src");
    let rank: BTreeMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, m)| (m.as_str(), i))
        .collect();
    assert_eq!(
        rank.len(),
        order.len(),
        "a module is listed twice: {order:?}"
    );

    let mut modules = BTreeSet::new();
    for entry in fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if let Some(m) = module_of(&src, &path) {
            modules.insert(m);
        }
    }
    let listed: BTreeSet<String> = order.iter().cloned().collect();
    assert_eq!(
        modules, listed,
        "ARCHITECTURE.md's layer block must list exactly the runtime's modules"
    );

    let mut wrong = Vec::new();
    for (from, tos) in edges(&src) {
        for (to, place) in tos {
            // A name that is no module (a macro exported at the root) is not an edge.
            let Some(&t) = rank.get(to.as_str()) else {
                continue;
            };
            if t > rank[from.as_str()] {
                wrong.push(format!("{from} → {to} ({place})"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "these edges go against ARCHITECTURE.md's layer order (a module may name only modules \
         listed before it):\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn the_check_sees_an_edge_against_the_order() {
    // The reader itself: a `crate::` path outside a comment is an edge; a comment is not.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    fs::write(src.join("lib.rs"), "pub use crate::b::thing;\n").unwrap();
    fs::write(
        src.join("a.rs"),
        "use crate::thing;\n// crate::c in a comment\n",
    )
    .unwrap();
    fs::write(src.join("b.rs"), "/// [`x`](crate::a::x)\nfn f() {}\n").unwrap();
    let edges = edges(src);
    assert_eq!(edges["a"].keys().collect::<Vec<_>>(), ["b"]);
    assert!(
        !edges.contains_key("b"),
        "a doc comment is not an edge: {edges:?}"
    );
}
