//! Which database a project's migrations are written for, from what their text says. Each clue
//! names the databases it is written for (`AUTO_INCREMENT` is MySQL's, `DATETIME` SQLite's or
//! MySQL's); the guess is the one database that every clue allows, and no guess when the clues
//! disagree or there are none.

use sqlparser::ast::DataType;

use super::Database;
use super::lex::{self, Kind};

const POSTGRES: &[Database] = &[Database::Postgres];
const SQLITE: &[Database] = &[Database::Sqlite];
const MYSQL: &[Database] = &[Database::Mysql];
const SQLITE_OR_MYSQL: &[Database] = &[Database::Sqlite, Database::Mysql];

/// The clues read so far.
#[derive(Debug)]
pub(super) struct Evidence {
    clues: usize,
    possible: Vec<Database>,
}

impl Evidence {
    pub(super) fn new() -> Self {
        Evidence {
            clues: 0,
            possible: Database::ALL.to_vec(),
        }
    }

    /// A clue: what was read is written for one of `written_for`.
    pub(super) fn note(&mut self, written_for: &[Database]) {
        self.clues += 1;
        self.possible.retain(|d| written_for.contains(d));
    }

    /// The one database every clue allows.
    pub(super) fn guess(&self) -> Option<Database> {
        match self.possible.as_slice() {
            [one] if self.clues > 0 => Some(*one),
            _ => None,
        }
    }

    /// The words of a migration that one database's grammar has and the others' do not:
    /// `$$` bodies and PL/pgSQL; `AUTOINCREMENT` and `PRAGMA`; backquoted names, `ENGINE =`,
    /// `AUTO_INCREMENT`, `UNSIGNED`, MySQL's own type names, inline `ENUM(…)` columns and
    /// `ALTER TABLE … MODIFY | CHANGE`.
    pub(super) fn read_text(&mut self, text: &str) {
        let tokens = lex::lex(text);
        let mut statement_start = true;
        let mut in_alter = false;
        for (i, token) in tokens.iter().enumerate() {
            let next = tokens.get(i + 1).map(|t| &t.kind);
            let previous = i.checked_sub(1).and_then(|p| tokens.get(p));
            match &token.kind {
                Kind::Dollar(_) => self.note(POSTGRES),
                Kind::QuotedIdent(_) if text[token.span.clone()].starts_with('`') => {
                    self.note(MYSQL);
                }
                Kind::Word(w) => {
                    let w = w.to_ascii_lowercase();
                    if statement_start {
                        in_alter = w == "alter";
                    }
                    match w.as_str() {
                        "autoincrement" => self.note(SQLITE),
                        "pragma" if statement_start => self.note(SQLITE),
                        "plpgsql" => self.note(POSTGRES),
                        "auto_increment" | "unsigned" | "zerofill" | "tinyint" | "mediumint"
                        | "tinytext" | "mediumtext" | "longtext" | "tinyblob" | "mediumblob"
                        | "longblob" => self.note(MYSQL),
                        "engine" if next == Some(&Kind::Punct('=')) => self.note(MYSQL),
                        "modify" | "change" if in_alter => self.note(MYSQL),
                        // `CREATE TYPE … AS ENUM (…)` is PostgreSQL's, and read as a statement.
                        "enum"
                            if next == Some(&Kind::Punct('('))
                                && !previous.is_some_and(|p| p.is_keyword("as")) =>
                        {
                            self.note(MYSQL);
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
            statement_start = token.kind == Kind::Semicolon;
        }
    }

    /// A column's declared type, where its name belongs to some databases only.
    pub(super) fn read_type(&mut self, data_type: &DataType) {
        let text = data_type.to_string().to_ascii_lowercase();
        let base = text.split('(').next().unwrap_or("").trim();
        match base {
            "bigserial"
            | "serial"
            | "smallserial"
            | "timestamptz"
            | "jsonb"
            | "bytea"
            | "double precision"
            | "timestamp with time zone" => self.note(POSTGRES),
            "blob" | "datetime" => self.note(SQLITE_OR_MYSQL),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guess(texts: &[&str]) -> Option<Database> {
        let mut evidence = Evidence::new();
        for text in texts {
            evidence.read_text(text);
        }
        evidence.guess()
    }

    #[test]
    fn each_database_has_words_of_its_own() {
        assert_eq!(
            guess(&["CREATE FUNCTION f() RETURNS int AS $$ SELECT 1 $$ LANGUAGE sql;"]),
            Some(Database::Postgres)
        );
        assert_eq!(
            guess(&["CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT);"]),
            Some(Database::Sqlite)
        );
        for mysql in [
            "CREATE TABLE `t` (id INT);",
            "CREATE TABLE t (id INT) ENGINE=InnoDB;",
            "CREATE TABLE t (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY);",
            "CREATE TABLE t (n INT UNSIGNED);",
            "CREATE TABLE t (s ENUM('A', 'B'));",
            "CREATE TABLE t (b LONGTEXT);",
            "ALTER TABLE t MODIFY COLUMN s TEXT;",
            "ALTER TABLE t CHANGE s state TEXT;",
        ] {
            assert_eq!(guess(&[mysql]), Some(Database::Mysql), "{mysql}");
        }
    }

    #[test]
    fn no_clue_or_clues_that_disagree_guess_nothing() {
        assert_eq!(guess(&["CREATE TABLE t (id INT);"]), None);
        assert_eq!(guess(&["CREATE TYPE s AS ENUM ('A');"]), None);
        // A column may be called `engine` or `change` outside an `ALTER TABLE`.
        assert_eq!(guess(&["CREATE TABLE t (engine TEXT, change INT);"]), None);
        assert_eq!(
            guess(&[
                "CREATE TABLE `t` (id INT);",
                "CREATE TABLE u (id INTEGER PRIMARY KEY AUTOINCREMENT);"
            ]),
            None
        );
    }

    #[test]
    fn a_clue_for_two_databases_narrows_with_another() {
        let mut evidence = Evidence::new();
        evidence.read_type(&DataType::Datetime(None));
        assert_eq!(evidence.guess(), None, "SQLite or MySQL");
        evidence.read_text("CREATE TABLE t (id INT UNSIGNED);");
        assert_eq!(evidence.guess(), Some(Database::Mysql));
    }
}
