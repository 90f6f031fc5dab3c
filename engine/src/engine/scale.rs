#[allow(clippy::wildcard_imports)]
use super::*;

use lockstep_schemas::{KubeScaleTarget, ScaleRule};

/// A scale target's evaluation after its scale-in plan: what the plan
/// wants, and the target's pods as `(Slurm node, pod key, UID)`.
struct Planned {
    current: u32,
    desired: u32,
    plan: scaling::ScaleInPlan,
    /// Scale-in victims whose pods are still there.
    present: Vec<String>,
    live: Vec<(String, String, String)>,
}

/// What evaluating one scale target did that the loop acts on.
#[derive(Default)]
struct Looked {
    /// Slurm nodes whose victim status changed.
    touched: Vec<String>,
    /// A victim was picked: the next evaluation is due (one already
    /// DRAINED for another cause brings no change that would call it).
    added_victims: bool,
}

impl Engine {
    /// Re-evaluates every scale target: desired replicas, scale-up, picking,
    /// draining and deleting victims, lowering replicas, rolling replacement.
    pub(super) fn eval_scaling(&mut self, ctx: &Ctx<'_>, out: &mut Output) {
        let now = ctx.now_ms;
        let rules = self.policy.scaling.targets.clone();
        // Victims of targets no longer scaled are dropped (their drains lift).
        let stale: Vec<String> = self
            .scaling
            .victims
            .iter()
            .filter(|(_, v)| !rules.iter().any(|r| r.target == v.target))
            .map(|(n, _)| n.clone())
            .collect();
        for n in stale {
            self.drop_victim(&n, now);
            self.touch_slurm(&n);
        }
        let mut wake: Option<u64> = None;
        let mut added_victims = false;
        let scan_all =
            std::mem::take(&mut self.scaling.scan_needed) || self.scaling.busy.len() != rules.len();
        if scan_all {
            self.scaling.busy = vec![0; rules.len()];
            self.scaling.rollout = vec![true; rules.len()];
            self.scaling.rule_of.clear();
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
            if !scan_all && self.scale_fast(index, rule, &target, ctx, &mut wake, out) {
                continue;
            }
            let looked = self.scale_target(index, rule, &target, ctx, &mut wake, out);
            added_victims |= looked.added_victims;
            for n in looked.touched {
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

    /// The fast path: nothing but job counts changed since the last scan, no
    /// victims, no rollout, and no scale-in wanted: only the replica count
    /// can need a change, and the busy count is current. Whether it applied.
    fn scale_fast(
        &mut self,
        index: usize,
        rule: &ScaleRule,
        target: &KubeScaleTarget,
        ctx: &Ctx<'_>,
        wake: &mut Option<u64>,
        out: &mut Output,
    ) -> bool {
        if self.scaling.rollout[index]
            || self
                .scaling
                .victims
                .values()
                .any(|v| v.target == rule.target)
        {
            return false;
        }
        let current = target.replicas;
        let pending = self.model.pending_nodes(&rule.partition);
        let desired = scaling::desired(
            self.scaling.busy[index],
            pending,
            rule.min_replicas,
            rule.max_replicas,
        );
        if desired < current {
            return false;
        }
        let ctl = self.scaling.targets.entry(rule.target.clone()).or_default();
        ctl.desired = Some(desired);
        ctl.blocked = None;
        let counts = Replicas {
            current,
            desired,
            lower_to: None,
        };
        let flights = &mut self.flights;
        let policy = &self.policy.actions;
        reconcile_replicas(ctl, flights, rule, counts, ctx, policy, wake, out);
        true
    }

    /// One scale target, scanned: its plan, its victims, their pods'
    /// deletion and deletion cost, rolling replacement, why scale-in stops
    /// short, and the replica count.
    fn scale_target(
        &mut self,
        index: usize,
        rule: &ScaleRule,
        target: &KubeScaleTarget,
        ctx: &Ctx<'_>,
        wake: &mut Option<u64>,
        out: &mut Output,
    ) -> Looked {
        let mut looked = Looked::default();
        let planned = self.plan_target(index, rule, target, ctx, wake, &mut looked, out);
        let now = ctx.now_ms;
        // Victims: drop the ones no longer wanted, add the new ones.
        for node in &planned.present {
            if !planned.plan.victims.contains(node) {
                self.drop_victim(node, now);
                looked.touched.push(node.clone());
            }
        }
        let mut picked = false;
        for node in &planned.plan.victims {
            if self.scaling.victims.contains_key(node) {
                continue;
            }
            let Some((_, key, uid)) = planned.live.iter().find(|(s, _, _)| s == node) else {
                continue;
            };
            self.add_victim(node, rule, VictimKind::ScaleIn, key, uid);
            looked.touched.push(node.clone());
            picked = true;
            looked.added_victims = true;
        }
        let ctl = self
            .scaling
            .targets
            .get_mut(&rule.target)
            .expect("made by the plan");
        if picked {
            ctl.last_down_ms = Some(now);
        }
        self.delete_victim_pods(rule, &planned.plan, ctx, wake, out);
        self.mark_deletion_cost(&planned, ctx, wake, out);
        if self.model.slurm_visible && self.model.kube_visible {
            self.pick_replacements(rule, target, &planned.live, &mut looked);
        }
        self.report_blocked(rule, &planned, ctx, out);
        // The replica count: up at once (after the cooldown); down as the
        // plan says, never below the demand of this moment.
        let ctl = self
            .scaling
            .targets
            .get_mut(&rule.target)
            .expect("made by the plan");
        let counts = Replicas {
            current: planned.current,
            desired: planned.desired,
            lower_to: planned.plan.lower_to,
        };
        let flights = &mut self.flights;
        let policy = &self.policy.actions;
        reconcile_replicas(ctl, flights, rule, counts, ctx, policy, wake, out);
        looked
    }

    /// Scans a target's pods: the busy count, the rollout, the desired
    /// count; settles replacement and scale-in victims whose pods are gone
    /// and deletes replaced pods once DRAINED; plans the scale-in.
    #[allow(clippy::too_many_arguments)]
    fn plan_target(
        &mut self,
        index: usize,
        rule: &ScaleRule,
        target: &KubeScaleTarget,
        ctx: &Ctx<'_>,
        wake: &mut Option<u64>,
        looked: &mut Looked,
        out: &mut Output,
    ) -> Planned {
        let now = ctx.now_ms;
        let current = target.replicas;
        let visible = self.model.slurm_visible && self.model.kube_visible;
        let removal = self.policy.scaling.removal_of(&rule.target);
        let (pods, idle_at) = scaling::pod_facts(
            &self.model,
            &self.policy,
            rule,
            &self.scaling.idle_since,
            &self.scaling.victims,
            |slurm| self.slurm_unseen(slurm),
            now,
        );
        // Busy Slurm nodes, each once even while two pods claim it (a
        // replacement starting beside a terminating pod).
        let busy = pods
            .iter()
            .filter(|p| p.busy)
            .map(|p| p.slurm)
            .collect::<std::collections::BTreeSet<_>>()
            .len() as u32;
        self.scaling.busy[index] = busy;
        for p in &pods {
            if !self.scaling.rule_of.contains_key(p.slurm) {
                self.scaling.rule_of.insert(p.slurm.to_owned(), index);
            }
        }
        self.scaling.rollout[index] = target
            .update_revision
            .as_deref()
            .is_some_and(|rev| pods.iter().any(|p| p.revision.is_some_and(|r| r != rev)));
        let pending = self.model.pending_nodes(&rule.partition);
        let desired = scaling::desired(busy, pending, rule.min_replicas, rule.max_replicas);
        let ctl = self.scaling.targets.entry(rule.target.clone()).or_default();
        ctl.desired = Some(desired);
        let down_ready_at = ctl
            .last_down_ms
            .map_or(0, |t| after_s(t, rule.scale_down_cooldown_s));

        let mut book = Victims {
            victims: &mut self.scaling.victims,
            flights: &mut self.flights,
            rule,
            pods: &pods,
            now,
            timeout_ms: ms(self.policy.actions.timeout_s),
        };
        let policy = &self.policy.actions;
        book.settle_replacements(visible, ctx, policy, wake, looked, out);
        let counted = removal == Some(Removal::DeletePod) && desired < current;
        let (present, gone) = book.settle_scale_in(counted, current, looked);
        let may_pick = now >= down_ready_at;
        if desired < current && visible && !may_pick {
            min_wake(wake, down_ready_at);
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
                min_wake(wake, at);
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
        Planned {
            current,
            desired,
            plan,
            present: present.iter().map(|s| (*s).to_owned()).collect(),
            live: pods
                .iter()
                .map(|p| (p.slurm.to_owned(), p.key.to_owned(), p.uid.to_owned()))
                .collect(),
        }
    }

    /// A victim no longer wanted: its pod's deletion, if in flight, is
    /// parked.
    fn drop_victim(&mut self, node: &str, now: u64) {
        if let Some(v) = self.scaling.victims.remove(node) {
            let timeout_ms = ms(self.policy.actions.timeout_s);
            self.flights
                .park(Owner::Pod, &v.pod_key, Aspect::is_delete, now, timeout_ms);
        }
    }

    /// A new victim: it takes back a deletion of its pod still in flight.
    fn add_victim(&mut self, node: &str, rule: &ScaleRule, kind: VictimKind, key: &str, uid: &str) {
        self.flights.adopt(Owner::Pod, key, Aspect::is_delete);
        self.scaling.victims.insert(
            node.to_owned(),
            Victim {
                target: rule.target.clone(),
                kind,
                pod_key: key.to_owned(),
                uid: uid.to_owned(),
                gone_at_replicas: None,
            },
        );
    }

    /// `delete_pod`: delete each DRAINED victim's pod (`scaling.delete_pod`).
    fn delete_victim_pods(
        &mut self,
        rule: &ScaleRule,
        plan: &scaling::ScaleInPlan,
        ctx: &Ctx<'_>,
        wake: &mut Option<u64>,
        out: &mut Output,
    ) {
        for v in self
            .scaling
            .victims
            .values()
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
            let issue = ctx.issue(Rule::DeletePod);
            let key = Key::Pod(&v.pod_key, AspectRef::Delete);
            let policy = &self.policy.actions;
            self.flights
                .bring(key, want, &issue, policy, &mut out.actions, wake);
        }
    }

    /// `deletion_cost`: the lowest cost on DRAINED victims, and on no other
    /// pod of the target (`scaling.deletion_cost`).
    fn mark_deletion_cost(
        &mut self,
        planned: &Planned,
        ctx: &Ctx<'_>,
        wake: &mut Option<u64>,
        out: &mut Output,
    ) {
        let cost_key = scaling::COST_LABEL;
        for (_, key, _) in &planned.live {
            let Some(entry) = self.model.pods.get(key) else {
                continue;
            };
            let marked = planned.plan.mark.contains(key);
            let want = scaling::cost_want(&entry.obs, marked);
            let issue = ctx.issue(Rule::DeletionCost);
            let key = Key::Pod(key, AspectRef::Label(cost_key));
            let policy = &self.policy.actions;
            self.flights
                .bring(key, want, &issue, policy, &mut out.actions, wake);
        }
    }

    /// Rolling replacement: pods of an old revision become victims, at most
    /// `max_unavailable` at a time, those with the fewest jobs first.
    fn pick_replacements(
        &mut self,
        rule: &ScaleRule,
        target: &KubeScaleTarget,
        live: &[(String, String, String)],
        looked: &mut Looked,
    ) {
        let Some(rev) = &target.update_revision else {
            return;
        };
        let replacing = self
            .scaling
            .victims
            .values()
            .filter(|v| v.target == rule.target && v.kind == VictimKind::Replace)
            .count() as u32;
        let room = rule.max_unavailable.saturating_sub(replacing) as usize;
        let mut old: Vec<(u32, String, String, String)> = Vec::new();
        for (key, entry) in &self.model.pods {
            let p = &entry.obs;
            if p.revision.as_ref().is_none_or(|r| r == rev) {
                continue;
            }
            // `live` is sorted by pod key, each key once (`pod_facts`): a
            // look-up per pod, not a walk of every pod of the target.
            let Ok(at) = live.binary_search_by(|(_, k, _)| k.as_str().cmp(key.as_str())) else {
                continue;
            };
            let (slurm, _, uid) = &live[at];
            if self.scaling.victims.contains_key(slurm)
                || p.deleting
                || !self.model.slurm_nodes.contains_key(slurm)
            {
                continue;
            }
            let jobs = self.model.jobs_on(slurm);
            old.push((jobs, slurm.clone(), key.clone(), uid.clone()));
        }
        old.sort_by(|a, b| scaling::victim_order((a.0, &a.1), (b.0, &b.1)));
        for (_, slurm, key, uid) in old.into_iter().take(room) {
            self.add_victim(&slurm, rule, VictimKind::Replace, &key, &uid);
            looked.touched.push(slurm);
            looked.added_victims = true;
        }
    }

    /// Why scale-in stops short, once per change, in the audit trail
    /// (`scaling.blocked`).
    fn report_blocked(
        &mut self,
        rule: &ScaleRule,
        planned: &Planned,
        ctx: &Ctx<'_>,
        out: &mut Output,
    ) {
        let (current, desired) = (planned.current, planned.desired);
        let blocked = planned
            .plan
            .blocked
            .as_ref()
            .filter(|_| desired < current)
            .map(|(node, why)| {
                let detail = format!(
                    "scale-in of {} from {current} toward {desired} stops: {why}",
                    rule.target
                );
                (node.clone(), detail)
            });
        let ctl = self
            .scaling
            .targets
            .get_mut(&rule.target)
            .expect("made by the plan");
        if blocked.as_ref().map(|(_, d)| d) == ctl.blocked.as_ref() {
            return;
        }
        ctl.blocked = blocked.as_ref().map(|(_, d)| d.clone());
        let Some((node, detail)) = blocked else {
            return;
        };
        let node = node.unwrap_or_else(|| rule.target.to_string());
        let phase = self
            .ctl
            .get(&node)
            .map_or(Phase::Unknown, |c| c.status.phase);
        out.transitions.push(Transition {
            seq: ctx.seq,
            time_ms: ctx.now_ms,
            node,
            from: phase,
            to: phase,
            rule: Rule::ScaleInBlocked,
            cause: ctx.event.clone(),
            detail,
        });
    }
}

/// One target's victims, settled against its pods as scanned.
struct Victims<'a, 'p> {
    victims: &'a mut BTreeMap<String, Victim>,
    flights: &'a mut Flights,
    rule: &'a ScaleRule,
    pods: &'a [PodFacts<'p>],
    now: u64,
    timeout_ms: u64,
}

impl<'p> Victims<'_, 'p> {
    /// Victims of this target of one kind.
    fn of_kind(&self, kind: VictimKind) -> Vec<String> {
        self.victims
            .iter()
            .filter(|(_, v)| v.target == self.rule.target && v.kind == kind)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The pod a victim was picked for, if it is still there.
    fn pod_of(&self, v: &Victim) -> Option<&'_ PodFacts<'p>> {
        self.pods
            .iter()
            .find(|p| p.key == v.pod_key && p.uid == v.uid)
    }

    /// A victim settled: its pod's deletion, if in flight, is parked.
    fn settle(&mut self, node: &str, looked: &mut Looked) {
        if let Some(v) = self.victims.remove(node) {
            let delete = Aspect::is_delete;
            self.flights
                .park(Owner::Pod, &v.pod_key, delete, self.now, self.timeout_ms);
        }
        looked.touched.push(node.to_owned());
    }

    /// Rolling replacement victims: their pod deleted once DRAINED (fail
    /// closed: only what is surely drained and idle); settled once their pod
    /// is gone and its successor serves: Running and Ready on a Ready node,
    /// and its Slurm node in service. Until then the victim counts against
    /// `max_unavailable`: a successor still pulling its image, or whose
    /// slurmd has not registered, is not capacity back.
    fn settle_replacements(
        &mut self,
        visible: bool,
        ctx: &Ctx<'_>,
        policy: &lockstep_schemas::ActionPolicy,
        wake: &mut Option<u64>,
        looked: &mut Looked,
        out: &mut Output,
    ) {
        for node in self.of_kind(VictimKind::Replace) {
            let v = &self.victims[&node];
            let Some(pod) = self.pod_of(v) else {
                let back = self
                    .pods
                    .iter()
                    .any(|p| p.slurm == node && p.uid != v.uid && p.serving && p.slurm_serves);
                if back {
                    self.settle(&node, looked);
                }
                continue;
            };
            let safe = visible && pod.known && pod.drained && pod.jobs == 0 && !pod.busy;
            let want = (safe && !pod.deleting).then(|| delete_action(pod));
            let issue = Issue {
                seq: ctx.seq,
                now_ms: self.now,
                cause: ctx.event,
                rule: Rule::Replace.name(),
            };
            let key = Key::Pod(&v.pod_key, AspectRef::Delete);
            self.flights
                .bring(key, want, &issue, policy, &mut out.actions, wake);
        }
    }

    /// Scale-in victims whose pods are gone: settled, except that while
    /// they are `counted` (`delete_pod`, scaling in) they are counted off
    /// `replicas` first. Returns the Slurm nodes of the victims whose pods
    /// are there, and how many are counted.
    fn settle_scale_in(
        &mut self,
        counted: bool,
        current: u32,
        looked: &mut Looked,
    ) -> (Vec<&'p str>, u32) {
        let mut present: Vec<&'p str> = Vec::new();
        let mut gone = 0u32;
        for node in self.of_kind(VictimKind::ScaleIn) {
            if let Some(p) = self.pod_of(&self.victims[&node]) {
                present.push(p.slurm);
                continue;
            }
            let v = self.victims.get_mut(&node).expect("listed above");
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
            self.settle(&node, looked);
        }
        (present, gone)
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
    let up = matches!(want, Some(Action::KubeScale { replicas, .. }) if replicas > current);
    let issue = Issue {
        seq: ctx.seq,
        now_ms: now,
        cause: ctx.event,
        rule: if up { Rule::ScaleUp } else { Rule::ScaleDown }.name(),
    };
    let before = out.actions.len();
    let key = Key::Scale(&rule.target);
    flights.bring(key, want, &issue, policy, &mut out.actions, wake);
    if out.actions[before..]
        .iter()
        .any(|a| matches!(a.action, Action::KubeScale { replicas, .. } if replicas > current))
    {
        ctl.last_up_ms = Some(now);
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
