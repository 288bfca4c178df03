//! The README works as a new crate: its dependency snippet and its whole-service example are
//! written into a fresh crate outside the workspace (path dependencies on this repository), which
//! is built and run against the local NATS server. Its output must show the three event types of
//! each order, in order.

use std::path::{Path, PathBuf};
use std::process::Command;

use event_tests::db::{nats_url, services_required};

/// The fenced block of `language` in `text` whose body satisfies `pick`.
fn block(text: &str, language: &str, pick: impl Fn(&str) -> bool) -> Option<String> {
    let mut rest = text;
    while let Some(start) = rest.find("```") {
        let after = &rest[start + 3..];
        let info_end = after.find('\n')?;
        let info = &after[..info_end];
        let body_and_rest = &after[info_end + 1..];
        let end = body_and_rest.find("```")?;
        let body = &body_and_rest[..end];
        if info.split(',').next() == Some(language) && pick(body) {
            return Some(body.to_owned());
        }
        rest = &body_and_rest[end + 3..];
    }
    None
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_owned()
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// Runs `command` (cargo, or a wrapper of it) with `args` in the new crate `dir`, building into
/// the repository's `target/readme-crate`, which the README crates share.
fn cargo_in(mut command: Command, args: &[&str], dir: &Path, repo: &Path) -> std::process::Output {
    command
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", repo.join("target/readme-crate"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo")
}

/// Deletes the example's stream, so that each run starts from an empty one.
async fn delete_stream(url: &str) -> bool {
    let Ok(client) = async_nats::connect(url).await else {
        return false;
    };
    let js = async_nats::jetstream::new(client);
    let _ = js.delete_stream("ORDERS").await;
    true
}

#[test]
fn the_readme_service_builds_and_runs_as_a_new_crate() {
    let url = nats_url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    if !runtime.block_on(delete_stream(&url)) {
        assert!(
            !services_required(),
            "NATS at {url} is unreachable; EVENT_TEST_REQUIRE_SERVICES=1 makes this a failure"
        );
        eprintln!("skipping: NATS at {url} is unreachable");
        return;
    }
    let repo = repository();
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let guide = std::fs::read_to_string(repo.join("docs/src/outbox.md")).unwrap();
    let dependencies = block(&readme, "toml", |b| b.contains("event-core = { path"))
        .expect("the README's dependency snippet");
    let main = block(&guide, "rust", |b| b.starts_with("// src/main.rs"))
        .expect("the guide's whole-service example");

    let dir = std::env::temp_dir().join(format!("readme-shop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let dependencies = dependencies.replace(
        "path/to/event-toolkit",
        repo.to_str().expect("a UTF-8 path"),
    );
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"readme-shop\"\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n\
             # Not a member of any workspace around it.\n[workspace]\n\n{dependencies}"
        ),
    )
    .unwrap();
    // The versions this repository was tested with; cargo drops what the crate does not use.
    std::fs::copy(repo.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    std::fs::write(
        dir.join("src/main.rs"),
        main.replace("nats://127.0.0.1:4222", &url),
    )
    .unwrap();

    let out = cargo_in(Command::new(cargo()), &["run", "--quiet"], &dir, &repo);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the README's service failed:\n{stdout}\n{stderr}"
    );
    println!("{stdout}");

    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.first(), Some(&"relayed 6 events"), "{stdout}");
    for order in ["o-1", "o-2"] {
        let seen: Vec<String> = lines
            .iter()
            .filter(|l| l.starts_with(&format!("{order} #")))
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(
            seen,
            vec![
                format!("{order} #1 ORDER_PLACED"),
                format!("{order} #2 ORDER_PAID"),
                format!("{order} #3 ORDER_SHIPPED"),
            ],
            "{stdout}"
        );
    }
    assert!(
        stdout.contains("ORDER_PAID    correlation Some(\"o-1\")"),
        "{stdout}"
    );
    assert_eq!(lines.last(), Some(&"applied 6, duplicates 0"), "{stdout}");

    runtime.block_on(delete_stream(&url));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Rust blocks of the section `heading`, up to the next section of its level.
fn section_blocks(text: &str, heading: &str) -> Vec<String> {
    let start = text.find(heading).expect("the section");
    let rest = &text[start + heading.len()..];
    // The section ends at the next heading of its level or above, outside code blocks (where a
    // `# ` line is a doctest's hidden line).
    let level = heading.split(' ').next().unwrap_or("#").len();
    let mut end = rest.len();
    let mut fenced = false;
    let mut at = 0;
    for line in rest.split_inclusive('\n') {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !fenced && (1..=level).contains(&hashes) && line[hashes..].starts_with(' ') {
            end = at;
            break;
        }
        at += line.len();
    }
    let section = &rest[..end];
    let mut blocks = Vec::new();
    let mut rest = section;
    while let Some(body) = block(rest, "rust", |_| true) {
        // Past the block and its closing fence.
        let at = rest.find(&body).expect("the block is in the section") + body.len() + 3;
        blocks.push(body);
        rest = &rest[at..];
    }
    blocks
}

/// A doctest as the file a user pastes it into: its hidden lines shown, and wrapped in `main`
/// when it has none, as rustdoc runs it.
fn as_program(doctest: &str) -> String {
    let lines: Vec<&str> = doctest
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(shown) => shown,
            None if l == "#" => "",
            None => l,
        })
        .collect();
    let code = lines.join("\n");
    if code.contains("fn main(") {
        code
    } else {
        format!("fn main() {{\n{code}\n}}\n")
    }
}

#[test]
fn the_testing_examples_pass_as_a_new_crate_without_a_network() {
    let repo = repository();
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let dependencies = block(&readme, "toml", |b| b.contains("event-core = { path"))
        .expect("the README's dependency snippet");
    let testing = std::fs::read_to_string(repo.join("docs/src/testing.md")).unwrap();
    let dev = block(&testing, "toml", |b| b.contains("event-test = { path"))
        .expect("the guide's dev-dependency snippet");
    let mut examples = section_blocks(&readme, "## Testing your service");
    assert_eq!(examples.len(), 1, "the README's testing example");
    let chapter = section_blocks(&testing, "# Testing your service");
    assert_eq!(chapter.len(), 3, "the guide's three testing examples");
    examples.extend(chapter);

    let dir = std::env::temp_dir().join(format!("readme-testing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::create_dir_all(dir.join("tests")).unwrap();
    std::fs::write(dir.join("src/lib.rs"), "").unwrap();
    let mut manifest = format!(
        "[package]\nname = \"readme-testing\"\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n\
         [workspace]\n\n{dependencies}\n{dev}\n"
    );
    for (i, example) in examples.iter().enumerate() {
        std::fs::write(
            dir.join(format!("tests/example_{i}.rs")),
            as_program(example),
        )
        .unwrap();
        manifest.push_str(&format!(
            "[[test]]\nname = \"example_{i}\"\npath = \"tests/example_{i}.rs\"\nharness = false\n\n"
        ));
    }
    let manifest = manifest.replace(
        "path/to/event-toolkit",
        repo.to_str().expect("a UTF-8 path"),
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::copy(repo.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();

    // Without a network, where the machine allows it: nothing but the kit is reachable.
    let cargo = cargo();
    let isolated = Command::new("unshare")
        .args(["-n", "true"])
        .status()
        .is_ok_and(|s| s.success());
    let command = if isolated {
        let mut c = Command::new("unshare");
        c.args(["-n", &cargo]);
        c
    } else {
        eprintln!("unshare -n is not permitted here: running with the network");
        Command::new(&cargo)
    };
    let out = cargo_in(command, &["test", "--offline", "--quiet"], &dir, &repo);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the README's testing examples failed as a new crate (network isolated: {isolated}):\n{stdout}\n{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
