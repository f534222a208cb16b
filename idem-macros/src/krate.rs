//! The path generated code names idem by: `::idem`, or what `crate = "…"` says.
//!
//! Without `crate = "…"`, a crate that reaches idem under another name (a renamed dependency,
//! or a re-export from another crate) would get a "cannot find `idem`" error for every path
//! the expansion names. When the crate's `Cargo.toml` shows for certain that `::idem` cannot
//! resolve, one error on the macro says which argument fixes it instead; when it cannot tell,
//! nothing is reported and the compiler has the last word.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::SystemTime;

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::LitStr;
use toml::de::{DeTable, DeValue};

use crate::ctxt::Ctxt;
use crate::spans::respan;

/// The idem crate, as generated code reaches it.
#[derive(Clone)]
pub(crate) struct Krate {
    path: TokenStream,
    /// Written by the user, on their string: a path that does not resolve is reported there.
    given: bool,
}

/// How the macro being expanded takes a crate path, for the message that asks for one.
#[derive(Clone, Copy)]
pub(crate) enum Site {
    /// `#[idempotent(…, crate = "…")]` and the SQL attributes.
    Attribute,
    /// `idem::scope!("…", crate = "…")`.
    Scope,
    /// `#[idem(crate = "…")]` on the enum of `state_machine!`.
    Machine,
}

impl Site {
    fn fix(self, path: &str) -> String {
        match self {
            Site::Attribute => format!("`crate = \"{path}\"`"),
            Site::Scope => format!("`crate = \"{path}\"` after the template"),
            Site::Machine => format!("`#[idem(crate = \"{path}\")]` on the enum"),
        }
    }
}

impl Krate {
    /// `::idem`, or the `crate = "…"` argument, checked: a string that is not a path is an
    /// error on it, and `::idem` stands in so the rest of the checks still run.
    pub(crate) fn new(lit: Option<&LitStr>, site: Site, cx: &mut Ctxt) -> Krate {
        let Some(lit) = lit else {
            if let Some(msg) = manifest_dir().and_then(|dir| unreachable_message(&dir, site)) {
                cx.at(Span::call_site(), msg);
            }
            return Krate::default_path();
        };
        match lit.parse::<syn::Path>() {
            Ok(path) => Krate {
                path: path.into_token_stream(),
                given: true,
            },
            Err(_) => {
                cx.at(
                    lit.span(),
                    format_args!(
                        "`crate` must be a path to the idem crate, such as \"::idem\" or \"my_app::deps::idem\", not \"{}\"",
                        lit.value()
                    ),
                );
                Krate::default_path()
            }
        }
    }

    fn default_path() -> Krate {
        Krate {
            path: quote!(::idem),
            given: false,
        }
    }

    /// `<crate>::__private`: where everything generated code calls lives.
    pub(crate) fn private(&self) -> TokenStream {
        let path = &self.path;
        quote!(#path::__private)
    }

    /// `<crate>::__private`, located on a user token: an unmet trait bound of the function it
    /// names is then reported there (under the return type, the store, an argument), not on
    /// the attribute. A crate path the user wrote keeps its own location, so that a path that
    /// does not resolve is reported once, on its string.
    pub(crate) fn private_at(&self, span: Span) -> TokenStream {
        let tail = respan(quote!(::__private), span);
        let path = if self.given {
            self.path.clone()
        } else {
            respan(self.path.clone(), span)
        };
        quote!(#path #tail)
    }
}

fn manifest_dir() -> Option<PathBuf> {
    std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from)
}

/// The package users depend on; its library is `idem`.
const PACKAGE: &str = "idempotency";

/// What a crate's manifest says about the name `idem`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reach {
    /// `::idem` resolves, or may.
    Maybe,
    /// idem is a dependency renamed to this key.
    Renamed(String),
    /// Nothing named like idem is a dependency: it can only come through a re-export.
    Absent,
}

/// The message for a crate that cannot reach idem as `::idem`, if its manifest says so.
fn unreachable_message(dir: &Path, site: Site) -> Option<String> {
    match reach(&dir.join("Cargo.toml")) {
        Reach::Maybe => None,
        Reach::Renamed(key) => {
            let name = key.replace('-', "_");
            Some(format!(
                "idem is a dependency of this crate under the name `{key}`, so it is not at `::idem`: add {}",
                site.fix(&format!("::{name}"))
            ))
        }
        Reach::Absent => Some(format!(
            "idem is not a dependency of this crate, so it is not at `::idem`: if another crate re-exports it, say where with {}",
            site.fix("other_crate::idem")
        )),
    }
}

/// Read once per manifest and modification time: every expansion in a crate asks.
fn reach(manifest: &Path) -> Reach {
    type Cache = HashMap<PathBuf, (Option<SystemTime>, Reach)>;
    static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(|| Mutex::new(HashMap::new()));
    let modified = std::fs::metadata(manifest).and_then(|m| m.modified()).ok();
    let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((at, reach)) = cache.get(manifest)
        && *at == modified
    {
        return reach.clone();
    }
    let reach = std::fs::read_to_string(manifest)
        .map(|text| reach_in(&text))
        .unwrap_or(Reach::Maybe);
    cache.insert(manifest.to_owned(), (modified, reach.clone()));
    reach
}

/// The verdict for one manifest's text. Anything unexpected is `Maybe`: a false error would be
/// worse than the compiler's own.
fn reach_in(text: &str) -> Reach {
    let Ok(doc) = DeTable::parse(text) else {
        return Reach::Maybe;
    };
    let doc = doc.get_ref();
    let named_idem = |table: Option<&DeValue<'_>>| {
        matches!(
            table.and_then(|t| entry_str(t, "name")),
            Some("idem" | PACKAGE)
        )
    };
    if named_idem(entry(doc, "package")) || named_idem(entry(doc, "lib")) {
        return Reach::Maybe;
    }
    let deps = dependency_tables(doc);
    let mut renamed = Vec::new();
    let mut similar = false;
    for (key, spec) in deps.iter().flat_map(|t| table_entries(t)) {
        let package = entry_str(spec, "package");
        // The package's library is named `idem`: under its own name, or renamed to `idem`, the
        // dependency is reached as `::idem`.
        if key == "idem" || (key == PACKAGE && package.is_none()) {
            return Reach::Maybe;
        }
        if package == Some(PACKAGE) {
            renamed.push(key.to_owned());
        }
        similar |= key.contains("idem") || package.is_some_and(|p| p.contains("idem"));
    }
    match renamed.as_slice() {
        [one] => Reach::Renamed(one.clone()),
        [] if !similar => Reach::Absent,
        _ => Reach::Maybe,
    }
}

/// `[dependencies]`, `[dev-dependencies]`, `[build-dependencies]`, and the same under each
/// `[target.'…']`.
fn dependency_tables<'a>(doc: &'a DeTable<'a>) -> Vec<&'a DeValue<'a>> {
    const KINDS: [&str; 3] = ["dependencies", "dev-dependencies", "build-dependencies"];
    let mut tables: Vec<&DeValue<'_>> = KINDS.iter().filter_map(|k| entry(doc, k)).collect();
    if let Some(DeValue::Table(targets)) = entry(doc, "target") {
        for (_, target) in targets.iter() {
            if let DeValue::Table(t) = target.get_ref() {
                tables.extend(KINDS.iter().filter_map(|k| entry(t, k)));
            }
        }
    }
    tables
}

fn entry<'a>(table: &'a DeTable<'a>, key: &str) -> Option<&'a DeValue<'a>> {
    table
        .iter()
        .find(|(k, _)| k.get_ref() == key)
        .map(|(_, v)| v.get_ref())
}

fn entry_str<'a>(value: &'a DeValue<'a>, key: &str) -> Option<&'a str> {
    match value {
        DeValue::Table(t) => match entry(t, key)? {
            DeValue::String(s) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

fn table_entries<'a>(value: &'a DeValue<'a>) -> Vec<(&'a str, &'a DeValue<'a>)> {
    match value {
        DeValue::Table(t) => t
            .iter()
            .map(|(k, v)| (&**k.get_ref(), v.get_ref()))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::{Reach, reach_in};

    #[test]
    fn a_dependency_named_idem_resolves() {
        let toml = "[package]\nname = \"shop\"\n[dependencies]\nidempotency = \"0.1\"\n";
        assert_eq!(reach_in(toml), Reach::Maybe, "the library is named idem");
        let toml = "[package]\nname = \"shop\"\n[dependencies]\nidem = { package = \"idempotency\", version = \"0.1\" }\n";
        assert_eq!(reach_in(toml), Reach::Maybe);
        let toml = "[package]\nname = \"shop\"\n[dev-dependencies]\nidem = { path = \"..\" }\n";
        assert_eq!(reach_in(toml), Reach::Maybe);
        let toml = "[package]\nname = \"idempotency\"\n";
        assert_eq!(
            reach_in(toml),
            Reach::Maybe,
            "the crate's own tests and examples"
        );
    }

    #[test]
    fn a_renamed_dependency_is_named() {
        let toml = "[package]\nname = \"shop\"\n[dependencies]\nmy-idem = { package = \"idempotency\", version = \"0.1\" }\n";
        assert_eq!(reach_in(toml), Reach::Renamed("my-idem".into()));
        let toml = "[package]\nname = \"shop\"\n[target.'cfg(unix)'.dependencies]\nid = { package = \"idempotency\" }\n";
        assert_eq!(reach_in(toml), Reach::Renamed("id".into()));
    }

    #[test]
    fn no_dependency_like_idem_is_absent() {
        let toml = "[package]\nname = \"shop\"\n[dependencies]\nplatform = { path = \"../platform\" }\nserde = \"1\"\n";
        assert_eq!(reach_in(toml), Reach::Absent);
    }

    #[test]
    fn anything_unsure_says_nothing() {
        // Another package whose library may be called idem, a name that is only similar, and
        // text that is not a manifest.
        let toml = "[package]\nname = \"shop\"\n[dependencies]\nidem-rs = \"1\"\n";
        assert_eq!(reach_in(toml), Reach::Maybe);
        let toml = "[package]\nname = \"shop\"\n[dependencies]\nidempotent = \"0.3\"\n";
        assert_eq!(reach_in(toml), Reach::Maybe);
        assert_eq!(reach_in("not [ toml"), Reach::Maybe);
    }
}
