//! Figures of `lockstep run` against a real nats-server, for docs/src/benchmarks.md:
//! end-to-end publish -> apply throughput, restart and catch-up of a large
//! log with a checkpoint at its head, with one a whole checkpoint interval
//! behind it (a crash just before the next checkpoint: the worst recovery)
//! and without one, and resident memory with 50,000 Slurm nodes in state.
//!
//! ```sh
//! cargo build --release --bin lockstep
//! cargo run --release -p lockstep-benches --example service_figures -- [events] [memory_nodes]
//! ```
//! (defaults: 1,000,000 events, 50,000 nodes, 0 to skip the memory figures;
//! needs `nats-server` on PATH).
//!
//! With `--memory` first, only the memory figures:
//! `cargo run --release -p lockstep-benches --example service_figures -- --memory [memory_nodes]`.
//! They are the resident memory after applying the log, and the peak of
//! each life of the process (applying the log and its checkpoints, then a
//! restart from the checkpoint), the final checkpoint written on the way
//! out included: the largest of `VmRSS` sampled every 50 ms and the last
//! `VmHWM` read before it exits. `LOCKSTEP_BIN` runs another build of
//! `lockstep` (an earlier commit's, for a before and after).
//!
//! With `--bootstrap [nodes] [events]` first (50,000 and 1,000,000), a new
//! replica's start from the newest snapshot against folding the whole log.
//!
//! With `--long [nodes] [events] [window]` first (50,000, 10,000,000 and
//! 3,600,000: an hour at 1,000 events a second), on a long log: a new
//! replica's start from the newest snapshot, and `lockstep replay --from`
//! of the last `window` records (from the newest snapshot before them)
//! against the replay of the whole log.
//!
//! With `--pauses [nodes]` first (50,000), the apply loop's pauses: a log
//! that brings up that many Slurm nodes (one per Kubernetes node, scaling
//! and topology on) and cordons every node, its actions never carried out,
//! is applied by a fresh instance, which then takes over every action in
//! flight as it starts to lead, while the log's Slurm node records arrive
//! again (restamped, round robin: nodes go back and forth between the
//! states the log shows) at 1,000 a second; then, as the reference, the
//! same instance once the take-over is done; then the same instance,
//! restarted, writing a checkpoint every 3 s under the same stream. The figures are the gaps between two
//! advances of `/status`'s `applied_seq` (sampled every 2 ms), p99 and
//! max, over 30 s of each.
//!
//! With `--cluster` first, only the publish -> apply figure, on one
//! nats-server and then on a three-server JetStream cluster
//! (`deploy/local/nats/up.sh`) with the streams replicated three times,
//! its servers syncing every write, then every 2 minutes, then every write
//! again (what synced writes cost):
//! `cargo run --release -p lockstep-benches --example service_figures -- --cluster [events]`
//! (default 200,000 events).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_store::{EventLog, StreamLimits};
use lockstep_testkit::gen::{Generator, Shape};
use lockstep_testkit::{free_port, temp_dir, NatsServer};

fn lockstep_bin() -> PathBuf {
    std::env::var_os("LOCKSTEP_BIN").map_or_else(
        || lockstep_benches::sibling_binary("lockstep"),
        PathBuf::from,
    )
}

fn status(port: u16) -> Option<(bool, u64)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let json = &body[body.find('{')?..];
    let ready = json.contains("\"ready\":true");
    let applied = json
        .split("\"applied_seq\":")
        .nth(1)?
        .split(',')
        .next()?
        .parse()
        .ok()?;
    Some((ready, applied))
}

fn wait_applied(port: u16, head: u64, limit: Duration) -> Duration {
    let t = Instant::now();
    loop {
        if let Some((true, applied)) = status(port) {
            if applied >= head {
                return t.elapsed();
            }
        }
        assert!(
            t.elapsed() < limit,
            "not caught up with seq {head} within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(config: &Path) -> Child {
    Command::new(lockstep_bin())
        .args(["run", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run target/release/lockstep (cargo build --release --bin lockstep)")
}

/// [`start`], logging checkpoints and restores to `log` as well as warnings.
fn start_logged(config: &Path, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    Command::new(lockstep_bin())
        .args(["run", "--config"])
        .arg(config)
        .env(
            "RUST_LOG",
            // With LOCKSTEP_PAUSES_LOG, each batch's apply and commit times.
            if std::env::var_os("LOCKSTEP_PAUSES_LOG").is_some() {
                "warn,lockstep::telemetry=debug,lockstep::service=info"
            } else {
                "warn,lockstep::telemetry=info,lockstep::service=info"
            },
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("run target/release/lockstep (cargo build --release --bin lockstep)")
}

fn stop(child: &mut Child) {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    child.wait().unwrap();
}

fn rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmRSS:").unwrap_or(f64::NAN)
}

/// A `/proc/PID/status` memory field (`VmRSS:`, `VmHWM:`) in MiB; `None`
/// once the process has exited (a zombie has no memory fields).
fn status_mib(pid: u32, field: &str) -> Option<f64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
}

/// The peak resident memory of one process over its life.
#[derive(Debug, Default, Clone, Copy)]
struct Peak {
    /// The largest `VmRSS` sampled.
    sampled_mib: f64,
    /// The last `VmHWM` read (the kernel's high-water mark).
    hwm_mib: f64,
}

impl Peak {
    fn mib(self) -> f64 {
        self.sampled_mib.max(self.hwm_mib)
    }
}

/// Samples `pid`'s memory every 50 ms until it exits.
fn sample_peak(pid: u32) -> std::thread::JoinHandle<Peak> {
    std::thread::spawn(move || {
        let mut peak = Peak::default();
        while let Some(rss) = status_mib(pid, "VmRSS:") {
            peak.sampled_mib = peak.sampled_mib.max(rss);
            if let Some(hwm) = status_mib(pid, "VmHWM:") {
                peak.hwm_mib = peak.hwm_mib.max(hwm);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        peak
    })
}

/// `key=value` of the lines of `log` that contain `what`.
fn logged(log: &Path, what: &str, key: &str) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
                .map(|v| v.trim_matches('"').to_owned())
        })
        .collect()
}

/// The service's default checkpoint cadence (`[service]
/// checkpoint_every_records`; also every 30 s).
const CHECKPOINT_EVERY: usize = 50_000;

fn config(dir: &Path, nats: &str, port: u16) -> PathBuf {
    config_with(dir, nats, port, 30_000)
}

fn config_with(dir: &Path, nats: &str, port: u16, checkpoint_every_ms: u64) -> PathBuf {
    let path = dir.join("lockstep.toml");
    let replicas = if nats.contains(',') { 3 } else { 1 };
    std::fs::write(
        &path,
        format!(
            "data_dir = \"data\"\n[log]\nnats_url = \"{nats}\"\nreplicas = {replicas}\nmax_bytes = -1\n[service]\nbatch_max = 4096\ntick_interval_ms = 60000\ncheckpoint_every_records = {CHECKPOINT_EVERY}\ncheckpoint_every_ms = {checkpoint_every_ms}\n[telemetry]\nlisten = \"127.0.0.1:{port}\"\n"
        ),
    )
    .unwrap();
    path
}

/// A log on the nats-server at `url` whose streams keep everything.
fn unbounded_log(rt: &tokio::runtime::Runtime, url: &str) -> EventLog {
    rt.block_on(EventLog::connect_nats(
        url,
        &StreamLimits {
            max_bytes: -1,
            ..StreamLimits::default()
        },
    ))
    .unwrap()
}

async fn publish(log: &EventLog, records: &[lockstep_schemas::EventRecord]) -> Duration {
    let t = Instant::now();
    for chunk in records.chunks(2048) {
        let appends = chunk.iter().map(|r| log.append(&r.envelope));
        for a in futures::future::join_all(appends).await {
            a.expect("publish");
        }
    }
    t.elapsed()
}

/// Figures of `lockstep run` against a real nats-server (see the module
/// docs; one of the flags picks a single measurement, none runs the
/// default ones).
#[derive(clap::Parser)]
#[command(name = "service_figures")]
#[command(group = clap::ArgGroup::new("only").multiple(false))]
struct Args {
    /// Events of the log for publish -> apply and the restarts.
    #[arg(default_value_t = 1_000_000)]
    events: usize,
    /// Slurm nodes for the memory figures (0: skip them).
    #[arg(default_value_t = 50_000)]
    memory_nodes: usize,
    /// Only publish -> apply, on one nats-server and on a three-server
    /// cluster [events: 200,000].
    #[arg(long, group = "only", num_args = 0..=1, value_name = "EVENTS")]
    cluster: Option<Option<usize>>,
    /// Only a new replica's start from the newest snapshot against folding
    /// the whole log [nodes: 50,000] [events: 1,000,000].
    #[arg(long, group = "only", num_args = 0..=2, value_names = ["NODES", "EVENTS"])]
    bootstrap: Option<Vec<usize>>,
    /// Only the figures of a long log [nodes: 50,000] [events: 10,000,000]
    /// [window: 3,600,000 records].
    #[arg(long, group = "only", num_args = 0..=3, value_names = ["NODES", "EVENTS", "WINDOW"])]
    long: Option<Vec<usize>>,
    /// Only the apply loop's pauses in a take-over and under checkpoints
    /// [nodes: 50,000].
    #[arg(long, group = "only", num_args = 0..=1, value_name = "NODES")]
    pauses: Option<Option<usize>>,
    /// Only the memory figures [nodes: 50,000].
    #[arg(long, group = "only", num_args = 0..=1, value_name = "NODES")]
    memory: Option<Option<usize>>,
}

/// The `i`th value given after a flag, or `default`.
fn nth(values: &[usize], i: usize, default: usize) -> usize {
    values.get(i).copied().unwrap_or(default)
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    if let Some(events) = args.cluster {
        return cluster_throughput(events.unwrap_or(200_000));
    }
    if let Some(v) = &args.bootstrap {
        return bootstrap(nth(v, 0, 50_000), nth(v, 1, 1_000_000));
    }
    if let Some(v) = &args.long {
        return long_log(
            nth(v, 0, 50_000),
            nth(v, 1, 10_000_000),
            nth(v, 2, 3_600_000),
        );
    }
    if let Some(nodes) = args.pauses {
        return pauses(nodes.unwrap_or(50_000));
    }
    if let Some(nodes) = args.memory {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let _entered = rt.enter();
        return memory(&rt, nodes.unwrap_or(50_000));
    }
    let Args {
        events,
        memory_nodes,
        ..
    } = args;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();

    // 1. Publish -> apply, and restarts, on a log of `events` records.
    let nats = NatsServer::start();
    let log = unbounded_log(&rt, &nats.url());
    eprintln!("generating {events} events over 10,000 slurm nodes ...");
    let mut g = Generator::new(Shape::plain(10_000, 4), 42);
    g.steady_state(events.saturating_sub(g.records().len()));
    let records = g.into_records();
    // The last checkpoint interval is published while the service is down.
    let behind = (CHECKPOINT_EVERY - 1).min(records.len() / 2);
    let (records, rest) = records.split_at(records.len() - behind);
    let dir = temp_dir("service-figures");
    let port = free_port();
    let cfg = config(&dir, &nats.url(), port);
    let mut child = start(&cfg);
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let published = rt.block_on(publish(&log, records));
    let head = rt.block_on(log.head()).unwrap();
    wait_applied(port, head, Duration::from_secs(600));
    let total = t.elapsed();
    println!(
        "publish -> apply: {} events published in {:.2} s ({:.0} events/s); all applied {:.2} s after the first publish: {:.0} events/s end to end",
        records.len(),
        published.as_secs_f64(),
        records.len() as f64 / published.as_secs_f64(),
        total.as_secs_f64(),
        records.len() as f64 / total.as_secs_f64()
    );
    stop(&mut child);

    // 2. Restart with the checkpoint written at shutdown.
    let t = Instant::now();
    let mut child = start(&cfg);
    let caught_up = wait_applied(port, head, Duration::from_secs(600)).max(Duration::ZERO);
    println!(
        "restart with a checkpoint at seq {head}: caught up in {:.2} s ({:.2} s from process start)",
        caught_up.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    stop(&mut child);

    // 3. A crash just before the next checkpoint: the checkpoint is one
    // interval (less one record) behind the log's head.
    rt.block_on(publish(&log, rest));
    let head = rt.block_on(log.head()).unwrap();
    let t = Instant::now();
    let mut child = start(&cfg);
    wait_applied(port, head, Duration::from_secs(600));
    println!(
        "restart with the checkpoint {behind} records behind the head (seq {head}): caught up in {:.2} s from process start",
        t.elapsed().as_secs_f64()
    );
    stop(&mut child);

    // 4. Restart without it: rebuild from the whole log.
    std::fs::remove_dir_all(dir.join("data/store")).unwrap();
    let t = Instant::now();
    let mut child = start(&cfg);
    wait_applied(port, head, Duration::from_secs(600));
    println!(
        "restart without a checkpoint: re-applied {head} records in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    stop(&mut child);
    drop(nats);
    let _ = std::fs::remove_dir_all(&dir);

    // 5. Memory with a large model (0: skip).
    if memory_nodes > 0 {
        memory(&rt, memory_nodes);
    }
}

/// Resident memory of `lockstep run` with `memory_nodes` Slurm nodes (one
/// Kubernetes node per ten), as many pods and 100,000 jobs in state: after
/// applying the log, and the peak of each life, checkpoints included.
fn memory(rt: &tokio::runtime::Runtime, memory_nodes: usize) {
    let nats = NatsServer::start();
    let log = unbounded_log(rt, &nats.url());
    let shape = Shape {
        slurm_nodes: memory_nodes,
        per_kube_node: 10,
        pending_jobs: 100_000,
        scaling_and_topology: true,
    };
    eprintln!("generating a cluster of {memory_nodes} slurm nodes and 100,000 jobs ...");
    let records = Generator::new(shape, 7).into_records();
    rt.block_on(publish(&log, &records));
    drop(records);
    let head = rt.block_on(log.head()).unwrap();
    let dir = temp_dir("service-memory");
    let port = free_port();
    let cfg = config(&dir, &nats.url(), port);
    let run_log = dir.join("run.log");
    let mut child = start_logged(&cfg, &run_log);
    let peak = sample_peak(child.id());
    wait_applied(port, head, Duration::from_secs(600));
    std::thread::sleep(Duration::from_secs(3));
    let built = rss_mib(child.id());
    let t = Instant::now();
    stop(&mut child);
    let first_stop = t.elapsed();
    let first = peak.join().unwrap();
    let t = Instant::now();
    let mut child = start_logged(&cfg, &run_log);
    let peak = sample_peak(child.id());
    wait_applied(port, head, Duration::from_secs(600));
    let caught_up = t.elapsed();
    std::thread::sleep(Duration::from_secs(3));
    let restarted = rss_mib(child.id());
    let t = Instant::now();
    stop(&mut child);
    let second_stop = t.elapsed();
    let second = peak.join().unwrap();
    println!(
        "memory: lockstep run with {memory_nodes} slurm nodes, {} kubernetes nodes, {memory_nodes} pods and 100,000 jobs in state: {built:.0} MiB resident after applying the log, {restarted:.0} MiB after a restart from its checkpoint",
        memory_nodes / 10,
    );
    println!(
        "memory: peak resident {:.0} MiB applying the log ({head} records) and writing its checkpoints (VmHWM {:.0} MiB, sampled VmRSS max {:.0} MiB); peak {:.0} MiB restoring from the checkpoint and stopping (VmHWM {:.0} MiB, sampled {:.0} MiB)",
        first.mib(),
        first.hwm_mib,
        first.sampled_mib,
        second.mib(),
        second.hwm_mib,
        second.sampled_mib,
    );
    println!(
        "checkpoints written (bytes, took_ms): {:?}",
        logged(&run_log, "checkpoint written", "bytes")
            .into_iter()
            .zip(logged(&run_log, "checkpoint written", "took_ms"))
            .collect::<Vec<_>>()
    );
    println!(
        "stop (SIGTERM -> exit, the final checkpoint included): {:.2} s, {:.2} s; restart from the checkpoint: caught up {:.2} s from process start; restore took_ms {:?}",
        first_stop.as_secs_f64(),
        second_stop.as_secs_f64(),
        caught_up.as_secs_f64(),
        logged(&run_log, "resuming from checkpoint", "took_ms"),
    );
    if let Ok(m) = std::fs::metadata(dir.join("data/store/engine.checkpoint")) {
        println!("checkpoint file: {} bytes", m.len());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Publish -> apply on one nats-server, then on a three-server JetStream
/// cluster with the streams replicated three times, its servers syncing
/// every write, then every 2 minutes, then every write again: the first
/// measurement of `main`, side by side on the same events.
fn cluster_throughput(events: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    eprintln!("generating {events} events over 10,000 slurm nodes ...");
    let mut g = Generator::new(Shape::plain(10_000, 4), 42);
    g.steady_state(events.saturating_sub(g.records().len()));
    let records = g.into_records();
    {
        let single = NatsServer::start();
        measure(&rt, &single.url(), 1, &records, "one nats-server (R1)");
    }
    // Every write synced (what lockstep ships), then JetStream's default
    // (synced every 2 minutes), then synced again: the cost of synced
    // writes, measured between two runs of the other.
    for (sync, what) in [
        (
            "always",
            "a 3-server JetStream cluster (R3), every write synced",
        ),
        (
            "2m",
            "a 3-server JetStream cluster (R3), synced every 2 minutes",
        ),
        (
            "always",
            "a 3-server JetStream cluster (R3), every write synced, again",
        ),
    ] {
        let cluster = lockstep_testkit::NatsCluster::start_syncing(sync);
        measure(&rt, &cluster.url(), 3, &records, what);
    }
}

/// A new replica's start: from the newest snapshot the leader kept beside
/// the log (with 50,000 records after it), against folding the whole log.
/// The same records are on two nats-servers, one of them without
/// snapshots; the two starts alternate three times.
fn bootstrap(nodes: usize, events: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    eprintln!("generating {events} events over {nodes} slurm nodes ...");
    let mut g = Generator::new(Shape::plain(nodes, 4), 42);
    g.steady_state(events.saturating_sub(g.records().len()));
    let records = g.into_records();
    let after = CHECKPOINT_EVERY.min(records.len() / 2);
    let (before, rest) = records.split_at(records.len() - after);
    let limits = StreamLimits {
        max_bytes: -1,
        ..StreamLimits::default()
    };
    let servers = [NatsServer::start(), NatsServer::start()];
    let logs: Vec<EventLog> = servers
        .iter()
        .map(|n| {
            rt.block_on(EventLog::connect_nats(&n.url(), &limits))
                .unwrap()
        })
        .collect();
    for log in &logs {
        eprintln!("publishing {} events ...", before.len());
        rt.block_on(publish(log, before));
    }
    let head = rt.block_on(logs[0].head()).unwrap();
    // The leader folds the first server's log and keeps a snapshot at its
    // head.
    let dir = temp_dir("service-figures-bootstrap");
    let port = free_port();
    let mut leader = start(&config(&dir, &servers[0].url(), port));
    wait_applied(port, head, Duration::from_secs(3600));
    let deadline = Instant::now() + Duration::from_secs(600);
    let snapshot = loop {
        let kept = rt.block_on(logs[0].snapshots()).unwrap();
        if let Some(s) = kept.last().filter(|s| s.seq == head) {
            break s.clone();
        }
        assert!(Instant::now() < deadline, "no snapshot at seq {head}");
        std::thread::sleep(Duration::from_millis(200));
    };
    stop(&mut leader);
    let _ = std::fs::remove_dir_all(&dir);
    for log in &logs {
        rt.block_on(publish(log, rest));
    }
    let head = rt.block_on(logs[0].head()).unwrap();
    assert_eq!(head, rt.block_on(logs[1].head()).unwrap());
    println!(
        "a new replica's start, {head} events over {nodes} nodes, snapshot at seq {} ({:.1} MiB), {after} records after it:",
        snapshot.seq,
        snapshot.bytes as f64 / f64::from(1 << 20)
    );
    for round in 1..=3 {
        for (server, what) in [(0, "from the snapshot"), (1, "folding the whole log")] {
            let took = new_replica(
                &rt,
                &logs[server],
                &servers[server].url(),
                head,
                snapshot.seq,
            );
            println!("  round {round}, {what}: {:.2} s", took.as_secs_f64());
        }
    }
}

/// A long log on one nats-server: a new replica's start from the newest
/// snapshot the leader kept (three rounds), then the replay of the log's
/// last `window` records as `lockstep replay --from` runs it (from the
/// newest snapshot before the window), against the replay of the whole log.
/// The leader keeps a snapshot every 20 s of its fold, so that the log has
/// some before the window.
fn long_log(nodes: usize, events: usize, window: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let server = NatsServer::start();
    let limits = StreamLimits {
        max_bytes: -1,
        ..StreamLimits::default()
    };
    let log = rt
        .block_on(EventLog::connect_nats(&server.url(), &limits))
        .unwrap();
    let mut g = Generator::new(Shape::plain(nodes, 4), 43);
    // Publishes up to `until` events in all, a million at a time.
    let mut published = 0;
    let mut publish_until = |until: usize| {
        while published < until {
            g.steady_state(
                1_000_000
                    .min(until - published)
                    .saturating_sub(g.records().len()),
            );
            let records = g.take_records();
            published += records.len();
            rt.block_on(publish(&log, &records));
            eprintln!("published {published} of {events} events ...");
        }
    };
    // The log before the window, folded by a leader that then keeps a
    // snapshot at its head; the window published while it leads, as a
    // live leader sees it, keeping a snapshot every 20 s.
    let t = Instant::now();
    publish_until(events.saturating_sub(window));
    let before = rt.block_on(log.head()).unwrap();
    eprintln!("{before} records in {:.0} s", t.elapsed().as_secs_f64());
    let dir = temp_dir("service-figures-long");
    let port = free_port();
    let cfg = config(&dir, &server.url(), port);
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace(
            "[telemetry]",
            "snapshot_every_ms = 20000\nsnapshots_kept = 100\n[telemetry]",
        ),
    )
    .unwrap();
    let mut leader = start(&cfg);
    let folded = wait_applied(port, before, Duration::from_secs(7200));
    let snapshot_at = |seq: u64| {
        let deadline = Instant::now() + Duration::from_secs(600);
        while rt
            .block_on(log.snapshots())
            .unwrap()
            .last()
            .is_none_or(|s| s.seq < seq)
        {
            assert!(Instant::now() < deadline, "no snapshot at seq {seq}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    snapshot_at(before);
    publish_until(events);
    let head = rt.block_on(log.head()).unwrap();
    wait_applied(port, head, Duration::from_secs(7200));
    snapshot_at(head);
    stop(&mut leader);
    let _ = std::fs::remove_dir_all(&dir);
    let kept = rt.block_on(log.snapshots()).unwrap();
    let newest = kept.last().unwrap().clone();
    println!(
        "{head} events over {nodes} nodes; the leader folded the first {before} in {:.1} s, then applied the rest as they came; {} snapshots kept, the newest at seq {} ({:.1} MiB)",
        folded.as_secs_f64(),
        kept.len(),
        newest.seq,
        newest.bytes as f64 / f64::from(1 << 20)
    );
    for round in 1..=3 {
        let took = new_replica(&rt, &log, &server.url(), head, newest.seq);
        println!("  a new replica's start from the snapshot, round {round}: {took:.2?}");
    }
    // The window: what the leader applied live.
    let (from, window) = (before + 1, head - before);
    let replay = |args: &[&str]| {
        let t = Instant::now();
        let out = Command::new(lockstep_bin())
            .arg("replay")
            .arg(server.url())
            .args(args)
            .arg("--quiet")
            .output()
            .unwrap();
        let took = t.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let summary = stderr.lines().last().unwrap_or_default().to_owned();
        let start = stderr
            .lines()
            .find(|l| l.starts_with("starting from"))
            .unwrap_or("from the first record")
            .to_owned();
        (took, start, summary)
    };
    for round in 1..=2 {
        let (took, start, summary) = replay(&["--from", &from.to_string()]);
        println!(
            "  replay of the last {window} records (from seq {from}), round {round}: {took:.2?}; {start}; {summary}"
        );
    }
    let (took, _, summary) = replay(&[]);
    println!("  replay of the whole log: {took:.2?}; {summary}");
}

/// A new replica with an empty store on the log at `url`: the time from
/// its start until it has applied `head`. It leads once caught up, and
/// keeps a snapshot then: the snapshots after `keep_up_to` are deleted, so
/// that the next one starts as this one did.
fn new_replica(
    rt: &tokio::runtime::Runtime,
    log: &EventLog,
    url: &str,
    head: u64,
    keep_up_to: u64,
) -> Duration {
    let dir = temp_dir("service-figures-replica");
    let port = free_port();
    let cfg = config(&dir, url, port);
    let t = Instant::now();
    let mut child = start(&cfg);
    wait_applied(port, head, Duration::from_secs(3600));
    let took = t.elapsed();
    stop(&mut child);
    let newer: Vec<String> = rt
        .block_on(log.snapshots())
        .unwrap()
        .into_iter()
        .filter(|s| s.seq > keep_up_to)
        .map(|s| s.name)
        .collect();
    rt.block_on(delete_snapshots(url, &newer));
    let _ = std::fs::remove_dir_all(&dir);
    took
}

/// Deletes the snapshots named from the nats-server at `url`.
async fn delete_snapshots(url: &str, names: &[String]) {
    if names.is_empty() {
        return;
    }
    let client = async_nats::connect(url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let bucket = js
        .get_object_store(lockstep_store::snapshots::BUCKET)
        .await
        .unwrap();
    for name in names {
        bucket.delete(name).await.unwrap();
    }
}

fn measure(
    rt: &tokio::runtime::Runtime,
    url: &str,
    replicas: usize,
    records: &[lockstep_schemas::EventRecord],
    what: &str,
) {
    let log = rt
        .block_on(EventLog::connect_nats(
            url,
            &StreamLimits {
                max_bytes: -1,
                replicas,
                ..StreamLimits::default()
            },
        ))
        .unwrap();
    let dir = temp_dir("service-figures-cluster");
    let port = free_port();
    let cfg = config(&dir, url, port);
    let mut child = start(&cfg);
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let published = rt.block_on(publish(&log, records));
    let head = rt.block_on(log.head()).unwrap();
    wait_applied(port, head, Duration::from_secs(600));
    let total = t.elapsed();
    println!(
        "publish -> apply on {what}: {} events published in {:.2} s ({:.0} events/s); all applied {:.2} s after the first publish: {:.0} events/s end to end",
        records.len(),
        published.as_secs_f64(),
        records.len() as f64 / published.as_secs_f64(),
        total.as_secs_f64(),
        records.len() as f64 / total.as_secs_f64()
    );
    stop(&mut child);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--pauses`: the apply loop's longest pauses during a take-over and
/// during checkpoints.
fn pauses(nodes: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let nats = NatsServer::start();
    let log = unbounded_log(&rt, &nats.url());
    let (_, records, in_flight) = lockstep_testkit::gen::cordoned_fleet(nodes, 11);
    let relists: Vec<lockstep_schemas::Envelope> = records
        .iter()
        .filter(|r| matches!(r.envelope.event, lockstep_schemas::Event::SlurmNode(_)))
        .map(|r| r.envelope.clone())
        .collect();
    eprintln!(
        "publishing {} records: {nodes} slurm nodes brought up and cordoned, {in_flight} actions in flight at the end ...",
        records.len()
    );
    rt.block_on(publish(&log, &records));
    let head = rt.block_on(log.head()).unwrap();
    let dir = temp_dir("apply-pauses");
    let port = free_port();
    let logfile = dir.join("lockstep.log");

    // 1. A fresh instance folds the log, then leads and takes over.
    let cfg = config_with(&dir, &nats.url(), port, 3_600_000);
    let mut child = start_logged(&cfg, &logfile);
    wait_applied(port, head, Duration::from_secs(600));
    let take_over = under_stream(&rt, &log, &relists, port, Duration::from_secs(30));
    let took = logged(
        &logfile,
        "actions of earlier leaderships published",
        "took_ms",
    );
    let published = logged(
        &logfile,
        "actions of earlier leaderships published",
        "unpublished",
    );
    println!(
        "take-over of {in_flight} actions in flight at {nodes} nodes ({} published{}): apply loop's gaps p99 {:.0} ms, max {:.0} ms over {} advances",
        published.first().map_or("?", String::as_str),
        took.first().map_or(String::new(), |t| format!(" in {t} ms, off the loop")),
        take_over.0,
        take_over.1,
        take_over.2,
    );
    // The same instance, leading, the take-over done: the gaps the stream
    // and the engine make on their own, the reference for the two above.
    let steady = under_stream(&rt, &log, &relists, port, Duration::from_secs(30));
    println!(
        "steady at {nodes} nodes (no take-over, no checkpoint): apply loop's gaps p99 {:.0} ms, max {:.0} ms over {} advances",
        steady.0, steady.1, steady.2,
    );
    stop(&mut child);

    // 2. Restarted, writing a checkpoint every 3 s.
    let cfg = config_with(&dir, &nats.url(), port, 3_000);
    let before = logged(&logfile, "checkpoint written", "took_ms").len();
    let mut child = start_logged(&cfg, &logfile);
    let head = rt.block_on(log.head()).unwrap();
    wait_applied(port, head, Duration::from_secs(600));
    let checkpoints = under_stream(&rt, &log, &relists, port, Duration::from_secs(30));
    stop(&mut child);
    let written = logged(&logfile, "checkpoint written", "took_ms");
    if std::env::var_os("LOCKSTEP_PAUSES_LOG").is_some() {
        let _ = std::fs::copy(&logfile, "/tmp/lockstep-pauses.log");
    }
    println!(
        "checkpoints at {nodes} nodes ({} written, each {} ms): apply loop's gaps p99 {:.0} ms, max {:.0} ms over {} advances",
        written.len().saturating_sub(before),
        written.get(before + 1).map_or("?", String::as_str),
        checkpoints.0,
        checkpoints.1,
        checkpoints.2,
    );
    drop(nats);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Appends `relists` round robin at 1,000 a second for `span` while sampling
/// `/status` every 2 ms; returns the gaps between two advances of
/// `applied_seq` (p99 ms, max ms, how many).
fn under_stream(
    rt: &tokio::runtime::Runtime,
    log: &EventLog,
    relists: &[lockstep_schemas::Envelope],
    port: u16,
    span: Duration,
) -> (f64, f64, usize) {
    let feed = {
        let (log, relists) = (log.clone(), relists.to_vec());
        rt.spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(10));
            let mut i = 0;
            loop {
                every.tick().await;
                // Observed now: the same content at another time is another
                // record (an envelope's id covers its time).
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as u64;
                let fresh: Vec<_> = (0..10)
                    .map(|k| {
                        let e = &relists[(i + k) % relists.len()];
                        lockstep_schemas::Envelope::new(e.source, now_ms, e.event.clone())
                    })
                    .collect();
                let appends = fresh.iter().map(|e| log.append(e));
                for a in futures::future::join_all(appends).await {
                    a.expect("append");
                }
                i += 10;
            }
        })
    };
    let started = Instant::now();
    eprintln!(
        "  window starts at {} ms since the epoch",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let (mut last, mut since) = (None, Instant::now());
    let mut gaps = Vec::new();
    while started.elapsed() < span {
        if let Some((_, applied)) = status(port) {
            if last != Some(applied) {
                let now = Instant::now();
                if last.is_some() {
                    gaps.push((
                        (now - since).as_secs_f64() * 1e3,
                        (since - started).as_secs_f64(),
                    ));
                }
                (last, since) = (Some(applied), now);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        !feed.is_finished(),
        "the feed stopped: {:?}",
        rt.block_on(feed)
    );
    feed.abort();
    gaps.sort_by(|a, b| a.0.total_cmp(&b.0));
    let longest: Vec<String> = gaps
        .iter()
        .rev()
        .take(3)
        .map(|(ms, at)| format!("{ms:.0} ms at {at:.1} s"))
        .collect();
    eprintln!("  longest gaps: {}", longest.join(", "));
    let p99 = gaps
        .get((gaps.len() * 99 / 100).min(gaps.len().saturating_sub(1)))
        .map_or(f64::NAN, |g| g.0);
    (p99, gaps.last().map_or(f64::NAN, |g| g.0), gaps.len())
}
