#[allow(clippy::wildcard_imports)]
use super::*;

impl Engine {
    /// Re-evaluates every scale target: desired replicas, scale-up, picking,
    /// draining and deleting victims, lowering replicas, rolling replacement.
    pub(super) fn eval_scaling(&mut self, ctx: &Ctx<'_>, out: &mut Output) {
        let now = ctx.now_ms;
        let rules = self.policy.scaling.targets.clone();
        // Victims of targets no longer scaled are dropped (their drains lift).
        let stale: Vec<String> = self
            .victims
            .iter()
            .filter(|(_, v)| !rules.iter().any(|r| r.target == v.target))
            .map(|(n, _)| n.clone())
            .collect();
        let timeout_ms = ms(self.policy.actions.timeout_s);
        for n in stale {
            if let Some(v) = self.victims.remove(&n) {
                self.flights
                    .park(Owner::Pod, &v.pod_key, Aspect::is_delete, now, timeout_ms);
            }
            self.touch_slurm(&n);
        }
        let mut wake: Option<u64> = None;
        // A victim picked now may already be DRAINED (its node was drained
        // for another cause): no change of it will come to bring scaling
        // back, so the next evaluation is due anyway.
        let mut added_victims = false;
        let visible = self.model.slurm_visible && self.model.kube_visible;
        let scan_all =
            std::mem::take(&mut self.scale_scan_needed) || self.scale_busy.len() != rules.len();
        if scan_all {
            self.scale_busy = vec![0; rules.len()];
            self.scale_rollout = vec![true; rules.len()];
            self.scale_rule_of.clear();
        }
        for (index, rule) in rules.iter().enumerate() {
            let Some(target) = self
                .model
                .scale_targets
                .get(&rule.target)
                .map(|t| t.obs.clone())
            else {
                continue;
            };
            let current = target.replicas;
            // Fast path: nothing but job counts changed since the last scan,
            // no victims, no rollout, and no scale-in wanted: only the
            // replica count can need a change, and the busy count is current.
            if !scan_all
                && !self.scale_rollout[index]
                && !self.victims.values().any(|v| v.target == rule.target)
            {
                let pending = self.model.pending_nodes(&rule.partition);
                let desired = scaling::desired(
                    self.scale_busy[index],
                    pending,
                    rule.min_replicas,
                    rule.max_replicas,
                );
                if desired >= current {
                    let ctl = self.scale.entry(rule.target.clone()).or_default();
                    ctl.desired = Some(desired);
                    ctl.blocked = None;
                    let counts = Replicas {
                        current,
                        desired,
                        lower_to: None,
                    };
                    let flights = &mut self.flights;
                    let policy = &self.policy.actions;
                    reconcile_replicas(ctl, flights, rule, counts, ctx, policy, &mut wake, out);
                    continue;
                }
            }
            // The target's pods, with what scaling needs to know of each.
            let removal = self.policy.scaling.removal_of(&rule.target);
            let idle_ms = ms(rule.idle_before_scale_down_s);
            let cost_key = scaling::COST_LABEL;
            let mut pods: Vec<PodFacts> = Vec::new();
            let mut idle_at: Vec<u64> = Vec::new();
            for (key, entry) in &self.model.pods {
                let p = &entry.obs;
                let owned = p.namespace == rule.target.namespace
                    && p.owner
                        .as_ref()
                        .is_some_and(|o| scaling::owned_by(&rule.target, &o.kind, &o.name));
                if !owned {
                    continue;
                }
                let Some(slurm) = slurm_name_of_pod(p, &self.policy) else {
                    continue;
                };
                let node = self.model.slurm_nodes.get(slurm).map(|n| &n.obs);
                let jobs = self.model.jobs_on(slurm);
                let busy = jobs > 0 || node.is_some_and(scaling::slurm_busy);
                let idle_enough = match self.idle_since.get(slurm).copied() {
                    Some(t) if after_ms(t, idle_ms) <= now => true,
                    Some(t) => {
                        if !busy && !self.victims.contains_key(slurm) {
                            idle_at.push(after_ms(t, idle_ms));
                        }
                        false
                    }
                    None => false,
                };
                pods.push(PodFacts {
                    key,
                    name: &p.name,
                    uid: &p.uid,
                    slurm,
                    jobs,
                    busy,
                    known: node.is_some(),
                    drained: node.is_some_and(|n| scaling::drained(n, jobs)),
                    deleting: p.deleting,
                    serving: p.running_and_ready() && p.node_name.is_some(),
                    idle_enough,
                    cost: p.labels.get(cost_key).map_or(Some(0), |c| c.parse().ok()),
                    revision: p.revision.as_deref(),
                });
            }
            // Decisions below must not depend on the hash map's order (it
            // differs after a restore).
            pods.sort_unstable_by(|a, b| a.key.cmp(b.key));
            // Busy Slurm nodes, each once even while two pods claim it (a
            // replacement starting beside a terminating pod).
            let busy = pods
                .iter()
                .filter(|p| p.busy)
                .map(|p| p.slurm)
                .collect::<std::collections::BTreeSet<_>>()
                .len() as u32;
            self.scale_busy[index] = busy;
            for p in &pods {
                if !self.scale_rule_of.contains_key(p.slurm) {
                    self.scale_rule_of.insert(p.slurm.to_owned(), index);
                }
            }
            self.scale_rollout[index] = target
                .update_revision
                .as_deref()
                .is_some_and(|rev| pods.iter().any(|p| p.revision.is_some_and(|r| r != rev)));
            let pending = self.model.pending_nodes(&rule.partition);
            let desired = scaling::desired(busy, pending, rule.min_replicas, rule.max_replicas);
            let ctl = self.scale.entry(rule.target.clone()).or_default();
            ctl.desired = Some(desired);
            let mut touched = Vec::new();

            // Rolling replacement victims: settle once their pod is gone,
            // delete it once DRAINED.
            let replacing: Vec<String> = self
                .victims
                .iter()
                .filter(|(_, v)| v.target == rule.target && v.kind == VictimKind::Replace)
                .map(|(n, _)| n.clone())
                .collect();
            for node in &replacing {
                let v = self.victims.get_mut(node).expect("listed above");
                let Some(pod) = pods.iter().find(|p| p.key == v.pod_key && p.uid == v.uid) else {
                    if let Some(v) = self.victims.remove(node) {
                        self.flights.park(
                            Owner::Pod,
                            &v.pod_key,
                            Aspect::is_delete,
                            now,
                            timeout_ms,
                        );
                    }
                    touched.push(node.clone());
                    continue;
                };
                // Fail closed: delete only what is surely drained and idle.
                let safe = visible && pod.known && pod.drained && pod.jobs == 0 && !pod.busy;
                let want = (safe && !pod.deleting).then(|| delete_action(pod));
                let issue = Issue {
                    seq: ctx.seq,
                    now_ms: now,
                    cause: ctx.event,
                    rule: Rule::Scaling.name(),
                };
                let key = Key::Pod(&v.pod_key, AspectRef::Delete);
                let (_, w) = self.flights.reconcile(
                    key,
                    want,
                    &issue,
                    &self.policy.actions,
                    &mut out.actions,
                );
                if let Some(w) = w {
                    min_wake(&mut wake, w);
                }
            }

            // Scale-in victims whose pods are gone: settled, except that
            // with `delete_pod` they are counted off `replicas` first.
            let scale_in: Vec<String> = self
                .victims
                .iter()
                .filter(|(_, v)| v.target == rule.target && v.kind == VictimKind::ScaleIn)
                .map(|(n, _)| n.clone())
                .collect();
            let mut present: Vec<&str> = Vec::new();
            let mut gone = 0u32;
            for node in &scale_in {
                let v = self.victims.get_mut(node).expect("listed above");
                if let Some(p) = pods.iter().find(|p| p.key == v.pod_key && p.uid == v.uid) {
                    present.push(p.slurm);
                    continue;
                }
                let counted = removal == Some(Removal::DeletePod) && desired < current;
                match v.gone_at_replicas {
                    _ if !counted => {}
                    None => {
                        v.gone_at_replicas = Some(current);
                        gone += 1;
                        continue;
                    }
                    Some(at) if current >= at => {
                        gone += 1;
                        continue;
                    }
                    Some(_) => {}
                }
                if let Some(v) = self.victims.remove(node) {
                    self.flights
                        .park(Owner::Pod, &v.pod_key, Aspect::is_delete, now, timeout_ms);
                }
                touched.push(node.clone());
            }
            let down_ready_at = ctl
                .last_down_ms
                .map_or(0, |t| after_s(t, rule.scale_down_cooldown_s));
            let may_pick = now >= down_ready_at;
            if desired < current && visible && !may_pick {
                min_wake(&mut wake, down_ready_at);
            }
            let mut plan = scaling::plan_scale_in(&ScaleIn {
                removal,
                target: &rule.target,
                current,
                desired,
                pods: &pods,
                victims: &present,
                gone,
                may_pick,
                visible,
            });
            if desired < current && visible && may_pick {
                for at in idle_at {
                    min_wake(&mut wake, at);
                }
            }
            if let Some(to) = plan.lower_to {
                if let Err(why) =
                    scaling::lowering_allowed(removal, &rule.target, &pods, current, to, visible)
                {
                    plan.lower_to = None;
                    plan.blocked = Some((None, why));
                }
            }
            let live: Vec<(String, String, String)> = pods
                .iter()
                .map(|p| (p.slurm.to_owned(), p.key.to_owned(), p.uid.to_owned()))
                .collect();
            drop(pods);

            // Victims: drop the ones no longer wanted, add the new ones.
            for node in present.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>() {
                if !plan.victims.contains(&node) {
                    if let Some(v) = self.victims.remove(&node) {
                        self.flights.park(
                            Owner::Pod,
                            &v.pod_key,
                            Aspect::is_delete,
                            now,
                            timeout_ms,
                        );
                    }
                    touched.push(node);
                }
            }
            let mut picked = false;
            for node in &plan.victims {
                if self.victims.contains_key(node) {
                    continue;
                }
                let Some((_, key, uid)) = live.iter().find(|(s, _, _)| s == node) else {
                    continue;
                };
                self.flights.adopt(Owner::Pod, key, Aspect::is_delete);
                self.victims.insert(
                    node.clone(),
                    Victim {
                        target: rule.target.clone(),
                        kind: VictimKind::ScaleIn,
                        pod_key: key.clone(),
                        uid: uid.clone(),
                        gone_at_replicas: None,
                    },
                );
                touched.push(node.clone());
                picked = true;
                added_victims = true;
            }
            let ctl = self.scale.get_mut(&rule.target).expect("inserted above");
            if picked {
                ctl.last_down_ms = Some(now);
            }
            // `delete_pod`: delete each DRAINED victim's pod.
            for v in self
                .victims
                .values_mut()
                .filter(|v| v.target == rule.target && v.kind == VictimKind::ScaleIn)
            {
                let want = plan.delete.contains(&v.pod_key).then(|| {
                    let (namespace, pod) = v
                        .pod_key
                        .split_once('/')
                        .expect("pod keys are namespace/name");
                    Action::KubeDeletePod {
                        namespace: namespace.to_owned(),
                        pod: pod.to_owned(),
                        uid: v.uid.clone(),
                    }
                });
                let issue = Issue {
                    seq: ctx.seq,
                    now_ms: now,
                    cause: ctx.event,
                    rule: Rule::Scaling.name(),
                };
                let key = Key::Pod(&v.pod_key, AspectRef::Delete);
                let (_, w) = self.flights.reconcile(
                    key,
                    want,
                    &issue,
                    &self.policy.actions,
                    &mut out.actions,
                );
                if let Some(w) = w {
                    min_wake(&mut wake, w);
                }
            }
            // `deletion_cost`: the lowest cost on DRAINED victims, and on no
            // other pod of the target.
            for (_, key, _) in &live {
                let Some(entry) = self.model.pods.get(key) else {
                    continue;
                };
                let has = entry.obs.labels.get(cost_key).map(String::as_str);
                let marked = plan.mark.contains(key);
                let value = match (marked, has) {
                    (true, Some(scaling::VICTIM_COST)) | (false, None) => None,
                    (true, _) => Some(Some(scaling::VICTIM_COST.to_owned())),
                    (false, Some(scaling::VICTIM_COST)) => Some(None),
                    (false, Some(_)) => None,
                };
                let want = value.map(|value| Action::KubeLabelPod {
                    namespace: entry.obs.namespace.clone(),
                    pod: entry.obs.name.clone(),
                    key: cost_key.to_owned(),
                    value,
                });
                let issue = Issue {
                    seq: ctx.seq,
                    now_ms: now,
                    cause: ctx.event,
                    rule: Rule::Scaling.name(),
                };
                let key = Key::Pod(key, AspectRef::Label(cost_key));
                let (_, w) = self.flights.reconcile(
                    key,
                    want,
                    &issue,
                    &self.policy.actions,
                    &mut out.actions,
                );
                if let Some(w) = w {
                    min_wake(&mut wake, w);
                }
            }

            // Rolling replacement of pods of an old revision.
            if let (Some(rev), true) = (&target.update_revision, visible) {
                let replacing = self
                    .victims
                    .values()
                    .filter(|v| v.target == rule.target && v.kind == VictimKind::Replace)
                    .count() as u32;
                let room = rule.max_unavailable.saturating_sub(replacing) as usize;
                let mut old: Vec<(u32, String, String, String)> = Vec::new();
                for (key, entry) in &self.model.pods {
                    let p = &entry.obs;
                    let Some((slurm, _, uid)) = live.iter().find(|(_, k, _)| k == key) else {
                        continue;
                    };
                    if p.revision.as_ref().is_none_or(|r| r == rev)
                        || self.victims.contains_key(slurm)
                        || p.deleting
                        || !self.model.slurm_nodes.contains_key(slurm)
                    {
                        continue;
                    }
                    old.push((
                        self.model.jobs_on(slurm),
                        slurm.clone(),
                        key.clone(),
                        uid.clone(),
                    ));
                }
                old.sort_by(|a, b| scaling::victim_order((a.0, &a.1), (b.0, &b.1)));
                for (_, slurm, key, uid) in old.into_iter().take(room) {
                    self.flights.adopt(Owner::Pod, &key, Aspect::is_delete);
                    self.victims.insert(
                        slurm.clone(),
                        Victim {
                            target: rule.target.clone(),
                            kind: VictimKind::Replace,
                            pod_key: key,
                            uid,
                            gone_at_replicas: None,
                        },
                    );
                    touched.push(slurm);
                    added_victims = true;
                }
            }

            // Why scale-in stops short, once per change, in the audit trail.
            let blocked = plan
                .blocked
                .filter(|_| desired < current)
                .map(|(node, why)| {
                    let detail = format!(
                        "scale-in of {} from {current} toward {desired} stops: {why}",
                        rule.target
                    );
                    (node, detail)
                });
            let ctl = self.scale.get_mut(&rule.target).expect("inserted above");
            if blocked.as_ref().map(|(_, d)| d) != ctl.blocked.as_ref() {
                ctl.blocked = blocked.as_ref().map(|(_, d)| d.clone());
                if let Some((node, detail)) = blocked {
                    let node = node.unwrap_or_else(|| rule.target.to_string());
                    let phase = self
                        .ctl
                        .get(&node)
                        .map_or(Phase::Unknown, |c| c.status.phase);
                    out.transitions.push(Transition {
                        seq: ctx.seq,
                        time_ms: now,
                        node,
                        from: phase,
                        to: phase,
                        rule: Rule::Scaling,
                        cause: ctx.event.clone(),
                        detail,
                    });
                }
            }

            // The replica count: up at once (after the cooldown); down as
            // the plan says, never below the demand of this moment.
            let ctl = self.scale.get_mut(&rule.target).expect("inserted above");
            let counts = Replicas {
                current,
                desired,
                lower_to: plan.lower_to,
            };
            let flights = &mut self.flights;
            let policy = &self.policy.actions;
            reconcile_replicas(ctl, flights, rule, counts, ctx, policy, &mut wake, out);
            for n in touched {
                self.touch_slurm(&n);
            }
        }
        // The nodes touched above are evaluated in this same record.
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for w in &dirty {
            match w {
                Wake::Slurm(n) => self.eval_slurm(n, ctx, out),
                Wake::Kube(n) => self.eval_kube(n, ctx, out),
                Wake::Maint(n) => self.eval_maintenance(n, ctx, out),
                Wake::Scale => {}
            }
        }
        dirty.clear();
        self.dirty = dirty;
        if added_victims {
            min_wake(
                &mut wake,
                after_s(now, self.policy.scaling.evaluate_every_s),
            );
        }
        self.timers.set(WakeOf::Scale, wake);
    }
}

/// A scale target's replica count now, what demand wants, and how far the
/// scale-in plan found it safe to lower it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Replicas {
    current: u32,
    desired: u32,
    lower_to: Option<u32>,
}

/// The replica count a scale target should have now: up to `desired` at
/// once (after the cooldown), down to `lower_to` (what the scale-in plan
/// found safe), never below `desired`.
#[allow(clippy::too_many_arguments)]
pub(super) fn reconcile_replicas(
    ctl: &mut ScaleCtl,
    flights: &mut Flights,
    rule: &lockstep_schemas::ScaleRule,
    Replicas {
        current,
        desired,
        lower_to,
    }: Replicas,
    ctx: &Ctx<'_>,
    policy: &lockstep_schemas::ActionPolicy,
    wake: &mut Option<u64>,
    out: &mut Output,
) {
    let now = ctx.now_ms;
    let up_ready_at = ctl
        .last_up_ms
        .map_or(0, |t| after_s(t, rule.scale_up_cooldown_s));
    let want = if desired > current {
        if now >= up_ready_at {
            Some(desired)
        } else {
            min_wake(wake, up_ready_at);
            None
        }
    } else {
        lower_to.map(|to| to.max(desired).max(rule.min_replicas))
    };
    let want = want
        .filter(|&r| r != current)
        .map(|replicas| Action::KubeScale {
            target: rule.target.clone(),
            replicas,
        });
    let issue = Issue {
        seq: ctx.seq,
        now_ms: now,
        cause: ctx.event,
        rule: Rule::Scaling.name(),
    };
    let before = out.actions.len();
    let key = Key::Scale(&rule.target);
    let (_, w) = flights.reconcile(key, want, &issue, policy, &mut out.actions);
    if out.actions[before..]
        .iter()
        .any(|a| matches!(a.action, Action::KubeScale { replicas, .. } if replicas > current))
    {
        ctl.last_up_ms = Some(now);
    }
    if let Some(w) = w {
        min_wake(wake, w);
    }
}

/// Deletes a pod, only if its UID is still the one scaling looked at.
pub(super) fn delete_action(pod: &PodFacts<'_>) -> Action {
    let (namespace, name) = pod
        .key
        .split_once('/')
        .expect("pod keys are namespace/name");
    Action::KubeDeletePod {
        namespace: namespace.to_owned(),
        pod: name.to_owned(),
        uid: pod.uid.to_owned(),
    }
}
