//! The router of wakes: every wake a record raised, in order, to the
//! policy it belongs to. A Slurm node's wake asks each policy for its causes
//! (the cause table), has the drain policy decide through health damping's
//! gate, and brings its features, topology and what its pod shows; a
//! Kubernetes node's brings its taints; a maintenance wake, its
//! reservation and drain conditions; the scaling wake, every scale target.

use lockstep_schemas::{Phase, Policy, Rule, Transition, ANNOTATION_PREFIX};

use super::{ownership, slurm_unseen, Engine};
use crate::cause::{Cause, Status, VictimKind};
use crate::ctx::{Ctx, Output};
use crate::drain::{self, SlurmSide};
use crate::flights::{Aspect, AspectRef, Flights, Key, Owner};
use crate::model::NodeView;
use crate::node::NodeCtl;
use crate::scaling::{self, Victim};
use crate::shown::{self, OnNode, Want};
use crate::timers::{Wake, WakeOf};
use crate::units::ms;
use crate::{evict, health, maintenance, topology};

impl Engine {
    /// The router: evaluates the wakes raised so far, in order and each
    /// once, that `admit` lets through; the policy each wakes decides. What
    /// the evaluations raise waits for the next call.
    pub(super) fn route(&mut self, admit: fn(&Wake) -> bool, ctx: &Ctx<'_>, out: &mut Output) {
        if self.dirty.is_empty() {
            return;
        }
        let mut wakes = std::mem::take(&mut self.dirty);
        wakes.sort_unstable();
        wakes.dedup();
        for wake in wakes.iter().filter(|w| admit(w)) {
            match wake {
                Wake::Slurm(n) => self.eval_slurm(n, ctx, out),
                Wake::Kube(n) => self.eval_kube(n, ctx, out),
                Wake::Scale => self.eval_scaling(ctx, out),
                Wake::Maint(n) => self.eval_maintenance(n, ctx, out),
            }
        }
        if self.dirty.is_empty() {
            // Keeps the buffer's room for the next record.
            wakes.clear();
            self.dirty = wakes;
        }
    }

    /// The scaling wake: every scale target (`scaling`), then, in the same
    /// record, the nodes whose victim status it changed.
    fn eval_scaling(&mut self, ctx: &Ctx<'_>, out: &mut Output) {
        let (ctl, model, policy) = (&self.ctl, &self.model, &self.policy);
        let own = ownership(policy, &self.retired);
        let phase = |n: &str| ctl.get(n).map_or(Phase::Unknown, |c| c.status.phase);
        let unseen = |flights: &Flights, n: &str| slurm_unseen(ctl, flights, model, &own, n);
        let mut cx = scaling::Cx {
            model,
            policy,
            flights: &mut self.flights,
            phase: &phase,
            unseen: &unseen,
            ctx,
            out,
        };
        let done = self.scaling.evaluate(&mut cx);
        for n in &done.touched {
            self.touch_slurm(n);
        }
        // Everything raised so far in this record, those nodes among it.
        // What these evaluations raise in turn is dropped: only the
        // Kubernetes nodes under the touched nodes, evaluated just now.
        self.route(|w| *w != Wake::Scale, ctx, out);
        self.dirty.clear();
        self.timers.set(WakeOf::Scale, done.wake);
    }

    /// Re-evaluates one Slurm node: its causes, what Slurm should show, its
    /// phase, its features and topology, and what its pod shows.
    pub(super) fn eval_slurm(&mut self, name: &str, ctx: &Ctx<'_>, out: &mut Output) {
        let policy = &self.policy;
        let view = self.model.view(name, policy);
        let now = ctx.now_ms;
        let mut wake = None;
        let mut causes = std::mem::take(&mut self.scratch.causes);
        causes.clear();
        let ctl = self.ctl.get(name);
        let had_pod_loss = ctl.is_some_and(|c| c.causes.iter().any(|(c, _)| c.is_pod_loss()));
        node_causes(
            &view,
            policy,
            had_pod_loss,
            self.scaling.victims.get(name),
            now,
            &mut causes,
            &mut wake,
        );
        let Some(slurm) = view.slurm else {
            // Slurm does not know this node: nothing to drain or resume.
            self.slurm_node_gone(name, ctx, out);
            self.scratch.causes = causes;
            return;
        };
        let side =
            SlurmSide::of(slurm, &self.ownership()).see(self.flights.state_action(name), slurm);
        if !self.ctl.contains_key(name) {
            self.ctl.insert(name.into(), NodeCtl::default());
            let state = |a: &Aspect| *a == Aspect::State;
            self.flights.adopt(Owner::SlurmNode, name, state);
        }
        let ctl = self.ctl.get_mut(name).expect("inserted above");
        // What the model holds predates lockstep's last change of the node.
        let side = SlurmSide {
            unseen: side.unseen || ctl.fresh_after.is_some(),
            ..side
        };
        let shown_before = ctl.health.shown();
        let visible = self.model.slurm_visible;
        let mut gate = health::Gate {
            cluster: &mut self.damping,
            node: &mut ctl.health,
            policy: &policy.health,
            now_ms: now,
        };
        gate.show(&view, side.unhealthy, visible, &mut wake);
        let shown = ctl.health.shown();
        let flights = &mut self.flights;
        // Nothing in flight on the node (the common case): no aspect needs a
        // look-up unless something is wanted of it.
        let idle = flights.idle(Owner::SlurmNode, name);
        let node = drain::Node {
            name,
            view: &view,
            slurm,
            side,
            idle,
        };
        drain::decide(
            &node,
            ctl,
            &mut self.damping,
            flights,
            &causes,
            visible,
            policy,
            ctx,
            &mut wake,
            out,
        );
        self.fresh.follow(name, ctl.fresh_after.is_some());
        if visible {
            let kube = view.kube_name.zip(view.kube.map(|k| &k.obs));
            let unseen = view.kube.map_or(&[][..], |k| &k.unseen_labels);
            let (features, topology, invalid) = topology::wants(
                name,
                slurm,
                kube,
                &policy.topology,
                unseen,
                &self.retired.feature_prefixes,
            );
            let wants = [
                (AspectRef::Features, features, Rule::Features),
                (AspectRef::Topology, topology, Rule::Topology),
            ];
            for (aspect, want, rule) in wants {
                let issue = ctx.issue(rule);
                if want.is_none() && idle {
                    continue;
                }
                let key = Key::Slurm(name, aspect);
                flights.bring(
                    key,
                    want,
                    &issue,
                    &policy.actions,
                    &mut out.actions,
                    &mut wake,
                );
            }
            topology::report_issue(ctl, name, invalid, ctx, out);
        }

        // What the pod should show (Slurm -> Kubernetes).
        let pod_key = view
            .pod_key
            .zip(view.pod)
            .filter(|_| self.model.kube_visible);
        let flights = &mut self.flights;
        if let Some((key, pod)) = pod_key {
            let busy = || self.model.jobs_on(name) > 0 || scaling::slurm_busy(slurm);
            let pod_idle = flights.idle(Owner::Pod, key);
            let holds = |a: AspectRef<'_>| !pod_idle && flights.holds(Key::Pod(key, a));
            let mut wants: Vec<Want<'_>> =
                shown::pod_wants(pod, slurm, side, shown, busy, policy, &self.retired, holds);
            // The pod's eviction, where lockstep answers it (`evict`).
            let out_of_service = !side.unseen && (side.drained || side.down);
            let (report, next) = evict::response(
                pod,
                slurm,
                out_of_service,
                busy(),
                &policy.drain,
                ctx.now_ms,
            );
            if let Some(at) = next {
                crate::timers::min_wake(&mut wake, at);
            }
            if report.is_some() || holds(AspectRef::Eviction) {
                wants.push((AspectRef::Eviction, report, Rule::EvictionResponse));
            }
            for (aspect, want, rule) in wants {
                let issue = ctx.issue(rule);
                let key = Key::Pod(key, aspect);
                flights.bring(
                    key,
                    want,
                    &issue,
                    &policy.actions,
                    &mut out.actions,
                    &mut wake,
                );
            }
        }

        self.scratch.causes = causes;
        self.timers.set(WakeOf::Slurm(name), wake);
        if shown != shown_before {
            // The taint of the Kubernetes node under it follows.
            if let Some(k) = self.model.placement(name, &self.policy) {
                self.dirty.push(Wake::Kube(k.to_owned()));
            }
        }
    }

    /// A Slurm node Slurm no longer reports: its phase becomes unknown, its
    /// timer and its state go (an action in flight is parked).
    fn slurm_node_gone(&mut self, name: &str, ctx: &Ctx<'_>, out: &mut Output) {
        let Some(ctl) = self.ctl.remove(name) else {
            return;
        };
        let status = Status {
            phase: Phase::Unknown,
            rule: Rule::Gone,
            cause: None,
        };
        if ctl.status != status {
            out.transitions.push(Transition {
                seq: ctx.seq,
                time_ms: ctx.now_ms,
                node: name.to_owned(),
                from: ctl.status.phase,
                to: Phase::Unknown,
                rule: Rule::Gone,
                cause: ctx.event.clone(),
                detail: "slurm no longer reports the node".to_owned(),
            });
        }
        self.timers.set(WakeOf::Slurm(name), None);
        let timeout_ms = ms(self.policy.actions.timeout_s);
        let flights = &mut self.flights;
        let state = |a: &Aspect| *a == Aspect::State;
        flights.park(Owner::SlurmNode, name, state, ctx.now_ms, timeout_ms);
        flights.forget(Owner::SlurmNode, name, |a| *a != Aspect::State);
    }

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
        let signals = &policy.node_signals;
        // Rows 7 and 8 speak for every Slurm node on it: not while Slurm
        // cannot be seen.
        let signals_on = self.model.slurm_visible
            && !(signals.foreign_drain_condition.is_empty()
                && signals.slurm_nodes_annotation.is_empty());
        let mut on = OnNode::default();
        let mut foreign: Vec<(&str, &str)> = Vec::new();
        // While Slurm cannot be seen, what lockstep last saw of it keeps a
        // taint that is there and never puts one on: the Kubernetes node
        // under a Slurm node may be another one by now (its pod rescheduled
        // meanwhile), and Slurm may have changed.
        let visible = self.model.slurm_visible;
        for n in &names {
            if let Some(s) = self.model.slurm_nodes.get(n.as_str()) {
                let side = SlurmSide::of(&s.obs, &own);
                let shown = self.ctl.get(n.as_str()).is_some_and(|c| c.health.shown());
                if shown {
                    // Shown and still unhealthy; or shown, recovered, and
                    // held by the hysteresis: that keeps a taint, never puts
                    // one on. Out under lockstep's own reason with its
                    // slurmd answering, neither: lockstep keeps it out, and
                    // the taint would stay until lockstep's resume.
                    on.unhealthy |= visible && side.faulty;
                    on.held |= !visible || !side.unhealthy;
                }
                if visible {
                    on.foreign |= side.held_by_other();
                } else {
                    on.foreign_held |= side.held_by_other();
                }
                // Row 7 names every drain and DOWN not lockstep's: somebody
                // else's, and Slurm's own once health damping shows it.
                if signals_on && (side.held_by_other() || (side.faulty && shown)) {
                    foreign.push((&s.obs.name, s.obs.reason.as_deref().unwrap_or("")));
                }
            }
        }
        let mut wants: Vec<Want<'_>> = Vec::new();
        let holds = |a: AspectRef<'_>| self.flights.holds(Key::Kube(name, a));
        shown::taint_wants(entry, on, policy, &self.retired, holds, &mut wants);
        let slot = |a: AspectRef<'_>| self.flights.current(Key::Kube(name, a));
        shown::retired_signal_wants(entry, &self.retired, holds, slot, &mut wants);
        let annotation_key = match signals.slurm_nodes_annotation.as_str() {
            "" => String::new(),
            key => format!("{ANNOTATION_PREFIX}{key}"),
        };
        if signals_on {
            names.retain(|n| self.model.slurm_nodes.contains_key(n.as_str()));
            names.sort_unstable();
            names.dedup();
            foreign.sort_unstable();
            foreign.dedup();
            shown::signal_wants(
                entry,
                &foreign,
                &names,
                policy,
                &annotation_key,
                holds,
                &mut wants,
            );
        }
        drop(foreign);
        self.scratch.names = names;
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

    /// Re-evaluates one Kubernetes node's maintenance (`maintenance` rows 1,
    /// 2, 4-6): its reservation, and the drain conditions lockstep shows.
    pub(super) fn eval_maintenance(&mut self, kube: &str, ctx: &Ctx<'_>, out: &mut Output) {
        if !self.model.kube_visible || !self.model.slurm_visible {
            return;
        }
        let own = ownership(&self.policy, &self.retired);
        let mut names = std::mem::take(&mut self.scratch.names);
        let wake = self.reservations.evaluate(
            kube,
            &self.model,
            &self.policy,
            &own,
            &mut self.flights,
            &mut names,
            ctx,
            out,
        );
        self.scratch.names = names;
        self.timers.set(WakeOf::Maint(kube), wake);
    }

    /// Whether a Kubernetes node has maintenance state: a reservation, an
    /// action of its maintenance not settled, or a timer.
    pub(super) fn maintained(&self, kube: &str) -> bool {
        self.reservations.holds(kube)
            || self
                .flights
                .owner_holds(Owner::KubeNode, kube, Aspect::is_maintenance)
            || self.timers.get(WakeOf::Maint(kube)).is_some()
    }
}

/// The cause table, in its order: drain rows 1-4 (`drain`), the maintenance
/// window (`maintenance` row 3), health rows 4-6 (`health`), and a scale-in
/// or replacement victim (`scaling`).
fn node_causes(
    view: &NodeView<'_>,
    policy: &Policy,
    had_pod_loss: bool,
    victim: Option<&Victim>,
    now: u64,
    causes: &mut Vec<Cause>,
    wake: &mut Option<u64>,
) {
    drain::causes(
        view,
        &policy.drain,
        policy.mapping.mode,
        had_pod_loss,
        causes,
    );
    let kube = view.kube.map(|k| &k.obs);
    if let Some(window) = maintenance::drain_window(kube, &policy.maintenance, now, wake) {
        causes.push(Cause::Maintenance(window));
    }
    health::causes(view, &policy.health, now, causes, wake);
    if let Some(v) = victim {
        // Until the replica count drops, a pod its controller recreates
        // meanwhile is on its way out too; a replacement is done once the
        // old pod is gone.
        let holds = match v.kind {
            VictimKind::ScaleIn => true,
            VictimKind::Replace => view.pod.is_some_and(|p| p.obs.uid == v.uid),
        };
        if holds {
            causes.push(Cause::Scaling(v.kind));
        }
    }
}
