#[allow(clippy::wildcard_imports)]
use super::*;

use crate::shown::{self, OnNode, Want};

impl Engine {
    /// Re-evaluates one Kubernetes node's taints from the Slurm nodes on it
    /// (`shown` rows 4-6).
    pub(super) fn eval_kube(&mut self, name: &str, ctx: &Ctx<'_>, out: &mut Output) {
        if !self.model.kube_visible {
            return;
        }
        let policy = &self.policy;
        let Some(entry) = self.model.kube_nodes.get(name) else {
            return;
        };
        let mut names = std::mem::take(&mut self.scratch.names);
        names.clear();
        self.model.slurm_nodes_on(name, policy, &mut names);
        let own = self.ownership();
        let mut on = OnNode::default();
        for n in &names {
            if let Some(s) = self.model.slurm_nodes.get(n) {
                let side = SlurmSide::of(&s.obs, &own);
                if self.ctl.get(n).is_some_and(NodeCtl::slurm_health_shown) {
                    // Shown and still unhealthy; or shown, recovered, and
                    // held by the hysteresis: that keeps a taint, never puts
                    // one on.
                    on.unhealthy |= side.unhealthy;
                    on.held |= !side.unhealthy;
                }
                on.foreign |= side.held_by_other();
            }
        }
        self.scratch.names = names;
        let mut wants: Vec<Want<'_>> = Vec::new();
        let holds = |a: AspectRef<'_>| self.flights.holds(Key::Kube(name, a));
        shown::taint_wants(entry, on, policy, &self.retired, holds, &mut wants);
        if wants.is_empty() {
            return;
        }
        let mut wake = None;
        for (aspect, want, rule) in wants {
            let issue = ctx.issue(rule);
            let key = Key::Kube(name, aspect);
            self.flights.bring(
                key,
                want,
                &issue,
                &policy.actions,
                &mut out.actions,
                &mut wake,
            );
        }
        self.timers.set(WakeOf::Kube(name), wake);
    }
}
