//! Incident bundles: a window of a log, with the state before it as a
//! snapshot record, replays alone to the same state and the same actions
//! as the whole log; `replay --from` and `--since` show the same window.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use lockstep::commands::{self, ReplayOptions, Start};
use lockstep_schemas::log::{self, Format, LogReader, LogWriter};
use lockstep_schemas::Record;

fn lockstep(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .output()
        .expect("lockstep runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lockstep-bundles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `lockstep ARGS` exits 2 and says `why` on stderr.
fn refused(args: &[&str], why: &str) {
    let out = lockstep(args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(stderr.contains(why), "{args:?}: {stderr}");
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every shipped incident log and the compat log.
fn logs() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root().join("replay-tests/incidents"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    out.sort();
    out.push(root().join("replay-tests/compat/0.1.0-2026-11-30.jsonl"));
    assert!(out.len() > 30, "{out:?}");
    out
}

fn records(path: &Path) -> commands::Records {
    Box::new(log::open(path).unwrap())
}

/// The JSON timeline rows (one per event that caused something) and the
/// state hash; with `verify`, every recorded action matched.
fn replay_verifying(records: commands::Records, verify: bool) -> (Vec<serde_json::Value>, String) {
    let opts = ReplayOptions {
        json: true,
        verify,
        ..Default::default()
    };
    let mut out = Vec::new();
    let report = commands::replay(records, &opts, &mut out, &mut |_| {}).unwrap();
    assert!(report.damage.is_none(), "{:?}", report.damage);
    assert!(report.divergence.is_none(), "{:?}", report.divergence);
    let rows = text(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (rows, report.state_hash)
}

/// `records` written in `format` and read back.
fn through_file(records: commands::Records, format: Format) -> commands::Records {
    let mut w = LogWriter::new(Vec::new(), format, "test").unwrap();
    for rec in records {
        let rec = rec.unwrap();
        if !matches!(rec, Record::Header(_)) {
            w.write(&rec).unwrap();
        }
    }
    let bytes = w.finish().unwrap();
    Box::new(LogReader::detect(std::io::Cursor::new(bytes)).unwrap())
}

fn replay(records: commands::Records) -> (Vec<serde_json::Value>, String) {
    replay_verifying(records, false)
}

/// Whether the whole log's recorded actions are the ones this build
/// computes (the compat log's are not: a rule was renamed since).
fn verifies(path: &Path) -> bool {
    let opts = ReplayOptions {
        verify: true,
        ..Default::default()
    };
    let report = commands::replay(records(path), &opts, &mut std::io::sink(), &mut |_| {}).unwrap();
    report.divergence.is_none()
}

fn seq_of(row: &serde_json::Value) -> u64 {
    row["seq"].as_u64().unwrap()
}

#[test]
fn a_window_of_every_log_at_every_event_replays_alone_to_the_same_state_and_actions() {
    let mut windows = 0;
    let mut verified = 0;
    for path in logs() {
        let verify = verifies(&path);
        verified += usize::from(verify);
        let (rows, hash) = replay(records(&path));
        let seqs: Vec<u64> = log::read_all(log::open(&path).unwrap())
            .0
            .iter()
            .filter_map(|r| match r {
                Record::Event(e) => Some(e.seq),
                _ => None,
            })
            .collect();
        for &from in &seqs {
            let want: Vec<_> = rows.iter().filter(|r| seq_of(r) >= from).collect();
            for format in [Format::JsonLines, Format::MessagePack] {
                let window = commands::window(records(&path), Start::Seq(from)).unwrap();
                let (got, got_hash) = replay_verifying(through_file(window, format), verify);
                let name = format!("{} from seq {from} in {format:?}", path.display());
                assert_eq!(got_hash, hash, "{name}");
                assert_eq!(got.iter().collect::<Vec<_>>(), want, "{name}");
            }
            windows += 1;
        }
        // A window that starts inside a gap of the sequence starts at the
        // next event; one past the end is an error.
        let last = *seqs.last().unwrap();
        let err = commands::window(records(&path), Start::Seq(last + 1))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains(&format!("the log ends at seq {last}")),
            "{err}"
        );
    }
    assert!(windows > 1500 && verified > 30, "{windows} {verified}");
}

#[test]
fn a_window_by_time_starts_at_the_first_event_at_or_after_it() {
    let path = root().join("replay-tests/incidents/flapping-node-damped.jsonl");
    let (recs, _) = log::read_all(log::open(&path).unwrap());
    let events: Vec<_> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Event(e) => Some(e),
            _ => None,
        })
        .collect();
    let middle = events[events.len() / 2];
    // The first event at that time, and a millisecond after the one before.
    let first = events.iter().find(|e| e.time_ms >= middle.time_ms).unwrap();
    for since in [middle.time_ms, events[events.len() / 2 - 1].time_ms + 1] {
        let by_time = replay(commands::window(records(&path), Start::Time(since)).unwrap());
        let by_seq = replay(commands::window(records(&path), Start::Seq(first.seq)).unwrap());
        assert_eq!(by_time, by_seq);
    }
    // The same through the command line, as an RFC 3339 time.
    let since = humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(middle.time_ms),
    )
    .to_string();
    let p = path.to_str().unwrap();
    let a = lockstep(&["replay", p, "--json", "--since", &since]);
    let b = lockstep(&["replay", p, "--json", "--from", &first.seq.to_string()]);
    assert!(a.status.success(), "{}", text(&a.stderr));
    assert_eq!(text(&a.stdout), text(&b.stdout));
    assert!(!a.stdout.is_empty());
    // A time that is neither is named.
    refused(&["replay", p, "--since", "yesterday-ish"], "neither a time");
}

/// A Slurm node with transitions in the second half of a log.
fn busy_node(path: &Path, from: u64) -> String {
    let (rows, _) = replay(records(path));
    rows.iter()
        .filter(|r| seq_of(r) >= from)
        .flat_map(|r| r["transitions"].as_array().unwrap().clone())
        .map(|t| t["node"].as_str().unwrap().to_owned())
        .next()
        .expect("a transition in the window")
}

#[test]
fn an_exported_bundle_replays_verifies_and_audits_alone() {
    let path = root().join("replay-tests/incidents/slurm-blip-damped.jsonl");
    let p = path.to_str().unwrap();
    let full = lockstep(&["replay", p, "--verify", "--quiet"]);
    assert!(full.status.success(), "{}", text(&full.stderr));
    let hash = |out: &Output| {
        let e = text(&out.stderr);
        e.split("state hash ")
            .nth(1)
            .map(|h| h.split_whitespace().next().unwrap().to_owned())
            .unwrap_or_else(|| panic!("{e}"))
    };
    let from = 100;
    let node = busy_node(&path, from);
    for name in ["bundle.jsonl", "bundle.msgpack"] {
        let out = tmp(name);
        let o = out.to_str().unwrap();
        let export = lockstep(&["export", "--log", p, "--from", &from.to_string(), o]);
        assert!(export.status.success(), "{}", text(&export.stderr));
        assert!(
            text(&export.stderr).contains(&format!("after the state at seq {}", from - 1)),
            "{}",
            text(&export.stderr)
        );
        let bundle = lockstep(&["replay", o, "--verify", "--quiet"]);
        assert!(bundle.status.success(), "{}", text(&bundle.stderr));
        assert_eq!(hash(&bundle), hash(&full), "{name}");
        assert!(text(&bundle.stderr).contains("verified: all"));
        // The timeline of the bundle is the full log's from `from` on.
        let a = lockstep(&["replay", o, "--json"]);
        let b = lockstep(&["replay", p, "--json", "--from", &from.to_string()]);
        assert_eq!(text(&a.stdout), text(&b.stdout), "{name}");
        let audit = lockstep(&["audit", &node, "--log", o]);
        assert!(audit.status.success(), "{}", text(&audit.stderr));
        assert!(
            text(&audit.stdout).contains(" -> "),
            "{}",
            text(&audit.stdout)
        );
        // A bundle of a bundle is the same window.
        let again = tmp(&format!("again-{name}"));
        let a2 = again.to_str().unwrap();
        let export = lockstep(&["export", "--log", o, "--from", &(from + 50).to_string(), a2]);
        assert!(export.status.success(), "{}", text(&export.stderr));
        let c = lockstep(&["replay", a2, "--json"]);
        let d = lockstep(&["replay", p, "--json", "--from", &(from + 50).to_string()]);
        assert_eq!(text(&c.stdout), text(&d.stdout), "{name}");
    }
    // --to ends the window.
    let out = tmp("head.jsonl");
    let o = out.to_str().unwrap();
    let export = lockstep(&["export", "--log", p, "--from", "100", "--to", "150", o]);
    assert!(export.status.success(), "{}", text(&export.stderr));
    let (recs, err) = log::read_all(log::open(&out).unwrap());
    assert!(err.is_none());
    let seqs: Vec<u64> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Event(e) => Some(e.seq),
            _ => None,
        })
        .collect();
    assert_eq!((seqs.first(), seqs.last()), (Some(&100), Some(&150)));
}

#[test]
fn an_altered_or_misplaced_snapshot_is_refused_with_the_reason() {
    let path = root().join("replay-tests/compat/0.1.0-2026-11-30.jsonl");
    let p = path.to_str().unwrap();
    let out = tmp("altered.jsonl");
    let o = out.to_str().unwrap();
    let export = lockstep(&["export", "--log", p, "--from", "200", o]);
    assert!(export.status.success(), "{}", text(&export.stderr));
    let bundle = std::fs::read_to_string(&out).unwrap();
    // One base64 character of the state changed.
    let at = bundle.find(r#""bytes":""#).unwrap() + 40;
    let mut altered = bundle.into_bytes();
    altered[at] = if altered[at] == b'A' { b'B' } else { b'A' };
    std::fs::write(&out, &altered).unwrap();
    refused(
        &["replay", o, "--verify"],
        "the snapshot of seq 199 hashes to",
    );
    // A what-if replay needs the log from its start.
    let export = lockstep(&["export", "--log", p, "--from", "200", o]);
    assert!(export.status.success());
    let policy = tmp("policy.json");
    std::fs::write(&policy, text(&lockstep(&["policy", "default"]).stdout)).unwrap();
    refused(
        &["replay", o, "--policy", policy.to_str().unwrap()],
        "needs the log from its first record",
    );
    // A window past the end of the log.
    refused(
        &["export", "--log", p, "--from", "100000", o],
        "before the window's start at seq 100000",
    );
}
