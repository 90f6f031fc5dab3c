//! The drain policy's stateful half: the causes in force with their
//! origins, what Slurm should show of a node ([`super::state_want`]) through
//! health damping's gate, the node's state slot, and its phase.

use lockstep_schemas::{Action, ConditionStatus, EventId, Policy, Rule, SlurmNode, Transition};

use super::{Before, SlurmSide, StateWant};
use crate::cause::{Cause, HealthCause, Status};
use crate::ctx::{Ctx, Output};
use crate::flights::{AspectRef, Flights, Key};
use crate::health;
use crate::model::{NodeView, Origin};
use crate::node::NodeCtl;
use crate::slot::{Flight, Issue, Step};
use crate::timers::min_wake;
use crate::units::{after_ms, ms};

/// The Slurm node being evaluated, as the model joins it.
#[derive(Clone, Copy)]
pub(crate) struct Node<'a> {
    pub name: &'a str,
    pub view: &'a NodeView<'a>,
    pub slurm: &'a SlurmNode,
    pub side: SlurmSide,
    /// No action of it is in flight.
    pub idle: bool,
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

/// What Slurm should show of the node (`drain::state_want`), through health
/// damping's gate (`health::Gate`: the resume hold, the cluster-wide bound
/// on new health drains), brought about through the node's state slot; and
/// the phase transition.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decide(
    node: &Node<'_>,
    ctl: &mut NodeCtl,
    damping: &mut health::Cluster,
    flights: &mut Flights,
    causes: &[Cause],
    slurm_visible: bool,
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
    carry_origins(ctl, causes, view, ctx);
    let primary = causes.first();
    let before = Before {
        phase: ctl.status.phase,
        rule: ctl.status.rule,
        had_cause: ctl.status.cause.is_some(),
    };
    let mut gate = health::Gate {
        cluster: damping,
        node: &mut ctl.health,
        policy: &policy.health,
        now_ms: now,
    };
    gate.follow(had_health, has_health);
    // A return to service that waits for the health signal: the signal,
    // and whether anything is left to hold.
    let rc = policy.health.return_condition.as_str();
    let good = !rc.is_empty()
        && view.kube.is_some_and(|k| {
            k.obs
                .conditions
                .iter()
                .any(|c| c.type_ == rc && c.status == ConditionStatus::True)
        });
    // Something is left to hold while a cause holds, lockstep's drain is
    // in Slurm, or one of lockstep's is on its way (sent, or done and not
    // shown by Slurm yet: its slot keeps it, below).
    gate.follow_return(good, !causes.is_empty() || side.owned_out() || side.unseen);
    let resume_hold = || gate.resume_hold();
    let StateWant {
        phase,
        mut rule,
        action,
        held,
    } = super::state_want(primary, view, slurm, side, before, resume_hold, policy);
    let mut act = held.is_none();
    if let Some(Some(at)) = held {
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
            if let Err(at) = gate.admit() {
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
    // lockstep's last drain, down or resume of the node is done in Slurm but
    // does not show yet, and nothing else is wanted now: its slot keeps it
    // until it shows, or until its timeout, so that what Slurm shows still
    // counts as about to change (`unseen`) while the poller catches up.
    // Nothing else is sent meanwhile either: a drain right after a resume
    // (or the other way round) could bring the node back to what the poller
    // last reported before it ever saw the first, and the poller reports
    // only changes, so no later observation would show the second.
    let landing = side.unseen && {
        let timeout_ms = ms(policy.actions.timeout_s);
        match flights.current(key) {
            Some(c) if action.as_ref().is_none_or(|a| *a != c.action) => match c.flight {
                Flight::Done { at_ms } if now < after_ms(at_ms, timeout_ms) => {
                    min_wake(wake, after_ms(at_ms, timeout_ms));
                    true
                }
                _ => false,
            },
            _ => false,
        }
    };
    let mut gave_up = None;
    if !slurm_visible {
        rule = Rule::SlurmInvisible;
    } else if landing {
        // Kept as it is (above).
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
                    if ctl.fresh_after.is_none() {
                        ctl.fresh_written = false;
                        ctl.fresh_resumes_only = false;
                    }
                    ctl.fresh_after = Some(ctx.seq);
                }
                if attempt == 1 && bounded {
                    gate.sent();
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
        let detail = gave_up.unwrap_or_else(|| {
            status.detail(view, slurm, policy, gate.spells(), gate.returning_since())
        });
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
