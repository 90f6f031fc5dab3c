//! Prints the reducer's figures in one run, for docs/src/benchmarks.md and for
//! profiling (criterion's `cargo bench -p lockstep-benches` is the careful
//! measurement of the same throughputs).
//!
//! `reducer-figures [slurm_nodes] [steady_events] [full]`: apply throughput on
//! the steady-state mix (`full`: with scaling and topology on and 90,000
//! queued jobs), replay throughput of a MessagePack log with decoding (read
//! ahead on a second thread, as `lockstep replay` reads a file, and on one
//! thread), and the floor of a one-thread replay: decoding the same log
//! alone.
//! `reducer-figures memory [slurm_nodes]`: resident memory of an engine
//! holding a model of that many Slurm nodes (with their pods and Kubernetes
//! nodes), after everything else is dropped.
//! `reducer-figures checkpoint [slurm_nodes]`: what a checkpoint of such an
//! engine costs: encoding it into memory, writing and syncing those bytes,
//! a copy of the engine (`Engine::clone`: its large tables shared, the rest
//! copied), and the frozen copy a checkpoint is encoded from off the apply
//! loop, each the median of five.
//! `reducer-figures scale-in [slurm_nodes]`: a fleet of idle Slurm nodes, one
//! per Kubernetes node, scaling and topology on, every node cordoned and
//! none of lockstep's actions answered; then unchanged relists, 1 ms apart,
//! months later. The first record finds every action timed out (a wave of
//! retries); scaling then scans its target at a whole second (a scale-in of
//! the whole idle fleet). Prints both, the scan as the median of five
//! applications to copies of the engine.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, Parser, Subcommand};

use lockstep_engine::replay::Replay;
use lockstep_engine::{Engine, Output};
use lockstep_schemas::log::{read_ahead, Format, LogReader, LogWriter};
use lockstep_schemas::{Policy, Record};
use lockstep_testkit::gen::{Generator, Shape};

// The same allocator as the `lockstep` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// The reducer's figures: apply and replay throughput by default, or one of
/// the measurements below.
#[derive(Parser)]
#[command(
    name = "reducer-figures",
    args_conflicts_with_subcommands = true,
    after_help = "scripts/bench-reducer.sh runs the throughput against a reference build, interleaved, and prints the ratios."
)]
struct Cli {
    #[command(subcommand)]
    measure: Option<Measure>,
    #[command(flatten)]
    throughput: Throughput,
}

/// Apply throughput on the steady-state mix, replay throughput of a
/// MessagePack log with decoding (read ahead on a second thread, and on
/// one), and decoding the same log alone.
#[derive(Args)]
struct Throughput {
    /// Slurm nodes of the generated cluster.
    #[arg(default_value_t = 10_000)]
    slurm_nodes: usize,
    /// Steady-state events applied after the cluster is brought up.
    #[arg(default_value_t = 1_000_000)]
    steady_events: usize,
    /// `full`: scaling and topology on, 90,000 queued jobs.
    #[arg(value_parser = ["full"])]
    full: Option<String>,
    /// A perf control FIFO (`perf record --control fifo:FIFO -D -1 ...`):
    /// sampling is enabled around the apply loop alone, and the run ends
    /// after it.
    #[arg(long, value_name = "FIFO")]
    perf_ctl: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Measure {
    /// Resident memory of an engine holding a model of that many Slurm
    /// nodes (with their pods and Kubernetes nodes).
    Memory {
        #[arg(default_value_t = 50_000)]
        slurm_nodes: usize,
    },
    /// Resident memory of an engine restored from a snapshot file.
    Restore { snapshot: PathBuf },
    /// A whole idle fleet to scale in: the retry wave, then scaling's scan.
    ScaleIn {
        #[arg(default_value_t = 50_000)]
        slurm_nodes: usize,
    },
    /// What a checkpoint costs: encoding, writing and syncing, a copy of the
    /// engine, the frozen copy.
    Checkpoint {
        #[arg(default_value_t = 50_000)]
        slurm_nodes: usize,
    },
}

fn main() {
    let cli = Cli::parse();
    match cli.measure {
        Some(Measure::Memory { slurm_nodes }) => memory(slurm_nodes),
        Some(Measure::Restore { snapshot }) => restore(&snapshot),
        Some(Measure::ScaleIn { slurm_nodes }) => scale_in(slurm_nodes),
        Some(Measure::Checkpoint { slurm_nodes }) => checkpoint(slurm_nodes),
        None => {
            let t = cli.throughput;
            throughput(
                t.slurm_nodes,
                t.steady_events,
                t.full.is_some(),
                t.perf_ctl.as_deref(),
            );
        }
    }
}

/// DESIGN.md's scale target: 50,000 Slurm nodes, 5,000 Kubernetes nodes,
/// 100,000 jobs, with scaling and topology on.
fn scale_engine(slurm_nodes: usize) -> Engine {
    let g = Generator::new(
        Shape {
            slurm_nodes,
            per_kube_node: 10,
            pending_jobs: 100_000,
            scaling_and_topology: true,
        },
        7,
    );
    let mut engine = Engine::new(Policy::default());
    let mut out = Output::default();
    for r in g.records() {
        engine.apply(r, &mut out);
        out.clear();
    }
    engine
}

fn checkpoint(slurm_nodes: usize) {
    let engine = scale_engine(slurm_nodes);
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let path = std::env::temp_dir().join(format!(
        "lockstep-checkpoint-{}.snapshot",
        std::process::id()
    ));
    let (mut encode, mut write, mut copy, mut freeze, mut stats) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut size = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let bytes = engine.snapshot();
        encode.push(t.elapsed().as_secs_f64() * 1e3);
        size = bytes.len();
        let t = Instant::now();
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&path).expect("create");
            f.write_all(&bytes).expect("write");
            f.sync_all().expect("sync");
        }
        write.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let twin = std::hint::black_box(engine.clone());
        copy.push(t.elapsed().as_secs_f64() * 1e3);
        drop(twin);
        let t = Instant::now();
        let frozen = std::hint::black_box(engine.frozen());
        freeze.push(t.elapsed().as_secs_f64() * 1e3);
        drop(frozen);
        let t = Instant::now();
        std::hint::black_box(engine.stats());
        stats.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let _ = std::fs::remove_file(&path);
    let [s, k, p, j] = engine.sizes();
    println!(
        "checkpoint: engine with {s} slurm nodes, {k} kubernetes nodes, {p} pods, {j} jobs, {:.1} MB: encode {:.0} ms, write+sync {:.0} ms, copy {:.0} ms, frozen copy {:.1} ms, the metrics' count of the model (`Engine::stats`) {:.1} ms (medians of 5)",
        size as f64 / 1e6,
        median(encode),
        median(write),
        median(copy),
        median(freeze),
        median(stats),
    );
}

fn scale_in(slurm_nodes: usize) {
    use lockstep_schemas::{Envelope, Event, EventRecord, Source};
    let (shape, records, in_flight) = lockstep_testkit::gen::cordoned_fleet(slurm_nodes, 11);
    let mut nodes = std::collections::BTreeMap::new();
    for r in &records {
        if let Event::SlurmNode(n) = &r.envelope.event {
            nodes.insert(n.name.clone(), n.clone());
        }
    }
    // Unchanged relists for three seconds, from a month after the log.
    let last = records.last().expect("a log");
    let (seq, now) = (last.seq, last.time_ms + 30 * 24 * 3_600_000);
    let relists: Vec<EventRecord> = (1..=3_000u64)
        .zip(nodes.values().cycle())
        .map(|(i, node)| EventRecord {
            seq: seq + i,
            time_ms: now + i,
            envelope: Envelope::new(Source::Slurm, now + i, Event::SlurmNode(node.clone())),
        })
        .collect();
    let mut out = Output::default();
    let build = |out: &mut Output| {
        let mut engine = Engine::new(lockstep_testkit::gen::policy(shape));
        for r in &records {
            engine.apply(r, out);
            out.clear();
        }
        engine
    };
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let mut engine = build(&mut out);
    let mut took = Vec::new();
    let mut retried = 0;
    for r in &relists {
        let t = Instant::now();
        engine.apply(r, &mut out);
        took.push(ms(t));
        if took.len() == 1 {
            retried = out.actions.len();
        }
        out.clear();
    }
    drop(engine);
    // The slowest after the first is the scan; measured again on fresh
    // engines brought to the same point.
    let scan_at = (1..took.len())
        .max_by(|&a, &b| took[a].total_cmp(&took[b]))
        .expect("relists after the first");
    let mut scans: Vec<f64> = (0..5)
        .map(|_| {
            let mut engine = build(&mut out);
            for r in &relists[..scan_at] {
                engine.apply(r, &mut out);
                out.clear();
            }
            let t = Instant::now();
            engine.apply(&relists[scan_at], &mut out);
            let t = ms(t);
            out.clear();
            t
        })
        .collect();
    scans.sort_by(f64::total_cmp);
    let first = took[0];
    let mut rest = took[1..].to_vec();
    rest.retain(|&t| t < scans[0] / 2.0);
    rest.sort_by(f64::total_cmp);
    println!(
        "scale-in: {slurm_nodes} idle slurm nodes, all cordoned, {in_flight} actions in flight; a month later the first record retries {retried} actions in {first:.0} ms; the scaling scan (relist {scan_at}, at {} ms past a second) median {:.0} ms of 5 ({:.0}-{:.0}); the {} other relists p50 {:.3} ms, p99 {:.2} ms",
        relists[scan_at].time_ms % 1000,
        scans[2],
        scans[0],
        scans[4],
        rest.len(),
        rest[rest.len() / 2],
        rest[rest.len() * 99 / 100],
    );
}

fn memory(slurm_nodes: usize) {
    let snapshot = scale_engine(slurm_nodes).snapshot();
    // Measure in a fresh process that only restores the snapshot, the way
    // the service starts from a checkpoint: no generator garbage in its heap.
    let path =
        std::env::temp_dir().join(format!("lockstep-memory-{}.snapshot", std::process::id()));
    std::fs::write(&path, &snapshot).expect("write snapshot");
    let status = std::process::Command::new(std::env::current_exe().expect("own path"))
        .arg("restore")
        .arg(&path)
        .status()
        .expect("child runs");
    let _ = std::fs::remove_file(&path);
    assert!(status.success());
}

fn restore(path: &Path) {
    let before = rss_mib();
    // Decoded as it is read, as the service restores its checkpoint: a
    // buffer of the whole snapshot, freed after, counted here before.
    let file = std::fs::File::open(path).expect("open snapshot");
    let engine =
        Engine::restore_from(std::io::BufReader::with_capacity(256 << 10, file)).expect("restores");
    let [s, k, p, j] = engine.sizes();
    println!(
        "memory: engine with {s} slurm nodes, {k} kubernetes nodes, {p} pods, {j} jobs restored from a {:.1} MB snapshot: {:.0} MiB resident ({before:.0} MiB before)",
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) as f64 / 1e6,
        rss_mib(),
    );
}

/// Tells perf, through its control FIFO, to start or stop sampling.
fn perf_ctl(fifo: Option<&Path>, command: &str) {
    if let Some(fifo) = fifo {
        std::fs::write(fifo, format!("{command}\n")).expect("write to perf's control FIFO");
    }
}

fn throughput(slurm_nodes: usize, steady: usize, full: bool, perf: Option<&Path>) {
    let shape = if full {
        Shape {
            slurm_nodes,
            per_kube_node: 4,
            pending_jobs: 90_000,
            scaling_and_topology: true,
        }
    } else {
        Shape::plain(slurm_nodes, 4)
    };
    eprintln!("generating {slurm_nodes} slurm nodes and {steady} steady-state events ...");
    let mut g = Generator::new(shape, 42);
    let bring_up = g.records().len();
    g.steady_state(steady);
    let records = g.into_records();

    let mut engine = Engine::new(Policy::default());
    let mut out = Output::default();
    let t = Instant::now();
    for r in &records[..bring_up] {
        engine.apply(r, &mut out);
        out.clear();
    }
    println!(
        "bring-up: {bring_up} events (the cluster, its pods and queued jobs appearing) applied in {:.3} s",
        t.elapsed().as_secs_f64()
    );
    let (mut actions, mut transitions) = (0usize, 0usize);
    perf_ctl(perf, "enable");
    let t = Instant::now();
    for r in &records[bring_up..] {
        engine.apply(r, &mut out);
        actions += out.actions.len();
        transitions += out.transitions.len();
        out.clear();
    }
    let apply = t.elapsed();
    perf_ctl(perf, "disable");
    println!(
        "apply: {} steady-state events over {slurm_nodes} slurm nodes in {:.3} s = {:.2} M events/s ({actions} actions, {transitions} transitions)",
        records.len() - bring_up,
        apply.as_secs_f64(),
        (records.len() - bring_up) as f64 / apply.as_secs_f64() / 1e6
    );
    if perf.is_some() {
        return;
    }

    let mut w = LogWriter::new(Vec::new(), Format::MessagePack, "bench").unwrap();
    for r in &records {
        w.write(&Record::Event(r.clone())).unwrap();
    }
    let bytes = w.finish().unwrap();
    drop(records);
    // The floor of a replay: decoding the same log and applying nothing.
    // The copy of the log is made before the clock starts, as for replay.
    let data = bytes.clone();
    let t = Instant::now();
    let mut decoded = 0usize;
    for rec in LogReader::msgpack(data).trust_ids() {
        std::hint::black_box(rec.expect("log decodes"));
        decoded += 1;
    }
    let el = t.elapsed();
    println!(
        "decode only: {decoded} records, {:.1} MB MessagePack in {:.3} s = {:.2} M events/s",
        bytes.len() as f64 / 1e6,
        el.as_secs_f64(),
        decoded as f64 / el.as_secs_f64() / 1e6
    );
    // As `lockstep replay` reads a file: decoded on a second thread while
    // the first applies; then on one thread, decoding and applying in turn.
    for (label, verify, ahead) in [
        ("", false, true),
        (" (one thread)", false, false),
        (" (verifying content ids)", true, true),
    ] {
        let data = bytes.clone();
        let t = Instant::now();
        let mut reader = LogReader::msgpack(data);
        if !verify {
            reader = reader.trust_ids();
        }
        let records: Box<dyn Iterator<Item = _>> = if ahead {
            Box::new(read_ahead(reader))
        } else {
            Box::new(reader)
        };
        let mut replay = Replay::new(Engine::new(Policy::default()));
        for rec in records {
            replay
                .feed(&rec.expect("log decodes"))
                .expect("log replays");
        }
        let el = t.elapsed();
        let n = replay.totals().events;
        println!(
            "replay{label}: {n} records, {:.1} MB MessagePack, decode + apply in {:.3} s = {:.2} M events/s",
            bytes.len() as f64 / 1e6,
            el.as_secs_f64(),
            n as f64 / el.as_secs_f64() / 1e6
        );
        assert_eq!(
            replay.engine().hash(),
            engine.hash(),
            "replay reaches the live state"
        );
    }
}
