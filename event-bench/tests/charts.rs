//! The performance chapter's charts are the ones the committed results draw: a result changed
//! without its chart redrawn (or a chart edited by hand) fails here.

use std::path::Path;
use std::process::Command;

#[test]
fn the_committed_charts_are_drawn_from_the_committed_results() {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/performance");
    let drawn = std::env::temp_dir().join(format!("event-bench-charts-{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_event-bench"))
        .arg("--charts")
        .arg(&drawn)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "event-bench --charts failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut charts = 0;
    for entry in std::fs::read_dir(&drawn).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        let fresh = std::fs::read_to_string(&path).unwrap();
        let kept = std::fs::read_to_string(committed.join(name)).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run cargo run -p event-bench -- --charts docs/src/performance",
                name.display()
            )
        });
        assert!(
            fresh == kept,
            "docs/src/performance/{} is not what benches/results draws; run cargo run -p event-bench -- --charts docs/src/performance",
            name.display()
        );
        charts += 1;
    }
    assert_eq!(charts, 3, "relay, end to end and latency");
    std::fs::remove_dir_all(&drawn).unwrap();
}
