//! The fingerprint canonicaliser (`idem::fingerprint`), on arbitrary serde data models.
//!
//! A fuzzed value drives every `Serializer` method. Properties:
//! - `canonical_bytes` is exactly the documented layout (encoding version 2), written here
//!   independently from the module's documentation, after the documented normalisation (integers
//!   widened, floats to `f64` with one NaN, newtypes transparent, map entries sorted);
//! - the encoding is unambiguous: a decoder written from the same documentation reads the bytes
//!   back into the normalised value, using every byte;
//! - `Fingerprint::of` and `Fingerprinter` hash the domain tag and those bytes, in order, and
//!   keep the version byte and 31 bytes of the digest;
//! - map entry order never changes a fingerprint;
//! - a `Serialize` that fails is `Error::Encode`, never a panic.

#![no_main]

use arbitrary::Unstructured;
use idem::fingerprint::canonical_bytes;
use idem::{Error, Fingerprint, Fingerprinter};
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::ser::{
    Error as _, SerializeMap, SerializeSeq, SerializeStruct, SerializeStructVariant,
    SerializeTuple, SerializeTupleStruct, SerializeTupleVariant, Serializer,
};
use sha2::{Digest, Sha256};

/// Field and variant names (serde wants `&'static str`). A field name is written as a string,
/// whose tag is not the end tag, so every length is safe: "abcdefghijklmn" (14, the end tag's
/// byte in version 1) included.
const NAMES: &[&str] = &[
    "",
    "abcdefghijklmn",
    "a",
    "id",
    "qty",
    "sku_id",
    "orderNo",
    "amount_cents",
    "type",
    "é",
    "\u{0}",
    "\u{e}",
    "a much longer field name, renamed",
];

fn name(i: u8) -> &'static str {
    NAMES[usize::from(i) % NAMES.len()]
}

/// A value of serde's data model.
#[derive(Debug, Clone)]
enum V {
    Unit,
    Bool(bool),
    I8(i8),
    I16(i16),
    I32(i32),
    I64(i64),
    I128(i128),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
    U128(u128),
    F32(f32),
    F64(f64),
    Char(char),
    Str(String),
    Bytes(Vec<u8>),
    None,
    Some(Box<V>),
    Seq(Vec<V>),
    Tuple(Vec<V>),
    TupleStruct(Vec<V>),
    Map(Vec<(V, V)>),
    Struct(Vec<(u8, V)>),
    UnitStruct,
    NewtypeStruct(Box<V>),
    UnitVariant(u8),
    NewtypeVariant(u8, Box<V>),
    TupleVariant(u8, Vec<V>),
    StructVariant(u8, Vec<(u8, V)>),
    /// A `Serialize` implementation that fails with this message.
    Fail(String),
}

const MAX_DEPTH: u32 = 12;

fn list(u: &mut Unstructured<'_>, depth: u32) -> arbitrary::Result<Vec<V>> {
    let n = u.int_in_range(0..=6)?;
    (0..n).map(|_| gen_value(u, depth + 1)).collect()
}

fn fields(u: &mut Unstructured<'_>, depth: u32) -> arbitrary::Result<Vec<(u8, V)>> {
    let n = u.int_in_range(0..=5)?;
    (0..n)
        .map(|_| Ok((u.arbitrary()?, gen_value(u, depth + 1)?)))
        .collect()
}

fn gen_value(u: &mut Unstructured<'_>, depth: u32) -> arbitrary::Result<V> {
    let leaf_kinds = 18;
    let kinds = if depth >= MAX_DEPTH { leaf_kinds } else { 31 };
    let boxed = |u: &mut Unstructured<'_>| gen_value(u, depth + 1).map(Box::new);
    Ok(match u.int_in_range(0..=kinds - 1)? {
        0 => V::Unit,
        1 => V::Bool(u.arbitrary()?),
        2 => V::I8(u.arbitrary()?),
        3 => V::I16(u.arbitrary()?),
        4 => V::I32(u.arbitrary()?),
        5 => V::I64(u.arbitrary()?),
        6 => V::I128(u.arbitrary()?),
        7 => V::U8(u.arbitrary()?),
        8 => V::U16(u.arbitrary()?),
        9 => V::U32(u.arbitrary()?),
        10 => V::U64(u.arbitrary()?),
        11 => V::U128(u.arbitrary()?),
        12 => V::F32(u.arbitrary()?),
        13 => V::F64(u.arbitrary()?),
        14 => V::Char(u.arbitrary()?),
        15 => V::Str(u.arbitrary()?),
        16 => V::Bytes(u.arbitrary()?),
        17 => V::None,
        18 => V::Some(boxed(u)?),
        19 => V::Seq(list(u, depth)?),
        20 => V::Tuple(list(u, depth)?),
        21 => V::TupleStruct(list(u, depth)?),
        22 => {
            let n = u.int_in_range(0..=5)?;
            V::Map(
                (0..n)
                    .map(|_| Ok((gen_value(u, depth + 1)?, gen_value(u, depth + 1)?)))
                    .collect::<arbitrary::Result<_>>()?,
            )
        }
        23 => V::Struct(fields(u, depth)?),
        24 => V::UnitStruct,
        25 => V::NewtypeStruct(boxed(u)?),
        26 => V::UnitVariant(u.arbitrary()?),
        27 => V::NewtypeVariant(u.arbitrary()?, boxed(u)?),
        28 => V::TupleVariant(u.arbitrary()?, list(u, depth)?),
        29 => V::StructVariant(u.arbitrary()?, fields(u, depth)?),
        _ => V::Fail(u.arbitrary()?),
    })
}

impl V {
    fn fails(&self) -> bool {
        match self {
            V::Fail(_) => true,
            V::Some(v) | V::NewtypeStruct(v) | V::NewtypeVariant(_, v) => v.fails(),
            V::Seq(vs) | V::Tuple(vs) | V::TupleStruct(vs) | V::TupleVariant(_, vs) => {
                vs.iter().any(V::fails)
            }
            V::Map(es) => es.iter().any(|(k, v)| k.fails() || v.fails()),
            V::Struct(fs) | V::StructVariant(_, fs) => fs.iter().any(|(_, v)| v.fails()),
            _ => false,
        }
    }

    /// The same value with its map entries in reverse order.
    fn reversed(&self) -> V {
        let r = |v: &V| v.reversed();
        let rl = |vs: &Vec<V>| vs.iter().map(r).collect();
        let rf = |fs: &Vec<(u8, V)>| fs.iter().map(|(n, v)| (*n, r(v))).collect();
        match self {
            V::Some(v) => V::Some(Box::new(r(v))),
            V::NewtypeStruct(v) => V::NewtypeStruct(Box::new(r(v))),
            V::NewtypeVariant(n, v) => V::NewtypeVariant(*n, Box::new(r(v))),
            V::Seq(vs) => V::Seq(rl(vs)),
            V::Tuple(vs) => V::Tuple(rl(vs)),
            V::TupleStruct(vs) => V::TupleStruct(rl(vs)),
            V::TupleVariant(n, vs) => V::TupleVariant(*n, rl(vs)),
            V::Map(es) => V::Map(es.iter().rev().map(|(k, v)| (r(k), r(v))).collect()),
            V::Struct(fs) => V::Struct(rf(fs)),
            V::StructVariant(n, fs) => V::StructVariant(*n, rf(fs)),
            other => other.clone(),
        }
    }
}

impl Serialize for V {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            V::Unit => s.serialize_unit(),
            V::Bool(v) => s.serialize_bool(*v),
            V::I8(v) => s.serialize_i8(*v),
            V::I16(v) => s.serialize_i16(*v),
            V::I32(v) => s.serialize_i32(*v),
            V::I64(v) => s.serialize_i64(*v),
            V::I128(v) => s.serialize_i128(*v),
            V::U8(v) => s.serialize_u8(*v),
            V::U16(v) => s.serialize_u16(*v),
            V::U32(v) => s.serialize_u32(*v),
            V::U64(v) => s.serialize_u64(*v),
            V::U128(v) => s.serialize_u128(*v),
            V::F32(v) => s.serialize_f32(*v),
            V::F64(v) => s.serialize_f64(*v),
            V::Char(v) => s.serialize_char(*v),
            V::Str(v) => s.serialize_str(v),
            V::Bytes(v) => s.serialize_bytes(v),
            V::None => s.serialize_none(),
            V::Some(v) => s.serialize_some(v),
            V::Seq(vs) => {
                let mut seq = s.serialize_seq(Some(vs.len()))?;
                for v in vs {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            V::Tuple(vs) => {
                let mut t = s.serialize_tuple(vs.len())?;
                for v in vs {
                    t.serialize_element(v)?;
                }
                t.end()
            }
            V::TupleStruct(vs) => {
                let mut t = s.serialize_tuple_struct("T", vs.len())?;
                for v in vs {
                    t.serialize_field(v)?;
                }
                t.end()
            }
            V::Map(es) => {
                let mut m = s.serialize_map(None)?;
                for (k, v) in es {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
            V::Struct(fs) => {
                let mut st = s.serialize_struct("S", fs.len())?;
                for (n, v) in fs {
                    st.serialize_field(name(*n), v)?;
                }
                st.end()
            }
            V::UnitStruct => s.serialize_unit_struct("U"),
            V::NewtypeStruct(v) => s.serialize_newtype_struct("N", v),
            V::UnitVariant(n) => s.serialize_unit_variant("E", 0, name(*n)),
            V::NewtypeVariant(n, v) => s.serialize_newtype_variant("E", 1, name(*n), v),
            V::TupleVariant(n, vs) => {
                let mut t = s.serialize_tuple_variant("E", 2, name(*n), vs.len())?;
                for v in vs {
                    t.serialize_field(v)?;
                }
                t.end()
            }
            V::StructVariant(n, fs) => {
                let mut st = s.serialize_struct_variant("E", 3, name(*n), fs.len())?;
                for (f, v) in fs {
                    st.serialize_field(name(*f), v)?;
                }
                st.end()
            }
            V::Fail(msg) => Err(S::Error::custom(msg)),
        }
    }
}

/// The normalised value the encoding stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum C {
    Unit,
    Bool(bool),
    I64(i64),
    U64(u64),
    I128(i128),
    U128(u128),
    F64(u64),
    Char(u32),
    Str(Vec<u8>),
    Bytes(Vec<u8>),
    None,
    Some(Box<C>),
    Seq(Vec<C>),
    Map(Vec<(C, C)>),
    Struct(Vec<(Vec<u8>, C)>),
    Variant(Vec<u8>, Box<C>),
}

// The tags of version 1, from the module documentation's order.
const UNIT: u8 = 0x00;
const FALSE: u8 = 0x01;
const TRUE: u8 = 0x02;
const I64: u8 = 0x03;
const U64: u8 = 0x04;
const I128: u8 = 0x05;
const U128: u8 = 0x06;
const F64: u8 = 0x07;
const CHAR: u8 = 0x08;
const STR: u8 = 0x09;
const BYTES: u8 = 0x0A;
const NONE: u8 = 0x0B;
const SOME: u8 = 0x0C;
const SEQ: u8 = 0x0D;
const END: u8 = 0x0E;
const MAP: u8 = 0x0F;
const STRUCT: u8 = 0x10;
const VARIANT: u8 = 0x11;

fn f64_bits(v: f64) -> u64 {
    if v.is_nan() {
        f64::NAN.to_bits()
    } else {
        v.to_bits()
    }
}

fn normalize(v: &V) -> C {
    let list = |vs: &Vec<V>| C::Seq(vs.iter().map(normalize).collect());
    let fields = |fs: &Vec<(u8, V)>| {
        C::Struct(
            fs.iter()
                .map(|(n, v)| (name(*n).as_bytes().to_vec(), normalize(v)))
                .collect(),
        )
    };
    let variant = |n: &u8, c: C| C::Variant(name(*n).as_bytes().to_vec(), Box::new(c));
    match v {
        V::Unit | V::UnitStruct => C::Unit,
        V::Bool(b) => C::Bool(*b),
        V::I8(x) => C::I64(i64::from(*x)),
        V::I16(x) => C::I64(i64::from(*x)),
        V::I32(x) => C::I64(i64::from(*x)),
        V::I64(x) => C::I64(*x),
        V::I128(x) => C::I128(*x),
        V::U8(x) => C::U64(u64::from(*x)),
        V::U16(x) => C::U64(u64::from(*x)),
        V::U32(x) => C::U64(u64::from(*x)),
        V::U64(x) => C::U64(*x),
        V::U128(x) => C::U128(*x),
        V::F32(x) => C::F64(f64_bits(f64::from(*x))),
        V::F64(x) => C::F64(f64_bits(*x)),
        V::Char(c) => C::Char(u32::from(*c)),
        V::Str(s) => C::Str(s.as_bytes().to_vec()),
        V::Bytes(b) => C::Bytes(b.clone()),
        V::None => C::None,
        V::Some(v) => C::Some(Box::new(normalize(v))),
        V::Seq(vs) | V::Tuple(vs) | V::TupleStruct(vs) => list(vs),
        V::Map(es) => {
            let mut entries: Vec<(C, C)> = es
                .iter()
                .map(|(k, v)| (normalize(k), normalize(v)))
                .collect();
            entries.sort_by_cached_key(|(k, v)| (encode(k), encode(v)));
            C::Map(entries)
        }
        V::Struct(fs) => fields(fs),
        V::NewtypeStruct(v) => normalize(v),
        V::UnitVariant(n) => variant(n, C::Unit),
        V::NewtypeVariant(n, v) => variant(n, normalize(v)),
        V::TupleVariant(n, vs) => variant(n, list(vs)),
        V::StructVariant(n, fs) => variant(n, fields(fs)),
        V::Fail(_) => unreachable!("failing values have no encoding"),
    }
}

/// LEB128: 7 bits a byte, low first, the high bit on every byte but the last.
fn put_varint(out: &mut Vec<u8>, mut v: u128) {
    loop {
        let low = (v & 0x7F) as u8;
        v >>= 7;
        if v == 0 {
            out.push(low);
            return;
        }
        out.push(low | 0x80);
    }
}

fn zigzag(v: i128) -> u128 {
    if v < 0 {
        (((-(v + 1)) as u128) << 1) | 1
    } else {
        (v as u128) << 1
    }
}

fn unzigzag(z: u128) -> i128 {
    if z & 1 == 1 {
        -((z >> 1) as i128) - 1
    } else {
        (z >> 1) as i128
    }
}

fn put_len(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, bytes.len() as u128);
    out.extend_from_slice(bytes);
}

/// The documented layout.
fn encode(c: &C) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(c, &mut out);
    out
}

fn encode_into(c: &C, out: &mut Vec<u8>) {
    match c {
        C::Unit => out.push(UNIT),
        C::Bool(false) => out.push(FALSE),
        C::Bool(true) => out.push(TRUE),
        C::I64(x) => {
            out.push(I64);
            put_varint(out, zigzag(i128::from(*x)));
        }
        C::U64(x) => {
            out.push(U64);
            put_varint(out, u128::from(*x));
        }
        C::I128(x) => {
            out.push(I128);
            put_varint(out, zigzag(*x));
        }
        C::U128(x) => {
            out.push(U128);
            put_varint(out, *x);
        }
        C::F64(bits) => {
            out.push(F64);
            out.extend_from_slice(&bits.to_le_bytes());
        }
        C::Char(c) => {
            out.push(CHAR);
            put_varint(out, u128::from(*c));
        }
        C::Str(s) => {
            out.push(STR);
            put_len(out, s);
        }
        C::Bytes(b) => {
            out.push(BYTES);
            put_len(out, b);
        }
        C::None => out.push(NONE),
        C::Some(v) => {
            out.push(SOME);
            encode_into(v, out);
        }
        C::Seq(vs) => {
            out.push(SEQ);
            vs.iter().for_each(|v| encode_into(v, out));
            out.push(END);
        }
        C::Map(es) => {
            out.push(MAP);
            for (k, v) in es {
                encode_into(k, out);
                encode_into(v, out);
            }
            out.push(END);
        }
        C::Struct(fs) => {
            out.push(STRUCT);
            for (n, v) in fs {
                out.push(STR);
                put_len(out, n);
                encode_into(v, out);
            }
            out.push(END);
        }
        C::Variant(n, v) => {
            out.push(VARIANT);
            put_len(out, n);
            encode_into(v, out);
        }
    }
}

/// Reads one value; `None` for bytes the encoder cannot have written.
struct Decoder<'a> {
    bytes: &'a [u8],
}

impl Decoder<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if n > self.bytes.len() {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }
    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn peek(&self) -> Option<u8> {
        self.bytes.first().copied()
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    /// A varint as the encoder writes it: at most 19 bytes (128 bits), and no trailing zero
    /// byte (a longer form of a shorter number).
    fn varint(&mut self) -> Option<u128> {
        let mut v = 0u128;
        for i in 0..19 {
            let b = self.byte()?;
            v |= u128::from(b & 0x7F).checked_shl(7 * i)?;
            if b & 0x80 == 0 {
                if b == 0 && i > 0 {
                    return None;
                }
                return Some(v);
            }
        }
        None
    }
    fn len_bytes(&mut self) -> Option<Vec<u8>> {
        let n = usize::try_from(self.varint()?).ok()?;
        self.take(n).map(<[u8]>::to_vec)
    }
    fn value(&mut self) -> Option<C> {
        Some(match self.byte()? {
            UNIT => C::Unit,
            FALSE => C::Bool(false),
            TRUE => C::Bool(true),
            I64 => C::I64(i64::try_from(unzigzag(self.varint()?)).ok()?),
            U64 => C::U64(u64::try_from(self.varint()?).ok()?),
            I128 => C::I128(unzigzag(self.varint()?)),
            U128 => C::U128(self.varint()?),
            F64 => C::F64(u64::from_le_bytes(self.array()?)),
            CHAR => C::Char(u32::try_from(self.varint()?).ok()?),
            STR => C::Str(self.len_bytes()?),
            BYTES => C::Bytes(self.len_bytes()?),
            NONE => C::None,
            SOME => C::Some(Box::new(self.value()?)),
            SEQ => {
                let mut vs = Vec::new();
                while self.peek()? != END {
                    vs.push(self.value()?);
                }
                self.byte();
                C::Seq(vs)
            }
            MAP => {
                let mut es = Vec::new();
                while self.peek()? != END {
                    es.push((self.value()?, self.value()?));
                }
                self.byte();
                C::Map(es)
            }
            STRUCT => {
                let mut fs = Vec::new();
                while self.peek()? != END {
                    if self.byte()? != STR {
                        return None;
                    }
                    fs.push((self.len_bytes()?, self.value()?));
                }
                self.byte();
                C::Struct(fs)
            }
            VARIANT => C::Variant(self.len_bytes()?, Box::new(self.value()?)),
            _ => return None,
        })
    }
}

/// The domain tag and the encoding's version.
const DOMAIN: &[u8] = b"idem\x02";

/// The version byte, then the first 31 bytes of the sha256 of the domain and the parts.
fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(DOMAIN);
    for p in parts {
        h.update(p);
    }
    let full: [u8; 32] = h.finalize().into();
    let mut out = [2; 32];
    out[1..].copy_from_slice(&full[..31]);
    out
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let (Ok(v), Ok(w)) = (gen_value(&mut u, 0), gen_value(&mut u, 0)) else {
        return;
    };

    if v.fails() {
        match (canonical_bytes(&v), Fingerprint::of(&v)) {
            (Err(Error::Encode(_)), Err(Error::Encode(_))) => {}
            other => panic!("a failing Serialize gave {other:?}"),
        }
        return;
    }

    let bytes = canonical_bytes(&v).expect("every value of the data model encodes");
    let want = normalize(&v);
    assert_eq!(bytes, encode(&want), "not the documented layout: {v:?}");
    let mut d = Decoder { bytes: &bytes };
    assert_eq!(d.value().as_ref(), Some(&want), "ambiguous encoding: {v:?}");
    assert!(d.bytes.is_empty(), "bytes left over");

    let fp = Fingerprint::of(&v).unwrap();
    assert_eq!(*fp.as_bytes(), digest(&[&bytes]));
    assert_eq!(
        Fingerprint::of(&v.reversed()).unwrap(),
        fp,
        "map order changed it"
    );
    assert_eq!(Fingerprint::from_slice(fp.as_bytes()), Some(fp));
    let hex = fp.to_string();
    assert_eq!(hex.len(), 64);
    assert!(
        hex.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );

    // Several arguments: each one's encoding, in order.
    if !w.fails() {
        let mut f = Fingerprinter::new();
        f.add(&v).unwrap();
        f.add(&w).unwrap();
        let wb = canonical_bytes(&w).unwrap();
        assert_eq!(*f.finish().as_bytes(), digest(&[&bytes, &wb]));
    }
});
