//! `eventctl console` as a real process, driven by a real headless Chromium through
//! chromedriver, on PostgreSQL and SQLite: search, the aggregate timeline's blocking head, retry
//! and skip with their audit entries, a quarantined entry requeued from the page and replayed by
//! the running consumer, a payload holding `<script>` shown as text; and, over plain HTTP,
//! actions without a login, with a wrong CSRF token, in read-only mode, and wrong secrets.
//!
//! Screenshots go to `$EVENT_CONSOLE_SCREENSHOTS` when set (the guide's come from there).

// A panic is how a test fails.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use event_core::{EventContext, UnitOfWork};
use event_sqlx::{
    Backend, Consumer, Delivered, EventStatus, HandlerError, MessageEvent, MessageStore,
    NatsPublisher, OutboxConfig, Quarantine, QuarantineStatus, RelayConfig, Route,
};
use event_tests::any_broker::durable;
use event_tests::any_broker::stream_for;
use event_tests::background::Process as Running;
use event_tests::db::{TestDb, nats_url, reachable, services_required, unique};
use event_tests::fixtures::{Order, OrderPlaced, Refusing};
use event_tests::wait;
use fantoccini::{Client, ClientBuilder, Locator};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "console-test-token-0123456789";
const XSS: &str = "<script>alert(1)</script>";

/// Starts `eventctl console` on a free port; returns it and its base URL.
fn console(url: &str, extra: &[&str]) -> (Running, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_eventctl"))
        .args(["console", "--database-url", url, "--listen", "127.0.0.1:0"])
        .args(extra)
        .env("EVENTCTL_CONSOLE_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start eventctl console");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let running = Running(child);
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the console says where it serves");
    let base = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in `{line}`"));
    (running, format!("http://{base}"))
}

/// Chromium under chromedriver, headless; `None` when they are not installed and not required.
async fn browser() -> Option<(Running, Client)> {
    let driver = std::env::var("EVENT_TEST_CHROMEDRIVER").unwrap_or("/usr/bin/chromedriver".into());
    let chromium = std::env::var("EVENT_TEST_CHROMIUM").unwrap_or("/usr/bin/chromium".into());
    if !PathBuf::from(&driver).exists() || !PathBuf::from(&chromium).exists() {
        assert!(
            !services_required(),
            "{driver} or {chromium} is missing: install Debian's chromium and chromium-driver (.ci/run does)"
        );
        eprintln!("skipped: {driver} or {chromium} is missing");
        return None;
    }
    let port = event_tests::db::free_port();
    let process = Running(
        Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver"),
    );
    let address = format!("127.0.0.1:{port}");
    wait::until(Duration::from_secs(30), async || {
        tokio::net::TcpStream::connect(&address)
            .await
            .map(|_| ())
            .map_err(|e| format!("chromedriver on {address}: {e}"))
    })
    .await;
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900", "--lang=en-US"]
        }),
    );
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://{address}"))
        .await
        .expect("a Chromium session");
    Some((process, client))
}

/// Saves a screenshot of the current page when `$EVENT_CONSOLE_SCREENSHOTS` names a folder.
async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    if let Ok(dir) = std::env::var("EVENT_CONSOLE_SCREENSHOTS") {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(PathBuf::from(dir).join(format!("{name}.png")), png).unwrap();
    }
}

async fn text(client: &Client, css: &str) -> String {
    match client
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css(css))
        .await
    {
        Ok(element) => element.text().await.unwrap(),
        Err(e) => {
            let url = client.current_url().await;
            let source = client.source().await.unwrap_or_default();
            panic!("no `{css}` on {url:?}: {e}\n{source}")
        }
    }
}

async fn fill(client: &Client, css: &str, value: &str) {
    let field = client.find(Locator::Css(css)).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(value).await.unwrap();
}

async fn click(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no `{css}` to click: {e}"))
        .click()
        .await
        .unwrap();
}

/// Waits for the browser to arrive on a page whose URL contains `part`.
async fn arrive(client: &Client, part: &str) {
    wait::until(Duration::from_secs(20), async || {
        let url = client.current_url().await.map_err(|e| e.to_string())?;
        if url.as_str().contains(part) {
            Ok(())
        } else {
            Err(format!("still on {url}"))
        }
    })
    .await;
}

/// One HTTP/1.1 request; the status, the headers (lowercased names) and the body.
async fn http(
    base: &str,
    method: &str,
    path: &str,
    cookie: Option<&str>,
    form: Option<&str>,
) -> (u16, Vec<(String, String)>, String) {
    let host = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let body = form.unwrap_or_default();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    if let Some(cookie) = cookie {
        request.push_str(&format!("Cookie: {cookie}\r\n"));
    }
    if form.is_some() {
        request.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The `name=value` of the session cookie a login response sets.
fn session_cookie(headers: &[(String, String)]) -> String {
    let set = header(headers, "set-cookie").expect("a login response sets the session cookie");
    set.split(';').next().unwrap_or(set).to_owned()
}

/// A POST of `body` (a form) to `path` with the session `cookie`.
async fn post(
    base: &str,
    path: &str,
    cookie: &str,
    body: &str,
) -> (u16, Vec<(String, String)>, String) {
    http(base, "POST", path, Some(cookie), Some(body)).await
}

/// A GET of `path` with the session `cookie`.
async fn get(base: &str, path: &str, cookie: &str) -> (u16, Vec<(String, String)>, String) {
    http(base, "GET", path, Some(cookie), None).await
}

/// The value of the hidden input `name` in `page`, unescaped.
fn hidden(page: &str, name: &str) -> String {
    page.split(&format!("name=\"{name}\" value=\""))
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .replace("&amp;", "&")
}

/// `pairs` as an `application/x-www-form-urlencoded` body.
fn form(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

async fn event_no<DB: Backend>(db: &TestDb<DB>, order: &str, seq: usize) -> String {
    db.outbox.by_aggregate("ORDER", order).await.unwrap()[seq]
        .event_no
        .clone()
}

async fn status<DB: Backend>(db: &TestDb<DB>, no: &str) -> EventStatus {
    db.outbox
        .by_event_no(no)
        .await
        .unwrap()
        .unwrap()
        .publish_status
}

async fn the_console_serves_operators<DB: Backend>(db: TestDb<DB>, name: &str) {
    let url = nats_url();
    let Some(nats) = reachable("NATS", &url, NatsPublisher::connect(&url).await) else {
        return;
    };
    let Some((_driver, client)) = browser().await else {
        return;
    };
    let topic = unique("console").replace('_', "-");
    let stream = stream_for(&nats, &topic).await.unwrap();
    let route = |key: &str| Route::topic(topic.clone()).routing_key(key);
    let outbox = event_sqlx::Outbox::new(
        db.pool().clone(),
        OutboxConfig::new()
            .route("ORDER_PLACED", route("order.placed"))
            .route("ORDER_PAID", route("order.paid")),
    );
    // o-1 placed and paid, its placement refused: the paid event waits behind it. o-2 and o-4
    // refused. o-3, o-5 and the one whose id holds a script tag published; the consumer is
    // broken for o-5 until the fix.
    let mut uow = UnitOfWork::new(EventContext::new("order-service"));
    let mut o1 = Order::place("o-1", 100).unwrap();
    o1.pay(100).unwrap();
    uow.collect(&mut o1).unwrap();
    for id in ["o-2", "o-3", "o-4", "o-5", "o-6", "o-7", XSS] {
        uow.collect(&mut Order::place(id, 100).unwrap()).unwrap();
    }
    let _ = outbox
        .commit(db.pool().begin().await.unwrap(), uow)
        .await
        .unwrap();
    let refusing = Refusing::new(nats.clone(), &["o-1", "o-2", "o-4", "o-6", "o-7"]);
    outbox
        .relay(refusing, RelayConfig::new("relay"))
        .drain()
        .await
        .unwrap();
    let placed_1 = event_no(&db, "o-1", 0).await;
    let paid_1 = event_no(&db, "o-1", 1).await;
    let placed_2 = event_no(&db, "o-2", 0).await;
    let placed_3 = event_no(&db, "o-3", 0).await;
    let placed_4 = event_no(&db, "o-4", 0).await;
    let placed_5 = event_no(&db, "o-5", 0).await;
    let xss_no = event_no(&db, XSS, 0).await;
    assert_eq!(status(&db, &placed_1).await, EventStatus::Failed);
    assert_eq!(status(&db, &paid_1).await, EventStatus::Pending);

    let broken = Arc::new(AtomicBool::new(true));
    let flag = Arc::clone(&broken);
    let billing = Consumer::new(db.pool().clone(), "billing", "1.0.0").on(
        async move |_tx: &mut DB::Connection, placed: Delivered<OrderPlaced>| {
            if placed.order_id == "o-5" && flag.load(Ordering::SeqCst) {
                return Err(HandlerError::Permanent("no price list for o-5".into()));
            }
            Ok(())
        },
    );
    let subscription = durable(&nats, &stream, "billing", &format!("{topic}.>")).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let consuming = subscription.run(&billing, async {
        let _ = stopped.await;
    });
    let quarantine = Quarantine::new(db.pool().clone());
    let (console_process, base) = console(&db.url, &[]);
    let driving = async {
        let entry = wait::until(Duration::from_secs(30), async || {
            match quarantine
                .entries(Some("billing"), None, &Default::default(), 0, 10)
                .await
                .map_err(|e| e.to_string())?
                .pop()
            {
                Some(entry) => Ok(entry),
                None => Err("the consumer has not quarantined o-5 yet".to_owned()),
            }
        })
        .await;
        assert_eq!(entry.event_id, placed_5);

        // Search by event number, typed into the form.
        client.goto(&format!("{base}/search")).await.unwrap();
        fill(&client, "#no", &placed_3).await;
        click(&client, "#search").await;
        arrive(&client, "no=").await;
        assert_eq!(text(&client, "#count").await, "1 events, newest first.");
        assert_eq!(text(&client, "a.event-no").await, placed_3);
        // By aggregate.
        client.goto(&format!("{base}/search")).await.unwrap();
        fill(&client, "#aggregate_type", "ORDER").await;
        fill(&client, "#aggregate_id", "o-1").await;
        click(&client, "#search").await;
        arrive(&client, "aggregate_id=o-1").await;
        let found: Vec<String> = {
            let mut v = Vec::new();
            for e in client.find_all(Locator::Css("a.event-no")).await.unwrap() {
                v.push(e.text().await.unwrap());
            }
            v
        };
        assert_eq!(found, vec![paid_1.clone(), placed_1.clone()]);
        screenshot(&client, &format!("search-{name}")).await;

        // The timeline names the blocking head.
        client
            .goto(&format!("{base}/aggregate?type=ORDER&id=o-1"))
            .await
            .unwrap();
        let blocked = text(&client, "#blocked").await;
        assert!(
            blocked.starts_with(&format!("{placed_1} is the head: 1 later events wait")),
            "{blocked}"
        );
        let head_row = client
            .find(Locator::XPath(
                "//tr[.//span[@id='head']]//a[@class='event-no']",
            ))
            .await
            .unwrap();
        assert_eq!(head_row.text().await.unwrap(), placed_1);
        // Not logged in: no action is offered.
        assert!(client.find(Locator::Css("#skip")).await.is_err());

        // Log in with a name and the shared token.
        client.goto(&format!("{base}/login?next=/")).await.unwrap();
        fill(&client, "#user-field", "alice").await;
        fill(&client, "#secret-field", TOKEN).await;
        click(&client, "#login").await;
        assert_eq!(text(&client, "#user").await, "alice");
        screenshot(&client, &format!("overview-{name}")).await;

        // Retry a failed event from its page.
        client
            .goto(&format!("{base}/event?no={}", enc(&placed_2)))
            .await
            .unwrap();
        click(&client, "#retry").await;
        let outcome = text(&client, "#outcome").await;
        assert_eq!(outcome, format!("{placed_2} was put back to pending"));
        assert_eq!(status(&db, &placed_2).await, EventStatus::Pending);

        // Skip the blocking head, with a reason.
        client
            .goto(&format!("{base}/aggregate?type=ORDER&id=o-1"))
            .await
            .unwrap();
        screenshot(&client, &format!("aggregate-{name}")).await;
        fill(
            &client,
            "#skip-reason",
            "customer called: placement duplicated",
        )
        .await;
        click(&client, "#skip").await;
        let outcome = text(&client, "#outcome").await;
        assert!(
            outcome.starts_with(&format!("skipped {placed_1}")),
            "{outcome}"
        );
        assert_eq!(status(&db, &placed_1).await, EventStatus::Cancelled);
        assert_eq!(status(&db, &paid_1).await, EventStatus::Pending);

        // Requeue the quarantined entry; the running consumer replays it.
        broken.store(false, Ordering::SeqCst);
        client
            .goto(&format!("{base}/quarantine?consumer=billing"))
            .await
            .unwrap();
        screenshot(&client, &format!("quarantine-{name}")).await;
        click(&client, &format!("#requeue-{}", entry.id)).await;
        let outcome = text(&client, "#outcome").await;
        assert!(outcome.contains("was requeued"), "{outcome}");
        wait::until(Duration::from_secs(30), async || {
            match quarantine
                .entry(entry.id)
                .await
                .map_err(|e| e.to_string())?
            {
                Some(e) if e.status == QuarantineStatus::Replayed => Ok(()),
                other => Err(format!("not replayed yet: {other:?}")),
            }
        })
        .await;
        client
            .goto(&format!("{base}/event?no={}", enc(&placed_5)))
            .await
            .unwrap();
        assert!(text(&client, "#consumed").await.contains("billing"));
        screenshot(&client, &format!("event-{name}")).await;

        // The audit page shows both changes, by alice, with the reason.
        client.goto(&format!("{base}/audit")).await.unwrap();
        let audit = text(&client, "#audit").await;
        for expected in [
            "outbox.retry",
            "outbox.skip",
            "quarantine.requeue",
            "alice",
            "customer called: placement duplicated",
        ] {
            assert!(
                audit.contains(expected),
                "no `{expected}` in the audit page: {audit}"
            );
        }
        assert!(
            audit.contains(&placed_1) && audit.contains(&placed_2),
            "{audit}"
        );
        assert!(
            !audit.contains("no outcome was recorded"),
            "every entry settled: {audit}"
        );
        screenshot(&client, &format!("audit-{name}")).await;

        // A payload holding a script tag is shown as text, and no script runs.
        client
            .goto(&format!("{base}/event?no={}", enc(&xss_no)))
            .await
            .unwrap();
        assert!(text(&client, "#payload").await.contains(XSS));
        assert!(text(&client, "h1").await.contains("<script>"));
        assert!(
            client
                .find_all(Locator::Css("script"))
                .await
                .unwrap()
                .is_empty()
        );
        let source = client.source().await.unwrap();
        assert!(!source.contains(XSS), "the tag is escaped in the HTML");

        // A phone's width: the overview still reads without sideways scrolling of the page.
        client.set_window_size(390, 844).await.unwrap();
        client.goto(&format!("{base}/")).await.unwrap();
        let _ = text(&client, "#backlog").await;
        screenshot(&client, &format!("phone-{name}")).await;

        // Over plain HTTP: no login, a wrong CSRF token, read-only: nothing changes.
        let (code, headers, _) = http(&base, "GET", "/", None, None).await;
        assert_eq!(code, 200);
        let csp = header(&headers, "content-security-policy").unwrap_or_default();
        assert!(
            csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
            "{csp}"
        );
        let retry_4 = form(&[("no", &placed_4), ("csrf", "anything")]);
        let (code, _, body) =
            http(&base, "POST", "/actions/outbox/retry", None, Some(&retry_4)).await;
        assert_eq!(code, 401, "{body}");
        assert_eq!(status(&db, &placed_4).await, EventStatus::Failed);

        let login = form(&[("user", "bob"), ("secret", TOKEN), ("next", "/")]);
        let (code, headers, _) = http(&base, "POST", "/login", None, Some(&login)).await;
        assert_eq!(code, 303);
        let cookie = session_cookie(&headers);
        let (_, _, page) = http(
            &base,
            "GET",
            &format!("/event?no={}", enc(&placed_4)),
            Some(&cookie),
            None,
        )
        .await;
        let csrf = hidden(&page, "csrf");
        let wrong = form(&[("no", &placed_4), ("csrf", "0000")]);
        let (code, _, body) = post(&base, "/actions/outbox/retry", &cookie, &wrong).await;
        assert_eq!(code, 403, "{body}");
        assert!(body.contains("CSRF"), "{body}");
        assert_eq!(status(&db, &placed_4).await, EventStatus::Failed);
        // The same request with the session's token does change it: the refusals above were
        // for the token, not for anything else.
        let right = form(&[("no", &placed_4), ("csrf", &csrf)]);
        let (code, _, body) = post(&base, "/actions/outbox/retry", &cookie, &right).await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(status(&db, &placed_4).await, EventStatus::Pending);

        // Bulk retry: the confirmation counts the rows (o-6 and o-7 are the failed ones left),
        // the retry touches those and is audited with both.
        let (code, _, page) = get(&base, "/bulk-retry?event_type=ORDER_PLACED", &cookie).await;
        assert_eq!(code, 200);
        assert!(
            page.contains("This puts <strong>2</strong> failed events back to pending"),
            "{page}"
        );
        let filter = hidden(&page, "filter");
        let bulk = form(&[
            ("filter", &filter),
            ("expected", "2"),
            ("csrf", &csrf),
            ("reason", "broker fixed"),
        ]);
        let (code, _, body) = post(&base, "/actions/outbox/bulk-retry", &cookie, &bulk).await;
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("2 of 2 failed events"), "{body}");
        let placed_6 = event_no(&db, "o-6", 0).await;
        let placed_7 = event_no(&db, "o-7", 0).await;
        assert_eq!(status(&db, &placed_6).await, EventStatus::Pending);
        assert_eq!(status(&db, &placed_7).await, EventStatus::Pending);
        let (_, _, audit) = http(&base, "GET", "/audit", None, None).await;
        assert!(
            audit.contains("outbox.bulk_retry")
                && audit.contains(&placed_6)
                && audit.contains(&placed_7)
        );

        // A cancel without a reason is refused.
        let no_reason = form(&[("no", &placed_4), ("csrf", &csrf), ("reason", " ")]);
        let (code, _, body) = post(&base, "/actions/outbox/cancel", &cookie, &no_reason).await;
        assert_eq!(code, 400, "{body}");
        assert_eq!(status(&db, &placed_4).await, EventStatus::Pending);

        // Wrong secrets: five are answered, then the address is refused for a while, even with
        // the right one.
        for _ in 0..5 {
            let bad = form(&[
                ("user", "mallory"),
                ("secret", "not-the-token-at-all"),
                ("next", "/"),
            ]);
            let (code, headers, _) = http(&base, "POST", "/login", None, Some(&bad)).await;
            assert_eq!(code, 401);
            assert!(header(&headers, "set-cookie").is_none());
        }
        let (code, headers, _) = http(&base, "POST", "/login", None, Some(&login)).await;
        assert_eq!(code, 429);
        assert!(header(&headers, "set-cookie").is_none());

        // Read-only: the session of the other console means nothing here, and nothing changes.
        let (_read_only, ro) = console(&db.url, &["--read-only"]);
        let (code, _, body) = http(
            &ro,
            "POST",
            "/actions/outbox/cancel",
            Some(&cookie),
            Some(&form(&[
                ("no", &placed_4),
                ("csrf", &csrf),
                ("reason", "x"),
            ])),
        )
        .await;
        assert_eq!(code, 403, "{body}");
        assert!(body.contains("read-only"), "{body}");
        let (code, _, _) = http(&ro, "POST", "/login", None, Some(&login)).await;
        assert_eq!(code, 403);
        assert_eq!(status(&db, &placed_4).await, EventStatus::Pending);
        let (_, _, page) = http(
            &ro,
            "GET",
            &format!("/event?no={}", enc(&placed_4)),
            None,
            None,
        )
        .await;
        assert!(
            !page.contains("/actions/"),
            "a read-only page offers no action"
        );

        let _ = stop.send(());
    };
    let (consumed, ()) = tokio::join!(consuming, driving);
    consumed.unwrap();
    drop(console_process);
    client.close().await.unwrap();
    db.cleanup().await;
}

/// `value` encoded for a query string.
fn enc(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    the_console_serves_operators(db, "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let db = TestDb::sqlite().await.unwrap();
    the_console_serves_operators(db, "sqlite").await;
}

#[test]
fn a_console_on_a_public_address_without_credentials_refuses_to_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_eventctl"))
        .args([
            "console",
            "--database-url",
            "sqlite://nowhere.db",
            "--listen",
            "0.0.0.0:0",
        ])
        .env_remove("EVENTCTL_CONSOLE_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to serve on 0.0.0.0:0 without credentials"),
        "{stderr}"
    );
}

/// On MySQL/MariaDB each page answers, over HTTP, with the events it should show; hostile query
/// strings get a page that names the problem, never a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_pages_answer_and_bad_input_is_named() {
    let Some(db) = TestDb::mysql().await else {
        return;
    };
    let mut uow = UnitOfWork::new(EventContext::new("order-service"));
    for id in ["o-1", "o-2"] {
        let mut order = Order::place(id, 100).unwrap();
        order.pay(100).unwrap();
        uow.collect(&mut order).unwrap();
    }
    let _ = db
        .outbox
        .commit(db.pool().begin().await.unwrap(), uow)
        .await
        .unwrap();
    let placed = event_no(&db, "o-1", 0).await;
    let (_console, base) = console(&db.url, &[]);
    for (path, expected) in [
        ("/".to_owned(), "4</span> pending".to_owned()),
        ("/search".to_owned(), placed.clone()),
        (
            format!("/search?no={}", enc(&placed)),
            "1 events".to_owned(),
        ),
        (
            "/search?aggregate_type=ORDER&aggregate_id=o-1".to_owned(),
            placed.clone(),
        ),
        (
            "/search?event_type=ORDER_PAID&from=2020-01-01T00:00".to_owned(),
            "2 events".to_owned(),
        ),
        (
            "/aggregate?type=ORDER&id=o-2".to_owned(),
            "is the head: 1 later events wait".to_owned(),
        ),
        (
            format!("/event?no={}", enc(&placed)),
            "No consumer has recorded it".to_owned(),
        ),
        (
            "/quarantine".to_owned(),
            "No consumer has quarantined".to_owned(),
        ),
        ("/messages".to_owned(), "Failed messages".to_owned()),
        ("/audit".to_owned(), "No change has been made".to_owned()),
    ] {
        let (code, _, body) = http(&base, "GET", &path, None, None).await;
        assert_eq!(code, 200, "{path}: {body}");
        assert!(
            body.contains(&expected),
            "{path}: no `{expected}` in {body}"
        );
    }
    for (path, code, expected) in [
        ("/search?from=yesterday", 400, "is not a time"),
        ("/search?status=lost", 400, "unknown status `lost`"),
        ("/search?aggregate_type=ORDER", 400, "give both"),
        (
            "/search?before=99999999999999999999_1",
            400,
            "cursor is damaged",
        ),
        (
            "/event?no=nothing",
            404,
            "no outbox event has event number nothing",
        ),
        ("/aggregate?type=ORDER", 400, "give the aggregate"),
        ("/quarantine?class=odd", 400, "unknown failure class"),
        ("/login?next=%2F%0D%0ASet-Cookie%3A%20x", 200, "Log in"),
        ("/nowhere", 404, "no such page"),
    ] {
        let (got, _, body) = http(&base, "GET", path, None, None).await;
        assert_eq!(got, code, "{path}: {body}");
        assert!(body.contains(expected), "{path}: no `{expected}` in {body}");
    }
    // A login sent back to a header-breaking `next` lands on `/`.
    let login = form(&[
        ("user", "carol"),
        ("secret", TOKEN),
        ("next", "/\r\nSet-Cookie: x=1"),
    ]);
    let (code, headers, _) = http(&base, "POST", "/login", None, Some(&login)).await;
    assert_eq!(code, 303);
    assert_eq!(header(&headers, "location"), Some("/"));
    let cookie = session_cookie(&headers);

    // The message table: a failed message retried, a pending one cancelled with a reason, under
    // the CLI's guards (a pending message is not retried), each audited.
    let messages = MessageStore::new(db.pool().clone());
    let envelope = db
        .outbox
        .by_event_no(&placed)
        .await
        .unwrap()
        .unwrap()
        .envelope()
        .unwrap();
    for no in ["MSG-1", "MSG-2"] {
        let mut message = MessageEvent::from_envelope(&envelope);
        message.event_no = no.into();
        assert!(messages.create(&message).await.unwrap());
    }
    let first = messages.by_event_no("MSG-1").await.unwrap().unwrap();
    assert!(messages.claim(&first).await.unwrap());
    assert!(
        messages
            .fail(first.id, "downstream said no", Duration::from_secs(60))
            .await
            .unwrap()
    );
    let (_, _, page) = get(&base, "/messages", &cookie).await;
    assert!(
        page.contains("MSG-1") && page.contains("downstream said no"),
        "{page}"
    );
    let csrf = hidden(&page, "csrf");
    let post = async |path: &str, pairs: &[(&str, &str)]| {
        http(&base, "POST", path, Some(&cookie), Some(&form(pairs))).await
    };
    let (code, _, body) = post(
        "/actions/messages/retry",
        &[("no", "MSG-2"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(code, 409, "a pending message is not retried: {body}");
    let (code, _, body) = post(
        "/actions/messages/retry",
        &[("no", "MSG-1"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let (code, _, body) = post(
        "/actions/messages/cancel",
        &[("no", "MSG-2"), ("csrf", &csrf), ("reason", "sent by hand")],
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let status_of = async |no: &str| {
        messages
            .by_event_no(no)
            .await
            .unwrap()
            .unwrap()
            .event_status
    };
    assert_eq!(status_of("MSG-1").await, EventStatus::Pending);
    assert_eq!(status_of("MSG-2").await, EventStatus::Cancelled);

    // A consumer whose inbox is in another database (SQLite here): with
    // --consumer-database-url, the event page lists it.
    let consumer_db = TestDb::sqlite().await.unwrap();
    event_sqlx::Inbox::new(consumer_db.pool().clone(), "shipping")
        .handle(&envelope, async |_tx| Ok::<_, std::convert::Infallible>(()))
        .await
        .unwrap();
    let event_page = format!("/event?no={}", enc(&placed));
    let (_, _, page) = http(&base, "GET", &event_page, None, None).await;
    assert!(
        !page.contains("shipping"),
        "the outbox's own inbox has no shipping"
    );
    let (_elsewhere, other) = console(&db.url, &["--consumer-database-url", &consumer_db.url]);
    let (code, _, page) = http(&other, "GET", &event_page, None, None).await;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("<td>shipping</td>"), "{page}");
    consumer_db.cleanup().await;
    let (_, _, audit) = http(&base, "GET", "/audit", None, None).await;
    for expected in ["message.retry", "message.cancel", "sent by hand", "carol"] {
        assert!(audit.contains(expected), "no `{expected}` in {audit}");
    }
    db.cleanup().await;
}
