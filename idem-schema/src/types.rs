//! Type families: what a column's declared type means for binding a Rust value to it.

use super::catalog::QualifiedName;

/// The database a catalog's migrations are written for. PostgreSQL and SQLite read the same
/// declared type differently (`INTEGER` is 32-bit in one and 64-bit in the other) and compare
/// quoted names differently, so some answers depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL.
    Postgres,
    /// SQLite.
    Sqlite,
}

/// A declared type, normalized to what sqlx binds to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypeFamily {
    /// `TEXT`, `VARCHAR`, `CHAR`: a `&str` or `String`.
    Text,
    /// `SMALLINT`: an `i16`.
    Int16,
    /// `INTEGER` on PostgreSQL: an `i32`.
    Int32,
    /// `BIGINT`, and SQLite's `INTEGER`: an `i64`.
    Int64,
    /// `REAL` on PostgreSQL: an `f32`.
    Float32,
    /// `DOUBLE PRECISION`, and SQLite's `REAL`: an `f64`.
    Float64,
    /// `NUMERIC`, `DECIMAL`: a decimal type.
    Numeric,
    /// `BOOLEAN`: a `bool`.
    Bool,
    /// `BYTEA`, `BLOB`: bytes.
    Bytes,
    /// Without time zone.
    Timestamp,
    /// With time zone.
    TimestampTz,
    /// `DATE`.
    Date,
    /// `TIME`.
    Time,
    /// `UUID`.
    Uuid,
    /// `json` or `jsonb`.
    Json,
    /// A PostgreSQL enum type, by name.
    Enum(QualifiedName),
    /// A PostgreSQL array of the element family.
    Array(Box<TypeFamily>),
    /// Anything else, as declared (empty for a SQLite column declared without a type).
    Other(String),
}

/// Lower-cases, drops type modifiers (`(20)`, `(12,2)`) and collapses blanks, so
/// `CHARACTER VARYING(20)` and `character  varying` read alike.
fn normalize(declared: &str) -> String {
    let mut out = String::new();
    let mut depth = 0usize;
    for c in declared.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth > 0 => {}
            c if c.is_whitespace() => {
                if !out.is_empty() && !out.ends_with(' ') {
                    out.push(' ');
                }
            }
            c => out.push(c.to_ascii_lowercase()),
        }
    }
    out.trim_end().replace(" [", "[")
}

/// The precision in `float(p)`, which decides between `real` and `double precision`.
fn float_precision(declared: &str) -> Option<u32> {
    let open = declared.find('(')?;
    let close = declared[open..].find(')')? + open;
    declared[open + 1..close].trim().parse().ok()
}

impl TypeFamily {
    /// The family of a declared type under `backend`. Enum columns are resolved by the catalog,
    /// which knows the enum types; here a user-defined name is `Other`.
    pub fn classify(declared: &str, backend: Backend) -> TypeFamily {
        match backend {
            Backend::Postgres => postgres(declared),
            Backend::Sqlite => sqlite(declared),
        }
    }
}

fn postgres(declared: &str) -> TypeFamily {
    let n = normalize(declared);
    if let Some(element) = n.strip_suffix("[]") {
        return TypeFamily::Array(Box::new(postgres(element)));
    }
    if let Some(element) = n.strip_suffix(" array") {
        return TypeFamily::Array(Box::new(postgres(element)));
    }
    // `pg_catalog.int4` names the same type as `int4`.
    let n = n.strip_prefix("pg_catalog.").unwrap_or(&n);
    match n {
        "text" | "varchar" | "character varying" | "char" | "character" | "bpchar" | "name"
        | "citext" | "nvarchar" | "nchar" => TypeFamily::Text,
        "smallint" | "int2" | "smallserial" | "serial2" => TypeFamily::Int16,
        "integer" | "int" | "int4" | "serial" | "serial4" => TypeFamily::Int32,
        "bigint" | "int8" | "bigserial" | "serial8" => TypeFamily::Int64,
        "real" | "float4" => TypeFamily::Float32,
        "double precision" | "float8" | "double" => TypeFamily::Float64,
        "float" => match float_precision(declared) {
            Some(p) if p <= 24 => TypeFamily::Float32,
            _ => TypeFamily::Float64,
        },
        "numeric" | "decimal" | "dec" => TypeFamily::Numeric,
        "boolean" | "bool" => TypeFamily::Bool,
        "bytea" => TypeFamily::Bytes,
        "timestamp" | "timestamp without time zone" => TypeFamily::Timestamp,
        "timestamptz" | "timestamp with time zone" => TypeFamily::TimestampTz,
        "date" => TypeFamily::Date,
        "time" | "time without time zone" => TypeFamily::Time,
        "uuid" => TypeFamily::Uuid,
        "json" | "jsonb" => TypeFamily::Json,
        _ => TypeFamily::Other(declared.trim().to_owned()),
    }
}

/// SQLite stores by affinity, derived from the declared name by substring rules
/// (<https://www.sqlite.org/datatype3.html#determination_of_column_affinity>). The names that
/// sqlx gives a meaning of its own (booleans, dates and times, UUIDs, JSON) come first.
fn sqlite(declared: &str) -> TypeFamily {
    let n = normalize(declared);
    match n.as_str() {
        "boolean" | "bool" => return TypeFamily::Bool,
        "datetime" | "timestamp" => return TypeFamily::Timestamp,
        "date" => return TypeFamily::Date,
        "time" => return TypeFamily::Time,
        "uuid" => return TypeFamily::Uuid,
        "json" | "jsonb" => return TypeFamily::Json,
        "" => return TypeFamily::Other(String::new()),
        _ => {}
    }
    if n.contains("int") {
        TypeFamily::Int64
    } else if n.contains("char") || n.contains("clob") || n.contains("text") {
        TypeFamily::Text
    } else if n.contains("blob") {
        TypeFamily::Bytes
    } else if n.contains("real") || n.contains("floa") || n.contains("doub") {
        TypeFamily::Float64
    } else {
        TypeFamily::Numeric
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_names_and_spellings() {
        let cases = [
            ("TEXT", TypeFamily::Text),
            ("CHARACTER VARYING(20)", TypeFamily::Text),
            ("varchar(255)", TypeFamily::Text),
            ("SMALLINT", TypeFamily::Int16),
            ("INTEGER", TypeFamily::Int32),
            ("serial", TypeFamily::Int32),
            ("BIGSERIAL", TypeFamily::Int64),
            ("int8", TypeFamily::Int64),
            ("REAL", TypeFamily::Float32),
            ("FLOAT(10)", TypeFamily::Float32),
            ("FLOAT", TypeFamily::Float64),
            ("DOUBLE PRECISION", TypeFamily::Float64),
            ("NUMERIC(12,2)", TypeFamily::Numeric),
            ("BOOLEAN", TypeFamily::Bool),
            ("BYTEA", TypeFamily::Bytes),
            ("TIMESTAMP", TypeFamily::Timestamp),
            ("TIMESTAMP(3) WITHOUT TIME ZONE", TypeFamily::Timestamp),
            ("TIMESTAMP WITH TIME ZONE", TypeFamily::TimestampTz),
            ("timestamptz", TypeFamily::TimestampTz),
            ("DATE", TypeFamily::Date),
            ("UUID", TypeFamily::Uuid),
            ("JSONB", TypeFamily::Json),
            ("pg_catalog.int4", TypeFamily::Int32),
            ("TEXT[]", TypeFamily::Array(Box::new(TypeFamily::Text))),
            ("INT ARRAY", TypeFamily::Array(Box::new(TypeFamily::Int32))),
            ("money", TypeFamily::Other("money".into())),
        ];
        for (declared, want) in cases {
            assert_eq!(
                TypeFamily::classify(declared, Backend::Postgres),
                want,
                "{declared}"
            );
        }
    }

    #[test]
    fn sqlite_affinity_rules() {
        let cases = [
            ("INTEGER", TypeFamily::Int64),
            ("INT", TypeFamily::Int64),
            ("BIGINT", TypeFamily::Int64),
            ("TEXT", TypeFamily::Text),
            ("VARCHAR(20)", TypeFamily::Text),
            ("CLOB", TypeFamily::Text),
            ("BLOB", TypeFamily::Bytes),
            ("REAL", TypeFamily::Float64),
            ("DOUBLE", TypeFamily::Float64),
            ("DECIMAL(10,5)", TypeFamily::Numeric),
            ("BOOLEAN", TypeFamily::Bool),
            ("DATETIME", TypeFamily::Timestamp),
            ("", TypeFamily::Other(String::new())),
        ];
        for (declared, want) in cases {
            assert_eq!(
                TypeFamily::classify(declared, Backend::Sqlite),
                want,
                "{declared}"
            );
        }
    }
}
