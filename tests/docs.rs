//! The book under `docs/` stays true: every `console` example runs against
//! the `lockstep` binary built from these sources, every alert rule has its
//! runbook section, every relative link of the README and the book leads
//! somewhere, and the README's test command is the one CI runs.
//!
//! A `console` block is a session: a line `$ COMMAND` runs COMMAND with
//! `sh -c` from the repository's root (`lockstep` and `kubectl-lockstep` on
//! PATH); the lines after it, up to the next command, must each appear as a
//! line of its output (stdout or stderr), except `...`, which stands for
//! lines left out, and `(exit N)`, the exit status expected (0 otherwise).
//! Commands that need a cluster go in `sh` blocks, which are not run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every markdown file of the book, by its path under the repository.
fn book_pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "md") {
                out.push(path);
            }
        }
    }
    let mut pages = Vec::new();
    walk(&repo().join("docs/src"), &mut pages);
    assert!(pages.len() > 10, "the book has its pages");
    pages
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn shown(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// A command of a `console` block and what its output must show.
struct Example {
    page: String,
    line: usize,
    command: String,
    expected: Vec<String>,
    exit: i32,
}

/// The fenced blocks of a page: (info string, first line number, lines).
fn fenced_blocks(text: &str) -> Vec<(String, usize, Vec<String>)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, usize, Vec<String>)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match (&mut open, fence) {
            (None, true) => {
                let info = line.trim_start().trim_start_matches('`').trim().to_owned();
                open = Some((info, i + 2, Vec::new()));
            }
            (Some(_), true) => blocks.push(open.take().unwrap()),
            (Some((_, _, lines)), false) => lines.push(line.to_owned()),
            (None, false) => {}
        }
    }
    assert!(open.is_none(), "a fenced block is not closed");
    blocks
}

fn examples(page: &Path) -> Vec<Example> {
    let mut out: Vec<Example> = Vec::new();
    for (info, first, lines) in fenced_blocks(&read(page)) {
        if info != "console" {
            continue;
        }
        for (i, line) in lines.iter().enumerate() {
            if let Some(command) = line.strip_prefix("$ ") {
                out.push(Example {
                    page: shown(page),
                    line: first + i,
                    command: command.to_owned(),
                    expected: Vec::new(),
                    exit: 0,
                });
                continue;
            }
            let example = out.last_mut().unwrap_or_else(|| {
                panic!(
                    "{}:{}: output before any `$ ` command",
                    shown(page),
                    first + i
                )
            });
            let line = line.trim_end();
            if let Some(code) = line
                .strip_prefix("(exit ")
                .and_then(|l| l.strip_suffix(')'))
            {
                example.exit = code.parse().expect("(exit N)");
            } else if line != "..." && !line.is_empty() {
                example.expected.push(line.to_owned());
            }
        }
    }
    out
}

/// A directory on PATH with `lockstep` and `kubectl-lockstep` (the same
/// binary, which is a kubectl plugin under that name).
fn bin_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lockstep-docs-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_lockstep"));
    for name in ["lockstep", "kubectl-lockstep"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&exe, &link).unwrap();
    }
    dir
}

fn run(example: &Example, path: &str) -> (i32, String) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(&example.command)
        .current_dir(repo())
        .env("PATH", path)
        .env_remove("LOCKSTEP_URL")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("sh runs");
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn every_console_example_of_the_book_runs_as_shown() {
    let bin = bin_dir();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let all: Vec<Example> = book_pages().iter().flat_map(|p| examples(p)).collect();
    assert!(all.len() >= 20, "only {} console examples", all.len());
    let mut failures = Vec::new();
    for example in &all {
        let (code, output) = run(example, &path);
        let lines: BTreeSet<&str> = output.lines().map(str::trim_end).collect();
        let missing: Vec<&String> = example
            .expected
            .iter()
            .filter(|l| !lines.contains(l.as_str()))
            .collect();
        if code != example.exit || !missing.is_empty() {
            failures.push(format!(
                "{}:{}: $ {}\n  exit {code} (the page says {}); lines not in the output: {missing:#?}\n  output:\n{output}",
                example.page, example.line, example.command, example.exit
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!("{} console examples ran as shown", all.len());
}

#[test]
fn every_alert_rule_has_its_runbook_section() {
    let rules: BTreeSet<String> = read(&repo().join("deploy/prometheus/alerts.yaml"))
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|n| n.trim().to_owned())
        .collect();
    assert!(rules.len() >= 5, "{rules:?}");
    let page = read(&repo().join("docs/src/operations/alerts.md"));
    let sections: BTreeSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|n| n.trim().to_owned())
        .collect();
    let without: Vec<_> = rules.difference(&sections).collect();
    assert!(
        without.is_empty(),
        "alert rules without a section in docs/src/operations/alerts.md: {without:?}"
    );
    let stale: Vec<_> = sections
        .iter()
        .filter(|s| s.starts_with("Lockstep") && !rules.contains(*s))
        .collect();
    assert!(stale.is_empty(), "runbooks of no alert rule: {stale:?}");
}

/// mdbook's anchor of a heading: lowercase, spaces to `-`, only
/// alphanumerics, `-` and `_` kept.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// Relative links `[text](target)` and images outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            out.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
    }
    out.retain(|l| !l.contains("://") && !l.starts_with("mailto:"));
    out
}

#[test]
fn every_relative_link_of_the_readme_and_the_book_leads_somewhere() {
    let mut pages = book_pages();
    pages.push(repo().join("README.md"));
    let mut broken = Vec::new();
    for page in &pages {
        let text = read(page);
        for link in links(&text) {
            let (file, frag) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", shown(page)));
                continue;
            }
            if !frag.is_empty()
                && target.extension().is_some_and(|x| x == "md")
                && !anchors(&read(&target)).contains(frag)
            {
                broken.push(format!("{}: {link}: no such heading", shown(page)));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_starts_with_the_two_commands_and_ci_runs_its_test_command() {
    let readme = read(&repo().join("README.md"));
    let (_, first, lines) = fenced_blocks(&readme).into_iter().next().unwrap();
    assert!(first <= 4, "the README starts with its commands");
    let commands: Vec<&str> = lines
        .iter()
        .map(|l| l.split('#').next().unwrap().trim())
        .collect();
    assert_eq!(commands, ["scripts/replay-demo.sh", "scripts/test.sh"]);
    let ci = read(&repo().join(".ci/run"));
    assert!(
        ci.lines().any(|l| l.trim() == "exec scripts/test.sh"),
        ".ci/run runs the README's test command"
    );
    assert!(readme.lines().count() < 150, "the README stays short");
}
