//! The performance chapter's charts: SVG bar charts drawn from the committed results
//! (`benches/results/*.json`), each captioned with the machine and the date of its run.
//! `cargo run -p event-bench -- --charts docs/src/performance` redraws them; a test checks that
//! the committed charts are the ones the committed results draw.

use std::path::Path;

use anyhow::{Context, Result};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use serde_json::Value;

/// One group of bars: a label under the group and one value per series.
struct Group {
    label: String,
    values: Vec<f64>,
}

/// A bar chart: a title, the run it comes from, the series' names and the groups.
struct Chart<'a> {
    title: &'a str,
    run: String,
    unit: &'a str,
    series: &'a [&'a str],
    groups: Vec<Group>,
    /// A logarithmic axis, for values that span orders of magnitude.
    log: bool,
}

const COLORS: [RGBColor; 4] = [
    RGBColor(0x33, 0x66, 0x99),
    RGBColor(0x66, 0x99, 0x55),
    RGBColor(0xcc, 0x77, 0x33),
    RGBColor(0x99, 0x99, 0x99),
];

/// Reads `benches/results/<name>.json` under `root`.
fn results(root: &Path, name: &str) -> Result<Value> {
    let path = root.join("benches/results").join(name);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}: run its benchmark first", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// "2 cores (AMD EPYC), 23 GiB, 2026-12-01": the machine and the day a result was measured.
fn run_of(result: &Value) -> String {
    let machine = result["machine"].as_str().unwrap_or("unknown machine");
    let day = result["measuredAt"]
        .as_str()
        .and_then(|at| at.get(..10))
        .unwrap_or("undated");
    format!("{machine}, measured {day}")
}

fn number(value: &Value, key: &str) -> Result<f64> {
    value[key]
        .as_f64()
        .with_context(|| format!("the result has no number `{key}`: {value}"))
}

/// Draws every chart into `dir`.
pub(crate) fn run(dir: &Path) -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let charts = [
        ("relay.svg", relay(&results(&root, "outbox.json")?)?),
        (
            "end-to-end.svg",
            end_to_end(&results(&root, "throughput.json")?)?,
        ),
        ("latency.svg", latency(&results(&root, "throughput.json")?)?),
    ];
    for (name, chart) in charts {
        let path = dir.join(name);
        draw(&path, &chart).with_context(|| format!("cannot draw {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The relay's drain beside the database's raw multi-row INSERT, the status model's floor (two
/// bare UPDATEs per event) and a naive one-row relay.
fn relay(outbox: &Value) -> Result<Chart<'static>> {
    let rows = outbox["results"]
        .as_array()
        .context("outbox.json has no results")?;
    let groups = rows
        .iter()
        .map(|row| {
            Ok(Group {
                label: row["backend"].as_str().unwrap_or("?").to_owned(),
                values: vec![
                    number(row, "raw_insert_events_per_s")?,
                    number(row, "two_updates_events_per_s")?,
                    number(row, "relay_drain_events_per_s")?,
                    number(row, "naive_relay_events_per_s")?,
                ],
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Chart {
        title: "Relay drain of a 100,000-event backlog",
        run: run_of(outbox),
        unit: "events/s",
        series: &[
            "raw multi-row INSERT",
            "two bare UPDATEs per event",
            "relay drain",
            "naive one-row relay",
        ],
        groups,
        log: false,
    })
}

/// A committed backlog moved end to end, beside the broker's raw publish rate.
fn end_to_end(throughput: &Value) -> Result<Chart<'static>> {
    let rows = throughput["backlog"]
        .as_array()
        .context("throughput.json has no backlog")?;
    let groups = rows
        .iter()
        .filter(|row| row["events"].as_u64() >= Some(100_000))
        .map(|row| {
            Ok(Group {
                label: format!(
                    "{}, {} handler, batches of {}",
                    row["broker"].as_str().unwrap_or("?"),
                    row["handler"].as_str().unwrap_or("?"),
                    row["consumerBatch"]
                ),
                values: vec![number(row, "endToEndEventsPerS")?],
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Chart {
        title: "End to end: a committed backlog of 100,000 events",
        run: run_of(throughput),
        unit: "events/s",
        series: &["end to end"],
        groups,
        log: false,
    })
}

/// Commit-to-consume latency, median and 99th percentile, at a steady rate and at saturation.
fn latency(throughput: &Value) -> Result<Chart<'static>> {
    let rows = throughput["latency"]
        .as_array()
        .context("throughput.json has no latency")?;
    let groups = rows
        .iter()
        .map(|row| {
            Ok(Group {
                label: match row["handler"].as_str() {
                    Some(handler) => format!(
                        "{}, {}, {handler} handler",
                        row["broker"].as_str().unwrap_or("?"),
                        row["load"].as_str().unwrap_or("?")
                    ),
                    None => format!(
                        "{}, {}",
                        row["broker"].as_str().unwrap_or("?"),
                        row["load"].as_str().unwrap_or("?")
                    ),
                },
                values: vec![number(row, "p50Ms")?, number(row, "p99Ms")?],
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Chart {
        title: "Commit to consume latency",
        run: run_of(throughput),
        unit: "ms, logarithmic",
        series: &["p50", "p99"],
        groups,
        log: true,
    })
}

/// Draws `chart` as horizontal bars (long labels read better beside the bars than under them).
fn draw(path: &Path, chart: &Chart<'_>) -> Result<()> {
    let bars = chart.groups.len() * chart.series.len();
    let height = 90 + 22 * bars as u32 + 8 * chart.groups.len() as u32 + 60;
    let area = SVGBackend::new(path, (760, height)).into_drawing_area();
    area.fill(&WHITE)?;
    let max = chart
        .groups
        .iter()
        .flat_map(|g| g.values.iter().copied())
        .fold(1.0_f64, f64::max);
    let drawn = if chart.log {
        plot(&area, chart, (1.0..max * 2.0).log_scale(), 1.0)
    } else {
        plot(&area, chart, 0.0..max * 1.15, 0.0)
    };
    drawn.map_err(|e| anyhow::anyhow!("{e}"))?;
    area.present()?;
    Ok(())
}

/// Draws `chart` on `area` with `x` as its value axis, whose bars start at `origin`.
fn plot<X>(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    chart: &Chart<'_>,
    x: X,
    origin: f64,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let per_group = chart.series.len() as u32 + 1;
    let slots = chart.groups.len() as u32 * per_group;
    let (top, legend) = area.split_vertically(area.dim_in_pixel().1 - 50);
    let mut plot = ChartBuilder::on(&top)
        .caption(chart.title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(230)
        .build_cartesian_2d(x, 0..slots)?;
    let labels: Vec<&str> = chart.groups.iter().map(|g| g.label.as_str()).collect();
    plot.configure_mesh()
        .disable_y_mesh()
        .y_labels(slots as usize + 1)
        .y_label_formatter(&|slot: &u32| {
            // The label of a group sits beside its middle bar.
            let (group, within) = (*slot / per_group, *slot % per_group);
            if within == per_group / 2 {
                let index = labels.len().saturating_sub(1 + group as usize);
                labels.get(index).map(|l| l.to_string()).unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_desc(chart.unit)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    for (g, group) in chart.groups.iter().enumerate() {
        // The first group at the top.
        let base = (chart.groups.len() - 1 - g) as u32 * per_group;
        for (s, value) in group.values.iter().enumerate() {
            let slot = base + per_group - 1 - s as u32;
            let color = COLORS[s % COLORS.len()];
            plot.draw_series(std::iter::once(Rectangle::new(
                [(origin, slot - 1), (*value, slot)],
                color.filled(),
            )))?;
            plot.draw_series(std::iter::once(Text::new(
                format!("{value:.0}"),
                (*value, slot),
                ("sans-serif", 11),
            )))?;
        }
    }
    for (s, name) in chart.series.iter().enumerate() {
        let x = 240 + 170 * s as i32;
        legend.draw(&Rectangle::new(
            [(x, 8), (x + 12, 20)],
            COLORS[s % COLORS.len()].filled(),
        ))?;
        legend.draw(&Text::new(
            name.to_string(),
            (x + 18, 8),
            ("sans-serif", 12),
        ))?;
    }
    legend.draw(&Text::new(chart.run.clone(), (240, 30), ("sans-serif", 11)))?;
    Ok(())
}
