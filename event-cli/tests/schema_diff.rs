//! `eventctl schema diff`: exit 0 compatible, 1 incompatible, 2 bad input with a one-line reason.

use std::path::PathBuf;
use std::process::Command;

fn write(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("eventctl-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn diff(old: &PathBuf, new: &PathBuf, extra: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_eventctl"))
        .args(["schema", "diff"])
        .arg(old)
        .arg(new)
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn exit_codes_say_compatible_incompatible_or_bad_input() {
    let v1 = write(
        "v1.json",
        r#"{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}"#,
    );
    let v2 = write(
        "v2.json",
        r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}},"additionalProperties":false}"#,
    );

    let (code, out, _) = diff(&v1, &v2, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("compatible"), "{out}");

    let (code, out, _) = diff(&v2, &v1, &["--mode", "backward"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL")
            && out.contains("#/properties/b"),
        "{out}"
    );
    assert!(out.contains("to fix:"), "{out}");

    let (code, out, _) = diff(&v1, &v2, &["--mode", "full", "--format", "json"]);
    assert_eq!(code, 1);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["compatible"], false);
    assert_eq!(report["mode"], "FULL");
    assert!(
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["breaks"] == "forward")
    );
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let good = write("good.json", r#"{"type":"string"}"#);
    let cases = [
        (
            PathBuf::from("/nonexistent/old.json"),
            "cannot read /nonexistent/old.json",
        ),
        (write("notjson.json", "{\"type\": "), "is not JSON"),
        (write("number.json", "42"), "not a schema"),
        (
            write("badtype.json", r#"{"type":"strnig"}"#),
            "`strnig` is not a JSON schema type",
        ),
        (
            write(
                "deep.json",
                &format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
            ),
            "is not JSON",
        ),
        (
            write("nested.json", &{
                let mut s = String::from(r#"{"type":"string"}"#);
                for _ in 0..100 {
                    s = format!(r#"{{"type":"array","items":{s}}}"#);
                }
                s
            }),
            "deeper than 64 levels",
        ),
    ];
    for (bad, expected) in cases {
        let (code, out, err) = diff(&bad, &good, &[]);
        assert_eq!(code, 2, "{}: {out}{err}", bad.display());
        assert!(err.contains(expected), "{}: {err}", bad.display());
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
    let (code, _, err) = diff(&good, &good, &["--mode", "sideways"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown mode `sideways`"), "{err}");
}
