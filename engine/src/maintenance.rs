//! Maintenance policy: planned maintenance of a Kubernetes node, announced
//! ahead by its node lifecycle conditions (`MaintenancePlanned` with the
//! window in its message, `MaintenanceInProgress`; Kubernetes v1.37) or the
//! annotation `lockstep.dev/maintenance-window`. Slurm stops starting jobs
//! there that would not end before the window, running jobs end, the nodes
//! come back after it; Kubernetes shows how far the drain has got.
//!
//! | row | holds when                                                                 | wants                                                        | rule                            |
//! |-----|----------------------------------------------------------------------------|--------------------------------------------------------------|---------------------------------|
//! | 1   | a window is announced and not over, and Slurm nodes run on the node        | reservation `<prefix><node>` over them, START..END, `MAINT,IGNORE_JOBS` | `maintenance.reserve`  |
//! | 2   | lockstep's reservation exists and row 1 no longer holds (over, cancelled, node deleted, policy off) | its deletion                        | `maintenance.release`           |
//! | 3   | START <= now < END, or `MaintenanceInProgress` is True, or END passed and the node is not Ready yet | the Slurm nodes drained, reason `maintenance START/END` | `maintenance.window` |
//! | 4   | lockstep has every Slurm node of the node out, some still run a job       | `DrainInProgress=True`, `Drained=False`                      | `maintenance.drain_conditions`  |
//! | 5   | lockstep has every Slurm node of the node out, none runs a job            | `DrainInProgress=False`, `Drained=True`                      | `maintenance.drain_conditions`  |
//! | 6   | otherwise, where a condition lockstep set is True                          | it False                                                     | `maintenance.drain_conditions`  |
//!
//! Rows 4-6 run under `maintenance.enabled` with `maintenance.node_conditions`,
//! and for every drain lockstep makes (a cordon, an eviction, health) under
//! `node_signals.drain_conditions` alone.
//!
//! Row 3 is a drain cause like the ones in `drain`: the drain lifts (and is
//! audited as `drain.cause_cleared`) when no cause holds any more. The
//! reservation exists in Slurm alone; lockstep knows it from the outcomes of
//! its own actions (its name carries the policy's prefix, and nobody else
//! is meant to touch it). Rows 4-6 write only conditions whose reason is
//! [`CONDITION_REASON`], or write one where lockstep's drain is the news:
//! the Kubernetes API leaves the coordination of writers to them.

use std::collections::BTreeMap;

use lockstep_schemas::{
    Action, ConditionStatus, KubeNode, Maintenance, MaintenancePolicy, PodCondition, Policy, Rule,
    DRAINED, DRAIN_IN_PROGRESS,
};
use serde::{Deserialize, Serialize};

use crate::ctx::{Ctx, Output};
use crate::drain::{Ownership, SlurmSide};
use crate::flights::{AspectRef, Flights, Key};
use crate::model::Model;

/// The reason of the drain conditions lockstep sets.
pub(crate) const CONDITION_REASON: &str = "LockstepSlurmDrain";

/// Maintenance's state: Kubernetes node -> the reservation Slurm confirmed
/// last (the `SlurmReserve` that succeeded; gone once a `SlurmUnreserve`
/// did). Kept apart from the node's entry: a reservation outlives the Node
/// object, and is removed after it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Reservations(BTreeMap<String, Action>);

impl Reservations {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether Slurm holds a reservation lockstep made for `kube`.
    pub fn holds(&self, kube: &str) -> bool {
        self.0.contains_key(kube)
    }

    /// The Kubernetes nodes with a reservation.
    pub fn nodes(&self) -> impl Iterator<Item = &String> {
        self.0.keys()
    }

    /// Slurm confirmed a reservation action for `kube` (it succeeded, or was
    /// done already): `action` is the one in flight, `None` when no
    /// reservation is in flight (an unreserve, or an outcome without one).
    pub fn confirmed(&mut self, kube: String, action: Option<Action>) {
        match action {
            Some(a @ Action::SlurmReserve { .. }) => {
                self.0.insert(kube, a);
            }
            _ => {
                self.0.remove(&kube);
            }
        }
    }

    /// Re-evaluates one Kubernetes node (rows 1, 2, 4-6): its reservation,
    /// and the drain conditions lockstep shows. `names`: a buffer. Returns
    /// when to look again.
    #[allow(clippy::too_many_arguments)]
    pub fn evaluate(
        &self,
        kube: &str,
        model: &Model,
        policy: &Policy,
        own: &Ownership<'_>,
        flights: &mut Flights,
        names: &mut Vec<String>,
        ctx: &Ctx<'_>,
        out: &mut Output,
    ) -> Option<u64> {
        let mp = &policy.maintenance;
        let node = model.kube_nodes.get(kube).map(|e| &e.obs);
        names.clear();
        if node.is_some() {
            model.slurm_nodes_on(kube, policy, names);
            names.retain(|n| model.slurm_nodes.contains_key(n.as_str()));
            names.sort();
        }
        let now = ctx.now_ms;
        let reserved = self.0.get(kube);
        let (want, mut wake) = reservation(kube, node, mp, names, reserved, now);
        let reservation = reservation_step(want, reserved);
        let rule = match &reservation {
            Some(Action::SlurmUnreserve { .. }) => Rule::Release,
            _ => Rule::Reserve,
        };
        // Rows 4-6: how lockstep's drain of the node's Slurm nodes stands.
        let conditions_on = policy.drain_conditions_on();
        let conditions = match node.filter(|_| conditions_on) {
            Some(node) => {
                let progress = DrainProgress::of(names.iter().map(|n| {
                    let s = &model.slurm_nodes[n.as_str()].obs;
                    let runs = model.jobs_on(n) > 0 || crate::scaling::slurm_busy(s);
                    (SlurmSide::of(s, own).owned_out(), runs)
                }));
                drain_conditions(node, progress)
            }
            None if conditions_on => [DRAIN_IN_PROGRESS, DRAINED].map(|t| (t, None)),
            None => [("", None), ("", None)],
        };
        let key = Key::Kube(kube, AspectRef::Reservation);
        flights.bring(
            key,
            reservation,
            &ctx.issue(rule),
            &policy.actions,
            &mut out.actions,
            &mut wake,
        );
        for (t, want) in conditions.into_iter().filter(|(t, _)| !t.is_empty()) {
            let key = Key::Kube(kube, AspectRef::Condition(t));
            let issue = ctx.issue(Rule::DrainConditions);
            flights.bring(
                key,
                want,
                &issue,
                &policy.actions,
                &mut out.actions,
                &mut wake,
            );
        }
        wake
    }
}

/// Where an announced maintenance stands at a log time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Announced, not started.
    Ahead,
    /// Under way.
    Running,
    /// Its end has passed.
    Over,
}

/// The stage of `m` at `now`, and when it next changes.
pub(crate) fn stage(m: &Maintenance, now: u64) -> (Stage, Option<u64>) {
    if m.in_progress {
        return (Stage::Running, m.end_ms.filter(|e| *e > now));
    }
    if now < m.start_ms {
        return (Stage::Ahead, Some(m.start_ms));
    }
    match m.end_ms {
        Some(end) if now >= end => (Stage::Over, None),
        end => (Stage::Running, end),
    }
}

/// The maintenance lockstep acts on: announced, under an enabled policy.
pub(crate) fn announced<'a>(
    node: Option<&'a KubeNode>,
    policy: &MaintenancePolicy,
) -> Option<&'a Maintenance> {
    node.filter(|_| policy.enabled)
        .and_then(|n| n.maintenance.as_ref())
}

/// Row 3: whether the Slurm nodes on `node` are kept out for maintenance
/// now (the window, as the drain reason shows it), and when to look again.
pub(crate) fn drain_window(
    node: Option<&KubeNode>,
    policy: &MaintenancePolicy,
    now: u64,
    wake: &mut Option<u64>,
) -> Option<String> {
    let m = announced(node, policy)?;
    let (stage, next) = stage(m, now);
    if let Some(at) = next {
        crate::timers::min_wake(wake, at);
    }
    let ready = node.is_some_and(|n| n.ready == ConditionStatus::True);
    let holds = match stage {
        Stage::Ahead => false,
        Stage::Running => true,
        Stage::Over => !ready,
    };
    holds.then(|| {
        if m.window.is_empty() {
            "in progress".to_owned()
        } else {
            m.window.clone()
        }
    })
}

/// Rows 1-2: the reservation lockstep wants for `kube` (`None`: none), given
/// the Slurm nodes on it (sorted) and the one Slurm last confirmed. With no
/// Slurm node left on it (its pods gone during the window) a reservation
/// made stays as it is until the window ends. Also: when to look again.
pub(crate) fn reservation(
    kube: &str,
    node: Option<&KubeNode>,
    policy: &MaintenancePolicy,
    slurm_nodes: &[String],
    reserved: Option<&Action>,
    now: u64,
) -> (Option<Action>, Option<u64>) {
    let Some(m) = announced(node, policy).filter(|m| m.start_ms > 0) else {
        return (None, None);
    };
    let (stage, next) = stage(m, now);
    if stage == Stage::Over {
        return (None, None);
    }
    if slurm_nodes.is_empty() {
        return (reserved.cloned(), next);
    }
    let want = Action::SlurmReserve {
        name: format!("{}{kube}", policy.reservation_prefix),
        nodes: slurm_nodes.to_vec(),
        start_ms: m.start_ms,
        end_ms: m.end_ms,
        users: policy.reservation_users.clone(),
    };
    (Some(want), next)
}

/// What a reservation slot should do: the reservation wanted against the one
/// confirmed.
pub(crate) fn reservation_step(want: Option<Action>, reserved: Option<&Action>) -> Option<Action> {
    match (want, reserved) {
        (Some(w), Some(r)) if w == *r => None,
        (Some(w), _) => Some(w),
        (None, Some(Action::SlurmReserve { name, .. })) => {
            Some(Action::SlurmUnreserve { name: name.clone() })
        }
        (None, _) => None,
    }
}

/// How lockstep's drain of the Slurm nodes on a Kubernetes node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainProgress {
    /// Not every Slurm node on it is out by lockstep's doing (or none is on it).
    NotDraining,
    /// All out by lockstep; some still run a job.
    Draining,
    /// All out by lockstep; none runs a job.
    Drained,
}

impl DrainProgress {
    /// From each Slurm node on the Kubernetes node: whether lockstep has it
    /// out, and whether it runs or finishes a job.
    pub fn of(nodes: impl IntoIterator<Item = (bool, bool)>) -> Self {
        let (mut any, mut all_out, mut busy) = (false, true, false);
        for (out, runs) in nodes {
            any = true;
            all_out &= out;
            busy |= runs;
        }
        match (any && all_out, busy) {
            (false, _) => Self::NotDraining,
            (true, true) => Self::Draining,
            (true, false) => Self::Drained,
        }
    }
}

/// Rows 4-6 for a Kubernetes node: the conditions `DrainInProgress` and
/// `Drained`, each with the action it needs (`None`: shown already).
pub(crate) fn drain_conditions(
    node: &KubeNode,
    progress: DrainProgress,
) -> [(&'static str, Option<Action>); 2] {
    [DRAIN_IN_PROGRESS, DRAINED].map(|t| {
        let shown = node.conditions.iter().find(|c| c.type_ == t);
        let want =
            drain_condition(t, progress, shown).map(|condition| Action::KubeSetNodeCondition {
                node: node.name.to_string(),
                condition,
            });
        (t, want)
    })
}

/// Rows 4-6: the condition of `type_` lockstep wants on the node, given
/// what it shows now (`None`: leave it).
pub(crate) fn drain_condition(
    type_: &str,
    progress: DrainProgress,
    shown: Option<&lockstep_schemas::NodeCondition>,
) -> Option<PodCondition> {
    let truth = match (type_, progress) {
        (_, DrainProgress::NotDraining) => None,
        (DRAIN_IN_PROGRESS, p) => Some(p == DrainProgress::Draining),
        (_, p) => Some(p == DrainProgress::Drained),
    };
    let status = match truth {
        Some(true) => ConditionStatus::True,
        Some(false) => ConditionStatus::False,
        // Row 6: only a condition lockstep set to True is taken back.
        None => {
            let ours = shown
                .is_some_and(|c| c.status == ConditionStatus::True && c.reason == CONDITION_REASON);
            if !ours {
                return None;
            }
            ConditionStatus::False
        }
    };
    if shown.is_some_and(|c| c.status == status && c.reason == CONDITION_REASON) {
        return None;
    }
    let message = match progress {
        DrainProgress::Draining => "lockstep drains the Slurm nodes on this node; jobs still run",
        DrainProgress::Drained => "lockstep drained the Slurm nodes on this node; no job runs",
        DrainProgress::NotDraining => "lockstep does not drain the Slurm nodes on this node",
    };
    Some(PodCondition {
        type_: type_.to_owned(),
        status,
        reason: CONDITION_REASON.to_owned(),
        message: message.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_schemas::NodeCondition;

    const H: u64 = 3_600_000;

    fn window(start_ms: u64, end_ms: Option<u64>) -> Maintenance {
        Maintenance {
            window: "2026-12-01T03:00:00Z/2026-12-01T04:00:00Z".to_owned(),
            start_ms,
            end_ms,
            in_progress: false,
        }
    }

    fn node(m: Option<Maintenance>, ready: bool) -> KubeNode {
        KubeNode {
            name: "k1".into(),
            unschedulable: false,
            ready: if ready {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            conditions: Vec::new(),
            labels: Default::default(),
            taints: Vec::new(),
            read_labels: None,
            maintenance: m,
            identity: Default::default(),
            devices: Default::default(),
            version: 0,
        }
    }

    fn on() -> MaintenancePolicy {
        MaintenancePolicy {
            enabled: true,
            ..MaintenancePolicy::default()
        }
    }

    fn nodes() -> Vec<String> {
        vec!["n1".to_owned(), "n2".to_owned()]
    }

    fn reserve(start_ms: u64, end_ms: Option<u64>, nodes: Vec<String>) -> Action {
        Action::SlurmReserve {
            name: "lockstep_maint_k1".to_owned(),
            nodes,
            start_ms,
            end_ms,
            users: "root".to_owned(),
        }
    }

    /// (window, Slurm nodes on the node, confirmed reservation, now) ->
    /// (slot wants, next look).
    type Case = (
        Option<Maintenance>,
        Vec<String>,
        Option<Action>,
        u64,
        Option<Action>,
        Option<u64>,
    );

    /// Rows 1 and 2, one case a line.
    #[test]
    fn reservation_rows() {
        let w = Some(window(10 * H, Some(11 * H)));
        let made = reserve(10 * H, Some(11 * H), nodes());
        let cases: [Case; 8] = [
            // row 1: ahead, nothing reserved yet -> reserve; look at the start
            (
                w.clone(),
                nodes(),
                None,
                H,
                Some(made.clone()),
                Some(10 * H),
            ),
            // row 1: reserved as wanted -> nothing
            (
                w.clone(),
                nodes(),
                Some(made.clone()),
                H,
                None,
                Some(10 * H),
            ),
            // row 1: a pod moved -> the reservation follows
            (
                w.clone(),
                vec!["n1".into()],
                Some(made.clone()),
                H,
                Some(reserve(10 * H, Some(11 * H), vec!["n1".into()])),
                Some(10 * H),
            ),
            // row 1: running, its pods gone -> kept as made; look at the end
            (
                w.clone(),
                vec![],
                Some(made.clone()),
                10 * H,
                None,
                Some(11 * H),
            ),
            // row 2: over -> released
            (
                w.clone(),
                nodes(),
                Some(made.clone()),
                11 * H,
                Some(Action::SlurmUnreserve {
                    name: "lockstep_maint_k1".into(),
                }),
                None,
            ),
            // row 2: cancelled (announcement gone) -> released
            (
                None,
                nodes(),
                Some(made.clone()),
                H,
                Some(Action::SlurmUnreserve {
                    name: "lockstep_maint_k1".into(),
                }),
                None,
            ),
            // no window, only MaintenanceInProgress -> no reservation (row 3 drains at once)
            (
                Some(Maintenance {
                    window: String::new(),
                    start_ms: 0,
                    end_ms: None,
                    in_progress: true,
                }),
                nodes(),
                None,
                H,
                None,
                None,
            ),
            // an open end -> reserved without an end
            (
                Some(window(10 * H, None)),
                nodes(),
                None,
                H,
                Some(reserve(10 * H, None, nodes())),
                Some(10 * H),
            ),
        ];
        for (i, (m, slurm, reserved, now, step, next)) in cases.into_iter().enumerate() {
            let n = node(m, true);
            let (want, wake) = reservation("k1", Some(&n), &on(), &slurm, reserved.as_ref(), now);
            assert_eq!(reservation_step(want, reserved.as_ref()), step, "case {i}");
            assert_eq!(wake, next, "case {i}");
        }
    }

    #[test]
    fn a_disabled_policy_releases_and_drains_nothing() {
        let n = node(Some(window(10 * H, Some(11 * H))), true);
        let off = MaintenancePolicy::default();
        let made = reserve(10 * H, Some(11 * H), nodes());
        let (want, _) = reservation("k1", Some(&n), &off, &nodes(), Some(&made), 10 * H);
        assert!(matches!(
            reservation_step(want, Some(&made)),
            Some(Action::SlurmUnreserve { .. })
        ));
        assert_eq!(drain_window(Some(&n), &off, 10 * H, &mut None), None);
    }

    /// Row 3, one case a line: (window, Ready, now) -> (drain, next look).
    #[test]
    fn drain_rows() {
        let w = Some(window(10 * H, Some(11 * H)));
        let text = "2026-12-01T03:00:00Z/2026-12-01T04:00:00Z".to_owned();
        let progress = Some(Maintenance {
            window: String::new(),
            start_ms: 0,
            end_ms: None,
            in_progress: true,
        });
        let cases = [
            (w.clone(), true, H, None, Some(10 * H)),
            (w.clone(), true, 10 * H, Some(text.clone()), Some(11 * H)),
            (w.clone(), true, 11 * H, None, None),
            (w.clone(), false, 11 * H, Some(text.clone()), None),
            (progress, true, H, Some("in progress".to_owned()), None),
            (None, true, H, None, None),
        ];
        for (i, (m, ready, now, drain, next)) in cases.into_iter().enumerate() {
            let n = node(m, ready);
            let mut wake = None;
            assert_eq!(
                drain_window(Some(&n), &on(), now, &mut wake),
                drain,
                "case {i}"
            );
            assert_eq!(wake, next, "case {i}");
        }
    }

    /// Rows 4-6, one case a line: (type, progress, shown) -> wanted status.
    #[test]
    fn condition_rows() {
        let shown = |status, reason: &str| NodeCondition {
            type_: String::new(),
            status,
            reason: reason.to_owned(),
            message: String::new(),
        };
        use ConditionStatus::{False, True};
        use DrainProgress::{Drained, Draining, NotDraining};
        let ours = CONDITION_REASON;
        let cases = [
            ("DrainInProgress", Draining, None, Some(True)),
            ("Drained", Draining, None, Some(False)),
            (
                "DrainInProgress",
                Drained,
                Some(shown(True, ours)),
                Some(False),
            ),
            ("Drained", Drained, None, Some(True)),
            ("Drained", Drained, Some(shown(True, ours)), None),
            // row 6: lockstep's True taken back; anybody else's left alone
            ("Drained", NotDraining, Some(shown(True, ours)), Some(False)),
            (
                "Drained",
                NotDraining,
                Some(shown(True, "AdminDrain")),
                None,
            ),
            ("Drained", NotDraining, None, None),
            (
                "DrainInProgress",
                NotDraining,
                Some(shown(False, ours)),
                None,
            ),
        ];
        for (i, (t, p, s, want)) in cases.into_iter().enumerate() {
            let got = drain_condition(t, p, s.as_ref()).map(|c| c.status);
            assert_eq!(got, want, "case {i}");
        }
    }
}
