//! lockstep on a real Kubernetes node: a real kubelet, controller-manager,
//! scheduler and containerd (`deploy/local/kube/node-up.sh`), lockstep
//! installed by its Helm chart (`deploy/helm/lockstep`) from its own image,
//! running as two Pods under its ServiceAccount with leader election, the
//! log in a real nats-server; Slurm 22.05's slurmctld and slurmrestd on the
//! host (`deploy/local/slurm`), and slurmd in real pods of a real
//! StatefulSet, one Slurm node per pod (pod `slurmd-i` is Slurm node
//! `slurmd-i`, pre-declared in slurm.conf), several Slurm nodes on the one
//! Kubernetes node. Nothing here plays the kubelet or a controller: pods are
//! scheduled, started, evicted and replaced by Kubernetes itself.
//!
//! Each scenario starts from a fresh Slurm and an empty log, makes its
//! objects and removes them; the node stays up between scenarios and is
//! torn down (host restored) when the test process exits (see
//! `common::node`). Figures are printed and appended to
//! `/tmp/lockstep-node/logs/figures.txt`.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use lockstep_schemas::{Event, EventRecord, OutcomeResult};
use lockstep_store::{EventLog, StreamLimits};
use lockstep_testkit::temp_dir;
use serde_json::{json, Value};

mod common;

use common::node::{Bed, LOCKSTEP_NS, NATS_PORT, NODE_NAME, RELEASE, ROOT, SLURM_NS};
use common::wait_for;

const MINUTE: Duration = Duration::from_secs(60);
const BUSY_LABEL: &str = "lockstep.io/slurm-busy";
const SLURMD_SELECTOR: &str = "app.kubernetes.io/component=slurmd";

/// One scenario: the bed (node, Slurm, NATS, images), cleaned; a temp dir
/// for values files, logs and the exported log.
struct Scenario {
    bed: Bed,
    dir: PathBuf,
    /// `kubectl logs -f` of lockstep's pods, started by `follow_logs`.
    followers: Vec<(String, Child)>,
    _turn: MutexGuard<'static, ()>,
}

impl Scenario {
    fn new(name: &str) -> Self {
        let turn = common::node::ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let bed = Bed::up();
        let s = Self {
            bed,
            dir: temp_dir(&format!("node-{name}")),
            followers: Vec::new(),
            _turn: turn,
        };
        s.clean();
        s.prepare();
        s
    }

    /// Nothing of an earlier scenario: no release, no namespaces, the node
    /// schedulable and Ready, no taint lockstep set.
    fn clean(&self) {
        let b = &self.bed;
        let _ = b.try_helm(&[
            "uninstall",
            RELEASE,
            "-n",
            LOCKSTEP_NS,
            "--wait",
            "--timeout",
            "120s",
        ]);
        b.kubectl(
            &[
                "delete",
                "namespace",
                SLURM_NS,
                LOCKSTEP_NS,
                "--ignore-not-found",
                "--wait=true",
                "--timeout=180s",
            ],
            None,
        );
        b.kubectl(
            &[
                "delete",
                "pv",
                "-l",
                "lockstep-node-e2e=true",
                "--ignore-not-found",
            ],
            None,
        );
        let _ = b.try_kubectl(&["uncordon", NODE_NAME], None);
        let _ = b.try_kubectl(
            &["taint", "nodes", NODE_NAME, "lockstep.io/slurm-unhealthy-"],
            None,
        );
        wait_for("the node Ready", MINUTE, || self.node_ready().then_some(()));
    }

    /// Namespaces; slurm.conf and the munge key for the slurmd pods (as the
    /// controller has them: slurmd runs in the host's network); for
    /// lockstep's pods a slurm.conf that names slurmctld at the bridge
    /// address (they have their own network), the munge key and the JWT.
    fn prepare(&self) {
        let b = &self.bed;
        for ns in [SLURM_NS, LOCKSTEP_NS] {
            b.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
            wait_for(
                &format!("the default ServiceAccount in {ns}"),
                MINUTE,
                || b.get(&["serviceaccount", "default", "-n", ns]).map(|_| ()),
            );
        }
        let conf_path = PathBuf::from(&b.slurm["SLURM_CONF"]);
        let conf = std::fs::read_to_string(&conf_path).unwrap();
        let pod_conf: String = conf
            .lines()
            .map(|l| match l.strip_prefix("SlurmctldHost=") {
                Some(h) => format!(
                    "SlurmctldHost={}({})",
                    h.split('(').next().unwrap(),
                    b.gateway()
                ),
                None => l.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n";
        let pod_conf_path = self.dir.join("slurm-pod.conf");
        std::fs::write(&pod_conf_path, pod_conf).unwrap();
        let key = b.slurm_state.join("munge/munge.key");
        let token = b.slurm_state.join("token");
        for (ns, conf) in [(SLURM_NS, &conf_path), (LOCKSTEP_NS, &pod_conf_path)] {
            b.kubectl(
                &[
                    "create",
                    "configmap",
                    "slurm-conf",
                    "-n",
                    ns,
                    &format!("--from-file=slurm.conf={}", conf.display()),
                ],
                None,
            );
            b.kubectl(
                &[
                    "create",
                    "secret",
                    "generic",
                    "munge-key",
                    "-n",
                    ns,
                    &format!("--from-file=munge.key={}", key.display()),
                ],
                None,
            );
        }
        b.kubectl(
            &[
                "create",
                "secret",
                "generic",
                "slurm-jwt",
                "-n",
                LOCKSTEP_NS,
                &format!("--from-file=token={}", token.display()),
            ],
            None,
        );
    }

    fn node_ready(&self) -> bool {
        self.bed.get(&["node", NODE_NAME]).is_some_and(|n| {
            n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    }

    /// The slurmd StatefulSet: `replicas` pods of the slurmd image in the
    /// host's network (slurm.conf gives each Slurm node its port on
    /// 127.0.0.1), updated only when a pod is deleted (OnDelete: lockstep
    /// paces rollouts so that no job is killed).
    fn slurmd_statefulset(&self, replicas: u32, image: &str) {
        self.bed.apply(&json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "slurmd", "namespace": SLURM_NS},
            "spec": {
                "replicas": replicas,
                "serviceName": "slurmd",
                "podManagementPolicy": "Parallel",
                "updateStrategy": {"type": "OnDelete"},
                "selector": {"matchLabels": {"app.kubernetes.io/component": "slurmd"}},
                "template": {
                    "metadata": {"labels": {"app.kubernetes.io/component": "slurmd"}},
                    "spec": {
                        "hostNetwork": true,
                        "dnsPolicy": "ClusterFirstWithHostNet",
                        "enableServiceLinks": false,
                        "automountServiceAccountToken": false,
                        "terminationGracePeriodSeconds": 10,
                        "containers": [{
                            "name": "slurmd",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                            "volumeMounts": [
                                {"name": "slurm-conf", "mountPath": "/etc/slurm", "readOnly": true},
                                {"name": "munge-key", "mountPath": "/etc/munge-key", "readOnly": true},
                            ],
                        }],
                        "volumes": [
                            {"name": "slurm-conf", "configMap": {"name": "slurm-conf"}},
                            {"name": "munge-key", "secret": {"secretName": "munge-key"}},
                        ],
                    },
                },
            },
        }));
    }

    fn slurmd_image(&self) -> String {
        self.bed.images["SLURMD_IMAGE"].clone()
    }

    /// Slurm nodes `slurmd-0 .. slurmd-{n-1}` registered by their pods' slurmd and idle.
    fn wait_slurm_idle(&self, n: usize) {
        for i in 0..n {
            let node = format!("slurmd-{i}");
            wait_for(&format!("{node} registered and idle"), 2 * MINUTE, || {
                (self.bed.slurm_state(&node) == "IDLE").then_some(())
            });
        }
    }

    fn replicas(&self) -> u64 {
        self.bed
            .get(&["statefulset", "slurmd", "-n", SLURM_NS])
            .unwrap()["spec"]["replicas"]
            .as_u64()
            .unwrap()
    }

    fn pod(&self, name: &str) -> Option<Value> {
        self.bed.get(&["pod", name, "-n", SLURM_NS])
    }

    /// The chart's values for this bed; `policy` and `overrides` on top.
    fn values(&self, policy: &Value, overrides: &Value) -> PathBuf {
        let b = &self.bed;
        let socket_dir = b.slurm_state.join("munge");
        let mut values = json!({
            "mode": "nats",
            "replicaCount": 2,
            "image": {"repository": b.images["LOCKSTEP_IMAGE"].rsplit_once(':').unwrap().0},
            "nats": {"url": format!("nats://{}:{NATS_PORT}", b.gateway())},
            "slurm": {
                "restUrl": format!("http://{}:{}", b.gateway(), common::node::SLURMRESTD_PORT),
                "restUser": b.slurm.get("SLURM_JWT_USER").map_or("root", String::as_str),
                "jwt": {"existingSecret": "slurm-jwt", "key": "token"},
                "pollIntervalMs": 200,
                "scontrol": {
                    "enabled": true,
                    "slurmVersion": "22.05",
                    "slurmConf": {"existingConfigMap": "slurm-conf"},
                    "munge": {"keySecret": "munge-key", "socketDir": socket_dir.display().to_string()},
                },
            },
            "leaderElection": {"leaseDurationMs": 3000, "renewDeadlineMs": 2000, "retryPeriodMs": 500},
            "loop": {"tickIntervalMs": 200, "readWaitMs": 50},
            "telemetry": {"logFormat": "text", "logLevel": "info"},
            "terminationGracePeriodSeconds": 10,
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
            "policy": policy,
        });
        merge(&mut values, overrides);
        let path = self.dir.join(format!("values-{}.json", rand_suffix()));
        std::fs::write(&path, serde_json::to_string_pretty(&values).unwrap()).unwrap();
        path
    }

    /// `helm install` of the chart; waits for the pods and a leader.
    fn install(&self, policy: &Value, overrides: &Value) {
        let values = self.values(policy, overrides);
        let chart = common::repo().join("deploy/helm/lockstep");
        self.bed.helm(&[
            "install",
            RELEASE,
            chart.to_str().unwrap(),
            "-n",
            LOCKSTEP_NS,
            "-f",
            values.to_str().unwrap(),
            "--wait",
            "--timeout",
            "180s",
        ]);
        if overrides["mode"] != "embedded" {
            self.wait_leader();
        }
    }

    /// lockstep's pods: (name, pod IP, uid, restart count of the lockstep container).
    fn lockstep_pods(&self) -> Vec<(String, String, String, u64)> {
        let list = self
            .bed
            .get(&[
                "pods",
                "-n",
                LOCKSTEP_NS,
                "-l",
                &format!("app.kubernetes.io/instance={RELEASE}"),
            ])
            .unwrap();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .map(|p| {
                let restarts = p["status"]["containerStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|c| c["name"] == "lockstep")
                    .map(|c| c["restartCount"].as_u64().unwrap_or(0))
                    .sum();
                (
                    p["metadata"]["name"].as_str().unwrap().to_owned(),
                    p["status"]["podIP"].as_str().unwrap_or("").to_owned(),
                    p["metadata"]["uid"].as_str().unwrap().to_owned(),
                    restarts,
                )
            })
            .collect()
    }

    /// `/status` of the lockstep pod at `ip` (the host reaches pod IPs on the bridge).
    fn status(ip: &str) -> Option<Value> {
        if ip.is_empty() {
            return None;
        }
        let mut s = std::net::TcpStream::connect_timeout(
            &format!("{ip}:9464").parse().ok()?,
            Duration::from_secs(1),
        )
        .ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(b"GET /status HTTP/1.0\r\nHost: x\r\n\r\n")
            .ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).ok()?;
        serde_json::from_str(buf.split("\r\n\r\n").nth(1)?).ok()
    }

    /// The pod that leads, if one does.
    fn leader(&self) -> Option<String> {
        self.lockstep_pods()
            .into_iter()
            .find(|(_, ip, _, _)| Self::status(ip).is_some_and(|s| s["leader"] == true))
            .map(|(name, ..)| name)
    }

    fn wait_leader(&self) -> String {
        wait_for("a lockstep pod leads", 2 * MINUTE, || self.leader())
    }

    /// Every record of the log.
    fn records(&self) -> Vec<EventRecord> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let log = EventLog::connect_nats(&nats_url(), &StreamLimits::default())
                .await
                .unwrap();
            common::read_all(&log).await
        })
    }

    /// No action id has more than one outcome.
    fn assert_each_action_carried_out_at_most_once(&self) {
        let mut seen = std::collections::BTreeMap::<String, u32>::new();
        for r in self.records() {
            if let Event::ActionOutcome(o) = &r.envelope.event {
                *seen.entry(o.action_id.0.clone()).or_default() += 1;
            }
        }
        let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "actions carried out more than once: {twice:?}"
        );
    }

    /// Outcomes that succeeded, by action kind, in log order.
    fn succeeded(&self, kinds: &[&str]) -> Vec<String> {
        self.records()
            .into_iter()
            .filter_map(|r| match r.envelope.event {
                Event::ActionOutcome(o) if o.result == OutcomeResult::Succeeded => {
                    Some(o.kind.name().to_owned())
                }
                _ => None,
            })
            .filter(|k| kinds.contains(&k.as_str()))
            .collect()
    }

    /// Follows the logs of lockstep's current pods into the scenario's dir
    /// (they end when the container stops).
    fn follow_logs(&mut self) {
        for (name, ..) in self.lockstep_pods() {
            if self.followers.iter().any(|(n, _)| *n == name) {
                continue;
            }
            let file = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
            let child = Command::new(self.bed.bin.join("kubectl"))
                .args(["logs", "-f", "-n", LOCKSTEP_NS, &name, "-c", "lockstep"])
                .env("KUBECONFIG", &self.bed.kubeconfig)
                .stdout(file)
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            self.followers.push((name, child));
        }
    }

    /// Stops lockstep (the Deployment scaled to zero: a graceful stop of every
    /// replica), then exports the log up to the last record both replicas
    /// applied and replays it with `--verify`: every recorded action is what
    /// the reducer issues from the recorded events. The export and the replay
    /// run the binary that is in the image: the lockstep that wrote the log.
    /// Then `helm uninstall`.
    fn stop_and_verify(&mut self) {
        self.follow_logs();
        std::thread::sleep(Duration::from_millis(500));
        self.bed.kubectl(
            &[
                "scale",
                "deployment",
                RELEASE,
                "-n",
                LOCKSTEP_NS,
                "--replicas=0",
            ],
            None,
        );
        wait_for("lockstep's pods gone", 2 * MINUTE, || {
            self.lockstep_pods().is_empty().then_some(())
        });
        let mut applied = Vec::new();
        for (name, mut child) in std::mem::take(&mut self.followers) {
            let _ = wait_for(&format!("the log of {name} to end"), MINUTE, || {
                child.try_wait().unwrap()
            });
            let log = std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap();
            if let Some(seq) = log
                .lines()
                .filter(|l| l.contains("stopped"))
                .find_map(|l| l.split("applied_seq=").nth(1))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
            {
                applied.push(seq);
            }
        }
        let cut = applied
            .iter()
            .min()
            .unwrap_or_else(|| {
                panic!(
                    "no replica logged its final applied_seq (logs in {})",
                    self.dir.display()
                )
            })
            .to_string();
        let file = self.dir.join("incident.jsonl");
        let out = Command::new(&self.bed.images["LOCKSTEP_BINARY"])
            .args(["export", "--nats", &nats_url(), "--to", &cut])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "export: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = Command::new(&self.bed.images["LOCKSTEP_BINARY"])
            .args(["replay", "--verify"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "replay --verify: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self.bed.helm(&[
            "uninstall",
            RELEASE,
            "-n",
            LOCKSTEP_NS,
            "--wait",
            "--timeout",
            "120s",
        ]);
    }

    /// Writes what is needed to understand a failure into the scenario's dir.
    fn diagnostics(&self) {
        let b = &self.bed;
        let mut out = String::new();
        for args in [
            vec![
                "get",
                "nodes,pods,statefulsets,deployments,pdb,leases,events",
                "-A",
                "-o",
                "wide",
            ],
            vec!["describe", "pods", "-A"],
            vec!["describe", "node", NODE_NAME],
        ] {
            out += &format!("\n==== kubectl {}\n", args.join(" "));
            out += &b.try_kubectl(&args, None).unwrap_or_else(|e| e);
        }
        for ns in [LOCKSTEP_NS, SLURM_NS] {
            let pods = b
                .try_kubectl(&["get", "pods", "-n", ns, "-o", "name"], None)
                .unwrap_or_default();
            for p in pods.lines() {
                out += &format!("\n==== kubectl logs -n {ns} {p} --all-containers\n");
                out += &b
                    .try_kubectl(
                        &["logs", "-n", ns, p, "--all-containers", "--tail=300"],
                        None,
                    )
                    .unwrap_or_else(|e| e);
            }
        }
        out += "\n==== sinfo\n";
        out += &b
            .try_slurm("sinfo", &["-N", "-o", "%N %T %E"])
            .unwrap_or_else(|e| e);
        std::fs::write(self.dir.join("diagnostics.txt"), out).unwrap();
        let _ = Command::new(&self.bed.images["LOCKSTEP_BINARY"])
            .args(["export", "--nats", &nats_url()])
            .arg(self.dir.join("log-at-failure.jsonl"))
            .status();
        for (src, dst) in [
            ("node/logs/kubelet.log", "kubelet.log"),
            ("node/logs/containerd.log", "containerd.log"),
            (
                "node/logs/kube-controller-manager.log",
                "kube-controller-manager.log",
            ),
            ("slurm/log/slurmctld.log", "slurmctld.log"),
        ] {
            let _ = std::fs::copy(PathBuf::from(ROOT).join(src), self.dir.join(dst));
        }
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.diagnostics();
            eprintln!(
                "scenario files (values, logs, diagnostics, the log) kept in {}",
                self.dir.display()
            );
        }
        for (_, mut c) in std::mem::take(&mut self.followers) {
            let _ = c.kill();
            let _ = c.wait();
        }
        // What this scenario made goes; the node stays for the next one.
        self.clean();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn nats_url() -> String {
    format!("nats://127.0.0.1:{NATS_PORT}")
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Merges `b` into `a` (objects key by key, anything else replaced).
fn merge(a: &mut Value, b: &Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

fn base_policy() -> Value {
    json!({
        "mapping": {"mode": "pod", "pod_selector": SLURMD_SELECTOR},
        "health": {"unhealthy_taint": null},
    })
}

fn drained_by_lockstep(show: &str) -> bool {
    show.contains("DRAIN") && show.contains("Reason=lockstep:")
}

/// A figure for the report: printed and appended to the figures file.
fn figure(line: &str) {
    eprintln!("FIGURE {line}");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(PathBuf::from(ROOT).join("logs/figures.txt"))
    {
        let _ = writeln!(f, "{line}");
    }
}

fn percentiles(mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let pct = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
    format!(
        "n={} min {:.0} ms, p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        v.len(),
        ms(v[0]),
        ms(pct(0.50)),
        ms(pct(0.90)),
        ms(pct(0.99)),
        ms(v[v.len() - 1])
    )
}

/// The working set and the RSS of each container of lockstep's pods, from
/// the kubelet's summary API (the working set is what `kubectl top` and the
/// eviction manager use: the cgroup's usage minus inactive file pages, so it
/// also counts the page cache of sled's files that was used lately).
fn lockstep_memory(b: &Bed) -> Vec<(String, String, u64, u64)> {
    let raw = b.kubectl(
        &[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{NODE_NAME}/proxy/stats/summary"),
        ],
        None,
    );
    let summary: Value = serde_json::from_str(&raw).unwrap();
    let mut out = Vec::new();
    for pod in summary["pods"].as_array().into_iter().flatten() {
        if pod["podRef"]["namespace"] != LOCKSTEP_NS {
            continue;
        }
        for c in pod["containers"].as_array().into_iter().flatten() {
            out.push((
                pod["podRef"]["name"].as_str().unwrap_or("").to_owned(),
                c["name"].as_str().unwrap_or("").to_owned(),
                c["memory"]["workingSetBytes"].as_u64().unwrap_or(0),
                c["memory"]["rssBytes"].as_u64().unwrap_or(0),
            ));
        }
    }
    out
}

/// Cordon / uncordon through the API, timed from the PATCH.
fn set_unschedulable(b: &Bed, on: bool) {
    b.kubectl(
        &[
            "patch",
            "node",
            NODE_NAME,
            "--type=merge",
            "-p",
            &json!({"spec": {"unschedulable": on}}).to_string(),
        ],
        None,
    );
}

/// `trials` cordons of the node, each followed by an uncordon: the time
/// from just before the PATCH to DRAIN (with lockstep's reason) of every
/// Slurm node in `nodes`, and to the first of them, as slurmrestd shows it;
/// and when each PATCH was sent (ms since the epoch, for `latency_split`).
fn cordon_trials(
    b: &Bed,
    nodes: &[&str],
    trials: usize,
) -> (Vec<Duration>, Vec<Duration>, Vec<u64>) {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, Patch, PatchParams};
    use lockstep_connectors::slurm::{RestClient, RestConfig, TokenSource};
    use lockstep_schemas::SlurmNodeFlag;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let config = lockstep_connectors::kube::load_config(Some(&b.kubeconfig))
            .await
            .unwrap();
        let api: Api<Node> = Api::all(kube::Client::try_from(config).unwrap());
        let rest = RestClient::new(RestConfig::new(
            b.slurm["SLURMRESTD_URL"].clone(),
            b.slurm.get("SLURM_JWT_USER").map_or("root", String::as_str),
            TokenSource::File(b.slurm["SLURM_JWT_FILE"].clone().into()),
        ))
        .unwrap();
        let drained = |n: &str| {
            let (rest, n) = (rest.clone(), n.to_owned());
            async move {
                rest.node(&n).await.ok().flatten().is_some_and(|n| {
                    n.flags.contains(&SlurmNodeFlag::Drain)
                        && n.reason
                            .as_deref()
                            .is_some_and(|r| r.starts_with("lockstep:"))
                })
            }
        };
        let set = |on: bool| {
            let api = api.clone();
            async move {
                api.patch(
                    NODE_NAME,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"unschedulable": on}})),
                )
                .await
                .unwrap();
            }
        };
        let (mut all, mut first, mut sent) = (Vec::new(), Vec::new(), Vec::new());
        for trial in 0..trials {
            // A settled state first: lockstep holds the resume of the last
            // trial in flight until a Slurm poll (200 ms here) confirms it,
            // and a new drain of the same node waits for it (one action in
            // flight per target). A real cordon does not come 200 ms after
            // an uncordon; back-to-back trials would measure that wait.
            tokio::time::sleep(Duration::from_secs(1)).await;
            sent.push(epoch_ms());
            let t = Instant::now();
            set(true).await;
            let mut seen_first = None;
            loop {
                let mut count = 0;
                for n in nodes {
                    if drained(n).await {
                        count += 1;
                    }
                }
                if count > 0 && seen_first.is_none() {
                    seen_first = Some(t.elapsed());
                }
                if count == nodes.len() {
                    break;
                }
                assert!(
                    t.elapsed() < MINUTE,
                    "trial {trial}: not all drained within a minute"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            all.push(t.elapsed());
            first.push(seen_first.unwrap());
            set(false).await;
            let t = Instant::now();
            for n in nodes {
                while drained(n).await {
                    assert!(
                        t.elapsed() < MINUTE,
                        "trial {trial}: {n} not resumed within a minute"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        (all, first, sent)
    })
}

fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Where the time of a cordon goes, from the log (append times and the
/// observers' own times are this host's clock, as is `sent`): PATCH sent ->
/// seen by lockstep's Kubernetes observer -> appended to the log -> the last
/// drain's outcome appended (the reducer, the action, scontrol in the pod).
fn latency_split(records: &[EventRecord], sent: &[u64]) -> String {
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let (mut observed, mut appended, mut drained) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &t) in sent.iter().enumerate() {
        let end = sent.get(i + 1).copied().unwrap_or(u64::MAX);
        let Some(cordon) = records.iter().find(|r| {
            r.time_ms >= t
                && r.time_ms < end
                && matches!(&r.envelope.event, Event::KubeNode(n) if n.name == NODE_NAME && n.unschedulable)
        }) else {
            continue;
        };
        let last_drain = records
            .iter()
            .filter(|r| r.seq > cordon.seq && r.time_ms < end)
            .filter(|r| matches!(&r.envelope.event, Event::ActionOutcome(o) if o.kind.name() == "slurm_drain"))
            .map(|r| r.time_ms)
            .max();
        observed.push(cordon.envelope.observed_ms.saturating_sub(t));
        appended.push(cordon.time_ms.saturating_sub(cordon.envelope.observed_ms));
        if let Some(d) = last_drain {
            drained.push(d.saturating_sub(cordon.time_ms));
        }
    }
    format!(
        "medians over {} trials: PATCH -> observed {} ms, observed -> in the log {} ms, in the log -> last drain done {} ms",
        observed.len(),
        median(observed),
        median(appended),
        median(drained)
    )
}

#[test]
fn the_chart_runs_lockstep_as_pods_and_a_cordon_drains_every_slurm_node_of_the_node() {
    let mut s = Scenario::new("cordon");
    s.slurmd_statefulset(3, &s.slurmd_image());
    s.wait_slurm_idle(3);
    s.install(&base_policy(), &json!({}));
    s.follow_logs();
    let b = &s.bed;

    // lockstep runs as its ServiceAccount, in the pod network, with the
    // in-cluster configuration the kubelet gives it: the leader holds the
    // Lease under its pod's name.
    let pods = s.lockstep_pods();
    assert_eq!(pods.len(), 2, "{pods:?}");
    for (name, ..) in &pods {
        let pod = b.get(&["pod", name, "-n", LOCKSTEP_NS]).unwrap();
        assert_eq!(pod["spec"]["serviceAccountName"], RELEASE);
        assert!(
            pod["spec"]["hostNetwork"].is_null(),
            "lockstep runs in the pod network"
        );
    }
    let leader = s.wait_leader();
    let lease = b.get(&["lease", RELEASE, "-n", LOCKSTEP_NS]).unwrap();
    assert!(
        lease["spec"]["holderIdentity"]
            .as_str()
            .is_some_and(|h| h.starts_with(&leader)),
        "{lease}"
    );
    // The chart's ClusterRole is deploy/kubernetes/rbac.yaml's.
    let manifest = b.kubectl(
        &[
            "create",
            "--dry-run=client",
            "-o",
            "json",
            "-f",
            common::repo()
                .join("deploy/kubernetes/rbac.yaml")
                .to_str()
                .unwrap(),
        ],
        None,
    );
    // (one JSON document per object)
    let role = serde_json::Deserializer::from_str(&manifest)
        .into_iter::<Value>()
        .map(Result::unwrap)
        .find(|o| o["kind"] == "ClusterRole")
        .expect("rbac.yaml has a ClusterRole");
    let installed = b.get(&["clusterrole", RELEASE]).unwrap();
    assert_eq!(
        installed["rules"], role["rules"],
        "the chart's ClusterRole differs from rbac.yaml"
    );

    // A cordon drains all three Slurm nodes of the node; uncordon resumes
    // them. Timed as scripts/bench-reaction.sh times it: from just before
    // the node PATCH is sent (through the API, as `kubectl cordon` does) to
    // DRAIN of every Slurm node in slurmctld (slurmrestd, polled every 5 ms).
    let nodes = ["slurmd-0", "slurmd-1", "slurmd-2"];
    let (all, first, sent) = cordon_trials(b, &nodes, 20);
    // And with kubectl itself: the reason names the cause.
    b.kubectl(&["cordon", NODE_NAME], None);
    wait_for("slurmd-1 drained by kubectl cordon", MINUTE, || {
        let show = b.slurm_node("slurmd-1");
        (drained_by_lockstep(&show) && show.contains(&format!("{NODE_NAME} cordoned")))
            .then_some(())
    });
    b.kubectl(&["uncordon", NODE_NAME], None);
    for n in nodes {
        wait_for(&format!("{n} resumed"), MINUTE, || {
            (!b.slurm_node(n).contains("DRAIN")).then_some(())
        });
    }
    figure(&format!(
        "real node, lockstep from the chart (2 pods): cordon -> DRAIN of all 3 Slurm nodes: {}",
        percentiles(all)
    ));
    figure(&format!(
        "real node: cordon -> DRAIN of the first Slurm node: {}",
        percentiles(first)
    ));
    figure(&format!(
        "real node: cordon latency split, {}",
        latency_split(&s.records(), &sent)
    ));
    for (pod, container, working_set, rss) in lockstep_memory(b) {
        let role = if pod == leader { "leader" } else { "follower" };
        figure(&format!(
            "real node: memory of {pod} ({role}) container {container}: working set {:.1} MiB, RSS {:.1} MiB",
            working_set as f64 / (1 << 20) as f64,
            rss as f64 / (1 << 20) as f64
        ));
    }
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify();
    // Nothing of the release is left.
    assert!(s.bed.get(&["clusterrole", RELEASE]).is_none());
    assert!(s
        .bed
        .get(&["configmap", "lockstep-policy", "-n", LOCKSTEP_NS])
        .is_none());
}

/// A PodDisruptionBudget that lets no busy slurmd pod go (lockstep labels
/// the pods whose Slurm node runs a job).
fn busy_pdb(b: &Bed) {
    b.apply(&json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "slurmd-busy", "namespace": SLURM_NS},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {BUSY_LABEL: "true"}}},
    }));
}

fn uid(s: &Scenario, pod: &str) -> Option<String> {
    s.pod(pod)
        .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_owned))
}

fn running(s: &Scenario, pod: &str) -> bool {
    s.pod(pod).is_some_and(|p| {
        p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
    })
}

#[test]
fn kubectl_drain_evicts_a_slurmd_pod_only_once_its_job_has_ended() {
    let mut s = Scenario::new("drain");
    s.slurmd_statefulset(2, &s.slurmd_image());
    s.wait_slurm_idle(2);
    busy_pdb(&s.bed);
    let mut policy = base_policy();
    policy["scaling"]["busy_label"] = json!(BUSY_LABEL);
    s.install(&policy, &json!({}));

    let job = s.bed.sbatch(&["-w", "slurmd-1"], "sleep 25");
    wait_for("the job runs", MINUTE, || {
        (s.bed.job_state(&job).as_deref() == Some("RUNNING")).then_some(())
    });
    wait_for("the busy label on slurmd-1", MINUTE, || {
        (s.pod("slurmd-1")?["metadata"]["labels"][BUSY_LABEL] == "true").then_some(())
    });
    let (uid0, uid1) = (uid(&s, "slurmd-0").unwrap(), uid(&s, "slurmd-1").unwrap());

    // A real `kubectl drain` (of the slurmd pods: lockstep's own pods, on the
    // same single node, have their own budget).
    let mut drain = Command::new(s.bed.bin.join("kubectl"))
        .args([
            "drain",
            NODE_NAME,
            "--pod-selector",
            SLURMD_SELECTOR,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=180s",
        ])
        .env("KUBECONFIG", &s.bed.kubeconfig)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(s.dir.join("kubectl-drain.log")).unwrap())
        .spawn()
        .map(|c| common::Reap(Some(c)))
        .unwrap();
    for n in ["slurmd-0", "slurmd-1"] {
        wait_for(&format!("{n} drained by lockstep"), MINUTE, || {
            drained_by_lockstep(&s.bed.slurm_node(n)).then_some(())
        });
    }
    // The idle pod goes at once; its replacement stays Pending (cordoned).
    wait_for("slurmd-0 evicted", MINUTE, || {
        (uid(&s, "slurmd-0").as_deref() != Some(uid0.as_str())).then_some(())
    });
    // The busy one stays while the job runs: the eviction is refused.
    let mut label_gone = None;
    while s.bed.job_state(&job).is_some() {
        assert!(
            drain.0.as_mut().unwrap().try_wait().unwrap().is_none(),
            "kubectl drain finished while the job still ran"
        );
        assert_eq!(
            uid(&s, "slurmd-1").as_deref(),
            Some(uid1.as_str()),
            "slurmd-1 was evicted under a running job"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let job_ended = Instant::now();
    let status = wait_for("kubectl drain to finish once the job ended", MINUTE, || {
        if label_gone.is_none()
            && s.pod("slurmd-1")
                .is_some_and(|p| p["metadata"]["labels"][BUSY_LABEL].is_null())
        {
            label_gone = Some(job_ended.elapsed());
        }
        drain.0.as_mut().unwrap().try_wait().unwrap()
    });
    let drained_after = job_ended.elapsed();
    assert!(
        status.success(),
        "kubectl drain failed: {}",
        std::fs::read_to_string(s.dir.join("kubectl-drain.log")).unwrap()
    );
    drain.0 = None;
    assert_eq!(s.bed.job_end_state(&job).as_deref(), Some("COMPLETED"));
    assert_ne!(uid(&s, "slurmd-1").as_deref(), Some(uid1.as_str()));
    figure(&format!(
        "real node: kubectl drain of a node whose pod runs a job: finished {:.1} s after the job ended (busy label removed after {})",
        drained_after.as_secs_f64(),
        label_gone.map_or("-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
    ));

    // Uncordon: the StatefulSet's replacements run, lockstep lifts its drains.
    s.bed.kubectl(&["uncordon", NODE_NAME], None);
    for n in ["slurmd-0", "slurmd-1"] {
        wait_for(&format!("{n} running again"), MINUTE, || {
            running(&s, n).then_some(())
        });
    }
    s.wait_slurm_idle(2);
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify();
}

fn scaling_policy(min: u32, max: u32) -> Value {
    let mut policy = base_policy();
    policy["scaling"]["busy_label"] = json!(BUSY_LABEL);
    policy["scaling"]["targets"] = json!([{
        "target": {"group": "apps", "kind": "StatefulSet", "namespace": SLURM_NS, "name": "slurmd"},
        "partition": "batch",
        "min_replicas": min,
        "max_replicas": max,
        "scale_up_cooldown_s": 0,
        "scale_down_cooldown_s": 0,
        "idle_before_scale_down_s": 3,
        "max_unavailable": 1,
    }]);
    policy["actions"]["timeout_s"] = json!(10);
    policy["actions"]["retry_backoff_initial_s"] = json!(1);
    policy
}

/// The Slurm node a running job is on.
fn job_node(b: &Bed, job: &str) -> String {
    b.slurm("squeue", &["-h", "-j", job, "-o", "%N"])
        .trim()
        .to_owned()
}

#[test]
fn lockstep_scales_the_statefulset_through_its_controller_and_never_removes_the_pod_of_a_running_job(
) {
    let mut s = Scenario::new("scale");
    s.slurmd_statefulset(1, &s.slurmd_image());
    s.wait_slurm_idle(1);
    s.install(&scaling_policy(1, 3), &json!({}));
    let b = &s.bed;

    // Scale-up: each job that waits for a node makes lockstep raise the
    // replicas; the StatefulSet controller creates the pod, its slurmd
    // registers, the job runs there.
    let a = b.sbatch(&["-N", "1", "--exclusive"], "sleep 600");
    wait_for("job a runs", MINUTE, || {
        (b.job_state(&a).as_deref() == Some("RUNNING")).then_some(())
    });
    let t = Instant::now();
    let bj = b.sbatch(&["-N", "1", "--exclusive"], "sleep 600");
    wait_for("job b runs on a new pod", 2 * MINUTE, || {
        (b.job_state(&bj).as_deref() == Some("RUNNING")).then_some(())
    });
    figure(&format!(
        "real node: a job waiting for a node -> running on a pod lockstep had the StatefulSet create: {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    let c = b.sbatch(&["-N", "1", "--exclusive"], "sleep 40");
    wait_for("job c runs", 2 * MINUTE, || {
        (b.job_state(&c).as_deref() == Some("RUNNING")).then_some(())
    });
    assert_eq!(s.replicas(), 3);
    assert_eq!(
        job_node(b, &c),
        "slurmd-2",
        "job c is on the highest ordinal"
    );
    let uid2 = uid(&s, "slurmd-2").unwrap();

    // a and b end: slurmd-0 and slurmd-1 are idle, slurmd-2 still runs c. A
    // StatefulSet scales in from its highest ordinal, so any scale-in now
    // would kill c: lockstep must hold the replicas until c ends.
    b.slurm("scancel", &[&a, &bj]);
    while b.job_state(&c).is_some() {
        assert_eq!(
            s.replicas(),
            3,
            "the StatefulSet was scaled in under the job on slurmd-2"
        );
        assert_eq!(
            uid(&s, "slurmd-2").as_deref(),
            Some(uid2.as_str()),
            "the pod of the running job was removed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        b.job_end_state(&c).as_deref(),
        Some("COMPLETED"),
        "job c was not allowed to finish"
    );

    // Then the scale-in: down to the minimum, highest ordinals first.
    wait_for("the StatefulSet scaled in to 1", 3 * MINUTE, || {
        (s.replicas() == 1).then_some(())
    });
    for n in ["slurmd-1", "slurmd-2"] {
        wait_for(&format!("pod {n} gone"), MINUTE, || {
            s.pod(n).is_none().then_some(())
        });
    }
    assert!(running(&s, "slurmd-0"));
    assert!(
        !b.slurm_node("slurmd-0").contains("DRAIN"),
        "{}",
        b.slurm_node("slurmd-0")
    );
    // Two scale-ups; then the victims drained before the scale-in that
    // removes them (lockstep may lower the replicas in one step: the
    // controller removes the highest ordinals itself).
    let kinds = s.succeeded(&["slurm_drain", "kube_delete_pod", "kube_scale"]);
    let first_drain = kinds
        .iter()
        .position(|k| k == "slurm_drain")
        .expect("no drain");
    assert_eq!(
        &kinds[..first_drain],
        ["kube_scale", "kube_scale"],
        "{kinds:?}"
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("kube_scale"),
        "{kinds:?}"
    );
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify();
}

#[test]
fn a_new_slurmd_image_rolls_out_one_pod_at_a_time_and_waits_for_the_running_job() {
    let mut s = Scenario::new("rollout");
    let old = s.slurmd_image();
    let new = format!("{old}-r2");
    s.bed.tag_image(&old, &new);
    s.slurmd_statefulset(2, &old);
    s.wait_slurm_idle(2);
    s.install(&scaling_policy(2, 2), &json!({}));
    let b = &s.bed;

    let job = b.sbatch(&["-w", "slurmd-1"], "sleep 40");
    wait_for("the job runs", MINUTE, || {
        (b.job_state(&job).as_deref() == Some("RUNNING")).then_some(())
    });
    let (uid0, uid1) = (uid(&s, "slurmd-0").unwrap(), uid(&s, "slurmd-1").unwrap());
    b.kubectl(
        &[
            "set",
            "image",
            "statefulset/slurmd",
            "-n",
            SLURM_NS,
            &format!("slurmd={new}"),
        ],
        None,
    );
    let image = |pod: &str| {
        s.pod(pod).and_then(|p| {
            p["spec"]["containers"][0]["image"]
                .as_str()
                .map(str::to_owned)
        })
    };

    // The idle pod is replaced first (drained, deleted, recreated by the
    // controller at the new revision); its Slurm node comes back.
    wait_for("slurmd-0 replaced by the new image", 2 * MINUTE, || {
        (uid(&s, "slurmd-0").is_some_and(|u| u != uid0)
            && image("slurmd-0").as_deref() == Some(new.as_str())
            && running(&s, "slurmd-0"))
        .then_some(())
    });
    s.wait_slurm_idle(1);
    // The busy one waits for its job.
    while b.job_state(&job).is_some() {
        assert_eq!(
            uid(&s, "slurmd-1").as_deref(),
            Some(uid1.as_str()),
            "slurmd-1 was replaced under its job"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(b.job_end_state(&job).as_deref(), Some("COMPLETED"));
    wait_for("slurmd-1 replaced by the new image", 2 * MINUTE, || {
        (uid(&s, "slurmd-1").is_some_and(|u| u != uid1)
            && image("slurmd-1").as_deref() == Some(new.as_str())
            && running(&s, "slurmd-1"))
        .then_some(())
    });
    s.wait_slurm_idle(2);
    for n in ["slurmd-0", "slurmd-1"] {
        wait_for(&format!("{n} resumed"), MINUTE, || {
            (!b.slurm_node(n).contains("DRAIN")).then_some(())
        });
    }
    assert_eq!(s.replicas(), 2);
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify();
}

#[test]
fn a_stopped_kubelet_makes_the_node_unknown_and_lockstep_drains_its_slurm_nodes_until_it_is_back() {
    let mut s = Scenario::new("kubelet");
    s.slurmd_statefulset(2, &s.slurmd_image());
    s.wait_slurm_idle(2);
    let mut policy = base_policy();
    policy["health"]["not_ready_grace_s"] = json!(5);
    policy["health"]["resume_after_s"] = json!(2);
    s.install(&policy, &json!({}));
    let b = &s.bed;

    let pid = b.kubelet_pid().expect("the kubelet runs");
    let t = Instant::now();
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let ready = || -> Option<String> {
        b.get(&["node", NODE_NAME])?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready")
            .and_then(|c| c["status"].as_str().map(str::to_owned))
    };
    wait_for("the node Ready=Unknown", 2 * MINUTE, || {
        (ready().as_deref() == Some("Unknown")).then_some(())
    });
    let unknown = t.elapsed();
    for n in ["slurmd-0", "slurmd-1"] {
        wait_for(&format!("{n} drained for the lost node"), MINUTE, || {
            let show = b.slurm_node(n);
            (drained_by_lockstep(&show) && show.contains("not ready")).then_some(())
        });
    }
    let drained = t.elapsed();
    assert!(
        drained - unknown >= Duration::from_secs(4),
        "drained before the grace period: {unknown:?} {drained:?}"
    );
    // The containers outlive the kubelet: slurmd still answers, jobs could run.
    assert!(
        !b.slurm_state("slurmd-0").contains("DOWN"),
        "{}",
        b.slurm_state("slurmd-0")
    );
    figure(&format!(
        "real node: kubelet stopped -> node Ready=Unknown after {:.1} s (node-monitor-grace-period 20 s) -> Slurm nodes drained {:.1} s later (grace 5 s)",
        unknown.as_secs_f64(),
        (drained - unknown).as_secs_f64()
    ));

    common::node::script("deploy/local/kube/node-up.sh", &[]);
    wait_for("the node Ready again", MINUTE, || {
        (ready().as_deref() == Some("True")).then_some(())
    });
    for n in ["slurmd-0", "slurmd-1"] {
        wait_for(&format!("{n} resumed"), MINUTE, || {
            (!b.slurm_node(n).contains("DRAIN")).then_some(())
        });
    }
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify();
}

#[test]
fn lockstep_pod_deleted_in_the_middle_of_a_scale_in_and_the_other_replica_completes_it_once() {
    let mut s = Scenario::new("takeover");
    s.slurmd_statefulset(2, &s.slurmd_image());
    s.wait_slurm_idle(2);
    // Minimum 1, but slurmd-1 (the highest ordinal) runs a job: no scale-in
    // until the test cancels it, once it watches. lockstep polls Slurm every
    // 4 s here: between the drain and the poll that sees slurmd-1 DRAINED
    // (after which the scale-in completes) there is time to delete the leader.
    let job = s.bed.sbatch(&["-w", "slurmd-1"], "sleep 600");
    wait_for("the job runs", MINUTE, || {
        (s.bed.job_state(&job).as_deref() == Some("RUNNING")).then_some(())
    });
    s.install(
        &scaling_policy(1, 2),
        &json!({"slurm": {"pollIntervalMs": 4000}}),
    );
    s.follow_logs();
    let b = &s.bed;
    let leader = s.wait_leader();
    b.slurm("scancel", &[&job]);

    wait_for("slurmd-1 drained by lockstep", MINUTE, || {
        drained_by_lockstep(&b.slurm_node("slurmd-1")).then_some(())
    });
    assert_eq!(
        s.replicas(),
        2,
        "the scale-in finished before the leader could be deleted"
    );
    let standby: Vec<String> = s
        .lockstep_pods()
        .into_iter()
        .map(|(name, ..)| name)
        .filter(|n| *n != leader)
        .collect();
    b.kubectl(
        &["delete", "pod", &leader, "-n", LOCKSTEP_NS, "--wait=false"],
        None,
    );
    let deleted = Instant::now();
    let next = wait_for("another replica leads", MINUTE, || {
        s.leader().filter(|l| *l != leader)
    });
    assert!(
        standby.contains(&next),
        "{next} leads, not the standby replica {standby:?}"
    );
    figure(&format!(
        "real node: lockstep's leader pod deleted mid scale-in -> {next} leads after {:.1} s (lease 3 s)",
        deleted.elapsed().as_secs_f64()
    ));
    wait_for("the StatefulSet scaled in to 1", 2 * MINUTE, || {
        (s.replicas() == 1).then_some(())
    });
    wait_for("pod slurmd-1 gone", MINUTE, || {
        s.pod("slurmd-1").is_none().then_some(())
    });
    // Once: the count settles at 1, slurmd-0 stays in service.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(s.replicas(), 1);
    assert!(running(&s, "slurmd-0"));
    assert!(!b.slurm_node("slurmd-0").contains("DRAIN"));
    let kinds = s.succeeded(&["kube_delete_pod", "kube_scale"]);
    assert!(
        kinds.iter().filter(|k| *k == "kube_scale").count() <= 1,
        "{kinds:?}"
    );
    assert!(
        kinds.iter().filter(|k| *k == "kube_delete_pod").count() <= 1,
        "{kinds:?}"
    );
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify();
}

#[test]
fn a_policy_change_through_helm_upgrade_reaches_the_running_pods_without_a_restart() {
    let mut s = Scenario::new("policy");
    s.slurmd_statefulset(2, &s.slurmd_image());
    s.wait_slurm_idle(2);
    let mut policy = base_policy();
    policy["drain"]["on_cordon"] = json!(false);
    s.install(&policy, &json!({}));
    let before = s.lockstep_pods();
    let b = &s.bed;

    // Cordons do not drain under this policy.
    set_unschedulable(b, true);
    let seen = wait_for("the cordon in the log", MINUTE, || {
        s.records()
            .into_iter()
            .rev()
            .find_map(|r| match &r.envelope.event {
                Event::KubeNode(n) if n.name == NODE_NAME && n.unschedulable => Some(r.seq),
                _ => None,
            })
    });
    wait_for("lockstep applied the cordon", MINUTE, || {
        s.lockstep_pods()
            .iter()
            .filter_map(|(_, ip, ..)| Scenario::status(ip))
            .any(|st| st["leader"] == true && st["applied_seq"].as_u64().is_some_and(|a| a >= seen))
            .then_some(())
    });
    assert!(!b.slurm_node("slurmd-0").contains("DRAIN"));

    // helm upgrade with the policy changed: the kubelet updates the
    // ConfigMap volume, lockstep appends PolicyChanged, the cordon drains.
    let values = s.dir.join("policy-upgrade.json");
    policy["drain"]["on_cordon"] = json!(true);
    std::fs::write(&values, json!({"policy": policy}).to_string()).unwrap();
    let chart = common::repo().join("deploy/helm/lockstep");
    let t = Instant::now();
    b.helm(&[
        "upgrade",
        RELEASE,
        chart.to_str().unwrap(),
        "-n",
        LOCKSTEP_NS,
        "--reuse-values",
        "-f",
        values.to_str().unwrap(),
        "--wait",
        "--timeout",
        "120s",
    ]);
    for n in ["slurmd-0", "slurmd-1"] {
        wait_for(
            &format!("{n} drained once the policy says so"),
            2 * MINUTE,
            || drained_by_lockstep(&b.slurm_node(n)).then_some(()),
        );
    }
    figure(&format!(
        "real node: helm upgrade of the policy -> PolicyChanged applied and the cordon drains: {:.1} s (kubelet syncFrequency 10 s)",
        t.elapsed().as_secs_f64()
    ));
    let changes: Vec<bool> = s
        .records()
        .into_iter()
        .filter_map(|r| match r.envelope.event {
            Event::PolicyChanged(p) => Some(p.drain.on_cordon),
            _ => None,
        })
        .collect();
    assert_eq!(changes.first(), Some(&false), "{changes:?}");
    assert_eq!(changes.last(), Some(&true), "{changes:?}");
    // No pod was restarted or replaced.
    assert_eq!(s.lockstep_pods(), before);

    set_unschedulable(b, false);
    for n in ["slurmd-0", "slurmd-1"] {
        wait_for(&format!("{n} resumed"), MINUTE, || {
            (!b.slurm_node(n).contains("DRAIN")).then_some(())
        });
    }
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify();
}

#[test]
fn embedded_mode_runs_one_replica_whose_log_survives_its_pod() {
    let s = Scenario::new("embedded");
    s.slurmd_statefulset(1, &s.slurmd_image());
    s.wait_slurm_idle(1);
    // A volume for the claim (there is no provisioner): a hostPath PV.
    let path = PathBuf::from(ROOT).join(format!("pv/embedded-{}", rand_suffix()));
    s.bed.apply(&json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "lockstep-e2e-embedded", "labels": {"lockstep-node-e2e": "true"}},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "lockstep-local",
            "hostPath": {"path": path.display().to_string(), "type": "DirectoryOrCreate"},
        },
    }));
    s.install(
        &base_policy(),
        &json!({"mode": "embedded", "embedded": {"persistence": {"storageClass": "lockstep-local", "size": "1Gi"}}}),
    );
    let b = &s.bed;
    let pvc = b
        .get(&["pvc", "data-lockstep-0", "-n", LOCKSTEP_NS])
        .unwrap();
    assert_eq!(pvc["status"]["phase"], "Bound", "{pvc}");
    assert_eq!(pvc["spec"]["volumeName"], "lockstep-e2e-embedded");

    set_unschedulable(b, true);
    wait_for("slurmd-0 drained", MINUTE, || {
        drained_by_lockstep(&b.slurm_node("slurmd-0")).then_some(())
    });
    set_unschedulable(b, false);
    wait_for("slurmd-0 resumed", MINUTE, || {
        (!b.slurm_node("slurmd-0").contains("DRAIN")).then_some(())
    });
    let applied = |s: &Scenario| {
        s.lockstep_pods()
            .first()
            .and_then(|(_, ip, ..)| Scenario::status(ip))
            .filter(|st| st["ready"] == true)
            .and_then(|st| st["applied_seq"].as_u64())
    };
    let before = wait_for("lockstep's status", MINUTE, || applied(&s));

    // The pod goes; the StatefulSet's new pod has the same volume, the same
    // log: it goes on from where the old one was, and still acts.
    b.kubectl(&["delete", "pod", "lockstep-0", "-n", LOCKSTEP_NS], None);
    let after = wait_for("the new pod caught up", 2 * MINUTE, || {
        applied(&s).filter(|a| *a >= before)
    });
    assert!(after >= before);
    set_unschedulable(b, true);
    wait_for("slurmd-0 drained by the new pod", MINUTE, || {
        drained_by_lockstep(&b.slurm_node("slurmd-0")).then_some(())
    });
    set_unschedulable(b, false);
    wait_for("slurmd-0 resumed", MINUTE, || {
        (!b.slurm_node("slurmd-0").contains("DRAIN")).then_some(())
    });
    b.helm(&[
        "uninstall",
        RELEASE,
        "-n",
        LOCKSTEP_NS,
        "--wait",
        "--timeout",
        "120s",
    ]);
}
