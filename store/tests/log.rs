//! The event log against a real nats-server, and the embedded log.

use std::time::Duration;

use lockstep_schemas::{Envelope, Event, KubeNode, Source};
use lockstep_store::{EventLog, StreamLimits};
use lockstep_testkit::{temp_dir, NatsServer};

fn node(i: u64) -> Envelope {
    Envelope::new(
        Source::Test,
        1_000 + i,
        Event::KubeNode(KubeNode {
            read_labels: None,
            maintenance: None,
            name: lockstep_schemas::format_text!("k{i}"),
            unschedulable: i.is_multiple_of(2),
            ready: lockstep_schemas::ConditionStatus::True,
            conditions: vec![],
            labels: Default::default(),
            taints: vec![],
            identity: Default::default(),
            devices: Default::default(),
            version: 0,
        }),
    )
}

fn envelope(i: u64) -> Envelope {
    node(i)
}

/// A drain issued at `seq`.
fn issued(seq: u64) -> lockstep_schemas::IssuedAction {
    lockstep_schemas::IssuedAction {
        id: lockstep_schemas::ActionId(format!("{seq}.slurm_drain.slurm:n{seq}/state")),
        seq,
        time_ms: 1,
        cause: lockstep_schemas::EventId("e".into()),
        rule: "drain.cordon".into(),
        attempt: 1,
        action: lockstep_schemas::Action::SlurmDrain {
            node: format!("n{seq}"),
            reason: "lockstep: test".into(),
        },
    }
}

async fn read_all(log: &EventLog, from: u64, until: u64) -> Vec<lockstep_schemas::EventRecord> {
    let mut out: Vec<lockstep_schemas::EventRecord> = Vec::new();
    let mut next = from;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while next <= until {
        assert!(
            tokio::time::Instant::now() < deadline,
            "read stalled at seq {next}"
        );
        match log.read(next, 64, Duration::from_millis(500)).await {
            Ok(batch) => {
                for r in batch.into_iter().filter(|r| r.seq <= until) {
                    assert!(
                        r.seq >= next,
                        "seq {} went back (expected >= {next})",
                        r.seq
                    );
                    next = r.seq + 1;
                    out.push(r);
                }
            }
            // The server may be restarting: try again.
            Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => panic!("{e}"),
        }
    }
    out
}

async fn round_trip_and_dedup(log: EventLog) {
    let mut seqs = Vec::new();
    for i in 0..20 {
        let a = log.append(&node(i)).await.unwrap();
        assert!(!a.duplicate);
        seqs.push(a.seq);
    }
    assert!(seqs.windows(2).all(|w| w[1] > w[0]));
    // Re-publishing the same envelope (a restart between publish and ack) adds nothing.
    let again = log.append(&node(7)).await.unwrap();
    assert!(again.duplicate);
    assert_eq!(again.seq, seqs[7]);
    assert_eq!(log.head().await.unwrap(), seqs[19]);
    let got = read_all(&log, 1, seqs[19]).await;
    assert_eq!(got.len(), 20);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.envelope, node(i as u64));
        assert!(r.envelope.id_matches());
    }
    assert!(got.windows(2).all(|w| w[1].time_ms >= w[0].time_ms));
    // Reading from the middle starts there.
    let tail = read_all(&log, seqs[15], seqs[19]).await;
    assert_eq!(tail.len(), 5);
    assert_eq!(tail[0].seq, seqs[15]);
    // Nothing more: an empty batch after the wait.
    assert!(log
        .read(seqs[19] + 1, 10, Duration::from_millis(200))
        .await
        .unwrap()
        .is_empty());

    // Appended together: in order, one record each; again (an error
    // after some landed), only the new ones are added, after the rest.
    let together: Vec<_> = (20..60).map(node).collect();
    let first = log.append_all(&together[..30]).await.unwrap();
    assert_eq!(first.len(), 30);
    assert!(first.iter().all(|a| !a.duplicate));
    assert!(first.windows(2).all(|w| w[1].seq > w[0].seq));
    assert!(first[0].seq > seqs[19]);
    let again = log.append_all(&together).await.unwrap();
    assert!(again[..30].iter().all(|a| a.duplicate));
    assert_eq!(
        again[..30].iter().map(|a| a.seq).collect::<Vec<_>>(),
        first.iter().map(|a| a.seq).collect::<Vec<_>>()
    );
    assert!(again[30..].iter().all(|a| !a.duplicate));
    assert!(again[29..].windows(2).all(|w| w[1].seq > w[0].seq));
    let head = again[39].seq;
    let got = read_all(&log, 1, head).await;
    assert_eq!(got.len(), 60);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.envelope, node(i as u64));
    }
    assert!(log.append_all(&[]).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_round_trip_in_order_with_deduplication() {
    let nats = NatsServer::start();
    let log = EventLog::connect_nats(&nats.url(), &StreamLimits::default())
        .await
        .unwrap();
    round_trip_and_dedup(log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_round_trip_in_order_with_deduplication() {
    let dir = temp_dir("embedded-log");
    round_trip_and_dedup(EventLog::open_embedded(&dir).unwrap()).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_log_survives_reopen_and_wakes_readers() {
    let dir = temp_dir("embedded-reopen");
    {
        let log = EventLog::open_embedded(&dir).unwrap();
        for i in 0..5 {
            log.append(&node(i)).await.unwrap();
        }
        log.flush().await.unwrap();
    }
    // The log's database lets go of its files a little after the handle
    // is dropped: reopened as a restarted lockstep would, waiting for them.
    let log = EventLog::open_embedded_waiting(&dir, Duration::from_secs(5)).unwrap();
    assert_eq!(log.head().await.unwrap(), 5);
    assert!(
        log.append(&node(3)).await.unwrap().duplicate,
        "dedup survives reopen"
    );
    let reader = {
        let log = log.clone();
        tokio::spawn(async move { log.read(6, 10, Duration::from_secs(10)).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    log.append(&node(9)).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].seq, 6);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_restart_in_the_middle_loses_and_repeats_nothing() {
    let mut nats = NatsServer::start();
    let log = EventLog::connect_nats(&nats.url(), &StreamLimits::default())
        .await
        .unwrap();
    for i in 0..50 {
        log.append(&node(i)).await.unwrap();
    }
    let first = read_all(&log, 1, 25).await;
    assert_eq!(first.last().unwrap().seq, 25);
    nats.restart();
    // Appends resume once the client has reconnected.
    let mut i = 50;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while i < 100 {
        match log.append(&node(i)).await {
            Ok(_) => i += 1,
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                assert!(
                    std::time::Instant::now() < deadline,
                    "no reconnect within 30 s: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let rest = read_all(&log, 26, 100).await;
    let seqs: Vec<u64> = first.iter().chain(&rest).map(|r| r.seq).collect();
    assert_eq!(
        seqs,
        (1..=100).collect::<Vec<_>>(),
        "every record exactly once, in order"
    );
    for r in first.iter().chain(&rest) {
        assert_eq!(r.envelope, node(r.seq - 1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_are_published_once_per_id() {
    let nats = NatsServer::start();
    let dir = temp_dir("embedded-actions");
    for log in [
        EventLog::connect_nats(&nats.url(), &StreamLimits::default())
            .await
            .unwrap(),
        EventLog::open_embedded(&dir).unwrap(),
    ] {
        let a = lockstep_schemas::IssuedAction {
            id: lockstep_schemas::ActionId("5.slurm_drain.slurm:n1/state".into()),
            seq: 5,
            time_ms: 1,
            cause: lockstep_schemas::EventId("e".into()),
            rule: "drain.cordon".into(),
            attempt: 1,
            action: lockstep_schemas::Action::SlurmDrain {
                node: "n1".into(),
                reason: "lockstep: test".into(),
            },
        };
        let mut b = a.clone();
        b.id = lockstep_schemas::ActionId("6.slurm_drain.slurm:n2/state".into());
        assert_eq!(
            log.publish_actions(&[a.clone(), b.clone()]).await.unwrap(),
            [true, true]
        );
        // The second publisher learns that it is not the one to act.
        assert_eq!(
            log.publish_actions(std::slice::from_ref(&a)).await.unwrap(),
            [false]
        );
        assert_eq!(log.actions().await.unwrap(), [a, b]);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_kept_newest_first_pruned_and_read_back_whole() {
    let nats = NatsServer::start();
    let log = EventLog::connect_nats(&nats.url(), &StreamLimits::default())
        .await
        .unwrap();
    let dir = temp_dir("log-snapshots");
    keeps_snapshots(&log, &dir.join("nats")).await;
    let embedded = EventLog::open_embedded(&dir.join("embedded")).unwrap();
    keeps_snapshots(&embedded, &dir.join("embedded-files")).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Five snapshots kept out of order: the newest three stay, with their
/// metadata, and one reads back byte for byte.
async fn keeps_snapshots(log: &EventLog, dir: &std::path::Path) {
    use lockstep_store::snapshots::SnapshotInfo;
    // None before the first: no bucket yet, and no error.
    assert_eq!(log.snapshots().await.unwrap(), vec![]);
    std::fs::create_dir_all(dir).unwrap();
    for seq in [10, 50, 20, 40, 30] {
        // Larger than one chunk (128 KiB), so that the upload and the
        // download each take several.
        let body: Vec<u8> = (0..300_000u32).map(|i| (i as u64 * seq) as u8).collect();
        let file = dir.join(format!("cp-{seq}"));
        std::fs::write(&file, &body).unwrap();
        let meta = SnapshotInfo::new(seq, format!("hash-{seq}"), 2, "test");
        log.put_snapshot(&file, &meta, 3).await.unwrap();
    }
    let kept = log.snapshots().await.unwrap();
    let seqs: Vec<u64> = kept.iter().map(|s| s.seq).collect();
    assert_eq!(seqs, vec![30, 40, 50], "the newest three, oldest first");
    let newest = kept.last().unwrap();
    assert_eq!(
        (
            newest.state_hash.as_str(),
            newest.layout,
            newest.version.as_str(),
            newest.bytes
        ),
        ("hash-50", 2, "test", 300_000)
    );
    let to = dir.join("fetched");
    assert_eq!(
        log.fetch_snapshot(&newest.name, &to).await.unwrap(),
        300_000
    );
    assert_eq!(
        std::fs::read(&to).unwrap(),
        std::fs::read(dir.join("cp-50")).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_log_discards_old_records_but_none_its_oldest_snapshot_needs() {
    use lockstep_store::snapshots::SnapshotInfo;
    let dir = temp_dir("log-discard");
    let log = EventLog::open_embedded(&dir.join("log")).unwrap();
    let mut times = Vec::new();
    for i in 0..30u64 {
        let a = log.append(&envelope(i)).await.unwrap();
        times.push(log.read(a.seq, 1, Duration::ZERO).await.unwrap()[0].time_ms);
        let action = issued(a.seq);
        log.publish_actions(std::slice::from_ref(&action))
            .await
            .unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let all_past = times[29] + 1;
    // Without a snapshot, nothing goes.
    assert_eq!(log.discard_before(all_past).unwrap(), 0);
    // With one at seq 20, the records up to it go: the log still starts
    // right after a snapshot.
    let cp = dir.join("cp");
    std::fs::write(&cp, b"state").unwrap();
    log.put_snapshot(&cp, &SnapshotInfo::new(20, "h".into(), 2, "test"), 3)
        .await
        .unwrap();
    assert_eq!(
        log.discard_before(times[9]).unwrap(),
        9,
        "before the 10th record's time"
    );
    assert_eq!(log.state().await.unwrap().first_seq, 10);
    assert_eq!(log.discard_before(all_past).unwrap(), 11);
    let state = log.state().await.unwrap();
    assert_eq!((state.first_seq, state.last_seq), (21, 30));
    assert_eq!(log.read(1, 100, Duration::ZERO).await.unwrap()[0].seq, 21);
    // The actions of the records gone went with them.
    let actions: Vec<u64> = log.actions().await.unwrap().iter().map(|a| a.seq).collect();
    assert_eq!(actions, (21..=30).collect::<Vec<_>>());
    // Even past every record, the last stays, and sequences go on, also
    // after the log is opened again. (The oldest snapshot kept counts:
    // one kept, at seq 30.)
    log.put_snapshot(&cp, &SnapshotInfo::new(30, "h".into(), 2, "test"), 1)
        .await
        .unwrap();
    assert_eq!(log.discard_before(u64::MAX).unwrap(), 9);
    assert_eq!(log.state().await.unwrap().first_seq, 30);
    drop(log);
    let log = EventLog::open_embedded(&dir.join("log")).unwrap();
    assert_eq!(log.append(&envelope(99)).await.unwrap().seq, 31);
    let state = log.state().await.unwrap();
    assert_eq!((state.first_seq, state.last_seq), (30, 31));
    let _ = std::fs::remove_dir_all(dir);
}
