//! How commands print: aligned tables for people, one JSON document for scripts.
//!
//! What a store or a broker holds was written by services and their clients, not by the
//! operator: before it is printed for people, every character a terminal would act on is
//! written as an escape ([`printable`]). JSON escapes them by itself.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::Duration;

use crate::Failure;

/// Rows of cells printed in aligned columns; a header row is printed first when there is one.
#[derive(Debug, Default)]
pub(crate) struct Table {
    header: Option<Vec<String>>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table without a header: the `name  value` pairs of one item.
    pub(crate) fn pairs() -> Self {
        Table::default()
    }

    /// A table of items under `columns`.
    pub(crate) fn with_header(columns: &[&str]) -> Self {
        Table {
            header: Some(columns.iter().map(|c| (*c).to_owned()).collect()),
            rows: Vec::new(),
        }
    }

    /// Adds a row; its cells are shown [`printable`], on one line each.
    pub(crate) fn row<I, S>(&mut self, cells: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.rows.push(
            cells
                .into_iter()
                .map(|c| {
                    let c = c.into();
                    match printable(&c) {
                        Cow::Borrowed(_) => c,
                        Cow::Owned(escaped) => escaped,
                    }
                })
                .collect(),
        );
        self
    }

    /// The table as text: columns two spaces apart, the last one not padded.
    pub(crate) fn render(&self) -> String {
        let all: Vec<&Vec<String>> = self.header.iter().chain(&self.rows).collect();
        let columns = all.iter().map(|r| r.len()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|i| {
                all.iter()
                    .filter_map(|r| r.get(i))
                    .map(|c| c.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in all {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let _ = write!(line, "{cell:<width$}  ", width = widths[i]);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `text` as it may reach a terminal: every control character (C0, DEL, C1: an escape
/// sequence's ESC, a carriage return, a NUL, a line break) and every bidirectional override is
/// written as an escape (`\x1b`, `\r`, `\0`, `\n`, `\u{202e}`), so stored text can neither
/// move the cursor, recolour, retitle or clear the screen, nor reorder or hide what is shown.
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    escape(text, false)
}

/// [`printable`], keeping line breaks and tabs: for a stored body printed on lines of its own.
pub(crate) fn printable_lines(text: &str) -> Cow<'_, str> {
    escape(text, true)
}

fn escape(text: &str, lines: bool) -> Cow<'_, str> {
    let acts = |c: char| {
        (c.is_control() && !(lines && matches!(c, '\n' | '\t')))
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.contains(acts) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !acts(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            c if (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// A duration as people read it: `4m 58s`, `850ms`.
pub(crate) fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    // The larger unit, and the next one unless it is zero.
    let two = |big: u64, unit: &str, small: u64, small_unit: &str| match small {
        0 => format!("{big}{unit}"),
        _ => format!("{big}{unit} {small}{small_unit}"),
    };
    match secs {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{secs}s"),
        60..3600 => two(secs / 60, "m", secs % 60, "s"),
        3600..86_400 => two(secs / 3600, "h", secs % 3600 / 60, "m"),
        _ => two(secs / 86_400, "d", secs % 86_400 / 3600, "h"),
    }
}

/// A duration in whole milliseconds, for JSON.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn json(value: &serde_json::Value) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Failure::Failed(format!("could not write JSON: {e}")))?;
    println!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up() {
        let mut t = Table::with_header(&["scope", "state"]);
        t.row(["refund:A1", "completed"]).row(["x", "in_progress"]);
        assert_eq!(
            t.render(),
            "scope      state\nrefund:A1  completed\nx          in_progress\n"
        );
    }

    #[test]
    fn what_a_terminal_acts_on_is_escaped() {
        assert!(matches!(printable("refund:A1 é 🦀"), Cow::Borrowed(_)));
        assert_eq!(
            printable("a\u{1b}[2J\u{1b}]0;t\u{7}\r\0\n\t\u{7f}\u{9b}\u{202e}\u{2066}z"),
            r"a\x1b[2J\x1b]0;t\x07\r\0\n\t\x7f\u{9b}\u{202e}\u{2066}z"
        );
        assert_eq!(printable_lines("a\n\tb\r\u{1b}"), "a\n\tb\\r\\x1b");
        let mut t = Table::with_header(&["scope", "key"]);
        t.row(["refund:\u{1b}[31mA1", "k\nk"]);
        assert_eq!(
            t.render(),
            "scope              key\nrefund:\\x1b[31mA1  k\\nk\n"
        );
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(duration(Duration::from_millis(850)), "850ms");
        assert_eq!(duration(Duration::from_secs(42)), "42s");
        assert_eq!(duration(Duration::from_secs(298)), "4m 58s");
        assert_eq!(duration(Duration::from_secs(7260)), "2h 1m");
        assert_eq!(duration(Duration::from_secs(86_400 + 7200)), "1d 2h");
        assert_eq!(duration(Duration::from_secs(3600)), "1h");
        assert_eq!(duration(Duration::from_secs(300)), "5m");
    }
}
