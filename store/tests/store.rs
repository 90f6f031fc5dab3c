//! The store: checkpoints verified, ledger and audit index idempotent,
//! formats refused when newer.

use lockstep_schemas::{Action, ActionId, EventId, IssuedAction, OutcomeResult};
use lockstep_schemas::{Phase, Rule, Transition};
use lockstep_store::{store::Error, Checkpoint, Commit, Store};
use lockstep_testkit::temp_dir;

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
    let store = Store::open(&dir).unwrap();
    assert_eq!(store.checkpoint().unwrap(), None);
    let commit = Commit {
        checkpoint: Some(Checkpoint {
            seq: 10,
            snapshot: b"engine state".to_vec(),
        }),
        issued: vec![issued(9, "n1"), issued(10, "n2")],
        outcomes: vec![],
        transitions: vec![
            transition(9, "n1"),
            transition(10, "n2"),
            transition(10, "n1"),
        ],
    };
    store.commit(&commit).unwrap();
    store
        .mark_dispatched(&[commit.issued[0].id.clone()])
        .unwrap();
    // The same batch again (a restart re-applies it): nothing duplicated,
    // nothing the ledger knew forgotten.
    store.commit(&commit).unwrap();
    assert_eq!(store.checkpoint().unwrap().unwrap().seq, 10);
    assert_eq!(store.undispatched().unwrap(), [commit.issued[1].clone()]);
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

#[test]
fn a_damaged_checkpoint_is_detected() {
    let dir = temp_dir("store-corrupt");
    {
        let store = Store::open(&dir).unwrap();
        store
            .commit(&Commit {
                checkpoint: Some(Checkpoint {
                    seq: 42,
                    snapshot: vec![7; 1000],
                }),
                ..Commit::default()
            })
            .unwrap();
        store.damage_checkpoint().unwrap();
    }
    let store = Store::open(&dir).unwrap();
    let err = store.checkpoint().unwrap_err();
    assert!(matches!(err, Error::CorruptCheckpoint { seq: 42 }), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_store_from_a_newer_lockstep_is_refused() {
    let dir = temp_dir("store-newer");
    {
        let db = sled::open(&dir).unwrap();
        db.open_tree("meta")
            .unwrap()
            .insert("format", &99u32.to_be_bytes())
            .unwrap();
        db.flush().unwrap();
    }
    let err = Store::open(&dir).err().unwrap();
    assert!(err.to_string().contains("has format 99"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_store_locked_by_a_process_on_its_way_out_is_waited_for_and_a_live_lock_is_an_error() {
    let dir = temp_dir("store-lock");
    let held = Store::open(&dir).unwrap();
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
