//! Table names are configurable, and are the only text ever placed into SQL: they are validated.

use std::fmt;

/// A validated SQL table name: `[A-Za-z_][A-Za-z0-9_]{0,62}`, optionally qualified by a schema
/// of the same shape (`events.biz_outbox_event`). Nothing else can reach the SQL text.
///
/// ```
/// use event_sqlx::TableName;
///
/// assert!(TableName::new("biz_outbox_event").is_ok());
/// assert!(TableName::new("events.biz_outbox_event").is_ok());
/// assert!(TableName::new("outbox; DROP TABLE users").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName(String);

/// Why a table name was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid table name `{name}`: {reason}; use letters, digits and `_` (not starting with a digit), at most 63 characters, optionally `schema.table`"
)]
pub struct TableNameError {
    name: String,
    reason: &'static str,
}

impl TableName {
    /// Validates `name`.
    pub fn new(name: &str) -> Result<TableName, TableNameError> {
        let fail = |reason| TableNameError {
            name: name.chars().take(80).collect(),
            reason,
        };
        let mut parts = name.split('.');
        let (first, second, rest) = (parts.next(), parts.next(), parts.next());
        if rest.is_some() {
            return Err(fail("it has more than one `.`"));
        }
        for part in [first, second].into_iter().flatten() {
            if part.is_empty() {
                return Err(fail("a part is empty"));
            }
            if part.len() > 63 {
                return Err(fail("a part is longer than 63 characters"));
            }
            let mut chars = part.chars();
            if !chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            {
                return Err(fail("it must start with a letter or `_`"));
            }
            if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(fail(
                    "it contains a character other than a letter, digit or `_`",
                ));
            }
        }
        Ok(TableName(name.to_owned()))
    }

    /// The name as it appears in SQL.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::TableName;

    #[test]
    fn accepts_plain_and_qualified_names() {
        for ok in ["biz_outbox_event", "_t", "s.t", "T1"] {
            assert!(TableName::new(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_anything_that_could_change_the_sql() {
        for bad in [
            "",
            "1t",
            "a-b",
            "a b",
            "a.b.c",
            "a.",
            ".a",
            "t;",
            "t\"",
            "t'",
            "t--",
            &"x".repeat(64),
        ] {
            let err = TableName::new(bad).unwrap_err();
            assert!(err.to_string().contains("invalid table name"), "{bad}");
        }
    }
}
