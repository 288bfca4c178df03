//! Archive and retention (seed 000: 归档后再清理, archive first, then delete): final rows older than
//! a retention move, batch by batch, from a seed table to its archive table, so that the online
//! tables stay small; the archive is purged after a longer retention.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Pool;

use crate::error::Error;
use crate::sql::archive::{self as sql, Archived};
use crate::sql::dialect::Backend;
use crate::sql::retry_transient;

/// What an archive run did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveReport {
    /// The live table.
    pub table: String,
    /// The archive table.
    pub archive: String,
    /// Rows moved to the archive.
    pub moved: u64,
    /// Transactions, one per batch.
    pub batches: u64,
    /// Rows last updated before this were moved.
    pub cutoff: DateTime<Utc>,
}

/// Moves every final row older than `cutoff`, `batch` rows per transaction, calling `progress`
/// with the rows moved so far after each batch. A batch whose connection drops is tried again
/// on a fresh one for up to 30 s: it committed whole or not at all.
///
/// After each batch it pauses, so that live relays beside it keep most of their rate (measured
/// in the archive benchmark): retention is background work. See [`Pacer`].
pub(crate) async fn run<DB: Backend>(
    pool: &Pool<DB>,
    table: Archived<'_>,
    cutoff: DateTime<Utc>,
    batch: u32,
    mut progress: impl FnMut(u64),
) -> Result<ArchiveReport, Error> {
    let limit = i64::from(batch.clamp(1, 10_000));
    let mut report = ArchiveReport {
        table: table.live.to_string(),
        archive: table.archive.to_string(),
        moved: 0,
        batches: 0,
        cutoff,
    };
    let mut pacer = Pacer::default();
    loop {
        let started = tokio::time::Instant::now();
        let deadline = started + Duration::from_secs(30);
        let (picked, moved) = retry_transient(
            || sql::archive_batch::<DB>(pool, &table, cutoff, limit),
            Some(deadline),
        )
        .await
        .map_err(|e| Error::database(table.live, e))?;
        if picked == 0 {
            return Ok(report);
        }
        report.moved += moved;
        report.batches += 1;
        progress(report.moved);
        if i64::try_from(picked).unwrap_or(i64::MAX) < limit {
            return Ok(report);
        }
        tokio::time::sleep(pacer.pause(started.elapsed(), picked)).await;
    }
}

/// The longest rest between two batches.
const MAX_REST: Duration = Duration::from_secs(5);

/// How long the archiver rests after a batch. A batch that took longer per row than the
/// fastest one so far met other work in the database (relays, commands, a lock held by a
/// writer): the archiver then rests three times the excess, giving that work the database. It
/// always rests a quarter of the batch's time, so that writers waiting for a lock (SQLite has
/// one writer) get their turn even before the archiver notices them.
///
/// A rest never exceeds [`MAX_REST`], so a batch that waited long on a lock does not stall the
/// run for minutes.
#[derive(Debug, Default)]
struct Pacer {
    fastest_per_row: Option<Duration>,
}

impl Pacer {
    fn pause(&mut self, took: Duration, rows: usize) -> Duration {
        let rows = u32::try_from(rows.max(1)).unwrap_or(u32::MAX);
        let per_row = took / rows;
        let fastest = self.fastest_per_row.map_or(per_row, |f| f.min(per_row));
        self.fastest_per_row = Some(fastest);
        let excess = took.saturating_sub(fastest * rows);
        (took / 4 + excess * 3).min(MAX_REST)
    }
}

/// How many rows an archive run at `cutoff` would move.
pub(crate) async fn archivable<DB: Backend>(
    pool: &Pool<DB>,
    table: Archived<'_>,
    cutoff: DateTime<Utc>,
) -> Result<u64, Error> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| Error::database(table.live, e))?;
    let count = sql::archivable::<DB>(&mut conn, &table, cutoff)
        .await
        .map_err(|e| Error::database(table.live, e))?;
    Ok(u64::try_from(count).unwrap_or(0))
}

/// Deletes archived rows last updated before `cutoff`, `batch` at a time; returns how many.
pub(crate) async fn purge<DB: Backend>(
    pool: &Pool<DB>,
    archive: &crate::table::TableName,
    cutoff: DateTime<Utc>,
    batch: u32,
) -> Result<u64, Error> {
    let limit = i64::from(batch.clamp(1, 10_000));
    crate::sql::delete_in_batches(pool, limit, async |conn, limit| {
        sql::purge_batch::<DB>(conn, archive, cutoff, limit).await
    })
    .await
    .map_err(|e| Error::database(archive, e))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Pacer;

    #[test]
    fn the_archiver_rests_more_when_its_batches_slow_down() {
        let mut pacer = Pacer::default();
        let ms = Duration::from_millis;
        // Alone: a quarter of the batch's time.
        assert_eq!(pacer.pause(ms(100), 1000), ms(25));
        assert_eq!(pacer.pause(ms(100), 1000), ms(25));
        // Half again as slow: others are busy; it rests three times the 50 ms excess on top.
        assert_eq!(
            pacer.pause(ms(150), 1000),
            ms(37) + Duration::from_micros(500) + ms(150)
        );
        // A faster batch becomes the new measure.
        assert_eq!(pacer.pause(ms(40), 500), ms(10));
        assert_eq!(pacer.pause(ms(100), 1000), ms(25) + ms(60));
        // A batch that waited a minute on a lock: the rest is capped.
        assert_eq!(pacer.pause(ms(60_000), 1000), super::MAX_REST);
    }
}
