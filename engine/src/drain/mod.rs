//! Drain policy: why lockstep takes a Slurm node out of service, and how it
//! tells its own drains from everybody else's.
//!
//! | row | holds when                                   | rule               |
//! |-----|----------------------------------------------|--------------------|
//! | 1   | the Kubernetes node is cordoned              | `drain.cordon`     |
//! | 2   | the pod is being deleted                     | `drain.pod_deleting` |
//! | 3   | the pod is evicted (DisruptionTarget=True)   | `drain.pod_evicted` |
//! | 4   | pod mode, row 2, 3 or 4 held before (or the pod went without a `deleting` phase: a force delete, a relist that no longer lists it or lists another pod of its name) and no pod of the node is Running and Ready now: slurmd has no pod until its replacement serves | `drain.pod_missing` |
//! | 5   | `eviction_responder`: an eviction of the pod that lockstep answers is under way, not canceled (`evict` has the response) | `drain.eviction_requested` |
//!
//! The maintenance window (`maintenance`, row 3) follows, then the health
//! rows (`health`). The first row that holds names the drain. What Slurm
//! should show then ([`state_want`]):
//!
//! | holds when                                                    | wants                                  | rule                     |
//! |---------------------------------------------------------------|----------------------------------------|--------------------------|
//! | a cause, and Slurm does not show the node out (somebody else's drain, or a DOWN a user set, keeps it out) | drain (DOWN for a health cause with `health.action: down`), reason `<prefix> <cause>` | the cause's row |
//! | a cause, lockstep's drain for it was there and is gone          | the drain again                         | `drain.reapply`          |
//! | no cause, lockstep's drain or down is in Slurm                  | resume (unless health damping holds it) | `drain.cause_cleared`    |
//! | no cause, somebody else's drain or down                         | nothing: shown, never undone            | `drain.foreign`          |
//! | no cause, Slurm reports the node unhealthy                      | nothing                                 | `health.slurm_unhealthy` |
//! | no cause, nothing out                                           | nothing                                 | `observe.slurm`          |
//!
//! Slurm is trusted only while lockstep sees it: after it sees Slurm again,
//! no rule acts on Slurm until complete listings of nodes and jobs, started
//! since, are applied (`model::Regain`). The Slurm actuator follows the same
//! ownership: it reads the node first and leaves a drain or down it does
//! not own as it is (outcome `declined`), so an admin's drain that lands
//! while lockstep's is on its way is never replaced and so never resumed.
//!
//! Ownership ([`Ownership::owns`]): a drain or down is lockstep's own when
//! Slurm says lockstep's Slurm user (`drain.slurm_user`) set its reason; when
//! that user is not configured or Slurm does not say who set it, when its
//! reason starts with the policy's reason prefix or one lockstep used under
//! an earlier policy. lockstep resumes only those, never anybody else's. A
//! DOWN whose reason ends in ` : Not responding` is slurmctld's (24.11 and
//! later append that to the reason lockstep set), never lockstep's.

mod decide;
pub(crate) use decide::{decide, Node};

use lockstep_schemas::{
    Action, DrainPolicy, HealthAction, KubePod, MappingMode, Phase, Policy, SlurmBaseState,
    SlurmNode, SlurmNodeFlag,
};

use crate::cause::{Cause, DrainCause};
use crate::model::NodeView;
use lockstep_schemas::Rule;

/// Rows 1-5 of the table. `had_pod_loss`: a pod loss (rows 2-4) was among
/// the causes in force before.
pub(crate) fn causes(
    view: &NodeView<'_>,
    policy: &DrainPolicy,
    mode: MappingMode,
    had_pod_loss: bool,
    out: &mut Vec<Cause>,
) {
    if policy.on_cordon && view.kube.is_some_and(|k| k.obs.unschedulable) {
        out.push(Cause::Drain(DrainCause::Cordoned));
    }
    if policy.on_pod_disruption {
        let pod = view.pod.map(|p| &p.obs);
        if let Some(pod) = pod.filter(|p| p.deleting || p.disruption_target) {
            if pod.deleting {
                out.push(Cause::Drain(DrainCause::PodDeleting));
            }
            if pod.disruption_target {
                out.push(Cause::Drain(DrainCause::PodEvicted));
            }
        } else if mode == MappingMode::Pod
            && !pod.is_some_and(KubePod::running_and_ready)
            && had_pod_loss
        {
            // A replacement that is Pending, or Running but not Ready, does
            // not serve yet: slurmd in it may not even have started.
            out.push(Cause::Drain(DrainCause::PodMissing));
        }
    }
    if crate::evict::requested(view, policy) {
        out.push(Cause::Drain(DrainCause::EvictionRequested));
    }
}

/// What lockstep wants Slurm to show of one node, and the phase and rule
/// that say why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StateWant {
    pub phase: Phase,
    pub rule: Rule,
    /// The drain, down or resume that makes Slurm show it; `None`: Slurm
    /// shows it already, or nothing is wanted.
    pub action: Option<Action>,
    /// Health holds the node: nothing is sent now; until a log time (a
    /// timer looks again), or, `Some(None)`, until a signal.
    pub held: Option<Option<u64>>,
}

/// Where a node stood after its last evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Before {
    pub phase: Phase,
    pub rule: Rule,
    /// Whether a cause was in force.
    pub had_cause: bool,
}

/// The state rows: a cause in force takes the node out (drained, or DOWN for
/// a health cause with `health.action: down`), and puts it back out when an
/// owned drain was removed while its cause holds (`drain.reapply`); with no
/// cause, lockstep's own drain is resumed (`drain.cause_cleared`) unless
/// health damping holds it (`resume_hold`, asked only then); anybody
/// else's drain or Slurm's own unhealthy state is shown, never undone.
pub(crate) fn state_want(
    primary: Option<&Cause>,
    view: &NodeView<'_>,
    slurm: &SlurmNode,
    side: SlurmSide,
    before: Before,
    resume_hold: impl FnOnce() -> Option<(Rule, Option<u64>)>,
    policy: &Policy,
) -> StateWant {
    let quiet = |phase, rule| StateWant {
        phase,
        rule,
        action: None,
        held: None,
    };
    let Some(primary) = primary else {
        if side.owned_out() {
            return match resume_hold() {
                Some((rule, until)) => StateWant {
                    held: Some(until),
                    ..quiet(Phase::Resuming, rule)
                },
                None => StateWant {
                    action: Some(Action::SlurmResume {
                        node: slurm.name.to_string(),
                    }),
                    ..quiet(Phase::Resuming, Rule::CauseCleared)
                },
            };
        }
        return if side.foreign_drain() {
            quiet(Phase::ForeignDrain, Rule::ForeignDrain)
        } else if side.unhealthy {
            quiet(Phase::SlurmUnhealthy, Rule::SlurmUnhealthy)
        } else {
            quiet(Phase::InService, Rule::Observed)
        };
    };
    let down = primary.is_health() && policy.health.action == HealthAction::Down;
    let reason = format!(
        "{} {}",
        policy.drain.reason_prefix,
        primary.reason(view, policy.drain.reason_names_nodes)
    );
    // What Slurm shows before lockstep's own action on it shows is about to
    // change: a cause back while a resume is on its way takes the node out
    // again, and a drain sent for a new cause waits to be seen.
    let shown = !side.unseen
        && if down {
            side.down
        } else {
            side.drained || (side.down && (side.owned || side.held))
        };
    // A cause that names itself rewrites only lockstep's own reason: a drain
    // somebody else set already keeps the node out, and its reason is
    // theirs (replacing it would make it lockstep's, to be resumed later).
    let satisfied = shown
        && (!primary.names_itself() || !side.owned || slurm.reason.as_deref() == Some(&reason));
    if satisfied {
        return quiet(Phase::Drained, primary.rule());
    }
    // Drained for a cause that still holds, and Slurm no longer shows it:
    // somebody removed lockstep's drain early. (Not a drain that only needs
    // to say its new cause.)
    let reapply = (before.phase == Phase::Drained && before.had_cause && !shown)
        || (before.phase == Phase::Draining && before.rule == Rule::Reapplied);
    let rule = if reapply {
        Rule::Reapplied
    } else {
        primary.rule()
    };
    let node = slurm.name.to_string();
    let action = if down {
        Action::SlurmDown { node, reason }
    } else {
        Action::SlurmDrain { node, reason }
    };
    StateWant {
        action: Some(action),
        ..quiet(Phase::Draining, rule)
    }
}

/// How lockstep tells its own drains (module docs): the rule the Slurm
/// actuator follows too.
pub(crate) use lockstep_schemas::Ownership;

/// What Slurm shows, from lockstep's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlurmSide {
    /// DRAIN flag set.
    pub drained: bool,
    /// Base state DOWN.
    pub down: bool,
    /// The drain or down is lockstep's ([`Ownership::owns`]).
    pub owned: bool,
    /// Somebody else holds the node out: their drain, or a DOWN or FAIL a
    /// user set ([`Ownership::held_by_other`]); the Slurm actuator leaves it
    /// as it is, and it keeps the node out for any cause of lockstep's.
    pub held: bool,
    /// What Kubernetes shows as a drain by someone else: their drain, or a
    /// DOWN a user set of a node whose slurmd still answers (a DOWN of a
    /// node that also stopped answering reads the same whether a user or
    /// slurmctld set it, and shows as unhealthy instead).
    pub held_shown: bool,
    /// Slurm reports NOT_RESPONDING or FAIL, or DOWN not by lockstep's own
    /// `state=DOWN` (a drain lockstep made that Slurm then took DOWN is
    /// unhealthy: slurmd stopped answering under it).
    pub unhealthy: bool,
    /// Unhealthy by no doing of lockstep's: NOT_RESPONDING or FAIL, or DOWN
    /// under somebody else's reason. What the unhealthy taint and the
    /// Kubernetes node's signals speak of. A DOWN under lockstep's own
    /// reason whose slurmd answers is not: slurmctld lifts a DOWN of its
    /// own once the node answers again (`ReturnToService` 1 or 2), so it is
    /// a `state=DOWN` somebody sent (a preStop hook) that lockstep's drain
    /// then wrote its reason over, and it ends with lockstep's resume.
    pub faulty: bool,
    /// lockstep's last drain, down or resume of it (sent, done, or failed
    /// and to be tried again) does not show yet ([`SlurmSide::see`]): what Slurm shows is about to change,
    /// so it satisfies no cause.
    pub unseen: bool,
}

impl SlurmSide {
    pub fn of(node: &SlurmNode, own: &Ownership<'_>) -> Self {
        let drained = node.has(&SlurmNodeFlag::Drain);
        let down = node.state == SlurmBaseState::Down;
        let owned = (drained || down) && own.owns(node);
        let own_down = down && owned && !drained;
        let failing = node.has(&SlurmNodeFlag::NotResponding) || node.has(&SlurmNodeFlag::Fail);
        let unhealthy = failing || (down && !own_down);
        Self {
            drained,
            down,
            owned,
            held: own.held_by_other(node),
            held_shown: own.held_by_other(node)
                && (drained || !node.has(&SlurmNodeFlag::NotResponding)),
            unhealthy,
            faulty: failing || (down && !owned),
            unseen: false,
        }
    }

    /// Drained by somebody else.
    pub fn foreign_drain(self) -> bool {
        self.drained && !self.owned
    }

    /// Held out by somebody else: their drain, or a DOWN or FAIL a user set
    /// (what Kubernetes shows as a drain by someone else).
    pub fn held_by_other(self) -> bool {
        self.held_shown
    }

    /// Out of service by lockstep's doing.
    pub fn owned_out(self) -> bool {
        self.owned
    }

    /// Marks the node `unseen` when Slurm does not show the effect of
    /// `action`, lockstep's drain, down or resume of it still in flight: a
    /// drain or down shows with its reason (slurmctld may append to it) or
    /// with somebody else's (theirs keeps the node out as well; lockstep's
    /// own with an earlier reason may be from before a resume), a resume
    /// once lockstep's drain or down is gone.
    #[must_use]
    pub fn see(mut self, action: Option<&Action>, node: &SlurmNode) -> Self {
        let with_reason = |reason: &str| {
            !self.owned
                || node
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with(reason))
        };
        self.unseen = match action {
            Some(Action::SlurmDrain { reason, .. }) => {
                !((self.drained || self.held) && with_reason(reason))
            }
            Some(Action::SlurmDown { reason, .. }) => !(self.down && with_reason(reason)),
            Some(Action::SlurmResume { .. }) => self.owned_out(),
            _ => false,
        };
        self
    }
}

/// Slurm's word for what is wrong, for pod conditions: `SlurmDown`,
/// `SlurmNotResponding` or `SlurmFail`.
pub(crate) fn unhealthy_reason(node: &SlurmNode) -> &'static str {
    if node.has(&SlurmNodeFlag::NotResponding) {
        "SlurmNotResponding"
    } else if node.has(&SlurmNodeFlag::Fail) {
        "SlurmFail"
    } else {
        "SlurmDown"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cause::{HealthCause, VictimKind};
    use crate::model::PodEntry;
    use lockstep_schemas::PodPhase;

    fn pod(phase: PodPhase, ready: bool, deleting: bool, evicted: bool) -> PodEntry {
        PodEntry {
            obs: KubePod {
                namespace: "slurm".into(),
                name: "n1".into(),
                uid: "u1".into(),
                node_name: Some("k1".into()),
                phase,
                ready,
                deleting,
                disruption_target: evicted,
                labels: Default::default(),
                conditions: vec![],
                owner: None,
                revision: None,
                unhealthy_devices: Default::default(),
                eviction: Default::default(),
                version: 0,
            },
            gen: 0,
        }
    }

    #[test]
    fn pod_rows_table() {
        use DrainCause::*;
        use PodPhase::*;
        let serving = pod(Running, true, false, false);
        let pending = pod(Pending, false, false, false);
        let unready = pod(Running, false, false, false);
        let deleting = pod(Running, true, true, false);
        let evicted = pod(Running, true, false, true);
        // (pod, causes before, mode) -> causes now
        type Row<'a> = (
            Option<&'a PodEntry>,
            &'a [DrainCause],
            MappingMode,
            &'a [DrainCause],
        );
        let rows: &[Row<'_>] = &[
            (Some(&serving), &[], MappingMode::Pod, &[]),
            (Some(&deleting), &[], MappingMode::Pod, &[PodDeleting]),
            (Some(&evicted), &[], MappingMode::Pod, &[PodEvicted]),
            (None, &[PodDeleting], MappingMode::Pod, &[PodMissing]),
            (None, &[PodMissing], MappingMode::Pod, &[PodMissing]),
            // A replacement that does not serve yet keeps the drain.
            (
                Some(&pending),
                &[PodMissing],
                MappingMode::Pod,
                &[PodMissing],
            ),
            (
                Some(&unready),
                &[PodEvicted],
                MappingMode::Pod,
                &[PodMissing],
            ),
            // Running and Ready: the drain lifts.
            (Some(&serving), &[PodMissing], MappingMode::Pod, &[]),
            // Never had one, or never lost one: nothing.
            (None, &[], MappingMode::Pod, &[]),
            (Some(&pending), &[], MappingMode::Pod, &[]),
            (Some(&unready), &[Cordoned], MappingMode::Pod, &[]),
            (None, &[PodMissing], MappingMode::Host, &[]),
        ];
        for (i, (pod, previous, mode, want)) in rows.iter().enumerate() {
            let view = NodeView {
                pod_key: pod.map(|_| "slurm/n1"),
                pod: *pod,
                ..NodeView::default()
            };
            let mut got = Vec::new();
            let had_pod_loss = previous.iter().any(|c| c.is_pod_loss());
            causes(
                &view,
                &DrainPolicy::default(),
                *mode,
                had_pod_loss,
                &mut got,
            );
            let want: Vec<Cause> = want.iter().map(|d| Cause::Drain(*d)).collect();
            assert_eq!(got, want, "row {i}");
        }
    }

    fn node(state: SlurmBaseState, flags: &[SlurmNodeFlag], reason: Option<&str>) -> SlurmNode {
        SlurmNode {
            name: "n1".into(),
            state,
            flags: flags.to_vec(),
            reason: reason.map(str::to_owned),
            reason_user: None,
            features: vec![],
            topology: None,
            partitions: vec![],
            version: 0,
        }
    }

    #[test]
    fn ownership_by_user_and_earlier_prefixes_table() {
        let earlier = vec!["ls:".to_owned()];
        // (slurm_user, reason, reason_user) -> owned
        let rows: &[(Option<&str>, &str, Option<&str>, bool)] = &[
            (None, "lockstep: cordoned", None, true),
            (None, "lockstep: cordoned", Some("root"), true),
            (None, "ls: cordoned", None, true), // an earlier prefix
            (None, "admin: dimm", None, false),
            // The user decides when configured and reported.
            (Some("slurm-ls"), "ls-old: cordoned", Some("slurm-ls"), true),
            (
                Some("slurm-ls"),
                "lockstep: typed by hand",
                Some("root"),
                false,
            ),
            (Some("slurm-ls"), "admin: dimm", Some("root"), false),
            // Not reported (scontrol without the user): the prefix decides.
            (Some("slurm-ls"), "lockstep: cordoned", None, true),
            (Some("slurm-ls"), "admin: dimm", None, false),
        ];
        for (user, reason, by, want) in rows {
            let own = Ownership {
                prefix: "lockstep:",
                earlier_prefixes: &earlier,
                slurm_user: *user,
            };
            let mut n = node(SlurmBaseState::Idle, &[SlurmNodeFlag::Drain], Some(reason));
            n.reason_user = by.map(str::to_owned);
            assert_eq!(own.owns(&n), *want, "{user:?} {reason:?} {by:?}");
            assert_eq!(SlurmSide::of(&n, &own).owned, *want);
        }
    }

    #[test]
    fn ownership_table() {
        use SlurmBaseState::*;
        use SlurmNodeFlag::*;
        // (state, flags, reason) -> (drained, down, owned, unhealthy, faulty)
        type Row<'a> = (
            SlurmBaseState,
            &'a [SlurmNodeFlag],
            Option<&'a str>,
            (bool, bool, bool, bool, bool),
        );
        let rows: &[Row<'_>] = &[
            (Idle, &[], None, (false, false, false, false, false)),
            (
                Idle,
                &[Drain],
                Some("lockstep: kubernetes node k cordoned"),
                (true, false, true, false, false),
            ),
            (
                Allocated,
                &[Drain],
                Some("admin: bad dimm"),
                (true, false, false, false, false),
            ),
            (Idle, &[Drain], None, (true, false, false, false, false)),
            (
                Down,
                &[],
                Some("lockstep: kubernetes node k not ready"),
                (false, true, true, false, false),
            ),
            (
                Down,
                &[NotResponding],
                Some("Not responding"),
                (false, true, false, true, true),
            ),
            (
                Idle,
                &[NotResponding],
                None,
                (false, false, false, true, true),
            ),
            // Slurm 24.11 took lockstep's drained node DOWN and appended to
            // its reason: the DOWN is Slurm's, also once it answers again.
            (
                Down,
                &[NotResponding],
                Some("lockstep: kubernetes node k cordoned : Not responding"),
                (false, true, false, true, true),
            ),
            (
                Down,
                &[],
                Some("lockstep: kubernetes node k cordoned : Not responding"),
                (false, true, false, true, true),
            ),
            // lockstep's drain, and then slurmd stopped answering.
            (
                Idle,
                &[Drain, NotResponding],
                Some("lockstep: kubernetes node k cordoned"),
                (true, false, true, true, true),
            ),
            // Out under lockstep's reason, its slurmd answering: a DOWN
            // somebody set (a preStop hook) that lockstep's drain wrote its
            // reason over. Unhealthy for the pod condition, which says
            // what Slurm shows; not faulty.
            (
                Down,
                &[Drain],
                Some("lockstep: kubernetes node k cordoned"),
                (true, true, true, true, false),
            ),
            (
                Down,
                &[Drain, NotResponding],
                Some("lockstep: kubernetes node k cordoned"),
                (true, true, true, true, true),
            ),
            (
                Mixed,
                &[Fail],
                Some("lockstep-ish"),
                (false, false, false, true, true),
            ),
            (
                Idle,
                &[Drain],
                Some("LOCKSTEP: upper case is not ours"),
                (true, false, false, false, false),
            ),
        ];
        for (state, flags, reason, want) in rows {
            let own = Ownership {
                prefix: "lockstep:",
                earlier_prefixes: &[],
                slurm_user: None,
            };
            let s = SlurmSide::of(&node(state.clone(), flags, *reason), &own);
            assert_eq!(
                (s.drained, s.down, s.owned, s.unhealthy, s.faulty),
                *want,
                "{state:?} {flags:?} {reason:?}"
            );
        }
    }

    /// Whether lockstep's own action in flight shows, one case per line:
    /// (action, Slurm shows) -> unseen.
    #[test]
    fn seen_rows_table() {
        use SlurmBaseState::{Down, Idle};
        use SlurmNodeFlag::{Drain, NotResponding};
        let drain = |r: &str| Action::SlurmDrain {
            node: "n1".into(),
            reason: r.into(),
        };
        let down = |r: &str| Action::SlurmDown {
            node: "n1".into(),
            reason: r.into(),
        };
        let resume = Action::SlurmResume { node: "n1".into() };
        #[rustfmt::skip]
        let rows: &[(Option<Action>, SlurmNode, bool)] = &[
            (None, node(Idle, &[Drain], Some("lockstep: a")), false),
            (Some(drain("lockstep: a")), node(Idle, &[Drain], Some("lockstep: a")), false),
            // lockstep's drain for an earlier cause, maybe from before a resume
            (Some(drain("lockstep: a")), node(Idle, &[Drain], Some("lockstep: b")), true),
            // somebody else's drain keeps the node out as well
            (Some(drain("lockstep: a")), node(Idle, &[Drain], Some("bad dimm")), false),
            (Some(drain("lockstep: a")), node(Idle, &[], None), true),
            (Some(down("lockstep: a")), node(Down, &[NotResponding], Some("lockstep: a : Not responding")), false),
            (Some(down("lockstep: a")), node(Idle, &[], None), true),
            (Some(resume.clone()), node(Idle, &[Drain], Some("lockstep: a")), true),
            (Some(resume.clone()), node(Idle, &[], None), false),
            (Some(resume), node(Idle, &[Drain], Some("bad dimm")), false),
        ];
        let own = Ownership {
            prefix: "lockstep:",
            earlier_prefixes: &[],
            slurm_user: None,
        };
        for (i, (action, n, unseen)) in rows.iter().enumerate() {
            let side = SlurmSide::of(n, &own).see(action.as_ref(), n);
            assert_eq!(side.unseen, *unseen, "row {i}");
        }
    }

    /// The state rows, one case per line: (cause, Slurm shows (drained,
    /// down, owned, unhealthy), before, damping holds) -> (phase, rule,
    /// action).
    #[test]
    fn state_rows_table() {
        use Phase::{Drained as Dd, Draining as Dg, ForeignDrain as Fd, InService as In};
        use Phase::{Resuming as Rs, SlurmUnhealthy as Su};
        let side = |d: bool, dn: bool, o: bool, u: bool| SlurmSide {
            drained: d,
            down: dn,
            owned: o,
            held: (d || dn) && !o && !u,
            held_shown: (d || dn) && !o && !u,
            unhealthy: u,
            faulty: u,
            unseen: false,
        };
        let (none, out_owned, out_other) = (
            side(false, false, false, false),
            side(true, false, true, false),
            side(true, false, false, false),
        );
        let drained = (Dd, Rule::Cordoned, true);
        let fresh = (In, Rule::Observed, false);
        let hold = Some((Rule::FlapHold, Some(99)));
        let gated = Some((Rule::ReturnGate, None));
        type Case = (
            Option<Cause>,
            SlurmSide,
            (Phase, Rule, bool),
            Option<(Rule, Option<u64>)>,
            (Phase, Rule, Option<&'static str>),
        );
        #[rustfmt::skip]
        let cases: &[Case] = &[
            (Some(Cause::Drain(DrainCause::Cordoned)), none, fresh, None, (Dg, Rule::Cordoned, Some("slurm_drain"))),
            (Some(Cause::Drain(DrainCause::Cordoned)), out_owned, fresh, None, (Dd, Rule::Cordoned, None)),
            // somebody else's drain keeps it out already
            (Some(Cause::Drain(DrainCause::Cordoned)), out_other, fresh, None, (Dd, Rule::Cordoned, None)),
            // lockstep's drain removed while its cause holds
            (Some(Cause::Drain(DrainCause::Cordoned)), none, drained, None, (Dg, Rule::Reapplied, Some("slurm_drain"))),
            (Some(Cause::Health(HealthCause::NotReady)), none, fresh, None, (Dg, Rule::NotReady, Some("slurm_drain"))),
            // names itself: lockstep's drain for another cause says so
            (Some(Cause::Health(HealthCause::KubeNodeGone)), out_owned, drained, None, (Dg, Rule::KubeNodeGone, Some("slurm_drain"))),
            // a cause back while lockstep's resume (or another drain) is on its way
            (Some(Cause::Scaling(VictimKind::ScaleIn)), SlurmSide { unseen: true, ..out_owned }, (Rs, Rule::CauseCleared, false), None, (Dg, Rule::ScaleIn, Some("slurm_drain"))),
            (None, out_owned, drained, None, (Rs, Rule::CauseCleared, Some("slurm_resume"))),
            (None, out_owned, drained, hold, (Rs, Rule::FlapHold, None)),
            // back as another machine: held until the health signal
            (None, out_owned, drained, gated, (Rs, Rule::ReturnGate, None)),
            (None, out_other, fresh, None, (Fd, Rule::ForeignDrain, None)),
            (None, side(false, true, false, true), fresh, None, (Su, Rule::SlurmUnhealthy, None)),
            (None, none, drained, None, (In, Rule::Observed, None)),
        ];
        let n = node(SlurmBaseState::Idle, &[], Some("lockstep: earlier"));
        let view = NodeView {
            slurm: Some(&n),
            kube_name: Some("k1"),
            ..NodeView::default()
        };
        let policy = Policy::default();
        for (i, (cause, side, (phase, rule, had_cause), hold, want)) in cases.iter().enumerate() {
            let before = Before {
                phase: *phase,
                rule: *rule,
                had_cause: *had_cause,
            };
            let got = state_want(cause.as_ref(), &view, &n, *side, before, || *hold, &policy);
            let kind = got.action.as_ref().map(|a| a.kind().name());
            assert_eq!((got.phase, got.rule, kind), *want, "case {i}");
            assert_eq!(got.held, hold.filter(|_| got.phase == Rs).map(|h| h.1));
        }
    }

    /// The action the state rows want for `cause` on `n`, whose
    /// Kubernetes node is `kube`, with `drain.reason_names_nodes` = `names`.
    fn wanted(cause: Cause, n: &SlurmNode, kube: &str, names: bool) -> Option<Action> {
        let own = Ownership {
            prefix: "lockstep:",
            earlier_prefixes: &[],
            slurm_user: None,
        };
        let before = Before {
            phase: Phase::InService,
            rule: Rule::Observed,
            had_cause: false,
        };
        let view = NodeView {
            slurm: Some(n),
            kube_name: Some(kube),
            ..NodeView::default()
        };
        let mut policy = Policy::default();
        policy.drain.reason_names_nodes = names;
        let side = SlurmSide::of(n, &own);
        state_want(Some(&cause), &view, n, side, before, || None, &policy).action
    }

    #[test]
    fn a_drain_names_its_kubernetes_node_in_the_reason_unless_the_policy_says_not_to() {
        let idle = node(SlurmBaseState::Idle, &[], None);
        let reason = |kube: &str, names: bool| match wanted(
            Cause::Drain(DrainCause::Cordoned),
            &idle,
            kube,
            names,
        ) {
            Some(Action::SlurmDrain { reason, .. }) => reason,
            other => panic!("a drain, not {other:?}"),
        };
        assert!(Policy::default().drain.reason_names_nodes);
        assert_eq!(reason("k1", true), "lockstep: kubernetes node k1 cordoned");
        assert_eq!(reason("k1", false), "lockstep: kubernetes node cordoned");
        assert_eq!(reason("k1", false), reason("k2", false));

        // A drain already made keeps its reason, but for a deleted
        // Kubernetes node's: that cause always says itself.
        let drained = |was: &str| node(SlurmBaseState::Idle, &[SlurmNodeFlag::Drain], Some(was));
        let cordoned = drained("lockstep: kubernetes node k1 cordoned");
        assert_eq!(
            wanted(Cause::Drain(DrainCause::Cordoned), &cordoned, "k1", false),
            None
        );
        let gone = drained("lockstep: kubernetes node k1 deleted");
        assert_eq!(
            wanted(Cause::Health(HealthCause::KubeNodeGone), &gone, "k1", false),
            Some(Action::SlurmDrain {
                node: "n1".into(),
                reason: "lockstep: kubernetes node deleted".into(),
            })
        );
    }
}
