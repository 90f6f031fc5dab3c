//! Crash soak of `lockstep run`: SIGKILLed at `--kills` seeded points while
//! observations arrive and its Slurm actuator carries out drains and resumes
//! against a real slurmctld, with the log on a real nats-server (or, with
//! `--cluster`, a three-server JetStream cluster, streams with three
//! replicas). After every kill the store it left is checked against a clean
//! replay of the log; at the end a last life catches up and stops, and the
//! whole run is checked (see `testkit/src/soak.rs` for the invariants).
//!
//! ```sh
//! cargo build --release --bin lockstep && cargo build --release -p lockstep-benches --example crash_soak
//! nice -n 10 target/release/examples/crash_soak --kills 1000 --seed 7 > soak.log 2>&1
//! ```
//!
//! Where the kills land, by seeded choice per kill:
//! - `random`: a random time into the life (0 .. `--life-ms`): start-up,
//!   catch-up, steady state;
//! - `checkpoint`: as soon as the log says a checkpoint is being written
//!   (its batch is committed and flushed; the snapshot is being streamed to
//!   a temporary file, synced and renamed over the last one), plus 0-2 ms;
//! - `publish`: as soon as a committed batch that issued actions is logged
//!   (its actions are about to be or being published), plus 0-2 ms;
//! - `handover` (with `--two-replicas`): the leader of two replicas with
//!   leader election on a Lease in a real kube-apiserver
//!   (`deploy/local/kube/up.sh`), while the follower is ready to take over.
//!
//! Prints kills/minute as it goes, and the first violation with its seed and
//! kill number (exit status 1). The process timing is not deterministic; the
//! schedule (trigger and delays per kill) and the observations are.

use std::io::{Read, Seek};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use lockstep_store::{EventLog, StreamLimits};
use lockstep_testkit::gen::Rng;
use lockstep_testkit::soak::{self, Feeder, Instance, Reference, Setup, SlurmForActions};
use lockstep_testkit::{NatsCluster, NatsServer};

/// Kills lockstep over and over at chosen points and checks that nothing
/// is lost or doubled (see the module docs).
#[derive(clap::Parser)]
#[command(name = "crash_soak")]
struct Args {
    /// Kills in all.
    #[arg(long, default_value_t = 100)]
    kills: usize,
    /// Seed of the schedule of kills and of the observations.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The log on a three-server JetStream cluster.
    #[arg(long)]
    cluster: bool,
    /// Two replicas with leader election on a Lease in a real
    /// kube-apiserver: kills also land on the leader while the follower is
    /// ready to take over.
    #[arg(long)]
    two_replicas: bool,
    /// How long an instance lives between kills at random points (at least
    /// 10).
    #[arg(long, default_value_t = 1500, value_name = "MS")]
    life_ms: u64,
    /// Observations published a second.
    #[arg(long, default_value_t = 400, value_name = "EVENTS_PER_S")]
    rate: u64,
}

fn args() -> Args {
    let mut a = <Args as clap::Parser>::parse();
    a.life_ms = a.life_ms.max(10);
    a.rate = a.rate.max(1);
    a
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Trigger {
    Random,
    Checkpoint,
    Publish,
    Handover,
}

/// Follows an instance's `run.log` from where it was.
struct Tail {
    path: PathBuf,
    offset: u64,
}

impl Tail {
    fn new(path: PathBuf) -> Self {
        let offset = std::fs::metadata(&path).map_or(0, |m| m.len());
        Self { path, offset }
    }

    /// Whether a line added since the last call matches.
    fn saw(&mut self, matches: impl Fn(&str) -> bool) -> bool {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return false;
        };
        if f.seek(std::io::SeekFrom::Start(self.offset)).is_err() {
            return false;
        }
        let mut text = String::new();
        let _ = f.read_to_string(&mut text);
        // Only whole lines.
        let Some(end) = text.rfind('\n') else {
            return false;
        };
        self.offset += end as u64 + 1;
        text[..end].lines().any(matches)
    }
}

fn publish_marker(line: &str) -> bool {
    line.contains("batch committed") && !line.contains("actions=0")
}

fn checkpoint_marker(line: &str) -> bool {
    line.contains("writing a checkpoint")
}

fn violation(a: &Args, kill: usize, what: &str, dirs: &[&Instance]) -> ! {
    println!(
        "VIOLATION after kill {kill} (seed {}{}): {what}",
        a.seed,
        if a.cluster { ", --cluster" } else { "" }
    );
    // Exiting runs no destructor: the directories stay for a look.
    for i in dirs {
        println!("  instance directory kept: {}", i.dir.display());
    }
    println!(
        "rerun: target/release/examples/crash_soak --kills {} --seed {}{}{}",
        a.kills,
        a.seed,
        if a.cluster { " --cluster" } else { "" },
        if a.two_replicas {
            " --two-replicas"
        } else {
            ""
        }
    );
    std::process::exit(1);
}

fn main() {
    let a = args();
    let repo = lockstep_testkit::repo();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let mut rng = Rng::new(a.seed);

    // The log.
    let (_single, _cluster, url, replicas) = if a.cluster {
        let c = NatsCluster::start();
        let url = c.url();
        (None, Some(c), url, 3)
    } else {
        let s = NatsServer::start();
        let url = s.url();
        (Some(s), None, url, 1)
    };
    let limits = StreamLimits {
        replicas,
        ..StreamLimits::default()
    };
    let log = rt
        .block_on(EventLog::connect_nats(&url, &limits))
        .expect("the log");

    // Slurm for the actuator; Kubernetes for the Lease.
    let slurm = SlurmForActions::up(&repo, &soak::slurm_node_names(a.seed));
    let kubeconfig = a.two_replicas.then(|| {
        let out = std::process::Command::new(repo.join("deploy/local/kube/up.sh"))
            .env("LOCKSTEP_STATE_DIR", "/tmp/lockstep-local")
            .output()
            .expect("deploy/local/kube/up.sh runs");
        assert!(
            out.status.success(),
            "deploy/local/kube/up.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from("/tmp/lockstep-local/kube/kubeconfig")
    });
    let setup = Setup {
        bin: lockstep_benches::sibling_binary("lockstep"),
        nats_url: url.clone(),
        replicas,
        slurm_conf: Some(slurm.conf.clone()),
        kubeconfig,
        lease: format!("lockstep-soak-{}-{}", a.seed, std::process::id()),
    };
    assert!(
        setup.bin.exists(),
        "{} is missing: cargo build --release --bin lockstep",
        setup.bin.display()
    );
    let mut instances: Vec<Instance> = (0..if a.two_replicas { 2 } else { 1 })
        .map(|i| Instance::new(&setup, &format!("soak-{i}")))
        .collect();

    // Observations for the whole run, and then some.
    let expected_s = a.kills as u64 * (a.life_ms / 2 + 400) / 1000 + 60;
    let n = (a.rate * expected_s).min(2_000_000) as usize;
    eprintln!("generating {n} observations (seed {}) ...", a.seed);
    let feeder = Feeder::start(&url, limits.clone(), soak::observations(a.seed, n), a.rate);

    let mut reference = Reference::default();
    let mut last_checkpoint = vec![0u64; instances.len()];
    let mut by_trigger: std::collections::BTreeMap<Trigger, usize> = Default::default();
    let mut undispatched_kills = 0usize;
    let mut busy_store_kills = 0usize;
    let started = Instant::now();
    println!(
        "crash soak: {} kills, seed {}, log {}, {} instance(s), {} observations/s",
        a.kills,
        a.seed,
        if a.cluster {
            "3-server JetStream cluster (R3)"
        } else {
            "one nats-server"
        },
        instances.len(),
        a.rate
    );
    for inst in instances.iter_mut() {
        inst.start();
    }
    for kill in 1..=a.kills {
        let trigger = match rng.below(10) {
            0..=5 => Trigger::Random,
            6..=7 => Trigger::Checkpoint,
            _ if a.two_replicas && rng.below(2) == 0 => Trigger::Handover,
            _ => Trigger::Publish,
        };
        let delay = Duration::from_millis(rng.below(a.life_ms));
        let victim_pick = rng.below(instances.len() as u64) as usize;
        let extra = Duration::from_micros(rng.below(2_000));
        // Which instance dies: the leader for a hand-over, else a seeded one.
        let victim = if trigger == Trigger::Handover {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some(i) = instances
                    .iter()
                    .position(|i| i.status().is_some_and(|s| s.1))
                {
                    break i;
                }
                if Instant::now() > deadline {
                    violation(&a, kill, "no instance leads within 30 s", &[]);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        } else {
            victim_pick
        };
        let mut tail = Tail::new(instances[victim].dir.join("run.log"));
        let limit = Instant::now() + Duration::from_millis(a.life_ms * 4);
        match trigger {
            Trigger::Random => std::thread::sleep(delay),
            Trigger::Handover => {
                // Let the follower catch up, then kill the leader.
                std::thread::sleep(delay / 2);
            }
            Trigger::Checkpoint | Trigger::Publish => {
                let marker = if trigger == Trigger::Checkpoint {
                    checkpoint_marker
                } else {
                    publish_marker
                };
                while !tail.saw(marker) && Instant::now() < limit {
                    std::thread::sleep(Duration::from_micros(500));
                }
                std::thread::sleep(extra);
            }
        }
        instances[victim].kill();
        *by_trigger.entry(trigger).or_default() += 1;
        let store_dir = instances[victim].dir.join("data/store");
        match rt.block_on(soak::check_store(
            &store_dir,
            &log,
            &mut reference,
            &mut last_checkpoint[victim],
        )) {
            Ok(after) => {
                undispatched_kills += usize::from(after.undispatched > 0);
                if let Some(e) = &after.open_error {
                    busy_store_kills += 1;
                    println!(
                        "kill {kill}: the store opened after {} failed attempts (last: {e})",
                        after.open_retries
                    );
                }
            }
            Err(e) => violation(&a, kill, &e, &[&instances[victim]]),
        }
        instances[victim].start();
        if kill % 25 == 0 || kill == a.kills {
            let minutes = started.elapsed().as_secs_f64() / 60.0;
            println!(
                "kill {kill}/{}: {:.1} kills/min; log head {}; checkpoint seq {:?}; {} observations fed; {} actions executed; kills that left committed actions unpublished: {undispatched_kills}; by trigger {by_trigger:?}",
                a.kills,
                kill as f64 / minutes,
                rt.block_on(log.head()).unwrap_or(0),
                last_checkpoint,
                feeder.count(),
                reference.executed.len(),
            );
        }
    }
    // The end: no more observations; each instance catches up and stops.
    let acked = feeder.stop();
    let head = rt.block_on(log.head()).unwrap();
    for inst in instances.iter_mut() {
        if let Err(e) = inst.wait_applied(head, Duration::from_secs(300)) {
            violation(&a, a.kills, &e, &[inst]);
        }
    }
    // Outcomes of the last actions may still be on their way: let the
    // leader settle, then stop everyone.
    std::thread::sleep(Duration::from_secs(2));
    let head = rt.block_on(log.head()).unwrap();
    for inst in instances.iter_mut() {
        if let Err(e) = inst.wait_applied(head, Duration::from_secs(300)) {
            violation(&a, a.kills, &e, &[inst]);
        }
    }
    for inst in instances.iter_mut() {
        if let Err(e) = inst.stop() {
            violation(&a, a.kills, &e, &[inst]);
        }
    }
    for inst in &instances {
        // Every instance folded the same log: each must end at its head.
        let store = inst.store();
        let head = rt.block_on(log.head()).unwrap();
        let mut r = std::mem::take(&mut reference);
        let res = rt.block_on(soak::check_final(&store, &log, &mut r, &acked));
        reference = r;
        if let Err(e) = res {
            violation(
                &a,
                a.kills,
                &format!("{e} (instance {}, head {head})", inst.dir.display()),
                &[inst],
            );
        }
    }
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    println!(
        "ok: {} kills in {:.1} min ({:.1} kills/min), seed {}; {} records in the log, {} observations fed and all in it once; {} actions issued, {} executed, none twice; kills that left committed actions unpublished: {undispatched_kills}; kills after which the store opened only on a retry: {busy_store_kills}; by trigger {by_trigger:?}",
        a.kills,
        minutes,
        a.kills as f64 / minutes,
        a.seed,
        rt.block_on(log.head()).unwrap(),
        acked.len(),
        reference.issued.len(),
        reference.executed.len(),
    );
}
