//! `eventctl migrate --index-profile`: lean on PostgreSQL takes the seed's operational indexes
//! off the outbox table, seed brings them back; lean on SQLite is refused with the reason.

use std::process::Command;

use event_tests::db::TestDb;

fn migrate(db_url: &str, profile: &str) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_eventctl"))
        .args([
            "migrate",
            "--database-url",
            db_url,
            "--index-profile",
            profile,
        ])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn has_index(db: &TestDb<sqlx::Postgres>, name: &str) -> bool {
    sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM pg_indexes WHERE indexname = $1")
        .bind(name)
        .fetch_one(db.pool())
        .await
        .unwrap()
        == 1
}

#[tokio::test]
async fn lean_and_back_on_postgres() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (code, out, err) = migrate(&db.url, "lean");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Lean index profile"), "{out}");
    assert!(!has_index(&db, "outbox_idx_trace_id").await);
    assert!(has_index(&db, "outbox_lean_idx_in_progress").await);

    let (code, _, err) = migrate(&db.url, "seed");
    assert_eq!(code, 0, "{err}");
    assert!(has_index(&db, "outbox_idx_trace_id").await);
    assert!(!has_index(&db, "outbox_lean_idx_in_progress").await);
    db.cleanup().await;
}

#[tokio::test]
async fn lean_is_refused_on_sqlite() {
    let db = TestDb::sqlite().await.unwrap();
    let (code, _, err) = migrate(&db.url, "lean");
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("--index-profile lean exists for PostgreSQL only"),
        "{err}"
    );

    db.cleanup().await;
}
