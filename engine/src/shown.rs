//! What lockstep shows in Kubernetes of what Slurm says: pod conditions, a
//! pod label and node taints (Slurm -> Kubernetes).
//!
//! | row | shows                                               | while                                                         | rule                     |
//! |-----|-----------------------------------------------------|---------------------------------------------------------------|--------------------------|
//! | 1   | pod condition `foreign_drain_condition` True        | somebody else drained or downed the pod's Slurm node          | `drain.foreign`          |
//! | 2   | pod condition `slurm_health_condition` False        | health damping shows the pod's Slurm node unhealthy (`health`) | `health.slurm_unhealthy` |
//! | 3   | pod label `busy_label` = `true`                     | the pod's Slurm node runs or finishes a job                   | `scaling.busy`           |
//! | 4   | node taint `unhealthy_taint`                        | a Slurm node on the Kubernetes node is shown unhealthy; one recovered and still held keeps a taint that is there, never puts one on | `health.slurm_unhealthy` |
//! | 5   | node taint `foreign_drain_taint`                    | a Slurm node on the Kubernetes node is drained by somebody else | `drain.foreign`        |
//! | 6   | a condition, label or taint lockstep set under a name the policy no longer has (`retired`) | condition: Unknown, reason [`NOT_MANAGED`]; label and taint: removed | `policy.retired` |
//!
//! Once a row no longer holds, what lockstep set is taken back: a
//! condition flips to its other status (False, or True for health), a label
//! or a taint is removed. Conditions are never removed: the actions set them.
//!
//! Every function here is pure: from what the model holds to the actions
//! wanted, `None` where Kubernetes already shows it. A want is listed also
//! when nothing is to be done but a slot for it exists (an action of it in
//! flight), so the slot learns that it is done.

use lockstep_schemas::{
    Action, ConditionStatus, PodCondition, Policy, Rule, SlurmNode, Taint, TaintSpec,
};

use crate::drain::{self, SlurmSide};
use crate::flights::AspectRef;
use crate::model::{KubeEntry, PodEntry};
use crate::retired::Retired;

/// The reason of a pod condition lockstep set under a type the policy no
/// longer names, once it is left: Unknown, no longer kept current.
pub(crate) const NOT_MANAGED: &str = "LockstepNotManaged";

/// One thing lockstep shows: what of the pod or node it is, the action it
/// needs (`None`: shown already) and the rule.
pub(crate) type Want<'a> = (AspectRef<'a>, Option<Action>, Rule);

/// Rows 1-3 and 6 for one pod: `unhealthy_shown` is the health damping's
/// verdict, `busy` whether its Slurm node runs or finishes a job (asked only
/// when the policy has a busy label), `holds` whether an action on an
/// aspect of the pod is not settled.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pod_wants<'a>(
    pod: &PodEntry,
    slurm: &SlurmNode,
    side: SlurmSide,
    unhealthy_shown: bool,
    busy: impl FnOnce() -> bool,
    policy: &'a Policy,
    retired: &'a Retired,
    holds: impl Fn(AspectRef<'_>) -> bool,
) -> Vec<Want<'a>> {
    let mut out = Vec::new();
    let set = |condition: PodCondition| Action::KubeSetPodCondition {
        namespace: pod.obs.namespace.clone(),
        pod: pod.obs.name.clone(),
        condition,
    };
    let label = |key: &str, value: Option<String>| Action::KubeLabelPod {
        namespace: pod.obs.namespace.clone(),
        pod: pod.obs.name.clone(),
        key: key.to_owned(),
        value,
    };
    let conditions = &pod.obs.conditions;
    // Row 1.
    let fd = policy.drain.foreign_drain_condition.as_str();
    if !fd.is_empty() {
        let wanted = side.foreign_drain().then(|| {
            (
                ConditionStatus::True,
                "SlurmDrain",
                slurm.reason.as_deref().unwrap_or(""),
            )
        });
        let want = condition_want(conditions, fd, wanted, "SlurmNotDrained");
        let aspect = AspectRef::Condition(fd);
        if want.is_some() || holds(aspect) {
            out.push((aspect, want.map(set), Rule::ForeignDrain));
        }
    }
    // Row 2.
    let hc = policy.health.slurm_health_condition.as_str();
    if !hc.is_empty() {
        // While shown after Slurm recovered (hysteresis, flap hold), the
        // condition keeps what it said.
        let kept = conditions
            .iter()
            .find(|c| c.type_ == hc && c.status == ConditionStatus::False)
            .map(|c| {
                (
                    ConditionStatus::False,
                    c.reason.as_str(),
                    c.message.as_str(),
                )
            });
        let wanted = match (unhealthy_shown, side.unhealthy) {
            (false, _) => None,
            (true, true) => Some((
                ConditionStatus::False,
                drain::unhealthy_reason(slurm),
                slurm.reason.as_deref().unwrap_or(""),
            )),
            // Held, not newly shown (a new pod of a node that recovered
            // meanwhile shows nothing).
            (true, false) => kept,
        };
        let want = condition_want_health(conditions, hc, wanted);
        let aspect = AspectRef::Condition(hc);
        if want.is_some() || holds(aspect) {
            out.push((aspect, want.map(set), Rule::SlurmUnhealthy));
        }
    }
    // Row 3.
    let busy_label = policy.scaling.busy_label.as_str();
    if !busy_label.is_empty() {
        let present = pod.obs.labels.get(busy_label).map(String::as_str);
        let value = match (busy(), present) {
            (true, Some("true")) | (false, None) => None,
            (true, _) => Some(Some("true".to_owned())),
            (false, Some(_)) => Some(None),
        };
        let aspect = AspectRef::Label(busy_label);
        if value.is_some() || holds(aspect) {
            let want = value.map(|value| label(busy_label, value));
            out.push((aspect, want, Rule::Busy));
        }
    }
    // Row 6. A condition cannot be removed (the actions set conditions), so
    // it says Unknown: lockstep no longer keeps it current.
    for ty in &retired.conditions {
        let want = conditions
            .iter()
            .find(|c| c.type_ == *ty)
            .filter(|c| !(c.status == ConditionStatus::Unknown && c.reason == NOT_MANAGED))
            .map(|_| {
                set(PodCondition {
                    type_: ty.clone(),
                    status: ConditionStatus::Unknown,
                    reason: NOT_MANAGED.to_owned(),
                    message: "lockstep no longer manages this condition".to_owned(),
                })
            });
        let aspect = AspectRef::Condition(ty);
        if want.is_some() || holds(aspect) {
            out.push((aspect, want, Rule::Retired));
        }
    }
    for retired_label in &retired.labels {
        let aspect = AspectRef::Label(retired_label);
        let want = pod
            .obs
            .labels
            .contains_key(retired_label)
            .then(|| label(retired_label, None));
        if want.is_some() || holds(aspect) {
            out.push((aspect, want, Rule::Retired));
        }
    }
    out
}

/// How the Slurm nodes on one Kubernetes node stand, for rows 4 and 5.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OnNode {
    /// One is shown unhealthy and still is.
    pub unhealthy: bool,
    /// One is shown unhealthy, has recovered and is held by the damping.
    pub held: bool,
    /// One is drained by somebody else.
    pub foreign: bool,
}

/// Rows 4-6 for one Kubernetes node; `holds` as for [`pod_wants`].
pub(crate) fn taint_wants<'a>(
    node: &KubeEntry,
    on: OnNode,
    policy: &'a Policy,
    retired: &'a Retired,
    holds: impl Fn(AspectRef<'_>) -> bool,
    out: &mut Vec<Want<'a>>,
) {
    let name = &node.obs.name;
    let taints = &node.obs.taints;
    let has_slot = |key: &str| holds(AspectRef::Taint(key));
    let mut unhealthy = on.unhealthy;
    if on.held && !unhealthy {
        let key = policy
            .health
            .unhealthy_taint
            .as_ref()
            .map(|t| t.key.as_str());
        unhealthy = taints.iter().any(|t| Some(t.key.as_str()) == key);
    }
    let rows: [(Option<&TaintSpec>, bool, Rule); 2] = [
        (
            policy.health.unhealthy_taint.as_ref(),
            unhealthy,
            Rule::SlurmUnhealthy,
        ),
        (
            policy.drain.foreign_drain_taint.as_ref(),
            on.foreign,
            Rule::ForeignDrain,
        ),
    ];
    // Row 6: taints lockstep set under keys the policy no longer has.
    for key in &retired.taints {
        if rows
            .iter()
            .any(|(s, _, _)| s.is_some_and(|s| s.key == *key))
        {
            continue;
        }
        let present = taints.iter().any(|t| t.key == *key);
        let want = present.then(|| Action::KubeUntaintNode {
            node: name.clone(),
            key: key.clone(),
        });
        if want.is_some() || has_slot(key) {
            out.push((AspectRef::Taint(key), want, Rule::Retired));
        }
    }
    for (spec, needed, rule) in rows {
        let Some(spec) = spec else { continue };
        let present = taints.iter().find(|t| t.key == spec.key);
        let want = match (needed, present) {
            (true, Some(t)) if t.value == spec.value && t.effect == spec.effect => None,
            (true, _) => Some(Action::KubeTaintNode {
                node: name.clone(),
                taint: Taint {
                    key: spec.key.clone(),
                    value: spec.value.clone(),
                    effect: spec.effect,
                },
            }),
            (false, Some(_)) => Some(Action::KubeUntaintNode {
                node: name.clone(),
                key: spec.key.clone(),
            }),
            (false, None) => None,
        };
        if want.is_some() || has_slot(&spec.key) {
            out.push((AspectRef::Taint(&spec.key), want, rule));
        }
    }
}

/// The condition lockstep wants on a pod, or `None` if the pod already shows
/// it. `wanted` is `(status, reason, message)` while the condition applies;
/// once it no longer does, a condition lockstep set is flipped to False with
/// `clear_reason`, and an absent one stays absent.
fn condition_want(
    observed: &[PodCondition],
    ty: &str,
    wanted: Option<(ConditionStatus, &str, &str)>,
    clear_reason: &str,
) -> Option<PodCondition> {
    let present = observed.iter().find(|c| c.type_ == ty);
    let (status, reason, message) = match (wanted, present) {
        (Some(w), _) => w,
        (None, Some(c)) if c.status == ConditionStatus::True => {
            (ConditionStatus::False, clear_reason, "")
        }
        (None, _) => return None,
    };
    shown_already(present, status, reason, message, ty)
}

/// Like [`condition_want`] for the health condition, whose healthy state is True.
fn condition_want_health(
    observed: &[PodCondition],
    ty: &str,
    wanted: Option<(ConditionStatus, &str, &str)>,
) -> Option<PodCondition> {
    let present = observed.iter().find(|c| c.type_ == ty);
    let (status, reason, message) = match (wanted, present) {
        (Some(w), _) => w,
        (None, Some(c)) if c.status != ConditionStatus::True => {
            (ConditionStatus::True, "SlurmHealthy", "")
        }
        (None, _) => return None,
    };
    shown_already(present, status, reason, message, ty)
}

/// The condition to set, or `None` when `present` already says it.
fn shown_already(
    present: Option<&PodCondition>,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    ty: &str,
) -> Option<PodCondition> {
    if present.is_some_and(|c| c.status == status && c.reason == reason && c.message == message) {
        return None;
    }
    Some(PodCondition {
        type_: ty.to_owned(),
        status,
        reason: reason.to_owned(),
        message: message.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(ty: &str, status: ConditionStatus, reason: &str) -> PodCondition {
        PodCondition {
            type_: ty.into(),
            status,
            reason: reason.into(),
            message: String::new(),
        }
    }

    use ConditionStatus::{False as F, True as T, Unknown as U};

    /// Rows 1 and 2 and their take-back, one case per line:
    /// (observed condition, wanted, want for the drain kind, for the health kind).
    #[test]
    fn condition_rows() {
        type Case = (
            Option<(ConditionStatus, &'static str)>,
            Option<(ConditionStatus, &'static str)>,
            Option<(ConditionStatus, &'static str)>,
            Option<(ConditionStatus, &'static str)>,
        );
        #[rustfmt::skip]
        let cases: &[Case] = &[
            // absent, not wanted: nothing (drain), nothing (health)
            (None, None, None, None),
            // absent, wanted: set it
            (None, Some((T, "SlurmDrain")), Some((T, "SlurmDrain")), Some((T, "SlurmDrain"))),
            // shown as wanted: nothing
            (Some((T, "SlurmDrain")), Some((T, "SlurmDrain")), None, None),
            // lockstep's True left over: drain flips it False, health keeps True
            (Some((T, "SlurmDrain")), None, Some((F, "SlurmNotDrained")), None),
            // health False left over: health flips it True
            (Some((F, "SlurmDown")), None, None, Some((T, "SlurmHealthy"))),
            // Unknown: health makes it True again
            (Some((U, "x")), None, None, Some((T, "SlurmHealthy"))),
        ];
        for (i, (observed, wanted, drain_kind, health_kind)) in cases.iter().enumerate() {
            let observed: Vec<PodCondition> =
                observed.iter().map(|(s, r)| cond("C", *s, r)).collect();
            let wanted = wanted.map(|(s, r)| (s, r, ""));
            let got = |c: Option<PodCondition>| c.map(|c| (c.status, c.reason));
            let owned = |w: &Option<(ConditionStatus, &str)>| w.map(|(s, r)| (s, r.to_owned()));
            assert_eq!(
                got(condition_want(&observed, "C", wanted, "SlurmNotDrained")),
                owned(drain_kind),
                "case {i}: drain kind"
            );
            assert_eq!(
                got(condition_want_health(&observed, "C", wanted)),
                owned(health_kind),
                "case {i}: health kind"
            );
        }
    }
}
