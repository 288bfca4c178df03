//! A database server that accepts the connection and never answers: every command gives up
//! within its connect timeout, with exit 2 and a reason, instead of hanging.

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A port that accepts connections and never says a word.
fn silent_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    port
}

/// Runs `eventctl args...`; its exit code and stderr, or a failure if it is still running after
/// `limit` (then it is killed).
fn run_with_limit(args: &[&str], limit: Duration) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_eventctl"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .unwrap();
            return (status.code().unwrap_or(-1), stderr);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("eventctl {args:?} still hung after {limit:?}");
        }
        // Polling the child process, with the limit above.
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_silent_server_gives_exit_2_within_the_connect_timeout() {
    let port = silent_server();
    for url in [
        format!("postgres://postgres@127.0.0.1:{port}/test"),
        format!("mysql://root@127.0.0.1:{port}/test"),
    ] {
        for command in [
            &["outbox", "status"][..],
            &["migrate"][..],
            // A relay waits for a database that is not answering yet; not with --max-wait 0.
            &["relay", "--until-idle", "--max-wait", "0"][..],
        ] {
            let mut args: Vec<&str> = command.to_vec();
            args.extend(["--database-url", &url, "--connect-timeout", "1s"]);
            // Without a timeout this never returns; with it, well within the limit.
            let (code, stderr) = run_with_limit(&args, Duration::from_secs(60));
            assert_eq!(code, 2, "{args:?}: {stderr}");
            assert!(
                stderr.contains("no answer within 1s") && stderr.contains("--connect-timeout"),
                "{args:?}: {stderr}"
            );
            assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        }
    }
}

#[test]
fn a_relay_tries_a_silent_server_again_until_its_max_wait() {
    let port = silent_server();
    let url = format!("postgres://postgres@127.0.0.1:{port}/test");
    let args = [
        "relay",
        "--until-idle",
        "--database-url",
        &url,
        "--connect-timeout",
        "1s",
        "--max-wait",
        "3s",
    ];
    let (code, stderr) = run_with_limit(&args, Duration::from_secs(60));
    assert_eq!(code, 2, "{stderr}");
    // Tried again after each timeout, then given up, saying why.
    assert!(
        stderr.matches("no answer within 1s").count() >= 2
            && stderr.contains("trying again in")
            && stderr.contains("gave up after trying for 3s (--max-wait)"),
        "{stderr}"
    );
}
