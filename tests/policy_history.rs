//! Configuration history and rollback, on the two logs lockstep runs on: the
//! embedded sled log and a real nats-server (started on a free port).
//!
//! The story, the same on both: the policy drains on cordon; k1 is cordoned
//! and n1 drained; a new policy stops draining on cordon, and the cordon of
//! k2 drains nothing; `lockstep policy rollback` puts the first policy back,
//! recorded as a rollback; n2 is drained at the rollback. `lockstep run`
//! folds the log and publishes the actions all along; at the end
//! `replay --verify` recomputes every recorded action across the rollback,
//! and `policy history` shows each change with its diff and the rollback
//! with its sequence and who asked.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use lockstep_schemas::{
    ConditionStatus, Envelope, Event, KubeNode, KubePod, PodPhase, Policy, SlurmBaseState,
    SlurmNode, Source,
};
use lockstep_store::EventLog;
use lockstep_testkit::{free_port, temp_dir, NatsServer};

/// `lockstep run` on one configuration; killed on drop if still running.
struct Service {
    dir: PathBuf,
    config: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Service {
    fn new(name: &str, log_section: &str) -> Self {
        let dir = temp_dir(name);
        let port = free_port();
        let config = dir.join("lockstep.toml");
        std::fs::write(
            &config,
            format!(
                "data_dir = \"data\"\npolicy_file = \"policy.json\"\n[log]\n{log_section}\n[service]\ntick_interval_ms = 200\npolicy_poll_ms = 200\n[telemetry]\nlisten = \"127.0.0.1:{port}\"\n"
            ),
        )
        .unwrap();
        Self {
            dir,
            config,
            port,
            child: None,
        }
    }

    fn write_policy(&self, policy: &Policy) {
        std::fs::write(
            self.dir.join("policy.json"),
            serde_json::to_string_pretty(policy).unwrap(),
        )
        .unwrap();
    }

    fn policy_file(&self) -> Policy {
        Policy::from_json(&std::fs::read_to_string(self.dir.join("policy.json")).unwrap()).unwrap()
    }

    fn start(&mut self) {
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
            .unwrap();
        self.child = Some(child);
    }

    fn status(&self) -> Option<serde_json::Value> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(b"GET /status HTTP/1.0\r\nHost: x\r\n\r\n")
            .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        serde_json::from_str(body.split("\r\n\r\n").nth(1)?.trim()).ok()
    }

    /// Waits until the service leads and has applied everything up to the
    /// head of the log, at least `seq`.
    fn wait_applied(&self, seq: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = self.status() {
                let applied = s["applied_seq"].as_u64().unwrap_or(0);
                let head = s["head_seq"].as_u64().unwrap_or(u64::MAX);
                if s["leader"] == true && applied >= seq && applied >= head {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "lockstep did not apply seq {seq} within 60 s; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        let mut child = self.child.take().expect("running");
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "lockstep run: {status}\n{}", self.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("run.log")).unwrap_or_default()
    }

    fn cli(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_lockstep"))
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .env("USER", "tester")
            .output()
            .unwrap()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        text(&out.stderr),
        text(&out.stdout)
    );
    text(&out.stdout)
}

fn kube_node(name: &str, cordoned: bool) -> Event {
    Event::KubeNode(KubeNode {
        read_labels: None,
        maintenance: None,
        name: name.into(),
        unschedulable: cordoned,
        ready: ConditionStatus::True,
        conditions: vec![],
        labels: Default::default(),
        taints: vec![],
        identity: Default::default(),
        devices: Default::default(),
        version: 0,
    })
}

/// Three Kubernetes nodes, each with a slurmd pod running Slurm node n<i>.
fn world() -> Vec<Event> {
    let mut v = Vec::new();
    for i in 1..=3 {
        v.push(kube_node(&format!("k{i}"), false));
        v.push(Event::SlurmNode(SlurmNode {
            name: format!("n{i}").into(),
            state: SlurmBaseState::Idle,
            flags: vec![],
            reason: None,
            reason_user: None,
            features: vec![],
            topology: None,
            partitions: vec!["batch".into()],
            version: 0,
        }));
        v.push(Event::KubePod(KubePod {
            namespace: "slurm".into(),
            name: format!("n{i}"),
            uid: format!("uid-n{i}"),
            node_name: Some(format!("k{i}")),
            phase: PodPhase::Running,
            ready: true,
            deleting: false,
            disruption_target: false,
            labels: Default::default(),
            conditions: vec![],
            owner: None,
            revision: None,
            unhealthy_devices: Default::default(),
            eviction: Default::default(),
            version: 0,
        }));
    }
    v
}

fn no_cordon_drain() -> Policy {
    let mut p = Policy::default();
    p.drain.on_cordon = false;
    p
}

async fn append(log: &EventLog, events: Vec<Event>) -> u64 {
    let mut last = 0;
    for (i, e) in events.into_iter().enumerate() {
        let observed = 1_772_334_000_000 + i as u64;
        last = log
            .append(&Envelope::new(Source::Test, observed, e))
            .await
            .unwrap()
            .seq;
    }
    log.flush().await.unwrap();
    last
}

/// Every slurm_drain the replay recomputed: (seq, node).
fn drains(replay_json: &str) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for line in replay_json.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        for a in row["actions"].as_array().unwrap() {
            if let Some(d) = a["action"].get("slurm_drain") {
                out.push((
                    row["seq"].as_u64().unwrap(),
                    d["node"].as_str().unwrap().to_owned(),
                ));
            }
        }
    }
    out
}

/// The seq of each `PolicyChanged` in `policy history --json`, with its
/// rollback target (0: none).
fn history(s: &Service) -> Vec<(u64, u64, serde_json::Value)> {
    let out = s.cli(&["policy", "history", "--json"]);
    ok(&out, "policy history")
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["seq"].as_u64().unwrap(),
                v["detail"]["rollback_to_seq"].as_u64().unwrap_or(0),
                v,
            )
        })
        .collect()
}

/// After the story: the log replays with --verify across the rollback (from
/// the configured log, and from an export in both encodings), and history
/// and diff tell it.
fn check_the_log_after_the_rollback(s: &Service, rollback_seq: u64, first_policy_seq: u64) {
    let out = s.cli(&["replay", "--verify", "--json"]);
    let timeline = ok(&out, "replay --verify");
    let err = text(&out.stderr);
    assert!(err.contains("verified: all"), "{err}");
    let d = drains(&timeline);
    assert!(
        d.iter().any(|(_, n)| n == "n1"),
        "the first policy drains the cordoned k1: {d:?}"
    );
    let n2: Vec<u64> = d
        .iter()
        .filter(|(_, n)| n == "n2")
        .map(|(q, _)| *q)
        .collect();
    assert_eq!(
        n2,
        [rollback_seq],
        "n2 is drained at the rollback, not before: {d:?}"
    );

    // The rollback row: its target, who, and the diff against the policy
    // it replaced.
    let h = history(s);
    let row = &h.iter().find(|(seq, _, _)| *seq == rollback_seq).unwrap().2;
    assert_eq!(row["detail"]["rollback_to_seq"], first_policy_seq, "{row}");
    assert!(
        row["detail"]["by"].as_str().unwrap().starts_with("tester"),
        "{row}"
    );
    assert_eq!(
        row["changes"],
        serde_json::json!([{"path": "drain.on_cordon", "from": false, "to": true}]),
        "{row}"
    );
    let out = s.cli(&["policy", "history"]);
    let text_history = ok(&out, "policy history");
    assert!(
        text_history.contains(&format!(
            "rollback to the policy in force at seq {first_policy_seq}, by tester"
        )),
        "{text_history}"
    );
    assert!(
        text_history.contains("~ drain.on_cordon: false -> true"),
        "{text_history}"
    );
    let out = s.cli(&[
        "policy",
        "diff",
        &first_policy_seq.to_string(),
        &(rollback_seq - 1).to_string(),
    ]);
    assert!(
        ok(&out, "policy diff").contains("~ drain.on_cordon: true -> false"),
        "{}",
        text(&out.stdout)
    );

    // An exported file replays and verifies the same, in both encodings,
    // and tells the same history.
    for name in ["export.jsonl", "export.msgpack"] {
        let file = s.dir.join(name);
        let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
            .args(["export", "--config"])
            .arg(&s.config)
            .arg(&file)
            .output()
            .unwrap();
        ok(&out, "export");
        let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
            .args(["replay", "--verify", "--json"])
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(drains(&ok(&out, "replay --verify of the export")), d);
        let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
            .args(["policy", "history"])
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(ok(&out, "history of the export"), text_history);
    }
}

#[test]
fn a_rollback_on_the_embedded_log_is_audited_and_replays() {
    let mut s = Service::new("rollback-embedded", "");
    s.write_policy(&Policy::default());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let log_dir = s.dir.join("data/log");
    std::fs::create_dir_all(&log_dir).unwrap();

    // The world, k1 cordoned; the service folds it under the first policy.
    let head = rt.block_on(async {
        let log = EventLog::open_embedded(&log_dir).unwrap();
        let mut events = world();
        events.push(kube_node("k1", true));
        append(&log, events).await
    });
    s.start();
    s.wait_applied(head + 1);
    s.stop();

    // The second policy, then k2 cordoned: nothing drains.
    s.write_policy(&no_cordon_drain());
    s.start();
    s.wait_applied(head + 2);
    s.stop();
    let head = rt.block_on(async {
        let log = EventLog::open_embedded(&log_dir).unwrap();
        append(&log, vec![kube_node("k2", true)]).await
    });
    let h = history(&s);
    assert_eq!(h.len(), 2, "{h:?}");
    let first = h[0].0;
    assert_eq!(
        h[0].2["detail"]["file"],
        s.dir.join("policy.json").display().to_string()
    );

    // Rolled back with the service stopped (an embedded log has one user).
    let out = s.cli(&["policy", "rollback", &first.to_string()]);
    let said = ok(&out, "policy rollback");
    let rollback_seq = head + 1;
    assert!(
        said.contains(&format!(
            "appended seq {rollback_seq}: rollback to the policy in force at seq {first}"
        )),
        "{said}"
    );
    assert_eq!(
        s.policy_file(),
        Policy::default(),
        "the policy file follows"
    );
    // Rolling back to what is in force appends nothing.
    let out = s.cli(&["policy", "rollback", &first.to_string()]);
    assert!(ok(&out, "second rollback").contains("nothing to roll back"));

    s.start();
    s.wait_applied(rollback_seq + 1);
    // While the service runs, the embedded log is its own: a rollback is
    // refused with the reason.
    let out = s.cli(&["policy", "rollback", "1"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is `lockstep run` running with this configuration?"),
        "{}",
        text(&out.stderr)
    );
    s.stop();

    let h = history(&s);
    let rollbacks: Vec<_> = h.iter().filter(|(_, to, _)| *to > 0).collect();
    assert_eq!(rollbacks.len(), 1, "{h:?}");
    assert_eq!(rollbacks[0].0, rollback_seq);
    check_the_log_after_the_rollback(&s, rollback_seq, first);
}

#[test]
fn a_rollback_on_nats_while_lockstep_runs_is_audited_and_replays() {
    let nats = NatsServer::start();
    let mut s = Service::new("rollback-nats", &format!("nats_url = \"{}\"", nats.url()));
    s.write_policy(&Policy::default());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let log = rt.block_on(EventLog::connect_nats(&nats.url(), &Default::default()));
    let log = log.unwrap();

    s.start();
    // The service appends the policy file's policy once it acts.
    s.wait_applied(1);
    let head = rt.block_on(async {
        let mut events = world();
        events.push(kube_node("k1", true));
        append(&log, events).await
    });
    s.wait_applied(head);
    s.write_policy(&no_cordon_drain());
    let policy_seq = crate_wait(|| {
        let h = history(&s);
        (h.len() == 2).then(|| h[1].0)
    });
    s.wait_applied(policy_seq);
    let head = rt.block_on(append(&log, vec![kube_node("k2", true)]));
    s.wait_applied(head);

    let first = history(&s)[0].0;
    // While lockstep runs: the rollback goes into the NATS log, the service
    // applies it (and the policy file it rewrote, which changes nothing).
    let out = s.cli(&["policy", "rollback", &first.to_string()]);
    let said = ok(&out, "policy rollback");
    let rollback_seq: u64 = said
        .strip_prefix("appended seq ")
        .and_then(|r| r.split(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!(rollback_seq > head, "{said}");
    s.wait_applied(rollback_seq);
    // The policy file's rewrite is appended as a change that changes nothing.
    let h = crate_wait(|| {
        let h = history(&s);
        (h.len() == 4).then_some(h)
    });
    assert_eq!(h[3].2["changes"], serde_json::json!([]), "{:?}", h[3]);
    s.wait_applied(h[3].0);
    s.stop();
    check_the_log_after_the_rollback(&s, rollback_seq, first);

    // And straight from the NATS URL.
    let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["policy", "history", &nats.url()])
        .output()
        .unwrap();
    assert!(ok(&out, "history from nats://").contains("rollback to the policy in force"));
}

/// Polls `f` every 100 ms for up to 30 s.
fn crate_wait<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "not within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[allow(dead_code)]
fn _paths(_: &Path) {}
