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
    /// Written by lockstep before scaling's rules had their own names: any
    /// scaling action or report. No longer issued; kept so that audit
    /// trails and logs of that time still read.
    Scaling,
    /// scaling: demand is above the replica count; scale up.
    ScaleUp,
    /// scaling: the replica count is lowered past drained victims.
    ScaleDown,
    /// scaling (`delete_pod`): a DRAINED victim's pod is deleted.
    DeletePod,
    /// scaling (`deletion_cost`): DRAINED victims carry the lowest
    /// deletion cost, no other pod does.
    DeletionCost,
    /// scaling: why scale-in stops short of the demand.
    ScaleInBlocked,
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
    /// node_signals: a Kubernetes node's annotation names the Slurm nodes on it.
    SlurmNodesAnnotation,
    /// health: the node came back as a different machine; lockstep's drain
    /// is lifted once `return_condition` is True there.
    ReturnGate,
    /// health: a DRA device on the node is tainted or reported unhealthy.
    DeviceFault,
    /// drain: an eviction of the slurmd pod is under way (lockstep answers it
    /// as its eviction responder).
    EvictionRequested,
    /// drain: lockstep reports its progress on the pod's eviction, and
    /// completes once the Slurm node is drained.
    EvictionResponse,
}

impl Rule {
    /// Every rule, in declaration order.
    pub const ALL: [Rule; 40] = [
        Self::Observed,
        Self::Gone,
        Self::Cordoned,
        Self::PodDeleting,
        Self::PodEvicted,
        Self::PodMissing,
        Self::Reapplied,
        Self::NotReady,
        Self::NodeCondition,
        Self::KubeNodeGone,
        Self::RateLimited,
        Self::CauseCleared,
        Self::ResumeDelayed,
        Self::FlapHold,
        Self::ForeignDrain,
        Self::SlurmUnhealthy,
        Self::SlurmInvisible,
        Self::GaveUp,
        Self::ScaleIn,
        Self::Replace,
        Self::Features,
        Self::Topology,
        Self::TopologyInvalid,
        Self::Busy,
        Self::Scaling,
        Self::ScaleUp,
        Self::ScaleDown,
        Self::DeletePod,
        Self::DeletionCost,
        Self::ScaleInBlocked,
        Self::Retired,
        Self::Maintenance,
        Self::Reserve,
        Self::Release,
        Self::DrainConditions,
        Self::SlurmNodesAnnotation,
        Self::ReturnGate,
        Self::DeviceFault,
        Self::EvictionRequested,
        Self::EvictionResponse,
    ];

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
            Self::ScaleUp => "scaling.up",
            Self::ScaleDown => "scaling.down",
            Self::DeletePod => "scaling.delete_pod",
            Self::DeletionCost => "scaling.deletion_cost",
            Self::ScaleInBlocked => "scaling.blocked",
            Self::Retired => "policy.retired",
            Self::Maintenance => "maintenance.window",
            Self::Reserve => "maintenance.reserve",
            Self::Release => "maintenance.release",
            Self::DrainConditions => "maintenance.drain_conditions",
            Self::SlurmNodesAnnotation => "node_signals.slurm_nodes",
            Self::ReturnGate => "health.return_gate",
            Self::DeviceFault => "health.device_fault",
            Self::EvictionRequested => "drain.eviction_requested",
            Self::EvictionResponse => "drain.eviction_response",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_rule_once_with_a_distinct_name() {
        // A rule missing from ALL fails to compile here.
        let index = |r: Rule| Rule::ALL.iter().position(|x| *x == r);
        for r in Rule::ALL {
            let covered = match r {
                Rule::Observed => index(Rule::Observed),
                Rule::Gone => index(Rule::Gone),
                Rule::Cordoned => index(Rule::Cordoned),
                Rule::PodDeleting => index(Rule::PodDeleting),
                Rule::PodEvicted => index(Rule::PodEvicted),
                Rule::PodMissing => index(Rule::PodMissing),
                Rule::Reapplied => index(Rule::Reapplied),
                Rule::NotReady => index(Rule::NotReady),
                Rule::NodeCondition => index(Rule::NodeCondition),
                Rule::KubeNodeGone => index(Rule::KubeNodeGone),
                Rule::RateLimited => index(Rule::RateLimited),
                Rule::CauseCleared => index(Rule::CauseCleared),
                Rule::ResumeDelayed => index(Rule::ResumeDelayed),
                Rule::FlapHold => index(Rule::FlapHold),
                Rule::ForeignDrain => index(Rule::ForeignDrain),
                Rule::SlurmUnhealthy => index(Rule::SlurmUnhealthy),
                Rule::SlurmInvisible => index(Rule::SlurmInvisible),
                Rule::GaveUp => index(Rule::GaveUp),
                Rule::ScaleIn => index(Rule::ScaleIn),
                Rule::Replace => index(Rule::Replace),
                Rule::Features => index(Rule::Features),
                Rule::Topology => index(Rule::Topology),
                Rule::TopologyInvalid => index(Rule::TopologyInvalid),
                Rule::Busy => index(Rule::Busy),
                Rule::Scaling => index(Rule::Scaling),
                Rule::ScaleUp => index(Rule::ScaleUp),
                Rule::ScaleDown => index(Rule::ScaleDown),
                Rule::DeletePod => index(Rule::DeletePod),
                Rule::DeletionCost => index(Rule::DeletionCost),
                Rule::ScaleInBlocked => index(Rule::ScaleInBlocked),
                Rule::Retired => index(Rule::Retired),
                Rule::Maintenance => index(Rule::Maintenance),
                Rule::Reserve => index(Rule::Reserve),
                Rule::Release => index(Rule::Release),
                Rule::DrainConditions => index(Rule::DrainConditions),
                Rule::SlurmNodesAnnotation => index(Rule::SlurmNodesAnnotation),
                Rule::ReturnGate => index(Rule::ReturnGate),
                Rule::DeviceFault => index(Rule::DeviceFault),
                Rule::EvictionRequested => index(Rule::EvictionRequested),
                Rule::EvictionResponse => index(Rule::EvictionResponse),
            };
            assert!(covered.is_some());
        }
        let mut names: Vec<&str> = Rule::ALL.iter().map(|r| r.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Rule::ALL.len());
    }
}
