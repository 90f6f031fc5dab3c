//! A schedule: the cluster's shape and the things that happen to it (an
//! administrator's commands, failures, jobs, policy edits), each after a
//! delay. It owns what a world run is made of, so that a failing run is a
//! value that can be shrunk, saved as JSON and run again; it never decides
//! how the world reacts (that is the rest of `world`).
//!
//! Everything refers to nodes, pods and sets by small indices taken modulo
//! what exists, so that any sub-list of steps (what proptest's shrinking
//! produces) is still a valid schedule.

use proptest::prelude::*;
use serde::{Deserialize, Serialize};

use lockstep_schemas::{LabelFeature, Policy, ScaleRule, ScaleTargetRef, TaintSpec};

/// Namespace of every slurmd pod and scale target.
pub const NAMESPACE: &str = "slurm";
/// The scaled set's name; its Slurm partition is [`SCALED_PARTITION`].
pub const SCALED_SET: &str = "cpu";
/// The partition of the scaled set.
pub const SCALED_PARTITION: &str = "batch";
/// The fixed-size set's name (not scaled by lockstep); its partition is [`FIXED_PARTITION`].
pub const FIXED_SET: &str = "gpu";
/// The partition of the fixed set.
pub const FIXED_PARTITION: &str = "gpu";
/// The node label whose value becomes a Slurm feature when the zone feature is on.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// A second node label that a policy change may turn into features.
pub const RACK_LABEL: &str = "example.com/rack";
/// The node condition a node-problem-detector sets (GPU XID errors).
pub const XID_CONDITION: &str = "GpuXid";
/// The busy label lockstep sets when the policy asks for one.
pub const BUSY_LABEL: &str = "lockstep.io/slurm-busy";
/// lockstep's unhealthy taint key.
pub const UNHEALTHY_TAINT: &str = "lockstep.io/slurm-unhealthy";
/// The node annotation naming a node's Slurm nodes, when the policy asks
/// for one (`node_signals.slurm_nodes_annotation`).
pub const SLURM_NODES_ANNOTATION: &str = "lockstep.io/slurm-nodes";

/// How the scaled target manages its pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScaledKind {
    /// A StatefulSet with `podManagementPolicy: OrderedReady` (the default).
    OrderedReady,
    /// A StatefulSet with `podManagementPolicy: Parallel`.
    Parallel,
    /// A ReplicaSet (as a Deployment owns): scale-down by pod-deletion-cost rank.
    ReplicaSet,
}

/// The cluster before the first step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setup {
    /// Kubernetes nodes (hosts), `k8s-0` ...
    pub kube_nodes: u8,
    /// Kind of the scaled target.
    pub scaled_kind: ScaledKind,
    /// Scaling bounds of the scaled target.
    pub scaled_min: u8,
    /// Upper bound (at least `scaled_min`, at least 1).
    pub scaled_max: u8,
    /// Replicas of the fixed set (0: no fixed set).
    pub fixed_replicas: u8,
    /// slurm.conf `ReturnToService` (1 or 2).
    pub return_to_service: u8,
    /// The policy sets a busy label (and a PodDisruptionBudget selects it).
    pub busy_label: bool,
    /// The policy's `health.unhealthy_taint` is set.
    pub unhealthy_taint: bool,
    /// The policy turns the zone label into `zone-<value>` features.
    pub zone_feature: bool,
    /// Actuator calls fail now and then (retryable, nothing changed).
    pub flaky_actuators: bool,
    /// Seed of the latencies (the world is deterministic given it).
    pub jitter_seed: u64,
    /// Slinky's slurm-operator runs beside lockstep: it drains on cordon,
    /// undrains its own drains on uncordon, and its worker pods set their
    /// Slurm node DOWN in their preStop hook.
    #[serde(default)]
    pub slinky: bool,
    /// A pod created during the run pulls its image this long before its
    /// containers start (Pending, ContainerCreating); 0: the image is on
    /// every node already.
    #[serde(default)]
    pub image_pull_s: u16,
    /// The policy names each Kubernetes node's Slurm nodes in an annotation
    /// (`node_signals.slurm_nodes_annotation`).
    #[serde(default)]
    pub slurm_nodes_annotation: bool,
    /// lockstep polls Slurm's jobs and partitions in a lane apart from its
    /// nodes (`slurm_jobs_lane_ms`), as it does since it has lanes. Off:
    /// one poll lists nodes, jobs and partitions at one instant, the
    /// poller every story saved before the lanes was found with (they
    /// keep it, so they still tell the race they were saved for).
    #[serde(default)]
    pub slurm_lanes: bool,
    /// lockstep lists Slurm's nodes through scontrol
    /// (`[slurm] nodes_through_scontrol`): a slurmrestd that does not answer
    /// fails the jobs' lane only, and the nodes' lane goes on showing
    /// what changes while lockstep says it lost sight of Slurm (the
    /// actuator still fails: its writes go through slurmrestd).
    #[serde(default)]
    pub nodes_through_scontrol: bool,
}

/// One thing that happens, `after_ms` after the previous step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// Delay after the previous step (virtual ms).
    pub after_ms: u64,
    /// What happens.
    pub op: Op,
}

/// Which pod: a set (0 = scaled, 1 = fixed) and an index into its pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    /// 0: the scaled set; 1: the fixed set.
    pub set: u8,
    /// Index (modulo the pods that exist, in name order).
    pub index: u8,
}

/// The object kinds a relist can be about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RelistKind {
    /// Kubernetes nodes.
    KubeNodes,
    /// slurmd pods.
    KubePods,
    /// Scale targets.
    KubeScaleTargets,
    /// Slurm nodes.
    SlurmNodes,
    /// Slurm jobs.
    SlurmJobs,
}

/// A change an administrator makes to lockstep's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyEdit {
    /// `health.unhealthy_taint` on <-> off.
    ToggleUnhealthyTaint,
    /// `drain.reason_prefix` "lockstep:" <-> "lockstep-v2:".
    RenameReasonPrefix,
    /// `drain.foreign_drain_condition` "SlurmNodeDrained" <-> "SlurmDrained".
    RenameDrainCondition,
    /// `health.slurm_health_condition` "SlurmNodeHealthy" <-> "SlurmHealthy".
    RenameHealthCondition,
    /// `health.node_conditions` ["GpuXid"] <-> ["GpuXidError"].
    RenameNodeCondition,
    /// Add or remove the `example.com/rack` -> `rack-` feature label.
    ToggleRackFeature,
    /// `scaling.busy_label` on <-> off.
    ToggleBusyLabel,
    /// `node_signals.slurm_nodes_annotation` on <-> off.
    ToggleSlurmNodesAnnotation,
}

/// What happens in a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// `kubectl cordon`.
    Cordon {
        /// Kubernetes node index.
        node: u8,
    },
    /// `kubectl uncordon`.
    Uncordon {
        /// Kubernetes node index.
        node: u8,
    },
    /// The kubelet reports NotReady (container runtime trouble) for a while;
    /// containers keep running.
    NodeNotReady {
        /// Kubernetes node index.
        node: u8,
        /// For how long.
        for_s: u16,
    },
    /// The host dies: kubelet and every container on it stop.
    HostDies {
        /// Kubernetes node index.
        node: u8,
    },
    /// A dead host boots again.
    HostBack {
        /// Kubernetes node index.
        node: u8,
    },
    /// The host is decommissioned and its Node object deleted.
    DeleteNode {
        /// Kubernetes node index.
        node: u8,
    },
    /// `kubectl delete pod --force --grace-period=0`.
    ForceDeletePod {
        /// Which pod.
        pod: PodRef,
    },
    /// The eviction API (`kubectl drain`), refused by the PDB for busy pods.
    EvictPod {
        /// Which pod.
        pod: PodRef,
    },
    /// A node-problem-detector condition (GPU XID) turns True for a while.
    XidError {
        /// Kubernetes node index.
        node: u8,
        /// For how long.
        for_s: u16,
    },
    /// A node label changes (zone or rack).
    Relabel {
        /// Kubernetes node index.
        node: u8,
        /// Rack instead of zone.
        rack: bool,
        /// New value index.
        value: u8,
    },
    /// A StatefulSet's template changes: the scaled set (OnDelete: lockstep
    /// replaces its pods) or the fixed one (RollingUpdate: the controller does).
    NewRevision {
        /// The fixed set instead of the scaled one.
        fixed: bool,
    },
    /// A stale copy of an earlier observation is appended again (JetStream
    /// re-publish after its deduplication window).
    Redeliver {
        /// Which earlier observation (modulo their number, from the end).
        back: u16,
    },
    /// A watch breaks and the connector lists again.
    Relist {
        /// What is listed.
        kind: RelistKind,
        /// The connector restarted: objects that disappeared get no Gone event.
        forget: bool,
    },
    /// `sbatch -N nodes` with a run time.
    SubmitJob {
        /// Into the fixed partition instead of the scaled one.
        fixed: bool,
        /// Nodes asked for.
        nodes: u8,
        /// Run time.
        run_s: u16,
    },
    /// `scontrol update nodename=N state=drain reason=...` by an administrator.
    AdminDrain {
        /// Which Slurm node (through its pod).
        pod: PodRef,
        /// Which reason text.
        reason: u8,
    },
    /// `scontrol update nodename=N state=resume` by an administrator.
    AdminResume {
        /// Which Slurm node (through its pod).
        pod: PodRef,
    },
    /// slurmd does not answer for a while (shorter than SlurmdTimeout).
    SlurmdBlip {
        /// Which Slurm node (through its pod).
        pod: PodRef,
        /// For how long.
        for_s: u16,
    },
    /// An administrator edits lockstep's policy.
    Policy {
        /// The edit.
        edit: PolicyEdit,
    },
    /// `scontrol update nodename=N reason=R` by an administrator on a node
    /// that is drained or DOWN: the reason is theirs from then on (Slurm
    /// reports them as the reason's user), whoever set the drain.
    AdminRewriteReason {
        /// Which Slurm node (through its pod).
        pod: PodRef,
        /// Which reason text.
        reason: u8,
    },
    /// slurmrestd does not answer for a while (restarted, overloaded, its
    /// host rebooting): lockstep neither sees Slurm nor reaches it.
    /// slurmctld, scontrol and Slinky's hooks go on.
    SlurmrestdDown {
        /// For how long.
        for_s: u16,
    },
}

/// A whole schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// The cluster at the start.
    pub setup: Setup,
    /// What happens, in order.
    pub steps: Vec<Step>,
}

/// Reasons administrators give. The last looks like lockstep's own on
/// purpose: ownership must not be decided by the reason text alone.
pub const ADMIN_REASONS: &[&str] = &[
    "bad dimm",
    "maintenance",
    "lockstep: manual hold",
    "netops: link flap",
];

/// The administrator's user name in Slurm.
pub const ADMIN_USER: &str = "root";
/// lockstep's user name in Slurm.
pub const LOCKSTEP_USER: &str = "lockstep";
/// slurmctld's own user (SlurmUser) for the reasons it sets; also the user
/// Slinky's slurm-operator talks to slurmrestd as.
pub const SLURM_USER: &str = "slurm";
/// The prefix of every reason Slinky's slurm-operator sets.
pub const SLINKY_PREFIX: &str = "slurm-operator: ";

/// The policy edits applied so far, as a state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyState {
    /// Toggled edits, one bit each (index = edit).
    pub toggled: [bool; 8],
}

impl PolicyEdit {
    const fn index(self) -> usize {
        match self {
            Self::ToggleUnhealthyTaint => 0,
            Self::RenameReasonPrefix => 1,
            Self::RenameDrainCondition => 2,
            Self::RenameHealthCondition => 3,
            Self::RenameNodeCondition => 4,
            Self::ToggleRackFeature => 5,
            Self::ToggleBusyLabel => 6,
            Self::ToggleSlurmNodesAnnotation => 7,
        }
    }
}

impl PolicyState {
    /// Applies one edit.
    pub fn apply(&mut self, edit: PolicyEdit) {
        let i = edit.index();
        self.toggled[i] = !self.toggled[i];
    }

    fn on(&self, edit: PolicyEdit) -> bool {
        self.toggled[edit.index()]
    }
}

/// The scaled target's reference.
pub fn scaled_target(setup: &Setup) -> ScaleTargetRef {
    ScaleTargetRef {
        group: "apps".to_owned(),
        kind: match setup.scaled_kind {
            ScaledKind::OrderedReady | ScaledKind::Parallel => "StatefulSet",
            ScaledKind::ReplicaSet => "ReplicaSet",
        }
        .to_owned(),
        namespace: NAMESPACE.to_owned(),
        name: SCALED_SET.to_owned(),
    }
}

/// The fixed set's reference.
pub fn fixed_target() -> ScaleTargetRef {
    ScaleTargetRef {
        group: "apps".to_owned(),
        kind: "StatefulSet".to_owned(),
        namespace: NAMESPACE.to_owned(),
        name: FIXED_SET.to_owned(),
    }
}

/// The policy in force for a setup after some edits. Timers are shorter
/// than the defaults so that a schedule covers many cycles in little log
/// time; their relations (grace < hold, cooldowns, idle time) are kept.
pub fn policy_for(setup: &Setup, edits: PolicyState) -> Policy {
    let mut p = Policy::default();
    // Configured as a deployment should be: Slurm names who set a reason,
    // so an administrator's drain written with lockstep's prefix is theirs.
    p.drain.slurm_user = Some(LOCKSTEP_USER.to_owned());
    p.drain.reason_prefix = if edits.on(PolicyEdit::RenameReasonPrefix) {
        "lockstep-v2:"
    } else {
        "lockstep:"
    }
    .to_owned();
    p.drain.foreign_drain_condition = if edits.on(PolicyEdit::RenameDrainCondition) {
        "SlurmDrained"
    } else {
        "SlurmNodeDrained"
    }
    .to_owned();
    p.health.slurm_health_condition = if edits.on(PolicyEdit::RenameHealthCondition) {
        "SlurmHealthy"
    } else {
        "SlurmNodeHealthy"
    }
    .to_owned();
    p.health.node_conditions = vec![if edits.on(PolicyEdit::RenameNodeCondition) {
        "GpuXidError".to_owned()
    } else {
        XID_CONDITION.to_owned()
    }];
    p.health.not_ready_grace_s = 20;
    p.health.resume_after_s = 10;
    p.health.flaps_max = 3;
    p.health.flap_window_s = 600;
    p.health.flap_hold_s = 120;
    p.health.unhealthy_taint =
        (setup.unhealthy_taint != edits.on(PolicyEdit::ToggleUnhealthyTaint)).then(|| TaintSpec {
            key: UNHEALTHY_TAINT.to_owned(),
            value: String::new(),
            effect: lockstep_schemas::TaintEffect::NoSchedule,
        });
    p.actions.timeout_s = 20;
    p.actions.retry_backoff_initial_s = 2;
    p.actions.retry_backoff_max_s = 30;
    if setup.zone_feature {
        p.topology.features.push(LabelFeature {
            label: ZONE_LABEL.to_owned(),
            prefix: "zone-".to_owned(),
        });
    }
    if edits.on(PolicyEdit::ToggleRackFeature) {
        p.topology.features.push(LabelFeature {
            label: RACK_LABEL.to_owned(),
            prefix: "rack-".to_owned(),
        });
    }
    if setup.busy_label != edits.on(PolicyEdit::ToggleBusyLabel) {
        p.scaling.busy_label = BUSY_LABEL.to_owned();
    }
    if setup.slurm_nodes_annotation != edits.on(PolicyEdit::ToggleSlurmNodesAnnotation) {
        p.node_signals.slurm_nodes_annotation = SLURM_NODES_ANNOTATION.to_owned();
    }
    p.scaling.targets = vec![ScaleRule {
        target: scaled_target(setup),
        partition: SCALED_PARTITION.to_owned(),
        min_replicas: u32::from(setup.scaled_min),
        max_replicas: u32::from(setup.scaled_max),
        scale_up_cooldown_s: 10,
        scale_down_cooldown_s: 20,
        idle_before_scale_down_s: 30,
        max_unavailable: 1,
    }];
    p
}

/// Bounds of generated schedules.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Most steps in a schedule.
    pub steps_max: usize,
}

fn setup_strategy() -> impl Strategy<Value = Setup> {
    (
        3u8..=5,
        prop_oneof![
            4 => Just(ScaledKind::OrderedReady),
            3 => Just(ScaledKind::Parallel),
            1 => Just(ScaledKind::ReplicaSet),
        ],
        0u8..=2,
        1u8..=4,
        0u8..=3,
        1u8..=2,
        any::<[bool; 6]>(),
        any::<u64>(),
        prop_oneof![3 => Just(0u16), 1 => 30u16..=240],
        any::<bool>(),
    )
        .prop_map(
            |(
                kube_nodes,
                scaled_kind,
                min,
                extra,
                fixed,
                rts,
                flags,
                jitter_seed,
                image_pull_s,
                nodes_through_scontrol,
            )| Setup {
                kube_nodes,
                scaled_kind,
                scaled_min: min,
                scaled_max: min + extra,
                fixed_replicas: fixed,
                return_to_service: rts,
                busy_label: flags[0],
                unhealthy_taint: flags[1],
                zone_feature: flags[2],
                flaky_actuators: flags[3],
                jitter_seed,
                slinky: flags[4],
                image_pull_s,
                slurm_nodes_annotation: flags[5],
                slurm_lanes: true,
                nodes_through_scontrol,
            },
        )
}

fn pod_ref() -> impl Strategy<Value = PodRef> {
    (prop_oneof![3 => Just(0u8), 1 => Just(1u8)], any::<u8>())
        .prop_map(|(set, index)| PodRef { set, index })
}

fn policy_edit() -> impl Strategy<Value = PolicyEdit> {
    prop_oneof![
        Just(PolicyEdit::ToggleUnhealthyTaint),
        Just(PolicyEdit::RenameReasonPrefix),
        Just(PolicyEdit::RenameDrainCondition),
        Just(PolicyEdit::RenameHealthCondition),
        Just(PolicyEdit::RenameNodeCondition),
        Just(PolicyEdit::ToggleRackFeature),
        Just(PolicyEdit::ToggleBusyLabel),
        Just(PolicyEdit::ToggleSlurmNodesAnnotation),
    ]
}

fn relist_kind() -> impl Strategy<Value = RelistKind> {
    prop_oneof![
        Just(RelistKind::KubeNodes),
        Just(RelistKind::KubePods),
        Just(RelistKind::KubeScaleTargets),
        Just(RelistKind::SlurmNodes),
        Just(RelistKind::SlurmJobs),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let node = any::<u8>();
    prop_oneof![
        3 => node.prop_map(|node| Op::Cordon { node }),
        3 => node.prop_map(|node| Op::Uncordon { node }),
        2 => (node, 5u16..=400).prop_map(|(node, for_s)| Op::NodeNotReady { node, for_s }),
        1 => node.prop_map(|node| Op::HostDies { node }),
        2 => node.prop_map(|node| Op::HostBack { node }),
        1 => node.prop_map(|node| Op::DeleteNode { node }),
        2 => pod_ref().prop_map(|pod| Op::ForceDeletePod { pod }),
        2 => pod_ref().prop_map(|pod| Op::EvictPod { pod }),
        1 => (node, 5u16..=200).prop_map(|(node, for_s)| Op::XidError { node, for_s }),
        1 => (node, any::<bool>(), 0u8..3).prop_map(|(node, rack, value)| Op::Relabel { node, rack, value }),
        1 => any::<bool>().prop_map(|fixed| Op::NewRevision { fixed }),
        3 => any::<u16>().prop_map(|back| Op::Redeliver { back }),
        2 => (relist_kind(), any::<bool>()).prop_map(|(kind, forget)| Op::Relist { kind, forget }),
        8 => (prop_oneof![4 => Just(false), 1 => Just(true)], 1u8..=5, 10u16..=300)
            .prop_map(|(fixed, nodes, run_s)| Op::SubmitJob { fixed, nodes, run_s }),
        2 => (pod_ref(), 0u8..4).prop_map(|(pod, reason)| Op::AdminDrain { pod, reason }),
        2 => pod_ref().prop_map(|pod| Op::AdminResume { pod }),
        2 => (pod_ref(), 5u16..=45).prop_map(|(pod, for_s)| Op::SlurmdBlip { pod, for_s }),
        2 => policy_edit().prop_map(|edit| Op::Policy { edit }),
        2 => (pod_ref(), 0u8..4).prop_map(|(pod, reason)| Op::AdminRewriteReason { pod, reason }),
        1 => (5u16..=120).prop_map(|for_s| Op::SlurmrestdDown { for_s }),
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    (
        prop_oneof![
            1 => Just(0u64),
            4 => 100u64..5_000,
            4 => 5_000u64..60_000,
            2 => 60_000u64..240_000,
        ],
        op_strategy(),
    )
        .prop_map(|(after_ms, op)| Step { after_ms, op })
}

/// Random schedules of at most `bounds.steps_max` steps; shrinking removes
/// steps and simplifies each.
pub fn schedules(bounds: Bounds) -> impl Strategy<Value = Schedule> {
    (
        setup_strategy(),
        proptest::collection::vec(step_strategy(), 1..=bounds.steps_max.max(1)),
    )
        .prop_map(|(setup, steps)| Schedule { setup, steps })
}

impl Op {
    /// The step in words, for stories.
    pub fn describe(&self) -> String {
        let pod = |p: &PodRef| {
            format!(
                "{} pod #{}",
                if p.set == 0 { SCALED_SET } else { FIXED_SET },
                p.index
            )
        };
        match self {
            Self::Cordon { node } => format!("cordon node #{node}"),
            Self::Uncordon { node } => format!("uncordon node #{node}"),
            Self::NodeNotReady { node, for_s } => format!("node #{node} NotReady for {for_s} s"),
            Self::HostDies { node } => format!("host #{node} dies"),
            Self::HostBack { node } => format!("host #{node} boots again"),
            Self::DeleteNode { node } => format!("node #{node} decommissioned and deleted"),
            Self::ForceDeletePod { pod: p } => format!("force delete {}", pod(p)),
            Self::EvictPod { pod: p } => format!("evict {}", pod(p)),
            Self::XidError { node, for_s } => format!("GPU XID on node #{node} for {for_s} s"),
            Self::Relabel { node, rack, value } => format!(
                "relabel node #{node} {}={value}",
                if *rack { "rack" } else { "zone" }
            ),
            Self::NewRevision { fixed } => format!(
                "new revision of the {} StatefulSet",
                if *fixed { FIXED_SET } else { SCALED_SET }
            ),
            Self::Redeliver { back } => format!("re-deliver a stale observation (#{back})"),
            Self::Relist { kind, forget } => format!(
                "relist {kind:?}{}",
                if *forget {
                    " after a connector restart"
                } else {
                    ""
                }
            ),
            Self::SubmitJob {
                fixed,
                nodes,
                run_s,
            } => format!(
                "submit a {nodes}-node job of {run_s} s to {}",
                if *fixed {
                    FIXED_PARTITION
                } else {
                    SCALED_PARTITION
                }
            ),
            Self::AdminDrain { pod: p, reason } => format!(
                "admin drains the Slurm node of {} ({:?})",
                pod(p),
                ADMIN_REASONS[usize::from(*reason) % ADMIN_REASONS.len()]
            ),
            Self::AdminResume { pod: p } => format!("admin resumes the Slurm node of {}", pod(p)),
            Self::SlurmdBlip { pod: p, for_s } => {
                format!("slurmd of {} does not answer for {for_s} s", pod(p))
            }
            Self::Policy { edit } => format!("policy edit {edit:?}"),
            Self::AdminRewriteReason { pod: p, reason } => format!(
                "admin rewrites the reason of the Slurm node of {} ({:?})",
                pod(p),
                ADMIN_REASONS[usize::from(*reason) % ADMIN_REASONS.len()]
            ),
            Self::SlurmrestdDown { for_s } => format!("slurmrestd does not answer for {for_s} s"),
        }
    }
}

impl Schedule {
    /// The schedule in words, one step a line.
    pub fn story(&self) -> String {
        let s = &self.setup;
        let mut out = format!(
            "{} hosts; {} {:?} min {} max {}; {} fixed; RTS={}; busy label {}; unhealthy taint {}; zone feature {}; flaky actuators {}; Slinky {}; image pull {} s\n",
            s.kube_nodes,
            SCALED_SET,
            s.scaled_kind,
            s.scaled_min,
            s.scaled_max,
            s.fixed_replicas,
            s.return_to_service,
            s.busy_label,
            s.unhealthy_taint,
            s.zone_feature,
            s.flaky_actuators,
            s.slinky,
            s.image_pull_s
        );
        if s.slurm_nodes_annotation {
            out.insert_str(out.len() - 1, "; Slurm nodes annotated on their hosts");
        }
        if s.slurm_lanes {
            out.insert_str(out.len() - 1, "; Slurm jobs polled apart from nodes");
        }
        if s.nodes_through_scontrol {
            out.insert_str(out.len() - 1, "; nodes listed through scontrol");
        }
        let mut t = 0;
        for st in &self.steps {
            t += st.after_ms;
            out.push_str(&format!(
                "  +{:>7.1} s  {}\n",
                t as f64 / 1000.0,
                st.op.describe()
            ));
        }
        out
    }
}
