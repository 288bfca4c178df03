//! The backend-specific statements the benchmark needs: the business transaction, the raw
//! multi-row insert baseline, the naive one-row relay of the seed, and bulk fill.

use std::future::Future;

use chrono::{DateTime, Utc};
use event_sqlx::Backend;
use sqlx::Pool;

/// A raw outbox row for the insert baseline and the naive relay's backlog.
pub struct RawRow {
    pub event_no: String,
    pub aggregate_id: String,
    pub sequence: i64,
}

pub trait BenchDb: Backend {
    /// Creates the business tables.
    fn setup(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send + '_;
    /// One UPDATE and one INSERT: the business write of a command.
    fn business_write<'a>(
        conn: &'a mut Self::Connection,
        account: i64,
    ) -> impl Future<Output = sqlx::Result<()>> + Send + 'a;
    /// `SELECT 1`: one more round trip and nothing else.
    fn trivial_statement(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = sqlx::Result<()>> + Send + '_;
    /// A plain multi-row INSERT of `rows` into the outbox table, in one transaction.
    fn raw_insert<'a>(
        pool: &'a Pool<Self>,
        rows: &'a [RawRow],
        now: DateTime<Utc>,
    ) -> impl Future<Output = sqlx::Result<()>> + Send + 'a;
    /// The seed's relay, literally: select 100 pending, then for each one claim, publish, mark.
    /// Returns how many were published.
    fn naive_relay_round(
        pool: &Pool<Self>,
    ) -> impl Future<Output = sqlx::Result<usize>> + Send + '_;
    /// Adds `count` published rows numbered from `from`.
    fn fill_published(
        pool: &Pool<Self>,
        from: i64,
        count: i64,
    ) -> impl Future<Output = sqlx::Result<()>> + Send + '_;
    /// Empties the outbox table.
    fn truncate(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send + '_;
    /// Refreshes the planner's statistics.
    fn analyze(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send + '_;
    /// Runs a fixed statement.
    fn raw<'a>(
        pool: &'a Pool<Self>,
        statement: &'static str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send + 'a;
    /// Runs a statement the benchmark wrote (numbers only, no outside text).
    fn raw_owned(
        pool: &Pool<Self>,
        statement: String,
    ) -> impl Future<Output = sqlx::Result<()>> + Send + '_;
    /// The lowest and highest id in the outbox table.
    fn id_range(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<(i64, i64)>> + Send + '_;
    /// Reads every published row's key columns in keyset pages of `page` by id, as
    /// reconciliation reads them; returns how many.
    fn scan_outbox(
        pool: &Pool<Self>,
        page: i64,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send + '_;
    /// Reads every inbox record of `consumer` in keyset pages of `page` by its primary key;
    /// returns how many.
    fn scan_inbox<'a>(
        pool: &'a Pool<Self>,
        consumer: &'a str,
        page: i64,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send + 'a;
    /// After a bulk fill: refreshes statistics and does the maintenance the fill would otherwise
    /// trigger in the background during the measurement (PostgreSQL's autovacuum).
    fn settle(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send + '_;
    /// The row lock waits the server has counted since it started (InnoDB's
    /// `Innodb_row_lock_waits`), where it counts them: MySQL and MariaDB.
    fn row_lock_waits(
        pool: &Pool<Self>,
    ) -> impl Future<Output = sqlx::Result<Option<i64>>> + Send + '_;
}

const OUTBOX_COLUMNS: &str = "event_no, aggregate_type, aggregate_id, aggregate_sequence, event_type, event_version, event_source, publish_channel, topic, routing_key, event_payload, event_headers, publish_status, retry_count, max_retry_count, trace_id, create_time, update_time";

macro_rules! impl_bench_db {
    ($db:ty, $id:ty, $concat:literal, $truncate:literal, $analyze:literal, $settle:literal, $ledger:literal, $lock_waits:literal) => {
        impl BenchDb for $db {
            fn setup(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send + '_ {
                async move {
                    sqlx::raw_sql("CREATE TABLE bench_account (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)")
                        .execute(pool)
                        .await?;
                    sqlx::raw_sql($ledger).execute(pool).await?;
                    let mut q = sqlx::QueryBuilder::<$db>::new("INSERT INTO bench_account (id, balance) ");
                    q.push_values(0..1000_i64, |mut b, id| {
                        b.push_bind(id).push_bind(0_i64);
                    });
                    q.build().execute(pool).await?;
                    Ok(())
                }
            }

            fn business_write<'a>(conn: &'a mut Self::Connection, account: i64) -> impl Future<Output = sqlx::Result<()>> + Send + 'a {
                async move {
                    let mut q = sqlx::QueryBuilder::<$db>::new("UPDATE bench_account SET balance = balance + 1 WHERE id = ");
                    q.push_bind(account);
                    q.build().execute(&mut *conn).await?;
                    let mut q = sqlx::QueryBuilder::<$db>::new("INSERT INTO bench_ledger (account_id, amount) VALUES (");
                    q.push_bind(account).push(", ").push_bind(1_i64).push(")");
                    q.build().execute(&mut *conn).await?;
                    Ok(())
                }
            }

            fn trivial_statement(conn: &mut Self::Connection) -> impl Future<Output = sqlx::Result<()>> + Send + '_ {
                async move {
                    sqlx::query::<$db>("SELECT 1").execute(&mut *conn).await?;
                    Ok(())
                }
            }

            fn raw_insert<'a>(pool: &'a Pool<Self>, rows: &'a [RawRow], now: DateTime<Utc>) -> impl Future<Output = sqlx::Result<()>> + Send + 'a {
                async move {
                    let mut tx = pool.begin().await?;
                    for chunk in rows.chunks(500) {
                        let mut q = sqlx::QueryBuilder::<$db>::new(format!("INSERT INTO biz_outbox_event ({OUTBOX_COLUMNS}) "));
                        q.push_values(chunk, |mut b, row| {
                            b.push_bind(row.event_no.as_str())
                                .push_bind("ORDER")
                                .push_bind(row.aggregate_id.as_str())
                                .push_bind(row.sequence)
                                .push_bind("NOTE_ADDED")
                                .push_bind(1_i32)
                                .push_bind("bench")
                                .push_bind("MQ")
                                .push_bind("order.event")
                                .push_bind("note.added")
                                .push_bind(sqlx::types::Json(serde_json::json!({"text": "note"})))
                                .push_bind(sqlx::types::Json(serde_json::json!({"source": "bench"})))
                                .push_bind(0_i16)
                                .push_bind(0_i32)
                                .push_bind(5_i32)
                                .push_bind(None::<String>)
                                .push_bind(now)
                                .push_bind(now);
                        });
                        q.build().execute(&mut *tx).await?;
                    }
                    tx.commit().await
                }
            }

            fn naive_relay_round(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<usize>> + Send + '_ {
                async move {
                    use sqlx::Row;
                    let rows = sqlx::QueryBuilder::<$db>::new(
                        "SELECT id, event_no, aggregate_type, aggregate_id, event_type, event_version, event_source, \
                         publish_channel, topic, routing_key, event_payload, event_headers, retry_count, \
                         max_retry_count, trace_id, create_time FROM biz_outbox_event \
                         WHERE deleted = 0 AND publish_status = 0 ORDER BY create_time ASC LIMIT 100",
                    )
                    .build()
                    .fetch_all(pool)
                    .await?;
                    let mut published = 0;
                    for row in rows {
                        let id: $id = row.try_get("id")?;
                        let now = Utc::now();
                        let mut claim = sqlx::QueryBuilder::<$db>::new(
                            "UPDATE biz_outbox_event SET publish_status = 1, locked_by = 'publisher-01', lock_until = ",
                        );
                        claim.push_bind(now + chrono::TimeDelta::minutes(2))
                            .push(", last_publish_time = ").push_bind(now)
                            .push(", version = version + 1, update_time = ").push_bind(now)
                            .push(" WHERE id = ").push_bind(id)
                            .push(" AND deleted = 0 AND publish_status IN (0, 3) AND (next_retry_time IS NULL OR next_retry_time <= ")
                            .push_bind(now).push(")");
                        if claim.build().execute(pool).await?.rows_affected() != 1 {
                            continue;
                        }
                        // "Publish": serialize the payload, as a real publisher would.
                        let payload: sqlx::types::Json<serde_json::Value> = row.try_get("event_payload")?;
                        std::hint::black_box(serde_json::to_vec(&payload.0).ok());
                        let mut mark = sqlx::QueryBuilder::<$db>::new(
                            "UPDATE biz_outbox_event SET publish_status = 2, published_time = ",
                        );
                        mark.push_bind(now)
                            .push(", fail_reason = NULL, locked_by = NULL, lock_until = NULL, update_time = ").push_bind(now)
                            .push(" WHERE id = ").push_bind(id)
                            .push(" AND deleted = 0 AND publish_status = 1 AND locked_by = 'publisher-01'");
                        published += mark.build().execute(pool).await?.rows_affected() as usize;
                    }
                    Ok(published)
                }
            }

            fn fill_published(pool: &Pool<Self>, from: i64, count: i64) -> impl Future<Output = sqlx::Result<()>> + Send + '_ {
                async move {
                    // Up to 1M rows per statement from a product of digit tables; works on all three.
                    let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";
                    let mut done = 0;
                    while done < count {
                        let chunk = (count - done).min(100_000);
                        let base = from + done;
                        let now = Utc::now();
                        let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                            "INSERT INTO biz_outbox_event ({OUTBOX_COLUMNS}, published_time) SELECT {}, 'ORDER', {}, 1, 'NOTE_ADDED', 1, 'bench', 'MQ', 'order.event', 'note.added', '{{\"text\":\"note\"}}', '{{\"source\":\"bench\"}}', 2, 0, 5, NULL, ",
                            format!($concat, "'P-'", "n"),
                            format!($concat, "'pa-'", "n"),
                        ));
                        q.push_bind(now).push(", ").push_bind(now).push(", ").push_bind(now);
                        q.push(format!(
                            " FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + "
                        ));
                        q.push_bind(base).push(format!(
                            " AS n FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f) g WHERE n < "
                        ));
                        q.push_bind(base + chunk);
                        q.build().execute(pool).await?;
                        done += chunk;
                    }
                    Ok(())
                }
            }

            fn truncate(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send + '_ {
                async move {
                    sqlx::raw_sql($truncate).execute(pool).await?;
                    Ok(())
                }
            }

            fn scan_outbox(pool: &Pool<Self>, page: i64) -> impl Future<Output = sqlx::Result<u64>> + Send + '_ {
                async move {
                    let (mut after, mut seen) = (0_i64, 0_u64);
                    loop {
                        let mut q = sqlx::QueryBuilder::<$db>::new(
                            "SELECT id, event_no, event_type FROM biz_outbox_event WHERE publish_status = 2 AND id > ",
                        );
                        q.push_bind(after).push(" ORDER BY id LIMIT ").push_bind(page);
                        let rows: Vec<($id, String, String)> = q.build_query_as().fetch_all(pool).await?;
                        let Some(last) = rows.last() else { return Ok(seen) };
                        after = i64::try_from(last.0).unwrap_or(i64::MAX);
                        seen += rows.len() as u64;
                        std::hint::black_box(&rows);
                    }
                }
            }

            fn scan_inbox<'a>(pool: &'a Pool<Self>, consumer: &'a str, page: i64) -> impl Future<Output = sqlx::Result<u64>> + Send + 'a {
                async move {
                    let (mut after, mut seen) = (String::new(), 0_u64);
                    loop {
                        let mut q = sqlx::QueryBuilder::<$db>::new(
                            "SELECT event_id FROM consumed_event WHERE consumer = ",
                        );
                        q.push_bind(consumer).push(" AND event_id > ").push_bind(after.clone());
                        q.push(" ORDER BY consumer, event_id LIMIT ").push_bind(page);
                        let rows: Vec<(String,)> = q.build_query_as().fetch_all(pool).await?;
                        let Some(last) = rows.last() else { return Ok(seen) };
                        after = last.0.clone();
                        seen += rows.len() as u64;
                        std::hint::black_box(&rows);
                    }
                }
            }

            fn settle(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send + '_ {
                async move {
                    sqlx::raw_sql($settle).execute(pool).await?;
                    Ok(())
                }
            }

            fn row_lock_waits(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<Option<i64>>> + Send + '_ {
                async move {
                    if $lock_waits.is_empty() {
                        return Ok(None);
                    }
                    let (_, value) = sqlx::query_as::<_, (String, String)>($lock_waits)
                        .fetch_one(pool)
                        .await?;
                    value.parse().map(Some).map_err(|e| sqlx::Error::Decode(Box::new(e)))
                }
            }

            fn raw<'a>(pool: &'a Pool<Self>, statement: &'static str) -> impl Future<Output = sqlx::Result<()>> + Send + 'a {
                async move {
                    sqlx::raw_sql(statement).execute(pool).await?;
                    Ok(())
                }
            }

            fn raw_owned(pool: &Pool<Self>, statement: String) -> impl Future<Output = sqlx::Result<()>> + Send + '_ {
                async move {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(statement)).execute(pool).await?;
                    Ok(())
                }
            }

            fn id_range(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<(i64, i64)>> + Send + '_ {
                async move {
                    let (first, last) = sqlx::query_as::<_, ($id, $id)>(
                        "SELECT MIN(id), MAX(id) FROM biz_outbox_event",
                    )
                    .fetch_one(pool)
                    .await?;
                    let id = |v: $id| i64::try_from(v).map_err(|e| sqlx::Error::Decode(Box::new(e)));
                    Ok((id(first)?, id(last)?))
                }
            }

            fn analyze(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send + '_ {
                async move {
                    sqlx::raw_sql($analyze).execute(pool).await?;
                    Ok(())
                }
            }
        }
    };
}

impl_bench_db!(
    sqlx::Postgres,
    i64,
    "({} || CAST({} AS TEXT))",
    "TRUNCATE biz_outbox_event",
    "ANALYZE biz_outbox_event",
    "VACUUM ANALYZE biz_outbox_event",
    "CREATE TABLE bench_ledger (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, account_id BIGINT NOT NULL, amount BIGINT NOT NULL)",
    ""
);
impl_bench_db!(
    sqlx::MySql,
    u64,
    "CONCAT({}, {})",
    "TRUNCATE TABLE biz_outbox_event",
    "ANALYZE TABLE biz_outbox_event",
    "ANALYZE TABLE biz_outbox_event",
    "CREATE TABLE bench_ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, account_id BIGINT NOT NULL, amount BIGINT NOT NULL) ENGINE=InnoDB",
    "SHOW GLOBAL STATUS LIKE 'Innodb_row_lock_waits'"
);
impl_bench_db!(
    sqlx::Sqlite,
    i64,
    "({} || CAST({} AS TEXT))",
    // DELETE leaves the file full of free pages that the next fill scatters rows over; VACUUM
    // gives back a file as compact as a fresh one, as TRUNCATE does on the servers.
    "DELETE FROM biz_outbox_event; VACUUM",
    "ANALYZE",
    "ANALYZE",
    "CREATE TABLE bench_ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, account_id INTEGER NOT NULL, amount INTEGER NOT NULL)",
    ""
);
