//! The outbox table's index profiles: the seed's twelve indexes, or a lean set for PostgreSQL
//! that keeps the producer's insert to four index entries.

use super::dialect::Dialect;
use crate::config::outbox::IndexProfile;
use crate::status::EventStatus;

/// The seed's operational indexes that the lean profile takes off the outbox table (each
/// statement recreates one; the migrations created them).
const SEED_ONLY: [&str; 9] = [
    "CREATE INDEX IF NOT EXISTS outbox_idx_status_retry_time ON {t} (publish_status, next_retry_time, retry_count)",
    "CREATE INDEX IF NOT EXISTS outbox_idx_status_lock_until ON {t} (publish_status, lock_until)",
    "CREATE INDEX IF NOT EXISTS outbox_idx_aggregate ON {t} (aggregate_type, aggregate_id)",
    "CREATE INDEX IF NOT EXISTS outbox_idx_event_type_create_time ON {t} (event_type, create_time)",
    "CREATE INDEX IF NOT EXISTS outbox_idx_topic_create_time ON {t} (topic, create_time)",
    "CREATE INDEX IF NOT EXISTS outbox_idx_trace_id ON {t} (trace_id)",
    "CREATE INDEX IF NOT EXISTS outbox_idx_create_time ON {t} (create_time)",
    "CREATE INDEX IF NOT EXISTS outbox_idx_status_update_time ON {t} (publish_status, update_time)",
    "CREATE INDEX IF NOT EXISTS outbox_idx_unpublished_aggregate ON {t} (aggregate_type, aggregate_id, aggregate_sequence) WHERE publish_status IN ({pending}, {in_progress}, {failed}) AND deleted = 0",
];

/// What the lean profile puts in their place. The partial indexes hold rows only once they leave
/// `pending` (in progress, failed, final), so the producer's insert never touches them; the
/// relay's updates do. The lookups by trace id, event type and topic move to the archive. The
/// claim's per-aggregate check reads each candidate's nearest earlier event on the unique key
/// `outbox_uk_aggregate_sequence` (`AggregateOrder::NearestEarlier`) instead of a partial index
/// of the unpublished events, which a new row would enter.
const LEAN_ONLY: [&str; 6] = [
    "CREATE INDEX IF NOT EXISTS outbox_lean_idx_failed_retry ON {t} (next_retry_time, retry_count) WHERE publish_status = {failed}",
    "CREATE INDEX IF NOT EXISTS outbox_lean_idx_in_progress ON {t} (lock_until) WHERE publish_status = {in_progress}",
    "CREATE INDEX IF NOT EXISTS outbox_lean_idx_final_update_time ON {t} (update_time) WHERE publish_status IN ({succeeded}, {cancelled})",
    "CREATE INDEX IF NOT EXISTS outbox_archive_idx_trace_id ON {a} (trace_id)",
    "CREATE INDEX IF NOT EXISTS outbox_archive_idx_event_type_create_time ON {a} (event_type, create_time)",
    "CREATE INDEX IF NOT EXISTS outbox_archive_idx_topic_create_time ON {a} (topic, create_time)",
];

/// The index a `CREATE INDEX IF NOT EXISTS <name> ON ...` statement creates.
fn index_name(create: &str) -> &str {
    create
        .trim_start_matches("CREATE INDEX IF NOT EXISTS ")
        .split(' ')
        .next()
        .unwrap_or_default()
}

/// The statements that bring the tables to `profile`, idempotent (run them again and nothing
/// changes), or `None` when the dialect has no such profile.
pub(crate) fn statements(
    dialect: Dialect,
    profile: IndexProfile,
    table: &str,
    archive: &str,
) -> Option<Vec<String>> {
    // Status codes come from `EventStatus`, the one place they are defined.
    let fill = |s: &str| {
        s.replace("{t}", table)
            .replace("{a}", archive)
            .replace("{pending}", &EventStatus::Pending.code().to_string())
            .replace("{in_progress}", &EventStatus::InProgress.code().to_string())
            .replace("{succeeded}", &EventStatus::Succeeded.code().to_string())
            .replace("{failed}", &EventStatus::Failed.code().to_string())
            .replace("{cancelled}", &EventStatus::Cancelled.code().to_string())
    };
    let (create, drop) = match (profile, dialect) {
        (IndexProfile::Seed, Dialect::Postgres) => (&SEED_ONLY[..], &LEAN_ONLY[..]),
        (IndexProfile::Lean, Dialect::Postgres) => (&LEAN_ONLY[..], &SEED_ONLY[..]),
        // The migrations create the seed's profile; the lean one never ran here.
        (IndexProfile::Seed, Dialect::MySql | Dialect::Sqlite) => return Some(Vec::new()),
        (IndexProfile::Lean, Dialect::MySql | Dialect::Sqlite) => return None,
    };
    let mut out: Vec<String> = create.iter().map(|s| fill(s)).collect();
    for statement in drop {
        out.push(format!("DROP INDEX IF EXISTS {}", index_name(statement)));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lean_drops_each_seed_index_it_replaces_and_seed_restores_them() {
        let lean = statements(Dialect::Postgres, IndexProfile::Lean, "o", "a").unwrap();
        let seed = statements(Dialect::Postgres, IndexProfile::Seed, "o", "a").unwrap();
        assert!(lean.contains(&"DROP INDEX IF EXISTS outbox_idx_trace_id".to_owned()));
        assert!(
            lean.iter()
                .any(|s| s.contains("ON o (lock_until) WHERE publish_status = 1"))
        );
        assert!(
            lean.iter()
                .any(|s| s.contains("(update_time) WHERE publish_status IN (2, 4)"))
        );
        assert!(lean.iter().all(|s| !s.contains('{')), "{lean:?}");
        assert!(seed.contains(&"DROP INDEX IF EXISTS outbox_lean_idx_in_progress".to_owned()));
        assert!(
            seed.iter()
                .any(|s| s.contains("outbox_idx_trace_id ON o (trace_id)"))
        );
        assert!(lean.contains(&"DROP INDEX IF EXISTS outbox_idx_unpublished_aggregate".to_owned()));
        assert!(seed.iter().any(|s| s.contains(
            "outbox_idx_unpublished_aggregate ON o (aggregate_type, aggregate_id, \
             aggregate_sequence) WHERE publish_status IN (0, 1, 3) AND deleted = 0"
        )));
        assert_eq!(lean.len(), 6 + 9);
        assert!(statements(Dialect::MySql, IndexProfile::Lean, "o", "a").is_none());
        assert!(statements(Dialect::Sqlite, IndexProfile::Lean, "o", "a").is_none());
        assert_eq!(
            statements(Dialect::MySql, IndexProfile::Seed, "o", "a"),
            Some(Vec::new())
        );
    }
}
