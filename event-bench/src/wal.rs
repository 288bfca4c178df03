//! PostgreSQL's write-ahead log during a run: bytes per event, from the log's insert position,
//! and flushes and full-page images per 1,000 events, from the server's `pg_stat_wal`
//! (PostgreSQL 14 and later). Every row, index entry and commit an event causes (the
//! producer's INSERT, the relay's claim and mark, the consumer's inbox row and effect) is written
//! to the log first, and every commit that waits for the disk waits for a flush of it, so the
//! log's bytes per event count the writes per event more steadily than any rate on a shared
//! machine. The view counts the whole server, like `cpu` counts whole processes: run the harness
//! on a server nothing else writes to.

use serde::Serialize;
use sqlx::PgPool;

/// The server's write-ahead log counters at one moment.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub(crate) struct Snapshot {
    bytes: f64,
    flushes: f64,
    full_page_images: f64,
}

impl Snapshot {
    /// The counters now, or `None` where the server has no `pg_stat_wal` (before PostgreSQL 14)
    /// or does not answer: the figures are then left out of the results, not guessed.
    pub(crate) async fn take(pool: &PgPool) -> Option<Snapshot> {
        // The log's insert position is exact at once; the view's counters are reported by each
        // server process at most once a second, so over a run of a few seconds they lag by
        // about as much at both ends.
        sqlx::query_as::<_, Snapshot>(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8 AS bytes, \
             wal_sync::float8 AS flushes, wal_fpi::float8 AS full_page_images FROM pg_stat_wal",
        )
        .fetch_one(pool)
        .await
        .ok()
    }

    /// What the log took per event, of `events`, since `earlier`.
    pub(crate) fn per_event_since(&self, earlier: &Snapshot, events: usize) -> PerEvent {
        let events = events.max(1) as f64;
        let grew = |now: f64, then: f64| (now - then).max(0.0);
        PerEvent {
            bytes: grew(self.bytes, earlier.bytes) / events,
            flushes_per_1000: grew(self.flushes, earlier.flushes) * 1000.0 / events,
            full_page_images_per_1000: grew(self.full_page_images, earlier.full_page_images)
                * 1000.0
                / events,
        }
    }
}

/// [`Snapshot::per_event_since`] when both snapshots were taken.
pub(crate) fn per_event(
    earlier: Option<Snapshot>,
    now: Option<Snapshot>,
    events: usize,
) -> Option<PerEvent> {
    Some(now?.per_event_since(&earlier?, events))
}

/// The write-ahead log per event.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PerEvent {
    /// Bytes written to the log per event.
    pub(crate) bytes: f64,
    /// Flushes of the log to disk per 1,000 events: the commits that waited for the disk,
    /// grouped as the server grouped them (as the server's processes report them, each up to a
    /// second late: steady over runs of many seconds, not over one of a few).
    pub(crate) flushes_per_1000: f64,
    /// Whole pages written to the log per 1,000 events (the first change of a page after a
    /// checkpoint).
    pub(crate) full_page_images_per_1000: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use event_tests::db::TestDb;

    #[test]
    fn counts_what_grew_per_event_and_nothing_for_a_missing_snapshot() {
        let then = Snapshot {
            bytes: 1_000.0,
            flushes: 10.0,
            full_page_images: 2.0,
        };
        let now = Snapshot {
            bytes: 5_000.0,
            flushes: 14.0,
            full_page_images: 2.0,
        };
        let per = now.per_event_since(&then, 8);
        assert!((per.bytes - 500.0).abs() < 1e-9, "{per:?}");
        assert!((per.flushes_per_1000 - 500.0).abs() < 1e-9, "{per:?}");
        assert!(per.full_page_images_per_1000.abs() < 1e-9, "{per:?}");
        // A server restarted between the two (its counters reset) gives no negative figure.
        assert!(then.per_event_since(&now, 8).bytes.abs() < 1e-9);
        assert!(per_event(None, Some(now), 8).is_none());
        assert!(per_event(Some(then), None, 8).is_none());
    }

    #[tokio::test]
    async fn a_committed_row_shows_in_the_servers_log() {
        let Some(db) = TestDb::postgres().await else {
            return;
        };
        let before = Snapshot::take(db.pool()).await;
        assert!(before.is_some(), "pg_stat_wal was not readable");
        sqlx::raw_sql("CREATE TABLE wal_probe (id BIGINT PRIMARY KEY, body TEXT NOT NULL)")
            .execute(db.pool())
            .await
            .unwrap();
        for id in 0..10_i64 {
            sqlx::query("INSERT INTO wal_probe (id, body) VALUES ($1, repeat('x', 500))")
                .bind(id)
                .execute(db.pool())
                .await
                .unwrap();
        }
        let per = per_event(before, Snapshot::take(db.pool()).await, 10).unwrap();
        // Each row's 500 bytes at least, at once (the flushes are reported up to a second late).
        assert!(per.bytes >= 500.0, "{per:?}");
        db.cleanup().await;
    }
}
