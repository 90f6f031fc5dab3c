//! `lockstep audit NODE --html` and `lockstep timeline --html` in a real
//! headless Chromium (Debian's `chromium`; `scripts/ensure-chromium.sh`
//! installs it when missing): the page is loaded from its file with the
//! network cut, the DOM as the browser drew it is dumped, and its phase
//! bands, event ticks and action arrows are counted against the replay
//! (`lockstep audit --json`). A screenshot of each page is kept under
//! `target/html-test/` (its path is printed) for a person to look at; the
//! book shows them from `docs/src/images/`, written there with
//! `LOCKSTEP_BLESS=1` (otherwise the test only checks that they are there).

use std::path::{Path, PathBuf};
use std::process::Command;

use lockstep_testkit::repo;

fn incident(name: &str) -> PathBuf {
    repo().join("replay-tests/incidents").join(name)
}

fn out_dir() -> PathBuf {
    let dir = repo().join("target/html-test");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn lockstep(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "lockstep {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn chromium() {
    let ok = Command::new(repo().join("scripts/ensure-chromium.sh"))
        .status()
        .unwrap();
    assert!(ok.success(), "scripts/ensure-chromium.sh failed");
}

/// Chromium, headless, as root (no sandbox), with no network at all.
fn browser(args: &[&str], page: &Path) -> Vec<u8> {
    // A profile per run: Chromium refuses a profile another one holds.
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let profile =
        std::env::temp_dir().join(format!("lockstep-chromium-{}-{run}", std::process::id()));
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--window-size=1280,900",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The elements the browser drew, in order: (class, data-node, data-seq,
/// data-phase) of every element whose class starts with `prefix`.
fn drawn(dom: &str, prefix: &str) -> Vec<(String, String, String, String)> {
    let attr = |tag: &str, name: &str| -> String {
        tag.split(&format!(" {name}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("")
            .to_owned()
    };
    dom.split('<')
        .filter(|t| t.starts_with("rect ") || t.starts_with("line ") || t.starts_with("path "))
        .map(|t| t.split('>').next().unwrap())
        .filter(|t| attr(t, "class").starts_with(prefix))
        .map(|t| {
            (
                attr(t, "class"),
                attr(t, "data-node"),
                attr(t, "data-seq"),
                attr(t, "data-phase"),
            )
        })
        .collect()
}

/// What the replay says of a node: (transition phases in order, events,
/// actions).
fn replayed(log: &Path, node: &str) -> (Vec<String>, usize, usize) {
    let json = lockstep(&["audit", node, "--log", log.to_str().unwrap(), "--json"]);
    let rows: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let phases = rows
        .iter()
        .filter(|r| r["type"] == "transition")
        .map(|r| r["transition"]["to"].as_str().unwrap().to_owned())
        .collect();
    let count = |t: &str| rows.iter().filter(|r| r["type"] == t).count();
    (phases, count("event"), count("action"))
}

fn screenshot(page: &Path, name: &str) -> PathBuf {
    let png = out_dir().join(name);
    let _ = std::fs::remove_file(&png);
    browser(&[&format!("--screenshot={}", png.display())], page);
    let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
    assert!(size > 10_000, "{}: {size} bytes", png.display());
    eprintln!("screenshot: {}", png.display());
    let in_book = repo().join("docs/src/images").join(name);
    if std::env::var_os("LOCKSTEP_BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(in_book.parent().unwrap()).unwrap();
        std::fs::copy(&png, &in_book).unwrap();
    } else {
        assert!(
            in_book.exists(),
            "{} is missing: write it with LOCKSTEP_BLESS=1 cargo test -p lockstep --test html",
            in_book.display()
        );
    }
    png
}

#[test]
fn an_audit_page_draws_each_transition_event_and_action_of_the_replay() {
    chromium();
    let log = incident("not-ready-grace.jsonl");
    let page = out_dir().join("audit-n2.html");
    lockstep(&[
        "audit",
        "n2",
        "--log",
        log.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: nothing to fetch, and nothing drawn until the browser
    // runs the page's script.
    for outside in ["<link", " src=", "@import", "url(http"] {
        assert!(!html.contains(outside), "{outside} in the page");
    }
    assert!(
        !html.contains("class=\"band\""),
        "drawn by the script, not the file"
    );

    let dom = String::from_utf8(browser(&["--dump-dom"], &page)).unwrap();
    assert!(dom.contains("data-drawn=\"true\""), "the script ran: {dom}");
    let (phases, events, actions) = replayed(&log, "n2");
    let bands = drawn(&dom, "band");
    assert_eq!(
        bands.iter().map(|b| b.3.clone()).collect::<Vec<_>>(),
        phases,
        "one band per transition, in order, coloured by the phase entered"
    );
    assert_eq!(drawn(&dom, "tick").len(), events);
    let arrows = drawn(&dom, "arrow");
    assert_eq!(arrows.len(), actions);
    assert!(
        arrows.iter().all(|a| a.0 == "arrow succeeded"),
        "both actions of this incident succeeded: {arrows:?}"
    );
    // The chain below, a row per line of `lockstep audit`, each with its seq.
    let text = lockstep(&["audit", "n2", "--log", log.to_str().unwrap()]);
    assert_eq!(dom.matches("class=\"row").count(), text.lines().count());
    assert!(dom.contains("because of seq 12: kubernetes node k2 Ready=False"));
    screenshot(&page, "audit-n2.png");
}

#[test]
fn a_timeline_page_draws_every_node_of_the_log() {
    chromium();
    let log = incident("mass-not-ready-rate-bound.jsonl");
    let page = out_dir().join("timeline-mass-not-ready.html");
    lockstep(&[
        "timeline",
        log.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    let dom = String::from_utf8(browser(&["--dump-dom"], &page)).unwrap();
    let bands = drawn(&dom, "band");
    let nodes: std::collections::BTreeSet<String> = bands.iter().map(|b| b.1.clone()).collect();
    assert!(nodes.len() >= 4, "{nodes:?}");
    for node in &nodes {
        let (phases, events, actions) = replayed(&log, node);
        let mine = |v: Vec<(String, String, String, String)>| {
            v.into_iter().filter(|e| &e.1 == node).collect::<Vec<_>>()
        };
        assert_eq!(
            mine(drawn(&dom, "band"))
                .into_iter()
                .map(|b| b.3)
                .collect::<Vec<_>>(),
            phases,
            "{node}"
        );
        assert_eq!(mine(drawn(&dom, "tick")).len(), events, "{node}");
        assert_eq!(mine(drawn(&dom, "arrow")).len(), actions, "{node}");
    }
    // A range: only what happened in it.
    let part = out_dir().join("timeline-range.html");
    lockstep(&[
        "timeline",
        log.to_str().unwrap(),
        "--html",
        part.to_str().unwrap(),
        "--from",
        "1",
        "--to",
        "12",
    ]);
    let dom_part = String::from_utf8(browser(&["--dump-dom"], &part)).unwrap();
    for (_, _, seq, _) in drawn(&dom_part, "band")
        .into_iter()
        .chain(drawn(&dom_part, "tick"))
    {
        let seq: u64 = seq.parse().unwrap();
        assert!((1..=12).contains(&seq), "seq {seq} outside the range");
    }
    screenshot(&page, "timeline-mass-not-ready.png");
}
