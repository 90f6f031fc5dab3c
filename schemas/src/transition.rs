//! Transitions: the audit trail of every change in what lockstep thinks of a
//! Slurm node, each with the rule that decided it and the event that caused it.

use crate::EventId;
use serde::{Deserialize, Serialize};

/// Where a Slurm node stands, as lockstep sees the joined model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Slurm does not report this node.
    Unknown,
    /// In service: no drain, nothing wanted.
    InService,
    /// lockstep wants the node out (drain or down); Slurm does not show it yet.
    Draining,
    /// Out of service because lockstep wants it out, and Slurm shows it.
    Drained,
    /// lockstep's reason to drain is gone; its drain is still in Slurm
    /// (resume pending, delayed or held by flap damping).
    Resuming,
    /// Drained or downed by someone else; lockstep shows it and never undoes it.
    ForeignDrain,
    /// Slurm reports the node DOWN, NOT_RESPONDING or FAIL, not by lockstep's doing.
    SlurmUnhealthy,
}

impl Phase {
    /// A static name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::InService => "in_service",
            Self::Draining => "draining",
            Self::Drained => "drained",
            Self::Resuming => "resuming",
            Self::ForeignDrain => "foreign_drain",
            Self::SlurmUnhealthy => "slurm_unhealthy",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The rule that put a node in its phase. Each is a row of a policy table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// Slurm reports the node (first sight, or nothing to do).
    Observed,
    /// Slurm no longer reports the node.
    Gone,
    /// drain: the Kubernetes node is cordoned.
    Cordoned,
    /// drain: the pod is being deleted.
    PodDeleting,
    /// drain: the pod is evicted (DisruptionTarget).
    PodEvicted,
    /// drain: the pod is gone; its replacement is not running yet.
    PodMissing,
    /// drain: an owned drain was removed while its cause holds; re-applied.
    Reapplied,
    /// health: the Kubernetes node is NotReady past the grace period.
    NotReady,
    /// health: a configured node condition is True.
    NodeCondition,
    /// health: the Kubernetes node under the Slurm node was deleted; its
    /// host is gone until a node of that name is Ready again.
    KubeNodeGone,
    /// health: the cluster-wide drain rate bound defers this drain.
    RateLimited,
    /// The cause is gone; lockstep resumes its drain.
    CauseCleared,
    /// health: resume waits until the node has been healthy long enough.
    ResumeDelayed,
    /// health: the node flaps; it is held drained.
    FlapHold,
    /// drain: someone else drained or downed the node.
    ForeignDrain,
    /// health: Slurm reports the node unhealthy.
    SlurmUnhealthy,
    /// lockstep cannot see Slurm; it changes nothing until it can.
    SlurmInvisible,
    /// An action ran out of attempts or failed for good.
    GaveUp,
    /// scaling: the node was picked to be scaled in.
    ScaleIn,
    /// scaling: the node's pod is replaced by a new revision.
    Replace,
    /// topology: features follow the Kubernetes node's labels.
    Features,
    /// topology: the topology unit follows the Kubernetes node's label.
    Topology,
    /// topology: the unit label is missing or invalid; nothing goes to Slurm.
    TopologyInvalid,
    /// scaling: the busy label follows the node's jobs.
    Busy,
    /// scaling: replica count changes and pod deletions.
    Scaling,
    /// A taint, pod condition or label lockstep set under a name the policy
    /// no longer has is cleaned up.
    Retired,
    /// maintenance: the Kubernetes node's maintenance window runs.
    Maintenance,
    /// maintenance: a Slurm maintenance reservation ahead of the window.
    Reserve,
    /// maintenance: lockstep's reservation is removed (window over or cancelled).
    Release,
    /// maintenance: the node lifecycle conditions `DrainInProgress` and
    /// `Drained` follow lockstep's drain.
    DrainConditions,
}

impl Rule {
    /// A static name, `policy.rule`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Observed => "observe.slurm",
            Self::Gone => "observe.gone",
            Self::Cordoned => "drain.cordon",
            Self::PodDeleting => "drain.pod_deleting",
            Self::PodEvicted => "drain.pod_evicted",
            Self::PodMissing => "drain.pod_missing",
            Self::Reapplied => "drain.reapply",
            Self::NotReady => "health.not_ready",
            Self::NodeCondition => "health.node_condition",
            Self::KubeNodeGone => "health.kube_node_gone",
            Self::RateLimited => "health.rate_limited",
            Self::CauseCleared => "drain.cause_cleared",
            Self::ResumeDelayed => "health.resume_delay",
            Self::FlapHold => "health.flap_hold",
            Self::ForeignDrain => "drain.foreign",
            Self::SlurmUnhealthy => "health.slurm_unhealthy",
            Self::SlurmInvisible => "observe.slurm_invisible",
            Self::GaveUp => "actions.gave_up",
            Self::ScaleIn => "scaling.in",
            Self::Replace => "scaling.replace",
            Self::Features => "topology.features",
            Self::Topology => "topology.unit",
            Self::TopologyInvalid => "topology.invalid",
            Self::Busy => "scaling.busy",
            Self::Scaling => "scaling",
            Self::Retired => "policy.retired",
            Self::Maintenance => "maintenance.window",
            Self::Reserve => "maintenance.reserve",
            Self::Release => "maintenance.release",
            Self::DrainConditions => "maintenance.drain_conditions",
        }
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One change of a Slurm node's phase or of the rule behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// Sequence of the record whose application made the change.
    pub seq: u64,
    /// Log time of that record (ms).
    pub time_ms: u64,
    /// Slurm node.
    pub node: String,
    /// Phase before.
    pub from: Phase,
    /// Phase after.
    pub to: Phase,
    /// The rule that decided `to`.
    pub rule: Rule,
    /// The event behind the rule: the one that made its cause true (the
    /// cordon, the NotReady), not merely the tick on which a grace period ran out.
    pub cause: EventId,
    /// Human-readable explanation.
    pub detail: String,
}
