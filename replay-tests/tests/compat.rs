//! Logs written by earlier lockstep releases replay forever (DESIGN.md
//! invariant 6: "every log that any earlier lockstep wrote still replays to
//! the same state hash").
//!
//! `replay-tests/compat/` holds, for each release, a log it wrote (JSON Lines
//! and the same records in MessagePack) and, next to it, `<name>.state-hash`:
//! the state hash that release's `lockstep replay` gave. Each log covers
//! every event and action kind of its time. For each log this test checks
//! that
//!
//! 1. it still decodes completely, every record, in both encodings, to the
//!    same records;
//! 2. replay is deterministic on it: two replays give the same state hash,
//!    and so does any batch size with a restart from a snapshot between
//!    batches;
//! 3. the hash is the recorded one.
//!
//! These files are never re-blessed and never regenerated: there is no
//! `LOCKSTEP_BLESS` here. A new release adds a new log beside the old ones.
//! If (3) fails, an old log now means something else. That is a bug unless
//! a reducer rule was fixed on purpose; then, and only then, add the new
//! hash to the `.state-hash` file with a line saying which change made it
//! and why, and explain it in the commit message. (1) and (2) must never be
//! relaxed.

use std::path::{Path, PathBuf};

use lockstep::commands::{self, ReplayOptions};
use lockstep_engine::{Engine, Output};
use lockstep_schemas::log::{self, read_all, Format};
use lockstep_schemas::{Policy, Record};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("compat")
}

/// Every compat log: the file stem under `compat/`.
fn logs() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "state-hash"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no compat logs in {}", dir().display());
    names
}

/// The recorded hash: the last line of `<name>.state-hash` that is not a
/// comment.
fn recorded_hash(name: &str) -> String {
    let path = dir().join(format!("{name}.state-hash"));
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap_or_else(|| panic!("{}: no hash", path.display()))
        .to_owned()
}

/// Reads every record of a log file, failing on any damage.
fn decode(path: &Path) -> Vec<Record> {
    let (records, err) = read_all(log::open(path).unwrap());
    if let Some(e) = err {
        panic!(
            "{}: {e}: a log an earlier lockstep wrote no longer decodes completely ({} records read)",
            path.display(),
            records.len()
        );
    }
    records
}

/// `lockstep replay FILE`: the state hash it prints.
fn replay_hash(path: &Path) -> String {
    let opts = ReplayOptions::default();
    let report = commands::replay(
        log::open(path).unwrap(),
        &opts,
        &mut std::io::sink(),
        &mut |_| {},
    )
    .unwrap();
    assert!(
        report.damage.is_none(),
        "{}: {:?}",
        path.display(),
        report.damage
    );
    report.state_hash
}

/// Folds the events in batches of `batch` records, restarting the engine
/// from its snapshot after each batch, as the service does after a crash.
fn batched_hash(records: &[Record], batch: usize) -> String {
    let events: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Event(e) => Some(e),
            _ => None,
        })
        .collect();
    let mut engine = Engine::new(Policy::default());
    let mut out = Output::default();
    for chunk in events.chunks(batch) {
        for ev in chunk {
            out.clear();
            engine.apply(ev, &mut out);
        }
        engine = Engine::restore(&engine.snapshot()).expect("a snapshot restores");
    }
    engine.hash()
}

#[test]
fn every_compat_log_decodes_completely_in_both_encodings() {
    for name in logs() {
        let jsonl = dir().join(format!("{name}.jsonl"));
        let lines = std::fs::read_to_string(&jsonl)
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count();
        let records = decode(&jsonl);
        assert_eq!(
            records.len(),
            lines,
            "{name}.jsonl: every line is one record"
        );
        let packed = dir().join(format!("{name}.msgpack"));
        assert_eq!(log::Format::from_path(&packed), Format::MessagePack);
        assert!(
            decode(&packed) == records,
            "{name}: the MessagePack file decodes to other records than the JSON Lines file"
        );
        assert!(
            records
                .iter()
                .filter(|r| matches!(r, Record::Event(_)))
                .count()
                > 100,
            "{name}: the log has its events"
        );
    }
}

#[test]
fn every_compat_log_replays_deterministically_at_any_batch_size() {
    for name in logs() {
        let path = dir().join(format!("{name}.jsonl"));
        let first = replay_hash(&path);
        assert_eq!(replay_hash(&path), first, "{name}: a second replay");
        let records = decode(&path);
        for batch in [1, 2, 7, 64, usize::MAX] {
            assert_eq!(
                batched_hash(&records, batch),
                first,
                "{name}: batches of {batch} with a restart after each"
            );
        }
    }
}

#[test]
fn every_compat_log_replays_to_its_recorded_state_hash() {
    for name in logs() {
        let recorded = recorded_hash(&name);
        for ext in ["jsonl", "msgpack"] {
            let got = replay_hash(&dir().join(format!("{name}.{ext}")));
            assert!(
                got == recorded,
                "compat/{name}.{ext} now replays to state hash {got}, not {recorded}, the hash \
                 recorded when it was written. An old log means something else now.\n\
                 Never re-bless this. If a reducer rule was changed on purpose, add the new \
                 hash to compat/{name}.state-hash with a line saying which change made it and \
                 why, and explain it in the commit message; otherwise fix the regression."
            );
        }
    }
}
