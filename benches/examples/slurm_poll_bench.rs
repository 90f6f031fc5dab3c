//! Cost of the Slurm observer against a real slurmrestd with 1,000 and
//! 10,000 nodes, on the Slurm version of `LOCKSTEP_SLURM_VERSION` (22.05,
//! 24.11 or 26.05; default 22.05).
//!
//! ```text
//! LOCKSTEP_SLURM_VERSION=26.05 \
//! cargo run --release -p lockstep-benches --example slurm_poll_bench [SIZES] [ITERATIONS]
//! #   SIZES: comma separated node counts (default 1000,10000)
//! #   LOCKSTEP_BENCH_CPU_S: seconds of each background CPU measurement (30; 0: none)
//! #   LOCKSTEP_BENCH_CPU_ONLY=1: only the daemons' CPU
//! ```
//!
//! For each size it starts a separate Slurm with `deploy/local/slurm/up.sh`
//! (its own state dir and ports, `LOCKSTEP_SLURMD_MAX=0`: the nodes exist in
//! slurm.conf, no slurmd runs), so the test clusters are not disturbed, and
//! stops it (`down.sh --purge`) afterwards. Needs root.
//!
//! Measured, interleaved in the same run:
//!
//! - raw: `GET /nodes`, `/jobs`, `/partitions` with the same HTTP client,
//!   body read, nothing else (what any client pays);
//! - lockstep: one observer poll of the same three lists in full
//!   (`use_update_time = false`): GET, parse, diff against the previous
//!   snapshot, events;
//! - an unchanged poll: the observer's poll with `update_time`, where all
//!   three answers are HTTP 304; this thread's CPU time.
//!
//! - slurmctld's and slurmrestd's own CPU (`/proc/PID/stat`) per unchanged
//!   poll and per full listing (each in a burst of polls, minus the
//!   background rate measured `LOCKSTEP_BENCH_CPU_S` seconds before and
//!   after), and what that makes at a poll every 250 ms and every 1 s.
//!
//! Times are wall clock (median of the iterations) and this thread's CPU
//! time (`/proc/thread-self/schedstat`; the runtime is single-threaded, so
//! all of lockstep's work, HTTP client included, runs on it).
//!
//! `--lanes TRIALS` measures something else on the same Slurm: how long a
//! node drained or resumed with scontrol takes to reach the running
//! observer (nodes through scontrol, jobs and partitions through
//! slurmrestd, a poll every 350 ms) while a queue of `--jobs` held jobs
//! changes every 300 ms, against the observer polling every domain in
//! turn, as it did before nodes had a lane of their own. Two rounds, the
//! order swapped; on two runtime workers, as `lockstep run`.
//! `--jobs-poll-ms MS` adds the running observer with its jobs polled that
//! far apart. Each mode also reports the CPU of the observer, slurmrestd
//! and slurmctld over its trials.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockstep_connectors::slurm::{
    Backend, Observation, Observer, ObserverConfig, RestClient, RestConfig, Scontrol,
    ScontrolConfig, TokenSource,
};
use lockstep_schemas::{Domain, Event, SlurmNodeFlag};
use tokio::sync::mpsc;

/// This thread's CPU time, ns. The kernel updates the figure at scheduling
/// points; yielding first makes it current.
fn thread_cpu_ns() -> u64 {
    std::thread::yield_now();
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// The Slurm version under test.
fn version() -> String {
    std::env::var("LOCKSTEP_SLURM_VERSION").unwrap_or_else(|_| "22.05".to_owned())
}

struct Bench {
    state: PathBuf,
    down: PathBuf,
    env: Vec<(String, String)>,
}

impl Bench {
    fn start(repo: &Path, nodes: usize) -> (Self, RestClient) {
        let state = PathBuf::from(format!("/tmp/lockstep-bench-{nodes}-{}", version()));
        let env: Vec<(String, String)> = [
            ("LOCKSTEP_SLURM_VERSION", version()),
            (
                "LOCKSTEP_SLURM_STATE_DIR",
                state.join("slurm").display().to_string(),
            ),
            ("LOCKSTEP_SLURM_NODES", nodes.to_string()),
            ("LOCKSTEP_SLURMD_MAX", "0".to_owned()),
            ("LOCKSTEP_SLURMCTLD_PORT", "26817".to_owned()),
            ("LOCKSTEP_SLURMD_PORT_BASE", "26830".to_owned()),
            ("LOCKSTEP_SLURMRESTD_PORT", "26820".to_owned()),
            ("LOCKSTEP_SLURM_WAIT", "300".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let b = Self {
            state,
            down: repo.join("deploy/local/slurm/down.sh"),
            env,
        };
        let t = Instant::now();
        let out = Command::new(repo.join("deploy/local/slurm/up.sh"))
            .envs(b.env.iter().map(|(k, v)| (k, v)))
            .env_remove("SLURM_JWT")
            .output()
            .expect("run up.sh");
        assert!(
            out.status.success(),
            "up.sh failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "  slurm {} with {nodes} nodes up in {:.1} s",
            version(),
            t.elapsed().as_secs_f64()
        );
        let mut rc = RestConfig::new(
            "http://127.0.0.1:26820",
            "root",
            TokenSource::File(b.state.join("slurm/token")),
        );
        rc.request_timeout_ms = 120_000;
        (b, RestClient::new(rc).unwrap())
    }
}

impl Bench {
    /// utime + stime of the daemon of pid file `name`, in seconds.
    fn cpu_s(&self, name: &str) -> f64 {
        let pid = std::fs::read_to_string(self.state.join(format!("slurm/run/{name}.pid")))
            .unwrap_or_default();
        proc_cpu_s(pid.trim())
    }
}

/// utime + stime of process `pid` (`self`: this one), in seconds.
fn proc_cpu_s(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which is in parentheses): utime is the
    // 14th field of the line, stime the 15th; in clock ticks (100/s).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    f.get(11)
        .zip(f.get(12))
        .map_or(0.0, |(u, s)| (u + s) as f64 / 100.0)
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ = Command::new(&self.down)
            .arg("--purge")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

async fn run(repo: &Path, nodes: usize, iterations: usize, lanes: Lanes) {
    eprintln!("== Slurm {}, {nodes} nodes", version());
    let (bench, rest) = Bench::start(repo, nodes);
    let v = rest.version().await.unwrap();
    let paths = ["nodes", "jobs", "partitions"].map(|p| format!("/slurm/{v}/{p}"));
    let full = ObserverConfig {
        use_update_time: false,
        resync_every_polls: 0,
        ..ObserverConfig::default()
    };
    let mut obs = Observer::new(Backend::Rest(rest.clone()), full);
    let first = obs.poll().await;
    assert!(obs.visible(), "{first:?}");
    assert_eq!(obs.nodes().len(), nodes);

    // Nodes without slurmd go from UNKNOWN to DOWN after SlurmdTimeout
    // (30 s): let that settle, so slurmctld's own work does not skew the
    // measurement (at most 3 minutes).
    let settle = Instant::now();
    let mut quiet = 0;
    while quiet < 3 && settle.elapsed() < Duration::from_secs(180) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let changed = !obs.poll().await.is_empty();
        let unknown = obs
            .nodes()
            .iter()
            .any(|n| n.state == lockstep_schemas::SlurmBaseState::Unknown);
        let waited = settle.elapsed() > Duration::from_secs(45);
        quiet = if changed || (unknown && !waited) {
            0
        } else {
            quiet + 1
        };
    }
    eprintln!("  settled after {:.0} s", settle.elapsed().as_secs_f64());
    let span_s: u64 = std::env::var("LOCKSTEP_BENCH_CPU_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    if lanes.trials > 0 {
        node_lane(&bench, rest, nodes, lanes).await;
        return;
    }
    if std::env::var("LOCKSTEP_BENCH_CPU_ONLY").is_ok_and(|v| v == "1") {
        daemon_cpu(&bench, &rest, nodes, Duration::from_secs(span_s.max(1))).await;
        return;
    }
    let (mut raw_ms, mut raw_cpu, mut ls_ms, mut ls_cpu) = (vec![], vec![], vec![], vec![]);
    let mut bytes = 0;
    let mut events = 0;
    for i in 0..iterations {
        // Alternate which goes first, so neither always finds slurmrestd warm.
        for lockstep_turn in [i % 2 == 0, i % 2 != 0] {
            let (t, c) = (Instant::now(), thread_cpu_ns());
            if lockstep_turn {
                events += obs.poll().await.len();
                assert!(obs.visible());
                ls_cpu.push((thread_cpu_ns() - c) as f64 / 1e6);
                ls_ms.push(t.elapsed().as_secs_f64() * 1e3);
            } else {
                for p in &paths {
                    let (status, body) = rest.get_raw(p).await.unwrap();
                    assert_eq!(status, 200);
                    bytes += body.len();
                }
                raw_cpu.push((thread_cpu_ns() - c) as f64 / 1e6);
                raw_ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    // Parse alone, on the same answer.
    let (_, body) = rest.get_raw(&paths[0]).await.unwrap();
    let mut parse_ms = Vec::new();
    for _ in 0..20 {
        let c = thread_cpu_ns();
        let l = lockstep_connectors::slurm::parse::nodes(&body).unwrap();
        parse_ms.push((thread_cpu_ns() - c) as f64 / 1e6);
        assert_eq!(l.items.len(), nodes);
    }
    let parse = median(&mut parse_ms);
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (raw_min, ls_min) = (min(&raw_ms), min(&ls_ms));
    let (raw, ls) = (median(&mut raw_ms), median(&mut ls_ms));
    let (rawc, lsc) = (median(&mut raw_cpu), median(&mut ls_cpu));
    println!(
        "{nodes:>6} nodes  full poll ({:.1} MB): raw GET median {raw:7.1} ms (client cpu {rawc:5.1} ms) | lockstep poll+diff median {ls:7.1} ms (cpu {lsc:5.1} ms) | wall ratio {:.3} (of the minima {raw_min:.1} / {ls_min:.1} ms: {:.3}) | lockstep's extra cpu {:.1} ms = {:.1}% of the raw GET (parse alone {parse:.1} ms) [{iterations} iterations each, {events} events after the first listing]",
        bytes as f64 / iterations as f64 / 1e6,
        ls / raw,
        ls_min / raw_min,
        lsc - rawc,
        (lsc - rawc) / raw * 100.0,
    );

    // Unchanged polls: update_time, all three answers 304.
    let mut obs = Observer::new(
        Backend::Rest(rest.clone()),
        ObserverConfig {
            resync_every_polls: 0,
            ..ObserverConfig::default()
        },
    );
    obs.poll().await;
    let (mut cpu, mut wall) = (vec![], vec![]);
    let mut other = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while cpu.len() < 500 && Instant::now() < deadline {
        let (t, c) = (Instant::now(), thread_cpu_ns());
        obs.poll().await;
        let (c, t) = (
            (thread_cpu_ns() - c) as f64 / 1e3,
            t.elapsed().as_secs_f64() * 1e3,
        );
        let s = obs.last_poll();
        if s.unchanged == 3 && !s.failed {
            cpu.push(c);
            wall.push(t);
        } else {
            other += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!cpu.is_empty(), "no unchanged poll in 120 s");
    println!(
        "{nodes:>6} nodes  unchanged poll (3 answers \"unchanged\": 304, or 24.11+'s 200 without jobs): lockstep cpu median {:.0} us, p99 {:.0} us; wall median {:.2} ms  [{} polls; {} other polls had changes]",
        median(&mut cpu),
        pct(&mut cpu, 0.99),
        median(&mut wall),
        cpu.len(),
        other
    );

    if span_s > 0 {
        daemon_cpu(&bench, &rest, nodes, Duration::from_secs(span_s)).await;
    }
}

/// slurmctld's and slurmrestd's own CPU per poll, and what that makes at
/// a poll every 250 ms and every 1 s. slurmctld's background work at this
/// size (thousands of nodes without slurmd) comes in bursts of several % of
/// a core, far more than one poll costs, so each poll kind is timed in a
/// burst of back-to-back polls, and the background rate (measured before and
/// after, `span` each) is subtracted.
async fn daemon_cpu(bench: &Bench, rest: &RestClient, nodes: usize, span: Duration) {
    let cpu = || (bench.cpu_s("slurmctld"), bench.cpu_s("slurmrestd"));
    let background = || async {
        let (t, (c0, r0)) = (Instant::now(), cpu());
        tokio::time::sleep(span).await;
        let (c1, r1) = cpu();
        let secs = t.elapsed().as_secs_f64();
        ((c1 - c0) / secs, (r1 - r0) / secs)
    };
    let before = background().await;

    // Unchanged polls (update_time), back to back.
    let mut obs = Observer::new(
        Backend::Rest(rest.clone()),
        ObserverConfig {
            resync_every_polls: 0,
            ..ObserverConfig::default()
        },
    );
    obs.poll().await;
    let (t, (c0, r0)) = (Instant::now(), cpu());
    let (mut unchanged, mut changed) = (0_u32, 0_u32);
    while unchanged < 1_000 && t.elapsed() < Duration::from_secs(60) {
        obs.poll().await;
        let st = obs.last_poll();
        if st.unchanged == 3 && !st.failed {
            unchanged += 1;
        } else {
            changed += 1;
        }
    }
    let (c1, r1) = cpu();
    let quiet_secs = t.elapsed().as_secs_f64();

    // Full listings (what a poll costs after a change), back to back.
    let mut full = Observer::new(
        Backend::Rest(rest.clone()),
        ObserverConfig {
            use_update_time: false,
            resync_every_polls: 0,
            ..ObserverConfig::default()
        },
    );
    let fulls = 5_u32;
    let (tf, (fc0, fr0)) = (Instant::now(), cpu());
    for _ in 0..fulls {
        full.poll().await;
    }
    let (fc1, fr1) = cpu();
    let full_secs = tf.elapsed().as_secs_f64();
    let after = background().await;

    let (bc, br) = ((before.0 + after.0) / 2.0, (before.1 + after.1) / 2.0);
    let polls = f64::from(unchanged + changed);
    let per_poll = (
        ((c1 - c0) - bc * quiet_secs).max(0.0) / polls * 1e3,
        ((r1 - r0) - br * quiet_secs).max(0.0) / polls * 1e3,
    );
    let per_full = (
        ((fc1 - fc0) - bc * full_secs).max(0.0) / f64::from(fulls) * 1e3,
        ((fr1 - fr0) - br * full_secs).max(0.0) / f64::from(fulls) * 1e3,
    );
    println!(
        "{nodes:>6} nodes  daemons' cpu: background slurmctld {:.2}% / {:.2}% of a core (before / after), slurmrestd {:.2}%; \
         an unchanged poll costs slurmctld {:.3} ms, slurmrestd {:.3} ms ({unchanged} unchanged, {changed} changed polls in {quiet_secs:.1} s); \
         a full listing costs slurmctld {:.0} ms, slurmrestd {:.0} ms ({full_secs:.1} s for {fulls})",
        before.0 * 100.0,
        after.0 * 100.0,
        br * 100.0,
        per_poll.0,
        per_poll.1,
        per_full.0,
        per_full.1,
    );
    for poll_ms in [250_u32, 1_000] {
        let per_s = 1_000.0 / f64::from(poll_ms);
        println!(
            "{nodes:>6} nodes  poll every {poll_ms} ms, nothing changing: slurmctld {:.3}% of a core, slurmrestd {:.3}% (each poll that finds a change adds a full listing)",
            per_poll.0 * per_s / 10.0,
            per_poll.1 * per_s / 10.0,
        );
    }
}

/// Cost of the Slurm observer against a real slurmrestd (see the module
/// docs; `LOCKSTEP_SLURM_VERSION`, `LOCKSTEP_BENCH_CPU_S` and
/// `LOCKSTEP_BENCH_CPU_ONLY` there).
#[derive(clap::Parser)]
#[command(name = "slurm_poll_bench")]
struct Args {
    /// Node counts, comma separated: a Slurm of each size is started in turn.
    #[arg(default_value = "1000,10000", value_parser = sizes)]
    sizes: Sizes,
    /// Repetitions of each measurement (the figures are their medians).
    #[arg(default_value_t = 10)]
    iterations: usize,
    /// Instead of the costs: a running observer (nodes through scontrol,
    /// jobs and partitions through slurmrestd) against one polling every
    /// domain in turn, this many node drains and resumes each, timed from
    /// scontrol's update to the observation, while a queue of `--jobs`
    /// held jobs changes every 300 ms.
    #[arg(long, default_value_t = 0)]
    lanes: usize,
    /// Held jobs queued for `--lanes` (Slurm's MaxJobCount is 10,000).
    #[arg(long, default_value_t = 9_000)]
    jobs: usize,
    /// With `--lanes`, a third observer in the rounds: the running one with
    /// its jobs polled this far apart (`[slurm] jobs_poll_interval_ms`).
    #[arg(long)]
    jobs_poll_ms: Option<u64>,
}

#[derive(Clone)]
struct Sizes(Vec<usize>);

/// `1000,10000`: node counts.
fn sizes(s: &str) -> Result<Sizes, String> {
    s.split(',')
        .map(|n| {
            n.trim()
                .parse()
                .map_err(|e| format!("{n:?} is not a node count: {e}"))
        })
        .collect::<Result<_, _>>()
        .map(Sizes)
}

fn main() {
    let Args {
        sizes: Sizes(sizes),
        iterations,
        lanes,
        jobs,
        jobs_poll_ms,
    } = clap::Parser::parse();
    let repo = lockstep_testkit::repo();
    // `--lanes` runs the observer as `lockstep run` does, on two workers.
    let rt = if lanes > 0 {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
    .unwrap();
    rt.block_on(async {
        for n in sizes {
            run(
                &repo,
                n,
                iterations,
                Lanes {
                    trials: lanes,
                    jobs,
                    jobs_poll_ms,
                },
            )
            .await;
        }
    });
}

/// What `--lanes` measures.
#[derive(Clone, Copy)]
struct Lanes {
    trials: usize,
    jobs: usize,
    jobs_poll_ms: Option<u64>,
}

/// Runs one of this Slurm's client programs; its stdout, or panics.
fn cli(bin: &Path, program: &str, args: &[&str]) -> String {
    let out = Command::new(bin.join(program))
        .args(args)
        .env_remove("SLURM_JWT")
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The observer as it ran before nodes had a lane of their own: every
/// domain in turn at each poll (the reference of `--lanes`).
async fn one_lane(mut obs: Observer, tx: mpsc::Sender<Observation>) {
    let mut took = Duration::ZERO;
    loop {
        tokio::select! {
            () = tx.closed() => return,
            () = tokio::time::sleep(obs.next_delay_after(took)) => {}
        }
        let started = Instant::now();
        for o in obs.poll().await {
            if tx.send(o).await.is_err() {
                return;
            }
        }
        took = started.elapsed();
    }
}

/// `--lanes` (see `Args::lanes`): two rounds, the running observer and the
/// one-lane reference in turn, the order swapped in the second.
async fn node_lane(bench: &Bench, rest: RestClient, nodes: usize, lanes: Lanes) {
    let bin = bench.state.join("slurm/bin");
    let t = Instant::now();
    let mut ids = Vec::with_capacity(lanes.jobs);
    for i in 0..lanes.jobs {
        let out = cli(
            &bin,
            "sbatch",
            &[
                "--parsable",
                "-H",
                "-N1",
                "-o",
                "/dev/null",
                "--wrap",
                "sleep 1000",
            ],
        );
        ids.push(out.trim().split(';').next().unwrap_or_default().to_owned());
        if (i + 1) % 1_000 == 0 {
            eprintln!("  {} held jobs queued", i + 1);
        }
    }
    eprintln!(
        "  {} held jobs queued in {:.0} s",
        ids.len(),
        t.elapsed().as_secs_f64()
    );
    // One job changes every 300 ms, so that every poll of the jobs lists
    // the whole queue, as on a busy cluster.
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (bin, stop) = (bin.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) && !ids.is_empty() {
                let id = &ids[n % ids.len()];
                cli(
                    &bin,
                    "scontrol",
                    &[
                        "update",
                        &format!("jobid={id}"),
                        &format!("comment=bench-{n}"),
                    ],
                );
                n += 1;
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    let scontrol = Scontrol::new(ScontrolConfig {
        program: bin.join("scontrol"),
        ..ScontrolConfig::default()
    });
    let config = ObserverConfig {
        poll_interval_ms: 350,
        ..ObserverConfig::default()
    };
    let spaced = lanes
        .jobs_poll_ms
        .map(|ms| format!("the same, jobs polled every {ms} ms"));
    let mut figures: Vec<(&str, Vec<f64>)> = vec![
        ("running observer, nodes in a lane of their own", vec![]),
        ("every domain in turn (before)", vec![]),
    ];
    if let Some(label) = &spaced {
        figures.push((label, vec![]));
    }
    // Per mode: wall seconds, and CPU seconds of this process (the
    // observer; scontrol's children are not in it), of slurmrestd and of
    // slurmctld.
    let mut cpu = vec![[0.0f64; 4]; figures.len()];
    let sample = || {
        [
            0.0,
            proc_cpu_s("self"),
            bench.cpu_s("slurmrestd"),
            bench.cpu_s("slurmctld"),
        ]
    };
    let mut node = 0;
    let modes = figures.len();
    for round in 0..2 {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..modes).collect()
        } else {
            (0..modes).rev().collect()
        };
        for which in order {
            let config = ObserverConfig {
                jobs_poll_interval_ms: lanes.jobs_poll_ms.filter(|_| which == 2),
                ..config.clone()
            };
            let obs = Observer::new(
                Backend::NodesThroughScontrol(rest.clone(), scontrol.clone()),
                config,
            );
            let (tx, mut rx) = mpsc::channel(4096);
            let task = if which == 1 {
                tokio::spawn(one_lane(obs, tx))
            } else {
                tokio::spawn(obs.run(tx))
            };
            // The first listings of nodes and jobs.
            let mut listed = 0;
            while listed < 2 {
                if let Event::SyncDone {
                    domain: Domain::SlurmNodes | Domain::SlurmJobs,
                } = rx.recv().await.expect("the observer runs").event
                {
                    listed += 1;
                }
            }
            let (started, before) = (Instant::now(), sample());
            for _ in 0..lanes.trials {
                node = node % nodes + 1;
                let name = format!("ls-n{node}");
                for drain in [true, false] {
                    let state = if drain { "state=drain" } else { "state=resume" };
                    let b = bin.clone();
                    let args = [
                        "update".to_owned(),
                        format!("nodename={name}"),
                        state.to_owned(),
                        "reason=bench".to_owned(),
                    ];
                    tokio::task::spawn_blocking(move || {
                        let args: Vec<&str> = args.iter().map(String::as_str).collect();
                        cli(&b, "scontrol", &args)
                    })
                    .await
                    .unwrap();
                    let t = Instant::now();
                    loop {
                        let o = tokio::time::timeout(Duration::from_secs(120), rx.recv())
                            .await
                            .expect("an observation within 120 s")
                            .expect("the observer runs");
                        if let Event::SlurmNode(n) = &o.event {
                            if n.name == name && n.has(&SlurmNodeFlag::Drain) == drain {
                                break;
                            }
                        }
                    }
                    figures[which].1.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
            task.abort();
            let after = sample();
            cpu[which][0] += started.elapsed().as_secs_f64();
            for k in 1..4 {
                cpu[which][k] += after[k] - before[k];
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().expect("the job churn");
    println!(
        "{nodes:>6} nodes, {} held jobs, one changing every 300 ms, poll every 350 ms; Slurm node drained or resumed (scontrol returned) -> observed, {} each:",
        lanes.jobs,
        figures[0].1.len()
    );
    for ((label, mut ms), [wall, own, restd, ctld]) in figures.into_iter().zip(cpu) {
        println!(
            "  {label}: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms; over {wall:.0} s, CPU of a core: the observer {:.1}%, slurmrestd {:.1}%, slurmctld {:.1}%",
            pct(&mut ms, 0.5),
            pct(&mut ms, 0.9),
            pct(&mut ms, 0.99),
            pct(&mut ms, 1.0),
            100.0 * own / wall,
            100.0 * restd / wall,
            100.0 * ctld / wall,
        );
    }
}
