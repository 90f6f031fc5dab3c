//! The crash and fault harness shared by `tests/service.rs` and
//! `benches/examples/crash_soak.rs`: a real `lockstep run` (or two, with leader
//! election) against a real nats-server or JetStream cluster, observations
//! arriving from a feeder all the time, and the reducer's Slurm actions
//! carried out by lockstep's own Slurm actuator against a real slurmctld
//! (`deploy/local/slurm/up.sh`, its own state directory and ports, one Slurm
//! node per synthetic node, no slurmd).
//!
//! The checks, after every kill and at the end:
//! - the checkpoint on disk restores to the state a clean replay of the log
//!   reaches at the checkpoint's sequence (and checkpoints never go back);
//! - no action id is executed twice (one `ActionOutcome` from lockstep's
//!   actuator per id at most), none published twice on the action stream,
//!   none dispatched twice in the ledger, and every one of them is an
//!   action a clean replay issues;
//! - no observation is lost or doubled: every envelope the feeder had
//!   acknowledged is in the log exactly once.
//!
//! It owns no decision of lockstep; it only drives processes and compares.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockstep_engine::{Engine, Output};
use lockstep_schemas::{Envelope, Event, Policy, Source};
use lockstep_store::{EventLog, Store, StreamLimits};

use crate::gen::{Generator, Shape};

/// Synthetic Slurm nodes (one pod each, four per Kubernetes node).
pub const SLURM_NODES: usize = 40;

/// The observations of a seeded synthetic cluster, without the generator's
/// policy record (lockstep runs with its default policy) and without the
/// generator's own action outcomes (lockstep's actuator reports the real
/// ones).
pub fn observations(seed: u64, n: usize) -> Vec<Envelope> {
    let mut g = Generator::new(Shape::plain(SLURM_NODES, 4), seed);
    g.steady_state(n);
    g.into_records()
        .into_iter()
        .skip(1)
        .map(|r| r.envelope)
        .filter(|e| !matches!(e.event, Event::ActionOutcome(_)))
        .collect()
}

/// The Slurm node names of the synthetic cluster.
pub fn slurm_node_names(seed: u64) -> Vec<String> {
    let g = Generator::new(Shape::plain(SLURM_NODES, 4), seed);
    let mut names = BTreeSet::new();
    for r in g.records() {
        if let Event::SlurmNode(n) = &r.envelope.event {
            names.insert(n.name.to_string());
        }
    }
    names.into_iter().collect()
}

/// A real slurmctld that knows the synthetic nodes, for lockstep's Slurm
/// actuator to act on (`scontrol update ... state=drain|resume`). Left
/// running for the next user (up.sh is idempotent); `scripts/test.sh`
/// stops it.
pub struct SlurmForActions {
    /// Its `slurm.conf`.
    pub conf: PathBuf,
}

/// State directory of that Slurm.
pub const SOAK_SLURM_STATE: &str = "/tmp/lockstep-soak-slurm";

impl SlurmForActions {
    /// Starts it (or finds it running).
    pub fn up(repo: &Path, nodes: &[String]) -> Self {
        let out = Command::new(repo.join("deploy/local/slurm/up.sh"))
            .env("LOCKSTEP_SLURM_STATE_DIR", SOAK_SLURM_STATE)
            .env("LOCKSTEP_SLURM_NODES", nodes.join(","))
            .env("LOCKSTEP_SLURMD_MAX", "0")
            // Away from the test suite's Slurm and the reaction bench's.
            .env("LOCKSTEP_SLURMCTLD_PORT", "16967")
            .env("LOCKSTEP_SLURMRESTD_PORT", "6925")
            .env("LOCKSTEP_SLURMD_PORT_BASE", "17100")
            .stdin(Stdio::null())
            .output()
            .expect("deploy/local/slurm/up.sh runs");
        assert!(
            out.status.success(),
            "deploy/local/slurm/up.sh failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            conf: PathBuf::from(SOAK_SLURM_STATE).join("slurm.conf"),
        }
    }
}

/// One `lockstep run` instance: its directory, config and process.
pub struct Instance {
    /// Its directory (config, data, `run.log`).
    pub dir: PathBuf,
    /// Its config file.
    pub config: PathBuf,
    /// Telemetry port.
    pub port: u16,
    bin: PathBuf,
    child: Option<Child>,
}

/// How the instances are configured.
#[derive(Clone)]
pub struct Setup {
    /// The `lockstep` binary.
    pub bin: PathBuf,
    /// `[log] nats_url`.
    pub nats_url: String,
    /// `[log] replicas`.
    pub replicas: usize,
    /// The slurm.conf of the Slurm the actuator acts on.
    pub slurm_conf: Option<PathBuf>,
    /// `[leader_election]` with this kubeconfig (two replicas).
    pub kubeconfig: Option<PathBuf>,
    /// The Lease name (one per run).
    pub lease: String,
}

impl Instance {
    /// Writes the config of a new instance in a new directory.
    pub fn new(setup: &Setup, name: &str) -> Self {
        let dir = crate::temp_dir(name);
        let port = crate::free_port();
        let slurm = setup.slurm_conf.as_ref().map_or(String::new(), |conf| {
            format!(
                "[slurm]\nobserve = false\nactuate = true\nslurm_conf = \"{}\"\n",
                conf.display()
            )
        });
        let election = setup.kubeconfig.as_ref().map_or(String::new(), |k| {
            format!(
                "[kubernetes]\nkubeconfig = \"{}\"\nobserve = false\nactuate = false\n[leader_election]\nnamespace = \"default\"\nlease_name = \"{}\"\nidentity = \"{name}\"\nlease_duration_ms = 3000\nrenew_deadline_ms = 2000\nretry_period_ms = 500\n",
                k.display(),
                setup.lease
            )
        });
        let config = dir.join("lockstep.toml");
        std::fs::write(
            &config,
            format!(
                "data_dir = \"data\"\n[log]\nnats_url = \"{}\"\nreplicas = {}\n[service]\nbatch_max = 64\nread_wait_ms = 100\ntick_interval_ms = 300\ncheckpoint_every_records = 100\ncheckpoint_every_ms = 300\nretry_backoff_max_ms = 1000\n[telemetry]\nlisten = \"127.0.0.1:{port}\"\n{slurm}{election}",
                setup.nats_url, setup.replicas
            ),
        )
        .unwrap();
        Self {
            dir,
            config,
            port,
            bin: setup.bin.clone(),
            child: None,
        }
    }

    /// Starts `lockstep run` (appending to `run.log`).
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("run.log"))
            .unwrap();
        let child = Command::new(&self.bin)
            .args(["run", "--config"])
            .arg(&self.config)
            // Debug for the telemetry events: "batch committed" lines mark
            // the moment between a batch's commit and its publication.
            .env("RUST_LOG", "info,lockstep::telemetry=debug")
            .env("NO_COLOR", "1")
            .env_remove("SLURM_JWT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", self.bin.display()));
        self.child = Some(child);
    }

    /// Whether the process is running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and the exit status must be success.
    pub fn stop(&mut self) -> Result<(), String> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return if s.success() {
                    Ok(())
                } else {
                    Err(format!("lockstep exited with {s} on SIGTERM"))
                };
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                return Err("lockstep did not stop within 60 s of SIGTERM".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// An HTTP GET on the telemetry endpoint: status code and body.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        crate::http_get(self.port, path)
    }

    /// `/status`: (ready, leader, applied_seq).
    pub fn status(&self) -> Option<(bool, bool, u64)> {
        let (_, body) = self.get("/status")?;
        let v: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
        Some((
            v["ready"].as_bool()?,
            v["leader"].as_bool()?,
            v["applied_seq"].as_u64()?,
        ))
    }

    /// Waits until it has applied `seq`.
    pub fn wait_applied(&mut self, seq: u64, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if self.status().is_some_and(|(_, _, applied)| applied >= seq) {
                return Ok(());
            }
            if !self.running() {
                return Err(format!(
                    "lockstep exited before applying seq {seq}; log tail:\n{}",
                    self.log_tail(30)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "lockstep did not apply seq {seq} within {limit:?} (status {:?}); log tail:\n{}",
                    self.status(),
                    self.log_tail(30)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("run.log")).unwrap_or_default()
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Its store (the process must not run: sled locks it).
    pub fn store(&self) -> Store {
        Store::open(&self.dir.join("data/store")).unwrap()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill();
        // LOCKSTEP_SOAK_KEEP=1 keeps the directories (config, data, run.log).
        if !std::thread::panicking() && std::env::var_os("LOCKSTEP_SOAK_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Appends observations from its own thread and client, at a steady rate,
/// retrying while the log is unavailable (a server down, an election):
/// the same envelope again, which deduplication keeps one record.
pub struct Feeder {
    stop: Arc<AtomicBool>,
    /// Ids of the envelopes whose append was acknowledged.
    pub acked: Arc<Mutex<Vec<lockstep_schemas::EventId>>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Feeder {
    /// Starts appending `events` to the log at `url`, `per_s` a second.
    pub fn start(url: &str, limits: StreamLimits, events: Vec<Envelope>, per_s: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let url = url.to_owned();
        let handle = {
            let (stop, acked) = (stop.clone(), acked.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Runtime::new().unwrap();
                rt.block_on(async move {
                    let log = loop {
                        match EventLog::connect_nats(&url, &limits).await {
                            Ok(l) => break l,
                            Err(_) if !stop.load(Ordering::Relaxed) => {
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                            Err(_) => return,
                        }
                    };
                    let pause = Duration::from_micros(1_000_000 / per_s.max(1));
                    for e in events {
                        loop {
                            if stop.load(Ordering::Relaxed) {
                                return;
                            }
                            match log.append(&e).await {
                                Ok(_) => break,
                                Err(err) if err.is_retryable() => {
                                    tokio::time::sleep(Duration::from_millis(100)).await;
                                }
                                Err(err) => panic!("feeder: {err}"),
                            }
                        }
                        acked.lock().unwrap().push(e.id.clone());
                        tokio::time::sleep(pause).await;
                    }
                });
            })
        };
        Self {
            stop,
            acked,
            handle: Some(handle),
        }
    }

    /// How many appends were acknowledged.
    pub fn count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Stops it (an append in flight is finished or abandoned) and returns
    /// the acknowledged ids.
    pub fn stop(mut self) -> Vec<lockstep_schemas::EventId> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            h.join().expect("the feeder does not panic");
        }
        std::mem::take(&mut *self.acked.lock().unwrap())
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// A clean replay of the log, folded forward as far as asked, with what
/// the checks need: where each envelope id sits, what the reducer issued,
/// and how many outcomes lockstep's actuator reported per action id.
pub struct Reference {
    engine: Engine,
    out: Output,
    /// Next sequence to fold.
    pub next: u64,
    /// Sequence of each envelope id seen.
    pub seen: HashMap<lockstep_schemas::EventId, u64>,
    /// Every action id the reducer issued.
    pub issued: BTreeSet<String>,
    /// Outcomes lockstep's actuator reported, per action id.
    pub executed: BTreeMap<String, u32>,
    /// State hashes at the sequences asked for so far.
    hashes: BTreeMap<u64, String>,
}

impl Default for Reference {
    fn default() -> Self {
        Self {
            engine: Engine::new(Policy::default()),
            out: Output::default(),
            next: 1,
            seen: HashMap::new(),
            issued: BTreeSet::new(),
            executed: BTreeMap::new(),
            hashes: BTreeMap::new(),
        }
    }
}

impl Reference {
    /// Folds the log up to `seq` (inclusive).
    pub async fn advance(&mut self, log: &EventLog, seq: u64) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.next <= seq {
            if Instant::now() > deadline {
                return Err(format!("reading the log stalled at seq {}", self.next));
            }
            let batch = match log.read(self.next, 1024, Duration::from_secs(2)).await {
                Ok(b) => b,
                Err(e) if e.is_retryable() => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => return Err(format!("reading the log: {e}")),
            };
            for rec in batch {
                if rec.seq > seq {
                    break;
                }
                if rec.seq != self.next {
                    return Err(format!(
                        "the log skipped from seq {} to {}",
                        self.next, rec.seq
                    ));
                }
                if let Some(first) = self.seen.insert(rec.envelope.id.clone(), rec.seq) {
                    return Err(format!(
                        "envelope {} is in the log twice: seq {first} and {}",
                        rec.envelope.id.0, rec.seq
                    ));
                }
                if let (Source::Actuator, Event::ActionOutcome(o)) =
                    (rec.envelope.source, &rec.envelope.event)
                {
                    let n = self.executed.entry(o.action_id.0.clone()).or_default();
                    *n += 1;
                    if *n > 1 {
                        return Err(format!(
                            "action {} was executed {n} times (outcome at seq {})",
                            o.action_id.0, rec.seq
                        ));
                    }
                }
                self.out.clear();
                self.engine.apply(&rec, &mut self.out);
                self.issued
                    .extend(self.out.actions.iter().map(|a| a.id.0.clone()));
                self.next = rec.seq + 1;
            }
        }
        Ok(())
    }

    /// The state hash after the last record folded.
    pub fn hash(&self) -> String {
        self.engine.hash()
    }

    /// The clean replay's state hash right after `seq`: folded forward to
    /// it, or, for a sequence already passed (two instances' checkpoints
    /// interleave), from the hashes remembered at earlier checkpoints.
    pub async fn hash_at(&mut self, log: &EventLog, seq: u64) -> Result<String, String> {
        if seq + 1 >= self.next {
            self.advance(log, seq).await?;
            let h = self.hash();
            self.hashes.insert(seq, h.clone());
            return Ok(h);
        }
        if let Some(h) = self.hashes.get(&seq) {
            return Ok(h.clone());
        }
        // A sequence passed without a hash taken: replay from the start.
        let mut fresh = Reference::default();
        fresh.advance(log, seq).await?;
        let h = fresh.hash();
        self.hashes.insert(seq, h.clone());
        Ok(h)
    }
}

/// What a dead instance left on disk, checked against the reference.
#[derive(Debug, Default, Clone)]
pub struct AfterKill {
    /// The checkpoint's sequence (0: none yet).
    pub checkpoint_seq: u64,
    /// Actions committed in the ledger but not marked published: the kill
    /// fell between a batch's commit and the end of its publication.
    pub undispatched: usize,
    /// Failed attempts to open the store before it opened.
    pub open_retries: u32,
    /// The last of those failures.
    pub open_error: Option<String>,
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// Checks the store of a dead instance: its checkpoint restores to the
/// clean replay's state at the same sequence, checkpoints never go back,
/// and nothing in its ledger was dispatched twice.
pub async fn check_store(
    store_dir: &Path,
    log: &EventLog,
    reference: &mut Reference,
    last_checkpoint: &mut u64,
) -> Result<AfterKill, String> {
    let mut after = AfterKill::default();
    // The dead process's file lock may outlive it for a moment (a child
    // forked for scontrol that had not yet exec'd holds the descriptor): a
    // failure to open is retried for 5 s, and counted; one that lasts is a
    // violation (the next life could not start either).
    let deadline = Instant::now() + Duration::from_secs(5);
    let store = loop {
        match Store::open(store_dir) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                after.open_retries += 1;
                after.open_error = Some(error_chain(&e));
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("opening the store: {}", error_chain(&e))),
        }
    };
    if let Some(cp) = store
        .checkpoint()
        .map_err(|e| format!("reading the checkpoint: {e}"))?
    {
        if cp.seq < *last_checkpoint {
            return Err(format!(
                "the checkpoint went back from seq {last_checkpoint} to {}",
                cp.seq
            ));
        }
        *last_checkpoint = cp.seq;
        let hash = reference.hash_at(log, cp.seq).await?;
        let restored = Engine::restore(&cp.snapshot)
            .map_err(|e| format!("the checkpoint at seq {} does not restore: {e}", cp.seq))?;
        if restored.hash() != hash {
            return Err(format!(
                "the checkpoint at seq {} has state {} but a clean replay to it has {hash}",
                cp.seq,
                restored.hash(),
            ));
        }
        after.checkpoint_seq = cp.seq;
    }
    let ledger = store
        .ledger()
        .map_err(|e| format!("reading the ledger: {e}"))?;
    if let Some(e) = ledger.iter().find(|e| e.dispatched > 1) {
        return Err(format!(
            "action {} was dispatched {} times",
            e.issued.id.0, e.dispatched
        ));
    }
    after.undispatched = ledger
        .iter()
        .filter(|e| e.dispatched == 0 && e.outcome.is_none())
        .count();
    Ok(after)
}

/// The end: every acknowledged observation in the log once, the final
/// checkpoint at the head with the clean replay's state, ledger and action
/// stream holding only what a clean replay issues, each id once.
pub async fn check_final(
    store: &Store,
    log: &EventLog,
    reference: &mut Reference,
    acked: &[lockstep_schemas::EventId],
) -> Result<(), String> {
    let head = log.head().await.map_err(|e| e.to_string())?;
    reference.advance(log, head).await?;
    let cp = store
        .checkpoint()
        .map_err(|e| e.to_string())?
        .ok_or("no checkpoint after a graceful stop")?;
    if cp.seq != head {
        return Err(format!(
            "the final checkpoint is at seq {}, the log's head at {head}",
            cp.seq
        ));
    }
    let hash = Engine::restore(&cp.snapshot)
        .map_err(|e| e.to_string())?
        .hash();
    if hash != reference.hash() {
        return Err(format!(
            "final state {hash} differs from a clean replay of the log: {}",
            reference.hash()
        ));
    }
    if let Some(lost) = acked.iter().find(|id| !reference.seen.contains_key(*id)) {
        return Err(format!(
            "observation {} was acknowledged but is not in the log",
            lost.0
        ));
    }
    let ledger = store.ledger().map_err(|e| e.to_string())?;
    for e in &ledger {
        if e.dispatched > 1 {
            return Err(format!(
                "action {} dispatched {} times",
                e.issued.id.0, e.dispatched
            ));
        }
        if !reference.issued.contains(&e.issued.id.0) {
            return Err(format!(
                "the ledger holds action {} that a clean replay does not issue",
                e.issued.id.0
            ));
        }
    }
    let published = log.actions().await.map_err(|e| e.to_string())?;
    let mut once = BTreeSet::new();
    for a in &published {
        if !once.insert(a.id.0.clone()) {
            return Err(format!("action {} was published twice", a.id.0));
        }
        if !reference.issued.contains(&a.id.0) {
            return Err(format!(
                "action {} was published but a clean replay does not issue it",
                a.id.0
            ));
        }
    }
    if let Some((id, _)) = reference
        .executed
        .iter()
        .find(|(id, _)| !once.contains(*id))
    {
        return Err(format!("action {id} was executed but never published"));
    }
    Ok(())
}
