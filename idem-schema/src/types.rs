//! Type families: what a column's declared type means for binding a Rust value to it.

use super::Database;
use super::catalog::QualifiedName;

/// A declared type, normalized to what sqlx binds to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypeFamily {
    /// `TEXT`, `VARCHAR`, `CHAR`, and MySQL's `ENUM(…)` and `SET(…)`: a `&str` or `String`.
    Text,
    /// MySQL's `TINYINT` (`TINYINT(1)` is how MySQL stores a `BOOLEAN`): an `i8`, or a `bool`.
    Int8,
    /// `SMALLINT`: an `i16`.
    Int16,
    /// `INTEGER` on PostgreSQL and MySQL (and MySQL's `MEDIUMINT`): an `i32`.
    Int32,
    /// `BIGINT`, and SQLite's `INTEGER`: an `i64`.
    Int64,
    /// `REAL` on PostgreSQL, `FLOAT` on MySQL: an `f32`.
    Float32,
    /// `DOUBLE PRECISION`, SQLite's `REAL`, MySQL's `DOUBLE` and `REAL`: an `f64`.
    Float64,
    /// `NUMERIC`, `DECIMAL`: a decimal type.
    Numeric,
    /// `BOOLEAN`: a `bool`.
    Bool,
    /// `BYTEA`, `BLOB`, MySQL's `BINARY` and `VARBINARY`: bytes.
    Bytes,
    /// Without time zone (and MySQL's `DATETIME`).
    Timestamp,
    /// With time zone (and MySQL's `TIMESTAMP`, stored in UTC).
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
    /// The family of a declared type on `database`, which reads the same declared type its
    /// own way (`INTEGER` is 32-bit on PostgreSQL and MySQL and 64-bit on SQLite). Enum types
    /// are resolved by the catalog, which knows them; here a user-defined name is `Other`.
    pub fn classify(declared: &str, database: Database) -> TypeFamily {
        match database {
            Database::Postgres => postgres(declared),
            Database::Sqlite => sqlite(declared),
            Database::Mysql => mysql(declared),
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

/// MySQL's names (<https://dev.mysql.com/doc/refman/8.4/en/data-types.html>), without the
/// attributes that leave the same Rust types binding to the column (`UNSIGNED`, `SIGNED`,
/// `ZEROFILL`). An `ENUM(…)` or `SET(…)` column is bound as text.
fn mysql(declared: &str) -> TypeFamily {
    let n = normalize(declared);
    let mut words: Vec<&str> = n.split(' ').collect();
    while words
        .last()
        .is_some_and(|w| matches!(*w, "unsigned" | "signed" | "zerofill"))
    {
        words.pop();
    }
    match words.join(" ").as_str() {
        "char"
        | "varchar"
        | "character"
        | "character varying"
        | "nchar"
        | "nvarchar"
        | "national char"
        | "national varchar"
        | "national character"
        | "national character varying"
        | "tinytext"
        | "text"
        | "mediumtext"
        | "longtext"
        | "enum"
        | "set" => TypeFamily::Text,
        "tinyint" => TypeFamily::Int8,
        "smallint" => TypeFamily::Int16,
        "mediumint" | "int" | "integer" => TypeFamily::Int32,
        // `SERIAL` is `BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE`.
        "bigint" | "serial" => TypeFamily::Int64,
        // MySQL's `FLOAT` is single precision unless `FLOAT(p)` asks for more than 24 bits.
        "float" => match float_precision(declared) {
            Some(p) if p > 24 => TypeFamily::Float64,
            _ => TypeFamily::Float32,
        },
        "double" | "double precision" | "real" => TypeFamily::Float64,
        "decimal" | "dec" | "numeric" | "fixed" => TypeFamily::Numeric,
        "boolean" | "bool" => TypeFamily::Bool,
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => {
            TypeFamily::Bytes
        }
        "datetime" => TypeFamily::Timestamp,
        "timestamp" => TypeFamily::TimestampTz,
        "date" => TypeFamily::Date,
        "time" => TypeFamily::Time,
        "json" => TypeFamily::Json,
        // MariaDB's, since 10.7.
        "uuid" => TypeFamily::Uuid,
        _ => TypeFamily::Other(declared.trim().to_owned()),
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
                TypeFamily::classify(declared, Database::Postgres),
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
                TypeFamily::classify(declared, Database::Sqlite),
                want,
                "{declared}"
            );
        }
    }

    #[test]
    fn mysql_names_and_attributes() {
        let cases = [
            ("VARCHAR(64)", TypeFamily::Text),
            ("LONGTEXT", TypeFamily::Text),
            ("ENUM('PENDING', 'PAID')", TypeFamily::Text),
            ("SET('a', 'b')", TypeFamily::Text),
            ("TINYINT(1)", TypeFamily::Int8),
            ("TINYINT UNSIGNED", TypeFamily::Int8),
            ("SMALLINT UNSIGNED", TypeFamily::Int16),
            ("MEDIUMINT", TypeFamily::Int32),
            ("INT", TypeFamily::Int32),
            ("INT UNSIGNED ZEROFILL", TypeFamily::Int32),
            ("BIGINT(20) UNSIGNED", TypeFamily::Int64),
            ("SERIAL", TypeFamily::Int64),
            ("FLOAT", TypeFamily::Float32),
            ("FLOAT(30)", TypeFamily::Float64),
            ("DOUBLE", TypeFamily::Float64),
            ("REAL", TypeFamily::Float64),
            ("DECIMAL(12,2) UNSIGNED", TypeFamily::Numeric),
            ("BOOLEAN", TypeFamily::Bool),
            ("VARBINARY(255)", TypeFamily::Bytes),
            ("LONGBLOB", TypeFamily::Bytes),
            ("DATETIME(3)", TypeFamily::Timestamp),
            ("TIMESTAMP(6)", TypeFamily::TimestampTz),
            ("DATE", TypeFamily::Date),
            ("JSON", TypeFamily::Json),
            ("UUID", TypeFamily::Uuid),
            ("YEAR", TypeFamily::Other("YEAR".into())),
            ("BIT(1)", TypeFamily::Other("BIT(1)".into())),
        ];
        for (declared, want) in cases {
            assert_eq!(
                TypeFamily::classify(declared, Database::Mysql),
                want,
                "{declared}"
            );
        }
    }
}
