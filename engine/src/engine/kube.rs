#[allow(clippy::wildcard_imports)]
use super::*;

impl Engine {
    /// Re-evaluates one Kubernetes node's taints from the Slurm nodes on it.
    pub(super) fn eval_kube(&mut self, name: &str, ctx: &Ctx<'_>, out: &mut Output) {
        if !self.model.kube_visible {
            return;
        }
        let policy = &self.policy;
        let Some(entry) = self.model.kube_nodes.get(name) else {
            return;
        };
        let mut names = std::mem::take(&mut self.scratch_names);
        names.clear();
        self.model.slurm_nodes_on(name, policy, &mut names);
        let (mut unhealthy, mut held, mut foreign) = (false, false, false);
        for n in &names {
            if let Some(s) = self.model.slurm_nodes.get(n) {
                let side = SlurmSide::of(
                    &s.obs,
                    &Ownership {
                        prefix: &policy.drain.reason_prefix,
                        earlier_prefixes: &self.retired.prefixes,
                        slurm_user: policy.drain.slurm_user.as_deref(),
                    },
                );
                if self.ctl.get(n).is_some_and(|c| c.slurm_health.shown) {
                    // Shown and still unhealthy; or shown, recovered, and
                    // held by the hysteresis: that keeps a taint, never
                    // puts one on.
                    unhealthy |= side.unhealthy;
                    held |= !side.unhealthy;
                }
                foreign |= side.foreign_drain();
            }
        }
        self.scratch_names = names;
        if held && !unhealthy {
            let key = policy
                .health
                .unhealthy_taint
                .as_ref()
                .map(|t| t.key.as_str());
            unhealthy = entry.obs.taints.iter().any(|t| Some(t.key.as_str()) == key);
        }
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
        let mut wants: Vec<(String, Option<Action>, Rule)> = Vec::new();
        // Taints lockstep set under keys the policy no longer has.
        for key in &self.retired.taints {
            if rows
                .iter()
                .any(|(s, _, _)| s.is_some_and(|s| s.key == *key))
            {
                continue;
            }
            let present = entry.obs.taints.iter().any(|t| t.key == *key);
            let want = present.then(|| Action::KubeUntaintNode {
                node: name.to_owned(),
                key: key.clone(),
            });
            if want.is_some() || entry.taint_slots.iter().any(|(k, _)| k == key) {
                wants.push((key.clone(), want, Rule::Retired));
            }
        }
        for (spec, needed, rule) in rows {
            let Some(spec) = spec else { continue };
            let present = entry.obs.taints.iter().find(|t| t.key == spec.key);
            let want = match (needed, present) {
                (true, Some(t)) if t.value == spec.value && t.effect == spec.effect => None,
                (true, _) => Some(Action::KubeTaintNode {
                    node: name.to_owned(),
                    taint: Taint {
                        key: spec.key.clone(),
                        value: spec.value.clone(),
                        effect: spec.effect,
                    },
                }),
                (false, Some(_)) => Some(Action::KubeUntaintNode {
                    node: name.to_owned(),
                    key: spec.key.clone(),
                }),
                (false, None) => None,
            };
            if want.is_some() || entry.taint_slots.iter().any(|(k, _)| *k == spec.key) {
                wants.push((spec.key.clone(), want, rule));
            }
        }
        if wants.is_empty() {
            return;
        }
        let entry = self
            .model
            .kube_nodes
            .get_mut(name)
            .expect("looked up above");
        let mut wake = None;
        for (key, want, rule) in wants {
            let issue = Issue {
                seq: ctx.seq,
                now_ms: ctx.now_ms,
                cause: ctx.event,
                rule: rule.name(),
            };
            if let Some(w) = reconcile_keyed(
                &mut entry.taint_slots,
                &key,
                want,
                &issue,
                &policy.actions,
                &mut out.actions,
            ) {
                min_wake(&mut wake, w);
            }
        }
        self.timers.set(WakeOf::Kube(name), wake);
    }
}
