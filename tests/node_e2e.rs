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
//!
//! What every scenario starts from is in `node_e2e/scenario.rs`; the
//! measurements behind the figures in `node_e2e/figures.rs`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_schemas::Event;
use serde_json::{json, Value};

mod common;
#[path = "node_e2e/figures.rs"]
mod figures;
#[path = "node_e2e/scenario.rs"]
mod scenario;

use common::node::{Bed, LOCKSTEP_NS, NODE_NAME, RELEASE, ROOT, SLURM_NS};
use common::wait_for;
use figures::{
    cordon_trials, figure, latency_split, lockstep_memory, percentiles, set_unschedulable,
};
use scenario::{
    base_policy, drained_by_lockstep, rand_suffix, Scenario, BUSY_LABEL, MINUTE, SLURMD_SELECTOR,
};

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
