//! The guide's walkthrough (`src/guide/walkthrough.md`), run as written: every command between its `<!-- walkthrough -->`
//! markers goes through bash against a fresh `cargo run --example refund_service` (its default
//! SQLite file, in a directory of its own), and each answer must be the one the guide prints,
//! byte for byte (a `date:` header aside). Then the reset the guide describes (stop, delete
//! `refund_service.db*`, start again), and the same commands must print the same answers.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// One command of the walkthrough and what it prints.
#[derive(Debug)]
struct Step {
    command: String,
    expected: String,
    /// Where it is in the walkthrough, for the message.
    line: usize,
}

/// The commands between the markers: each line of a `sh` block (printing nothing), and each
/// `$ ` line of a `text` block with the lines after it as its output.
fn steps(readme: &str) -> Vec<Step> {
    let start = readme
        .find("<!-- walkthrough")
        .expect("the guide marks the start of its walkthrough");
    let end = readme
        .find("<!-- /walkthrough -->")
        .expect("the guide marks the end of its walkthrough");
    let first_line = readme[..start].lines().count();
    let mut steps: Vec<Step> = Vec::new();
    let mut block: Option<&str> = None;
    // Whether the `text` block at hand has had a command yet: lines before one are not output.
    let mut in_command = false;
    for (i, line) in readme[start..end].lines().enumerate() {
        let at = first_line + i + 1;
        if let Some(lang) = line.strip_prefix("```") {
            block = match block {
                None => Some(lang),
                Some(_) => None,
            };
            in_command = false;
            continue;
        }
        match block {
            Some("sh") if !line.trim().is_empty() && !line.trim_start().starts_with('#') => {
                steps.push(Step {
                    command: line.to_owned(),
                    expected: String::new(),
                    line: at,
                });
            }
            Some("text") => {
                if let Some(command) = line.strip_prefix("$ ") {
                    steps.push(Step {
                        command: command.to_owned(),
                        expected: String::new(),
                        line: at,
                    });
                    in_command = true;
                } else if let Some(step) = steps.last_mut().filter(|_| in_command) {
                    step.expected.push_str(line);
                    step.expected.push('\n');
                }
            }
            _ => {}
        }
    }
    steps
}

/// What may differ between two runs: the `Date` header.
fn normalise(output: &str) -> String {
    output
        .trim_end()
        .lines()
        .map(|l| {
            if l.to_ascii_lowercase().starts_with("date: ") {
                "date: …"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The example as the guide starts it: no configuration but `database_url` (none: its
/// default SQLite file), its files in `dir`.
fn start(dir: &Path, database_url: Option<&str>) -> (Service, String) {
    let mut command = Command::new(common::example_binary("refund_service"));
    match database_url {
        Some(url) => command.env("DATABASE_URL", url),
        None => command.env_remove("DATABASE_URL"),
    };
    let mut child = command
        .current_dir(dir)
        .env("IDEM_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "error")
        .env_remove("IDEM_STORE_URL")
        .env_remove("NATS_URL")
        .env_remove("PAYMENT_WEBHOOK_SECRET")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the example");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    (Service(child), base)
}

/// Runs every step in one bash, against the service at `base`, and compares each answer.
fn run(steps: &[Step], dir: &Path, base: &str) {
    let mut script = String::from("set -u\n");
    for (i, step) in steps.iter().enumerate() {
        script.push_str(&format!("printf '\\n@@step {i}@@\\n'\n"));
        script.push_str(&step.command.replace("http://127.0.0.1:3000", base));
        script.push('\n');
    }
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir)
        .env_remove("PAYMENT_WEBHOOK_SECRET")
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "the walkthrough's commands failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("the answers are UTF-8");
    let mut answers = stdout.split("@@step ").skip(1);
    let mut wrong = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let answer = answers.next().expect("every step ran");
        let answer = answer
            .strip_prefix(&format!("{i}@@\n"))
            .expect("the steps ran in order");
        if normalise(answer) != normalise(&step.expected) {
            wrong.push(format!(
                "src/guide/walkthrough.md line {}: `{}`\n--- the guide says:\n{}\n--- it printed:\n{}\n",
                step.line,
                step.command,
                normalise(&step.expected),
                normalise(answer)
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} commands printed another answer:\n\n{}",
        wrong.len(),
        steps.len(),
        wrong.join("\n")
    );
}

#[test]
#[cfg_attr(
    not(idem_walkthrough_tools),
    ignore = "needs bash, curl and openssl, as the guide's walkthrough does"
)]
fn the_walkthrough_prints_what_the_readme_says_and_again_after_a_reset() {
    let readme = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../src/guide/walkthrough.md"),
    )
    .expect("read the guide's walkthrough");
    let steps = steps(&readme);
    assert!(
        steps.len() > 10,
        "the walkthrough has its commands: {steps:?}"
    );
    let dir = tempfile::tempdir().unwrap();

    let (service, base) = start(dir.path(), None);
    run(&steps, dir.path(), &base);
    drop(service);

    // The guide's reset: stop the service, delete refund_service.db*, start it again.
    let mut removed = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("refund_service.db") {
            std::fs::remove_file(&path).unwrap();
            removed += 1;
        }
    }
    assert!(
        removed >= 1,
        "the service kept its data in refund_service.db"
    );
    let (_service, base) = start(dir.path(), None);
    run(&steps, dir.path(), &base);
}

/// The guide's PostgreSQL section: the same walkthrough prints the same answers on a database
/// of its own (here a schema of its own), and again on a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(all(idem_postgres, idem_walkthrough_tools)),
    ignore = "needs PostgreSQL (DATABASE_URL=postgres://…) and bash, curl and openssl"
)]
async fn the_walkthrough_prints_the_same_on_postgres() {
    twice_on_a_new_database(async || {
        let schema = common::PgSchema::create(&common::pg_url(), 1).await;
        let url = schema.scoped_url();
        (schema, url)
    })
    .await;
}

/// The guide's MySQL section: the same walkthrough prints the same answers on a MariaDB
/// database of its own, and again on a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(all(idem_mysql, idem_walkthrough_tools)),
    ignore = "needs MySQL or MariaDB (IDEM_MYSQL_URL=mysql://…) and bash, curl and openssl"
)]
async fn the_walkthrough_prints_the_same_on_mysql() {
    twice_on_a_new_database(async || {
        let database = common::MyDatabase::create(&common::mysql_url(), 1).await;
        let url = database.url.clone();
        (database, url)
    })
    .await;
}

/// The walkthrough on the service started on a database `new` makes (what keeps it, and its
/// URL), then again on another one.
async fn twice_on_a_new_database<D>(new: impl AsyncFn() -> (D, String)) {
    let readme = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../src/guide/walkthrough.md"),
    )
    .expect("read the guide's walkthrough");
    let steps = steps(&readme);
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let (_database, url) = new().await;
        let (service, base) = start(dir.path(), Some(&url));
        tokio::task::block_in_place(|| run(&steps, dir.path(), &base));
        drop(service);
    }
}
