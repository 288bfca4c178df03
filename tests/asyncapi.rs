//! The AsyncAPI document, checked by AsyncAPI's own tools (`tools/asyncapi`, pinned npm
//! packages): the documents of the README's example service and of these tests' events pass
//! `asyncapi validate` for every broker and wire format, and `@asyncapi/diff` between two
//! versions of a service calls an added optional field non-breaking and a removed field
//! breaking.

use std::path::{Path, PathBuf};
use std::process::Command;

use event_sqlx::asyncapi::{AsyncApi, Protocol};
use event_sqlx::{OutboxConfig, Route, WireFormat};
use event_tests::fixtures::OrderPaid;
use serde_json::{Value, json};

fn tools() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tools/asyncapi");
    if dir.join("node_modules/.bin/asyncapi").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var("EVENT_TEST_REQUIRE_SERVICES").as_deref() != Ok("1"),
        "the AsyncAPI tools are not installed: npm ci --prefix tools/asyncapi"
    );
    eprintln!("skipped: the AsyncAPI tools are not installed (npm ci --prefix tools/asyncapi)");
    None
}

fn write(dir: &Path, name: &str, document: &Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(document).unwrap()).unwrap();
    path
}

/// Runs `program` with `args` in `tools`, without telemetry; (exit code, stdout, stderr).
fn run(tools: &Path, program: &str, args: &[&Path]) -> (i32, String, String) {
    let out = Command::new(program)
        .args(args)
        .current_dir(tools)
        .env("ASYNCAPI_METRICS", "false")
        .env("SUPPRESS_NO_CONFIG_WARNING", "1")
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn validate(tools: &Path, file: &Path) {
    let cli = tools.join("node_modules/.bin/asyncapi");
    let args = [
        Path::new("validate"),
        Path::new("--fail-severity=warn"),
        file,
    ];
    let (code, stdout, stderr) = run(tools, cli.to_str().unwrap(), &args);
    assert_eq!(
        code,
        0,
        "asyncapi validate {}:\n{stdout}\n{stderr}",
        file.display()
    );
}

/// The routes of the README's service and of the tests' order events.
fn routes() -> OutboxConfig {
    let route = |key: &str| Route::topic("orders").routing_key(key);
    OutboxConfig::new()
        .route("ORDER_PLACED", route("order.placed"))
        .route("ORDER_PAID", route("order.paid"))
}

const PROTOCOLS: [Protocol; 3] = [Protocol::Nats, Protocol::Amqp, Protocol::Kafka];
const FORMATS: [WireFormat; 3] = [
    WireFormat::Envelope,
    WireFormat::CloudEventsBinary,
    WireFormat::CloudEventsStructured,
];

#[test]
fn every_document_passes_asyncapi_validate() {
    let Some(tools) = tools() else {
        return;
    };
    let dir = tempdir();
    for protocol in PROTOCOLS {
        for format in FORMATS {
            let readme = AsyncApi::new("order-service", "1.0.0")
                .protocol(protocol)
                .format(format)
                .server("127.0.0.1:4222")
                // The README's OrderPaid: the fixture has its type, version and fields.
                .with::<OrderPaid>()
                .document(&routes())
                .unwrap();
            let name = format!("readme-{protocol:?}-{format}.json");
            validate(&tools, &write(&dir, &name, &readme));
            // Every event these tests derive (the fixtures' orders, notes, payments, ...).
            let tests = AsyncApi::new("event-tests", "1.0.0")
                .protocol(protocol)
                .format(format)
                .registered()
                .document(&routes())
                .unwrap();
            let messages = tests["components"]["messages"].as_object().unwrap();
            assert!(messages.len() >= 3, "{:?}", messages.keys());
            let name = format!("tests-{protocol:?}-{format}.json");
            validate(&tools, &write(&dir, &name, &tests));
        }
    }
}

#[test]
fn the_document_carries_routes_versions_headers_and_the_key() {
    let v1 = json!({"type": "object", "properties": {"order_id": {"type": "string"}}, "x-aggregate-type": "ORDER"});
    let v2 = json!({"type": "object", "properties": {"order_id": {"type": "string"}, "amount_minor": {"type": "integer"}}, "x-aggregate-type": "ORDER"});
    let doc = AsyncApi::new("order-service", "2.0.0")
        .protocol(Protocol::Kafka)
        .format(WireFormat::CloudEventsBinary)
        .event("ORDER_PLACED", 1, v1)
        .event("ORDER_PLACED", 2, v2)
        .document(&routes())
        .unwrap();
    let channel = &doc["channels"]["orders"];
    assert_eq!(channel["address"], "orders");
    assert_eq!(channel["bindings"]["kafka"]["topic"], "orders");
    let keys: Vec<&String> = channel["messages"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["ORDER_PLACED-v1", "ORDER_PLACED-v2"]);
    let message = &doc["components"]["messages"]["ORDER_PLACED-v2"];
    let headers = &message["headers"]["properties"];
    assert_eq!(headers["ce_type"]["const"], "ORDER_PLACED");
    assert_eq!(
        headers["ce_dataschema"]["const"],
        "urn:event-type:ORDER_PLACED:v2"
    );
    assert_eq!(headers["ce_aggregatetype"]["const"], "ORDER");
    assert_eq!(
        message["payload"]["properties"]["amount_minor"]["type"],
        "integer"
    );
    assert!(
        message["bindings"]["kafka"]["key"]["description"]
            .as_str()
            .unwrap()
            .contains("aggregate id")
    );
    assert_eq!(
        message["correlationId"]["location"],
        "$message.header#/ce_id"
    );
    assert_eq!(doc["operations"]["send-ORDER_PLACED-v2"]["action"], "send");
}

#[test]
fn asyncapi_diff_calls_an_added_optional_field_safe_and_a_removed_field_breaking() {
    let Some(tools) = tools() else {
        return;
    };
    let dir = tempdir();
    let service = |schema: Value| {
        AsyncApi::new("order-service", "1.0.0")
            .protocol(Protocol::Amqp)
            .event("ORDER_PLACED", 1, schema)
            .document(&routes())
            .unwrap()
    };
    let before = json!({"type": "object", "required": ["order_id", "amount_minor"], "properties": {"order_id": {"type": "string"}, "amount_minor": {"type": "integer"}}});
    let mut added = before.clone();
    added["properties"]["note"] = json!({"type": ["string", "null"]});
    let mut removed = before.clone();
    removed["properties"]
        .as_object_mut()
        .unwrap()
        .remove("amount_minor");
    removed["required"] = json!(["order_id"]);
    let before = write(&dir, "before.json", &service(before));
    let added = write(&dir, "added.json", &service(added));
    let removed = write(&dir, "removed.json", &service(removed));
    let diff = |a: &Path, b: &Path| {
        let (code, stdout, stderr) = run(&tools, "node", &[Path::new("diff.js"), a, b]);
        assert!(code == 0 || code == 1, "diff.js: {stdout}\n{stderr}");
        (code, serde_json::from_str::<Value>(&stdout).unwrap())
    };
    let (code, changes) = diff(&before, &added);
    assert_eq!(code, 0, "{changes:#}");
    assert!(changed(&changes, "nonBreaking", "note"), "{changes:#}");
    let (code, changes) = diff(&before, &removed);
    assert_eq!(code, 1, "{changes:#}");
    assert!(changed(&changes, "breaking", "amount_minor"), "{changes:#}");
}

/// Whether the diff lists, among its `kind` changes, the payload field `field`.
fn changed(changes: &Value, kind: &str, field: &str) -> bool {
    let suffix = format!("/payload/properties/payload/properties/{field}");
    let listed = changes[kind].as_array().unwrap();
    listed
        .iter()
        .any(|c| c["path"].as_str().unwrap().ends_with(&suffix))
}

/// A fresh directory under the target directory, for the documents a test writes.
fn tempdir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(event_tests::db::unique("asyncapi"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
