//! Health policy, both directions.
//!
//! Kubernetes -> Slurm (rows 4-8 of the cause table that `drain` starts):
//!
//! | row | holds when                                            | rule                    |
//! |-----|-------------------------------------------------------|-------------------------|
//! | 4   | Ready is False/Unknown for at least `not_ready_grace_s` | `health.not_ready`    |
//! | 5   | a condition named in `node_conditions` is True        | `health.node_condition` |
//! | 6   | the Kubernetes node under it was deleted (a delete, or missing from a relist), and no node of that name is Ready again yet | `health.kube_node_gone` |
//! | 7   | `device_faults`: the kubelet reports a DRA device allocated to its pod Unhealthy (`allocatedResourcesStatus`) | `health.device_fault` |
//! | 8   | `device_faults`: a DRA device on the Kubernetes node under it has a taint of effect NoSchedule or NoExecute (its ResourceSlice, or a DeviceTaintRule) | `health.device_fault` |
//!
//! Row 6 keeps the Slurm node out (drained, or DOWN with `action: down`)
//! with the reason `kubernetes node X deleted`: its host is gone, and a
//! deleted node used to look like a node that is simply not cordoned.
//!
//! Health drains are damped:
//!
//! | holds when                                                          | effect                        | rule                  |
//! |---------------------------------------------------------------------|-------------------------------|-----------------------|
//! | `drains_per_minute_max` new health drains in the last minute of log time, cluster-wide | a new one waits      | `health.rate_limited` |
//! | a health cause cleared less than `resume_after_s` ago                | the resume waits              | `health.resume_delay` |
//! | more than `flaps_max` health spells within `flap_window_s`           | held drained for `flap_hold_s` | `health.flap_hold`   |
//! | the Kubernetes node came back as a different machine (deleted, a new UID or providerID, a new bootID with `return_after_reboot`) and `return_condition` has not been True there since (on the same Node object: not True, then True) | the resume waits, with no deadline | `health.return_gate` |
//!
//! A spell is a health cause turning on where none was ([`Damping`]):
//! lockstep putting its drain back after an admin resumed the node, a retry,
//! or a drain Slurm already showed is no new spell. The resume delay and the
//! flap hold belong to the health cause: a cordon cycle meanwhile ends
//! neither. The cluster-wide bound admits each node's health drain once: a
//! drain put back while its cause holds is not a new one.
//!
//! Slurm -> Kubernetes: a Slurm node that is NOT_RESPONDING or FAIL, or DOWN
//! not by lockstep's own `state=DOWN` (a node lockstep drained that then
//! stops answering included), sets the pod condition
//! `slurm_health_condition` to False, and the Kubernetes node under it gets
//! `unhealthy_taint` unless the node is out under lockstep's own reason with
//! its slurmd answering (`SlurmSide::faulty`: somebody's DOWN that
//! lockstep's drain wrote its reason over; its resume ends it). Damped the
//! same way ([`slurm_health_step`]):
//!
//! | row | holds when                                                     | shown |
//! |-----|----------------------------------------------------------------|-------|
//! | 1   | unhealthy for less than `slurm_unhealthy_grace_s`               | no (wake at the grace) |
//! | 2   | unhealthy past the grace, the cluster-wide bound of `slurm_unhealthy_per_minute_max` reached | no (wake when a slot frees) |
//! | 3   | unhealthy past the grace, within the bound                      | yes |
//! | 4   | healthy again, for less than `slurm_healthy_after_s`, or flapping (more than `flaps_max` shown within `flap_window_s`, until `flap_hold_s` after the last) | still yes |
//! | 5   | healthy again past both                                        | no |

use std::collections::VecDeque;

use lockstep_schemas::{ConditionStatus, HealthPolicy, IdentityChange, Rule};
use serde::{Deserialize, Serialize};

use crate::cause::{Cause, HealthCause};
use crate::model::NodeView;
use crate::timers::min_wake;
use crate::units::{after_ms, after_s, ms};

/// The cluster-wide rate bounds of health damping.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Cluster {
    /// Log times of recent health drains (`health.rate_limited`).
    pub drains: VecDeque<u64>,
    /// Log times of nodes recently shown unhealthy in Kubernetes (the
    /// Slurm -> Kubernetes bound).
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub marks: VecDeque<u64>,
}

/// Rows 4-6. Sets `wake` to when a NotReady spell reaches its grace period.
pub(crate) fn causes(
    view: &NodeView<'_>,
    policy: &HealthPolicy,
    now_ms: u64,
    out: &mut Vec<Cause>,
    wake: &mut Option<u64>,
) {
    if view.kube_gone.is_some() {
        out.push(Cause::Health(HealthCause::KubeNodeGone));
    }
    let Some(kube) = view.kube else { return };
    if let Some(since) = &kube.not_ready_since {
        let deadline = after_s(since.ms, policy.not_ready_grace_s);
        if now_ms >= deadline {
            out.push(Cause::Health(HealthCause::NotReady));
        } else {
            min_wake(wake, deadline);
        }
    }
    for cond in &kube.obs.conditions {
        if cond.status == ConditionStatus::True && policy.node_conditions.contains(&cond.type_) {
            out.push(Cause::Health(HealthCause::NodeCondition(
                cond.type_.clone(),
            )));
        }
    }
    if policy.device_faults {
        // Rows 7 and 8.
        let pod = view.pod.map_or(&[][..], |p| &p.obs.unhealthy_devices[..]);
        out.extend(
            pod.iter()
                .map(|d| Cause::Health(HealthCause::Device(format!("{d} unhealthy")))),
        );
        out.extend(
            kube.obs
                .devices
                .faults
                .iter()
                .map(|f| Cause::Health(HealthCause::Device(f.clone()))),
        );
    }
}

/// Slurm -> Kubernetes damping state of one Slurm node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SlurmHealth {
    /// Since when Slurm reports it unhealthy, in this spell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_since: Option<u64>,
    /// Since when Slurm reports it healthy again, while still shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_since: Option<u64>,
    /// Whether lockstep shows it unhealthy in Kubernetes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shown: bool,
    /// Log times it was newly shown, for flap damping (bounded).
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub marks: VecDeque<u64>,
}

impl SlurmHealth {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// One step of the Slurm -> Kubernetes damping (rows 1-5 of the second
/// table): updates whether the node is shown unhealthy; returns when to
/// look again. `cluster` holds the log times of recent marks, cluster-wide.
pub(crate) fn slurm_health_step(
    st: &mut SlurmHealth,
    unhealthy: bool,
    now_ms: u64,
    policy: &HealthPolicy,
    cluster: &mut VecDeque<u64>,
) -> Option<u64> {
    let per_minute_max = policy.slurm_unhealthy_per_minute_max.max(1);
    if unhealthy {
        st.healthy_since = None;
        let since = *st.unhealthy_since.get_or_insert(now_ms);
        if st.shown {
            return None;
        }
        let due = after_s(since, policy.slurm_unhealthy_grace_s);
        if now_ms < due {
            return Some(due);
        }
        if let Some(at) = rate_limited(cluster, now_ms, per_minute_max) {
            return Some(at);
        }
        st.shown = true;
        record(cluster, now_ms, 60_000, per_minute_max as usize);
        let bound = policy.flaps_max as usize + 1;
        record(&mut st.marks, now_ms, ms(policy.flap_window_s), bound);
        None
    } else {
        st.unhealthy_since = None;
        if !st.shown {
            return None;
        }
        let since = *st.healthy_since.get_or_insert(now_ms);
        let clear_at = after_s(since, policy.slurm_healthy_after_s);
        let until = flap_hold(&st.marks, now_ms, policy).map_or(clear_at, |u| u.max(clear_at));
        if now_ms < until {
            return Some(until);
        }
        st.shown = false;
        st.healthy_since = None;
        None
    }
}

/// Whether the resume of lockstep's drain after a health cause cleared at
/// `cleared_ms` waits: `health.flap_hold` while the node flaps, else
/// `health.resume_delay` until it has been healthy for `resume_after_s`;
/// with the log time it waits until.
pub(crate) fn resume_hold(
    drains: &VecDeque<u64>,
    cleared_ms: u64,
    now_ms: u64,
    policy: &HealthPolicy,
) -> Option<(Rule, u64)> {
    let resume_at = after_s(cleared_ms, policy.resume_after_s);
    match flap_hold(drains, now_ms, policy) {
        Some(until) => Some((Rule::FlapHold, until.max(resume_at))),
        None if now_ms < resume_at => Some((Rule::ResumeDelayed, resume_at)),
        None => None,
    }
}

/// Kubernetes -> Slurm damping of one Slurm node: when its health spells
/// began (flap damping) and when the last one ended (resume hysteresis).
///
/// A spell begins when a health cause turns on where none was (a new
/// NotReady spell past its grace, a condition turning True, the node
/// deleted) and ends when the last health cause clears. It counts the cause,
/// never lockstep's writes: a drain re-applied after an admin resumed the
/// node, a retry, a drain that Slurm already showed are all one spell. And
/// the hold it decides belongs to the health cause: another cause coming and
/// going meanwhile (a cordon cycle for a GPU reset) does not end it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Damping {
    /// Log times health spells began, newest last, bounded by `flaps_max +
    /// 1` within `flap_window_s`. (Named as it was when lockstep counted its
    /// own health drains, so that snapshots of that time restore.)
    #[serde(rename = "health_drains")]
    pub onsets: VecDeque<u64>,
    /// When the last health spell ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared_ms: Option<u64>,
    /// Read from snapshots of the time before `cleared_ms`: whether the last
    /// cause was a health cause ([`Damping::upgrade`]). Never written.
    #[serde(default, rename = "last_cause_health", skip_serializing)]
    legacy_last_cause_health: bool,
}

impl Damping {
    /// One evaluation of the node's causes: a spell begins or ends.
    pub fn follow(
        &mut self,
        had_health: bool,
        has_health: bool,
        now_ms: u64,
        policy: &HealthPolicy,
    ) {
        if has_health && !had_health {
            let bound = policy.flaps_max as usize + 1;
            record(&mut self.onsets, now_ms, ms(policy.flap_window_s), bound);
        } else if had_health && !has_health {
            self.cleared_ms = Some(now_ms);
        }
    }

    /// Whether the resume of lockstep's drain waits, and until when
    /// ([`resume_hold`]), whatever cause was the last in force: `None` for a
    /// node that never had a health spell.
    pub fn resume_hold(&self, now_ms: u64, policy: &HealthPolicy) -> Option<(Rule, u64)> {
        let cleared = self.cleared_ms?;
        resume_hold(&self.onsets, cleared, now_ms, policy)
    }

    /// Health spells within the flap window, for the audit trail.
    pub fn spells(&self) -> usize {
        self.onsets.len()
    }

    /// A snapshot from before `cleared_ms` knew only when the last cause of
    /// any kind cleared, and whether it was a health cause.
    pub fn upgrade(&mut self, last_cleared_ms: Option<u64>) {
        if std::mem::take(&mut self.legacy_last_cause_health) && self.cleared_ms.is_none() {
            self.cleared_ms = last_cleared_ms;
        }
    }
}

/// A return to service that waits for the health signal
/// (`health.return_condition`): the Kubernetes node under the Slurm node came
/// back as a different machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Returning {
    /// What made it another machine.
    pub change: IdentityChange,
    /// Log time it was seen.
    pub since_ms: u64,
    /// The condition has been seen not True since: what makes a True count
    /// on a Node object that outlived the change (a reboot).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub seen_not_good: bool,
}

/// One Slurm node's health damping, both directions: kept on the node's
/// entry in the engine (flattened, so that its fields are encoded where they
/// were before they were grouped here), read and changed only through
/// [`Gate`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeHealth {
    /// Kubernetes -> Slurm: when its health spells began and when the last
    /// one ended.
    #[serde(flatten)]
    damping: Damping,
    /// Slurm -> Kubernetes, boxed and only while not at its default (most
    /// nodes are healthy, and each saves 64 bytes); encoded as the damping
    /// itself was when it was kept inline.
    #[serde(
        default,
        rename = "slurm_health",
        skip_serializing_if = "Option::is_none"
    )]
    slurm: Option<Box<SlurmHealth>>,
    /// A return to service waiting for the health signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    returning: Option<Box<Returning>>,
}

impl NodeHealth {
    /// Whether lockstep shows the node unhealthy in Kubernetes.
    pub fn shown(&self) -> bool {
        self.slurm.as_ref().is_some_and(|h| h.shown)
    }

    /// See [`Damping::upgrade`].
    pub fn upgrade(&mut self, last_cleared_ms: Option<u64>) {
        self.damping.upgrade(last_cleared_ms);
    }

    /// Runs `f` on the Slurm -> Kubernetes damping, kept boxed only while it
    /// is not at its default.
    fn with_slurm<R>(&mut self, f: impl FnOnce(&mut SlurmHealth) -> R) -> R {
        match &mut self.slurm {
            Some(h) => {
                let r = f(h);
                if h.is_default() {
                    self.slurm = None;
                }
                r
            }
            None => {
                let mut h = SlurmHealth::default();
                let r = f(&mut h);
                if !h.is_default() {
                    self.slurm = Some(Box::new(h));
                }
                r
            }
        }
    }
}

/// The one gate of health damping between what the drain policy wants of a
/// node and the action: it counts a health cause turning on or off (never
/// lockstep's own writes), holds a resume, bounds new health drains
/// cluster-wide, and decides what lockstep shows of Slurm's health in
/// Kubernetes.
pub(crate) struct Gate<'a> {
    pub cluster: &'a mut Cluster,
    pub node: &'a mut NodeHealth,
    pub policy: &'a HealthPolicy,
    pub now_ms: u64,
}

impl Gate<'_> {
    /// One evaluation of the node's causes: whether a health cause was in
    /// force before and is now. A spell begins or ends.
    pub fn follow(&mut self, had_health: bool, has_health: bool) {
        let (now, policy) = (self.now_ms, self.policy);
        self.node
            .damping
            .follow(had_health, has_health, now, policy);
    }

    /// Whether the resume of lockstep's drain waits, and until when
    /// (`None`: until the return condition turns True, no timer).
    pub fn resume_hold(&self) -> Option<(Rule, Option<u64>)> {
        if self.node.returning.is_some() {
            return Some((Rule::ReturnGate, None));
        }
        self.node
            .damping
            .resume_hold(self.now_ms, self.policy)
            .map(|(rule, until)| (rule, Some(until)))
    }

    /// The Kubernetes node under it came back as a different machine: a
    /// resume of lockstep's drain waits for `return_condition` (off: nothing).
    pub fn returning(&mut self, change: IdentityChange) {
        if self.policy.return_condition.is_empty() {
            return;
        }
        self.node.returning = Some(Box::new(Returning {
            change,
            since_ms: self.now_ms,
            // On a new Node object, whatever it says is about the new machine.
            seen_not_good: change.new_object(),
        }));
    }

    /// One evaluation of a return that waits (the table's last row):
    /// `good` whether the Kubernetes node shows `return_condition` True
    /// now; `held` whether lockstep still has a drain to lift, one on its
    /// way, or a cause keeps the node out. The wait ends once the condition is True after
    /// having been seen not True since the change (at once on a new Node
    /// object), or when there is nothing left to hold, or with the policy.
    pub fn follow_return(&mut self, good: bool, held: bool) {
        let Some(r) = &mut self.node.returning else {
            return;
        };
        if self.policy.return_condition.is_empty() || !held || (good && r.seen_not_good) {
            self.node.returning = None;
        } else if !good {
            r.seen_not_good = true;
        }
    }

    /// Why a return waits, if it does.
    pub fn returning_since(&self) -> Option<IdentityChange> {
        self.node.returning.as_ref().map(|r| r.change)
    }

    /// Whether a new health drain may be sent now (`health.rate_limited`):
    /// `Err` with the log time a place frees when the cluster-wide bound is
    /// reached.
    pub fn admit(&mut self) -> Result<(), u64> {
        let max = self.policy.drains_per_minute_max;
        match rate_limited(&mut self.cluster.drains, self.now_ms, max) {
            Some(at) => Err(at),
            None => Ok(()),
        }
    }

    /// A new health drain was sent (its first attempt, as its slot reports):
    /// it counts against the cluster-wide bound.
    pub fn sent(&mut self) {
        let max = self.policy.drains_per_minute_max as usize;
        record(&mut self.cluster.drains, self.now_ms, 60_000, max);
    }

    /// Health spells within the flap window, for the audit trail.
    pub fn spells(&self) -> usize {
        self.node.damping.spells()
    }

    /// Slurm -> Kubernetes: whether lockstep shows the node unhealthy,
    /// damped ([`slurm_health_step`]). `unhealthy`: Slurm reports it so.
    /// Sets `wake` to when to look again.
    pub fn show(
        &mut self,
        view: &NodeView<'_>,
        unhealthy: bool,
        slurm_visible: bool,
        wake: &mut Option<u64>,
    ) {
        let now = self.now_ms;
        // What Kubernetes already shows for a node Slurm still reports
        // unhealthy (set before a restart or an upgrade) is kept, not
        // flipped to healthy for the length of a grace period.
        let hc = self.policy.slurm_health_condition.as_str();
        let pod_shows = !hc.is_empty()
            && view.pod.is_some_and(|p| {
                p.obs
                    .conditions
                    .iter()
                    .any(|c| c.type_ == hc && c.status == ConditionStatus::False)
            });
        if unhealthy && pod_shows && !self.node.shown() {
            self.node.with_slurm(|h| {
                h.shown = true;
                h.unhealthy_since.get_or_insert(now);
            });
        }
        if slurm_visible {
            let (policy, marks) = (self.policy, &mut self.cluster.marks);
            if let Some(at) = self
                .node
                .with_slurm(|h| slurm_health_step(h, unhealthy, now, policy, marks))
            {
                min_wake(wake, at);
            }
        }
    }
}

/// Log times of recent health drains, newest last, bounded by `bound`.
pub(crate) fn record(times: &mut VecDeque<u64>, now_ms: u64, window_ms: u64, bound: usize) {
    trim(times, now_ms, window_ms);
    times.push_back(now_ms);
    while times.len() > bound {
        times.pop_front();
    }
}

/// Drops entries older than the window.
pub(crate) fn trim(times: &mut VecDeque<u64>, now_ms: u64, window_ms: u64) {
    while times
        .front()
        .is_some_and(|&t| t.saturating_add(window_ms) <= now_ms)
    {
        times.pop_front();
    }
}

/// Cluster-wide bound: `Some(when)` if a new health drain must wait until `when`.
pub(crate) fn rate_limited(
    times: &mut VecDeque<u64>,
    now_ms: u64,
    per_minute_max: u32,
) -> Option<u64> {
    trim(times, now_ms, 60_000);
    if times.len() >= per_minute_max as usize {
        times.front().map(|t| after_ms(*t, 60_000))
    } else {
        None
    }
}

/// Per-node flap damping: `Some(until)` if the node must stay drained.
pub(crate) fn flap_hold(times: &VecDeque<u64>, now_ms: u64, policy: &HealthPolicy) -> Option<u64> {
    let window_ms = ms(policy.flap_window_s);
    let last = *times.back()?;
    let recent = times
        .iter()
        .filter(|&&t| t.saturating_add(window_ms) > last)
        .count();
    let until = after_s(last, policy.flap_hold_s);
    (recent > policy.flaps_max as usize && now_ms < until).then_some(until)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{KubeEntry, Origin};
    use lockstep_schemas::{EventId, KubeNode};

    fn origin(ms: u64) -> Origin {
        Origin {
            ms,
            seq: 1,
            event: EventId("e".into()),
        }
    }

    fn kube(not_ready_since: Option<u64>) -> KubeEntry {
        KubeEntry {
            obs: KubeNode {
                read_labels: None,
                maintenance: None,
                name: "k1".into(),
                unschedulable: false,
                ready: if not_ready_since.is_some() {
                    ConditionStatus::False
                } else {
                    ConditionStatus::True
                },
                conditions: vec![],
                labels: Default::default(),
                taints: vec![],
                identity: Default::default(),
                devices: Default::default(),
                version: 0,
            },
            gen: 0,
            not_ready_since: not_ready_since.map(origin),
            unseen_labels: vec![],
        }
    }

    #[test]
    fn slurm_health_damping_table() {
        let p = HealthPolicy {
            slurm_unhealthy_grace_s: 60,
            slurm_unhealthy_per_minute_max: 2,
            slurm_healthy_after_s: 30,
            flaps_max: 1,
            flap_window_s: 3600,
            flap_hold_s: 600,
            ..HealthPolicy::default()
        };
        // One node: (time s, Slurm says unhealthy) -> (shown, wake s)
        let steps: &[(u64, bool, bool, Option<u64>)] = &[
            (0, true, false, Some(60)), // row 1: within the grace
            (45, false, false, None),   // a blip: nothing shown, nothing held
            (100, true, false, Some(160)),
            (160, true, true, None),       // row 3
            (200, false, true, Some(230)), // row 4: hysteresis
            (230, false, false, None),     // row 5
            (300, true, false, Some(360)),
            (360, true, true, None),       // second mark: flapping now
            (400, false, true, Some(960)), // held for flap_hold_s
            (960, false, false, None),
        ];
        let (mut st, mut cluster) = (SlurmHealth::default(), VecDeque::new());
        for (at, unhealthy, shown, wake) in steps {
            let got = slurm_health_step(&mut st, *unhealthy, at * 1000, &p, &mut cluster);
            assert_eq!(
                (st.shown, got),
                (*shown, wake.map(|w| w * 1000)),
                "at {at}s"
            );
        }
        // Row 2: the cluster-wide bound defers the third node in a minute.
        let mut cluster = VecDeque::new();
        let mut nodes = vec![SlurmHealth::default(); 3];
        for n in &mut nodes {
            slurm_health_step(n, true, 0, &p, &mut cluster);
        }
        let got: Vec<_> = nodes
            .iter_mut()
            .map(|n| slurm_health_step(n, true, 60_000, &p, &mut cluster))
            .collect();
        assert_eq!(got, [None, None, Some(120_000)]);
        assert_eq!(
            nodes.iter().map(|n| n.shown).collect::<Vec<_>>(),
            [true, true, false]
        );
    }

    #[test]
    fn kubernetes_node_rows_table() {
        let p = HealthPolicy::default(); // 60 s grace
        let ready = kube(None);
        let not_ready = kube(Some(0));
        let deleted = origin(0);
        // (node, deleted, now) -> causes
        type Row<'a> = (Option<&'a KubeEntry>, Option<&'a Origin>, u64, &'a [Cause]);
        let rows: &[Row<'_>] = &[
            (Some(&ready), None, 100_000, &[]),
            (Some(&not_ready), None, 59_999, &[]),
            (
                Some(&not_ready),
                None,
                60_000,
                &[Cause::Health(HealthCause::NotReady)],
            ),
            // Deleted: its host is gone.
            (
                None,
                Some(&deleted),
                0,
                &[Cause::Health(HealthCause::KubeNodeGone)],
            ),
            // Registered again, not Ready yet: still gone, and NotReady
            // once the grace runs out.
            (
                Some(&not_ready),
                Some(&deleted),
                10_000,
                &[Cause::Health(HealthCause::KubeNodeGone)],
            ),
            (
                Some(&not_ready),
                Some(&deleted),
                60_000,
                &[
                    Cause::Health(HealthCause::KubeNodeGone),
                    Cause::Health(HealthCause::NotReady),
                ],
            ),
        ];
        for (i, (node, gone, now, want)) in rows.iter().enumerate() {
            let view = NodeView {
                kube_name: Some("k1"),
                kube: *node,
                kube_gone: *gone,
                ..NodeView::default()
            };
            let (mut got, mut wake) = (Vec::new(), None);
            causes(&view, &p, *now, &mut got, &mut wake);
            assert_eq!(got, *want, "row {i}");
        }
    }

    #[test]
    fn rate_bound_defers_until_the_oldest_leaves_the_window() {
        let mut t = VecDeque::new();
        for now in [0, 1_000, 2_000] {
            assert_eq!(rate_limited(&mut t, now, 3), None);
            record(&mut t, now, 60_000, 3);
        }
        assert_eq!(rate_limited(&mut t, 3_000, 3), Some(60_000));
        assert_eq!(rate_limited(&mut t, 60_000, 3), None);
    }

    #[test]
    fn flapping_holds_only_past_the_bound_and_only_for_the_hold() {
        let p = HealthPolicy {
            flaps_max: 2,
            flap_window_s: 100,
            flap_hold_s: 50,
            ..HealthPolicy::default()
        };
        let mut t = VecDeque::new();
        record(&mut t, 0, 100_000, 3);
        record(&mut t, 10_000, 100_000, 3);
        assert_eq!(
            flap_hold(&t, 20_000, &p),
            None,
            "two drains: not flapping yet"
        );
        record(&mut t, 20_000, 100_000, 3);
        assert_eq!(flap_hold(&t, 30_000, &p), Some(70_000));
        assert_eq!(flap_hold(&t, 70_000, &p), None, "hold over");
        // Old drains leave the window.
        let mut t = VecDeque::from([0, 10_000, 200_000]);
        assert_eq!(flap_hold(&t, 200_001, &p), None);
        record(&mut t, 200_002, 100_000, 3);
        assert_eq!(t, [200_000, 200_002]);
    }

    /// The return gate, one story per line: what made the node another
    /// machine, then each evaluation's (the condition True, something left
    /// to hold) -> whether the resume still waits after it.
    #[test]
    fn return_gate_table() {
        use IdentityChange::{BootId, Deleted, ProviderId, Uid};
        let on = HealthPolicy {
            return_condition: "HealthCheckPassed".to_owned(),
            ..HealthPolicy::default()
        };
        type Case = (IdentityChange, &'static [(bool, bool, bool)]);
        #[rustfmt::skip]
        let cases: &[Case] = &[
            // a new Node object: the condition True on it opens the gate
            (Deleted, &[(false, true, true), (true, true, false)]),
            (Uid, &[(true, true, false)]),
            (ProviderId, &[(false, true, true), (true, true, false)]),
            // the same Node after a reboot: a True left from before counts
            // only after the condition was seen not True
            (BootId, &[(true, true, true), (true, true, true), (false, true, true), (true, true, false)]),
            // nothing left to hold (an admin resumed, no cause): the wait ends
            (BootId, &[(false, false, false), (true, true, false)]),
        ];
        for (i, (change, steps)) in cases.iter().enumerate() {
            let mut node = NodeHealth::default();
            let mut cluster = Cluster::default();
            let mut gate = Gate {
                cluster: &mut cluster,
                node: &mut node,
                policy: &on,
                now_ms: 1_000,
            };
            gate.returning(*change);
            for (j, (good, held, waits)) in steps.iter().enumerate() {
                gate.follow_return(*good, *held);
                let hold = gate.resume_hold();
                assert_eq!(
                    hold == Some((Rule::ReturnGate, None)),
                    *waits,
                    "case {i} step {j}: {hold:?}"
                );
            }
        }
        // Off: a change holds nothing, and a policy turned off lets go.
        let off = HealthPolicy::default();
        let (mut node, mut cluster) = (NodeHealth::default(), Cluster::default());
        let mut gate = Gate {
            cluster: &mut cluster,
            node: &mut node,
            policy: &off,
            now_ms: 0,
        };
        gate.returning(Uid);
        assert_eq!(gate.resume_hold(), None);
        let (mut node, mut cluster) = (NodeHealth::default(), Cluster::default());
        Gate {
            cluster: &mut cluster,
            node: &mut node,
            policy: &on,
            now_ms: 0,
        }
        .returning(Uid);
        let mut gate = Gate {
            cluster: &mut cluster,
            node: &mut node,
            policy: &off,
            now_ms: 0,
        };
        gate.follow_return(false, true);
        assert_eq!(gate.resume_hold(), None);
    }

    /// The resume rows, one case per line: (health drains, cleared at, now)
    /// -> hold.
    #[test]
    fn resume_hold_table() {
        let p = HealthPolicy {
            resume_after_s: 30,
            flaps_max: 2,
            flap_window_s: 100,
            flap_hold_s: 50,
            ..HealthPolicy::default()
        };
        type Case = (&'static [u64], u64, u64, Option<(Rule, u64)>);
        #[rustfmt::skip]
        let cases: &[Case] = &[
            // healthy for less than resume_after_s: wait
            (&[0], 5_000, 10_000, Some((Rule::ResumeDelayed, 35_000))),
            // long enough: resume
            (&[0], 5_000, 35_000, None),
            // flapping: held for flap_hold_s after the last drain, and not
            // before resume_after_s
            (&[0, 10_000, 20_000], 21_000, 30_000, Some((Rule::FlapHold, 70_000))),
            (&[0, 10_000, 60_000], 61_000, 62_000, Some((Rule::FlapHold, 110_000))),
            // the hold is over
            (&[0, 10_000, 20_000], 21_000, 70_000, None),
        ];
        for (i, (drains, cleared, now, want)) in cases.iter().enumerate() {
            let drains: VecDeque<u64> = drains.iter().copied().collect();
            assert_eq!(resume_hold(&drains, *cleared, *now, &p), *want, "case {i}");
        }
    }
}
