//! The flush: multi-row and one-row inserts, the one-trip script, the stored-before check and
//! the error a sequence conflict becomes.

use crate::row::outbox::NewOutboxRow;
use crate::sql::PENDING;
use crate::sql::dialect::{Backend, Columns, Dialect, Sql, Value};
use crate::table::TableName;

/// The columns a flush writes.
pub(super) const INSERT_COLUMNS: &str = "event_no, aggregate_type, aggregate_id, \
    aggregate_sequence, event_type, event_version, event_source, publish_channel, topic, \
    routing_key, event_payload, event_headers, publish_status, retry_count, max_retry_count, \
    trace_id, create_time, update_time";

/// Statements are kept well under every backend's bind-parameter limit (SQLite: 32766).
pub(super) const ROWS_PER_INSERT: usize = 500;

/// The name the migrations give the unique key on `(aggregate_type, aggregate_id,
/// aggregate_sequence)` ends with this (`outbox_uk_aggregate_sequence` on PostgreSQL and SQLite,
/// `uk_aggregate_sequence` on MySQL).
pub(super) const SEQUENCE_KEY: &str = "uk_aggregate_sequence";

/// One value of a new row.
pub(super) enum Cell<'a> {
    /// A value of the event itself (its number, aggregate id and sequence, payload, headers,
    /// trace id, time).
    Own(Value<'a>),
    /// A value every event of its type shares (aggregate and event type, version, source,
    /// route, retry limit): a literal in a one-row statement, else bound.
    Shared(Value<'a>),
    /// A constant of the statement's text.
    Constant(i16),
    /// `create_time` again: its placeholder reused in a one-row statement, else bound.
    CreateTime(Value<'a>),
}

/// The values of a new row, in `INSERT_COLUMNS` order. A new row is pending with no attempt:
/// constants in the text.
pub(super) fn cells(row: &NewOutboxRow) -> [Cell<'_>; 18] {
    use Cell::{Constant, CreateTime, Own, Shared};
    [
        Own(Value::Str(&row.event_no)),
        Shared(Value::Str(&row.aggregate_type)),
        Own(Value::Str(&row.aggregate_id)),
        Own(Value::I64(row.aggregate_sequence)),
        Shared(Value::Str(&row.event_type)),
        Shared(Value::I32(row.event_version)),
        Shared(Value::Str(&row.event_source)),
        Shared(Value::Str(&row.publish_channel)),
        Shared(Value::OptStr(row.topic.as_deref())),
        Shared(Value::OptStr(row.routing_key.as_deref())),
        Own(Value::Json(&row.event_payload)),
        Own(Value::Json(&row.event_headers)),
        Constant(PENDING),
        Constant(0),
        Shared(Value::I32(row.max_retry_count)),
        Own(Value::OptStr(row.trace_id.as_deref())),
        Own(Value::Time(row.create_time)),
        CreateTime(Value::Time(row.create_time)),
    ]
}

/// Writes the VALUES rows of `rows` into `out`: the punctuation and constants with `text`, each
/// other value with `value`, which may refuse it (`false` ends the writing, and this returns
/// `false`).
pub(super) fn push_rows<'r, O>(
    out: &mut O,
    rows: impl IntoIterator<Item = &'r NewOutboxRow>,
    text: fn(&mut O, &str),
    value: fn(&mut O, Value<'r>) -> bool,
) -> bool {
    for (i, row) in rows.into_iter().enumerate() {
        text(out, if i == 0 { "(" } else { ", (" });
        for (j, cell) in cells(row).into_iter().enumerate() {
            if j > 0 {
                text(out, ", ");
            }
            match cell {
                Cell::Own(v) | Cell::Shared(v) | Cell::CreateTime(v) => {
                    if !value(out, v) {
                        return false;
                    }
                }
                Cell::Constant(code) => text(out, &code.to_string()),
            }
        }
        text(out, ")");
    }
    true
}

/// A multi-row INSERT of `rows`.
pub(super) fn insert_statement<'r, DB: Backend>(
    table: &TableName,
    rows: impl IntoIterator<Item = &'r NewOutboxRow>,
) -> Sql<DB> {
    let mut q = Sql::new(format!("INSERT INTO {table} ({INSERT_COLUMNS}) VALUES "));
    push_rows(
        &mut q,
        rows,
        |q, text| {
            q.push(text);
        },
        |q, value| {
            q.bind(value);
            true
        },
    );
    q
}

/// The values a one-row statement binds: the event's own (see [`Cell::Own`]).
pub(crate) const OWN_VALUES: usize = 7;

/// PostgreSQL: a plain INSERT of one row, the values its event type shares written as literals
/// and only the event's own values bound (`$1` to `$7`, `create_time`'s placeholder reused for
/// `update_time`): per commit the server converts and checks seven values instead of sixteen,
/// for one prepared statement per event type. `None` when a shared value has no literal (text
/// holding a NUL).
pub(crate) fn one_row_insert<'r>(
    table: &TableName,
    row: &'r NewOutboxRow,
) -> Option<(String, [Value<'r>; OWN_VALUES])> {
    use std::fmt::Write;
    let mut text = format!("INSERT INTO {table} ({INSERT_COLUMNS}) VALUES (");
    let mut own = [Value::I16(0); OWN_VALUES];
    let mut bound = 0;
    for (j, cell) in cells(row).into_iter().enumerate() {
        if j > 0 {
            text.push_str(", ");
        }
        match cell {
            Cell::Own(v) => {
                *own.get_mut(bound)? = v;
                bound += 1;
                let _ = write!(text, "${bound}");
            }
            Cell::Shared(v) => {
                if !v.push_pg_literal(&mut text) {
                    return None;
                }
            }
            Cell::Constant(code) => {
                let _ = write!(text, "{code}");
            }
            // The placeholder of the value bound last: `create_time`'s.
            Cell::CreateTime(_) => {
                let _ = write!(text, "${bound}");
            }
        }
    }
    text.push(')');
    (bound == OWN_VALUES).then_some((text, own))
}

/// Runs a one-row INSERT from [`one_row_insert`] on `conn`: a duplicate fails it.
pub(crate) async fn insert_one<DB: Backend>(
    conn: &mut DB::Connection,
    statement: String,
    values: &[Value<'_>],
) -> Result<(), sqlx::Error> {
    DB::execute_values(conn, statement, values)
        .await
        .map(|_| ())
}

/// PostgreSQL: a plain INSERT of `rows` with every value a literal (a duplicate fails it).
/// `None` when a value cannot be written as a literal (text holding a NUL), or there are more
/// rows than one statement takes.
pub(crate) fn literal_insert(table: &TableName, rows: &[NewOutboxRow]) -> Option<String> {
    if !fit_one_statement(rows) {
        return None;
    }
    let mut statement = format!("INSERT INTO {table} ({INSERT_COLUMNS}) VALUES ");
    push_rows(&mut statement, rows, String::push_str, |out, value| {
        value.push_pg_literal(out)
    })
    .then_some(statement)
}

/// Whether `rows` go in one INSERT statement.
pub(crate) fn fit_one_statement(rows: &[NewOutboxRow]) -> bool {
    !rows.is_empty() && rows.len() <= ROWS_PER_INSERT
}

/// A plain INSERT of `rows` (see [`fit_one_statement`]), its values bound: a duplicate fails
/// it, which on PostgreSQL aborts the transaction.
pub(crate) async fn insert_plain<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    rows: &[NewOutboxRow],
) -> Result<(), sqlx::Error> {
    insert_statement::<DB>(table, rows)
        .execute(conn)
        .await
        .map(|_| ())
}

/// PostgreSQL: one script that runs `insert` (from [`literal_insert`]), notifies `channel`,
/// commits the transaction it runs in and opens another, empty one, so that sqlx's count of
/// open transactions stays right: the event rows travel with the COMMIT, in one round trip.
/// `None` when the channel's name cannot be written as a literal.
pub(crate) fn insert_and_commit_script(
    mut insert: String,
    channel: Option<&str>,
) -> Option<String> {
    if let Some(channel) = channel {
        insert.push_str("; SELECT pg_notify(");
        if !Value::Str(channel).push_pg_literal(&mut insert) {
            return None;
        }
        insert.push_str(", '')");
    }
    insert.push_str("; COMMIT; BEGIN");
    Some(insert)
}

/// Which of `event_nos` the table holds, read on `conn`.
pub(crate) async fn stored_event_nos<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    event_nos: &[&str],
) -> Result<Vec<String>, sqlx::Error> {
    let mut stored = Vec::new();
    for chunk in event_nos.chunks(ROWS_PER_INSERT) {
        let mut q = Sql::<DB>::new(format!("SELECT event_no FROM {table} WHERE event_no"));
        q.in_strs(chunk);
        for row in q.fetch(&mut *conn).await? {
            stored.push(Columns::<DB>(&row).string("event_no")?);
        }
    }
    Ok(stored)
}

/// Inserts `rows` on `conn`; returns the event numbers written. A row whose event number is
/// already stored is left out and the stored row untouched; a taken aggregate sequence fails the
/// statement (see [`sequence_conflict`]).
pub(crate) async fn insert<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    rows: &[NewOutboxRow],
) -> Result<Vec<String>, sqlx::Error> {
    let mut inserted = Vec::with_capacity(rows.len());
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        let mut chunk: Vec<&NewOutboxRow> = chunk.iter().collect();
        if DB::DIALECT.has_returning() && chunk.len() == 1 {
            // One row (most commands record one event): the count of rows written says whether
            // it was new, and the database returns no row.
            let mut q = insert_statement::<DB>(table, chunk.iter().copied());
            q.push(DB::DIALECT.insert_ignoring_duplicate("event_no", ""));
            if q.execute(conn).await? == 1 {
                inserted.push(chunk[0].event_no.clone());
            }
            continue;
        }
        if DB::DIALECT.has_returning() {
            let mut q = insert_statement::<DB>(table, chunk.iter().copied());
            q.push(DB::DIALECT.insert_ignoring_duplicate("event_no", ""));
            q.push(" RETURNING event_no");
            for row in q.fetch(conn).await? {
                inserted.push(Columns::<DB>(&row).string("event_no")?);
            }
            continue;
        }
        // No RETURNING on MySQL. Duplicates are rare, so a plain INSERT goes first: a duplicate
        // key fails it whole, and MySQL then rolls back that statement only, not the caller's
        // transaction.
        match insert_statement::<DB>(table, chunk.iter().copied())
            .execute(conn)
            .await
        {
            Ok(_) => {
                inserted.extend(chunk.iter().map(|row| row.event_no.clone()));
                continue;
            }
            Err(e) if DB::DIALECT.violated_key(&e).is_none() => return Err(e),
            Err(_) => {}
        }
        // Then find the duplicates and insert the rest with a plain INSERT again, so that a
        // conflict on the aggregate sequence is an error and never silently absorbed.
        let numbers: Vec<&str> = chunk.iter().map(|row| row.event_no.as_str()).collect();
        let existing = stored_event_nos::<DB>(conn, table, &numbers).await?;
        chunk.retain(|row| !existing.contains(&row.event_no));
        if !chunk.is_empty() {
            insert_statement::<DB>(table, chunk.iter().copied())
                .execute(conn)
                .await?;
            inserted.extend(chunk.iter().map(|row| row.event_no.clone()));
        }
    }
    Ok(inserted)
}

/// When `error` is the unique key on the aggregate sequence refusing one of `rows`, the index of
/// that row; `None` for any other error.
///
/// The row is the one whose key the database's error names (PostgreSQL, MySQL); on SQLite, whose
/// error names only the columns, the first row whose sequence is already stored, looked up on
/// `conn` (SQLite rolled back only the statement). A sequence taken twice within `rows` blames
/// its second row.
pub(crate) async fn sequence_conflict<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    rows: &[NewOutboxRow],
    error: &sqlx::Error,
) -> Option<usize> {
    let key = DB::DIALECT.violated_key(error)?;
    if !key.ends_with(SEQUENCE_KEY) {
        return None;
    }
    if let Some(values) = DB::DIALECT.duplicate_values(error) {
        let separator = if DB::DIALECT == Dialect::MySql {
            "-"
        } else {
            ", "
        };
        let named = rows.iter().position(|r| {
            [
                r.aggregate_type.as_str(),
                r.aggregate_id.as_str(),
                &r.aggregate_sequence.to_string(),
            ]
            .join(separator)
                == values
        });
        if named.is_some() {
            return named;
        }
    }
    if DB::DIALECT == Dialect::Sqlite
        && let Ok(Some(taken)) = first_taken::<DB>(conn, table, rows).await
    {
        return Some(taken);
    }
    let within = rows.iter().enumerate().position(|(i, r)| {
        rows[..i].iter().any(|earlier| {
            (
                &earlier.aggregate_type,
                &earlier.aggregate_id,
                earlier.aggregate_sequence,
            ) == (&r.aggregate_type, &r.aggregate_id, r.aggregate_sequence)
        })
    });
    Some(within.unwrap_or(0))
}

/// The index of the first of `rows` whose aggregate sequence is already stored.
pub(super) async fn first_taken<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    rows: &[NewOutboxRow],
) -> Result<Option<usize>, sqlx::Error> {
    for chunk_start in (0..rows.len()).step_by(ROWS_PER_INSERT) {
        let chunk = &rows[chunk_start..rows.len().min(chunk_start + ROWS_PER_INSERT)];
        let mut q = Sql::<DB>::new(format!(
            "SELECT aggregate_type, aggregate_id, aggregate_sequence FROM {table} WHERE "
        ));
        for (i, r) in chunk.iter().enumerate() {
            q.push(if i == 0 { "(" } else { " OR (" })
                .push("aggregate_type = ")
                .bind(&r.aggregate_type)
                .push(" AND aggregate_id = ")
                .bind(&r.aggregate_id)
                .push(" AND aggregate_sequence = ")
                .bind(r.aggregate_sequence)
                .push(")");
        }
        for row in q.fetch(conn).await? {
            let c = Columns::<DB>(&row);
            let taken = (
                c.string("aggregate_type")?,
                c.string("aggregate_id")?,
                c.i64("aggregate_sequence")?,
            );
            if let Some(i) = chunk.iter().position(|r| {
                (&r.aggregate_type, &r.aggregate_id, r.aggregate_sequence)
                    == (&taken.0, &taken.1, taken.2)
            }) {
                return Ok(Some(chunk_start + i));
            }
        }
    }
    Ok(None)
}

/// PostgreSQL: `pg_notify(channel)` in the transaction on `conn`, delivered on commit.
/// Elsewhere nothing.
pub(crate) async fn notify_commit<DB: Backend>(
    conn: &mut DB::Connection,
    channel: &str,
) -> Result<(), sqlx::Error> {
    if DB::DIALECT == Dialect::Postgres {
        let mut q = Sql::<DB>::new("SELECT pg_notify(");
        q.bind(channel).push(", '')");
        q.fetch(conn).await?;
    }
    Ok(())
}

/// The sequence of the aggregate's last recorded event, 0 when it has none.
pub(crate) async fn aggregate_version<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    aggregate_type: &str,
    aggregate_id: &str,
) -> Result<i64, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "SELECT MAX(aggregate_sequence) AS last_sequence FROM {table} WHERE aggregate_type = "
    ));
    q.bind(aggregate_type)
        .push(" AND aggregate_id = ")
        .bind(aggregate_id);
    let rows = q.fetch(conn).await?;
    match rows.first() {
        Some(row) => Ok(Columns::<DB>(row).opt_i64("last_sequence")?.unwrap_or(0)),
        None => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn row() -> NewOutboxRow {
        NewOutboxRow {
            event_no: "ORDER_PAID:o-1".into(),
            aggregate_type: "ORDER".into(),
            aggregate_id: "o-1".into(),
            aggregate_sequence: 2,
            event_type: "ORDER_PAID".into(),
            event_version: 3,
            event_source: "it's".into(),
            publish_channel: "MQ".into(),
            topic: Some("order.event".into()),
            routing_key: None,
            event_payload: serde_json::json!({"amount": 1}),
            event_headers: serde_json::json!({}),
            max_retry_count: 5,
            trace_id: None,
            create_time: Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
        }
    }

    #[test]
    fn a_one_row_insert_binds_the_events_own_values_and_writes_the_shared_ones() {
        let table = TableName::new("biz_outbox_event").unwrap();
        let row = row();
        let (text, values) = one_row_insert(&table, &row).unwrap();
        assert!(
            text.ends_with(
                "VALUES ($1, E'ORDER', $2, $3, E'ORDER_PAID', 3, E'it''s', E'MQ', \
                 E'order.event', NULL, $4, $5, 0, 0, 5, $6, $7, $7)"
            ),
            "{text}"
        );
        assert!(matches!(values[0], Value::Str("ORDER_PAID:o-1")));
        assert!(matches!(values[2], Value::I64(2)));
        assert!(matches!(values[5], Value::OptStr(None)));
        assert!(matches!(values[6], Value::Time(t) if t == row.create_time));

        let mut nul = row.clone();
        nul.event_source = "a\0b".into();
        assert!(one_row_insert(&table, &nul).is_none());
    }
}
