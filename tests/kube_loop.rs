//! `lockstep run` with a Kubernetes section, against a real kube-apiserver
//! (`deploy/local/kube`) and a real nats-server: what happens in the API
//! server reaches the log, and what the reducer decides reaches the API
//! server.
//!
//! The Slurm side is played by the test: it appends Slurm observations to
//! the log as the Slurm connector would.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_schemas::{Action, Envelope, Event, SlurmBaseState, SlurmNode, SlurmNodeFlag, Source};
mod common;

use common::{kubectl_path, lockstep_kubeconfig, repo, Reap, STATE};
use lockstep_store::testing::{temp_dir, NatsServer};
use lockstep_store::{EventLog, StreamLimits};

/// Starts (or finds running) the local control plane; fails loudly if it
/// cannot be built or started.
fn control_plane() -> (PathBuf, PathBuf) {
    let status = Command::new(repo().join("deploy/local/kube/up.sh"))
        .env("LOCKSTEP_STATE_DIR", STATE)
        .stdout(Stdio::null())
        .status()
        .expect("deploy/local/kube/up.sh runs");
    assert!(status.success(), "deploy/local/kube/up.sh failed");
    (Path::new(STATE).join("kube/kubeconfig"), kubectl_path())
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    fn run(&self, args: &[&str], stdin: Option<&str>) -> String {
        use std::io::Write;
        let mut child = Command::new(&self.bin)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.run(&a, None)).unwrap()
    }
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every record up to the head (a read returns what is at hand, in batches).
async fn read_all(log: &EventLog) -> Vec<lockstep_schemas::EventRecord> {
    let head = log.head().await.unwrap();
    let mut out: Vec<lockstep_schemas::EventRecord> = Vec::new();
    let mut next = 1;
    while next <= head {
        let batch = log.read(next, 1024, Duration::from_secs(5)).await.unwrap();
        assert!(
            !batch.is_empty(),
            "the log stopped at {next} before its head {head}"
        );
        next = batch.last().unwrap().seq + 1;
        out.extend(batch);
    }
    out
}

#[test]
fn cordons_reach_the_log_and_decisions_reach_the_api_server() {
    let (kubeconfig, kubectl) = control_plane();
    let k = Kubectl {
        bin: kubectl,
        kubeconfig: kubeconfig.clone(),
    };
    let run = format!("{}", std::process::id());
    let node = format!("loop-node-{run}");
    let pod = format!("loop-slurmd-{run}");
    k.run(
        &["apply", "-f", "-"],
        Some(
            &serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
                .to_string(),
        ),
    );
    k.run(
        &["apply", "-f", "-"],
        Some(
            &serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": "default", "labels": {"app.kubernetes.io/component": "slurmd"}},
                "spec": {"nodeName": node, "containers": [{"name": "slurmd", "image": "slurmd:test"}]}
            })
            .to_string(),
        ),
    );

    let nats = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let log = rt
        .block_on(EventLog::connect_nats(
            &nats.url(),
            &StreamLimits::default(),
        ))
        .unwrap();
    let dir = temp_dir("kube-loop");
    let config = dir.join("lockstep.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"data\"\n[log]\nnats_url = \"{}\"\n[service]\ntick_interval_ms = 500\n[telemetry]\n[kubernetes]\nkubeconfig = \"{}\"\n",
            nats.url(),
            lockstep_kubeconfig().display()
        )
        .replace("[telemetry]\n", "[telemetry]\nlisten = \"127.0.0.1:0\"\n"),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("run.log")).unwrap())
        .spawn()
        .map(|c| Reap(Some(c)))
        .unwrap();
    let run_log = || std::fs::read_to_string(dir.join("run.log")).unwrap_or_default();

    // The Slurm side: the node exists, idle.
    let mut slurm = SlurmNode {
        name: pod.clone(),
        state: SlurmBaseState::Idle,
        flags: vec![],
        reason: None,
        reason_user: None,
        features: vec![],
        topology: None,
        partitions: vec![],
    };
    rt.block_on(log.append(&Envelope::new(
        Source::Test,
        1,
        Event::SlurmNode(slurm.clone()),
    )))
    .unwrap();

    // kubectl cordon reaches the log and the reducer drains the Slurm node:
    // the action appears on the action stream (no Slurm actuator here).
    k.run(&["cordon", &node], None);
    let drain = wait_for(
        "a drain for the cordon on the action stream",
        Duration::from_secs(60),
        || {
            rt.block_on(log.actions()).ok()?.into_iter().find(|a| {
            matches!(&a.action, Action::SlurmDrain { node: n, reason } if *n == pod && reason.contains("cordoned"))
        })
        },
    );
    assert_eq!(drain.rule, "drain.cordon", "{}", run_log());
    k.run(&["uncordon", &node], None);

    // An admin drains the node in Slurm: lockstep shows the foreign drain on
    // the pod, through the real API server.
    slurm.flags = vec![SlurmNodeFlag::Drain];
    slurm.reason = Some("admin: reseat GPU".into());
    slurm.reason_user = Some("root".into());
    rt.block_on(log.append(&Envelope::new(Source::Test, 2, Event::SlurmNode(slurm))))
        .unwrap();
    let condition = wait_for(
        "pod condition SlurmNodeDrained=True",
        Duration::from_secs(60),
        || {
            let p = k.json(&["get", "pod", &pod, "-n", "default"]);
            p["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "SlurmNodeDrained" && c["status"] == "True")
                .cloned()
        },
    );
    assert_eq!(condition["message"], "admin: reseat GPU", "{}", run_log());

    // Both directions are in the log: the Kubernetes observations and the
    // actuator's outcome.
    let records = rt.block_on(read_all(&log));
    assert!(records.iter().any(|r| r.envelope.source == Source::Kubernetes
        && matches!(&r.envelope.event, Event::KubeNode(n) if n.name == node && n.unschedulable)));
    let outcome = wait_for(
        "the pod condition's outcome in the log",
        Duration::from_secs(30),
        || {
            rt.block_on(read_all(&log)).into_iter().find(|r| {
            r.envelope.source == Source::Actuator
                && matches!(&r.envelope.event, Event::ActionOutcome(o) if o.kind.name() == "kube_set_pod_condition")
        })
        },
    );
    assert!(
        matches!(&outcome.envelope.event, Event::ActionOutcome(o) if o.result == lockstep_schemas::OutcomeResult::Succeeded)
    );

    let status = child.stop();
    assert!(status.success(), "{}", run_log());
    k.run(
        &[
            "delete",
            "pod",
            &pod,
            "-n",
            "default",
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    k.run(&["delete", "node", &node], None);
    let _ = std::fs::remove_dir_all(dir);
}
