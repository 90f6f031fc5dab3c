//! Eviction through Slurm: lockstep as an eviction responder of slurmd pods
//! (the Kubernetes EvictionRequest API, `lifecycle.k8s.io/v1alpha1`, with
//! `drain.eviction_responder` named in the pods' `spec.evictionResponders`).
//! An Eviction of such a pod drains its Slurm node at once (`drain` row 5);
//! while lockstep is the active responder it reports how far the drain has
//! got, and completes once the Slurm node is out and runs no job, so that
//! the next responder (Kubernetes' own evictor) evicts the pod. An eviction
//! withdrawn before that lifts the drain (`drain.cause_cleared`).
//!
//! | row | holds when                                                                 | wants                                                                | rule                       |
//! |-----|----------------------------------------------------------------------------|----------------------------------------------------------------------|----------------------------|
//! | 1   | an eviction of the pod is under way and not canceled                       | the Slurm node drained (`drain` row 5)                               | `drain.eviction_requested` |
//! | 2   | lockstep is the active responder, not done; the Slurm node still runs a job or is not out yet | a report (`heartbeatTime`, the drain's progress), again every [`HEARTBEAT_MS`] | `drain.eviction_response` |
//! | 3   | lockstep is the active responder, not done; the Slurm node is out and runs no job | the report that completes it (`completionTime`)               | `drain.eviction_response`  |

use lockstep_schemas::{Action, DrainPolicy, ResponderState, SlurmNode};

use crate::model::{NodeView, PodEntry};

/// How often lockstep reports while the drain goes on: well within
/// Kubernetes' 20 minutes without a heartbeat, after which the next
/// responder takes over, and well above its 20 s floor.
pub(crate) const HEARTBEAT_MS: u64 = 5 * 60_000;

/// Row 1: an eviction of the node's pod that lockstep answers is under way.
pub(crate) fn requested(view: &NodeView<'_>, policy: &DrainPolicy) -> bool {
    !policy.eviction_responder.is_empty()
        && view
            .pod
            .and_then(|p| p.obs.eviction.as_ref())
            .is_some_and(|e| !e.over && e.state != ResponderState::Canceled)
}

/// Rows 2 and 3 for the pod of `slurm`: the report wanted (`None`: none),
/// and when to report again. `out`: Slurm shows the node drained or down;
/// `busy`: it runs or finishes a job.
pub(crate) fn response(
    pod: &PodEntry,
    slurm: &SlurmNode,
    out: bool,
    busy: bool,
    policy: &DrainPolicy,
    now_ms: u64,
) -> (Option<Action>, Option<u64>) {
    let responder = policy.eviction_responder.as_str();
    let eviction = pod
        .obs
        .eviction
        .as_ref()
        .filter(|e| e.state == ResponderState::Active && !e.completed && !e.over);
    let Some(e) = eviction.filter(|_| !responder.is_empty()) else {
        return (None, None);
    };
    let complete = out && !busy;
    let node = &slurm.name;
    let message = match (out, busy) {
        (true, false) => format!("Slurm node {node} drained; no job runs"),
        (true, true) => format!("Slurm node {node} draining; jobs still run"),
        (false, _) => format!("Slurm node {node} to be drained"),
    };
    let beat = if complete { 0 } else { now_ms / HEARTBEAT_MS };
    let action = Action::KubeRespondEviction {
        namespace: pod.obs.namespace.clone(),
        pod: pod.obs.name.clone(),
        eviction: e.name.clone(),
        responder: responder.to_owned(),
        message,
        beat,
        complete,
    };
    let next = (!complete).then(|| (beat + 1) * HEARTBEAT_MS);
    (Some(action), next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_schemas::{KubePod, PodEviction};

    fn pod(eviction: Option<(ResponderState, bool)>) -> PodEntry {
        PodEntry::of(KubePod {
            eviction: eviction.map(|(state, completed)| PodEviction {
                name: "pod-1-n1".into(),
                state,
                completed,
                over: false,
                version: 7,
            }),
            ..KubePod::running("slurm", "n1", "k1")
        })
    }

    /// One case a line: (lockstep's state in the eviction, completed, Slurm
    /// shows it out, busy, now) -> (the report's message and completion,
    /// next report).
    #[test]
    fn response_rows() {
        use ResponderState::{Active, Canceled, Completed, Inactive, Interrupted};
        let policy = DrainPolicy {
            eviction_responder: "lockstep.dev/slurm-drain".into(),
            ..DrainPolicy::default()
        };
        let slurm = SlurmNode::idle("n1");
        let m = HEARTBEAT_MS;
        type Case = (
            Option<(ResponderState, bool)>,
            bool,
            bool,
            u64,
            Option<(&'static str, bool, u64)>,
            Option<u64>,
        );
        #[rustfmt::skip]
        let cases: &[Case] = &[
            // no eviction, or not lockstep's turn: nothing to say
            (None, false, false, 0, None, None),
            (Some((Inactive, false)), true, false, 0, None, None),
            // row 2: the drain goes on; a report every period
            (Some((Active, false)), false, false, 10, Some(("Slurm node n1 to be drained", false, 0)), Some(m)),
            (Some((Active, false)), true, true, m + 10, Some(("Slurm node n1 draining; jobs still run", false, 1)), Some(2 * m)),
            // row 3: out, no job: complete
            (Some((Active, false)), true, false, 3 * m + 5, Some(("Slurm node n1 drained; no job runs", true, 0)), None),
            // done, interrupted, canceled, completed: nothing more
            (Some((Active, true)), true, false, 0, None, None),
            (Some((Interrupted, false)), true, false, 0, None, None),
            (Some((Canceled, false)), true, false, 0, None, None),
            (Some((Completed, true)), true, false, 0, None, None),
        ];
        for (i, (eviction, out, busy, now, want, next)) in cases.iter().enumerate() {
            let (action, got_next) = response(&pod(*eviction), &slurm, *out, *busy, &policy, *now);
            let got = action.map(|a| match a {
                Action::KubeRespondEviction {
                    message,
                    complete,
                    beat,
                    eviction,
                    ..
                } => {
                    assert_eq!(eviction, "pod-1-n1");
                    (message, complete, beat)
                }
                other => panic!("{other:?}"),
            });
            let want = want.map(|(m, c, b)| (m.to_owned(), c, b));
            assert_eq!((got, got_next), (want, *next), "case {i}");
        }
        // Off: nothing, whatever the pod says.
        let (action, _) = response(
            &pod(Some((Active, false))),
            &slurm,
            true,
            false,
            &DrainPolicy::default(),
            0,
        );
        assert!(action.is_none());
    }
}
