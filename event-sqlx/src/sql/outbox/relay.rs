//! The relay's statements: the claim with its per-aggregate check, the marks after a publish,
//! lease renewal and recovery.

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;

use crate::row::outbox::OutboxRecord;
use crate::sql::dialect::{Backend, Columns, Sql};
use crate::sql::{CANCELLED, FAILED, IN_PROGRESS, PENDING, SUCCEEDED, codes};
use crate::status::EventStatus::{Failed, InProgress, Pending};
use crate::table::TableName;
use crate::wire::PREVIOUS_SEQUENCE_HEADER;

use super::{COLUMNS, decode};

/// What makes a row claimable (`o` is the row): pending, or failed with retries left. The first
/// two terms are the predicate of the partial index `outbox_idx_claimable`.
pub(super) fn claimable() -> String {
    format!(
        "o.publish_status IN {} AND o.deleted = 0 \
         AND (o.publish_status = {PENDING} OR o.retry_count < o.max_retry_count)",
        codes(&[Pending, Failed])
    )
}

/// How a claim keeps each aggregate's events in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AggregateOrder {
    /// Not at all ([`RelayConfig::unordered`](crate::RelayConfig::unordered)).
    Unordered,
    /// One probe per candidate for an earlier event in any unpublished status: on PostgreSQL
    /// and SQLite an index-only probe of the partial index `outbox_idx_unpublished_aggregate`;
    /// on MySQL, which has no partial index, a walk of the aggregate's events through an index
    /// the optimizer picks, reading each row's status.
    OneProbe,
    /// MySQL with the migrations' `uk_aggregate_sequence` (see `Outbox::detect_order_index`):
    /// the candidate's previous event (its sequence less one) decides, in one lookup of that
    /// key. Published: nothing earlier is unpublished, since a relay that keeps order claimed
    /// it only once every event before it was published or cancelled, and neither status ever
    /// changes again. Pending, in progress or failed: the candidate waits. Cancelled, deleted
    /// or absent (archived): the candidate's earlier events are walked on that key, up to the
    /// candidate and no further, as [`AggregateOrder::OneProbe`] does. A claim thus reads one
    /// earlier event per candidate, however long the aggregate's history, where the walk read
    /// all of them (and, on the key MariaDB chose, the later ones as well).
    PreviousEvent,
    /// MySQL with an index that leads with `(aggregate_type, aggregate_id, publish_status)`
    /// (see `Outbox::detect_order_index`): one probe per unpublished status, each reading only
    /// the aggregate's events in that status, however long its published history.
    ProbePerStatus,
    /// PostgreSQL's lean profile, which has no `outbox_idx_unpublished_aggregate` (see
    /// `Outbox::detect_order_index`): the candidate's nearest earlier event that is neither
    /// cancelled nor deleted decides, found walking `outbox_uk_aggregate_sequence` backwards
    /// from the candidate. Published or none: the candidate goes, for the reason
    /// [`AggregateOrder::PreviousEvent`] gives; pending, in progress or failed: it waits. The
    /// walk reads the previous event, and past it only a run of cancelled or deleted ones.
    NearestEarlier,
}

impl AggregateOrder {
    /// The order as a small number, for an atomic.
    pub(crate) fn code(self) -> u8 {
        match self {
            AggregateOrder::Unordered => 0,
            AggregateOrder::OneProbe => 1,
            AggregateOrder::PreviousEvent => 2,
            AggregateOrder::ProbePerStatus => 3,
            AggregateOrder::NearestEarlier => 4,
        }
    }

    /// The order [`AggregateOrder::code`] gave `code`; [`AggregateOrder::OneProbe`] for any
    /// other number.
    pub(crate) fn from_code(code: u8) -> AggregateOrder {
        match code {
            0 => AggregateOrder::Unordered,
            2 => AggregateOrder::PreviousEvent,
            3 => AggregateOrder::ProbePerStatus,
            4 => AggregateOrder::NearestEarlier,
            _ => AggregateOrder::OneProbe,
        }
    }
}

/// Per-aggregate order as `order` keeps it: nothing when unordered, otherwise that no earlier
/// event of the same aggregate is still unpublished. The subqueries run per candidate row past
/// its aggregate's sequence 1 (see
/// [`Dialect::per_row_subquery`]): once for the three unpublished statuses, once for each, or a
/// lookup of the previous event and, only after a cancelled, deleted or absent one, the walk.
///
/// [`Dialect::per_row_subquery`]: crate::sql::dialect::Dialect::per_row_subquery
pub(super) fn no_earlier_unpublished<DB: Backend>(
    table: &TableName,
    order: AggregateOrder,
) -> String {
    let none_earlier = |index: &str, status: String| {
        format!(
            "NOT EXISTS (SELECT 1 FROM {table} p{index} \
             WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id \
             AND p.publish_status {status} AND p.deleted = 0 \
             AND p.aggregate_sequence < o.aggregate_sequence{})",
            DB::DIALECT.per_row_subquery()
        )
    };
    let unpublished = [Pending, InProgress, Failed];
    let any_unpublished = || format!("IN {}", codes(&unpublished));
    let check = match order {
        AggregateOrder::Unordered => return String::new(),
        AggregateOrder::OneProbe => none_earlier("", any_unpublished()),
        AggregateOrder::PreviousEvent => {
            let walk = none_earlier(
                &format!(" FORCE INDEX ({})", super::SEQUENCE_KEY),
                any_unpublished(),
            );
            format!(
                "CASE COALESCE((SELECT CASE WHEN p.deleted = 0 THEN p.publish_status \
                 ELSE {CANCELLED} END FROM {table} p \
                 WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id \
                 AND p.aggregate_sequence = o.aggregate_sequence - 1), {CANCELLED}) \
                 WHEN {SUCCEEDED} THEN 1 WHEN {CANCELLED} THEN {walk} ELSE 0 END = 1"
            )
        }
        AggregateOrder::ProbePerStatus => unpublished
            .iter()
            .map(|status| none_earlier("", format!("= {}", status.code())))
            .collect::<Vec<_>>()
            .join(" AND "),
        // `IS NOT FALSE`, not `COALESCE(..) = ..`: PostgreSQL takes a comparison it has no
        // statistics for to hold for one row in 200, so a claim's LIMIT looks like a read of
        // the whole table, and a cost that high has each claim compiled by the JIT first (365
        // ms for a claim that ran in 4 ms); a condition of its own it takes to hold for half.
        AggregateOrder::NearestEarlier => format!(
            "(SELECT p.publish_status = {SUCCEEDED} FROM {table} p \
             WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id \
             AND p.aggregate_sequence < o.aggregate_sequence AND p.deleted = 0 \
             AND p.publish_status <> {CANCELLED} \
             ORDER BY p.aggregate_sequence DESC LIMIT 1) IS NOT FALSE"
        ),
    };
    // An aggregate's first event has nothing before it (sequences start at 1; the flush refuses
    // 0): it goes without the subqueries, which a claim of new aggregates' events would
    // otherwise run once per candidate to find nothing.
    format!(" AND (o.aggregate_sequence = 1 OR ({check}))")
}

/// A claim of a batch under a lease.
#[derive(Debug, Clone)]
pub(crate) struct Claim<'a> {
    pub(crate) relay_id: &'a str,
    pub(crate) now: DateTime<Utc>,
    pub(crate) lease_until: DateTime<Utc>,
    pub(crate) limit: i64,
    pub(crate) order: AggregateOrder,
    /// Whether the claim waits for its commit to reach the disk (see [`unflushed`]).
    pub(crate) synchronous_commit: bool,
    /// MySQL: whether the claim's transaction may run at `READ COMMITTED`, so that it locks no
    /// gaps (see [`Dialect::begin_without_gap_locks`]); not where the binary log is written as
    /// statements (see [`claims_without_gap_locks`]).
    ///
    /// [`Dialect::begin_without_gap_locks`]: crate::sql::dialect::Dialect::begin_without_gap_locks
    pub(crate) without_gap_locks: bool,
    /// MySQL: the claim runs beside the delivery of a full batch, so a backlog is likely
    /// beyond it. It keeps the server's default isolation, under which drains measured faster,
    /// and stops well before the place where producers insert; should it read to the end all
    /// the same, it rolls back and claims again without gap locks.
    pub(crate) in_backlog: bool,
}

/// Lets the statement's transaction commit without waiting for the disk, unless
/// `synchronous_commit` (see [`Dialect::commit_without_flush`]): for the relay's own
/// bookkeeping, whose loss in a crash only publishes events again.
///
/// [`Dialect::commit_without_flush`]: crate::sql::dialect::Dialect::commit_without_flush
pub(super) fn unflushed<DB: Backend>(q: &mut Sql<DB>, synchronous_commit: bool) {
    if let Some(condition) = DB::DIALECT
        .commit_without_flush()
        .filter(|_| !synchronous_commit)
    {
        q.push(condition);
    }
}

/// A failed publish to record.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) id: i64,
    pub(crate) next_retry_time: DateTime<Utc>,
    pub(crate) reason: String,
}

/// ` FROM ... WHERE ...`: the rows a claim at `now` may take.
pub(super) fn due_candidates<DB: Backend>(
    q: &mut Sql<DB>,
    table: &TableName,
    now: DateTime<Utc>,
    order: AggregateOrder,
) {
    q.push(format!(" FROM {table} o WHERE {}", claimable()));
    q.push(" AND (o.next_retry_time IS NULL OR o.next_retry_time <= ")
        .bind(now)
        .push(")");
    q.push(no_earlier_unpublished::<DB>(table, order));
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
    order: AggregateOrder,
    relay_id: &str,
) -> Result<bool, sqlx::Error> {
    let mut q = Sql::<DB>::new(DB::DIALECT.select_one_where());
    q.push("EXISTS (SELECT 1");
    due_candidates(&mut q, table, now, order);
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
    conn: &mut PoolConnection<DB>,
    table: &TableName,
    claim: &Claim<'_>,
) -> Result<Vec<OutboxRecord>, sqlx::Error> {
    let candidates = |q: &mut Sql<DB>| {
        due_candidates(q, table, claim.now, claim.order);
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
    let records = if DB::DIALECT.has_returning() {
        // One statement: pick and lease the batch, return the rows. The batch is picked once,
        // whatever the planner believes of the backlog (see Dialect::claimed_ids).
        let mut q = Sql::<DB>::new("");
        set_claimed(&mut q);
        let (open, close) = DB::DIALECT.claimed_ids();
        q.push(&guard).push(open).push("SELECT o.id");
        candidates(&mut q);
        q.push(DB::DIALECT.skip_locked()).push(close);
        unflushed(&mut q, claim.synchronous_commit);
        q.push(format!(
            " RETURNING {COLUMNS}{}",
            cancelled_previous(table, &table.to_string())
        ));
        decode_claimed::<DB>(&q.fetch(conn).await?)?
    } else {
        // SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE, in one short transaction; the rows are
        // patched in memory, not read again. A claim in a backlog keeps the server's isolation
        // (see `Claim::in_backlog`) unless it reads to the end of the claimable rows.
        let mut gap_free = claim.without_gap_locks && !claim.in_backlog;
        loop {
            let mut tx = match DB::DIALECT.begin_without_gap_locks() {
                Some(begin) if gap_free => {
                    let begin = sqlx::SqlSafeStr::into_sql_str(begin);
                    sqlx::Connection::begin_with(&mut **conn, begin).await?
                }
                _ => sqlx::Acquire::begin(&mut *conn).await?,
            };
            let mut q = Sql::<DB>::new(format!(
                "SELECT {COLUMNS}{}",
                cancelled_previous(table, "o")
            ));
            candidates(&mut q);
            q.push(DB::DIALECT.skip_locked());
            let mut records = decode_claimed::<DB>(&q.fetch(&mut tx).await?)?;
            if !gap_free
                && claim.without_gap_locks
                && i64::try_from(records.len()).unwrap_or(i64::MAX) < claim.limit
            {
                // It read to the end, locking the gap where producers insert: give that back
                // at once and claim again without gap locks.
                tx.rollback().await?;
                gap_free = true;
                continue;
            }
            if !records.is_empty() {
                let mut q = Sql::<DB>::new("");
                set_claimed(&mut q);
                q.push(&guard)
                    .push("id IN ")
                    .list(records.iter().map(|(r, _)| r.id));
                q.execute(&mut tx).await?;
                for (record, _) in &mut records {
                    record.publish_status = InProgress;
                    record.locked_by = Some(claim.relay_id.to_owned());
                    record.lock_until = Some(claim.lease_until);
                    record.last_publish_time = Some(claim.now);
                    record.version += 1;
                    record.update_time = claim.now;
                }
            }
            tx.commit().await?;
            break records;
        }
    };
    // The claim is committed: a failure to read further leaves the event without the header
    // (its in-order consumers then wait for the cancelled sequences), not the batch leased.
    let mut stamped = Vec::with_capacity(records.len());
    for (mut record, cancelled) in records {
        clear_previous(&mut record);
        if cancelled.is_some()
            && let Err(e) = stamp_after_cancelled::<DB>(conn, table, &mut record).await
        {
            tracing::warn!(
                event_id = %record.event_no,
                error = %e,
                "could not read which events before this one were cancelled; it is published without {PREVIOUS_SEQUENCE_HEADER}"
            );
        }
        stamped.push(record);
    }
    stamped.sort_by_key(|r| r.id);
    Ok(stamped)
}

/// `, ... AS cancelled_previous`, for a claimed row of `table` that the claim names `row`: the
/// sequence before the row's in its aggregate when that event was cancelled or deleted, else
/// NULL. One probe of the aggregate sequence's unique key per row past sequence 1.
pub(super) fn cancelled_previous(table: &TableName, row: &str) -> String {
    format!(
        ", CASE WHEN {row}.aggregate_sequence > 1 THEN (SELECT c.aggregate_sequence \
         FROM {table} c WHERE c.aggregate_type = {row}.aggregate_type \
         AND c.aggregate_id = {row}.aggregate_id \
         AND c.aggregate_sequence = {row}.aggregate_sequence - 1 \
         AND (c.publish_status = {CANCELLED} OR c.deleted <> 0)) END AS cancelled_previous"
    )
}

/// Claimed rows, each with its `cancelled_previous` (see [`cancelled_previous`]).
fn decode_claimed<DB: Backend>(
    rows: &[DB::Row],
) -> Result<Vec<(OutboxRecord, Option<i64>)>, sqlx::Error> {
    rows.iter()
        .map(|row| {
            Ok((
                decode::<DB>(row)?,
                Columns::<DB>(row).opt_i64("cancelled_previous")?,
            ))
        })
        .collect()
}

/// For an event whose previous sequence was cancelled or deleted: the sequence of the last
/// event before it in its aggregate that was neither (0 when there is none), provided every
/// sequence between the two is still in the table, so that each is known never to be
/// published. `None` when one is missing (archived, say): then the consumer waits for it, as
/// for any event.
async fn previous_live<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    record: &OutboxRecord,
) -> Result<Option<i64>, sqlx::Error> {
    let aggregate = |q: &mut Sql<DB>| {
        q.bind(record.aggregate_type.as_str())
            .push(" AND aggregate_id = ")
            .bind(record.aggregate_id.as_str())
            .push(" AND aggregate_sequence < ")
            .bind(record.aggregate_sequence);
    };
    let mut q = Sql::<DB>::new(format!(
        "SELECT aggregate_sequence FROM {table} WHERE aggregate_type = "
    ));
    aggregate(&mut q);
    q.push(format!(
        " AND publish_status <> {CANCELLED} AND deleted = 0 \
         ORDER BY aggregate_sequence DESC LIMIT 1"
    ));
    let previous = match q.fetch(&mut *conn).await?.first() {
        Some(row) => Columns::<DB>(row).i64("aggregate_sequence")?,
        None => 0,
    };
    let mut q = Sql::<DB>::new(format!(
        "SELECT COUNT(*) AS n FROM {table} WHERE aggregate_type = "
    ));
    aggregate(&mut q);
    q.push(" AND aggregate_sequence > ").bind(previous);
    let between = match q.fetch(conn).await?.first() {
        Some(row) => Columns::<DB>(row).i64("n")?,
        None => 0,
    };
    Ok((between == record.aggregate_sequence - previous - 1).then_some(previous))
}

/// Stamps the `records` (read for sending again, not claimed) whose previous sequence was
/// cancelled or deleted, as a claim does: one query for all of them, and [`previous_live`]
/// for those. The caller drops the headers of that name stored with them first (see
/// [`clear_previous`]).
pub(crate) async fn stamp_cancelled_predecessors<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    records: &mut [OutboxRecord],
) -> Result<(), sqlx::Error> {
    let followers: Vec<i64> = records
        .iter()
        .filter(|r| r.aggregate_sequence > 1)
        .map(|r| r.id)
        .collect();
    if followers.is_empty() {
        return Ok(());
    }
    let mut q = Sql::<DB>::new(format!(
        "SELECT o.id{} FROM {table} o WHERE o.id",
        cancelled_previous(table, "o")
    ));
    q.in_ids(&followers);
    let mut flagged = std::collections::HashSet::new();
    for row in q.fetch(&mut *conn).await? {
        let c = Columns::<DB>(&row);
        if c.opt_i64("cancelled_previous")?.is_some() {
            flagged.insert(c.id("id")?);
        }
    }
    for record in records.iter_mut().filter(|r| flagged.contains(&r.id)) {
        stamp_after_cancelled::<DB>(conn, table, record).await?;
    }
    Ok(())
}

/// For `record`, whose previous sequence was cancelled or deleted: stamps it with the last
/// earlier sequence that was neither, when [`previous_live`] can tell.
async fn stamp_after_cancelled<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    record: &mut OutboxRecord,
) -> Result<(), sqlx::Error> {
    if let Some(previous) = previous_live::<DB>(conn, table, record).await? {
        stamp_previous(record, previous);
    }
    Ok(())
}

/// Drops a [`PREVIOUS_SEQUENCE_HEADER`] stored with the row: an application's own header of
/// that name (`EventContext::header`, say, copied from an event it consumed), which would
/// otherwise tell in-order consumers to skip sequences that are still to come. Only the relay
/// sets it, on the claimed or re-read record, never in the table.
pub(crate) fn clear_previous(record: &mut OutboxRecord) {
    if let Some(serde_json::Value::Object(headers)) = &mut record.event_headers {
        headers.remove(PREVIOUS_SEQUENCE_HEADER);
    }
}

/// Tells the consumers of `record` that its aggregate's previous published event is sequence
/// `previous` (see [`PREVIOUS_SEQUENCE_HEADER`]), in the claimed row's headers, not in the
/// table. Headers that are not a JSON object are left alone: the relay reports them as
/// unreadable when it builds the envelope.
fn stamp_previous(record: &mut OutboxRecord, previous: i64) {
    let value = serde_json::Value::String(previous.to_string());
    match &mut record.event_headers {
        Some(serde_json::Value::Object(headers)) => {
            headers.insert(PREVIOUS_SEQUENCE_HEADER.to_owned(), value);
        }
        headers @ (None | Some(serde_json::Value::Null)) => {
            let mut object = serde_json::Map::new();
            object.insert(PREVIOUS_SEQUENCE_HEADER.to_owned(), value);
            *headers = Some(serde_json::Value::Object(object));
        }
        Some(_) => {}
    }
}

/// ` WHERE ...`: the rows of `ids` that `relay_id` still holds in progress; the statement
/// commits without waiting for the disk unless `synchronous_commit` (see [`unflushed`]).
pub(super) fn held_by<DB: Backend>(
    q: &mut Sql<DB>,
    relay_id: &str,
    ids: &[i64],
    synchronous_commit: bool,
) {
    q.push(format!(
        " WHERE deleted = 0 AND {} = {IN_PROGRESS} AND locked_by = ",
        DB::DIALECT.status_guard("publish_status")
    ))
    .bind(relay_id)
    .push(" AND id")
    .in_ids(ids);
    unflushed(q, synchronous_commit);
}

/// In progress -> succeeded, for the rows `relay_id` still holds.
pub(crate) async fn mark_published<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    relay_id: &str,
    ids: &[i64],
    now: DateTime<Utc>,
    synchronous_commit: bool,
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
    held_by(&mut q, relay_id, ids, synchronous_commit);
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
    q.bind(at).push(" AND id").in_ids(ids);
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
            .push(" AND id")
            .in_ids(&failures.iter().map(|f| f.id).collect::<Vec<_>>());
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
    synchronous_commit: bool,
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
    held_by(&mut q, relay_id, ids, synchronous_commit);
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
    // Durable: a renewal lost in a crash would shorten a lease still in use (and it runs only
    // every third of a lease).
    held_by(&mut q, relay_id, ids, true);
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
             AND retry_count >= max_retry_count AND id",
            DB::DIALECT.status_guard("publish_status")
        ))
        .in_ids(ids);
    q.execute(conn).await
}

/// In progress with an expired lease -> failed, due at `retry_at`. With `without_gap_locks`
/// (MySQL, see [`Claim::without_gap_locks`]) the statement runs in a transaction at `READ
/// COMMITTED`: at the server's default it locked the gap before the first leased row in the
/// status index, where every new pending event goes, and producers' inserts waited for it.
pub(crate) async fn recover_expired<DB: Backend>(
    conn: &mut DB::Connection,
    table: &TableName,
    now: DateTime<Utc>,
    retry_at: DateTime<Utc>,
    reason: &str,
    without_gap_locks: bool,
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
    match DB::DIALECT.begin_without_gap_locks() {
        Some(begin) if without_gap_locks => {
            let begin = sqlx::SqlSafeStr::into_sql_str(begin);
            let mut tx = sqlx::Connection::begin_with(&mut *conn, begin).await?;
            let recovered = q.execute(&mut tx).await?;
            tx.commit().await?;
            Ok(recovered)
        }
        _ => q.execute(conn).await,
    }
}

#[cfg(test)]
mod tests {
    use super::AggregateOrder::{self, *};

    #[test]
    fn orders_survive_their_codes_and_an_unknown_code_is_the_one_probe() {
        for order in [
            Unordered,
            OneProbe,
            PreviousEvent,
            ProbePerStatus,
            NearestEarlier,
        ] {
            assert_eq!(AggregateOrder::from_code(order.code()), order);
        }
        assert_eq!(AggregateOrder::from_code(200), OneProbe);
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn only_the_previous_event_order_names_an_index() {
        let table = crate::table::TableName::new("biz_outbox_event").unwrap();
        let previous = super::no_earlier_unpublished::<sqlx::MySql>(&table, PreviousEvent);
        assert!(
            previous.contains("p.aggregate_sequence = o.aggregate_sequence - 1"),
            "{previous}"
        );
        assert!(
            previous.contains("p FORCE INDEX (uk_aggregate_sequence) WHERE"),
            "{previous}"
        );
        for order in [OneProbe, ProbePerStatus] {
            let probe = super::no_earlier_unpublished::<sqlx::MySql>(&table, order);
            assert!(!probe.contains("FORCE INDEX"), "{probe}");
        }
        assert_eq!(
            super::no_earlier_unpublished::<sqlx::MySql>(&table, Unordered),
            ""
        );
    }

    /// PostgreSQL's lean profile: the nearest earlier event that counts, as a condition of its
    /// own (see [`NearestEarlier`]).
    #[cfg(feature = "postgres")]
    #[test]
    fn the_nearest_earlier_event_decides_as_a_condition_of_its_own() {
        let table = crate::table::TableName::new("biz_outbox_event").unwrap();
        let nearest = super::no_earlier_unpublished::<sqlx::Postgres>(&table, NearestEarlier);
        assert!(
            nearest.starts_with(
                " AND (o.aggregate_sequence = 1 OR ((SELECT p.publish_status = 2 \
                 FROM biz_outbox_event p"
            ),
            "{nearest}"
        );
        assert!(
            nearest.ends_with(
                "AND p.deleted = 0 AND p.publish_status <> 4 \
                 ORDER BY p.aggregate_sequence DESC LIMIT 1) IS NOT FALSE))"
            ),
            "{nearest}"
        );
    }
}
