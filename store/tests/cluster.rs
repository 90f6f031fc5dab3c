//! The event log on a real three-server JetStream cluster
//! (`deploy/local/nats/up.sh`), streams with three replicas: a server killed,
//! wiped, or frozen while records are appended; nothing acknowledged is
//! lost, nothing appended twice, and the order stays one.

use std::time::Duration;

use lockstep_schemas::{Envelope, Event, EventRecord, Source};
use lockstep_store::log::{Error, EVENTS_STREAM};
use lockstep_store::{EventLog, StreamLimits};
use lockstep_testkit::NatsCluster;

/// The `i`th envelope: a tick observed at its own time, so each has its own
/// content id.
fn node(i: u64) -> Envelope {
    Envelope::new(Source::Test, 1_000 + i, Event::Tick)
}

fn replicated() -> StreamLimits {
    StreamLimits {
        replicas: 3,
        ..StreamLimits::default()
    }
}

/// Appends, retrying while the cluster elects (each retry is the same
/// envelope: deduplication makes it one record).
async fn append(log: &EventLog, e: &Envelope) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match log.append(e).await {
            Ok(a) => return a.seq,
            Err(err) => {
                assert!(err.is_retryable(), "{err}");
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no append within 60 s: {err}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn read_all(log: &EventLog, until: u64) -> Vec<EventRecord> {
    let mut out: Vec<EventRecord> = Vec::new();
    let mut next = 1;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while next <= until {
        assert!(
            tokio::time::Instant::now() < deadline,
            "read stalled at seq {next}"
        );
        match log.read(next, 256, Duration::from_millis(500)).await {
            Ok(batch) => {
                for r in batch.into_iter().filter(|r| r.seq <= until) {
                    assert_eq!(r.seq, next, "records in one order, none skipped");
                    next = r.seq + 1;
                    out.push(r);
                }
            }
            Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => panic!("{e}"),
        }
    }
    out
}

/// Every envelope once, in the order appended.
fn assert_exactly_once(records: &[EventRecord], n: u64) {
    assert_eq!(records.len() as u64, n, "one record per envelope");
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.envelope, node(i as u64), "record {} in order", r.seq);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockstep_creates_replicated_streams_and_scales_an_existing_one() {
    let cluster = NatsCluster::start();
    // An R1 stream first (an older config), then the configured three.
    let log = cluster
        .client(Error::is_retryable, || async {
            EventLog::connect_nats(&cluster.url(), &StreamLimits::default()).await
        })
        .await;
    append(&log, &node(0)).await;
    let peers = cluster.stream_peers(EVENTS_STREAM).await.unwrap();
    assert!(peers.replicas.is_empty(), "{peers:?}");
    let log = cluster
        .client(Error::is_retryable, || async {
            EventLog::connect_nats(&cluster.url(), &replicated()).await
        })
        .await;
    append(&log, &node(1)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let peers = cluster.stream_peers(EVENTS_STREAM).await.unwrap();
        if peers.replicas.len() == 2 && peers.replicas.iter().all(|r| r.1) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not three current replicas: {peers:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_exactly_once(&read_all(&log, 2).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_leader_killed_mid_append_loses_and_repeats_nothing() {
    let cluster = NatsCluster::start();
    let log = cluster
        .client(Error::is_retryable, || async {
            EventLog::connect_nats(&cluster.url(), &replicated()).await
        })
        .await;
    const N: u64 = 600;
    let writer = {
        let log = log.clone();
        tokio::spawn(async move {
            for i in 0..N {
                append(&log, &node(i)).await;
            }
        })
    };
    // Kill the leader while the writer is at it.
    while log.head().await.unwrap_or(0) < 150 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let leader = cluster
        .stream_leader(EVENTS_STREAM, Duration::from_secs(10))
        .await;
    cluster.kill(leader);
    let new_leader = cluster
        .stream_leader(EVENTS_STREAM, Duration::from_secs(60))
        .await;
    assert_ne!(new_leader, leader);
    tokio::time::timeout(Duration::from_secs(120), writer)
        .await
        .expect("the writer finishes after the election")
        .unwrap();
    assert_eq!(log.head().await.unwrap(), N);
    assert_exactly_once(&read_all(&log, N).await, N);
    // The killed server comes back and catches up.
    cluster.up(&[leader]);
    wait_caught_up(&cluster, leader, N).await;
}

async fn wait_caught_up(cluster: &NatsCluster, i: usize, head: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let local = cluster.local_stream_state(i, EVENTS_STREAM);
        let peers = cluster.stream_peers(EVENTS_STREAM).await;
        let current = peers.as_ref().is_some_and(|p| {
            p.leader.as_deref() == Some(&format!("n{i}"))
                || p.replicas
                    .iter()
                    .any(|(name, current, lag)| *name == format!("n{i}") && *current && *lag == 0)
        });
        if current && local == Some((head, head)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "n{i} did not catch up to {head} within 60 s: holds {local:?}, group {peers:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_with_its_store_wiped_rejoins_and_catches_up() {
    let cluster = NatsCluster::start();
    let log = cluster
        .client(Error::is_retryable, || async {
            EventLog::connect_nats(&cluster.url(), &replicated()).await
        })
        .await;
    for i in 0..300 {
        append(&log, &node(i)).await;
    }
    // A follower loses its disk; records keep coming while it is away.
    let leader = cluster
        .stream_leader(EVENTS_STREAM, Duration::from_secs(10))
        .await;
    let wiped = if leader == 1 { 2 } else { 1 };
    cluster.kill_and_wipe(wiped);
    for i in 300..400 {
        append(&log, &node(i)).await;
    }
    cluster.up(&[wiped]);
    for i in 400..500 {
        append(&log, &node(i)).await;
    }
    wait_caught_up(&cluster, wiped, 500).await;
    // It now carries the log: with the third server gone, it and the old
    // leader still hold every record; with the old leader gone too... no
    // quorum. So take away the one that was never wiped and not leading.
    let other = 6 - leader - wiped;
    cluster.kill(other);
    for i in 500..520 {
        append(&log, &node(i)).await;
    }
    assert_exactly_once(&read_all(&log, 520).await, 520);
    wait_caught_up(&cluster, wiped, 520).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_cut_off_longer_than_the_election_timeout_rejoins() {
    let cluster = NatsCluster::start();
    let log = cluster
        .client(Error::is_retryable, || async {
            EventLog::connect_nats(&cluster.url(), &replicated()).await
        })
        .await;
    for i in 0..200 {
        append(&log, &node(i)).await;
    }
    // Cut off the leader itself: the others must elect, and the frozen one
    // must step down when it runs again (no second leader, no fork).
    let leader = cluster
        .stream_leader(EVENTS_STREAM, Duration::from_secs(10))
        .await;
    cluster.freeze(leader);
    let writer = {
        let log = log.clone();
        tokio::spawn(async move {
            for i in 200..400 {
                append(&log, &node(i)).await;
            }
        })
    };
    // JetStream's raft elects after 4 to 9 s without a heartbeat; stay
    // frozen well past that.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let during = cluster
        .stream_leader(EVENTS_STREAM, Duration::from_secs(30))
        .await;
    assert_ne!(during, leader, "a new leader while n{leader} is cut off");
    cluster.thaw(leader);
    tokio::time::timeout(Duration::from_secs(120), writer)
        .await
        .expect("the writer finishes")
        .unwrap();
    assert_eq!(log.head().await.unwrap(), 400);
    assert_exactly_once(&read_all(&log, 400).await, 400);
    wait_caught_up(&cluster, leader, 400).await;
}
