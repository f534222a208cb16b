//! Idempotency keys: the client's half of a record's identity, validated before any store access.

use std::fmt;

use crate::error::{Error, KeyError};

/// The longest key the default policy accepts, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// Which keys are accepted.
///
/// The default accepts 1–255 bytes of visible ASCII (`0x21..=0x7E`), which covers UUIDs, ULIDs
/// and the opaque tokens clients generate. [`KeyPolicy::Uuid`] accepts only the canonical
/// hyphenated UUID form, in either case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyPolicy {
    /// 1 to `max_len` bytes of visible ASCII.
    VisibleAscii {
        /// The longest key accepted, in bytes (at most [`MAX_KEY_LEN`] is sensible: stores index
        /// the key).
        max_len: usize,
    },
    /// A UUID in its 36-character hyphenated form, such as
    /// `0b2c1c6e-1f7b-4f0f-9d3a-8f2f6f0a1111`.
    Uuid,
}

impl Default for KeyPolicy {
    fn default() -> Self {
        KeyPolicy::DEFAULT
    }
}

impl KeyPolicy {
    /// 1–255 bytes of visible ASCII.
    pub const DEFAULT: KeyPolicy = KeyPolicy::VisibleAscii {
        max_len: MAX_KEY_LEN,
    };

    /// Checks `raw` against this policy.
    pub fn check(&self, raw: &str) -> Result<(), KeyError> {
        self.check_bytes(raw.as_bytes())
    }

    /// Checks raw bytes against this policy, in the same order as [`KeyPolicy::check`]: an HTTP
    /// header's bytes get the same answer whether they are UTF-8 or not.
    pub(crate) fn check_bytes(&self, bytes: &[u8]) -> Result<(), KeyError> {
        if bytes.is_empty() {
            return Err(KeyError::Empty);
        }
        match *self {
            KeyPolicy::VisibleAscii { max_len } => {
                if bytes.len() > max_len {
                    return Err(KeyError::TooLong {
                        len: bytes.len(),
                        max: max_len,
                    });
                }
                match bytes.iter().position(|b| !b.is_ascii_graphic()) {
                    Some(index) => Err(KeyError::InvalidByte { index }),
                    None => Ok(()),
                }
            }
            KeyPolicy::Uuid => {
                let is_uuid = bytes.len() == 36
                    && bytes.iter().enumerate().all(|(i, b)| match i {
                        8 | 13 | 18 | 23 => *b == b'-',
                        _ => b.is_ascii_hexdigit(),
                    });
                if is_uuid {
                    Ok(())
                } else {
                    Err(KeyError::NotUuid)
                }
            }
        }
    }
}

/// A validated idempotency key.
///
/// Build one with [`Key::parse`] (default policy) or [`Key::parse_with`]; a `Key` that exists has
/// passed its policy, so stores never see a malformed one.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Box<str>);

impl Key {
    /// Validates `raw` with [`KeyPolicy::DEFAULT`].
    pub fn parse(raw: &str) -> Result<Key, Error> {
        Key::parse_with(raw, KeyPolicy::DEFAULT)
    }

    /// Validates `raw` with `policy`.
    pub fn parse_with(raw: &str, policy: KeyPolicy) -> Result<Key, Error> {
        policy.check(raw)?;
        Ok(Key(raw.into()))
    }

    /// Validates the bytes of a header value with `policy`. Bytes that are not text are refused
    /// with the error [`KeyPolicy::check`] would give (a key too long is `TooLong`, whatever its
    /// bytes), so the HTTP extractor and the tower guard answer as `parse_with` does.
    // Used by the `axum` and `tower` integrations (and this module's tests).
    #[cfg_attr(not(any(feature = "axum", feature = "tower")), allow(dead_code))]
    pub(crate) fn parse_bytes(raw: &[u8], policy: KeyPolicy) -> Result<Key, Error> {
        Ok(Key::read_bytes(raw, policy)?)
    }

    /// [`Key::parse_bytes`], saying only why the key was refused: the client checks the key it
    /// is given by the rules the server applies.
    #[cfg_attr(
        not(any(feature = "axum", feature = "tower", feature = "client")),
        allow(dead_code)
    )]
    pub(crate) fn read_bytes(raw: &[u8], policy: KeyPolicy) -> Result<Key, KeyError> {
        policy.check_bytes(raw)?;
        // Every policy accepts only ASCII, so the check leaves text.
        match std::str::from_utf8(raw) {
            Ok(text) => Ok(Key(text.into())),
            Err(e) => Err(KeyError::InvalidByte {
                index: e.valid_up_to(),
            }),
        }
    }

    /// The key as sent by the client.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Key {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Key::parse(s)
    }
}

/// Anything a key can be taken from: the `key = …` expression of `#[idempotent]` must implement
/// it.
///
/// Strings are validated with [`KeyPolicy::DEFAULT`]; a [`Key`] (or the HTTP extractor, which
/// applies its own policy) is already valid. A message id that is a number is rendered in
/// decimal.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an idempotency key",
    label = "not a key",
    note = "use a `&str`, a `String`, an integer message id, an `idem::Key`, or the `IdempotencyKey` extractor"
)]
pub trait ToKey {
    /// Returns the validated key.
    fn to_key(&self) -> Result<Key, Error>;
}

impl ToKey for Key {
    fn to_key(&self) -> Result<Key, Error> {
        Ok(self.clone())
    }
}

impl ToKey for str {
    fn to_key(&self) -> Result<Key, Error> {
        Key::parse(self)
    }
}

impl ToKey for String {
    fn to_key(&self) -> Result<Key, Error> {
        Key::parse(self)
    }
}

impl<T: ToKey + ?Sized> ToKey for &T {
    fn to_key(&self) -> Result<Key, Error> {
        (**self).to_key()
    }
}

impl<T: ToKey> ToKey for Option<T> {
    fn to_key(&self) -> Result<Key, Error> {
        match self {
            Some(k) => k.to_key(),
            None => Err(Error::InvalidKey(KeyError::Missing)),
        }
    }
}

macro_rules! int_keys {
    ($($t:ty)*) => {$(
        impl ToKey for $t {
            fn to_key(&self) -> Result<Key, Error> {
                Ok(Key(self.to_string().into()))
            }
        }
    )*};
}
int_keys!(u32 u64 u128 i32 i64 i128 usize);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy() {
        assert!(Key::parse("0b2c1c6e-1f7b-4f0f-9d3a-8f2f6f0a1111").is_ok());
        assert!(Key::parse("a").is_ok());
        assert!(Key::parse(&"k".repeat(255)).is_ok());
        let err = |s: &str| match Key::parse(s) {
            Err(Error::InvalidKey(e)) => e,
            other => panic!("{s:?} gave {other:?}"),
        };
        assert_eq!(err(""), KeyError::Empty);
        assert_eq!(
            err(&"k".repeat(256)),
            KeyError::TooLong { len: 256, max: 255 }
        );
        assert_eq!(err("ab\ncd"), KeyError::InvalidByte { index: 2 });
        assert_eq!(err("a b"), KeyError::InvalidByte { index: 1 });
        assert_eq!(err("\u{7f}"), KeyError::InvalidByte { index: 0 });
        assert_eq!(err("clé"), KeyError::InvalidByte { index: 2 });
    }

    #[test]
    fn uuid_policy() {
        let p = KeyPolicy::Uuid;
        assert!(p.check("0b2c1c6e-1f7b-4f0f-9d3a-8f2f6f0a1111").is_ok());
        assert!(p.check("0B2C1C6E-1F7B-4F0F-9D3A-8F2F6F0A1111").is_ok());
        assert_eq!(
            p.check("0b2c1c6e1f7b4f0f9d3a8f2f6f0a1111"),
            Err(KeyError::NotUuid)
        );
        assert_eq!(
            p.check("0b2c1c6e-1f7b-4f0f-9d3a-8f2f6f0a111g"),
            Err(KeyError::NotUuid)
        );
        assert_eq!(p.check(""), Err(KeyError::Empty));
    }

    #[test]
    fn bytes_get_the_answer_text_gets() {
        // Found by fuzzing (fuzz target `key`): a header too long *and* not text was refused as
        // `InvalidByte`, where the same policy says `TooLong` for a long string.
        let mut long = vec![b'k'; 300];
        long[3] = 0xFF;
        assert!(matches!(
            Key::parse_bytes(&long, KeyPolicy::DEFAULT),
            Err(Error::InvalidKey(KeyError::TooLong { len: 300, max: 255 }))
        ));
        assert!(matches!(
            Key::parse_bytes(b"\xffab", KeyPolicy::Uuid),
            Err(Error::InvalidKey(KeyError::NotUuid))
        ));
        assert!(matches!(
            Key::parse_bytes(b"ab\x80", KeyPolicy::DEFAULT),
            Err(Error::InvalidKey(KeyError::InvalidByte { index: 2 }))
        ));
        assert_eq!(
            Key::parse_bytes(b"ab", KeyPolicy::DEFAULT)
                .unwrap()
                .as_str(),
            "ab"
        );
    }

    #[test]
    fn to_key() {
        assert_eq!(42u64.to_key().unwrap().as_str(), "42");
        assert_eq!("x".to_key().unwrap().as_str(), "x");
        assert!(matches!(
            None::<String>.to_key(),
            Err(Error::InvalidKey(KeyError::Missing))
        ));
    }
}
