//! Scaling's stateful half: its [`Book`] evaluated against the model, one
//! entry point ([`Book::evaluate`]) that brings every scale target's
//! actions and says which Slurm nodes it touched and when to look again;
//! and the busy and idle bookkeeping the fast path reads between scans.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};

use lockstep_schemas::{
    Action, ActionPolicy, KubeScaleTarget, Phase, Policy, Removal, Rule, ScaleRule, Transition,
};

use super::{PodFacts, ScaleCtl, ScaleIn, Victim, VictimKind};
use crate::ctx::{Ctx, Output};
use crate::flights::{Aspect, AspectRef, Flights, Key, Owner};
use crate::model::Model;
use crate::slot::{Issue, Step};
use crate::timers::min_wake;
use crate::units::{after_s, ms};

/// What scaling reads and writes of the rest of the engine while it
/// evaluates.
pub(crate) struct Cx<'a, 'r> {
    pub model: &'a Model,
    pub policy: &'a Policy,
    pub flights: &'a mut Flights,
    /// The phase lockstep holds of a Slurm node.
    pub phase: &'a dyn Fn(&str) -> Phase,
    /// Whether what Slurm shows of a node is about to change: lockstep's
    /// last drain, down or resume of it does not show yet.
    pub unseen: &'a dyn Fn(&Flights, &str) -> bool,
    pub ctx: &'a Ctx<'r>,
    pub out: &'a mut Output,
}

/// What an evaluation did that the engine acts on.
#[derive(Debug, Default)]
pub(crate) struct Evaluated {
    /// Slurm nodes whose victim status changed: the engine evaluates them
    /// in the same record.
    pub touched: Vec<String>,
    /// When scaling looks again.
    pub wake: Option<u64>,
}

/// A scale target's evaluation after its scale-in plan: what the plan
/// wants, and the target's pods as `(Slurm node, pod key, UID)`.
struct Planned<'m> {
    current: u32,
    desired: u32,
    /// See [`Replicas::keep`].
    keep: Option<u32>,
    plan: super::ScaleInPlan,
    /// Scale-in victims whose pods are still there.
    present: Vec<&'m str>,
    live: Vec<(&'m str, &'m str, &'m str)>,
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

impl super::Book {
    /// Re-evaluates every scale target: desired replicas, scale-up, picking,
    /// draining and deleting victims, lowering replicas, rolling replacement.
    pub fn evaluate(&mut self, cx: &mut Cx<'_, '_>) -> Evaluated {
        let now = cx.ctx.now_ms;
        let policy = cx.policy;
        let rules = &policy.scaling.targets;
        let mut done = Evaluated::default();
        // Victims of targets no longer scaled are dropped (their drains lift).
        let stale: Vec<String> = self
            .victims
            .iter()
            .filter(|(_, v)| !rules.iter().any(|r| r.target == v.target))
            .map(|(n, _)| n.clone())
            .collect();
        for n in stale {
            self.drop_victim(&n, cx.flights, policy, now);
            done.touched.push(n);
        }
        let mut wake: Option<u64> = None;
        let mut added_victims = false;
        let scan_all = std::mem::take(&mut self.scan_needed) || self.busy.len() != rules.len();
        if scan_all {
            self.busy = vec![0; rules.len()];
            self.rollout = vec![true; rules.len()];
            self.stopped_at_top = vec![false; rules.len()];
            self.rule_of.clear();
        }
        for (index, rule) in rules.iter().enumerate() {
            let Some(target) = cx.model.scale_targets.get(&rule.target).map(|t| &t.obs) else {
                continue;
            };
            if !scan_all
                && (self.scale_fast(index, rule, target, cx, &mut wake)
                    || self.scale_top(index, rule, target, cx, &mut wake))
            {
                continue;
            }
            let looked = self.scale_target(index, rule, target, cx, &mut wake);
            added_victims |= looked.added_victims;
            done.touched.extend(looked.touched);
        }
        if added_victims {
            min_wake(&mut wake, after_s(now, policy.scaling.evaluate_every_s));
        }
        done.wake = wake;
        done
    }

    /// The fast path: nothing but job counts changed since the last scan, no
    /// victims, no rollout, and no scale-in wanted: only the replica count
    /// can need a change, and the busy count is current. Whether it applied.
    fn scale_fast(
        &mut self,
        index: usize,
        rule: &ScaleRule,
        target: &KubeScaleTarget,
        cx: &mut Cx<'_, '_>,
        wake: &mut Option<u64>,
    ) -> bool {
        if self.rollout[index] || self.has_victims(&rule.target) {
            return false;
        }
        let current = target.replicas;
        let desired = self.desired_now(index, rule, cx.model);
        if desired < current {
            return false;
        }
        let ctl = self.targets.entry(rule.target.clone()).or_default();
        ctl.desired = Some(desired);
        ctl.blocked = None;
        let counts = Replicas {
            current,
            desired,
            lower_to: None,
            keep: None,
        };
        reconcile_replicas(ctl, rule, counts, cx, wake);
        true
    }

    /// The top ordinal alone: the last scan found a `highest_ordinal`
    /// scale-in stopped at the target's top ordinal with nothing to pick,
    /// mark, delete or lower and no victims, and no pod, target, policy or
    /// visibility changed since (each forces a scan). Then the pods below
    /// the top wait for it, and only the top pod, looked at afresh, can
    /// set the chain going: its plan is the whole target's. When that plan
    /// wants more than to stop there, the target is scanned instead.
    /// Whether it applied.
    fn scale_top(
        &mut self,
        index: usize,
        rule: &ScaleRule,
        target: &KubeScaleTarget,
        cx: &mut Cx<'_, '_>,
        wake: &mut Option<u64>,
    ) -> bool {
        let visible = cx.model.slurm_visible && cx.model.kube_visible;
        let removal = cx.policy.scaling.removal_of(&rule.target);
        let current = target.replicas;
        if !self.stopped_at_top[index]
            || !visible
            || removal != Some(Removal::HighestOrdinal)
            || self.has_victims(&rule.target)
        {
            return false;
        }
        let desired = self.desired_now(index, rule, cx.model);
        if desired >= current {
            return false;
        }
        // `desired < current`: there is a top ordinal.
        let top_key = crate::model::pod_key(
            &rule.target.namespace,
            &format!("{}-{}", rule.target.name, current - 1),
        );
        let top: Vec<PodFacts<'_>> = self.pod_look(rule, cx).get(&top_key).into_iter().collect();
        let now = cx.ctx.now_ms;
        let down_ready_at = self
            .targets
            .get(&rule.target)
            .map_or(0, |ctl| ctl.down_ready_at(rule));
        let may_pick = now >= down_ready_at;
        let plan = super::plan_scale_in(&ScaleIn {
            removal,
            target: &rule.target,
            current,
            desired,
            pods: &top,
            victims: &[],
            gone: 0,
            may_pick,
            visible,
        });
        if !plan.wants_nothing() {
            return false;
        }
        let waits = Waits {
            wanted: true,
            may_pick,
            down_ready_at,
            idle_wake: plan.idle_wake,
        };
        waits.bring(wake);
        let planned = Planned {
            current,
            desired,
            keep: None,
            plan,
            present: Vec::new(),
            live: Vec::new(),
        };
        self.report_blocked(rule, &planned, cx);
        let ctl = self.targets.entry(rule.target.clone()).or_default();
        ctl.desired = Some(desired);
        let counts = Replicas {
            current,
            desired,
            lower_to: None,
            keep: None,
        };
        reconcile_replicas(ctl, rule, counts, cx, wake);
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
        cx: &mut Cx<'_, '_>,
        wake: &mut Option<u64>,
    ) -> Looked {
        let mut looked = Looked::default();
        let planned = self.plan_target(index, rule, target, cx, wake, &mut looked);
        let now = cx.ctx.now_ms;
        // Victims: drop the ones no longer wanted, add the new ones.
        let wanted: FxHashSet<&str> = planned.plan.victims.iter().map(String::as_str).collect();
        for &node in &planned.present {
            if !wanted.contains(node) {
                self.drop_victim(node, cx.flights, cx.policy, now);
                looked.touched.push(node.to_owned());
            }
        }
        let mut picked = false;
        // Each Slurm node's first pod, as a walk of `live` would find it.
        let mut pod_of: FxHashMap<&str, (&str, &str)> = FxHashMap::default();
        for &(slurm, key, uid) in &planned.live {
            pod_of.entry(slurm).or_insert((key, uid));
        }
        for node in &planned.plan.victims {
            let Some(&(key, uid)) = pod_of.get(node.as_str()) else {
                continue;
            };
            if let Some(v) = self.victims.get_mut(node) {
                // A rolling replacement's victim that the scale-in takes
                // (its node DRAINED for the replacement, so the count may
                // drop past it at once): it now leaves for good, and its
                // drain must hold until its pod is gone, not end once a
                // successor serves.
                if v.kind == VictimKind::Replace {
                    v.kind = VictimKind::ScaleIn;
                    key.clone_into(&mut v.pod_key);
                    uid.clone_into(&mut v.uid);
                    v.gone_at_replicas = None;
                    looked.touched.push(node.clone());
                    picked = true;
                }
                continue;
            }
            self.add_victim(node, rule, VictimKind::ScaleIn, key, uid, cx.flights);
            looked.touched.push(node.clone());
            picked = true;
            looked.added_victims = true;
        }
        let ctl = self
            .targets
            .get_mut(&rule.target)
            .expect("made by the plan");
        if picked {
            ctl.last_down_ms = Some(now);
        }
        self.delete_victim_pods(rule, &planned.plan, cx, wake);
        let costs_settled = self.mark_deletion_cost(&planned, cx, wake);
        if !costs_settled {
            // A change of a pod's cost in flight, or failed and to be tried
            // again: only a scan brings it, and the fast path scans nothing
            // (once demand is back, no victim or scale-in would force one).
            self.scan_needed = true;
        }
        if cx.model.slurm_visible && cx.model.kube_visible {
            self.pick_replacements(rule, target, &planned.live, cx, &mut looked);
        }
        self.report_blocked(rule, &planned, cx);
        // The replica count: up at once (after the cooldown); down as the
        // plan says, never below the demand of this moment.
        let ctl = self
            .targets
            .get_mut(&rule.target)
            .expect("made by the plan");
        let counts = Replicas {
            current: planned.current,
            desired: planned.desired,
            lower_to: planned.plan.lower_to,
            keep: planned.keep,
        };
        reconcile_replicas(ctl, rule, counts, cx, wake);
        self.stopped_at_top[index] = cx.policy.scaling.removal_of(&rule.target)
            == Some(Removal::HighestOrdinal)
            && cx.model.slurm_visible
            && cx.model.kube_visible
            && planned.desired < planned.current
            && planned.plan.wants_nothing()
            && costs_settled
            && !self.rollout[index]
            && !self.has_victims(&rule.target);
        looked
    }

    /// Scans a target's pods: the busy count, the rollout, the desired
    /// count; settles replacement and scale-in victims whose pods are gone
    /// and deletes replaced pods once DRAINED; plans the scale-in.
    #[allow(clippy::too_many_arguments)]
    fn plan_target<'m>(
        &mut self,
        index: usize,
        rule: &ScaleRule,
        target: &KubeScaleTarget,
        cx: &mut Cx<'m, '_>,
        wake: &mut Option<u64>,
        looked: &mut Looked,
    ) -> Planned<'m> {
        let now = cx.ctx.now_ms;
        let current = target.replicas;
        let visible = cx.model.slurm_visible && cx.model.kube_visible;
        let removal = cx.policy.scaling.removal_of(&rule.target);
        let policy = cx.policy;
        let pods = self.pod_look(rule, cx).all();
        // Busy Slurm nodes, each once even while two pods claim it (a
        // replacement starting beside a terminating pod).
        let busy = pods
            .iter()
            .filter(|p| p.busy)
            .map(|p| p.slurm)
            .collect::<FxHashSet<_>>()
            .len() as u32;
        self.busy[index] = busy;
        for p in &pods {
            if !self.rule_of.contains_key(p.slurm) {
                self.rule_of.insert(p.slurm.into(), index);
            }
        }
        self.rollout[index] = target
            .update_revision
            .as_deref()
            .is_some_and(|rev| pods.iter().any(|p| p.revision.is_some_and(|r| r != rev)));
        let desired = self.desired_now(index, rule, cx.model);
        // Victims are looked at before they are let go (`scale_target`).
        // Kept on what the model holds even while Slurm is not seen in full
        // again (a job listing in before the node listing after an outage):
        // raising the count only keeps a pod, and its controller may remove
        // it before the last listing comes.
        let keep = if removal == Some(Removal::HighestOrdinal) && cx.model.kube_visible {
            keep_busy_victims(&self.victims, rule, &pods, current)
        } else {
            None
        };
        let ctl = self.targets.entry(rule.target.clone()).or_default();
        ctl.desired = Some(desired);
        let down_ready_at = ctl.down_ready_at(rule);

        let mut book = Victims {
            victims: &mut self.victims,
            flights: &mut *cx.flights,
            rule,
            pods: &pods,
            now,
            timeout_ms: ms(cx.policy.actions.timeout_s),
        };
        let ctx = cx.ctx;
        let out = &mut *cx.out;
        book.settle_replacements(visible, ctx, &policy.actions, wake, looked, out);
        let counted = removal == Some(Removal::DeletePod) && desired < current;
        let (present, gone) = book.settle_scale_in(counted, current, looked);
        let may_pick = now >= down_ready_at;
        let mut plan = super::plan_scale_in(&ScaleIn {
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
        let waits = Waits {
            wanted: desired < current && visible,
            may_pick,
            down_ready_at,
            idle_wake: plan.idle_wake,
        };
        waits.bring(wake);
        if let Some(to) = plan.lower_to {
            if let Err(why) =
                super::lowering_allowed(removal, &rule.target, &pods, current, to, visible)
            {
                plan.lower_to = None;
                plan.blocked = Some((None, why));
            }
        }
        Planned {
            current,
            desired,
            keep,
            plan,
            present,
            live: pods.iter().map(|p| (p.slurm, p.key, p.uid)).collect(),
        }
    }

    /// What scaling reads to know rule's pods, as of `cx`.
    fn pod_look<'a, 'b>(
        &'b self,
        rule: &'b ScaleRule,
        cx: &'b Cx<'a, '_>,
    ) -> super::PodLook<'a, 'b, impl Fn(&str) -> bool + 'b> {
        let (flights, unseen): (&Flights, _) = (&*cx.flights, cx.unseen);
        super::PodLook {
            model: cx.model,
            policy: cx.policy,
            rule,
            idle_since: &self.idle_since,
            victims: &self.victims,
            unseen: move |slurm: &str| unseen(flights, slurm),
            flights,
            reads_costs: cx.policy.scaling.removal_of(&rule.target) == Some(Removal::DeletionCost),
            now: cx.ctx.now_ms,
        }
    }

    /// A victim no longer wanted: its pod's deletion, if in flight, is
    /// parked.
    fn drop_victim(&mut self, node: &str, flights: &mut Flights, policy: &Policy, now: u64) {
        if let Some(v) = self.victims.remove(node) {
            let timeout_ms = ms(policy.actions.timeout_s);
            flights.park(Owner::Pod, &v.pod_key, Aspect::is_delete, now, timeout_ms);
        }
    }

    /// A new victim: it takes back a deletion of its pod still in flight.
    fn add_victim(
        &mut self,
        node: &str,
        rule: &ScaleRule,
        kind: VictimKind,
        key: &str,
        uid: &str,
        flights: &mut Flights,
    ) {
        flights.adopt(Owner::Pod, key, Aspect::is_delete);
        self.victims.insert(
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
        plan: &super::ScaleInPlan,
        cx: &mut Cx<'_, '_>,
        wake: &mut Option<u64>,
    ) {
        let delete: FxHashSet<&str> = plan.delete.iter().map(String::as_str).collect();
        for v in self
            .victims
            .values()
            .filter(|v| v.target == rule.target && v.kind == VictimKind::ScaleIn)
        {
            let want = delete.contains(v.pod_key.as_str()).then(|| {
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
            let issue = cx.ctx.issue(Rule::DeletePod);
            let key = Key::Pod(&v.pod_key, AspectRef::Delete);
            let policy = &cx.policy.actions;
            cx.flights
                .bring(key, want, &issue, policy, &mut cx.out.actions, wake);
        }
    }

    /// `deletion_cost`: the lowest cost on DRAINED victims, and on no other
    /// pod of the target (`scaling.deletion_cost`). Whether every pod
    /// already carries what it should, with nothing of it in flight.
    fn mark_deletion_cost(
        &mut self,
        planned: &Planned<'_>,
        cx: &mut Cx<'_, '_>,
        wake: &mut Option<u64>,
    ) -> bool {
        let cost_key = super::COST_LABEL;
        let mark: FxHashSet<&str> = planned.plan.mark.iter().map(String::as_str).collect();
        let mut settled = true;
        for &(_, key, _) in &planned.live {
            let Some(entry) = cx.model.pods.get(key) else {
                continue;
            };
            let marked = mark.contains(key);
            let want = super::cost_want(&entry.obs, marked);
            let issue = cx.ctx.issue(Rule::DeletionCost);
            let key = Key::Pod(key, AspectRef::Label(cost_key));
            settled &= want.is_none() && !cx.flights.holds(key);
            let policy = &cx.policy.actions;
            cx.flights
                .bring(key, want, &issue, policy, &mut cx.out.actions, wake);
        }
        settled
    }

    /// Rolling replacement: pods of an old revision become victims, at most
    /// `max_unavailable` at a time, those with the fewest jobs first.
    fn pick_replacements(
        &mut self,
        rule: &ScaleRule,
        target: &KubeScaleTarget,
        live: &[(&str, &str, &str)],
        cx: &mut Cx<'_, '_>,
        looked: &mut Looked,
    ) {
        let Some(rev) = &target.update_revision else {
            return;
        };
        let replacing = self
            .victims
            .values()
            .filter(|v| v.target == rule.target && v.kind == VictimKind::Replace)
            .count() as u32;
        let room = rule.max_unavailable.saturating_sub(replacing) as usize;
        let mut old: Vec<(u32, String, String, String)> = Vec::new();
        for (key, entry) in &cx.model.pods {
            let p = &entry.obs;
            if p.revision.as_ref().is_none_or(|r| r == rev) {
                continue;
            }
            // `live` is sorted by pod key, each key once (`pod_facts`): a
            // look-up per pod, not a walk of every pod of the target.
            let Ok(at) = live.binary_search_by(|(_, k, _)| (*k).cmp(key.as_str())) else {
                continue;
            };
            let (slurm, _, uid) = live[at];
            if self.victims.contains_key(slurm)
                || p.deleting
                || !cx.model.slurm_nodes.contains_key(slurm)
            {
                continue;
            }
            let jobs = cx.model.jobs_on(slurm);
            old.push((jobs, slurm.to_owned(), key.clone(), uid.to_owned()));
        }
        old.sort_by(|a, b| super::victim_order((a.0, &a.1), (b.0, &b.1)));
        for (_, slurm, key, uid) in old.into_iter().take(room) {
            self.add_victim(&slurm, rule, VictimKind::Replace, &key, &uid, cx.flights);
            looked.touched.push(slurm);
            looked.added_victims = true;
        }
    }

    /// Why scale-in stops short, once per change, in the audit trail
    /// (`scaling.blocked`).
    fn report_blocked(&mut self, rule: &ScaleRule, planned: &Planned<'_>, cx: &mut Cx<'_, '_>) {
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
        let phase = (cx.phase)(&node);
        cx.out.transitions.push(Transition {
            seq: cx.ctx.seq,
            time_ms: cx.ctx.now_ms,
            node,
            from: phase,
            to: phase,
            rule: Rule::ScaleInBlocked,
            cause: cx.ctx.event.clone(),
            detail,
        });
    }
}

/// The busy and idle bookkeeping, kept current as observations arrive.
impl super::Book {
    /// A Slurm node whose jobs may have gone from none to some or back, or
    /// newly listed: its idle clock runs from `now` while it runs no job.
    pub fn follow_idle(&mut self, node: &str, model: &Model, now: u64) {
        if model.jobs_on(node) == 0 {
            self.idle_since.insert(node.into(), now);
        } else {
            self.idle_since.remove(node);
        }
    }

    /// Keeps the busy set and the per-rule busy counts current for `node`.
    /// Without scale targets there is nothing to keep: the set is rebuilt
    /// when a policy brings some.
    ///
    /// Whether it turned busy while a scale-in victim: its target may have
    /// been lowered past it already, and is looked at again at once.
    pub fn follow_busy(&mut self, node: &str, model: &Model, policy: &Policy) -> bool {
        if policy.scaling.targets.is_empty() {
            return false;
        }
        let busy = model.jobs_on(node) > 0
            || model
                .slurm_nodes
                .get(node)
                .is_some_and(|n| super::slurm_busy(&n.obs));
        if busy == self.busy_nodes.contains(node) {
            return false;
        }
        if busy {
            self.busy_nodes.insert(node.into());
        } else {
            self.busy_nodes.remove(node);
        }
        let rule = self.rule_of.get(node).copied();
        if let Some(count) = rule.and_then(|r| self.busy.get_mut(r)) {
            *count = if busy {
                *count + 1
            } else {
                count.saturating_sub(1)
            };
        }
        busy && self
            .victims
            .get(node)
            .is_some_and(|v| v.kind == VictimKind::ScaleIn)
    }

    /// Rebuilds the busy set from the model. Busy: running a job (whether
    /// Slurm's node list has the node yet or not) or finishing one.
    pub fn rebuild_busy(&mut self, model: &Model, policy: &Policy) {
        self.busy_nodes.clear();
        let mut names: Vec<String> = model.slurm_nodes.keys().map(|n| n.to_string()).collect();
        names.extend(model.nodes_with_jobs());
        for n in names {
            self.follow_busy(&n, model, policy);
        }
    }
}

/// One target's victims, settled against its pods as scanned.
struct Victims<'a, 'p> {
    victims: &'a mut BTreeMap<String, Victim>,
    flights: &'a mut Flights,
    rule: &'a ScaleRule,
    /// Sorted by pod key, each key once (`pod_facts`).
    pods: &'a [PodFacts<'p>],
    now: u64,
    timeout_ms: u64,
}

impl<'p> Victims<'_, 'p> {
    /// Victims of this target of one kind.
    fn of_kind(&self, kind: VictimKind) -> impl Iterator<Item = (&String, &Victim)> {
        let target = &self.rule.target;
        self.victims
            .iter()
            .filter(move |(_, v)| v.target == *target && v.kind == kind)
    }

    /// The pod a victim was picked for, if it is still there.
    fn pod_of(&self, v: &Victim) -> Option<&'_ PodFacts<'p>> {
        let at = self
            .pods
            .binary_search_by(|p| p.key.cmp(v.pod_key.as_str()))
            .ok()?;
        let p = &self.pods[at];
        (p.uid == v.uid).then_some(p)
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
        policy: &ActionPolicy,
        wake: &mut Option<u64>,
        looked: &mut Looked,
        out: &mut Output,
    ) {
        let replacing: Vec<String> = self
            .of_kind(VictimKind::Replace)
            .map(|(n, _)| n.clone())
            .collect();
        for node in replacing {
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
        // Those whose pods are gone: few, where all may be present (a
        // scale-in of thousands waits on its drains).
        let mut missing: Vec<String> = Vec::new();
        for (node, v) in self.of_kind(VictimKind::ScaleIn) {
            match self.pod_of(v) {
                Some(p) => present.push(p.slurm),
                None => missing.push(node.clone()),
            }
        }
        let mut gone = 0u32;
        for node in missing {
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

/// When a scale-in that is `wanted` (and lockstep sees both sides) needs
/// another look by itself: at the end of the scale-down cooldown while it
/// lasts, else when the next pod its plan waits for is idle long enough.
struct Waits {
    wanted: bool,
    may_pick: bool,
    down_ready_at: u64,
    idle_wake: Option<u64>,
}

impl Waits {
    fn bring(&self, wake: &mut Option<u64>) {
        if !self.wanted {
            return;
        }
        match (self.may_pick, self.idle_wake) {
            (false, _) => min_wake(wake, self.down_ready_at),
            (true, Some(at)) => min_wake(wake, at),
            (true, None) => {}
        }
    }
}

/// A scale target's replica count now, what demand wants, and how far the
/// scale-in plan found it safe to lower it.
#[derive(Debug, Clone, Copy)]
struct Replicas {
    current: u32,
    desired: u32,
    lower_to: Option<u32>,
    /// A `highest_ordinal` target lowered past a pod that took a job
    /// before its controller removed it: the count that keeps that pod.
    keep: Option<u32>,
}

/// The replica count a scale target should have now: up to `desired` at
/// once (after the cooldown), down to `lower_to` (what the scale-in plan
/// found safe), never below `desired`.
fn reconcile_replicas(
    ctl: &mut ScaleCtl,
    rule: &ScaleRule,
    Replicas {
        current,
        desired,
        lower_to,
        keep,
    }: Replicas,
    cx: &mut Cx<'_, '_>,
    wake: &mut Option<u64>,
) {
    let ctx = cx.ctx;
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
    // Up to keep a pod that took a job, cooldown or not: its controller may
    // remove it at any moment.
    let want = match keep {
        Some(k) => Some(want.map_or(k, |w| w.max(k))),
        None => want,
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
    let key = Key::Scale(&rule.target);
    let policy = &cx.policy.actions;
    let step = cx
        .flights
        .bring(key, want, &issue, policy, &mut cx.out.actions, wake);
    // The cooldown runs from the scale-up sent (a slot sends what it was
    // asked for, first attempt or retry).
    if up && matches!(step, Step::Sent { .. }) {
        ctl.last_up_ms = Some(now);
    }
}

/// A `highest_ordinal` target's count lowered past scale-in victims that
/// run a job now (a drain lifted by somebody before the controller removed
/// the pod): the count that keeps the highest of them, within
/// `max_replicas`, if above `current`; else the job goes with the pod.
fn keep_busy_victims(
    victims: &BTreeMap<String, Victim>,
    rule: &ScaleRule,
    pods: &[PodFacts<'_>],
    current: u32,
) -> Option<u32> {
    pods.iter()
        .filter(|p| p.busy && !p.deleting)
        .filter(|p| {
            victims
                .get(p.slurm)
                .is_some_and(|v| v.kind == VictimKind::ScaleIn && v.target == rule.target)
        })
        .filter_map(|p| super::ordinal(&rule.target.name, p.name))
        .filter(|&o| o >= current)
        .max()
        .map(|o| o.saturating_add(1).min(rule.max_replicas.max(current)))
        .filter(|&to| to > current)
}

/// Deletes a pod, only if its UID is still the one scaling looked at.
fn delete_action(pod: &PodFacts<'_>) -> Action {
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
