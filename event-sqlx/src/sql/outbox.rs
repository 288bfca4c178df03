//! The statements of the outbox table (`biz_outbox_event`): the flush, the relay's claim and
//! marks, and the seed's queries.

use chrono::{DateTime, Utc};
use sqlx::Pool;

use super::dialect::{Backend, Columns, Dialect, Sql, Value};
use super::{CANCELLED, FAILED, IN_PROGRESS, PENDING, SUCCEEDED, codes};
use crate::row::outbox::{Lease, NewOutboxRow, OutboxRecord};
use crate::status::EventStatus::{Failed, InProgress, Pending};
use crate::table::TableName;

/// Every column, in the order rows are decoded.
pub(crate) const COLUMNS: &str = "id, event_no, aggregate_type, aggregate_id, aggregate_sequence, \
    event_type, event_version, event_source, publish_channel, topic, routing_key, event_payload, \
    event_headers, publish_status, retry_count, max_retry_count, next_retry_time, locked_by, \
    lock_until, last_publish_time, published_time, fail_reason, trace_id, remark, version, \
    create_time, update_time";

/// The columns a flush writes.
const INSERT_COLUMNS: &str = "event_no, aggregate_type, aggregate_id, \
    aggregate_sequence, event_type, event_version, event_source, publish_channel, topic, \
    routing_key, event_payload, event_headers, publish_status, retry_count, max_retry_count, \
    trace_id, create_time, update_time";

/// Statements are kept well under every backend's bind-parameter limit (SQLite: 32766).
const ROWS_PER_INSERT: usize = 500;

/// The name the migrations give the unique key on `(aggregate_type, aggregate_id,
/// aggregate_sequence)` ends with this (`outbox_uk_aggregate_sequence` on PostgreSQL and SQLite,
/// `uk_aggregate_sequence` on MySQL).
const SEQUENCE_KEY: &str = "uk_aggregate_sequence";

/// What makes a row claimable (`o` is the row): pending, or failed with retries left. The first
/// two terms are the predicate of the partial index `outbox_idx_claimable`.
fn claimable() -> String {
    format!(
        "o.publish_status IN {} AND o.deleted = 0 \
         AND (o.publish_status = {PENDING} OR o.retry_count < o.max_retry_count)",
        codes(&[Pending, Failed])
    )
}

/// Per-aggregate order: no earlier event of the same aggregate is still unpublished. The status
/// list is the predicate of the partial index `outbox_idx_unpublished_aggregate`.
fn no_earlier_unpublished(table: &TableName) -> String {
    format!(
        " AND NOT EXISTS (SELECT 1 FROM {table} p \
         WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id \
         AND p.aggregate_sequence < o.aggregate_sequence AND p.publish_status IN {} \
         AND p.deleted = 0)",
        codes(&[Pending, InProgress, Failed])
    )
}

/// A claim of a batch under a lease.
#[derive(Debug, Clone)]
pub(crate) struct Claim<'a> {
    pub(crate) relay_id: &'a str,
    pub(crate) now: DateTime<Utc>,
    pub(crate) lease_until: DateTime<Utc>,
    pub(crate) limit: i64,
    pub(crate) ordered: bool,
}

/// A failed publish to record.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) id: i64,
    pub(crate) next_retry_time: DateTime<Utc>,
    pub(crate) reason: String,
}

/// The read queries of the seed's Outbox model.
#[derive(Debug, Clone)]
pub(crate) enum Select<'a> {
    Pending {
        limit: i64,
    },
    DueRetries {
        now: DateTime<Utc>,
        limit: i64,
    },
    LeaseExpired {
        now: DateTime<Utc>,
        limit: i64,
    },
    ByAggregate {
        aggregate_type: &'a str,
        aggregate_id: &'a str,
    },
    ByEventNo {
        event_no: &'a str,
    },
    FailedByTopic {
        topic: &'a str,
        limit: i64,
    },
    ManyFailures {
        min_retries: i32,
        limit: i64,
    },
    /// The earliest unpublished, unclaimed event of an aggregate (its head).
    Head {
        aggregate_type: &'a str,
        aggregate_id: &'a str,
    },
    /// Published events matching a replay filter, by id after `after_id`.
    /// These rows, whatever their state.
    ByIds {
        ids: &'a [i64],
    },
    Published {
        aggregate: Option<(&'a str, &'a str)>,
        event_type: Option<&'a str>,
        from: Option<DateTime<Utc>>,
        to: Option<DateTime<Utc>>,
        after_id: i64,
        limit: i64,
    },
}

pub(crate) fn decode<DB: Backend>(row: &DB::Row) -> Result<OutboxRecord, sqlx::Error> {
    let c = Columns::<DB>(row);
    Ok(OutboxRecord {
        id: c.id("id")?,
        event_no: c.string("event_no")?,
        aggregate_type: c.string("aggregate_type")?,
        aggregate_id: c.string("aggregate_id")?,
        aggregate_sequence: c.i64("aggregate_sequence")?,
        event_type: c.string("event_type")?,
        event_version: c.i32("event_version")?,
        event_source: c.string("event_source")?,
        publish_channel: c.string("publish_channel")?,
        topic: c.opt_string("topic")?,
        routing_key: c.opt_string("routing_key")?,
        event_payload: c.json("event_payload")?,
        event_headers: c.opt_json("event_headers")?,
        publish_status: c.status("publish_status")?,
        retry_count: c.i32("retry_count")?,
        max_retry_count: c.i32("max_retry_count")?,
        next_retry_time: c.opt_time("next_retry_time")?,
        locked_by: c.opt_string("locked_by")?,
        lock_until: c.opt_time("lock_until")?,
        last_publish_time: c.opt_time("last_publish_time")?,
        published_time: c.opt_time("published_time")?,
        fail_reason: c.opt_string("fail_reason")?,
        trace_id: c.opt_string("trace_id")?,
        remark: c.opt_string("remark")?,
        version: c.i32("version")?,
        create_time: c.time("create_time")?,
        update_time: c.time("update_time")?,
    })
}

fn decode_all<DB: Backend>(rows: &[DB::Row]) -> Result<Vec<OutboxRecord>, sqlx::Error> {
    rows.iter().map(decode::<DB>).collect()
}

/// One value of a new row.
enum Cell<'a> {
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
fn cells(row: &NewOutboxRow) -> [Cell<'_>; 18] {
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
fn push_rows<'r, O>(
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
fn insert_statement<'r, DB: Backend>(
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
async fn first_taken<DB: Backend>(
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

/// ` FROM ... WHERE ...`: the rows a claim at `now` may take.
fn due_candidates<DB: Backend>(
    q: &mut Sql<DB>,
    table: &TableName,
    now: DateTime<Utc>,
    ordered: bool,
) {
    q.push(format!(" FROM {table} o WHERE {}", claimable()));
    q.push(" AND (o.next_retry_time IS NULL OR o.next_retry_time <= ")
        .bind(now)
        .push(")");
    if ordered {
        q.push(no_earlier_unpublished(table));
    }
}

/// Whether a drain by `relay_id` must go on: a row is claimable at `now` (read without locks, so
/// rows another relay is claiming in a transaction not yet committed count), or another relay
/// holds a lease that has not expired (the rows after its own come free when it finishes).
/// Both are read in one statement, so that no claim or mark of another relay can fall between
/// the two.
pub(crate) async fn work_remains<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    now: DateTime<Utc>,
    ordered: bool,
    relay_id: &str,
) -> Result<bool, sqlx::Error> {
    let mut q = Sql::<DB>::new(DB::DIALECT.select_one_where());
    q.push("EXISTS (SELECT 1");
    due_candidates(&mut q, table, now, ordered);
    q.push(format!(
        ") OR EXISTS (SELECT 1 FROM {table} l WHERE l.publish_status = {IN_PROGRESS} \
         AND l.deleted = 0 AND l.lock_until > "
    ))
    .bind(now)
    .push(" AND l.locked_by <> ")
    .bind(relay_id)
    .push(")");
    Ok(!q.fetch(conn).await?.is_empty())
}

/// Leases up to `claim.limit` due events to `claim.relay_id`, in one short transaction, and
/// returns them by id.
pub(crate) async fn claim<DB: Backend>(
    pool: &Pool<DB>,
    table: &TableName,
    claim: &Claim<'_>,
) -> Result<Vec<OutboxRecord>, sqlx::Error> {
    let candidates = |q: &mut Sql<DB>| {
        due_candidates(q, table, claim.now, claim.ordered);
        q.push(DB::DIALECT.claim_order());
        q.push(" LIMIT ").bind(claim.limit);
    };
    let set_claimed = |q: &mut Sql<DB>| {
        q.push(format!(
            "UPDATE {table} SET publish_status = {IN_PROGRESS}, locked_by = "
        ));
        q.bind(claim.relay_id)
            .push(", lock_until = ")
            .bind(claim.lease_until)
            .push(", last_publish_time = ")
            .bind(claim.now)
            .push(", version = version + 1, update_time = ")
            .bind(claim.now);
    };
    // Only rows still pending or failed are leased, whoever picked them.
    let guard = format!(
        " WHERE {} IN {} AND ",
        DB::DIALECT.status_guard("publish_status"),
        codes(&[Pending, Failed])
    );
    let mut records = if DB::DIALECT.has_returning() {
        // One statement: pick and lease the batch, return the rows. The batch is picked once,
        // whatever the planner believes of the backlog (see Dialect::claimed_ids).
        let mut q = Sql::<DB>::new("");
        set_claimed(&mut q);
        let (open, close) = DB::DIALECT.claimed_ids();
        q.push(&guard).push(open).push("SELECT o.id");
        candidates(&mut q);
        q.push(DB::DIALECT.skip_locked());
        q.push(format!("{close} RETURNING {COLUMNS}"));
        let mut conn = pool.acquire().await?;
        decode_all::<DB>(&q.fetch(&mut conn).await?)?
    } else {
        // SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE, in one short transaction; the rows are
        // patched in memory, not read again.
        let mut tx = pool.begin().await?;
        let mut q = Sql::<DB>::new(format!("SELECT {COLUMNS}"));
        candidates(&mut q);
        q.push(DB::DIALECT.skip_locked());
        let mut records = decode_all::<DB>(&q.fetch(&mut tx).await?)?;
        if !records.is_empty() {
            let mut q = Sql::<DB>::new("");
            set_claimed(&mut q);
            q.push(&guard)
                .push("id IN ")
                .list(records.iter().map(|r| r.id));
            q.execute(&mut tx).await?;
            for record in &mut records {
                record.publish_status = InProgress;
                record.locked_by = Some(claim.relay_id.to_owned());
                record.lock_until = Some(claim.lease_until);
                record.last_publish_time = Some(claim.now);
                record.version += 1;
                record.update_time = claim.now;
            }
        }
        tx.commit().await?;
        records
    };
    records.sort_by_key(|r| r.id);
    Ok(records)
}

/// ` WHERE ...`: the rows of `ids` that `relay_id` still holds in progress.
fn held_by<DB: Backend>(q: &mut Sql<DB>, relay_id: &str, ids: &[i64]) {
    q.push(format!(
        " WHERE deleted = 0 AND {} = {IN_PROGRESS} AND locked_by = ",
        DB::DIALECT.status_guard("publish_status")
    ))
    .bind(relay_id)
    .push(" AND id IN ")
    .list(ids.iter().copied());
}

/// In progress -> succeeded, for the rows `relay_id` still holds.
pub(crate) async fn mark_published<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    relay_id: &str,
    ids: &[i64],
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let mut q = Sql::<DB>::new(format!(
        "UPDATE {table} SET publish_status = {SUCCEEDED}, published_time = "
    ));
    q.bind(now)
        .push(", fail_reason = NULL, locked_by = NULL, lock_until = NULL, update_time = ")
        .bind(now);
    held_by(&mut q, relay_id, ids);
    q.execute(conn).await
}

/// How many of `ids` are published with `published_time` = `at`: those a mark at `at` wrote,
/// when its answer was lost and it ran again (and so found them no longer held).
pub(crate) async fn count_published_at<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    ids: &[i64],
    at: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let mut q = Sql::<DB>::new(format!(
        "SELECT COUNT(*) AS marked FROM {table} WHERE publish_status = {SUCCEEDED} AND published_time = "
    ));
    q.bind(at).push(" AND id IN ").list(ids.iter().copied());
    match q.fetch(conn).await?.first() {
        Some(row) => Ok(u64::try_from(Columns::<DB>(row).i64("marked")?).unwrap_or(0)),
        None => Ok(0),
    }
}

/// In progress -> failed, for the rows `relay_id` still holds: the seed's write for a whole
/// batch, each row with its own next retry time and reason through CASE. Rows already at their
/// retry limit stay failed without counting further (the second pass).
pub(crate) async fn mark_failed<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    relay_id: &str,
    failures: &[Failure],
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    if failures.is_empty() {
        return Ok(0);
    }
    let mut affected = 0;
    for with_retries_left in [true, false] {
        let mut q = Sql::<DB>::new(format!("UPDATE {table} SET publish_status = {FAILED}"));
        if with_retries_left {
            q.push(", retry_count = retry_count + 1");
        }
        q.push(", next_retry_time = CASE id");
        for f in failures {
            q.push(" WHEN ")
                .bind(f.id)
                .push(" THEN ")
                .bind(f.next_retry_time);
        }
        q.push(" END, fail_reason = CASE id");
        for f in failures {
            q.push(" WHEN ")
                .bind(f.id)
                .push(" THEN ")
                .bind(f.reason.as_str());
        }
        q.push(" END, locked_by = NULL, lock_until = NULL, update_time = ")
            .bind(now)
            .push(format!(
                " WHERE deleted = 0 AND {} = {IN_PROGRESS} AND locked_by = ",
                DB::DIALECT.status_guard("publish_status")
            ))
            .bind(relay_id)
            .push(if with_retries_left {
                " AND retry_count < max_retry_count"
            } else {
                " AND retry_count >= max_retry_count"
            })
            .push(" AND id IN ")
            .list(failures.iter().map(|f| f.id));
        affected += q.execute(conn).await?;
    }
    Ok(affected)
}

/// In progress -> what it was before the claim, for the rows `relay_id` still holds: pending
/// when it had never failed, failed otherwise, with its retry count and next retry time
/// unchanged. For a batch the broker never answered for: not an attempt of these events.
/// `reason` is kept in `fail_reason`, so that operators see why they wait.
pub(crate) async fn release<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    relay_id: &str,
    ids: &[i64],
    reason: &str,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let mut q = Sql::<DB>::new(format!(
        "UPDATE {table} SET publish_status = CASE WHEN retry_count > 0 THEN {FAILED} \
         ELSE {PENDING} END, fail_reason = "
    ));
    q.bind(reason)
        .push(", locked_by = NULL, lock_until = NULL, update_time = ")
        .bind(now);
    held_by(&mut q, relay_id, ids);
    q.execute(conn).await
}

/// Moves the lease of the rows `relay_id` still holds to `until`: the heartbeat of a batch in
/// flight. Returns how many it still held.
pub(crate) async fn renew_leases<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    relay_id: &str,
    ids: &[i64],
    until: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let mut q = Sql::<DB>::new(format!("UPDATE {table} SET lock_until = "));
    q.bind(until);
    held_by(&mut q, relay_id, ids);
    q.execute(conn).await
}

/// Failed with no retries left -> cancelled.
pub(crate) async fn cancel_exhausted<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    ids: &[i64],
    reason: &str,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let mut q = Sql::<DB>::new(format!(
        "UPDATE {table} SET publish_status = {CANCELLED}, fail_reason = "
    ));
    q.bind(reason)
        .push(", update_time = ")
        .bind(now)
        .push(format!(
            " WHERE deleted = 0 AND {} = {FAILED} \
             AND retry_count >= max_retry_count AND id IN ",
            DB::DIALECT.status_guard("publish_status")
        ))
        .list(ids.iter().copied());
    q.execute(conn).await
}

/// In progress with an expired lease -> failed, due at `retry_at`.
pub(crate) async fn recover_expired<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    now: DateTime<Utc>,
    retry_at: DateTime<Utc>,
    reason: &str,
) -> Result<u64, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "UPDATE {table} SET publish_status = {FAILED}, retry_count = retry_count + 1, \
         next_retry_time = "
    ));
    q.bind(retry_at)
        .push(", fail_reason = ")
        .bind(reason)
        .push(", locked_by = NULL, lock_until = NULL, update_time = ")
        .bind(now)
        .push(format!(
            " WHERE deleted = 0 AND publish_status = {IN_PROGRESS} AND lock_until <= "
        ))
        .bind(now);
    q.execute(conn).await
}

/// Pending or failed -> cancelled, for one row.
pub(crate) async fn cancel<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    id: i64,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "UPDATE {table} SET publish_status = {CANCELLED}, fail_reason = "
    ));
    q.bind(reason)
        .push(", locked_by = NULL, lock_until = NULL, update_time = ")
        .bind(now)
        .push(" WHERE id = ")
        .bind(id)
        .push(format!(
            " AND deleted = 0 AND publish_status IN {}",
            codes(&[Pending, Failed])
        ));
    q.execute(conn).await
}

/// Failed -> pending: one more round of attempts, due now.
pub(crate) async fn retry<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    id: i64,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "UPDATE {table} SET publish_status = {PENDING}, next_retry_time = NULL, update_time = "
    ));
    q.bind(now)
        .push(" WHERE id = ")
        .bind(id)
        .push(format!(" AND deleted = 0 AND publish_status = {FAILED}"));
    q.execute(conn).await
}

/// One of the seed's read queries.
pub(crate) async fn select<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    select: &Select<'_>,
) -> Result<Vec<OutboxRecord>, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "SELECT {COLUMNS} FROM {table} WHERE deleted = 0 AND "
    ));
    match *select {
        Select::Pending { limit } => {
            q.push(format!(
                "publish_status = {PENDING} ORDER BY create_time ASC, id ASC LIMIT "
            ))
            .bind(limit);
        }
        Select::DueRetries { now, limit } => {
            q.push(format!(
                "publish_status = {FAILED} AND retry_count < max_retry_count AND next_retry_time <= "
            ))
            .bind(now)
            .push(" ORDER BY next_retry_time ASC LIMIT ")
            .bind(limit);
        }
        Select::LeaseExpired { now, limit } => {
            q.push(format!("publish_status = {IN_PROGRESS} AND lock_until <= "))
                .bind(now)
                .push(" ORDER BY lock_until ASC LIMIT ")
                .bind(limit);
        }
        Select::ByAggregate {
            aggregate_type,
            aggregate_id,
        } => {
            q.push("aggregate_type = ")
                .bind(aggregate_type)
                .push(" AND aggregate_id = ")
                .bind(aggregate_id)
                .push(" ORDER BY aggregate_sequence ASC");
        }
        Select::ByEventNo { event_no } => {
            // Cancelled and deleted rows are found by number too: an operator looks them up.
            q = Sql::new(format!("SELECT {COLUMNS} FROM {table} WHERE event_no = "));
            q.bind(event_no);
        }
        Select::ByIds { ids } => {
            q = Sql::new(format!("SELECT {COLUMNS} FROM {table} WHERE id IN "));
            q.list(ids.iter().copied()).push(" ORDER BY id ASC");
        }
        Select::FailedByTopic { topic, limit } => {
            q.push("topic = ")
                .bind(topic)
                .push(format!(
                    " AND publish_status = {FAILED} ORDER BY update_time DESC LIMIT "
                ))
                .bind(limit);
        }
        Select::ManyFailures { min_retries, limit } => {
            q.push(format!("publish_status = {FAILED} AND retry_count >= "))
                .bind(min_retries)
                .push(" ORDER BY update_time DESC LIMIT ")
                .bind(limit);
        }
        Select::Published {
            aggregate,
            event_type,
            from,
            to,
            after_id,
            limit,
        } => {
            q.push(format!("publish_status = {SUCCEEDED} AND id > "))
                .bind(after_id);
            if let Some((aggregate_type, aggregate_id)) = aggregate {
                q.push(" AND aggregate_type = ")
                    .bind(aggregate_type)
                    .push(" AND aggregate_id = ")
                    .bind(aggregate_id);
            }
            if let Some(event_type) = event_type {
                q.push(" AND event_type = ").bind(event_type);
            }
            if let Some(from) = from {
                q.push(" AND create_time >= ").bind(from);
            }
            if let Some(to) = to {
                q.push(" AND create_time < ").bind(to);
            }
            q.push(" ORDER BY id ASC LIMIT ").bind(limit);
        }
        Select::Head {
            aggregate_type,
            aggregate_id,
        } => {
            q.push(format!(
                "publish_status IN {} AND aggregate_type = ",
                codes(&[Pending, Failed])
            ))
            .bind(aggregate_type)
            .push(" AND aggregate_id = ")
            .bind(aggregate_id)
            .push(" ORDER BY aggregate_sequence ASC LIMIT 1");
        }
    }
    decode_all::<DB>(&q.fetch(conn).await?)
}

/// The leases held, per relay.
pub(crate) async fn leases<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
) -> Result<Vec<Lease>, sqlx::Error> {
    let q = Sql::<DB>::new(format!(
        "SELECT COALESCE(locked_by, '') AS relay, COUNT(*) AS events, \
         MIN(lock_until) AS earliest, MAX(lock_until) AS latest FROM {table} \
         WHERE deleted = 0 AND publish_status = {IN_PROGRESS} \
         GROUP BY COALESCE(locked_by, '') ORDER BY relay"
    ));
    let mut leases = Vec::new();
    for row in q.fetch(conn).await? {
        let c = Columns::<DB>(&row);
        let (Some(earliest), Some(latest)) = (c.opt_time("earliest")?, c.opt_time("latest")?)
        else {
            continue;
        };
        leases.push(Lease {
            relay: c.string("relay")?,
            events: c.i64("events")?,
            earliest_expiry: earliest,
            latest_expiry: latest,
        });
    }
    Ok(leases)
}

/// Refreshes the planner's statistics of `table` (see [`Dialect::analyze`]).
pub(crate) async fn analyze<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
) -> Result<(), sqlx::Error> {
    if let Some(statement) = DB::DIALECT.analyze(table.as_str()) {
        Sql::<DB>::new(statement).fetch(conn).await?;
    }
    Ok(())
}

/// Whether `table`'s statistics are missing or stale (see [`Dialect::stale_statistics`]): never
/// taken, or more than 10,000 rows changed since they were taken. The claim's plan depends on how
/// many rows are unpublished, which is small next to the table: a backlog of 50,000 beside a
/// larger history is stale for the claim long before it is for autovacuum (10% of the table).
pub(crate) async fn stale_statistics<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
) -> Result<bool, sqlx::Error> {
    let Some(query) = DB::DIALECT.stale_statistics() else {
        return Ok(false);
    };
    let mut q = Sql::<DB>::new(query);
    q.bind(table.as_str()).push(
        ") AND ((last_analyze IS NULL AND last_autoanalyze IS NULL) \
         OR n_mod_since_analyze > 10000)",
    );
    Ok(!q.fetch(conn).await?.is_empty())
}

/// The rows the health of the outbox is read from: pending, failed and expired-lease counts, each
/// answered from the status indexes, and the oldest pending row's creation time.
pub(crate) async fn health<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    now: DateTime<Utc>,
) -> Result<(i64, i64, i64, Option<DateTime<Utc>>), sqlx::Error> {
    let mut counts = [0_i64; 2];
    for (slot, status) in [(0, PENDING), (1, FAILED)] {
        let q = Sql::<DB>::new(format!(
            "SELECT COUNT(*) AS n FROM {table} WHERE publish_status = {status} AND deleted = 0"
        ));
        if let Some(row) = q.fetch(conn).await?.first() {
            counts[slot] = Columns::<DB>(row).i64("n")?;
        }
    }
    let mut q = Sql::<DB>::new(format!(
        "SELECT COUNT(*) AS n FROM {table} WHERE publish_status = {IN_PROGRESS} AND deleted = 0 \
         AND lock_until <= "
    ));
    q.bind(now);
    let expired = match q.fetch(conn).await?.first() {
        Some(row) => Columns::<DB>(row).i64("n")?,
        None => 0,
    };
    let q = Sql::<DB>::new(format!(
        "SELECT MIN(create_time) AS oldest FROM {table} WHERE publish_status = {PENDING} \
         AND deleted = 0"
    ));
    let oldest = match q.fetch(conn).await?.first() {
        Some(row) => Columns::<DB>(row).opt_time("oldest")?,
        None => None,
    };
    Ok((counts[0], counts[1], expired, oldest))
}

/// A published event as reconciliation reads it: the key columns, not the payload.
#[derive(Debug, Clone)]
pub(crate) struct PublishedKey {
    pub(crate) id: i64,
    pub(crate) event_no: String,
    pub(crate) event_type: String,
    pub(crate) published_time: Option<DateTime<Utc>>,
}

/// A keyset page of published events created in `[from, to)`, of `event_types` when not
/// empty, by id after `after_id`.
pub(crate) async fn published_keys<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    event_types: &[String],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    after_id: i64,
    limit: i64,
) -> Result<Vec<PublishedKey>, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!(
        "SELECT id, event_no, event_type, published_time FROM {table} \
         WHERE publish_status = {SUCCEEDED} AND id > "
    ));
    q.bind(after_id)
        .push(" AND create_time >= ")
        .bind(from)
        .push(" AND create_time < ")
        .bind(to);
    if !event_types.is_empty() {
        q.push(" AND event_type IN ")
            .list(event_types.iter().map(String::as_str));
    }
    q.push(" ORDER BY id ASC LIMIT ").bind(limit);
    q.fetch(conn)
        .await?
        .iter()
        .map(|row| {
            let c = Columns::<DB>(row);
            Ok(PublishedKey {
                id: c.id("id")?,
                event_no: c.string("event_no")?,
                event_type: c.string("event_type")?,
                published_time: c.opt_time("published_time")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

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
