//! Scale-in plans by removal rule (the second table of `scaling`): which
//! victims to drain, how far the replica count may drop, which pods to
//! delete or mark.

#[allow(clippy::wildcard_imports)]
use super::*;

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
    /// The next time an idle pod's becoming idle long enough can change
    /// this plan: the earliest of any pod's, or for `highest_ordinal` the
    /// one where the chain stops (the pods below it wait for it).
    pub idle_wake: Option<u64>,
}

impl ScaleInPlan {
    /// Wants nothing done: no victim, no lowering, nothing to delete or
    /// mark.
    pub fn wants_nothing(&self) -> bool {
        self.victims.is_empty()
            && self.lower_to.is_none()
            && self.delete.is_empty()
            && self.mark.is_empty()
    }
}

/// One scale-in step, by the target's removal rule (module table).
pub(crate) fn plan_scale_in(s: &ScaleIn<'_, '_>) -> ScaleInPlan {
    let mut plan = ScaleInPlan {
        idle_wake: s.pods.iter().filter_map(|p| p.idle_at).min(),
        ..ScaleInPlan::default()
    };
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
    // A set: the plans ask of every pod whether it is a victim.
    let victims: FxHashSet<&str> = s.victims.iter().copied().collect();
    match removal {
        Removal::HighestOrdinal => highest_ordinal(s, &victims, &mut plan),
        Removal::DeletionCost => deletion_cost(s, &victims, &mut plan),
        Removal::DeletePod => delete_pod(s, &victims, &mut plan),
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
fn highest_ordinal(s: &ScaleIn<'_, '_>, victims: &FxHashSet<&str>, plan: &mut ScaleInPlan) {
    let set = s.target.name.as_str();
    let ordinals = Ordinals::of(set, s.pods);
    let at = |o: u32| {
        ordinals
            .at(o)
            .find(|p| !p.deleting)
            .or_else(|| ordinals.at(o).next())
    };
    // Ordinals at or above the count are the controller's to remove: their
    // victims stay until their pods are gone.
    for p in s.pods {
        if ordinal(set, p.name).is_some_and(|o| o >= s.current) && victims.contains(p.slurm) {
            plan.victims.push(p.slurm.to_owned());
        }
    }
    // The chain: from the top down to the demand, each ordinal removable.
    // Only the pod where it stops can set it going again by growing idle.
    plan.idle_wake = None;
    let mut o = s.current;
    while o > s.desired {
        o -= 1;
        let Some(p) = at(o) else {
            plan.blocked = Some((None, format!("pod {set}-{o} is not known")));
            break;
        };
        let victim = victims.contains(p.slurm);
        // A pod already leaving does not stop the chain; one being deleted
        // whose node still holds work does.
        let leaving = p.leaving();
        if let Some(why) = p.why_not_removable().filter(|_| !leaving) {
            plan.blocked = Some((
                Some(p.slurm.to_owned()),
                format!("{why}, and a StatefulSet removes its highest ordinals first"),
            ));
            break;
        }
        if !(victim || leaving || (s.may_pick && p.idle_enough)) {
            plan.idle_wake = p.idle_at;
            break;
        }
        plan.victims.push(p.slurm.to_owned());
    }
    // Lower past each ordinal from the top whose node is DRAINED, or whose
    // pod is leaving anyway and its node takes no job.
    let picked: FxHashSet<&str> = plan.victims.iter().map(String::as_str).collect();
    let mut to = s.current;
    while to > s.desired {
        let Some(p) = at(to - 1) else { break };
        if !(picked.contains(p.slurm) && p.passable()) {
            if picked.contains(p.slurm) && p.self_lifting && plan.blocked.is_none() {
                plan.blocked = Some((
                    Some(p.slurm.to_owned()),
                    format!(
                        "slurm node {} is drained by somebody who lifts that drain by itself; lockstep drains it once it is lifted",
                        p.slurm
                    ),
                ));
            }
            break;
        }
        to -= 1;
    }
    plan.lower_to = (to < s.current).then_some(to);
}

/// `deletion_cost`: any idle pods, marked lowest cost once DRAINED.
fn deletion_cost(s: &ScaleIn<'_, '_>, victims: &FxHashSet<&str>, plan: &mut ScaleInPlan) {
    let victim_cost: i64 = VICTIM_COST.parse().expect("a number");
    let wanted = s.current.saturating_sub(s.desired) as usize;
    // Victims being removed (after a lowering) stay until gone.
    let leaving: Vec<&PodFacts> = s
        .pods
        .iter()
        .filter(|p| p.deleting && victims.contains(p.slurm))
        .collect();
    plan.victims
        .extend(leaving.iter().map(|p| p.slurm.to_owned()));
    // `replicas` already lowered past marked victims whose pods are not
    // seen going yet: the controller removes them next, whatever the
    // demand says now, so they stay victims, and marked, until gone.
    let live = s.pods.iter().filter(|p| !p.deleting).count() as u32;
    let mut doomed: Vec<&PodFacts> = s
        .pods
        .iter()
        .filter(|p| !p.deleting && victims.contains(p.slurm))
        .filter(|p| p.cost == Some(victim_cost))
        .collect();
    doomed.sort_by(|a, b| victim_order((a.jobs, a.slurm), (b.jobs, b.slurm)));
    doomed.truncate(live.saturating_sub(s.current) as usize);
    plan.victims
        .extend(doomed.iter().map(|p| p.slurm.to_owned()));
    let doomed_keys: FxHashSet<&str> = doomed.iter().map(|p| p.key).collect();
    let mut kept: Vec<&PodFacts> = s
        .pods
        .iter()
        .filter(|p| !p.deleting && victims.contains(p.slurm))
        .filter(|p| !doomed_keys.contains(p.key))
        .filter(|p| p.why_not_removable().is_none())
        .collect();
    kept.sort_by(|a, b| victim_order((a.jobs, a.slurm), (b.jobs, b.slurm)));
    kept.truncate(wanted);
    if s.may_pick && kept.len() < wanted {
        let mut fresh: Vec<&PodFacts> = s
            .pods
            .iter()
            .filter(|p| !victims.contains(p.slurm) && p.serving && p.idle_enough)
            .filter(|p| p.why_not_removable().is_none())
            .collect();
        fresh.sort_by(|a, b| victim_order((a.jobs, a.slurm), (b.jobs, b.slurm)));
        fresh.truncate(wanted - kept.len());
        kept.extend(fresh);
    }
    plan.victims.extend(kept.iter().map(|p| p.slurm.to_owned()));
    plan.mark = doomed
        .iter()
        .map(|p| p.key.to_owned())
        .chain(
            kept.iter()
                .filter(|p| p.safe_to_remove())
                .map(|p| p.key.to_owned()),
        )
        .collect();
    // Lower only when the controller can pick nothing but the marked,
    // DRAINED victims: every other pod serves and costs more, none is on
    // its way out, and the count is settled.
    let marked: FxHashSet<&str> = kept
        .iter()
        .filter(|p| p.safe_to_remove() && p.cost == Some(victim_cost) && !p.cost_unsettled)
        .map(|p| p.key)
        .collect();
    if marked.is_empty() {
        return;
    }
    let live = s.pods.iter().filter(|p| !p.deleting).count() as u32;
    let blocker = s
        .pods
        .iter()
        .filter(|p| !marked.contains(p.key))
        .find_map(|p| {
            if p.deleting {
                Some(format!("pod {} is being deleted", p.key))
            } else if p.cost_unsettled {
                Some(format!(
                    "lockstep's change of the deletion cost of pod {} does not show yet",
                    p.key
                ))
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
fn delete_pod(s: &ScaleIn<'_, '_>, victims: &FxHashSet<&str>, plan: &mut ScaleInPlan) {
    let wanted = s.current.saturating_sub(s.desired).saturating_sub(s.gone) as usize;
    // Pods already being deleted stay victims until gone.
    let mut kept: Vec<&PodFacts> = s
        .pods
        .iter()
        .filter(|p| victims.contains(p.slurm))
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
            .filter(|p| !victims.contains(p.slurm) && p.idle_enough)
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
/// pods it makes the controller remove are DRAINED and hold no job, or are
/// leaving anyway, hold none and can take none. `Err` says why not.
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
            let ordinals = Ordinals::of(&target.name, pods);
            for o in to..from {
                let p = ordinals
                    .at(o)
                    .next()
                    .ok_or_else(|| format!("pod {}-{o} is not known", target.name))?;
                if !p.passable() {
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

/// A StatefulSet's pods by ordinal, found by a binary search instead of a
/// walk of every pod: a scale-in of a large set asks for each ordinal it
/// passes.
struct Ordinals<'a, 'p> {
    pods: &'a [PodFacts<'p>],
    /// `(ordinal, index in pods)`, sorted: an ordinal's pods in the order of
    /// `pods` (two while a replacement starts beside a terminating pod).
    sorted: Vec<(u32, usize)>,
}

impl<'a, 'p> Ordinals<'a, 'p> {
    fn of(set: &str, pods: &'a [PodFacts<'p>]) -> Self {
        let mut sorted: Vec<(u32, usize)> = pods
            .iter()
            .enumerate()
            .filter_map(|(i, p)| ordinal(set, p.name).map(|o| (o, i)))
            .collect();
        sorted.sort_unstable();
        Self { pods, sorted }
    }

    /// The pods of ordinal `o`, in the order of `pods`.
    fn at(&self, o: u32) -> impl Iterator<Item = &'a PodFacts<'p>> + '_ {
        let from = self.sorted.partition_point(|&(x, _)| x < o);
        self.sorted[from..]
            .iter()
            .take_while(move |&&(x, _)| x == o)
            .map(|&(_, i)| &self.pods[i])
    }
}
