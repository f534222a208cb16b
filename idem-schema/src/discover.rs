//! Finding the migrations the way sqlx does: the directory, the file names, the order.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use toml::de::{DeTable, DeValue};

use super::SchemaError;
use super::catalog::{MigrationFile, MigrationKind};

/// sqlx's default, relative to the crate (`sqlx::migrate!()` with no argument).
const DEFAULT_DIR: &str = "migrations";

/// Where the migrations are.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    /// A directory of `<VERSION>_<DESCRIPTION>.sql` files.
    Directory(PathBuf),
    /// One schema file, applied as a whole.
    File(PathBuf),
}

/// A source, and the `sqlx.toml` consulted to find it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Located {
    pub(crate) source: Source,
    pub(crate) config: Option<PathBuf>,
}

/// Finds the migrations of the crate in `manifest_dir`. `explicit` (relative to the crate,
/// or absolute) names a directory or a single `.sql` file and must exist. Otherwise the
/// directory is `migrations/`, or the `[migrate] migrations-dir` of the crate's `sqlx.toml`,
/// as for `sqlx::migrate!()`; `None` when that directory does not exist.
pub(crate) fn locate(
    manifest_dir: &Path,
    explicit: Option<&Path>,
) -> Result<Option<Located>, SchemaError> {
    if let Some(explicit) = explicit {
        let path = manifest_dir.join(explicit);
        let source = if path.is_dir() {
            Source::Directory(path)
        } else if path.is_file() {
            Source::File(path)
        } else {
            return Err(SchemaError::NotFound { path });
        };
        return Ok(Some(Located {
            source,
            config: None,
        }));
    }
    let config_path = manifest_dir.join("sqlx.toml");
    let (dir, config) = if config_path.is_file() {
        let dir = configured_dir(&config_path)?;
        (dir, Some(config_path))
    } else {
        (None, None)
    };
    let dir = manifest_dir.join(dir.as_deref().unwrap_or(DEFAULT_DIR));
    Ok(dir.is_dir().then_some(Located {
        source: Source::Directory(dir),
        config,
    }))
}

/// `[migrate] migrations-dir` of a `sqlx.toml`, as sqlx reads it: a string, relative to the
/// crate root.
fn configured_dir(path: &Path) -> Result<Option<String>, SchemaError> {
    let text = fs::read_to_string(path).map_err(|e| SchemaError::io(path, &e))?;
    let config_error = |message: String| SchemaError::Config {
        path: path.to_owned(),
        message,
    };
    let document = DeTable::parse(&text).map_err(|e| config_error(e.to_string()))?;
    let Some(migrate) = entry(document.get_ref(), "migrate") else {
        return Ok(None);
    };
    let DeValue::Table(migrate) = migrate else {
        return Err(config_error("`migrate` must be a table".to_owned()));
    };
    match entry(migrate, "migrations-dir") {
        None => Ok(None),
        Some(DeValue::String(dir)) => Ok(Some(dir.to_string())),
        Some(_) => Err(config_error(
            "`migrate.migrations-dir` must be a string".to_owned(),
        )),
    }
}

fn entry<'a, 'i>(table: &'a DeTable<'i>, key: &str) -> Option<&'a DeValue<'i>> {
    table
        .iter()
        .find(|(k, _)| k.get_ref() == key)
        .map(|(_, v)| v.get_ref())
}

/// The files to replay, in order, each with its text.
pub(crate) fn read(source: &Source) -> Result<Vec<(MigrationFile, String)>, SchemaError> {
    let files = match source {
        Source::File(path) => vec![MigrationFile {
            path: path.clone(),
            version: None,
            description: path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            kind: MigrationKind::Schema,
        }],
        Source::Directory(dir) => list(dir)?,
    };
    files
        .into_iter()
        .map(|file| {
            let text =
                fs::read_to_string(&file.path).map_err(|e| SchemaError::io(&file.path, &e))?;
            Ok((file, text))
        })
        .collect()
}

/// sqlx's rules (`sqlx_core::migrate::source::resolve_blocking_with_config`): a regular file
/// whose name splits at the first `_` into an `i64` version and a description ending in
/// `.sql`; other names are skipped, a non-numeric version is an error; `.down.sql` files are
/// reverts and are not applied; the order is by version.
fn list(dir: &Path) -> Result<Vec<MigrationFile>, SchemaError> {
    let entries = fs::read_dir(dir).map_err(|e| SchemaError::io(dir, &e))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| SchemaError::io(dir, &e))?;
        let path = entry.path();
        match fs::metadata(&path) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => continue,
            Err(e) => return Err(SchemaError::io(&path, &e)),
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((version, rest)) = name.split_once('_') else {
            continue;
        };
        if !rest.ends_with(".sql") {
            continue;
        }
        let Ok(version) = version.parse::<i64>() else {
            return Err(SchemaError::BadFileName { path });
        };
        let (kind, suffix) = if rest.ends_with(".up.sql") {
            (MigrationKind::ReversibleUp, ".up.sql")
        } else if rest.ends_with(".down.sql") {
            continue;
        } else {
            (MigrationKind::Simple, ".sql")
        };
        files.push(MigrationFile {
            description: rest.trim_end_matches(suffix).replace('_', " "),
            path,
            version: Some(version),
            kind,
        });
    }
    // The name breaks ties only so that the order never depends on the directory's.
    files.sort_by(|a, b| (a.version, &a.path).cmp(&(b.version, &b.path)));
    Ok(files)
}

impl SchemaError {
    fn io(path: &Path, error: &io::Error) -> Self {
        SchemaError::Io {
            path: path.to_owned(),
            message: error.to_string(),
        }
    }
}
