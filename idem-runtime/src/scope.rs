//! Scopes: the server's half of a record's identity, rendered from a template such as
//! `refund:<order_no>`.
//!
//! `#[idempotent]` parses the template at compile time and emits calls to [`ScopeBuilder`]; the
//! builder can also be used directly.
//!
//! # Encoding
//!
//! Every value is percent-encoded: bytes other than ASCII letters, digits, `-`, `_`, `.` and `~`
//! become `%XX`. The template language requires a delimiter outside that set between two
//! placeholders (for example `:`), so a scope can be split back into its values in exactly one
//! way: distinct values always give distinct scopes. Without this, `order:<a>:<b>` would render
//! `a = "1:2", b = "3"` and `a = "1", b = "2:3"` to the same string.

use std::fmt::{self, Write as _};

use crate::error::Error;

/// The longest scope accepted, in bytes after encoding. Stores index `(scope, key)`; a value from
/// a request (a path segment, say) must not be able to build an entry the index refuses.
pub const MAX_SCOPE_LEN: usize = 1024;

/// Renders a scope from literal parts and encoded values.
///
/// ```
/// use idem::scope::ScopeBuilder;
///
/// let mut s = ScopeBuilder::new();
/// s.literal("refund:");
/// s.value(&"ORD:7 x");
/// assert_eq!(s.finish().unwrap(), "refund:ORD%3A7%20x");
/// ```
#[derive(Debug, Default)]
pub struct ScopeBuilder {
    buf: String,
}

impl ScopeBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        ScopeBuilder::default()
    }

    /// An empty builder with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Self {
        ScopeBuilder {
            buf: String::with_capacity(capacity),
        }
    }

    /// Appends template text verbatim.
    pub fn literal(&mut self, text: &str) -> &mut Self {
        self.buf.push_str(text);
        self
    }

    /// Appends a value, percent-encoded, as rendered by its `Display` implementation.
    pub fn value<T: fmt::Display + ?Sized>(&mut self, value: &T) -> &mut Self {
        // Writing into a String cannot fail; a Display impl that errors leaves what it wrote.
        let _ = write!(Encoder(&mut self.buf), "{value}");
        self
    }

    /// The rendered scope, or [`Error::InvalidScope`] when it is longer than [`MAX_SCOPE_LEN`].
    pub fn finish(self) -> Result<String, Error> {
        if self.buf.len() > MAX_SCOPE_LEN {
            return Err(Error::InvalidScope {
                len: self.buf.len(),
                max: MAX_SCOPE_LEN,
            });
        }
        Ok(self.buf)
    }
}

/// Whether `b` may appear unencoded in a value.
pub fn is_value_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~')
}

struct Encoder<'a>(&'a mut String);

impl fmt::Write for Encoder<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let mut rest = s.as_bytes();
        while !rest.is_empty() {
            let plain = rest
                .iter()
                .position(|b| !is_value_byte(*b))
                .unwrap_or(rest.len());
            // The prefix is ASCII, hence valid UTF-8 on its own.
            self.0
                .push_str(std::str::from_utf8(&rest[..plain]).unwrap_or_default());
            if let Some(&b) = rest.get(plain) {
                self.0.push('%');
                self.0.push(HEX[usize::from(b >> 4)] as char);
                self.0.push(HEX[usize::from(b & 0xF)] as char);
                rest = &rest[plain + 1..];
            } else {
                rest = &[];
            }
        }
        Ok(())
    }
}

/// Encodes one value the way [`ScopeBuilder::value`] does.
pub fn encode_value<T: fmt::Display + ?Sized>(value: &T) -> String {
    let mut out = String::new();
    let _ = write!(Encoder(&mut out), "{value}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_delimiters_and_keeps_plain_values_readable() {
        assert_eq!(encode_value("ORD-0001_a.b~"), "ORD-0001_a.b~");
        assert_eq!(encode_value("a:b"), "a%3Ab");
        assert_eq!(encode_value("100%"), "100%25");
        assert_eq!(encode_value("é"), "%C3%A9");
        assert_eq!(encode_value(&42u64), "42");
    }

    #[test]
    fn colon_values_do_not_collide() {
        let render = |a: &str, b: &str| {
            let mut s = ScopeBuilder::new();
            s.literal("order:").value(a).literal(":").value(b);
            s.finish().unwrap()
        };
        assert_ne!(render("1:2", "3"), render("1", "2:3"));
    }

    #[test]
    fn too_long_is_rejected() {
        let mut s = ScopeBuilder::new();
        s.literal("refund:").value(&"x".repeat(MAX_SCOPE_LEN));
        assert!(matches!(s.finish(), Err(Error::InvalidScope { .. })));
    }
}
