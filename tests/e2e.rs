//! The whole loop, end to end, on real parts: a real Slurm (slurmctld, four
//! slurmd, slurmrestd; `deploy/local/slurm`) of each version lockstep
//! supports, a real
//! kube-apiserver (`deploy/local/kube`), a real nats-server, and
//! `lockstep run` under the ServiceAccount of `deploy/kubernetes/rbac.yaml`
//! with leader election on. Each test is a scenario an operator would
//! recognise; each ends by exporting the log and replaying it with
//! `--verify`.
//!
//! The local control plane has no kubelet and no controllers: the tests
//! create the Nodes and the slurmd Pods (bound, marked Running) themselves,
//! and play the StatefulSet controller where a scenario needs one. Slurm is
//! the real thing throughout.
//!
//! The scenarios share one Slurm per version and one API server, so they run
//! one at a time (a lock), each from a clean slate. The scenarios about the
//! Slurm side (a cordon drains, an admin's drain is never resumed, a label
//! becomes a feature) run on every Slurm version (22.05 writes through
//! scontrol, 24.11 and 26.05 through slurmrestd); the others (health grace,
//! `kubectl drain` and the PDB, scaling, a leader killed mid scale-in,
//! RBAC) exercise the same Slurm calls and run on the newest only (the
//! `on!` lines at the end). Planned maintenance runs on the oldest (announced
//! by the annotation) and the newest (by the node lifecycle condition):
//! reservations go through scontrol on every version. Drains shown on the
//! Kubernetes node run on the oldest and the newest (the observer reads
//! reasons through scontrol and through slurmrestd).
//!
//! What every scenario starts from (the stack cleaned, a fresh log,
//! `lockstep run`, the replay at the end) is in `e2e/scenario.rs`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_schemas::{Event, OutcomeResult};
use serde_json::{json, Value};

mod common;
#[path = "e2e/scenario.rs"]
mod scenario;

use common::{wait_for, Lockstep};
use scenario::{
    base_policy, drained_by_lockstep, now_rfc3339, rfc3339_in, Scenario, BUSY_LABEL, LEASE_MS,
    MARK, MINUTE, NODE_LABEL, NS,
};

fn kubectl_cordon_drains_the_slurm_nodes_on_the_node_and_uncordon_resumes_them(
    slurm_version: &str,
) {
    let s = Scenario::new("cordon", slurm_version);
    s.node("e2e-k1", json!({}));
    s.slurmd_pod("ls-n1", "e2e-k1", None);
    s.slurmd_pod("ls-n2", "e2e-k1", None);
    let mut l = s.start_leader("a", &base_policy());

    s.stack.kubectl(&["cordon", "e2e-k1"], None);
    for n in ["ls-n1", "ls-n2"] {
        wait_for(&format!("{n} drained by lockstep"), MINUTE, || {
            let show = s.stack.slurm_node(n);
            (drained_by_lockstep(n)(&show) && show.contains("e2e-k1 cordoned")).then_some(())
        });
    }
    assert!(
        !s.stack.slurm_node("ls-n3").contains("DRAIN"),
        "{}",
        l.log()
    );

    s.stack.kubectl(&["uncordon", "e2e-k1"], None);
    for n in ["ls-n1", "ls-n2"] {
        wait_for(&format!("{n} resumed"), MINUTE, || {
            (!s.stack.slurm_node(n).contains("DRAIN")).then_some(())
        });
    }
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify(&mut l);
}

fn an_admin_drain_shows_on_the_pod_and_an_uncordon_never_resumes_it(slurm_version: &str) {
    let s = Scenario::new("admin-drain", slurm_version);
    s.node("e2e-k2", json!({}));
    s.slurmd_pod("ls-n3", "e2e-k2", None);
    let mut l = s.start_leader("a", &base_policy());

    s.stack.admin_drain("ls-n3", "admin: reseat GPU");
    let condition = wait_for("pod condition SlurmNodeDrained=True", MINUTE, || {
        let pod = s.stack.get(&["pod", "ls-n3", "-n", NS])?;
        pod["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "SlurmNodeDrained" && c["status"] == "True")
            .cloned()
    });
    assert_eq!(condition["message"], "admin: reseat GPU", "{}", l.log());

    // A cordon and uncordon of its node leave the admin's drain alone.
    s.stack.kubectl(&["cordon", "e2e-k2"], None);
    s.stack.kubectl(&["uncordon", "e2e-k2"], None);
    // The uncordon is in the log and applied; then time for a wrong
    // resume, were lockstep to issue one, to reach slurmctld.
    let seen_uncordon = wait_for("the uncordon in the log", MINUTE, || {
        s.records()
            .into_iter()
            .rev()
            .find_map(|r| match &r.envelope.event {
                Event::KubeNode(n) if n.name == "e2e-k2" && !n.unschedulable => Some(r.seq),
                _ => None,
            })
    });
    wait_for("lockstep applied the uncordon", MINUTE, || {
        let st = l.status()?;
        (st["applied_seq"].as_u64()? >= seen_uncordon).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    let show = s.stack.slurm_node("ls-n3");
    assert!(
        show.contains("DRAIN") && show.contains("Reason=admin: reseat GPU"),
        "the admin's drain was changed: {show}\n{}",
        l.log()
    );
    let resumes: Vec<_> = s
        .records()
        .into_iter()
        .filter_map(|r| match r.envelope.event {
            Event::ActionOutcome(o) if o.kind.name() == "slurm_resume" => Some(o),
            _ => None,
        })
        .collect();
    assert!(
        resumes.is_empty(),
        "lockstep resumed something: {resumes:?}"
    );
    s.stop_and_verify(&mut l);
}

fn a_node_not_ready_past_the_grace_period_drains_its_slurm_nodes(slurm_version: &str) {
    let s = Scenario::new("not-ready", slurm_version);
    s.node("e2e-k3", json!({}));
    s.slurmd_pod("ls-n2", "e2e-k3", None);
    let mut policy = base_policy();
    policy["health"]["not_ready_grace_s"] = json!(2);
    policy["health"]["resume_after_s"] = json!(1);
    let mut l = s.start_leader("a", &policy);

    let t = Instant::now();
    s.set_ready("e2e-k3", false);
    wait_for("ls-n2 drained for NotReady", MINUTE, || {
        drained_by_lockstep("ls-n2")(&s.stack.slurm_node("ls-n2")).then_some(())
    });
    assert!(
        t.elapsed() >= Duration::from_secs(2),
        "drained before the grace period: {:?}\n{}",
        t.elapsed(),
        l.log()
    );
    s.set_ready("e2e-k3", true);
    wait_for("ls-n2 resumed once Ready again", MINUTE, || {
        (!s.stack.slurm_node("ls-n2").contains("DRAIN")).then_some(())
    });
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify(&mut l);
}

fn kubectl_drain_waits_for_the_running_job_through_the_pod_disruption_budget(slurm_version: &str) {
    let s = Scenario::new("kubectl-drain", slurm_version);
    s.node("e2e-k4", json!({}));
    s.slurmd_pod("ls-n4", "e2e-k4", None);
    s.stack.apply(&json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "slurmd-busy", "namespace": NS},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {BUSY_LABEL: "true"}}},
    }));
    let mut policy = base_policy();
    policy["scaling"]["busy_label"] = json!(BUSY_LABEL);
    let mut l = s.start_leader("a", &policy);

    let job = s.stack.sbatch(&["-w", "ls-n4"], "sleep 15");
    wait_for("the job runs", MINUTE, || {
        (s.stack.job_state(&job).as_deref() == Some("RUNNING")).then_some(())
    });
    wait_for("the busy label on the pod", MINUTE, || {
        let pod = s.stack.get(&["pod", "ls-n4", "-n", NS])?;
        (pod["metadata"]["labels"][BUSY_LABEL] == "true").then_some(())
    });

    let mut drain = Command::new(&s.stack.kubectl_bin)
        .args([
            "drain",
            "e2e-k4",
            "--force",
            "--ignore-daemonsets",
            "--timeout=120s",
        ])
        .env("KUBECONFIG", &s.stack.admin_kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(|c| common::Reap(Some(c)))
        .unwrap();
    // The cordon drains the Slurm node; the job keeps running (DRAINING).
    wait_for("ls-n4 draining", MINUTE, || {
        drained_by_lockstep("ls-n4")(&s.stack.slurm_node("ls-n4")).then_some(())
    });
    while s.stack.job_state(&job).is_some() {
        assert!(
            drain.0.as_mut().unwrap().try_wait().unwrap().is_none(),
            "kubectl drain finished while the job still ran\n{}",
            l.log()
        );
        assert!(
            s.stack.get(&["pod", "ls-n4", "-n", NS]).is_some(),
            "the pod was evicted under a running job"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let job_ended = Instant::now();
    let status = wait_for("kubectl drain to finish once the job ended", MINUTE, || {
        drain.0.as_mut().unwrap().try_wait().unwrap()
    });
    assert!(status.success(), "kubectl drain failed\n{}", l.log());
    eprintln!(
        "kubectl drain finished {:?} after the job ended",
        job_ended.elapsed()
    );
    assert!(s.stack.get(&["pod", "ls-n4", "-n", NS]).is_none());
    drain.0 = None;
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify(&mut l);
}

/// A StatefulSet `slurm` with `replicas`, its pods made by the test (no
/// controller runs), scaled by lockstep following partition `batch`. Its
/// pods are `slurm-<ordinal>`; pod `slurm-i` runs Slurm node `ls-n<i+1>`.
fn stateful_set(s: &Scenario, replicas: u32) -> String {
    s.stack.apply(&json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "slurm", "namespace": NS, "labels": {MARK: "true"}},
        "spec": {
            "replicas": replicas,
            "serviceName": "slurm",
            "selector": {"matchLabels": {"app.kubernetes.io/component": "slurmd"}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/component": "slurmd"}},
                "spec": {"containers": [{"name": "slurmd", "image": "slurmd:e2e"}]},
            },
        },
    }));
    s.stack.get(&["statefulset", "slurm", "-n", NS]).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn replicas(s: &Scenario) -> u64 {
    s.stack.get(&["statefulset", "slurm", "-n", NS]).unwrap()["spec"]["replicas"]
        .as_u64()
        .unwrap()
}

fn scaling_policy() -> Value {
    let mut policy = base_policy();
    policy["mapping"]["node_name_label"] = json!(NODE_LABEL);
    policy["scaling"]["targets"] = json!([{
        "target": {"group": "apps", "kind": "StatefulSet", "namespace": NS, "name": "slurm"},
        "partition": "batch",
        "min_replicas": 1,
        "max_replicas": 2,
        "scale_up_cooldown_s": 0,
        "scale_down_cooldown_s": 0,
        "idle_before_scale_down_s": 2,
    }]);
    policy["actions"]["timeout_s"] = json!(5);
    policy["actions"]["retry_backoff_initial_s"] = json!(1);
    policy
}

/// Scale up: ls-n1 (pod slurm-0, the StatefulSet's one pod) is busy and a
/// job waits for resources, so lockstep raises the replica count; the test
/// plays the StatefulSet controller and slurmd registering (pod slurm-1 for
/// ls-n2, node resumed). Returns the StatefulSet's uid.
fn scale_up(s: &Scenario, l: &Lockstep) -> String {
    let uid = stateful_set(s, 1);
    s.node("e2e-k5", json!({}));
    s.slurmd_pod_named("slurm-0", "ls-n1", "e2e-k5", Some(("slurm", &uid)));
    // Nodes the StatefulSet has not made yet are not up in Slurm.
    for n in ["ls-n2", "ls-n3", "ls-n4"] {
        s.stack.admin_drain(n, "e2e: not provisioned");
    }
    let busy = s.stack.sbatch(&["-w", "ls-n1", "--exclusive"], "sleep 300");
    let waiting = s.stack.sbatch(&["-N", "1"], "sleep 300");
    wait_for("a job pending for resources", MINUTE, || {
        (s.stack.job_state(&waiting).as_deref() == Some("PENDING")).then_some(())
    });
    wait_for("the StatefulSet scaled up to 2", MINUTE, || {
        (replicas(s) == 2).then_some(())
    });
    // The controller's part: the new pod, its slurmd registering.
    s.slurmd_pod_named("slurm-1", "ls-n2", "e2e-k5", Some(("slurm", &uid)));
    s.stack.admin_resume("ls-n2");
    wait_for("the waiting job runs on ls-n2", MINUTE, || {
        (s.stack.job_state(&waiting).as_deref() == Some("RUNNING")).then_some(())
    });
    assert_eq!(replicas(s), 2, "{}", l.log());
    // The queue empties: both nodes go idle.
    s.stack.slurm("scancel", &[&busy, &waiting]);
    uid
}

/// The StatefulSet controller's part of a scale-in: once `replicas` is 1 it
/// removes the highest ordinal, slurm-1.
fn controller_removes_the_top_ordinal(s: &Scenario) {
    wait_for("the StatefulSet scaled down to 1", MINUTE, || {
        (replicas(s) == 1).then_some(())
    });
    s.stack.kubectl(
        &["delete", "pod", "slurm-1", "-n", NS, "--wait=false"],
        None,
    );
    wait_for("the pod slurm-1 gone", MINUTE, || {
        s.stack
            .get(&["pod", "slurm-1", "-n", NS])
            .is_none()
            .then_some(())
    });
}

fn pending_jobs_scale_the_stateful_set_up_and_an_idle_queue_scales_it_down(slurm_version: &str) {
    let s = Scenario::new("scale", slurm_version);
    let mut l = s.start_leader("a", &scaling_policy());
    scale_up(&s, &l);

    // Scale-in the way a StatefulSet removes pods: its highest ordinal
    // (slurm-1, Slurm node ls-n2) is drained, seen DRAINED, and only then
    // is the replica count lowered; the controller removes the pod.
    wait_for("ls-n2 drained by lockstep", MINUTE, || {
        drained_by_lockstep("ls-n2")(&s.stack.slurm_node("ls-n2")).then_some(())
    });
    controller_removes_the_top_ordinal(&s);
    assert!(s.stack.get(&["pod", "slurm-0", "-n", NS]).is_some());
    assert!(!s.stack.slurm_node("ls-n1").contains("DRAIN"));

    // In that order: up, drain, down (by the outcomes in the log); lockstep
    // deletes no pod of a StatefulSet.
    let order: Vec<String> = s
        .records()
        .into_iter()
        .filter_map(|r| match r.envelope.event {
            Event::ActionOutcome(o) if o.result == OutcomeResult::Succeeded => {
                Some(o.kind.name().to_owned())
            }
            _ => None,
        })
        .filter(|k| ["slurm_drain", "kube_delete_pod", "kube_scale"].contains(&k.as_str()))
        .collect();
    assert_eq!(
        order,
        ["kube_scale", "slurm_drain", "kube_scale"],
        "{}",
        l.log()
    );
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify(&mut l);
}

/// Slinky's NodeSet CRD, read from `../shared/slinky` (server-side apply:
/// installed already is fine), served before this returns.
fn install_node_set_crd(s: &Scenario) {
    let crd = common::repo().join("../shared/slinky/slinky.slurm.net_nodesets.yaml");
    let crd = crd.to_str().unwrap();
    s.stack.kubectl(
        &["apply", "--server-side", "--force-conflicts", "-f", crd],
        None,
    );
    s.stack.kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "crd/nodesets.slinky.slurm.net",
            "--timeout=60s",
        ],
        None,
    );
}

/// A Slinky NodeSet `slurm` with `replicas`, made anew; no Slinky controller
/// runs, the test makes its pods. Returns its uid.
fn node_set(s: &Scenario, replicas: u32) -> String {
    install_node_set_crd(s);
    s.stack.kubectl(
        &["delete", "nodeset", "slurm", "-n", NS, "--ignore-not-found"],
        None,
    );
    s.stack.apply(&json!({
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
        "metadata": {"name": "slurm", "namespace": NS, "labels": {MARK: "true"}},
        "spec": {
            "controllerRef": {"name": "slurm"},
            "replicas": replicas,
            "template": {"spec": {"containers": [{"name": "slurmd", "image": "slurmd:e2e"}]}},
        },
    }));
    s.stack.get(&["nodeset", "slurm", "-n", NS]).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn node_set_replicas(s: &Scenario) -> u64 {
    s.stack.get(&["nodeset", "slurm", "-n", NS]).unwrap()["spec"]["replicas"]
        .as_u64()
        .unwrap()
}

/// Scale up of a Slinky NodeSet: ls-n1 (pod slurm-0, the NodeSet's one pod,
/// owned by it as Slinky makes it) is busy and a job waits for resources, so
/// lockstep raises the NodeSet's replicas through its scale subresource.
fn pending_jobs_scale_a_slinky_node_set_up(slurm_version: &str) {
    let s = Scenario::new("nodeset", slurm_version);
    let mut policy = scaling_policy();
    policy["scaling"]["targets"][0]["target"] =
        json!({"group": "slinky.slurm.net", "kind": "NodeSet", "namespace": NS, "name": "slurm"});
    let mut l = s.start_leader("a", &policy);
    let uid = node_set(&s, 1);
    s.node("e2e-k5", json!({}));
    s.slurmd_pod_named("slurm-0", "ls-n1", "e2e-k5", None);
    let owner = json!({"metadata": {"ownerReferences": [{
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet", "name": "slurm",
        "uid": uid, "controller": true,
    }]}});
    s.stack.kubectl(
        &[
            "patch",
            "pod",
            "slurm-0",
            "-n",
            NS,
            "--type=merge",
            "-p",
            &owner.to_string(),
        ],
        None,
    );
    for n in ["ls-n2", "ls-n3", "ls-n4"] {
        s.stack.admin_drain(n, "e2e: not provisioned");
    }
    let busy = s.stack.sbatch(&["-w", "ls-n1", "--exclusive"], "sleep 300");
    let waiting = s.stack.sbatch(&["-N", "1"], "sleep 300");
    wait_for("a job pending for resources", MINUTE, || {
        (s.stack.job_state(&waiting).as_deref() == Some("PENDING")).then_some(())
    });
    wait_for("the NodeSet scaled up to 2", MINUTE, || {
        (node_set_replicas(&s) == 2).then_some(())
    });
    s.stack.slurm("scancel", &[&busy, &waiting]);
    let scaled = s
        .records()
        .into_iter()
        .filter(|r| {
            matches!(&r.envelope.event, Event::ActionOutcome(o)
                if o.result == OutcomeResult::Succeeded && o.kind.name() == "kube_scale")
        })
        .count();
    assert_eq!(scaled, 1, "{}", l.log());
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify(&mut l);
    s.stack.kubectl(
        &["delete", "nodeset", "slurm", "-n", NS, "--ignore-not-found"],
        None,
    );
}

fn the_leader_killed_in_the_middle_of_a_scale_in_and_the_scale_in_completes_once(
    slurm_version: &str,
) {
    let s = Scenario::new("takeover", slurm_version);
    let mut a = s.start_leader("a", &scaling_policy());
    let mut b = s.start("b", &scaling_policy());
    wait_for("b follows, caught up", MINUTE, || {
        let st = b.status()?;
        (st["ready"] == true && st["leader"] == false).then_some(())
    });
    scale_up(&s, &a);

    // Kill the leader as soon as the scale-in has begun.
    wait_for("ls-n2 drained by lockstep", MINUTE, || {
        drained_by_lockstep("ls-n2")(&s.stack.slurm_node("ls-n2")).then_some(())
    });
    a.kill();
    let killed = Instant::now();
    wait_for("b takes over", MINUTE, || b.leads().then_some(()));
    let takeover = killed.elapsed();
    eprintln!("takeover after the leader was killed: {takeover:?} (lease duration {LEASE_MS} ms)");
    let holder = s
        .stack
        .get(&["lease", &s.lease, "-n", "lockstep-system"])
        .unwrap();
    assert_eq!(holder["spec"]["holderIdentity"], "b");

    controller_removes_the_top_ordinal(&s);
    // Once: the count settles at 1 (not 0), ls-n1 keeps its pod and stays
    // in service.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(replicas(&s), 1, "{}", b.log());
    assert!(s.stack.get(&["pod", "slurm-0", "-n", NS]).is_some());
    assert!(!s.stack.slurm_node("ls-n1").contains("DRAIN"));
    let succeeded = |kind: &str| {
        s.records()
            .into_iter()
            .filter(|r| {
                matches!(&r.envelope.event, Event::ActionOutcome(o)
                    if o.kind.name() == kind && o.result == OutcomeResult::Succeeded)
            })
            .count()
    };
    assert!(
        succeeded("kube_scale") <= 2,
        "more than one scale-up and one scale-down carried out\n{}",
        b.log()
    );
    assert_eq!(succeeded("kube_delete_pod"), 0, "{}", b.log());
    s.assert_each_action_carried_out_at_most_once();
    // Both replicas published into the same action stream: every action
    // there was issued by the reducer from the log.
    s.stop_and_verify(&mut b);
}

fn a_node_label_change_updates_the_slurm_features(slurm_version: &str) {
    let s = Scenario::new("features", slurm_version);
    s.node("e2e-k6", json!({"lockstep.io/gpu": "h100"}));
    s.slurmd_pod("ls-n3", "e2e-k6", None);
    let mut policy = base_policy();
    policy["topology"]["features"] = json!([{"label": "lockstep.io/gpu", "prefix": "gpu-"}]);
    let mut l = s.start_leader("a", &policy);

    let features = |show: &str| {
        show.split_whitespace()
            .find_map(|f| f.strip_prefix("AvailableFeatures="))
            .unwrap_or("")
            .to_owned()
    };
    wait_for("feature gpu-h100 on ls-n3", MINUTE, || {
        (features(&s.stack.slurm_node("ls-n3")) == "gpu-h100").then_some(())
    });
    s.stack.kubectl(
        &[
            "label",
            "node",
            "e2e-k6",
            "lockstep.io/gpu=a100",
            "--overwrite",
        ],
        None,
    );
    wait_for("feature gpu-a100 instead", MINUTE, || {
        (features(&s.stack.slurm_node("ls-n3")) == "gpu-a100").then_some(())
    });
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify(&mut l);
}

/// A node condition of `node` as the API server has it: (status, reason).
fn node_condition(s: &Scenario, node: &str, type_: &str) -> Option<(String, String)> {
    node_condition_message(s, node, type_).map(|(status, reason, _)| (status, reason))
}

/// A node condition as the API server has it: (status, reason, message).
fn node_condition_message(
    s: &Scenario,
    node: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let n = s.stack.get(&["node", node])?;
    let c = n["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?
        .clone();
    let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    Some((text("status"), text("reason"), text("message")))
}

/// Planned maintenance on a node: announced 75 s ahead, by the
/// `MaintenancePlanned` node lifecycle condition (the API server runs with
/// `NodeLifecycleConditions` on) or, for clusters without it, the
/// `lockstep.dev/maintenance-window` annotation. Slurm's maintenance
/// reservation lets a job that ends in time start and holds one that would
/// not; the window drains the node's Slurm nodes, the node shows
/// `DrainInProgress` while a job still runs there and `Drained` once none
/// does; after the window everything is given back and the held job runs.
fn planned_maintenance_reserves_drains_and_gives_back(slurm_version: &str, announce_by: &str) {
    let s = Scenario::new("maintenance", slurm_version);
    let node = "e2e-k5";
    let reservation = format!("lockstep_maint_{node}");
    s.node(node, json!({}));
    s.slurmd_pod("ls-n1", node, None);
    s.slurmd_pod("ls-n2", node, None);
    let mut policy = base_policy();
    policy["maintenance"] = json!({"enabled": true});
    let mut l = s.start_leader("a", &policy);

    // A job that will still run when the window opens.
    let running = s.stack.sbatch(&["-w", "ls-n2", "--time=10"], "sleep 600");
    wait_for("the running job runs", MINUTE, || {
        (s.stack.job_state(&running).as_deref() == Some("RUNNING")).then_some(())
    });

    let (start, end) = (rfc3339_in(75), rfc3339_in(90));
    let window = format!("{start}/{end}");
    match announce_by {
        "condition" => s.stack.kubectl(
            &[
                "patch",
                "node",
                node,
                "--subresource=status",
                "--type=strategic",
                "-p",
                &json!({"status": {"conditions": [{
                    "type": "MaintenancePlanned", "status": "True", "reason": "MaintenanceWindow",
                    "message": format!("firmware update, window {window}"),
                    "lastTransitionTime": now_rfc3339(), "lastHeartbeatTime": now_rfc3339(),
                }]}})
                .to_string(),
            ],
            None,
        ),
        _ => s.stack.kubectl(
            &[
                "annotate",
                "node",
                node,
                &format!("lockstep.dev/maintenance-window={window}"),
            ],
            None,
        ),
    };
    let shown = wait_for("the maintenance reservation in Slurm", MINUTE, || {
        s.stack
            .try_slurm("scontrol", &["-o", "show", "reservation", &reservation])
            .ok()
    });
    assert!(
        shown.contains("Flags=MAINT") && shown.contains("Nodes=ls-n[1-2]"),
        "{shown}\n{}",
        l.log()
    );

    // A job that ends before the window starts; one that would not is held.
    let short = s.stack.sbatch(&["-w", "ls-n1", "--time=1"], "sleep 5");
    let long = s.stack.sbatch(&["-w", "ls-n1", "--time=10"], "sleep 30");
    wait_for("the short job starts", MINUTE, || {
        (s.stack.job_state(&short).as_deref() != Some("PENDING")).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        s.stack.job_state(&long).as_deref(),
        Some("PENDING"),
        "a job that would run into the window started: {}",
        s.stack.slurm("squeue", &[])
    );

    // The window opens: both Slurm nodes drain; one still runs a job.
    for n in ["ls-n1", "ls-n2"] {
        wait_for(&format!("{n} drained for maintenance"), 2 * MINUTE, || {
            let show = s.stack.slurm_node(n);
            (drained_by_lockstep(n)(&show) && show.contains(&format!("maintenance {start}")))
                .then_some(())
        });
    }
    wait_for("DrainInProgress=True on the node", MINUTE, || {
        (node_condition(&s, node, "DrainInProgress")
            == Some(("True".into(), "LockstepSlurmDrain".into())))
        .then_some(())
    });
    assert_eq!(
        node_condition(&s, node, "Drained").map(|c| c.0).as_deref(),
        Some("False")
    );
    assert_eq!(s.stack.job_state(&running).as_deref(), Some("RUNNING"));

    // Its job ends: the node is drained.
    s.stack.slurm("scancel", &[&running]);
    wait_for("Drained=True on the node", MINUTE, || {
        (node_condition(&s, node, "Drained").map(|c| c.0).as_deref() == Some("True")).then_some(())
    });

    // After the window: resumed, the reservation gone, the held job runs.
    for n in ["ls-n1", "ls-n2"] {
        wait_for(&format!("{n} resumed after the window"), MINUTE, || {
            (!s.stack.slurm_node(n).contains("DRAIN")).then_some(())
        });
    }
    wait_for("the reservation removed", MINUTE, || {
        s.stack
            .try_slurm("scontrol", &["-o", "show", "reservation", &reservation])
            .is_err()
            .then_some(())
    });
    wait_for("the held job runs", MINUTE, || {
        (s.stack.job_state(&long).as_deref() != Some("PENDING")).then_some(())
    });
    wait_for("Drained=False on the node", MINUTE, || {
        (node_condition(&s, node, "Drained").map(|c| c.0).as_deref() == Some("False")).then_some(())
    });
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify(&mut l);
}

fn planned_maintenance_announced_by_the_node_lifecycle_condition(slurm_version: &str) {
    planned_maintenance_reserves_drains_and_gives_back(slurm_version, "condition");
}

fn planned_maintenance_announced_by_the_annotation(slurm_version: &str) {
    planned_maintenance_reserves_drains_and_gives_back(slurm_version, "annotation");
}

/// Slurm's drains on the Kubernetes Node itself (`[node_signals]`): each
/// node's annotation names its Slurm nodes; a cordon shows
/// `DrainInProgress` while a job runs there and `Drained` once none does;
/// an admin's drain shows as `SlurmNodeDrained` on the node, naming the
/// Slurm node and its reason; each is taken back, and the annotation follows
/// a pod that is gone.
fn slurm_drains_show_on_the_kubernetes_node_itself(slurm_version: &str) {
    let s = Scenario::new("node-signals", slurm_version);
    let (k6, k7) = ("e2e-k6", "e2e-k7");
    s.node(k6, json!({}));
    s.node(k7, json!({}));
    s.slurmd_pod("ls-n1", k6, None);
    s.slurmd_pod("ls-n2", k6, None);
    s.slurmd_pod("ls-n3", k7, None);
    let mut policy = base_policy();
    policy["node_signals"] = json!({
        "drain_conditions": true,
        "foreign_drain_condition": "SlurmNodeDrained",
        "slurm_nodes_annotation": "lockstep.dev/slurm-nodes",
    });
    let mut l = s.start_leader("a", &policy);
    let annotation = |node: &str| {
        s.stack.get(&["node", node]).and_then(|n| {
            n["metadata"]["annotations"]["lockstep.dev/slurm-nodes"]
                .as_str()
                .map(str::to_owned)
        })
    };
    for (node, names) in [(k6, "ls-n1,ls-n2"), (k7, "ls-n3")] {
        wait_for(&format!("{node} annotated with {names}"), MINUTE, || {
            (annotation(node).as_deref() == Some(names)).then_some(())
        });
    }

    // A cordon while a job runs: in progress, then drained.
    let running = s.stack.sbatch(&["-w", "ls-n2", "--time=10"], "sleep 600");
    wait_for("the job runs", MINUTE, || {
        (s.stack.job_state(&running).as_deref() == Some("RUNNING")).then_some(())
    });
    s.stack.kubectl(&["cordon", k6], None);
    wait_for("DrainInProgress=True on the node", MINUTE, || {
        (node_condition(&s, k6, "DrainInProgress")
            == Some(("True".into(), "LockstepSlurmDrain".into())))
        .then_some(())
    });
    s.stack.slurm("scancel", &[&running]);
    wait_for("Drained=True on the node", MINUTE, || {
        (node_condition(&s, k6, "Drained").map(|c| c.0).as_deref() == Some("True")).then_some(())
    });
    assert_eq!(
        node_condition(&s, k6, "DrainInProgress")
            .map(|c| c.0)
            .as_deref(),
        Some("False"),
        "{}",
        l.log()
    );

    // An admin's drain on the other node: shown there, named, with its reason.
    s.stack.admin_drain("ls-n3", "admin: reseat GPU");
    wait_for("SlurmNodeDrained=True on the node", MINUTE, || {
        (node_condition_message(&s, k7, "SlurmNodeDrained")
            == Some((
                "True".into(),
                "SlurmDrain".into(),
                "ls-n3: admin: reseat GPU".into(),
            )))
        .then_some(())
    });
    assert_eq!(
        node_condition(&s, k7, "Drained"),
        None,
        "an admin's drain is not lockstep's"
    );
    s.stack.admin_resume("ls-n3");
    wait_for("SlurmNodeDrained=False on the node", MINUTE, || {
        (node_condition(&s, k7, "SlurmNodeDrained")
            == Some(("False".into(), "SlurmNotDrained".into())))
        .then_some(())
    });

    // The uncordon takes lockstep's conditions back.
    s.stack.kubectl(&["uncordon", k6], None);
    wait_for("Drained=False on the node", MINUTE, || {
        (node_condition(&s, k6, "Drained").map(|c| c.0).as_deref() == Some("False")).then_some(())
    });
    // A pod gone from the node: the annotation no longer names its Slurm node.
    s.stack.kubectl(
        &[
            "delete",
            "pod",
            "ls-n2",
            "-n",
            NS,
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    wait_for("the annotation follows the pod", MINUTE, || {
        (annotation(k6).as_deref() == Some("ls-n1")).then_some(())
    });
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify(&mut l);
}

/// GPU faults from DRA (`health.device_faults`): a device taint on a GPU in
/// the node's ResourceSlice drains both Slurm nodes on it, the device named
/// in the reason, and the drain lifts when the driver clears the taint; a
/// DeviceTaintRule does the same; a GPU the kubelet reports Unhealthy in a
/// slurmd pod's `allocatedResourcesStatus` drains that pod's Slurm node only.
fn a_gpu_fault_from_dra_drains_the_slurm_nodes_it_concerns(slurm_version: &str) {
    let s = Scenario::new("dra", slurm_version);
    let node = "e2e-k9";
    s.node(node, json!({}));
    s.slurmd_pod("ls-n1", node, None);
    // ls-n2's slurmd holds a GPU through a DRA claim.
    s.stack.apply(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "ls-n2", "namespace": NS, "labels": {
            "app.kubernetes.io/component": "slurmd", MARK: "true", NODE_LABEL: "ls-n2"}},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "ls-n2-gpu"}],
            "containers": [{"name": "slurmd", "image": "slurmd:e2e",
                "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }));
    let pod_status = |health: &str| {
        json!({"status": {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{
                "name": "slurmd", "image": "slurmd:e2e", "imageID": "", "ready": true,
                "restartCount": 0, "started": true, "state": {"running": {}},
                "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [
                    {"resourceID": "gpu.nvidia.com/e2e-k9/gpu-1", "health": health}]}],
            }],
        }})
        .to_string()
    };
    let patch_pod = |health: &str| {
        s.stack.kubectl(
            &[
                "patch",
                "pod",
                "ls-n2",
                "-n",
                NS,
                "--subresource=status",
                "--type=merge",
                "-p",
                &pod_status(health),
            ],
            None,
        );
    };
    patch_pod("Healthy");
    let slice = |taints: Value| {
        s.stack.apply(&json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "e2e-k9-gpus", "labels": {MARK: "true"}},
            "spec": {
                "driver": "gpu.nvidia.com", "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "taints": taints}, {"name": "gpu-1"}],
            },
        }));
    };
    slice(json!([]));
    let mut policy = base_policy();
    policy["health"]["device_faults"] = json!(true);
    policy["health"]["resume_after_s"] = json!(0);
    let mut l = s.start_leader("a", &policy);
    let reason = |n: &str| {
        let show = s.stack.slurm_node(n);
        drained_by_lockstep(n)(&show).then(|| {
            show.split("Reason=")
                .nth(1)
                .map(|r| r.split(" [").next().unwrap_or(r).trim().to_owned())
                .unwrap_or_default()
        })
    };
    let resumed = |n: &str| {
        wait_for(&format!("{n} resumed"), MINUTE, || {
            (!s.stack.slurm_node(n).contains("DRAIN")).then_some(())
        });
    };

    // The driver taints gpu-0 for an XID: both Slurm nodes on the node out.
    slice(json!([{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]));
    let fault = "gpu.nvidia.com/e2e-k9/gpu-0 gpu.nvidia.com/xid=79:NoSchedule";
    for n in ["ls-n1", "ls-n2"] {
        let r = wait_for(&format!("{n} drained for the device"), MINUTE, || reason(n));
        assert!(r.contains(fault), "{r}\n{}", l.log());
    }
    slice(json!([]));
    resumed("ls-n1");
    resumed("ls-n2");

    // An operator's DeviceTaintRule takes gpu-1 out; deleting it lets go.
    s.stack.apply(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
        "metadata": {"name": "e2e-nvlink", "labels": {MARK: "true"}},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": node, "device": "gpu-1"},
            "taint": {"key": "ops.example.com/nvlink", "value": "down", "effect": "NoExecute"},
        },
    }));
    let r = wait_for("ls-n1 drained for the rule", MINUTE, || reason("ls-n1"));
    assert!(
        r.contains("gpu.nvidia.com/e2e-k9/gpu-1 ops.example.com/nvlink=down:NoExecute"),
        "{r}"
    );
    s.stack
        .kubectl(&["delete", "devicetaintrule", "e2e-nvlink"], None);
    resumed("ls-n1");
    resumed("ls-n2");

    // The kubelet reports ls-n2's GPU Unhealthy: ls-n2 alone goes out.
    patch_pod("Unhealthy");
    let r = wait_for("ls-n2 drained for its GPU", MINUTE, || reason("ls-n2"));
    assert!(r.contains("gpu.nvidia.com/e2e-k9/gpu-1 unhealthy"), "{r}");
    assert!(
        !s.stack.slurm_node("ls-n1").contains("DRAIN"),
        "ls-n1 does not hold that GPU: {}",
        l.log()
    );
    patch_pod("Healthy");
    resumed("ls-n2");
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify(&mut l);
}

/// lockstep's eviction responder name in the tests.
const RESPONDER: &str = "lockstep.dev/slurm-drain";
const EVICTOR: &str = "imperative-eviction.k8s.io/evictor";

/// A slurmd pod that names lockstep among its eviction responders, as a
/// site's pod template would; returns its UID.
fn slurmd_pod_answered_by_lockstep(s: &Scenario, slurm_node: &str, node: &str) -> String {
    s.stack.apply(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": slurm_node, "namespace": NS, "labels": {
            "app.kubernetes.io/component": "slurmd", MARK: "true", NODE_LABEL: slurm_node}},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 0,
            "evictionResponders": [{"name": RESPONDER, "priority": 10000}],
            "containers": [{"name": "slurmd", "image": "slurmd:e2e"}],
        },
    }));
    s.stack.kubectl(
        &[
            "patch", "pod", slurm_node, "-n", NS, "--subresource=status", "--type=merge", "-p",
            r#"{"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}"#,
        ],
        None,
    );
    let pod = s.stack.get(&["pod", slurm_node, "-n", NS]).unwrap();
    assert_eq!(
        pod["spec"]["evictionResponders"][0]["name"], RESPONDER,
        "the API server dropped spec.evictionResponders: is the EvictionRequestAPI gate on?"
    );
    pod["metadata"]["uid"].as_str().unwrap().to_owned()
}

/// What Kubernetes' evictionrequest-controller (kube-controller-manager
/// v1.38) writes of an Eviction's status, as it was seen doing it: the
/// responders' states, each responder's `name` and the `startTime` it gave
/// the active ones, the requesters and the conditions; applied with its
/// field manager, so the responders' own fields stay theirs.
fn controller_writes(
    s: &Scenario,
    eviction: &str,
    states: [(&str, &str); 2],
    started: [Option<&str>; 2],
    failed: Option<&str>,
) {
    let names = [RESPONDER, EVICTOR];
    let now = now_rfc3339();
    let responders: Vec<Value> = names
        .iter()
        .zip(started)
        .map(|(name, start)| match start {
            Some(t) => json!({"name": name, "startTime": t}),
            None => json!({"name": name}),
        })
        .collect();
    let (failed_status, failed_reason, evicted_reason) = match failed {
        Some(reason) => ("True", reason, "EvictionFailed"),
        None => ("False", "AwaitingEviction", "AwaitingEviction"),
    };
    let intent = if failed.is_some() {
        "Withdrawn"
    } else {
        "Eviction"
    };
    let status = json!({
        "apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "Eviction",
        "metadata": {"name": eviction, "namespace": NS},
        "status": {
            "observedGeneration": 1,
            "requesters": [{"name": "example.com/upgrader", "intent": intent}],
            "targetResponders": [
                {"name": names[0], "priority": 10000, "state": states[0].1},
                {"name": names[1], "priority": 100, "state": states[1].1},
            ],
            "responders": responders,
            "conditions": [
                {"type": "Failed", "status": failed_status, "reason": failed_reason, "message": "", "lastTransitionTime": now},
                {"type": "TargetEvicted", "status": "False", "reason": evicted_reason, "message": "", "lastTransitionTime": now},
            ],
        },
    });
    s.stack.kubectl(
        &[
            "apply",
            "--server-side",
            "--subresource=status",
            "--field-manager=evictionrequest-controller",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(&status.to_string()),
    );
}

/// An eviction of `pod` is requested, and the controller makes lockstep its
/// active responder: the EvictionRequest, then the Eviction it creates
/// (labelled with each participant), lockstep Active. Returns the start.
fn eviction_requested(s: &Scenario, eviction: &str, pod: &str, uid: &str) -> String {
    let target = json!({"pod": {"name": pod, "uid": uid}});
    s.stack.apply(&json!({
        "apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "EvictionRequest",
        "metadata": {"name": format!("upgrade-{pod}"), "namespace": NS},
        "spec": {"target": target, "requester": "example.com/upgrader", "intent": "Eviction"},
    }));
    s.stack.apply(&json!({
        "apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "Eviction",
        "metadata": {"name": eviction, "namespace": NS, "labels": {
            "example.com/upgrader": "requester", RESPONDER: "responder", EVICTOR: "responder"}},
        "spec": {"target": target},
    }));
    let start = now_rfc3339();
    controller_writes(
        s,
        eviction,
        [(RESPONDER, "Active"), (EVICTOR, "Inactive")],
        [Some(&start), None],
        None,
    );
    start
}

/// lockstep's entry in an Eviction's `status.responders`.
fn lockstep_report(s: &Scenario, eviction: &str) -> Value {
    s.stack
        .get(&["eviction.lifecycle.k8s.io", eviction, "-n", NS])
        .and_then(|e| {
            e["status"]["responders"]
                .as_array()?
                .iter()
                .find(|r| r["name"] == RESPONDER)
                .cloned()
        })
        .unwrap_or(Value::Null)
}

/// Eviction through Slurm (`drain.eviction_responder`, the EvictionRequest
/// API served by the API server with its alpha gate): an Eviction of a
/// slurmd pod that names lockstep drains its Slurm node at once; lockstep,
/// the active responder, reports (server-side apply of its own status
/// entry, validated by the API server), and completes once the job has
/// ended, after which the evictor evicts the pod. Another pod's eviction,
/// withdrawn while its job runs, lifts its drain. The test plays the
/// evictionrequest-controller and the evictor (kube-controller-manager
/// v1.38; v1.37.2 serves the API but has no controller for it), writing
/// what the real one was seen writing.
fn an_eviction_of_a_slurmd_pod_goes_through_slurm(slurm_version: &str) {
    let s = Scenario::new("eviction", slurm_version);
    let node = "e2e-k11";
    s.node(node, json!({}));
    let uid1 = slurmd_pod_answered_by_lockstep(&s, "ls-n1", node);
    let uid2 = slurmd_pod_answered_by_lockstep(&s, "ls-n2", node);
    let mut policy = base_policy();
    policy["drain"] = json!({"eviction_responder": RESPONDER});
    let mut l = s.start_leader("a", &policy);
    let job1 = s.stack.sbatch(&["-w", "ls-n1", "--time=10"], "sleep 600");
    let job2 = s.stack.sbatch(&["-w", "ls-n2", "--time=10"], "sleep 600");
    for job in [&job1, &job2] {
        wait_for("the job runs", MINUTE, || {
            (s.stack.job_state(job).as_deref() == Some("RUNNING")).then_some(())
        });
    }
    let drained = |n: &str| {
        let show = s.stack.slurm_node(n);
        (drained_by_lockstep(n)(&show)
            && show.contains(&format!("pod {NS}/{n} eviction requested")))
        .then_some(())
    };

    // ls-n1's eviction: drained at once, lockstep reports while the job runs.
    eviction_requested(&s, "pod-1-ls-n1", "ls-n1", &uid1);
    wait_for("ls-n1 drained for its eviction", MINUTE, || {
        drained("ls-n1")
    });
    // Its first report may come before Slurm shows the drain ("to be
    // drained"); once Slurm shows it, the report says the job still runs.
    let report = wait_for("lockstep's report of the running job", MINUTE, || {
        let r = lockstep_report(&s, "pod-1-ls-n1");
        r["message"]
            .as_str()
            .is_some_and(|m| m.contains("jobs still run"))
            .then_some(r)
    });
    assert!(
        report["heartbeatTime"].is_string() && report["completionTime"].is_null(),
        "{report}\n{}",
        l.log()
    );
    // The job ends: lockstep completes.
    s.stack.slurm("scancel", &[&job1]);
    let report = wait_for("lockstep completes", MINUTE, || {
        let r = lockstep_report(&s, "pod-1-ls-n1");
        r["completionTime"].is_string().then_some(r)
    });
    assert!(
        report["message"]
            .as_str()
            .unwrap_or_default()
            .contains("no job runs"),
        "{report}"
    );
    // The controller moves on to the evictor, which evicts the pod.
    let start = report["startTime"].as_str().unwrap().to_owned();
    let now = now_rfc3339();
    controller_writes(
        &s,
        "pod-1-ls-n1",
        [(RESPONDER, "Completed"), (EVICTOR, "Active")],
        [Some(&start), Some(&now)],
        None,
    );
    s.stack.kubectl(
        &[
            "create",
            "--raw",
            &format!("/api/v1/namespaces/{NS}/pods/ls-n1/eviction"),
            "-f",
            "-",
        ],
        Some(
            &json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "ls-n1", "namespace": NS}})
            .to_string(),
        ),
    );
    // (With a grace period of 0 and no kubelet, the pod is gone at once.)
    wait_for("the pod evicted", MINUTE, || {
        let pod = s.stack.get(&["pod", "ls-n1", "-n", NS]);
        pod.is_none_or(|p| p["metadata"]["deletionTimestamp"].is_string())
            .then_some(())
    });
    assert!(drained("ls-n1").is_some(), "{}", l.log());

    // ls-n2's eviction, withdrawn while its job runs: the drain is lifted.
    let start = eviction_requested(&s, "pod-1-ls-n2", "ls-n2", &uid2);
    wait_for("ls-n2 drained for its eviction", MINUTE, || {
        drained("ls-n2")
    });
    wait_for("lockstep's report on ls-n2", MINUTE, || {
        lockstep_report(&s, "pod-1-ls-n2")["heartbeatTime"]
            .is_string()
            .then_some(())
    });
    controller_writes(
        &s,
        "pod-1-ls-n2",
        [(RESPONDER, "Canceled"), (EVICTOR, "Inactive")],
        [Some(&start), None],
        Some("CanceledDueToNoRequesters"),
    );
    wait_for("ls-n2 resumed", MINUTE, || {
        (!s.stack.slurm_node("ls-n2").contains("DRAIN")).then_some(())
    });
    assert!(
        lockstep_report(&s, "pod-1-ls-n2")["completionTime"].is_null(),
        "a withdrawn eviction is never completed"
    );
    assert_eq!(s.stack.job_state(&job2).as_deref(), Some("RUNNING"));
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify(&mut l);
}

/// Patches a node's status (strategic merge: conditions by type).
fn patch_node_status(s: &Scenario, node: &str, status: Value) {
    s.stack.kubectl(
        &[
            "patch",
            "node",
            node,
            "--subresource=status",
            "--type=strategic",
            "-p",
            &json!({ "status": status }).to_string(),
        ],
        None,
    );
}

/// The health check's condition on a node.
fn health_check(s: &Scenario, node: &str, passed: bool) {
    let now = now_rfc3339();
    patch_node_status(
        s,
        node,
        json!({"conditions": [{
            "type": "HealthCheckPassed", "status": if passed { "True" } else { "False" },
            "reason": "Checked", "lastTransitionTime": now, "lastHeartbeatTime": now,
        }]}),
    );
}

/// The kubelet's boot ID after a boot (the rest of nodeInfo as a kubelet
/// reports it).
fn boot(s: &Scenario, node: &str, boot_id: &str) {
    patch_node_status(
        s,
        node,
        json!({"nodeInfo": {
            "bootID": boot_id, "machineID": "m-1", "systemUUID": "s-1",
            "kernelVersion": "6.1.0", "osImage": "Debian GNU/Linux 12",
            "containerRuntimeVersion": "containerd://2.0.0", "kubeletVersion": "v1.37.2",
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
        }}),
    );
}

/// Health-gated return to service (`health.return_condition`): a node that
/// reboots while cordoned is not resumed on uncordon while its health
/// check's True is the one from before the boot, only once the check turns
/// False and then True; a node deleted and registered again (a replaced VM)
/// is resumed only once the check is True on the new Node.
fn a_node_back_as_another_machine_returns_only_once_its_health_check_passes(slurm_version: &str) {
    let s = Scenario::new("return-gate", slurm_version);
    let node = "e2e-k8";
    s.node(node, json!({}));
    boot(&s, node, "boot-a");
    health_check(&s, node, true);
    s.slurmd_pod("ls-n1", node, None);
    let mut policy = base_policy();
    policy["health"]["return_condition"] = json!("HealthCheckPassed");
    policy["health"]["resume_after_s"] = json!(0);
    let mut l = s.start_leader("a", &policy);
    let drained = || drained_by_lockstep("ls-n1")(&s.stack.slurm_node("ls-n1"));
    // Settled: what lockstep holds of the node includes the latest change.
    let settled = |what: &str| {
        let seen = wait_for(&format!("{what} in the log"), MINUTE, || {
            s.records()
                .into_iter()
                .rev()
                .find_map(|r| match &r.envelope.event {
                    Event::KubeNode(n) if n.name == node => Some(r.seq),
                    _ => None,
                })
        });
        wait_for(&format!("lockstep applied {what}"), MINUTE, || {
            (l.status()?["applied_seq"].as_u64()? >= seen).then_some(())
        });
        std::thread::sleep(Duration::from_secs(2));
    };

    // A reboot while cordoned: the True from before the boot proves nothing.
    s.stack.kubectl(&["cordon", node], None);
    wait_for("ls-n1 drained for the cordon", MINUTE, || {
        drained().then_some(())
    });
    boot(&s, node, "boot-b");
    s.stack.kubectl(&["uncordon", node], None);
    settled("the uncordon");
    assert!(drained(), "resumed before the health check: {}", l.log());
    health_check(&s, node, false);
    settled("the check failing");
    assert!(drained(), "{}", l.log());
    health_check(&s, node, true);
    wait_for("ls-n1 resumed once the check passed", MINUTE, || {
        (!s.stack.slurm_node("ls-n1").contains("DRAIN")).then_some(())
    });

    // The VM is replaced: the Node is deleted and registers again, Ready.
    s.stack.kubectl(&["delete", "node", node], None);
    wait_for("ls-n1 drained for the deleted node", MINUTE, || {
        drained().then_some(())
    });
    s.node(node, json!({}));
    boot(&s, node, "boot-c");
    settled("the new node");
    assert!(
        drained(),
        "resumed before the new machine's check: {}",
        l.log()
    );
    health_check(&s, node, true);
    wait_for("ls-n1 resumed on the new machine", MINUTE, || {
        (!s.stack.slurm_node("ls-n1").contains("DRAIN")).then_some(())
    });
    let held = s
        .records()
        .into_iter()
        .filter(|r| matches!(&r.envelope.event, Event::ActionOutcome(o) if o.kind.name() == "slurm_resume"))
        .count();
    assert_eq!(held, 2, "one resume after each check: {}", l.log());
    s.assert_each_action_carried_out_at_most_once();
    s.stop_and_verify(&mut l);
}

/// lockstep beside a Slurm that runs on the hosts, no slurmd pods: started
/// as `deploy/systemd/lockstep.service` says (its `ExecStart` and
/// `Environment`, `/etc/lockstep` and `/var/lib/lockstep` moved under the
/// scenario's directory), with `deploy/systemd/lockstep.toml` pointed at this
/// slurmrestd and API server, `deploy/systemd/policy.json` (host mode, node
/// signals) and a ServiceAccount's kubeconfig. A cordon drains the Slurm node
/// of the same name and the uncordon resumes it; an admin's drain shows on
/// the Node; SIGTERM (systemd's stop) ends it with success; its embedded log
/// replays with `--verify`. `systemd-analyze verify` finds nothing to say
/// about the unit.
fn beside_an_existing_slurm_lockstep_runs_as_its_systemd_unit_says(slurm_version: &str) {
    let s = Scenario::new("systemd", slurm_version);
    let shipped = common::repo().join("deploy/systemd");
    let root = s.dir.join("root");
    let etc = root.join("etc/lockstep");
    std::fs::create_dir_all(&etc).unwrap();
    // StateDirectory=lockstep: systemd makes it.
    std::fs::create_dir_all(root.join("var/lib/lockstep")).unwrap();
    let bin = env!("CARGO_BIN_EXE_lockstep");
    let moved = |text: &str| {
        text.replace("/usr/local/bin/lockstep", bin)
            .replace("/etc/lockstep", etc.to_str().unwrap())
            .replace(
                "/var/lib/lockstep",
                root.join("var/lib/lockstep").to_str().unwrap(),
            )
    };

    // The unit, as systemd reads it.
    let unit = std::fs::read_to_string(shipped.join("lockstep.service")).unwrap();
    std::fs::write(s.dir.join("lockstep.service"), moved(&unit)).unwrap();
    let verify = Command::new("systemd-analyze")
        .args(["verify", "lockstep.service"])
        .current_dir(&s.dir)
        .output()
        .expect("systemd-analyze (Debian's systemd) is installed by scripts/ensure-packages.sh");
    assert!(
        verify.status.success() && verify.stderr.is_empty() && verify.stdout.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    let service: Vec<(&str, &str)> = unit
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| !k.starts_with('#'))
        .collect();
    let exec = service
        .iter()
        .find(|(k, _)| *k == "ExecStart")
        .map(|(_, v)| moved(v))
        .expect("ExecStart");
    let environment: Vec<(String, String)> = service
        .iter()
        .filter(|(k, _)| *k == "Environment")
        .filter_map(|(_, v)| v.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();

    // /etc/lockstep as an operator fills it: the shipped configuration with
    // the site's endpoints, the shipped policy, the kubeconfig, the token.
    let slurm = &s.stack.slurm;
    std::fs::copy(&s.stack.lockstep_kubeconfig, etc.join("kubeconfig")).unwrap();
    std::fs::copy(&slurm["SLURM_JWT_FILE"], etc.join("slurm.jwt")).unwrap();
    std::fs::copy(shipped.join("policy.json"), etc.join("policy.json")).unwrap();
    let mut config: toml::Table =
        moved(&std::fs::read_to_string(shipped.join("lockstep.toml")).unwrap())
            .parse()
            .unwrap();
    let telemetry = format!("127.0.0.1:{}", lockstep_testkit::free_port());
    let table = |config: &mut toml::Table, name: &str| -> toml::Table {
        config[name].as_table().cloned().unwrap()
    };
    let mut t = table(&mut config, "telemetry");
    t.insert("listen".into(), telemetry.clone().into());
    config.insert("telemetry".into(), t.into());
    let mut t = table(&mut config, "slurm");
    t.insert("rest_url".into(), slurm["SLURMRESTD_URL"].clone().into());
    let user = slurm.get("SLURM_JWT_USER").map_or("root", String::as_str);
    t.insert("rest_user".into(), user.into());
    config.insert("slurm".into(), t.into());
    std::fs::write(etc.join("lockstep.toml"), config.to_string()).unwrap();

    let args: Vec<&str> = exec.split_whitespace().collect();
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(environment);
    let mut l = Lockstep::spawn(cmd, &s.dir.join("run"), telemetry);
    wait_for("lockstep acts", MINUTE, || l.leads().then_some(()));

    // Host mode: the Kubernetes node and the Slurm node share a name.
    s.node("ls-n1", json!({}));
    s.node("ls-n2", json!({}));
    wait_for("ls-n1 annotated with its Slurm node", MINUTE, || {
        let n = s.stack.get(&["node", "ls-n1"])?;
        (n["metadata"]["annotations"]["lockstep.dev/slurm-nodes"] == "ls-n1").then_some(())
    });
    s.stack.kubectl(&["cordon", "ls-n1"], None);
    wait_for("ls-n1 drained by lockstep", MINUTE, || {
        let show = s.stack.slurm_node("ls-n1");
        (drained_by_lockstep("ls-n1")(&show) && show.contains("ls-n1 cordoned")).then_some(())
    });
    s.stack.kubectl(&["uncordon", "ls-n1"], None);
    wait_for("ls-n1 resumed", MINUTE, || {
        (!s.stack.slurm_node("ls-n1").contains("DRAIN")).then_some(())
    });
    s.stack.admin_drain("ls-n2", "admin: disk");
    wait_for("SlurmNodeDrained=True on ls-n2", MINUTE, || {
        (node_condition_message(&s, "ls-n2", "SlurmNodeDrained")
            == Some((
                "True".into(),
                "SlurmDrain".into(),
                "ls-n2: admin: disk".into(),
            )))
        .then_some(())
    });
    s.stack.admin_resume("ls-n2");
    wait_for("SlurmNodeDrained=False on ls-n2", MINUTE, || {
        (node_condition(&s, "ls-n2", "SlurmNodeDrained")
            .map(|c| c.0)
            .as_deref()
            == Some("False"))
        .then_some(())
    });

    // systemctl stop: SIGTERM, a clean exit; the embedded log replays.
    let status = l.child.stop();
    assert!(status.success(), "{status}: {}", l.log());
    let file = s.dir.join("incident.jsonl");
    for args in [
        vec![
            "export",
            "--config",
            etc.join("lockstep.toml").to_str().unwrap(),
            file.to_str().unwrap(),
        ],
        vec!["replay", "--verify", file.to_str().unwrap()],
    ] {
        let out = Command::new(bin).args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn the_service_account_has_the_rights_lockstep_needs_and_no_more_and_the_deployment_is_valid(
    slurm_version: &str,
) {
    let s = Scenario::new("rbac", slurm_version);
    let can = |verb: &str, what: &str, ns: Option<&str>| {
        let (resource, sub) = what.split_once('/').unwrap_or((what, ""));
        let subresource = format!("--subresource={sub}");
        let mut args = vec![
            "auth",
            "can-i",
            verb,
            resource,
            "--as=system:serviceaccount:lockstep-system:lockstep",
        ];
        if !sub.is_empty() {
            args.push(&subresource);
        }
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        s.stack.try_kubectl(&args, None).is_ok()
    };
    for (verb, what, ns) in [
        ("watch", "nodes", None),
        ("patch", "nodes", None),
        ("watch", "pods", Some(NS)),
        ("delete", "pods", Some(NS)),
        ("patch", "pods/status", Some(NS)),
        ("patch", "nodes/status", None),
        ("patch", "statefulsets/scale", Some(NS)),
        ("watch", "nodesets.slinky.slurm.net", Some(NS)),
        ("patch", "nodesets.slinky.slurm.net/scale", Some(NS)),
        ("watch", "resourceslices.resource.k8s.io", None),
        ("watch", "devicetaintrules.resource.k8s.io", None),
        ("watch", "evictions.lifecycle.k8s.io", Some(NS)),
        ("patch", "evictions.lifecycle.k8s.io/status", Some(NS)),
        ("update", "leases", Some("lockstep-system")),
    ] {
        assert!(can(verb, what, ns), "lockstep needs to {verb} {what}");
    }
    for (verb, what, ns) in [
        ("delete", "nodes", None),
        ("create", "pods", Some(NS)),
        ("get", "secrets", Some(NS)),
        ("patch", "statefulsets", Some(NS)),
        ("patch", "nodesets.slinky.slurm.net", Some(NS)),
        ("update", "leases", Some("kube-system")),
        ("create", "pods/eviction", Some(NS)),
    ] {
        assert!(!can(verb, what, ns), "lockstep must not {verb} {what}");
    }
    // The Deployment manifest is valid for this API server.
    let manifest = common::repo().join("deploy/kubernetes/lockstep.yaml");
    s.stack.kubectl(
        &[
            "apply",
            "--dry-run=server",
            "-f",
            manifest.to_str().unwrap(),
        ],
        None,
    );
}

/// `on!(scenario: v22_05 = "22.05", ...)`: the scenario as one test per Slurm
/// version (`cargo test --test e2e v26_05` runs one version).
macro_rules! on {
    ($scenario:ident: $($v:ident = $name:literal),+) => {
        mod $scenario {
            $(
                #[test]
                fn $v() {
                    super::$scenario($name);
                }
            )+
        }
    };
}

on!(kubectl_cordon_drains_the_slurm_nodes_on_the_node_and_uncordon_resumes_them:
    v22_05 = "22.05", v24_11 = "24.11", v26_05 = "26.05");
on!(an_admin_drain_shows_on_the_pod_and_an_uncordon_never_resumes_it:
    v22_05 = "22.05", v24_11 = "24.11", v26_05 = "26.05");
on!(a_node_not_ready_past_the_grace_period_drains_its_slurm_nodes:
    v26_05 = "26.05");
on!(kubectl_drain_waits_for_the_running_job_through_the_pod_disruption_budget:
    v26_05 = "26.05");
on!(pending_jobs_scale_the_stateful_set_up_and_an_idle_queue_scales_it_down:
    v26_05 = "26.05");
on!(pending_jobs_scale_a_slinky_node_set_up:
    v26_05 = "26.05");
on!(the_leader_killed_in_the_middle_of_a_scale_in_and_the_scale_in_completes_once:
    v26_05 = "26.05");
on!(a_node_label_change_updates_the_slurm_features:
    v22_05 = "22.05", v24_11 = "24.11", v26_05 = "26.05");
on!(planned_maintenance_announced_by_the_node_lifecycle_condition:
    v26_05 = "26.05");
on!(planned_maintenance_announced_by_the_annotation:
    v22_05 = "22.05");
on!(slurm_drains_show_on_the_kubernetes_node_itself:
    v22_05 = "22.05", v26_05 = "26.05");
on!(an_eviction_of_a_slurmd_pod_goes_through_slurm:
    v26_05 = "26.05");
on!(a_gpu_fault_from_dra_drains_the_slurm_nodes_it_concerns:
    v26_05 = "26.05");
on!(a_node_back_as_another_machine_returns_only_once_its_health_check_passes:
    v26_05 = "26.05");
on!(beside_an_existing_slurm_lockstep_runs_as_its_systemd_unit_says:
    v26_05 = "26.05");
on!(the_service_account_has_the_rights_lockstep_needs_and_no_more_and_the_deployment_is_valid:
    v26_05 = "26.05");
