//! `eventctl schema check --dir schemas [--against GIT_REV]` on a scratch git repository.

use std::path::Path;
use std::process::Command;

fn run(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_eventctl"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn git(dir: &Path, args: &[&str]) {
    let ok = Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .output()
        .unwrap()
        .status
        .success();
    assert!(ok, "git {args:?}");
}

fn snapshot(fields: &[&str], required: &[&str], upcaster: bool) -> String {
    let properties: serde_json::Map<String, serde_json::Value> = fields
        .iter()
        .map(|f| (f.to_string(), serde_json::json!({"type": "string"})))
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "x-event-snapshot": {"compatibility": "BACKWARD_TRANSITIVE", "upcasterFromPrevious": upcaster}
    }))
    .unwrap()
}

#[test]
fn snapshots_are_checked_against_history_and_a_git_base() {
    let repo = std::env::temp_dir().join(format!("schema-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&repo);
    let dir = repo.join("schemas/ORDER_PAID");
    std::fs::create_dir_all(&dir).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(
        dir.join("v1.json"),
        snapshot(&["order_id"], &["order_id"], false),
    )
    .unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "v1"]);

    let (code, out) = run(
        &repo,
        &["schema", "check", "--dir", "schemas", "--against", "HEAD"],
    );
    assert_eq!(code, 0, "{out}");

    // v2 adds a required field: old data lacks it.
    std::fs::write(
        dir.join("v2.json"),
        snapshot(&["order_id", "currency"], &["order_id", "currency"], false),
    )
    .unwrap();
    let (code, out) = run(&repo, &["schema", "check", "--dir", "schemas"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("ORDER_PAID v2 breaks BackwardTransitive compatibility with v1"),
        "{out}"
    );
    assert!(
        out.contains("REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL"),
        "{out}"
    );

    // Recorded with an upcaster from v1, it passes.
    std::fs::write(
        dir.join("v2.json"),
        snapshot(&["order_id", "currency"], &["order_id", "currency"], true),
    )
    .unwrap();
    let (code, out) = run(&repo, &["schema", "check", "--dir", "schemas"]);
    assert_eq!(code, 0, "{out}");

    // Editing the released v1 in place is caught against the base revision.
    std::fs::write(
        dir.join("v1.json"),
        snapshot(&["order_id", "note"], &["order_id", "note"], false),
    )
    .unwrap();
    let (code, out) = run(
        &repo,
        &["schema", "check", "--dir", "schemas", "--against", "HEAD"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("v1.json was edited in place"), "{out}");

    // Removing it is caught too.
    std::fs::remove_file(dir.join("v1.json")).unwrap();
    let (code, out) = run(
        &repo,
        &["schema", "check", "--dir", "schemas", "--against", "HEAD"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("v1.json was removed"), "{out}");

    let (code, out) = run(&repo, &["schema", "check", "--dir", "nowhere"]);
    assert_eq!(code, 2, "{out}");
    let _ = std::fs::remove_dir_all(&repo);
}

/// A snapshot that cannot be read, is empty, is not JSON or not a schema, or whose file name is
/// ambiguous or out of range is bad input: exit 2, naming the file at fault, even when it is the
/// only version.
#[test]
fn bad_snapshots_exit_2_and_name_the_file() {
    let root = std::env::temp_dir().join(format!("schema-bad-{}", std::process::id()));
    let good = snapshot(&["order_id"], &["order_id"], false);
    // (the files of one event type, the file at fault, what the line says)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: &[Case<'_>] = &[
        (&[("v1.json", "")], "v1.json", "is empty"),
        (&[("v1.json", "{\"type\": ")], "v1.json", "not JSON"),
        (&[("v1.json", "[1, 2]")], "v1.json", "not a schema"),
        (
            &[("v1.json", r#"{"type":"object","properties":[1,2]}"#)],
            "v1.json",
            "#/properties",
        ),
        (
            &[("v1.json", &good), ("v2.json", "[1, 2]")],
            "v2.json",
            "not a schema",
        ),
        (
            &[("v1.json", &good), ("v01.json", &good)],
            "v1.json",
            "v01.json",
        ),
        (&[("v0.json", &good)], "v0.json", "versions start at 1"),
        (
            &[("v99999999999.json", &good)],
            "v99999999999.json",
            "out of range",
        ),
        (
            &[("vlatest.json", &good)],
            "vlatest.json",
            "not a snapshot name",
        ),
    ];
    for (files, at_fault, reason) in cases {
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join("ORDER_PAID");
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in *files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let (code, out) = run(&root, &["schema", "check", "--dir", "."]);
        assert_eq!(code, 2, "{files:?}: {out}");
        let line = out
            .lines()
            .find(|l| l.contains(reason))
            .unwrap_or_else(|| panic!("{files:?}: no `{reason}` in {out}"));
        assert!(
            line.contains(at_fault),
            "{files:?}: names {at_fault}: {line}"
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn schema_asyncapi_writes_every_snapshot_version_on_its_route() {
    let repo = std::env::temp_dir().join(format!("schema-asyncapi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&repo);
    let dir = repo.join("schemas/ORDER_PAID");
    std::fs::create_dir_all(&dir).unwrap();
    for (version, fields) in [(1, &["order_id"][..]), (2, &["order_id", "currency"][..])] {
        let file = dir.join(format!("v{version}.json"));
        std::fs::write(file, snapshot(fields, &["order_id"], false)).unwrap();
    }
    let args = [
        "schema",
        "asyncapi",
        "--title",
        "order-service",
        "--protocol",
        "amqp",
        "--format",
        "binary",
        "--route",
        "ORDER_PAID=orders:order.paid",
    ];
    let (code, out) = run(&repo, &args);
    assert_eq!(code, 0, "{out}");
    let document: serde_json::Value = serde_json::from_str(&out).unwrap();
    let channel = &document["channels"]["orders-order_paid"];
    assert_eq!(channel["address"], "order.paid");
    assert_eq!(channel["bindings"]["amqp"]["exchange"]["name"], "orders");
    let messages: Vec<&String> = channel["messages"].as_object().unwrap().keys().collect();
    assert_eq!(messages, ["ORDER_PAID-v1", "ORDER_PAID-v2"]);
    let payload = &document["components"]["messages"]["ORDER_PAID-v2"]["payload"];
    assert_eq!(payload["properties"]["currency"]["type"], "string");
    assert!(payload.get("x-event-snapshot").is_none(), "{payload}");

    let (code, out) = run(
        &repo,
        &[
            "schema",
            "asyncapi",
            "--title",
            "s",
            "--route",
            "ORDER_PAID",
        ],
    );
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("write EVENT_TYPE=TOPIC or EVENT_TYPE=TOPIC:ROUTING_KEY"),
        "{out}"
    );
    let (code, out) = run(
        &repo,
        &["schema", "asyncapi", "--title", "s", "--protocol", "mqtt"],
    );
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("use nats, amqp (RabbitMQ) or kafka"), "{out}");
    let _ = std::fs::remove_dir_all(&repo);
}
