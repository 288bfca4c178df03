//! The producer's cost of one outbox event per index profile, on PostgreSQL
//! (benches/results/producer.json): a business transaction (one UPDATE, one INSERT) alone, with
//! one row more in a one-column, one-index table (the floor for "one more row"), with one outbox
//! event under the seed's and the lean index profile, and with a four-column, one-index row by
//! hand (a minimal outbox row). The variants run interleaved in rounds, so that drift in the
//! machine's load hits each alike.

use std::time::Instant;

use chrono::Utc;
use event_core::{Aggregate, EventContext, RecordedEvents, UnitOfWork};
use event_sqlx::{CommitPath, IndexProfile, Outbox, OutboxConfig};
use event_tests::db::TestDb;
use event_tests::fixtures::{NoteAdded, Order};
use serde::Serialize;
use sqlx::Postgres;

use crate::sql::BenchDb;

/// One outbox row as the toolkit writes it, by hand.
const RAW_ROW: &str = "INSERT INTO biz_outbox_event (event_no, aggregate_type, aggregate_id, \
    aggregate_sequence, event_type, event_version, event_source, publish_channel, topic, \
    routing_key, event_payload, event_headers, publish_status, retry_count, max_retry_count, \
    trace_id, create_time, update_time) VALUES ($1, 'ORDER', $2, 1, 'NOTE_ADDED', 1, 'bench', \
    'MQ', 'order.event', 'note.added', $3, $4, 0, 0, 5, NULL, $5, $5)";

/// A minimal outbox row: four columns, one index (the primary key).
const PEER_TABLE: &str = "CREATE TABLE peer_outbox (id BIGSERIAL PRIMARY KEY, \
    topic TEXT NOT NULL, payload JSONB NOT NULL, created_at TIMESTAMPTZ NOT NULL)";
const PEER_ROW: &str = "INSERT INTO peer_outbox (topic, payload, created_at) VALUES ($1, $2, $3)";

/// The same row with every value bound (sixteen), the constants of a new row inlined.
const BOUND_ROW: &str = "INSERT INTO biz_outbox_event (event_no, aggregate_type, aggregate_id, \
    aggregate_sequence, event_type, event_version, event_source, publish_channel, topic, \
    routing_key, event_payload, event_headers, publish_status, retry_count, max_retry_count, \
    trace_id, create_time, update_time) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 0, 0, $13, $14, $15, $16)";

/// The same, reporting duplicates as the toolkit does.
const RAW_ROW_RETURNING: &str = "INSERT INTO biz_outbox_event (event_no, aggregate_type, \
    aggregate_id, aggregate_sequence, event_type, event_version, event_source, publish_channel, \
    topic, routing_key, event_payload, event_headers, publish_status, retry_count, \
    max_retry_count, trace_id, create_time, update_time) VALUES ($1, 'ORDER', $2, 1, \
    'NOTE_ADDED', 1, 'bench', 'MQ', 'order.event', 'note.added', $3, $4, 0, 0, 5, NULL, $5, $5) \
    ON CONFLICT (event_no) DO NOTHING RETURNING event_no";

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Figures {
    transactions_per_variant: usize,
    business_tx_us: f64,
    business_tx_lean_database_us: f64,
    with_floor_row_us: f64,
    with_event_seed_us: f64,
    with_event_lean_us: f64,
    /// The lean database, the same row inserted by hand with a static prepared statement.
    with_raw_row_lean_us: f64,
    /// The same with `ON CONFLICT (event_no) DO NOTHING RETURNING event_no`.
    with_raw_row_returning_lean_us: f64,
    /// The lean database, the row by hand with every value bound.
    with_bound_row_lean_us: f64,
    /// The lean database, `Outbox::flush` then `tx.commit()`: the events in a round trip of
    /// their own, with the flush's `ON CONFLICT` duplicate detection.
    with_event_lean_flush_then_commit_us: f64,
    /// The lean database, `Outbox::commit` with `CommitPath::OneTrip`: the events in the
    /// COMMIT's message.
    with_event_lean_one_trip_us: f64,
    /// The lean database, `Outbox::commit` with `CommitPath::Bound`: a prepared INSERT, then
    /// the COMMIT.
    with_event_lean_bound_us: f64,
    /// The lean database, a four-column, one-index row by hand (id, topic, JSON payload,
    /// creation time): the stand-in for a minimal outbox row such as a peer library's.
    with_peer_row_lean_us: f64,
    /// The path `CommitPath::Auto` (the default, measured in `withEventLeanUs`) chose here.
    lean_commit_path: String,
    floor_overhead: f64,
    seed_overhead: f64,
    lean_overhead: f64,
    lean_overhead_vs_floor_overhead: f64,
    /// The lean profile's event over the four-column, one-index row, each as added to the
    /// business transaction alone on the lean database.
    lean_overhead_vs_peer_row_overhead: f64,
    lean_tx_vs_floor_tx: f64,
    lean_one_trip_tx_vs_floor_tx: f64,
    lean_bound_tx_vs_floor_tx: f64,
    seed_indexes_touched_by_insert: usize,
    lean_indexes_touched_by_insert: usize,
}

pub(crate) async fn run(transactions: usize) -> anyhow::Result<()> {
    let db = TestDb::postgres()
        .await
        .ok_or_else(|| anyhow::anyhow!("PostgreSQL is unreachable"))?;
    Postgres::setup(db.pool()).await?;
    sqlx::raw_sql("CREATE TABLE floor_row (event_no TEXT PRIMARY KEY)")
        .execute(db.pool())
        .await?;
    // A second database on the same server, its outbox in the lean profile.
    let lean_db = TestDb::postgres()
        .await
        .ok_or_else(|| anyhow::anyhow!("PostgreSQL is unreachable"))?;
    Postgres::setup(lean_db.pool()).await?;
    let lean = Outbox::new(
        lean_db.pool().clone(),
        OutboxConfig::new().index_profile(IndexProfile::Lean),
    );
    lean.migrate().await?;
    sqlx::raw_sql(PEER_TABLE).execute(lean_db.pool()).await?;
    let lean_with = |path| {
        Outbox::new(
            lean_db.pool().clone(),
            OutboxConfig::new()
                .index_profile(IndexProfile::Lean)
                .commit_path(path),
        )
    };
    let (lean_one_trip, lean_bound) =
        (lean_with(CommitPath::OneTrip), lean_with(CommitPath::Bound));
    let seed = &db.outbox;
    let indexes = |pool: sqlx::PgPool, table: &'static str| {
        async move {
            sqlx::query_scalar::<_, i64>(
                // Every index a pending row enters: those without a predicate, and the partial ones
                // whose status list starts with pending (0).
                "SELECT COUNT(*) FROM pg_indexes WHERE tablename = $1 \
             AND (indexdef NOT LIKE '%WHERE%' OR indexdef LIKE '%ARRAY[0,%')",
            )
            .bind(table)
            .fetch_one(&pool)
            .await
        }
    };
    let seed_indexes = indexes(db.pool().clone(), "biz_outbox_event").await? as usize;
    let lean_indexes = indexes(lean_db.pool().clone(), "biz_outbox_event").await? as usize;

    // Short rounds, so that drift in the machine's load hits every variant alike; each
    // transaction timed on its own, and each variant's median taken, so that the occasional slow
    // commit (a checkpoint's fsync) does not decide a ratio.
    let per_round = 50.min(transactions.max(1));
    let rounds = (transactions / per_round).max(1);
    // Seed database: alone, + floor row, + event; lean database: alone, + event, + the same
    // outbox row written by hand with one static prepared statement (what the database alone
    // costs for the row, without the toolkit's envelope, event number and encoding).
    // And the same row with the toolkit's duplicate detection, `ON CONFLICT DO NOTHING
    // RETURNING`; the event flushed in a round trip of its own before the COMMIT; and the event
    // sent in the COMMIT's message (`CommitPath::OneTrip`); a prepared INSERT then the COMMIT
    // (`CommitPath::Bound`); the row by hand with every value bound.
    // And a four-column, one-index row, by hand.
    let mut samples: [Vec<f64>; 12] = Default::default();
    let mut serial = 0usize;
    // Each round runs the variants in a new order (a fixed pseudo-random sequence), so that no
    // variant always follows the same one: what a variant leaves behind on the server (dirty
    // pages, an open transaction sqlx rolls back on the connection's next use) falls on each
    // of the others alike.
    let mut order: Vec<usize> = (0..samples.len()).collect();
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    for round in 0..=rounds {
        for i in (1..order.len()).rev() {
            // xorshift64, then Fisher-Yates.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            order.swap(i, (state % (i as u64 + 1)) as usize);
        }
        for &variant in &order {
            let samples = &mut samples[variant];
            for _ in 0..per_round {
                let started = Instant::now();
                serial += 1;
                let pool = if variant < 3 {
                    db.pool()
                } else {
                    lean_db.pool()
                };
                let mut tx = pool.begin().await?;
                Postgres::business_write(&mut tx, (serial % 1000) as i64).await?;
                match variant {
                    1 => {
                        sqlx::query("INSERT INTO floor_row (event_no) VALUES ($1)")
                            .bind(format!("NOTE_ADDED:tx-{serial}"))
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                    }
                    6 => {
                        sqlx::query(RAW_ROW_RETURNING)
                            .bind(format!("NOTE_ADDED:tx-{serial}"))
                            .bind(format!("tx-{serial}"))
                            .bind(sqlx::types::Json(serde_json::json!({"text": "note"})))
                            .bind(sqlx::types::Json(serde_json::json!({"source": "bench"})))
                            .bind(Utc::now())
                            .fetch_all(&mut *tx)
                            .await?;
                        tx.commit().await?;
                    }
                    10 => {
                        sqlx::query(BOUND_ROW)
                            .bind(format!("NOTE_ADDED:tx-{serial}"))
                            .bind("ORDER".to_owned())
                            .bind(format!("tx-{serial}"))
                            .bind(1_i64)
                            .bind("NOTE_ADDED".to_owned())
                            .bind(1_i32)
                            .bind("bench".to_owned())
                            .bind("MQ".to_owned())
                            .bind(Some("order.event".to_owned()))
                            .bind(Some("note.added".to_owned()))
                            .bind(sqlx::types::Json(serde_json::json!({"text": "note"})))
                            .bind(sqlx::types::Json(serde_json::json!({"source": "bench"})))
                            .bind(5_i32)
                            .bind(None::<String>)
                            .bind(Utc::now())
                            .bind(Utc::now())
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                    }
                    11 => {
                        sqlx::query(PEER_ROW)
                            .bind("order.event")
                            .bind(sqlx::types::Json(serde_json::json!({
                                "eventId": format!("NOTE_ADDED:tx-{serial}"),
                                "eventType": "NOTE_ADDED",
                                "aggregateId": format!("tx-{serial}"),
                                "payload": {"text": "note"},
                            })))
                            .bind(Utc::now())
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                    }
                    5 => {
                        sqlx::query(RAW_ROW)
                            .bind(format!("NOTE_ADDED:tx-{serial}"))
                            .bind(format!("tx-{serial}"))
                            .bind(sqlx::types::Json(serde_json::json!({"text": "note"})))
                            .bind(sqlx::types::Json(serde_json::json!({"source": "bench"})))
                            .bind(Utc::now())
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                    }
                    2 | 4 | 7 | 8 | 9 => {
                        let outbox: &Outbox<Postgres> = match variant {
                            2 => seed,
                            8 => &lean_one_trip,
                            9 => &lean_bound,
                            _ => &lean,
                        };
                        let mut order = Order {
                            id: format!("tx-{serial}"),
                            paid: false,
                            events: RecordedEvents::new(),
                        };
                        order.record(NoteAdded {
                            text: "note".into(),
                        })?;
                        let mut uow = UnitOfWork::new(EventContext::new("bench"));
                        uow.collect(&mut order)?;
                        if variant == 7 {
                            outbox.flush(&mut tx, &uow.commit()).await?;
                            tx.commit().await?;
                        } else {
                            // What services call.
                            let _ = outbox.commit(tx, uow).await?;
                        }
                    }
                    // The business transaction alone.
                    _ => tx.commit().await?,
                }
                if round > 0 {
                    // Round 0 warms up.
                    samples.push(started.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let [s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11] = &mut samples;
    let (base, floor, with_seed, lean_base, with_lean, with_raw_row, with_raw_returning) = (
        median(s0),
        median(s1),
        median(s2),
        median(s3),
        median(s4),
        median(s5),
        median(s6),
    );
    let with_lean_flush = median(s7);
    let with_lean_one_trip = median(s8);
    let with_lean_bound = median(s9);
    let with_bound_row = median(s10);
    let with_peer_row = median(s11);
    // A lean transaction's cost relative to the business transaction alone, against the
    // floor's relative to its own.
    let vs_floor = |with_event: f64| (with_event / lean_base) / (floor / base);
    let figures = Figures {
        transactions_per_variant: per_round * rounds,
        business_tx_us: base,
        business_tx_lean_database_us: lean_base,
        with_floor_row_us: floor,
        with_event_seed_us: with_seed,
        with_event_lean_us: with_lean,
        with_raw_row_lean_us: with_raw_row,
        with_raw_row_returning_lean_us: with_raw_returning,
        with_event_lean_flush_then_commit_us: with_lean_flush,
        with_event_lean_one_trip_us: with_lean_one_trip,
        with_event_lean_bound_us: with_lean_bound,
        with_bound_row_lean_us: with_bound_row,
        with_peer_row_lean_us: with_peer_row,
        lean_commit_path: format!("{:?}", lean.commit_path()),
        floor_overhead: floor / base - 1.0,
        seed_overhead: with_seed / base - 1.0,
        lean_overhead: with_lean / lean_base - 1.0,
        lean_overhead_vs_floor_overhead: (with_lean - lean_base) / (floor - base),
        lean_overhead_vs_peer_row_overhead: (with_lean - lean_base) / (with_peer_row - lean_base),
        lean_tx_vs_floor_tx: vs_floor(with_lean),
        lean_one_trip_tx_vs_floor_tx: vs_floor(with_lean_one_trip),
        lean_bound_tx_vs_floor_tx: vs_floor(with_lean_bound),
        seed_indexes_touched_by_insert: seed_indexes,
        lean_indexes_touched_by_insert: lean_indexes,
    };
    let report = serde_json::json!({
        "machine": crate::machine(),
        "measuredAt": Utc::now(),
        "store": "PostgreSQL",
        "note": "one run; the variants interleaved in rounds of 50 transactions, in a new order each round; each figure the median of one variant's transactions",
        "figures": figures,
    });
    crate::write_result("benches/results/producer.json", &report)?;
    db.cleanup().await;
    lean_db.cleanup().await;
    Ok(())
}
