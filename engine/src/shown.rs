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
        let node = |taints: &[&str]| KubeEntry {
            obs: KubeNode {
                name: "k1".into(),
                unschedulable: false,
                ready: ConditionStatus::True,
                conditions: vec![],
                labels: Default::default(),
                taints: taints
                    .iter()
                    .map(|k| lockstep_schemas::Taint {
                        key: (*k).to_owned(),
                        value: String::new(),
                        effect: TaintEffect::NoSchedule,
                    })
                    .collect(),
                read_labels: None,
                maintenance: None,
                version: 0,
            },
            gen: 0,
            not_ready_since: None,
            unseen_labels: vec![],
        };
        let on = |unhealthy, held, foreign| OnNode {
            unhealthy,
            held,
            foreign,
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
            // row 6: a retired key is removed
            (on(false, false, false), vec!["old"], &retired, vec!["Taint(\"old\")=kube_untaint_node [policy.retired]"]),
        ];
        for (i, (on, taints, retired, want)) in cases.iter().enumerate() {
            let mut got = Vec::new();
            taint_wants(&node(taints), *on, &policy, retired, |_| false, &mut got);
            assert_eq!(show(&got), *want, "case {i}");
        }
    }
}
