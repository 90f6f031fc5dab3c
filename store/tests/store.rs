//! The store: checkpoints verified (streamed through a file, replaced
//! atomically, read from the database of an older store), ledger and audit index idempotent,
//! formats refused when newer.

use lockstep_schemas::{Action, ActionId, EventId, IssuedAction, OutcomeResult};
use lockstep_schemas::{Phase, Rule, Transition};
use lockstep_store::{store::Error, Checkpoint, Commit, LogPosition, Store};
use lockstep_testkit::temp_dir;

/// How long a test waits for a store's lock: sled finishes a dropped
/// store's last writes on its own threads, which hold the directory's lock
/// a moment longer (as `lockstep run` waits for a predecessor's).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The store in `dir`, opened once a store dropped a moment ago lets go.
fn reopen(dir: &std::path::Path) -> Store {
    Store::open_waiting(dir, LOCK_WAIT).unwrap()
}

/// sled's database in `dir` itself, waiting the same way.
fn sled_open(dir: &std::path::Path) -> sled::Db {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match sled::open(dir) {
            Ok(db) => return db,
            Err(sled::Error::Io(e))
                if e.to_string().starts_with("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            Err(e) => panic!("open {}: {e}", dir.display()),
        }
    }
}

fn issued(seq: u64, node: &str) -> IssuedAction {
    let action = Action::SlurmDrain {
        node: node.into(),
        reason: "lockstep: test".into(),
    };
    IssuedAction {
        id: ActionId::derive(seq, action.kind(), &action.target()),
        seq,
        time_ms: seq,
        cause: EventId("e".into()),
        rule: "drain.cordon".into(),
        attempt: 1,
        action,
    }
}

fn transition(seq: u64, node: &str) -> Transition {
    Transition {
        seq,
        time_ms: seq,
        node: node.into(),
        from: Phase::InService,
        to: Phase::Draining,
        rule: Rule::Cordoned,
        cause: EventId("e".into()),
        detail: "kubernetes node k1 cordoned".into(),
    }
}

#[test]
fn a_commit_is_all_or_nothing_and_re_applying_changes_nothing() {
    let dir = temp_dir("store-commit");
    let store = reopen(&dir);
    assert_eq!(store.checkpoint().unwrap(), None);
    assert_eq!(store.log_position().unwrap(), None);
    let position = LogPosition {
        log_id: "LOCKSTEP@1".into(),
        seq: 10,
        envelope_id: "e10".into(),
    };
    let commit = Commit {
        issued: &[issued(9, "n1"), issued(10, "n2")],
        outcomes: vec![],
        transitions: &[
            transition(9, "n1"),
            transition(10, "n2"),
            transition(10, "n1"),
        ],
        position: Some(&position),
    };
    store.commit(&commit).unwrap();
    assert_eq!(store.log_position().unwrap().as_ref(), Some(&position));
    store
        .mark_dispatched(&[commit.issued[0].id.clone()])
        .unwrap();
    // The same batch again (a restart re-applies it): nothing duplicated,
    // nothing the ledger knew forgotten.
    store.commit(&commit).unwrap();
    assert_eq!(
        store.undispatched(None, 100).unwrap(),
        [commit.issued[1].clone()]
    );
    assert_eq!(
        store
            .ledger_entry(&commit.issued[0].id)
            .unwrap()
            .unwrap()
            .dispatched,
        1
    );
    assert_eq!(store.transitions("n1").unwrap().len(), 2);
    store
        .commit(&Commit {
            outcomes: vec![(commit.issued[0].id.clone(), OutcomeResult::Succeeded)],
            ..Commit::default()
        })
        .unwrap();
    assert_eq!(
        store
            .ledger_entry(&commit.issued[0].id)
            .unwrap()
            .unwrap()
            .outcome,
        Some(OutcomeResult::Succeeded)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Writes `snapshot` as the checkpoint after `seq`.
fn write(store: &Store, seq: u64, snapshot: &[u8]) -> u64 {
    store
        .write_checkpoint(seq, |w| w.write_all(snapshot))
        .unwrap()
}

/// The body as the streaming reader sees it, and its sequence.
fn read(store: &Store) -> Option<(u64, Vec<u8>)> {
    store
        .read_checkpoint(|r| {
            let mut body = Vec::new();
            r.read_to_end(&mut body).map(|_| body)
        })
        .unwrap()
        .map(|(seq, body)| (seq, body.unwrap()))
}

#[test]
fn a_checkpoint_goes_through_its_file_and_replaces_the_last() {
    let dir = temp_dir("store-checkpoint");
    let snapshot: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    {
        let store = reopen(&dir);
        assert_eq!(store.checkpoint().unwrap(), None);
        assert_eq!(read(&store), None);
        let bytes = write(&store, 7, b"older state");
        assert_eq!(
            bytes,
            std::fs::metadata(store.checkpoint_path()).unwrap().len()
        );
        let bytes = write(&store, 10, &snapshot);
        assert_eq!(bytes, 20 + snapshot.len() as u64 + 32);
    }
    let store = reopen(&dir);
    assert_eq!(read(&store), Some((10, snapshot.clone())));
    assert_eq!(
        store.checkpoint().unwrap(),
        Some(Checkpoint { seq: 10, snapshot })
    );
    // A decoder that stops early: the rest of the body is still verified.
    let (seq, first) = store
        .read_checkpoint(|r| {
            let mut first = [0u8; 4];
            r.read_exact(&mut first).map(|()| first)
        })
        .unwrap()
        .unwrap();
    assert_eq!((seq, first.unwrap()), (10, [0, 1, 2, 3]));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_damaged_checkpoint_is_detected() {
    let dir = temp_dir("store-corrupt");
    {
        let store = reopen(&dir);
        write(&store, 42, &[7; 1000]);
        store.damage_checkpoint().unwrap();
    }
    let store = reopen(&dir);
    let err = store.checkpoint().unwrap_err();
    assert!(matches!(err, Error::CorruptCheckpoint { seq: 42 }), "{err}");
    // Whatever the decoder made of it.
    let err = store
        .read_checkpoint(|_| Ok::<_, std::io::Error>(()))
        .unwrap_err();
    assert!(matches!(err, Error::CorruptCheckpoint { seq: 42 }), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_truncated_checkpoint_is_detected() {
    let dir = temp_dir("store-truncated");
    let store = reopen(&dir);
    write(&store, 42, &[7; 1000]);
    let path = store.checkpoint_path();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    for len in [500, 40, 10, 0] {
        file.set_len(len).unwrap();
        let err = store.checkpoint().unwrap_err();
        let seq = if len >= 52 { 42 } else { 0 };
        assert!(
            matches!(err, Error::CorruptCheckpoint { seq: s } if s == seq),
            "{len}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_checkpoint_whose_writing_fails_leaves_the_last_one_and_no_temporary_file() {
    let dir = temp_dir("store-checkpoint-fails");
    let store = reopen(&dir);
    write(&store, 5, b"state at 5");
    let err = store
        .write_checkpoint(9, |w| {
            w.write_all(&[1; 100_000])?;
            Err(std::io::Error::other("the engine did not encode"))
        })
        .unwrap_err();
    assert!(matches!(err, Error::CheckpointIo { .. }), "{err}");
    assert_eq!(read(&store), Some((5, b"state at 5".to_vec())));
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("engine."))
        .collect();
    names.sort();
    assert_eq!(names, ["engine.checkpoint"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_checkpoint_in_the_database_is_read_until_a_file_replaces_it() {
    let dir = temp_dir("store-legacy-checkpoint");
    {
        let store = reopen(&dir);
        store.write_legacy_checkpoint(3, b"old layout").unwrap();
    }
    let store = reopen(&dir);
    assert_eq!(read(&store), Some((3, b"old layout".to_vec())));
    store.damage_checkpoint().unwrap();
    let err = store.checkpoint().unwrap_err();
    assert!(matches!(err, Error::CorruptCheckpoint { seq: 3 }), "{err}");
    store.write_legacy_checkpoint(3, b"old layout").unwrap();
    write(&store, 8, b"new layout");
    assert_eq!(read(&store), Some((8, b"new layout".to_vec())));
    // Gone from the database: without the file, there is no checkpoint.
    drop(store);
    std::fs::remove_file(dir.join("engine.checkpoint")).unwrap();
    let store = reopen(&dir);
    assert_eq!(store.checkpoint().unwrap(), None);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn undispatched_actions_come_in_pages_in_issue_order_and_leave_when_dispatched_done_or_forgotten() {
    let dir = temp_dir("store-undispatched");
    let store = reopen(&dir);
    // Issued out of order across batches; offered in (seq, id) order.
    let all: Vec<IssuedAction> = (0..10u64)
        .map(|i| issued(100 - i, &format!("n{i}")))
        .collect();
    store
        .commit(&Commit {
            issued: &all[5..],
            ..Commit::default()
        })
        .unwrap();
    store
        .commit(&Commit {
            issued: &all[..5],
            ..Commit::default()
        })
        .unwrap();
    let mut expected = all.clone();
    expected.sort_by(|a, b| (a.seq, &a.id).cmp(&(b.seq, &b.id)));
    let pages = |store: &Store| {
        let mut got = Vec::new();
        let mut page = store.undispatched(None, 3).unwrap();
        while !page.is_empty() {
            assert!(page.len() <= 3);
            got.extend(page);
            page = store.undispatched(got.last(), 3).unwrap();
        }
        got
    };
    assert_eq!(pages(&store), expected);
    // Dispatched, finished (an outcome from another instance's dispatch),
    // forgotten: none of them is offered again.
    store.mark_dispatched(&[expected[0].id.clone()]).unwrap();
    store
        .commit(&Commit {
            outcomes: vec![(expected[4].id.clone(), OutcomeResult::Succeeded)],
            ..Commit::default()
        })
        .unwrap();
    store
        .forget_undispatched(std::slice::from_ref(&expected[9]))
        .unwrap();
    let left: Vec<_> = [1, 2, 3, 5, 6, 7, 8]
        .iter()
        .map(|&i| expected[i].clone())
        .collect();
    assert_eq!(pages(&store), left);
    // Forgetting keeps the ledger entry as it was.
    assert_eq!(
        store
            .ledger_entry(&expected[9].id)
            .unwrap()
            .unwrap()
            .dispatched,
        0
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_format_1_store_is_upgraded_with_its_undispatched_actions_indexed() {
    let dir = temp_dir("store-upgrade");
    let (a, b, c) = (issued(1, "n1"), issued(2, "n2"), issued(3, "n3"));
    {
        let store = reopen(&dir);
        store
            .commit(&Commit {
                issued: &[a.clone(), b.clone(), c.clone()],
                ..Commit::default()
            })
            .unwrap();
        store.mark_dispatched(std::slice::from_ref(&b.id)).unwrap();
    }
    {
        // What a format 1 lockstep left: no index, format 1.
        let db = sled_open(&dir);
        db.drop_tree("undispatched").unwrap();
        db.open_tree("meta")
            .unwrap()
            .insert("format", &1u32.to_be_bytes())
            .unwrap();
        db.flush().unwrap();
    }
    let store = reopen(&dir);
    assert_eq!(store.undispatched(None, 10).unwrap(), [a, c]);
    drop(store);
    let db = sled_open(&dir);
    assert_eq!(
        db.open_tree("meta")
            .unwrap()
            .get("format")
            .unwrap()
            .unwrap(),
        &lockstep_store::store::FORMAT_VERSION.to_be_bytes()[..]
    );
    drop(db);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_store_from_a_newer_lockstep_is_refused() {
    let dir = temp_dir("store-newer");
    {
        let db = sled_open(&dir);
        db.open_tree("meta")
            .unwrap()
            .insert("format", &99u32.to_be_bytes())
            .unwrap();
        db.flush().unwrap();
    }
    let err = Store::open_waiting(&dir, LOCK_WAIT).err().unwrap();
    assert!(err.to_string().contains("has format 99"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_store_locked_by_a_process_on_its_way_out_is_waited_for_and_a_live_lock_is_an_error() {
    let dir = temp_dir("store-lock");
    let held = reopen(&dir);
    // Held for good: the wait runs out, and the error is the lock's.
    let started = std::time::Instant::now();
    assert!(matches!(
        Store::open_waiting(&dir, std::time::Duration::from_millis(200)),
        Err(e) if e.is_lock_held()
    ));
    assert!(started.elapsed() >= std::time::Duration::from_millis(200));
    // Released meanwhile (a killed predecessor's files closing): opened.
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(150));
        drop(held);
    });
    Store::open_waiting(&dir, std::time::Duration::from_secs(5)).unwrap();
    release.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_retention_horizon_drops_older_ledger_entries_and_transitions_only() {
    let dir = temp_dir("store-trim");
    let store = reopen(&dir);
    assert_eq!(store.retained_from().unwrap(), None);
    // Times are the sequences (see `issued` and `transition`).
    let actions: Vec<IssuedAction> = (1..=20)
        .map(|s| issued(s, &format!("n{}", s % 3)))
        .collect();
    let transitions: Vec<Transition> = (1..=20)
        .map(|s| transition(s, &format!("n{}", s % 3)))
        .collect();
    store
        .commit(&Commit {
            issued: &actions,
            outcomes: vec![(actions[0].id.clone(), OutcomeResult::Succeeded)],
            transitions: &transitions,
            position: None,
        })
        .unwrap();
    // Dispatched or not, done or not: what was issued before 11 goes.
    store.mark_dispatched(&[actions[1].id.clone()]).unwrap();
    let trimmed = store.trim(11).unwrap();
    assert_eq!((trimmed.ledger, trimmed.transitions), (10, 10));
    let mut kept: Vec<u64> = store
        .ledger()
        .unwrap()
        .iter()
        .map(|e| e.issued.seq)
        .collect();
    kept.sort_unstable();
    assert_eq!(kept, (11..=20).collect::<Vec<_>>());
    let pending: Vec<u64> = store
        .undispatched(None, 100)
        .unwrap()
        .iter()
        .map(|a| a.seq)
        .collect();
    assert_eq!(pending, (11..=20).collect::<Vec<_>>());
    for node in ["n0", "n1", "n2"] {
        let seqs: Vec<u64> = store
            .transitions(node)
            .unwrap()
            .iter()
            .map(|t| t.seq)
            .collect();
        assert!(
            seqs.iter().all(|&s| s >= 11) && !seqs.is_empty(),
            "{node}: {seqs:?}"
        );
    }
    assert_eq!(store.retained_from().unwrap(), Some(11));
    // Again: nothing more; an older horizon does not move it back. And it
    // is kept across a reopen.
    assert_eq!(store.trim(11).unwrap(), Default::default());
    store.trim(5).unwrap();
    drop(store);
    let store = reopen(&dir);
    assert_eq!(store.retained_from().unwrap(), Some(11));
    assert_eq!(store.ledger().unwrap().len(), 10);
}
