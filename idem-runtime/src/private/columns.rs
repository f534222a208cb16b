//! The column-type check of a column argument, against the column's type in the migrations.
//!
//! Only types whose meaning idem knows (integers, floats, `bool`, text, bytes, and references
//! or `Option`s of them) are judged; any other type (a newtype, `chrono`, `uuid`,
//! `rust_decimal`) is the user's word and passes, so that the check never refuses a program
//! the database would accept.
#![allow(non_camel_case_types, non_snake_case, clippy::upper_case_acronyms)]

use std::marker::PhantomData;

/// A Rust type whose fit to each column type idem can tell.
pub trait Known {}

macro_rules! known {
    ($($t:ty),*) => {$( impl Known for $t {} )*};
}

known!(
    bool,
    i8,
    i16,
    i32,
    i64,
    u8,
    u16,
    u32,
    u64,
    f32,
    f64,
    str,
    String,
    [u8],
    Vec<u8>
);

impl<T: Known + ?Sized> Known for &T {}
impl<T: Known + ?Sized> Known for &mut T {}
impl<T: Known> Known for Option<T> {}
impl<T: Known + ?Sized> Known for Box<T> {}

/// A column type, by the name a migration gives it: a module with a marker type and a
/// `Fits` that says which known Rust types fit it (a trait of its own, so that the
/// compiler's message names the column type).
macro_rules! column_types {
    ($($name:ident $message:literal $label:literal [$($t:ty),*];)*) => {$(
        pub mod $name {
            #[derive(Debug)]
            pub enum Column {}

            #[diagnostic::on_unimplemented(
                message = $message,
                label = $label,
                note = "the column's type is read from the migrations: give the argument a type that fits it, or change the column in a migration"
            )]
            pub trait Fits {}

            $( impl Fits for $t {} )*
            impl<T: Fits + ?Sized> Fits for &T {}
            impl<T: Fits + ?Sized> Fits for &mut T {}
            impl<T: Fits> Fits for Option<T> {}
            impl<T: Fits + ?Sized> Fits for Box<T> {}
        }

    )*};
}

// The types that take only values of their own (dates, times, UUIDs, JSON, decimals, enum
// types) are judged on PostgreSQL alone: SQLite stores text or numbers in them, and MySQL
// converts text and numbers to them, so their messages speak of PostgreSQL.
column_types! {
    TEXT "`{Self}` does not fit a TEXT column" "this argument fills a TEXT column" [str, String];
    TINYINT "`{Self}` does not fit a TINYINT column" "this argument fills a TINYINT column (MySQL's `BOOLEAN` is a `TINYINT(1)`)" [i8, i16, i32, i64, u8, u16, u32, u64, bool];
    SMALLINT "`{Self}` does not fit a SMALLINT column" "this argument fills a SMALLINT column" [i8, i16, i32, i64, u8, u16, u32, u64];
    INTEGER "`{Self}` does not fit an INTEGER column" "this argument fills an INTEGER column" [i8, i16, i32, i64, u8, u16, u32, u64];
    BIGINT "`{Self}` does not fit a BIGINT column" "this argument fills a BIGINT column" [i8, i16, i32, i64, u8, u16, u32, u64];
    REAL "`{Self}` does not fit a REAL column" "this argument fills a REAL column" [i8, i16, i32, i64, u8, u16, u32, u64, f32, f64];
    FLOAT "`{Self}` does not fit a FLOAT column" "this argument fills a FLOAT column" [i8, i16, i32, i64, u8, u16, u32, u64, f32, f64];
    DOUBLE_PRECISION "`{Self}` does not fit a DOUBLE PRECISION column" "this argument fills a DOUBLE PRECISION column" [i8, i16, i32, i64, u8, u16, u32, u64, f32, f64];
    NUMERIC "`{Self}` does not fit a NUMERIC column" "this argument fills a NUMERIC column" [i8, i16, i32, i64, u8, u16, u32, u64, f32, f64];
    BOOLEAN "`{Self}` does not fit a BOOLEAN column" "this argument fills a BOOLEAN column" [bool];
    BYTEA "`{Self}` does not fit a BYTEA column" "this argument fills a BYTEA column" [[u8], Vec<u8>];
    BLOB "`{Self}` does not fit a BLOB column" "this argument fills a BLOB column" [[u8], Vec<u8>];
    TIMESTAMP "`{Self}` does not fit a TIMESTAMP column" "this argument fills a TIMESTAMP column: PostgreSQL does not take text or numbers for it" [];
    TIMESTAMPTZ "`{Self}` does not fit a TIMESTAMPTZ column" "this argument fills a TIMESTAMPTZ column: PostgreSQL does not take text or numbers for it" [];
    DATE "`{Self}` does not fit a DATE column" "this argument fills a DATE column: PostgreSQL does not take text or numbers for it" [];
    TIME "`{Self}` does not fit a TIME column" "this argument fills a TIME column: PostgreSQL does not take text or numbers for it" [];
    UUID "`{Self}` does not fit a UUID column" "this argument fills a UUID column: PostgreSQL does not take text for it" [];
    JSON "`{Self}` does not fit a JSON column" "this argument fills a JSON column: PostgreSQL does not take text for it, bind a `serde_json::Value` or `sqlx::types::Json`" [];
    ENUM "`{Self}` does not fit a column of an enum type" "this argument fills a column of an enum type: PostgreSQL does not take text for it, bind a type declared with `#[derive(sqlx::Type)]`" [];
}

// Written out, not generated: the compiler quotes the bound that failed.
impl Strict<TEXT::Column> {
    pub fn fits<T: TEXT::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<TINYINT::Column> {
    pub fn fits<T: TINYINT::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<SMALLINT::Column> {
    pub fn fits<T: SMALLINT::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<INTEGER::Column> {
    pub fn fits<T: INTEGER::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<BIGINT::Column> {
    pub fn fits<T: BIGINT::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<REAL::Column> {
    pub fn fits<T: REAL::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<FLOAT::Column> {
    pub fn fits<T: FLOAT::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<DOUBLE_PRECISION::Column> {
    pub fn fits<T: DOUBLE_PRECISION::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<NUMERIC::Column> {
    pub fn fits<T: NUMERIC::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<BOOLEAN::Column> {
    pub fn fits<T: BOOLEAN::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<BYTEA::Column> {
    pub fn fits<T: BYTEA::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<BLOB::Column> {
    pub fn fits<T: BLOB::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<TIMESTAMP::Column> {
    pub fn fits<T: TIMESTAMP::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<TIMESTAMPTZ::Column> {
    pub fn fits<T: TIMESTAMPTZ::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<DATE::Column> {
    pub fn fits<T: DATE::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<TIME::Column> {
    pub fn fits<T: TIME::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<UUID::Column> {
    pub fn fits<T: UUID::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<JSON::Column> {
    pub fn fits<T: JSON::Fits + ?Sized>(self, _value: &T) {}
}

impl Strict<ENUM::Column> {
    pub fn fits<T: ENUM::Fits + ?Sized>(self, _value: &T) {}
}

/// The argument `T` for a column of type `F`: method resolution picks [`KnownType`] when
/// idem can judge `T`, and [`OtherType`] when it cannot.
#[derive(Debug)]
pub struct Column<F, T: ?Sized>(PhantomData<F>, PhantomData<fn(&T)>);

pub fn column<F, T: ?Sized>(_value: &T) -> Column<F, T> {
    Column(PhantomData, PhantomData)
}

pub trait KnownType<F> {
    fn rule(&self) -> Strict<F> {
        Strict(PhantomData)
    }
}

impl<F, T: Known + ?Sized> KnownType<F> for Column<F, T> {}

pub trait OtherType {
    fn rule(&self) -> Lenient {
        Lenient
    }
}

impl<F, T: ?Sized> OtherType for &Column<F, T> {}

/// The fit of a type idem knows: each column type's `fits` requires its `Fits`.
#[derive(Debug)]
pub struct Strict<F>(PhantomData<F>);

/// Any other type: the user's word.
#[derive(Debug)]
pub struct Lenient;

impl Lenient {
    pub fn fits<T: ?Sized>(self, _value: &T) {}
}
