//! Scaling policy: each scale target follows the demand of one Slurm
//! partition, and shrinks only through drain -> drained -> delete.
//!
//! | rule               | what                                                                 |
//! |--------------------|----------------------------------------------------------------------|
//! | `scaling.desired`  | busy nodes of the target + nodes wanted by pending jobs that more nodes can help, bounded by min / max |
//! | `scaling.up`       | desired above the replica count: scale up at once (after the cooldown) |
//! | `scaling.in`       | desired below it: pick victims the way the target's controller removes pods (below), drain them |
//! | `scaling.down`     | lower the replica count, never below the demand of that moment, and only so far that every pod it makes the controller remove is DRAINED (DRAIN, not ALLOCATED/MIXED/COMPLETING, no job) |
//! | `scaling.cancel`   | a victim no longer wanted (demand returns, a job lands on it, the chain above it breaks, its target is gone): drop it, at every step (its drain is resumed) |
//! | `scaling.replace`  | pods of an old revision: at most `max_unavailable` at a time through drain -> DRAINED -> delete |
//! | `scaling.busy`     | label pods whose Slurm node runs a job, so a PodDisruptionBudget protects them |
//!
//! Scale-in by removal rule ([`Removal`], per kind of target):
//!
//! | removal            | victims                                   | what lowers `replicas`                                           |
//! |--------------------|-------------------------------------------|-------------------------------------------------------------------|
//! | `highest_ordinal`  | the top ordinals, each idle long enough (or its pod already on its way out, its node jobless); a busy one stops the chain below it | past an ordinal once it and all above it are DRAINED |
//! | `deletion_cost`    | any idle, Running and Ready pods           | by the DRAINED victims marked with the lowest deletion cost, while every other pod is Running, Ready and costs more |
//! | `delete_pod`       | any idle pods                              | by the victims whose pods lockstep deleted once DRAINED, while no more pods exist than the new count |
//! | `controller_drains`| none (the controller drains)               | by at most the pods idle long enough                               |
//! | (kind not known)   | none                                       | never: only scaled up                                              |
//!
//! Fail closed: while lockstep cannot see Slurm or Kubernetes, or does not
//! know a pod or its Slurm node, nothing is deleted and `replicas` is not
//! lowered. No pod whose Slurm node runs a job is removed, by lockstep or by
//! a controller lockstep scaled.

use std::cmp::Ordering;

use lockstep_schemas::{
    Removal, ScaleTargetRef, SlurmBaseState, SlurmJob, SlurmJobState, SlurmNode, SlurmNodeFlag,
};
use serde::{Deserialize, Serialize};

/// Why a node is being taken out by scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum VictimKind {
    /// Scale-in: the pod goes and the replica count drops.
    ScaleIn,
    /// Rolling replacement: the pod goes and its controller recreates it at
    /// the new revision.
    Replace,
}

/// A node on its way out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Victim {
    pub target: ScaleTargetRef,
    pub kind: VictimKind,
    /// `namespace/name` of its pod, and the pod's UID when it was picked.
    pub pod_key: String,
    pub uid: String,
    /// The target's replica count when the pod was seen gone (scale-in),
    /// so the victim is settled once the count drops below it.
    pub gone_at_replicas: Option<u32>,
}

/// Per scale target.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ScaleCtl {
    pub last_up_ms: Option<u64>,
    pub last_down_ms: Option<u64>,
    /// The last desired count, to report changes.
    pub desired: Option<u32>,
    /// Why scale-in does not go further, as last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<String>,
}

/// The annotation a ReplicaSet ranks pods by when it removes some (the
/// lowest cost goes first), `controller.kubernetes.io/pod-deletion-cost`,
/// as pods' labels carry it in observations and in
/// `KubeLabelPod` actions: a key `annotation:<key>` names an annotation (the
/// Kubernetes connector watches it for targets whose removal is
/// `deletion_cost`, and patches `metadata.annotations` for it).
pub(crate) const COST_LABEL: &str = "annotation:controller.kubernetes.io/pod-deletion-cost";

/// The cost lockstep gives a DRAINED victim: the lowest there is (int32).
pub(crate) const VICTIM_COST: &str = "-2147483648";

/// What scaling knows of one pod of a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodFacts<'a> {
    /// `namespace/name`.
    pub key: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub slurm: &'a str,
    /// Jobs holding its Slurm node.
    pub jobs: u32,
    /// A job holds its Slurm node, or Slurm shows it ALLOCATED, MIXED or
    /// COMPLETING.
    pub busy: bool,
    /// Slurm knows its node.
    pub known: bool,
    /// Its Slurm node is DRAINED.
    pub drained: bool,
    pub deleting: bool,
    /// Assigned, Running and Ready.
    pub serving: bool,
    /// Its Slurm node has been idle for `idle_before_scale_down_s`.
    pub idle_enough: bool,
    /// Its `controller.kubernetes.io/pod-deletion-cost` as observed (absent: 0;
    /// `None`: not a number, so its rank is unknown).
    pub cost: Option<i64>,
    pub revision: Option<&'a str>,
}

impl PodFacts<'_> {
    /// Whether removing it now could cost a job, or lockstep cannot tell.
    fn why_not_removable(&self) -> Option<String> {
        if !self.known {
            Some(format!("slurm node {} is not known", self.slurm))
        } else if self.jobs > 0 {
            Some(format!(
                "slurm node {} runs {} job(s)",
                self.slurm, self.jobs
            ))
        } else if self.busy {
            Some(format!(
                "slurm node {} is allocated or completing",
                self.slurm
            ))
        } else if self.deleting {
            Some(format!("pod {} is being deleted", self.key))
        } else {
            None
        }
    }

    /// DRAINED and holding nothing: its removal cannot cost a job.
    fn safe_to_remove(&self) -> bool {
        self.known && self.drained && self.jobs == 0 && !self.busy
    }
}

/// The ordinal of a StatefulSet pod `<set>-<ordinal>` (canonical decimal).
pub(crate) fn ordinal(set: &str, pod: &str) -> Option<u32> {
    let digits = pod.strip_prefix(set)?.strip_prefix('-')?;
    let o: u32 = digits.parse().ok()?;
    (o.to_string() == digits).then_some(o)
}

/// Whether a pod's controller is the scale target: the target itself, or
/// for a Deployment, its ReplicaSet `<deployment>-<pod-template-hash>`.
pub(crate) fn owned_by(target: &ScaleTargetRef, owner_kind: &str, owner_name: &str) -> bool {
    if target.kind == "Deployment" && target.group == "apps" {
        return owner_kind == "ReplicaSet"
            && owner_name
                .strip_prefix(target.name.as_str())
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|hash| {
                    !hash.is_empty() && hash.bytes().all(|b| b.is_ascii_alphanumeric())
                });
    }
    owner_kind == target.kind && owner_name == target.name
}

/// The inputs of one scale-in step.
pub(crate) struct ScaleIn<'a, 'p> {
    pub removal: Option<Removal>,
    pub target: &'a ScaleTargetRef,
    pub current: u32,
    /// Desired replicas (demand, within min and max): never go below it.
    pub desired: u32,
    pub pods: &'a [PodFacts<'p>],
    /// Slurm nodes that are scale-in victims now.
    pub victims: &'a [&'a str],
    /// Slurm nodes whose victim pods lockstep deleted and are gone
    /// (`delete_pod`), not yet counted off `replicas`.
    pub gone: u32,
    /// New victims may be picked (the scale-down cooldown is over).
    pub may_pick: bool,
    /// lockstep sees both Slurm and Kubernetes.
    pub visible: bool,
}

/// What one scale-in step wants.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ScaleInPlan {
    /// Slurm nodes that are (or stay) victims; the others are dropped.
    pub victims: Vec<String>,
    /// Lower `replicas` to this now.
    pub lower_to: Option<u32>,
    /// Pods (`namespace/name`) lockstep should delete now (`delete_pod`).
    pub delete: Vec<String>,
    /// Pods (`namespace/name`) that should carry [`VICTIM_COST`] now
    /// (`deletion_cost`); any other pod of the target that carries it
    /// should not.
    pub mark: Vec<String>,
    /// Why scale-in stops short, for the audit trail: the Slurm node that
    /// stops it (if one does) and why.
    pub blocked: Option<(Option<String>, String)>,
}

/// One scale-in step, by the target's removal rule (module table).
pub(crate) fn plan_scale_in(s: &ScaleIn<'_, '_>) -> ScaleInPlan {
    let mut plan = ScaleInPlan::default();
    if !s.visible {
        // Blind: keep what was decided, decide nothing new.
        plan.victims = s.victims.iter().map(|v| (*v).to_owned()).collect();
        if s.desired < s.current {
            plan.blocked = Some((
                None,
                "lockstep cannot see slurm or kubernetes; no scale-in until it can".to_owned(),
            ));
        }
        return plan;
    }
    let Some(removal) = s.removal else {
        if s.desired < s.current {
            plan.blocked = Some((
                None,
                format!(
                    "no removal rule for kind {}: set scaling.removal to scale it in",
                    s.target.kind
                ),
            ));
        }
        return plan;
    };
    match removal {
        Removal::HighestOrdinal => highest_ordinal(s, &mut plan),
        Removal::DeletionCost => deletion_cost(s, &mut plan),
        Removal::DeletePod => delete_pod(s, &mut plan),
        Removal::ControllerDrains => {
            if s.desired < s.current && s.may_pick {
                let idle = s
                    .pods
                    .iter()
                    .filter(|p| p.idle_enough && p.why_not_removable().is_none())
                    .count() as u32;
                let to = s.current.saturating_sub(idle).max(s.desired);
                plan.lower_to = (to < s.current).then_some(to);
            }
        }
    }
    plan
}

/// `highest_ordinal`: the chain of top ordinals.
fn highest_ordinal(s: &ScaleIn<'_, '_>, plan: &mut ScaleInPlan) {
    let set = s.target.name.as_str();
    let at = |o: u32| {
        s.pods
            .iter()
            .find(|p| ordinal(set, p.name) == Some(o) && !p.deleting)
            .or_else(|| s.pods.iter().find(|p| ordinal(set, p.name) == Some(o)))
    };
    // Ordinals at or above the count are the controller's to remove: their
    // victims stay until their pods are gone.
    for p in s.pods {
        if ordinal(set, p.name).is_some_and(|o| o >= s.current) && s.victims.contains(&p.slurm) {
            plan.victims.push(p.slurm.to_owned());
        }
    }
    // The chain: from the top down to the demand, each ordinal removable.
    let mut o = s.current;
    while o > s.desired {
        o -= 1;
        let Some(p) = at(o) else {
            plan.blocked = Some((None, format!("pod {set}-{o} is not known")));
            break;
        };
        let victim = s.victims.contains(&p.slurm);
        // A pod already being deleted (evicted, or stuck terminating on a
        // host that is gone) leaves whatever lockstep does; lowering past
        // it only keeps the controller from recreating it, so it does not
        // stop the chain unless its node still holds work.
        let leaving = p.deleting && p.known && p.jobs == 0 && !p.busy;
        if let Some(why) = p.why_not_removable().filter(|_| !leaving) {
            plan.blocked = Some((
                Some(p.slurm.to_owned()),
                format!("{why}, and a StatefulSet removes its highest ordinals first"),
            ));
            break;
        }
        if !(victim || leaving || (s.may_pick && p.idle_enough)) {
            break;
        }
        plan.victims.push(p.slurm.to_owned());
    }
    // Lower past each ordinal from the top whose node is DRAINED.
    let mut to = s.current;
    while to > s.desired {
        let Some(p) = at(to - 1) else { break };
        if !(plan.victims.iter().any(|v| v == p.slurm) && p.safe_to_remove()) {
            break;
        }
        to -= 1;
    }
    plan.lower_to = (to < s.current).then_some(to);
}

/// `deletion_cost`: any idle pods, marked lowest cost once DRAINED.
fn deletion_cost(s: &ScaleIn<'_, '_>, plan: &mut ScaleInPlan) {
    let victim_cost: i64 = VICTIM_COST.parse().expect("a number");
    let wanted = s.current.saturating_sub(s.desired) as usize;
    // Victims being removed (after a lowering) stay until gone.
    let leaving: Vec<&PodFacts> = s
        .pods
        .iter()
        .filter(|p| p.deleting && s.victims.contains(&p.slurm))
        .collect();
    plan.victims
        .extend(leaving.iter().map(|p| p.slurm.to_owned()));
    let mut kept: Vec<&PodFacts> = s
        .pods
        .iter()
        .filter(|p| !p.deleting && s.victims.contains(&p.slurm))
        .filter(|p| p.why_not_removable().is_none())
        .collect();
    kept.sort_by(|a, b| victim_order((a.jobs, a.slurm), (b.jobs, b.slurm)));
    kept.truncate(wanted);
    if s.may_pick && kept.len() < wanted {
        let mut fresh: Vec<&PodFacts> = s
            .pods
            .iter()
            .filter(|p| !s.victims.contains(&p.slurm) && p.serving && p.idle_enough)
            .filter(|p| p.why_not_removable().is_none())
            .collect();
        fresh.sort_by(|a, b| victim_order((a.jobs, a.slurm), (b.jobs, b.slurm)));
        fresh.truncate(wanted - kept.len());
        kept.extend(fresh);
    }
    plan.victims.extend(kept.iter().map(|p| p.slurm.to_owned()));
    plan.mark = kept
        .iter()
        .filter(|p| p.safe_to_remove())
        .map(|p| p.key.to_owned())
        .collect();
    // Lower only when the controller can pick nothing but the marked,
    // DRAINED victims: every other pod serves and costs more, none is on
    // its way out, and the count is settled.
    let marked: Vec<&&PodFacts> = kept
        .iter()
        .filter(|p| p.safe_to_remove() && p.cost == Some(victim_cost))
        .collect();
    if marked.is_empty() {
        return;
    }
    let live = s.pods.iter().filter(|p| !p.deleting).count() as u32;
    let blocker = s
        .pods
        .iter()
        .filter(|p| !marked.iter().any(|m| m.key == p.key))
        .find_map(|p| {
            if p.deleting {
                Some(format!("pod {} is being deleted", p.key))
            } else if !p.serving {
                Some(format!(
                    "pod {} is not Running and Ready, so the controller would remove it first",
                    p.key
                ))
            } else if p.cost.is_none_or(|c| c <= victim_cost) {
                Some(format!(
                    "pod {} has a deletion cost as low as lockstep's victims",
                    p.key
                ))
            } else {
                None
            }
        });
    if let Some(why) = blocker {
        plan.blocked = Some((None, why));
    } else if live != s.current {
        plan.blocked = Some((
            None,
            format!(
                "{live} pods for {} replicas: waiting for the controller",
                s.current
            ),
        ));
    } else {
        let to = s.current.saturating_sub(marked.len() as u32).max(s.desired);
        plan.lower_to = (to < s.current).then_some(to);
    }
}

/// `delete_pod`: lockstep deletes DRAINED victims, then lowers by the gone.
fn delete_pod(s: &ScaleIn<'_, '_>, plan: &mut ScaleInPlan) {
    let wanted = s.current.saturating_sub(s.desired).saturating_sub(s.gone) as usize;
    // Pods already being deleted stay victims until gone.
    let mut kept: Vec<&PodFacts> = s
        .pods
        .iter()
        .filter(|p| s.victims.contains(&p.slurm))
        .filter(|p| p.deleting || p.why_not_removable().is_none())
        .collect();
    kept.sort_by(|a, b| {
        b.deleting
            .cmp(&a.deleting)
            .then_with(|| victim_order((a.jobs, a.slurm), (b.jobs, b.slurm)))
    });
    let deleting = kept.iter().filter(|p| p.deleting).count();
    kept.truncate(wanted.max(deleting));
    if s.may_pick && kept.len() < wanted {
        let mut fresh: Vec<&PodFacts> = s
            .pods
            .iter()
            .filter(|p| !s.victims.contains(&p.slurm) && p.idle_enough)
            .filter(|p| p.why_not_removable().is_none())
            .collect();
        fresh.sort_by(|a, b| victim_order((a.jobs, a.slurm), (b.jobs, b.slurm)));
        fresh.truncate(wanted - kept.len());
        kept.extend(fresh);
    }
    plan.victims = kept.iter().map(|p| p.slurm.to_owned()).collect();
    plan.delete = kept
        .iter()
        .filter(|p| !p.deleting && p.safe_to_remove())
        .map(|p| p.key.to_owned())
        .collect();
    if s.gone > 0 {
        let to = s.current.saturating_sub(s.gone).max(s.desired);
        let live = s.pods.iter().filter(|p| !p.deleting).count() as u32;
        if to < s.current && live > to {
            plan.blocked = Some((
                None,
                format!(
                    "{live} pods would remain for {to} replicas: the controller would remove one"
                ),
            ));
        } else if to < s.current {
            plan.lower_to = Some(to);
        }
    }
}

/// The guard every lowering of `replicas` passes, whatever decided it: the
/// pods it makes the controller remove are DRAINED and hold no job. `Err`
/// says why not.
pub(crate) fn lowering_allowed(
    removal: Option<Removal>,
    target: &ScaleTargetRef,
    pods: &[PodFacts<'_>],
    from: u32,
    to: u32,
    visible: bool,
) -> Result<(), String> {
    if to >= from {
        return Ok(());
    }
    if !visible {
        return Err("lockstep cannot see slurm or kubernetes".to_owned());
    }
    match removal {
        None => Err(format!("no removal rule for kind {}", target.kind)),
        Some(Removal::HighestOrdinal) => {
            for o in to..from {
                let p = pods
                    .iter()
                    .find(|p| ordinal(&target.name, p.name) == Some(o))
                    .ok_or_else(|| format!("pod {}-{o} is not known", target.name))?;
                if !p.safe_to_remove() {
                    return Err(format!(
                        "slurm node {} of ordinal {o} is not DRAINED and idle",
                        p.slurm
                    ));
                }
            }
            Ok(())
        }
        // Their plans only lower when the controller's choice is forced
        // (deletion_cost) or nothing is left to choose (delete_pod), or the
        // controller drains itself.
        Some(Removal::DeletionCost | Removal::DeletePod | Removal::ControllerDrains) => Ok(()),
    }
}

/// Whether a pending job is demand that more nodes can meet.
pub(crate) fn scalable(job: &SlurmJob, unscalable_reasons: &[String]) -> bool {
    job.state == SlurmJobState::Pending
        && !job
            .pending_reason
            .as_deref()
            .is_some_and(|r| unscalable_reasons.iter().any(|u| r.starts_with(u.as_str())))
}

/// Busy from Slurm's side: a job holds it or is finishing on it.
pub(crate) fn slurm_busy(node: &SlurmNode) -> bool {
    matches!(
        node.state,
        SlurmBaseState::Allocated | SlurmBaseState::Mixed
    ) || node.has(&SlurmNodeFlag::Completing)
}

/// DRAINED in sinfo's sense: DRAIN and nothing running or finishing.
pub(crate) fn drained(node: &SlurmNode, jobs: u32) -> bool {
    node.has(&SlurmNodeFlag::Drain) && !slurm_busy(node) && jobs == 0
}

/// Desired replicas: busy nodes plus pending demand, within bounds.
pub(crate) fn desired(busy: u32, pending_nodes: u64, min: u32, max: u32) -> u32 {
    let want = u64::from(busy).saturating_add(pending_nodes);
    u32::try_from(want).unwrap_or(u32::MAX).clamp(min, max)
}

/// Victim order: idle first, then fewest running jobs, then newest (the
/// highest ordinal: StatefulSet and NodeSet pods are numbered in creation
/// order), then by name, so the choice is deterministic.
pub(crate) fn victim_order(a: (u32, &str), b: (u32, &str)) -> Ordering {
    let ordinal = |s: &str| {
        let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        s[s.len() - digits..].parse::<u64>().ok()
    };
    a.0.cmp(&b.0)
        .then_with(|| ordinal(b.1).cmp(&ordinal(a.1)))
        .then_with(|| a.1.cmp(b.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(kind: &str, name: &str) -> ScaleTargetRef {
        ScaleTargetRef {
            group: "apps".into(),
            kind: kind.into(),
            namespace: "slurm".into(),
            name: name.into(),
        }
    }

    /// A pod of set `gpu` by a one-letter state: `i` idle long enough, `y`
    /// idle not long enough, `b` busy (a job), `d` drained, `m` drained and
    /// marked with the victim cost, `u` Slurm node unknown, `x` being
    /// deleted, `p` not Running and Ready.
    fn pod(name: &'static str, state: char) -> PodFacts<'static> {
        let key: &'static str = Box::leak(format!("slurm/{name}").into_boxed_str());
        PodFacts {
            key,
            name,
            uid: "u",
            slurm: name,
            jobs: u32::from(state == 'b'),
            busy: state == 'b',
            known: state != 'u',
            drained: matches!(state, 'd' | 'm' | 'x'),
            deleting: state == 'x',
            serving: !matches!(state, 'p' | 'x'),
            idle_enough: matches!(state, 'i' | 'd' | 'm' | 'p'),
            cost: Some(if state == 'm' { -2_147_483_648 } else { 0 }),
            revision: None,
        }
    }

    fn pods(states: &str) -> Vec<PodFacts<'static>> {
        const NAMES: [&str; 6] = ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"];
        states
            .chars()
            .enumerate()
            .map(|(i, c)| pod(NAMES[i], c))
            .collect()
    }

    #[test]
    fn statefulset_scale_in_table() {
        // (pod states by ordinal, current, desired, victims before)
        //   -> (victims, lower to, blocked by)
        type Row = (
            &'static str,
            u32,
            u32,
            &'static [&'static str],
            &'static [&'static str],
            Option<u32>,
            Option<&'static str>,
        );
        let rows: &[Row] = &[
            // Idle top ordinals become victims; nothing lowered before DRAINED.
            (
                "biiii",
                5,
                1,
                &[],
                &["gpu-4", "gpu-3", "gpu-2", "gpu-1"],
                None,
                None,
            ),
            // The incident: a busy top ordinal stops it all, however idle
            // the ones below it are.
            ("biiib", 5, 2, &[], &[], None, Some("gpu-4")),
            // A busy ordinal in the middle stops the chain there.
            ("bibii", 5, 1, &[], &["gpu-4", "gpu-3"], None, Some("gpu-2")),
            // Lowered past the top DRAINED victims only.
            (
                "biidd",
                5,
                1,
                &["gpu-4", "gpu-3", "gpu-2", "gpu-1"],
                &["gpu-4", "gpu-3", "gpu-2", "gpu-1"],
                Some(3),
                None,
            ),
            (
                "bidid",
                5,
                1,
                &["gpu-4", "gpu-3", "gpu-2", "gpu-1"],
                &["gpu-4", "gpu-3", "gpu-2", "gpu-1"],
                Some(4),
                None,
            ),
            // Never below the demand of this moment.
            (
                "bdddd",
                5,
                3,
                &["gpu-4", "gpu-3", "gpu-2", "gpu-1"],
                &["gpu-4", "gpu-3"],
                Some(3),
                None,
            ),
            // Demand back above the count: victims below it are let go.
            ("bdddd", 5, 5, &["gpu-4", "gpu-3"], &[], None, None),
            // A victim that got a job is let go with the ones below it.
            (
                "bddbd",
                5,
                1,
                &["gpu-4", "gpu-3", "gpu-2"],
                &["gpu-4"],
                Some(4),
                Some("gpu-3"),
            ),
            // Pods at or above the count are the controller's to remove: their
            // victims stay until they are gone.
            (
                "bixx",
                2,
                1,
                &["gpu-3", "gpu-2"],
                &["gpu-2", "gpu-3", "gpu-1"],
                None,
                None,
            ),
            // Not idle long enough: waits, no complaint.
            ("biiiy", 5, 1, &[], &[], None, None),
            // Fail closed on what lockstep does not know.
            ("biiiu", 5, 1, &[], &[], None, Some("gpu-4")),
            ("biii", 5, 1, &[], &[], None, None),
        ];
        for (i, (states, current, desired, before, victims, lower, blocked)) in
            rows.iter().enumerate()
        {
            let pods = pods(states);
            let t = target("StatefulSet", "gpu");
            let plan = plan_scale_in(&ScaleIn {
                removal: Some(Removal::HighestOrdinal),
                target: &t,
                current: *current,
                desired: *desired,
                pods: &pods,
                victims: before,
                gone: 0,
                may_pick: true,
                visible: true,
            });
            let mut got = plan.victims.clone();
            got.sort();
            let mut want: Vec<String> = victims.iter().map(|v| (*v).to_owned()).collect();
            want.sort();
            assert_eq!(got, want, "row {i}: victims");
            assert_eq!(plan.lower_to, *lower, "row {i}: lower to");
            let by = plan.blocked.as_ref().map(|(n, _)| n.as_deref());
            match blocked {
                Some(n) => assert_eq!(by, Some(Some(*n)), "row {i}: blocked"),
                None => assert!(
                    by.is_none() || (*states == "biii" && by == Some(None)),
                    "row {i}: blocked by {by:?}"
                ),
            }
            assert!(plan.delete.is_empty() && plan.mark.is_empty());
            if let Some(to) = plan.lower_to {
                assert!(to >= *desired);
                lowering_allowed(Some(Removal::HighestOrdinal), &t, &pods, *current, to, true)
                    .unwrap_or_else(|e| panic!("row {i}: {e}"));
            }
        }
    }

    #[test]
    fn deletion_cost_scale_in_table() {
        // (pod states, current, desired, victims before)
        //   -> (victims, marked, lower to)
        type Row = (
            &'static str,
            u32,
            u32,
            &'static [&'static str],
            &'static [&'static str],
            &'static [&'static str],
            Option<u32>,
        );
        let rows: &[Row] = &[
            // Any idle pods, newest first; no lowering before they are marked.
            ("biibi", 5, 3, &[], &["gpu-4", "gpu-2"], &[], None),
            // DRAINED victims get the lowest cost.
            (
                "bidbd",
                5,
                3,
                &["gpu-4", "gpu-2"],
                &["gpu-4", "gpu-2"],
                &["slurm/gpu-4", "slurm/gpu-2"],
                None,
            ),
            // Marked and DRAINED: lowered by them.
            (
                "bimbm",
                5,
                3,
                &["gpu-4", "gpu-2"],
                &["gpu-4", "gpu-2"],
                &["slurm/gpu-4", "slurm/gpu-2"],
                Some(3),
            ),
            // One marked, one not yet: lowered by one.
            (
                "bidbm",
                5,
                3,
                &["gpu-4", "gpu-2"],
                &["gpu-4", "gpu-2"],
                &["slurm/gpu-4", "slurm/gpu-2"],
                Some(4),
            ),
            // Another pod not Running and Ready would go first: wait.
            (
                "bpmbm",
                5,
                3,
                &["gpu-4", "gpu-2"],
                &["gpu-4", "gpu-2"],
                &["slurm/gpu-4", "slurm/gpu-2"],
                None,
            ),
            // Demand back: victims beyond it are let go, to be unmarked; no
            // lowering while the one let go still carries the lowest cost.
            (
                "bimbm",
                5,
                4,
                &["gpu-4", "gpu-2"],
                &["gpu-4"],
                &["slurm/gpu-4"],
                None,
            ),
            (
                "bimbd",
                5,
                4,
                &["gpu-4"],
                &["gpu-4"],
                &["slurm/gpu-4"],
                None,
            ),
            (
                "bidbm",
                5,
                4,
                &["gpu-4"],
                &["gpu-4"],
                &["slurm/gpu-4"],
                Some(4),
            ),
            ("bimbm", 5, 5, &["gpu-4", "gpu-2"], &[], &[], None),
            // Two victims already going after a lowering; demand back: the
            // count stays, the others are let go.
            (
                "bixbx",
                3,
                3,
                &["gpu-4", "gpu-2"],
                &["gpu-4", "gpu-2"],
                &[],
                None,
            ),
            // A victim that got a job is let go (another is picked); the
            // marked one goes.
            (
                "bibbm",
                5,
                3,
                &["gpu-4", "gpu-2"],
                &["gpu-4", "gpu-1"],
                &["slurm/gpu-4"],
                Some(4),
            ),
        ];
        for (i, (states, current, desired, before, victims, marked, lower)) in
            rows.iter().enumerate()
        {
            let pods = pods(states);
            let t = target("ReplicaSet", "web");
            let plan = plan_scale_in(&ScaleIn {
                removal: Some(Removal::DeletionCost),
                target: &t,
                current: *current,
                desired: *desired,
                pods: &pods,
                victims: before,
                gone: 0,
                may_pick: true,
                visible: true,
            });
            let mut got = plan.victims.clone();
            got.sort();
            let mut want: Vec<String> = victims.iter().map(|v| (*v).to_owned()).collect();
            want.sort();
            assert_eq!(got, want, "row {i}: victims");
            let mut got = plan.mark.clone();
            got.sort();
            let mut want: Vec<String> = marked.iter().map(|v| (*v).to_owned()).collect();
            want.sort();
            assert_eq!(got, want, "row {i}: marked");
            assert_eq!(plan.lower_to, *lower, "row {i}: lower to");
        }
    }

    #[test]
    fn delete_pod_and_controller_drains_table() {
        let t = target("NodeSet", "gpu");
        let idle = pods("biidd");
        // Victims picked, DRAINED ones deleted, nothing lowered yet.
        let plan = plan_scale_in(&ScaleIn {
            removal: Some(Removal::DeletePod),
            target: &t,
            current: 5,
            desired: 2,
            pods: &idle,
            victims: &["gpu-4", "gpu-3"],
            gone: 0,
            may_pick: true,
            visible: true,
        });
        assert_eq!(plan.victims, ["gpu-4", "gpu-3", "gpu-2"]);
        assert_eq!(plan.delete, ["slurm/gpu-4", "slurm/gpu-3"]);
        assert_eq!(plan.lower_to, None);
        // Two gone, demand back to 4: lowered to the demand, not by both.
        let left = pods("bii");
        let plan = plan_scale_in(&ScaleIn {
            removal: Some(Removal::DeletePod),
            target: &t,
            current: 5,
            desired: 4,
            pods: &left,
            victims: &[],
            gone: 2,
            may_pick: true,
            visible: true,
        });
        assert_eq!(plan.lower_to, Some(4));
        // Lowering by the gone would leave more pods than replicas: wait.
        let plan = plan_scale_in(&ScaleIn {
            removal: Some(Removal::DeletePod),
            target: &t,
            current: 5,
            desired: 1,
            pods: &pods("biiid"),
            victims: &[],
            gone: 2,
            may_pick: false,
            visible: true,
        });
        assert_eq!(plan.lower_to, None, "5 pods would remain for 3 replicas");
        assert!(plan.blocked.is_some());
        // The controller drains: lowered by the pods idle long enough.
        let plan = plan_scale_in(&ScaleIn {
            removal: Some(Removal::ControllerDrains),
            target: &t,
            current: 5,
            desired: 1,
            pods: &pods("bbiyi"),
            victims: &[],
            gone: 0,
            may_pick: true,
            visible: true,
        });
        assert_eq!(plan.lower_to, Some(3));
        assert!(plan.victims.is_empty());
        // No rule for the kind, or blind: nothing.
        for (removal, visible) in [(None, true), (Some(Removal::ControllerDrains), false)] {
            let plan = plan_scale_in(&ScaleIn {
                removal,
                target: &t,
                current: 5,
                desired: 1,
                pods: &idle,
                victims: &[],
                gone: 0,
                may_pick: true,
                visible,
            });
            assert_eq!(plan.lower_to, None);
            assert!(plan.victims.is_empty() && plan.blocked.is_some());
        }
    }

    #[test]
    fn lowering_a_statefulset_needs_every_removed_ordinal_drained() {
        let t = target("StatefulSet", "gpu");
        let hs = Some(Removal::HighestOrdinal);
        // (states, from, to) -> allowed
        for (states, from, to, ok) in [
            ("bdddd", 5, 1, true),
            ("bddbd", 5, 1, false),
            ("bddbd", 5, 4, true),
            ("bdd", 5, 3, false), // ordinals 3 and 4 not known
            ("bdddu", 5, 4, false),
            ("biiii", 5, 5, true),
        ] {
            let got = lowering_allowed(hs, &t, &pods(states), from, to, true);
            assert_eq!(got.is_ok(), ok, "{states} {from}->{to}: {got:?}");
        }
        assert!(lowering_allowed(hs, &t, &pods("bdddd"), 5, 1, false).is_err());
    }

    #[test]
    fn ordinals_and_owners() {
        for (pod, want) in [
            ("gpu-3", Some(3)),
            ("gpu-12", Some(12)),
            ("gpu-03", None),
            ("gpu-", None),
            ("gpu-a", None),
            ("gpux-3", None),
            ("gpu-gpu-3", None),
        ] {
            assert_eq!(ordinal("gpu", pod), want, "{pod}");
        }
        let d = target("Deployment", "web");
        assert!(owned_by(&d, "ReplicaSet", "web-5d8f7c9b4"));
        assert!(!owned_by(&d, "ReplicaSet", "web-api-5d8f7c9b4"));
        assert!(!owned_by(&d, "Deployment", "web"));
        let s = target("StatefulSet", "gpu");
        assert!(owned_by(&s, "StatefulSet", "gpu"));
        assert!(!owned_by(&s, "StatefulSet", "gpu2"));
    }

    #[test]
    fn desired_is_busy_plus_pending_within_bounds() {
        // (busy, pending, min, max) -> desired
        for (busy, pending, min, max, want) in [
            (0, 0, 1, 8, 1),
            (2, 3, 0, 8, 5),
            (2, 30, 0, 8, 8),
            (0, 0, 0, 8, 0),
            (5, u64::MAX, 0, 10, 10),
        ] {
            assert_eq!(
                desired(busy, pending, min, max),
                want,
                "{busy} {pending} {min} {max}"
            );
        }
    }

    #[test]
    fn victims_idle_first_then_fewest_jobs_then_newest() {
        let mut v = vec![
            (0, "gpu-2"),
            (1, "gpu-9"),
            (0, "gpu-10"),
            (0, "gpu-1"),
            (2, "gpu-11"),
        ];
        v.sort_by(|a, b| victim_order(*a, *b));
        assert_eq!(
            v,
            [
                (0, "gpu-10"),
                (0, "gpu-2"),
                (0, "gpu-1"),
                (1, "gpu-9"),
                (2, "gpu-11")
            ]
        );
    }

    #[test]
    fn pending_reasons_that_nodes_cannot_fix_do_not_count() {
        let reasons: Vec<String> = ["Dependency", "JobHeld", "QOS"].map(str::to_owned).to_vec();
        let job = |state: SlurmJobState, reason: Option<&str>| SlurmJob {
            job_id: 1,
            state,
            partition: "p".into(),
            nodes: vec![],
            node_count: 1,
            pending_reason: reason.map(str::to_owned),
            version: 0,
        };
        assert!(scalable(
            &job(SlurmJobState::Pending, Some("Resources")),
            &reasons
        ));
        assert!(scalable(&job(SlurmJobState::Pending, None), &reasons));
        assert!(!scalable(
            &job(SlurmJobState::Pending, Some("Dependency")),
            &reasons
        ));
        assert!(!scalable(
            &job(SlurmJobState::Pending, Some("JobHeldUser")),
            &reasons
        ));
        assert!(!scalable(
            &job(SlurmJobState::Pending, Some("QOSMaxJobsPerUserLimit")),
            &reasons
        ));
        assert!(!scalable(&job(SlurmJobState::Running, None), &reasons));
    }
}
