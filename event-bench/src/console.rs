//! The web console at scale: `--console N` rows in a PostgreSQL outbox (spread over ten days,
//! ten event types, five topics, aggregates of five events, one in a thousand failed), then each
//! search and the overview through `eventctl console` over HTTP, against the same statements run
//! directly on the database in the same run. Each statement's plan is recorded with the indexes
//! it reads. Results: benches/results/console.json.

use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use event_tests::db::TestDb;
use sqlx::{Executor, PgPool, Row};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SAMPLES: usize = 200;

/// One page of the console and the statements behind it.
struct Case {
    name: &'static str,
    path: String,
    /// The statements the page runs, as the console sends them (parameters inlined only for
    /// EXPLAIN; the timing runs them as prepared statements with binds).
    statements: Vec<(String, Vec<String>)>,
}

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index.min(samples.len() - 1)]
}

async fn get(address: &str, path: &str) -> anyhow::Result<(u16, usize)> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let head = String::from_utf8_lossy(&raw[..raw.len().min(64)]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, raw.len()))
}

const COLUMNS: &str = "id, event_no, aggregate_type, aggregate_id, aggregate_sequence, event_type, event_version, event_source, publish_channel, topic, routing_key, event_payload, event_headers, publish_status, retry_count, max_retry_count, next_retry_time, locked_by, lock_until, last_publish_time, published_time, fail_reason, trace_id, remark, version, create_time, update_time";

fn search(filter: &str, binds: &[&str]) -> (String, Vec<String>) {
    (
        format!(
            "SELECT {COLUMNS} FROM biz_outbox_event WHERE 1 = 1{filter} ORDER BY create_time DESC, id DESC LIMIT 51"
        ),
        binds.iter().map(|b| (*b).to_owned()).collect(),
    )
}

/// Runs `sql` with text binds cast by PostgreSQL, returns the rows read.
async fn run_statement(pool: &PgPool, sql: &str, binds: &[String]) -> anyhow::Result<usize> {
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()));
    for b in binds {
        q = q.bind(b.clone());
    }
    Ok(q.fetch_all(pool).await?.len())
}

async fn indexes(pool: &PgPool, sql: &str, binds: &[String]) -> anyhow::Result<Vec<String>> {
    let mut text = sql.to_owned();
    for (i, b) in binds.iter().enumerate().rev() {
        text = text.replace(
            &format!("${}", i + 1),
            &format!("'{}'", b.replace('\'', "''")),
        );
    }
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {text}")))
        .fetch_all(pool)
        .await?;
    let mut found = Vec::new();
    for row in rows {
        let line: String = row.try_get(0)?;
        if let Some(rest) = line.split("Seq Scan on ").nth(1) {
            let table = rest.split_whitespace().next().unwrap_or_default();
            found.push(format!("sequential scan of {table}"));
        }
        if let Some(rest) = line.split(" using ").nth(1) {
            let name = rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
            if !found.contains(&name) {
                found.push(name);
            }
        }
    }
    Ok(found)
}

pub(crate) async fn run(rows: i64) -> anyhow::Result<()> {
    let eventctl = std::env::current_exe()?
        .parent()
        .map(|d| d.join("eventctl"))
        .filter(|p| p.exists())
        .context("eventctl is not beside event-bench: build both, `cargo build --release -p event-cli -p event-bench`")?;
    let db = TestDb::postgres()
        .await
        .context("PostgreSQL is unreachable")?;
    let pool = db.pool().clone();
    eprintln!("== filling {rows} outbox rows");
    let started = Instant::now();
    // Ten days of events, newest last; 1 in 1000 failed, 1 in 2000 pending, the rest published.
    pool.execute(sqlx::AssertSqlSafe(format!(
        "INSERT INTO biz_outbox_event (event_no, aggregate_type, aggregate_id, aggregate_sequence, \
         event_type, event_version, event_source, publish_channel, topic, routing_key, \
         event_payload, event_headers, publish_status, retry_count, max_retry_count, trace_id, \
         fail_reason, next_retry_time, published_time, create_time, update_time) \
         SELECT 'EV-' || n, 'ORDER', 'o-' || (n / 5), n % 5 + 1, 'TYPE_' || (n % 10), 1, 'bench', \
           'MQ', 'topic.' || (n % 5), 'key', '{{\"order\":\"x\",\"amount\":100}}', \
           '{{\"source\":\"bench\"}}', \
           CASE WHEN n % 1000 = 0 THEN 3 WHEN n % 2000 = 1 THEN 0 ELSE 2 END, \
           CASE WHEN n % 1000 = 0 THEN 2 ELSE 0 END, 5, 'trace-' || (n / 10), \
           CASE WHEN n % 1000 = 0 THEN 'broker refused it' END, \
           CASE WHEN n % 1000 = 0 THEN now() + interval '1 minute' END, \
           CASE WHEN n % 1000 <> 0 AND n % 2000 <> 1 THEN t END, t, t \
         FROM (SELECT n, now() - ({rows} - n) * interval '864 ms' * (1000000.0 / {rows}) AS t \
               FROM generate_series(1, {rows}) AS n) s"
    )))
    .await?;
    pool.execute("VACUUM ANALYZE biz_outbox_event").await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    eprintln!("   {fill_seconds:.0} s");

    let mid = rows / 2;
    let day_ago = (chrono::Utc::now() - chrono::TimeDelta::days(1))
        .format("%Y-%m-%dT%H:%M")
        .to_string();
    let hours_ago = (chrono::Utc::now() - chrono::TimeDelta::hours(20))
        .format("%Y-%m-%dT%H:%M")
        .to_string();
    // The second page of an unfiltered search starts after the 50th newest row.
    let cursor: (chrono::DateTime<chrono::Utc>, i64) = sqlx::query_as(
        "SELECT create_time, id FROM biz_outbox_event ORDER BY create_time DESC, id DESC OFFSET 49 LIMIT 1",
    )
    .fetch_one(&pool)
    .await?;
    let cursor_text = format!("{}_{}", cursor.0.timestamp_micros(), cursor.1);
    let cursor_time = cursor.0.to_rfc3339();
    let since = (chrono::Utc::now() - chrono::TimeDelta::hours(3)).to_rfc3339();
    let cases = vec![
        Case {
            name: "search by event number",
            path: format!("/search?no=EV-{mid}"),
            statements: vec![search(" AND event_no = $1", &[&format!("EV-{mid}")])],
        },
        Case {
            name: "search by aggregate",
            path: format!("/search?aggregate_type=ORDER&aggregate_id=o-{}", mid / 5),
            statements: vec![search(
                " AND aggregate_type = $1 AND aggregate_id = $2",
                &["ORDER", &format!("o-{}", mid / 5)],
            )],
        },
        Case {
            name: "search by event type and time range",
            path: format!("/search?event_type=TYPE_3&from={day_ago}&to={hours_ago}"),
            statements: vec![search(
                " AND event_type = $1 AND create_time >= $2::timestamptz AND create_time < $3::timestamptz",
                &[
                    "TYPE_3",
                    &format!("{day_ago}:00Z"),
                    &format!("{hours_ago}:00Z"),
                ],
            )],
        },
        Case {
            name: "search by trace id",
            path: format!("/search?trace_id=trace-{}", mid / 10),
            statements: vec![search(
                " AND trace_id = $1",
                &[&format!("trace-{}", mid / 10)],
            )],
        },
        Case {
            name: "search by status failed",
            path: "/search?status=failed".into(),
            statements: vec![search(" AND publish_status = 3", &[])],
        },
        Case {
            name: "search by topic",
            path: "/search?topic=topic.2".into(),
            statements: vec![search(" AND topic = $1", &["topic.2"])],
        },
        Case {
            name: "search, no filter",
            path: "/search".into(),
            statements: vec![search("", &[])],
        },
        Case {
            name: "search, second page",
            path: format!("/search?before={cursor_text}"),
            statements: vec![search(
                " AND (create_time < $1::timestamptz OR (create_time = $1::timestamptz AND id < $2::bigint))",
                &[&cursor_time, &cursor.1.to_string()],
            )],
        },
        Case {
            name: "overview",
            path: "/".into(),
            statements: {
                let mut s: Vec<(String, Vec<String>)> = Vec::new();
                for status in [0, 3] {
                    s.push((format!("SELECT COUNT(*) AS n FROM biz_outbox_event WHERE publish_status = {status} AND deleted = 0"), vec![]));
                }
                s.push(("SELECT COUNT(*) AS n FROM biz_outbox_event WHERE publish_status = 1 AND deleted = 0 AND lock_until <= now()".into(), vec![]));
                s.push(("SELECT MIN(create_time) AS oldest FROM biz_outbox_event WHERE publish_status = 0 AND deleted = 0".into(), vec![]));
                for status in [0, 1, 3] {
                    s.push((format!("SELECT COUNT(*) AS n FROM biz_outbox_event WHERE publish_status = {status} AND deleted = 0"), vec![]));
                }
                for status in [2, 4] {
                    s.push((format!("SELECT COUNT(*) AS n FROM biz_outbox_event WHERE publish_status = {status} AND deleted = 0 AND update_time >= $1::timestamptz"), vec![since.clone()]));
                }
                for column in ["topic", "event_type"] {
                    s.push((format!("SELECT COALESCE({column}, '') AS k, COUNT(*) AS n FROM biz_outbox_event WHERE publish_status = 3 AND deleted = 0 GROUP BY COALESCE({column}, '') ORDER BY n DESC, k ASC LIMIT 20"), vec![]));
                }
                for status in [2, 3] {
                    s.push((format!("SELECT CAST(FLOOR(EXTRACT(EPOCH FROM update_time) / 60) AS BIGINT) AS m, COUNT(*) AS n FROM biz_outbox_event WHERE publish_status = {status} AND deleted = 0 AND update_time >= $1::timestamptz GROUP BY CAST(FLOOR(EXTRACT(EPOCH FROM update_time) / 60) AS BIGINT)"), vec![since.clone()]));
                }
                s.push(("SELECT COALESCE(locked_by, '') AS relay, COUNT(*) AS events, MIN(lock_until) AS earliest, MAX(lock_until) AS latest FROM biz_outbox_event WHERE deleted = 0 AND publish_status = 1 GROUP BY COALESCE(locked_by, '') ORDER BY relay".into(), vec![]));
                s.push(("SELECT consumer, status, COUNT(*) AS n FROM quarantined_event GROUP BY consumer, status".into(), vec![]));
                s
            },
        },
    ];

    eprintln!("== starting the console");
    let mut child = Command::new(&eventctl)
        .args([
            "console",
            "--database-url",
            &db.url,
            "--listen",
            "127.0.0.1:0",
            "--read-only",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start eventctl console")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stderr), &mut line);
        line
    })
    .await?;
    let Some(address) = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .map(str::to_owned)
    else {
        let _ = child.kill();
        bail!("the console did not start: {line}");
    };

    let mut results = Vec::new();
    println!(
        "| page | console p50 | console p95 | same statements direct p50 | p95 | p95 ratio | indexes read |"
    );
    println!("|---|---|---|---|---|---|---|");
    for case in &cases {
        // Warm up both paths, then interleave them sample by sample.
        for _ in 0..5 {
            get(&address, &case.path).await?;
            for (sql, binds) in &case.statements {
                run_statement(&pool, sql, binds).await?;
            }
        }
        let (mut console, mut direct) = (Vec::new(), Vec::new());
        let mut bytes = 0;
        for _ in 0..SAMPLES {
            let started = Instant::now();
            let (status, size) = get(&address, &case.path).await?;
            console.push(started.elapsed().as_secs_f64() * 1000.0);
            if status != 200 {
                let _ = child.kill();
                bail!("{} answered {status}", case.path);
            }
            bytes = size;
            let started = Instant::now();
            for (sql, binds) in &case.statements {
                run_statement(&pool, sql, binds).await?;
            }
            direct.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        let mut used = Vec::new();
        for (sql, binds) in &case.statements {
            for index in indexes(&pool, sql, binds).await? {
                if !used.contains(&index) {
                    used.push(index);
                }
            }
        }
        let (c50, c95) = (
            percentile(&mut console, 0.5),
            percentile(&mut console, 0.95),
        );
        let (d50, d95) = (percentile(&mut direct, 0.5), percentile(&mut direct, 0.95));
        println!(
            "| {} | {c50:.1} ms | {c95:.1} ms | {d50:.1} ms | {d95:.1} ms | {:.2}x | {} |",
            case.name,
            c95 / d95.max(0.001),
            used.join(", ")
        );
        results.push(serde_json::json!({
            "page": case.name,
            "path": case.path,
            "consoleP50Ms": c50,
            "consoleP95Ms": c95,
            "directP50Ms": d50,
            "directP95Ms": d95,
            "p95Ratio": c95 / d95.max(0.001),
            "responseBytes": bytes,
            "statements": case.statements.len(),
            "indexes": used,
        }));
    }
    let _ = child.kill();
    let _ = child.wait();
    let report = serde_json::json!({
        "machine": crate::machine(),
        "measuredAt": chrono::Utc::now(),
        "outboxRows": rows,
        "samplesPerPage": SAMPLES,
        "fillSeconds": fill_seconds,
        "results": results,
    });
    crate::write_result("benches/results/console.json", &report)?;
    db.cleanup().await;
    Ok(())
}
