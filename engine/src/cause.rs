//! The nouns every policy raises: why lockstep wants a Slurm node out
//! ([`Cause`], one variant per policy that raises it), the phase of a node
//! and the rule behind it ([`Status`]), and the description of each rule
//! that the audit trail shows ([`Status::detail`]). A leaf: the policies
//! import it, it imports none of them.

use lockstep_schemas::{IdentityChange, Phase, Policy, Rule, SlurmNode};
use serde::{Deserialize, Serialize};

use crate::model::NodeView;

/// Rows 1-4: why the drain policy wants a Slurm node out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum DrainCause {
    Cordoned,
    PodDeleting,
    PodEvicted,
    PodMissing,
    /// An eviction of the pod lockstep answers as its eviction responder.
    EvictionRequested,
}

impl DrainCause {
    pub fn rule(self) -> Rule {
        match self {
            Self::Cordoned => Rule::Cordoned,
            Self::PodDeleting => Rule::PodDeleting,
            Self::PodEvicted => Rule::PodEvicted,
            Self::PodMissing => Rule::PodMissing,
            Self::EvictionRequested => Rule::EvictionRequested,
        }
    }

    /// The slurmd pod is being lost or is gone (rows 2-4).
    pub fn is_pod_loss(self) -> bool {
        matches!(
            self,
            Self::PodDeleting | Self::PodEvicted | Self::PodMissing
        )
    }

    fn describe(self, view: &NodeView<'_>) -> String {
        let pod = view.pod_key.unwrap_or("?");
        match self {
            Self::Cordoned => {
                let kube = view.kube_name.unwrap_or("?");
                format!("kubernetes node {kube} cordoned")
            }
            Self::PodDeleting => format!("pod {pod} being deleted"),
            Self::PodEvicted => format!("pod {pod} evicted"),
            Self::PodMissing => "slurmd pod gone, waiting for its replacement".to_owned(),
            Self::EvictionRequested => format!("pod {pod} eviction requested"),
        }
    }

    /// [`Self::describe`] without naming the pod or Kubernetes node.
    fn summary(self) -> &'static str {
        match self {
            Self::Cordoned => "kubernetes node cordoned",
            Self::PodDeleting => "pod being deleted",
            Self::PodEvicted => "pod evicted",
            Self::PodMissing => "slurmd pod gone, waiting for its replacement",
            Self::EvictionRequested => "pod eviction requested",
        }
    }
}

/// A reason lockstep wants a Slurm node out of service, as the policy that
/// raises it says it. The order of the cause table: drain, maintenance,
/// health, scaling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Cause {
    /// Rows 1-4 here.
    Drain(DrainCause),
    /// `maintenance` row 3: the Kubernetes node's window, as announced.
    Maintenance(String),
    /// `health` rows 4-6.
    Health(HealthCause),
    /// `scaling`: picked to be scaled in, or its pod replaced.
    Scaling(VictimKind),
}

impl Cause {
    pub fn rule(&self) -> Rule {
        match self {
            Self::Drain(d) => d.rule(),
            Self::Maintenance(_) => Rule::Maintenance,
            Self::Health(h) => h.rule(),
            Self::Scaling(VictimKind::ScaleIn) => Rule::ScaleIn,
            Self::Scaling(VictimKind::Replace) => Rule::Replace,
        }
    }

    /// The slurmd pod is being lost or is gone (rows 2-4).
    pub fn is_pod_loss(&self) -> bool {
        matches!(self, Self::Drain(d) if d.is_pod_loss())
    }

    /// Health causes are rate-bounded and damped; drain causes are operator
    /// intent and act at once.
    pub fn is_health(&self) -> bool {
        matches!(self, Self::Health(_))
    }

    /// Causes whose drain must say so in its reason, even when Slurm already
    /// shows a drain lockstep made for an earlier cause: whoever reads the
    /// reason of a node whose host is gone must not read "cordoned".
    pub fn names_itself(&self) -> bool {
        matches!(self, Self::Health(HealthCause::KubeNodeGone))
    }

    /// What to write after the reason prefix in Slurm: the description,
    /// or with `names` off (`drain.reason_names_nodes`) the same without
    /// the pod or Kubernetes node it names, so that every drain for one
    /// cause says the same and can be written together. Stable for a given
    /// cause, so an unchanged cause never rewrites the Slurm reason.
    pub fn reason(&self, view: &NodeView<'_>, names: bool) -> String {
        if names {
            return self.describe(view);
        }
        match self {
            Self::Drain(d) => d.summary().to_owned(),
            Self::Health(h) => h.summary(),
            Self::Scaling(VictimKind::Replace) => "pod replaced by a new revision".to_owned(),
            Self::Maintenance(_) | Self::Scaling(VictimKind::ScaleIn) => self.describe(view),
        }
    }

    /// What the cause is, as the audit trail says it.
    pub fn describe(&self, view: &NodeView<'_>) -> String {
        match self {
            Self::Drain(d) => d.describe(view),
            Self::Maintenance(window) => format!("maintenance {window}"),
            Self::Health(h) => h.describe(view.kube_name.unwrap_or("?")),
            Self::Scaling(VictimKind::ScaleIn) => "scale-in".to_owned(),
            Self::Scaling(VictimKind::Replace) => {
                let pod = view.pod_key.unwrap_or("?");
                format!("pod {pod} replaced by a new revision")
            }
        }
    }
}

/// Why a node is being taken out by scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum VictimKind {
    /// Scale-in: the pod goes and the replica count drops.
    ScaleIn,
    /// Rolling replacement: the pod goes and its controller recreates it at
    /// the new revision.
    Replace,
}

/// Rows 4-6: why the health policy wants a Slurm node out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum HealthCause {
    NotReady,
    NodeCondition(String),
    /// The Kubernetes node under it was deleted.
    KubeNodeGone,
    /// A DRA device: tainted on the Kubernetes node (`DRIVER/POOL/DEVICE
    /// KEY=VALUE:EFFECT`), or reported unhealthy to the pod (`ID unhealthy`).
    Device(String),
}

impl HealthCause {
    pub fn rule(&self) -> Rule {
        match self {
            Self::NotReady => Rule::NotReady,
            Self::NodeCondition(_) => Rule::NodeCondition,
            Self::KubeNodeGone => Rule::KubeNodeGone,
            Self::Device(_) => Rule::DeviceFault,
        }
    }

    /// What follows the reason prefix, for the Kubernetes node `kube`.
    pub fn describe(&self, kube: &str) -> String {
        match self {
            Self::NotReady => format!("kubernetes node {kube} not ready"),
            Self::NodeCondition(c) => format!("kubernetes node {kube} condition {c}"),
            Self::KubeNodeGone => format!("kubernetes node {kube} deleted"),
            Self::Device(d) => format!("kubernetes node {kube} device {d}"),
        }
    }

    /// [`Self::describe`] without naming the Kubernetes node.
    fn summary(&self) -> String {
        match self {
            Self::NotReady => "kubernetes node not ready".to_owned(),
            Self::NodeCondition(c) => format!("kubernetes node condition {c}"),
            Self::KubeNodeGone => "kubernetes node deleted".to_owned(),
            Self::Device(d) => format!("kubernetes node device {d}"),
        }
    }
}

/// The phase of a node and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Status {
    pub phase: Phase,
    pub rule: Rule,
    pub cause: Option<Cause>,
}

impl Default for Status {
    fn default() -> Self {
        Self {
            phase: Phase::Unknown,
            rule: Rule::Observed,
            cause: None,
        }
    }
}

impl Status {
    /// The human-readable explanation of the status: the rule's description
    /// of the node as it is. `flaps`: the node's health spells in the flap
    /// window.
    pub fn detail(
        &self,
        view: &NodeView<'_>,
        slurm: &SlurmNode,
        policy: &Policy,
        flaps: usize,
        returning: Option<IdentityChange>,
    ) -> String {
        let status = self;
        let cause = || {
            status
                .cause
                .as_ref()
                .map_or_else(String::new, |c| c.describe(view))
        };
        let slurm_state = || {
            let mut s = slurm.state.to_string();
            for f in &slurm.flags {
                s.push('+');
                s.push_str(f.as_str());
            }
            s
        };
        match status.rule {
            Rule::ScaleIn
            | Rule::Replace
            | Rule::Cordoned
            | Rule::PodDeleting
            | Rule::PodEvicted
            | Rule::PodMissing
            | Rule::EvictionRequested
            | Rule::NotReady
            | Rule::NodeCondition
            | Rule::KubeNodeGone
            | Rule::DeviceFault
            | Rule::Maintenance => match status.phase {
                Phase::Drained => format!("{}; slurm shows {}", cause(), slurm_state()),
                _ => cause(),
            },
            Rule::Reapplied => format!("{}; the drain was removed while its cause holds", cause()),
            Rule::RateLimited => format!(
                "{}; deferred: health drains are at the bound of {} per minute",
                cause(),
                policy.health.drains_per_minute_max
            ),
            Rule::CauseCleared => "cause cleared; resuming lockstep's drain".to_owned(),
            Rule::ResumeDelayed => format!(
                "cause cleared; resume once healthy for {}s",
                policy.health.resume_after_s
            ),
            Rule::ReturnGate => format!(
                "cause cleared; the kubernetes node is another machine ({}): resume once {} is True there",
                returning.map_or("changed", IdentityChange::describe),
                policy.health.return_condition
            ),
            Rule::FlapHold => format!(
                "cause cleared, but {flaps} health spells within {}s; held for {}s",
                policy.health.flap_window_s, policy.health.flap_hold_s
            ),
            Rule::ForeignDrain => format!(
                "drained by {}: {}",
                slurm.reason_user.as_deref().unwrap_or("someone else"),
                slurm.reason.as_deref().unwrap_or("(no reason)")
            ),
            Rule::SlurmUnhealthy => format!(
                "slurm reports {}{}",
                slurm_state(),
                slurm
                    .reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
            Rule::SlurmInvisible => {
                "lockstep cannot see slurm; no slurm actions until it can".to_owned()
            }
            Rule::Observed => format!("slurm shows {}", slurm_state()),
            Rule::Gone => "slurm no longer reports the node".to_owned(),
            Rule::GaveUp => "gave up".to_owned(),
            Rule::Features
            | Rule::Topology
            | Rule::TopologyInvalid
            | Rule::Busy
            | Rule::Scaling
            | Rule::ScaleUp
            | Rule::ScaleDown
            | Rule::DeletePod
            | Rule::DeletionCost
            | Rule::ScaleInBlocked
            | Rule::Retired
            | Rule::Reserve
            | Rule::Release
            | Rule::DrainConditions
            | Rule::SlurmNodesAnnotation
            | Rule::EvictionResponse => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_without_names_is_the_same_for_every_node_with_the_cause() {
        let causes = [
            Cause::Drain(DrainCause::Cordoned),
            Cause::Drain(DrainCause::PodDeleting),
            Cause::Drain(DrainCause::PodEvicted),
            Cause::Drain(DrainCause::PodMissing),
            Cause::Drain(DrainCause::EvictionRequested),
            Cause::Maintenance("2026-12-10T02:00Z/PT2H".into()),
            Cause::Health(HealthCause::NotReady),
            Cause::Health(HealthCause::NodeCondition("GpuXid".into())),
            Cause::Health(HealthCause::KubeNodeGone),
            Cause::Health(HealthCause::Device(
                "gpu.nvidia.com/pool/gpu-3 unhealthy".into(),
            )),
            Cause::Scaling(VictimKind::ScaleIn),
            Cause::Scaling(VictimKind::Replace),
        ];
        let view = |k: &'static str, p: &'static str| NodeView {
            pod_key: Some(p),
            kube_name: Some(k),
            ..NodeView::default()
        };
        let (a, b) = (view("k8s-17", "slurm/n17"), view("k8s-18", "slurm/n18"));
        for cause in &causes {
            let (ra, rb) = (cause.reason(&a, false), cause.reason(&b, false));
            assert_eq!(ra, rb, "{cause:?}");
            assert!(!ra.contains("17") && !ra.contains('?'), "{cause:?}: {ra}");
            // Named, the reason is the audit trail's description.
            assert_eq!(cause.reason(&a, true), cause.describe(&a));
        }
        assert_eq!(
            Cause::Drain(DrainCause::Cordoned).reason(&a, true),
            "kubernetes node k8s-17 cordoned"
        );
        assert_eq!(
            Cause::Drain(DrainCause::Cordoned).reason(&a, false),
            "kubernetes node cordoned"
        );
    }
}
