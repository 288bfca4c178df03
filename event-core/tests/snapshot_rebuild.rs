//! The build-time snapshot check is part of the build: a crate with a derived event builds
//! against its committed snapshot, is not rebuilt when nothing changed, and is rebuilt, with the
//! new finding as a compile error, when the snapshot on disk changes. `EVENT_SNAPSHOT_DIR=off`
//! turns the check off (and changing it rebuilds too).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("event-core is inside the repository")
        .to_owned()
}

fn build(dir: &Path, repo: &Path, snapshot_dir: Option<&str>) -> Output {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--color", "never"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", repo.join("target/snapshot-crate"))
        .env_remove("RUSTFLAGS")
        .env_remove("EVENT_SNAPSHOT_DIR");
    if let Some(value) = snapshot_dir {
        command.env("EVENT_SNAPSHOT_DIR", value);
    }
    command.output().expect("run cargo")
}

const SNAPSHOT: &str = r#"{
  "type": "object",
  "properties": {
    "order_id": { "type": "string" },
    "amount": { "type": "integer", "format": "int64" }
  },
  "required": ["order_id", "amount"],
  "x-event-type": "ORDER_PAID",
  "x-event-version": 1
}
"#;

#[test]
fn editing_a_snapshot_rebuilds_the_crate_and_reports_the_finding() {
    let repo = repository();
    let dir = std::env::temp_dir().join(format!("snapshot-rebuild-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::create_dir_all(dir.join("schemas/ORDER_PAID")).unwrap();
    let core = repo.join("event-core");
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"snapshot-rebuild\"\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n\
             [workspace]\n\n[dependencies]\nevent-core = {{ path = {core:?} }}\n\
             serde = {{ version = \"1\", features = [\"derive\"] }}\nschemars = \"1.2\"\n"
        ),
    )
    .unwrap();
    std::fs::copy(repo.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    std::fs::write(
        dir.join("src/lib.rs"),
        "#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, event_core::DomainEvent)]\n\
         #[domain_event(event_type = \"ORDER_PAID\", aggregate = \"ORDER\")]\n\
         pub struct OrderPaid {\n    #[domain_event(aggregate_id)]\n    pub order_id: String,\n    pub amount: i64,\n}\n",
    )
    .unwrap();
    let snapshot = dir.join("schemas/ORDER_PAID/v1.json");
    std::fs::write(&snapshot, SNAPSHOT).unwrap();

    let first = build(&dir, &repo, None);
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(
        first.status.success(),
        "the crate matches its snapshot:\n{stderr}"
    );

    let again = build(&dir, &repo, None);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(
        !stderr.contains("Compiling snapshot-rebuild"),
        "nothing changed, nothing is rebuilt:\n{stderr}"
    );

    // The snapshot gains a property the struct does not have: the next build recompiles and
    // reports it on the struct.
    std::fs::write(
        &snapshot,
        SNAPSHOT.replace(
            r#""amount": { "type": "integer", "format": "int64" }"#,
            r#""amount": { "type": "integer", "format": "int64" }, "currency": { "type": "string" }"#,
        ),
    )
    .unwrap();
    let edited = build(&dir, &repo, None);
    let stderr = String::from_utf8_lossy(&edited.stderr);
    assert!(
        !edited.status.success(),
        "the finding fails the build:\n{stderr}"
    );
    assert!(stderr.contains("Compiling snapshot-rebuild"), "{stderr}");
    assert!(
        stderr.contains("has the property `currency`, which no field produces any more"),
        "{stderr}"
    );
    assert!(
        stderr.contains("src/lib.rs:3:12"),
        "the error is on the struct:\n{stderr}"
    );

    // Switched off by the environment: builds; and the check is back when the variable goes.
    let off = build(&dir, &repo, Some("off"));
    assert!(
        off.status.success(),
        "{}",
        String::from_utf8_lossy(&off.stderr)
    );
    let on = build(&dir, &repo, None);
    assert!(
        !on.status.success(),
        "removing the variable rebuilds and checks again:\n{}",
        String::from_utf8_lossy(&on.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
