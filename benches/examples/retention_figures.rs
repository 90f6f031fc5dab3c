//! Months of operation compressed into minutes: disk use of the embedded
//! log and the store under the retention horizon.
//!
//! `cargo run --release -p lockstep-benches --example retention_figures --
//! [DAYS] [EVENTS_PER_HOUR] [NODES] [HORIZON_DAYS]` (default 90 days, 3,600
//! events an hour, 1,000 Slurm nodes, a 30-day horizon) appends the
//! generator's steady-state mix to an embedded log with log times spread
//! over the days, folds it through the reducer, commits the ledger and the
//! audit index as the service does, and every hour of log time writes a
//! checkpoint, keeps it as a snapshot beside the log (three kept) and
//! applies the horizon: `Store::trim` and `EventLog::discard_before`, the
//! calls the service makes. Every five days it prints the records the log
//! holds and the bytes on disk of the log, its snapshots and the store.

use std::path::Path;
use std::time::{Duration, Instant};

use lockstep_engine::{Engine, Output};
use lockstep_schemas::{Event, Policy};
use lockstep_store::snapshots::SnapshotInfo;
use lockstep_store::{Commit, EventLog, Store};
use lockstep_testkit::gen::{Generator, Shape};

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR_MS;

/// Months of operation compressed into minutes: disk use of the embedded
/// log and the store under the retention horizon (see the module docs).
#[derive(clap::Parser)]
#[command(name = "retention_figures")]
struct Args {
    /// Days of log time.
    #[arg(default_value_t = 90)]
    days: u64,
    /// Events an hour of log time.
    #[arg(default_value_t = 3_600)]
    events_per_hour: usize,
    /// Slurm nodes.
    #[arg(default_value_t = 1_000)]
    nodes: usize,
    /// The retention horizon, in days.
    #[arg(default_value_t = 30)]
    horizon_days: u64,
}

/// Bytes of the files under `dir`.
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => bytes_under(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / f64::from(1 << 20))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Args {
        days,
        events_per_hour: per_hour,
        nodes,
        horizon_days,
    } = clap::Parser::parse();
    let horizon_ms = horizon_days * DAY_MS;
    let dir = lockstep_testkit::temp_dir("retention-figures");
    let log = EventLog::open_embedded(&dir.join("log")).expect("embedded log");
    let store = Store::open(&dir.join("store")).expect("store");
    let mut g = Generator::new(Shape::plain(nodes, 4), 29);
    let mut engine = Engine::new(Policy::default());
    let mut out = Output::default();
    let start_ms = 1_772_334_000_000u64;
    let started = Instant::now();
    let (mut next, mut events) = (1u64, 0u64);
    println!(
        "{days} days of log time, {per_hour} events an hour, {nodes} Slurm nodes, horizon {} days",
        horizon_ms / DAY_MS
    );
    println!(
        "day  records held (first..last)   log MiB  snapshots MiB  store MiB  ledger  elapsed s"
    );
    for hour in 0..days * 24 {
        if hour > 0 {
            g.steady_state(per_hour);
        }
        let records = g.take_records();
        let t0 = start_ms + hour * HOUR_MS;
        let n = records.len() as u64;
        for (i, r) in records.iter().enumerate() {
            log.append_at(&r.envelope, t0 + i as u64 * HOUR_MS / n.max(1))
                .expect("append");
        }
        loop {
            let batch = log.read(next, 1024, Duration::ZERO).await.expect("read");
            if batch.is_empty() {
                break;
            }
            out.clear();
            let mut outcomes = Vec::new();
            for rec in &batch {
                engine.apply(rec, &mut out);
                if let Event::ActionOutcome(o) = &rec.envelope.event {
                    outcomes.push((o.action_id.clone(), o.result.clone()));
                }
                next = rec.seq + 1;
                events += 1;
            }
            store
                .commit(&Commit {
                    issued: &out.actions,
                    outcomes,
                    transitions: &out.transitions,
                    position: None,
                })
                .expect("commit");
        }
        store.flush().await.expect("flush");
        // Hourly, as the leader: checkpoint, snapshot, horizon.
        let seq = engine.last_seq();
        store
            .write_checkpoint(seq, |w| {
                engine.snapshot_to(w).map_err(std::io::Error::other)
            })
            .expect("checkpoint");
        let meta = SnapshotInfo::new(seq, engine.hash(), lockstep_engine::LAYOUT, "bench");
        log.put_snapshot(&store.checkpoint_path(), &meta, 3)
            .await
            .expect("snapshot");
        let now = engine.now_ms();
        store.trim(now.saturating_sub(horizon_ms)).expect("trim");
        log.discard_before(now.saturating_sub(horizon_ms))
            .expect("discard");
        let day = (hour + 1) / 24;
        if (hour + 1) % 24 == 0 && (day % 5 == 0 || day == 1) {
            let state = log.state().await.expect("state");
            let log_dir = dir.join("log");
            let snapshots = bytes_under(&log_dir.join("snapshots"));
            println!(
                "{day:>3}  {:>9} ({}..{})   {:>7}  {:>13}  {:>9}  {:>6}  {:>9.1}",
                state.last_seq + 1 - state.first_seq,
                state.first_seq,
                state.last_seq,
                mib(bytes_under(&log_dir) - snapshots),
                mib(snapshots),
                mib(bytes_under(&dir.join("store"))),
                store.ledger().expect("ledger").len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    println!(
        "{events} events applied in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
