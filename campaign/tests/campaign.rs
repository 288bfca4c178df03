//! The fault campaign in CI: a short run per pair (PostgreSQL + JetStream, MariaDB + RabbitMQ,
//! PostgreSQL + Kafka) for each seed of a fixed list, then every run kept in
//! `failing-seeds.txt`. Each run starts private services and real processes (`eventctl relay`
//! among them), plays its seed's schedule of faults and checks the tables; a run that breaks a
//! guarantee fails the test with the checker's findings and the replay command.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Seeds every CI run plays on every pair.
const SEEDS: [u64; 2] = [1, 2];
/// A short campaign: seconds of load, faults in it, events a second per producer.
const SHORT: [&str; 6] = ["--load", "40", "--faults", "10", "--rate", "50"];

/// One campaign at a time: they share two cores with nothing else.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn campaign() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_event-campaign"))
}

/// Whether what a campaign starts is on this machine; without it the test says so and passes,
/// unless `EVENT_TEST_REQUIRE_SERVICES=1`.
fn tools_present() -> bool {
    let eventctl = campaign().with_file_name("eventctl");
    let mut missing = Vec::new();
    if !eventctl.exists() {
        missing.push(format!("{} (cargo build -p event-cli)", eventctl.display()));
    }
    for tool in [
        "/usr/sbin/mariadbd",
        "/usr/bin/mariadb-install-db",
        "/usr/lib/rabbitmq/bin/rabbitmq-server",
    ] {
        if !Path::new(tool).exists() {
            missing.push(tool.to_owned());
        }
    }
    if Command::new("nats-server")
        .arg("--version")
        .output()
        .is_err()
    {
        missing.push("nats-server".to_owned());
    }
    if missing.is_empty() {
        return true;
    }
    let required = std::env::var("EVENT_TEST_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
    assert!(!required, "the campaign needs {}", missing.join(", "));
    eprintln!("skipping the campaign: missing {}", missing.join(", "));
    false
}

/// Runs `event-campaign run` with `args`, and fails with its report unless it passed.
fn run(args: &[String]) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let output = Command::new(campaign())
        .arg("run")
        .args(args)
        .output()
        .expect("start event-campaign");
    let report = String::from_utf8_lossy(&output.stdout);
    eprintln!("{report}");
    assert!(
        output.status.success(),
        "the campaign failed ({}):\n{report}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains("PASS"), "{report}");
}

/// The runs of `failing-seeds.txt` for `pair`.
fn kept_runs(pair: &str) -> Vec<Vec<String>> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("failing-seeds.txt");
    let text = std::fs::read_to_string(&file).expect("read failing-seeds.txt");
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            line.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|args| args.windows(2).any(|w| w[0] == "--pair" && w[1] == pair))
        .collect()
}

fn campaign_on(pair: &str) {
    if !tools_present() {
        return;
    }
    for seed in SEEDS {
        let mut args = vec![
            "--pair".to_owned(),
            pair.to_owned(),
            "--seed".to_owned(),
            seed.to_string(),
        ];
        args.extend(SHORT.iter().map(|s| (*s).to_owned()));
        run(&args);
    }
    for args in kept_runs(pair) {
        run(&args);
    }
}

#[test]
fn postgres_and_jetstream_keep_every_guarantee_under_faults() {
    campaign_on("pg-jetstream");
}

#[test]
fn mariadb_and_rabbitmq_keep_every_guarantee_under_faults() {
    campaign_on("mariadb-rabbitmq");
}

#[test]
fn postgres_and_kafka_keep_every_guarantee_under_faults() {
    campaign_on("pg-kafka");
}
