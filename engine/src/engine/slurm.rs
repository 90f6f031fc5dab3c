#[allow(clippy::wildcard_imports)]
use super::*;

impl Engine {
    /// Re-evaluates one Slurm node: its causes, what Slurm should show, what
    /// its pod should show, and its phase.
    pub(super) fn eval_slurm(&mut self, name: &str, ctx: &Ctx<'_>, out: &mut Output) {
        let policy = &self.policy;
        let view = self.model.view(name, policy);
        let now = ctx.now_ms;
        let mut wake = None;
        let mut causes = std::mem::take(&mut self.scratch_causes);
        causes.clear();
        let previous: &[(Cause, Origin)] = self.ctl.get(name).map_or(&[], |c| &c.causes);
        let mut prev_causes: Vec<Cause> = Vec::new();
        if !previous.is_empty() {
            prev_causes.extend(previous.iter().map(|(c, _)| c.clone()));
        }
        drain::causes(
            &view,
            &policy.drain,
            policy.mapping.mode,
            &prev_causes,
            &mut causes,
        );
        if let Some(window) = maintenance::drain_window(
            view.kube.map(|k| &k.obs),
            &policy.maintenance,
            now,
            &mut wake,
        ) {
            causes.push(Cause::Maintenance(window));
        }
        health::causes(&view, &policy.health, now, &mut causes, &mut wake);
        if let Some(v) = self.victims.get(name) {
            match v.kind {
                // Until the replica count drops, a pod its controller
                // recreates meanwhile is on its way out too.
                VictimKind::ScaleIn => causes.push(Cause::ScaleIn),
                // A replacement is done once the old pod is gone.
                VictimKind::Replace => {
                    if view.pod.is_some_and(|p| p.obs.uid == v.uid) {
                        causes.push(Cause::Replace);
                    }
                }
            }
        }

        let Some(slurm) = view.slurm else {
            // Slurm does not know this node: nothing to drain or resume.
            if let Some(ctl) = self.ctl.remove(name) {
                let status = Status {
                    phase: Phase::Unknown,
                    rule: Rule::Gone,
                    cause: None,
                };
                if ctl.status != status {
                    out.transitions.push(Transition {
                        seq: ctx.seq,
                        time_ms: now,
                        node: name.to_owned(),
                        from: ctl.status.phase,
                        to: Phase::Unknown,
                        rule: Rule::Gone,
                        cause: ctx.event.clone(),
                        detail: "slurm no longer reports the node".to_owned(),
                    });
                }
                self.timers.set(WakeOf::Slurm(name), None);
                self.park(ctl.state_slot);
            }
            self.scratch_causes = causes;
            return;
        };
        let side = SlurmSide::of(
            slurm,
            &Ownership {
                prefix: &policy.drain.reason_prefix,
                earlier_prefixes: &self.retired.prefixes,
                slurm_user: policy.drain.slurm_user.as_deref(),
            },
        );
        if !self.ctl.contains_key(name) {
            let mut ctl = NodeCtl::default();
            if let Some(slot) = self.orphans.remove(&Target::SlurmNodeState {
                node: name.to_owned(),
            }) {
                ctl.state_slot = slot;
            }
            self.ctl.insert(name.to_owned(), ctl);
        }
        let ctl = self.ctl.get_mut(name).expect("inserted above");

        // Slurm -> Kubernetes: what lockstep shows of Slurm's health, damped
        // like the other direction (health::slurm_health_step).
        let shown_before = ctl.slurm_health.shown;
        // What Kubernetes already shows for a node Slurm still reports
        // unhealthy (set before a restart or an upgrade) is kept, not
        // flipped to healthy for the length of a grace period.
        let hc = policy.health.slurm_health_condition.as_str();
        let pod_shows = !hc.is_empty()
            && view.pod.is_some_and(|p| {
                p.obs
                    .conditions
                    .iter()
                    .any(|c| c.type_ == hc && c.status == ConditionStatus::False)
            });
        if side.unhealthy && pod_shows && !ctl.slurm_health.shown {
            ctl.slurm_health.shown = true;
            ctl.slurm_health.unhealthy_since.get_or_insert(now);
        }
        if self.model.slurm_visible {
            if let Some(at) = health::slurm_health_step(
                &mut ctl.slurm_health,
                side.unhealthy,
                now,
                &policy.health,
                &mut self.slurm_marks,
            ) {
                min_wake(&mut wake, at);
            }
        }
        let shown = ctl.slurm_health.shown;

        // Causes keep their origin while they hold.
        let had_causes = !ctl.causes.is_empty();
        if !ctl.causes.iter().map(|(c, _)| c).eq(causes.iter()) {
            let mut next = Vec::with_capacity(causes.len());
            for c in &causes {
                let origin = ctl
                    .causes
                    .iter()
                    .find(|(old, _)| old == c)
                    .map(|(_, o)| o.clone())
                    .or_else(|| match c {
                        Cause::NotReady => view.kube.and_then(|k| k.not_ready_since.clone()),
                        Cause::KubeNodeGone => view.kube_gone.cloned(),
                        _ => None,
                    })
                    .unwrap_or_else(|| Origin {
                        ms: now,
                        seq: ctx.seq,
                        event: ctx.event.clone(),
                    });
                next.push((c.clone(), origin));
            }
            ctl.causes = next;
        }
        if !causes.is_empty() {
            ctl.cleared = None;
        } else if had_causes {
            ctl.cleared = Some(Origin {
                ms: now,
                seq: ctx.seq,
                event: ctx.event.clone(),
            });
        }
        // The event behind what happens now: the origin of the cause in
        // force, or, while lockstep's drain waits to be lifted, the event that
        // cleared its cause.
        let cause_event: &EventId = match (ctl.causes.first(), &ctl.cleared) {
            (Some((_, o)), _) => &o.event,
            (None, Some(o)) if side.owned_out() => &o.event,
            _ => ctx.event,
        };

        // What Slurm should show.
        let mut want = None;
        let mut act = true;
        let (phase, mut rule) = if let Some(primary) = causes.first() {
            ctl.last_cause_health = primary.is_health();
            let down =
                primary.is_health() && policy.health.action == lockstep_schemas::HealthAction::Down;
            let reason = format!("{} {}", policy.drain.reason_prefix, primary.describe(&view));
            let shown = if down {
                side.down
            } else {
                side.drained || (side.down && side.owned)
            };
            // A cause that names itself rewrites only lockstep's own reason:
            // a drain somebody else set already keeps the node out, and its
            // reason is theirs (replacing it would make it lockstep's, to be
            // resumed later).
            let satisfied = shown
                && (!primary.names_itself()
                    || !side.owned
                    || slurm.reason.as_deref() == Some(&reason));
            if satisfied {
                (Phase::Drained, primary.rule())
            } else {
                // Drained for a cause that still holds, and Slurm no longer
                // shows it: someone removed lockstep's drain early. (Not a
                // drain that only needs to say its new cause.)
                let reapply = (ctl.status.phase == Phase::Drained
                    && ctl.status.cause.is_some()
                    && !shown)
                    || (ctl.status.phase == Phase::Draining && ctl.status.rule == Rule::Reapplied);
                let mut rule = if reapply {
                    Rule::Reapplied
                } else {
                    primary.rule()
                };
                let action = if down {
                    Action::SlurmDown {
                        node: name.to_owned(),
                        reason,
                    }
                } else {
                    Action::SlurmDrain {
                        node: name.to_owned(),
                        reason,
                    }
                };
                let already = ctl
                    .state_slot
                    .current
                    .as_ref()
                    .is_some_and(|f| f.action == action);
                if primary.is_health() && !already {
                    if let Some(at) = health::rate_limited(
                        &mut self.health_drains,
                        now,
                        policy.health.drains_per_minute_max,
                    ) {
                        rule = Rule::RateLimited;
                        act = false;
                        min_wake(&mut wake, at);
                    }
                }
                want = Some(action);
                (Phase::Draining, rule)
            }
        } else {
            if side.owned_out() {
                let hold = if ctl.last_cause_health {
                    let resume_at = after_s(
                        ctl.cleared.as_ref().map_or(0, |o| o.ms),
                        policy.health.resume_after_s,
                    );
                    match health::flap_hold(&ctl.health_drains, now, &policy.health) {
                        Some(until) => Some((Rule::FlapHold, until.max(resume_at))),
                        None if now < resume_at => Some((Rule::ResumeDelayed, resume_at)),
                        None => None,
                    }
                } else {
                    None
                };
                match hold {
                    Some((rule, until)) => {
                        min_wake(&mut wake, until);
                        act = false;
                        (Phase::Resuming, rule)
                    }
                    None => {
                        want = Some(Action::SlurmResume {
                            node: name.to_owned(),
                        });
                        (Phase::Resuming, Rule::CauseCleared)
                    }
                }
            } else if side.foreign_drain() {
                (Phase::ForeignDrain, Rule::ForeignDrain)
            } else if side.unhealthy {
                (Phase::SlurmUnhealthy, Rule::SlurmUnhealthy)
            } else {
                (Phase::InService, Rule::Observed)
            }
        };

        let mut gave_up = None;
        if !self.model.slurm_visible {
            rule = Rule::SlurmInvisible;
        } else if act {
            let before = out.actions.len();
            let issue = Issue {
                seq: ctx.seq,
                now_ms: now,
                cause: cause_event,
                rule: rule.name(),
            };
            let (step, w) =
                ctl.state_slot
                    .reconcile(want, &issue, &policy.actions, &mut out.actions);
            if let Some(w) = w {
                min_wake(&mut wake, w);
            }
            if let Step::GaveUp { attempts, error } = step {
                rule = Rule::GaveUp;
                gave_up = Some(format!("gave up after {attempts} attempts: {error}"));
            }
            let new_health_out = out.actions[before..].iter().any(|a| {
                a.attempt == 1
                    && matches!(
                        a.action,
                        Action::SlurmDrain { .. } | Action::SlurmDown { .. }
                    )
            }) && causes.first().is_some_and(Cause::is_health);
            if new_health_out {
                let window_ms = ms(policy.health.flap_window_s);
                let bound = policy.health.flaps_max as usize + 1;
                health::record(&mut ctl.health_drains, now, window_ms, bound);
                health::record(
                    &mut self.health_drains,
                    now,
                    60_000,
                    policy.health.drains_per_minute_max as usize,
                );
            }
        } else if matches!(ctl.state_slot.current, Some(ref f) if f.flight != Flight::Sent) {
            // Held (rate bound, damping): forget a finished action so the
            // next attempt starts fresh.
            ctl.state_slot.current = None;
        }

        // Phase and the rule behind it.
        let status = Status {
            phase,
            rule,
            cause: causes.first().cloned(),
        };
        if status != ctl.status {
            let detail = gave_up
                .unwrap_or_else(|| detail(&status, &view, slurm, policy, ctl.health_drains.len()));
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

        // Features and topology from the labels of the node under it.
        if self.model.slurm_visible {
            let kube_obs = view.kube.map(|k| &k.obs);
            let unseen = view.kube.map_or(&[][..], |k| &k.unseen_labels);
            let features = topology::features_want(
                slurm,
                kube_obs,
                &policy.topology,
                unseen,
                &self.retired.feature_prefixes,
            )
            .map(|features| Action::SlurmSetFeatures {
                node: name.to_owned(),
                features,
            });
            let issue = Issue {
                seq: ctx.seq,
                now_ms: now,
                cause: ctx.event,
                rule: Rule::Features.name(),
            };
            let (_, w) =
                ctl.features_slot
                    .reconcile(features, &issue, &policy.actions, &mut out.actions);
            if let Some(w) = w {
                min_wake(&mut wake, w);
            }
            let kube_named = view.kube_name.zip(kube_obs);
            let (topology, issue_now) =
                match topology::topology_want(slurm, kube_named, &policy.topology, unseen) {
                    TopologyWant::Leave => (None, None),
                    TopologyWant::Set(topology) => (
                        Some(Action::SlurmSetTopology {
                            node: name.to_owned(),
                            topology,
                        }),
                        None,
                    ),
                    TopologyWant::Invalid(why) => (None, Some(why)),
                };
            let issue = Issue {
                seq: ctx.seq,
                now_ms: now,
                cause: ctx.event,
                rule: Rule::Topology.name(),
            };
            let (_, w) =
                ctl.topology_slot
                    .reconcile(topology, &issue, &policy.actions, &mut out.actions);
            if let Some(w) = w {
                min_wake(&mut wake, w);
            }
            if issue_now != ctl.topology_issue {
                let (rule, detail) = match &issue_now {
                    Some(why) => (
                        Rule::TopologyInvalid,
                        format!("{why}; slurm's topology is left as it is"),
                    ),
                    None => (Rule::Topology, "topology label usable again".to_owned()),
                };
                out.transitions.push(Transition {
                    seq: ctx.seq,
                    time_ms: now,
                    node: name.to_owned(),
                    from: ctl.status.phase,
                    to: ctl.status.phase,
                    rule,
                    cause: ctx.event.clone(),
                    detail,
                });
                ctl.topology_issue = issue_now;
            }
        }

        // What the pod should show (Slurm -> Kubernetes): conditions and the
        // busy label. (slot key, wanted action or None when it shows it, rule)
        let mut pod_wants: Vec<(String, Option<Action>, &'static str)> = Vec::new();
        let mut pod_key_owned = None;
        if let (Some(key), Some(pod)) = (view.pod_key, view.pod) {
            if self.model.kube_visible {
                let set = |condition: PodCondition| Action::KubeSetPodCondition {
                    namespace: pod.obs.namespace.clone(),
                    pod: pod.obs.name.clone(),
                    condition,
                };
                let fd = policy.drain.foreign_drain_condition.as_str();
                if !fd.is_empty() {
                    let wanted = side.foreign_drain().then(|| {
                        (
                            ConditionStatus::True,
                            "SlurmDrain",
                            slurm.reason.as_deref().unwrap_or(""),
                        )
                    });
                    let want = condition_want(&pod.obs.conditions, fd, wanted, "SlurmNotDrained");
                    if want.is_some() || pod.has_slot(fd) {
                        pod_wants.push((fd.to_owned(), want.map(set), Rule::ForeignDrain.name()));
                    }
                }
                let hc = policy.health.slurm_health_condition.as_str();
                if !hc.is_empty() {
                    // While shown after Slurm recovered (hysteresis, flap
                    // hold), the condition keeps what it said.
                    let kept = pod
                        .obs
                        .conditions
                        .iter()
                        .find(|c| c.type_ == hc && c.status == ConditionStatus::False)
                        .map(|c| {
                            (
                                ConditionStatus::False,
                                c.reason.as_str(),
                                c.message.as_str(),
                            )
                        });
                    let wanted = match (shown, side.unhealthy) {
                        (false, _) => None,
                        (true, true) => Some((
                            ConditionStatus::False,
                            drain::unhealthy_reason(slurm),
                            slurm.reason.as_deref().unwrap_or(""),
                        )),
                        // Held, not newly shown (a new pod of a node that
                        // recovered meanwhile shows nothing).
                        (true, false) => kept,
                    };
                    let want = condition_want_health(&pod.obs.conditions, hc, wanted);
                    if want.is_some() || pod.has_slot(hc) {
                        pod_wants.push((hc.to_owned(), want.map(set), Rule::SlurmUnhealthy.name()));
                    }
                }
                let label = policy.scaling.busy_label.as_str();
                if !label.is_empty() {
                    let busy = self.model.jobs_on(name) > 0 || scaling::slurm_busy(slurm);
                    let present = pod.obs.labels.get(label).map(String::as_str);
                    let value = match (busy, present) {
                        (true, Some("true")) | (false, None) => None,
                        (true, _) => Some(Some("true".to_owned())),
                        (false, Some(_)) => Some(None),
                    };
                    let slot_key = format!("label:{label}");
                    if value.is_some() || pod.has_slot(&slot_key) {
                        let want = value.map(|value| Action::KubeLabelPod {
                            namespace: pod.obs.namespace.clone(),
                            pod: pod.obs.name.clone(),
                            key: label.to_owned(),
                            value,
                        });
                        pod_wants.push((slot_key, want, Rule::Busy.name()));
                    }
                }
                // What lockstep set under names the policy no longer has. A
                // condition cannot be removed (the actions set conditions),
                // so it says Unknown: lockstep no longer keeps it current.
                for ty in &self.retired.conditions {
                    let present = pod.obs.conditions.iter().find(|c| c.type_ == *ty);
                    let want = present
                        .filter(|c| {
                            !(c.status == ConditionStatus::Unknown && c.reason == NOT_MANAGED)
                        })
                        .map(|_| {
                            set(PodCondition {
                                type_: ty.clone(),
                                status: ConditionStatus::Unknown,
                                reason: NOT_MANAGED.to_owned(),
                                message: "lockstep no longer manages this condition".to_owned(),
                            })
                        });
                    if want.is_some() || pod.has_slot(ty) {
                        pod_wants.push((ty.clone(), want, Rule::Retired.name()));
                    }
                }
                for label in &self.retired.labels {
                    let slot_key = format!("label:{label}");
                    let want = pod
                        .obs
                        .labels
                        .contains_key(label)
                        .then(|| Action::KubeLabelPod {
                            namespace: pod.obs.namespace.clone(),
                            pod: pod.obs.name.clone(),
                            key: label.clone(),
                            value: None,
                        });
                    if want.is_some() || pod.has_slot(&slot_key) {
                        pod_wants.push((slot_key, want, Rule::Retired.name()));
                    }
                }
                if !pod_wants.is_empty() {
                    pod_key_owned = Some(key.to_owned());
                }
            }
        }
        if let Some(key) = pod_key_owned {
            let entry = self
                .model
                .pods
                .get_mut(&key)
                .expect("pod seen in this view");
            for (slot_key, want, rule) in pod_wants {
                let issue = Issue {
                    seq: ctx.seq,
                    now_ms: now,
                    cause: ctx.event,
                    rule,
                };
                if let Some(w) = reconcile_keyed(
                    &mut entry.condition_slots,
                    &slot_key,
                    want,
                    &issue,
                    &policy.actions,
                    &mut out.actions,
                ) {
                    min_wake(&mut wake, w);
                }
            }
        }

        self.scratch_causes = causes;
        self.timers.set(WakeOf::Slurm(name), wake);
        if shown != shown_before {
            // The taint of the Kubernetes node under it follows.
            if let Some(k) = self.model.placement(name, &self.policy) {
                self.dirty.push(Wake::Kube(k.to_owned()));
            }
        }
    }
}

/// The condition lockstep wants on a pod, or `None` if the pod already shows
/// it. `wanted` is `(status, reason, message)` while the condition applies;
/// once it no longer does, a condition lockstep set is flipped to False with
/// `clear_reason`, and an absent one stays absent.
pub(super) fn condition_want(
    observed: &[PodCondition],
    ty: &str,
    wanted: Option<(ConditionStatus, &str, &str)>,
    clear_reason: &str,
) -> Option<PodCondition> {
    let present = observed.iter().find(|c| c.type_ == ty);
    let (status, reason, message) = match (wanted, present) {
        (Some(w), _) => w,
        (None, Some(c)) if c.status == ConditionStatus::True => {
            (ConditionStatus::False, clear_reason, "")
        }
        (None, _) => return None,
    };
    if present.is_some_and(|c| c.status == status && c.reason == reason && c.message == message) {
        return None;
    }
    Some(PodCondition {
        type_: ty.to_owned(),
        status,
        reason: reason.to_owned(),
        message: message.to_owned(),
    })
}

/// Like [`condition_want`] for the health condition, whose healthy state is True.
pub(super) fn condition_want_health(
    observed: &[PodCondition],
    ty: &str,
    wanted: Option<(ConditionStatus, &str, &str)>,
) -> Option<PodCondition> {
    let present = observed.iter().find(|c| c.type_ == ty);
    let (status, reason, message) = match (wanted, present) {
        (Some(w), _) => w,
        (None, Some(c)) if c.status != ConditionStatus::True => {
            (ConditionStatus::True, "SlurmHealthy", "")
        }
        (None, _) => return None,
    };
    if present.is_some_and(|c| c.status == status && c.reason == reason && c.message == message) {
        return None;
    }
    Some(PodCondition {
        type_: ty.to_owned(),
        status,
        reason: reason.to_owned(),
        message: message.to_owned(),
    })
}

/// The reason of a pod condition lockstep set under a type the policy no
/// longer names, once it is left: Unknown, no longer kept current.
pub(super) const NOT_MANAGED: &str = "LockstepNotManaged";

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
            "cause cleared, but {flaps} health drains within {}s; held for {}s",
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
        | Rule::Retired
        | Rule::Reserve
        | Rule::Release
        | Rule::DrainConditions => String::new(),
    }
}
