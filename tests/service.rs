//! `lockstep run` as a process, against a real nats-server: killed with
//! SIGKILL at random points while events keep arriving, restarted, and at the
//! end it must be where a clean replay of the same log is, with no action
//! dispatched twice. Also: a damaged checkpoint is rebuilt from the log, and
//! the embedded log works with nothing else running.
//!
//! The crash schedule is seeded: a failure prints the seed; rerun with
//! `LOCKSTEP_CRASH_SEED=<seed> cargo test --test service`. The long run of
//! the same is `benches/examples/crash_soak.rs` (1,000 kills).
//!
//! A log that does not continue what was applied (restored from an older
//! backup, created anew, a hole, retention past every snapshot) stops
//! lockstep, which says why; a new replica starts from the newest snapshot
//! the leader kept beside the log.
//!
//! On a real three-server JetStream cluster (streams with three replicas),
//! with lockstep's Slurm actuator carrying out its drains against a real
//! slurmctld: the stream leader killed, a server frozen past the election
//! timeout, and lockstep started while only one server of three is up.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_engine::{Engine, Output};
use lockstep_schemas::Policy;
use lockstep_store::log::{Error, EVENTS_STREAM};
use lockstep_store::{EventLog, Store, StreamLimits};
use lockstep_testkit::gen::{Generator, Rng, Shape};
use lockstep_testkit::{free_port, soak, temp_dir, NatsCluster, NatsServer};

struct Service {
    dir: PathBuf,
    config: PathBuf,
    port: u16,
    /// Every `lockstep run` started, killed on drop if still running (a
    /// failed test leaves none behind).
    pids: std::cell::RefCell<Vec<u32>>,
}

impl Service {
    fn new(nats: Option<&str>) -> Self {
        let dir = temp_dir("service");
        let port = free_port();
        let nats = nats.map_or(String::new(), |u| format!("nats_url = \"{u}\"\n"));
        let config = dir.join("lockstep.toml");
        std::fs::write(
            &config,
            format!(
                "data_dir = \"data\"\n[log]\n{nats}[service]\nbatch_max = 64\ntick_interval_ms = 300\ncheckpoint_every_records = 150\ncheckpoint_every_ms = 500\n[telemetry]\nlisten = \"127.0.0.1:{port}\"\n"
            ),
        )
        .unwrap();
        Self {
            dir,
            config,
            port,
            pids: Default::default(),
        }
    }

    /// A service on the embedded log whose config names a policy file
    /// (`policy.json`, the default policy), and that file's path.
    fn with_policy_file() -> (Self, PathBuf) {
        let service = Self::new(None);
        let policy = service.dir.join("policy.json");
        std::fs::write(&policy, serde_json::to_string(&Policy::default()).unwrap()).unwrap();
        let cfg = std::fs::read_to_string(&service.config).unwrap();
        std::fs::write(
            &service.config,
            format!("policy_file = \"policy.json\"\n{cfg}"),
        )
        .unwrap();
        (service, policy)
    }

    fn start(&self) -> Child {
        let child = Command::new(env!("CARGO_BIN_EXE_lockstep"))
            .args(["run", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join("run.log"))
                    .unwrap(),
            )
            .spawn()
            .expect("lockstep runs");
        self.pids.borrow_mut().push(child.id());
        child
    }

    fn status(&self) -> Option<(u64, u64)> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        let json = &body[body.find('{')?..];
        let v: serde_json::Value = serde_json::from_str(json.trim()).ok()?;
        Some((v["applied_seq"].as_u64()?, v["head_seq"].as_u64()?))
    }

    /// Waits until the service has applied `head`.
    fn wait_applied(&self, head: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.status().is_some_and(|(applied, _)| applied >= head) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "lockstep did not apply seq {head} within 60 s; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the telemetry endpoint accepts connections: `run` has
    /// started, and listens for SIGTERM.
    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "lockstep did not listen within 30 s; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn terminate(&self, child: &Child) {
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn stop(&self, child: Child) {
        self.terminate(&child);
        self.wait_stopped(child);
    }

    /// Waits for a stop asked for by SIGTERM, which must be graceful.
    fn wait_stopped(&self, mut child: Child) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                assert!(
                    s.success(),
                    "lockstep exited with {s} on SIGTERM; log:\n{}",
                    self.log()
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "lockstep did not stop within 30 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("run.log")).unwrap_or_default()
    }

    /// A telemetry endpoint's answer: (status code, body).
    fn get(&self, path: &str) -> Option<(u16, String)> {
        lockstep_testkit::http_get(self.port, path)
    }

    /// Waits until `/readyz` says lockstep stopped, and returns what it
    /// says.
    fn wait_stopped_for(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((503, body)) = self.get("/readyz") {
                if body.contains("stopped") {
                    assert!(body.contains(what), "{body}");
                    return body;
                }
            }
            assert!(
                Instant::now() < deadline,
                "lockstep did not stop for \"{what}\" within 60 s; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The value of one metric series on `/metrics` (`name{labels}`).
    fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics")?;
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    fn store(&self) -> Store {
        Store::open(&self.dir.join("data/store")).unwrap()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        for pid in self.pids.borrow().iter() {
            // Only a process that is still this test's `lockstep run` (a
            // reaped pid may have been reused).
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let config = self.config.to_string_lossy();
            if String::from_utf8_lossy(&cmdline).contains(config.as_ref()) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The state a clean replay of the whole log reaches, and the actions it issues.
async fn clean_replay(log: &EventLog) -> (String, BTreeSet<String>) {
    let head = log.head().await.unwrap();
    let mut engine = Engine::new(Policy::default());
    let mut out = Output::default();
    let mut ids = BTreeSet::new();
    let mut next = 1;
    while next <= head {
        for rec in log.read(next, 1024, Duration::from_secs(5)).await.unwrap() {
            if rec.seq > head {
                break;
            }
            out.clear();
            engine.apply(&rec, &mut out);
            ids.extend(out.actions.iter().map(|a| a.id.0.clone()));
            next = rec.seq + 1;
        }
    }
    (engine.hash(), ids)
}

fn checkpoint_hash(store: &Store) -> (u64, String) {
    let cp = store
        .checkpoint()
        .unwrap()
        .expect("a checkpoint after a graceful stop");
    (cp.seq, Engine::restore(&cp.snapshot).unwrap().hash())
}

fn events(seed: u64, n: usize) -> Vec<lockstep_schemas::Envelope> {
    let mut g = Generator::new(Shape::plain(40, 4), seed);
    g.steady_state(n);
    // Everything but the generator's own policy record; cordons among them
    // make the reducer issue drains and resumes.
    g.into_records()
        .into_iter()
        .skip(1)
        .map(|r| r.envelope)
        .collect()
}

#[test]
fn kill_minus_9_at_random_points_then_restart_reaches_the_clean_replay_state() {
    let seed = std::env::var("LOCKSTEP_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_u64);
    eprintln!("crash schedule seed: {seed} (rerun with LOCKSTEP_CRASH_SEED={seed})");
    let mut rng = Rng::new(seed);
    let nats = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The NATS client spawns on drop: keep the runtime's context entered.
    let _entered = rt.enter();
    let log = nats_log(&rt, &nats.url());
    let service = Service::new(Some(&nats.url()));
    let all = events(seed, 3_000);
    let mut feed = all.iter();
    const RUNS: usize = 20;
    for run in 0..RUNS {
        let child = service.start();
        // Events keep arriving while it runs; the kill lands anywhere:
        // mid-batch, mid-commit, between commit and publish.
        for e in feed.by_ref().take(all.len() / RUNS) {
            rt.block_on(log.append(e)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(rng.below(400)));
        let mut child = child;
        child.kill().unwrap();
        child.wait().unwrap();
        eprintln!("run {run}: killed");
    }
    for e in feed {
        rt.block_on(log.append(e)).unwrap();
    }
    // The last run catches up and stops gracefully.
    let child = service.start();
    let head = rt.block_on(log.head()).unwrap();
    service.wait_applied(head);
    service.stop(child);
    let head = rt.block_on(log.head()).unwrap();

    let (clean_hash, clean_ids) = rt.block_on(clean_replay(&log));
    let store = service.store();
    let (seq, hash) = checkpoint_hash(&store);
    assert_eq!(
        seq, head,
        "seed {seed}: the final checkpoint is at the head"
    );
    assert_eq!(
        hash, clean_hash,
        "seed {seed}: state differs from a clean replay of the same log"
    );
    let ledger = store.ledger().unwrap();
    let twice: Vec<_> = ledger
        .iter()
        .filter(|e| e.dispatched > 1)
        .map(|e| &e.issued.id)
        .collect();
    assert!(twice.is_empty(), "seed {seed}: dispatched twice: {twice:?}");
    assert!(
        ledger.iter().all(|e| e.dispatched == 1),
        "seed {seed}: an issued action was never dispatched"
    );
    let ledger_ids: BTreeSet<String> = ledger.iter().map(|e| e.issued.id.0.clone()).collect();
    assert!(!clean_ids.is_empty(), "the log makes the reducer act");
    assert_eq!(
        ledger_ids, clean_ids,
        "seed {seed}: the ledger holds exactly the actions a clean replay issues"
    );
    let published = rt.block_on(log.actions()).unwrap();
    let published_ids: Vec<String> = published.iter().map(|a| a.id.0.clone()).collect();
    let unique: BTreeSet<String> = published_ids.iter().cloned().collect();
    assert_eq!(
        unique.len(),
        published_ids.len(),
        "seed {seed}: an action was published twice"
    );
    assert_eq!(unique, clean_ids);

    // The stream itself replays and verifies against the actions published.
    drop(store);
    let replay = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["replay", "--verify", "--quiet", &nats.url()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&replay.stderr);
    assert!(replay.status.success(), "seed {seed}: {stderr}");
    assert!(stderr.contains(&clean_hash), "{stderr}");
    // And the audit index answers without a replay.
    let node = {
        let store = service.store();
        let ledger = store.ledger().unwrap();
        match &ledger[0].issued.action {
            lockstep_schemas::Action::SlurmDrain { node, .. }
            | lockstep_schemas::Action::SlurmResume { node } => node.clone(),
            other => panic!("unexpected action {other:?}"),
        }
    };
    let audit = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["audit", &node, "--config"])
        .arg(&service.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&audit.stdout);
    assert!(audit.status.success());
    assert!(
        text.contains(&format!("audit index of slurm node {node}")),
        "{text}"
    );
    assert!(text.contains("-> draining [drain.cordon]"), "{text}");
}

/// A new leader takes over the actions it finds in flight (folded while it
/// caught up, never published) off its apply loop, and the cordons that
/// arrive as it starts to lead issue actions of their own, which queue
/// behind the take-over: every action is published once, in issue order,
/// and the ledger holds each as dispatched once.
#[test]
fn a_new_leader_publishes_what_it_took_over_and_what_it_issued_meanwhile_once_in_order() {
    let mut g = Generator::new(Shape::plain(6_000, 1), 7);
    let in_flight = g.cordon_all();
    assert!(in_flight >= 6_000, "every cordon drains: {in_flight}");
    // The cordons of the last thousand nodes arrive once it leads.
    leader_publishes_once_in_order(
        g.into_records(),
        1_000,
        "actions of earlier leaderships published",
    );
}

/// A batch that issues more than a page of actions (here a cordon of a
/// Kubernetes node running 1,100 Slurm nodes) is a wave: the leader
/// publishes it off its apply loop, and the actions of what follows come
/// after it (queued behind it while it is published): every action is
/// published once, in issue order.
#[test]
fn a_wave_of_actions_is_published_off_the_loop_and_what_follows_after_it_in_order() {
    let mut g = Generator::new(Shape::plain(2_200, 1_100), 7);
    let in_flight = g.cordon_all();
    assert_eq!(in_flight, 2_200, "every cordon drains its Slurm nodes");
    // The two cordons arrive once it leads.
    leader_publishes_once_in_order(
        g.into_records(),
        2,
        "a wave of actions published off the apply loop",
    );
}

/// Appends `records` but the last `held_back` to a NATS log, starts a
/// leader, appends those once it leads, and waits until it has published
/// everything the log issues; then checks that it said `says`, and that
/// every action was published once, in issue order, and is in the ledger
/// as dispatched once.
fn leader_publishes_once_in_order(
    records: Vec<lockstep_schemas::EventRecord>,
    held_back: usize,
    says: &str,
) {
    let nats = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let log = nats_log(&rt, &nats.url());
    let records: Vec<_> = records.into_iter().map(|r| r.envelope).collect();
    let (first, rest) = records.split_at(records.len() - held_back);
    let append = |envelopes: &[lockstep_schemas::Envelope]| {
        for chunk in envelopes.chunks(512) {
            for a in rt.block_on(futures::future::join_all(
                chunk.iter().map(|e| log.append(e)),
            )) {
                a.unwrap();
            }
        }
    };
    append(first);
    let service = Service::new(Some(&nats.url()));
    let child = service.start();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !service.log().contains("in_flight=") {
        assert!(Instant::now() < deadline, "never led:\n{}", service.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    append(rest);
    let head = rt.block_on(log.head()).unwrap();
    service.wait_applied(head);
    let (_, issued) = rt.block_on(clean_replay(&log));
    // Stopping abandons what is not yet published (the next leader takes
    // it over): wait until all of it is.
    while rt.block_on(log.actions()).unwrap().len() < issued.len() {
        assert!(
            Instant::now() < deadline,
            "not all published:\n{}",
            service.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    service.stop(child);
    // With what its own ticks made it issue since.
    let (_, clean_ids) = rt.block_on(clean_replay(&log));
    assert!(service.log().contains(says), "{}", service.log());
    let ledger = service.store().ledger().unwrap();
    assert!(
        ledger.iter().all(|e| e.dispatched == 1),
        "each action dispatched once"
    );
    let published = rt.block_on(log.actions()).unwrap();
    let ids: BTreeSet<String> = published.iter().map(|a| a.id.0.clone()).collect();
    assert_eq!(ids.len(), published.len(), "an action was published twice");
    assert_eq!(ids, clean_ids);
    assert!(
        published.windows(2).all(|w| w[0].seq <= w[1].seq),
        "published in issue order"
    );
}

#[test]
fn a_damaged_checkpoint_is_rebuilt_from_the_log() {
    let nats = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The NATS client spawns on drop: keep the runtime's context entered.
    let _entered = rt.enter();
    let log = nats_log(&rt, &nats.url());
    let service = Service::new(Some(&nats.url()));
    for e in events(7, 500) {
        rt.block_on(log.append(&e)).unwrap();
    }
    let child = service.start();
    service.wait_applied(rt.block_on(log.head()).unwrap());
    service.stop(child);
    service.store().damage_checkpoint().unwrap();

    let child = service.start();
    let head = rt.block_on(log.head()).unwrap();
    service.wait_applied(head);
    service.stop(child);
    assert!(
        service
            .log()
            .contains("rebuilding from the log instead of starting from bad state"),
        "{}",
        service.log()
    );
    let (_, hash) = checkpoint_hash(&service.store());
    assert_eq!(hash, rt.block_on(clean_replay(&log)).0);
}

#[test]
fn the_embedded_log_needs_nothing_else_and_exports_to_a_replayable_file() {
    let (service, policy) = Service::with_policy_file();
    let child = service.start();
    // The policy is appended by the service itself; with nothing waiting on
    // time, no ticks (every 300 ms they used to come while quiet).
    service.wait_applied(1);
    // A policy change takes effect without restart.
    std::fs::write(&policy, r#"{"health": {"not_ready_grace_s": 5}}"#).unwrap();
    std::thread::sleep(Duration::from_millis(2_000));
    service.stop(child);
    let export = service.dir.join("export.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["export", "--config"])
        .arg(&service.config)
        .arg(&export)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let replay = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["replay", "--verify", "--all-events"])
        .arg(&export)
        .output()
        .unwrap();
    assert!(
        replay.status.success(),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let timeline = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(timeline.matches("policy changed").count(), 2, "{timeline}");
    assert!(
        !timeline.lines().any(|l| l.ends_with(" tick")),
        "a quiet log with no timer due gets no ticks:\n{timeline}"
    );
    let stderr = String::from_utf8_lossy(&replay.stderr);
    let (_, hash) = checkpoint_hash(&service.store());
    assert!(
        stderr.contains(&hash),
        "export replays to the service's state: {stderr} vs {hash}"
    );
    assert!(
        policy_in_force(&service.dir.join("data/store"))
            .health
            .not_ready_grace_s
            == 5
    );
}

#[test]
fn sigterm_while_the_service_starts_stops_it_gracefully() {
    // The store's lock, held here, keeps `lockstep run` opening its store
    // (it waits for it up to 5 s), before its loop runs: the SIGTERM comes
    // then, and used to end the process by the signal.
    let service = Service::new(None);
    let held = service.store();
    let child = service.start();
    service.wait_listening();
    service.terminate(&child);
    drop(held);
    service.wait_stopped(child);
    assert!(
        service.log().contains("shutdown requested"),
        "{}",
        service.log()
    );
}

/// `THP_enabled` of a process (`/proc/PID/status`): whether the kernel may
/// back its memory with transparent huge pages.
fn thp_enabled(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .expect("THP_enabled in /proc/PID/status (Linux 5.0+)")
        .trim()
        .to_owned()
}

#[test]
fn lockstep_run_opts_out_of_transparent_huge_pages_unless_told_otherwise() {
    // With a policy file the service appends `PolicyChanged` at start: once
    // applied, the service runs (and stops gracefully on SIGTERM).
    let (service, policy) = Service::with_policy_file();
    let child = service.start();
    service.wait_applied(1);
    assert_eq!(thp_enabled(child.id()), "0", "{}", service.log());
    service.stop(child);

    // On request, the node's setting applies, as it does to this test.
    let cfg = std::fs::read_to_string(&service.config).unwrap();
    std::fs::write(
        &service.config,
        cfg.replace("[service]\n", "[service]\ntransparent_huge_pages = true\n"),
    )
    .unwrap();
    // A changed policy is appended at start: the second life's own record.
    std::fs::write(&policy, r#"{"health": {"not_ready_grace_s": 5}}"#).unwrap();
    let child = service.start();
    service.wait_applied(2);
    assert_eq!(
        thp_enabled(child.id()),
        thp_enabled(std::process::id()),
        "{}",
        service.log()
    );
    service.stop(child);
}

fn policy_in_force(store: &Path) -> Policy {
    let store = Store::open(store).unwrap();
    let cp = store.checkpoint().unwrap().unwrap();
    Engine::restore(&cp.snapshot).unwrap().policy().clone()
}

fn replicated() -> StreamLimits {
    StreamLimits {
        replicas: 3,
        ..StreamLimits::default()
    }
}

/// lockstep on a three-server cluster (R3 streams), its Slurm actuator on
/// a real slurmctld, observations arriving at 300/s for 10 s; `disrupt`
/// breaks the cluster once lockstep is under way. At the end nothing is
/// lost, nothing applied, published or executed twice, and the state is a
/// clean replay's.
fn on_a_cluster_while_lockstep_acts(disrupt: impl FnOnce(&NatsCluster, &tokio::runtime::Runtime)) {
    const SEED: u64 = 0xc105;
    let cluster = NatsCluster::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let log = rt.block_on(cluster.client(Error::is_retryable, || async {
        EventLog::connect_nats(&cluster.url(), &replicated()).await
    }));
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let slurm = soak::SlurmForActions::up(&repo, &soak::slurm_node_names(SEED));
    let setup = soak::Setup {
        bin: PathBuf::from(env!("CARGO_BIN_EXE_lockstep")),
        nats_url: cluster.url(),
        replicas: 3,
        slurm_conf: Some(slurm.conf),
        kubeconfig: None,
        lease: String::new(),
    };
    let mut lockstep = soak::Instance::new(&setup, "cluster");
    lockstep.start();
    let observations = soak::observations(SEED, 3_000);
    let total = observations.len();
    let feeder = soak::Feeder::start(&cluster.url(), replicated(), observations, 300);
    lockstep
        .wait_applied(500, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));

    disrupt(&cluster, &rt);

    let deadline = Instant::now() + Duration::from_secs(120);
    while feeder.count() < total {
        assert!(
            Instant::now() < deadline,
            "the feeder got {} of {total} appends acknowledged",
            feeder.count()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let acked = feeder.stop();
    // Caught up; then the outcomes of the last actions arrive; caught up again.
    for _ in 0..2 {
        let head = rt.block_on(log.head()).unwrap();
        lockstep
            .wait_applied(head, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("{e}"));
        std::thread::sleep(Duration::from_secs(2));
    }
    lockstep
        .stop()
        .unwrap_or_else(|e| panic!("{e}\n{}", lockstep.log_tail(40)));
    let mut reference = soak::Reference::default();
    rt.block_on(soak::check_final(
        &lockstep.store(),
        &log,
        &mut reference,
        &acked,
    ))
    .unwrap_or_else(|e| panic!("{e}; lockstep's log:\n{}", lockstep.log_tail(40)));
    assert!(
        !reference.executed.is_empty(),
        "lockstep's actuator carried out actions ({} issued)",
        reference.issued.len()
    );
}

#[test]
fn the_stream_leader_killed_while_lockstep_applies_and_acts() {
    on_a_cluster_while_lockstep_acts(|cluster, rt| {
        let leader = rt.block_on(cluster.stream_leader(EVENTS_STREAM, Duration::from_secs(10)));
        cluster.kill(leader);
        let new = rt.block_on(cluster.stream_leader(EVENTS_STREAM, Duration::from_secs(60)));
        assert_ne!(new, leader, "a new leader among the two left");
        // Later it comes back (and must catch up without disturbing anyone).
        std::thread::sleep(Duration::from_secs(2));
        cluster.up(&[leader]);
    });
}

#[test]
fn a_server_cut_off_past_the_election_timeout_while_lockstep_acts() {
    on_a_cluster_while_lockstep_acts(|cluster, rt| {
        let leader = rt.block_on(cluster.stream_leader(EVENTS_STREAM, Duration::from_secs(10)));
        cluster.freeze(leader);
        // JetStream's raft elects after 4 to 9 s without heartbeats.
        std::thread::sleep(Duration::from_secs(12));
        let during = rt.block_on(cluster.stream_leader(EVENTS_STREAM, Duration::from_secs(30)));
        assert_ne!(
            during, leader,
            "the others elected while n{leader} was cut off"
        );
        cluster.thaw(leader);
    });
}

#[test]
fn lockstep_waits_for_a_majority_of_the_cluster_and_says_why() {
    let cluster = NatsCluster::start_only(&[1]);
    let setup = soak::Setup {
        bin: PathBuf::from(env!("CARGO_BIN_EXE_lockstep")),
        nats_url: cluster.url(),
        replicas: 3,
        slurm_conf: None,
        kubeconfig: None,
        lease: String::new(),
    };
    let mut lockstep = soak::Instance::new(&setup, "quorum");
    lockstep.start();
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        if let Some((503, body)) = lockstep.get("/readyz") {
            if body.contains("waiting for the event log") {
                break body;
            }
        }
        assert!(
            lockstep.running(),
            "lockstep gave up: {}",
            lockstep.log_tail(20)
        );
        assert!(
            Instant::now() < deadline,
            "/readyz does not say why it waits: {:?}; log: {}",
            lockstep.get("/readyz"),
            lockstep.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(body.contains("majority"), "{body}");
    assert!(
        lockstep.log().contains("event log unavailable; retrying"),
        "{}",
        lockstep.log()
    );
    // Still waiting a while later, not gone.
    std::thread::sleep(Duration::from_secs(3));
    assert!(lockstep.running());
    assert_eq!(lockstep.get("/readyz").map(|r| r.0), Some(503));

    // Quorum returns: it starts, and applies what arrives.
    cluster.up(&[2, 3]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let log = rt.block_on(cluster.client(Error::is_retryable, || async {
        EventLog::connect_nats(&cluster.url(), &replicated()).await
    }));
    for e in events(3, 200) {
        rt.block_on(log.append(&e)).unwrap();
    }
    let head = rt.block_on(log.head()).unwrap();
    lockstep
        .wait_applied(head, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    // Ready once the loop, idle, finds itself at the log's head: one read
    // after it applied the last record.
    let deadline = Instant::now() + Duration::from_secs(10);
    while lockstep.get("/readyz").map(|r| r.0) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "not ready after applying the log: {:?}; log: {}",
            lockstep.get("/readyz"),
            lockstep.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(lockstep.log().contains("the event log answers; starting"));
    lockstep.stop().unwrap();
}

/// The log on the nats-server at `url`, with default limits, and its
/// events stream (for what lockstep never does to it).
fn connect(
    rt: &tokio::runtime::Runtime,
    url: &str,
) -> (EventLog, async_nats::jetstream::stream::Stream) {
    (nats_log(rt, url), rt.block_on(events_stream(url)))
}

/// The log on the nats-server at `url`, with the default limits.
fn nats_log(rt: &tokio::runtime::Runtime, url: &str) -> EventLog {
    rt.block_on(EventLog::connect_nats(url, &StreamLimits::default()))
        .unwrap()
}

/// The log's stream, for what lockstep never does to it (deleting records).
async fn events_stream(url: &str) -> async_nats::jetstream::stream::Stream {
    let client = async_nats::connect(url).await.unwrap();
    async_nats::jetstream::new(client)
        .get_stream(EVENTS_STREAM)
        .await
        .unwrap()
}

fn append_events(rt: &tokio::runtime::Runtime, log: &EventLog, seed: u64, n: usize) -> u64 {
    let mut head = 0;
    for e in events(seed, n) {
        head = rt.block_on(log.append(&e)).unwrap().seq;
    }
    head
}

/// Copies a directory tree (a nats-server's store, stopped: a backup).
fn copy_tree(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_log_restored_from_an_older_backup_stops_lockstep_and_it_says_why() {
    let mut nats = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let url = nats.url();
    let reconnect = || connect(&rt, &url).0;
    let service = Service::new(Some(&url));
    let backup = service.dir.join("nats-backup");
    let head = append_events(&rt, &reconnect(), 11, 30);
    // The backup, taken with the server stopped.
    nats.stop();
    copy_tree(&nats.dir.join("js"), &backup);
    nats.restart();
    let head = head.max(append_events(&rt, &reconnect(), 12, 30));
    let child = service.start();
    service.wait_applied(head);
    service.stop(child);
    let applied = service.store().log_position().unwrap().unwrap().seq;
    assert_eq!(applied, head);

    // Restored: the log ends before what was applied.
    nats.stop();
    std::fs::remove_dir_all(nats.dir.join("js")).unwrap();
    copy_tree(&backup, &nats.dir.join("js"));
    nats.restart();
    let restored = rt.block_on(reconnect().head()).unwrap();
    assert!(restored < applied, "{restored} < {applied}");
    let child = service.start();
    let why = service.wait_stopped_for("went back");
    assert!(
        why.contains(&format!("last record is seq {restored}"))
            && why.contains(&format!("applied up to seq {applied}")),
        "{why}"
    );
    assert_eq!(
        service.metric("lockstep_log_broken{reason=\"went_back\"}"),
        Some(1.0)
    );
    let (_, status) = service.get("/status").unwrap();
    let status: serde_json::Value = serde_json::from_str(status.trim()).unwrap();
    assert_eq!(status["ready"], false, "{status}");
    assert!(status["stopped"].as_str().unwrap().contains("went back"));
    service.stop(child);
    assert!(
        service
            .log()
            .contains("lockstep stopped: it applies no more records"),
        "{}",
        service.log()
    );

    // The restored log grows past what was applied: other records at the
    // same sequences.
    let grown = append_events(&rt, &reconnect(), 13, 60);
    assert!(grown > applied);
    let child = service.start();
    service.wait_stopped_for(&format!(
        "went back and grew again: seq {applied}, which lockstep applied, now holds another record"
    ));
    service.stop(child);
    assert_eq!(
        service.store().log_position().unwrap().unwrap().seq,
        applied,
        "nothing of the other log was applied"
    );
}

#[test]
fn a_stream_deleted_and_created_again_stops_lockstep_at_start_and_while_it_runs() {
    let mut nats = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let url = nats.url();
    let reconnect = || connect(&rt, &url).0;
    let service = Service::new(Some(&url));
    let head = append_events(&rt, &reconnect(), 21, 20);
    let child = service.start();
    service.wait_applied(head);

    // While it runs: the stream deleted, and created again by a writer.
    rt.block_on(async {
        let client = async_nats::connect(&url).await.unwrap();
        async_nats::jetstream::new(client)
            .delete_stream(EVENTS_STREAM)
            .await
            .unwrap();
    });
    append_events(&rt, &reconnect(), 22, 5);
    service.wait_stopped_for("created anew");
    assert_eq!(
        service.metric("lockstep_log_broken{reason=\"recreated\"}"),
        Some(1.0)
    );
    service.stop(child);

    // At start, on a server whose store was wiped: as many records as
    // before, none of them the ones applied.
    nats.stop();
    std::fs::remove_dir_all(nats.dir.join("js")).unwrap();
    nats.restart();
    append_events(&rt, &reconnect(), 23, 40);
    let child = service.start();
    service.wait_stopped_for("created anew");
    service.stop(child);
    assert_eq!(service.store().log_position().unwrap().unwrap().seq, head);
}

#[test]
fn a_hole_in_the_log_stops_lockstep_before_it() {
    let nats = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let (log, stream) = connect(&rt, &nats.url());
    let service = Service::new(Some(&nats.url()));
    let first = append_events(&rt, &log, 31, 40);
    let child = service.start();
    service.wait_applied(first);
    service.stop(child);

    // A record deleted after the last one applied: it applies up to the
    // hole and stops.
    let head = append_events(&rt, &log, 32, 20);
    let missing = head - 5;
    assert!(rt.block_on(stream.delete_message(missing)).unwrap());
    let child = service.start();
    service.wait_stopped_for(&format!("seq {missing} is missing"));
    assert_eq!(
        service.metric("lockstep_log_broken{reason=\"hole\"}"),
        Some(1.0)
    );
    service.stop(child);
    assert_eq!(
        service.store().log_position().unwrap().unwrap().seq,
        missing - 1
    );
}

/// A service whose leader keeps a snapshot at every checkpoint (500 ms).
fn snapshotting(url: &str) -> Service {
    let service = Service::new(Some(url));
    let cfg = std::fs::read_to_string(&service.config).unwrap();
    std::fs::write(
        &service.config,
        cfg.replace("[service]\n", "[service]\nsnapshot_every_ms = 400\n"),
    )
    .unwrap();
    service
}

#[test]
fn a_new_replica_on_a_log_whose_front_retention_discarded_and_no_snapshot_does_not_act() {
    let nats = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let (log, stream) = connect(&rt, &nats.url());
    append_events(&rt, &log, 41, 60);
    rt.block_on(async { stream.purge().sequence(10).await })
        .unwrap();
    let service = Service::new(Some(&nats.url()));
    let child = service.start();
    let why = service.wait_stopped_for("records 1..=9 were discarded by the event log's retention");
    assert!(
        why.contains("no snapshot starts after them (none is kept)"),
        "{why}"
    );
    assert_eq!(
        service.metric("lockstep_log_broken{reason=\"uncovered\"}"),
        Some(1.0)
    );
    service.stop(child);
}

#[test]
fn a_new_replica_starts_from_the_newest_snapshot_where_retention_discarded_the_log_before_it() {
    let nats = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let (log, stream) = connect(&rt, &nats.url());

    // The leader keeps snapshots beside the log: the newest names the
    // state after its sequence.
    let head = append_events(&rt, &log, 43, 60);
    let leader = snapshotting(&nats.url());
    let child = leader.start();
    leader.wait_applied(head);
    let deadline = Instant::now() + Duration::from_secs(60);
    let snapshot = loop {
        let kept = rt.block_on(log.snapshots()).unwrap();
        if let Some(s) = kept.last().filter(|s| s.seq == head) {
            break s.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no snapshot at seq {head} within 60 s: {kept:?}\n{}",
            leader.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    leader.stop(child);
    let (seq, leader_hash) = checkpoint_hash(&leader.store());
    assert_eq!((seq, &leader_hash), (head, &snapshot.state_hash));

    // More records, then retention passes the snapshot's sequence. A new
    // replica starts from the snapshot and folds the rest.
    let grown = append_events(&rt, &log, 44, 40);
    rt.block_on(async { stream.purge().sequence(head + 1).await })
        .unwrap();
    let replica = Service::new(Some(&nats.url()));
    let child = replica.start();
    replica.wait_applied(grown);
    replica.stop(child);
    assert!(
        replica.log().contains(&format!(
            "starting from the snapshot kept beside the event log seq={head}"
        )),
        "{}",
        replica.log()
    );

    // It reaches the state of the leader, which goes on from its own
    // checkpoint.
    let child = leader.start();
    leader.wait_applied(grown);
    leader.stop(child);
    assert_eq!(
        checkpoint_hash(&replica.store()),
        checkpoint_hash(&leader.store())
    );
    assert!(
        rt.block_on(log.snapshots()).unwrap().len() <= 3,
        "three kept"
    );

    // The commands start from the snapshot too: a replay of the whole log
    // reaches the same state, and so does an incident bundle of its last
    // records, alone.
    let (_, hash) = checkpoint_hash(&leader.store());
    let url = nats.url();
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {stderr}");
        (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
    };
    let (_, whole) = cli(&["replay", &url, "--verify", "--quiet"]);
    assert!(
        whole.contains(&format!("starting from the snapshot of seq {head}"))
            && whole.contains(&hash),
        "{whole}\nnot {hash}"
    );
    let from = (head + 20).to_string();
    let bundle = leader.dir.join("bundle.msgpack");
    let bundle = bundle.to_str().unwrap();
    let (_, exported) = cli(&["export", "--nats", &url, "--from", &from, bundle]);
    assert!(
        exported.contains(&format!("after the state at seq {}", head + 19)),
        "{exported}"
    );
    let (alone, replayed) = cli(&["replay", bundle, "--verify", "--all-events", "--json"]);
    assert!(replayed.contains(&hash), "{replayed}\nnot {hash}");
    let (window, _) = cli(&["replay", &url, "--from", &from, "--all-events", "--json"]);
    assert_eq!(alone, window);
    assert_eq!(alone.lines().count(), (grown - head - 19) as usize);
    // By time: from the first record at or after the time of seq head + 20.
    // (A read hands out what one fetch brought: read until `grown`.)
    let mut records: Vec<lockstep_schemas::EventRecord> = Vec::new();
    while records.last().map_or(head, |r| r.seq) < grown {
        let next = records.last().map_or(head + 1, |r| r.seq + 1);
        let batch = rt
            .block_on(log.read(next, 1000, Duration::from_secs(5)))
            .unwrap();
        assert!(!batch.is_empty(), "the log ends before seq {grown}");
        records.extend(batch);
    }
    let at = records.iter().find(|r| r.seq == head + 20).unwrap().time_ms;
    let first = records.iter().find(|r| r.time_ms >= at).unwrap().seq;
    let since = humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(at))
        .to_string();
    let (by_time, stderr) = cli(&["replay", &url, "--since", &since, "--all-events", "--json"]);
    let (by_seq, _) = cli(&[
        "replay",
        &url,
        "--from",
        &first.to_string(),
        "--all-events",
        "--json",
    ]);
    assert_eq!(by_time, by_seq);
    assert!(
        stderr.contains(&format!("starting from the snapshot of seq {head}")),
        "{stderr}"
    );
}

#[test]
fn limits_that_could_leave_the_log_without_a_snapshot_are_refused() {
    let service = Service::new(Some("nats://127.0.0.1:1"));
    let cfg = std::fs::read_to_string(&service.config).unwrap();
    std::fs::write(
        &service.config,
        cfg.replace("[log]\n", "[log]\nmax_age_s = 3600\n"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["run", "--config"])
        .arg(&service.config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("service.snapshot_every_ms (3600000 ms) must be less than half of log.max_age_s (3600 s)"),
        "{stderr}"
    );
}

#[test]
fn the_embedded_log_and_the_store_drop_history_past_the_horizon_and_keep_what_a_restart_needs() {
    // Three seconds of retention (log and store), a snapshot every 400 ms.
    let service = Service::new(None);
    let cfg = std::fs::read_to_string(&service.config).unwrap();
    std::fs::write(
        &service.config,
        cfg.replace("[log]\n", "[log]\nmax_age_s = 3\n")
            .replace("[service]\n", "[service]\nsnapshot_every_ms = 400\n"),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let log_dir = service.dir.join("data/log");
    std::fs::create_dir_all(&log_dir).unwrap();
    let append = |seed, n| {
        let log = EventLog::open_embedded(&log_dir).unwrap();
        append_events(&rt, &log, seed, n)
    };
    let old = append(51, 50);
    std::thread::sleep(Duration::from_millis(4_500));
    let head = append(52, 50);
    let child = service.start();
    service.wait_applied(head);
    // After the first snapshot, at `head`.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !service.log().lines().any(|l| {
        l.contains("dropped the history before the retention horizon") && !l.contains(" records=0 ")
    }) {
        assert!(Instant::now() < deadline, "{}", service.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    service.stop(child);

    // The first records are older than the horizon: the log discarded
    // them, but none that its oldest snapshot needs; the store dropped
    // what happened before its horizon.
    let log = EventLog::open_embedded(&log_dir).unwrap();
    let state = rt.block_on(log.state()).unwrap();
    let snapshots = rt.block_on(log.snapshots()).unwrap();
    assert!(
        state.first_seq > old && state.first_seq <= snapshots[0].seq + 1,
        "{state:?} {snapshots:?}\n{}",
        service.log()
    );
    assert_eq!(
        rt.block_on(log.read(1, 1, Duration::ZERO)).unwrap()[0].seq,
        state.first_seq
    );
    drop(log);
    let store = service.store();
    let horizon = store.retained_from().unwrap().expect("a horizon");
    assert!(store
        .ledger()
        .unwrap()
        .iter()
        .all(|e| e.issued.time_ms >= horizon));
    // An audit of the store's index says where its history stops.
    let node = "gpu-00001";
    drop(store);
    let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["audit", node, "--config"])
        .arg(&service.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("beyond retention: what happened before") && text.contains("oldest kept: "),
        "{text}"
    );

    // A restart goes on from its checkpoint: the log continues it.
    let grown = append(53, 30);
    let child = service.start();
    service.wait_applied(grown);
    service.stop(child);
    assert!(!service.log().contains("stopped:"), "{}", service.log());

    // A window exported from the embedded log starts from the snapshot
    // it keeps, and replays to the service's state.
    let bundle = service.dir.join("bundle.jsonl");
    let export = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["export", "--config"])
        .arg(&service.config)
        .args(["--from", &(head + 10).to_string()])
        .arg(&bundle)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&export.stderr);
    assert!(export.status.success(), "{stderr}");
    assert!(
        stderr.contains("starting from the snapshot of seq "),
        "{stderr}"
    );
    let replay = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["replay", "--verify", "--quiet"])
        .arg(&bundle)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&replay.stderr);
    assert!(replay.status.success(), "{stderr}");
    let (_, hash) = checkpoint_hash(&service.store());
    assert!(stderr.contains(&hash), "{stderr}\nnot {hash}");
}
