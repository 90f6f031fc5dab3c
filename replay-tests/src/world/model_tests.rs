//! The world model against the documented behaviour it follows, with
//! lockstep not acting: each test is one documented rule, read off the log
//! lockstep's connectors would have written.

use lockstep_schemas::{
    ConditionStatus, Domain, Event, PodPhase, SlurmBaseState, SlurmJobState, SlurmNodeFlag,
};

use super::kube::{Pod, WorkloadKind};
use super::schedule::{Op, PodRef, RelistKind, ScaledKind, Schedule, Setup, Step};
use super::{Actor, Ms, World, WorldConfig, EPOCH_MS};

fn setup(kind: ScaledKind) -> Setup {
    Setup {
        kube_nodes: 3,
        scaled_kind: kind,
        scaled_min: 3,
        scaled_max: 5,
        fixed_replicas: 0,
        return_to_service: 1,
        busy_label: false,
        unhealthy_taint: false,
        zone_feature: false,
        flaky_actuators: false,
        jitter_seed: 7,
        slinky: false,
        image_pull_s: 0,
        slurm_nodes_annotation: false,
        slurm_lanes: true,
        nodes_through_scontrol: false,
    }
}

/// A world where lockstep observes but does not act.
fn world(setup: Setup, steps: Vec<Step>) -> World {
    let cfg = WorldConfig {
        lockstep_acts: false,
        ..WorldConfig::default()
    };
    World::new(&Schedule { setup, steps }, cfg)
}

fn at(after_ms: u64, op: Op) -> Step {
    Step { after_ms, op }
}

/// An administrator drains the Slurm node of the scaled set's first pod.
fn drain_first_pod(after_ms: u64) -> Step {
    at(
        after_ms,
        Op::AdminDrain {
            pod: PodRef { set: 0, index: 0 },
            reason: 0,
        },
    )
}

/// Log events as (virtual ms, event).
fn events(w: &World) -> Vec<(Ms, &Event)> {
    w.ls.events()
        .map(|r| (r.time_ms - EPOCH_MS, &r.envelope.event))
        .collect()
}

/// When the pod was first observed terminating, and when gone.
fn deleting_ms(w: &World, name: &str) -> Option<Ms> {
    events(w).into_iter().find_map(|(t, e)| match e {
        Event::KubePod(p) if p.name == name && p.deleting => Some(t),
        _ => None,
    })
}

fn gone_ms(w: &World, name: &str) -> Option<Ms> {
    events(w).into_iter().find_map(|(t, e)| match e {
        Event::KubePodGone { name: n, .. } if n == name => Some(t),
        _ => None,
    })
}

fn scale(w: &mut World, replicas: u32) {
    w.kube.sets[0].replicas = replicas;
    w.kube.sets[0].replicas_by = Actor::Step(0);
    w.set_written(0);
}

fn host_of(w: &World, pod: &str) -> u8 {
    let n = w.kube.pods[pod].node.as_ref().expect("bound");
    n.trim_start_matches("k8s-").parse().expect("k8s-N")
}

#[test]
fn ordered_ready_scale_down_removes_the_highest_ordinal_first_one_at_a_time() {
    let mut w = world(setup(ScaledKind::OrderedReady), vec![]);
    w.run_until(1_000);
    scale(&mut w, 1);
    w.run_until(60_000);
    let gone2 = gone_ms(&w, "cpu-2").expect("cpu-2 removed");
    let deleting1 = deleting_ms(&w, "cpu-1").expect("cpu-1 removed");
    assert!(
        gone2 <= deleting1,
        "cpu-1 deleted at {deleting1} before cpu-2 was gone at {gone2}"
    );
    assert!(w.kube.pods.contains_key("cpu-0"));
    assert!(!w.kube.pods.contains_key("cpu-1") && !w.kube.pods.contains_key("cpu-2"));
}

#[test]
fn parallel_scale_down_removes_all_condemned_pods_at_once() {
    let mut w = world(setup(ScaledKind::Parallel), vec![]);
    w.run_until(1_000);
    scale(&mut w, 1);
    w.run_until(60_000);
    let (a, b) = (
        deleting_ms(&w, "cpu-2").expect("cpu-2 removed"),
        deleting_ms(&w, "cpu-1").expect("cpu-1 removed"),
    );
    assert!(a.abs_diff(b) < 500, "cpu-2 at {a}, cpu-1 at {b}");
}

#[test]
fn ordered_ready_waits_for_every_predecessor_to_be_running_and_ready() {
    let mut w = world(setup(ScaledKind::OrderedReady), vec![]);
    let host = host_of(&w, "cpu-1");
    w.host_dies(host, &Actor::Step(0));
    // After the grace period the node is Unknown and its pods not Ready.
    w.run_until(45_000);
    assert!(!w.kube.pods["cpu-1"].ready);
    scale(&mut w, 5);
    w.run_until(120_000);
    assert!(
        !w.kube.pods.contains_key("cpu-3"),
        "created behind an unready cpu-1"
    );
    w.host_back(host);
    w.run_until(240_000);
    let created = |name: &str| {
        events(&w).into_iter().find_map(|(t, e)| match e {
            Event::KubePod(p) if p.name == name => Some(t),
            _ => None,
        })
    };
    let ready3 = events(&w).into_iter().find_map(|(t, e)| match e {
        Event::KubePod(p) if p.name == "cpu-3" && p.ready && p.phase == PodPhase::Running => {
            Some(t)
        }
        _ => None,
    });
    assert!(created("cpu-4").expect("cpu-4 created") >= ready3.expect("cpu-3 ready"));
}

#[test]
fn a_dead_host_turns_unknown_after_the_grace_period_and_its_pods_stay_until_force_deleted() {
    let mut w = world(setup(ScaledKind::OrderedReady), vec![]);
    let host = host_of(&w, "cpu-0");
    let name = format!("k8s-{host}");
    w.run_until(1_000);
    w.host_dies(host, &Actor::Step(0));
    w.run_until(1_000 + 39_000);
    assert_eq!(w.kube.nodes[&name].ready, ConditionStatus::True);
    w.run_until(1_000 + 41_000);
    assert_eq!(w.kube.nodes[&name].ready, ConditionStatus::Unknown);
    // The pod still says Running; evicted after the 300 s toleration, it
    // stays terminating: no kubelet confirms the deletion.
    assert_eq!(w.kube.pods["cpu-0"].phase, PodPhase::Running);
    w.run_until(1_000 + 40_000 + 301_000);
    let p: &Pod = &w.kube.pods["cpu-0"];
    assert!(p.deletion.is_some() && p.disruption_target);
    w.run_until(600_000);
    assert!(
        w.kube.pods.contains_key("cpu-0"),
        "a dead kubelet confirms nothing"
    );
    // The node is deleted: PodGC removes the pod and the StatefulSet makes
    // a new one elsewhere.
    let uid = w.kube.pods["cpu-0"].uid.clone();
    w.delete_node(host, &Actor::Step(0));
    w.run_until(700_000);
    let p = &w.kube.pods["cpu-0"];
    assert_ne!(p.uid, uid);
    assert_ne!(p.node.as_deref(), Some(name.as_str()));
    assert!(p.up());
}

#[test]
fn a_force_deleted_pod_is_gone_without_ever_being_seen_terminating_and_comes_back_new() {
    let steps = vec![at(
        5_000,
        Op::ForceDeletePod {
            pod: PodRef { set: 0, index: 1 },
        },
    )];
    let mut w = world(setup(ScaledKind::OrderedReady), steps);
    let uid = w.kube.pods["cpu-1"].uid.clone();
    w.run_until(60_000);
    assert!(gone_ms(&w, "cpu-1").is_some());
    assert_eq!(deleting_ms(&w, "cpu-1"), None);
    assert_ne!(w.kube.pods["cpu-1"].uid, uid);
    assert!(w.kube.pods["cpu-1"].up());
}

#[test]
fn a_drain_under_a_job_is_draining_until_the_job_ends_then_drained() {
    let mut s = setup(ScaledKind::OrderedReady);
    s.scaled_min = 1;
    let steps = vec![
        at(
            1_000,
            Op::SubmitJob {
                fixed: false,
                nodes: 1,
                run_s: 60,
            },
        ),
        drain_first_pod(5_000),
    ];
    let mut w = world(s, steps);
    w.run_until(30_000);
    let n = &w.slurm.nodes["cpu-0"];
    assert_eq!(n.base, SlurmBaseState::Allocated);
    assert!(n.drain.is_some());
    assert_eq!(n.reason.as_ref().map(|r| r.1.as_str()), Some("root"));
    w.run_until(90_000);
    let n = &w.slurm.nodes["cpu-0"];
    assert_eq!(n.base, SlurmBaseState::Idle);
    assert!(n.drain.is_some() && n.jobs.is_empty() && n.completing == 0);
}

#[test]
fn slurmd_gone_is_not_responding_then_down_after_slurmd_timeout_and_kills_its_job() {
    let mut s = setup(ScaledKind::OrderedReady);
    s.scaled_min = 1;
    let steps = vec![at(
        1_000,
        Op::SubmitJob {
            fixed: false,
            nodes: 1,
            run_s: 600,
        },
    )];
    let mut w = world(s, steps);
    w.run_until(10_000);
    let host = host_of(&w, "cpu-0");
    w.host_dies(host, &Actor::Step(0));
    // The next ping (every SlurmdTimeout / 3 = 20 s) finds it silent.
    w.run_until(31_000);
    assert!(w.slurm.nodes["cpu-0"].not_responding);
    assert_ne!(w.slurm.nodes["cpu-0"].base, SlurmBaseState::Down);
    w.run_until(10_000 + 60_000 + 21_000);
    let n = &w.slurm.nodes["cpu-0"];
    assert_eq!(n.base, SlurmBaseState::Down);
    assert_eq!(
        n.reason.as_ref().map(|r| (r.0.as_str(), r.1.as_str())),
        Some(("Not responding", "slurm"))
    );
    let job = w.slurm.jobs.values().next().expect("the job");
    assert_eq!(job.state, SlurmJobState::NodeFail);
    assert_eq!(w.facts.job_kills.len(), 1);
    assert_eq!(w.facts.job_kills[0].by, Actor::Step(0));
}

#[test]
fn return_to_service_decides_whether_a_registering_down_node_comes_back() {
    // (ReturnToService, DOWN for not responding, comes back)
    let cases = [
        (1, true, true),
        (2, true, true),
        (1, false, false),
        (2, false, true),
    ];
    for (rts, not_responding, back) in cases {
        let mut s = setup(ScaledKind::OrderedReady);
        s.scaled_min = 1;
        s.return_to_service = rts;
        let mut w = world(s, vec![]);
        let host = host_of(&w, "cpu-0");
        w.run_until(1_000);
        if not_responding {
            w.host_dies(host, &Actor::Step(0));
            w.run_until(120_000);
        } else {
            w.down_node("cpu-0", "bad gpu", "root", &Actor::Step(0), None);
            w.host_dies(host, &Actor::Step(0));
            w.run_until(120_000);
        }
        assert_eq!(w.slurm.nodes["cpu-0"].base, SlurmBaseState::Down);
        w.host_back(host);
        w.run_until(200_000);
        let n = &w.slurm.nodes["cpu-0"];
        assert_eq!(
            n.base != SlurmBaseState::Down,
            back,
            "RTS={rts} not_responding={not_responding}: {:?}",
            n.base
        );
        assert!(!n.not_responding);
    }
}

#[test]
fn a_drain_survives_down_and_return_to_service() {
    let mut s = setup(ScaledKind::OrderedReady);
    s.scaled_min = 1;
    s.return_to_service = 2;
    let mut w = world(s, vec![]);
    let host = host_of(&w, "cpu-0");
    w.drain_node("cpu-0", "bad dimm", "root", &Actor::Step(0));
    w.host_dies(host, &Actor::Step(0));
    w.run_until(120_000);
    w.host_back(host);
    w.run_until(200_000);
    let n = &w.slurm.nodes["cpu-0"];
    assert_eq!(n.base, SlurmBaseState::Idle);
    assert!(n.drain.is_some());
    assert_eq!(n.reason.as_ref().map(|r| r.0.as_str()), Some("bad dimm"));
}

#[test]
fn a_relist_after_a_restart_says_nothing_of_what_disappeared() {
    // (forget, a Gone event for the pod deleted while the watch was down)
    for (forget, gone_event) in [(false, true), (true, false)] {
        let mut w = world(setup(ScaledKind::OrderedReady), vec![]);
        w.run_until(1_000);
        // The watch is down: the deletion is not delivered.
        w.kube.pods.remove("cpu-2");
        w.kube.sets[0].replicas = 2;
        w.kube_relist(super::observe::Kind::Pods, forget);
        assert_eq!(
            gone_ms(&w, "cpu-2").is_some(),
            gone_event,
            "forget={forget}"
        );
        let frame: Vec<&Event> = events(&w)
            .into_iter()
            .map(|(_, e)| e)
            .skip_while(|e| !matches!(e, Event::SyncStarted { .. }))
            .collect();
        assert!(frame.iter().any(|e| matches!(e, Event::SyncDone { .. })));
    }
}

#[test]
fn slurm_changes_reach_the_log_at_the_next_poll() {
    let steps = || {
        vec![at(
            1_300,
            Op::SubmitJob {
                fixed: false,
                nodes: 1,
                run_s: 60,
            },
        )]
    };
    let first = |w: &World, pick: &dyn Fn(&Event) -> bool| {
        events(w)
            .into_iter()
            .find_map(|(t, e)| pick(e).then_some(t))
    };
    let job = |e: &Event| matches!(e, Event::SlurmJob(_));
    let allocated =
        |e: &Event| matches!(e, Event::SlurmNode(n) if n.state == SlurmBaseState::Allocated);
    // One poll: nodes, jobs and partitions at the next multiple of the
    // interval.
    let mut s = setup(ScaledKind::OrderedReady);
    s.scaled_min = 1;
    s.slurm_lanes = false;
    let mut w = world(s.clone(), steps());
    w.run_until(5_000);
    assert_eq!(
        first(&w, &job),
        Some(2_020),
        "submitted at 1.3 s, polled at 2 s"
    );
    let started = first(&w, &allocated).expect("the job's node is observed allocated");
    assert_eq!(started % 1_000, 20, "at a poll of the nodes: {started}");
    // Two lanes: the job 20 ms to 2.5 s after its submission, at a phase of
    // its own; the nodes as before.
    s.slurm_lanes = true;
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..20 {
        s.jitter_seed = seed;
        let mut w = world(s.clone(), steps());
        w.run_until(5_000);
        let t = first(&w, &job).expect("the job is observed");
        assert!((1_320..=3_800).contains(&t), "the job at {t}");
        seen.insert(t);
        let started = first(&w, &allocated).expect("the job's node is observed allocated");
        assert_eq!(started % 1_000, 20, "at a poll of the nodes: {started}");
    }
    assert!(seen.len() > 10, "the lane's phase varies: {seen:?}");
    let _ = RelistKind::SlurmJobs;
}

#[test]
fn a_slurmrestd_blackout_is_said_once_and_both_lanes_list_again_after_it() {
    for (seed, through_scontrol) in (0..20).flat_map(|s| [(s, false), (s, true)]) {
        let mut s = setup(ScaledKind::OrderedReady);
        s.jitter_seed = seed;
        s.nodes_through_scontrol = through_scontrol;
        let steps = vec![
            at(1_000, Op::SlurmrestdDown { for_s: 10 }),
            drain_first_pod(5_000),
        ];
        let mut w = world(s, steps);
        w.run_until(60_000);
        let ev = events(&w);
        let status = |visible: bool| {
            ev.iter()
                .enumerate()
                .filter(|(_, (_, e))| {
                    matches!(e, Event::ConnectorStatus { visible: v, .. } if *v == visible)
                })
                .map(|(i, _)| i)
                .collect::<Vec<_>>()
        };
        let (lost, back) = (status(false), status(true));
        assert_eq!(
            (lost.len(), back.len()),
            (1, 1),
            "seed {seed}: {lost:?} {back:?}"
        );
        assert!(lost[0] < back[0]);
        // Listed through scontrol, the drain shows while Slurm is out of
        // sight; through slurmrestd, only once it is back.
        let drained = ev
            .iter()
            .position(|(_, e)| matches!(e, Event::SlurmNode(n) if n.has(&SlurmNodeFlag::Drain)))
            .expect("the drain is observed");
        assert_eq!(drained < back[0], through_scontrol, "seed {seed}");
        for domain in [
            Domain::SlurmNodes,
            Domain::SlurmJobs,
            Domain::SlurmPartitions,
        ] {
            let done = ev[back[0]..]
                .iter()
                .any(|(_, e)| matches!(e, Event::SyncDone { domain: d } if *d == domain));
            assert!(
                done,
                "seed {seed}: {domain:?} not listed after visible: true"
            );
        }
    }
}

fn cost(p: &mut Pod, v: &str) {
    p.annotations.insert(
        super::kube::DELETION_COST.to_owned(),
        (v.to_owned(), Actor::Setup),
    );
}

#[test]
fn a_replicaset_deletes_in_the_documented_order() {
    let mut w = world(setup(ScaledKind::ReplicaSet), vec![]);
    w.run_until(400_000);
    let base = w.kube.pods.values().next().expect("a pod").clone();
    let pod = |name: &str, f: &dyn Fn(&mut Pod)| {
        let mut p = base.clone();
        p.name = name.to_owned();
        p.node = Some(format!("node-of-{name}"));
        p.phase = PodPhase::Running;
        p.ready = true;
        p.ready_since = Some(0);
        p.created_ms = 0;
        p.annotations.clear();
        p.restarts = 0;
        f(&mut p);
        p
    };
    let now = w.now;
    // Each pod is the one to go first among those after it, by one rule.
    let expected = [
        pod("unscheduled", &|p| p.node = None),
        pod("pending", &|p| p.phase = PodPhase::Pending),
        pod("not-ready", &|p| p.ready = false),
        pod("cheap", &|p| cost(p, "-10")),
        pod("crowded", &|p| p.node = Some("k8s-1".to_owned())),
        pod("ready-late", &|p| p.ready_since = Some(now - 1_000)),
        pod("restarted", &|p| p.restarts = 3),
        pod("young", &|p| p.created_ms = now - 2_000),
        pod("old", &|_| {}),
    ];
    let mut input = expected.to_vec();
    // Two more pods on k8s-1 so that it is the crowded node.
    input.push(pod("zz-crowd-1", &|p| {
        p.node = Some("k8s-1".to_owned());
        cost(p, "100");
    }));
    input.push(pod("zz-crowd-2", &|p| {
        p.node = Some("k8s-1".to_owned());
        cost(p, "100");
    }));
    input.reverse();
    let ranked: Vec<String> = w
        .rank_for_deletion(input)
        .into_iter()
        .map(|p| p.name)
        .filter(|n| !n.starts_with("zz-"))
        .collect();
    let want: Vec<String> = expected.iter().map(|p| p.name.clone()).collect();
    assert_eq!(ranked, want);
    assert!(matches!(w.kube.sets[0].kind, WorkloadKind::ReplicaSet));
}

#[test]
fn a_rolling_update_replaces_the_highest_ordinal_first_each_once_the_rest_is_ready() {
    let mut s = setup(ScaledKind::OrderedReady);
    s.fixed_replicas = 3;
    let steps = vec![at(1_000, Op::NewRevision { fixed: true })];
    let mut w = world(s, steps);
    w.run_until(120_000);
    let d: Vec<Ms> = ["gpu-2", "gpu-1", "gpu-0"]
        .iter()
        .map(|n| deleting_ms(&w, n).expect("replaced"))
        .collect();
    assert!(d[0] < d[1] && d[1] < d[2], "{d:?}");
    // gpu-1 went only once the new gpu-2 was Running and Ready.
    let ready2 = events(&w).into_iter().find_map(|(t, e)| match e {
        Event::KubePod(p)
            if p.name == "gpu-2" && p.ready && p.revision.as_deref() == Some("gpu-rev2") =>
        {
            Some(t)
        }
        _ => None,
    });
    assert!(ready2.expect("new gpu-2 ready") <= d[1]);
    assert!(w
        .kube
        .pods_of(1)
        .all(|p| p.revision.as_deref() == Some("gpu-rev2")));
}

#[test]
fn a_replicaset_scale_down_takes_the_pod_with_the_lowest_deletion_cost() {
    let mut w = world(setup(ScaledKind::ReplicaSet), vec![]);
    w.run_until(60_000);
    let names: Vec<String> = w.kube.pods_of(0).map(|p| p.name.clone()).collect();
    assert_eq!(names.len(), 3);
    let victim = names[1].clone();
    cost(w.kube.pods.get_mut(&victim).expect("listed"), "-2147483648");
    w.pod_written(&victim);
    scale(&mut w, 2);
    w.run_until(120_000);
    assert!(!w.kube.pods.contains_key(&victim));
    assert_eq!(w.kube.pods_of(0).count(), 2);
}

#[test]
fn a_node_annotation_is_reported_under_its_annotation_key_only_while_the_policy_reads_it() {
    let annotated = |w: &World| {
        events(w)
            .into_iter()
            .rev()
            .find_map(|(_, e)| match e {
                Event::KubeNode(n) if n.name == "k8s-0" => {
                    Some(n.labels.get("annotation:lockstep.io/slurm-nodes").cloned())
                }
                _ => None,
            })
            .flatten()
    };
    for on in [true, false] {
        let mut w = world(
            Setup {
                slurm_nodes_annotation: on,
                ..setup(ScaledKind::Parallel)
            },
            vec![],
        );
        w.run_until(1_000);
        let n = w.kube.nodes.get_mut("k8s-0").expect("k8s-0");
        n.annotations.insert(
            "lockstep.io/slurm-nodes".to_owned(),
            ("cpu-0".to_owned(), Actor::Step(0)),
        );
        // Not a label: a label of the same name is never reported as it.
        n.labels
            .insert("lockstep.io/slurm-nodes".to_owned(), "x".to_owned());
        w.node_written("k8s-0");
        w.run_until(5_000);
        assert_eq!(
            annotated(&w),
            on.then(|| "cpu-0".to_owned()),
            "policy on: {on}"
        );
    }
}

#[test]
fn a_reason_written_over_a_drain_or_down_makes_it_its_writers() {
    // A node has one reason (`scontrol show node`'s Reason=): once a DOWN
    // writes its own over a drain's, nothing in Slurm says any more who
    // drained it, and the drain goes with the reason.
    let mut w = world(setup(ScaledKind::OrderedReady), vec![]);
    w.run_until(1_000);
    w.drain_node("cpu-0", "bad dimm", "root", &Actor::Step(0));
    w.down_node("cpu-0", "bad dimm", "root", &Actor::Step(1), None);
    let n = &w.slurm.nodes["cpu-0"];
    assert_eq!(
        n.drain.as_ref().map(|d| &d.0),
        Some(&Actor::Step(0)),
        "same reason: the drain stays"
    );
    w.down_node(
        "cpu-0",
        "Pod is terminating",
        "slurm",
        &Actor::Step(2),
        None,
    );
    let n = &w.slurm.nodes["cpu-0"];
    assert_eq!(n.drain.as_ref().map(|d| &d.0), Some(&Actor::Step(2)));
    assert_eq!(
        n.reason.as_ref().map(|r| r.0.as_str()),
        Some("Pod is terminating")
    );
}
