#[allow(clippy::wildcard_imports)]
use super::*;

impl Engine {
    /// Re-evaluates one Kubernetes node's maintenance (`maintenance` rows 1,
    /// 2, 4-6): its reservation, and the drain conditions lockstep shows.
    pub(super) fn eval_maintenance(&mut self, kube: &str, ctx: &Ctx<'_>, out: &mut Output) {
        if !self.model.kube_visible || !self.model.slurm_visible {
            return;
        }
        let policy = &self.policy;
        let mp = &policy.maintenance;
        let node = self.model.kube_nodes.get(kube).map(|e| &e.obs);
        let mut names = std::mem::take(&mut self.scratch_names);
        names.clear();
        if node.is_some() {
            self.model.slurm_nodes_on(kube, policy, &mut names);
            names.retain(|n| self.model.slurm_nodes.contains_key(n));
            names.sort();
        }
        let now = ctx.now_ms;
        let ctl = self.maintenance.get(kube);
        let reserved = ctl.and_then(|m| m.reserved.as_ref());
        let (want, mut wake) = maintenance::reservation(kube, node, mp, &names, reserved, now);
        let reservation = maintenance::reservation_step(want, reserved);
        let rule = match &reservation {
            Some(Action::SlurmUnreserve { .. }) => Rule::Release,
            _ => Rule::Reserve,
        };
        // Rows 4-6: how lockstep's drain of the node's Slurm nodes stands.
        let mut conditions: Vec<(String, Option<Action>)> = Vec::new();
        if mp.enabled && mp.node_conditions {
            let own = self.ownership();
            let mut all_out = !names.is_empty();
            let mut busy = false;
            for n in &names {
                let s = &self.model.slurm_nodes[n].obs;
                all_out &= SlurmSide::of(s, &own).owned_out();
                busy |= self.model.jobs_on(n) > 0 || scaling::slurm_busy(s);
            }
            let progress = match (all_out, busy) {
                (false, _) => maintenance::DrainProgress::NotDraining,
                (true, true) => maintenance::DrainProgress::Draining,
                (true, false) => maintenance::DrainProgress::Drained,
            };
            for t in [
                lockstep_schemas::DRAIN_IN_PROGRESS,
                lockstep_schemas::DRAINED,
            ] {
                let shown = node.and_then(|n| n.conditions.iter().find(|c| c.type_ == t));
                let want = node
                    .and(maintenance::drain_condition(t, progress, shown))
                    .map(|condition| Action::KubeSetNodeCondition {
                        node: kube.to_owned(),
                        condition,
                    });
                conditions.push((t.to_owned(), want));
            }
        }
        self.scratch_names = names;
        if reservation.is_none()
            && conditions.iter().all(|(_, w)| w.is_none())
            && self.maintenance.get(kube).is_none_or(MaintCtl::is_idle)
            && wake.is_none()
            && self.timers.get(WakeOf::Maint(kube)).is_none()
        {
            return;
        }
        let m = self.maintenance.entry(kube.to_owned()).or_default();
        let issue = |rule: Rule| Issue {
            seq: ctx.seq,
            now_ms: now,
            cause: ctx.event,
            rule: rule.name(),
        };
        let (_, w) = m.reservation_slot.reconcile(
            reservation,
            &issue(rule),
            &policy.actions,
            &mut out.actions,
        );
        if let Some(w) = w {
            min_wake(&mut wake, w);
        }
        for (t, want) in conditions {
            if let Some(w) = reconcile_keyed(
                &mut m.condition_slots,
                &t,
                want,
                &issue(Rule::DrainConditions),
                &policy.actions,
                &mut out.actions,
            ) {
                min_wake(&mut wake, w);
            }
        }
        self.timers.set(WakeOf::Maint(kube), wake);
        if wake.is_none() && m.is_idle() {
            self.maintenance.remove(kube);
        }
    }
}
