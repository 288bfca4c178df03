//! Building a statement once for every database: [`Sql`] with its bound [`Value`]s, and
//! [`Columns`] reading a row back.

use chrono::{DateTime, Utc};
use sqlx::QueryBuilder;

use crate::status::EventStatus;

use super::{Backend, Dialect};

/// A value bound into a statement. Statements are generic; each backend binds these with its
/// own sqlx types.
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
#[allow(unreachable_pub)] // unnameable outside: only the sealed Backend takes it
pub enum Value<'a> {
    I64(i64),
    I32(i32),
    I16(i16),
    Str(&'a str),
    OptStr(Option<&'a str>),
    Time(DateTime<Utc>),
    OptTime(Option<DateTime<Utc>>),
    Json(&'a serde_json::Value),
}

impl Value<'_> {
    /// Appends this value to `out` as a PostgreSQL literal, for a statement sent in the simple
    /// query protocol, which takes no bound values. Text is an escape string (`E'...'`), whose
    /// meaning does not depend on `standard_conforming_strings`: backslashes and quotes are
    /// doubled, and nothing else in it is special. Returns `false`, leaving `out` unusable, for
    /// text holding a NUL, which no PostgreSQL text can hold (bound, it fails the statement).
    pub(crate) fn push_pg_literal(&self, out: &mut String) -> bool {
        use std::fmt::Write;
        fn text(out: &mut String, s: &str) -> bool {
            if s.contains('\0') {
                return false;
            }
            out.reserve(s.len() + 3);
            out.push_str("E'");
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\'' => out.push_str("''"),
                    c => out.push(c),
                }
            }
            out.push('\'');
            true
        }
        // Microseconds, cut as sqlx's binary encoding cuts them.
        let time = |out: &mut String, t: &DateTime<Utc>| {
            let _ = write!(out, "'{}'", t.format("%Y-%m-%dT%H:%M:%S%.6f+00:00"));
        };
        match self {
            Value::I64(v) => {
                let _ = write!(out, "{v}");
            }
            Value::I32(v) => {
                let _ = write!(out, "{v}");
            }
            Value::I16(v) => {
                let _ = write!(out, "{v}");
            }
            Value::Str(s) | Value::OptStr(Some(s)) => return text(out, s),
            Value::Time(t) | Value::OptTime(Some(t)) => time(out, t),
            Value::OptStr(None) | Value::OptTime(None) => out.push_str("NULL"),
            // serde_json escapes every control character: the text holds no NUL.
            Value::Json(v) => return text(out, &v.to_string()),
        }
        true
    }
}

macro_rules! value_from {
    ($($ty:ty => $variant:ident),* $(,)?) => {$(
        impl<'a> From<$ty> for Value<'a> {
            fn from(value: $ty) -> Value<'a> {
                Value::$variant(value)
            }
        }
    )*};
}

value_from!(
    i64 => I64,
    i32 => I32,
    i16 => I16,
    &'a str => Str,
    Option<&'a str> => OptStr,
    DateTime<Utc> => Time,
    Option<DateTime<Utc>> => OptTime,
    &'a serde_json::Value => Json,
);

impl<'a> From<&'a String> for Value<'a> {
    fn from(value: &'a String) -> Value<'a> {
        Value::Str(value)
    }
}

impl From<EventStatus> for Value<'_> {
    fn from(status: EventStatus) -> Self {
        Value::I16(status.code())
    }
}

/// A statement being written: SQL text, with every value bound.
#[doc(hidden)]
#[allow(unreachable_pub)] // unnameable outside: only the sealed Backend takes it
pub struct Sql<DB: Backend>(pub(crate) QueryBuilder<DB>);

impl<DB: Backend> Sql<DB> {
    /// A statement starting with `text`.
    pub(crate) fn new(text: impl Into<String>) -> Sql<DB> {
        Sql(QueryBuilder::new(text))
    }

    /// Appends SQL text: only fixed fragments and validated table names, never a value.
    pub(crate) fn push(&mut self, text: impl std::fmt::Display) -> &mut Self {
        self.0.push(text);
        self
    }

    /// Appends a placeholder bound to `value`.
    pub(crate) fn bind<'v>(&mut self, value: impl Into<Value<'v>>) -> &mut Self {
        DB::bind(&mut self.0, value.into());
        self
    }

    /// Appends `(v1, v2, ...)`, every value bound: the list of an `IN`.
    pub(crate) fn list<'v, V: Into<Value<'v>>>(
        &mut self,
        values: impl IntoIterator<Item = V>,
    ) -> &mut Self {
        self.push("(");
        for (i, value) in values.into_iter().enumerate() {
            if i > 0 {
                self.push(", ");
            }
            self.bind(value);
        }
        self.push(")")
    }

    /// Appends a membership test in `values` for the column before it: ` = ANY($n)` with one
    /// array bound on PostgreSQL, ` IN (...)` with each value bound elsewhere. `values` must not
    /// be empty.
    pub(crate) fn in_strs(&mut self, values: &[&str]) -> &mut Self {
        self.membership(|q| DB::push_str_array(q, values))
    }

    /// Appends a membership test in `ids` for the column before it: ` = ANY($n)` with one
    /// array bound on PostgreSQL, so that every batch size shares one prepared statement, and
    /// ` IN (...)` with each value bound elsewhere. `ids` must not be empty.
    pub(crate) fn in_ids(&mut self, ids: &[i64]) -> &mut Self {
        self.membership(|q| DB::push_id_array(q, ids))
    }

    /// ` = ANY(...)` on PostgreSQL, ` IN (...)` elsewhere, around what `values` pushes.
    fn membership(&mut self, values: impl FnOnce(&mut QueryBuilder<DB>)) -> &mut Self {
        self.push(match DB::DIALECT {
            Dialect::Postgres => " = ANY(",
            Dialect::MySql | Dialect::Sqlite => " IN (",
        });
        values(&mut self.0);
        self.push(")")
    }

    /// Appends one bound array of `values` (PostgreSQL only: elsewhere the values as a list).
    pub(crate) fn str_array(&mut self, values: &[&str]) -> &mut Self {
        DB::push_str_array(&mut self.0, values);
        self
    }

    /// Runs the statement on `conn`; the number of rows it changed.
    pub(crate) async fn execute(self, conn: &mut DB::Connection) -> Result<u64, sqlx::Error> {
        DB::execute(conn, self).await
    }

    /// Runs the query on `conn`; its rows.
    pub(crate) async fn fetch(
        self,
        conn: &mut DB::Connection,
    ) -> Result<Vec<DB::Row>, sqlx::Error> {
        DB::fetch_all(conn, self).await
    }
}

/// Reads typed columns of one row by name.
pub(crate) struct Columns<'r, DB: Backend>(pub(crate) &'r DB::Row);

impl<DB: Backend> Columns<'_, DB> {
    pub(crate) fn id(&self, column: &str) -> Result<i64, sqlx::Error> {
        DB::read_id(self.0, column)
    }
    pub(crate) fn i64(&self, column: &str) -> Result<i64, sqlx::Error> {
        DB::read_i64(self.0, column)
    }
    pub(crate) fn opt_i64(&self, column: &str) -> Result<Option<i64>, sqlx::Error> {
        DB::read_opt_i64(self.0, column)
    }
    pub(crate) fn i32(&self, column: &str) -> Result<i32, sqlx::Error> {
        DB::read_i32(self.0, column)
    }
    pub(crate) fn code(&self, column: &str) -> Result<i64, sqlx::Error> {
        DB::read_code(self.0, column)
    }
    pub(crate) fn string(&self, column: &str) -> Result<String, sqlx::Error> {
        DB::read_string(self.0, column)
    }
    pub(crate) fn opt_string(&self, column: &str) -> Result<Option<String>, sqlx::Error> {
        DB::read_opt_string(self.0, column)
    }
    pub(crate) fn time(&self, column: &str) -> Result<DateTime<Utc>, sqlx::Error> {
        DB::read_time(self.0, column)
    }
    pub(crate) fn opt_time(&self, column: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        DB::read_opt_time(self.0, column)
    }
    pub(crate) fn json(&self, column: &str) -> Result<serde_json::Value, sqlx::Error> {
        DB::read_json(self.0, column)
    }
    pub(crate) fn opt_json(&self, column: &str) -> Result<Option<serde_json::Value>, sqlx::Error> {
        DB::read_opt_json(self.0, column)
    }
    pub(crate) fn status(&self, column: &str) -> Result<EventStatus, sqlx::Error> {
        EventStatus::from_code(self.code(column)?).map_err(|e| sqlx::Error::Decode(Box::new(e)))
    }
}
