//! How commands print: aligned tables for people, one JSON document for scripts.

use std::fmt::Write as _;

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
    #[allow(dead_code)] // for the listing commands
    pub(crate) fn with_header(columns: &[&str]) -> Self {
        Table {
            header: Some(columns.iter().map(|c| (*c).to_owned()).collect()),
            rows: Vec::new(),
        }
    }

    /// Adds a row.
    pub(crate) fn row<I, S>(&mut self, cells: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.rows.push(cells.into_iter().map(Into::into).collect());
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
}
