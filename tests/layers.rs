//! The runtime's layering, as ARCHITECTURE.md draws it, checked against the code.
//!
//! ARCHITECTURE.md lists the runtime's modules in order (rows top to bottom, left to right) in
//! the block under "Layers of the runtime": a module may name only modules listed before it.
//! This test reads that list and every `crate::…` path in `idem-runtime/src` (comments aside)
//! and fails on an edge that points the other way, on a module the list does not name, and on
//! a listed module that does not exist. Generated-code shims (`private`) come last: they may
//! name anything, nothing may name them.
//!
//! The stores are checked one level down the same way: the block under "Layers of the stores"
//! orders `store`'s own file and its children (`crate::store::…`, `super::…` and `self::…`
//! paths, names re-exported by `store/mod.rs` or `lib.rs` counted as the child they come from),
//! so that no two of them name each other.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// The modules of the layer block of ARCHITECTURE.md's section `section`, in order.
fn documented_order(section: &str) -> Vec<String> {
    let doc = fs::read_to_string(Path::new(ROOT).join("ARCHITECTURE.md")).unwrap();
    let start = doc
        .find(&format!("## {section}\n"))
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has a section \"{section}\""));
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
    let order = documented_order("Layers of the runtime");
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

/// A file's module path (`store/sql/engine.rs` → `store::sql::engine`, a `mod.rs` its
/// directory's).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut path: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_owned())
        .collect();
    if path.last().is_some_and(|l| l == "mod" || l == "lib") {
        path.pop();
    }
    path
}

/// What `pub use` (of any visibility) in `text` re-exports, name → the module path it names,
/// relative to `base` (`self::`/`crate::` resolved), for names of a brace list or a single
/// path; globs re-export no name of their own.
fn reexports(text: &str, base: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut names = BTreeMap::new();
    let flat = text.replace('\n', " ");
    for stmt in flat.split(';') {
        let stmt = stmt.trim();
        let Some(at) = stmt.find("use ") else {
            continue;
        };
        if !stmt[..at].trim_start().starts_with("pub") {
            continue;
        }
        let path = stmt[at + 4..].trim();
        let (prefix, items) = match path.split_once('{') {
            Some((prefix, items)) => (prefix.trim_end_matches("::"), items.trim_end_matches('}')),
            None => match path.rsplit_once("::") {
                Some((prefix, item)) => (prefix, item),
                None => continue,
            },
        };
        let module = resolve(prefix, base);
        for item in items
            .split(',')
            .map(str::trim)
            .filter(|i| !i.is_empty() && *i != "*")
        {
            let name = item
                .rsplit("::")
                .next()
                .unwrap()
                .split(" as ")
                .next()
                .unwrap();
            let mut full = module.clone();
            full.extend(
                item.split("::")
                    .take(item.matches("::").count())
                    .map(str::to_owned),
            );
            names.insert(name.trim().to_owned(), full);
        }
    }
    names
}

/// A path as written in the module `at` (`crate::a::b`, `super::x`, `self::y`, or relative).
fn resolve(path: &str, at: &[String]) -> Vec<String> {
    let mut parts = path.split("::").map(str::trim).filter(|p| !p.is_empty());
    let mut out: Vec<String> = match parts.clone().next() {
        Some("crate") => {
            parts.next();
            Vec::new()
        }
        _ => at.to_vec(),
    };
    for part in parts {
        match part {
            "self" => {}
            "super" => {
                out.pop();
            }
            p => out.push(p.to_owned()),
        }
    }
    out
}

/// The edges between the children of the module `dir` (and its own file, named `dir`): which
/// names which, with where. `store/mod.rs`'s and `lib.rs`'s re-exports count as the module they
/// come from; a `pub use` in the directory's own file is its facade, not an edge.
fn child_edges(src: &Path, dir: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let own = src.join(dir).join("mod.rs");
    let own_text = fs::read_to_string(&own).unwrap();
    let base = vec![dir.to_owned()];
    let renamed = reexports(&own_text, &base);
    let at_root = reexports(&fs::read_to_string(src.join("lib.rs")).unwrap(), &[]);
    let mut children = BTreeSet::new();
    for entry in fs::read_dir(src.join(dir)).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if (path.is_dir() || path.extension().is_some_and(|e| e == "rs")) && stem != "mod" {
            children.insert(stem);
        }
    }
    let node_of = |path: &[String]| -> Option<String> {
        let path = match path.first() {
            Some(first) if first == dir => path,
            // A name the crate's root re-exports (`crate::PgStore`).
            Some(first) => at_root
                .get(first)
                .filter(|full| full.first().is_some_and(|m| m == dir))?
                .as_slice(),
            None => return None,
        };
        match path.get(1) {
            Some(child) if children.contains(child) => Some(child.clone()),
            Some(name) => match renamed.get(name) {
                Some(full) => full
                    .get(1)
                    .filter(|c| children.contains(*c))
                    .cloned()
                    .or(Some(dir.to_owned())),
                None => Some(dir.to_owned()),
            },
            None => Some(dir.to_owned()),
        }
    };
    let mut files = Vec::new();
    rust_files(&src.join(dir), &mut files);
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in files {
        let at = module_path(src, &file);
        let Some(from) = node_of(&at) else { continue };
        let text = fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//")
                || (file == own && code.starts_with("pub") && code.contains("use "))
            {
                continue;
            }
            for start in ["crate::", "super::", "self::"] {
                for (i, _) in line.match_indices(start) {
                    // The start of a path, not the middle of one (`a::super::b` is not written).
                    if line[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                        continue;
                    }
                    let written: String = line[i..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                        .collect();
                    // The module part: every segment but a trailing item that is no module is
                    // harmless, as `node_of` looks at the first two only.
                    let path = resolve(written.trim_end_matches(':'), &at);
                    let Some(to) = node_of(&path) else { continue };
                    if to != from {
                        let place =
                            format!("{}:{}", file.strip_prefix(src).unwrap().display(), n + 1);
                        edges
                            .entry(from.clone())
                            .or_default()
                            .entry(to)
                            .or_insert(place);
                    }
                }
            }
        }
    }
    edges
}

#[test]
fn every_store_module_names_only_store_modules_listed_before_it() {
    let order = documented_order("Layers of the stores");
    let src = Path::new(ROOT).join("idem-runtime/src");
    let rank: BTreeMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, m)| (m.as_str(), i))
        .collect();
    let mut modules: BTreeSet<String> = fs::read_dir(src.join("store"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() || p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_stem().unwrap().to_str().unwrap().to_owned())
        .collect();
    modules.remove("mod");
    modules.insert("store".to_owned());
    let listed: BTreeSet<String> = order.iter().cloned().collect();
    assert_eq!(
        modules, listed,
        "ARCHITECTURE.md's store block must list exactly `store` and its children"
    );
    let mut wrong = Vec::new();
    for (from, tos) in child_edges(&src, "store") {
        for (to, place) in tos {
            if rank[to.as_str()] > rank[from.as_str()] {
                wrong.push(format!("{from} → {to} ({place})"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "these edges go against ARCHITECTURE.md's store order (a module may name only modules \
         listed before it):\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn the_store_check_resolves_super_self_and_reexports() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    fs::create_dir_all(src.join("store/sql")).unwrap();
    fs::write(
        src.join("lib.rs"),
        "pub use crate::store::lite::LiteStore;\n",
    )
    .unwrap();
    fs::write(
        src.join("store/mod.rs"),
        "mod sql;\npub use sql::{Builder, Kind};\npub use self::admin::Query;\npub trait Store {}\n",
    )
    .unwrap();
    fs::write(src.join("store/admin.rs"), "use super::Store;\n").unwrap();
    fs::write(src.join("store/sql/mod.rs"), "mod engine;\n").unwrap();
    fs::write(
        src.join("store/sql/engine.rs"),
        "use super::super::Query;\nuse crate::LiteStore;\n// crate::store::memory\n",
    )
    .unwrap();
    fs::write(
        src.join("store/lite.rs"),
        "use crate::store::Builder;\nfn f(_: &dyn super::Store) {}\n",
    )
    .unwrap();
    let edges = child_edges(src, "store");
    assert_eq!(edges["admin"].keys().collect::<Vec<_>>(), ["store"]);
    assert_eq!(edges["sql"].keys().collect::<Vec<_>>(), ["admin", "lite"]);
    assert_eq!(edges["lite"].keys().collect::<Vec<_>>(), ["sql", "store"]);
    assert!(
        !edges.contains_key("store"),
        "a facade's re-export is no edge: {edges:?}"
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
