//! The compatibility checker at scale: many event types, and inputs that grow twentyfold.

use std::time::Instant;

use chrono::Utc;

/// How the checker's time grows with the input: enums of 10k to 200k values (one value
/// removed), and anyOf lists of 300 to 3,000 subschemas, tagged (one variant added) and untagged
/// (every subschema's title changed), each against parsing the same two documents in the same
/// run. Near-linear growth keeps `checkVsParse` roughly flat as the size grows twentyfold.
fn checker_scaling() -> anyhow::Result<serde_json::Value> {
    use event_core::schema::{Mode, check};
    use serde_json::json;
    let measure =
        |old: &serde_json::Value, new: &serde_json::Value| -> anyhow::Result<serde_json::Value> {
            let (old_text, new_text) = (old.to_string(), new.to_string());
            let started = Instant::now();
            let parsed: (serde_json::Value, serde_json::Value) = (
                serde_json::from_str(&old_text)?,
                serde_json::from_str(&new_text)?,
            );
            let parse = started.elapsed().as_secs_f64();
            let started = Instant::now();
            let report = check(&parsed.0, &parsed.1, Mode::Backward)?;
            let seconds = started.elapsed().as_secs_f64();
            Ok(json!({
                "seconds": seconds,
                "parseSeconds": parse,
                "checkVsParse": seconds / parse,
                "compatible": report.is_compatible(),
            }))
        };
    let mut enums = serde_json::Map::new();
    for n in [10_000_usize, 50_000, 200_000] {
        let values = |skip: usize| -> Vec<String> {
            (0..n)
                .filter(|&i| i != skip)
                .map(|i| format!("v{i}"))
                .collect()
        };
        let result = measure(
            &json!({ "enum": values(n) }),
            &json!({ "enum": values(n / 2) }),
        )?;
        enums.insert(n.to_string(), result);
    }
    let mut tagged = serde_json::Map::new();
    let mut untagged = serde_json::Map::new();
    for n in [300_usize, 1_000, 3_000] {
        let variants = |count: usize| -> Vec<serde_json::Value> {
            (0..count)
                .map(|i| json!({
                    "type": "object",
                    "properties": { "kind": { "const": format!("k{i}") }, "amount": { "type": "integer" } },
                    "required": ["kind"]
                }))
                .collect()
        };
        tagged.insert(
            n.to_string(),
            measure(
                &json!({ "anyOf": variants(n) }),
                &json!({ "anyOf": variants(n + 1) }),
            )?,
        );
        let titled = |prefix: &str| -> Vec<serde_json::Value> {
            (0..n)
                .map(|i| json!({ "type": "string", "title": format!("{prefix}{i}") }))
                .collect()
        };
        untagged.insert(
            n.to_string(),
            measure(
                &json!({ "anyOf": titled("old") }),
                &json!({ "anyOf": titled("new") }),
            )?,
        );
    }
    let growth = |table: &serde_json::Map<String, serde_json::Value>, small: &str, big: &str| {
        table[big]["seconds"].as_f64().unwrap_or(0.0)
            / table[small]["seconds"].as_f64().unwrap_or(1.0)
    };
    Ok(json!({
        "enum": enums,
        "enumGrowth10kTo200k": growth(&enums, "10000", "200000"),
        "anyOfTagged": tagged,
        "anyOfTaggedGrowth300To3000": growth(&tagged, "300", "3000"),
        "anyOfUntagged": untagged,
        "anyOfUntaggedGrowth300To3000": growth(&untagged, "300", "3000"),
    }))
}

/// Checks `types` event types with 3 versions each (BACKWARD_TRANSITIVE, serde profile), against
/// the baseline of parsing the same schema texts, measured in the same run.
pub(crate) fn schema_bench(types: usize) -> anyhow::Result<()> {
    use event_core::schema::{Mode, Profile, check_history};
    let version = |t: usize, v: usize| {
        let mut properties = serde_json::Map::new();
        for f in 0..(8 + v) {
            properties.insert(
                format!("field_{f}"),
                serde_json::json!({"type": "string", "maxLength": 64}),
            );
        }
        properties.insert(
            "amount".into(),
            serde_json::json!({"type": "integer", "format": if v < 2 { "int32" } else { "int64" }}),
        );
        properties.insert(
            "address".into(),
            serde_json::json!({"$ref": "#/$defs/Address"}),
        );
        serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": format!("Event{t}"),
            "type": "object",
            "properties": properties,
            "required": ["field_0", "amount"],
            "$defs": {"Address": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": ["string", "null"]}}}}
        })
        .to_string()
    };
    let texts: Vec<Vec<String>> = (0..types)
        .map(|t| (0..3).map(|v| version(t, v)).collect())
        .collect();

    let started = Instant::now();
    let mut parsed = 0;
    for history in &texts {
        for text in history {
            let value: serde_json::Value = serde_json::from_str(text)?;
            parsed += usize::from(value.is_object());
        }
    }
    let parse = started.elapsed();

    let started = Instant::now();
    let mut compatible = 0;
    for history in &texts {
        let values: Vec<serde_json::Value> = history
            .iter()
            .map(|t| serde_json::from_str(t))
            .collect::<Result<_, _>>()?;
        if check_history(&values, Mode::BackwardTransitive, Profile::Serde)?.is_compatible() {
            compatible += 1;
        }
    }
    let check = started.elapsed();
    anyhow::ensure!(
        parsed == types * 3 && compatible == types,
        "{compatible} of {types} histories compatible"
    );
    let scaling = checker_scaling()?;
    let report = serde_json::json!({
        "machine": crate::machine(),
        "measuredAt": Utc::now(),
        "scaling": scaling,
        "eventTypes": types,
        "versionsEach": 3,
        "checkSeconds": check.as_secs_f64(),
        "parseOnlySeconds": parse.as_secs_f64(),
        "checkVsParse": check.as_secs_f64() / parse.as_secs_f64(),
        "perEventTypeMicros": check.as_secs_f64() * 1e6 / types as f64,
    });
    crate::write_result("benches/results/schema.json", &report)?;
    Ok(())
}
