//! Private database and broker instances that the nemesis may kill and start again: a
//! PostgreSQL cluster, a MariaDB server, a NATS server with JetStream, a RabbitMQ node, a Tansu
//! broker, each on its own port and data directory under the run's directory.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

use crate::pair::{Broker, Db};

/// A free loopback port (bound, then released).
pub(crate) fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("no free port")?;
    Ok(listener.local_addr()?.port())
}

/// Whether something accepts connections on `port`.
pub(crate) async fn listening(port: u16) -> bool {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
}

/// Sends `signal` (a name such as `KILL`, `STOP`) to the process group `pgid`. Never to group
/// 0 or 1 (this process's own group, every process).
pub(crate) fn signal_group(pgid: u32, signal: &str) {
    if pgid <= 1 {
        return;
    }
    let _ = std::process::Command::new("kill")
        .args(["-s", signal, "--"])
        .arg(format!("-{pgid}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Runs a command to its end, failing with its output.
fn run_to_end(command: &mut std::process::Command, what: &str) -> anyhow::Result<()> {
    let output = command
        .output()
        .with_context(|| format!("cannot run {what}"))?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// The PostgreSQL binaries' directory.
fn pg_bin() -> anyhow::Result<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .context("no /usr/lib/postgresql: PostgreSQL's server binaries are needed")?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("postgres").exists())
        .collect();
    found.sort();
    found
        .pop()
        .context("no postgres binary under /usr/lib/postgresql/*/bin")
}

/// The Tansu binary `.ci/kafka-broker` installs.
fn tansu_bin() -> anyhow::Result<PathBuf> {
    if let Ok(path) = std::env::var("TANSU_BIN") {
        return Ok(PathBuf::from(path));
    }
    let cache = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .context("neither XDG_CACHE_HOME nor HOME is set")?;
    let bin = cache.join("event-toolkit/tansu-0.6.0/tansu");
    if !bin.exists() {
        bail!(
            "no Tansu binary at {}: run .ci/kafka-broker once, or set TANSU_BIN",
            bin.display()
        );
    }
    Ok(bin)
}

/// How a service is started: the command, run in a process group of its own.
#[derive(Debug, Clone)]
struct Recipe {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Runs as this user (PostgreSQL refuses root).
    user: Option<String>,
}

/// A running (or crashed) service.
#[derive(Debug)]
pub(crate) struct Service {
    pub(crate) name: &'static str,
    pub(crate) port: u16,
    recipe: Recipe,
    log: PathBuf,
    child: Option<Child>,
    startup: Duration,
}

impl Service {
    async fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open {}", self.log.display()))?;
        let mut command = match &self.recipe.user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.arg("-u").arg(user).arg("--").arg(&self.recipe.program);
                c
            }
            None => Command::new(&self.recipe.program),
        };
        command
            .args(&self.recipe.args)
            .envs(self.recipe.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {}", self.name))?;
        self.child = Some(child);
        // Listening, or exited (a crashed instance's leftovers, such as PostgreSQL's lock file
        // while its old postmaster is not yet reaped, make a start fail at once): a failed start
        // is reported now, not after the whole startup time, so that `restart` tries again.
        let until = tokio::time::Instant::now() + self.startup;
        while tokio::time::Instant::now() < until {
            if listening(self.port).await {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                bail!(
                    "{} exited ({status}) before it listened on port {}; see {}",
                    self.name,
                    self.port,
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!(
            "{} did not listen on port {} within {:?}; see {}",
            self.name,
            self.port,
            self.startup,
            self.log.display()
        )
    }

    /// Kills the whole process group at once (a crash), and waits until the port is closed.
    pub(crate) async fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                signal_group(pid, "KILL");
            }
            let _ = child.wait().await;
        }
        for _ in 0..100 {
            if !listening(self.port).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts it again after a crash, retrying every half second, for up to its startup time,
    /// while the old instance's leftovers clear.
    pub(crate) async fn restart(&mut self) -> anyhow::Result<()> {
        let until = tokio::time::Instant::now() + self.startup;
        loop {
            match self.start().await {
                Ok(()) => return Ok(()),
                Err(e) if tokio::time::Instant::now() >= until => return Err(e),
                Err(_) => {
                    self.crash().await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// Stops it for good.
    pub(crate) async fn stop(&mut self) {
        self.crash().await;
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            signal_group(pid, "KILL");
        }
    }
}

/// A private database: PostgreSQL (initdb into the run directory, run as `postgres`) or
/// MariaDB (mariadb-install-db, run as root with grant tables off), with database `campaign`.
pub(crate) async fn start_db(db: Db, dir: &Path) -> anyhow::Result<Service> {
    let port = free_port()?;
    let log = dir.join(match db {
        Db::Postgres => "postgres.log",
        Db::MariaDb => "mariadb.log",
    });
    let mut service = match db {
        Db::Postgres => {
            let bin = pg_bin()?;
            let data = dir.join("pgdata");
            std::fs::create_dir_all(&data)?;
            run_to_end(
                std::process::Command::new("chown")
                    .arg("-R")
                    .arg("postgres")
                    .arg(dir),
                "chown the run directory to postgres",
            )?;
            run_to_end(
                std::process::Command::new("runuser")
                    .args(["-u", "postgres", "--"])
                    .arg(bin.join("initdb"))
                    .arg("-D")
                    .arg(&data)
                    .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]),
                "initdb",
            )?;
            Service {
                name: "postgres",
                port,
                recipe: Recipe {
                    program: bin.join("postgres"),
                    args: vec![
                        "-D".into(),
                        data.display().to_string(),
                        "-p".into(),
                        port.to_string(),
                        "-k".into(),
                        dir.display().to_string(),
                        "-c".into(),
                        "listen_addresses=127.0.0.1".into(),
                        // Committed transactions reach the OS before the commit returns; a
                        // killed server loses none of them (the machine does not crash).
                        "-c".into(),
                        "fsync=off".into(),
                        "-c".into(),
                        "max_connections=200".into(),
                        "-c".into(),
                        "shared_buffers=256MB".into(),
                    ],
                    env: Vec::new(),
                    user: Some("postgres".into()),
                },
                log,
                child: None,
                startup: Duration::from_secs(30),
            }
        }
        Db::MariaDb => {
            let data = dir.join("mariadb");
            std::fs::create_dir_all(&data)?;
            run_to_end(
                std::process::Command::new("mariadb-install-db")
                    .arg("--no-defaults")
                    .arg(format!("--datadir={}", data.display()))
                    .args([
                        "--user=root",
                        "--skip-test-db",
                        "--auth-root-authentication-method=normal",
                    ]),
                "mariadb-install-db",
            )?;
            Service {
                name: "mariadb",
                port,
                recipe: Recipe {
                    program: PathBuf::from("/usr/sbin/mariadbd"),
                    args: vec![
                        "--no-defaults".into(),
                        format!("--datadir={}", data.display()),
                        format!("--port={port}"),
                        format!("--socket={}", dir.join("mariadb.sock").display()),
                        "--bind-address=127.0.0.1".into(),
                        "--user=root".into(),
                        "--skip-grant-tables".into(),
                        "--skip-log-bin".into(),
                        "--max-connections=300".into(),
                        // The log reaches the OS at each commit: a killed server loses nothing.
                        "--innodb-flush-log-at-trx-commit=2".into(),
                        "--innodb-buffer-pool-size=256M".into(),
                    ],
                    env: Vec::new(),
                    user: None,
                },
                log,
                child: None,
                startup: Duration::from_secs(60),
            }
        }
    };
    service.start().await?;
    create_database(db, port).await?;
    Ok(service)
}

async fn create_database(db: Db, port: u16) -> anyhow::Result<()> {
    use sqlx::Connection;
    match db {
        Db::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&format!(
                "postgres://postgres@127.0.0.1:{port}/postgres"
            ))
            .await
            .context("cannot connect to the private PostgreSQL")?;
            sqlx::raw_sql("CREATE DATABASE campaign")
                .execute(&mut conn)
                .await?;
        }
        Db::MariaDb => {
            let mut conn =
                sqlx::MySqlConnection::connect(&format!("mysql://root@127.0.0.1:{port}/mysql"))
                    .await
                    .context("cannot connect to the private MariaDB")?;
            sqlx::raw_sql("CREATE DATABASE campaign")
                .execute(&mut conn)
                .await?;
        }
    }
    Ok(())
}

/// A private broker. Kafka's (Tansu) advertises `advertised`, the port of the proxy in front of
/// it, so that every client connection goes through the proxy.
pub(crate) async fn start_broker(
    broker: Broker,
    dir: &Path,
    advertised: u16,
    port: u16,
) -> anyhow::Result<Service> {
    let mut service = match broker {
        Broker::Jetstream => {
            let store = dir.join("nats");
            std::fs::create_dir_all(&store)?;
            Service {
                name: "nats-server",
                port,
                recipe: Recipe {
                    program: PathBuf::from("nats-server"),
                    args: vec![
                        "-a".into(),
                        "127.0.0.1".into(),
                        "-p".into(),
                        port.to_string(),
                        "-js".into(),
                        "-sd".into(),
                        store.display().to_string(),
                    ],
                    env: Vec::new(),
                    user: None,
                },
                log: dir.join("nats.log"),
                child: None,
                startup: Duration::from_secs(30),
            }
        }
        Broker::Rabbitmq => {
            let base = dir.join("rabbitmq");
            std::fs::create_dir_all(&base)?;
            std::fs::write(base.join("enabled_plugins"), "[].\n")?;
            std::fs::write(
                base.join("rabbitmq.conf"),
                format!("listeners.tcp.default = 127.0.0.1:{port}\nloopback_users = none\n"),
            )?;
            let dist = free_port()?;
            let node = format!("campaign{port}@localhost");
            let env = [
                ("RABBITMQ_NODENAME", node),
                ("RABBITMQ_NODE_PORT", port.to_string()),
                ("RABBITMQ_DIST_PORT", dist.to_string()),
                (
                    "RABBITMQ_MNESIA_BASE",
                    base.join("mnesia").display().to_string(),
                ),
                ("RABBITMQ_LOG_BASE", base.join("log").display().to_string()),
                (
                    "RABBITMQ_ENABLED_PLUGINS_FILE",
                    base.join("enabled_plugins").display().to_string(),
                ),
                (
                    "RABBITMQ_CONFIG_FILE",
                    base.join("rabbitmq").display().to_string(),
                ),
                ("RABBITMQ_PID_FILE", base.join("pid").display().to_string()),
            ];
            Service {
                name: "rabbitmq",
                port,
                recipe: Recipe {
                    program: PathBuf::from("/usr/lib/rabbitmq/bin/rabbitmq-server"),
                    args: Vec::new(),
                    env: env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
                    user: None,
                },
                log: dir.join("rabbitmq.log"),
                child: None,
                startup: Duration::from_secs(90),
            }
        }
        Broker::Kafka => Service {
            name: "tansu",
            port,
            recipe: Recipe {
                program: tansu_bin()?,
                args: vec![
                    "broker".into(),
                    "--storage-engine".into(),
                    "memory://tansu/".into(),
                    "--listener-url".into(),
                    format!("tcp://127.0.0.1:{port}"),
                    "--advertised-listener-url".into(),
                    format!("tcp://127.0.0.1:{advertised}"),
                ],
                env: Vec::new(),
                user: None,
            },
            log: dir.join("tansu.log"),
            child: None,
            startup: Duration::from_secs(30),
        },
    };
    service.start().await?;
    Ok(service)
}
