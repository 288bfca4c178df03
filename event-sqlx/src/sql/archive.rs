//! The statements that move final rows of a seed table into its archive table, and purge the
//! archive (seed 000: 归档后再清理, archive first, then delete).

use chrono::{DateTime, Utc};
use sqlx::Pool;

use super::codes;
use super::dialect::{Backend, Columns, Dialect, Sql};
use crate::status::EventStatus;
use crate::table::TableName;

/// One seed table and its archive: which columns to copy and which status column says final.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Archived<'a> {
    pub(crate) live: &'a TableName,
    pub(crate) archive: &'a TableName,
    pub(crate) columns: &'static str,
    pub(crate) status_column: &'static str,
}

/// Final statuses: published (or handled) and cancelled. Nothing else is ever archived.
const FINAL: [EventStatus; 2] = [EventStatus::Succeeded, EventStatus::Cancelled];

/// ` WHERE <final> AND update_time < cutoff`, without the cutoff's bind.
fn final_and_older(t: &Archived<'_>) -> String {
    format!(
        " WHERE {} IN {} AND deleted = 0 AND update_time < ",
        t.status_column,
        codes(&FINAL)
    )
}

/// How many rows an archive run at `cutoff` would move.
pub(crate) async fn archivable<DB: Backend>(
    conn: &mut DB::Connection,
    t: &Archived<'_>,
    cutoff: DateTime<Utc>,
) -> Result<i64, sqlx::Error> {
    let mut q = Sql::<DB>::new(format!("SELECT COUNT(*) AS n FROM {}", t.live));
    q.push(final_and_older(t)).bind(cutoff);
    match q.fetch(conn).await?.first() {
        Some(row) => Columns::<DB>(row).i64("n"),
        None => Ok(0),
    }
}

/// Moves up to `limit` final rows older than `cutoff` into the archive, in one transaction:
/// copy, then delete the same ids. A copy that is already there (a run that died after its copy
/// committed elsewhere) is left as it is, so a run can always be repeated. Returns how many rows
/// were picked and how many left the live table.
pub(crate) async fn archive_batch<DB: Backend>(
    pool: &Pool<DB>,
    t: &Archived<'_>,
    cutoff: DateTime<Utc>,
    limit: i64,
) -> Result<(usize, u64), sqlx::Error> {
    let mut tx = match DB::DIALECT.begin_writing() {
        Some(begin) => pool.begin_with(begin).await?,
        None => pool.begin().await?,
    };
    if let Some(set) = DB::DIALECT.plan_for_values() {
        Sql::<DB>::new(set).execute(&mut tx).await?;
    }
    // Oldest first, one final status at a time, in the order of the (status, update_time)
    // index: each batch reads only the rows it moves, however large the history.
    let mut ids: Vec<i64> = Vec::new();
    for status in FINAL {
        let room = limit - i64::try_from(ids.len()).unwrap_or(i64::MAX);
        if room <= 0 {
            break;
        }
        let mut q = Sql::<DB>::new(format!(
            "SELECT id FROM {} WHERE {} = {} AND deleted = 0 AND update_time < ",
            t.live,
            t.status_column,
            status.code()
        ));
        q.bind(cutoff)
            .push(" ORDER BY update_time LIMIT ")
            .bind(room);
        for row in q.fetch(&mut tx).await? {
            ids.push(Columns::<DB>(&row).id("id")?);
        }
    }
    if ids.is_empty() {
        tx.rollback().await?;
        return Ok((0, 0));
    }
    let mut copy = Sql::<DB>::new(format!(
        "INSERT INTO {} ({}) SELECT {} FROM {} WHERE {} IN {} AND id IN ",
        t.archive,
        t.columns,
        t.columns,
        t.live,
        t.status_column,
        codes(&FINAL)
    ));
    copy.list(ids.iter().copied());
    copy.push(match DB::DIALECT {
        Dialect::MySql => format!(" ON DUPLICATE KEY UPDATE {0}.id = {0}.id", t.archive),
        Dialect::Postgres | Dialect::Sqlite => " ON CONFLICT (id) DO NOTHING".to_owned(),
    });
    copy.execute(&mut tx).await?;
    // Only rows now in the archive leave: a row that is not final any more stays.
    let mut delete = Sql::<DB>::new(format!(
        "DELETE FROM {} WHERE {} IN {} AND id IN ",
        t.live,
        t.status_column,
        codes(&FINAL)
    ));
    delete.list(ids.iter().copied());
    delete.push(format!(
        " AND id IN (SELECT id FROM {} WHERE id IN ",
        t.archive
    ));
    delete.list(ids.iter().copied()).push(")");
    let moved = delete.execute(&mut tx).await?;
    tx.commit().await?;
    Ok((ids.len(), moved))
}

/// Deletes up to `limit` archived rows last updated before `cutoff`.
pub(crate) async fn purge_batch<DB: Backend>(
    conn: &mut DB::Connection,
    archive: &TableName,
    cutoff: DateTime<Utc>,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let (head, tail) = DB::DIALECT.limited_delete(archive.as_str());
    let mut q = Sql::<DB>::new(head);
    q.push("update_time < ")
        .bind(cutoff)
        .push(" LIMIT ")
        .bind(limit)
        .push(tail);
    q.execute(conn).await
}
