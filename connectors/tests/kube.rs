//! The Kubernetes connector against a real kube-apiserver (and etcd), as
//! `deploy/local/kube/up.sh` builds and starts them. No kubelet runs: the
//! tests create Node and Pod objects and set their status through the API,
//! as a kubelet would.
//!
//! Two control planes:
//!
//! - the shared one (`/tmp/lockstep-local`, port 16443) for tests that only
//!   create and change their own objects; they run in parallel, each with
//!   its own object names and label selector;
//! - a second one (`/tmp/lockstep-kube-disrupt`, port 16444) for the tests
//!   that stop and restart kube-apiserver or compact etcd. They hold
//!   `DISRUPT_LOCK`, so they run one at a time without stopping the others.
//!
//! A missing control plane is a failure, never a skip: `up.sh` is run once
//! per process and per control plane, and its output is shown if it fails.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams};
use lockstep_connectors::kube::{
    Actuator, ActuatorConfig, Leadership, LeaseConfig, Observation, ObserveSpec, Observer,
    ObserverConfig, ScaleKind,
};
use lockstep_schemas::{
    Action, ActionId, ActionOutcome, ConditionStatus, Connector, Domain, Event, EventId,
    IssuedAction, KubeNode, KubePod, KubeScaleTarget, OutcomeResult, PodCondition, PodPhase,
    Policy, ScaleTargetRef, Source, Taint, TaintEffect,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;

// ---------------------------------------------------------------------------
// Control planes

#[derive(Clone)]
struct ControlPlane {
    /// Environment for up.sh / down.sh.
    env: Vec<(&'static str, String)>,
    state_dir: PathBuf,
    kubeconfig: PathBuf,
    kubectl: PathBuf,
    api_addr: SocketAddr,
    etcd_port: u16,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("connectors/ is in the repo")
        .to_owned()
}

impl ControlPlane {
    fn new(state: &str, api_port: u16, etcd_port: u16) -> Self {
        let state_dir = PathBuf::from(state).join("kube");
        Self {
            env: vec![
                ("LOCKSTEP_STATE_DIR", state.to_owned()),
                ("LOCKSTEP_KUBE_API_PORT", api_port.to_string()),
                ("LOCKSTEP_ETCD_CLIENT_PORT", etcd_port.to_string()),
                ("LOCKSTEP_ETCD_PEER_PORT", (etcd_port + 1).to_string()),
            ],
            kubeconfig: state_dir.join("kubeconfig"),
            kubectl: PathBuf::new(),
            state_dir,
            api_addr: SocketAddr::from(([127, 0, 0, 1], api_port)),
            etcd_port,
        }
    }

    fn script(&self, name: &str, args: &[&str], apiserver_args: &str) {
        let path = repo_root().join("deploy/local/kube").join(name);
        let out = Command::new(&path)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("LOCKSTEP_KUBE_APISERVER_EXTRA_ARGS", apiserver_args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
        assert!(
            out.status.success(),
            "{} {args:?} failed ({}); the kube tests need a real control plane.\n--- stdout\n{}\n--- stderr\n{}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
    }

    /// Starts etcd and kube-apiserver unless running; reads env.sh.
    fn up(&mut self, apiserver_args: &str) {
        self.script("up.sh", &[], apiserver_args);
        let env_sh =
            std::fs::read_to_string(self.state_dir.join("env.sh")).expect("up.sh writes env.sh");
        // env.sh puts the bin dir of the built kubectl first on PATH:
        //   ... export PATH='/root/.cache/lockstep/kube/v1.37.2/bin':"$PATH" ...
        let bin = env_sh
            .split("export PATH='")
            .nth(1)
            .and_then(|rest| rest.split('\'').next())
            .expect("env.sh exports PATH with the kubectl bin dir");
        self.kubectl = Path::new(bin).join("kubectl");
        assert!(
            self.kubectl.exists(),
            "no kubectl at {}",
            self.kubectl.display()
        );
        assert!(
            self.kubeconfig.exists(),
            "no kubeconfig at {}",
            self.kubeconfig.display()
        );
    }

    fn stop_apiserver(&self) {
        self.script("down.sh", &["--apiserver-only"], "");
    }

    async fn kube_config(&self) -> kube::Config {
        lockstep_connectors::kube::load_config(Some(&self.kubeconfig))
            .await
            .expect("kubeconfig written by up.sh loads")
    }

    fn kubectl_output(&self, args: &[&str], stdin: Option<&str>) -> std::process::Output {
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        if let Some(input) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("piped")
                .write_all(input.as_bytes())
                .expect("write kubectl stdin");
        }
        child.wait_with_output().expect("kubectl finishes")
    }

    /// Runs kubectl; panics with its output if it fails.
    fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_output(args, None);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    }

    fn create(&self, obj: &Value) {
        let out = self.kubectl_output(&["create", "-f", "-"], Some(&obj.to_string()));
        assert!(
            out.status.success(),
            "kubectl create {obj} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `kubectl get -o json`.
    fn get(&self, args: &[&str]) -> Value {
        let mut a = vec!["get", "-o", "json"];
        a.extend_from_slice(args);
        serde_json::from_str(&self.kubectl(&a)).expect("kubectl prints json")
    }

    fn exists(&self, args: &[&str]) -> bool {
        let mut a = vec!["get", "--ignore-not-found", "-o", "name"];
        a.extend_from_slice(args);
        !self.kubectl(&a).trim().is_empty()
    }

    fn patch_status(&self, kind_name: &[&str], patch: &Value) {
        let mut a = vec!["patch"];
        a.extend_from_slice(kind_name);
        let p = patch.to_string();
        a.extend_from_slice(&["--subresource=status", "--type=merge", "-p", &p]);
        self.kubectl(&a);
    }

    fn etcd(&self, path: &str, body: &str) -> Value {
        let url = format!("http://127.0.0.1:{}/v3/kv/{path}", self.etcd_port);
        let out = Command::new("curl")
            .args(["-fsS", "-m", "10", "-X", "POST", &url, "-d", body])
            .output()
            .expect("curl runs");
        assert!(
            out.status.success(),
            "etcd {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("etcd answers json")
    }

    /// etcd's current revision (every answer's header carries it; "Lw==" is "/").
    fn etcd_revision(&self) -> u64 {
        self.etcd("range", r#"{"key":"Lw==","limit":1}"#)["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .expect("revision")
    }

    /// Compacts etcd's history up to `revision`: a watch from an older
    /// resourceVersion then gets `410 Gone` (when kube-apiserver serves
    /// watches from etcd, i.e. `--watch-cache=false`).
    fn compact_etcd(&self, revision: u64) {
        self.etcd(
            "compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        );
    }
}

static SHARED: OnceLock<ControlPlane> = OnceLock::new();
static DISRUPT: OnceLock<Mutex<ControlPlane>> = OnceLock::new();
/// Held by the tests that stop kube-apiserver or compact etcd.
static DISRUPT_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn shared() -> &'static ControlPlane {
    SHARED.get_or_init(|| {
        let mut cp = ControlPlane::new("/tmp/lockstep-local", 16443, 2479);
        cp.up("");
        cp
    })
}

/// The control plane the disruptive tests may stop; call with
/// `DISRUPT_LOCK` held.
fn disrupt() -> &'static Mutex<ControlPlane> {
    DISRUPT.get_or_init(|| {
        let mut cp = ControlPlane::new("/tmp/lockstep-kube-disrupt", 16444, 2481);
        cp.up("");
        Mutex::new(cp)
    })
}

/// Restarts the disruptive control plane's kube-apiserver with `args`;
/// returns a copy to use while `DISRUPT_LOCK` is held.
fn restart_apiserver(args: &str) -> ControlPlane {
    let mut cp = disrupt().lock().expect("not poisoned");
    cp.stop_apiserver();
    cp.up(args);
    cp.clone()
}

// ---------------------------------------------------------------------------
// Fixtures

/// A name unique to this process and call: tests run in parallel and
/// repeatedly against the same API server.
fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .subsec_nanos();
    format!(
        "{prefix}-{}-{}-{:x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos % 0xffff
    )
}

const NS: &str = "default";
const TEST_LABEL: &str = "lockstep-test";
const ZONE: &str = "topology.kubernetes.io/zone";

/// What the tests observe: the default policy plus a watched node
/// condition, a node-name label, a zone label and a rack annotation,
/// restricted to the objects labelled `lockstep-test=<run>`.
fn spec(run: &str) -> ObserveSpec {
    let mut policy = Policy::default();
    policy.health.node_conditions = vec!["GpuXid".to_owned()];
    policy.mapping.node_name_label = Some("slurm.node".to_owned());
    let selector = format!("{TEST_LABEL}={run}");
    policy.mapping.pod_selector = selector.clone();
    let mut spec = ObserveSpec::from_policy(&policy, &[ZONE, "annotation:lockstep.io/rack"]);
    spec.node_selector = Some(selector.clone());
    spec.namespace = Some(NS.to_owned());
    spec.scale_selector = Some(selector);
    spec
}

fn test_observer_config() -> ObserverConfig {
    ObserverConfig {
        backoff_initial_ms: 100,
        backoff_max_ms: 1_000,
        probe_interval_ms: 200,
        probe_timeout_ms: 2_000,
        connect_timeout_ms: 2_000,
        ..ObserverConfig::default()
    }
}

fn node_obj(name: &str, run: &str, zone: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {TEST_LABEL: run, ZONE: zone, "unwatched": "x"}},
    })
}

fn pod_obj(name: &str, run: &str, node: Option<&str>) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": NS,
            "labels": {TEST_LABEL: run, "slurm.node": format!("slurm-{name}"),
                       "controller-revision-hash": "compute-rev1"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "compute",
                                 "uid": "00000000-0000-0000-0000-000000000001", "controller": true}],
        },
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30,
                 "containers": [{"name": "slurmd", "image": "slurmd:test"}]},
    })
}

fn stateful_set_obj(name: &str, run: &str, replicas: u32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": NS, "labels": {TEST_LABEL: run}},
        "spec": {
            "replicas": replicas, "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "slurmd", "image": "slurmd:test"}]}},
        },
    })
}

fn node_conditions(ready: &str, heartbeat: &str, extra: &[(&str, &str, &str)]) -> Value {
    let mut c = vec![
        json!({"type": "Ready", "status": ready, "reason": "KubeletReady",
        "lastHeartbeatTime": heartbeat, "lastTransitionTime": "2025-01-01T00:00:00Z"}),
    ];
    for (t, s, r) in extra {
        c.push(json!({"type": t, "status": s, "reason": r,
            "lastHeartbeatTime": heartbeat, "lastTransitionTime": "2025-01-01T00:00:00Z"}));
    }
    json!({"status": {"conditions": c}})
}

/// A running observer and everything it sent so far.
struct Watch {
    rx: mpsc::Receiver<Observation>,
    seen: Vec<Event>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const WAIT: Duration = Duration::from_secs(20);

impl Watch {
    fn start(config: kube::Config, spec: ObserveSpec) -> Self {
        let observer = Observer::new(config, spec, test_observer_config()).expect("observer");
        let (tx, rx) = mpsc::channel(1024);
        Self {
            rx,
            seen: Vec::new(),
            task: tokio::spawn(observer.run(tx)),
        }
    }

    async fn recv(&mut self, deadline: tokio::time::Instant) -> Option<Event> {
        match tokio::time::timeout_at(deadline, self.rx.recv()).await {
            Ok(Some((source, observed_ms, event))) => {
                assert_eq!(source, Source::Kubernetes);
                assert!(
                    observed_ms > 1_600_000_000_000,
                    "observed_ms is wall-clock ms"
                );
                self.seen.push(event.clone());
                Some(event)
            }
            Ok(None) => panic!("observer stopped; events so far:\n{}", self.history()),
            Err(_) => None,
        }
    }

    fn history(&self) -> String {
        let from = self.seen.len().saturating_sub(60);
        self.seen[from..]
            .iter()
            .map(|e| format!("  {}", e.summary()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The next event matching `pred`, within `WAIT`; panics otherwise.
    async fn next(&mut self, what: &str, pred: impl Fn(&Event) -> bool) -> Event {
        let deadline = tokio::time::Instant::now() + WAIT;
        while let Some(e) = self.recv(deadline).await {
            if pred(&e) {
                return e;
            }
        }
        panic!(
            "no {what} within {WAIT:?}; last events:\n{}",
            self.history()
        )
    }

    async fn node(&mut self, name: &str, what: &str, pred: impl Fn(&KubeNode) -> bool) -> KubeNode {
        match self
            .next(
                what,
                |e| matches!(e, Event::KubeNode(n) if n.name == name && pred(n)),
            )
            .await
        {
            Event::KubeNode(n) => n,
            _ => unreachable!(),
        }
    }

    async fn pod(&mut self, name: &str, what: &str, pred: impl Fn(&KubePod) -> bool) -> KubePod {
        match self
            .next(
                what,
                |e| matches!(e, Event::KubePod(p) if p.name == name && pred(p)),
            )
            .await
        {
            Event::KubePod(p) => p,
            _ => unreachable!(),
        }
    }

    async fn synced(&mut self, domain: Domain) {
        self.next(
            &format!("SyncDone {domain:?}"),
            |e| matches!(e, Event::SyncDone { domain: d } if *d == domain),
        )
        .await;
    }

    async fn visible(&mut self, visible: bool) -> Event {
        self.next(&format!("ConnectorStatus visible={visible}"), |e| {
            matches!(e, Event::ConnectorStatus { connector: Connector::Kubernetes, visible: v, .. } if *v == visible)
        })
        .await
    }

    /// Everything sent within `d`.
    async fn quiet(&mut self, d: Duration) -> Vec<Event> {
        let deadline = tokio::time::Instant::now() + d;
        let mut got = Vec::new();
        while let Some(e) = self.recv(deadline).await {
            got.push(e);
        }
        got
    }

    /// Waits until the nodes the log describes (folded as the reducer
    /// folds them) satisfy `pred`.
    async fn converge(&mut self, what: &str, pred: impl Fn(&BTreeMap<String, KubeNode>) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if pred(&mirror_nodes(&self.seen)) {
                return;
            }
            if self.recv(deadline).await.is_none() {
                panic!(
                    "nodes did not converge to {what}; folded: {:?}\nlast events:\n{}",
                    mirror_nodes(&self.seen).keys().collect::<Vec<_>>(),
                    self.history()
                );
            }
        }
    }
}

/// The Kubernetes nodes a log describes, folded with the reducer's rules:
/// `*Gone` removes, and whatever a `SyncStarted` .. `SyncDone` listing did
/// not list is gone.
fn mirror_nodes(events: &[Event]) -> BTreeMap<String, KubeNode> {
    let mut nodes: BTreeMap<String, (KubeNode, u32)> = BTreeMap::new();
    let (mut gen, mut listing) = (0, false);
    for e in events {
        match e {
            Event::KubeNode(n) => {
                nodes.insert(n.name.clone(), (n.clone(), gen));
            }
            Event::KubeNodeGone { name, .. } => {
                nodes.remove(name);
            }
            Event::SyncStarted {
                domain: Domain::KubeNodes,
            } => {
                gen += 1;
                listing = true;
            }
            Event::SyncDone {
                domain: Domain::KubeNodes,
            } if listing => {
                nodes.retain(|_, (_, g)| *g == gen);
                listing = false;
            }
            _ => {}
        }
    }
    nodes.into_iter().map(|(k, (n, _))| (k, n)).collect()
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

async fn actuator(cp: &ControlPlane) -> Actuator {
    Actuator::new(
        cp.kube_config().await,
        vec![ScaleKind::stateful_set()],
        ActuatorConfig::default(),
    )
    .expect("actuator")
}

#[track_caller]
fn assert_failed(o: &ActionOutcome, retryable: bool, contains: &str) {
    match &o.result {
        OutcomeResult::Failed {
            retryable: r,
            error,
        } => {
            assert_eq!(*r, retryable, "retryable of {error:?}");
            assert!(
                error.contains(contains),
                "{error:?} should contain {contains:?}"
            );
            assert!(
                error.chars().next().is_some_and(|c| !c.is_uppercase()),
                "lowercase message: {error:?}"
            );
        }
        other => panic!("expected failure ({contains}), got {other:?}"),
    }
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

// ---------------------------------------------------------------------------
// Observer

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_lifecycle_appears_as_observations() {
    let cp = shared();
    let run = unique("nodes");
    let name = unique("node");
    let mut w = Watch::start(cp.kube_config().await, spec(&run));
    w.synced(Domain::KubeNodes).await;

    cp.create(&node_obj(&name, &run, "z1"));
    let n = w.node(&name, "created node", |_| true).await;
    assert_eq!(n.ready, ConditionStatus::Unknown, "no Ready condition yet");
    assert!(!n.unschedulable);
    assert_eq!(
        n.labels,
        BTreeMap::from([(ZONE.to_owned(), "z1".to_owned())]),
        "only named labels"
    );
    assert!(
        n.taints.is_empty(),
        "node.kubernetes.io/not-ready is not lockstep's"
    );

    cp.patch_status(
        &["node", &name],
        &node_conditions("True", "2025-01-01T00:00:00Z", &[]),
    );
    w.node(&name, "Ready=True", |n| n.ready == ConditionStatus::True)
        .await;

    cp.kubectl(&["cordon", &name]);
    w.node(&name, "cordoned", |n| n.unschedulable).await;

    cp.patch_status(
        &["node", &name],
        &node_conditions("False", "2025-01-01T00:00:10Z", &[]),
    );
    w.node(&name, "NotReady", |n| {
        n.ready == ConditionStatus::False && n.unschedulable
    })
    .await;

    cp.kubectl(&["label", "node", &name, &format!("{ZONE}=z2"), "--overwrite"]);
    w.node(&name, "relabelled", |n| {
        n.labels.get(ZONE).map(String::as_str) == Some("z2")
    })
    .await;

    cp.kubectl(&["annotate", "node", &name, "lockstep.io/rack=r7"]);
    w.node(&name, "annotated", |n| {
        n.labels
            .get("annotation:lockstep.io/rack")
            .map(String::as_str)
            == Some("r7")
    })
    .await;

    cp.patch_status(
        &["node", &name],
        &node_conditions(
            "False",
            "2025-01-01T00:00:20Z",
            &[("GpuXid", "True", "Xid79")],
        ),
    );
    let n = w
        .node(&name, "GpuXid condition", |n| !n.conditions.is_empty())
        .await;
    assert_eq!(n.conditions[0].type_, "GpuXid");
    assert_eq!(
        (n.conditions[0].status, n.conditions[0].reason.as_str()),
        (ConditionStatus::True, "Xid79")
    );

    cp.kubectl(&[
        "taint",
        "node",
        &name,
        "lockstep.io/slurm-unhealthy=:NoSchedule",
        "example.com/other=x:NoSchedule",
    ]);
    let n = w
        .node(&name, "lockstep taint", |n| !n.taints.is_empty())
        .await;
    assert_eq!(
        n.taints,
        vec![Taint {
            key: "lockstep.io/slurm-unhealthy".to_owned(),
            value: String::new(),
            effect: TaintEffect::NoSchedule
        }],
        "only lockstep's taints"
    );

    // A kubelet heartbeat (new lastHeartbeatTime, same statuses), a label
    // and an annotation lockstep does not read: nothing to report.
    cp.patch_status(
        &["node", &name],
        &node_conditions(
            "False",
            "2025-01-01T00:05:00Z",
            &[("GpuXid", "True", "Xid79")],
        ),
    );
    cp.kubectl(&["label", "node", &name, "unwatched=y", "--overwrite"]);
    cp.kubectl(&["annotate", "node", &name, "noise=1"]);
    let got = w.quiet(Duration::from_millis(1_500)).await;
    assert!(
        got.is_empty(),
        "heartbeat and unwatched changes made events: {got:?}"
    );

    cp.kubectl(&["delete", "node", &name]);
    w.next(
        "node gone",
        |e| matches!(e, Event::KubeNodeGone { name: n, version } if *n == name && *version != 0),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_lifecycle_appears_as_observations() {
    let cp = shared();
    let run = unique("pods");
    let (node, p1, p2, stranger) = (unique("pnode"), unique("pod"), unique("pod"), unique("pod"));
    cp.create(&node_obj(&node, &run, "z1"));
    let mut w = Watch::start(cp.kube_config().await, spec(&run));
    w.synced(Domain::KubePods).await;

    // A pod without the selector's label is never seen.
    let mut other = pod_obj(&stranger, &run, Some(&node));
    other["metadata"]["labels"][TEST_LABEL] = json!("someone-else");
    cp.create(&other);

    cp.create(&pod_obj(&p1, &run, Some(&node)));
    let p = w.pod(&p1, "created pod", |_| true).await;
    let uid = cp.get(&["pod", &p1, "-n", NS])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(p.version, 0, "the pod's resourceVersion is its version");
    assert_eq!(
        p,
        KubePod {
            namespace: NS.to_owned(),
            name: p1.clone(),
            uid,
            node_name: Some(node.clone()),
            phase: PodPhase::Pending,
            ready: false,
            deleting: false,
            disruption_target: false,
            labels: BTreeMap::from([("slurm.node".to_owned(), format!("slurm-{p1}"))]),
            conditions: vec![],
            owner: Some(lockstep_schemas::OwnerRef {
                kind: "StatefulSet".to_owned(),
                name: "compute".to_owned()
            }),
            revision: Some("compute-rev1".to_owned()),
            version: p.version,
        }
    );

    cp.patch_status(
        &["pod", &p1, "-n", NS],
        &json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastProbeTime": null},
            {"type": "SlurmNodeDrained", "status": "True", "reason": "Admin", "message": "maintenance"},
        ]}}),
    );
    let p = w
        .pod(&p1, "running with a managed condition", |p| {
            p.phase == PodPhase::Running
        })
        .await;
    assert_eq!(
        p.conditions,
        vec![PodCondition {
            type_: "SlurmNodeDrained".to_owned(),
            status: ConditionStatus::True,
            reason: "Admin".to_owned(),
            message: "maintenance".to_owned(),
        }],
        "only the conditions lockstep manages"
    );
    assert!(p.ready, "the Ready condition is read");

    // Status churn lockstep does not read: nothing.
    cp.patch_status(
        &["pod", &p1, "-n", NS],
        &json!({"status": {"podIP": "10.0.0.7", "conditions": [
            {"type": "Ready", "status": "True", "lastProbeTime": "2025-01-01T00:00:00Z"},
            {"type": "SlurmNodeDrained", "status": "True", "reason": "Admin", "message": "maintenance"},
        ]}}),
    );
    let got = w.quiet(Duration::from_millis(1_500)).await;
    assert!(
        got.is_empty(),
        "unread pod status changes made events: {got:?}"
    );

    // A real eviction: the API server sets DisruptionTarget, then deletes
    // (gracefully: without a kubelet the pod stays, deleting).
    let pods: Api<Pod> =
        Api::namespaced(kube::Client::try_from(cp.kube_config().await).unwrap(), NS);
    pods.evict(&p1, &EvictParams::default())
        .await
        .expect("eviction");
    let p = w
        .pod(&p1, "evicted", |p| p.disruption_target && p.deleting)
        .await;
    assert_eq!(p.phase, PodPhase::Running);

    // A plain delete: deleting without DisruptionTarget.
    cp.create(&pod_obj(&p2, &run, Some(&node)));
    w.pod(&p2, "second pod", |p| !p.deleting).await;
    cp.kubectl(&["delete", "pod", &p2, "-n", NS, "--wait=false"]);
    let p = w.pod(&p2, "deleting", |p| p.deleting).await;
    assert!(!p.disruption_target);

    for p in [&p1, &p2] {
        cp.kubectl(&[
            "delete",
            "pod",
            p,
            "-n",
            NS,
            "--grace-period=0",
            "--force",
            "--wait=false",
        ]);
        w.next(
            "pod gone",
            |e| matches!(e, Event::KubePodGone { name, namespace, .. } if name == p && namespace == NS),
        )
        .await;
    }
    assert!(
        !w.seen.iter().any(|e| e.summary().contains(&stranger)),
        "pod outside the selector was observed"
    );
    cp.kubectl(&[
        "delete",
        "pod",
        &stranger,
        "-n",
        NS,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    cp.kubectl(&["delete", "node", &node]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateful_set_appears_as_scale_target() {
    let cp = shared();
    let run = unique("sts");
    let name = unique("compute");
    let mut w = Watch::start(cp.kube_config().await, spec(&run));
    w.synced(Domain::KubeScaleTargets).await;
    let target = ScaleTargetRef {
        group: "apps".to_owned(),
        kind: "StatefulSet".to_owned(),
        namespace: NS.to_owned(),
        name: name.clone(),
    };
    cp.create(&stateful_set_obj(&name, &run, 2));
    let want = KubeScaleTarget {
        target: target.clone(),
        replicas: 2,
        ready_replicas: 0,
        update_revision: None,
        version: 0,
    };
    w.next(
        "created",
        |e| matches!(e, Event::KubeScaleTarget(t) if t.same_but_version(&want) && t.version != 0),
    )
    .await;

    cp.patch_status(
        &["statefulset", &name, "-n", NS],
        &json!({"status": {"replicas": 2, "readyReplicas": 1, "updateRevision": format!("{name}-abc")}}),
    );
    let want = KubeScaleTarget {
        target: target.clone(),
        replicas: 2,
        ready_replicas: 1,
        update_revision: Some(format!("{name}-abc")),
        version: 0,
    };
    w.next(
        "status",
        |e| matches!(e, Event::KubeScaleTarget(t) if t.same_but_version(&want) && t.version != 0),
    )
    .await;

    cp.kubectl(&["delete", "statefulset", &name, "-n", NS]);
    w.next(
        "gone",
        |e| matches!(e, Event::KubeScaleTargetGone { target: t, .. } if *t == target),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_listing_is_framed_by_sync_markers() {
    let cp = shared();
    let run = unique("sync");
    let (a, b) = (unique("node"), unique("node"));
    cp.create(&node_obj(&a, &run, "z1"));
    cp.create(&node_obj(&b, &run, "z1"));
    let mut w = Watch::start(cp.kube_config().await, spec(&run));
    w.synced(Domain::KubeNodes).await;
    let at = |pred: &dyn Fn(&Event) -> bool| w.seen.iter().position(pred).expect("seen");
    let started = at(&|e| {
        matches!(
            e,
            Event::SyncStarted {
                domain: Domain::KubeNodes
            }
        )
    });
    let done = at(&|e| {
        matches!(
            e,
            Event::SyncDone {
                domain: Domain::KubeNodes
            }
        )
    });
    let na = at(&|e| matches!(e, Event::KubeNode(n) if n.name == a));
    let nb = at(&|e| matches!(e, Event::KubeNode(n) if n.name == b));
    let visible = at(&|e| matches!(e, Event::ConnectorStatus { visible: true, .. }));
    assert!(
        visible < started && started < na && started < nb && na < done && nb < done,
        "{}",
        w.history()
    );
    for n in [&a, &b] {
        cp.kubectl(&["delete", "node", n]);
    }
}

/// A TCP proxy in front of the API server that the test can cut, like a
/// network partition: open connections are dropped, new ones are closed
/// right away.
struct Proxy {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let up = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let (up, conns) = (Arc::clone(&up), Arc::clone(&conns));
            async move {
                loop {
                    let Ok((mut inbound, _)) = listener.accept().await else {
                        continue;
                    };
                    if !up.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let h = tokio::spawn(async move {
                        if let Ok(mut out) = tokio::net::TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        }
                    });
                    conns.lock().expect("not poisoned").push(h);
                }
            }
        });
        Self {
            addr,
            up,
            conns,
            accept,
        }
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for h in self.conns.lock().expect("not poisoned").drain(..) {
            h.abort();
        }
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    fn config(&self, mut c: kube::Config) -> kube::Config {
        // The serving certificate is for IP 127.0.0.1, any port.
        c.cluster_url = format!("https://{}", self.addr).parse().expect("uri");
        c
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watch_is_reported_and_resumes_without_loss() {
    let cp = shared();
    let run = unique("cut");
    let (a, b) = (unique("node"), unique("node"));
    cp.create(&node_obj(&a, &run, "z1"));
    cp.create(&node_obj(&b, &run, "z1"));
    let proxy = Proxy::start(cp.api_addr).await;
    let mut w = Watch::start(proxy.config(cp.kube_config().await), spec(&run));
    w.visible(true).await;
    w.synced(Domain::KubeNodes).await;

    proxy.cut();
    let e = w.visible(false).await;
    assert!(e.summary().contains("cannot reach"), "{}", e.summary());
    // Changes while lockstep cannot see.
    cp.kubectl(&["cordon", &a]);
    cp.kubectl(&["delete", "node", &b]);
    proxy.restore();
    w.visible(true).await;
    w.converge("a cordoned, b gone", |nodes| {
        nodes.get(&a).is_some_and(|n| n.unschedulable) && !nodes.contains_key(&b)
    })
    .await;
    assert!(
        w.seen
            .iter()
            .any(|e| matches!(e, Event::KubeNodeGone { name, .. } if *name == b)),
        "the delete is in the log as a delete:\n{}",
        w.history()
    );
    cp.kubectl(&["delete", "node", &a]);
}

/// Stops kube-apiserver in the middle of a watch, with changes just before
/// the stop and just after the start; the folded log must end up as the
/// cluster is, with every delete in it.
async fn apiserver_restart_loses_nothing(apiserver_args: &str) {
    let _serial = DISRUPT_LOCK.lock().await;
    let mut cp = restart_apiserver(apiserver_args);
    let run = unique("restart");
    let names: Vec<String> = (0..5).map(|_| unique("node")).collect();
    let [a, b, c, d, e] = [0, 1, 2, 3, 4].map(|i| names[i].clone());
    for n in [&a, &b, &c, &d] {
        cp.create(&node_obj(n, &run, "z1"));
    }
    let mut w = Watch::start(cp.kube_config().await, spec(&run));
    w.synced(Domain::KubeNodes).await;
    w.converge("all four listed", |nodes| nodes.len() == 4)
        .await;

    // Just before the stop: the watcher may or may not get these in time.
    cp.kubectl(&["cordon", &a]);
    cp.kubectl(&["delete", "node", &b]);
    cp.stop_apiserver();
    w.visible(false).await;

    cp.up(apiserver_args);
    w.visible(true).await;

    // Just after the start.
    cp.kubectl(&["delete", "node", &c]);
    cp.kubectl(&["label", "node", &d, &format!("{ZONE}=z2"), "--overwrite"]);
    cp.create(&node_obj(&e, &run, "z3"));

    w.converge("a cordoned, b and c gone, d in z2, e new", |nodes| {
        nodes.keys().cloned().collect::<Vec<_>>() == {
            let mut v = vec![a.clone(), d.clone(), e.clone()];
            v.sort();
            v
        } && nodes[&a].unschedulable
            && nodes[&d].labels.get(ZONE).map(String::as_str) == Some("z2")
            && nodes[&e].labels.get(ZONE).map(String::as_str) == Some("z3")
    })
    .await;
    for gone in [&b, &c] {
        assert!(
            w.seen
                .iter()
                .any(|ev| matches!(ev, Event::KubeNodeGone { name, .. } if name == gone)),
            "delete of {gone} is in the log:\n{}",
            w.history()
        );
    }
    // Quiet afterwards: no duplicates trickling in.
    let extra = w.quiet(Duration::from_millis(1_000)).await;
    assert!(
        extra
            .iter()
            .all(|e| matches!(e, Event::ConnectorStatus { .. })),
        "{extra:?}"
    );
    for n in [&a, &d, &e] {
        cp.kubectl(&["delete", "node", n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart_with_watch_cache_loses_nothing() {
    apiserver_restart_loses_nothing("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart_without_watch_cache_loses_nothing() {
    apiserver_restart_loses_nothing("--watch-cache=false").await;
}

/// A watch that resumes from a compacted resourceVersion gets a real
/// `410 Gone`; the relist must report the objects deleted meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relist_after_410_gone_reports_deletes() {
    let _serial = DISRUPT_LOCK.lock().await;
    // Watches served from etcd, not the watch cache, so that compaction
    // makes old resourceVersions expire at once.
    let cp = restart_apiserver("--watch-cache=false");
    let run = unique("gone");
    let (x, y, z) = (unique("node"), unique("node"), unique("node"));
    for n in [&x, &y, &z] {
        cp.create(&node_obj(n, &run, "z1"));
    }
    let proxy = Proxy::start(cp.api_addr).await;
    let mut w = Watch::start(proxy.config(cp.kube_config().await), spec(&run));
    w.synced(Domain::KubeNodes).await;
    w.converge("three nodes", |nodes| nodes.len() == 3).await;
    let listings_before = w
        .seen
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::SyncStarted {
                    domain: Domain::KubeNodes
                }
            )
        })
        .count();

    proxy.cut();
    w.visible(false).await;
    cp.kubectl(&["delete", "node", &y]);
    cp.kubectl(&["cordon", &x]);
    // One more write, so the compaction revision is past the delete's.
    let bump = unique("bump");
    cp.kubectl(&["create", "configmap", &bump, "-n", NS]);
    cp.compact_etcd(cp.etcd_revision());
    proxy.restore();

    let start = w.seen.len();
    w.synced(Domain::KubeNodes).await;
    let relist = &w.seen[start..];
    let pos = |pred: &dyn Fn(&Event) -> bool| relist.iter().position(pred);
    let started = pos(&|e| {
        matches!(
            e,
            Event::SyncStarted {
                domain: Domain::KubeNodes
            }
        )
    })
    .unwrap_or_else(|| panic!("no relist:\n{}", w.history()));
    let gone = pos(&|e| matches!(e, Event::KubeNodeGone { name, .. } if *name == y))
        .unwrap_or_else(|| panic!("no Gone for {y}:\n{}", w.history()));
    let done = pos(&|e| {
        matches!(
            e,
            Event::SyncDone {
                domain: Domain::KubeNodes
            }
        )
    })
    .unwrap();
    assert!(started < gone && gone < done, "{}", w.history());
    assert!(
        relist
            .iter()
            .any(|e| matches!(e, Event::KubeNode(n) if n.name == x && n.unschedulable)),
        "{}",
        w.history()
    );
    let listings_after = w
        .seen
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::SyncStarted {
                    domain: Domain::KubeNodes
                }
            )
        })
        .count();
    assert_eq!(listings_after, listings_before + 1, "exactly one relist");
    assert_eq!(mirror_nodes(&w.seen).into_keys().collect::<Vec<_>>(), {
        let mut v = vec![x.clone(), z.clone()];
        v.sort();
        v
    });
    for n in [&x, &z] {
        cp.kubectl(&["delete", "node", n]);
    }
    cp.kubectl(&["delete", "configmap", &bump, "-n", NS]);
}

// ---------------------------------------------------------------------------
// Actuator

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_pod_condition_patches_status_once() {
    let cp = shared();
    let act = actuator(cp).await;
    let pod = unique("pod");
    cp.create(&pod_obj(&pod, "act", None));
    cp.patch_status(
        &["pod", &pod, "-n", NS],
        &json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
    );
    let set = |status, reason: &str, message: &str| {
        issued(Action::KubeSetPodCondition {
            namespace: NS.to_owned(),
            pod: pod.clone(),
            condition: PodCondition {
                type_: "SlurmNodeDrained".to_owned(),
                status,
                reason: reason.to_owned(),
                message: message.to_owned(),
            },
        })
    };
    let a = set(ConditionStatus::True, "SlurmDrain", "drained by admin");
    let o = act.execute(&a).await;
    assert_eq!(o.result, OutcomeResult::Succeeded);
    assert_eq!(
        (o.action_id.clone(), o.kind, o.target.clone()),
        (a.id.clone(), a.action.kind(), a.action.target())
    );
    let obj = cp.get(&["pod", &pod, "-n", NS, "--show-managed-fields"]);
    let c = condition(&obj, "SlurmNodeDrained")
        .expect("condition set")
        .clone();
    assert_eq!(
        (
            c["status"].as_str(),
            c["reason"].as_str(),
            c["message"].as_str()
        ),
        (Some("True"), Some("SlurmDrain"), Some("drained by admin"))
    );
    let t1 = c["lastTransitionTime"]
        .as_str()
        .expect("lastTransitionTime")
        .to_owned();
    assert!(condition(&obj, "Ready").is_some(), "other conditions kept");
    assert!(
        obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["manager"] == "lockstep"),
        "field manager lockstep: {}",
        obj["metadata"]["managedFields"]
    );

    assert_eq!(act.execute(&a).await.result, OutcomeResult::AlreadyDone);

    // Same status, new message: updated, transition time kept.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let o = act
        .execute(&set(ConditionStatus::True, "SlurmDrain", "still drained"))
        .await;
    assert_eq!(o.result, OutcomeResult::Succeeded);
    let c = condition(&cp.get(&["pod", &pod, "-n", NS]), "SlurmNodeDrained")
        .unwrap()
        .clone();
    assert_eq!(
        (c["message"].as_str(), c["lastTransitionTime"].as_str()),
        (Some("still drained"), Some(t1.as_str()))
    );

    // New status: new transition time.
    let o = act
        .execute(&set(ConditionStatus::False, "SlurmNotDrained", ""))
        .await;
    assert_eq!(o.result, OutcomeResult::Succeeded);
    let c = condition(&cp.get(&["pod", &pod, "-n", NS]), "SlurmNodeDrained")
        .unwrap()
        .clone();
    assert_eq!(c["status"].as_str(), Some("False"));
    assert!(
        c["lastTransitionTime"].as_str().unwrap() > t1.as_str(),
        "{c}"
    );
    assert_eq!(
        act.execute(&set(ConditionStatus::False, "SlurmNotDrained", ""))
            .await
            .result,
        OutcomeResult::AlreadyDone
    );

    // A condition lockstep wrote is observed even under a policy that no
    // longer names it (so that it can be retired); somebody else's is not.
    cp.kubectl(&[
        "patch",
        "pod",
        &pod,
        "-n",
        NS,
        "--subresource=status",
        "--type=strategic",
        "-p",
        r#"{"status": {"conditions": [{"type": "SiteCheck", "status": "True"}]}}"#,
    ]);
    let obj: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(cp.get(&["pod", &pod, "-n", NS, "--show-managed-fields"])).unwrap();
    let mut renamed = Policy::default();
    renamed.drain.foreign_drain_condition = "SlurmDrainedByOthers".to_owned();
    let observed =
        lockstep_connectors::kube::reduce::pod(&obj, &ObserveSpec::from_policy(&renamed, &[]))
            .unwrap();
    let types: Vec<&str> = observed
        .conditions
        .iter()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(types, ["SlurmNodeDrained"], "{observed:?}");

    cp.kubectl(&[
        "delete",
        "pod",
        &pod,
        "-n",
        NS,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    let o = act.execute(&a).await;
    assert_failed(&o, false, "not found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taint_and_untaint_keep_other_taints() {
    let cp = shared();
    let act = actuator(cp).await;
    let node = unique("tnode");
    cp.create(&node_obj(&node, "act", "z1"));
    cp.kubectl(&["taint", "node", &node, "example.com/foreign=x:NoSchedule"]);
    let taints = || -> Vec<(String, String, String)> {
        let obj = cp.get(&["node", &node]);
        let mut v: Vec<_> = obj["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|t| {
                (
                    t["key"].as_str().unwrap().to_owned(),
                    t["value"].as_str().unwrap_or("").to_owned(),
                    t["effect"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let before = taints();
    assert!(
        before.iter().any(|t| t.0 == "example.com/foreign"),
        "{before:?}"
    );
    let taint = |value: &str| {
        issued(Action::KubeTaintNode {
            node: node.clone(),
            taint: Taint {
                key: "lockstep.io/slurm-unhealthy".to_owned(),
                value: value.to_owned(),
                effect: TaintEffect::NoSchedule,
            },
        })
    };
    assert_eq!(
        act.execute(&taint("")).await.result,
        OutcomeResult::Succeeded
    );
    let mut want = before.clone();
    want.push((
        "lockstep.io/slurm-unhealthy".to_owned(),
        String::new(),
        "NoSchedule".to_owned(),
    ));
    want.sort();
    assert_eq!(taints(), want);
    assert_eq!(
        act.execute(&taint("")).await.result,
        OutcomeResult::AlreadyDone
    );

    // A new value replaces the taint of that key.
    assert_eq!(
        act.execute(&taint("down")).await.result,
        OutcomeResult::Succeeded
    );
    let got = taints();
    assert_eq!(
        got.iter()
            .filter(|t| t.0 == "lockstep.io/slurm-unhealthy")
            .count(),
        1,
        "{got:?}"
    );
    assert!(got.contains(&(
        "lockstep.io/slurm-unhealthy".to_owned(),
        "down".to_owned(),
        "NoSchedule".to_owned()
    )));

    let untaint = issued(Action::KubeUntaintNode {
        node: node.clone(),
        key: "lockstep.io/slurm-unhealthy".to_owned(),
    });
    assert_eq!(act.execute(&untaint).await.result, OutcomeResult::Succeeded);
    assert_eq!(taints(), before, "only lockstep's taint removed");
    assert_eq!(
        act.execute(&untaint).await.result,
        OutcomeResult::AlreadyDone
    );

    cp.kubectl(&["delete", "node", &node]);
    assert_failed(&act.execute(&taint("")).await, false, "not found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_pod_sets_and_removes() {
    let cp = shared();
    let act = actuator(cp).await;
    let pod = unique("lpod");
    cp.create(&pod_obj(&pod, "act", None));
    let label = |value: Option<&str>| {
        issued(Action::KubeLabelPod {
            namespace: NS.to_owned(),
            pod: pod.clone(),
            key: "lockstep.io/slurm-busy".to_owned(),
            value: value.map(str::to_owned),
        })
    };
    let busy =
        || cp.get(&["pod", &pod, "-n", NS])["metadata"]["labels"]["lockstep.io/slurm-busy"].clone();
    assert_eq!(
        act.execute(&label(Some("true"))).await.result,
        OutcomeResult::Succeeded
    );
    assert_eq!(busy(), json!("true"));
    assert_eq!(
        act.execute(&label(Some("true"))).await.result,
        OutcomeResult::AlreadyDone
    );
    assert_eq!(
        act.execute(&label(None)).await.result,
        OutcomeResult::Succeeded
    );
    assert_eq!(busy(), Value::Null);
    assert_eq!(
        cp.get(&["pod", &pod, "-n", NS])["metadata"]["labels"][TEST_LABEL],
        json!("act"),
        "other labels kept"
    );
    assert_eq!(
        act.execute(&label(None)).await.result,
        OutcomeResult::AlreadyDone
    );
    // An invalid label value is a 422: not retryable.
    assert_failed(
        &act.execute(&label(Some("not a valid value!"))).await,
        false,
        "422",
    );
    cp.kubectl(&[
        "delete",
        "pod",
        &pod,
        "-n",
        NS,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_pod_only_with_its_uid() {
    let cp = shared();
    let act = actuator(cp).await;
    let node = unique("dnode");
    let (bound, unbound) = (unique("dpod"), unique("dpod"));
    cp.create(&node_obj(&node, "act", "z1"));
    cp.create(&pod_obj(&bound, "act", Some(&node)));
    cp.create(&pod_obj(&unbound, "act", None));
    let uid = |p: &str| {
        cp.get(&["pod", p, "-n", NS])["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let delete = |pod: &str, uid: String| {
        issued(Action::KubeDeletePod {
            namespace: NS.to_owned(),
            pod: pod.to_owned(),
            uid,
        })
    };

    let wrong = delete(&bound, "00000000-0000-0000-0000-00000000beef".to_owned());
    assert_failed(&act.execute(&wrong).await, false, "uid precondition");
    assert!(
        cp.exists(&["pod", &bound, "-n", NS]),
        "refused delete left the pod"
    );
    assert!(cp.get(&["pod", &bound, "-n", NS])["metadata"]["deletionTimestamp"].is_null());

    // Bound pod: graceful delete, and without a kubelet it stays, deleting.
    let right = delete(&bound, uid(&bound));
    assert_eq!(act.execute(&right).await.result, OutcomeResult::Succeeded);
    assert!(cp.get(&["pod", &bound, "-n", NS])["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(act.execute(&right).await.result, OutcomeResult::AlreadyDone);

    // Unbound pod: deleted at once.
    let right = delete(&unbound, uid(&unbound));
    assert_eq!(act.execute(&right).await.result, OutcomeResult::Succeeded);
    assert!(!cp.exists(&["pod", &unbound, "-n", NS]));
    assert_eq!(act.execute(&right).await.result, OutcomeResult::AlreadyDone);

    cp.kubectl(&[
        "delete",
        "pod",
        &bound,
        "-n",
        NS,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    cp.kubectl(&["delete", "node", &node]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_patches_the_scale_subresource() {
    let cp = shared();
    let act = actuator(cp).await;
    let name = unique("scale");
    cp.create(&stateful_set_obj(&name, "act", 2));
    let target = ScaleTargetRef {
        group: "apps".to_owned(),
        kind: "StatefulSet".to_owned(),
        namespace: NS.to_owned(),
        name: name.clone(),
    };
    let scale = |replicas| {
        issued(Action::KubeScale {
            target: target.clone(),
            replicas,
        })
    };
    assert_eq!(
        act.execute(&scale(5)).await.result,
        OutcomeResult::Succeeded
    );
    assert_eq!(
        cp.get(&["statefulset", &name, "-n", NS])["spec"]["replicas"],
        json!(5)
    );
    assert_eq!(
        act.execute(&scale(5)).await.result,
        OutcomeResult::AlreadyDone
    );
    assert_eq!(
        act.execute(&scale(0)).await.result,
        OutcomeResult::Succeeded
    );
    assert_eq!(
        cp.get(&["statefulset", &name, "-n", NS])["spec"]["replicas"],
        json!(0)
    );

    let nodeset = issued(Action::KubeScale {
        target: ScaleTargetRef {
            group: "slinky.slurm.net".to_owned(),
            kind: "NodeSet".to_owned(),
            ..target.clone()
        },
        replicas: 1,
    });
    assert_failed(
        &act.execute(&nodeset).await,
        false,
        "unknown scale target kind",
    );
    cp.kubectl(&["delete", "statefulset", &name, "-n", NS]);
    assert_failed(&act.execute(&scale(1)).await, false, "not found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_or_silent_api_fails_retryably_in_bounded_time() {
    let cp = shared();
    let action = issued(Action::KubeLabelPod {
        namespace: NS.to_owned(),
        pod: "p".to_owned(),
        key: "k".to_owned(),
        value: None,
    });
    let config = ActuatorConfig {
        connect_timeout_ms: 500,
        request_timeout_ms: 500,
        action_timeout_ms: 1_500,
        ..ActuatorConfig::default()
    };

    // Nothing listens: connection refused.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut c = cp.kube_config().await;
    c.cluster_url = format!("https://{closed}").parse().unwrap();
    let act = Actuator::new(c, vec![], config.clone()).unwrap();
    assert_failed(&act.execute(&action).await, true, "cannot reach");

    // Something listens and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let mut c = cp.kube_config().await;
    c.cluster_url = format!("https://{addr}").parse().unwrap();
    let act = Actuator::new(c, vec![], config).unwrap();
    let t0 = Instant::now();
    let o = act.execute(&action).await;
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    assert!(
        matches!(
            o.result,
            OutcomeResult::Failed {
                retryable: true,
                ..
            }
        ),
        "{o:?}"
    );
    hold.abort();

    // A Slurm action is not for this actuator.
    let act = actuator(cp).await;
    let o = act
        .execute(&issued(Action::SlurmResume {
            node: "n".to_owned(),
        }))
        .await;
    assert_failed(&o, false, "not a kubernetes action");
}

/// kube-runtime's watcher retries a watch from the same resourceVersion
/// after a server error, and a watch served from etcd whose next event is a
/// delete with its previous version compacted away fails with 500 ("etcd
/// event received with PrevKv=nil") every time: without a way out, the
/// delete would never be seen. The observer starts such a watcher over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_stuck_on_server_errors_lists_again() {
    let _serial = DISRUPT_LOCK.lock().await;
    let cp = restart_apiserver("--watch-cache=false");
    // The scenario needs the delete to be etcd's very next revision after
    // the last event the watcher saw; another write (the API server renews
    // its lease every 10 s) can slip in between: then try again.
    for attempt in 1..=5 {
        let run = unique("stuck");
        let (x, y) = (unique("node"), unique("node"));
        for n in [&x, &y] {
            cp.create(&node_obj(n, &run, "z1"));
        }
        let proxy = Proxy::start(cp.api_addr).await;
        let mut w = Watch::start(proxy.config(cp.kube_config().await), spec(&run));
        w.synced(Domain::KubeNodes).await;
        w.converge("two nodes", |nodes| nodes.len() == 2).await;
        cp.kubectl(&["cordon", &x]);
        w.node(&x, "cordoned", |n| n.unschedulable).await;
        let seen_rv: u64 = cp.get(&["node", &x])["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .expect("resourceVersion");
        proxy.cut();
        cp.kubectl(&["delete", "node", &y]);
        let delete_rev = cp.etcd_revision();
        if delete_rev != seen_rv + 1 {
            eprintln!("attempt {attempt}: another write between {seen_rv} and the delete ({delete_rev}); again");
            proxy.restore();
            cp.kubectl(&["delete", "node", &x]);
            continue;
        }
        cp.compact_etcd(delete_rev);
        // The server really answers that watch with a 500, every time.
        let raw = cp.kubectl(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes?watch=1&resourceVersion={seen_rv}&labelSelector={TEST_LABEL}%3D{run}&timeoutSeconds=2"),
        ]);
        assert!(
            raw.contains(r#""code":500"#) && raw.contains("PrevKv=nil"),
            "{raw}"
        );

        let start = w.seen.len();
        proxy.restore();
        w.next(
            "gone after listing again",
            |e| matches!(e, Event::KubeNodeGone { name, .. } if *name == y),
        )
        .await;
        assert!(
            w.seen[start..].iter().any(|e| matches!(
                e,
                Event::SyncStarted {
                    domain: Domain::KubeNodes
                }
            )),
            "{}",
            w.history()
        );
        assert_eq!(
            mirror_nodes(&w.seen).into_keys().collect::<Vec<_>>(),
            vec![x.clone()]
        );
        cp.kubectl(&["delete", "node", &x]);
        return;
    }
    panic!("could not arrange a delete right after the watcher's last event in 5 attempts");
}

// ---------------------------------------------------------------------------
// Leader election

fn lease(name: &str, identity: &str, duration_s: u64, renew_s: u64) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(duration_s),
        renew_deadline: Duration::from_secs(renew_s),
        retry_period: Duration::from_millis(500),
        ..LeaseConfig::new(NS, name, identity)
    }
}

/// Waits until `f` holds, for at most `limit`.
async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Instant {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Instant::now()
}

fn holder(cp: &ControlPlane, name: &str) -> Value {
    cp.get(&["lease", name, "-n", NS])["spec"]["holderIdentity"].clone()
}

/// Two candidates: exactly one leads; when it stops it releases the Lease,
/// and the other takes over at once rather than when the Lease would have
/// expired (30 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_candidate_leads_and_a_release_hands_over_at_once() {
    let cp = shared();
    let name = unique("lease");
    let a = Leadership::start(cp.kube_config().await, lease(&name, "a", 30, 20)).unwrap();
    let b = Leadership::start(cp.kube_config().await, lease(&name, "b", 30, 20)).unwrap();
    until("a leader", Duration::from_secs(10), || {
        a.is_leader() || b.is_leader()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(a.is_leader() != b.is_leader(), "exactly one leads");
    let (leader, follower, follower_id) = if a.is_leader() {
        (a, b, "b")
    } else {
        (b, a, "a")
    };
    leader.release(Duration::from_secs(5)).await;
    until("the follower takes over", Duration::from_secs(10), || {
        follower.is_leader()
    })
    .await;
    assert_eq!(holder(cp, &name), follower_id);
    follower.release(Duration::from_secs(5)).await;
    assert_eq!(holder(cp, &name), Value::Null, "released");
    cp.kubectl(&["delete", "lease", &name, "-n", NS]);
}

/// A TCP proxy to the API server that can be cut.
async fn proxy(to: SocketAddr) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((mut inbound, _)) = listener.accept().await {
            conns.spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, task)
}

/// The safety of the protocol: a leader cut off from the API server stops
/// leading (renew deadline 2 s) before anyone may take its Lease (4 s
/// after its last renewal), so two candidates never lead at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_steps_down_before_another_takes_over() {
    let cp = shared();
    let name = unique("lease");
    let direct = cp.kube_config().await;
    let api: SocketAddr = format!(
        "{}:{}",
        direct.cluster_url.host().unwrap(),
        direct.cluster_url.port_u16().unwrap()
    )
    .parse()
    .unwrap();
    let (addr, cut) = proxy(api).await;
    let mut via_proxy = direct.clone();
    via_proxy.cluster_url = format!("https://{addr}").parse().unwrap();

    let mut a = Leadership::start(via_proxy, lease(&name, "a", 4, 2)).unwrap();
    until("a leads", Duration::from_secs(10), || a.is_leader()).await;
    let b = Leadership::start(direct, lease(&name, "b", 4, 2)).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(a.is_leader() && !b.is_leader());

    // Cut a off: its listener and every connection through it go away.
    cut.abort();
    let _ = cut.await;
    tokio::time::timeout(Duration::from_secs(10), async {
        // (The first change may still be the one to leader.)
        while a.changed().await {}
    })
    .await
    .expect("a notices within its renew deadline");
    assert!(!a.is_leader());
    let a_down = Instant::now();
    let b_up = until("b takes over", Duration::from_secs(15), || b.is_leader()).await;
    assert!(
        b_up > a_down,
        "b led before a stepped down: two leaders at once"
    );
    eprintln!(
        "a stepped down {:?} before b took over",
        b_up.duration_since(a_down)
    );
    assert_eq!(holder(cp, &name), "b");
    b.release(Duration::from_secs(5)).await;
    a.release(Duration::from_secs(1)).await;
    cp.kubectl(&["delete", "lease", &name, "-n", NS]);
}
