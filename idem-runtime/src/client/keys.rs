//! Where the keys of unfinished operations live: in memory for the life of the client, or in
//! files, so that a client restarted in the middle of an operation sends it again with the key
//! it first sent it with.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::key::Key;

/// Where the keys of operations without a definite answer yet are kept, by the name the caller
/// gives each logical operation ([`Operation`](super::Operation)).
///
/// The middleware asks [`PendingKeys::keep`] before it first sends an operation and
/// [`PendingKeys::forget`] once the operation has a definite answer (an answer or a refusal);
/// an operation given up on (still running, or no answer within the bound) keeps its key, so
/// that sending it again, in this process or after a restart, is the same request to the
/// server. Its methods are called on Tokio's blocking pool, so they may read and write files.
///
/// [`MemoryKeys`] (the default) keeps keys for the life of the process; [`FileKeys`] keeps
/// them on disk.
pub trait PendingKeys: fmt::Debug + Send + Sync + 'static {
    /// The key kept for `operation`; when there is none, `fresh`, kept from now on. Two calls
    /// for one operation, at once or in two processes sharing the store, get one key.
    fn keep(&self, operation: &str, fresh: &Key) -> io::Result<Key>;

    /// Forgets `operation`'s key when it is still `key`: the operation has a definite answer.
    fn forget(&self, operation: &str, key: &Key) -> io::Result<()>;

    /// Every operation with a key kept, and its key: what a restarted client has left to finish.
    fn pending(&self) -> io::Result<Vec<(String, Key)>>;
}

/// Keys kept in memory, for the life of the process: two sends of one operation (a user who
/// clicks twice) share a key, and a restart forgets them.
#[derive(Debug, Default)]
pub struct MemoryKeys {
    keys: Mutex<HashMap<String, Key>>,
}

impl MemoryKeys {
    /// An empty store.
    pub fn new() -> Self {
        MemoryKeys::default()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Key>> {
        // A map of strings is whole whatever panicked while it was held.
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl PendingKeys for MemoryKeys {
    fn keep(&self, operation: &str, fresh: &Key) -> io::Result<Key> {
        Ok(self
            .map()
            .entry(operation.to_owned())
            .or_insert_with(|| fresh.clone())
            .clone())
    }

    fn forget(&self, operation: &str, key: &Key) -> io::Result<()> {
        let mut map = self.map();
        if map.get(operation) == Some(key) {
            map.remove(operation);
        }
        Ok(())
    }

    fn pending(&self) -> io::Result<Vec<(String, Key)>> {
        let mut all: Vec<_> = self
            .map()
            .iter()
            .map(|(op, key)| (op.clone(), key.clone()))
            .collect();
        all.sort();
        Ok(all)
    }
}

/// Keys kept in a directory, one small JSON file per operation (named by the SHA-256 of the
/// operation's name, holding the name and the key), so that they outlive the process.
///
/// A key is written to a file of its own, synced, then linked into place, which fails when
/// another process linked one first: two processes sharing the directory get one key for one
/// operation, and a crash leaves either no key or a whole one. A file that holds no valid key is
/// an error naming it, never a new key in its place.
///
/// ```no_run
/// use idem::client::{FileKeys, Idempotency, PendingKeys};
///
/// let keys = FileKeys::open("/var/lib/checkout/pending-keys")?;
/// for (operation, key) in keys.pending()? {
///     println!("{operation} was left unfinished with key {key}: send it again");
/// }
/// let middleware = Idempotency::new().pending_keys(keys);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct FileKeys {
    dir: PathBuf,
}

/// The content of one key's file.
#[derive(serde::Serialize, serde::Deserialize)]
struct Entry {
    operation: String,
    key: String,
}

impl FileKeys {
    /// Keys in `dir`, created (with its parents) when missing.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<FileKeys> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(FileKeys { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, operation: &str) -> PathBuf {
        let digest = Sha256::digest(operation.as_bytes());
        let name: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{name}.key"))
    }

    /// The entry in `path`; `None` when there is no file.
    fn read(path: &Path) -> io::Result<Option<(String, Key)>> {
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let corrupt = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} holds no pending key: {why}", path.display()),
            )
        };
        let entry: Entry = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        let key = Key::parse(&entry.key).map_err(|e| corrupt(e.to_string()))?;
        Ok(Some((entry.operation, key)))
    }

    /// The key in `path`, which must be `operation`'s.
    fn read_own(path: &Path, operation: &str) -> io::Result<Option<Key>> {
        match FileKeys::read(path)? {
            Some((op, key)) if op == operation => Ok(Some(key)),
            Some((op, _)) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} holds the key of {op:?}, not of {operation:?}",
                    path.display()
                ),
            )),
            None => Ok(None),
        }
    }

    /// Makes the directory's new or removed entries durable. Not every platform lets a
    /// directory be opened for that; the files' own sync is what a crash needs most.
    fn sync_dir(&self) {
        if let Ok(dir) = fs::File::open(&self.dir) {
            let _ = dir.sync_all();
        }
    }
}

impl PendingKeys for FileKeys {
    fn keep(&self, operation: &str, fresh: &Key) -> io::Result<Key> {
        let path = self.path(operation);
        if let Some(key) = FileKeys::read_own(&path, operation)? {
            return Ok(key);
        }
        static TEMP: AtomicU64 = AtomicU64::new(0);
        let temp = self.dir.join(format!(
            ".{}.{}.tmp",
            std::process::id(),
            TEMP.fetch_add(1, Ordering::Relaxed)
        ));
        let entry = Entry {
            operation: operation.to_owned(),
            key: fresh.as_str().to_owned(),
        };
        let written = serde_json::to_vec(&entry)
            .map_err(io::Error::other)
            .and_then(|bytes| {
                let mut file = fs::File::create_new(&temp)?;
                io::Write::write_all(&mut file, &bytes)?;
                file.sync_all()
            });
        // A hard link is created whole or not at all, and never over an existing file: the
        // first process to link its key wins, the others read it.
        let linked = written.and_then(|()| fs::hard_link(&temp, &path));
        let _ = fs::remove_file(&temp);
        match linked {
            Ok(()) => {
                self.sync_dir();
                Ok(fresh.clone())
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                FileKeys::read_own(&path, operation)?.ok_or(e)
            }
            Err(e) => Err(e),
        }
    }

    fn forget(&self, operation: &str, key: &Key) -> io::Result<()> {
        let path = self.path(operation);
        if FileKeys::read_own(&path, operation)?.as_ref() != Some(key) {
            return Ok(());
        }
        match fs::remove_file(&path) {
            Ok(()) => {
                self.sync_dir();
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn pending(&self) -> io::Result<Vec<(String, Key)>> {
        let mut all = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "key")
                && let Some(found) = FileKeys::read(&path)?
            {
                all.push(found);
            }
        }
        all.sort();
        Ok(all)
    }
}

/// A new key: a random (version 4) UUID, which every [`KeyPolicy`](crate::KeyPolicy) accepts.
pub(crate) fn generate() -> io::Result<Key> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| io::Error::other(e.to_string()))?;
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    );
    Key::parse(&uuid).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::KeyPolicy;

    #[test]
    fn generated_keys_are_uuids_and_differ() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_ne!(a, b);
        assert!(KeyPolicy::Uuid.check(a.as_str()).is_ok(), "{a}");
        assert_eq!(&a.as_str()[14..15], "4", "version 4: {a}");
    }

    #[test]
    fn files_keep_one_key_per_operation_until_forgotten() {
        let dir = std::env::temp_dir().join(format!("idem-keys-{}", generate().unwrap()));
        let keys = FileKeys::open(&dir).unwrap();
        let (first, second) = (generate().unwrap(), generate().unwrap());
        assert_eq!(keys.keep("checkout 7", &first).unwrap(), first);
        assert_eq!(keys.keep("checkout 7", &second).unwrap(), first);
        // Another store on the directory, as a restarted process opens it.
        let again = FileKeys::open(&dir).unwrap();
        assert_eq!(
            again.pending().unwrap(),
            vec![("checkout 7".to_owned(), first.clone())]
        );
        again.forget("checkout 7", &second).unwrap();
        assert_eq!(
            again.pending().unwrap().len(),
            1,
            "another key is not forgotten"
        );
        again.forget("checkout 7", &first).unwrap();
        assert!(keys.pending().unwrap().is_empty());
        assert_eq!(keys.keep("checkout 7", &second).unwrap(), second);
        fs::write(
            keys.path("broken"),
            b"{\"operation\":\"broken\",\"key\":\"a b\"}",
        )
        .unwrap();
        let err = keys.keep("broken", &first).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(
            err.to_string().contains(".key holds no pending key"),
            "{err}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn callers_racing_on_one_directory_agree_on_one_key() {
        let dir = std::env::temp_dir().join(format!("idem-keys-{}", generate().unwrap()));
        let keys = FileKeys::open(&dir).unwrap();
        let kept: Vec<Key> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16)
                .map(|_| {
                    let keys = keys.clone();
                    s.spawn(move || keys.keep("race", &generate().unwrap()).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(kept.iter().all(|k| *k == kept[0]), "{kept:?}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
