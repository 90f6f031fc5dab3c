//! What lockstep shows in Kubernetes of what Slurm says: pod conditions, a
//! pod label and node taints (Slurm -> Kubernetes).
//!
//! | row | shows                                               | while                                                         | rule                     |
//! |-----|-----------------------------------------------------|---------------------------------------------------------------|--------------------------|
//! | 1   | pod condition `foreign_drain_condition` True        | somebody else drained or downed the pod's Slurm node          | `drain.foreign`          |
//! | 2   | pod condition `slurm_health_condition` False        | health damping shows the pod's Slurm node unhealthy (`health`) | `health.slurm_unhealthy` |
//! | 3   | pod label `busy_label` = `true`                     | the pod's Slurm node runs or finishes a job                   | `scaling.busy`           |
//! | 4   | node taint `unhealthy_taint`                        | a Slurm node on the Kubernetes node is shown unhealthy, not by lockstep's doing (NOT_RESPONDING, FAIL, or DOWN under somebody else's reason); one recovered and still held keeps a taint that is there, never puts one on | `health.slurm_unhealthy` |
//! | 5   | node taint `foreign_drain_taint`                    | a Slurm node on the Kubernetes node is drained by somebody else | `drain.foreign`        |
//! | 6   | a condition, label, annotation or taint lockstep set on a pod or node under a name the policy no longer has (`retired`) | condition: Unknown, reason [`NOT_MANAGED`]; label, annotation and taint: removed | `policy.retired` |
//! | 7   | node condition `foreign_drain_condition` of `[node_signals]` True, each such Slurm node and its reason in the message | a Slurm node on the Kubernetes node is drained or down by somebody else, or DOWN, NOT_RESPONDING or FAIL by Slurm's own doing once health damping shows it | `drain.foreign` |
//! | 8   | node annotation `slurm_nodes_annotation` of `[node_signals]` = the Slurm nodes on it, sorted, comma-separated | Slurm reports a Slurm node on the Kubernetes node | `node_signals.slurm_nodes` |
//!
//! While Slurm cannot be seen, rows 4 and 5 keep a taint that is there and
//! never put one on: the Kubernetes node under a Slurm node may be another
//! one by now (its pod rescheduled meanwhile), and Slurm may have changed.
//!
//! Once a row no longer holds, what lockstep set is taken back: a
//! condition flips to its other status (False, or True for health), a label,
//! an annotation or a taint is removed. Conditions are never removed: the actions set them.
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
use crate::slot::{Flight, InFlight};

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
        let wanted = side.held_by_other().then(|| {
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
            .map(|_| set(not_managed(ty)));
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
    /// One was drained by somebody else when Slurm was last seen: keeps a
    /// taint that is there, never puts one on.
    pub foreign_held: bool,
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
    let present = |spec: Option<&TaintSpec>| {
        spec.is_some_and(|spec| taints.iter().any(|t| t.key == spec.key))
    };
    let unhealthy = on.unhealthy || (on.held && present(policy.health.unhealthy_taint.as_ref()));
    let foreign =
        on.foreign || (on.foreign_held && present(policy.drain.foreign_drain_taint.as_ref()));
    let rows: [(Option<&TaintSpec>, bool, Rule); 2] = [
        (
            policy.health.unhealthy_taint.as_ref(),
            unhealthy,
            Rule::SlurmUnhealthy,
        ),
        (
            policy.drain.foreign_drain_taint.as_ref(),
            foreign,
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
            node: name.to_string(),
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
                node: name.to_string(),
                taint: Taint {
                    key: spec.key.clone(),
                    value: spec.value.clone(),
                    effect: spec.effect,
                },
            }),
            (false, Some(_)) => Some(Action::KubeUntaintNode {
                node: name.to_string(),
                key: spec.key.clone(),
            }),
            (false, None) => None,
        };
        if want.is_some() || has_slot(&spec.key) {
            out.push((AspectRef::Taint(&spec.key), want, rule));
        }
    }
}

/// The longest message of the foreign drain node condition (row 7): a node
/// with many Slurm nodes drained by others names the first ones.
const FOREIGN_MESSAGE_MAX: usize = 1024;

/// Rows 7 and 8 for one Kubernetes node: `foreign` the Slurm nodes on it
/// drained or down by somebody else with their reasons, `slurm_nodes` every
/// Slurm node on it Slurm reports, both sorted by name; `annotation_key`
/// the annotation of row 8 as a label key (`annotation:<key>`, empty: row
/// off). `holds` as for [`pod_wants`].
pub(crate) fn signal_wants<'a>(
    node: &KubeEntry,
    foreign: &[(&str, &str)],
    slurm_nodes: &[String],
    policy: &'a Policy,
    annotation_key: &'a str,
    holds: impl Fn(AspectRef<'_>) -> bool,
    out: &mut Vec<Want<'a>>,
) {
    let name = &node.obs.name;
    // Row 7.
    let ty = policy.node_signals.foreign_drain_condition.as_str();
    if !ty.is_empty() {
        let present = node.obs.conditions.iter().find(|c| c.type_ == ty);
        let wanted = if foreign.is_empty() {
            // Taken back only where lockstep's True is shown.
            present
                .filter(|c| c.status == ConditionStatus::True)
                .map(|_| (ConditionStatus::False, "SlurmNotDrained", String::new()))
        } else {
            Some((
                ConditionStatus::True,
                "SlurmDrain",
                foreign_message(foreign),
            ))
        };
        let want = wanted
            .filter(|(status, reason, message)| {
                !present.is_some_and(|c| {
                    c.status == *status && c.reason == *reason && c.message == *message
                })
            })
            .map(|(status, reason, message)| Action::KubeSetNodeCondition {
                node: name.to_string(),
                condition: PodCondition {
                    type_: ty.to_owned(),
                    status,
                    reason: reason.to_owned(),
                    message,
                },
            });
        let aspect = AspectRef::Condition(ty);
        if want.is_some() || holds(aspect) {
            out.push((aspect, want, Rule::ForeignDrain));
        }
    }
    // Row 8.
    if !annotation_key.is_empty() {
        let value = (!slurm_nodes.is_empty()).then(|| slurm_nodes.join(","));
        let present = node.obs.labels.get(annotation_key);
        let want = (present != value.as_ref()).then(|| Action::KubeLabelNode {
            node: name.to_string(),
            key: annotation_key.to_owned(),
            value,
        });
        let aspect = AspectRef::Label(annotation_key);
        if want.is_some() || holds(aspect) {
            out.push((aspect, want, Rule::SlurmNodesAnnotation));
        }
    }
}

/// Row 6: what a condition lockstep set under a type the policy no longer
/// has says once left: Unknown, no longer kept current.
fn not_managed(ty: &str) -> PodCondition {
    PodCondition {
        type_: ty.to_owned(),
        status: ConditionStatus::Unknown,
        reason: NOT_MANAGED.to_owned(),
        message: "lockstep no longer manages this condition".to_owned(),
    }
}

/// Row 6 for node signals: the foreign drain condition lockstep set under
/// a type the policy no longer has says Unknown ([`NOT_MANAGED`]); the
/// annotation it set under a key the policy no longer has is removed.
///
/// The observer reads only what the policy in force names, so a write that
/// lands after the policy dropped its name is never seen. `slot` gives what
/// the aspect's slot holds: a write it sent that has ended (done, or failed,
/// which may be a timeout of a write that landed) counts as there, and a
/// taking back that has not succeeded yet is still wanted (retried as any
/// action), not dropped for want of anything seen.
pub(crate) fn retired_signal_wants<'a, 'f>(
    node: &KubeEntry,
    retired: &'a Retired,
    holds: impl Fn(AspectRef<'_>) -> bool,
    slot: impl Fn(AspectRef<'_>) -> Option<&'f InFlight>,
    out: &mut Vec<Want<'a>>,
) {
    let name = &node.obs.name;
    let managed = |status: ConditionStatus, reason: &str| {
        !(status == ConditionStatus::Unknown && reason == NOT_MANAGED)
    };
    // Whether what the slot holds wants the taking back although nothing is
    // seen: a write (`write`) that has ended, or a taking back that has not
    // succeeded.
    let wanted_by_slot = |c: &InFlight, write: bool| match c.flight {
        Flight::Sent => !write,
        Flight::Done { .. } => write,
        Flight::Failed { .. } | Flight::GaveUp { .. } => true,
    };
    for ty in &retired.node_conditions {
        let aspect = AspectRef::Condition(ty);
        let seen = node
            .obs
            .conditions
            .iter()
            .find(|c| c.type_ == *ty)
            .is_some_and(|c| managed(c.status, &c.reason));
        let by_slot = slot(aspect).is_some_and(|c| {
            let write = matches!(&c.action, Action::KubeSetNodeCondition { condition, .. } if managed(condition.status, &condition.reason));
            wanted_by_slot(c, write)
        });
        let want = (seen || by_slot).then(|| Action::KubeSetNodeCondition {
            node: name.to_string(),
            condition: not_managed(ty),
        });
        if want.is_some() || holds(aspect) {
            out.push((aspect, want, Rule::Retired));
        }
    }
    for key in &retired.node_labels {
        let aspect = AspectRef::Label(key);
        let seen = node.obs.labels.contains_key(key);
        let by_slot = slot(aspect).is_some_and(|c| {
            wanted_by_slot(
                c,
                matches!(&c.action, Action::KubeLabelNode { value: Some(_), .. }),
            )
        });
        let want = (seen || by_slot).then(|| Action::KubeLabelNode {
            node: name.to_string(),
            key: key.clone(),
            value: None,
        });
        if want.is_some() || holds(aspect) {
            out.push((aspect, want, Rule::Retired));
        }
    }
}

/// `n1: reason; n2: reason`, cut at [`FOREIGN_MESSAGE_MAX`] with how many
/// more there are.
fn foreign_message(foreign: &[(&str, &str)]) -> String {
    let mut message = String::new();
    for (i, (node, reason)) in foreign.iter().enumerate() {
        let part = if reason.is_empty() {
            (*node).to_owned()
        } else {
            format!("{node}: {reason}")
        };
        if !message.is_empty() && message.len() + part.len() + 2 > FOREIGN_MESSAGE_MAX {
            message.push_str(&format!("; and {} more", foreign.len() - i));
            break;
        }
        if !message.is_empty() {
            message.push_str("; ");
        }
        message.push_str(&part);
    }
    message
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
    use crate::flights::AspectRef;

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

    use lockstep_schemas::{
        KubeNode, KubePod, PodPhase, SlurmBaseState, SlurmNodeFlag, TaintEffect,
    };

    fn pod(conditions: &[(&str, ConditionStatus)], labels: &[(&str, &str)]) -> PodEntry {
        PodEntry {
            obs: KubePod {
                namespace: "slurm".into(),
                name: "n1".into(),
                uid: "u1".into(),
                node_name: Some("k1".into()),
                phase: PodPhase::Running,
                ready: true,
                deleting: false,
                disruption_target: false,
                labels: labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                conditions: conditions
                    .iter()
                    .map(|(t, st)| {
                        let reason = if *st == F { "SlurmDown" } else { "SlurmDrain" };
                        PodCondition {
                            message: "admin".into(),
                            ..cond(t, *st, reason)
                        }
                    })
                    .collect(),
                owner: None,
                revision: None,
                unhealthy_devices: Default::default(),
                eviction: Default::default(),
                version: 0,
            },
            gen: 0,
        }
    }

    fn slurm(state: SlurmBaseState, flags: &[SlurmNodeFlag]) -> SlurmNode {
        SlurmNode {
            name: "n1".into(),
            state,
            flags: flags.to_vec(),
            reason: Some("admin".into()),
            reason_user: Some("root".into()),
            features: vec![],
            topology: None,
            partitions: vec![],
            version: 0,
        }
    }

    fn policy() -> Policy {
        let mut p = Policy::default();
        p.drain.foreign_drain_condition = "SlurmNodeDrained".into();
        p.health.slurm_health_condition = "SlurmNodeHealthy".into();
        p.scaling.busy_label = "busy".into();
        p.drain.foreign_drain_taint = Some(TaintSpec {
            key: "foreign".into(),
            value: String::new(),
            effect: TaintEffect::NoSchedule,
        });
        p
    }

    /// What a want list says, compactly: `aspect=action kind` (or `-`).
    fn show(wants: &[Want<'_>]) -> Vec<String> {
        wants
            .iter()
            .map(|(a, w, r)| {
                let what = w.as_ref().map_or("-", |w| w.kind().name());
                format!("{a:?}={what} [{}]", r.name())
            })
            .collect()
    }

    /// Rows 1-3 and 6 on a pod, one case per line: (Slurm shows, pod shows,
    /// unhealthy shown, busy, retired, in flight) -> wants.
    #[test]
    fn pod_rows_table() {
        use lockstep_schemas::SlurmBaseState::{Down, Idle};
        use lockstep_schemas::SlurmNodeFlag::Drain;
        let drained = slurm(Idle, &[Drain]);
        let idle = slurm(Idle, &[]);
        let down = slurm(Down, &[]);
        let side = |n: &SlurmNode, owned: bool| SlurmSide {
            drained: n.has(&Drain),
            down: n.state == Down,
            owned,
            held: n.has(&Drain) && !owned,
            held_shown: n.has(&Drain) && !owned,
            unhealthy: n.state == Down && !owned,
            faulty: n.state == Down && !owned,
            unseen: false,
        };
        let fd = ("SlurmNodeDrained", T);
        let hc_false = ("SlurmNodeHealthy", F);
        let mut retired = Retired::default();
        retired.conditions.push("OldCondition".into());
        retired.labels.push("old-busy".into());
        let none = Retired::default();
        type Case<'a> = (
            &'a SlurmNode,
            bool,
            PodEntry,
            bool,
            bool,
            &'a Retired,
            Option<&'a str>,
            &'a [&'a str],
        );
        #[rustfmt::skip]
        let cases: Vec<Case<'_>> = vec![
            // row 1: somebody else's drain is shown, and taken back
            (&drained, false, pod(&[], &[]), false, false, &none, None,
                &["Condition(\"SlurmNodeDrained\")=kube_set_pod_condition [drain.foreign]"]),
            (&drained, false, pod(&[fd], &[]), false, false, &none, None, &[]),
            (&idle, false, pod(&[fd], &[]), false, false, &none, None,
                &["Condition(\"SlurmNodeDrained\")=kube_set_pod_condition [drain.foreign]"]),
            // lockstep's own drain is not foreign
            (&drained, true, pod(&[], &[]), false, false, &none, None, &[]),
            // row 2: shown unhealthy by the damping; back to healthy after
            (&down, false, pod(&[], &[]), true, false, &none, None,
                &["Condition(\"SlurmNodeHealthy\")=kube_set_pod_condition [health.slurm_unhealthy]"]),
            (&down, false, pod(&[], &[]), false, false, &none, None, &[]),
            (&idle, false, pod(&[hc_false], &[]), false, false, &none, None,
                &["Condition(\"SlurmNodeHealthy\")=kube_set_pod_condition [health.slurm_unhealthy]"]),
            // held: keeps what it says
            (&idle, false, pod(&[hc_false], &[]), true, false, &none, None, &[]),
            // row 3: the busy label follows the jobs
            (&idle, false, pod(&[], &[]), false, true, &none, None,
                &["Label(\"busy\")=kube_label_pod [scaling.busy]"]),
            (&idle, false, pod(&[], &[("busy", "true")]), false, true, &none, None, &[]),
            (&idle, false, pod(&[], &[("busy", "true")]), false, false, &none, None,
                &["Label(\"busy\")=kube_label_pod [scaling.busy]"]),
            // row 6: retired names are taken back
            (&idle, false, pod(&[("OldCondition", T)], &[("old-busy", "x")]), false, false, &retired, None,
                &["Condition(\"OldCondition\")=kube_set_pod_condition [policy.retired]",
                  "Label(\"old-busy\")=kube_label_pod [policy.retired]"]),
            // an action in flight: the want is listed with nothing to do
            (&idle, false, pod(&[], &[]), false, false, &none, Some("SlurmNodeDrained"),
                &["Condition(\"SlurmNodeDrained\")=- [drain.foreign]"]),
        ];
        let policy = policy();
        for (i, (node, owned, pod, shown, busy, retired, flying, want)) in cases.iter().enumerate()
        {
            let holds = |a: AspectRef<'_>| Some(a) == flying.map(AspectRef::Condition);
            let got = pod_wants(
                pod,
                node,
                side(node, *owned),
                *shown,
                || *busy,
                &policy,
                retired,
                holds,
            );
            assert_eq!(show(&got), *want, "case {i}");
        }
    }

    /// Rows 4-6 on a Kubernetes node, one case per line: (Slurm nodes on it,
    /// taints it has, retired taint keys) -> wants.
    #[test]
    fn taint_rows_table() {
        let node = |taints: &[&str]| {
            KubeEntry::of(KubeNode {
                taints: taints
                    .iter()
                    .map(|k| lockstep_schemas::Taint {
                        key: (*k).to_owned(),
                        value: String::new(),
                        effect: TaintEffect::NoSchedule,
                    })
                    .collect(),
                ..KubeNode::ready("k1")
            })
        };
        let on = |unhealthy, held, foreign| OnNode {
            unhealthy,
            held,
            foreign,
            foreign_held: false,
        };
        let foreign_held = OnNode {
            foreign_held: true,
            ..on(false, false, false)
        };
        let policy = policy();
        let unhealthy_key = policy
            .health
            .unhealthy_taint
            .as_ref()
            .expect("default")
            .key
            .clone();
        let uk = unhealthy_key.as_str();
        let mut retired = Retired::default();
        retired.taints.push("old".into());
        let none = Retired::default();
        let taint_want = format!("Taint({uk:?})=kube_taint_node [health.slurm_unhealthy]");
        let untaint_want = format!("Taint({uk:?})=kube_untaint_node [health.slurm_unhealthy]");
        #[rustfmt::skip]
        let cases: Vec<(OnNode, Vec<&str>, &Retired, Vec<&str>)> = vec![
            // row 4: shown unhealthy puts the taint on; healthy takes it off
            (on(true, false, false), vec![], &none, vec![&taint_want]),
            (on(true, false, false), vec![uk], &none, vec![]),
            (on(false, false, false), vec![uk], &none, vec![&untaint_want]),
            // held: keeps a taint that is there, never puts one on
            (on(false, true, false), vec![uk], &none, vec![]),
            (on(false, true, false), vec![], &none, vec![]),
            // row 5: somebody else's drain
            (on(false, false, true), vec![], &none, vec!["Taint(\"foreign\")=kube_taint_node [drain.foreign]"]),
            (on(false, false, false), vec!["foreign"], &none, vec!["Taint(\"foreign\")=kube_untaint_node [drain.foreign]"]),
            // as last seen, Slurm out of sight: keeps it, never puts it on
            (foreign_held, vec!["foreign"], &none, vec![]),
            (foreign_held, vec![], &none, vec![]),
            // row 6: a retired key is removed
            (on(false, false, false), vec!["old"], &retired, vec!["Taint(\"old\")=kube_untaint_node [policy.retired]"]),
        ];
        for (i, (on, taints, retired, want)) in cases.iter().enumerate() {
            let mut got = Vec::new();
            taint_wants(&node(taints), *on, &policy, retired, |_| false, &mut got);
            assert_eq!(show(&got), *want, "case {i}");
        }
    }

    /// Rows 7 and 8 on a Kubernetes node, one case per line: (Slurm nodes
    /// drained by others with their reasons, Slurm nodes on it, the foreign
    /// condition it shows as (status, reason, message), its annotation, the
    /// condition's slot busy) -> the condition and annotation written.
    #[test]
    fn signal_rows_table() {
        use lockstep_schemas::NodeCondition;
        const KEY: &str = "annotation:lockstep.dev/slurm-nodes";
        let key = KEY;
        use ConditionStatus::{False as F, True as T};
        type Shown = Option<(ConditionStatus, &'static str, &'static str)>;
        type Foreign<'a> = &'a [(&'a str, &'a str)];
        type Case<'a> = (
            Foreign<'a>,
            &'a [String],
            Shown,
            Option<&'a str>,
            bool,
            Vec<String>,
        );
        let node = |shown: Shown, annotation: Option<&str>| {
            KubeEntry::of(KubeNode {
                conditions: shown
                    .map(|(status, reason, message)| NodeCondition {
                        type_: "SlurmNodeDrained".into(),
                        status,
                        reason: reason.into(),
                        message: message.into(),
                    })
                    .into_iter()
                    .collect(),
                labels: annotation
                    .map(|a| (KEY.to_owned(), a.to_owned()))
                    .into_iter()
                    .collect(),
                ..KubeNode::ready("k1")
            })
        };
        let mut policy = Policy::default();
        policy.node_signals.foreign_drain_condition = "SlurmNodeDrained".into();
        policy.node_signals.slurm_nodes_annotation = "lockstep.dev/slurm-nodes".into();
        let both = ["n1".to_owned(), "n2".to_owned()];
        let n1 = [("n1", "admin: bad dimm")];
        let two = [("n1", "admin: bad dimm"), ("n2", "")];
        let cond = |status: ConditionStatus, reason: &str, message: &str| {
            format!(
                "set condition SlurmNodeDrained={status:?} on kubernetes node k1 ({reason}{})",
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {message}")
                }
            )
        };
        let annotate =
            |v: &str| format!("annotate kubernetes node k1 lockstep.dev/slurm-nodes={v}");
        let unannotate =
            "remove annotation lockstep.dev/slurm-nodes from kubernetes node k1".to_owned();
        #[rustfmt::skip]
        let cases: Vec<Case<'_>> = vec![
            // row 7: somebody else's drain shows True, naming the node and reason
            (&n1, &both, None, Some("n1,n2"), false, vec![cond(T, "SlurmDrain", "n1: admin: bad dimm")]),
            (&n1, &both, Some((T, "SlurmDrain", "n1: admin: bad dimm")), Some("n1,n2"), false, vec![]),
            // a second one: the message follows
            (&two, &both, Some((T, "SlurmDrain", "n1: admin: bad dimm")), Some("n1,n2"), false, vec![cond(T, "SlurmDrain", "n1: admin: bad dimm; n2")]),
            // none any more: False; an absent or False one is left
            (&[], &both, Some((T, "SlurmDrain", "n1: admin: bad dimm")), Some("n1,n2"), false, vec![cond(F, "SlurmNotDrained", "")]),
            (&[], &both, None, Some("n1,n2"), false, vec![]),
            (&[], &both, Some((F, "SlurmNotDrained", "")), Some("n1,n2"), false, vec![]),
            // somebody's True under another reason is lockstep's to correct: it owns the type
            (&[], &both, Some((T, "Other", "")), Some("n1,n2"), false, vec![cond(F, "SlurmNotDrained", "")]),
            // row 8: the annotation names the Slurm nodes, follows them, goes with the last
            (&[], &both, None, None, false, vec![annotate("n1,n2")]),
            (&[], &both[..1], None, Some("n1,n2"), false, vec![annotate("n1")]),
            (&[], &[], None, Some("n1"), false, vec![unannotate.clone()]),
            (&[], &[], None, None, false, vec![]),
        ];
        for (i, (foreign, nodes, shown, annotation, flying, want)) in cases.iter().enumerate() {
            let mut got = Vec::new();
            let holds = |a: AspectRef<'_>| *flying && a == AspectRef::Condition("SlurmNodeDrained");
            signal_wants(
                &node(*shown, *annotation),
                foreign,
                nodes,
                &policy,
                key,
                holds,
                &mut got,
            );
            let got: Vec<String> = got
                .iter()
                .filter_map(|(_, w, _)| w.as_ref().map(Action::describe))
                .collect();
            assert_eq!(got, *want, "case {i}");
        }
        // The rules: row 7 is drain.foreign, row 8 node_signals.slurm_nodes.
        let mut got = Vec::new();
        signal_wants(
            &node(None, None),
            &n1,
            &both,
            &policy,
            key,
            |_| false,
            &mut got,
        );
        assert_eq!(show(&got), [
            "Condition(\"SlurmNodeDrained\")=kube_set_node_condition [drain.foreign]",
            "Label(\"annotation:lockstep.dev/slurm-nodes\")=kube_label_node [node_signals.slurm_nodes]",
        ]);
        // A slot in flight is told when nothing is left to do.
        let mut got = Vec::new();
        let flying = |a: AspectRef<'_>| a == AspectRef::Condition("SlurmNodeDrained");
        signal_wants(
            &node(None, Some("n1,n2")),
            &[],
            &both,
            &policy,
            key,
            flying,
            &mut got,
        );
        assert_eq!(
            show(&got),
            ["Condition(\"SlurmNodeDrained\")=- [drain.foreign]"]
        );
        // A long list is cut, saying how many more.
        let many: Vec<String> = (0..200).map(|i| format!("gpu-node-{i:04}")).collect();
        let foreign: Vec<(&str, &str)> = many.iter().map(|n| (n.as_str(), "admin: rma")).collect();
        let message = foreign_message(&foreign);
        assert!(
            message.len() <= FOREIGN_MESSAGE_MAX + 20,
            "{}",
            message.len()
        );
        assert!(
            message.starts_with("gpu-node-0000: admin: rma; gpu-node-0001"),
            "{message}"
        );
        assert!(message.ends_with(" more"), "{message}");
    }

    /// Row 6 for node signals when the write lands after the policy dropped
    /// its name: the observer no longer reads it, so what the slot holds
    /// decides.
    #[test]
    fn a_retired_signal_written_unseen_is_taken_back() {
        const KEY: &str = "annotation:lockstep.dev/slurm-nodes";
        const TY: &str = "SlurmNodeDrained";
        let retired = Retired {
            node_conditions: vec![TY.into()],
            node_labels: vec![KEY.into()],
            ..Retired::default()
        };
        let node = |seen: bool| {
            KubeEntry::of(KubeNode {
                labels: seen
                    .then(|| (KEY.to_owned(), "n1".to_owned()))
                    .into_iter()
                    .collect(),
                conditions: seen
                    .then(|| lockstep_schemas::NodeCondition {
                        type_: TY.into(),
                        status: ConditionStatus::True,
                        reason: "SlurmDrain".into(),
                        message: String::new(),
                    })
                    .into_iter()
                    .collect(),
                ..KubeNode::ready("k1")
            })
        };
        let label = |value: Option<&str>| Action::KubeLabelNode {
            node: "k1".into(),
            key: KEY.into(),
            value: value.map(str::to_owned),
        };
        let condition = |c: PodCondition| Action::KubeSetNodeCondition {
            node: "k1".into(),
            condition: c,
        };
        let held = |action: Action, flight: Flight| InFlight {
            id: lockstep_schemas::ActionId("1.x".into()),
            action,
            issued_ms: 0,
            attempt: 1,
            flight,
        };
        let done = Flight::Done { at_ms: 1 };
        let failed = Flight::Failed {
            retry_at_ms: 5_000,
            error: "timeout".into(),
        };
        let writes = |f: &Flight| {
            (
                held(
                    condition(cond(TY, ConditionStatus::True, "SlurmDrain")),
                    f.clone(),
                ),
                held(label(Some("n1")), f.clone()),
            )
        };
        let take_backs = |f: &Flight| {
            (
                held(condition(not_managed(TY)), f.clone()),
                held(label(None), f.clone()),
            )
        };
        let take_back = vec![condition(not_managed(TY)), label(None)];
        // Seen; what the slots of (the condition, the annotation) hold; the actions wanted.
        type Case = (bool, Option<(InFlight, InFlight)>, Vec<Action>);
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            // seen: taken back
            (true, None, take_back.clone()),
            // written and done, or failed (perhaps a timeout of a write that
            // landed), not seen: taken back all the same
            (false, Some(writes(&done)), take_back.clone()),
            (false, Some(writes(&failed)), take_back.clone()),
            // a write still on its way: its outcome first
            (false, Some(writes(&Flight::Sent)), vec![]),
            // a taking back that failed is still wanted (retried); one done is the end
            (false, Some(take_backs(&failed)), take_back),
            (false, Some(take_backs(&done)), vec![]),
            // nothing seen, nothing held
            (false, None, vec![]),
        ];
        for (i, (seen, slots, want)) in cases.into_iter().enumerate() {
            let slot = |a: AspectRef<'_>| match (a, &slots) {
                (AspectRef::Condition(_), Some((c, _))) => Some(c),
                (AspectRef::Label(_), Some((_, l))) => Some(l),
                _ => None,
            };
            let mut got = Vec::new();
            retired_signal_wants(&node(seen), &retired, |_| false, slot, &mut got);
            let got: Vec<Action> = got.into_iter().filter_map(|(_, a, _)| a).collect();
            assert_eq!(got, want, "case {i}");
        }
    }
}
