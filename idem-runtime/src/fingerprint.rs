//! Fingerprints: sha256 over a canonical encoding of a request's arguments.
//!
//! The encoding is idem's own (version 2, below), not JSON: it is the same in every process and
//! run, does not depend on the iteration order of maps (entries are sorted by their encoded key)
//! or of hash sets (elements sorted by their encoding), and is streamed into the hash without
//! building an intermediate value, except for the entries of maps and the elements of hash sets,
//! which must be buffered to be sorted.
//!
//! serde writes a set as it writes a list (`collect_seq`); a set is told by its type's name, so a
//! `HashSet` (std's, hashbrown's, any crate's type of that name) is sorted and a `Vec`,
//! `VecDeque`, slice or `BTreeSet` keeps its order and its encoding. A hand-written `Serialize`
//! that writes a hash-ordered collection element by element (`serialize_seq`) is not seen: sort
//! it there, or hold a `BTreeSet`.
//!
//! # Encoding, version 2
//!
//! Every value is a tag byte and a payload. Unsigned integers are widened to `u64` (or `u128`)
//! and written as LEB128 varints (7 bits a byte, low first, the high bit set on every byte but
//! the last); signed ones are widened to `i64` (or `i128`) and zigzag-mapped first (0, -1, 1, -2
//! … to 0, 1, 2, 3 …); a `char` is the varint of its scalar value; floats are widened to `f64`,
//! every NaN made one NaN, and written as their 8 bits, little-endian. Strings and byte strings
//! carry their length as a varint. Sequences, tuples, structs and maps end with an end tag that
//! never starts a value; struct fields are written as a string (the name) and a value, in
//! declaration order, so a field never starts with the end tag either. A varint is prefix-free,
//! so concatenations are unambiguous. Newtype structs are transparent. A map's entries are
//! written sorted by the bytes of their encoded keys; a hash set's elements, which are written as
//! a sequence's, sorted by their encoded bytes.
//!
//! The hash input is the domain tag `idem` and the version byte 2, then the arguments' encodings
//! in order: short requests fit one block of sha256 (55 bytes: a UUID, an amount and a currency
//! do). The fingerprint is the version byte followed by the first 31 bytes of the digest, so a
//! stored fingerprint says which encoding made it and a later version of the encoding can
//! recognise the records of this one instead of taking them for another request.

use std::fmt;

use serde::ser::{self, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Error;

/// A request fingerprint: 32 bytes, the encoding's version (its first byte) and 31 bytes of
/// sha256.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The version of the encoding this release fingerprints with: the first byte of every
    /// fingerprint it makes.
    pub const VERSION: u8 = 2;

    /// The version of the encoding that made this fingerprint (its first byte), as read back
    /// from a store.
    pub const fn version(&self) -> u8 {
        self.0[0]
    }

    /// Wraps raw digest bytes (as read back from a store).
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Fingerprint(bytes)
    }

    /// The digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Reads a fingerprint from a slice, which must be 32 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(bytes).ok().map(Fingerprint)
    }

    /// The fingerprint of one value.
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<Self, Error> {
        let mut f = Fingerprinter::new();
        f.add(value)?;
        Ok(f.finish())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// Builds a fingerprint from several arguments, in order.
///
/// ```
/// use idem::fingerprint::Fingerprinter;
///
/// let mut f = Fingerprinter::new();
/// f.add(&"ORD-1").unwrap();
/// f.add(&250_u32).unwrap();
/// let a = f.finish();
/// assert_eq!(a.to_string().len(), 64);
/// ```
#[derive(Clone)]
pub struct Fingerprinter {
    hasher: Sha256,
}

impl fmt::Debug for Fingerprinter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fingerprinter").finish_non_exhaustive()
    }
}

impl Default for Fingerprinter {
    fn default() -> Self {
        Fingerprinter::new()
    }
}

/// The start of the hash input: the domain tag and the encoding's version. Shorter than
/// version 1's (`idem/fingerprint/v1` and a zero byte), which it never starts like.
const DOMAIN: &[u8] = &[b'i', b'd', b'e', b'm', Fingerprint::VERSION];

impl Fingerprinter {
    /// A fingerprinter with nothing added.
    pub fn new() -> Self {
        let mut hasher = Sha256::new();
        hasher.update(DOMAIN);
        Fingerprinter { hasher }
    }

    /// Adds the next argument.
    pub fn add<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        value
            .serialize(&mut Canon {
                out: &mut self.hasher,
            })
            .map_err(|e| Error::Encode(format!("cannot fingerprint an argument: {}", e.0)))
    }

    /// The fingerprint of everything added.
    pub fn finish(self) -> Fingerprint {
        let digest = self.hasher.finalize();
        let mut out = [0; 32];
        out[0] = Fingerprint::VERSION;
        out[1..].copy_from_slice(&digest[..31]);
        Fingerprint(out)
    }
}

/// The canonical encoding of `value`, as hashed by [`Fingerprinter::add`].
pub fn canonical_bytes<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    value
        .serialize(&mut Canon { out: &mut out })
        .map_err(|e| Error::Encode(e.0))?;
    Ok(out)
}

trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

mod tag {
    pub(super) const UNIT: u8 = 0x00;
    pub(super) const FALSE: u8 = 0x01;
    pub(super) const TRUE: u8 = 0x02;
    pub(super) const I64: u8 = 0x03;
    pub(super) const U64: u8 = 0x04;
    pub(super) const I128: u8 = 0x05;
    pub(super) const U128: u8 = 0x06;
    pub(super) const F64: u8 = 0x07;
    pub(super) const CHAR: u8 = 0x08;
    pub(super) const STR: u8 = 0x09;
    pub(super) const BYTES: u8 = 0x0A;
    pub(super) const NONE: u8 = 0x0B;
    pub(super) const SOME: u8 = 0x0C;
    pub(super) const SEQ: u8 = 0x0D;
    pub(super) const END: u8 = 0x0E;
    pub(super) const MAP: u8 = 0x0F;
    pub(super) const STRUCT: u8 = 0x10;
    pub(super) const VARIANT: u8 = 0x11;
}

#[derive(Debug)]
struct CanonError(String);

impl fmt::Display for CanonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CanonError {}

impl ser::Error for CanonError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        CanonError(msg.to_string())
    }
}

struct Canon<'a, W: Sink> {
    out: &'a mut W,
}

impl<W: Sink> Canon<'_, W> {
    fn tag(&mut self, t: u8) {
        self.out.put(&[t]);
    }

    /// A tag and a varint, in one write.
    fn tagged_varint(&mut self, t: u8, mut v: u128) {
        let mut buf = [0u8; 20];
        buf[0] = t;
        let mut n = 1;
        while v >= 0x80 {
            buf[n] = (v as u8) | 0x80;
            v >>= 7;
            n += 1;
        }
        buf[n] = v as u8;
        self.out.put(&buf[..=n]);
    }

    fn len_bytes(&mut self, t: u8, bytes: &[u8]) {
        self.tagged_varint(t, bytes.len() as u128);
        self.out.put(bytes);
    }

    fn reborrow(&mut self) -> Canon<'_, W> {
        Canon { out: self.out }
    }
}

impl<'a, 'b, W: Sink> ser::Serializer for &'a mut Canon<'b, W> {
    type Ok = ();
    type Error = CanonError;
    type SerializeSeq = Compound<'a, 'b, W>;
    type SerializeTuple = Compound<'a, 'b, W>;
    type SerializeTupleStruct = Compound<'a, 'b, W>;
    type SerializeTupleVariant = Compound<'a, 'b, W>;
    type SerializeMap = MapBuf<'a, 'b, W>;
    type SerializeStruct = Compound<'a, 'b, W>;
    type SerializeStructVariant = Compound<'a, 'b, W>;

    fn serialize_bool(self, v: bool) -> Result<(), CanonError> {
        self.tag(if v { tag::TRUE } else { tag::FALSE });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), CanonError> {
        self.serialize_i64(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<(), CanonError> {
        self.serialize_i64(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<(), CanonError> {
        self.serialize_i64(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result<(), CanonError> {
        let zigzag = ((v << 1) ^ (v >> 63)) as u64;
        self.tagged_varint(tag::I64, zigzag.into());
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> Result<(), CanonError> {
        let zigzag = ((v << 1) ^ (v >> 127)) as u128;
        self.tagged_varint(tag::I128, zigzag);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), CanonError> {
        self.serialize_u64(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result<(), CanonError> {
        self.serialize_u64(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result<(), CanonError> {
        self.serialize_u64(v.into())
    }
    fn serialize_u64(self, v: u64) -> Result<(), CanonError> {
        self.tagged_varint(tag::U64, v.into());
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Result<(), CanonError> {
        self.tagged_varint(tag::U128, v);
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<(), CanonError> {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<(), CanonError> {
        let bits = if v.is_nan() {
            f64::NAN.to_bits()
        } else {
            v.to_bits()
        };
        let mut buf = [tag::F64; 9];
        buf[1..].copy_from_slice(&bits.to_le_bytes());
        self.out.put(&buf);
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), CanonError> {
        self.tagged_varint(tag::CHAR, u32::from(v).into());
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), CanonError> {
        self.len_bytes(tag::STR, v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), CanonError> {
        self.len_bytes(tag::BYTES, v);
        Ok(())
    }
    fn serialize_none(self) -> Result<(), CanonError> {
        self.tag(tag::NONE);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), CanonError> {
        self.tag(tag::SOME);
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), CanonError> {
        self.tag(tag::UNIT);
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), CanonError> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), CanonError> {
        self.len_bytes(tag::VARIANT, variant.as_bytes());
        self.tag(tag::UNIT);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), CanonError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), CanonError> {
        self.len_bytes(tag::VARIANT, variant.as_bytes());
        value.serialize(self)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, CanonError> {
        self.tag(tag::SEQ);
        Ok(Compound { ser: self })
    }
    /// serde's default, except for a set that iterates in its hasher's order: its elements are
    /// written sorted by their encoding, as a map's entries are.
    fn collect_seq<I>(self, iter: I) -> Result<(), CanonError>
    where
        I: IntoIterator,
        I::Item: Serialize,
    {
        if !hash_ordered::<I>() {
            let mut seq = self.serialize_seq(None)?;
            for element in iter {
                seq.element(&element)?;
            }
            return seq.end();
        }
        let mut elements = iter
            .into_iter()
            .map(|e| encode(&e))
            .collect::<Result<Vec<_>, _>>()?;
        elements.sort_unstable();
        self.tag(tag::SEQ);
        for e in &elements {
            self.out.put(e);
        }
        self.tag(tag::END);
        Ok(())
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, CanonError> {
        self.serialize_seq(None)
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, CanonError> {
        self.serialize_seq(None)
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, CanonError> {
        self.len_bytes(tag::VARIANT, variant.as_bytes());
        self.serialize_seq(None)
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, CanonError> {
        Ok(MapBuf {
            ser: self,
            entries: Vec::with_capacity(len.unwrap_or(0)),
            key: None,
        })
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, CanonError> {
        self.tag(tag::STRUCT);
        Ok(Compound { ser: self })
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, CanonError> {
        self.len_bytes(tag::VARIANT, variant.as_bytes());
        self.tag(tag::STRUCT);
        Ok(Compound { ser: self })
    }
}

struct Compound<'a, 'b, W: Sink> {
    ser: &'a mut Canon<'b, W>,
}

impl<W: Sink> Compound<'_, '_, W> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonError> {
        value.serialize(&mut self.ser.reborrow())
    }
    fn field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), CanonError> {
        // As a string: its tag is not the end tag, whatever the name's length.
        self.ser.len_bytes(tag::STR, name.as_bytes());
        self.element(value)
    }
    fn end(self) -> Result<(), CanonError> {
        self.ser.tag(tag::END);
        Ok(())
    }
}

macro_rules! seq_like {
    ($($trait:ident :: $method:ident),*) => {$(
        impl<W: Sink> ser::$trait for Compound<'_, '_, W> {
            type Ok = ();
            type Error = CanonError;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonError> {
                self.element(value)
            }
            fn end(self) -> Result<(), CanonError> {
                Compound::end(self)
            }
        }
    )*};
}
seq_like!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

macro_rules! struct_like {
    ($($trait:ident),*) => {$(
        impl<W: Sink> ser::$trait for Compound<'_, '_, W> {
            type Ok = ();
            type Error = CanonError;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                name: &'static str,
                value: &T,
            ) -> Result<(), CanonError> {
                self.field(name, value)
            }
            fn end(self) -> Result<(), CanonError> {
                Compound::end(self)
            }
        }
    )*};
}
struct_like!(SerializeStruct, SerializeStructVariant);

/// Whether `I`, what a `Serialize` impl hands to `collect_seq`, is a set that iterates in its
/// hasher's order: std's `HashSet` (serde writes it as `collect_seq(self)`, like a `Vec`), and
/// the `HashSet`s of hashbrown and of other crates that name theirs so. Its order then differs
/// between two sets of the same elements, in one process or two (each `RandomState` has its own
/// seed), so it is no part of the request. A sequence is told apart from a set only by its
/// type's name, which `std::any::type_name` gives (`&std::collections::hash::set::HashSet<…>`):
/// the test `hash_sets_are_told_by_their_type` keeps that reading honest on every compiler.
fn hash_ordered<I>() -> bool {
    let mut name = std::any::type_name::<I>();
    loop {
        let trimmed = name.trim_start_matches('&').trim_start_matches("mut ");
        if trimmed == name {
            break;
        }
        name = trimmed;
    }
    // A slice, array or tuple of sets is a sequence of its own.
    if name.starts_with(['[', '(']) {
        return false;
    }
    let outer = name.split('<').next().unwrap_or(name);
    outer.rsplit("::").next() == Some("HashSet")
}

/// Buffers a map's entries so they can be written sorted by encoded key.
struct MapBuf<'a, 'b, W: Sink> {
    ser: &'a mut Canon<'b, W>,
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    key: Option<Vec<u8>>,
}

fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CanonError> {
    let mut out = Vec::new();
    value.serialize(&mut Canon { out: &mut out })?;
    Ok(out)
}

impl<W: Sink> ser::SerializeMap for MapBuf<'_, '_, W> {
    type Ok = ();
    type Error = CanonError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), CanonError> {
        self.key = Some(encode(key)?);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonError> {
        let key = self
            .key
            .take()
            .ok_or_else(|| CanonError("map value serialized before its key".into()))?;
        self.entries.push((key, encode(value)?));
        Ok(())
    }

    fn end(mut self) -> Result<(), CanonError> {
        self.entries.sort_unstable();
        self.ser.tag(tag::MAP);
        for (k, v) in &self.entries {
            self.ser.out.put(k);
            self.ser.out.put(v);
        }
        self.ser.tag(tag::END);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;

    #[test]
    fn map_order_does_not_matter() {
        let mut a = HashMap::new();
        let mut b = HashMap::new();
        for i in 0..100 {
            a.insert(format!("k{i}"), i);
        }
        for i in (0..100).rev() {
            b.insert(format!("k{i}"), i);
        }
        let sorted: BTreeMap<_, _> = a.clone().into_iter().collect();
        assert_eq!(Fingerprint::of(&a).unwrap(), Fingerprint::of(&b).unwrap());
        assert_eq!(
            Fingerprint::of(&a).unwrap(),
            Fingerprint::of(&sorted).unwrap()
        );
    }

    #[test]
    fn set_order_does_not_matter() {
        use std::collections::HashSet;
        use std::collections::hash_map::RandomState;
        let mut a = HashSet::with_hasher(RandomState::new());
        let mut b = HashSet::with_hasher(RandomState::new());
        for i in 0..100u64 {
            a.insert(format!("e{i}"));
            b.insert(format!("e{}", 99 - i));
        }
        assert_eq!(Fingerprint::of(&a).unwrap(), Fingerprint::of(&b).unwrap());
        // Elements sorted by their encoding: the canonical bytes of the set.
        let mut elements: Vec<Vec<u8>> = a.iter().map(|e| canonical_bytes(e).unwrap()).collect();
        elements.sort();
        let mut expected = vec![tag::SEQ];
        elements.iter().for_each(|e| expected.extend_from_slice(e));
        expected.push(tag::END);
        assert_eq!(canonical_bytes(&b).unwrap(), expected);
        // Nested in a struct, in a map's value, in a sequence.
        let nested = |s: &HashSet<String, RandomState>| {
            let mut m = HashMap::new();
            m.insert("k", vec![s.clone()]);
            (1u8, m)
        };
        assert_eq!(
            Fingerprint::of(&nested(&a)).unwrap(),
            Fingerprint::of(&nested(&b)).unwrap()
        );
        b.insert("another".into());
        assert_ne!(Fingerprint::of(&a).unwrap(), Fingerprint::of(&b).unwrap());
    }

    #[test]
    fn hash_sets_are_told_by_their_type() {
        use std::collections::{BTreeSet, HashSet, VecDeque};
        assert!(hash_ordered::<&HashSet<u8>>());
        assert!(hash_ordered::<&&mut HashSet<String, std::hash::RandomState>>());
        // Ordered collections keep their order, and their encoding.
        assert!(!hash_ordered::<&Vec<u8>>());
        assert!(!hash_ordered::<&VecDeque<u8>>());
        assert!(!hash_ordered::<&BTreeSet<u8>>());
        assert!(!hash_ordered::<&[HashSet<u8>]>());
        let v = vec![3u8, 1, 2];
        assert_eq!(
            canonical_bytes(&v).unwrap(),
            [tag::SEQ, tag::U64, 3, tag::U64, 1, tag::U64, 2, tag::END]
        );
    }

    #[test]
    fn distinct_values_differ() {
        let f = |v: &dyn erased::Ser| v.fp();
        assert_ne!(f(&("ab", "c")), f(&("a", "bc")));
        assert_ne!(f(&(Some(1u8), None::<u8>)), f(&(None::<u8>, Some(1u8))));
        assert_ne!(f(&vec![vec![1u8], vec![]]), f(&vec![vec![], vec![1u8]]));
        assert_ne!(f(&1u64), f(&1i64));
        assert_eq!(f(&1u8), f(&1u64));
        assert_eq!(f(&f64::NAN), f(&-f64::NAN));
        assert_ne!(f(&-1i64), f(&1i64));
        assert_ne!(f(&(127u64, 0u8)), f(&128u64));
        assert_ne!(f(&i64::MIN), f(&i64::MAX));
    }

    #[test]
    fn varints_are_leb128() {
        let enc = |v: &dyn erased::Ser| v.canon();
        assert_eq!(enc(&0u8), [tag::U64, 0]);
        assert_eq!(enc(&127u64), [tag::U64, 0x7F]);
        assert_eq!(enc(&128u64), [tag::U64, 0x80, 0x01]);
        assert_eq!(enc(&-1i32), [tag::I64, 0x01]);
        assert_eq!(enc(&1i64), [tag::I64, 0x02]);
        assert_eq!(enc(&u64::MAX).len(), 11);
        assert_eq!(enc(&u128::MAX).len(), 20);
        assert_eq!(enc(&i128::MIN).len(), 20);
        assert_eq!(enc(&"ab"), [tag::STR, 2, b'a', b'b']);
    }

    #[test]
    fn a_field_name_never_reads_as_the_end() {
        struct Fourteen;
        impl Serialize for Fourteen {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ser::SerializeStruct as _;
                let mut st = s.serialize_struct("Fourteen", 1)?;
                st.serialize_field("abcdefghijklmn", &1u8)?;
                st.end()
            }
        }
        let bytes = canonical_bytes(&Fourteen).unwrap();
        assert_eq!(&bytes[..3], &[tag::STRUCT, tag::STR, 14]);
    }

    #[test]
    fn known_vector() {
        // The encoding is a compatibility promise: records written by one release must still
        // match requests fingerprinted by the next (or be told apart by their version byte).
        // The digest was computed independently from the documented layout (Python's hashlib):
        // "idem" 02, SEQ, STR 05 "ORD-1", U64 FA 01, END; then version 02 and 31 bytes.
        let fp = Fingerprint::of(&("ORD-1", 250u32)).unwrap();
        assert_eq!(
            fp.to_string(),
            "0296f1a20f275fc230a28594d7527d599f3e894bcadfbb97833bad940ded3cf2"
        );
        assert_eq!(fp.version(), Fingerprint::VERSION);
    }

    mod erased {
        use super::*;
        pub(super) trait Ser {
            fn fp(&self) -> Fingerprint;
            fn canon(&self) -> Vec<u8>;
        }
        impl<T: Serialize> Ser for T {
            fn fp(&self) -> Fingerprint {
                Fingerprint::of(self).unwrap()
            }
            fn canon(&self) -> Vec<u8> {
                canonical_bytes(self).unwrap()
            }
        }
    }
}
