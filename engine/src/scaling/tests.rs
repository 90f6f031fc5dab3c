use super::*;

fn target(kind: &str, name: &str) -> ScaleTargetRef {
    ScaleTargetRef {
        group: "apps".into(),
        kind: kind.into(),
        namespace: "slurm".into(),
        name: name.into(),
    }
}

/// A pod of set `gpu` by a one-letter state: `i` idle long enough, `y`
/// idle not long enough, `b` busy (a job), `d` drained, `m` drained and
/// marked with the victim cost, `u` Slurm node unknown, `x` being
/// deleted, `l` being deleted and not drained (its Slurm node DOWN by
/// somebody else: slurmd gone with its host), `p` not Running and Ready,
/// `k` drained and seen marked while lockstep's change of its cost does
/// not show yet.
fn pod(name: &'static str, state: char) -> PodFacts<'static> {
    let key: &'static str = Box::leak(format!("slurm/{name}").into_boxed_str());
    PodFacts {
        key,
        name,
        uid: "u",
        slurm: name,
        jobs: u32::from(state == 'b'),
        busy: state == 'b',
        known: state != 'u',
        drained: matches!(state, 'd' | 'm' | 'x' | 'k'),
        deleting: matches!(state, 'x' | 'l'),
        serving: !matches!(state, 'p' | 'x' | 'l'),
        slurm_serves: !matches!(state, 'd' | 'm' | 'x' | 'l' | 'u' | 'k'),
        held_down: state == 'l',
        self_lifting: false,
        cost_unsettled: state == 'k',
        idle_enough: matches!(state, 'i' | 'd' | 'm' | 'p' | 'k'),
        cost: Some(if matches!(state, 'm' | 'k') {
            -2_147_483_648
        } else {
            0
        }),
        revision: None,
        idle_at: None,
    }
}

fn pods(states: &str) -> Vec<PodFacts<'static>> {
    const NAMES: [&str; 6] = ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"];
    states
        .chars()
        .enumerate()
        .map(|(i, c)| pod(NAMES[i], c))
        .collect()
}

#[test]
fn statefulset_scale_in_table() {
    // (pod states by ordinal, current, desired, victims before)
    //   -> (victims, lower to, blocked by)
    type Row = (
        &'static str,
        u32,
        u32,
        &'static [&'static str],
        &'static [&'static str],
        Option<u32>,
        Option<&'static str>,
    );
    let rows: &[Row] = &[
        // Idle top ordinals become victims; nothing lowered before DRAINED.
        (
            "biiii",
            5,
            1,
            &[],
            &["gpu-4", "gpu-3", "gpu-2", "gpu-1"],
            None,
            None,
        ),
        // The incident: a busy top ordinal stops it all, however idle
        // the ones below it are.
        ("biiib", 5, 2, &[], &[], None, Some("gpu-4")),
        // A busy ordinal in the middle stops the chain there.
        ("bibii", 5, 1, &[], &["gpu-4", "gpu-3"], None, Some("gpu-2")),
        // Lowered past the top DRAINED victims only.
        (
            "biidd",
            5,
            1,
            &["gpu-4", "gpu-3", "gpu-2", "gpu-1"],
            &["gpu-4", "gpu-3", "gpu-2", "gpu-1"],
            Some(3),
            None,
        ),
        (
            "bidid",
            5,
            1,
            &["gpu-4", "gpu-3", "gpu-2", "gpu-1"],
            &["gpu-4", "gpu-3", "gpu-2", "gpu-1"],
            Some(4),
            None,
        ),
        // Never below the demand of this moment.
        (
            "bdddd",
            5,
            3,
            &["gpu-4", "gpu-3", "gpu-2", "gpu-1"],
            &["gpu-4", "gpu-3"],
            Some(3),
            None,
        ),
        // Demand back above the count: victims below it are let go.
        ("bdddd", 5, 5, &["gpu-4", "gpu-3"], &[], None, None),
        // A victim that got a job is let go with the ones below it.
        (
            "bddbd",
            5,
            1,
            &["gpu-4", "gpu-3", "gpu-2"],
            &["gpu-4"],
            Some(4),
            Some("gpu-3"),
        ),
        // Pods at or above the count are the controller's to remove: their
        // victims stay until they are gone.
        (
            "bixx",
            2,
            1,
            &["gpu-3", "gpu-2"],
            &["gpu-2", "gpu-3", "gpu-1"],
            None,
            None,
        ),
        // A pod leaving anyway whose node holds no job and takes none (here
        // DOWN by somebody else, which lockstep never drains over) is
        // lowered past, DRAINED or not: lowering only keeps it from coming
        // back.
        (
            "dl",
            2,
            0,
            &["gpu-1", "gpu-0"],
            &["gpu-1", "gpu-0"],
            Some(0),
            None,
        ),
        ("il", 2, 1, &[], &["gpu-1"], Some(1), None),
        // Not idle long enough: waits, no complaint.
        ("biiiy", 5, 1, &[], &[], None, None),
        // Fail closed on what lockstep does not know.
        ("biiiu", 5, 1, &[], &[], None, Some("gpu-4")),
        ("biii", 5, 1, &[], &[], None, None),
    ];
    for (i, (states, current, desired, before, victims, lower, blocked)) in rows.iter().enumerate()
    {
        let pods = pods(states);
        let t = target("StatefulSet", "gpu");
        let plan = plan_scale_in(&ScaleIn {
            removal: Some(Removal::HighestOrdinal),
            target: &t,
            current: *current,
            desired: *desired,
            pods: &pods,
            victims: before,
            gone: 0,
            may_pick: true,
            visible: true,
        });
        let mut got = plan.victims.clone();
        got.sort();
        let mut want: Vec<String> = victims.iter().map(|v| (*v).to_owned()).collect();
        want.sort();
        assert_eq!(got, want, "row {i}: victims");
        assert_eq!(plan.lower_to, *lower, "row {i}: lower to");
        let by = plan.blocked.as_ref().map(|(n, _)| n.as_deref());
        match blocked {
            Some(n) => assert_eq!(by, Some(Some(*n)), "row {i}: blocked"),
            None => assert!(
                by.is_none() || (*states == "biii" && by == Some(None)),
                "row {i}: blocked by {by:?}"
            ),
        }
        assert!(plan.delete.is_empty() && plan.mark.is_empty());
        if let Some(to) = plan.lower_to {
            assert!(to >= *desired);
            lowering_allowed(Some(Removal::HighestOrdinal), &t, &pods, *current, to, true)
                .unwrap_or_else(|e| panic!("row {i}: {e}"));
        }
    }
}

#[test]
fn deletion_cost_scale_in_table() {
    // (pod states, current, desired, victims before)
    //   -> (victims, marked, lower to)
    type Row = (
        &'static str,
        u32,
        u32,
        &'static [&'static str],
        &'static [&'static str],
        &'static [&'static str],
        Option<u32>,
    );
    let rows: &[Row] = &[
        // Any idle pods, newest first; no lowering before they are marked.
        ("biibi", 5, 3, &[], &["gpu-4", "gpu-2"], &[], None),
        // DRAINED victims get the lowest cost.
        (
            "bidbd",
            5,
            3,
            &["gpu-4", "gpu-2"],
            &["gpu-4", "gpu-2"],
            &["slurm/gpu-4", "slurm/gpu-2"],
            None,
        ),
        // Marked and DRAINED: lowered by them.
        (
            "bimbm",
            5,
            3,
            &["gpu-4", "gpu-2"],
            &["gpu-4", "gpu-2"],
            &["slurm/gpu-4", "slurm/gpu-2"],
            Some(3),
        ),
        // One marked, one not yet: lowered by one.
        (
            "bidbm",
            5,
            3,
            &["gpu-4", "gpu-2"],
            &["gpu-4", "gpu-2"],
            &["slurm/gpu-4", "slurm/gpu-2"],
            Some(4),
        ),
        // A cost lockstep changed that does not show yet may be gone
        // already (the controller would then pick another pod): wait,
        // whether on a victim or on any other pod.
        (
            "bikbm",
            5,
            3,
            &["gpu-4", "gpu-2"],
            &["gpu-4", "gpu-2"],
            &["slurm/gpu-4", "slurm/gpu-2"],
            None,
        ),
        (
            "bikbm",
            5,
            4,
            &["gpu-4"],
            &["gpu-4"],
            &["slurm/gpu-4"],
            None,
        ),
        // Another pod not Running and Ready would go first: wait.
        (
            "bpmbm",
            5,
            3,
            &["gpu-4", "gpu-2"],
            &["gpu-4", "gpu-2"],
            &["slurm/gpu-4", "slurm/gpu-2"],
            None,
        ),
        // Demand back: victims beyond it are let go, to be unmarked; no
        // lowering while the one let go still carries the lowest cost.
        (
            "bimbm",
            5,
            4,
            &["gpu-4", "gpu-2"],
            &["gpu-4"],
            &["slurm/gpu-4"],
            None,
        ),
        (
            "bimbd",
            5,
            4,
            &["gpu-4"],
            &["gpu-4"],
            &["slurm/gpu-4"],
            None,
        ),
        (
            "bidbm",
            5,
            4,
            &["gpu-4"],
            &["gpu-4"],
            &["slurm/gpu-4"],
            Some(4),
        ),
        ("bimbm", 5, 5, &["gpu-4", "gpu-2"], &[], &[], None),
        // Two victims already going after a lowering; demand back: the
        // count stays, the others are let go.
        (
            "bixbx",
            3,
            3,
            &["gpu-4", "gpu-2"],
            &["gpu-4", "gpu-2"],
            &[],
            None,
        ),
        // A victim that got a job is let go (another is picked); the
        // marked one goes.
        (
            "bibbm",
            5,
            3,
            &["gpu-4", "gpu-2"],
            &["gpu-4", "gpu-1"],
            &["slurm/gpu-4"],
            Some(4),
        ),
    ];
    for (i, (states, current, desired, before, victims, marked, lower)) in rows.iter().enumerate() {
        let pods = pods(states);
        let t = target("ReplicaSet", "web");
        let plan = plan_scale_in(&ScaleIn {
            removal: Some(Removal::DeletionCost),
            target: &t,
            current: *current,
            desired: *desired,
            pods: &pods,
            victims: before,
            gone: 0,
            may_pick: true,
            visible: true,
        });
        let mut got = plan.victims.clone();
        got.sort();
        let mut want: Vec<String> = victims.iter().map(|v| (*v).to_owned()).collect();
        want.sort();
        assert_eq!(got, want, "row {i}: victims");
        let mut got = plan.mark.clone();
        got.sort();
        let mut want: Vec<String> = marked.iter().map(|v| (*v).to_owned()).collect();
        want.sort();
        assert_eq!(got, want, "row {i}: marked");
        assert_eq!(plan.lower_to, *lower, "row {i}: lower to");
    }
}

#[test]
fn delete_pod_and_controller_drains_table() {
    let t = target("NodeSet", "gpu");
    let idle = pods("biidd");
    // Victims picked, DRAINED ones deleted, nothing lowered yet.
    let plan = plan_scale_in(&ScaleIn {
        removal: Some(Removal::DeletePod),
        target: &t,
        current: 5,
        desired: 2,
        pods: &idle,
        victims: &["gpu-4", "gpu-3"],
        gone: 0,
        may_pick: true,
        visible: true,
    });
    assert_eq!(plan.victims, ["gpu-4", "gpu-3", "gpu-2"]);
    assert_eq!(plan.delete, ["slurm/gpu-4", "slurm/gpu-3"]);
    assert_eq!(plan.lower_to, None);
    // Two gone, demand back to 4: lowered to the demand, not by both.
    let left = pods("bii");
    let plan = plan_scale_in(&ScaleIn {
        removal: Some(Removal::DeletePod),
        target: &t,
        current: 5,
        desired: 4,
        pods: &left,
        victims: &[],
        gone: 2,
        may_pick: true,
        visible: true,
    });
    assert_eq!(plan.lower_to, Some(4));
    // Lowering by the gone would leave more pods than replicas: wait.
    let plan = plan_scale_in(&ScaleIn {
        removal: Some(Removal::DeletePod),
        target: &t,
        current: 5,
        desired: 1,
        pods: &pods("biiid"),
        victims: &[],
        gone: 2,
        may_pick: false,
        visible: true,
    });
    assert_eq!(plan.lower_to, None, "5 pods would remain for 3 replicas");
    assert!(plan.blocked.is_some());
    // The controller drains: lowered by the pods idle long enough.
    let plan = plan_scale_in(&ScaleIn {
        removal: Some(Removal::ControllerDrains),
        target: &t,
        current: 5,
        desired: 1,
        pods: &pods("bbiyi"),
        victims: &[],
        gone: 0,
        may_pick: true,
        visible: true,
    });
    assert_eq!(plan.lower_to, Some(3));
    assert!(plan.victims.is_empty());
    // No rule for the kind, or blind: nothing.
    for (removal, visible) in [(None, true), (Some(Removal::ControllerDrains), false)] {
        let plan = plan_scale_in(&ScaleIn {
            removal,
            target: &t,
            current: 5,
            desired: 1,
            pods: &idle,
            victims: &[],
            gone: 0,
            may_pick: true,
            visible,
        });
        assert_eq!(plan.lower_to, None);
        assert!(plan.victims.is_empty() && plan.blocked.is_some());
    }
}

#[test]
fn lowering_a_statefulset_needs_every_removed_ordinal_drained() {
    let t = target("StatefulSet", "gpu");
    let hs = Some(Removal::HighestOrdinal);
    // (states, from, to) -> allowed
    for (states, from, to, ok) in [
        ("bdddd", 5, 1, true),
        ("bddbd", 5, 1, false),
        ("bddbd", 5, 4, true),
        ("bdd", 5, 3, false), // ordinals 3 and 4 not known
        ("bdddu", 5, 4, false),
        ("biiii", 5, 5, true),
    ] {
        let got = lowering_allowed(hs, &t, &pods(states), from, to, true);
        assert_eq!(got.is_ok(), ok, "{states} {from}->{to}: {got:?}");
    }
    assert!(lowering_allowed(hs, &t, &pods("bdddd"), 5, 1, false).is_err());
}

#[test]
fn ordinals_and_owners() {
    for (pod, want) in [
        ("gpu-3", Some(3)),
        ("gpu-12", Some(12)),
        ("gpu-03", None),
        ("gpu-0", Some(0)),
        ("gpu-00", None),
        ("gpu-+3", None),
        ("gpu-4294967295", Some(u32::MAX)),
        ("gpu-4294967296", None),
        ("gpu-", None),
        ("gpu-a", None),
        ("gpux-3", None),
        ("gpu-gpu-3", None),
    ] {
        assert_eq!(ordinal("gpu", pod), want, "{pod}");
    }
    let d = target("Deployment", "web");
    assert!(owned_by(&d, "ReplicaSet", "web-5d8f7c9b4"));
    assert!(!owned_by(&d, "ReplicaSet", "web-api-5d8f7c9b4"));
    assert!(!owned_by(&d, "Deployment", "web"));
    let s = target("StatefulSet", "gpu");
    assert!(owned_by(&s, "StatefulSet", "gpu"));
    assert!(!owned_by(&s, "StatefulSet", "gpu2"));
}

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
