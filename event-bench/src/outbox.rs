//! The outbox benchmark: a business transaction with 1 and 10 events against the same
//! transaction without, the relay's drain against a naive relay and the raw INSERT rate, and
//! the batch latency with 10k and 1M published rows (benches/results/outbox.json).

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use event_core::{Aggregate, EventContext, RecordedEvents, UnitOfWork};
use event_sqlx::{OutboxMessage, PublishError, Publisher, RelayConfig};
use event_tests::db::TestDb;
use event_tests::fixtures::{NoteAdded, Order};
use serde::Serialize;

use crate::Args;
use crate::sql::{BenchDb, RawRow};

/// A publisher that accepts everything after serializing it, as a real one would.
pub(crate) struct Serializing;

impl Publisher for Serializing {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        messages
            .iter()
            .map(|m| {
                std::hint::black_box(serde_json::to_vec(&m.envelope).map_err(PublishError::new))
                    .map(drop)
            })
            .collect()
    }
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct BackendResult {
    backend: String,
    tx_without_outbox_us: f64,
    tx_with_1_event_us: f64,
    tx_with_10_events_us: f64,
    tx_with_select_1_us: f64,
    overhead_1_event: f64,
    overhead_10_events: f64,
    overhead_select_1: f64,
    raw_insert_events_per_s: f64,
    relay_drain_events_per_s: f64,
    naive_relay_events_per_s: f64,
    /// The seed's status model's own floor: the same backlog taken through its two writes per
    /// event (pending -> in progress -> published) by two bare UPDATEs per batch of ids, the
    /// next batch's claim beside the last one's mark, with no candidate query, lease guard,
    /// publish or decoding. No relay that keeps every row's status can drain faster.
    two_updates_events_per_s: f64,
    /// The relay's drain over that floor.
    drain_vs_two_updates: f64,
    drain_vs_naive: f64,
    drain_vs_raw_insert: f64,
    batch_latency_10k_published_ms: f64,
    batch_latency_large_published_ms: f64,
    large_published_rows: i64,
    batch_latency_ratio: f64,
    /// PostgreSQL: batch latency on the large table filled after its statistics were taken
    /// empty (as after `migrate`), never analyzed since.
    stale_statistics_batch_latency_ms: Option<f64>,
    /// The same after `Outbox::ensure_statistics`, as a relay runs it on start.
    relay_start_batch_latency_ms: Option<f64>,
    /// The same after an explicit ANALYZE: the baseline.
    analyzed_batch_latency_ms: Option<f64>,
    /// `relay_start` over `analyzed`.
    relay_start_vs_analyzed: Option<f64>,
    /// `stale_statistics` over `analyzed`.
    stale_vs_analyzed: Option<f64>,
    /// Four producers committing one event per transaction through `Outbox::commit` on an
    /// empty outbox with no relay running: commits a second.
    producers_alone_per_s: Option<f64>,
    /// The same producers while a relay publishes what they commit.
    producers_beside_relay_per_s: Option<f64>,
    /// `producers_beside_relay` over `producers_alone`.
    producers_beside_relay_vs_alone: Option<f64>,
    /// MySQL: the row lock waits the server counted while the producers committed alone, and
    /// beside the relay (a claim that locked the gap where new events go made them wait).
    row_lock_waits_alone: Option<i64>,
    row_lock_waits_beside_relay: Option<i64>,
}

pub(crate) async fn bench<DB: BenchDb>(
    name: &str,
    db: &TestDb<DB>,
    args: &Args,
) -> anyhow::Result<BackendResult>
where
    event_sqlx::Relay<DB, Serializing>: Send,
{
    eprintln!("== {name}");
    DB::setup(db.pool()).await?;
    let mut r = BackendResult {
        backend: name.to_owned(),
        ..BackendResult::default()
    };

    // (a) The business transaction with 0, 1 and 10 outbox events, interleaved in rounds so that
    // drift in the machine's load hits every variant alike.
    let rounds = 6;
    let per_round = (args.transactions / rounds).max(1);
    // The fourth variant adds a trivial `SELECT 1` instead of events: the floor that any extra
    // statement in the transaction costs on this machine, one more round trip.
    let mut totals = [Duration::ZERO; 4];
    let mut serial = 0usize;
    for round in 0..=rounds {
        for (variant, events) in [0usize, 1, 10, 0].into_iter().enumerate() {
            let started = Instant::now();
            for _ in 0..per_round {
                serial += 1;
                let mut tx = db.pool().begin().await?;
                DB::business_write(&mut tx, (serial % 1000) as i64).await?;
                if variant == 3 {
                    DB::trivial_statement(&mut tx).await?;
                }
                if events > 0 {
                    let mut order = Order {
                        id: format!("tx-{serial}"),
                        paid: false,
                        events: RecordedEvents::new(),
                    };
                    for _ in 0..events {
                        order.record(NoteAdded {
                            text: "note".into(),
                        })?;
                    }
                    let mut uow = UnitOfWork::new(EventContext::new("bench"));
                    uow.collect(&mut order)?;
                    db.outbox.flush(&mut tx, &uow.commit()).await?;
                }
                tx.commit().await?;
            }
            if round > 0 {
                // Round 0 warms up.
                totals[variant] += started.elapsed();
            }
        }
    }
    let n = (per_round * rounds) as f64;
    r.tx_without_outbox_us = totals[0].as_secs_f64() * 1e6 / n;
    r.tx_with_1_event_us = totals[1].as_secs_f64() * 1e6 / n;
    r.tx_with_10_events_us = totals[2].as_secs_f64() * 1e6 / n;
    r.tx_with_select_1_us = totals[3].as_secs_f64() * 1e6 / n;
    r.overhead_select_1 = r.tx_with_select_1_us / r.tx_without_outbox_us - 1.0;
    r.overhead_1_event = r.tx_with_1_event_us / r.tx_without_outbox_us - 1.0;
    r.overhead_10_events = r.tx_with_10_events_us / r.tx_without_outbox_us - 1.0;
    eprintln!(
        "   transactions: {:.0} / {:.0} / {:.0} µs, with SELECT 1 {:.0} µs",
        r.tx_without_outbox_us, r.tx_with_1_event_us, r.tx_with_10_events_us, r.tx_with_select_1_us
    );

    // (b) The raw multi-row INSERT of a backlog, then the relay draining it.
    DB::truncate(db.pool()).await?;
    let rows = backlog("E", args.events, 0);
    let now = event_now();
    let started = Instant::now();
    for chunk in rows.chunks(5000) {
        DB::raw_insert(db.pool(), chunk, now).await?;
    }
    r.raw_insert_events_per_s = args.events as f64 / started.elapsed().as_secs_f64();
    DB::analyze(db.pool()).await?;
    let relay = db.outbox.relay(
        Serializing,
        RelayConfig::new("bench").batch_size(args.batch),
    );
    let started = Instant::now();
    let drained = relay.drain().await?.published;
    anyhow::ensure!(
        drained == args.events,
        "the relay drained {drained} of {} events",
        args.events
    );
    r.relay_drain_events_per_s = args.events as f64 / started.elapsed().as_secs_f64();
    eprintln!(
        "   raw insert {:.0}/s, relay drain {:.0}/s",
        r.raw_insert_events_per_s, r.relay_drain_events_per_s
    );

    // The naive relay on a fresh backlog of the same shape, for at most 20 s.
    let naive_rows = backlog("N", 20_000, 1_000_000);
    for chunk in naive_rows.chunks(5000) {
        DB::raw_insert(db.pool(), chunk, event_now()).await?;
    }
    DB::analyze(db.pool()).await?;
    let started = Instant::now();
    let mut naive = 0;
    while started.elapsed() < Duration::from_secs(20) {
        let published = DB::naive_relay_round(db.pool()).await?;
        if published == 0 {
            break;
        }
        naive += published;
    }
    r.naive_relay_events_per_s = naive as f64 / started.elapsed().as_secs_f64();
    r.drain_vs_naive = r.relay_drain_events_per_s / r.naive_relay_events_per_s;
    r.drain_vs_raw_insert = r.relay_drain_events_per_s / r.raw_insert_events_per_s;
    eprintln!("   naive relay {:.0}/s", r.naive_relay_events_per_s);

    // The status model's floor on a fresh backlog of the same size and shape.
    DB::truncate(db.pool()).await?;
    for chunk in rows.chunks(5000) {
        DB::raw_insert(db.pool(), chunk, now).await?;
    }
    DB::analyze(db.pool()).await?;
    r.two_updates_events_per_s = two_updates::<DB>(db, args.events, args.batch).await?;
    r.drain_vs_two_updates = r.relay_drain_events_per_s / r.two_updates_events_per_s;
    eprintln!(
        "   two bare updates per event {:.0}/s: the relay drains at {:.0}% of it",
        r.two_updates_events_per_s,
        r.drain_vs_two_updates * 100.0
    );

    // Producers beside a running relay, against the same producers alone (the servers;
    // SQLite has one writer).
    if <DB as event_sqlx::Backend>::DIALECT != event_sqlx::Dialect::Sqlite {
        DB::truncate(db.pool()).await?;
        let (alone, waits_alone) = producers(db, "alone").await?;
        DB::truncate(db.pool()).await?;
        let relay = db.outbox.relay(Serializing, RelayConfig::new("beside"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await
        });
        let beside = producers(db, "beside").await;
        let _ = stop.send(());
        running.await?;
        let (beside, waits_beside) = beside?;
        r.producers_alone_per_s = Some(alone);
        r.producers_beside_relay_per_s = Some(beside);
        r.producers_beside_relay_vs_alone = Some(beside / alone);
        r.row_lock_waits_alone = waits_alone;
        r.row_lock_waits_beside_relay = waits_beside;
        eprintln!(
            "   four producers alone {alone:.0}/s, beside a relay {beside:.0}/s; row lock waits {waits_alone:?} and {waits_beside:?}"
        );
    }

    // (c) Batch latency with 10k, then with many, published rows in the table.
    DB::truncate(db.pool()).await?;
    DB::fill_published(db.pool(), 0, 10_000).await?;
    r.batch_latency_10k_published_ms = batch_latency(db, "C", 2_000_000).await?;
    eprintln!("   filling {} published rows", args.published);
    DB::fill_published(db.pool(), 10_000, args.published - 10_000).await?;
    r.large_published_rows = args.published;
    r.batch_latency_large_published_ms = batch_latency(db, "D", 3_000_000).await?;
    r.batch_latency_ratio = r.batch_latency_large_published_ms / r.batch_latency_10k_published_ms;
    eprintln!(
        "   batch latency {:.2} ms -> {:.2} ms",
        r.batch_latency_10k_published_ms, r.batch_latency_large_published_ms
    );

    // (d) PostgreSQL: the table's statistics taken while it was empty (as `migrate` leaves
    // them), then filled in bulk before autovacuum could look: what the claim costs then, after
    // a relay's start has taken fresh statistics, and with ANALYZE run by hand.
    if <DB as event_sqlx::Backend>::DIALECT == event_sqlx::Dialect::Postgres {
        DB::truncate(db.pool()).await?;
        DB::raw(
            db.pool(),
            "ALTER TABLE biz_outbox_event SET (autovacuum_enabled = false)",
        )
        .await?;
        DB::analyze(db.pool()).await?;
        eprintln!("   filling {} published rows, not analyzed", args.published);
        DB::fill_published(db.pool(), 0, args.published).await?;
        // One claim, cut off after a minute: on stale statistics one can take minutes.
        let stale = first_batch_within(db, "S", 4_000_000, Duration::from_secs(60)).await?;
        let took = db.outbox.ensure_statistics().await?;
        anyhow::ensure!(took, "a relay's start did not find the statistics stale");
        let relay_start = batch_latency_unsettled(db, "T", 5_000_000).await?;
        DB::analyze(db.pool()).await?;
        let analyzed = batch_latency_unsettled(db, "U", 6_000_000).await?;
        DB::raw(
            db.pool(),
            "ALTER TABLE biz_outbox_event RESET (autovacuum_enabled)",
        )
        .await?;
        r.stale_statistics_batch_latency_ms = Some(stale);
        r.relay_start_batch_latency_ms = Some(relay_start);
        r.analyzed_batch_latency_ms = Some(analyzed);
        r.relay_start_vs_analyzed = Some(relay_start / analyzed);
        r.stale_vs_analyzed = Some(stale / analyzed);
        eprintln!(
            "   stale statistics {stale:.2} ms, after a relay's start {relay_start:.2} ms, analyzed {analyzed:.2} ms"
        );
    }
    Ok(r)
}

/// The time of one relay batch of 100 over a fresh backlog, or `limit` if it takes longer (the
/// batch is then abandoned; its database session is ended).
async fn first_batch_within<DB: BenchDb>(
    db: &TestDb<DB>,
    prefix: &str,
    offset: usize,
    limit: Duration,
) -> anyhow::Result<f64> {
    let rows = backlog(prefix, 100, offset);
    DB::raw_insert(db.pool(), &rows, event_now()).await?;
    let relay = db
        .outbox
        .relay(Serializing, RelayConfig::new("first").batch_size(100));
    let started = Instant::now();
    match tokio::time::timeout(limit, relay.run_once()).await {
        Ok(report) => {
            report?;
            Ok(started.elapsed().as_secs_f64() * 1000.0)
        }
        Err(_) => {
            DB::raw(
                db.pool(),
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()",
            )
            .await?;
            Ok(limit.as_secs_f64() * 1000.0)
        }
    }
}

/// [`batch_latency`] without the maintenance after the fill: the statistics stay as they are.
async fn batch_latency_unsettled<DB: BenchDb>(
    db: &TestDb<DB>,
    prefix: &str,
    offset: usize,
) -> anyhow::Result<f64> {
    let rows = backlog(prefix, 22 * 100, offset);
    for chunk in rows.chunks(1000) {
        DB::raw_insert(db.pool(), chunk, event_now()).await?;
    }
    measure_batches(db).await
}

/// The median time of one relay batch of 100 (claim, publish, mark) over 2000 pending events,
/// after two batches that warm the caches.
async fn batch_latency<DB: BenchDb>(
    db: &TestDb<DB>,
    prefix: &str,
    offset: usize,
) -> anyhow::Result<f64> {
    let (warm_up, measured) = (2, 20);
    let rows = backlog(prefix, (warm_up + measured) * 100, offset);
    for chunk in rows.chunks(1000) {
        DB::raw_insert(db.pool(), chunk, event_now()).await?;
    }
    DB::settle(db.pool()).await?;
    measure_batches(db).await
}

/// The median time of one relay batch of 100 over 20 batches, after two that warm the caches.
async fn measure_batches<DB: BenchDb>(db: &TestDb<DB>) -> anyhow::Result<f64> {
    let (warm_up, measured) = (2, 20);
    let relay = db
        .outbox
        .relay(Serializing, RelayConfig::new("latency").batch_size(100));
    let mut times = Vec::new();
    for batch in 0..warm_up + measured {
        let started = Instant::now();
        let report = relay.run_once().await?;
        if batch >= warm_up {
            // The first batches after a bulk fill meet cold caches on every run alike.
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        anyhow::ensure!(
            report.published == 100,
            "a batch published {}",
            report.published
        );
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Events the four producers beside a relay commit, one per transaction, in each phase.
const PRODUCER_EVENTS: usize = 8_000;

/// Four producers committing `PRODUCER_EVENTS` orders' events through `Outbox::commit`, one per
/// transaction: their commits a second, and the row lock waits the server counted meanwhile.
async fn producers<DB: BenchDb>(
    db: &TestDb<DB>,
    prefix: &str,
) -> anyhow::Result<(f64, Option<i64>)> {
    const PRODUCERS: usize = 4;
    let waits = DB::row_lock_waits(db.pool()).await?;
    let started = Instant::now();
    let work = (0..PRODUCERS).map(|p| async move {
        for i in (p..PRODUCER_EVENTS).step_by(PRODUCERS) {
            let mut order = Order::place(&format!("{prefix}-{i}"), i as i64)?;
            let mut uow = UnitOfWork::new(EventContext::new("bench"));
            uow.collect(&mut order)?;
            let _ = db.outbox.commit(db.pool().begin().await?, uow).await?;
        }
        Ok::<(), anyhow::Error>(())
    });
    for done in futures_util::future::join_all(work).await {
        done?;
    }
    let rate = PRODUCER_EVENTS as f64 / started.elapsed().as_secs_f64();
    let waits = match (waits, DB::row_lock_waits(db.pool()).await?) {
        (Some(before), Some(after)) => Some(after - before),
        _ => None,
    };
    Ok((rate, waits))
}

/// `count` events over `count / 10` aggregates, ten each, interleaved as a busy service commits.
/// Takes the `events` rows of the table through pending -> in progress -> published in
/// batches of `batch` ids, by two bare UPDATEs a batch (the claim of one batch beside the mark of
/// the one before, where the database takes concurrent writers); the events a second.
async fn two_updates<DB: BenchDb>(
    db: &TestDb<DB>,
    events: usize,
    batch: u32,
) -> anyhow::Result<f64> {
    let (first, last) = DB::id_range(db.pool()).await?;
    anyhow::ensure!(
        usize::try_from(last - first + 1)? == events,
        "ids {first}..={last} for {events} rows"
    );
    let claim = |from: i64| {
        format!(
            "UPDATE biz_outbox_event SET publish_status = 1, locked_by = 'floor', \
             lock_until = CURRENT_TIMESTAMP, last_publish_time = CURRENT_TIMESTAMP, \
             version = version + 1, update_time = CURRENT_TIMESTAMP \
             WHERE id BETWEEN {from} AND {}",
            from + i64::from(batch) - 1
        )
    };
    let mark = |from: i64| {
        format!(
            "UPDATE biz_outbox_event SET publish_status = 2, published_time = CURRENT_TIMESTAMP, \
             locked_by = NULL, lock_until = NULL, update_time = CURRENT_TIMESTAMP \
             WHERE id BETWEEN {from} AND {}",
            from + i64::from(batch) - 1
        )
    };
    let overlap = <DB as event_sqlx::Backend>::DIALECT != event_sqlx::Dialect::Sqlite;
    let starts: Vec<i64> = (first..=last).step_by(batch as usize).collect();
    let started = Instant::now();
    DB::raw_owned(db.pool(), claim(starts[0])).await?;
    for (i, &from) in starts.iter().enumerate() {
        let next = starts.get(i + 1).map(|&next| claim(next));
        match next {
            Some(next) if overlap => {
                let (claimed, marked) = tokio::join!(
                    DB::raw_owned(db.pool(), next),
                    DB::raw_owned(db.pool(), mark(from))
                );
                claimed?;
                marked?;
            }
            next => {
                DB::raw_owned(db.pool(), mark(from)).await?;
                if let Some(next) = next {
                    DB::raw_owned(db.pool(), next).await?;
                }
            }
        }
    }
    Ok(events as f64 / started.elapsed().as_secs_f64())
}

pub(crate) fn backlog(prefix: &str, count: usize, offset: usize) -> Vec<RawRow> {
    let aggregates = (count / 10).max(1);
    (0..count)
        .map(|k| RawRow {
            event_no: format!("{prefix}-{}", k + offset),
            aggregate_id: format!("{prefix}-a{}", (k % aggregates) + offset),
            sequence: (k / aggregates) as i64 + 1,
        })
        .collect()
}

pub(crate) fn event_now() -> chrono::DateTime<Utc> {
    let now = Utc::now();
    chrono::DurationRound::duration_trunc(now, chrono::TimeDelta::microseconds(1)).unwrap_or(now)
}

/// The outbox benchmark on each backend `args` names, printed and written to `args.out`.
pub(crate) async fn run(args: &Args) -> anyhow::Result<()> {
    let mut results = Vec::new();
    let all = args.backend == "all";
    if all || args.backend == "sqlite" {
        let db = TestDb::sqlite().await.context("SQLite")?;
        results.push(bench("sqlite", &db, args).await?);
        db.cleanup().await;
    }
    if all || args.backend == "postgres" {
        let db = TestDb::postgres()
            .await
            .context("PostgreSQL is unreachable")?;
        results.push(bench("postgres", &db, args).await?);
        db.cleanup().await;
    }
    if all || args.backend == "mysql" {
        let db = TestDb::mysql()
            .await
            .context("MariaDB/MySQL is unreachable")?;
        results.push(bench("mysql", &db, args).await?);
        db.cleanup().await;
    }
    let machine = crate::machine();
    let report = serde_json::json!({
        "machine": machine,
        "measuredAt": Utc::now(),
        "events": args.events,
        "transactionsPerVariant": args.transactions,
        "relayBatch": args.batch,
        "results": results,
    });
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    println!("\nmachine: {machine}");
    println!(
        "| backend | outbox overhead, 1 event | 10 events | `SELECT 1` instead (floor) | drain vs naive relay | drain vs raw INSERT | batch latency at {} vs 10k published |",
        args.published
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &results {
        println!(
            "| {} | {:+.1}% ({:.0} -> {:.0} µs) | {:+.1}% | {:+.1}% | {:.1}x ({:.0} vs {:.0} ev/s) | {:.0}% ({:.0} vs {:.0} ev/s) | {:.2}x ({:.2} vs {:.2} ms) |",
            r.backend,
            r.overhead_1_event * 100.0,
            r.tx_without_outbox_us,
            r.tx_with_1_event_us,
            r.overhead_10_events * 100.0,
            r.overhead_select_1 * 100.0,
            r.drain_vs_naive,
            r.relay_drain_events_per_s,
            r.naive_relay_events_per_s,
            r.drain_vs_raw_insert * 100.0,
            r.relay_drain_events_per_s,
            r.raw_insert_events_per_s,
            r.batch_latency_ratio,
            r.batch_latency_large_published_ms,
            r.batch_latency_10k_published_ms,
        );
    }
    println!("\nwritten to {}", args.out.display());
    Ok(())
}
