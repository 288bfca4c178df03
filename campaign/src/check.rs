//! The checker: the database is the truth. After the drain, every committed event has exactly
//! one effect (a cancelled one at most one), no effect belongs to an event that was never
//! committed, each aggregate's effects in the order they were applied are exactly its sequences
//! 1..n less the cancelled events never applied, every event is published or cancelled, nothing
//! is quarantined, and every commit a producer saw acknowledged is in the outbox.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

use anyhow::Context;

use crate::pair::{CONSUMER, Db};

/// Published, in `publish_status`.
const SUCCEEDED: i16 = 2;
/// Cancelled, in `publish_status`: by the campaign's operator.
const CANCELLED: i16 = 4;

/// How far the run has come, from the tables.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Progress {
    /// Events committed.
    pub(crate) total: i64,
    /// Events published.
    pub(crate) published: i64,
    /// Events cancelled.
    pub(crate) cancelled: i64,
    /// Events that were not cancelled and have an effect.
    pub(crate) applied: i64,
}

impl Progress {
    /// Every committed event is published or cancelled.
    pub(crate) fn settled(&self) -> bool {
        self.published + self.cancelled == self.total
    }

    /// Settled, and every event not cancelled has its effect: the drain is over.
    pub(crate) fn drained(&self) -> bool {
        self.settled() && self.applied == self.total - self.cancelled
    }
}

/// One outbox row.
pub(crate) struct OutboxRow {
    pub(crate) event_no: String,
    pub(crate) aggregate_id: String,
    pub(crate) sequence: i64,
    pub(crate) status: i16,
}

/// One effect, in applied order.
pub(crate) struct Effect {
    pub(crate) event_id: String,
    pub(crate) aggregate_id: String,
    pub(crate) sequence: i64,
}

/// A direct connection to the private database (not through a proxy).
pub(crate) enum Truth {
    Postgres(sqlx::PgPool),
    MariaDb(sqlx::MySqlPool),
}

impl Truth {
    pub(crate) async fn connect(db: Db, url: &str) -> anyhow::Result<Truth> {
        let timeout = std::time::Duration::from_secs(10);
        Ok(match db {
            Db::Postgres => Truth::Postgres(
                sqlx::pool::PoolOptions::new()
                    .max_connections(2)
                    .acquire_timeout(timeout)
                    .connect_lazy(url)?,
            ),
            Db::MariaDb => Truth::MariaDb(
                sqlx::pool::PoolOptions::new()
                    .max_connections(2)
                    .acquire_timeout(timeout)
                    .connect_lazy(url)?,
            ),
        })
    }

    pub(crate) async fn count(&self, sql: &'static str) -> anyhow::Result<i64> {
        Ok(match self {
            Truth::Postgres(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await?,
            Truth::MariaDb(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await?,
        })
    }

    pub(crate) async fn execute(&self, sql: &str) -> anyhow::Result<()> {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Truth::Postgres(pool) => {
                sqlx::raw_sql(sql).execute(pool).await?;
            }
            Truth::MariaDb(pool) => {
                sqlx::raw_sql(sql).execute(pool).await?;
            }
        }
        Ok(())
    }

    /// Ends every other client's connection to the database, as an administrator would, and
    /// returns how many it ended.
    pub(crate) async fn terminate_connections(&self) -> anyhow::Result<u64> {
        match self {
            Truth::Postgres(pool) => {
                let ended: Vec<bool> = sqlx::query_scalar(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid() \
                     AND backend_type = 'client backend'",
                )
                .fetch_all(pool)
                .await?;
                Ok(ended.into_iter().filter(|e| *e).count() as u64)
            }
            Truth::MariaDb(pool) => {
                let mut conn = pool.acquire().await?;
                // MariaDB gives the id as a signed BIGINT, MySQL 8 as an unsigned one.
                let ids: Vec<i64> = sqlx::query_scalar(
                    "SELECT CAST(id AS SIGNED) FROM information_schema.processlist \
                     WHERE id <> CONNECTION_ID() AND db = DATABASE() AND command <> 'Daemon'",
                )
                .fetch_all(&mut *conn)
                .await?;
                let mut ended = 0;
                for id in ids {
                    let kill = sqlx::AssertSqlSafe(format!("KILL {id}"));
                    if sqlx::raw_sql(kill).execute(&mut *conn).await.is_ok() {
                        ended += 1;
                    }
                }
                Ok(ended)
            }
        }
    }

    async fn outbox(&self) -> anyhow::Result<Vec<OutboxRow>> {
        const SQL: &str = "SELECT event_no, aggregate_id, aggregate_sequence, publish_status FROM biz_outbox_event";
        let rows: Vec<(String, String, i64, i16)> = match self {
            Truth::Postgres(pool) => sqlx::query_as(SQL).fetch_all(pool).await?,
            Truth::MariaDb(pool) => sqlx::query_as(SQL).fetch_all(pool).await?,
        };
        Ok(rows
            .into_iter()
            .map(|(event_no, aggregate_id, sequence, status)| OutboxRow {
                event_no,
                aggregate_id,
                sequence,
                status,
            })
            .collect())
    }

    async fn effects(&self) -> anyhow::Result<Vec<Effect>> {
        const SQL: &str = "SELECT event_id, aggregate_id, sequence FROM campaign_effect WHERE consumer = 'view' ORDER BY pos";
        let rows: Vec<(String, String, i64)> = match self {
            Truth::Postgres(pool) => sqlx::query_as(SQL).fetch_all(pool).await?,
            Truth::MariaDb(pool) => sqlx::query_as(SQL).fetch_all(pool).await?,
        };
        Ok(rows
            .into_iter()
            .map(|(event_id, aggregate_id, sequence)| Effect {
                event_id,
                aggregate_id,
                sequence,
            })
            .collect())
    }

    /// The longest time from commit to publish of any event, in milliseconds.
    pub(crate) async fn longest_publish_wait_ms(&self) -> anyhow::Result<i64> {
        Ok(match self {
            Truth::Postgres(pool) => sqlx::query_scalar::<_, Option<i64>>(
                "SELECT CAST(EXTRACT(EPOCH FROM MAX(published_time - create_time)) * 1000 AS BIGINT) FROM biz_outbox_event",
            )
            .fetch_one(pool)
            .await?,
            Truth::MariaDb(pool) => sqlx::query_scalar::<_, Option<i64>>(
                "SELECT CAST(MAX(TIMESTAMPDIFF(MICROSECOND, create_time, published_time)) DIV 1000 AS SIGNED) FROM biz_outbox_event",
            )
            .fetch_one(pool)
            .await?,
        }
        .unwrap_or(0))
    }

    /// Published and cancelled events, and the distinct effects of the others so far: the
    /// drain's progress.
    pub(crate) async fn progress(&self) -> anyhow::Result<Progress> {
        let total = self.count("SELECT COUNT(*) FROM biz_outbox_event").await?;
        let published = self
            .count("SELECT COUNT(*) FROM biz_outbox_event WHERE publish_status = 2")
            .await?;
        let cancelled = self
            .count("SELECT COUNT(*) FROM biz_outbox_event WHERE publish_status = 4")
            .await?;
        let applied = self
            .count(
                "SELECT COUNT(DISTINCT e.event_id) FROM campaign_effect e \
                 JOIN biz_outbox_event o ON o.event_no = e.event_id WHERE o.publish_status <> 4",
            )
            .await?;
        Ok(Progress {
            total,
            published,
            cancelled,
            applied,
        })
    }

    /// The newest pending event that follows another of its aggregate and that no relay has
    /// tried to publish yet: what the operator cancels, so that later events of the aggregate
    /// come after a cancelled one. (An event a relay tried may have reached the broker, its
    /// mark lost; cancelled, it could still be delivered, after its successor.)
    pub(crate) async fn newest_pending_follower(&self) -> anyhow::Result<Option<String>> {
        const SQL: &str = "SELECT event_no FROM biz_outbox_event WHERE publish_status = 0 \
                           AND aggregate_sequence > 1 AND last_publish_time IS NULL \
                           ORDER BY id DESC LIMIT 1";
        Ok(match self {
            Truth::Postgres(pool) => sqlx::query_scalar(SQL).fetch_optional(pool).await?,
            Truth::MariaDb(pool) => sqlx::query_scalar(SQL).fetch_optional(pool).await?,
        })
    }

    /// Whether the event is cancelled.
    pub(crate) async fn is_cancelled(&self, event_no: &str) -> anyhow::Result<bool> {
        let status: Option<i16> = match self {
            Truth::Postgres(pool) => {
                sqlx::query_scalar(
                    "SELECT publish_status FROM biz_outbox_event WHERE event_no = $1",
                )
                .bind(event_no)
                .fetch_optional(pool)
                .await?
            }
            Truth::MariaDb(pool) => {
                sqlx::query_scalar("SELECT publish_status FROM biz_outbox_event WHERE event_no = ?")
                    .bind(event_no)
                    .fetch_optional(pool)
                    .await?
            }
        };
        Ok(status == Some(CANCELLED))
    }
}

/// What the checker found.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    /// Figures, printed either way.
    pub(crate) figures: Vec<String>,
    /// Broken guarantees; empty when the run passed.
    pub(crate) failures: Vec<String>,
    /// The event numbers of committed events without an effect.
    pub(crate) lost: Vec<String>,
}

/// Shows at most a few examples.
fn some(items: &[String]) -> String {
    let mut shown: Vec<&str> = items.iter().take(5).map(String::as_str).collect();
    if items.len() > 5 {
        shown.push("...");
    }
    shown.join(", ")
}

/// Checks the tables against each other and against the producers' acknowledged commits.
pub(crate) async fn check(truth: &Truth, acked: &[PathBuf]) -> anyhow::Result<Findings> {
    let mut findings = Findings::default();
    let outbox = truth.outbox().await.context("cannot read the outbox")?;
    let effects = truth.effects().await.context("cannot read the effects")?;
    let quarantined = truth
        .count("SELECT COUNT(*) FROM quarantined_event")
        .await?;

    let committed: HashSet<&str> = outbox.iter().map(|r| r.event_no.as_str()).collect();
    let mut acked_total = 0usize;
    let mut acked_missing = Vec::new();
    for file in acked {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().filter(|l| !l.is_empty()) {
            acked_total += 1;
            if !committed.contains(line) {
                acked_missing.push(line.to_owned());
            }
        }
    }
    findings.figures.push(format!(
        "{} events committed ({} acknowledged to producers), {} effects",
        outbox.len(),
        acked_total,
        effects.len()
    ));
    if !acked_missing.is_empty() {
        findings.failures.push(format!(
            "{} acknowledged commits missing from the outbox: {}",
            acked_missing.len(),
            some(&acked_missing)
        ));
    }

    let unpublished: Vec<String> = outbox
        .iter()
        .filter(|r| r.status != SUCCEEDED && r.status != CANCELLED)
        .map(|r| format!("{} (status {})", r.event_no, r.status))
        .collect();
    if !unpublished.is_empty() {
        findings.failures.push(format!(
            "{} events not published: {}",
            unpublished.len(),
            some(&unpublished)
        ));
    }

    let mut times: HashMap<&str, usize> = HashMap::new();
    for effect in &effects {
        *times.entry(effect.event_id.as_str()).or_default() += 1;
    }
    // A cancelled event may have its effect: published before an operator cancelled it, once
    // its relay's mark was lost and its lease had expired.
    let lost: Vec<String> = outbox
        .iter()
        .filter(|r| r.status != CANCELLED && !times.contains_key(r.event_no.as_str()))
        .map(|r| r.event_no.clone())
        .collect();
    let cancelled: Vec<&OutboxRow> = outbox.iter().filter(|r| r.status == CANCELLED).collect();
    let cancelled_applied = cancelled
        .iter()
        .filter(|r| times.contains_key(r.event_no.as_str()))
        .count();
    findings.figures.push(format!(
        "{} events cancelled, {cancelled_applied} of them applied before their cancel",
        cancelled.len()
    ));
    let twice: Vec<String> = times
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, n)| format!("{id} x{n}"))
        .collect();
    let uncommitted: Vec<String> = times
        .keys()
        .filter(|id| !committed.contains(*id))
        .map(|id| (*id).to_owned())
        .collect();
    for (what, list) in [
        ("committed events without an effect (lost)", &lost),
        ("events applied more than once", &twice),
        ("effects of events never committed", &uncommitted),
    ] {
        if !list.is_empty() {
            findings
                .failures
                .push(format!("{} {what}: {}", list.len(), some(list)));
        }
    }

    // Per aggregate, the effects in applied order must be exactly 1..n, but for the cancelled
    // events that were never applied.
    let mut sequences_of: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for row in &outbox {
        if row.status != CANCELLED || times.contains_key(row.event_no.as_str()) {
            sequences_of
                .entry(row.aggregate_id.as_str())
                .or_default()
                .push(row.sequence);
        }
    }
    for sequences in sequences_of.values_mut() {
        sequences.sort_unstable();
    }
    let mut applied: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for effect in &effects {
        applied
            .entry(effect.aggregate_id.as_str())
            .or_default()
            .push(effect.sequence);
    }
    let mut out_of_order = Vec::new();
    for (aggregate, sequences) in &applied {
        let expected: Vec<i64> = sequences_of.get(aggregate).cloned().unwrap_or_default();
        if *sequences != expected {
            let at = sequences
                .iter()
                .zip(&expected)
                .position(|(a, e)| a != e)
                .unwrap_or(sequences.len().min(expected.len()));
            let around: Vec<String> = sequences
                .iter()
                .skip(at.saturating_sub(2))
                .take(5)
                .map(i64::to_string)
                .collect();
            out_of_order.push(format!(
                "{aggregate}: {} effects for {} events, first difference at #{} (applied ... {} ...)",
                sequences.len(),
                expected.len(),
                at + 1,
                around.join(", ")
            ));
        }
    }
    findings.figures.push(format!(
        "{} aggregates, each checked for effects 1..n in applied order (less the cancelled events never applied)",
        applied.len()
    ));
    if !out_of_order.is_empty() {
        findings.failures.push(format!(
            "{} aggregates whose effects are not their sequences 1..n (less cancelled) in order: {}",
            out_of_order.len(),
            some(&out_of_order)
        ));
    }
    if let Ok(ms) = truth.longest_publish_wait_ms().await {
        findings.figures.push(format!(
            "longest commit-to-publish wait of any event: {:.1} s (a killed or paused relay's events wait for its lease, 15 s, plus recovery)",
            ms as f64 / 1000.0
        ));
    }
    if quarantined > 0 {
        findings.failures.push(format!(
            "{quarantined} events quarantined by consumer {CONSUMER}"
        ));
    }
    findings.lost = lost;
    Ok(findings)
}

#[cfg(test)]
mod tests {
    use sqlx::Connection;

    use super::Truth;
    use crate::pair::Db;
    use event_tests::db::TestDb;

    /// The fault "terminate every db connection" ends another client's connection on both
    /// databases the campaign runs (on MariaDB it once failed to read the connection ids, and
    /// the fault did nothing).
    #[tokio::test]
    async fn ending_connections_ends_another_clients_connection_on_either_database() {
        if let Some(db) = TestDb::postgres().await {
            let mut victim = sqlx::PgConnection::connect(&db.url).await.unwrap();
            sqlx::query("SELECT 1").execute(&mut victim).await.unwrap();
            let truth = Truth::connect(Db::Postgres, &db.url).await.unwrap();
            let ended = truth.terminate_connections().await.unwrap();
            assert!(ended >= 1, "PostgreSQL: ended {ended} connections");
            assert!(
                sqlx::query("SELECT 1").execute(&mut victim).await.is_err(),
                "PostgreSQL: the other client's connection still answers"
            );
            db.cleanup().await;
        }
        if let Some(db) = TestDb::mysql().await {
            let mut victim = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
            sqlx::query("SELECT 1").execute(&mut victim).await.unwrap();
            let truth = Truth::connect(Db::MariaDb, &db.url).await.unwrap();
            let ended = truth.terminate_connections().await.unwrap();
            assert!(ended >= 1, "MariaDB: ended {ended} connections");
            assert!(
                sqlx::query("SELECT 1").execute(&mut victim).await.is_err(),
                "MariaDB: the other client's connection still answers"
            );
            db.cleanup().await;
        }
    }
}
