//! Reconciliation at scale: `--events` published events on the producer's side and as many
//! inbox records (but for one in 10,000, withheld) on the consumer's, in one database; the time
//! of `Outbox::reconcile` against one full keyset scan of both tables, measured in the same run,
//! and the memory it holds.

use std::time::{Duration, Instant};

use anyhow::Context;
use event_sqlx::Reconcile;
use event_tests::db::TestDb;

use crate::sql::BenchDb;

/// Resident memory of this process in KiB (Linux), 0 where unknown.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// Rows per page, for the reconciliation and for the scans it is measured against.
const PAGE: u32 = 1000;

pub(crate) async fn run(backend: &str, events: i64) -> anyhow::Result<()> {
    let mut results = Vec::new();
    let all = backend == "all";
    if all || backend == "postgres" {
        let db = TestDb::postgres()
            .await
            .context("PostgreSQL is unreachable")?;
        results.push(one("postgres", &db, events).await?);
        db.cleanup().await;
    }
    if all || backend == "mysql" {
        let db = TestDb::mysql()
            .await
            .context("MariaDB/MySQL is unreachable")?;
        results.push(one("mysql", &db, events).await?);
        db.cleanup().await;
    }
    if all || backend == "sqlite" {
        let db = TestDb::sqlite().await.context("SQLite")?;
        results.push(one("sqlite", &db, events).await?);
        db.cleanup().await;
    }
    let report = serde_json::json!({
        "machine": crate::machine(),
        "measuredAt": chrono::Utc::now(),
        "eventsPerSide": events,
        "results": results,
    });
    crate::write_result("benches/results/reconcile.json", &report)?;
    Ok(())
}

async fn one<DB: BenchDb>(
    name: &str,
    db: &TestDb<DB>,
    events: i64,
) -> anyhow::Result<serde_json::Value> {
    eprintln!("== {name}: reconcile {events} events per side");
    DB::fill_published(db.pool(), 0, events).await?;
    DB::raw(
        db.pool(),
        "INSERT INTO consumed_event (consumer, event_id, consumed_time, aggregate_type, \
         aggregate_id, aggregate_sequence) SELECT 'bench', event_no, CURRENT_TIMESTAMP, \
         aggregate_type, aggregate_id, aggregate_sequence FROM biz_outbox_event \
         WHERE id % 10000 <> 7",
    )
    .await?;
    DB::settle(db.pool()).await?;
    DB::raw(db.pool(), "ANALYZE consumed_event").await.ok();
    let withheld = (1..=events).filter(|id| id % 10_000 == 7).count() as u64;

    // The baseline: one keyset scan of each table, in pages of the same size.
    let started = Instant::now();
    let outbox_rows = DB::scan_outbox(db.pool(), PAGE.into()).await?;
    let inbox_rows = DB::scan_inbox(db.pool(), "bench", PAGE.into()).await?;
    let scan_secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        outbox_rows == events as u64,
        "scanned {outbox_rows} outbox rows"
    );
    eprintln!("   keyset scans: {outbox_rows} + {inbox_rows} rows in {scan_secs:.2} s");

    let before = rss_kib();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let options = {
        let peak = std::sync::Arc::clone(&peak);
        Reconcile::consumer("bench")
            .since(Duration::from_secs(2 * 24 * 3600))
            .grace(Duration::ZERO)
            .page(PAGE)
            .progress(move |_| {
                peak.fetch_max(rss_kib(), std::sync::atomic::Ordering::Relaxed);
            })
    };
    let started = Instant::now();
    let report = db.outbox.reconcile(db.pool(), &options).await?;
    let reconcile_secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        report.totals.published == events as u64 && report.totals.missing == withheld,
        "reconciled {:?}, {withheld} withheld",
        report.totals
    );
    let grew = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(before);
    eprintln!(
        "   reconcile: {reconcile_secs:.2} s ({:.2}x the scans), {} missing found, resident memory grew {grew} KiB",
        reconcile_secs / scan_secs,
        report.totals.missing
    );
    Ok(serde_json::json!({
        "backend": name,
        "keysetScanSeconds": scan_secs,
        "reconcileSeconds": reconcile_secs,
        "reconcileVsScan": reconcile_secs / scan_secs,
        "page": PAGE,
        "missingFound": report.totals.missing,
        "residentMemoryGrowthKiB": grew,
    }))
}
