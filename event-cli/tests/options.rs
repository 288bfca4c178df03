//! No option value makes `eventctl` panic: every subcommand is run with the smallest and the
//! largest value of each numeric or duration option, and with values outside any range. Each run
//! ends with exit 0, 1 or 2, never 101 (a panic), and a refused value is named on one line.

use std::path::Path;
use std::process::Command;

fn eventctl(args: &[&str], dir: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_eventctl"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run eventctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const EXTREMES: &[&str] = &[
    "0",
    "1",
    "-1",
    "65535",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "99999999999999999999999",
    "-9223372036854775808",
    "1.5",
    "NaN",
    "",
];

const DURATIONS: &[&str] = &[
    "0",
    "1ms",
    "10y",
    "11y",
    "99999999999999",
    "-5s",
    "5 fortnights",
];

#[test]
fn no_option_value_makes_eventctl_panic() {
    let dir = std::env::temp_dir().join(format!("eventctl-options-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/events.db?mode=rwc", dir.display());
    assert_eq!(eventctl(&["migrate", "--database-url", &url], &dir).0, 0);

    // (subcommand, option, values)
    let db = ["--database-url", url.as_str()];
    let mut runs: Vec<Vec<String>> = Vec::new();
    let with = |base: &[&str], option: &str, value: &str| -> Vec<String> {
        let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        args.extend(db.iter().map(|s| s.to_string()));
        args.push(format!("{option}={value}"));
        args
    };
    for value in EXTREMES {
        runs.push(with(&["outbox", "status"], "--hours", value));
        runs.push(with(&["outbox", "pending"], "--limit", value));
        runs.push(with(&["outbox", "failed"], "--limit", value));
        runs.push(with(&["outbox", "failed"], "--min-retries", value));
        runs.push(with(&["outbox", "stuck"], "--limit", value));
        for option in ["--max-pending", "--max-failed", "--max-stuck"] {
            runs.push(with(&["outbox", "check"], option, value));
        }
        for option in ["--batch-size", "--lease-secs", "--max-rate"] {
            runs.push(with(&["relay", "--until-idle"], option, value));
        }
        runs.push(vec![
            "demo".into(),
            "--db".into(),
            dir.join("demo.db").display().to_string(),
            format!("--orders={value}"),
        ]);
    }
    for value in DURATIONS {
        for option in ["--recovery-delay", "--recovery-interval", "--max-wait"] {
            runs.push(with(&["relay", "--until-idle"], option, value));
        }
        runs.push(with(&["outbox", "check"], "--max-oldest-pending", value));
        for option in ["--connect-timeout", "--statement-timeout"] {
            runs.push(with(&["outbox", "status"], option, value));
        }
    }
    for args in &runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stderr) = eventctl(&args, &dir);
        assert!(
            matches!(code, 0..=2),
            "eventctl {args:?} exited {code}: {stderr}"
        );
        if code == 2 {
            let errors: Vec<&str> = stderr
                .lines()
                .filter(|l| l.starts_with("error:") || l.starts_with("eventctl:"))
                .collect();
            assert!(
                !errors.is_empty(),
                "eventctl {args:?} failed without saying why: {stderr}"
            );
        }
        // The demo database is made anew each run.
        let _ = std::fs::remove_file(dir.join("demo.db"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A database without the event tables: one line that says to migrate, each cause once.
#[test]
fn missing_tables_say_to_migrate_once() {
    let dir = std::env::temp_dir().join(format!("eventctl-empty-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("empty.db"), "").unwrap();
    let url = format!("sqlite://{}/empty.db", dir.display());
    let (code, stderr) = eventctl(&["outbox", "status", "--database-url", &url], &dir);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("eventctl migrate"), "{stderr}");
    assert_eq!(stderr.matches("no such table").count(), 1, "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A password given in the database URL, in its user part or as PostgreSQL's `password`
/// parameter, is never printed when the database cannot be reached.
#[test]
fn a_password_in_the_database_url_is_never_shown() {
    let dir = std::env::temp_dir();
    // Nothing listens on port 1.
    for url in [
        "postgres://app:s3cret-in-user@127.0.0.1:1/orders",
        "postgres://app@127.0.0.1:1/orders?sslmode=disable&password=s3cret-in-query",
    ] {
        let (code, stderr) = eventctl(
            &[
                "outbox",
                "status",
                "--database-url",
                url,
                "--connect-timeout=2s",
            ],
            &dir,
        );
        assert!(code != 0 && code != 101, "exit {code}: {stderr}");
        assert!(
            stderr.contains("cannot connect to postgres://app"),
            "{stderr}"
        );
        assert!(stderr.contains("***"), "{stderr}");
        assert!(!stderr.contains("s3cret"), "{stderr}");
    }
}
