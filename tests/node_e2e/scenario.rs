//! A scenario on the real node: the bed cleaned, lockstep installed from its
//! chart, its pods, logs and exported log; what every scenario starts from.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::MutexGuard;
use std::time::Duration;

use lockstep_schemas::{Event, EventRecord, OutcomeResult};
use lockstep_store::{EventLog, StreamLimits};
use lockstep_testkit::{temp_dir, wait_showing};
use serde_json::{json, Value};

use crate::common::node::{Bed, LOCKSTEP_NS, NATS_PORT, NODE_NAME, RELEASE, ROOT, SLURM_NS};
use crate::common::wait_for;

pub const MINUTE: Duration = Duration::from_secs(60);
pub const BUSY_LABEL: &str = "lockstep.io/slurm-busy";
pub const SLURMD_SELECTOR: &str = "app.kubernetes.io/component=slurmd";

/// One scenario: the bed (node, Slurm, NATS, images), cleaned; a temp dir
/// for values files, logs and the exported log.
pub struct Scenario {
    pub bed: Bed,
    pub dir: PathBuf,
    /// `kubectl logs -f` of lockstep's pods, started by `follow_logs`.
    pub followers: Vec<(String, Child)>,
    pub _turn: MutexGuard<'static, ()>,
}

impl Scenario {
    pub fn new(name: &str) -> Self {
        let turn = crate::common::node::ONE_AT_A_TIME
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
    pub fn clean(&self) {
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
    pub fn prepare(&self) {
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

    pub fn node_ready(&self) -> bool {
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
    pub fn slurmd_statefulset(&self, replicas: u32, image: &str) {
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

    pub fn slurmd_image(&self) -> String {
        self.bed.images["SLURMD_IMAGE"].clone()
    }

    /// Slurm nodes `slurmd-0 .. slurmd-{n-1}` registered by their pods' slurmd and idle.
    pub fn wait_slurm_idle(&self, n: usize) {
        for i in 0..n {
            let node = format!("slurmd-{i}");
            wait_showing(&format!("{node} registered and idle"), 2 * MINUTE, || {
                let state = self.bed.slurm_state(&node);
                if state == "IDLE" {
                    Ok(())
                } else {
                    Err(format!("State={state}"))
                }
            });
        }
    }

    pub fn replicas(&self) -> u64 {
        self.bed
            .get(&["statefulset", "slurmd", "-n", SLURM_NS])
            .unwrap()["spec"]["replicas"]
            .as_u64()
            .unwrap()
    }

    pub fn pod(&self, name: &str) -> Option<Value> {
        self.bed.get(&["pod", name, "-n", SLURM_NS])
    }

    /// The chart's values for this bed; `policy` and `overrides` on top.
    pub fn values(&self, policy: &Value, overrides: &Value) -> PathBuf {
        let b = &self.bed;
        let socket_dir = b.slurm_state.join("munge");
        let mut values = json!({
            "mode": "nats",
            "replicaCount": 2,
            "image": {"repository": b.images["LOCKSTEP_IMAGE"].rsplit_once(':').unwrap().0},
            "nats": {"url": format!("nats://{}:{NATS_PORT}", b.gateway())},
            "slurm": {
                "restUrl": format!("http://{}:{}", b.gateway(), crate::common::node::SLURMRESTD_PORT),
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
    pub fn install(&self, policy: &Value, overrides: &Value) {
        let values = self.values(policy, overrides);
        let chart = crate::common::repo().join("deploy/helm/lockstep");
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
    pub fn lockstep_pods(&self) -> Vec<(String, String, String, u64)> {
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
    pub fn status(ip: &str) -> Option<Value> {
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
    pub fn leader(&self) -> Option<String> {
        self.lockstep_pods()
            .into_iter()
            .find(|(_, ip, _, _)| Self::status(ip).is_some_and(|s| s["leader"] == true))
            .map(|(name, ..)| name)
    }

    pub fn wait_leader(&self) -> String {
        wait_for("a lockstep pod leads", 2 * MINUTE, || self.leader())
    }

    /// Every record of the log.
    pub fn records(&self) -> Vec<EventRecord> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let log = EventLog::connect_nats(&nats_url(), &StreamLimits::default())
                .await
                .unwrap();
            crate::common::read_all(&log).await
        })
    }

    /// No action id has more than one outcome.
    pub fn assert_each_action_carried_out_at_most_once(&self) {
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
    pub fn succeeded(&self, kinds: &[&str]) -> Vec<String> {
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
    pub fn follow_logs(&mut self) {
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
    pub fn stop_and_verify(&mut self) {
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
    pub fn diagnostics(&self) {
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
            out += &self.kubectl_or_error(&args);
        }
        for ns in [LOCKSTEP_NS, SLURM_NS] {
            out += &self.pod_logs(ns, 300);
        }
        out += "\n==== sinfo\n";
        out += &self.sinfo();
        std::fs::write(self.dir.join("diagnostics.txt"), out).unwrap();
        eprintln!("{}", self.digest());
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

impl Scenario {
    /// A short account of the bed at a failure, for the test's own output
    /// (where CI shows it; the files stay on the machine that ran it): the
    /// node's conditions and taints, the slurmd pods and their containers'
    /// states, warning events, Slurm's view of its nodes, and the end of
    /// each slurmd pod's log.
    fn digest(&self) -> String {
        let mut out = String::from("---- the bed at the failure\n");
        out += &self.kubectl_or_error(&[
            "get",
            "node",
            NODE_NAME,
            "-o",
            "jsonpath={range .status.conditions[*]}{.type}={.status} {end}taints: {.spec.taints}",
        ]);
        out += "\n";
        out += &self.kubectl_or_error(&[
            "get",
            "pods",
            "-n",
            SLURM_NS,
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.nodeName} {.status.containerStatuses[*].state}{\"\\n\"}{end}",
        ]);
        out += &self.kubectl_or_error(&[
            "get",
            "events",
            "-A",
            "--field-selector=type=Warning",
            "-o",
            "custom-columns=AGE:.lastTimestamp,OBJECT:.involvedObject.name,REASON:.reason,MESSAGE:.message",
        ]);
        out += "\n";
        out += &self.sinfo();
        let ctld = std::fs::read_to_string(PathBuf::from(ROOT).join("slurm/log/slurmctld.log"))
            .unwrap_or_default();
        let lines: Vec<&str> = ctld.lines().collect();
        out += "-- the end of slurmctld.log\n";
        out += &lines[lines.len().saturating_sub(12)..].join("\n");
        out += &self.pod_logs(SLURM_NS, 20);
        out
    }

    /// kubectl's output, or its error.
    fn kubectl_or_error(&self, args: &[&str]) -> String {
        self.bed.try_kubectl(args, None).unwrap_or_else(|e| e)
    }

    /// The last `tail` lines of the log of each pod of `ns`.
    fn pod_logs(&self, ns: &str, tail: usize) -> String {
        let mut out = String::new();
        let pods = self
            .bed
            .try_kubectl(&["get", "pods", "-n", ns, "-o", "name"], None)
            .unwrap_or_default();
        let tail = format!("--tail={tail}");
        for p in pods.lines() {
            out += &format!("\n==== kubectl logs -n {ns} {p} --all-containers {tail}\n");
            out += &self.kubectl_or_error(&["logs", "-n", ns, p, "--all-containers", &tail]);
        }
        out
    }

    /// Slurm's nodes: name, state, reason.
    fn sinfo(&self) -> String {
        self.bed
            .try_slurm("sinfo", &["-N", "-o", "%N %T %E"])
            .unwrap_or_else(|e| e)
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

pub fn nats_url() -> String {
    format!("nats://127.0.0.1:{NATS_PORT}")
}

pub fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Merges `b` into `a` (objects key by key, anything else replaced).
pub fn merge(a: &mut Value, b: &Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

pub fn base_policy() -> Value {
    json!({
        "mapping": {"mode": "pod", "pod_selector": SLURMD_SELECTOR},
        "health": {"unhealthy_taint": null},
    })
}

pub fn drained_by_lockstep(show: &str) -> bool {
    show.contains("DRAIN") && show.contains("Reason=lockstep:")
}
