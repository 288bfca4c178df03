//! What the build-time snapshot check costs: a crate with `events` derived events is compiled
//! with their snapshots beside it and without (the same crate, its `schemas/` moved away),
//! alternately, five times each, its dependencies already built. The median of each and their
//! ratio go to benches/results/derive-build.json.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn write_crate(dir: &Path, repo: &Path, events: usize) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("src"))?;
    let core = repo.join("event-core");
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"derive-build\"\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n\
             [workspace]\n\n[dependencies]\nevent-core = {{ path = {core:?} }}\n\
             serde = {{ version = \"1\", features = [\"derive\"] }}\nschemars = \"1.2\"\n"
        ),
    )?;
    std::fs::copy(repo.join("Cargo.lock"), dir.join("Cargo.lock"))?;
    let mut source = String::new();
    for i in 0..events {
        let event_type = format!("BENCH_EVENT_{i}");
        source.push_str(&format!(
            "#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, event_core::DomainEvent)]\n\
             #[domain_event(event_type = \"{event_type}\", aggregate = \"ORDER\")]\n\
             pub struct Event{i} {{\n    #[domain_event(aggregate_id)]\n    pub order_id: String,\n    \
             pub amount_minor: i64,\n    pub lines: Vec<String>,\n    pub note: Option<String>,\n}}\n\n"
        ));
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "order_id": { "type": "string" },
                "amount_minor": { "type": "integer", "format": "int64" },
                "lines": { "type": "array", "items": { "type": "string" } },
                "note": { "type": ["string", "null"] },
            },
            "required": ["order_id", "amount_minor", "lines"],
            "x-event-type": event_type,
            "x-event-version": 1,
        });
        let type_dir = dir.join("schemas").join(&event_type);
        std::fs::create_dir_all(&type_dir)?;
        std::fs::write(
            type_dir.join("v1.json"),
            serde_json::to_string_pretty(&schema)?,
        )?;
    }
    std::fs::write(dir.join("src/lib.rs"), source)?;
    Ok(())
}

fn build(dir: &Path, target: &Path) -> anyhow::Result<f64> {
    // A change to the crate's source, so that it (and only it) is compiled again.
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let lib = dir.join("src/lib.rs");
    let text = std::fs::read_to_string(&lib)?;
    let body = text
        .split_once("// build ")
        .map_or(text.as_str(), |(head, _)| head);
    std::fs::write(&lib, format!("{body}// build {n}\n"))?;
    let started = Instant::now();
    let out = Command::new("cargo")
        .args(["build", "--quiet"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        // The whole crate compiled each time, not what incremental compilation can reuse.
        .env("CARGO_INCREMENTAL", "0")
        .env_remove("EVENT_SNAPSHOT_DIR")
        .output()?;
    let secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        out.status.success(),
        "the generated crate did not build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(secs)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

pub(crate) fn run(events: usize) -> anyhow::Result<()> {
    let repo = std::env::current_dir()?;
    let dir = repo.join("target/derive-build/crate");
    let target = repo.join("target/derive-build/target");
    write_crate(&dir, &repo, events)?;
    let schemas = dir.join("schemas");
    let away = dir.join("schemas-away");
    eprintln!("== building {events} derived events once to warm the dependencies");
    build(&dir, &target)?;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..5 {
        with.push(build(&dir, &target)?);
        std::fs::rename(&schemas, &away)?;
        let result = build(&dir, &target);
        std::fs::rename(&away, &schemas)?;
        without.push(result?);
        eprintln!(
            "   round {round}: with snapshots {:.2} s, without {:.2} s",
            with[round], without[round]
        );
    }
    let (with, without) = (median(with), median(without));
    let report = serde_json::json!({
        "machine": crate::machine(),
        "measuredAt": chrono::Utc::now(),
        "events": events,
        "withSnapshotsSeconds": with,
        "withoutSnapshotsSeconds": without,
        "ratio": with / without,
    });
    crate::write_result("benches/results/derive-build.json", &report)?;
    Ok(())
}
