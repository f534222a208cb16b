//! Finding a crate's migrations and replaying them into a [`Catalog`], once per change.

use std::collections::HashMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::SystemTime;

use super::catalog::{Catalog, MigrationFile};
use super::discover::{self, Located, locate};
use super::replay;

/// What [`load`] found.
#[derive(Debug, Clone)]
pub enum Migrations {
    /// No migrations: no directory, or no migration files in it. Nothing can be checked.
    None,
    /// The catalog the migrations build, shared with later expansions through the cache.
    Found(Arc<Catalog>),
}

/// Why the migrations could not be read. sqlx fails on the same inputs, so each is a real
/// problem in the user's project, worth an error on the attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaError {
    /// An explicitly named migrations path does not exist.
    NotFound {
        /// The path as resolved.
        path: PathBuf,
    },
    /// `sqlx.toml` is not valid TOML, or its `migrate` settings have the wrong shape.
    Config {
        /// The `sqlx.toml`.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A file or directory could not be read (or a migration is not UTF-8).
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        message: String,
    },
    /// A `*_*.sql` file whose version (before the first `_`) is not an integer.
    BadFileName {
        /// The file.
        path: PathBuf,
    },
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaError::NotFound { path } => {
                write!(
                    f,
                    "no migrations directory or schema file at {}",
                    path.display()
                )
            }
            SchemaError::Config { path, message } => {
                write!(f, "cannot read {}: {message}", path.display())
            }
            SchemaError::Io { path, message } => {
                write!(f, "cannot read {}: {message}", path.display())
            }
            SchemaError::BadFileName { path } => write!(
                f,
                "migration file {} must start with an integer version, as in `20240101120000_create_orders.sql`",
                path.display()
            ),
        }
    }
}

impl std::error::Error for SchemaError {}

/// Loads the migrations of the crate in `manifest_dir` (the macro passes
/// `CARGO_MANIFEST_DIR`), or of `explicit` (a directory or schema file, relative to the crate).
///
/// Parsed catalogs are cached for the life of the process (a compiler or rust-analyzer
/// expands many attributes): a cached catalog is reused only while the same files have the
/// same modification times, lengths and contents, so the cache never changes an answer.
pub fn load(manifest_dir: &Path, explicit: Option<&Path>) -> Result<Migrations, SchemaError> {
    let Some(located) = locate(manifest_dir, explicit)? else {
        return Ok(Migrations::None);
    };
    let files = discover::read(&located.source)?;
    if files.is_empty() {
        return Ok(Migrations::None);
    }
    let stamp = stamp(&located, &files);
    let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((cached_stamp, catalog)) = cache.get(&located)
        && *cached_stamp == stamp
    {
        return Ok(Migrations::Found(Arc::clone(catalog)));
    }
    let catalog = Arc::new(replay::build(files, located.config.clone()));
    cache.insert(located, (stamp, Arc::clone(&catalog)));
    Ok(Migrations::Found(catalog))
}

/// Per input file: path, modification time, length and a hash of the text. The hash catches
/// a rewrite of the same length within the file system's clock resolution.
type Stamp = Vec<(PathBuf, Option<SystemTime>, u64, u64)>;

/// The last catalog built from each source, with the stamp of the inputs it was built from.
type Cache = HashMap<Located, (Stamp, Arc<Catalog>)>;

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn stamp(located: &Located, files: &[(MigrationFile, String)]) -> Stamp {
    let config = located.config.as_ref().map(|path| {
        let text = std::fs::read(path).unwrap_or_default();
        (path.as_path(), text)
    });
    let inputs = config.iter().map(|(p, t)| (*p, t.as_slice())).chain(
        files
            .iter()
            .map(|(file, text)| (file.path.as_path(), text.as_bytes())),
    );
    inputs
        .map(|(path, bytes)| {
            let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
            let mut hasher = DefaultHasher::new();
            bytes.hash(&mut hasher);
            (
                path.to_owned(),
                modified,
                bytes.len() as u64,
                hasher.finish(),
            )
        })
        .collect()
}
