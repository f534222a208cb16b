//! Fingerprints: sha256 over a canonical encoding of a request's arguments.
//!
//! The encoding is idem's own (version 1, below), not JSON: it is the same in every process and
//! run, does not depend on the iteration order of maps (entries are sorted by their encoded key),
//! and is streamed into the hash without building an intermediate value, except for the entries
//! of maps, which must be buffered to be sorted.
//!
//! # Encoding, version 1
//!
//! Every value is a tag byte and a payload; integers are little-endian; strings and byte strings
//! carry a `u64` length; sequences, tuples, structs and maps end with an end tag that never starts
//! a value, so concatenations are unambiguous. Signed integers are widened to `i64` (or `i128`),
//! unsigned to `u64` (or `u128`), floats to `f64` with every NaN made one NaN. Struct fields are
//! written as name and value in declaration order; newtype structs are transparent. The hash input
//! starts with the domain tag `idem/fingerprint/v1`.

use std::fmt;

use serde::ser::{self, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Error;

/// A request fingerprint: 32 bytes of sha256.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
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

const DOMAIN: &[u8] = b"idem/fingerprint/v1\0";

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
        Fingerprint(self.hasher.finalize().into())
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

    fn len_bytes(&mut self, t: Option<u8>, bytes: &[u8]) {
        if let Some(t) = t {
            self.tag(t);
        }
        self.out.put(&(bytes.len() as u64).to_le_bytes());
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
        self.tag(tag::I64);
        self.out.put(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> Result<(), CanonError> {
        self.tag(tag::I128);
        self.out.put(&v.to_le_bytes());
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
        self.tag(tag::U64);
        self.out.put(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Result<(), CanonError> {
        self.tag(tag::U128);
        self.out.put(&v.to_le_bytes());
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
        self.tag(tag::F64);
        self.out.put(&bits.to_le_bytes());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), CanonError> {
        self.tag(tag::CHAR);
        self.out.put(&u32::from(v).to_le_bytes());
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), CanonError> {
        self.len_bytes(Some(tag::STR), v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), CanonError> {
        self.len_bytes(Some(tag::BYTES), v);
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
        self.len_bytes(Some(tag::VARIANT), variant.as_bytes());
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
        self.len_bytes(Some(tag::VARIANT), variant.as_bytes());
        value.serialize(self)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, CanonError> {
        self.tag(tag::SEQ);
        Ok(Compound { ser: self })
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
        self.len_bytes(Some(tag::VARIANT), variant.as_bytes());
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
        self.len_bytes(Some(tag::VARIANT), variant.as_bytes());
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
        self.ser.len_bytes(None, name.as_bytes());
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
    fn distinct_values_differ() {
        let f = |v: &dyn erased::Ser| v.fp();
        assert_ne!(f(&("ab", "c")), f(&("a", "bc")));
        assert_ne!(f(&(Some(1u8), None::<u8>)), f(&(None::<u8>, Some(1u8))));
        assert_ne!(f(&vec![vec![1u8], vec![]]), f(&vec![vec![], vec![1u8]]));
        assert_ne!(f(&1u64), f(&1i64));
        assert_eq!(f(&1u8), f(&1u64));
        assert_eq!(f(&f64::NAN), f(&-f64::NAN));
    }

    #[test]
    fn known_vector() {
        // The encoding is a compatibility promise: records written by one release must still
        // match requests fingerprinted by the next. The digest was computed independently
        // from the documented layout: domain, SEQ, STR len "ORD-1", U64 250, END.
        let fp = Fingerprint::of(&("ORD-1", 250u32)).unwrap();
        assert_eq!(
            fp.to_string(),
            "e784740e8d8b1f2266e0be80c02dbab03820913dde50e91ad088f2f2f16ede54"
        );
    }

    mod erased {
        use super::*;
        pub(super) trait Ser {
            fn fp(&self) -> Fingerprint;
        }
        impl<T: Serialize> Ser for T {
            fn fp(&self) -> Fingerprint {
                Fingerprint::of(self).unwrap()
            }
        }
    }
}
