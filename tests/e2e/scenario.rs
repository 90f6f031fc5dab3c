//! A scenario's world for the end-to-end tests: the local stack cleaned, a
//! fresh nats-server and directory, `lockstep run` started and its log replayed
//! with `--verify`; what every scenario starts from.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use lockstep_schemas::{Event, EventRecord};
use lockstep_store::{EventLog, StreamLimits};
use lockstep_testkit::{temp_dir, NatsServer};
use serde_json::{json, Value};

use crate::common::{wait_for, Lockstep, Stack};

/// The slurmd pods live here.
pub const NS: &str = "slurm";
/// Label on every Kubernetes object these tests create.
pub const MARK: &str = "lockstep-e2e";
pub const BUSY_LABEL: &str = "lockstep.io/slurm-busy";
/// The pod label naming a pod's Slurm node where pods are not named after
/// them (the StatefulSet's `slurm-<ordinal>`).
pub const NODE_LABEL: &str = "slurm.node";
pub const MINUTE: Duration = Duration::from_secs(60);

/// The replicas' leader election: a Lease of 8 s, renewed every 0.5 s, given
/// up after 6 s without a renewal. A shorter deadline (2 s was tried) loses
/// the Lease whenever the API server stalls for a couple of seconds, which a
/// machine running three Slurm versions, an API server and the tests does;
/// a replica that loses it steps down and leads again once it renews. A
/// killed leader is replaced within `LEASE_MS` plus a retry.
pub const LEASE_MS: u64 = 8000;

pub static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A scenario's world: the stack, cleaned; a fresh log; a temp dir.
pub struct Scenario {
    pub stack: Stack,
    pub nats: NatsServer,
    pub dir: PathBuf,
    pub lease: String,
    pub _turn: std::sync::MutexGuard<'static, ()>,
}

impl Scenario {
    pub fn new(name: &str, slurm_version: &str) -> Self {
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let stack = Stack::with_slurm(slurm_version);
        clean(&stack);
        let lease = format!("e2e-{name}");
        stack.kubectl(
            &[
                "delete",
                "lease",
                "-n",
                "lockstep-system",
                &lease,
                "--ignore-not-found",
            ],
            None,
        );
        Self {
            stack,
            nats: NatsServer::start(),
            dir: temp_dir(&format!("e2e-{name}")),
            lease,
            _turn: turn,
        }
    }

    /// The configuration of one replica (`identity`), without telemetry.
    pub fn config(&self, identity: &str) -> String {
        let s = &self.stack.slurm;
        format!(
            "[log]\nnats_url = \"{nats}\"\n\
             [service]\ntick_interval_ms = 200\nread_wait_ms = 50\n\
             [kubernetes]\nkubeconfig = \"{kubeconfig}\"\n\
             [slurm]\nrest_url = \"{rest}\"\nrest_user = \"{user}\"\njwt_file = \"{jwt}\"\nslurm_conf = \"{conf}\"\npoll_interval_ms = 200\n\
             [leader_election]\nnamespace = \"lockstep-system\"\nlease_name = \"{lease}\"\nidentity = \"{identity}\"\n\
             lease_duration_ms = {LEASE_MS}\nrenew_deadline_ms = {renew}\nretry_period_ms = 500\n",
            nats = self.nats.url(),
            kubeconfig = self.stack.lockstep_kubeconfig.display(),
            rest = s["SLURMRESTD_URL"],
            user = s.get("SLURM_JWT_USER").map_or("root", String::as_str),
            jwt = s["SLURM_JWT_FILE"],
            conf = s["SLURM_CONF"],
            lease = self.lease,
            renew = LEASE_MS * 3 / 4,
        )
    }

    /// Starts one replica (this Slurm's programs first in its `PATH`).
    pub fn start(&self, identity: &str, policy: &Value) -> Lockstep {
        Lockstep::start_with_env(
            &self.dir.join(identity),
            &self.config(identity),
            policy,
            &[("PATH", self.stack.slurm_path())],
        )
    }

    /// Starts one replica and waits until it leads.
    pub fn start_leader(&self, identity: &str, policy: &Value) -> Lockstep {
        let l = self.start(identity, policy);
        wait_for(&format!("{identity} leads"), MINUTE, || {
            l.leads().then_some(())
        });
        l
    }

    /// A Kubernetes node (Ready) with these labels.
    pub fn node(&self, name: &str, labels: Value) {
        let mut l = json!({ MARK: "true" });
        l.as_object_mut()
            .unwrap()
            .extend(labels.as_object().cloned().unwrap_or_default());
        self.stack.apply(&json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": l},
        }));
        self.set_ready(name, true);
    }

    pub fn set_ready(&self, node: &str, ready: bool) {
        let status = if ready { "True" } else { "False" };
        let now = now_rfc3339();
        self.stack.kubectl(
            &[
                "patch",
                "node",
                node,
                "--subresource=status",
                "--type=merge",
                "-p",
                &json!({"status": {"conditions": [{
                    "type": "Ready", "status": status,
                    "reason": if ready { "KubeletReady" } else { "KubeletNotReady" },
                    "lastHeartbeatTime": now, "lastTransitionTime": now,
                }]}})
                .to_string(),
            ],
            None,
        );
    }

    /// A slurmd pod for Slurm node `slurm_node`, bound to `node`, Running.
    /// `owner`: the StatefulSet (name, uid) that controls it.
    pub fn slurmd_pod(&self, slurm_node: &str, node: &str, owner: Option<(&str, &str)>) -> String {
        self.slurmd_pod_named(slurm_node, slurm_node, node, owner)
    }

    /// A slurmd pod named `pod` (a StatefulSet's `<set>-<ordinal>`), its
    /// Slurm node named by the [`NODE_LABEL`] label (the pod name when the
    /// policy names no label).
    pub fn slurmd_pod_named(
        &self,
        pod: &str,
        slurm_node: &str,
        node: &str,
        owner: Option<(&str, &str)>,
    ) -> String {
        let mut meta = json!({
            "name": pod, "namespace": NS,
            "labels": {"app.kubernetes.io/component": "slurmd", MARK: "true", NODE_LABEL: slurm_node},
        });
        if let Some((name, uid)) = owner {
            meta["ownerReferences"] = json!([{
                "apiVersion": "apps/v1", "kind": "StatefulSet", "name": name, "uid": uid,
                "controller": true,
            }]);
        }
        self.stack.apply(&json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "slurmd", "image": "slurmd:e2e"}],
            },
        }));
        self.stack.kubectl(
            &[
                "patch", "pod", pod, "-n", NS, "--subresource=status", "--type=merge", "-p",
                r#"{"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}"#,
            ],
            None,
        );
        self.stack.get(&["pod", pod, "-n", NS]).unwrap()["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Every record of the log.
    pub fn records(&self) -> Vec<EventRecord> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let log = EventLog::connect_nats(&self.nats.url(), &StreamLimits::default())
                .await
                .unwrap();
            crate::common::read_all(&log).await
        })
    }

    /// No action id has more than one outcome: nothing was carried out twice.
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

    /// Stops `leader` and exports the log up to the last record it applied,
    /// then replays that with `--verify`: the reducer, fed the recorded
    /// events, issues exactly the recorded actions.
    pub fn stop_and_verify(&self, leader: &mut Lockstep) {
        let status = leader.child.stop();
        assert!(status.success(), "{}", leader.log());
        let log = leader.log();
        let applied = log
            .lines()
            .filter(|l| l.contains("stopped"))
            .find_map(|l| l.split("applied_seq=").nth(1))
            .and_then(|v| v.split_whitespace().next())
            .unwrap_or_else(|| panic!("no final applied_seq in\n{log}"))
            .to_owned();
        let file = self.dir.join("incident.jsonl");
        let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
            .args(["export", "--nats", &self.nats.url(), "--to", &applied])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "export: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
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
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            clean(&self.stack);
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            let _ = Command::new(env!("CARGO_BIN_EXE_lockstep"))
                .args(["export", "--nats", &self.nats.url()])
                .arg(self.dir.join("log-at-failure.jsonl"))
                .status();
            eprintln!(
                "scenario files (config, run.log, log-at-failure.jsonl) kept in {}",
                self.dir.display()
            );
        }
    }
}

pub fn now_rfc3339() -> String {
    rfc3339_in(0)
}

/// No jobs, every Slurm node resumed and without features, none of the
/// tests' Kubernetes objects.
pub fn clean(stack: &Stack) {
    let _ = stack.try_slurm("scancel", &["-u", "root"]);
    let reservations = stack
        .try_slurm("scontrol", &["-o", "show", "reservation"])
        .unwrap_or_default();
    for name in reservations
        .lines()
        .filter_map(|l| l.strip_prefix("ReservationName="))
        .filter_map(|l| l.split_whitespace().next())
    {
        stack.slurm("scontrol", &["delete", "reservation", name]);
    }
    wait_for("the queue to empty", MINUTE, || {
        stack
            .slurm("squeue", &["-h", "-o", "%i"])
            .trim()
            .is_empty()
            .then_some(())
    });
    for n in ["ls-n1", "ls-n2", "ls-n3", "ls-n4"] {
        let _ = stack.try_slurm(
            "scontrol",
            &["update", &format!("nodename={n}"), "state=resume"],
        );
        let _ = stack.try_slurm(
            "scontrol",
            &[
                "update",
                &format!("nodename={n}"),
                "availablefeatures=",
                "activefeatures=",
            ],
        );
    }
    wait_for("the Slurm nodes idle", MINUTE, || {
        let s = stack.slurm("sinfo", &["-h", "-N", "-o", "%N %T"]);
        s.lines().all(|l| l.ends_with(" idle")).then_some(())
    });
    stack.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
    for kind in [
        "statefulsets",
        "poddisruptionbudgets",
        "evictionrequests.lifecycle.k8s.io",
        "evictions.lifecycle.k8s.io",
    ] {
        stack.kubectl(
            &["delete", kind, "-n", NS, "--all", "--ignore-not-found"],
            None,
        );
    }
    stack.kubectl(
        &[
            "delete",
            "pods",
            "-n",
            NS,
            "--all",
            "--force",
            "--grace-period=0",
            "--ignore-not-found",
        ],
        None,
    );
    for kind in ["nodes", "resourceslices", "devicetaintrules"] {
        stack.kubectl(
            &[
                "delete",
                kind,
                "-l",
                &format!("{MARK}=true"),
                "--ignore-not-found",
            ],
            None,
        );
    }
}

pub fn drained_by_lockstep(slurm_node: &str) -> impl Fn(&str) -> bool + '_ {
    move |show: &str| {
        show.contains("DRAIN") && show.contains("Reason=lockstep:") && show.contains(slurm_node)
    }
}

pub fn base_policy() -> Value {
    json!({"mapping": {"mode": "pod"}, "health": {"unhealthy_taint": null}})
}

/// RFC 3339 (UTC) of `secs` seconds from now.
pub fn rfc3339_in(secs: u64) -> String {
    let out = Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("+{secs} seconds"),
            "+%Y-%m-%dT%H:%M:%SZ",
        ])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}
