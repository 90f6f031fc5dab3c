//! The observation vocabulary: what connectors, actuators and lockstep itself
//! put into the log.
//!
//! An observation carries only what the reducer reads, plus the object's own
//! version. Connectors strip everything else (heartbeat timestamps, managed
//! fields) and emit an object again only when what the reducer reads changed
//! (versions aside), and the reducer, which is level-triggered, does nothing
//! with an observation that says what it already holds. The version lets it
//! drop an observation older than the one it holds (a re-delivery after the
//! log's deduplication window).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A short string held inside the object (up to 24 bytes; longer ones on
/// the heap) and serialized as a string: node names, features, partitions
/// and job node lists, which observations carry by the thousand and the
/// reducer compares with the copy it holds.
pub use compact_str::CompactString as Text;

/// `format!` into a [`Text`].
pub use compact_str::format_compact as format_text;

use crate::action::{ActionId, ActionKind, Target};
use crate::open_enum::open_enum;
use crate::policy::Policy;

/// One thing that happened, as observed by a connector, an actuator or
/// lockstep itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// A Slurm node as slurmctld reports it now.
    SlurmNode(SlurmNode),
    /// A Slurm node is no longer in slurmctld's configuration.
    SlurmNodeGone {
        /// Slurm node name.
        name: String,
        /// The object's version at deletion (see [`SlurmNode::version`]); 0
        /// when the deletion was inferred from a full listing.
        #[serde(default, skip_serializing_if = "is_zero")]
        version: u64,
    },
    /// A Slurm job as slurmctld reports it now.
    SlurmJob(SlurmJob),
    /// A Slurm job left slurmctld's job table.
    SlurmJobGone {
        /// Slurm job id.
        job_id: u64,
        /// The object's version at deletion (see [`SlurmNode::version`]); 0
        /// when the deletion was inferred from a full listing.
        #[serde(default, skip_serializing_if = "is_zero")]
        version: u64,
    },
    /// A Slurm partition as slurmctld reports it now.
    SlurmPartition(SlurmPartition),
    /// A Slurm partition was removed.
    SlurmPartitionGone {
        /// Partition name.
        name: String,
        /// The object's version at deletion (see [`SlurmNode::version`]); 0
        /// when the deletion was inferred from a full listing.
        #[serde(default, skip_serializing_if = "is_zero")]
        version: u64,
    },
    /// A Kubernetes node, reduced to what lockstep reads.
    KubeNode(KubeNode),
    /// A Kubernetes node was deleted.
    KubeNodeGone {
        /// Kubernetes node name.
        name: String,
        /// The object's version at deletion (see [`SlurmNode::version`]); 0
        /// when the deletion was inferred from a full listing.
        #[serde(default, skip_serializing_if = "is_zero")]
        version: u64,
    },
    /// A Kubernetes pod (one that runs slurmd), reduced to what lockstep reads.
    KubePod(KubePod),
    /// A Kubernetes pod was deleted.
    KubePodGone {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// The object's version at deletion (see [`SlurmNode::version`]); 0
        /// when the deletion was inferred from a full listing.
        #[serde(default, skip_serializing_if = "is_zero")]
        version: u64,
    },
    /// A Kubernetes object with a scale subresource (StatefulSet, Slinky NodeSet, ...).
    KubeScaleTarget(KubeScaleTarget),
    /// A scale target was deleted.
    KubeScaleTargetGone {
        /// Which object.
        target: ScaleTargetRef,
        /// The object's version at deletion (see [`SlurmNode::version`]); 0
        /// when the deletion was inferred from a full listing.
        #[serde(default, skip_serializing_if = "is_zero")]
        version: u64,
    },
    /// A connector starts a full listing of one kind of object. Every object of
    /// that kind not observed between this marker and the matching
    /// [`Event::SyncDone`] is gone (kube-rs `watcher` `Init` / `InitDone`).
    SyncStarted {
        /// The kind of object being relisted.
        domain: Domain,
    },
    /// A full listing started by [`Event::SyncStarted`] is complete.
    SyncDone {
        /// The kind of object that was relisted.
        domain: Domain,
    },
    /// A connector lost or regained sight of its system. Lets the reducer tell
    /// "the node is down" from "lockstep cannot see".
    ConnectorStatus {
        /// Which connector.
        connector: Connector,
        /// Whether the connector currently sees its system.
        visible: bool,
        /// Human-readable detail (last error), for the audit trail only.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        detail: String,
    },
    /// Nothing happened; appended when the log is quiet so that log time moves.
    Tick,
    /// An actuator finished (or gave up on) an action.
    ActionOutcome(ActionOutcome),
    /// The policy in force changed.
    PolicyChanged(Box<Policy>),
}

impl Event {
    /// A static name for the event's kind, usable as a metric label.
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::SlurmNode(_) => "slurm_node",
            Self::SlurmNodeGone { .. } => "slurm_node_gone",
            Self::SlurmJob(_) => "slurm_job",
            Self::SlurmJobGone { .. } => "slurm_job_gone",
            Self::SlurmPartition(_) => "slurm_partition",
            Self::SlurmPartitionGone { .. } => "slurm_partition_gone",
            Self::KubeNode(_) => "kube_node",
            Self::KubeNodeGone { .. } => "kube_node_gone",
            Self::KubePod(_) => "kube_pod",
            Self::KubePodGone { .. } => "kube_pod_gone",
            Self::KubeScaleTarget(_) => "kube_scale_target",
            Self::KubeScaleTargetGone { .. } => "kube_scale_target_gone",
            Self::SyncStarted { .. } => "sync_started",
            Self::SyncDone { .. } => "sync_done",
            Self::ConnectorStatus { .. } => "connector_status",
            Self::Tick => "tick",
            Self::ActionOutcome(_) => "action_outcome",
            Self::PolicyChanged(_) => "policy_changed",
        }
    }
}

impl Event {
    /// A one-line human-readable summary, for timelines; ends with the
    /// object's version when it has one.
    pub fn summary(&self) -> String {
        let mut s = self.summary_unversioned();
        let v = self.version();
        if v != 0 {
            s.push_str(&format!(" (v{v})"));
        }
        s
    }

    fn summary_unversioned(&self) -> String {
        fn flags(n: &SlurmNode) -> String {
            let mut s = n.state.to_string();
            for f in &n.flags {
                s.push('+');
                s.push_str(f.as_str());
            }
            s
        }
        match self {
            Self::SlurmNode(n) => {
                let mut s = format!("slurm node {} {}", n.name, flags(n));
                if let Some(r) = &n.reason {
                    s.push_str(&format!(" reason={r:?}"));
                    if let Some(u) = &n.reason_user {
                        s.push_str(&format!(" by {u}"));
                    }
                }
                s
            }
            Self::SlurmNodeGone { name, .. } => format!("slurm node {name} gone"),
            Self::SlurmJob(j) => format!(
                "slurm job {} {} on [{}]",
                j.job_id,
                j.state,
                j.nodes.join(",")
            ),
            Self::SlurmJobGone { job_id, .. } => format!("slurm job {job_id} gone"),
            Self::SlurmPartition(p) => {
                format!("slurm partition {} ({} nodes)", p.name, p.nodes.len())
            }
            Self::SlurmPartitionGone { name, .. } => format!("slurm partition {name} gone"),
            Self::KubeNode(n) => {
                let mut s = format!("kubernetes node {} Ready={:?}", n.name, n.ready);
                if n.unschedulable {
                    s.push_str(" cordoned");
                }
                for c in &n.conditions {
                    s.push_str(&format!(" {}={:?}", c.type_, c.status));
                }
                for t in &n.taints {
                    s.push_str(&format!(" taint {}:{:?}", t.key, t.effect));
                }
                let id = &n.identity;
                for (what, value) in [
                    ("uid", &id.uid),
                    ("boot", &id.boot_id),
                    ("provider", &id.provider_id),
                ] {
                    if !value.is_empty() {
                        s.push_str(&format!(" {what} {value}"));
                    }
                }
                for f in &n.devices.faults {
                    s.push_str(&format!(" device {f}"));
                }
                s
            }
            Self::KubeNodeGone { name, .. } => format!("kubernetes node {name} gone"),
            Self::KubePod(p) => {
                let mut s = format!(
                    "pod {}/{} {:?} on {}",
                    p.namespace,
                    p.name,
                    p.phase,
                    p.node_name.as_deref().unwrap_or("(unscheduled)")
                );
                if p.phase == PodPhase::Running && !p.ready {
                    s.push_str(" not-ready");
                }
                if p.deleting {
                    s.push_str(" deleting");
                }
                if p.disruption_target {
                    s.push_str(" evicted");
                }
                for c in &p.conditions {
                    s.push_str(&format!(" {}={:?}", c.type_, c.status));
                }
                for d in &p.unhealthy_devices {
                    s.push_str(&format!(" device {d} unhealthy"));
                }
                s
            }
            Self::KubePodGone {
                namespace, name, ..
            } => format!("pod {namespace}/{name} gone"),
            Self::KubeScaleTarget(t) => {
                format!("scale target {} replicas={}", t.target, t.replicas)
            }
            Self::KubeScaleTargetGone { target, .. } => format!("scale target {target} gone"),
            Self::SyncStarted { domain } => format!("full listing of {} started", domain.name()),
            Self::SyncDone { domain } => format!("full listing of {} done", domain.name()),
            Self::ConnectorStatus {
                connector,
                visible,
                detail,
            } => format!(
                "{connector:?} connector {}{}",
                if *visible {
                    "sees its system again"
                } else {
                    "lost sight of its system"
                },
                if detail.is_empty() {
                    String::new()
                } else {
                    format!(": {detail}")
                }
            ),
            Self::Tick => "tick".to_owned(),
            Self::ActionOutcome(o) => {
                let r = match &o.result {
                    OutcomeResult::Succeeded => "succeeded".to_owned(),
                    OutcomeResult::AlreadyDone => "already done".to_owned(),
                    OutcomeResult::Declined { held_by } => {
                        format!("declined: held by someone else: {held_by}")
                    }
                    OutcomeResult::Failed { retryable, error } => format!(
                        "failed ({}): {error}",
                        if *retryable { "retryable" } else { "final" }
                    ),
                };
                format!("outcome of {}: {r}", o.action_id)
            }
            Self::PolicyChanged(_) => "policy changed".to_owned(),
        }
    }
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if signature
fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if signature
fn is_false(v: &bool) -> bool {
    !*v
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if signature
fn is_true(v: &bool) -> bool {
    *v
}

const fn yes() -> bool {
    true
}

/// Equality of what an observation says, its version aside: a relist that
/// only bumps versions is the same observation; and assignment that reuses
/// the held buffers. Destructures every field, so a field added later
/// cannot be forgotten here. The fields in brackets are the object's key;
/// the others are compared in the order given, cheapest first.
macro_rules! same_but_version {
    ($ty:ident [$($key:ident),*] { $($field:ident),* $(,)? }) => {
        impl $ty {
            /// Equal in everything but `version`.
            pub fn same_but_version(&self, other: &Self) -> bool {
                $(self.$key == other.$key &&)* self.same_but_key_and_version(other)
            }

            /// Equal in everything but `version` and the key: what two
            /// observations of one object (found by its key) say is the
            /// same. The key is not read, which a table of held copies
            /// would mostly find out of cache.
            pub fn same_but_key_and_version(&self, other: &Self) -> bool {
                let $ty { version: _, $($key: _,)* $($field),* } = self;
                $(*$field == other.$field)&&*
            }

            /// `self.clone_from(other)` field by field, for another
            /// observation of the same object (found by its key): the
            /// derived `clone_from` clones the whole object anew, while an
            /// object observed again mostly differs in a field or two, so
            /// this reuses the buffers already held. The key, equal by
            /// construction, is not copied (nor read, as above).
            pub fn assign_from(&mut self, other: &Self) {
                let $ty { version, $($key,)* $($field),* } = other;
                $(debug_assert!(self.$key == *$key, "assign_from across keys");)*
                $(self.$field.clone_from($field);)*
                self.version = *version;
            }
        }
    };
}

same_but_version!(SlurmNode [name] {
    state,
    reason,
    reason_user,
    topology,
    flags,
    features,
    partitions
});
same_but_version!(SlurmJob [job_id] {
    state,
    node_count,
    pending_reason,
    partition,
    nodes
});
same_but_version!(SlurmPartition [name] { nodes });
same_but_version!(KubeNode [name] {
    unschedulable,
    ready,
    conditions,
    labels,
    taints,
    read_labels,
    maintenance,
    identity,
    devices
});
same_but_version!(KubePod [namespace, name] {
    uid,
    node_name,
    phase,
    ready,
    deleting,
    disruption_target,
    labels,
    conditions,
    owner,
    revision,
    eviction,
    unhealthy_devices
});
same_but_version!(KubeScaleTarget [target] {
    replicas,
    ready_replicas,
    update_revision
});

impl Event {
    /// The version of the object an observation or deletion is about; 0 for
    /// events that are not about one object, or when it is unknown.
    pub const fn version(&self) -> u64 {
        match self {
            Self::SlurmNode(o) => o.version,
            Self::SlurmJob(o) => o.version,
            Self::SlurmPartition(o) => o.version,
            Self::KubeNode(o) => o.version,
            Self::KubePod(o) => o.version,
            Self::KubeScaleTarget(o) => o.version,
            Self::SlurmNodeGone { version, .. }
            | Self::SlurmJobGone { version, .. }
            | Self::SlurmPartitionGone { version, .. }
            | Self::KubeNodeGone { version, .. }
            | Self::KubePodGone { version, .. }
            | Self::KubeScaleTargetGone { version, .. } => *version,
            Self::SyncStarted { .. }
            | Self::SyncDone { .. }
            | Self::ConnectorStatus { .. }
            | Self::Tick
            | Self::ActionOutcome(_)
            | Self::PolicyChanged(_) => 0,
        }
    }
}

/// The kinds of object a connector lists in full.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Domain {
    /// Slurm nodes.
    SlurmNodes,
    /// Slurm jobs.
    SlurmJobs,
    /// Slurm partitions.
    SlurmPartitions,
    /// Kubernetes nodes.
    KubeNodes,
    /// Kubernetes pods that run slurmd.
    KubePods,
    /// Kubernetes scale targets.
    KubeScaleTargets,
}

impl Domain {
    /// All domains, in a fixed order.
    pub const ALL: [Domain; 6] = [
        Domain::SlurmNodes,
        Domain::SlurmJobs,
        Domain::SlurmPartitions,
        Domain::KubeNodes,
        Domain::KubePods,
        Domain::KubeScaleTargets,
    ];

    /// A static name, usable as a metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Self::SlurmNodes => "slurm_nodes",
            Self::SlurmJobs => "slurm_jobs",
            Self::SlurmPartitions => "slurm_partitions",
            Self::KubeNodes => "kube_nodes",
            Self::KubePods => "kube_pods",
            Self::KubeScaleTargets => "kube_scale_targets",
        }
    }
}

/// The connectors whose visibility the reducer tracks.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Connector {
    /// The Slurm observer (slurmrestd or scontrol).
    Slurm,
    /// The Kubernetes watchers.
    Kubernetes,
}

impl Connector {
    /// Both connectors, in a fixed order.
    pub const ALL: [Connector; 2] = [Connector::Slurm, Connector::Kubernetes];

    /// A static name, usable as a metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Slurm => "slurm",
            Self::Kubernetes => "kubernetes",
        }
    }
}

open_enum! {
    /// Slurm's base node state (the part before the `+` in `scontrol show node`).
    pub enum SlurmBaseState {
        /// No jobs.
        Idle => "IDLE",
        /// Some CPUs allocated.
        Mixed => "MIXED",
        /// All CPUs allocated.
        Allocated => "ALLOCATED",
        /// Down.
        Down => "DOWN",
        /// Failed.
        Error => "ERROR",
        /// A power-saving node that does not exist yet.
        Future => "FUTURE",
        /// State not known to slurmctld.
        Unknown => "UNKNOWN",
    }
}

open_enum! {
    /// A Slurm node state flag (the parts after `+`).
    pub enum SlurmNodeFlag {
        /// Drain requested (DRAINING or DRAINED in sinfo).
        Drain => "DRAIN",
        /// Jobs on the node are completing.
        Completing => "COMPLETING",
        /// slurmd does not answer.
        NotResponding => "NOT_RESPONDING",
        /// FAIL: draining toward DOWN.
        Fail => "FAIL",
        /// Powered down by power saving.
        PoweredDown => "POWERED_DOWN",
        /// Powering up.
        PoweringUp => "POWERING_UP",
        /// Powering down.
        PoweringDown => "POWERING_DOWN",
        /// Reserved for maintenance.
        Maint => "MAINTENANCE",
        /// In a reservation.
        Reserved => "RESERVED",
        /// Registration failed (bad topology, memory, ...).
        InvalidReg => "INVALID_REG",
        /// The node is going to reboot.
        RebootRequested => "REBOOT_REQUESTED",
        /// Cloud node.
        Cloud => "CLOUD",
        /// Resumed, not yet registered.
        Resume => "RESUME",
    }
}

/// A Slurm node as the reducer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SlurmNode {
    /// Node name (the key of lockstep's node model).
    #[schemars(with = "String")]
    pub name: Text,
    /// Base state.
    pub state: SlurmBaseState,
    /// State flags, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<SlurmNodeFlag>,
    /// The reason set with the drain or down, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who set the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_user: Option<String>,
    /// Active features, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<String>")]
    pub features: Vec<Text>,
    /// Topology string (Slurm 23.11+ `topology=`), if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub topology: Option<Text>,
    /// Partitions the node is in, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<String>")]
    pub partitions: Vec<Text>,
    /// The object's own version: Kubernetes `metadata.resourceVersion` (an
    /// etcd revision), the Slurm observer's poll generation (poll time in ms,
    /// monotonic). 0: unknown, always applied. An observation older than the
    /// one the model holds changes nothing (a re-delivery after the log's
    /// deduplication window).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
}

impl SlurmNode {
    /// An IDLE node in no partition that reports nothing else (no
    /// version): what tests and tools start from, with
    /// `..SlurmNode::idle(name)`.
    pub fn idle(name: impl Into<Text>) -> Self {
        Self {
            name: name.into(),
            state: SlurmBaseState::Idle,
            flags: Vec::new(),
            reason: None,
            reason_user: None,
            features: Vec::new(),
            topology: None,
            partitions: Vec::new(),
            version: 0,
        }
    }

    /// Whether a flag is set.
    pub fn has(&self, flag: &SlurmNodeFlag) -> bool {
        self.flags.contains(flag)
    }

    /// Drained with exactly this reason: a drain with it is "already done".
    pub fn drained_with(&self, reason: &str) -> bool {
        self.has(&SlurmNodeFlag::Drain) && self.reason.as_deref() == Some(reason)
    }

    /// DOWN with exactly this reason: a down with it is "already done".
    pub fn down_with(&self, reason: &str) -> bool {
        self.state == SlurmBaseState::Down && self.reason.as_deref() == Some(reason)
    }
}

open_enum! {
    /// Slurm job state (base state, without flags).
    pub enum SlurmJobState {
        /// Waiting for resources.
        Pending => "PENDING",
        /// Running.
        Running => "RUNNING",
        /// Suspended.
        Suspended => "SUSPENDED",
        /// Ending.
        Completing => "COMPLETING",
        /// Finished successfully.
        Completed => "COMPLETED",
        /// Cancelled.
        Cancelled => "CANCELLED",
        /// Finished with an error.
        Failed => "FAILED",
        /// Ran out of time.
        Timeout => "TIMEOUT",
        /// Its node failed.
        NodeFail => "NODE_FAIL",
        /// Preempted.
        Preempted => "PREEMPTED",
        /// Out of memory.
        OutOfMemory => "OUT_OF_MEMORY",
        /// Reached its deadline.
        Deadline => "DEADLINE",
        /// Failed to launch.
        BootFail => "BOOT_FAIL",
    }
}

impl SlurmJobState {
    /// Whether the job holds its nodes (running, suspended or completing).
    pub fn holds_nodes(&self) -> bool {
        matches!(self, Self::Running | Self::Suspended | Self::Completing)
    }
}

/// A Slurm job as the reducer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SlurmJob {
    /// Job id.
    pub job_id: u64,
    /// State.
    pub state: SlurmJobState,
    /// Partition the job was submitted to (the first, if several).
    #[serde(default, skip_serializing_if = "Text::is_empty")]
    #[schemars(with = "String")]
    pub partition: Text,
    /// Nodes the job holds (hostlist expanded by the connector), sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<String>")]
    pub nodes: Vec<Text>,
    /// Number of nodes requested.
    #[serde(default)]
    pub node_count: u32,
    /// Why the job is pending (Slurm's reason code, e.g. `Resources`, `Dependency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_reason: Option<String>,
    /// The object's own version: Kubernetes `metadata.resourceVersion` (an
    /// etcd revision), the Slurm observer's poll generation (poll time in ms,
    /// monotonic). 0: unknown, always applied. An observation older than the
    /// one the model holds changes nothing (a re-delivery after the log's
    /// deduplication window).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
}

/// A Slurm partition as the reducer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SlurmPartition {
    /// Partition name.
    pub name: String,
    /// Member nodes (expanded), sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// The object's own version: Kubernetes `metadata.resourceVersion` (an
    /// etcd revision), the Slurm observer's poll generation (poll time in ms,
    /// monotonic). 0: unknown, always applied. An observation older than the
    /// one the model holds changes nothing (a re-delivery after the log's
    /// deduplication window).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
}

/// Status of a Kubernetes condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Unknown (for Ready: the kubelet stopped reporting).
    Unknown,
}

/// A node condition lockstep was asked to watch (policy `health.node_conditions`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NodeCondition {
    /// Condition type, e.g. `GpuXidError`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Status.
    pub status: ConditionStatus,
    /// Reason, as set by whoever reports the condition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Message, reported only for the conditions lockstep writes with a
    /// message that changes (`node_signals.foreign_drain_condition`); empty
    /// for the others, whose messages (a health check's timestamps) would
    /// only make news of nothing.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Kubernetes taint effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TaintEffect {
    /// Do not schedule new pods.
    NoSchedule,
    /// Avoid scheduling new pods.
    PreferNoSchedule,
    /// Evict running pods.
    NoExecute,
}

/// A Kubernetes node taint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct Taint {
    /// Taint key.
    pub key: String,
    /// Taint value.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// Effect.
    pub effect: TaintEffect,
}

/// A Kubernetes node, reduced to what lockstep reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KubeNode {
    /// Node name.
    #[schemars(with = "String")]
    pub name: Text,
    /// `spec.unschedulable` (cordoned).
    #[serde(default)]
    pub unschedulable: bool,
    /// Status of the `Ready` condition.
    pub ready: ConditionStatus,
    /// The watched conditions named in the policy, sorted by type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<NodeCondition>,
    /// Labels and annotations named in the policy (annotations prefixed `annotation:`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Taints whose key lockstep manages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// The label and annotation keys the observer looked for, sorted, found
    /// or not: a key absent from `labels` but named here is known to be
    /// absent; a key named in neither was not looked at (the observer read
    /// under another policy). `None` in logs written before lockstep
    /// recorded it: every key the policy reads counts as looked at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_labels: Option<Vec<String>>,
    /// Maintenance announced for this node (see [`Maintenance`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<Maintenance>,
    /// Which machine the node is, reported while the policy gates a return
    /// to service on it (`health.return_condition`); empty otherwise and in
    /// logs written before.
    #[serde(default, skip_serializing_if = "NodeIdentity::is_empty")]
    pub identity: NodeIdentity,
    /// Its DRA devices that a device taint marks faulty (from its
    /// ResourceSlices and the DeviceTaintRules), read only under
    /// `health.device_faults`.
    #[serde(default, skip_serializing_if = "NodeDevices::is_empty")]
    pub devices: NodeDevices,
    /// The object's own version: Kubernetes `metadata.resourceVersion` (an
    /// etcd revision), the Slurm observer's poll generation (poll time in ms,
    /// monotonic). 0: unknown, always applied. An observation older than the
    /// one the model holds changes nothing (a re-delivery after the log's
    /// deduplication window).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
}

impl KubeNode {
    /// A Ready, schedulable node that reports nothing else (no version):
    /// what tests and tools start from, with `..KubeNode::ready(name)`.
    pub fn ready(name: impl Into<Text>) -> Self {
        Self {
            name: name.into(),
            unschedulable: false,
            ready: ConditionStatus::True,
            conditions: Vec::new(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            read_labels: None,
            maintenance: None,
            identity: NodeIdentity::default(),
            devices: NodeDevices::default(),
            version: 0,
        }
    }
}

/// Which machine a Kubernetes node is. An empty field is unknown (not
/// reported), never a change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NodeIdentity {
    /// `metadata.uid`: a Node deleted and registered again has a new one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// `status.nodeInfo.bootID`: new at every boot.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
    /// `spec.providerID`: the cloud's instance, new when the VM is replaced.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider_id: String,
}

impl NodeIdentity {
    /// Nothing reported.
    pub fn is_empty(&self) -> bool {
        self.uid.is_empty() && self.boot_id.is_empty() && self.provider_id.is_empty()
    }

    /// What says that `new` is another machine than `self`, if anything:
    /// a field both report and that differs (`reboot`: `bootID` counts).
    pub fn changed(&self, new: &Self, reboot: bool) -> Option<IdentityChange> {
        let differs = |a: &str, b: &str| !a.is_empty() && !b.is_empty() && a != b;
        if differs(&self.uid, &new.uid) {
            Some(IdentityChange::Uid)
        } else if differs(&self.provider_id, &new.provider_id) {
            Some(IdentityChange::ProviderId)
        } else if reboot && differs(&self.boot_id, &new.boot_id) {
            Some(IdentityChange::BootId)
        } else {
            None
        }
    }
}

/// The latest eviction of a pod (Kubernetes `lifecycle.k8s.io/v1alpha1`
/// Eviction), as lockstep's eviction responder sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PodEviction {
    /// The Eviction object's name (in the pod's namespace).
    pub name: String,
    /// lockstep's responder's state in it.
    pub state: ResponderState,
    /// lockstep reported it complete (its `completionTime` is set).
    #[serde(default, skip_serializing_if = "is_false")]
    pub completed: bool,
    /// The Eviction is over (`TargetEvicted` or `Failed` True: the pod is
    /// gone, or every requester withdrew, or no responder got it done):
    /// nothing is under way.
    #[serde(default, skip_serializing_if = "is_false")]
    pub over: bool,
    /// The Eviction's `resourceVersion`: it comes from another object than
    /// the pod, so it carries its own version.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
}

/// An eviction responder's state (`status.targetResponders[].state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ResponderState {
    /// Another responder goes first.
    Inactive,
    /// Its turn: it is to report progress, then complete.
    Active,
    /// It missed its heartbeat deadline; the next responder goes on.
    Interrupted,
    /// Every requester withdrew.
    Canceled,
    /// It completed; the next responder goes on.
    Completed,
    /// A state this build does not know.
    #[serde(other)]
    Unknown,
}

/// The DRA devices of a Kubernetes node that device taints mark faulty.
/// They come from other objects than the Node (its ResourceSlices, the
/// DeviceTaintRules), so they carry their own version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NodeDevices {
    /// One per tainted device and taint, sorted:
    /// `DRIVER/POOL/DEVICE KEY=VALUE:EFFECT`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<String>,
    /// The newest `resourceVersion` (an etcd revision, ordered across
    /// kinds) among the ResourceSlices and DeviceTaintRules when `faults`
    /// last changed; 0: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
}

impl NodeDevices {
    /// No fault, never one.
    pub fn is_empty(&self) -> bool {
        self.faults.is_empty() && self.version == 0
    }
}

/// What made a Kubernetes node another machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IdentityChange {
    /// The Node was deleted (and may register again).
    Deleted,
    /// A new `metadata.uid`: deleted and registered again.
    Uid,
    /// A new `spec.providerID`: the instance was replaced.
    ProviderId,
    /// A new `status.nodeInfo.bootID`: rebooted or reinstalled.
    BootId,
}

impl IdentityChange {
    /// For the audit trail.
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Deleted => "its Node was deleted",
            Self::Uid => "it registered as a new Node (new uid)",
            Self::ProviderId => "its instance was replaced (new providerID)",
            Self::BootId => "it booted again (new bootID)",
        }
    }

    /// A new Node object: whatever its conditions say is about the new
    /// machine. On the same object after a reboot, a condition may be left
    /// from before.
    pub const fn new_object(self) -> bool {
        matches!(self, Self::Deleted | Self::Uid)
    }
}

/// The node lifecycle condition (Kubernetes v1.37) saying a node is being
/// drained; lockstep sets it from its drain of the node's Slurm nodes.
pub const DRAIN_IN_PROGRESS: &str = "DrainInProgress";

/// The node lifecycle condition saying a node's drain is complete.
pub const DRAINED: &str = "Drained";

/// Prefix of a label key (in [`KubeNode::labels`], [`KubePod::labels`] and
/// the key of a `KubeLabelPod` action) that names an annotation instead of
/// a label: `annotation:<key>`.
pub const ANNOTATION_PREFIX: &str = "annotation:";

/// The pod deletion cost annotation as a label key: a ReplicaSet removes the
/// pods with the lowest `controller.kubernetes.io/pod-deletion-cost` first
/// (see `Removal::DeletionCost`).
pub const POD_DELETION_COST: &str = "annotation:controller.kubernetes.io/pod-deletion-cost";

/// Maintenance of a Kubernetes node, as announced by its node lifecycle
/// conditions (Kubernetes v1.37, feature gate `NodeLifecycleConditions`):
/// `MaintenancePlanned=True` with the window `START/END` (RFC 3339, END
/// optional) in its message, `MaintenanceInProgress=True`; or, on clusters
/// without the gate, by the annotation `lockstep.dev/maintenance-window`
/// (the same `START/END`), which wins over the message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Maintenance {
    /// The window as announced, normalised to `START/END` (`START/` with no
    /// end); empty when only `MaintenanceInProgress` announces it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub window: String,
    /// Start, ms since the epoch; 0: started already (no window known).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub start_ms: u64,
    /// End, ms since the epoch; `None`: until no longer announced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_ms: Option<u64>,
    /// `MaintenanceInProgress` is True.
    #[serde(default, skip_serializing_if = "is_false")]
    pub in_progress: bool,
}

/// Pod phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PodPhase {
    /// Accepted, not all containers running.
    Pending,
    /// Bound and running.
    Running,
    /// All containers terminated successfully.
    Succeeded,
    /// All containers terminated, at least one in failure.
    Failed,
    /// State could not be obtained.
    Unknown,
}

/// A pod condition, as observed or as lockstep wants it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PodCondition {
    /// Condition type, e.g. `SlurmNodeDrained`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Status.
    pub status: ConditionStatus,
    /// Machine-readable reason (CamelCase).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The controller that owns a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OwnerRef {
    /// Owner kind, e.g. `StatefulSet`.
    pub kind: String,
    /// Owner name.
    pub name: String,
}

/// A Kubernetes pod that runs slurmd, reduced to what lockstep reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KubePod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (the precondition of a delete).
    pub uid: String,
    /// The Kubernetes node it is bound to, if scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Phase.
    pub phase: PodPhase,
    /// The pod's `Ready` condition is True. Missing in logs written before
    /// the field existed: read as true there, so that "Running and Ready"
    /// ([`KubePod::running_and_ready`]) means "Running", as those versions
    /// decided, and the state they replay to is the same.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set.
    #[serde(default)]
    pub deleting: bool,
    /// The `DisruptionTarget` condition is True (evicted or preempted).
    #[serde(default)]
    pub disruption_target: bool,
    /// Labels named in the policy.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Conditions whose type lockstep manages, sorted by type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<PodCondition>,
    /// The controller that owns the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<OwnerRef>,
    /// Controller revision (`controller-revision-hash`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The latest eviction of it that lockstep answers as its eviction
    /// responder (`drain.eviction_responder`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<PodEviction>,
    /// The resources allocated to it that the kubelet reports Unhealthy
    /// (`status.containerStatuses[].allocatedResourcesStatus`, a DRA device
    /// by its resource ID), sorted; read only under `health.device_faults`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_devices: Vec<String>,
    /// The object's own version: Kubernetes `metadata.resourceVersion` (an
    /// etcd revision), the Slurm observer's poll generation (poll time in ms,
    /// monotonic). 0: unknown, always applied. An observation older than the
    /// one the model holds changes nothing (a re-delivery after the log's
    /// deduplication window).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
}

/// Names a scale target.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub struct ScaleTargetRef {
    /// API group, empty for the core group (`apps` for StatefulSet).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// Kind, e.g. `StatefulSet` or `NodeSet`.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for ScaleTargetRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.kind, self.namespace, self.name)
    }
}

/// A Kubernetes object with a scale subresource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KubeScaleTarget {
    /// Which object.
    pub target: ScaleTargetRef,
    /// `spec.replicas`.
    pub replicas: u32,
    /// `status.readyReplicas`.
    #[serde(default)]
    pub ready_replicas: u32,
    /// The revision new pods get (`status.updateRevision`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_revision: Option<String>,
    /// The object's own version: Kubernetes `metadata.resourceVersion` (an
    /// etcd revision), the Slurm observer's poll generation (poll time in ms,
    /// monotonic). 0: unknown, always applied. An observation older than the
    /// one the model holds changes nothing (a re-delivery after the log's
    /// deduplication window).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
}

impl KubePod {
    /// A Running, Ready pod bound to `node` that reports nothing else (no
    /// owner, no version): what tests and tools start from, with
    /// `..KubePod::running(namespace, name, node)`.
    pub fn running(namespace: &str, name: &str, node: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: String::new(),
            node_name: Some(node.to_owned()),
            phase: PodPhase::Running,
            ready: true,
            deleting: false,
            disruption_target: false,
            labels: BTreeMap::new(),
            conditions: Vec::new(),
            owner: None,
            revision: None,
            eviction: None,
            unhealthy_devices: Vec::new(),
            version: 0,
        }
    }

    /// Phase Running and the Ready condition True: the pod serves.
    pub fn running_and_ready(&self) -> bool {
        self.phase == PodPhase::Running && self.ready
    }
}

/// How an action ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeResult {
    /// The actuator changed the target.
    Succeeded,
    /// The target was already in the wanted state; nothing was changed.
    AlreadyDone,
    /// The actuator left the target as it was: someone else holds it (a
    /// drain or down of a Slurm node whose reason lockstep did not set), and
    /// lockstep never replaces or lifts what it does not own. Not retried:
    /// the reducer learns who holds the node from the next observation.
    Declined {
        /// Who holds the target and why, as the actuator read it, for the
        /// audit trail.
        held_by: String,
    },
    /// The action failed.
    Failed {
        /// Whether trying again may help (timeouts, conflicts, connection errors).
        retryable: bool,
        /// The error, for the audit trail.
        error: String,
    },
}

/// An actuator's report on one action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ActionOutcome {
    /// The action's id.
    pub action_id: ActionId,
    /// The action's kind.
    pub kind: ActionKind,
    /// The action's target.
    pub target: Target,
    /// What happened.
    pub result: OutcomeResult,
}
