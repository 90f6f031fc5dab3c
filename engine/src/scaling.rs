//! Scaling policy: each scale target follows the demand of one Slurm
//! partition, and shrinks only through drain -> drained -> delete.
//!
//! | rule               | what                                                                 |
//! |--------------------|----------------------------------------------------------------------|
//! | `scaling.desired`  | busy nodes of the target + nodes wanted by pending jobs that more nodes can help, bounded by min / max |
//! | `scaling.up`       | desired above the replica count: scale up at once (after the cooldown) |
//! | `scaling.in`       | desired below it, for nodes idle long enough: pick victims, drain them |
//! | `scaling.delete`   | a victim is DRAINED (DRAIN, not ALLOCATED/MIXED/COMPLETING, no job): delete its pod (UID precondition) |
//! | `scaling.down`     | lower the replica count by the victims whose pods are gone |
//! | `scaling.cancel`   | demand returns before a victim's pod is deleted: drop it (its drain is resumed) |
//! | `scaling.replace`  | pods of an old revision: at most `max_unavailable` at a time through the same drain -> delete path |
//! | `scaling.busy`     | label pods whose Slurm node runs a job, so a PodDisruptionBudget protects them |
//!
//! Fail closed: while lockstep cannot see Slurm, or does not know a victim's
//! Slurm node, nothing is deleted. A pod whose Slurm node runs a job is never
//! deleted.

use std::cmp::Ordering;

use lockstep_schemas::{
    ScaleTargetRef, SlurmBaseState, SlurmJob, SlurmJobState, SlurmNode, SlurmNodeFlag,
};
use serde::{Deserialize, Serialize};

use crate::slot::Slot;

/// Why a node is being taken out by scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum VictimKind {
    /// Scale-in: the pod goes and the replica count drops.
    ScaleIn,
    /// Rolling replacement: the pod goes and its controller recreates it at
    /// the new revision.
    Replace,
}

/// A node on its way out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Victim {
    pub target: ScaleTargetRef,
    pub kind: VictimKind,
    /// `namespace/name` of its pod, and the pod's UID when it was picked.
    pub pod_key: String,
    pub uid: String,
    /// The target's replica count when the pod was seen gone (scale-in),
    /// so the victim is settled once the count drops below it.
    pub gone_at_replicas: Option<u32>,
    pub delete_slot: Slot,
}

/// Per scale target.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ScaleCtl {
    pub last_up_ms: Option<u64>,
    pub last_down_ms: Option<u64>,
    pub slot: Slot,
    /// The last desired count, to report changes.
    pub desired: Option<u32>,
}

/// Whether a pending job is demand that more nodes can meet.
pub(crate) fn scalable(job: &SlurmJob, unscalable_reasons: &[String]) -> bool {
    job.state == SlurmJobState::Pending
        && !job
            .pending_reason
            .as_deref()
            .is_some_and(|r| unscalable_reasons.iter().any(|u| r.starts_with(u.as_str())))
}

/// Busy from Slurm's side: a job holds it or is finishing on it.
pub(crate) fn slurm_busy(node: &SlurmNode) -> bool {
    matches!(
        node.state,
        SlurmBaseState::Allocated | SlurmBaseState::Mixed
    ) || node.has(&SlurmNodeFlag::Completing)
}

/// DRAINED in sinfo's sense: DRAIN and nothing running or finishing.
pub(crate) fn drained(node: &SlurmNode, jobs: u32) -> bool {
    node.has(&SlurmNodeFlag::Drain) && !slurm_busy(node) && jobs == 0
}

/// Desired replicas: busy nodes plus pending demand, within bounds.
pub(crate) fn desired(busy: u32, pending_nodes: u64, min: u32, max: u32) -> u32 {
    let want = u64::from(busy).saturating_add(pending_nodes);
    u32::try_from(want).unwrap_or(u32::MAX).clamp(min, max)
}

/// Victim order: idle first, then fewest running jobs, then newest (the
/// highest ordinal: StatefulSet and NodeSet pods are numbered in creation
/// order), then by name, so the choice is deterministic.
pub(crate) fn victim_order(a: (u32, &str), b: (u32, &str)) -> Ordering {
    let ordinal = |s: &str| {
        let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        s[s.len() - digits..].parse::<u64>().ok()
    };
    a.0.cmp(&b.0)
        .then_with(|| ordinal(b.1).cmp(&ordinal(a.1)))
        .then_with(|| a.1.cmp(b.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desired_is_busy_plus_pending_within_bounds() {
        // (busy, pending, min, max) -> desired
        for (busy, pending, min, max, want) in [
            (0, 0, 1, 8, 1),
            (2, 3, 0, 8, 5),
            (2, 30, 0, 8, 8),
            (0, 0, 0, 8, 0),
            (5, u64::MAX, 0, 10, 10),
        ] {
            assert_eq!(
                desired(busy, pending, min, max),
                want,
                "{busy} {pending} {min} {max}"
            );
        }
    }

    #[test]
    fn victims_idle_first_then_fewest_jobs_then_newest() {
        let mut v = vec![
            (0, "gpu-2"),
            (1, "gpu-9"),
            (0, "gpu-10"),
            (0, "gpu-1"),
            (2, "gpu-11"),
        ];
        v.sort_by(|a, b| victim_order(*a, *b));
        assert_eq!(
            v,
            [
                (0, "gpu-10"),
                (0, "gpu-2"),
                (0, "gpu-1"),
                (1, "gpu-9"),
                (2, "gpu-11")
            ]
        );
    }

    #[test]
    fn pending_reasons_that_nodes_cannot_fix_do_not_count() {
        let reasons: Vec<String> = ["Dependency", "JobHeld", "QOS"].map(str::to_owned).to_vec();
        let job = |state: SlurmJobState, reason: Option<&str>| SlurmJob {
            job_id: 1,
            state,
            partition: "p".into(),
            nodes: vec![],
            node_count: 1,
            pending_reason: reason.map(str::to_owned),
            version: 0,
        };
        assert!(scalable(
            &job(SlurmJobState::Pending, Some("Resources")),
            &reasons
        ));
        assert!(scalable(&job(SlurmJobState::Pending, None), &reasons));
        assert!(!scalable(
            &job(SlurmJobState::Pending, Some("Dependency")),
            &reasons
        ));
        assert!(!scalable(
            &job(SlurmJobState::Pending, Some("JobHeldUser")),
            &reasons
        ));
        assert!(!scalable(
            &job(SlurmJobState::Pending, Some("QOSMaxJobsPerUserLimit")),
            &reasons
        ));
        assert!(!scalable(&job(SlurmJobState::Running, None), &reasons));
    }
}
