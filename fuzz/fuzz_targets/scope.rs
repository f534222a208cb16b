//! Scope rendering and encoding: `ScopeBuilder` (what `#[idempotent]` expands to) and
//! `idem::scope!`, against a reference percent-encoder and decoder.
//!
//! Properties: a value's encoding holds only unreserved bytes and `%XX`, and decodes back to the
//! value's `Display` text; how `Display` splits its writes does not matter; a rendered scope is
//! the literals and the encoded values in order, refused exactly when longer than
//! `MAX_SCOPE_LEN`; and a template with delimiters between its placeholders renders distinct
//! values to distinct scopes that split back into those values.

#![no_main]

use std::fmt;

use arbitrary::Arbitrary;
use idem::Error;
use idem::scope::{MAX_SCOPE_LEN, ScopeBuilder, encode_value, is_value_byte};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Value {
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Char(char),
    Bool(bool),
    /// A string written by `Display` in several pieces, cut at these char counts.
    Pieces(String, Vec<u8>),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Str(s) => f.write_str(s),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Char(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::Pieces(s, cuts) => {
                let mut rest = s.as_str();
                for cut in cuts {
                    let at = rest
                        .char_indices()
                        .nth(usize::from(*cut % 8))
                        .map_or(rest.len(), |(i, _)| i);
                    let (head, tail) = rest.split_at(at);
                    f.write_str(head)?;
                    rest = tail;
                }
                f.write_str(rest)
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Part {
    Literal(String),
    Value(Value),
}

struct Order {
    id: i64,
}

#[derive(Arbitrary, Debug)]
struct Input {
    parts: Vec<Part>,
    a: String,
    b: String,
    id: i64,
    a2: String,
    b2: String,
    id2: i64,
}

/// The documented encoding, written independently.
fn reference_encode(text: &str) -> String {
    let mut out = String::new();
    for &b in text.as_bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-decoding; `None` for anything an encoder could not have written.
fn decode(encoded: &str) -> Option<String> {
    let bytes = encoded.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = encoded.get(i + 1..i + 3)?;
                if hex.bytes().any(|h| h.is_ascii_lowercase()) {
                    return None;
                }
                let b = u8::from_str_radix(hex, 16).ok()?;
                // An unreserved byte is never escaped: one value, one encoding.
                if is_value_byte(b) {
                    return None;
                }
                out.push(b);
                i += 3;
            }
            b if is_value_byte(b) => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// The template's rendering, or `None` when it is too long (checked against the reference).
fn scope_of(a: &str, b: &str, id: i64) -> Option<String> {
    let order = Order { id };
    let want = format!(
        "order:{}:{}:{}",
        reference_encode(a),
        reference_encode(b),
        reference_encode(&id.to_string())
    );
    match idem::scope!("order:<a>:<b>:<order.id>") {
        Ok(scope) => {
            assert_eq!(scope, want);
            Some(scope)
        }
        Err(Error::InvalidScope { len, .. }) => {
            assert_eq!(len, want.len());
            assert!(len > MAX_SCOPE_LEN);
            None
        }
        Err(other) => panic!("scope! gave {other:?}"),
    }
}

fuzz_target!(|input: Input| {
    // Values: the encoding alphabet, the reference, the round trip.
    let mut expected = String::new();
    for part in &input.parts {
        match part {
            Part::Literal(text) => expected.push_str(text),
            Part::Value(v) => {
                let text = v.to_string();
                let encoded = encode_value(v);
                assert_eq!(encoded, reference_encode(&text), "{v:?}");
                assert_eq!(
                    encode_value(&text),
                    encoded,
                    "Display's pieces changed the encoding"
                );
                assert!(encoded.bytes().all(|b| is_value_byte(b) || b == b'%'));
                assert_eq!(decode(&encoded).as_deref(), Some(text.as_str()), "{v:?}");
                expected.push_str(&encoded);
            }
        }
    }

    // The builder renders literals verbatim and values encoded, and refuses a long scope.
    let mut builder = ScopeBuilder::new();
    for part in &input.parts {
        match part {
            Part::Literal(text) => builder.literal(text),
            Part::Value(v) => builder.value(v),
        };
    }
    match builder.finish() {
        Ok(scope) => {
            assert!(scope.len() <= MAX_SCOPE_LEN);
            assert_eq!(scope, expected);
        }
        Err(Error::InvalidScope { len, max }) => {
            assert_eq!((len, max), (expected.len(), MAX_SCOPE_LEN));
            assert!(len > MAX_SCOPE_LEN);
            assert_eq!(Error::InvalidScope { len, max }.status(), 400);
        }
        Err(other) => panic!("finish gave {other:?}"),
    }

    // The macro: distinct values, distinct scopes; each scope splits back into its values.
    let (Some(one), Some(two)) = (
        scope_of(&input.a, &input.b, input.id),
        scope_of(&input.a2, &input.b2, input.id2),
    ) else {
        return;
    };
    let same_values = (&input.a, &input.b, input.id) == (&input.a2, &input.b2, input.id2);
    assert_eq!(one == two, same_values, "{one:?} vs {two:?}");
    let fields: Vec<&str> = one.split(':').collect();
    assert_eq!(fields.len(), 4, "{one:?}");
    assert_eq!(fields[0], "order");
    assert_eq!(decode(fields[1]).as_deref(), Some(input.a.as_str()));
    assert_eq!(decode(fields[2]).as_deref(), Some(input.b.as_str()));
    assert_eq!(decode(fields[3]), Some(input.id.to_string()));
});
