//! Archive and retention at scale (benches/results/archive.json).

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use event_sqlx::RelayConfig;
use event_tests::db::TestDb;

use crate::Args;
use crate::outbox::{Serializing, backlog, event_now};
use crate::sql::BenchDb;

/// Archiving, per backend: the rate of moving `--published` final rows to the archive against
/// the raw multi-row INSERT rate of rows of the same shape, and a relay's drain rate while the
/// archiver runs against its rate alone, all measured in one run on one fresh database.
pub(crate) async fn archive_bench(args: &Args) -> anyhow::Result<()> {
    let mut results = Vec::new();
    let all = args.backend == "all";
    if all || args.backend == "sqlite" {
        let db = TestDb::sqlite().await.context("SQLite")?;
        results.push(archive_one("sqlite", &db, args).await?);
        db.cleanup().await;
    }
    if all || args.backend == "postgres" {
        let db = TestDb::postgres()
            .await
            .context("PostgreSQL is unreachable")?;
        results.push(archive_one("postgres", &db, args).await?);
        db.cleanup().await;
    }
    if all || args.backend == "mysql" {
        let db = TestDb::mysql()
            .await
            .context("MariaDB/MySQL is unreachable")?;
        results.push(archive_one("mysql", &db, args).await?);
        db.cleanup().await;
    }
    let report = serde_json::json!({
        "machine": crate::machine(),
        "measuredAt": Utc::now(),
        "publishedRows": args.published,
        "results": results,
    });
    crate::write_result("benches/results/archive.json", &report)?;
    Ok(())
}

/// Rows per archive transaction: `eventctl outbox archive`'s default. (The raw INSERT baseline
/// writes 5000 rows per transaction; larger archive batches hold SQLite's one write lock longer
/// and cost a relay beside them more than they gain.)
const ARCHIVE_BATCH: u32 = 1000;

async fn archive_one<DB: BenchDb>(
    name: &str,
    db: &TestDb<DB>,
    args: &Args,
) -> anyhow::Result<serde_json::Value>
where
    event_sqlx::Relay<DB, Serializing>: Send,
{
    eprintln!("== {name}: archive");
    let rows = usize::try_from(args.published).unwrap_or(1_000_000);
    // The raw multi-row INSERT of as many rows of the same shape, into the same table: the
    // baseline. Inserting into a table as large as the one archived from, not a small one, is
    // what makes the two rates comparable.
    let raw = backlog("R", rows, 0);
    let started = Instant::now();
    for chunk in raw.chunks(5000) {
        DB::raw_insert(db.pool(), chunk, event_now()).await?;
    }
    let raw_rate = raw.len() as f64 / started.elapsed().as_secs_f64();
    DB::truncate(db.pool()).await?;

    // Archiving alone.
    DB::fill_published(db.pool(), 0, args.published).await?;
    DB::settle(db.pool()).await?;
    let started = Instant::now();
    let report = db
        .outbox
        .archive(Duration::ZERO, ARCHIVE_BATCH, |_| {})
        .await?;
    let archive_secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        report.moved == rows as u64,
        "archived {} of {rows}",
        report.moved
    );
    let archive_rate = report.moved as f64 / archive_secs;
    eprintln!("   raw insert {raw_rate:.0}/s, archive {archive_rate:.0}/s");

    // A relay's drain alone, then while the archiver moves another full history.
    DB::fill_published(db.pool(), 1_000_000_000, args.published).await?;
    DB::settle(db.pool()).await?;
    let drain = async |prefix: &str, offset: usize| -> anyhow::Result<f64> {
        let pending = backlog(prefix, 50_000, offset);
        for chunk in pending.chunks(5000) {
            DB::raw_insert(db.pool(), chunk, event_now()).await?;
        }
        let relay = db.outbox.relay(
            Serializing,
            RelayConfig::new("drain").batch_size(args.batch),
        );
        let started = Instant::now();
        let published = relay.drain().await?.published;
        anyhow::ensure!(published == pending.len(), "drained {published}");
        Ok(published as f64 / started.elapsed().as_secs_f64())
    };
    let alone = drain("A", 10_000_000).await?;
    let archiver = {
        let outbox = db.outbox.clone();
        tokio::spawn(async move { outbox.archive(Duration::ZERO, ARCHIVE_BATCH, |_| {}).await })
    };
    let beside = drain("B", 20_000_000).await?;
    let archived_beside = archiver.await??.moved;
    eprintln!("   drain alone {alone:.0}/s, beside the archiver {beside:.0}/s");
    Ok(serde_json::json!({
        "backend": name,
        "rawInsertRowsPerSecond": raw_rate,
        "archiveRowsPerSecond": archive_rate,
        "archiveVsRawInsert": archive_rate / raw_rate,
        "drainAlonePerSecond": alone,
        "drainBesideArchiverPerSecond": beside,
        "drainBesideVsAlone": beside / alone,
        "archivedBesideTheDrain": archived_beside,
        "archiveBatch": ARCHIVE_BATCH,
    }))
}
