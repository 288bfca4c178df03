//! Tables for people, JSON for scripts.

use serde::Serialize;

/// Prints `rows` as an aligned table under `headers`.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Prints `value` as pretty JSON.
pub(crate) fn json(value: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// A time for a table cell.
pub(crate) fn time(at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    at.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "-".to_owned())
}

/// An error and its causes on one line, each cause once: a cause whose text the message before
/// it already holds is left out (sqlx repeats the database's message in its own), and so is the
/// database server's own source line (` at line N`).
pub(crate) fn chain(error: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in error.chain() {
        let mut text = cause.to_string();
        if let Some((head, line)) = text.rsplit_once(" at line ")
            && !line.is_empty()
            && line.bytes().all(|b| b.is_ascii_digit())
        {
            text = head.to_owned();
        }
        if parts.iter().any(|earlier| earlier.contains(&text)) {
            continue;
        }
        parts.push(text);
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_cause_is_told_once() {
        #[derive(Debug)]
        struct Inner;
        impl std::fmt::Display for Inner {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("relation \"t\" does not exist at line 1392")
            }
        }
        impl std::error::Error for Inner {}
        #[derive(Debug)]
        struct Outer(Inner);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "error returned from database: {}", self.0)
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let error = anyhow::Error::new(Outer(Inner)).context("table t does not exist");
        assert_eq!(
            super::chain(&error),
            "table t does not exist: error returned from database: relation \"t\" does not exist"
        );
    }
}
