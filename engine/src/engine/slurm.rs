#[allow(clippy::wildcard_imports)]
use super::*;

use crate::drain::{Before, StateWant};
use crate::health::HealthCause;
use crate::model::NodeView;
use crate::shown::{self, Want};

impl Engine {
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
            self.ctl.insert(name.to_owned(), NodeCtl::default());
            let state = |a: &Aspect| *a == Aspect::State;
            self.flights.adopt(Owner::SlurmNode, name, state);
        }
        let ctl = self.ctl.get_mut(name).expect("inserted above");
        // What the model holds predates lockstep's last change of the node.
        let side = SlurmSide {
            unseen: side.unseen || ctl.fresh_after.is_some(),
            ..side
        };
        let shown_before = ctl.slurm_health_shown();
        show_health(
            ctl,
            &view,
            side,
            self.model.slurm_visible,
            now,
            &policy.health,
            &mut self.damping.marks,
            &mut wake,
        );
        let shown = ctl.slurm_health_shown();
        let cluster = &mut self.damping.drains;
        let visible = self.model.slurm_visible;
        let flights = &mut self.flights;
        // Nothing in flight on the node (the common case): no aspect needs a
        // look-up unless something is wanted of it.
        let idle = flights.idle(Owner::SlurmNode, name);
        let node = Node {
            name,
            view: &view,
            slurm,
            side,
            idle,
        };
        decide_state(
            &node, ctl, flights, &causes, visible, cluster, policy, ctx, &mut wake, out,
        );
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
            topology_issue(ctl, name, invalid, ctx, out);
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
            let wants: Vec<Want<'_>> =
                shown::pod_wants(pod, slurm, side, shown, busy, policy, &self.retired, holds);
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
}

/// The Slurm node being evaluated, as the model joins it.
#[derive(Clone, Copy)]
struct Node<'a> {
    name: &'a str,
    view: &'a NodeView<'a>,
    slurm: &'a SlurmNode,
    side: SlurmSide,
    /// No action of it is in flight.
    idle: bool,
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

/// Slurm -> Kubernetes: whether lockstep shows the node unhealthy, damped
/// like the other direction (`health::slurm_health_step`).
#[allow(clippy::too_many_arguments)]
fn show_health(
    ctl: &mut NodeCtl,
    view: &NodeView<'_>,
    side: SlurmSide,
    slurm_visible: bool,
    now: u64,
    policy: &lockstep_schemas::HealthPolicy,
    marks: &mut VecDeque<u64>,
    wake: &mut Option<u64>,
) {
    // What Kubernetes already shows for a node Slurm still reports unhealthy
    // (set before a restart or an upgrade) is kept, not flipped to healthy
    // for the length of a grace period.
    let hc = policy.slurm_health_condition.as_str();
    let pod_shows = !hc.is_empty()
        && view.pod.is_some_and(|p| {
            p.obs
                .conditions
                .iter()
                .any(|c| c.type_ == hc && c.status == ConditionStatus::False)
        });
    if side.unhealthy && pod_shows && !ctl.slurm_health_shown() {
        ctl.with_slurm_health(|h| {
            h.shown = true;
            h.unhealthy_since.get_or_insert(now);
        });
    }
    if slurm_visible {
        if let Some(at) = ctl
            .with_slurm_health(|h| health::slurm_health_step(h, side.unhealthy, now, policy, marks))
        {
            min_wake(wake, at);
        }
    }
}

/// Causes keep their origin while they hold; the event behind what happens
/// now is the origin of the cause in force, or, while lockstep's drain waits
/// to be lifted, the event that cleared its cause.
fn carry_origins(ctl: &mut NodeCtl, causes: &[Cause], view: &NodeView<'_>, ctx: &Ctx<'_>) {
    let here = || Origin {
        ms: ctx.now_ms,
        seq: ctx.seq,
        event: ctx.event.clone(),
    };
    let had_causes = !ctl.causes.is_empty();
    if !ctl.causes.iter().map(|(c, _)| c).eq(causes.iter()) {
        let mut next = Vec::with_capacity(causes.len());
        for c in causes {
            let origin = ctl
                .causes
                .iter()
                .find(|(old, _)| old == c)
                .map(|(_, o)| o.clone())
                .or_else(|| match c {
                    Cause::Health(HealthCause::NotReady) => {
                        view.kube.and_then(|k| k.not_ready_since.clone())
                    }
                    Cause::Health(HealthCause::KubeNodeGone) => view.kube_gone.cloned(),
                    _ => None,
                })
                .unwrap_or_else(here);
            next.push((c.clone(), origin));
        }
        ctl.causes = next;
    }
    if !causes.is_empty() {
        ctl.cleared = None;
    } else if had_causes {
        ctl.cleared = Some(Box::new(here()));
    }
}

/// What Slurm should show of the node (`drain::state_want`), held by the
/// cluster-wide bound on new health drains (`health.rate_limited`), brought
/// about through the node's state slot; and the phase transition.
#[allow(clippy::too_many_arguments)]
fn decide_state(
    node: &Node<'_>,
    ctl: &mut NodeCtl,
    flights: &mut Flights,
    causes: &[Cause],
    slurm_visible: bool,
    cluster_drains: &mut VecDeque<u64>,
    policy: &Policy,
    ctx: &Ctx<'_>,
    wake: &mut Option<u64>,
    out: &mut Output,
) {
    let Node {
        name,
        view,
        slurm,
        side,
        idle,
    } = *node;
    let key = Key::Slurm(name, AspectRef::State);
    let now = ctx.now_ms;
    let had_health = ctl.causes.iter().any(|(c, _)| c.is_health());
    let has_health = causes.iter().any(Cause::is_health);
    ctl.health
        .follow(had_health, has_health, now, &policy.health);
    carry_origins(ctl, causes, view, ctx);
    let primary = causes.first();
    let before = Before {
        phase: ctl.status.phase,
        rule: ctl.status.rule,
        had_cause: ctl.status.cause.is_some(),
    };
    let resume_hold = || ctl.health.resume_hold(now, &policy.health);
    let StateWant {
        phase,
        mut rule,
        action,
        held_until,
    } = drain::state_want(primary, view, slurm, side, before, resume_hold, policy);
    let mut act = held_until.is_none();
    if let Some(at) = held_until {
        min_wake(wake, at);
    }
    let already = |a: &Action| {
        flights
            .get(key)
            .and_then(|s| s.current.as_ref())
            .is_some_and(|f| f.action == *a)
    };
    // The cluster-wide bound admits a node's health drain once: a drain put
    // back while its cause holds (`drain.reapply`) was admitted already.
    let bounded = primary.is_some_and(Cause::is_health) && rule != Rule::Reapplied;
    if let (Some(a), true) = (&action, bounded) {
        if !already(a) {
            let max = policy.health.drains_per_minute_max;
            if let Some(at) = health::rate_limited(cluster_drains, now, max) {
                rule = Rule::RateLimited;
                act = false;
                min_wake(wake, at);
            }
        }
    }
    let cause_event: &EventId = match (ctl.causes.first(), &ctl.cleared) {
        (Some((_, o)), _) => &o.event,
        (None, Some(o)) if side.owned_out() => &o.event,
        _ => ctx.event,
    };
    let mut gave_up = None;
    if !slurm_visible {
        rule = Rule::SlurmInvisible;
    } else if act && !(idle && action.is_none()) {
        let issue = Issue {
            seq: ctx.seq,
            now_ms: now,
            cause: cause_event,
            rule: rule.name(),
        };
        let step = flights.bring(key, action, &issue, &policy.actions, &mut out.actions, wake);
        match step {
            Step::GaveUp { attempts, error } => {
                rule = Rule::GaveUp;
                gave_up = Some(format!("gave up after {attempts} attempts: {error}"));
            }
            Step::Sent { attempt } => {
                if side.unseen {
                    // Sent over an observation that predates lockstep's
                    // previous change: only a later one can show this one.
                    ctl.fresh_after = Some(ctx.seq);
                }
                if attempt == 1 && bounded {
                    let max = policy.health.drains_per_minute_max as usize;
                    health::record(cluster_drains, now, 60_000, max);
                }
            }
            Step::Quiet => {}
        }
    } else if flights
        .get(key)
        .and_then(|s| s.current.as_ref())
        .is_some_and(|f| f.flight != Flight::Sent)
    {
        // Held (rate bound, damping): forget a finished action so the next
        // attempt starts fresh.
        flights.clear(key);
    }

    let status = Status {
        phase,
        rule,
        cause: primary.cloned(),
    };
    if status != ctl.status {
        let detail =
            gave_up.unwrap_or_else(|| detail(&status, view, slurm, policy, ctl.health.spells()));
        out.transitions.push(Transition {
            seq: ctx.seq,
            time_ms: now,
            node: name.to_owned(),
            from: ctl.status.phase,
            to: phase,
            rule,
            cause: cause_event.clone(),
            detail,
        });
        ctl.status = status;
    }
}

/// A transition when the unit label becomes unusable or usable again
/// (`topology` row 3).
fn topology_issue(
    ctl: &mut NodeCtl,
    name: &str,
    invalid: Option<String>,
    ctx: &Ctx<'_>,
    out: &mut Output,
) {
    if invalid != ctl.topology_issue {
        let (rule, detail) = match &invalid {
            Some(why) => (
                Rule::TopologyInvalid,
                format!("{why}; slurm's topology is left as it is"),
            ),
            None => (Rule::Topology, "topology label usable again".to_owned()),
        };
        out.transitions.push(Transition {
            seq: ctx.seq,
            time_ms: ctx.now_ms,
            node: name.to_owned(),
            from: ctl.status.phase,
            to: ctl.status.phase,
            rule,
            cause: ctx.event.clone(),
            detail,
        });
        ctl.topology_issue = invalid;
    }
}

/// The human-readable explanation of a status.
pub(super) fn detail(
    status: &Status,
    view: &crate::model::NodeView<'_>,
    slurm: &lockstep_schemas::SlurmNode,
    policy: &Policy,
    flaps: usize,
) -> String {
    let cause = || {
        status
            .cause
            .as_ref()
            .map_or_else(String::new, |c| c.describe(view))
    };
    let slurm_state = || {
        let mut s = slurm.state.to_string();
        for f in &slurm.flags {
            s.push('+');
            s.push_str(f.as_str());
        }
        s
    };
    match status.rule {
        Rule::ScaleIn
        | Rule::Replace
        | Rule::Cordoned
        | Rule::PodDeleting
        | Rule::PodEvicted
        | Rule::PodMissing
        | Rule::NotReady
        | Rule::NodeCondition
        | Rule::KubeNodeGone
        | Rule::Maintenance => match status.phase {
            Phase::Drained => format!("{}; slurm shows {}", cause(), slurm_state()),
            _ => cause(),
        },
        Rule::Reapplied => format!("{}; the drain was removed while its cause holds", cause()),
        Rule::RateLimited => format!(
            "{}; deferred: health drains are at the bound of {} per minute",
            cause(),
            policy.health.drains_per_minute_max
        ),
        Rule::CauseCleared => "cause cleared; resuming lockstep's drain".to_owned(),
        Rule::ResumeDelayed => format!(
            "cause cleared; resume once healthy for {}s",
            policy.health.resume_after_s
        ),
        Rule::FlapHold => format!(
            "cause cleared, but {flaps} health spells within {}s; held for {}s",
            policy.health.flap_window_s, policy.health.flap_hold_s
        ),
        Rule::ForeignDrain => format!(
            "drained by {}: {}",
            slurm.reason_user.as_deref().unwrap_or("someone else"),
            slurm.reason.as_deref().unwrap_or("(no reason)")
        ),
        Rule::SlurmUnhealthy => format!(
            "slurm reports {}{}",
            slurm_state(),
            slurm
                .reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
        Rule::SlurmInvisible => {
            "lockstep cannot see slurm; no slurm actions until it can".to_owned()
        }
        Rule::Observed => format!("slurm shows {}", slurm_state()),
        Rule::Gone => "slurm no longer reports the node".to_owned(),
        Rule::GaveUp => "gave up".to_owned(),
        Rule::Features
        | Rule::Topology
        | Rule::TopologyInvalid
        | Rule::Busy
        | Rule::Scaling
        | Rule::ScaleUp
        | Rule::ScaleDown
        | Rule::DeletePod
        | Rule::DeletionCost
        | Rule::ScaleInBlocked
        | Rule::Retired
        | Rule::Reserve
        | Rule::Release
        | Rule::DrainConditions => String::new(),
    }
}
