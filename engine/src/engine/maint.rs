#[allow(clippy::wildcard_imports)]
use super::*;

use crate::maintenance::DrainProgress;

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
        let mut names = std::mem::take(&mut self.scratch.names);
        names.clear();
        if node.is_some() {
            self.model.slurm_nodes_on(kube, policy, &mut names);
            names.retain(|n| self.model.slurm_nodes.contains_key(n));
            names.sort();
        }
        let now = ctx.now_ms;
        let reserved = self.reservations.get(kube);
        let (want, mut wake) = maintenance::reservation(kube, node, mp, &names, reserved, now);
        let reservation = maintenance::reservation_step(want, reserved);
        let rule = match &reservation {
            Some(Action::SlurmUnreserve { .. }) => Rule::Release,
            _ => Rule::Reserve,
        };
        // Rows 4-6: how lockstep's drain of the node's Slurm nodes stands.
        let conditions = match node.filter(|_| mp.enabled && mp.node_conditions) {
            Some(node) => {
                let own = self.ownership();
                let progress = DrainProgress::of(names.iter().map(|n| {
                    let s = &self.model.slurm_nodes[n].obs;
                    let runs = self.model.jobs_on(n) > 0 || scaling::slurm_busy(s);
                    (SlurmSide::of(s, &own).owned_out(), runs)
                }));
                maintenance::drain_conditions(node, progress)
            }
            None if mp.enabled && mp.node_conditions => [
                lockstep_schemas::DRAIN_IN_PROGRESS,
                lockstep_schemas::DRAINED,
            ]
            .map(|t| (t, None)),
            None => [("", None), ("", None)],
        };
        self.scratch.names = names;
        let flights = &mut self.flights;
        let key = Key::Kube(kube, AspectRef::Reservation);
        flights.bring(
            key,
            reservation,
            &ctx.issue(rule),
            &policy.actions,
            &mut out.actions,
            &mut wake,
        );
        for (t, want) in conditions.into_iter().filter(|(t, _)| !t.is_empty()) {
            let key = Key::Kube(kube, AspectRef::Condition(t));
            let issue = ctx.issue(Rule::DrainConditions);
            flights.bring(
                key,
                want,
                &issue,
                &policy.actions,
                &mut out.actions,
                &mut wake,
            );
        }
        self.timers.set(WakeOf::Maint(kube), wake);
    }

    /// Whether a Kubernetes node has maintenance state: a reservation, an
    /// action of its maintenance not settled, or a timer.
    pub(super) fn maintained(&self, kube: &str) -> bool {
        self.reservations.contains_key(kube)
            || self
                .flights
                .owner_holds(Owner::KubeNode, kube, Aspect::is_maintenance)
            || self.timers.get(WakeOf::Maint(kube)).is_some()
    }
}
