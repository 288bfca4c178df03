//! The three databases: what differs between PostgreSQL, MySQL/MariaDB and SQLite, all here.
//!
//! The statements in the sibling modules are written once, as plain generic Rust over
//! [`Backend`]. What they cannot write generically lives in this module:
//! - [`Dialect`] says which SQL shape a database takes (claims, upserts, limited deletes, how a
//!   unique key is named in its errors);
//! - [`Backend`] binds values, runs statements and reads columns with each database's concrete
//!   sqlx types (ids are `BIGINT UNSIGNED` on MySQL, statuses `SMALLINT` on PostgreSQL), through
//!   one short macro, [`impl_backend!`], expanded once per database.

mod backend;
mod statement;

pub use backend::Backend;
pub(crate) use statement::Columns;
pub(crate) use statement::{Sql, Value};

/// The SQL dialect of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MySQL 8 / MariaDB 10.11.
    MySql,
    /// SQLite.
    Sqlite,
}

impl Dialect {
    /// Whether `UPDATE ... RETURNING` exists: a claim is then one statement.
    pub(crate) fn has_returning(self) -> bool {
        matches!(self, Dialect::Postgres | Dialect::Sqlite)
    }

    /// Whether the database takes writers concurrently (SQLite has one writer).
    pub(crate) fn concurrent_writers(self) -> bool {
        !matches!(self, Dialect::Sqlite)
    }

    /// Whether several transactions of one consumer can record their batches in the inbox at
    /// once: it takes concurrent writers, and an insert that tells the new events by
    /// `RETURNING` (without it, MySQL reads the inbox rows `FOR UPDATE` first, locking the gaps
    /// where the other transactions insert theirs).
    pub(crate) fn concurrent_inbox_batches(self) -> bool {
        self.concurrent_writers() && self.has_returning()
    }

    /// The row lock a claim's candidate query takes, so that concurrent relays pass over each
    /// other's rows instead of waiting.
    pub(crate) fn skip_locked(self) -> &'static str {
        match self {
            Dialect::Postgres | Dialect::MySql => " FOR UPDATE SKIP LOCKED",
            Dialect::Sqlite => "",
        }
    }

    /// What ends the claim's per-aggregate `NOT EXISTS` subquery. On PostgreSQL, `OFFSET 0`
    /// keeps the planner from turning it into an anti join, whose plan depends on the
    /// statistics: taken before a backlog was committed (or while the server had not yet counted
    /// its rows, which it does up to a second late), they say the table is empty, and the anti
    /// join then reads every unpublished row for each candidate, a second or more per claim of
    /// a 20,000-event backlog. Kept a subquery, it runs once per candidate as an index-only probe
    /// of `outbox_idx_unpublished_aggregate`, whatever the statistics say.
    pub(crate) fn per_row_subquery(self) -> &'static str {
        match self {
            Dialect::Postgres => " OFFSET 0",
            Dialect::MySql | Dialect::Sqlite => "",
        }
    }

    /// How a claim's UPDATE names the rows its subquery picks: `(open, close)` around the
    /// subquery. On PostgreSQL `id = ANY(ARRAY(subquery))` runs the subquery once, as an
    /// InitPlan: written `id IN (subquery)`, a planner whose statistics say the backlog is empty
    /// (taken before it grew) runs the subquery again for every pending row, and one claim over a
    /// backlog of thousands takes minutes. SQLite builds `IN (subquery)` once.
    pub(crate) fn claimed_ids(self) -> (&'static str, &'static str) {
        match self {
            Dialect::Postgres => ("id = ANY(ARRAY(", "))"),
            Dialect::MySql | Dialect::Sqlite => ("id IN (", ")"),
        }
    }

    /// How to begin a transaction that reads, then writes: SQLite takes the write lock at once
    /// (`BEGIN IMMEDIATE`), since a read transaction that later writes while another writer
    /// committed fails as `database is locked` instead of waiting.
    pub(crate) fn begin_writing(self) -> Option<&'static str> {
        match self {
            Dialect::Sqlite => Some("BEGIN IMMEDIATE"),
            Dialect::Postgres | Dialect::MySql => None,
        }
    }

    /// How to begin a claim's transaction where its locking read would otherwise lock gaps.
    ///
    /// MySQL and MariaDB default to `REPEATABLE READ`, under which `SELECT ... FOR UPDATE SKIP
    /// LOCKED` also locks the gaps it scans: a claim that reads to the end of the claimable
    /// rows (any claim that finds fewer than a batch) locks the place where every new pending
    /// event goes, and each producer's INSERT waits until the claim commits. Under `READ
    /// COMMITTED` a locking read locks only the rows it returns. The claim needs nothing more:
    /// it leases the rows it locked, and its per-aggregate check reads committed rows either
    /// way. `SET TRANSACTION` without a scope sets the next transaction only, and it goes to the
    /// server in one message with the `START TRANSACTION` it sets: sent as a statement of its
    /// own, a caller dropping the claim between the two would return the connection to the pool
    /// with the level still pending, for whatever transaction the application begins on it next.
    pub(crate) fn begin_without_gap_locks(self) -> Option<&'static str> {
        match self {
            Dialect::MySql => {
                Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
            }
            Dialect::Postgres | Dialect::Sqlite => None,
        }
    }

    /// The statement that makes the rest of a transaction plan each statement for its values.
    /// PostgreSQL switches a prepared statement to a generic plan after five runs; for an
    /// `id IN (<1000 values>)` against a table of millions, the generic plan scans the table
    /// where the values' plan reads 1000 index entries.
    pub(crate) fn plan_for_values(self) -> Option<&'static str> {
        match self {
            Dialect::Postgres => Some("SET LOCAL plan_cache_mode = force_custom_plan"),
            Dialect::MySql | Dialect::Sqlite => None,
        }
    }

    /// The guard on the status column of an UPDATE that names its rows by id (a claim, the
    /// relay's marks). The unary `+` keeps the planner from answering it from a status index, or
    /// a partial index over some statuses, instead of looking the ids up: on PostgreSQL, whose
    /// statistics count few live rows in those indexes, a scan of one otherwise visits every dead
    /// entry earlier claims and marks left behind (3,042 for 4 live rows, measured in a claim),
    /// at every statement until vacuum.
    pub(crate) fn status_guard(self, column: &str) -> String {
        match self {
            Dialect::Sqlite | Dialect::Postgres => format!("+{column}"),
            Dialect::MySql => column.to_owned(),
        }
    }

    /// The ORDER BY of a claim, in the order of an index so that the scan stops after `limit` rows
    /// instead of sorting the backlog or walking the published history: the partial index
    /// `outbox_idx_claimable (id)` on PostgreSQL; `idx_status_retry_time`, whose entries end with
    /// the row id, on MySQL and SQLite. SQLite's planner, without statistics, would otherwise sort
    /// every pending row, and with statistics taken on a fresh backlog, scan the published rows by
    /// id.
    pub(crate) fn claim_order(self) -> &'static str {
        match self {
            Dialect::Postgres => " ORDER BY o.id",
            Dialect::MySql | Dialect::Sqlite => {
                " ORDER BY o.publish_status, o.next_retry_time, o.retry_count, o.id"
            }
        }
    }

    /// A condition that always holds and, on PostgreSQL, lets the statement's own transaction
    /// commit without waiting for its WAL to reach the disk (`synchronous_commit = off` for
    /// that transaction alone, through `set_config(.., true)`, evaluated once as an InitPlan):
    /// one round trip, and nothing left set on the pooled connection. For the relay's claims,
    /// marks and give-backs, whose loss in a crash only publishes an event again (see
    /// [`RelayConfig::synchronous_commit`](crate::RelayConfig::synchronous_commit)). MySQL and
    /// SQLite have no such setting per transaction: `None`.
    pub(crate) fn commit_without_flush(self) -> Option<&'static str> {
        match self {
            Dialect::Postgres => {
                Some(" AND (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL")
            }
            Dialect::MySql | Dialect::Sqlite => None,
        }
    }

    /// `SELECT 1 ... WHERE `: a query of one row when its condition holds, of none otherwise.
    pub(crate) fn select_one_where(self) -> &'static str {
        match self {
            Dialect::MySql => "SELECT 1 FROM DUAL WHERE ",
            Dialect::Postgres | Dialect::Sqlite => "SELECT 1 WHERE ",
        }
    }

    /// The tail of an INSERT that leaves an existing row with the same `key` untouched.
    ///
    /// MySQL has no `ON CONFLICT`; there the duplicate "updates" `touch` to itself. sqlx connects
    /// to MySQL with CLIENT_FOUND_ROWS, under which that reports 1 row like an insert would, so
    /// `touch` must change the row: callers pass an expression such as `deliveries = deliveries
    /// + 1`, and a duplicate then reports 2.
    pub(crate) fn insert_ignoring_duplicate(self, key: &str, touch: &str) -> String {
        match self {
            Dialect::MySql => format!(" ON DUPLICATE KEY UPDATE {touch}"),
            Dialect::Postgres | Dialect::Sqlite => format!(" ON CONFLICT ({key}) DO NOTHING"),
        }
    }

    /// The tail of an INSERT that, on a duplicate `key`, updates the existing row: each
    /// `(column, merge)` says how the column takes the new value.
    pub(crate) fn upsert(self, table: &str, key: &str, sets: &[(&str, Merge)]) -> String {
        let sets: Vec<String> = sets
            .iter()
            .map(|&(column, merge)| {
                let (old, new) = match self {
                    Dialect::MySql => (column.to_owned(), format!("VALUES({column})")),
                    Dialect::Postgres | Dialect::Sqlite => {
                        (format!("{table}.{column}"), format!("excluded.{column}"))
                    }
                };
                match merge {
                    Merge::New => format!("{column} = {new}"),
                    Merge::Add => format!("{column} = {old} + {new}"),
                    Merge::Set(value) => format!("{column} = {value}"),
                }
            })
            .collect();
        match self {
            Dialect::MySql => format!(" ON DUPLICATE KEY UPDATE {}", sets.join(", ")),
            Dialect::Postgres | Dialect::Sqlite => {
                format!(" ON CONFLICT ({key}) DO UPDATE SET {}", sets.join(", "))
            }
        }
    }

    /// A `DELETE` of at most a limit of rows, as `(head, tail)`: the statement is `head`, the
    /// condition, ` LIMIT `, the limit, then `tail`. MySQL takes `LIMIT` on a DELETE; PostgreSQL
    /// and SQLite delete by their physical row id from a limited SELECT.
    pub(crate) fn limited_delete(self, table: &str) -> (String, &'static str) {
        match self {
            Dialect::MySql => (format!("DELETE FROM {table} WHERE "), ""),
            Dialect::Postgres => (
                format!("DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table} WHERE "),
                ")",
            ),
            Dialect::Sqlite => (
                format!("DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE "),
                ")",
            ),
        }
    }

    /// The statement that refreshes the planner's statistics of `table`, where plans depend on
    /// them: MySQL picks the claim's status index only when it knows how few rows are
    /// claimable, PostgreSQL plans the console's and the operators' queries with them. SQLite's
    /// claim is written in index order and needs none.
    pub(crate) fn analyze(self, table: &str) -> Option<String> {
        match self {
            Dialect::Postgres => Some(format!("ANALYZE {table}")),
            Dialect::MySql => Some(format!("ANALYZE TABLE {table}")),
            Dialect::Sqlite => None,
        }
    }

    /// A query of one row when the statistics of the table are missing or stale, as the text
    /// before and after the table's name (bound between them): never taken, by hand or by the
    /// server's background work (PostgreSQL's autovacuum), or taken when the table was less than
    /// half its size on disk (a bulk load that autovacuum has not caught up with). Other
    /// databases keep statistics as rows change, or need none.
    pub(crate) fn stale_statistics(self) -> Option<(&'static str, &'static str)> {
        match self {
            Dialect::Postgres => Some((
                "SELECT 1 FROM pg_stat_user_tables JOIN pg_class ON pg_class.oid = relid \
                 WHERE relid = to_regclass(",
                ") AND ((last_analyze IS NULL AND last_autoanalyze IS NULL) \
                 OR pg_relation_size(relid) \
                 > (2 * relpages + 16)::bigint * current_setting('block_size')::bigint)",
            )),
            Dialect::MySql | Dialect::Sqlite => None,
        }
    }

    /// A statement run once on a database before its migrations: SQLite switches the file to
    /// WAL, so that relays read while the service writes and a commit appends to one log
    /// instead of rewriting a rollback journal. The setting stays with the file.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
        allow(dead_code)
    )]
    pub(crate) fn before_migrations(self) -> Option<&'static str> {
        match self {
            Dialect::Sqlite => Some("PRAGMA journal_mode = WAL"),
            Dialect::Postgres | Dialect::MySql => None,
        }
    }

    /// The name of the unique key a duplicate violated, as the migrations name it, or `None`
    /// when `error` is not a unique violation. PostgreSQL names the index; MySQL names the key
    /// in its message (`... for key 'uk_aggregate_sequence'`, qualified by the table on MySQL 8);
    /// SQLite names only the columns, which are mapped back to the key that has them.
    pub(crate) fn violated_key(self, error: &sqlx::Error) -> Option<String> {
        let db = error.as_database_error()?;
        if !db.is_unique_violation() {
            return None;
        }
        match self {
            Dialect::Postgres => db.constraint().map(str::to_owned),
            Dialect::MySql => {
                let message = db.message();
                let key = message.rsplit_once("for key '")?.1.trim_end_matches('\'');
                Some(key.rsplit('.').next().unwrap_or(key).to_owned())
            }
            Dialect::Sqlite => {
                let columns = db.message().strip_prefix("UNIQUE constraint failed: ")?;
                let columns: Vec<&str> = columns
                    .split(", ")
                    .map(|c| c.rsplit('.').next().unwrap_or(c))
                    .collect();
                SQLITE_UNIQUE_KEYS
                    .iter()
                    .find(|(key_columns, _)| *key_columns == columns.as_slice())
                    .map(|(_, name)| (*name).to_owned())
            }
        }
    }

    /// The values of the duplicate key, where the database's error carries them: PostgreSQL's
    /// detail `Key (a, b, c)=(x, y, z) already exists.` gives `x, y, z`; MySQL's message
    /// `Duplicate entry 'x-y-z' for key ...` gives `x-y-z`. SQLite carries none.
    pub(crate) fn duplicate_values(self, error: &sqlx::Error) -> Option<String> {
        let db = error.as_database_error()?;
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => {
                let detail = db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?
                    .detail()?;
                let values = detail.split_once(")=(")?.1;
                Some(values.rsplit_once(") already exists")?.0.to_owned())
            }
            Dialect::MySql => {
                let message = db.message();
                let values = message.strip_prefix("Duplicate entry '")?;
                Some(values.rsplit_once("' for key")?.0.to_owned())
            }
            _ => None,
        }
    }
}

/// How an upsert updates a column of the row that was already there.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Merge {
    /// Takes the new value.
    New,
    /// Adds the new value to the old one.
    Add,
    /// Takes a fixed value (a status code).
    Set(i16),
}

/// The unique keys of the SQLite migrations, by their columns: SQLite's error names only the
/// columns.
const SQLITE_UNIQUE_KEYS: &[(&[&str], &str)] = &[
    (&["event_no"], "outbox_uk_event_no"),
    (
        &["aggregate_type", "aggregate_id", "aggregate_sequence"],
        "outbox_uk_aggregate_sequence",
    ),
    (&["consumer", "event_id"], "quarantine_uk_consumer_event"),
];

#[cfg(test)]
mod tests {
    use super::Value;
    use chrono::{TimeZone, Utc};

    fn literal(value: Value<'_>) -> Option<String> {
        let mut out = String::new();
        value.push_pg_literal(&mut out).then_some(out)
    }

    #[test]
    fn pg_literals_escape_what_an_escape_string_gives_meaning_to() {
        assert_eq!(
            literal(Value::Str(r"it's \ here")).unwrap(),
            r"E'it''s \\ here'"
        );
        assert_eq!(literal(Value::Str("")).unwrap(), "E''");
        assert_eq!(literal(Value::OptStr(None)).unwrap(), "NULL");
        assert_eq!(literal(Value::I64(-42)).unwrap(), "-42");
        let time = Utc.timestamp_opt(1_700_000_000, 123_456_789).unwrap();
        assert_eq!(
            literal(Value::Time(time)).unwrap(),
            "'2023-11-14T22:13:20.123456+00:00'"
        );
        let json = serde_json::json!({"text": "a'b\\c\u{0}"});
        assert_eq!(
            literal(Value::Json(&json)).unwrap(),
            r#"E'{"text":"a''b\\\\c\\u0000"}'"#
        );
        assert_eq!(literal(Value::Str("nul\0")), None);
    }
}
