//! The Slurm connector against a real Slurm (22.05, slurmrestd v0.0.38),
//! started by `deploy/local/slurm/up.sh` from this test process. These tests
//! never skip: without Slurm (or root to start it) they fail.
//!
//! Tests share one cluster. Each test that changes a node owns that node:
//! ls-n1 the actuator, ls-n2 the admin drain seen by the engine, ls-n3 jobs,
//! ls-n4 the stopped slurmd. Tests that stop a daemon everyone uses
//! (slurmctld, slurmrestd) take the cluster lock exclusively; the others take
//! it shared. Every test puts its node back as it found it, also when it
//! fails (guards restore in `Drop`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use lockstep_connectors::slurm::{
    Actuator, ActuatorConfig, Backend, Fetch, Observation, Observer, ObserverConfig, RestClient,
    RestConfig, Scontrol, ScontrolConfig, TokenSource,
};
use lockstep_engine::{Engine, Output, Phase};
use lockstep_schemas::{
    Action, ActionId, Envelope, Event, EventId, EventRecord, IssuedAction, OutcomeResult, Policy,
    SlurmBaseState, SlurmJobState, SlurmNode, SlurmNodeFlag, Source,
};
use tokio::sync::RwLock;

// ------------------------------------------------------------------ cluster

/// The cluster up.sh started, from the `export` lines it prints.
struct Cluster {
    conf: PathBuf,
    url: String,
    user: String,
    token_file: PathBuf,
    state: PathBuf,
    up: PathBuf,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
/// Shared by tests that change only their own node; exclusive for tests
/// that stop slurmctld or slurmrestd.
static LOCK: RwLock<()> = RwLock::const_new(());

fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(|| {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_owned();
        let up = repo.join("deploy/local/slurm/up.sh");
        let out = Command::new(&up)
            .env_remove("SLURM_JWT")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", up.display()));
        assert!(
            out.status.success(),
            "{} failed ({}); a real Slurm is required for these tests:\n{}",
            up.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let env: HashMap<String, String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let get = |k: &str| {
            env.get(k)
                .unwrap_or_else(|| panic!("up.sh printed no {k}"))
                .clone()
        };
        let conf = PathBuf::from(get("SLURM_CONF"));
        Cluster {
            state: conf.parent().unwrap().to_owned(),
            conf,
            url: get("SLURMRESTD_URL"),
            user: get("SLURM_JWT_USER"),
            token_file: PathBuf::from(get("SLURM_JWT_FILE")),
            up,
        }
    })
}

impl Cluster {
    /// Runs a Slurm command line program; stdout, or panics.
    fn cli(&self, program: &str, args: &[&str]) -> String {
        let out = self.try_cli(program, args);
        out.unwrap_or_else(|e| panic!("{program} {}: {e}", args.join(" ")))
    }

    fn try_cli(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let out = Command::new(program)
            .args(args)
            .env("SLURM_CONF", &self.conf)
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
        let out = Command::new(&self.up)
            .env_remove("SLURM_JWT")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "up.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
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
            // A failure here is fine if someone else resumed it meanwhile.
            let _ = self.try_cli(
                "scontrol",
                &["update", &format!("nodename={node}"), "state=resume"],
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
                "timed out after {limit:?} waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// Puts a node back in service when dropped (also when the test panics).
struct RestoreNode(&'static str);

impl Drop for RestoreNode {
    fn drop(&mut self) {
        cluster().restore(self.0);
    }
}

fn fast() -> ObserverConfig {
    ObserverConfig {
        poll_interval_ms: 200,
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
        .map(|(_, e)| e.summary())
        .collect::<Vec<_>>()
        .join("\n")
}

fn node_events<'a>(obs: &'a [Observation], name: &'a str) -> impl Iterator<Item = &'a SlurmNode> {
    obs.iter().filter_map(move |(_, e)| match e {
        Event::SlurmNode(n) if n.name == name => Some(n),
        _ => None,
    })
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

// ------------------------------------------------------------------ tests

#[tokio::test]
async fn actuator_drain_shows_in_slurm_is_idempotent_and_resumes() {
    let c = cluster();
    let _shared = LOCK.read().await;
    const N: &str = "ls-n1";
    let _restore = RestoreNode(N);
    c.restore(N);

    // The 22.05 set-up: reads through slurmrestd, writes through scontrol
    // (v0.0.38 has no node update endpoint).
    let act = Actuator::new(
        Some(c.rest()),
        Some(c.scontrol()),
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
    assert_eq!(n.reason_user.as_deref(), Some("root"));

    // The same drain again changes nothing.
    assert_eq!(act.execute(&drain).await.result, OutcomeResult::AlreadyDone);
    // A drain with another reason updates the reason.
    let other = issued(Action::SlurmDrain {
        node: N.to_owned(),
        reason: "lockstep: other reason".to_owned(),
    });
    assert_eq!(act.execute(&other).await.result, OutcomeResult::Succeeded);
    assert_eq!(c.node(N).reason.as_deref(), Some("lockstep: other reason"));

    // Resume, then resume again: the second finds nothing to do.
    let resume = issued(Action::SlurmResume { node: N.to_owned() });
    assert_eq!(act.execute(&resume).await.result, OutcomeResult::Succeeded);
    let n = c.node(N);
    assert!(!n.has(&SlurmNodeFlag::Drain) && n.reason.is_none(), "{n:?}");
    assert_eq!(
        act.execute(&resume).await.result,
        OutcomeResult::AlreadyDone
    );

    // scontrol alone (sites without slurmrestd) does the same.
    let sc_only = Actuator::new(None, Some(c.scontrol()), ActuatorConfig::default()).unwrap();
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

    // Down with a reason, then resume.
    let down = issued(Action::SlurmDown {
        node: N.to_owned(),
        reason: "lockstep: test down".to_owned(),
    });
    assert_eq!(act.execute(&down).await.result, OutcomeResult::Succeeded);
    let n = c.node(N);
    assert_eq!(
        (n.state.clone(), n.reason.as_deref()),
        (SlurmBaseState::Down, Some("lockstep: test down"))
    );
    assert_eq!(act.execute(&down).await.result, OutcomeResult::AlreadyDone);
    assert_eq!(act.execute(&resume).await.result, OutcomeResult::Succeeded);
    c.restore(N);

    // Features: set, already set, cleared.
    let features = issued(Action::SlurmSetFeatures {
        node: N.to_owned(),
        features: vec!["zone-a".to_owned(), "gpu".to_owned()],
    });
    assert_eq!(
        act.execute(&features).await.result,
        OutcomeResult::Succeeded
    );
    assert_eq!(c.node(N).features, ["gpu", "zone-a"]);
    assert_eq!(
        act.execute(&features).await.result,
        OutcomeResult::AlreadyDone
    );
    let clear = issued(Action::SlurmSetFeatures {
        node: N.to_owned(),
        features: vec![],
    });
    assert_eq!(act.execute(&clear).await.result, OutcomeResult::Succeeded);
    assert!(c.node(N).features.is_empty());

    // Topology needs Slurm 25.05: a final failure that says so.
    let topo = issued(Action::SlurmSetTopology {
        node: N.to_owned(),
        topology: "default:s1".to_owned(),
    });
    match act.execute(&topo).await.result {
        OutcomeResult::Failed {
            retryable: false,
            error,
        } => {
            assert!(
                error.contains("25.05") && error.contains("v0.0.38"),
                "{error}"
            );
        }
        r => panic!("topology on 22.05: {r:?}"),
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

#[tokio::test]
async fn a_submitted_job_appears_and_moves_its_node_to_allocated_or_mixed() {
    let c = cluster();
    let _shared = LOCK.read().await;
    const N: &str = "ls-n3";
    let _restore = RestoreNode(N);
    c.restore(N);
    let mut rest = Observer::new(Backend::Rest(c.rest()), fast());
    let mut sc = Observer::new(Backend::Scontrol(c.scontrol()), fast());
    let first = rest.poll().await;
    assert!(matches!(
        first.first(),
        Some((_, Event::ConnectorStatus { visible: true, .. }))
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
    let cancel = CancelJob(job_id);

    let running = |obs: &[Observation], o: &Observer| {
        obs.iter().any(|(_, e)| {
            matches!(e, Event::SlurmJob(j) if j.job_id == job_id && j.state == SlurmJobState::Running && j.nodes == [N])
        }) && o
            .nodes()
            .iter()
            .any(|n| n.name == N && matches!(n.state, SlurmBaseState::Allocated | SlurmBaseState::Mixed))
    };
    for obs in [&mut rest, &mut sc] {
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

    drop(cancel);
    let ended = |obs: &[Observation], o: &Observer| {
        obs.iter().any(|(_, e)| {
            matches!(e, Event::SlurmJob(j) if j.job_id == job_id && !j.state.holds_nodes())
        }) && o
            .nodes()
            .iter()
            .any(|n| n.name == N && n.state == SlurmBaseState::Idle && !n.has(&SlurmNodeFlag::Completing))
    };
    for obs in [&mut rest, &mut sc] {
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
struct CancelJob(u64);

impl Drop for CancelJob {
    fn drop(&mut self) {
        let _ = cluster().try_cli("scancel", &[&self.0.to_string()]);
    }
}

#[tokio::test]
async fn a_stopped_slurmd_is_observed_not_responding_then_down() {
    let c = cluster();
    let _shared = LOCK.read().await;
    const N: &str = "ls-n4";
    c.restore(N);
    /// Restarts the slurmd (up.sh starts what is missing) and waits until
    /// the node is back.
    struct Restart;
    impl Drop for Restart {
        fn drop(&mut self) {
            let c = cluster();
            c.up();
            c.restore(N);
        }
    }
    let _restart = Restart;
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
    assert_eq!(d.reason.as_deref(), Some("Not responding"));
    // Every event says something new about the node.
    for w in events.windows(2) {
        assert_ne!(w[0], w[1], "duplicate event");
    }
    eprintln!(
        "ls-n4: NOT_RESPONDING then DOWN observed {:?} after the kill",
        started.elapsed()
    );
}

#[tokio::test]
async fn slurmctld_restart_loses_and_duplicates_nothing() {
    let c = cluster();
    let _exclusive = LOCK.write().await;
    let mut obs = Observer::new(Backend::Rest(c.rest()), fast());
    let first = obs.poll().await;
    let mut last: BTreeMap<String, SlurmNode> = first
        .iter()
        .filter_map(|(_, e)| match e {
            Event::SlurmNode(n) => Some((n.name.clone(), n.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(last.len(), 4, "{}", summaries(&first));
    let jobs_before = obs.jobs();

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
        down.iter()
            .any(|(_, e)| matches!(e, Event::ConnectorStatus { visible: false, .. })),
        "{}",
        summaries(&down)
    );
    assert!(
        !down
            .iter()
            .any(|(_, e)| matches!(e, Event::SlurmNodeGone { .. } | Event::SlurmJobGone { .. })),
        "a failed poll must not make objects gone:\n{}",
        summaries(&down)
    );
    c.up();
    let back = poll_until(
        &mut obs,
        "the observer seeing slurm again",
        Duration::from_secs(60),
        |_, o| o.visible(),
    )
    .await;
    assert!(back
        .iter()
        .any(|(_, e)| matches!(e, Event::ConnectorStatus { visible: true, .. })));

    // The observer's view is scontrol's (nodes may still settle after the
    // restart: compare until they agree).
    let sc = c.scontrol();
    let t = Instant::now();
    let mut after = back;
    loop {
        let want = sc.nodes().await.unwrap();
        if obs.nodes() == want {
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
    assert_eq!(obs.jobs(), jobs_before, "no job lost");
    // No event repeats what was already known: unchanged nodes are silent.
    let all: Vec<Observation> = down.into_iter().chain(after).collect();
    for (_, e) in &all {
        match e {
            Event::SlurmNode(n) => {
                let prev = last.insert(n.name.clone(), n.clone());
                assert_ne!(
                    prev.as_ref(),
                    Some(n),
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

#[tokio::test]
async fn slurmrestd_down_is_reported_and_scontrol_still_observes() {
    let c = cluster();
    let _exclusive = LOCK.write().await;
    const N: &str = "ls-n1";
    let _restore = RestoreNode(N);
    /// Restarts slurmrestd when dropped.
    struct RestartRest;
    impl Drop for RestartRest {
        fn drop(&mut self) {
            cluster().up();
        }
    }
    let mut rest = Observer::new(Backend::Rest(c.rest()), fast());
    let mut sc = Observer::new(Backend::Scontrol(c.scontrol()), fast());
    rest.poll().await;
    sc.poll().await;
    // Both back ends see the same cluster.
    assert_eq!(rest.nodes(), sc.nodes());
    assert_eq!(rest.partitions(), sc.partitions());
    assert_eq!(rest.jobs(), sc.jobs());

    let _restart = RestartRest;
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
        .find_map(|(_, e)| match e {
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

    drop(_restart);
    let back = poll_until(
        &mut rest,
        "visible=true and the drain",
        Duration::from_secs(60),
        |seen, _| node_events(seen, N).any(|n| n.has(&SlurmNodeFlag::Drain)),
    )
    .await;
    let status = back
        .iter()
        .position(|(_, e)| matches!(e, Event::ConnectorStatus { visible: true, .. }))
        .unwrap_or_else(|| panic!("{}", summaries(&back)));
    let drained = back
        .iter()
        .position(|(_, e)| matches!(e, Event::SlurmNode(n) if n.name == N))
        .unwrap();
    assert!(
        status < drained,
        "visible first, then what changed meanwhile"
    );
}

#[tokio::test]
async fn an_update_time_poll_answered_500_is_taken_as_changed() {
    let c = cluster();
    let _shared = LOCK.read().await;
    let rest = c.rest();
    let v = rest.version().await.unwrap();
    assert_eq!(v.to_string(), "v0.0.38");
    // Wait for a quiet second (node pings change node data every ~10 s).
    let t = Instant::now();
    let since = loop {
        let since = lockstep_now_s() - 1;
        if let Ok(Fetch::Unchanged) = rest.nodes(Some(since)).await {
            break since;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "never a 304");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Change a node field lockstep does not read (ls-n3's weight).
    c.cli("scontrol", &["update", "nodename=ls-n3", "weight=2"]);
    let (status, _) = rest
        .get_raw(&format!("/slurm/{v}/nodes?update_time={since}"))
        .await
        .unwrap();
    assert_eq!(
        status, 500,
        "Slurm 22.05 answers a changed update_time poll with 500"
    );
    match rest.nodes(Some(since)).await.unwrap() {
        Fetch::Changed(l) => assert_eq!(l.items.len(), 4),
        Fetch::Unchanged => panic!("a 500 means changed"),
    }
    c.cli("scontrol", &["update", "nodename=ls-n3", "weight=1"]);
    // Jobs and partitions answer 304 when nothing changed.
    let later = lockstep_now_s() + 1;
    assert_eq!(
        rest.partitions(Some(later)).await.unwrap(),
        Fetch::Unchanged
    );
}

fn lockstep_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn an_admin_drain_reaches_the_engine_as_a_foreign_drain() {
    let c = cluster();
    let _shared = LOCK.read().await;
    const N: &str = "ls-n2";
    let _restore = RestoreNode(N);
    c.restore(N);
    let mut obs = Observer::new(Backend::Rest(c.rest()), fast());
    let mut engine = Engine::new(Policy::default());
    let mut out = Output::default();
    let mut seq = 0;
    let mut apply = |engine: &mut Engine, obs: Vec<Observation>| {
        for (observed_ms, event) in obs {
            seq += 1;
            let rec = EventRecord {
                seq,
                time_ms: observed_ms,
                envelope: Envelope::new(Source::Slurm, observed_ms, event),
            };
            engine.apply(&rec, &mut out);
        }
    };
    let first = obs.poll().await;
    apply(&mut engine, first);
    assert_eq!(engine.phase(N), Phase::InService);

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
    apply(&mut engine, seen);
    assert_eq!(engine.phase(N), Phase::ForeignDrain);
    assert!(
        !out.actions
            .iter()
            .any(|a| matches!(&a.action, Action::SlurmResume { node } if node == N)),
        "lockstep never resumes a drain it does not own"
    );
}
