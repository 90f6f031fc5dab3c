//! Health policy, both directions.
//!
//! Kubernetes -> Slurm (rows 4-5 of the cause table that `drain` starts):
//!
//! | row | holds when                                            | rule                    |
//! |-----|-------------------------------------------------------|-------------------------|
//! | 4   | Ready is False/Unknown for at least `not_ready_grace_s` | `health.not_ready`    |
//! | 5   | a condition named in `node_conditions` is True        | `health.node_condition` |
//! | 6   | the Kubernetes node under it was deleted (a delete, or missing from a relist), and no node of that name is Ready again yet | `health.kube_node_gone` |
//!
//! Row 6 keeps the Slurm node out (drained, or DOWN with `action: down`)
//! with the reason `kubernetes node X deleted`: its host is gone, and a
//! deleted node used to look like a node that is simply not cordoned.
//!
//! Health drains are damped: at most `drains_per_minute_max` new ones
//! cluster-wide per minute of log time (`health.rate_limited`), a resume waits
//! until the node has been healthy for `resume_after_s`
//! (`health.resume_delay`), and a node with more than `flaps_max` health
//! drains within `flap_window_s` is held drained for `flap_hold_s`
//! (`health.flap_hold`).
//!
//! Slurm -> Kubernetes: a Slurm node that is DOWN, NOT_RESPONDING or FAIL
//! (not by lockstep's doing) sets the pod condition `slurm_health_condition`
//! to False, and the Kubernetes node under it gets `unhealthy_taint`.

use std::collections::VecDeque;

use lockstep_schemas::{ConditionStatus, HealthPolicy};

use crate::drain::Cause;
use crate::model::NodeView;
use crate::units::{after_ms, after_s, ms};

/// Rows 4-6. Sets `wake` to when a NotReady spell reaches its grace period.
pub(crate) fn causes(
    view: &NodeView<'_>,
    policy: &HealthPolicy,
    now_ms: u64,
    out: &mut Vec<Cause>,
    wake: &mut Option<u64>,
) {
    if view.kube_gone.is_some() {
        out.push(Cause::KubeNodeGone);
    }
    let Some(kube) = view.kube else { return };
    if let Some(since) = &kube.not_ready_since {
        let deadline = after_s(since.ms, policy.not_ready_grace_s);
        if now_ms >= deadline {
            out.push(Cause::NotReady);
        } else {
            min_wake(wake, deadline);
        }
    }
    for cond in &kube.obs.conditions {
        if cond.status == ConditionStatus::True && policy.node_conditions.contains(&cond.type_) {
            out.push(Cause::NodeCondition(cond.type_.clone()));
        }
    }
}

/// Keeps the earliest of two wake-up times.
pub(crate) fn min_wake(wake: &mut Option<u64>, at: u64) {
    *wake = Some(wake.map_or(at, |w| w.min(at)));
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
                version: 0,
            },
            gen: 0,
            not_ready_since: not_ready_since.map(origin),
            taint_slots: vec![],
            wake_ms: None,
            unseen_labels: vec![],
        }
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
            (Some(&not_ready), None, 60_000, &[Cause::NotReady]),
            // Deleted: its host is gone.
            (None, Some(&deleted), 0, &[Cause::KubeNodeGone]),
            // Registered again, not Ready yet: still gone, and NotReady
            // once the grace runs out.
            (
                Some(&not_ready),
                Some(&deleted),
                10_000,
                &[Cause::KubeNodeGone],
            ),
            (
                Some(&not_ready),
                Some(&deleted),
                60_000,
                &[Cause::KubeNodeGone, Cause::NotReady],
            ),
        ];
        for (i, (node, gone, now, want)) in rows.iter().enumerate() {
            let view = NodeView {
                slurm: None,
                pod_key: None,
                pod: None,
                kube_name: Some("k1"),
                kube: *node,
                kube_gone: *gone,
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
}
