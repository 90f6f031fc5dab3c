//! The Slurm connector against real Slurm: 22.05 (the machine's own
//! packages, slurmrestd v0.0.38, node writes through scontrol), 24.11
//! (Debian 13 root, v0.0.42, writes through REST) and 26.05 (Debian
//! unstable root, v0.0.45, writes through REST, topology/block). Each
//! version's cluster is started by `deploy/local/slurm/up.sh` with
//! `LOCKSTEP_SLURM_VERSION` from this test process. These tests never skip:
//! without Slurm (or root to start it) they fail.
//!
//! Every scenario is a function of the cluster; the `on!` lines at the end
//! say which versions run it (test names end in `v22_05`, `v24_11`, `v26_05`,
//! so `cargo test --test slurm v26_05` runs one version).
//!
//! Tests share one cluster per version. Each test that changes a node owns
//! that node for its duration through the node's lock (ls-n1 the actuator,
//! ls-n2 the admin drain and the topology, ls-n3 jobs and `update_time`,
//! ls-n4 the stopped slurmd). Tests that stop a daemon everyone uses
//! (slurmctld, slurmrestd) take the cluster lock exclusively; the others
//! take it shared. Every test puts its node back as it found it, also when
//! it fails (guards restore in `Drop`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use lockstep_connectors::slurm::{
    Actuator, ActuatorConfig, Backend, BeforeWrite, Fetch, NodeSession, Observation, Observer,
    ObserverConfig, RestClient, RestConfig, Scontrol, ScontrolConfig, TokenSource, RESUMED_REASON,
};
use lockstep_engine::{Engine, Output, Phase};
use lockstep_schemas::{
    Action, ActionId, Domain, Envelope, Event, EventId, EventRecord, IssuedAction, OutcomeResult,
    Policy, ReasonOwnership, SlurmBaseState, SlurmJobState, SlurmNode, SlurmNodeFlag, Source,
};
use tokio::sync::{Mutex, MutexGuard, Notify, RwLock, RwLockReadGuard, RwLockWriteGuard};

// ------------------------------------------------------------------ cluster

/// The Slurm versions `deploy/local/slurm/up.sh` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum V {
    V22_05,
    V24_11,
    V26_05,
}

impl V {
    fn name(self) -> &'static str {
        match self {
            V::V22_05 => "22.05",
            V::V24_11 => "24.11",
            V::V26_05 => "26.05",
        }
    }

    /// The openapi version lockstep picks on it: the newest both speak.
    fn api(self) -> &'static str {
        match self {
            V::V22_05 => "v0.0.38",
            V::V24_11 => "v0.0.42",
            V::V26_05 => "v0.0.45",
        }
    }
}

const NODES: [&str; 4] = ["ls-n1", "ls-n2", "ls-n3", "ls-n4"];

/// One version's cluster, from the `export` lines up.sh prints.
struct Cluster {
    v: V,
    conf: PathBuf,
    url: String,
    user: String,
    token_file: PathBuf,
    state: PathBuf,
    /// up.sh's wrappers of this version's client programs.
    bin: PathBuf,
    /// Shared by tests that change only their own node; exclusive for tests
    /// that stop slurmctld or slurmrestd.
    lock: RwLock<()>,
    /// One per node in [`NODES`]: held by the test that changes that node.
    node_locks: [Mutex<()>; 4],
}

static CLUSTERS: [OnceLock<Cluster>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Runs `deploy/local/slurm/up.sh` for `v` (starts what is missing) and
/// returns what it printed.
fn up_sh(v: V) -> BTreeMap<String, String> {
    let up = repo().join("deploy/local/slurm/up.sh");
    let out = Command::new(&up)
        .env("LOCKSTEP_SLURM_VERSION", v.name())
        .env_remove("SLURM_JWT")
        .env_remove("LOCKSTEP_SLURM_STATE_DIR")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", up.display()));
    assert!(
        out.status.success(),
        "{} for Slurm {} failed ({}); a real Slurm is required for these tests:\n{}",
        up.display(),
        v.name(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn cluster(v: V) -> &'static Cluster {
    CLUSTERS[v as usize].get_or_init(|| {
        let env = up_sh(v);
        let get = |k: &str| {
            env.get(k)
                .unwrap_or_else(|| panic!("up.sh printed no {k}"))
                .clone()
        };
        assert_eq!(get("LOCKSTEP_SLURM_VERSION"), v.name());
        let conf = PathBuf::from(get("SLURM_CONF"));
        Cluster {
            v,
            state: conf.parent().unwrap().to_owned(),
            conf,
            url: get("SLURMRESTD_URL"),
            user: get("SLURM_JWT_USER"),
            token_file: PathBuf::from(get("SLURM_JWT_FILE")),
            bin: PathBuf::from(get("LOCKSTEP_SLURM_BIN")),
            lock: RwLock::const_new(()),
            node_locks: [
                Mutex::const_new(()),
                Mutex::const_new(()),
                Mutex::const_new(()),
                Mutex::const_new(()),
            ],
        }
    })
}

/// What a test holds while it runs: the cluster lock (shared), the lock of
/// the node it changes, and that node's restore guard (dropped first, so
/// the node is back before the locks go).
struct Owned {
    _restore: RestoreNode,
    _node: MutexGuard<'static, ()>,
    _cluster: RwLockReadGuard<'static, ()>,
}

impl Cluster {
    /// Takes the cluster shared and `node` for this test, and puts the node
    /// back in service now and when the test ends.
    async fn own(&'static self, node: &'static str) -> Owned {
        let cluster = self.lock.read().await;
        let i = NODES.iter().position(|n| *n == node).expect("a test node");
        let node_guard = self.node_locks[i].lock().await;
        self.restore(node);
        Owned {
            _restore: RestoreNode(self, node),
            _node: node_guard,
            _cluster: cluster,
        }
    }

    /// Takes the whole cluster (no other test of this version runs).
    async fn exclusive(&'static self) -> RwLockWriteGuard<'static, ()> {
        self.lock.write().await
    }

    /// Runs one of this cluster's client programs (up.sh's wrapper, so the
    /// right version and SLURM_CONF); stdout, or panics.
    fn cli(&self, program: &str, args: &[&str]) -> String {
        let out = self.try_cli(program, args);
        out.unwrap_or_else(|e| panic!("{program} {}: {e}", args.join(" ")))
    }

    fn try_cli(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let out = Command::new(self.bin.join(program))
            .args(args)
            .env_remove("SLURM_JWT")
            .current_dir(self.state.join("jobs"))
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Runs up.sh again (starts what is missing).
    fn up(&self) {
        up_sh(self.v);
    }

    /// `scontrol show node NODE -o`, parsed.
    fn node(&self, node: &str) -> SlurmNode {
        let line = self.cli("scontrol", &["--oneliner", "show", "node", node]);
        lockstep_connectors::slurm::scontrol::parse_nodes(&line)
            .unwrap()
            .pop()
            .unwrap()
    }

    fn pid(&self, name: &str) -> i32 {
        let f = self.state.join("run").join(format!("{name}.pid"));
        std::fs::read_to_string(&f)
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
            .trim()
            .parse()
            .unwrap()
    }

    /// SIGTERMs the daemon of pid file `name` and waits until it is gone.
    fn stop(&self, name: &str) {
        let pid = self.pid(name);
        let st = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(st.success(), "kill {name} ({pid})");
        let t = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{name} ({pid}) did not stop"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// slurmctld's log from byte `from` on.
    fn ctld_log_since(&self, from: u64) -> String {
        let text = std::fs::read(self.state.join("log/slurmctld.log")).unwrap_or_default();
        let from = usize::try_from(from).unwrap_or(usize::MAX).min(text.len());
        String::from_utf8_lossy(&text[from..]).into_owned()
    }

    /// Where slurmctld's log ends now.
    fn ctld_log_len(&self) -> u64 {
        std::fs::metadata(self.state.join("log/slurmctld.log")).map_or(0, |m| m.len())
    }

    /// Whether slurmctld put `node` back in service by itself since log
    /// offset `from`: with `ReturnToService=2` a node set DOWN whose slurmd
    /// still answers is back at the next ping (every SlurmdTimeout/3 s), and
    /// slurmctld logs `node_did_resp: node N returned to service`.
    fn returned_to_service_since(&self, node: &str, from: u64) -> bool {
        self.ctld_log_since(from)
            .contains(&format!("node {node} returned to service"))
    }

    fn rest(&self) -> RestClient {
        RestClient::new(RestConfig::new(
            self.url.clone(),
            self.user.clone(),
            TokenSource::File(self.token_file.clone()),
        ))
        .unwrap()
    }

    fn scontrol(&self) -> Scontrol {
        Scontrol::new(ScontrolConfig {
            program: self.bin.join("scontrol"),
            slurm_conf: Some(self.conf.clone()),
            ..ScontrolConfig::default()
        })
    }

    /// Resumes `node` if it is drained or down, and waits until it is in
    /// service again (a resumed node shows NOT_RESPONDING until the next
    /// ping).
    fn restore(&self, node: &str) {
        let n = self.node(node);
        if n.has(&SlurmNodeFlag::Drain) || n.state == SlurmBaseState::Down {
            // A failure here is fine if Slurm resumed it meanwhile.
            let _ = self.try_cli(
                "scontrol",
                &["update", &format!("nodename={node}"), "state=resume"],
            );
        }
        if !n.features.is_empty() {
            let _ = self.try_cli(
                "scontrol",
                &[
                    "update",
                    &format!("nodename={node}"),
                    "availablefeatures=",
                    "activefeatures=",
                ],
            );
        }
        self.wait(
            &format!("{node} back in service"),
            Duration::from_secs(60),
            || {
                let n = self.node(node);
                !n.has(&SlurmNodeFlag::Drain)
                    && !n.has(&SlurmNodeFlag::NotResponding)
                    && n.state != SlurmBaseState::Down
            },
        );
    }

    fn wait(&self, what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(
                t.elapsed() < limit,
                "Slurm {}: timed out after {limit:?} waiting for {what}",
                self.v.name()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// Puts a node back in service when dropped (also when the test panics).
struct RestoreNode(&'static Cluster, &'static str);

impl Drop for RestoreNode {
    fn drop(&mut self) {
        self.0.restore(self.1);
    }
}

/// Runs up.sh again when dropped (also when the test panics): starts the
/// daemon a test stopped.
struct RestartRest(&'static Cluster);

impl Drop for RestartRest {
    fn drop(&mut self) {
        self.0.up();
    }
}

fn fast() -> ObserverConfig {
    ObserverConfig {
        poll_interval_ms: 200,
        jobs_poll_interval_ms: None,
        resync_every_polls: 0,
        backoff_initial_ms: 200,
        backoff_max_ms: 1_000,
        lost_after_failures: 2,
        update_time_margin_s: 1,
        use_update_time: true,
    }
}

/// Polls (with the observer's own pauses) until `done` holds for what was
/// observed so far; returns everything observed.
async fn poll_until(
    obs: &mut Observer,
    what: &str,
    limit: Duration,
    mut done: impl FnMut(&[Observation], &Observer) -> bool,
) -> Vec<Observation> {
    let t = Instant::now();
    let mut seen = Vec::new();
    loop {
        tokio::time::sleep(obs.next_delay()).await;
        seen.extend(obs.poll().await);
        if done(&seen, obs) {
            return seen;
        }
        assert!(
            t.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}; observed:\n{}",
            summaries(&seen)
        );
    }
}

fn summaries(obs: &[Observation]) -> String {
    obs.iter()
        .map(|Observation { event: e, .. }| e.summary())
        .collect::<Vec<_>>()
        .join("\n")
}

fn node_events<'a>(obs: &'a [Observation], name: &'a str) -> impl Iterator<Item = &'a SlurmNode> {
    obs.iter()
        .filter_map(move |Observation { event: e, .. }| match e {
            Event::SlurmNode(n) if n.name == name => Some(n),
            _ => None,
        })
}

/// Which drains are lockstep's: the default policy's, as the service hands
/// them to the actuator.
fn owned() -> tokio::sync::watch::Receiver<ReasonOwnership> {
    tokio::sync::watch::channel(Engine::new(Policy::default()).reason_ownership()).1
}

fn issued(action: Action) -> IssuedAction {
    IssuedAction {
        id: ActionId::derive(1, action.kind(), &action.target()),
        seq: 1,
        time_ms: 0,
        cause: EventId("test".to_owned()),
        rule: "test".to_owned(),
        attempt: 1,
        action,
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A final failure whose message contains every one of `words`.
fn assert_final_failure(result: &OutcomeResult, words: &[&str]) {
    match result {
        OutcomeResult::Failed {
            retryable: false,
            error,
        } => {
            for w in words {
                assert!(error.contains(w), "{w:?} not in {error:?}");
            }
        }
        r => panic!("want a final failure mentioning {words:?}, got {r:?}"),
    }
}

/// Feeds observations to an engine, one log record each.
struct Fold {
    engine: Engine,
    out: Output,
    seq: u64,
}

impl Fold {
    fn new(policy: Policy) -> Self {
        Self {
            engine: Engine::new(policy),
            out: Output::default(),
            seq: 0,
        }
    }

    fn apply(&mut self, source: Source, observations: Vec<Observation>) {
        for Observation {
            observed_ms, event, ..
        } in observations
        {
            self.seq += 1;
            let rec = EventRecord {
                seq: self.seq,
                time_ms: observed_ms,
                envelope: Envelope::new(source, observed_ms, event),
            };
            self.engine.apply(&rec, &mut self.out);
        }
    }
}

// ------------------------------------------------------------------ scenarios

/// Every node write the actuator makes, as Slurm shows it afterwards, and
/// the second time as `AlreadyDone`. 22.05 writes through scontrol (v0.0.38
/// has no node update); 24.11 and 26.05 through `POST /slurm/vX/node/N`.
async fn actuator_drain_shows_in_slurm_is_idempotent_and_resumes(c: &'static Cluster) {
    const N: &str = "ls-n1";
    let _own = c.own(N).await;
    let rest = c.rest();
    assert_eq!(rest.version().await.unwrap().to_string(), c.v.api());

    let act = Actuator::new(
        Some(rest),
        Some(c.scontrol()),
        owned(),
        ActuatorConfig::default(),
    )
    .unwrap();
    let drain = issued(Action::SlurmDrain {
        node: N.to_owned(),
        reason: "lockstep: test drain".to_owned(),
    });
    let out = act.execute(&drain).await;
    assert_eq!(out.result, OutcomeResult::Succeeded);
    assert_eq!(out.action_id, drain.id);
    let sinfo = c.cli("sinfo", &["-h", "-N", "-n", N, "-o", "%T|%E"]);
    assert!(
        sinfo.starts_with("drained|lockstep: test drain"),
        "sinfo: {sinfo}"
    );
    let n = c.node(N);
    assert!(n.has(&SlurmNodeFlag::Drain), "{n:?}");
    assert_eq!(n.reason.as_deref(), Some("lockstep: test drain"));
    // Slurm names the user lockstep acts as (the JWT's user; scontrol's own
    // user on 22.05) as the one who set the reason.
    assert_eq!(n.reason_user.as_deref(), Some(c.user.as_str()));

    // The same drain again changes nothing.
    assert_eq!(act.execute(&drain).await.result, OutcomeResult::AlreadyDone);
    // A drain with another reason updates the reason; one with control
    // characters and 300 more characters is written clean and cut.
    let other = issued(Action::SlurmDrain {
        node: N.to_owned(),
        reason: "lockstep: other reason".to_owned(),
    });
    assert_eq!(act.execute(&other).await.result, OutcomeResult::Succeeded);
    assert_eq!(c.node(N).reason.as_deref(), Some("lockstep: other reason"));
    let dirty = issued(Action::SlurmDrain {
        node: N.to_owned(),
        reason: format!("lockstep: line\nbreak\u{7}{}", "x".repeat(300)),
    });
    assert_eq!(act.execute(&dirty).await.result, OutcomeResult::Succeeded);
    let clean = c.node(N).reason.unwrap();
    assert_eq!(clean.chars().count(), 256, "{clean}");
    assert!(clean.starts_with("lockstep: line breakxxx"), "{clean}");
    assert_eq!(act.execute(&dirty).await.result, OutcomeResult::AlreadyDone);

    // Resume, then resume again: the second finds nothing to do.
    let resume = issued(Action::SlurmResume { node: N.to_owned() });
    assert_eq!(act.execute(&resume).await.result, OutcomeResult::Succeeded);
    let n = c.node(N);
    assert!(!n.has(&SlurmNodeFlag::Drain), "{n:?}");
    if c.v == V::V24_11 {
        // 24.11 keeps the last reason on a resumed node (22.05 and 26.05
        // clear it) and would later append "Not responding" to lockstep's
        // reason: the actuator replaces it by one it does not own.
        assert_eq!(n.reason.as_deref(), Some(RESUMED_REASON), "{n:?}");
    } else {
        assert!(n.reason.is_none(), "{n:?}");
    }
    assert_eq!(
        act.execute(&resume).await.result,
        OutcomeResult::AlreadyDone
    );

    // scontrol alone (sites without slurmrestd) does the same.
    let sc_only =
        Actuator::new(None, Some(c.scontrol()), owned(), ActuatorConfig::default()).unwrap();
    assert_eq!(
        sc_only.execute(&drain).await.result,
        OutcomeResult::Succeeded
    );
    assert_eq!(
        sc_only.execute(&drain).await.result,
        OutcomeResult::AlreadyDone
    );
    assert_eq!(
        sc_only.execute(&resume).await.result,
        OutcomeResult::Succeeded
    );
    c.restore(N);

    // Down with a reason, then resume. slurmctld may put the node back in
    // service by itself at its next ping (ReturnToService=2, the slurmd
    // still answers): then, and only then, the node is not DOWN any more
    // and the second SlurmDown has something to do again.
    let down = issued(Action::SlurmDown {
        node: N.to_owned(),
        reason: "lockstep: test down".to_owned(),
    });
    let log_at = c.ctld_log_len();
    assert_eq!(act.execute(&down).await.result, OutcomeResult::Succeeded);
    let n = c.node(N);
    let returned = c.returned_to_service_since(N, log_at);
    if !returned {
        assert_eq!(
            (n.state.clone(), n.reason.as_deref()),
            (SlurmBaseState::Down, Some("lockstep: test down")),
            "{n:?}"
        );
    }
    let again = act.execute(&down).await.result;
    if c.returned_to_service_since(N, log_at) {
        assert!(
            matches!(again, OutcomeResult::AlreadyDone | OutcomeResult::Succeeded),
            "{again:?}"
        );
        eprintln!(
            "Slurm {}: {N} returned to service by itself; the second SlurmDown: {again:?}",
            c.v.name()
        );
    } else {
        assert_eq!(again, OutcomeResult::AlreadyDone);
    }
    let resumed = act.execute(&resume).await.result;
    assert!(
        resumed == OutcomeResult::Succeeded
            || (resumed == OutcomeResult::AlreadyDone && c.returned_to_service_since(N, log_at)),
        "{resumed:?}"
    );
    c.restore(N);

    // Features: lockstep owns those with its prefixes (`zone-`); the
    // reducer keeps the others in the list it asks for, so an admin's `gpu`
    // stays. Set, already set, a managed one removed, all cleared.
    c.cli(
        "scontrol",
        &[
            "update",
            &format!("nodename={N}"),
            "availablefeatures=gpu",
            "activefeatures=gpu",
        ],
    );
    let features = |f: &[&str]| {
        issued(Action::SlurmSetFeatures {
            node: N.to_owned(),
            features: f.iter().map(|s| (*s).to_owned()).collect(),
        })
    };
    let zoned = features(&["zone-a", "gpu"]);
    assert_eq!(act.execute(&zoned).await.result, OutcomeResult::Succeeded);
    assert_eq!(c.node(N).features, ["gpu", "zone-a"]);
    assert_eq!(act.execute(&zoned).await.result, OutcomeResult::AlreadyDone);
    let unzoned = features(&["gpu"]);
    assert_eq!(act.execute(&unzoned).await.result, OutcomeResult::Succeeded);
    assert_eq!(c.node(N).features, ["gpu"]);
    let clear = features(&[]);
    assert_eq!(act.execute(&clear).await.result, OutcomeResult::Succeeded);
    assert!(c.node(N).features.is_empty(), "{:?}", c.node(N));
    assert_eq!(act.execute(&clear).await.result, OutcomeResult::AlreadyDone);
    // A malformed feature is refused, never sent.
    assert_final_failure(
        &act.execute(&features(&["zone a"])).await.result,
        &["slurm feature"],
    );

    // Topology: per-node topology exists from Slurm 25.05 on (REST
    // `topology_str`, v0.0.43+).
    let topo = |t: &str| {
        issued(Action::SlurmSetTopology {
            node: N.to_owned(),
            topology: t.to_owned(),
        })
    };
    if c.v < V::V26_05 {
        assert_final_failure(
            &act.execute(&topo("default:b2")).await.result,
            &["25.05", c.v.api()],
        );
    } else {
        let _back = RestoreTopology(c, N);
        let pid = c.pid("slurmctld");
        assert_eq!(
            act.execute(&topo("default:b2")).await.result,
            OutcomeResult::Succeeded
        );
        assert_eq!(block_of(c, N).as_deref(), Some("b2"));
        assert_eq!(c.node(N).topology.as_deref(), Some("default:b2"));
        assert_eq!(
            act.execute(&topo("default:b2")).await.result,
            OutcomeResult::AlreadyDone
        );
        // A block topology.yaml does not declare: Slurm says no, for good.
        assert_final_failure(
            &act.execute(&topo("default:no-such-block")).await.result,
            &["not available"],
        );
        // Empty or malformed: refused before Slurm (an empty topology_str
        // takes the node out of every topology).
        for bad in ["", "default:b1 b2", "default:b1\n"] {
            assert_final_failure(&act.execute(&topo(bad)).await.result, &["topology"]);
        }
        assert_eq!(block_of(c, N).as_deref(), Some("b2"), "nothing was sent");
        assert_eq!(c.pid("slurmctld"), pid, "no restart");
    }

    // Unknown node, and a Kubernetes action sent here: final failures.
    for a in [
        Action::SlurmDrain {
            node: "ls-nope".to_owned(),
            reason: "lockstep: x".to_owned(),
        },
        Action::KubeUntaintNode {
            node: "k".to_owned(),
            key: "x".to_owned(),
        },
    ] {
        for act in [&act, &sc_only] {
            match act.execute(&issued(a.clone())).await.result {
                OutcomeResult::Failed {
                    retryable: false, ..
                } => {}
                r => panic!("{a:?}: {r:?}"),
            }
        }
    }
}

/// The block `node` is in, per `scontrol show topology` (26.05's block
/// topology `default`).
/// The actuators a site may run, each a name and its way to Slurm: the
/// service's (slurmrestd reads; writes through slurmrestd on 24.11 and
/// 26.05, through scontrol on 22.05) and scontrol alone.
fn actuators(
    c: &'static Cluster,
    ownership: &tokio::sync::watch::Receiver<ReasonOwnership>,
    config: &ActuatorConfig,
) -> Vec<(&'static str, Actuator)> {
    [
        ("slurmrestd and scontrol", Some(c.rest())),
        ("scontrol alone", None),
    ]
    .into_iter()
    .map(|(name, rest)| {
        let act = Actuator::new(rest, Some(c.scontrol()), ownership.clone(), config.clone());
        (name, act.unwrap())
    })
    .collect()
}

/// `update nodename=NODE` with `settings`, as root at the command line.
fn admin_update(c: &Cluster, node: &str, settings: &[&str]) {
    let mut args = vec!["update".to_owned(), format!("nodename={node}")];
    args.extend(settings.iter().map(|s| (*s).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    c.cli("scontrol", &args);
}

/// A `Declined` naming the holder's user and reason.
fn assert_declined(result: &OutcomeResult, user: &str, reason: &str) {
    match result {
        OutcomeResult::Declined { held_by } => assert!(
            held_by.contains(&format!("by {user}: {reason}")),
            "{held_by:?}"
        ),
        r => panic!("want Declined by {user}: {reason}, got {r:?}"),
    }
}

/// Drained with `reason`, set by `user`.
fn assert_drained(c: &Cluster, node: &str, user: &str, reason: &str) {
    let n = c.node(node);
    assert!(n.has(&SlurmNodeFlag::Drain), "{n:?}");
    assert_eq!(
        (n.reason.as_deref(), n.reason_user.as_deref()),
        (Some(reason), Some(user)),
        "{n:?}"
    );
}

/// Slurm has no conditional node update (a drain over another reason
/// replaces it), so the actuator reads the node again right before it
/// writes. Here lockstep's drain is held between its first read and its
/// write while an admin drains the node for an RMA: the drain goes on,
/// finds the admin's drain and declines, writing nothing; a down and a
/// resume of the node then decline too.
async fn an_admin_drain_between_the_actuators_read_and_write_is_left_alone(c: &'static Cluster) {
    const N: &str = "ls-n1";
    const RMA: &str = "NVSwitch RMA";
    let _own = c.own(N).await;
    let paused = Arc::new(Notify::new());
    let go = Arc::new(Notify::new());
    let hook = {
        let (paused, go) = (paused.clone(), go.clone());
        BeforeWrite::new(move |_| {
            let (paused, go) = (paused.clone(), go.clone());
            async move {
                paused.notify_one();
                go.notified().await;
            }
        })
    };
    let config = ActuatorConfig {
        before_write: Some(hook),
        ..ActuatorConfig::default()
    };
    for (path, act) in actuators(c, &owned(), &config) {
        let drain = issued(Action::SlurmDrain {
            node: N.to_owned(),
            reason: "lockstep: kubernetes node ls-n1 cordoned".to_owned(),
        });
        let admin = async {
            paused.notified().await;
            // lockstep read the node in service and decided to drain it.
            assert!(!c.node(N).has(&SlurmNodeFlag::Drain), "{path}");
            admin_update(c, N, &["state=drain", &format!("reason={RMA}")]);
            go.notify_one();
        };
        let (out, ()) = tokio::join!(act.execute(&drain), admin);
        assert_declined(&out.result, "root", RMA);
        assert_drained(c, N, "root", RMA);

        // The node is the admin's: lockstep neither downs nor resumes it
        // (the first read declines; the hook is never reached).
        let down = issued(Action::SlurmDown {
            node: N.to_owned(),
            reason: "lockstep: kubernetes node ls-n1 not ready".to_owned(),
        });
        assert_declined(&act.execute(&down).await.result, "root", RMA);
        let resume = issued(Action::SlurmResume { node: N.to_owned() });
        assert_declined(&act.execute(&resume).await.result, "root", RMA);
        assert_drained(c, N, "root", RMA);
        eprintln!(
            "Slurm {} ({path}): the admin's drain is left alone",
            c.v.name()
        );
        c.restore(N);
    }
}

/// What no read closes: a pod's preStop hook sets the node DOWN after the
/// actuator's last read of a resume of lockstep's drain, before its write
/// (Slinky's `state=down reason='slurm-operator: Pod is terminating'`).
/// The resume of a node only drained is an UNDRAIN: it lifts lockstep's
/// drain and leaves the DOWN, with the hook's reason; a RESUME would have
/// returned the node to service. Alone and in a batch.
async fn a_down_set_after_the_last_read_of_a_resume_stays(c: &'static Cluster) {
    const N: &str = "ls-n1";
    const PRESTOP: &str = "slurm-operator: Pod is terminating";
    let _own = c.own(N).await;
    let hook = BeforeWrite::new(move |a| {
        let resumes = matches!(a, Action::SlurmResume { .. });
        async move {
            if resumes {
                admin_update(c, N, &["state=down", &format!("reason={PRESTOP}")]);
            }
        }
    });
    let config = ActuatorConfig {
        after_read: Some(hook),
        ..ActuatorConfig::default()
    };
    let drain = issued(Action::SlurmDrain {
        node: N.to_owned(),
        reason: "lockstep: kubernetes node ls-n1 cordoned".to_owned(),
    });
    let resume = issued(Action::SlurmResume { node: N.to_owned() });
    for (path, act) in actuators(c, &owned(), &config) {
        for batched in [false, true] {
            let what = format!("Slurm {} ({path}, batched {batched})", c.v.name());
            assert_eq!(
                act.execute(&drain).await.result,
                OutcomeResult::Succeeded,
                "{what}"
            );
            let log_at = c.ctld_log_len();
            let out = if batched {
                act.execute_all(std::slice::from_ref(&resume))
                    .await
                    .remove(0)
            } else {
                act.execute(&resume).await
            };
            assert_eq!(out.result, OutcomeResult::Succeeded, "{what}");
            let n = c.node(N);
            assert!(!n.has(&SlurmNodeFlag::Drain), "{what}: {n:?}");
            // The slurmd here still answers, so slurmctld itself may put the
            // node back in service at its next ping (ReturnToService=2), and
            // says so in its log; a RESUME would have, without a word.
            if !c.returned_to_service_since(N, log_at) {
                assert_eq!(n.state, SlurmBaseState::Down, "{what}: {n:?}");
                assert_eq!(n.reason.as_deref(), Some(PRESTOP), "{what}: {n:?}");
            }
            c.restore(N);
        }
        eprintln!(
            "Slurm {} ({path}): a DOWN after the last read stays through the resume",
            c.v.name()
        );
    }
}

/// lockstep drained the node; root then rewrote the reason (the node is
/// root's now): lockstep's resume declines, and the node stays drained
/// with root's reason.
async fn a_resume_of_a_drain_whose_reason_root_rewrote_is_declined(c: &'static Cluster) {
    const N: &str = "ls-n1";
    const ROOTS: &str = "GPU 3 fell off the bus, keep out";
    let _own = c.own(N).await;
    for (path, act) in actuators(c, &owned(), &ActuatorConfig::default()) {
        let drain = issued(Action::SlurmDrain {
            node: N.to_owned(),
            reason: "lockstep: kubernetes node ls-n1 cordoned".to_owned(),
        });
        assert_eq!(
            act.execute(&drain).await.result,
            OutcomeResult::Succeeded,
            "{path}"
        );
        admin_update(c, N, &[&format!("reason={ROOTS}")]);
        assert_drained(c, N, "root", ROOTS);
        let resume = issued(Action::SlurmResume { node: N.to_owned() });
        assert_declined(&act.execute(&resume).await.result, "root", ROOTS);
        assert_drained(c, N, "root", ROOTS);
        // Nor does lockstep's drain take it back.
        assert_declined(&act.execute(&drain).await.result, "root", ROOTS);
        assert_drained(c, N, "root", ROOTS);
        c.restore(N);
    }
}

/// What is lockstep's own it replaces and lifts: a drain over lockstep's
/// earlier reason replaces it, a resume of its drain resumes. Which reasons
/// are its own follows the ownership the service sends: a reason under a
/// prefix lockstep does not use yet is declined, and is its own once a new
/// policy takes that prefix (the old one then counts as an earlier prefix).
async fn the_actuator_replaces_and_lifts_its_own_drains(c: &'static Cluster) {
    const N: &str = "ls-n1";
    let _own = c.own(N).await;
    let drain = |reason: &str| {
        issued(Action::SlurmDrain {
            node: N.to_owned(),
            reason: reason.to_owned(),
        })
    };
    let resume = issued(Action::SlurmResume { node: N.to_owned() });
    let start = Engine::new(Policy::default()).reason_ownership();
    let (ownership_tx, ownership) = tokio::sync::watch::channel(start.clone());
    for (path, act) in actuators(c, &ownership, &ActuatorConfig::default()) {
        ownership_tx.send_replace(start.clone());
        let first = drain("lockstep: kubernetes node ls-n1 cordoned");
        assert_eq!(
            act.execute(&first).await.result,
            OutcomeResult::Succeeded,
            "{path}"
        );
        let user = c.node(N).reason_user.unwrap();
        let second = drain("lockstep: kubernetes node ls-n1 not ready");
        assert_eq!(
            act.execute(&second).await.result,
            OutcomeResult::Succeeded,
            "{path}"
        );
        assert_drained(c, N, &user, "lockstep: kubernetes node ls-n1 not ready");
        assert_eq!(
            act.execute(&second).await.result,
            OutcomeResult::AlreadyDone,
            "{path}"
        );
        assert_eq!(
            act.execute(&resume).await.result,
            OutcomeResult::Succeeded,
            "{path}"
        );
        let n = c.node(N);
        assert!(
            !n.has(&SlurmNodeFlag::Drain) && n.state != SlurmBaseState::Down,
            "{n:?}"
        );
        c.restore(N);

        // A drain under a prefix lockstep does not use (yet) is not its own.
        admin_update(c, N, &["state=drain", "reason=ls-next: cordoned"]);
        assert_declined(
            &act.execute(&first).await.result,
            "root",
            "ls-next: cordoned",
        );
        assert_drained(c, N, "root", "ls-next: cordoned");
        // A new policy takes that prefix: the drain is lockstep's, replaced
        // and lifted; the old prefix stays lockstep's as an earlier one.
        ownership_tx.send_replace(ReasonOwnership {
            prefix: "ls-next:".to_owned(),
            earlier_prefixes: vec![start.prefix.clone()],
            slurm_user: None,
        });
        let next = drain("ls-next: kubernetes node ls-n1 cordoned");
        assert_eq!(
            act.execute(&next).await.result,
            OutcomeResult::Succeeded,
            "{path}"
        );
        assert_drained(c, N, &user, "ls-next: kubernetes node ls-n1 cordoned");
        assert_eq!(
            act.execute(&first).await.result,
            OutcomeResult::Succeeded,
            "{path}"
        );
        assert_eq!(
            act.execute(&resume).await.result,
            OutcomeResult::Succeeded,
            "{path}"
        );
        c.restore(N);
    }
}

/// `sdiag`'s count of the RPCs of `kind` slurmctld has served (`0` if none
/// yet): what lockstep's requests cost slurmctld, seen from Slurm.
fn rpc_count(c: &Cluster, kind: &str) -> u64 {
    let out = c.cli("sdiag", &[]);
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(kind))
        .and_then(|l| l.split("count:").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .map_or(0, |n| n.parse().unwrap())
}

/// The node reads and node writes slurmctld has served.
fn node_rpcs(c: &Cluster) -> (u64, u64) {
    let reads = rpc_count(c, "REQUEST_NODE_INFO") + rpc_count(c, "REQUEST_NODE_INFO_SINGLE");
    (reads, rpc_count(c, "REQUEST_UPDATE_NODE"))
}

/// Drains, downs and resumes that wait together are carried out together
/// (a node pool cordoned at once): their nodes are read in one listing
/// (from `listing_read_min` nodes on, or by name through scontrol) and
/// written in one write per kind and reason (a host list to scontrol on
/// 22.05, slurmrestd's `POST /nodes/` on 24.11 and 26.05), and still each
/// reports its own node: written, already
/// so, declined for an admin's drain, or not found. A second change of a
/// node in the same batch comes after the first.
async fn drains_that_wait_together_are_written_together(c: &'static Cluster) {
    const R: &str = "lockstep: kubernetes node pool-a cordoned";
    const RMA: &str = "NVSwitch RMA";
    const R2: &str = "lockstep: kubernetes node pool-a not ready";
    let _all = c.exclusive().await;
    for n in NODES {
        c.restore(n);
    }
    let _restore: Vec<RestoreNode> = NODES.iter().map(|n| RestoreNode(c, n)).collect();
    let drain = |node: &str, reason: &str| {
        issued(Action::SlurmDrain {
            node: node.to_owned(),
            reason: reason.to_owned(),
        })
    };
    let resume = |node: &str| {
        issued(Action::SlurmResume {
            node: node.to_owned(),
        })
    };
    let configs = [
        ("one listing", 2, false),
        ("one listing through scontrol", 2, true),
        (
            "one read by name through scontrol",
            ActuatorConfig::default().listing_read_min,
            true,
        ),
        (
            "a read each",
            ActuatorConfig::default().listing_read_min,
            false,
        ),
    ];
    for (reads, listing_read_min, list_through_scontrol) in configs {
        let config = ActuatorConfig {
            listing_read_min,
            list_through_scontrol,
            ..ActuatorConfig::default()
        };
        for (path, act) in actuators(c, &owned(), &config) {
            let what = format!("Slurm {} ({path}, {reads})", c.v.name());
            admin_update(c, "ls-n2", &["state=drain", &format!("reason={RMA}")]);
            let n3 = act.execute(&drain("ls-n3", R)).await;
            assert_eq!(n3.result, OutcomeResult::Succeeded, "{what}");

            let batch = [
                drain("ls-n1", R),
                drain("ls-n2", R),
                drain("ls-n3", R),
                drain("ls-n4", R),
                drain("ls-nope", R),
            ];
            let (reads_before, writes_before) = node_rpcs(c);
            let outcomes = act.execute_all(&batch).await;
            let (reads_after, writes_after) = node_rpcs(c);
            let results: Vec<_> = outcomes.iter().map(|o| &o.result).collect();
            assert_eq!(results[0], &OutcomeResult::Succeeded, "{what}");
            assert_declined(results[1], "root", RMA);
            assert_eq!(results[2], &OutcomeResult::AlreadyDone, "{what}");
            assert_eq!(results[3], &OutcomeResult::Succeeded, "{what}");
            assert_final_failure(results[4], &["ls-nope"]);
            for (o, a) in outcomes.iter().zip(&batch) {
                assert_eq!(o.action_id, a.id, "{what}: outcomes in order");
            }
            let user = c.node("ls-n1").reason_user.unwrap();
            assert_drained(c, "ls-n1", &user, R);
            assert_drained(c, "ls-n4", &user, R);
            assert_drained(c, "ls-n2", "root", RMA);
            assert_eq!(
                writes_after - writes_before,
                1,
                "{what}: ls-n1 and ls-n4 in one write"
            );
            eprintln!(
                "{what}: 5 drains: {} node reads, {} node write",
                reads_after - reads_before,
                writes_after - writes_before
            );
            if listing_read_min == 2 || list_through_scontrol {
                // One listing (of every node, or of the five by name: no
                // second read of the four found), and one read of the
                // node slurmctld does not know.
                assert!(
                    reads_after - reads_before <= 2,
                    "{what}: {} reads",
                    reads_after - reads_before
                );
            }

            // Resumes: lockstep's own together, the admin's declined, and
            // a drain of a node whose resume is in the same batch after it.
            let batch = [
                resume("ls-n1"),
                resume("ls-n2"),
                resume("ls-n3"),
                resume("ls-n4"),
                drain("ls-n1", R2),
            ];
            let (_, writes_before) = node_rpcs(c);
            let outcomes = act.execute_all(&batch).await;
            let (_, writes_after) = node_rpcs(c);
            let results: Vec<_> = outcomes.iter().map(|o| &o.result).collect();
            assert_eq!(results[0], &OutcomeResult::Succeeded, "{what}");
            assert_declined(results[1], "root", RMA);
            assert_eq!(results[2], &OutcomeResult::Succeeded, "{what}");
            assert_eq!(results[3], &OutcomeResult::Succeeded, "{what}");
            assert_eq!(results[4], &OutcomeResult::Succeeded, "{what}");
            assert_drained(c, "ls-n1", &user, R2);
            assert_drained(c, "ls-n2", "root", RMA);
            for n in ["ls-n3", "ls-n4"] {
                let node = c.node(n);
                assert!(!node.has(&SlurmNodeFlag::Drain), "{what}: {node:?}");
                // 24.11 keeps a resumed node's reason: lockstep's is
                // replaced (together), never left to read as its drain.
                assert!(
                    node.reason.as_deref().is_none_or(|r| r == RESUMED_REASON),
                    "{what}: {node:?}"
                );
            }
            // The resume of three nodes, the reasons 24.11 kept (one
            // write), the drain of ls-n1.
            assert!(
                writes_after - writes_before <= 3,
                "{what}: {} writes",
                writes_after - writes_before
            );
            for n in NODES {
                c.restore(n);
            }
        }
    }

    // A batch reads its nodes once, right before its writes: an admin's
    // drain that lands before that read is seen, and the node declined
    // while the others are written.
    let hook = BeforeWrite::new(move |a: &Action| {
        let admin = matches!(a, Action::SlurmDrain { node, .. } if node == "ls-n4");
        async move {
            if admin {
                admin_update(c, "ls-n4", &["state=drain", &format!("reason={RMA}")]);
            }
        }
    });
    let config = ActuatorConfig {
        listing_read_min: 2,
        before_write: Some(hook),
        ..ActuatorConfig::default()
    };
    for (path, act) in actuators(c, &owned(), &config) {
        let what = format!("Slurm {} ({path}, an admin before the read)", c.v.name());
        let outcomes = act
            .execute_all(&[drain("ls-n1", R), drain("ls-n4", R)])
            .await;
        assert_eq!(outcomes[0].result, OutcomeResult::Succeeded, "{what}");
        assert_declined(&outcomes[1].result, "root", RMA);
        assert_drained(c, "ls-n4", "root", RMA);
        for n in NODES {
            c.restore(n);
        }
    }
}

/// Maintenance reservations through scontrol, on every version: made,
/// found made the second time (`AlreadyDone`), moved to other nodes and
/// another end, opened, removed, found removed; a start in the past starts
/// it now. A MAINT reservation holds jobs of every test on its nodes, so
/// this test has the cluster to itself.
async fn actuator_reserves_for_maintenance_idempotently_and_releases(c: &'static Cluster) {
    let _all = c.exclusive().await;
    struct Unreserve(&'static Cluster);
    impl Drop for Unreserve {
        fn drop(&mut self) {
            for name in ["lockstep_maint_t1", "lockstep_maint_t2"] {
                let _ = self.0.try_cli("scontrol", &["delete", "reservation", name]);
            }
        }
    }
    let _cleanup = Unreserve(c);
    let act = Actuator::new(
        Some(c.rest()),
        Some(c.scontrol()),
        owned(),
        ActuatorConfig::default(),
    )
    .unwrap();
    let show = |name: &str| c.try_cli("scontrol", &["-o", "show", "reservation", name]);
    let now_ms = now_s() * 1000;
    let hour = 3_600_000;
    let reserve = |name: &str, nodes: &[&str], start_ms: u64, end_ms: Option<u64>| {
        issued(Action::SlurmReserve {
            name: name.to_owned(),
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            start_ms,
            end_ms,
            users: "root".to_owned(),
        })
    };

    let first = reserve(
        "lockstep_maint_t1",
        &["ls-n3", "ls-n4"],
        now_ms + hour,
        Some(now_ms + 2 * hour),
    );
    assert_eq!(act.execute(&first).await.result, OutcomeResult::Succeeded);
    let shown = show("lockstep_maint_t1").unwrap();
    for want in [
        "Nodes=ls-n[3-4]",
        "Flags=MAINT,IGNORE_JOBS",
        "Users=root",
        "State=INACTIVE",
    ] {
        assert!(shown.contains(want), "{want} not in {shown}");
    }
    assert_eq!(act.execute(&first).await.result, OutcomeResult::AlreadyDone);

    let moved = reserve(
        "lockstep_maint_t1",
        &["ls-n4"],
        now_ms + hour,
        Some(now_ms + 3 * hour),
    );
    assert_eq!(act.execute(&moved).await.result, OutcomeResult::Succeeded);
    let shown = show("lockstep_maint_t1").unwrap();
    assert!(
        shown.contains("Nodes=ls-n4 ") && shown.contains("Duration=02:00:00"),
        "{shown}"
    );
    assert_eq!(act.execute(&moved).await.result, OutcomeResult::AlreadyDone);
    let open = reserve("lockstep_maint_t1", &["ls-n4"], now_ms + hour, None);
    assert_eq!(act.execute(&open).await.result, OutcomeResult::Succeeded);
    assert_eq!(act.execute(&open).await.result, OutcomeResult::AlreadyDone);

    let started = reserve(
        "lockstep_maint_t2",
        &["ls-n3"],
        now_ms - 60_000,
        Some(now_ms + hour),
    );
    assert_eq!(act.execute(&started).await.result, OutcomeResult::Succeeded);
    assert!(show("lockstep_maint_t2").unwrap().contains("State=ACTIVE"));
    assert_eq!(
        act.execute(&started).await.result,
        OutcomeResult::AlreadyDone
    );

    for name in ["lockstep_maint_t1", "lockstep_maint_t2"] {
        let release = issued(Action::SlurmUnreserve {
            name: name.to_owned(),
        });
        assert_eq!(act.execute(&release).await.result, OutcomeResult::Succeeded);
        assert!(show(name).is_err(), "{name} still there");
        assert_eq!(
            act.execute(&release).await.result,
            OutcomeResult::AlreadyDone
        );
    }

    // slurmrestd alone: reservations need scontrol, and the error says so.
    let rest_only =
        Actuator::new(Some(c.rest()), None, owned(), ActuatorConfig::default()).unwrap();
    assert_final_failure(&rest_only.execute(&first).await.result, &["scontrol"]);
    assert!(show("lockstep_maint_t1").is_err());
}

fn block_of(c: &Cluster, node: &str) -> Option<String> {
    let out = c.cli("scontrol", &["show", "topology", "default"]);
    out.lines()
        .filter(|l| l.starts_with("BlockName="))
        .find(|l| {
            let nodes = l
                .split_whitespace()
                .find_map(|w| w.strip_prefix("Nodes="))
                .unwrap_or("");
            lockstep_connectors::slurm::hostlist::expand(nodes)
                .unwrap()
                .iter()
                .any(|n| n == node)
        })
        .and_then(|l| l.split_whitespace().next())
        .and_then(|w| w.strip_prefix("BlockName="))
        .map(str::to_owned)
}

/// Puts a node back where up.sh's topology.yaml has it (block b1 or b2 of
/// `default`, switch s1 or s2 of `tree`) when dropped. A node's topology
/// update replaces all its topologies, so both are named.
struct RestoreTopology(&'static Cluster, &'static str);

impl Drop for RestoreTopology {
    fn drop(&mut self) {
        let first_half = matches!(self.1, "ls-n1" | "ls-n2");
        let t = if first_half {
            "topology=default:b1,tree:sw_root:s1"
        } else {
            "topology=default:b2,tree:sw_root:s2"
        };
        let _ = self
            .0
            .try_cli("scontrol", &["update", &format!("nodename={}", self.1), t]);
    }
}

async fn a_submitted_job_appears_and_moves_its_node_to_allocated_or_mixed(c: &'static Cluster) {
    const N: &str = "ls-n3";
    let _own = c.own(N).await;
    let mut rest = Observer::new(Backend::Rest(c.rest()), fast());
    let mut sc = Observer::new(Backend::Scontrol(c.scontrol()), fast());
    // Nodes through scontrol, the job through slurmrestd: both must move.
    let mut mixed = Observer::new(
        Backend::NodesThroughScontrol(c.rest(), c.scontrol()),
        fast(),
    );
    mixed.poll().await;
    let first = rest.poll().await;
    assert!(matches!(
        first.first(),
        Some(Observation {
            event: Event::ConnectorStatus { visible: true, .. },
            ..
        })
    ));
    sc.poll().await;

    let out = c.cli(
        "sbatch",
        &[
            "--parsable",
            "-J",
            "lockstep-test",
            "-w",
            N,
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 20",
        ],
    );
    let job_id: u64 = out.trim().split(';').next().unwrap().parse().unwrap();
    let cancel = CancelJob(c, job_id);

    let running = |obs: &[Observation], o: &Observer| {
        obs.iter().any(|Observation { event: e, .. }| {
            matches!(e, Event::SlurmJob(j) if j.job_id == job_id && j.state == SlurmJobState::Running && j.nodes == [N])
        }) && o
            .nodes()
            .iter()
            .any(|n| n.name == N && matches!(n.state, SlurmBaseState::Allocated | SlurmBaseState::Mixed))
    };
    for obs in [&mut rest, &mut sc, &mut mixed] {
        let seen = poll_until(
            obs,
            "the job running on its node",
            Duration::from_secs(30),
            running,
        )
        .await;
        assert!(
            node_events(&seen, N)
                .any(|n| matches!(n.state, SlurmBaseState::Allocated | SlurmBaseState::Mixed)),
            "{}",
            summaries(&seen)
        );
        let job = obs.jobs().into_iter().find(|j| j.job_id == job_id).unwrap();
        assert_eq!((job.partition.as_str(), job.node_count), ("batch", 1));
    }
    // Polls where nothing changed (24.11+ answer an unchanged job list with
    // HTTP 200 and no jobs) leave the job where it is. Only this job: other
    // tests' jobs on the same slurmctld do leave, MinJobAge after they end.
    let t = Instant::now();
    let mut quiet = Vec::new();
    while t.elapsed() < Duration::from_millis(2_500) {
        tokio::time::sleep(rest.next_delay()).await;
        quiet.extend(rest.poll().await);
    }
    assert!(
        !quiet
            .iter()
            .any(|Observation { event: e, .. }| matches!(e, Event::SlurmJobGone { job_id: id, .. } if *id == job_id)),
        "{}",
        summaries(&quiet)
    );
    assert!(rest.jobs().iter().any(|j| j.job_id == job_id));

    drop(cancel);
    let ended = |obs: &[Observation], o: &Observer| {
        obs.iter().any(|Observation { event: e, .. }| {
            matches!(e, Event::SlurmJob(j) if j.job_id == job_id && !j.state.holds_nodes())
        }) && o
            .nodes()
            .iter()
            .any(|n| n.name == N && n.state == SlurmBaseState::Idle && !n.has(&SlurmNodeFlag::Completing))
    };
    for obs in [&mut rest, &mut sc, &mut mixed] {
        poll_until(
            obs,
            "the job ended and its node idle",
            Duration::from_secs(60),
            ended,
        )
        .await;
    }
}

/// Cancels a job when dropped.
struct CancelJob(&'static Cluster, u64);

impl Drop for CancelJob {
    fn drop(&mut self) {
        let _ = self.0.try_cli("scancel", &[&self.1.to_string()]);
    }
}

async fn a_stopped_slurmd_is_observed_not_responding_then_down(c: &'static Cluster) {
    const N: &str = "ls-n4";
    let _own = c.own(N).await;
    /// Restarts the slurmd (up.sh starts what is missing); the node's
    /// restore guard then waits until it is back.
    struct Restart(&'static Cluster);
    impl Drop for Restart {
        fn drop(&mut self) {
            self.0.up();
        }
    }
    let _restart = Restart(c);
    let mut obs = Observer::new(
        Backend::Rest(c.rest()),
        ObserverConfig {
            poll_interval_ms: 1_000,
            ..fast()
        },
    );
    obs.poll().await;
    let started = Instant::now();
    c.stop(&format!("slurmd-{N}"));

    // SlurmdTimeout=30: NOT_RESPONDING after ~30 s, DOWN after ~45 s.
    let seen = poll_until(
        &mut obs,
        "NOT_RESPONDING then DOWN",
        Duration::from_secs(120),
        |seen, _| node_events(seen, N).any(|n| n.state == SlurmBaseState::Down),
    )
    .await;
    let events: Vec<&SlurmNode> = node_events(&seen, N).collect();
    let nr = events
        .iter()
        .position(|n| n.has(&SlurmNodeFlag::NotResponding) && n.state != SlurmBaseState::Down)
        .unwrap_or_else(|| panic!("no NOT_RESPONDING before DOWN:\n{}", summaries(&seen)));
    let down = events
        .iter()
        .position(|n| n.state == SlurmBaseState::Down)
        .unwrap();
    assert!(nr < down);
    let d = events[down];
    assert!(d.has(&SlurmNodeFlag::NotResponding), "{d:?}");
    // 24.11 appends to a reason the node kept from before
    // ("resumed : Not responding").
    let reason = d.reason.as_deref().unwrap_or("");
    assert!(
        reason == "Not responding" || (c.v == V::V24_11 && reason.ends_with(" : Not responding")),
        "{d:?}"
    );
    // Every event says something new about the node.
    for w in events.windows(2) {
        assert!(!w[0].same_but_version(w[1]), "duplicate event {:?}", w[1]);
    }
    eprintln!(
        "Slurm {}: ls-n4 NOT_RESPONDING then DOWN observed {:?} after the kill",
        c.v.name(),
        started.elapsed()
    );
}

async fn slurmctld_restart_loses_and_duplicates_nothing(c: &'static Cluster) {
    let _exclusive = c.exclusive().await;
    let mut obs = Observer::new(Backend::Rest(c.rest()), fast());
    let first = obs.poll().await;
    let mut last: BTreeMap<String, SlurmNode> = first
        .iter()
        .filter_map(|Observation { event: e, .. }| match e {
            Event::SlurmNode(n) => Some((n.name.to_string(), n.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(last.len(), 4, "{}", summaries(&first));
    let jobs_before = obs.jobs();

    /// Starts slurmctld again if the test fails while it is stopped.
    struct Up(&'static Cluster);
    impl Drop for Up {
        fn drop(&mut self) {
            self.0.up();
        }
    }
    let up = Up(c);
    c.stop("slurmctld");
    // Slurm down: the observer says so, and says nothing about the nodes.
    let down = poll_until(
        &mut obs,
        "the observer losing slurm",
        Duration::from_secs(60),
        |_, o| !o.visible(),
    )
    .await;
    assert!(
        down.iter().any(|Observation { event: e, .. }| matches!(
            e,
            Event::ConnectorStatus { visible: false, .. }
        )),
        "{}",
        summaries(&down)
    );
    assert!(
        !down.iter().any(|Observation { event: e, .. }| matches!(
            e,
            Event::SlurmNodeGone { .. } | Event::SlurmJobGone { .. }
        )),
        "a failed poll must not make objects gone:\n{}",
        summaries(&down)
    );
    drop(up);
    let back = poll_until(
        &mut obs,
        "the observer seeing slurm again",
        Duration::from_secs(60),
        |_, o| o.visible(),
    )
    .await;
    // The poll that sees Slurm again says so, then lists everything.
    assert_regained_with_a_full_listing(&back, &obs);

    // The observer's view is scontrol's (nodes may still settle after the
    // restart: compare until they agree).
    let sc = c.scontrol();
    let same = |a: &[SlurmNode], b: &[SlurmNode]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same_but_version(y))
    };
    let t = Instant::now();
    let mut after = back;
    loop {
        let want = sc.nodes().await.unwrap();
        if same(&obs.nodes(), &want) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "observer and scontrol disagree:\n{:?}\n{:?}",
            obs.nodes(),
            want
        );
        tokio::time::sleep(obs.next_delay()).await;
        after.extend(obs.poll().await);
    }
    let jobs_after = obs.jobs();
    assert!(
        jobs_after.len() == jobs_before.len()
            && jobs_after
                .iter()
                .zip(&jobs_before)
                .all(|(a, b)| a.same_but_version(b)),
        "no job lost: {jobs_before:?} -> {jobs_after:?}"
    );
    // Outside the full listing no event repeats what was already known:
    // unchanged nodes are silent.
    let all: Vec<Observation> = down.into_iter().chain(after).collect();
    let mut listing = false;
    for Observation { event: e, .. } in &all {
        match e {
            Event::SyncStarted { .. } => listing = true,
            Event::SyncDone { .. } => listing = false,
            Event::SlurmNode(n) => {
                let prev = last.insert(n.name.to_string(), n.clone());
                assert!(
                    listing || !prev.as_ref().is_some_and(|p| p.same_but_version(n)),
                    "duplicate event for {}:\n{}",
                    n.name,
                    summaries(&all)
                );
            }
            Event::SlurmNodeGone { .. }
            | Event::SlurmJobGone { .. }
            | Event::SlurmPartitionGone { .. } => {
                panic!("nothing left Slurm:\n{}", summaries(&all));
            }
            _ => {}
        }
    }
}

async fn slurmrestd_down_is_reported_and_scontrol_still_observes(c: &'static Cluster) {
    let _exclusive = c.exclusive().await;
    const N: &str = "ls-n1";
    let _restore = RestoreNode(c, N);
    let mut rest = Observer::new(Backend::Rest(c.rest()), fast());
    let mut sc = Observer::new(Backend::Scontrol(c.scontrol()), fast());
    let mut mixed = Observer::new(
        Backend::NodesThroughScontrol(c.rest(), c.scontrol()),
        fast(),
    );
    rest.poll().await;
    sc.poll().await;
    mixed.poll().await;
    // The back ends see the same cluster.
    let same = |a: Vec<SlurmNode>, b: Vec<SlurmNode>| {
        a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.same_but_version(y))
    };
    assert!(
        same(rest.nodes(), sc.nodes()),
        "{:?}\n{:?}",
        rest.nodes(),
        sc.nodes()
    );
    assert!(
        same(rest.nodes(), mixed.nodes()),
        "{:?}\n{:?}",
        rest.nodes(),
        mixed.nodes()
    );
    let names = |o: &Observer| {
        (
            o.partitions()
                .into_iter()
                .map(|p| (p.name, p.nodes))
                .collect::<Vec<_>>(),
            o.jobs()
                .into_iter()
                .map(|j| (j.job_id, j.state, j.nodes))
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(names(&rest), names(&sc));
    assert_eq!(names(&rest), names(&mixed));

    let restart = RestartRest(c);
    c.stop("slurmrestd");
    let lost = poll_until(
        &mut rest,
        "visible=false",
        Duration::from_secs(30),
        |_, o| !o.visible(),
    )
    .await;
    let detail = lost
        .iter()
        .find_map(|Observation { event: e, .. }| match e {
            Event::ConnectorStatus {
                visible: false,
                detail,
                ..
            } => Some(detail.clone()),
            _ => None,
        })
        .unwrap();
    assert!(detail.contains("cannot reach slurmrestd"), "{detail}");

    c.cli(
        "scontrol",
        &[
            "update",
            &format!("nodename={N}"),
            "state=drain",
            "reason=lockstep-test: rest down",
        ],
    );
    poll_until(
        &mut sc,
        "scontrol observing the drain",
        Duration::from_secs(10),
        |seen, _| node_events(seen, N).any(|n| n.has(&SlurmNodeFlag::Drain)),
    )
    .await;

    drop(restart);
    let back = poll_until(
        &mut rest,
        "visible=true and the drain",
        Duration::from_secs(60),
        |seen, _| node_events(seen, N).any(|n| n.has(&SlurmNodeFlag::Drain)),
    )
    .await;
    let status = back
        .iter()
        .position(|Observation { event: e, .. }| {
            matches!(e, Event::ConnectorStatus { visible: true, .. })
        })
        .unwrap_or_else(|| panic!("{}", summaries(&back)));
    let drained = back
        .iter()
        .position(|Observation { event: e, .. }| matches!(e, Event::SlurmNode(n) if n.name == N))
        .unwrap();
    assert!(
        status < drained,
        "visible first, then what changed meanwhile"
    );
    assert_regained_with_a_full_listing(&back, &rest);
}

/// A running observer lists nodes through scontrol and jobs and partitions
/// through slurmrestd, in two lanes. slurmrestd stopped: the observer says
/// Slurm is out of sight, and still shows what happens to the nodes (the node
/// lane never waits for the job listing). slurmrestd back: `visible: true`,
/// then every domain listed in full after it, the nodes too, although their
/// lane never failed (the reducer trusts Slurm again only then).
async fn a_running_observer_shows_nodes_while_slurmrestd_is_down(c: &'static Cluster) {
    let _exclusive = c.exclusive().await;
    const N: &str = "ls-n1";
    let _restore = RestoreNode(c, N);
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let observer = Observer::new(
        Backend::NodesThroughScontrol(c.rest(), c.scontrol()),
        fast(),
    );
    let task = tokio::spawn(observer.run(tx));
    let mut seen = Vec::new();
    let mut recv_until =
        async |what: &str, limit: Duration, done: &dyn Fn(&[Observation]) -> bool| {
            let t = Instant::now();
            while !done(&seen) {
                let left = limit.saturating_sub(t.elapsed());
                match tokio::time::timeout(left, rx.recv()).await {
                    Ok(Some(o)) => seen.push(o),
                    _ => panic!(
                        "{what}: not seen within {limit:?}; observed:\n{}",
                        summaries(&seen)
                    ),
                }
            }
            seen.len()
        };
    let status_at = |seen: &[Observation], visible: bool| {
        seen.iter().rposition(|Observation { event: e, .. }| {
            matches!(e, Event::ConnectorStatus { visible: v, .. } if *v == visible)
        })
    };
    let listed = |seen: &[Observation], domain: Domain| {
        seen.iter()
            .any(|o| matches!(o.event, Event::SyncDone { domain: d } if d == domain))
    };
    let everything = |seen: &[Observation]| {
        [
            Domain::SlurmNodes,
            Domain::SlurmJobs,
            Domain::SlurmPartitions,
        ]
        .into_iter()
        .all(|d| listed(seen, d))
    };
    recv_until("first listings", Duration::from_secs(30), &|s| {
        status_at(s, true).is_some() && everything(s)
    })
    .await;

    let restart = RestartRest(c);
    c.stop("slurmrestd");
    let lost = recv_until("visible=false", Duration::from_secs(30), &|s| {
        status_at(s, false).is_some()
    })
    .await;
    c.cli(
        "scontrol",
        &[
            "update",
            &format!("nodename={N}"),
            "state=drain",
            "reason=lockstep-test: rest down, observer running",
        ],
    );
    recv_until(
        "the drain, slurmrestd down",
        Duration::from_secs(10),
        &|s| node_events(&s[lost..], N).any(|n| n.has(&SlurmNodeFlag::Drain)),
    )
    .await;

    drop(restart);
    recv_until(
        "visible=true, then every domain listed in full",
        Duration::from_secs(60),
        &|s| status_at(s, true).is_some_and(|at| at >= lost && everything(&s[at..])),
    )
    .await;
    task.abort();
    // The listing of the nodes after sight came back shows the drain.
    let at = status_at(&seen, true).unwrap();
    let after = &seen[at..];
    let start = after
        .iter()
        .position(|o| {
            matches!(
                o.event,
                Event::SyncStarted {
                    domain: Domain::SlurmNodes
                }
            )
        })
        .unwrap_or_else(|| panic!("{}", summaries(after)));
    assert!(
        node_events(&after[start..], N).any(|n| n.has(&SlurmNodeFlag::Drain)),
        "{}",
        summaries(after)
    );
}

/// After the first `ConnectorStatus { visible: true }` in `seen`: a full
/// listing of every domain, nodes, jobs and partitions in turn, each
/// `SyncStarted`, every object the observer now holds of it, `SyncDone`,
/// and nothing else. Objects that left while Slurm was out of sight are
/// gone by absence from it.
fn assert_regained_with_a_full_listing(seen: &[Observation], obs: &Observer) {
    let all = || summaries(seen);
    let at = seen
        .iter()
        .position(|Observation { event: e, .. }| {
            matches!(e, Event::ConnectorStatus { visible: true, .. })
        })
        .unwrap_or_else(|| panic!("no visible=true:\n{}", all()));
    let mut rest = seen[at + 1..].iter().map(|o| &o.event);
    let want = [
        (
            Domain::SlurmNodes,
            obs.nodes()
                .into_iter()
                .map(|n| n.name.to_string())
                .collect::<Vec<_>>(),
        ),
        (
            Domain::SlurmJobs,
            obs.jobs()
                .into_iter()
                .map(|j| j.job_id.to_string())
                .collect(),
        ),
        (
            Domain::SlurmPartitions,
            obs.partitions().into_iter().map(|p| p.name).collect(),
        ),
    ];
    for (domain, want) in want {
        assert!(
            matches!(rest.next(), Some(Event::SyncStarted { domain: d }) if *d == domain),
            "{domain:?} listing not started:\n{}",
            all()
        );
        let mut listed = Vec::new();
        loop {
            match rest.next() {
                Some(Event::SyncDone { domain: d }) if *d == domain => break,
                Some(Event::SlurmNode(n)) if domain == Domain::SlurmNodes => {
                    listed.push(n.name.to_string());
                }
                Some(Event::SlurmJob(j)) if domain == Domain::SlurmJobs => {
                    listed.push(j.job_id.to_string());
                }
                Some(Event::SlurmPartition(p)) if domain == Domain::SlurmPartitions => {
                    listed.push(p.name.as_str().into());
                }
                e => panic!("{e:?} in the {domain:?} listing:\n{}", all()),
            }
        }
        listed.sort();
        let mut want = want;
        want.sort();
        assert_eq!(listed, want, "{domain:?}:\n{}", all());
    }
    assert!(rest.next().is_none(), "more than the listing:\n{}", all());
}

/// Waits for an `update_time` poll of the nodes that answers 304, and
/// returns its `update_time`.
async fn quiet_second(rest: &RestClient) -> u64 {
    // Node pings change node data every ~10 s: wait for a quiet second.
    let t = Instant::now();
    loop {
        let since = now_s() - 1;
        if let Ok(Fetch::Unchanged) = rest.nodes(Some(since)).await {
            return since;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "never a 304");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The observer's long-lived scontrol ([`NodeSession`]): it lists what a
/// new scontrol lists; a drain or resume made right after a listing (in the
/// same second, which slurmctld's "changed since" compares in whole
/// seconds) shows in the next one; an unchanged listing is told apart; a
/// killed scontrol is replaced without a failed listing; a scontrol that
/// cannot start is an error, not an empty cluster.
async fn a_node_session_lists_every_change_and_tells_unchanged(c: &'static Cluster) {
    const N: &str = "ls-n2";
    let _own = c.own(N).await;
    let sc = c.scontrol();
    let mut session = NodeSession::new(sc.clone());
    let listed = |f: Fetch<Vec<SlurmNode>>| match f {
        Fetch::Changed(nodes) => nodes,
        Fetch::Unchanged => panic!("a full listing was asked for"),
    };
    let first = listed(session.nodes(false).await.unwrap());
    let one_shot = sc.nodes().await.unwrap();
    assert_eq!(
        first.iter().map(|n| &n.name).collect::<Vec<_>>(),
        one_shot.iter().map(|n| &n.name).collect::<Vec<_>>()
    );
    // Other tests change their own nodes of this cluster meanwhile: only
    // this test's node must read the same both ways.
    let node = |nodes: &[SlurmNode]| nodes.iter().find(|n| n.name == N).cloned().unwrap();
    assert!(
        node(&first).same_but_version(&node(&one_shot)),
        "{first:?}\n{one_shot:?}"
    );
    let pid = session.pid().expect("a running scontrol");

    for round in 0..6 {
        let reason = format!("lockstep session test {round}");
        admin_update(c, N, &["state=drain", &format!("reason={reason}")]);
        // A change is never "unchanged", however soon after the last listing.
        let Fetch::Changed(nodes) = session.nodes(true).await.unwrap() else {
            panic!("round {round}: a drain listed as unchanged");
        };
        let n = node(&nodes);
        assert!(n.has(&SlurmNodeFlag::Drain), "round {round}: {n:?}");
        assert_eq!(n.reason.as_deref(), Some(reason.as_str()));
        admin_update(c, N, &["state=resume"]);
        let Fetch::Changed(nodes) = session.nodes(true).await.unwrap() else {
            panic!("round {round}: a resume listed as unchanged");
        };
        let n = node(&nodes);
        assert!(!n.has(&SlurmNodeFlag::Drain), "round {round}: {n:?}");
    }
    assert_eq!(
        session.pid(),
        Some(pid),
        "one scontrol served every listing"
    );

    // Once the nodes stand still, a listing is unchanged, and a probe of
    // one node tells it without a listing printed.
    let t = Instant::now();
    loop {
        let before = session.counts();
        let fetched = session.nodes(true).await.unwrap();
        let after = session.counts();
        if fetched == Fetch::Unchanged && after.probes_unchanged > before.probes_unchanged {
            assert_eq!(after.listings, before.listings, "{after:?}");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "never unchanged by a probe: {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A change after a quiet spell: the probe finds it, and the listing
    // after it shows it.
    admin_update(
        c,
        N,
        &["state=drain", "reason=lockstep session test probed"],
    );
    let before = session.counts();
    let Fetch::Changed(nodes) = session.nodes(true).await.unwrap() else {
        panic!("a drain after a quiet spell listed as unchanged");
    };
    assert!(
        node(&nodes).has(&SlurmNodeFlag::Drain),
        "{:?}",
        node(&nodes)
    );
    assert_eq!(session.counts().probes_changed, before.probes_changed + 1);
    admin_update(c, N, &["state=resume"]);

    // An observer through scontrol lists its nodes through a session: its
    // polls tell an unchanged listing too (jobs and partitions are listed
    // in full).
    let mut obs = Observer::new(Backend::Scontrol(sc.clone()), fast());
    obs.poll().await;
    let t = Instant::now();
    loop {
        tokio::time::sleep(obs.next_delay()).await;
        obs.poll().await;
        if obs.last_poll().unchanged == 1 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{:?}",
            obs.last_poll()
        );
    }

    // A killed scontrol: the next listing starts another, and succeeds.
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let again = listed(session.nodes(false).await.unwrap());
    assert_eq!(again.len(), first.len());
    assert_ne!(session.pid(), Some(pid));

    // A scontrol that ends at once, or is not there, lists nothing: an
    // error, not an empty cluster.
    for program in ["false", "/nonexistent/scontrol"] {
        let mut broken = NodeSession::new(Scontrol::new(ScontrolConfig {
            program: program.into(),
            ..sc.config().clone()
        }));
        let err = broken.nodes(false).await.unwrap_err();
        assert!(broken.pid().is_none(), "{program}: {err}");
    }
}

/// `update_time` polls as each version answers them, and what the client
/// makes of them. Nothing changed: nodes and partitions 304; jobs 304 on
/// 22.05, but HTTP 200 with no jobs, `last_update` 0 and a warning on 24.11
/// and 26.05 (unchanged, never "every job is gone"). A node changed: HTTP
/// 500 on 22.05 ("Unspecified error") and 24.11 ("Unable to query
/// partitions"), 200 with the whole list on 26.05; changed, either way.
async fn update_time_polls_tell_unchanged_from_changed(c: &'static Cluster) {
    const N: &str = "ls-n3";
    let _own = c.own(N).await;
    let rest = c.rest();
    let v = rest.version().await.unwrap();
    assert_eq!(v.to_string(), c.v.api());
    let since = quiet_second(&rest).await;
    let (status, body) = rest
        .get_raw(&format!("/slurm/{v}/nodes?update_time={since}"))
        .await
        .unwrap();
    assert_eq!((status, body.len()), (304, 0));
    // Change a node field lockstep does not read (ls-n3's weight).
    c.cli("scontrol", &["update", "nodename=ls-n3", "weight=2"]);
    let (status, _) = rest
        .get_raw(&format!("/slurm/{v}/nodes?update_time={since}"))
        .await
        .unwrap();
    c.cli("scontrol", &["update", "nodename=ls-n3", "weight=1"]);
    let want = match c.v {
        V::V22_05 | V::V24_11 => 500,
        V::V26_05 => 200,
    };
    assert_eq!(status, want, "a changed node list on Slurm {}", c.v.name());
    match rest.nodes(Some(since)).await.unwrap() {
        Fetch::Changed(l) => assert_eq!(l.items.len(), 4),
        Fetch::Unchanged => panic!("a node changed"),
    }
    let later = now_s() + 1;
    let (status, _) = rest
        .get_raw(&format!("/slurm/{v}/jobs?update_time={later}"))
        .await
        .unwrap();
    let want = if c.v == V::V22_05 { 304 } else { 200 };
    assert_eq!(
        status,
        want,
        "an unchanged job list on Slurm {}",
        c.v.name()
    );
    assert_eq!(rest.jobs(Some(later)).await.unwrap(), Fetch::Unchanged);
    assert_eq!(
        rest.partitions(Some(later)).await.unwrap(),
        Fetch::Unchanged
    );
}

async fn an_admin_drain_reaches_the_engine_as_a_foreign_drain(c: &'static Cluster) {
    const N: &str = "ls-n2";
    let _own = c.own(N).await;
    let mut obs = Observer::new(Backend::Rest(c.rest()), fast());
    let mut fold = Fold::new(Policy::default());
    fold.apply(Source::Slurm, obs.poll().await);
    assert_eq!(fold.engine.phase(N), Phase::InService);

    c.cli(
        "scontrol",
        &[
            "update",
            &format!("nodename={N}"),
            "state=drain",
            "reason=admin test",
        ],
    );
    let seen = poll_until(
        &mut obs,
        "the admin drain",
        Duration::from_secs(10),
        |seen, _| node_events(seen, N).any(|n| n.has(&SlurmNodeFlag::Drain)),
    )
    .await;
    let n = node_events(&seen, N).last().unwrap().clone();
    assert_eq!(n.reason.as_deref(), Some("admin test"));
    assert_eq!(n.reason_user.as_deref(), Some("root"));
    fold.apply(Source::Slurm, seen);
    assert_eq!(fold.engine.phase(N), Phase::ForeignDrain);
    assert!(
        !fold
            .out
            .actions
            .iter()
            .any(|a| matches!(&a.action, Action::SlurmResume { node } if node == N)),
        "lockstep never resumes a drain it does not own"
    );
}

/// The shipped NVLink preset (`deploy/policies/nvidia-gpu-clique.json`):
/// the NVIDIA GPU operator's `nvidia.com/gpu.clique` label on a Kubernetes
/// node moves the Slurm node into the block of that NVLink domain, through
/// the reducer's topology action and a REST `topology_str` update, and
/// `scontrol show topology` shows it: no reconfigure, no restart. An empty
/// or invalid label value sends nothing.
async fn a_gpu_clique_label_moves_the_slurm_node_into_its_block(c: &'static Cluster) {
    const N: &str = "ls-n2";
    /// An empty block in up.sh's topology.yaml, named as the GPU operator
    /// names an NVLink domain: `<cluster uuid>.<clique id>`.
    const CLIQUE: &str = "7f3c9a2e-5b1d-4c8e-9f60-1a2b3c4d5e6f.1";
    let _own = c.own(N).await;
    let _back = RestoreTopology(c, N);
    let preset = repo().join("deploy/policies/nvidia-gpu-clique.json");
    let mut policy = Policy::from_json(&std::fs::read_to_string(&preset).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", preset.display()));
    assert_eq!(
        policy.topology.unit_label.as_deref(),
        Some("nvidia.com/gpu.clique")
    );
    // Host mode: the Kubernetes node has the Slurm node's name.
    policy.mapping.mode = lockstep_schemas::MappingMode::Host;

    let pid = c.pid("slurmctld");
    let log_at = c.ctld_log_len();
    let act = Actuator::new(Some(c.rest()), None, owned(), ActuatorConfig::default()).unwrap();
    let mut obs = Observer::new(Backend::Rest(c.rest()), fast());
    let mut fold = Fold::new(policy);
    fold.apply(Source::Slurm, obs.poll().await);
    let label = |value: &str| -> Vec<Observation> {
        let node = serde_json::from_value(serde_json::json!({
            "name": N, "ready": "True",
            "labels": {"nvidia.com/gpu.clique": value},
        }))
        .unwrap();
        vec![Observation::new(
            Source::Kubernetes,
            0,
            Event::KubeNode(node),
        )]
    };
    let topology_actions = |fold: &Fold, from: usize| -> Vec<IssuedAction> {
        fold.out.actions[from..]
            .iter()
            .filter(|a| matches!(a.action, Action::SlurmSetTopology { .. }))
            .cloned()
            .collect()
    };

    // Invalid or empty label values: the reducer sends nothing.
    for bad in ["", "not a block", "7f3c9a2e/1"] {
        let from = fold.out.actions.len();
        fold.apply(Source::Kubernetes, label(bad));
        assert!(
            topology_actions(&fold, from).is_empty(),
            "{bad:?}: {:?}",
            &fold.out.actions[from..]
        );
    }
    assert_eq!(block_of(c, N).as_deref(), Some("b1"));

    let from = fold.out.actions.len();
    fold.apply(Source::Kubernetes, label(CLIQUE));
    let actions = topology_actions(&fold, from);
    assert_eq!(actions.len(), 1, "{:?}", &fold.out.actions[from..]);
    assert_eq!(
        actions[0].action,
        Action::SlurmSetTopology {
            node: N.to_owned(),
            topology: format!("default:{CLIQUE}"),
        }
    );
    let outcome = act.execute(&actions[0]).await;
    assert_eq!(outcome.result, OutcomeResult::Succeeded);
    assert_eq!(block_of(c, N).as_deref(), Some(CLIQUE));
    let show = c.cli("scontrol", &["show", "topology"]);
    assert!(
        show.lines()
            .any(|l| l.starts_with(&format!("BlockName={CLIQUE} ")) && l.contains(N)),
        "{show}"
    );

    // The observer sees the node in its block; the reducer then wants
    // nothing more.
    let seen = poll_until(
        &mut obs,
        "the node's new topology",
        Duration::from_secs(10),
        |seen, _| {
            node_events(seen, N)
                .any(|n| n.topology.as_deref() == Some(&format!("default:{CLIQUE}")))
        },
    )
    .await;
    let from = fold.out.actions.len();
    fold.apply(Source::Slurm, seen);
    fold.apply(
        Source::Actuator,
        vec![Observation::new(
            Source::Actuator,
            0,
            Event::ActionOutcome(outcome),
        )],
    );
    assert!(
        topology_actions(&fold, from).is_empty(),
        "{:?}",
        &fold.out.actions[from..]
    );

    // No reconfigure, no restart: the same slurmctld, nothing in its log.
    assert_eq!(c.pid("slurmctld"), pid);
    let log = c.ctld_log_since(log_at);
    assert!(
        !log.to_ascii_lowercase().contains("reconfigure"),
        "slurmctld reconfigured:\n{log}"
    );
}

// ------------------------------------------------------------------ matrix

/// `on!(scenario: v22_05, v24_11)` runs `scenario` against each version
/// named, as tests `scenario::v22_05`, ...
macro_rules! on {
    ($scenario:ident: $($v:ident),+) => {
        mod $scenario {
            $(
                #[tokio::test]
                async fn $v() {
                    super::$scenario(super::cluster(on!(@v $v))).await;
                }
            )+
        }
    };
    (@v v22_05) => { super::V::V22_05 };
    (@v v24_11) => { super::V::V24_11 };
    (@v v26_05) => { super::V::V26_05 };
}

on!(actuator_drain_shows_in_slurm_is_idempotent_and_resumes: v22_05, v24_11, v26_05);
on!(an_admin_drain_between_the_actuators_read_and_write_is_left_alone: v22_05, v24_11, v26_05);
on!(a_resume_of_a_drain_whose_reason_root_rewrote_is_declined: v22_05, v24_11, v26_05);
on!(a_down_set_after_the_last_read_of_a_resume_stays: v22_05, v24_11, v26_05);
on!(the_actuator_replaces_and_lifts_its_own_drains: v22_05, v24_11, v26_05);
on!(drains_that_wait_together_are_written_together: v22_05, v24_11, v26_05);
on!(actuator_reserves_for_maintenance_idempotently_and_releases: v22_05, v24_11, v26_05);
on!(a_submitted_job_appears_and_moves_its_node_to_allocated_or_mixed: v22_05, v24_11, v26_05);
on!(a_stopped_slurmd_is_observed_not_responding_then_down: v22_05, v24_11, v26_05);
on!(slurmctld_restart_loses_and_duplicates_nothing: v22_05, v24_11, v26_05);
on!(slurmrestd_down_is_reported_and_scontrol_still_observes: v22_05, v24_11, v26_05);
on!(a_running_observer_shows_nodes_while_slurmrestd_is_down: v22_05, v24_11, v26_05);
on!(an_admin_drain_reaches_the_engine_as_a_foreign_drain: v22_05, v24_11, v26_05);
on!(update_time_polls_tell_unchanged_from_changed: v22_05, v24_11, v26_05);
on!(a_node_session_lists_every_change_and_tells_unchanged: v22_05, v24_11, v26_05);
on!(a_gpu_clique_label_moves_the_slurm_node_into_its_block: v26_05);
