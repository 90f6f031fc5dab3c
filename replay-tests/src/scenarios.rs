//! The incidents. Each function tells one story on a [`Sim`] and returns it;
//! `incidents/<name>.jsonl` is its log and `incidents/<name>.expected` the
//! timeline `lockstep replay` prints for it.

use lockstep_schemas::{
    ConditionStatus, Event, HealthAction, LabelFeature, Maintenance, MappingMode, PodPhase, Policy,
    ScaleRule, ScaleTargetRef, SlurmBaseState, SlurmJobState,
};

use crate::Sim;

/// An incident: its file name, what it shows, and how to build it.
pub struct Incident {
    /// File stem under `incidents/`.
    pub name: &'static str,
    /// One line for the README and the test output.
    pub about: &'static str,
    /// Builds the log.
    pub build: fn() -> Sim,
}

/// Every shipped incident.
pub const ALL: &[Incident] = &[
    Incident {
        name: "cordon-while-job-runs",
        about: "kubectl cordon under a running job drains Slurm (the job keeps running); uncordon resumes",
        build: cordon_while_job_runs,
    },
    Incident {
        name: "uncordon-resumes-only-owned",
        about: "two Slurm nodes on one Kubernetes node; uncordon resumes lockstep's drain, never the admin's",
        build: uncordon_resumes_only_owned,
    },
    Incident {
        name: "admin-drain-reflected",
        about: "an admin drain shows as a pod condition and is never undone",
        build: admin_drain_reflected,
    },
    Incident {
        name: "not-ready-grace",
        about: "a 20 s NotReady blip does nothing; 90 s NotReady drains at the grace period and resumes after recovery",
        build: not_ready_grace,
    },
    Incident {
        name: "slurm-not-responding",
        about: "slurmd stops answering: pod condition and node taint once past the grace period, both cleared once it has answered again long enough",
        build: slurm_not_responding,
    },
    Incident {
        name: "owned-drain-removed-early",
        about: "an admin resumes a node while it is still cordoned; lockstep re-applies its drain",
        build: owned_drain_removed_early,
    },
    Incident {
        name: "flapping-node-damped",
        about: "a node that flaps NotReady is held drained after the flap bound",
        build: flapping_node_damped,
    },
    Incident {
        name: "action-fails-then-retried",
        about: "a drain fails, is retried with backoff, is lost, times out, and finally succeeds",
        build: action_fails_then_retried,
    },
    Incident {
        name: "gpu-xid-host-mode-down",
        about: "host mode: a GPU XID node condition takes the node DOWN; cleared, it is resumed",
        build: gpu_xid_host_mode_down,
    },
    Incident {
        name: "mass-not-ready-rate-bound",
        about: "six nodes NotReady at once: health drains are bounded per minute, the rest deferred",
        build: mass_not_ready_rate_bound,
    },
    Incident {
        name: "pod-evicted",
        about: "a slurmd pod is evicted: its Slurm node drains; the replacement pod resumes it",
        build: pod_evicted,
    },
    Incident {
        name: "scale-up-burst",
        about: "a burst of pending jobs scales a StatefulSet up at once, bounded by max; held jobs do not count",
        build: scale_up_burst,
    },
    Incident {
        name: "idle-scale-in",
        about: "the queue drains; after the idle time the top ordinals are drained, then the replicas lowered so the StatefulSet removes exactly them",
        build: idle_scale_in,
    },
    Incident {
        name: "victim-gets-a-job",
        about: "a job lands on a scale-in victim (the top ordinal) before its drain: it is let go, and scaled in only after the job ends",
        build: victim_gets_a_job,
    },
    Incident {
        name: "victim-takes-a-job-after-scale-down",
        about: "replicas lowered past gpu-1, its controller waiting; an admin resumes gpu-1 and a job lands on it before lockstep's drain is back: replicas go up again at once, and gpu-1 is scaled in only after the job ends",
        build: victim_takes_a_job_after_scale_down,
    },
    Incident {
        name: "self-lifting-drain-not-counted",
        about: "Slinky's drain (left by a preStop) on the scale-in victim gpu-1 keeps it out but does not count as DRAINED, since Slinky lifts it by itself: the count stays until Slinky lifts it and lockstep's own drain shows",
        build: self_lifting_drain_not_counted,
    },
    Incident {
        name: "demand-returns-during-scale-in",
        about: "pending jobs arrive while victims drain: the drains are cancelled instead of adding nodes",
        build: demand_returns_during_scale_in,
    },
    Incident {
        name: "slurm-invisible-during-scale-in",
        about: "lockstep loses sight of Slurm during a scale-in: replicas are not lowered until it sees again",
        build: slurm_invisible_during_scale_in,
    },
    Incident {
        name: "pod-moves-to-another-block",
        about: "a pod moves to a Kubernetes node in another zone and block: features and topology follow it",
        build: pod_moves_to_another_block,
    },
    Incident {
        name: "invalid-topology-label",
        about: "an empty or invalid topology label never reaches Slurm; it is reported until fixed",
        build: invalid_topology_label,
    },
    Incident {
        name: "rolling-replacement",
        about: "a new pod revision replaces pods one at a time through drain, drained, delete",
        build: rolling_replacement,
    },
    Incident {
        name: "stale-observation-redelivered",
        about: "old observations re-published after the dedup window (a cordon, a running job) change nothing",
        build: stale_observation_redelivered,
    },
    Incident {
        name: "replacement-pending-keeps-drain",
        about: "an evicted pod's replacement appears Pending, then Running but not Ready: the drain lifts only when it is Ready",
        build: replacement_pending_keeps_drain,
    },
    Incident {
        name: "pod-force-deleted",
        about: "a slurmd pod force-deleted, and one deleted while the watch was down, drain like any pod loss until a replacement is Ready",
        build: pod_force_deleted,
    },
    Incident {
        name: "kube-node-deleted",
        about: "host mode: a cordoned node is deleted, another vanishes in a relist; both stay drained as deleted until a node of that name is Ready",
        build: kube_node_deleted,
    },
    Incident {
        name: "statefulset-busy-top-ordinal",
        about: "idle ordinals 1-3 below a busy ordinal 4: no scale-in (a StatefulSet removes its top ordinals) until ordinal 4 is idle; then the top ordinals go",
        build: statefulset_busy_top_ordinal,
    },
    Incident {
        name: "replicaset-scale-in-by-deletion-cost",
        about: "a ReplicaSet scales in any idle pods: drained, given the lowest pod-deletion-cost, then replicas lowered; the busy newest pod stays",
        build: replicaset_scale_in_by_deletion_cost,
    },
    Incident {
        name: "demand-returns-after-pods-gone",
        about: "demand returns after some victims' pods are gone and others are marked: replicas never drop below it, the rest are let go",
        build: demand_returns_after_pods_gone,
    },
    Incident {
        name: "recreated-pod-of-settled-victim",
        about: "static Slurm nodes keep their scale-in drain while their pods are gone; recreated by a scale-up, they are resumed",
        build: recreated_pod_of_settled_victim,
    },
    Incident {
        name: "policy-change-cleans-up",
        about: "a policy change turns the unhealthy taint off and renames the prefix, the health condition and the busy label: what lockstep set under the old names goes, its old drains stay its own",
        build: policy_change_cleans_up,
    },
    Incident {
        name: "policy-adds-feature-label",
        about: "a policy starts to read a rack label: the rack features (two nodes running jobs on them) are left alone until the nodes are observed with it",
        build: policy_adds_feature_label,
    },
    Incident {
        name: "slurm-blip-damped",
        about: "Slurm -> Kubernetes is damped: a 45 s NOT_RESPONDING blip on all nodes writes nothing, an outage is marked at a bounded rate, a flapping node is held, and a drained node that stops answering shows unhealthy",
        build: slurm_blip_damped,
    },
    Incident {
        name: "maintenance-window",
        about: "maintenance announced for k1 03:10-03:40: a Slurm maintenance reservation at once, the drain at 03:10 with DrainInProgress then Drained on the node as its job ends, resume and release at 03:40; k2's maintenance is cancelled before it starts and its reservation released",
        build: maintenance_window,
    },
    Incident {
        name: "admin-drain-lands-while-drain-in-flight",
        about: "a cordon's drain is on its way when netops drains the node for an RMA: the actuator leaves netops' drain as it is, lockstep takes the node as drained by someone else, and the uncordon resumes nothing",
        build: admin_drain_lands_while_drain_in_flight,
    },
    Incident {
        name: "admins-act-while-slurm-unseen",
        about: "slurmrestd is down for 5 minutes while root takes over one of lockstep's drains and netops drains the other node for an RMA, and both hosts are uncordoned: seen again, lockstep acts on nothing until Slurm is listed in full, then resumes neither",
        build: admins_act_while_slurm_unseen,
    },
    Incident {
        name: "admin-resumes-are-not-flaps",
        about: "one NotReady spell; an admin resumes the node three times and lockstep drains it again each time; Ready again, it is resumed after resume_after_s, not held as a flapping node",
        build: admin_resumes_are_not_flaps,
    },
    Incident {
        name: "cordon-cycle-keeps-flap-hold",
        about: "a node held after four GPU XID spells in an hour is cordoned and uncordoned for a GPU reset: the hold belongs to the health cause and lasts its time",
        build: cordon_cycle_keeps_flap_hold,
    },
    Incident {
        name: "rollout-waits-for-pulling-pods",
        about: "a new revision over six idle pods with max_unavailable 2: a replaced pod counts as unavailable while its successor pulls its image, until it is Running and Ready and its Slurm node serves",
        build: rollout_waits_for_pulling_pods,
    },
    Incident {
        name: "slinky-beside-lockstep",
        about: "Slinky's slurm-operator drains on cordon too: whichever drain lands first stands, neither resumes the other's, its preStop DOWN of a terminating pod is never lifted by lockstep, and nothing stays out once both causes end",
        build: slinky_beside_lockstep,
    },
    Incident {
        name: "drains-shown-on-nodes",
        about: "Slurm's drains on the Kubernetes nodes themselves: each node's annotation names its Slurm nodes; a cordon shows DrainInProgress while a job runs, then Drained; netops' RMA drain of n3 shows SlurmNodeDrained on k2 naming it, and a second drain there joins the message; resumes take each back",
        build: drains_shown_on_nodes,
    },
    Incident {
        name: "replaced-node-waits-for-health",
        about: "return to service gated on a health check (host mode): gpu-001's VM is replaced while drained and comes back Ready, resumed only once HealthCheckPassed is True on the new machine; gpu-002 reboots while cordoned and keeps a True left from before, resumed only after the check turns False then True; gpu-003 reboots in service and a later cordon cycle resumes at once",
        build: replaced_node_waits_for_health,
    },
    Incident {
        name: "gpu-fault-from-dra",
        about: "GPU faults from DRA (health.device_faults): the driver taints gpu-3 of k1 for an XID, and n1 and n2 on k1 drain naming the device; an operator's DeviceTaintRule takes gpu-5 of k2 out; the kubelet reports a GPU of n4's pod Unhealthy and only n4 drains; each resumes after resume_after_s once its taint is gone or its GPU healthy",
        build: gpu_fault_from_dra,
    },
    Incident {
        name: "eviction-through-slurm",
        about: "eviction through Slurm (drain.eviction_responder): an eviction of n1's pod drains n1 at once; lockstep reports every 5 minutes while job 1001 runs, completes when it ends, and Kubernetes' evictor then evicts the pod; n2's eviction is withdrawn while its job still runs, and its drain is lifted",
        build: eviction_through_slurm,
    },
    Incident {
        name: "prestop-down-under-own-drain",
        about: "ReturnToService=1: a terminating pod's preStop sets n1 DOWN between the actuator's read and its write of lockstep's drain, which takes over its reason; slurmd goes with the pod and n1 shows unhealthy on the replacement's host k3; once slurmd answers there the DOWN stays under lockstep's reason: the pod condition keeps saying SlurmDown, the unhealthy taint leaves k3, and lockstep's resume after k3's cordon ends brings n1 back",
        build: prestop_down_under_own_drain,
    },
    Incident {
        name: "drain-found-in-place-after-failed-resumes",
        about: "k1's cordon ends and lockstep's resume of n1 times out twice without landing (the retry goes out while the first attempt does not show); k1 is cordoned again and the Slurm actuator finds lockstep's drain still in place: n1 is drained as lockstep last saw it, and nothing more is sent, though the poller, which reports only changes, never reports n1 again",
        build: drain_found_in_place_after_failed_resumes,
    },
];

/// The incident with this name.
pub fn by_name(name: &str) -> Option<&'static Incident> {
    ALL.iter().find(|i| i.name == name)
}

/// One Kubernetes node per Slurm node, pod mode: `k<i>` runs pod `n<i>`.
fn cluster(policy: Policy, nodes: usize) -> Sim {
    let mut sim = Sim::new(policy);
    for i in 1..=nodes {
        let (n, k) = (format!("n{i}"), format!("k{i}"));
        sim.add_kube_node(&k).add_slurm_node(&n).add_pod(&n, &k);
    }
    sim
}

fn cordon_while_job_runs() -> Sim {
    let mut sim = cluster(Policy::default(), 2);
    sim.advance_s(10).start_job(1001, &["n1", "n2"]).actuate();
    sim.advance_s(60).cordon("k1").actuate();
    sim.advance_s(600).end_job(1001).actuate();
    sim.advance_s(60).uncordon("k1").actuate();
    sim
}

fn uncordon_resumes_only_owned() -> Sim {
    let mut sim = Sim::new(Policy::default());
    sim.add_kube_node("k1");
    for n in ["n1", "n2"] {
        sim.add_slurm_node(n).add_pod(n, "k1");
    }
    sim.advance_s(5)
        .admin_drain("n2", "bad DIMM, ticket 4411")
        .actuate();
    sim.advance_s(30).cordon("k1").actuate();
    sim.advance_s(300).uncordon("k1").actuate();
    sim
}

fn admin_drain_reflected() -> Sim {
    let mut sim = cluster(Policy::default(), 1);
    sim.advance_s(30)
        .admin_drain("n1", "reseat GPU 3")
        .actuate();
    sim.advance_s(3600).idle_s(120, 60);
    sim.advance_s(10).admin_resume("n1").actuate();
    sim
}

fn not_ready_grace() -> Sim {
    let mut sim = cluster(Policy::default(), 2);
    sim.advance_s(5).set_ready("k1", ConditionStatus::Unknown);
    sim.idle_s(20, 10).set_ready("k1", ConditionStatus::True);
    sim.advance_s(5).set_ready("k2", ConditionStatus::False);
    sim.idle_s(90, 10).actuate();
    sim.advance_s(5).set_ready("k2", ConditionStatus::True);
    sim.idle_s(40, 10).actuate();
    sim
}

fn slurm_not_responding() -> Sim {
    let mut sim = cluster(Policy::default(), 2);
    sim.advance_s(30).slurmd_not_responding("n2").actuate();
    // Ticks while the log is quiet: the grace period runs out on one.
    sim.run_s(300, 30);
    sim.advance_s(1).slurmd_back("n2").actuate();
    sim.run_s(60, 10);
    sim
}

fn owned_drain_removed_early() -> Sim {
    let mut sim = cluster(Policy::default(), 1);
    sim.advance_s(10).cordon("k1").actuate();
    sim.advance_s(120).admin_resume("n1").actuate();
    sim.advance_s(120).uncordon("k1").actuate();
    sim
}

fn flapping_node_damped() -> Sim {
    let mut policy = Policy::default();
    policy.health.not_ready_grace_s = 30;
    policy.health.resume_after_s = 60;
    policy.health.flaps_max = 2;
    policy.health.flap_window_s = 3600;
    policy.health.flap_hold_s = 900;
    let mut sim = cluster(policy, 1);
    for _ in 0..3 {
        sim.advance_s(60).set_ready("k1", ConditionStatus::False);
        sim.idle_s(40, 10).actuate();
        sim.advance_s(10).set_ready("k1", ConditionStatus::True);
        sim.idle_s(70, 10).actuate();
    }
    // Held: the third drain is past the bound, so no resume until the hold ends.
    sim.run_s(900, 60);
    sim
}

fn action_fails_then_retried() -> Sim {
    let mut policy = Policy::default();
    policy.actions.retry_backoff_initial_s = 5;
    policy.actions.timeout_s = 30;
    let mut sim = cluster(policy, 1);
    sim.advance_s(10).cordon("k1");
    sim.advance_s(1)
        .fail_next(true, "slurmctld: Socket timed out on send/recv operation");
    sim.idle_s(5, 5);
    sim.advance_s(1).lose_next();
    sim.idle_s(30, 10);
    sim.advance_s(1).actuate();
    sim
}

fn gpu_xid_host_mode_down() -> Sim {
    let mut policy = Policy::default();
    policy.mapping.mode = MappingMode::Host;
    policy.health.node_conditions = vec!["GpuXidError".to_owned()];
    policy.health.action = HealthAction::Down;
    policy.health.resume_after_s = 60;
    let mut sim = Sim::new(policy);
    for n in ["gpu-001", "gpu-002"] {
        sim.add_kube_node(n).add_slurm_node(n);
    }
    sim.advance_s(20)
        .set_node_condition("gpu-002", "GpuXidError", ConditionStatus::True);
    sim.actuate();
    sim.advance_s(600)
        .set_node_condition("gpu-002", "GpuXidError", ConditionStatus::False);
    sim.idle_s(60, 30).actuate();
    sim
}

fn mass_not_ready_rate_bound() -> Sim {
    let mut policy = Policy::default();
    policy.health.drains_per_minute_max = 2;
    policy.health.not_ready_grace_s = 30;
    let mut sim = cluster(policy, 6);
    sim.advance_s(10);
    for i in 1..=6 {
        sim.set_ready(&format!("k{i}"), ConditionStatus::Unknown);
    }
    for _ in 0..16 {
        sim.advance_s(10).tick().actuate();
    }
    sim
}

fn pod_evicted() -> Sim {
    let mut sim = cluster(Policy::default(), 2);
    sim.advance_s(30)
        .pod_change("n1", |p| p.disruption_target = true);
    sim.actuate();
    sim.advance_s(20).pod_change("n1", |p| p.deleting = true);
    sim.advance_s(10).remove_pod("n1");
    sim.advance_s(15).add_pod("n1", "k2").actuate();
    sim
}

/// A policy that scales StatefulSet `slurm/gpu` with partition `batch`.
fn scaling_policy(min: u32, max: u32) -> Policy {
    let mut p = Policy::default();
    p.scaling.targets = vec![ScaleRule {
        target: ScaleTargetRef {
            group: "apps".into(),
            kind: "StatefulSet".into(),
            namespace: "slurm".into(),
            name: "gpu".into(),
        },
        partition: "batch".into(),
        min_replicas: min,
        max_replicas: max,
        scale_up_cooldown_s: 30,
        scale_down_cooldown_s: 60,
        idle_before_scale_down_s: 300,
        max_unavailable: 1,
    }];
    p
}

fn gpu_cluster(policy: Policy, replicas: u32) -> Sim {
    let mut sim = Sim::new(policy);
    for k in ["k1", "k2", "k3"] {
        sim.add_kube_node(k);
    }
    sim.add_set("gpu", replicas, &["k1", "k2", "k3"]);
    sim
}

fn scale_up_burst() -> Sim {
    let mut sim = gpu_cluster(scaling_policy(1, 10), 2);
    sim.advance_s(10);
    sim.submit(11, "batch", 2, "Resources")
        .submit(12, "batch", 2, "Priority")
        .submit(13, "batch", 3, "Resources")
        .submit(14, "batch", 4, "Dependency")
        .submit(15, "other", 8, "Resources");
    sim.run_s(2, 1);
    sim.advance_s(5)
        .schedule(11, &["gpu-0", "gpu-1"])
        .schedule(12, &["gpu-2", "gpu-3"]);
    sim.run_s(60, 10);
    sim
}

fn idle_scale_in() -> Sim {
    let mut sim = gpu_cluster(scaling_policy(1, 6), 4);
    sim.advance_s(10)
        .submit(21, "batch", 1, "Resources")
        .schedule(21, &["gpu-0"])
        .actuate();
    sim.run_s(120, 30);
    sim.advance_s(1).end_job(21).actuate();
    sim.run_s(600, 30);
    sim
}

fn victim_gets_a_job() -> Sim {
    let mut sim = gpu_cluster(scaling_policy(1, 6), 2);
    sim.actuate().idle_s(300, 60);
    // The victim is picked and its drain issued; a job lands before the drain does.
    sim.submit(31, "batch", 1, "Resources")
        .schedule(31, &["gpu-1"]);
    sim.actuate();
    sim.run_s(300, 30);
    sim.advance_s(1).end_job(31).actuate();
    sim.run_s(420, 30);
    sim
}

fn victim_takes_a_job_after_scale_down() -> Sim {
    let mut sim = gpu_cluster(scaling_policy(1, 6), 2);
    // The controller takes the lower count but removes no pod yet (a pod
    // below is not Ready, say).
    sim.pause_controller("gpu");
    sim.actuate().idle_s(300, 60);
    sim.run_s(60, 30);
    // An admin resumes gpu-1; a job lands before lockstep's drain is back.
    sim.advance_s(10).admin_resume("gpu-1");
    sim.submit(51, "batch", 1, "Resources")
        .schedule(51, &["gpu-1"]);
    sim.actuate();
    sim.run_s(30, 10);
    sim.advance_s(30).resume_controller("gpu").actuate();
    sim.advance_s(300).end_job(51).actuate();
    sim.run_s(600, 30);
    sim
}

fn self_lifting_drain_not_counted() -> Sim {
    let mut sim = gpu_cluster(scaling_policy(1, 6), 2);
    // Slinky's preStop reason, left on gpu-1 as its pod came back: Slinky
    // undrains it once the pod is Ready on a node not cordoned.
    sim.advance_s(10)
        .admin_drain("gpu-1", "slurm-operator: Pod is terminating");
    sim.actuate().idle_s(300, 60);
    sim.run_s(120, 30);
    // Slinky lifts it; lockstep drains gpu-1 itself, then lowers the count.
    sim.advance_s(10).admin_resume("gpu-1").actuate();
    sim.run_s(120, 30);
    sim
}

fn demand_returns_during_scale_in() -> Sim {
    let mut sim = gpu_cluster(scaling_policy(1, 6), 3);
    sim.actuate().idle_s(300, 60);
    // Two victims picked and their drains on the way; now three nodes' worth
    // of work arrives.
    sim.submit(41, "batch", 3, "Resources");
    sim.run_s(30, 5);
    sim.advance_s(1)
        .schedule(41, &["gpu-0", "gpu-1", "gpu-2"])
        .actuate();
    sim.run_s(30, 10);
    sim
}

fn slurm_invisible_during_scale_in() -> Sim {
    let mut sim = gpu_cluster(scaling_policy(1, 6), 2);
    sim.idle_s(300, 60);
    sim.advance_s(1).tick();
    // The drain lands and Slurm shows it, then the connector goes blind
    // before scaling looks again.
    sim.actuate().slurm_visible(false);
    sim.run_s(120, 30);
    sim.advance_s(1).slurm_visible(true);
    sim.run_s(30, 10);
    sim
}

fn topology_policy() -> Policy {
    let mut p = Policy::default();
    p.topology.features = vec![LabelFeature {
        label: "topology.kubernetes.io/zone".into(),
        prefix: "zone-".into(),
    }];
    p.topology.unit_label = Some("example.com/block".into());
    p.topology.topology_name = "blocks".into();
    p
}

fn pod_moves_to_another_block() -> Sim {
    let mut sim = Sim::new(topology_policy());
    sim.add_kube_node("k1")
        .label_node("k1", "topology.kubernetes.io/zone", Some("a"))
        .label_node("k1", "example.com/block", Some("b1"));
    sim.add_kube_node("k2")
        .label_node("k2", "topology.kubernetes.io/zone", Some("b"))
        .label_node("k2", "example.com/block", Some("b7"));
    sim.add_slurm_node("n1").add_pod("n1", "k1").actuate();
    sim.advance_s(60)
        .pod_change("n1", |p| p.node_name = Some("k2".into()))
        .actuate();
    sim.advance_s(60)
        .label_node("k2", "example.com/block", Some("b8"))
        .actuate();
    sim
}

fn invalid_topology_label() -> Sim {
    let mut sim = Sim::new(topology_policy());
    sim.add_kube_node("k1")
        .label_node("k1", "example.com/block", Some(""));
    sim.add_slurm_node("n1").add_pod("n1", "k1").actuate();
    sim.advance_s(30)
        .label_node("k1", "example.com/block", Some("block 3!"))
        .actuate();
    sim.advance_s(30)
        .label_node("k1", "example.com/block", Some("block3"))
        .actuate();
    sim
}

fn rolling_replacement() -> Sim {
    let mut sim = gpu_cluster(scaling_policy(3, 3), 3);
    sim.advance_s(10)
        .submit(51, "batch", 1, "Resources")
        .schedule(51, &["gpu-0"])
        .actuate();
    sim.advance_s(10).set_revision("gpu", "rev-2");
    sim.run_s(60, 5);
    sim.advance_s(1).end_job(51).actuate();
    sim.run_s(60, 5);
    sim
}

/// A versioned cluster: the connectors stamp every observation.
fn versioned_cluster(policy: Policy, nodes: usize) -> Sim {
    let mut sim = Sim::new(policy);
    sim.versioned();
    for i in 1..=nodes {
        let (n, k) = (format!("n{i}"), format!("k{i}"));
        sim.add_kube_node(&k).add_slurm_node(&n).add_pod(&n, &k);
    }
    sim
}

fn stale_observation_redelivered() -> Sim {
    let mut policy = Policy::default();
    policy.scaling.busy_label = "lockstep.io/slurm-busy".into();
    let mut sim = versioned_cluster(policy, 2);
    sim.advance_s(10).cordon("k1").actuate();
    let cordoned = sim
        .last_seq_where(|e| matches!(e, Event::KubeNode(n) if n.name == "k1" && n.unschedulable))
        .expect("the cordon was observed");
    sim.advance_s(60).uncordon("k1").actuate();
    sim.advance_s(10).start_job(7, &["n2"]).actuate();
    let running = sim
        .last_seq_where(
            |e| matches!(e, Event::SlurmJob(j) if j.job_id == 7 && j.state == SlurmJobState::Running),
        )
        .expect("the job was observed running");
    sim.advance_s(120).end_job(7).actuate();
    // The Kubernetes and Slurm publishers re-publish what they had buffered,
    // long after the log's deduplication window.
    sim.advance_s(600);
    sim.redeliver(cordoned);
    sim.redeliver(running);
    sim.actuate().run_s(1_800, 300);
    sim
}

fn replacement_pending_keeps_drain() -> Sim {
    let mut sim = versioned_cluster(Policy::default(), 2);
    sim.advance_s(30)
        .pod_change("n1", |p| p.disruption_target = true)
        .actuate();
    sim.advance_s(20).pod_change("n1", |p| p.deleting = true);
    sim.advance_s(10).remove_pod("n1");
    // The replacement is scheduled on k2: Pending while its image pulls,
    // then Running while slurmd starts and its readiness probe fails.
    sim.advance_s(5).add_pending_pod("n1", "k2").actuate();
    sim.advance_s(40)
        .pod_change("n1", |p| p.phase = PodPhase::Running)
        .actuate();
    sim.advance_s(20)
        .pod_change("n1", |p| p.ready = true)
        .actuate();
    sim
}

fn pod_force_deleted() -> Sim {
    let mut sim = versioned_cluster(Policy::default(), 3);
    // `kubectl delete pod --force --grace-period=0`: gone, never deleting.
    sim.advance_s(30).remove_pod("n1").actuate();
    sim.advance_s(20).add_pending_pod("n1", "k1").actuate();
    sim.advance_s(30)
        .pod_change("n1", |p| p.phase = PodPhase::Running)
        .pod_change("n1", |p| p.ready = true)
        .actuate();
    // n2's pod is deleted while the pod watch is down; the relist finds it gone.
    sim.advance_s(60).forget_pod("n2");
    sim.advance_s(30).relist_pods().actuate();
    sim.advance_s(30).add_pod("n2", "k3").actuate();
    sim
}

fn kube_node_deleted() -> Sim {
    let mut policy = Policy::default();
    policy.mapping.mode = MappingMode::Host;
    policy.health.resume_after_s = 30;
    let mut sim = Sim::new(policy);
    sim.versioned();
    for n in ["gpu-001", "gpu-002", "gpu-003"] {
        sim.add_kube_node(n).add_slurm_node(n);
    }
    // The usual decommissioning: cordon, then delete the node object.
    sim.advance_s(10).cordon("gpu-001").actuate();
    sim.advance_s(60).delete_kube_node("gpu-001").actuate();
    // gpu-002 is deleted while the node watch is down; the relist finds it gone.
    sim.advance_s(30).forget_kube_node("gpu-002");
    sim.advance_s(30).relist_kube_nodes().actuate();
    // gpu-001's kubelet registers it again: NotReady first, then Ready.
    sim.advance_s(600)
        .register_kube_node("gpu-001", ConditionStatus::False)
        .actuate();
    sim.advance_s(30)
        .set_ready("gpu-001", ConditionStatus::True)
        .actuate();
    sim.run_s(60, 10);
    sim
}

fn statefulset_busy_top_ordinal() -> Sim {
    let mut sim = gpu_cluster(scaling_policy(1, 6), 5);
    sim.versioned();
    sim.advance_s(10)
        .start_job(61, &["gpu-0"])
        .start_job(62, &["gpu-4"])
        .actuate();
    // Ordinals 1-3 idle well past idle_before_scale_down_s: an earlier
    // lockstep deleted them, and the controller then removed ordinal 4 with
    // job 62 when replicas dropped.
    sim.run_s(900, 60);
    sim.advance_s(1).end_job(62).actuate();
    sim.run_s(600, 30);
    sim
}

/// Scales ReplicaSet `slurm/web` with partition `batch`.
fn replica_set_policy(min: u32, max: u32) -> Policy {
    let mut p = scaling_policy(min, max);
    p.scaling.targets[0].target = ScaleTargetRef {
        group: "apps".into(),
        kind: "ReplicaSet".into(),
        namespace: "slurm".into(),
        name: "web".into(),
    };
    p
}

fn web_cluster(policy: Policy, replicas: u32) -> Sim {
    let mut sim = Sim::new(policy);
    sim.versioned();
    for k in ["k1", "k2", "k3"] {
        sim.add_kube_node(k);
    }
    sim.add_replica_set("web", replicas, &["k1", "k2", "k3"]);
    sim
}

fn replicaset_scale_in_by_deletion_cost() -> Sim {
    let mut sim = web_cluster(replica_set_policy(1, 6), 4);
    // The newest pod runs a long job: a ReplicaSet left to itself would
    // remove it first (newest first).
    sim.advance_s(10).start_job(71, &["web-4"]).actuate();
    sim.run_s(600, 30);
    sim
}

fn demand_returns_after_pods_gone() -> Sim {
    let mut sim = web_cluster(replica_set_policy(1, 6), 6);
    sim.advance_s(10)
        .start_job(81, &["web-1"])
        .start_job(82, &["web-2", "web-3"])
        .actuate();
    // web-4..6 idle long enough: drained, marked, replicas lowered, gone.
    sim.run_s(360, 30);
    sim.advance_s(1).end_job(82).actuate();
    // web-2 and web-3 idle long enough: drained and marked...
    sim.run_s(330, 30);
    // ...and before replicas drop for them, a 4-node job arrives.
    sim.advance_s(1).submit(83, "batch", 4, "Resources");
    sim.run_s(120, 10);
    sim
}

fn recreated_pod_of_settled_victim() -> Sim {
    let mut sim = Sim::new(scaling_policy(1, 6));
    sim.versioned();
    for k in ["k1", "k2", "k3"] {
        sim.add_kube_node(k);
    }
    sim.add_static_set("gpu", 4, &["k1", "k2", "k3"]);
    sim.advance_s(10)
        .submit(91, "batch", 1, "Resources")
        .schedule(91, &["gpu-0"])
        .actuate();
    // gpu-1..3 scaled in: their Slurm nodes stay in slurm.conf, drained.
    sim.run_s(420, 30);
    // A 4-node job: scaled up again; the same Slurm nodes come back.
    sim.advance_s(1).submit(92, "batch", 4, "Resources");
    sim.run_s(120, 10);
    sim
}

fn policy_change_cleans_up() -> Sim {
    let mut policy = Policy::default();
    policy.scaling.busy_label = "lockstep.io/busy".into();
    let mut sim = versioned_cluster(policy.clone(), 3);
    sim.advance_s(10).slurmd_not_responding("n1").actuate();
    sim.advance_s(10).cordon("k2").actuate();
    sim.advance_s(10).start_job(5, &["n3"]).actuate();
    sim.run_s(120, 60);
    let mut next = policy;
    next.health.unhealthy_taint = None;
    next.drain.reason_prefix = "ls:".into();
    next.health.slurm_health_condition = "SlurmHealthy".into();
    next.scaling.busy_label = "lockstep.io/slurm-busy".into();
    sim.advance_s(10).change_policy(next).actuate();
    sim.run_s(120, 60);
    // The drain made under "lockstep:" is still lockstep's to lift.
    sim.advance_s(10).uncordon("k2").actuate();
    sim.run_s(60, 30);
    sim
}

fn policy_adds_feature_label() -> Sim {
    let zone = LabelFeature {
        label: "topology.kubernetes.io/zone".into(),
        prefix: "zone-".into(),
    };
    let mut policy = Policy::default();
    policy.topology.features = vec![zone.clone()];
    let mut sim = Sim::new(policy.clone());
    sim.versioned().change_policy(policy.clone());
    for i in 1..=3 {
        let (n, k) = (format!("n{i}"), format!("k{i}"));
        // Rack features from provisioning; jobs ask for them.
        let feature = format!("rack-r{i}");
        sim.add_slurm_node(&n)
            .slurm_change(&n, |s| s.features = vec![feature.into(), "zone-a".into()]);
        sim.add_kube_node(&k)
            .label_node(&k, "topology.kubernetes.io/zone", Some("a"))
            .label_node(&k, "example.com/rack", Some(&format!("r{i}")))
            .add_pod(&n, &k);
    }
    sim.actuate();
    sim.advance_s(10).start_job(7, &["n1", "n2"]).actuate();
    let mut next = policy;
    next.topology.features = vec![
        zone,
        LabelFeature {
            label: "example.com/rack".into(),
            prefix: "rack-".into(),
        },
    ];
    sim.advance_s(60).change_policy(next).actuate();
    sim.run_s(60, 20);
    // The observer restarted with the new policy and lists the nodes again.
    sim.advance_s(5).relist_kube_nodes().actuate();
    // A rack label changes: now lockstep acts on it.
    sim.advance_s(30)
        .label_node("k3", "example.com/rack", Some("r9"))
        .actuate();
    sim
}

fn slurm_blip_damped() -> Sim {
    let mut policy = Policy::default();
    policy.health.slurm_unhealthy_per_minute_max = 4;
    policy.health.flaps_max = 2;
    policy.health.flap_hold_s = 600;
    let mut sim = versioned_cluster(policy, 8);
    let all: Vec<String> = (1..=8).map(|i| format!("n{i}")).collect();
    // slurmctld loses its nodes for 45 s (its own network blip).
    sim.advance_s(30);
    for n in &all {
        sim.slurmd_silent(n);
    }
    sim.idle_s(45, 15);
    for n in &all {
        sim.slurmd_heard(n);
    }
    sim.run_s(120, 30);
    // A real outage of six nodes: marked after the grace, four a minute.
    for n in &all[..6] {
        sim.slurmd_silent(n);
    }
    sim.run_s(300, 15);
    for n in &all[..6] {
        sim.slurmd_heard(n);
    }
    sim.run_s(120, 15);
    // n7 is drained for its cordon, then its slurmd stops answering.
    sim.advance_s(10).cordon("k7").actuate();
    sim.advance_s(10).slurmd_silent("n7");
    sim.run_s(120, 15);
    // n8 flaps: out 90 s, back 60 s, three times; held after the third.
    for _ in 0..3 {
        sim.slurmd_silent("n8");
        sim.run_s(90, 15);
        sim.slurmd_heard("n8");
        sim.run_s(60, 15);
    }
    sim.run_s(600, 60);
    sim
}

/// A window `start_min`..`end_min` minutes after the scenarios' epoch
/// (2026-03-01T03:00:00Z), as the connector reports it.
fn window(start_min: u64, end_min: u64) -> Maintenance {
    Maintenance {
        window: format!("2026-03-01T03:{start_min:02}:00Z/2026-03-01T03:{end_min:02}:00Z"),
        start_ms: crate::EPOCH_MS + start_min * 60_000,
        end_ms: Some(crate::EPOCH_MS + end_min * 60_000),
        in_progress: false,
    }
}

fn maintenance_window() -> Sim {
    let mut policy = Policy::default();
    policy.maintenance.enabled = true;
    let mut sim = Sim::new(policy);
    sim.add_kube_node("k1").add_kube_node("k2");
    sim.add_slurm_node("n1").add_pod("n1", "k1");
    sim.add_slurm_node("n2").add_pod("n2", "k1");
    sim.add_slurm_node("n3").add_pod("n3", "k2");
    sim.advance_s(10)
        .start_job(1001, &["n1"])
        .start_job(1002, &["n2"])
        .actuate();
    sim.advance_s(50)
        .kube_change("k1", |k| k.maintenance = Some(window(10, 40)))
        .actuate();
    sim.advance_s(60)
        .kube_change("k2", |k| k.maintenance = Some(window(20, 30)))
        .actuate();
    // 03:05: job 1002 ends; k2's maintenance is called off.
    sim.idle_s(180, 60);
    sim.end_job(1002).actuate();
    sim.kube_change("k2", |k| k.maintenance = None).actuate();
    // 03:10: the window opens; 03:15: job 1001 ends.
    sim.run_s(600, 60);
    sim.end_job(1001).actuate();
    // 03:40: the window closes, the node is Ready.
    sim.run_s(1500, 60);
    sim.advance_s(60)
        .kube_change("k1", |k| k.maintenance = None)
        .actuate();
    sim
}

fn drains_shown_on_nodes() -> Sim {
    let mut policy = Policy::default();
    policy.node_signals.drain_conditions = true;
    policy.node_signals.foreign_drain_condition = "SlurmNodeDrained".to_owned();
    policy.node_signals.slurm_nodes_annotation = "lockstep.dev/slurm-nodes".to_owned();
    let mut sim = Sim::new(policy.clone());
    sim.add_kube_node("k1").add_kube_node("k2");
    sim.add_slurm_node("n1").add_pod("n1", "k1");
    sim.add_slurm_node("n2").add_pod("n2", "k1");
    sim.add_slurm_node("n3").add_pod("n3", "k2");
    sim.add_slurm_node("n4").add_pod("n4", "k2");
    sim.advance_s(10).start_job(1001, &["n1"]).actuate();
    // 03:01: k1 is cordoned while job 1001 runs; 03:11 it ends.
    sim.advance_s(50).cordon("k1").actuate();
    sim.advance_s(600).end_job(1001).actuate();
    // 03:12: netops drains n3 for an RMA, 03:13 n4 too.
    sim.advance_s(60)
        .admin_drain("n3", "NVSwitch RMA")
        .actuate();
    sim.advance_s(60).admin_drain("n4", "fan failure").actuate();
    // 03:20: k1 is uncordoned; 03:30 n3 is back, 03:31 n4.
    sim.advance_s(420).uncordon("k1").actuate();
    sim.advance_s(600).admin_resume("n3").actuate();
    sim.advance_s(60).admin_resume("n4").actuate();
    // 03:32: n2's pod is gone: the annotation no longer names it.
    sim.advance_s(60).remove_pod("n2").actuate();
    // 03:33: n3's slurmd stops answering; shown past the grace.
    sim.advance_s(60).slurmd_not_responding("n3").actuate();
    sim.run_s(90, 30);
    // 03:36: the policy renames the annotation and turns the condition off:
    // what lockstep set under the old names is taken back.
    policy.node_signals.foreign_drain_condition = String::new();
    policy.node_signals.slurm_nodes_annotation = "example.com/slurm".to_owned();
    sim.advance_s(60).change_policy(policy).actuate();
    sim.run_s(60, 30);
    sim
}

fn replaced_node_waits_for_health() -> Sim {
    const CHECK: &str = "HealthCheckPassed";
    let mut policy = Policy::default();
    policy.mapping.mode = MappingMode::Host;
    policy.health.resume_after_s = 30;
    policy.health.return_condition = CHECK.to_owned();
    let mut sim = Sim::new(policy);
    sim.versioned();
    let identity = |uid: &str, boot: &str| lockstep_schemas::NodeIdentity {
        uid: uid.to_owned(),
        boot_id: boot.to_owned(),
        provider_id: String::new(),
    };
    for (i, n) in ["gpu-001", "gpu-002", "gpu-003"].into_iter().enumerate() {
        sim.add_kube_node(n).add_slurm_node(n);
        sim.kube_change(n, |k| {
            k.identity = identity(&format!("uid-{i}"), &format!("boot-{i}a"));
        })
        .set_node_condition(n, CHECK, ConditionStatus::True);
    }
    sim.actuate();
    // gpu-001 stops answering; drained past the grace; its VM is replaced:
    // the Node is deleted and registers again, Ready, not checked yet.
    sim.advance_s(10)
        .set_ready("gpu-001", ConditionStatus::False);
    sim.idle_s(70, 10).actuate();
    sim.advance_s(120).delete_kube_node("gpu-001").actuate();
    sim.advance_s(300)
        .register_kube_node("gpu-001", ConditionStatus::True)
        .kube_change("gpu-001", |k| k.identity = identity("uid-9", "boot-9a"))
        .actuate();
    sim.run_s(120, 30);
    // The health check passes on the new machine.
    sim.advance_s(60)
        .set_node_condition("gpu-001", CHECK, ConditionStatus::True)
        .actuate();
    // gpu-002 is cordoned and reboots; uncordoned with the True from before.
    sim.advance_s(60).cordon("gpu-002").actuate();
    sim.advance_s(120)
        .kube_change("gpu-002", |k| k.identity = identity("uid-1", "boot-1b"))
        .actuate();
    sim.advance_s(60).uncordon("gpu-002").actuate();
    sim.run_s(120, 30);
    sim.advance_s(30)
        .set_node_condition("gpu-002", CHECK, ConditionStatus::False)
        .actuate();
    sim.advance_s(90)
        .set_node_condition("gpu-002", CHECK, ConditionStatus::True)
        .actuate();
    // gpu-003 reboots in service: nothing to hold, then or later.
    sim.advance_s(60)
        .kube_change("gpu-003", |k| k.identity = identity("uid-2", "boot-2b"))
        .actuate();
    sim.advance_s(60).cordon("gpu-003").actuate();
    sim.advance_s(60).uncordon("gpu-003").actuate();
    sim.run_s(60, 30);
    // gpu-001's Node is deleted again and registers as another machine
    // before Slurm shows the drain lockstep sent for the deletion: while
    // that drain is on its way the return still waits for the check.
    sim.advance_s(30).delete_kube_node("gpu-001");
    sim.advance_s(1)
        .register_kube_node("gpu-001", ConditionStatus::True)
        .kube_change("gpu-001", |k| k.identity = identity("uid-10", "boot-10a"))
        .actuate();
    sim.run_s(120, 30);
    sim.advance_s(30)
        .set_node_condition("gpu-001", CHECK, ConditionStatus::True)
        .actuate();
    sim.run_s(60, 30);
    // gpu-003's Node is deleted: the drain for it is done in slurmctld, but
    // lockstep's poller comes round only after the Node has registered
    // again as another machine and changed once more. The drain it then
    // shows is held for the check all the same.
    sim.advance_s(30)
        .delete_kube_node("gpu-003")
        .actuate_before_poll();
    sim.advance_s(2)
        .register_kube_node("gpu-003", ConditionStatus::True)
        .kube_change("gpu-003", |k| k.identity = identity("uid-11", "boot-11a"));
    sim.advance_s(1)
        .label_node("gpu-003", "example.com/rack", Some("r7"));
    sim.advance_s(5).poll_slurm_node("gpu-003").actuate();
    sim.run_s(60, 30);
    sim.advance_s(30)
        .set_node_condition("gpu-003", CHECK, ConditionStatus::True)
        .actuate();
    sim.run_s(60, 30);
    sim
}

fn gpu_fault_from_dra() -> Sim {
    let mut policy = Policy::default();
    policy.health.device_faults = true;
    policy.health.resume_after_s = 60;
    let mut sim = Sim::new(policy);
    sim.versioned();
    sim.add_kube_node("k1").add_kube_node("k2");
    sim.add_slurm_node("n1").add_pod("n1", "k1");
    sim.add_slurm_node("n2").add_pod("n2", "k1");
    sim.add_slurm_node("n3").add_pod("n3", "k2");
    sim.add_slurm_node("n4").add_pod("n4", "k2");
    sim.actuate();
    let faults = |faults: &[&str], version: u64| lockstep_schemas::NodeDevices {
        faults: faults.iter().map(|f| (*f).to_owned()).collect(),
        version,
    };
    // 03:01: the GPU driver taints gpu-3 of k1's slice for an XID.
    sim.advance_s(60)
        .kube_change("k1", |k| {
            k.devices = faults(
                &["gpu.nvidia.com/k1/gpu-3 gpu.nvidia.com/xid=79:NoSchedule"],
                101,
            );
        })
        .actuate();
    // 03:03: an operator's DeviceTaintRule takes gpu-5 of k2 out.
    sim.advance_s(120)
        .kube_change("k2", |k| {
            k.devices = faults(
                &["gpu.nvidia.com/k2/gpu-5 ops.example.com/nvlink=down:NoExecute"],
                102,
            );
        })
        .actuate();
    // 03:05: the rule is deleted; 03:06 the driver clears gpu-3 after a reset.
    sim.advance_s(120)
        .kube_change("k2", |k| k.devices = faults(&[], 103))
        .actuate();
    sim.advance_s(60)
        .kube_change("k1", |k| k.devices = faults(&[], 104))
        .actuate();
    sim.run_s(120, 30);
    // 03:09: the kubelet reports a GPU allocated to n4's pod Unhealthy.
    sim.advance_s(60)
        .pod_change("n4", |p| {
            p.unhealthy_devices = vec!["gpu.nvidia.com/k2/gpu-1".to_owned()];
        })
        .actuate();
    sim.advance_s(300)
        .pod_change("n4", |p| p.unhealthy_devices.clear())
        .actuate();
    sim.run_s(120, 30);
    sim
}

fn eviction_through_slurm() -> Sim {
    use lockstep_schemas::{PodEviction, ResponderState};
    let mut policy = Policy::default();
    policy.drain.eviction_responder = "lockstep.dev/slurm-drain".to_owned();
    let mut sim = cluster(policy, 2);
    sim.versioned();
    let eviction = |name: &str, state: ResponderState, over: bool, version: u64| PodEviction {
        name: name.to_owned(),
        state,
        completed: false,
        over,
        version,
    };
    sim.advance_s(10)
        .start_job(1001, &["n1"])
        .start_job(1002, &["n2"])
        .actuate();
    // 03:01: an eviction of n1's pod is requested; another responder first.
    sim.advance_s(50)
        .pod_change("n1", |p| {
            p.eviction = Some(eviction("pod-1-n1", ResponderState::Inactive, false, 101));
        })
        .actuate();
    // 03:01:10 lockstep's turn; 03:02 n2's eviction, lockstep's turn at once.
    sim.advance_s(10)
        .pod_change("n1", |p| {
            p.eviction = Some(eviction("pod-1-n1", ResponderState::Active, false, 102));
        })
        .actuate();
    sim.advance_s(50)
        .pod_change("n2", |p| {
            p.eviction = Some(eviction("pod-1-n2", ResponderState::Active, false, 103));
        })
        .actuate();
    // 03:04: every requester of n2's eviction withdraws.
    sim.advance_s(120)
        .pod_change("n2", |p| {
            p.eviction = Some(eviction("pod-1-n2", ResponderState::Canceled, true, 104));
        })
        .actuate();
    // Job 1001 runs until 03:16; lockstep reports meanwhile, then completes.
    sim.run_s(720, 60);
    sim.end_job(1001).actuate();
    sim.run_s(10, 5);
    // Kubernetes' evictor evicts the pod; it goes.
    sim.advance_s(5)
        .pod_change("n1", |p| {
            p.deleting = true;
            p.disruption_target = true;
        })
        .actuate();
    sim.advance_s(30).remove_pod("n1").actuate();
    sim.run_s(60, 30);
    sim
}

fn admin_drain_lands_while_drain_in_flight() -> Sim {
    let mut sim = cluster(Policy::default(), 1);
    sim.advance_s(10).cordon("k1");
    // Before the actuator's write: the node is drained for an RMA.
    sim.advance_s(1)
        .admin_drain_unseen("n1", "NVSwitch RMA", "netops");
    sim.actuate();
    sim.advance_s(2).poll_slurm_node("n1").actuate();
    sim.advance_s(300).uncordon("k1").actuate();
    sim.advance_s(3600).admin_resume("n1").actuate();
    sim
}

fn admins_act_while_slurm_unseen() -> Sim {
    let mut sim = cluster(Policy::default(), 2);
    sim.advance_s(10).cordon("k1").cordon("k2").actuate();
    sim.advance_s(60).slurm_visible(false);
    sim.advance_s(30).slurm_change_unseen("n1", |n| {
        n.reason = Some("disk replaced, keep out".to_owned());
        n.reason_user = Some("root".to_owned());
    });
    sim.advance_s(30)
        .admin_drain_unseen("n2", "NVSwitch RMA", "netops");
    sim.advance_s(60).uncordon("k1").uncordon("k2").actuate();
    sim.advance_s(180).slurm_seen_again().actuate();
    sim.advance_s(1).relist_slurm().actuate();
    sim.run_s(120, 30);
    sim
}

fn admin_resumes_are_not_flaps() -> Sim {
    let mut policy = Policy::default();
    policy.health.not_ready_grace_s = 60;
    policy.health.resume_after_s = 30;
    policy.health.flaps_max = 3;
    policy.health.flap_window_s = 3600;
    policy.health.flap_hold_s = 1080;
    let mut sim = cluster(policy, 1);
    sim.advance_s(10).set_ready("k1", ConditionStatus::False);
    sim.idle_s(70, 10).actuate();
    for _ in 0..3 {
        sim.advance_s(120).admin_resume("n1").actuate();
    }
    sim.advance_s(120).set_ready("k1", ConditionStatus::True);
    sim.run_s(60, 10);
    sim
}

fn cordon_cycle_keeps_flap_hold() -> Sim {
    let mut policy = Policy::default();
    policy.health.node_conditions = vec!["GpuXidError".to_owned()];
    policy.health.resume_after_s = 60;
    policy.health.flaps_max = 3;
    policy.health.flap_window_s = 3600;
    policy.health.flap_hold_s = 1800;
    let mut sim = cluster(policy, 1);
    for _ in 0..4 {
        sim.advance_s(300)
            .set_node_condition("k1", "GpuXidError", ConditionStatus::True)
            .actuate();
        sim.advance_s(120)
            .set_node_condition("k1", "GpuXidError", ConditionStatus::False);
        sim.run_s(70, 10);
    }
    // Held: four spells within the hour. A cordon cycle for a GPU reset.
    sim.advance_s(60).cordon("k1").actuate();
    sim.advance_s(300).uncordon("k1").actuate();
    sim.run_s(1800, 60);
    sim
}

fn rollout_waits_for_pulling_pods() -> Sim {
    let mut policy = scaling_policy(6, 6);
    policy.scaling.targets[0].max_unavailable = 2;
    let mut sim = gpu_cluster(policy, 6);
    sim.slow_pulls("gpu");
    sim.advance_s(10).set_revision("gpu", "rev-2");
    sim.run_s(60, 5);
    // The first two successors pull their image for minutes.
    sim.run_s(300, 30);
    sim.advance_s(1).images_pulled("gpu");
    sim.run_s(60, 5);
    sim.run_s(300, 30);
    sim.advance_s(1).images_pulled("gpu");
    sim.run_s(60, 5);
    sim.advance_s(1).images_pulled("gpu");
    sim.run_s(60, 5);
    sim
}

/// Slinky's slurm-operator drain reason for a cordoned node.
fn slinky_cordon_reason(kube: &str, pod: &str) -> String {
    format!("slurm-operator: Node ({kube}) was cordoned, Pod (slurm/{pod}) must be cordoned")
}

fn slinky_beside_lockstep() -> Sim {
    let mut sim = cluster(Policy::default(), 2);
    // k1: Slinky's drain lands before lockstep's actuator writes.
    sim.advance_s(10).cordon("k1");
    let reason = slinky_cordon_reason("k1", "n1");
    sim.advance_s(1).admin_drain_unseen("n1", &reason, "slurm");
    sim.actuate();
    sim.advance_s(1).poll_slurm_node("n1").actuate();
    // k2: lockstep's drain lands first; Slinky leaves a reason not its own.
    sim.advance_s(10).cordon("k2").actuate();
    // Both uncordoned: lockstep resumes its own drain, Slinky its own.
    sim.advance_s(300).uncordon("k1").uncordon("k2").actuate();
    sim.advance_s(2).admin_resume("n1");
    sim.run_s(60, 30);
    // n2's pod terminates: its preStop sets DOWN before lockstep's drain lands.
    sim.advance_s(60).pod_change("n2", |p| p.deleting = true);
    sim.advance_s(1).slurm_change_unseen("n2", |n| {
        n.state = SlurmBaseState::Down;
        n.reason = Some("slurm-operator: Pod is terminating".to_owned());
        n.reason_user = Some("slurm".to_owned());
    });
    sim.actuate();
    sim.advance_s(1).poll_slurm_node("n2").actuate();
    sim.advance_s(30).remove_pod("n2").actuate();
    // The replacement runs; its slurmd registers and slurmctld returns the
    // node to service (ReturnToService=2).
    sim.advance_s(20)
        .add_pod("n2", "k2")
        .slurm_change("n2", |n| {
            n.state = SlurmBaseState::Idle;
            n.reason = None;
            n.reason_user = None;
        });
    sim.run_s(120, 30);
    sim
}

fn prestop_down_under_own_drain() -> Sim {
    let mut sim = cluster(Policy::default(), 2);
    sim.add_kube_node("k3");
    // n1's pod terminates: its preStop sets DOWN between the actuator's read
    // of n1 (IDLE) and its write of lockstep's drain, whose reason then
    // replaces the hook's: Slurm shows DOWN+DRAIN under lockstep's reason.
    sim.advance_s(10).pod_change("n1", |p| p.deleting = true);
    sim.actuate_before_poll();
    sim.slurm_change_unseen("n1", |n| n.state = SlurmBaseState::Down);
    sim.advance_s(1).poll_slurm_node("n1").actuate();
    // slurmd goes with the pod; its replacement waits on k3 for its image.
    sim.advance_s(20)
        .remove_pod("n1")
        .slurmd_silent("n1")
        .actuate();
    sim.advance_s(1).add_pending_pod("n1", "k3").actuate();
    sim.run_s(120, 30);
    // An admin cordons k3; the replacement starts and its slurmd registers,
    // and slurmctld keeps the DOWN it did not set (ReturnToService=1).
    sim.advance_s(10).cordon("k3").actuate();
    sim.advance_s(60)
        .add_pod("n1", "k3")
        .slurmd_heard("n1")
        .actuate();
    sim.run_s(120, 30);
    // k3 uncordoned: lockstep resumes its own drain, and with it the DOWN.
    sim.advance_s(10).uncordon("k3").actuate();
    sim.run_s(120, 30);
    sim
}

fn drain_found_in_place_after_failed_resumes() -> Sim {
    let mut policy = Policy::default();
    policy.actions.retry_backoff_initial_s = 5;
    policy.actions.timeout_s = 30;
    let mut sim = cluster(policy, 1);
    sim.advance_s(10).cordon("k1").actuate();
    sim.idle_s(20, 10);
    // The resume times out and never reaches slurmctld; so does its retry.
    sim.advance_s(10).uncordon("k1");
    sim.advance_s(1).fail_next(true, "timeout");
    sim.idle_s(5, 5);
    sim.advance_s(1).fail_next(true, "timeout");
    // Cordoned again before the next retry: the drain finds n1 as it was.
    sim.advance_s(1).cordon("k1");
    sim.advance_s(1).find_next_in_place();
    sim.idle_s(120, 10);
    sim
}
