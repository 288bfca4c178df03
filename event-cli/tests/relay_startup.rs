//! `eventctl relay` started before its database and its broker answer (a service manager
//! starting everything at once, a database restarting) waits for them within `--max-wait`,
//! saying on stderr what it waits for, then publishes every event; a reason that does not pass
//! (a login the database or the broker refuses) stops it at once, without printing the password;
//! past `--max-wait` it gives up with exit 2.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use event_tests::db::{TestDb, free_port, nats_url, reachable, unique};
use event_tests::fixtures::{Order, commit_orders, orders_to};
use event_tests::proxy::{Fault, FaultProxy, socket_of, through};
use event_tests::wait;

const EVENTS: usize = 40;

/// A relay process and what it has written to stderr so far.
struct Running {
    child: Child,
    stderr: Arc<Mutex<String>>,
    /// The thread that copies stderr, until the process closes it.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    fn start(args: &[&str]) -> Running {
        let mut child = Command::new(env!("CARGO_BIN_EXE_eventctl"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let lines = BufReader::new(child.stderr.take().unwrap());
        let seen = Arc::clone(&stderr);
        let reader = std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
                seen.push_str(&line);
                seen.push('\n');
            }
        });
        Running {
            child,
            stderr,
            reader: Some(reader),
        }
    }

    fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until stderr holds `text`.
    async fn said(&self, text: &str) {
        wait::until(Duration::from_secs(60), async || {
            let stderr = self.stderr();
            if stderr.contains(text) {
                Ok(())
            } else {
                Err(format!("stderr without `{text}`: {stderr}"))
            }
        })
        .await;
    }

    /// Waits for the exit code, killing the process if it is still running after a minute, and
    /// for the rest of its stderr: a process that has exited may have lines still in the pipe.
    async fn exit_code(&mut self) -> i32 {
        let child = &mut self.child;
        let status = wait::until(Duration::from_secs(60), async || {
            match child.try_wait().unwrap() {
                Some(status) => Ok(status),
                None => Err("the relay is still running".to_owned()),
            }
        })
        .await;
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        status.code().unwrap_or(-1)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `url` with `credentials` (`user` or `user:password`) in place of its own.
fn as_user(url: &str, credentials: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let host_and_path = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    format!("{scheme}://{credentials}@{host_and_path}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_before_its_database_and_broker_waits_for_them_then_publishes() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let nats = nats_url();
    let Some(client) = reachable("NATS", &nats, async_nats::connect(&nats).await) else {
        return;
    };
    let js = async_nats::jetstream::new(client);
    let topic = unique("startup").replace('_', "-");
    let stream = topic.replace('-', "_").to_uppercase();
    commit_orders(
        &orders_to(db.pool(), &topic),
        (0..EVENTS).map(|i| Order::place(&format!("o-{i}"), 1).unwrap()),
    )
    .await;
    // Neither is reachable when the relay starts: each proxy closes every connection at once.
    let database = FaultProxy::start(socket_of(&db.url)).await.unwrap();
    let broker = FaultProxy::start(socket_of(&nats)).await.unwrap();
    database.set(Fault::Cut);
    broker.set(Fault::Cut);
    let (database_url, broker_url) = (
        through(&db.url, database.address()),
        through(&nats, broker.address()),
    );
    let subjects = format!("{topic}.>");
    let mut relay = Running::start(&[
        "relay",
        "--until-idle",
        "--database-url",
        &database_url,
        "--publisher",
        &broker_url,
        "--stream",
        &stream,
        "--subject",
        &subjects,
    ]);

    // It says what it waits for, and goes on waiting.
    relay.said("trying again in").await;
    // On one thread (a current-thread runtime; see the performance chapter): no worker threads
    // beside the main one, and nothing has needed the blocking pool yet.
    if cfg!(target_os = "linux") {
        let threads: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", relay.child.id()))
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .collect();
        assert_eq!(threads.len(), 1, "the relay's threads: {threads:?}");
    }
    let stderr = relay.stderr();
    assert!(
        stderr.contains("cannot connect to") && stderr.contains("--max-wait 2m"),
        "{stderr}"
    );
    let tries = wait::until(Duration::from_secs(60), async || {
        match database.accepted() {
            n if n >= 3 => Ok(n),
            n => Err(format!("{n} connections tried")),
        }
    })
    .await;
    assert!(tries >= 3);
    assert!(
        relay.child.try_wait().unwrap().is_none(),
        "{}",
        relay.stderr()
    );

    // The database comes up; the broker is still away: it waits for the broker.
    database.set(Fault::Pass);
    relay.said("NATS").await;
    assert_eq!(
        db.counts().await.pending,
        EVENTS as i64,
        "nothing claimed yet"
    );

    broker.set(Fault::Pass);
    let code = relay.exit_code().await;
    assert_eq!(code, 0, "{}", relay.stderr());
    assert_eq!(db.counts().await.succeeded, EVENTS as i64);
    let mut published = js.get_stream(&stream).await.unwrap();
    assert_eq!(
        published.info().await.unwrap().state.messages,
        EVENTS as u64
    );
    js.delete_stream(&stream).await.unwrap();
    drop(database);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_stops_the_relay_at_once_and_a_database_that_stays_away_after_max_wait() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    // A role the server does not know: no wait would help, so it is not waited for.
    let unknown_role = as_user(&db.url, &format!("no_such_role_{}", free_port()));
    let mut relay = Running::start(&["relay", "--until-idle", "--database-url", &unknown_role]);
    assert_eq!(relay.exit_code().await, 2);
    let stderr = relay.stderr();
    assert!(
        stderr.contains("no_such_role") && !stderr.contains("trying again"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    // Nothing listens on this port: refused at every try, for a second, then exit 2.
    let nowhere = format!("postgres://postgres@127.0.0.1:{}/test", free_port());
    let mut relay = Running::start(&[
        "relay",
        "--until-idle",
        "--database-url",
        &nowhere,
        "--max-wait",
        "1s",
    ]);
    assert_eq!(relay.exit_code().await, 2);
    let stderr = relay.stderr();
    assert!(
        stderr.matches("trying again in").count() >= 2
            && stderr.contains("gave up after trying for 1s (--max-wait)"),
        "{stderr}"
    );
    db.cleanup().await;
}

/// Runs a relay from `db` to `publisher`, a broker that refuses its login: it exits 2 without
/// trying again (the same login would be refused again). Its stderr.
async fn refused_at_once(db: &TestDb<sqlx::Postgres>, publisher: &str) -> String {
    let mut relay = Running::start(&[
        "relay",
        "--until-idle",
        "--database-url",
        &db.url,
        "--publisher",
        publisher,
    ]);
    assert_eq!(relay.exit_code().await, 2, "{}", relay.stderr());
    let stderr = relay.stderr();
    assert!(!stderr.contains("trying again"), "{stderr}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rabbitmq_broker_that_refuses_the_login_stops_the_relay_at_once_without_printing_the_password()
 {
    let amqp = event_tests::db::amqp_url();
    let Some(_) = reachable(
        "RabbitMQ",
        &amqp,
        lapin::Connection::connect(&amqp, lapin::ConnectionProperties::default()).await,
    ) else {
        return;
    };
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    // The test broker's address with a password it refuses.
    let secret = format!("not-the-password-{}", free_port());
    let wrong = as_user(&amqp, &format!("guest:{secret}"));
    let stderr = refused_at_once(&db, &wrong).await;
    assert!(
        stderr.contains("ACCESS_REFUSED") && stderr.contains("guest:***@"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(&secret),
        "the password was printed: {stderr}"
    );
    db.cleanup().await;
}

/// A nats-server of the test's own that wants a user and password.
struct NatsWithLogin {
    server: Child,
    port: u16,
}

impl NatsWithLogin {
    const SERVER: &str = "/usr/sbin/nats-server";

    async fn start() -> Option<NatsWithLogin> {
        if !std::path::Path::new(Self::SERVER).exists() {
            assert!(
                !event_tests::db::services_required(),
                "{} is needed for this test",
                Self::SERVER
            );
            return None;
        }
        let port = free_port();
        let server = Command::new(Self::SERVER)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(["--user", "app", "--pass", "the-right-one"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait::until(Duration::from_secs(30), async || {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map_err(|e| format!("nats-server not listening on {port}: {e}"))
        })
        .await;
        Some(NatsWithLogin { server, port })
    }
}

impl Drop for NatsWithLogin {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_that_refuses_the_login_stops_the_relay_at_once() {
    let Some(nats) = NatsWithLogin::start().await else {
        return;
    };
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let wrong = format!("nats://app:not-the-password@127.0.0.1:{}", nats.port);
    let stderr = refused_at_once(&db, &wrong).await;
    assert!(
        stderr.contains("authorization violation") && stderr.contains("app:***@"),
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-password"), "{stderr}");
    db.cleanup().await;
}
