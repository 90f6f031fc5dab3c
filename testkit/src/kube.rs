//! A real kube-apiserver (and etcd) for the tests, as
//! `deploy/local/kube/up.sh` builds and starts them, reached with the
//! kubectl it built and with etcd's HTTP gateway; names unique to a test;
//! the Node, Pod and StatefulSet objects the tests create.
//!
//! Two control planes:
//!
//! - the shared one ([`shared`]: `/tmp/lockstep-local`, port 16443) for
//!   tests that only create and change their own objects; they run in
//!   parallel, each with its own object names and label selector;
//! - a second one (`/tmp/lockstep-kube-disrupt`, port 16444) for the tests
//!   that stop and restart kube-apiserver or compact etcd
//!   ([`restart_apiserver`]). They hold [`DISRUPT_LOCK`], so they run one
//!   at a time without stopping the others.
//!
//! A missing control plane is a failure, never a skip: `up.sh` is run once
//! per process and per control plane, and its output is shown if it fails.
//! No kubelet runs: the tests set the status of their objects through the
//! API, as a kubelet would.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use serde_json::{json, Value};

use crate::repo;

// ---------------------------------------------------------------------------
// Control planes

/// One local control plane: etcd and kube-apiserver on their own ports and
/// state directory.
#[derive(Clone)]
pub struct ControlPlane {
    /// Environment for up.sh / down.sh.
    env: Vec<(&'static str, String)>,
    state_dir: PathBuf,
    /// The cluster-admin kubeconfig up.sh wrote.
    pub kubeconfig: PathBuf,
    /// The kubectl up.sh built (known after [`Self::up`]).
    pub kubectl: PathBuf,
    /// kube-apiserver's address.
    pub api_addr: SocketAddr,
    etcd_port: u16,
}

impl ControlPlane {
    /// A control plane with its state under `state` (`LOCKSTEP_STATE_DIR`)
    /// and its ports; nothing is started yet.
    pub fn new(state: &str, api_port: u16, etcd_port: u16) -> Self {
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
        let path = repo().join("deploy/local/kube").join(name);
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
    pub fn up(&mut self, apiserver_args: &str) {
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

    /// Stops kube-apiserver only (etcd keeps running).
    pub fn stop_apiserver(&self) {
        self.script("down.sh", &["--apiserver-only"], "");
    }

    /// Runs kubectl as cluster-admin, with `stdin` if given.
    pub fn kubectl_output(&self, args: &[&str], stdin: Option<&str>) -> std::process::Output {
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
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_output(args, None);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    }

    /// `kubectl create` of one object; panics if it fails.
    pub fn create(&self, obj: &Value) {
        let out = self.kubectl_output(&["create", "-f", "-"], Some(&obj.to_string()));
        assert!(
            out.status.success(),
            "kubectl create {obj} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `kubectl get -o json`.
    pub fn get(&self, args: &[&str]) -> Value {
        let mut a = vec!["get", "-o", "json"];
        a.extend_from_slice(args);
        serde_json::from_str(&self.kubectl(&a)).expect("kubectl prints json")
    }

    /// Whether `kubectl get` finds the object.
    pub fn exists(&self, args: &[&str]) -> bool {
        let mut a = vec!["get", "--ignore-not-found", "-o", "name"];
        a.extend_from_slice(args);
        !self.kubectl(&a).trim().is_empty()
    }

    /// A merge patch of the status subresource of `kind_name` (e.g.
    /// `["node", name]`).
    pub fn patch_status(&self, kind_name: &[&str], patch: &Value) {
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
    pub fn etcd_revision(&self) -> u64 {
        self.etcd("range", r#"{"key":"Lw==","limit":1}"#)["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .expect("revision")
    }

    /// Compacts etcd's history up to `revision`: a watch from an older
    /// resourceVersion then gets `410 Gone` (when kube-apiserver serves
    /// watches from etcd, i.e. `--watch-cache=false`).
    pub fn compact_etcd(&self, revision: u64) {
        self.etcd(
            "compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        );
    }
}

static SHARED: OnceLock<ControlPlane> = OnceLock::new();
static DISRUPT: OnceLock<Mutex<ControlPlane>> = OnceLock::new();
/// Held by the tests that stop kube-apiserver or compact etcd.
pub static DISRUPT_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The shared control plane, started (or found running) once per process.
pub fn shared() -> &'static ControlPlane {
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
pub fn restart_apiserver(args: &str) -> ControlPlane {
    let mut cp = disrupt().lock().expect("not poisoned");
    cp.stop_apiserver();
    cp.up(args);
    cp.clone()
}

// ---------------------------------------------------------------------------
// Names and objects

/// A name unique to this process and call: tests run in parallel and
/// repeatedly against the same API server.
pub fn unique(prefix: &str) -> String {
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

/// The namespace of the tests' objects.
pub const NS: &str = "default";
/// The label that ties a test's objects to its run (`lockstep-test=<run>`),
/// for label selectors.
pub const TEST_LABEL: &str = "lockstep-test";
/// The zone label on the tests' nodes.
pub const ZONE: &str = "topology.kubernetes.io/zone";

/// A Node of `run` in `zone` (and an unwatched label).
pub fn node_obj(name: &str, run: &str, zone: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {TEST_LABEL: run, ZONE: zone, "unwatched": "x"}},
    })
}

/// A slurmd Pod of `run` owned by the StatefulSet `compute`, labelled with
/// its Slurm node name (`slurm.node=slurm-<name>`), bound to `node` if given.
pub fn pod_obj(name: &str, run: &str, node: Option<&str>) -> Value {
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

/// A StatefulSet of `run` with `replicas`.
pub fn stateful_set_obj(name: &str, run: &str, replicas: u32) -> Value {
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

/// A Node status patch: `Ready=ready` and the `extra` conditions (type,
/// status, reason), all with `heartbeat` as their heartbeat.
pub fn node_conditions(ready: &str, heartbeat: &str, extra: &[(&str, &str, &str)]) -> Value {
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

/// The condition `type_` of an object's status.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}
