//! A small SQL lexer: enough to split a file into statements when the parser rejects the whole
//! file, and to find the names an unreadable statement touches. It knows the quoting rules that
//! can hide a `;` (strings, quoted identifiers, comments, `$tag$` bodies) and nothing else.

use std::ops::Range;

/// One lexical token, with its byte range in the lexed text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Token {
    pub(super) kind: Kind,
    pub(super) span: Range<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Kind {
    /// An unquoted word: a keyword or an identifier, as written.
    Word(String),
    /// A `"quoted"` or `` `quoted` `` identifier, unescaped.
    QuotedIdent(String),
    /// A string literal (`'…'`, `E'…'`, …); its text is not needed.
    Str,
    /// A `$tag$ … $tag$` body; the range is the text between the delimiters.
    Dollar(Range<usize>),
    /// A number.
    Number,
    /// `;`
    Semicolon,
    /// Any other character.
    Punct(char),
}

impl Token {
    /// The word, when this token is an unquoted word equal to `keyword` (ASCII case-insensitive).
    pub(super) fn is_keyword(&self, keyword: &str) -> bool {
        matches!(&self.kind, Kind::Word(w) if w.eq_ignore_ascii_case(keyword))
    }
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

/// Lexes `text`. Never fails: an unterminated string or comment runs to the end, which is what
/// the database would report as an error anyway.
pub(super) fn lex(text: &str) -> Vec<Token> {
    lex_as(text, false)
}

/// Lexes `text`, with MySQL's rules when `mysql`: a backslash escapes the next character in a
/// string, and `#` begins a comment.
pub(super) fn lex_as(text: &str, mysql: bool) -> Vec<Token> {
    let mut lexer = Lexer {
        text,
        pos: 0,
        out: Vec::new(),
        mysql,
    };
    lexer.run();
    lexer.out
}

struct Lexer<'a> {
    text: &'a str,
    pos: usize,
    out: Vec<Token>,
    mysql: bool,
}

impl Lexer<'_> {
    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn peek_at(&self, n: usize) -> Option<char> {
        self.text[self.pos..].chars().nth(n)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn push(&mut self, kind: Kind, start: usize) {
        self.out.push(Token {
            kind,
            span: start..self.pos,
        });
    }

    fn run(&mut self) {
        while let Some(c) = self.peek() {
            let start = self.pos;
            match c {
                c if c.is_whitespace() => {
                    self.bump();
                }
                '-' if self.peek_at(1) == Some('-') => self.line_comment(),
                '#' if self.mysql => self.line_comment(),
                '/' if self.peek_at(1) == Some('*') => self.block_comment(),
                '\'' => {
                    self.quoted('\'', self.mysql);
                    self.push(Kind::Str, start);
                }
                // A string on MySQL (without `ANSI_QUOTES`): only what it hides matters here.
                '"' if self.mysql => {
                    self.quoted('"', true);
                    self.push(Kind::Str, start);
                }
                '"' | '`' => {
                    let value = self.quoted(c, false);
                    self.push(Kind::QuotedIdent(value), start);
                }
                '$' => self.dollar(start),
                ';' => {
                    self.bump();
                    self.push(Kind::Semicolon, start);
                }
                c if c.is_ascii_digit() => {
                    while self
                        .peek()
                        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_')
                    {
                        self.bump();
                    }
                    self.push(Kind::Number, start);
                }
                c if is_ident_start(c) => self.word(start),
                _ => {
                    self.bump();
                    self.push(Kind::Punct(c), start);
                }
            }
        }
    }

    fn line_comment(&mut self) {
        while let Some(c) = self.bump() {
            if c == '\n' {
                break;
            }
        }
    }

    /// PostgreSQL nests block comments; SQLite does not, but a nested opener inside a SQLite
    /// comment is rare enough that following PostgreSQL costs nothing.
    fn block_comment(&mut self) {
        self.pos += 2;
        let mut depth = 1usize;
        while depth > 0 {
            match self.bump() {
                None => break,
                Some('*') if self.peek() == Some('/') => {
                    self.bump();
                    depth -= 1;
                }
                Some('/') if self.peek() == Some('*') => {
                    self.bump();
                    depth += 1;
                }
                Some(_) => {}
            }
        }
    }

    /// Reads a quoted run that starts at the current position; a doubled quote is an escaped
    /// quote. `backslash` also honours `\x` escapes (PostgreSQL's `E'…'`).
    fn quoted(&mut self, quote: char, backslash: bool) -> String {
        self.bump();
        let mut value = String::new();
        while let Some(c) = self.bump() {
            if backslash && c == '\\' {
                if let Some(escaped) = self.bump() {
                    value.push(escaped);
                }
            } else if c == quote {
                if self.peek() == Some(quote) {
                    self.bump();
                    value.push(quote);
                } else {
                    return value;
                }
            } else {
                value.push(c);
            }
        }
        value
    }

    fn word(&mut self, start: usize) {
        while self.peek().is_some_and(is_ident_char) {
            self.bump();
        }
        let word = &self.text[start..self.pos];
        // `E'…'` is a string with backslash escapes, where `\'` does not end the string.
        if self.peek() == Some('\'') && word.eq_ignore_ascii_case("e") {
            self.quoted('\'', true);
            self.push(Kind::Str, start);
            return;
        }
        // Other prefixed strings (`B'…'`, `X'…'`, `N'…'`, `U&'…'`) lex as a word and a string.
        let word = word.to_owned();
        self.push(Kind::Word(word), start);
    }

    /// `$tag$ … $tag$` (tag empty or an identifier), or a lone `$` such as the `$1` parameter.
    fn dollar(&mut self, start: usize) {
        let rest = &self.text[self.pos + 1..];
        let tag_len = rest
            .char_indices()
            .take_while(|&(i, c)| {
                if i == 0 {
                    is_ident_start(c)
                } else {
                    c.is_alphanumeric() || c == '_'
                }
            })
            .map(|(i, c)| i + c.len_utf8())
            .last()
            .unwrap_or(0);
        if !rest[tag_len..].starts_with('$') {
            self.bump();
            self.push(Kind::Punct('$'), start);
            return;
        }
        let delimiter_len = tag_len + 2;
        let delimiter = &self.text[start..start + delimiter_len];
        let body_start = start + delimiter_len;
        let (body_end, end) = match self.text[body_start..].find(delimiter) {
            Some(at) => (body_start + at, body_start + at + delimiter_len),
            None => (self.text.len(), self.text.len()),
        };
        self.pos = end;
        self.push(Kind::Dollar(body_start..body_end), start);
    }
}

/// One statement of a file: its text (without the `;`) and the line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Piece<'a> {
    pub(super) text: &'a str,
    pub(super) line: usize,
}

/// Splits `sql` into statements at top-level `;` (lexed with MySQL's rules when `mysql`).
/// Inside the `BEGIN … END` body of a `CREATE TRIGGER` (SQLite, MySQL) or of a `BEGIN ATOMIC`
/// routine (PostgreSQL) a `;` ends an inner statement, not the outer one, so it does not split
/// there.
pub(super) fn split(sql: &str, mysql: bool) -> Vec<Piece<'_>> {
    let tokens = lex_as(sql, mysql);
    let mut pieces = Vec::new();
    let mut current: Vec<&Token> = Vec::new();
    let mut depth = 0usize;
    let mut flush = |current: &mut Vec<&Token>| {
        if let (Some(first), Some(last)) = (current.first(), current.last()) {
            let start = first.span.start;
            pieces.push(Piece {
                text: &sql[start..last.span.end],
                line: 1 + sql[..start].matches('\n').count(),
            });
        }
        current.clear();
    };
    for token in &tokens {
        if token.kind == Kind::Semicolon && depth == 0 {
            flush(&mut current);
            continue;
        }
        current.push(token);
        // The statement's kind is in its first few words; looking no further keeps this linear.
        if has_compound_body(&current[..current.len().min(6)]) {
            if token.is_keyword("begin") || token.is_keyword("case") {
                depth += 1;
            } else if token.is_keyword("end") {
                depth = depth.saturating_sub(1);
            }
        }
    }
    flush(&mut current);
    pieces
}

/// Whether the statement begun by `tokens` is one whose body may hold `;`-separated statements:
/// `CREATE [OR REPLACE] [TEMP|TEMPORARY] TRIGGER|FUNCTION|PROCEDURE …`.
fn has_compound_body(tokens: &[&Token]) -> bool {
    let mut words = tokens.iter().map(|t| match &t.kind {
        Kind::Word(w) => w.to_ascii_lowercase(),
        _ => String::new(),
    });
    if words.next().as_deref() != Some("create") {
        return false;
    }
    for word in words {
        match word.as_str() {
            "or" | "replace" | "temp" | "temporary" | "constraint" => continue,
            "trigger" | "function" | "procedure" => return true,
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(sql: &str) -> Vec<&str> {
        split(sql, false).into_iter().map(|p| p.text).collect()
    }

    #[test]
    fn splits_at_top_level_semicolons_only() {
        let sql = "CREATE TABLE a (x text DEFAULT 'a;b'); -- c;d\n\
                   /* e; /* nested; */ f; */ INSERT INTO \"we;ird\" VALUES (E'g\\';h');\n\
                   SELECT $$ i; $$, $fn$ j; $x$ k; $fn$;  ;";
        assert_eq!(
            texts(sql),
            vec![
                "CREATE TABLE a (x text DEFAULT 'a;b')",
                "INSERT INTO \"we;ird\" VALUES (E'g\\';h')",
                "SELECT $$ i; $$, $fn$ j; $x$ k; $fn$",
            ]
        );
    }

    #[test]
    fn mysql_strings_escape_with_backslashes_and_hash_starts_a_comment() {
        let sql = "CREATE TABLE a (x text COMMENT 'it\\'s; fine', y text DEFAULT \"b;\\\"c\");\n\
                   # a comment; not a statement\n\
                   DROP TABLE a";
        let pieces: Vec<&str> = split(sql, true).into_iter().map(|p| p.text).collect();
        assert_eq!(
            pieces,
            vec![
                "CREATE TABLE a (x text COMMENT 'it\\'s; fine', y text DEFAULT \"b;\\\"c\")",
                "DROP TABLE a",
            ]
        );
        // Elsewhere a backslash is an ordinary character, and `#` an operator.
        assert_eq!(split("SELECT 'a\\'; SELECT 2 # 3", false).len(), 2);
    }

    #[test]
    fn reports_the_line_each_statement_starts_on() {
        let pieces = split(
            "-- header\nCREATE TABLE a (x int);\n\n  DROP TABLE a;",
            false,
        );
        let lines: Vec<usize> = pieces.iter().map(|p| p.line).collect();
        assert_eq!(lines, vec![2, 4]);
    }

    #[test]
    fn keeps_a_trigger_body_in_one_statement() {
        let sql = "CREATE TRIGGER t AFTER INSERT ON a BEGIN\n\
                     UPDATE b SET n = CASE WHEN n > 0 THEN n ELSE 0 END;\n\
                     INSERT INTO c VALUES (1);\n\
                   END;\nCREATE TABLE d (x int);";
        let got = texts(sql);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].ends_with("END"), "{got:?}");
        assert_eq!(got[1], "CREATE TABLE d (x int)");
    }

    #[test]
    fn a_dollar_parameter_is_not_a_quote() {
        assert_eq!(
            texts("UPDATE a SET x = $1; UPDATE b SET y = $2"),
            vec!["UPDATE a SET x = $1", "UPDATE b SET y = $2"]
        );
    }

    #[test]
    fn unterminated_quotes_run_to_the_end_without_panicking() {
        for sql in ["SELECT 'abc", "SELECT \"abc", "SELECT $$abc", "SELECT E'\\"] {
            let pieces = split(sql, false);
            assert_eq!(pieces.len(), 1, "{sql}");
            assert_eq!(pieces[0].text, sql);
        }
        // A comment is no statement, even an unterminated one.
        assert_eq!(texts("SELECT 1; /* abc; def"), vec!["SELECT 1"]);
    }

    #[test]
    fn quoted_identifiers_are_unescaped() {
        let tokens = lex("\"a\"\"b\" `c`");
        let kinds: Vec<Kind> = tokens.into_iter().map(|t| t.kind).collect();
        assert_eq!(
            kinds,
            vec![
                Kind::QuotedIdent("a\"b".into()),
                Kind::QuotedIdent("c".into())
            ]
        );
    }
}
