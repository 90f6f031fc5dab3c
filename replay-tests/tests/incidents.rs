//! The shipped incidents: each log must be what its scenario writes, must
//! replay to its expected timeline, and must verify against the actions it
//! recorded. Then each story is checked for what it is about.
//!
//! `LOCKSTEP_BLESS=1 cargo test -p lockstep-replay-tests` rewrites the logs
//! and expected timelines from the scenarios; review the diff before
//! committing it.

use std::path::PathBuf;

use lockstep::commands::{self, ReplayOptions};
use lockstep_engine::{Phase, Rule};
use lockstep_replay_tests::scenarios::{self, ALL};
use lockstep_replay_tests::Sim;
use lockstep_schemas::log::{Format, LogReader, LogWriter};
use lockstep_schemas::{Action, ActionKind};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("incidents")
}

fn bless() -> bool {
    std::env::var_os("LOCKSTEP_BLESS").is_some_and(|v| v == "1")
}

fn log_bytes(sim: &Sim) -> Vec<u8> {
    let mut w =
        LogWriter::new(Vec::new(), Format::JsonLines, "lockstep incident scenarios").unwrap();
    for r in sim.records() {
        w.write(r).unwrap();
    }
    w.finish().unwrap()
}

fn check_golden(path: &std::path::Path, actual: &[u8]) {
    if bless() {
        std::fs::write(path, actual).unwrap();
        return;
    }
    let expected = std::fs::read(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with LOCKSTEP_BLESS=1 to create it)",
            path.display()
        )
    });
    if expected != actual {
        let exp = String::from_utf8_lossy(&expected);
        let act = String::from_utf8_lossy(actual);
        let first = exp
            .lines()
            .zip(act.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(exp.lines().count().min(act.lines().count()));
        panic!(
            "{} is stale from line {}:\n  expected: {}\n  actual:   {}\n(if the change is intended, rerun with LOCKSTEP_BLESS=1 and review the diff)",
            path.display(),
            first + 1,
            exp.lines().nth(first).unwrap_or("<end>"),
            act.lines().nth(first).unwrap_or("<end>")
        );
    }
}

fn replay_text(path: &std::path::Path, verify: bool) -> (String, commands::ReplayReport) {
    let reader = lockstep_schemas::log::open(path).unwrap();
    let mut out = Vec::new();
    let opts = ReplayOptions {
        verify,
        ..ReplayOptions::default()
    };
    let report = commands::replay(reader, &opts, &mut out, &mut |_| {}).unwrap();
    (String::from_utf8(out).unwrap(), report)
}

#[test]
fn every_incident_log_replays_to_its_expected_timeline_and_verifies() {
    assert!(ALL.len() >= 8);
    for incident in ALL {
        let sim = (incident.build)();
        let log = dir().join(format!("{}.jsonl", incident.name));
        check_golden(&log, &log_bytes(&sim));
        let (text, report) = replay_text(&log, true);
        check_golden(
            &dir().join(format!("{}.expected", incident.name)),
            text.as_bytes(),
        );
        assert!(
            report.damage.is_none(),
            "{}: {:?}",
            incident.name,
            report.damage
        );
        assert_eq!(
            report.divergence, None,
            "{}: recomputed actions differ",
            incident.name
        );
        assert_eq!(report.recorded_actions, report.actions, "{}", incident.name);
        assert_eq!(
            report.state_hash,
            sim.engine().hash(),
            "{}: replay hash differs from the live run",
            incident.name
        );
    }
}

#[test]
fn every_incident_also_replays_from_messagepack() {
    for incident in ALL {
        let sim = (incident.build)();
        let mut w = LogWriter::new(Vec::new(), Format::MessagePack, "t").unwrap();
        for r in sim.records() {
            w.write(r).unwrap();
        }
        let bytes = w.finish().unwrap();
        let mut out = Vec::new();
        let opts = ReplayOptions {
            verify: true,
            ..ReplayOptions::default()
        };
        let report =
            commands::replay(LogReader::msgpack(bytes), &opts, &mut out, &mut |_| {}).unwrap();
        assert!(report.damage.is_none());
        assert_eq!(report.divergence, None);
        assert_eq!(report.state_hash, sim.engine().hash(), "{}", incident.name);
    }
}

/// Every incident again, with the simulated actuators publishing what they
/// changed before they report the outcome, as the Kubernetes watch usually
/// does: the same actions at the same times. An action whose outcome does
/// not wake the evaluation that wants its target waits for its timeout
/// here (a minute) instead.
#[test]
fn every_incident_decides_the_same_when_effects_are_seen_before_outcomes() {
    let decided = |sim: &Sim| -> Vec<String> {
        sim.actions
            .iter()
            .map(|a| {
                let at = (a.time_ms - lockstep_replay_tests::EPOCH_MS) as f64 / 1000.0;
                format!("{at:.1}s {} #{} {:?}", a.rule, a.attempt, a.action)
            })
            .collect()
    };
    let mut differ = Vec::new();
    for incident in ALL {
        let usual = decided(&(incident.build)());
        let seen_first = decided(&lockstep_replay_tests::observed_before_outcomes(
            incident.build,
        ));
        if usual != seen_first {
            let at = usual
                .iter()
                .zip(&seen_first)
                .position(|(a, b)| a != b)
                .unwrap_or(usual.len().min(seen_first.len()));
            differ.push(format!(
                "{}: action {at}: outcome first {:?}, effect first {:?}",
                incident.name,
                usual.get(at),
                seen_first.get(at)
            ));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// A frozen copy of the engine ([`lockstep_engine::Engine::frozen`], what a
/// checkpoint is encoded from off the apply loop) encodes the engine's
/// snapshot of its point, byte for byte, however much the engine applied
/// after it: every incident, frozen at every fifth record.
#[test]
fn a_frozen_engine_encodes_the_snapshot_of_its_point_while_the_engine_goes_on() {
    for incident in ALL {
        let sim = (incident.build)();
        let mut replay = lockstep_engine::replay::Replay::new(lockstep_engine::Engine::new(
            lockstep_schemas::Policy::default(),
        ));
        let mut frozen = Vec::new();
        for (i, r) in sim.records().iter().enumerate() {
            replay.feed(r).expect("replays");
            if i % 5 == 0 {
                frozen.push((replay.engine().frozen(), replay.engine().snapshot()));
            }
        }
        assert_eq!(
            replay.engine().hash(),
            sim.engine().hash(),
            "{}",
            incident.name
        );
        for (copy, bytes) in &frozen {
            assert!(
                copy.snapshot() == *bytes,
                "{}: the copy frozen at seq {} changed",
                incident.name,
                copy.last_seq()
            );
        }
        assert!(replay.engine().frozen().snapshot() == replay.engine().snapshot());
    }
}

fn build(name: &str) -> Sim {
    (scenarios::by_name(name).unwrap().build)()
}

/// When (seconds into the story) lockstep issued actions of `kind` on the
/// state of Slurm node `node`.
fn state_actions_s(sim: &lockstep_replay_tests::Sim, kind: ActionKind, node: &str) -> Vec<u64> {
    let target = format!("slurm:{node}/state");
    sim.actions
        .iter()
        .filter(|a| a.action.kind() == kind && a.action.target().to_string() == target)
        .map(|a| (a.time_ms - lockstep_replay_tests::EPOCH_MS) / 1000)
        .collect()
}

fn drains_of(sim: &Sim, node: &str) -> Vec<String> {
    sim.actions
        .iter()
        .filter_map(|a| match &a.action {
            Action::SlurmDrain { node: n, reason } if n == node => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

fn count(sim: &Sim, kind: ActionKind, node: &str) -> usize {
    sim.actions
        .iter()
        .filter(|a| {
            a.action.kind() == kind && a.action.target().to_string().contains(&format!("{node}/"))
        })
        .count()
}

#[test]
fn cordon_while_job_runs_drains_without_touching_the_job_and_uncordon_resumes() {
    let sim = build("cordon-while-job-runs");
    assert_eq!(
        drains_of(&sim, "n1"),
        ["lockstep: kubernetes node k1 cordoned"]
    );
    assert_eq!(count(&sim, ActionKind::SlurmResume, "n1"), 1);
    assert!(
        drains_of(&sim, "n2").is_empty(),
        "n2's node was never cordoned"
    );
    assert!(!sim
        .actions
        .iter()
        .any(|a| a.action.kind() == ActionKind::KubeDeletePod));
    // The drain went out while the job still held the node.
    let drain = sim
        .actions
        .iter()
        .find(|a| a.action.kind() == ActionKind::SlurmDrain)
        .unwrap();
    let job_end = sim
        .records()
        .iter()
        .position(|r| matches!(r, lockstep_schemas::Record::Event(e) if matches!(e.envelope.event, lockstep_schemas::Event::SlurmJobGone { .. })))
        .unwrap() as u64;
    assert!(drain.seq < job_end);
    assert_eq!(sim.phase("n1"), Phase::InService);
}

#[test]
fn uncordon_never_resumes_the_admins_drain() {
    let sim = build("uncordon-resumes-only-owned");
    assert_eq!(count(&sim, ActionKind::SlurmResume, "n1"), 1);
    assert_eq!(count(&sim, ActionKind::SlurmResume, "n2"), 0);
    assert_eq!(
        count(&sim, ActionKind::SlurmDrain, "n2"),
        0,
        "already drained by the admin"
    );
    assert_eq!(sim.phase("n2"), Phase::ForeignDrain);
    assert_eq!(
        sim.slurm["n2"].reason.as_deref(),
        Some("bad DIMM, ticket 4411")
    );
}

#[test]
fn admin_drain_is_reflected_and_never_undone() {
    let sim = build("admin-drain-reflected");
    assert_eq!(count(&sim, ActionKind::SlurmResume, "n1"), 0);
    let conds: Vec<_> = sim
        .actions
        .iter()
        .filter_map(|a| match &a.action {
            Action::KubeSetPodCondition { condition, .. } => {
                Some((condition.status, condition.message.clone()))
            }
            _ => None,
        })
        .collect();
    use lockstep_schemas::ConditionStatus::*;
    assert_eq!(
        conds,
        [(True, "reseat GPU 3".to_owned()), (False, String::new())]
    );
}

#[test]
fn not_ready_drains_only_past_the_grace_period() {
    let sim = build("not-ready-grace");
    assert!(
        drains_of(&sim, "n1").is_empty(),
        "a 20 s blip must not drain"
    );
    assert_eq!(
        drains_of(&sim, "n2"),
        ["lockstep: kubernetes node k2 not ready"]
    );
    let t = sim
        .transitions
        .iter()
        .find(|t| t.node == "n2" && t.to == Phase::Draining)
        .unwrap();
    let became_not_ready = sim
        .records()
        .iter()
        .find_map(|r| match r {
            lockstep_schemas::Record::Event(e) if e.envelope.id == t.cause => Some(e.time_ms),
            _ => None,
        })
        .expect("the transition names the NotReady observation as its cause");
    assert_eq!(
        t.time_ms - became_not_ready,
        60_000,
        "drained when the 60 s grace ran out"
    );
    assert_eq!(count(&sim, ActionKind::SlurmResume, "n2"), 1);
    assert_eq!(sim.phase("n2"), Phase::InService);
}

#[test]
fn slurm_not_responding_sets_and_clears_condition_and_taint() {
    let sim = build("slurm-not-responding");
    let kinds: Vec<_> = sim.actions.iter().map(|a| a.action.kind()).collect();
    assert_eq!(
        kinds,
        [
            ActionKind::KubeSetPodCondition,
            ActionKind::KubeTaintNode,
            ActionKind::KubeSetPodCondition,
            ActionKind::KubeUntaintNode
        ]
    );
    assert!(sim.kube["k2"].taints.is_empty());
    assert!(!sim
        .actions
        .iter()
        .any(|a| a.action.target().to_string().contains("n1")));
}

#[test]
fn an_owned_drain_removed_early_is_reapplied() {
    let sim = build("owned-drain-removed-early");
    assert_eq!(drains_of(&sim, "n1").len(), 2);
    assert!(sim.transitions.iter().any(|t| t.rule == Rule::Reapplied));
    assert_eq!(count(&sim, ActionKind::SlurmResume, "n1"), 1);
    assert_eq!(sim.phase("n1"), Phase::InService);
}

#[test]
fn a_flapping_node_is_held_drained() {
    let sim = build("flapping-node-damped");
    assert_eq!(drains_of(&sim, "n1").len(), 3);
    assert!(sim.transitions.iter().any(|t| t.rule == Rule::FlapHold));
    // Resumed after the first two flaps, then held, then resumed when the hold ended.
    let resumes: Vec<_> = sim
        .actions
        .iter()
        .filter(|a| a.action.kind() == ActionKind::SlurmResume)
        .map(|a| a.time_ms)
        .collect();
    assert_eq!(resumes.len(), 3);
    let last_drain = sim
        .actions
        .iter()
        .rev()
        .find(|a| a.action.kind() == ActionKind::SlurmDrain)
        .unwrap();
    assert!(
        resumes[2] >= last_drain.time_ms + 900_000,
        "held for flap_hold_s"
    );
}

#[test]
fn a_failed_drain_is_retried_with_backoff_until_it_succeeds() {
    let sim = build("action-fails-then-retried");
    let attempts: Vec<_> = sim
        .actions
        .iter()
        .filter(|a| a.action.kind() == ActionKind::SlurmDrain)
        .map(|a| (a.attempt, a.time_ms - sim.actions[0].time_ms))
        .collect();
    // Fails at +1 s, retried after the 5 s backoff; lost, retried on the
    // first record after the 30 s timeout (ticks come every 10 s).
    assert_eq!(attempts, [(1, 0), (2, 6_000), (3, 37_000)]);
    assert_eq!(sim.phase("n1"), Phase::Drained);
    assert!(sim.engine().pending().is_empty());
}

#[test]
fn a_drain_found_in_place_after_failed_resumes_settles_the_node() {
    let sim = build("drain-found-in-place-after-failed-resumes");
    let sent: Vec<_> = sim
        .actions
        .iter()
        .map(|a| (a.action.kind(), a.attempt))
        .collect();
    // The drain, the resume and its retry, the drain again: found in place
    // and not sent again at its timeout.
    assert_eq!(
        sent,
        [
            (ActionKind::SlurmDrain, 1),
            (ActionKind::SlurmResume, 1),
            (ActionKind::SlurmResume, 2),
            (ActionKind::SlurmDrain, 1),
        ]
    );
    assert_eq!(sim.phase("n1"), Phase::Drained);
    assert!(sim.engine().pending().is_empty());
}

#[test]
fn host_mode_gpu_xid_takes_the_node_down_and_back() {
    let sim = build("gpu-xid-host-mode-down");
    let kinds: Vec<_> = sim
        .actions
        .iter()
        .map(|a| (a.action.kind(), a.action.target().to_string()))
        .collect();
    assert_eq!(
        kinds,
        [
            (ActionKind::SlurmDown, "slurm:gpu-002/state".to_owned()),
            (ActionKind::SlurmResume, "slurm:gpu-002/state".to_owned())
        ]
    );
}

#[test]
fn mass_not_ready_is_rate_bound() {
    let sim = build("mass-not-ready-rate-bound");
    let times: Vec<_> = sim
        .actions
        .iter()
        .filter(|a| a.action.kind() == ActionKind::SlurmDrain)
        .map(|a| a.time_ms)
        .collect();
    assert_eq!(times.len(), 6, "all drained in the end");
    for w in times.windows(3) {
        assert!(
            w[2] - w[0] >= 60_000,
            "at most 2 health drains per minute: {times:?}"
        );
    }
    assert!(sim.transitions.iter().any(|t| t.rule == Rule::RateLimited));
}

#[test]
fn an_evicted_pod_drains_until_its_replacement_runs() {
    let sim = build("pod-evicted");
    assert_eq!(drains_of(&sim, "n1"), ["lockstep: pod slurm/n1 evicted"]);
    assert!(sim.transitions.iter().any(|t| t.rule == Rule::PodMissing));
    let resume = sim
        .actions
        .iter()
        .find(|a| a.action.kind() == ActionKind::SlurmResume)
        .unwrap();
    let replacement = sim
        .records()
        .iter()
        .rev()
        .find_map(|r| match r {
            lockstep_schemas::Record::Event(e) if matches!(&e.envelope.event, lockstep_schemas::Event::KubePod(p) if p.node_name.as_deref() == Some("k2") && p.name == "n1") => Some(e.seq),
            _ => None,
        })
        .unwrap();
    assert_eq!(resume.seq, replacement);
}

fn kinds_on(sim: &Sim, kind: ActionKind) -> Vec<&lockstep_schemas::IssuedAction> {
    sim.actions
        .iter()
        .filter(|a| a.action.kind() == kind)
        .collect()
}

fn replicas_set(sim: &Sim) -> Vec<u32> {
    kinds_on(sim, ActionKind::KubeScale)
        .iter()
        .map(|a| match a.action {
            Action::KubeScale { replicas, .. } => replicas,
            _ => unreachable!(),
        })
        .collect()
}

fn deleted_pods(sim: &Sim) -> Vec<String> {
    kinds_on(sim, ActionKind::KubeDeletePod)
        .iter()
        .map(|a| match &a.action {
            Action::KubeDeletePod { pod, .. } => pod.clone(),
            _ => unreachable!(),
        })
        .collect()
}

fn event_seq(sim: &Sim, f: impl Fn(&lockstep_schemas::Event) -> bool) -> u64 {
    sim.records()
        .iter()
        .find_map(|r| match r {
            lockstep_schemas::Record::Event(e) if f(&e.envelope.event) => Some(e.seq),
            _ => None,
        })
        .expect("the event is in the log")
}

#[test]
fn a_burst_of_pending_jobs_scales_up_once_counting_only_jobs_nodes_can_help() {
    let sim = build("scale-up-burst");
    // 2 + 2 + 3 nodes pending with Resources/Priority; the held (Dependency)
    // job and the other partition's job do not count.
    assert_eq!(replicas_set(&sim), [7]);
    assert_eq!(sim.sets["gpu"].replicas, 7);
    assert!(deleted_pods(&sim).is_empty());
}

#[test]
fn an_idle_queue_scales_in_the_top_ordinals_through_drain_then_fewer_replicas() {
    let sim = build("idle-scale-in");
    assert!(
        deleted_pods(&sim).is_empty(),
        "a StatefulSet removes its pods itself when replicas drop"
    );
    assert_eq!(replicas_set(&sim), [1]);
    assert_eq!(sim.sets["gpu"].replicas, 1);
    let mut drained: Vec<&str> = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        .into_iter()
        .filter(|n| !drains_of(&sim, n).is_empty())
        .collect();
    drained.sort();
    assert_eq!(drained, ["gpu-1", "gpu-2", "gpu-3"], "the top ordinals");
    // Lowered only after each ordinal it removes showed DRAIN in Slurm.
    let lowered = kinds_on(&sim, ActionKind::KubeScale)[0].seq;
    for pod in drained {
        let drained_at = event_seq(
            &sim,
            |e| matches!(e, lockstep_schemas::Event::SlurmNode(n) if n.name == pod && n.flags.contains(&lockstep_schemas::SlurmNodeFlag::Drain)),
        );
        assert!(drained_at < lowered, "{pod}");
    }
}

#[test]
fn a_victim_that_gets_a_job_is_let_go_and_removed_only_after_the_job_ends() {
    let sim = build("victim-gets-a-job");
    let job_end = event_seq(&sim, |e| {
        matches!(e, lockstep_schemas::Event::SlurmJobGone { job_id: 31, .. })
    });
    assert!(deleted_pods(&sim).is_empty());
    // Its drain was lifted while the job ran (it is the top ordinal: nothing
    // can be scaled in below it), and the audit trail says why.
    let resumed = kinds_on(&sim, ActionKind::SlurmResume);
    assert!(!resumed.is_empty() && resumed[0].seq < job_end);
    assert!(sim
        .transitions
        .iter()
        .any(|t| t.rule == Rule::ScaleInBlocked
            && t.node == "gpu-1"
            && t.detail.contains("runs 1 job(s)")));
    let lowered = kinds_on(&sim, ActionKind::KubeScale);
    assert!(!lowered.is_empty());
    assert!(
        lowered.iter().all(|d| d.seq > job_end),
        "replicas not lowered while job 31 ran"
    );
    assert_eq!(sim.sets["gpu"].replicas, 1);
}

#[test]
fn demand_returning_cancels_the_scale_in_instead_of_adding_nodes() {
    let sim = build("demand-returns-during-scale-in");
    assert!(deleted_pods(&sim).is_empty());
    assert!(replicas_set(&sim).is_empty(), "neither down nor back up");
    assert_eq!(kinds_on(&sim, ActionKind::SlurmResume).len(), 2);
    assert_eq!(sim.sets["gpu"].replicas, 3);
}

#[test]
fn nothing_is_removed_while_slurm_is_invisible() {
    let sim = build("slurm-invisible-during-scale-in");
    let lost = event_seq(&sim, |e| {
        matches!(
            e,
            lockstep_schemas::Event::ConnectorStatus { visible: false, .. }
        )
    });
    let back = event_seq(&sim, |e| {
        matches!(
            e,
            lockstep_schemas::Event::ConnectorStatus { visible: true, .. }
        )
    });
    assert!(deleted_pods(&sim).is_empty());
    let lowered = kinds_on(&sim, ActionKind::KubeScale);
    assert_eq!(lowered.len(), 1);
    assert!(lowered[0].seq >= back && !(lost..back).contains(&lowered[0].seq));
}

#[test]
fn features_and_topology_follow_the_pod_to_another_block() {
    let sim = build("pod-moves-to-another-block");
    let got: Vec<String> = sim
        .actions
        .iter()
        .filter_map(|a| match &a.action {
            Action::SlurmSetFeatures { features, .. } => {
                Some(format!("features {}", features.join(",")))
            }
            Action::SlurmSetTopology { topology, .. } => Some(format!("topology {topology}")),
            _ => None,
        })
        .collect();
    assert_eq!(
        got,
        [
            "features zone-a",
            "topology blocks:b1",
            "features zone-b",
            "topology blocks:b7",
            "topology blocks:b8"
        ]
    );
}

#[test]
fn an_invalid_topology_label_never_reaches_slurm() {
    let sim = build("invalid-topology-label");
    let topologies: Vec<_> = sim
        .actions
        .iter()
        .filter_map(|a| match &a.action {
            Action::SlurmSetTopology { topology, .. } => Some(topology.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(topologies, ["blocks:block3"]);
    let reports: Vec<_> = sim
        .transitions
        .iter()
        .filter(|t| t.rule == Rule::TopologyInvalid)
        .collect();
    assert_eq!(
        reports.len(),
        2,
        "the empty value, then the one with a space"
    );
    assert!(
        reports[1]
            .detail
            .contains("\"block 3!\" is not a valid topology unit"),
        "{}",
        reports[1].detail
    );
}

#[test]
fn a_new_revision_replaces_pods_one_at_a_time_busy_ones_last() {
    let sim = build("rolling-replacement");
    let deleted = deleted_pods(&sim);
    assert_eq!(deleted, ["gpu-2", "gpu-1", "gpu-0"]);
    let job_end = event_seq(&sim, |e| {
        matches!(e, lockstep_schemas::Event::SlurmJobGone { job_id: 51, .. })
    });
    assert!(
        kinds_on(&sim, ActionKind::KubeDeletePod)[2].seq > job_end,
        "gpu-0 ran a job"
    );
    assert!(sim
        .pods
        .values()
        .all(|p| p.revision.as_deref() == Some("rev-2")));
    assert!(replicas_set(&sim).is_empty());
}

#[test]
fn stale_observations_re_delivered_change_nothing() {
    let sim = build("stale-observation-redelivered");
    // One drain for the cordon, one resume for the uncordon, and nothing
    // after the old cordon came again.
    assert_eq!(
        drains_of(&sim, "n1"),
        ["lockstep: kubernetes node k1 cordoned"]
    );
    assert_eq!(count(&sim, ActionKind::SlurmResume, "n1"), 1);
    assert_eq!(sim.phase("n1"), Phase::InService);
    // The busy label went on with the job and off after it, once each.
    let labels: Vec<_> = kinds_on(&sim, ActionKind::KubeLabelPod)
        .iter()
        .map(|a| match &a.action {
            Action::KubeLabelPod { pod, value, .. } => (pod.clone(), value.clone()),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(
        labels,
        [
            ("n2".to_owned(), Some("true".to_owned())),
            ("n2".to_owned(), None)
        ]
    );
    assert!(!sim.pods["slurm/n2"]
        .labels
        .contains_key("lockstep.io/slurm-busy"));
    assert_eq!(sim.engine().jobs_on("n2"), 0);
    // Both copies are in the log, after everything else they describe.
    let copies = sim
        .records()
        .iter()
        .filter_map(|r| match r {
            lockstep_schemas::Record::Event(e) => Some(e.envelope.id.clone()),
            _ => None,
        })
        .fold(std::collections::BTreeMap::<_, u32>::new(), |mut m, id| {
            *m.entry(id).or_default() += 1;
            m
        })
        .into_values()
        .filter(|&n| n > 1)
        .count();
    assert_eq!(copies, 2);
}

#[test]
fn a_replacement_lifts_the_drain_only_once_running_and_ready() {
    let sim = build("replacement-pending-keeps-drain");
    assert_eq!(drains_of(&sim, "n1"), ["lockstep: pod slurm/n1 evicted"]);
    let resumes = kinds_on(&sim, ActionKind::SlurmResume);
    assert_eq!(resumes.len(), 1);
    let ready = event_seq(
        &sim,
        |e| matches!(e, lockstep_schemas::Event::KubePod(p) if p.name == "n1" && p.node_name.as_deref() == Some("k2") && p.running_and_ready()),
    );
    assert_eq!(
        resumes[0].seq, ready,
        "resumed when the replacement was Ready"
    );
    // Pending and Running-but-not-Ready kept it drained for the missing pod.
    let pending = event_seq(
        &sim,
        |e| matches!(e, lockstep_schemas::Event::KubePod(p) if p.name == "n1" && p.node_name.as_deref() == Some("k2")),
    );
    assert!(sim
        .transitions
        .iter()
        .filter(|t| t.node == "n1" && t.seq >= pending && t.seq < ready)
        .all(|t| t.rule == Rule::PodMissing));
    assert_eq!(sim.phase("n1"), Phase::InService);
}

#[test]
fn a_force_deleted_pod_drains_until_its_replacement_is_ready() {
    let sim = build("pod-force-deleted");
    for n in ["n1", "n2"] {
        assert_eq!(
            drains_of(&sim, n),
            ["lockstep: slurmd pod gone, waiting for its replacement"],
            "{n}"
        );
        assert_eq!(count(&sim, ActionKind::SlurmResume, n), 1, "{n}");
        assert_eq!(sim.phase(n), Phase::InService, "{n}");
    }
    assert!(drains_of(&sim, "n3").is_empty());
    // n2 drained on the relist that found its pod missing.
    let relist_done = event_seq(&sim, |e| {
        matches!(
            e,
            lockstep_schemas::Event::SyncDone {
                domain: lockstep_schemas::Domain::KubePods
            }
        )
    });
    let drain = sim
        .actions
        .iter()
        .find(|a| matches!(&a.action, Action::SlurmDrain { node, .. } if node == "n2"))
        .unwrap();
    assert_eq!(drain.seq, relist_done);
}

#[test]
fn a_deleted_kubernetes_node_keeps_its_slurm_node_drained_until_it_is_back() {
    let sim = build("kube-node-deleted");
    // Cordoned first, then the reason says the node is gone.
    assert_eq!(
        drains_of(&sim, "gpu-001"),
        [
            "lockstep: kubernetes node gpu-001 cordoned",
            "lockstep: kubernetes node gpu-001 deleted"
        ]
    );
    assert_eq!(
        drains_of(&sim, "gpu-002"),
        ["lockstep: kubernetes node gpu-002 deleted"]
    );
    assert!(drains_of(&sim, "gpu-003").is_empty());
    // gpu-001 resumed only after it was Ready again (and healthy for
    // resume_after_s); gpu-002 never came back.
    let ready = sim
        .last_seq_where(|e| {
            matches!(e, lockstep_schemas::Event::KubeNode(n) if n.name == "gpu-001" && n.ready == lockstep_schemas::ConditionStatus::True)
        })
        .unwrap();
    let gone = event_seq(
        &sim,
        |e| matches!(e, lockstep_schemas::Event::KubeNodeGone { name, .. } if name == "gpu-001"),
    );
    assert!(ready > gone);
    let resumes = kinds_on(&sim, ActionKind::SlurmResume);
    assert_eq!(resumes.len(), 1);
    assert!(matches!(&resumes[0].action, Action::SlurmResume { node } if node == "gpu-001"));
    assert!(resumes[0].seq > ready);
    assert_eq!(sim.phase("gpu-001"), Phase::InService);
    assert_eq!(sim.phase("gpu-002"), Phase::Drained);
    assert_eq!(
        sim.slurm["gpu-002"].reason.as_deref(),
        Some("lockstep: kubernetes node gpu-002 deleted")
    );
}

fn scale_ins(sim: &Sim) -> Vec<(u64, u32)> {
    kinds_on(sim, ActionKind::KubeScale)
        .iter()
        .map(|a| match a.action {
            Action::KubeScale { replicas, .. } => (a.seq, replicas),
            _ => unreachable!(),
        })
        .collect()
}

#[test]
fn a_busy_top_ordinal_stops_a_statefulset_scale_in_until_it_is_idle() {
    let sim = build("statefulset-busy-top-ordinal");
    let job_end = event_seq(&sim, |e| {
        matches!(e, lockstep_schemas::Event::SlurmJobGone { job_id: 62, .. })
    });
    // Nothing drained or lowered while ordinal 4 ran job 62, and the audit
    // trail says why.
    for a in &sim.actions {
        assert!(a.seq > job_end, "{} before job 62 ended", a.id);
    }
    assert!(sim
        .transitions
        .iter()
        .any(|t| t.rule == Rule::ScaleInBlocked
            && t.node == "gpu-4"
            && t.seq < job_end
            && t.detail.contains("highest ordinals")));
    // Then the top ordinals, and only they, went: by lowering replicas.
    let mut drained: Vec<String> = kinds_on(&sim, ActionKind::SlurmDrain)
        .iter()
        .map(|a| match &a.action {
            Action::SlurmDrain { node, .. } => node.clone(),
            _ => unreachable!(),
        })
        .collect();
    drained.sort();
    assert_eq!(drained, ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]);
    assert!(deleted_pods(&sim).is_empty());
    assert_eq!(replicas_set(&sim), [1]);
    assert!(sim.pods.contains_key("slurm/gpu-0"));
    assert_eq!(sim.engine().jobs_on("gpu-0"), 1, "job 61 still runs");
}

#[test]
fn a_replicaset_scales_in_its_idle_pods_by_deletion_cost() {
    let sim = build("replicaset-scale-in-by-deletion-cost");
    let marked: Vec<String> = kinds_on(&sim, ActionKind::KubeLabelPod)
        .iter()
        .filter_map(|a| match &a.action {
            Action::KubeLabelPod {
                pod, key, value, ..
            } if key == "annotation:controller.kubernetes.io/pod-deletion-cost"
                && value.as_deref() == Some("-2147483648") =>
            {
                Some(pod.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(marked, ["web-1", "web-2", "web-3"]);
    assert!(deleted_pods(&sim).is_empty());
    let lowered = scale_ins(&sim);
    assert_eq!(lowered.iter().map(|l| l.1).collect::<Vec<_>>(), [1]);
    // Marked only once drained, lowered only once marked.
    for pod in ["web-1", "web-2", "web-3"] {
        let drained = event_seq(
            &sim,
            |e| matches!(e, lockstep_schemas::Event::SlurmNode(n) if n.name == pod && n.flags.contains(&lockstep_schemas::SlurmNodeFlag::Drain)),
        );
        let mark = kinds_on(&sim, ActionKind::KubeLabelPod)
            .iter()
            .find(|a| matches!(&a.action, Action::KubeLabelPod { pod: p, .. } if p == pod))
            .unwrap()
            .seq;
        assert!(drained < mark && mark < lowered[0].0, "{pod}");
    }
    // The busy newest pod stayed, with its job.
    assert_eq!(
        sim.pods.keys().cloned().collect::<Vec<_>>(),
        ["slurm/web-4"]
    );
    assert_eq!(sim.engine().jobs_on("web-4"), 1);
}

#[test]
fn returning_demand_stops_a_scale_in_also_after_victims_are_gone() {
    let sim = build("demand-returns-after-pods-gone");
    let demand = event_seq(
        &sim,
        |e| matches!(e, lockstep_schemas::Event::SlurmJob(j) if j.job_id == 83),
    );
    let scales = scale_ins(&sim);
    // Lowered once (web-4..6 gone), then up to the demand: never below it.
    assert_eq!(scales.iter().map(|s| s.1).collect::<Vec<_>>(), [3, 5]);
    assert!(scales[0].0 < demand && scales[1].0 == demand);
    // web-2 and web-3 were marked, then let go: unmarked and resumed.
    for pod in ["web-2", "web-3"] {
        assert_eq!(count(&sim, ActionKind::SlurmResume, pod), 1, "{pod}");
        assert!(!sim.pods[&format!("slurm/{pod}")]
            .labels
            .contains_key("annotation:controller.kubernetes.io/pod-deletion-cost"));
        assert_eq!(sim.phase(pod), Phase::InService);
    }
    assert_eq!(sim.sets["web"].replicas, 5);
}

#[test]
fn no_scale_in_drain_outlives_the_scale_in() {
    let sim = build("recreated-pod-of-settled-victim");
    // gpu-1..3 kept their drain while their pods were gone (static nodes),
    // and were resumed once their pods came back with the scale-up.
    for n in ["gpu-1", "gpu-2", "gpu-3"] {
        assert_eq!(
            drains_of(&sim, n),
            ["lockstep: scale-in"],
            "{n}: drained once"
        );
        assert_eq!(count(&sim, ActionKind::SlurmResume, n), 1, "{n}");
        assert_eq!(sim.phase(n), Phase::InService, "{n}");
        assert_eq!(sim.slurm[n].reason, None, "{n}");
    }
    assert_eq!(sim.sets["gpu"].replicas, 5);
}

#[test]
fn a_policy_change_removes_what_lockstep_set_under_the_old_names() {
    let sim = build("policy-change-cleans-up");
    let changed = event_seq(
        &sim,
        |e| matches!(e, lockstep_schemas::Event::PolicyChanged(p) if p.drain.reason_prefix == "ls:"),
    );
    // The unhealthy taint lockstep put on k1 is gone.
    assert!(sim.kube["k1"].taints.is_empty());
    assert!(kinds_on(&sim, ActionKind::KubeUntaintNode)
        .iter()
        .any(|a| a.seq == changed));
    // The old health condition is left Unknown, the new one carries the news.
    let n1 = &sim.pods["slurm/n1"];
    let old = n1
        .conditions
        .iter()
        .find(|c| c.type_ == "SlurmNodeHealthy")
        .unwrap();
    assert_eq!(
        (old.status, old.reason.as_str()),
        (
            lockstep_schemas::ConditionStatus::Unknown,
            "LockstepNotManaged"
        )
    );
    let new = n1
        .conditions
        .iter()
        .find(|c| c.type_ == "SlurmHealthy")
        .unwrap();
    assert_eq!(new.status, lockstep_schemas::ConditionStatus::False);
    // The busy label moved to its new name.
    let n3 = &sim.pods["slurm/n3"].labels;
    assert!(!n3.contains_key("lockstep.io/busy"));
    assert_eq!(
        n3.get("lockstep.io/slurm-busy").map(String::as_str),
        Some("true")
    );
    // The drain made under the old prefix was still lockstep's: resumed.
    assert_eq!(count(&sim, ActionKind::SlurmResume, "n2"), 1);
    assert_eq!(sim.phase("n2"), Phase::InService);
    // The cleanup actions name the rule that wanted them.
    assert!(sim
        .actions
        .iter()
        .any(|a| a.seq == changed && a.rule == "policy.retired"));
}

#[test]
fn a_label_the_policy_starts_to_read_is_not_acted_on_until_observed() {
    let sim = build("policy-adds-feature-label");
    let relist = event_seq(&sim, |e| {
        matches!(
            e,
            lockstep_schemas::Event::SyncDone {
                domain: lockstep_schemas::Domain::KubeNodes
            }
        )
    });
    let sets: Vec<_> = kinds_on(&sim, ActionKind::SlurmSetFeatures)
        .iter()
        .map(|a| match &a.action {
            Action::SlurmSetFeatures { node, features } => (a.seq, node.clone(), features.clone()),
            _ => unreachable!(),
        })
        .collect();
    // Nothing stripped the rack features before or after the relist; only
    // the label that changed afterwards changed one.
    assert_eq!(sets.len(), 1, "{sets:?}");
    assert!(sets[0].0 > relist);
    assert_eq!(sets[0].1, "n3");
    assert_eq!(sets[0].2, ["rack-r9", "zone-a"]);
    for (n, rack) in [("n1", "rack-r1"), ("n2", "rack-r2")] {
        assert!(sim.slurm[n].features.contains(&rack.into()), "{n}");
    }
}

#[test]
fn slurm_to_kubernetes_is_damped_and_a_drained_node_that_stops_answering_shows_unhealthy() {
    let sim = build("slurm-blip-damped");
    let health_writes = |pod: &str| {
        kinds_on(&sim, ActionKind::KubeSetPodCondition)
            .iter()
            .filter(|a| matches!(&a.action, Action::KubeSetPodCondition { pod: p, .. } if p == pod))
            .count()
    };
    // The 45 s blip on all eight nodes wrote nothing: the first writes come
    // with the outage, after its grace period.
    let outage = sim
        .records()
        .iter()
        .filter_map(|r| match r {
            lockstep_schemas::Record::Event(e) => Some(e),
            _ => None,
        })
        .filter(|e| matches!(&e.envelope.event, lockstep_schemas::Event::SlurmNode(n) if n.name == "n1" && n.flags.contains(&lockstep_schemas::SlurmNodeFlag::NotResponding)))
        .nth(1)
        .unwrap()
        .clone();
    let first = sim.actions.iter().map(|a| a.time_ms).min().unwrap();
    assert_eq!(first - outage.time_ms, 60_000, "after the grace period");
    // Six nodes out: marked at most four a minute.
    let taints: Vec<u64> = kinds_on(&sim, ActionKind::KubeTaintNode)
        .iter()
        .map(|a| a.time_ms)
        .collect();
    for w in taints.windows(5) {
        assert!(w[4] - w[0] >= 60_000, "{taints:?}");
    }
    for n in ["n1", "n2", "n3", "n4", "n5", "n6"] {
        assert_eq!(health_writes(n), 2, "{n}: unhealthy, then healthy");
    }
    // n7, drained by lockstep, then silent: shown unhealthy.
    let n7 = sim.pods["slurm/n7"]
        .conditions
        .iter()
        .find(|c| c.type_ == "SlurmNodeHealthy")
        .unwrap();
    assert_eq!(
        (n7.status, n7.reason.as_str()),
        (
            lockstep_schemas::ConditionStatus::False,
            "SlurmNotResponding"
        )
    );
    assert!(!sim.kube["k7"].taints.is_empty());
    // n8 flapped: the third time it stayed shown for the flap hold.
    let n8: Vec<_> = kinds_on(&sim, ActionKind::KubeUntaintNode)
        .iter()
        .filter(|a| matches!(&a.action, Action::KubeUntaintNode { node, .. } if node == "k8"))
        .map(|a| a.time_ms)
        .collect();
    let back = sim
        .last_seq_where(|e| matches!(e, lockstep_schemas::Event::SlurmNode(n) if n.name == "n8"))
        .unwrap();
    let back_ms = sim
        .records()
        .iter()
        .find_map(|r| match r {
            lockstep_schemas::Record::Event(e) if e.seq == back => Some(e.time_ms),
            _ => None,
        })
        .unwrap();
    assert_eq!(n8.len(), 3);
    assert!(n8[2] - back_ms >= 600_000, "held for flap_hold_s");
    assert!(sim.kube["k8"].taints.is_empty());
}

#[test]
fn drains_show_on_the_kubernetes_nodes_and_are_taken_back() {
    use lockstep_schemas::ConditionStatus::False;
    let sim = build("drains-shown-on-nodes");
    let epoch = lockstep_replay_tests::EPOCH_MS;
    let t = |s: u64| epoch + s * 1000;
    // Every write to a Kubernetes node, in order: (time, node, what).
    let writes: Vec<(u64, String, String)> = sim
        .actions
        .iter()
        .filter_map(|a| match &a.action {
            Action::KubeSetNodeCondition { node, condition } => Some((
                a.time_ms,
                node.clone(),
                format!(
                    "{}={:?} {} {}",
                    condition.type_, condition.status, condition.reason, condition.message
                )
                .trim_end()
                .to_owned(),
            )),
            Action::KubeLabelNode { node, key, value } => {
                Some((a.time_ms, node.clone(), format!("{key}={value:?}")))
            }
            _ => None,
        })
        .collect();
    let w = |s: u64, node: &str, what: &str| (t(s), node.to_owned(), what.to_owned());
    let a = "annotation:lockstep.dev/slurm-nodes";
    assert_eq!(
        writes,
        [
            // The story adds the Slurm nodes one by one: the first is
            // named at once, the second once the first write is done.
            w(0, "k1", &format!("{a}=Some(\"n1\")")),
            w(0, "k2", &format!("{a}=Some(\"n3\")")),
            w(10, "k1", &format!("{a}=Some(\"n1,n2\")")),
            w(10, "k2", &format!("{a}=Some(\"n3,n4\")")),
            w(60, "k1", "DrainInProgress=True LockstepSlurmDrain lockstep drains the Slurm nodes on this node; jobs still run"),
            w(60, "k1", "Drained=False LockstepSlurmDrain lockstep drains the Slurm nodes on this node; jobs still run"),
            w(660, "k1", "DrainInProgress=False LockstepSlurmDrain lockstep drained the Slurm nodes on this node; no job runs"),
            w(660, "k1", "Drained=True LockstepSlurmDrain lockstep drained the Slurm nodes on this node; no job runs"),
            w(720, "k2", "SlurmNodeDrained=True SlurmDrain n3: NVSwitch RMA"),
            w(780, "k2", "SlurmNodeDrained=True SlurmDrain n3: NVSwitch RMA; n4: fan failure"),
            w(1200, "k1", "Drained=False LockstepSlurmDrain lockstep does not drain the Slurm nodes on this node"),
            w(1800, "k2", "SlurmNodeDrained=True SlurmDrain n4: fan failure"),
            w(1860, "k2", "SlurmNodeDrained=False SlurmNotDrained"),
            w(1920, "k1", &format!("{a}=Some(\"n1\")")),
            // n3's slurmd stops answering at 03:33; shown after the 60 s grace.
            w(2040, "k2", "SlurmNodeDrained=True SlurmDrain n3: Not responding"),
            // 03:35:30 a policy renames the annotation and drops the condition.
            w(2130, "k1", &format!("{a}=None")),
            w(2130, "k1", "annotation:example.com/slurm=Some(\"n1\")"),
            w(2130, "k2", "SlurmNodeDrained=Unknown LockstepNotManaged lockstep no longer manages this condition"),
            w(2130, "k2", &format!("{a}=None")),
            w(2130, "k2", "annotation:example.com/slurm=Some(\"n3,n4\")"),
        ]
    );
    // What the nodes show at the end.
    let shown = |k: &str, ty: &str| {
        sim.kube[k]
            .conditions
            .iter()
            .find(|c| c.type_ == ty)
            .map(|c| c.status)
    };
    assert_eq!(shown("k1", "Drained"), Some(False));
    assert_eq!(shown("k1", "DrainInProgress"), Some(False));
    assert_eq!(
        shown("k2", "SlurmNodeDrained"),
        Some(lockstep_schemas::ConditionStatus::Unknown)
    );
    assert_eq!(
        shown("k2", "Drained"),
        None,
        "netops' drains are not lockstep's"
    );
    let renamed = "annotation:example.com/slurm";
    assert_eq!(sim.kube["k1"].labels.get(a), None);
    assert_eq!(
        sim.kube["k1"].labels.get(renamed).map(String::as_str),
        Some("n1")
    );
    assert_eq!(
        sim.kube["k2"].labels.get(renamed).map(String::as_str),
        Some("n3,n4")
    );
}

#[test]
fn a_node_back_as_another_machine_returns_once_its_health_check_passes() {
    let sim = build("replaced-node-waits-for-health");
    let epoch = lockstep_replay_tests::EPOCH_MS;
    let resumes = |n: &str| -> Vec<u64> {
        sim.actions
            .iter()
            .filter(|a| matches!(&a.action, Action::SlurmResume { node } if node == n))
            .map(|a| (a.time_ms - epoch) / 1000)
            .collect()
    };
    let held_at = |n: &str| -> Vec<u64> {
        sim.transitions
            .iter()
            .filter(|t| t.node == n && t.rule == Rule::ReturnGate)
            .map(|t| (t.time_ms - epoch) / 1000)
            .collect()
    };
    // gpu-001: registered again Ready at 03:08:20, held there; resumed when
    // the check is True on the new machine (03:11:20), not before.
    // Deleted again at 03:23:50 and back as another machine a second
    // later, before Slurm showed the drain sent for the deletion: held all
    // the same once the drain shows (03:23:51), resumed when the check is
    // True (03:26:21).
    assert_eq!(held_at("gpu-001"), [500, 1431]);
    assert_eq!(resumes("gpu-001"), [680, 1581]);
    // gpu-002: uncordoned at 03:15:20 after a reboot, the True from before
    // does not count; False at 03:17:50, True at 03:19:20: resumed then.
    assert_eq!(held_at("gpu-002"), [920]);
    assert_eq!(resumes("gpu-002"), [1160]);
    // gpu-003 rebooted in service: its later cordon cycle is not held.
    // Its Node is deleted at 03:27:51 and is back as another machine two
    // seconds later, the drain done in slurmctld but not polled until
    // 03:27:59: held then, resumed when the check is True (03:29:29).
    let (held, resumed) = (held_at("gpu-003"), resumes("gpu-003"));
    assert_eq!(held, [1679], "{resumed:?}");
    assert_eq!(resumed, [1340, 1769]);
}

#[test]
fn a_dra_device_fault_drains_the_slurm_nodes_it_concerns_naming_the_device() {
    let sim = build("gpu-fault-from-dra");
    let at = |kind: ActionKind, n: &str| state_actions_s(&sim, kind, n);
    // The tainted GPU of k1 takes both Slurm nodes there out, named.
    for n in ["n1", "n2"] {
        assert_eq!(drains_of(&sim, n), ["lockstep: kubernetes node k1 device gpu.nvidia.com/k1/gpu-3 gpu.nvidia.com/xid=79:NoSchedule"]);
        assert_eq!(at(ActionKind::SlurmDrain, n), [60]);
        // Cleared at 03:06, resumed resume_after_s later.
        assert_eq!(at(ActionKind::SlurmResume, n), [420]);
    }
    // The rule's taint on k2: out 03:03 to 03:05 (+60 s).
    assert_eq!(at(ActionKind::SlurmDrain, "n3"), [180]);
    assert_eq!(at(ActionKind::SlurmResume, "n3"), [360]);
    // The GPU unhealthy in n4's pod takes out n4 alone.
    assert_eq!(at(ActionKind::SlurmDrain, "n4"), [180, 540]);
    assert_eq!(at(ActionKind::SlurmResume, "n4"), [360, 900]);
    assert_eq!(
        drains_of(&sim, "n4").last().map(String::as_str),
        Some("lockstep: kubernetes node k2 device gpu.nvidia.com/k2/gpu-1 unhealthy")
    );
}

#[test]
fn an_eviction_goes_through_slurm_and_a_withdrawn_one_lifts_its_drain() {
    let sim = build("eviction-through-slurm");
    let epoch = lockstep_replay_tests::EPOCH_MS;
    let reports = |pod: &str| -> Vec<(u64, bool)> {
        sim.actions
            .iter()
            .filter_map(|a| match &a.action {
                Action::KubeRespondEviction {
                    pod: p, complete, ..
                } if p == pod => Some(((a.time_ms - epoch) / 1000, *complete)),
                _ => None,
            })
            .collect()
    };
    let at = |kind: ActionKind, n: &str| state_actions_s(&sim, kind, n);
    // n1 drains as soon as its eviction is requested, before lockstep's turn.
    assert_eq!(at(ActionKind::SlurmDrain, "n1"), [60]);
    assert_eq!(
        drains_of(&sim, "n1"),
        ["lockstep: pod slurm/n1 eviction requested"]
    );
    // Its turn at 03:01:10: a report, then one every 5 minutes while job
    // 1001 runs, none retried; complete as soon as the job ends (03:16).
    assert_eq!(
        reports("n1"),
        [
            (70, false),
            (300, false),
            (600, false),
            (900, false),
            (960, true)
        ]
    );
    assert!(
        at(ActionKind::SlurmResume, "n1").is_empty(),
        "the pod was evicted"
    );
    // n2's eviction is withdrawn at 03:04 while its job runs: resumed, never
    // completed.
    assert_eq!(at(ActionKind::SlurmDrain, "n2"), [120]);
    assert_eq!(at(ActionKind::SlurmResume, "n2"), [240]);
    assert!(reports("n2").iter().all(|(_, complete)| !complete));
}

#[test]
fn maintenance_reserves_ahead_drains_in_the_window_shows_progress_and_gives_back() {
    let sim = build("maintenance-window");
    let epoch = lockstep_replay_tests::EPOCH_MS;
    let at = |kind: ActionKind, target: &str| -> Vec<u64> {
        sim.actions
            .iter()
            .filter(|a| a.action.kind() == kind && a.action.target().to_string() == target)
            .map(|a| a.time_ms)
            .collect()
    };
    // The reservation is made at the announcement, 9 minutes ahead.
    let reserved = at(
        ActionKind::SlurmReserve,
        "slurm:reservation/lockstep_maint_k1",
    );
    assert_eq!(reserved, [epoch + 60_000]);
    // The drain comes at the window's start, not before.
    let window = "lockstep: maintenance 2026-03-01T03:10:00Z/2026-03-01T03:40:00Z";
    for n in ["n1", "n2"] {
        assert_eq!(drains_of(&sim, n), [window]);
        assert_eq!(
            at(ActionKind::SlurmDrain, &format!("slurm:{n}/state")),
            [epoch + 600_000]
        );
        assert_eq!(
            at(ActionKind::SlurmResume, &format!("slurm:{n}/state")),
            [epoch + 2_400_000]
        );
    }
    // k1 shows the drain's progress: in progress while job 1001 runs, done after.
    let conditions: Vec<(u64, String, lockstep_schemas::ConditionStatus)> = sim
        .actions
        .iter()
        .filter_map(|a| match &a.action {
            Action::KubeSetNodeCondition { node, condition } if node == "k1" => {
                Some((a.time_ms, condition.type_.clone(), condition.status))
            }
            _ => None,
        })
        .collect();
    use lockstep_schemas::ConditionStatus::{False, True};
    let t = |min: u64| epoch + min * 60_000;
    assert_eq!(
        conditions,
        [
            (t(10), "DrainInProgress".to_owned(), True),
            (t(10), "Drained".to_owned(), False),
            (t(15), "DrainInProgress".to_owned(), False),
            (t(15), "Drained".to_owned(), True),
            (t(40), "Drained".to_owned(), False),
        ]
    );
    // Released at the end; k2's, cancelled, released before its start; n3
    // never drained.
    assert_eq!(
        at(
            ActionKind::SlurmUnreserve,
            "slurm:reservation/lockstep_maint_k1"
        ),
        [t(40)]
    );
    assert_eq!(
        at(
            ActionKind::SlurmUnreserve,
            "slurm:reservation/lockstep_maint_k2"
        ),
        [t(5)]
    );
    assert!(drains_of(&sim, "n3").is_empty());
    assert!(sim.reservations.is_empty(), "{:?}", sim.reservations);
    assert_eq!(sim.phase("n1"), Phase::InService);
}

/// The outcomes the actuators reported, with the id of their action.
fn outcomes(sim: &Sim) -> Vec<(String, lockstep_schemas::OutcomeResult)> {
    sim.records()
        .iter()
        .filter_map(|r| match r {
            lockstep_schemas::Record::Event(e) => match &e.envelope.event {
                lockstep_schemas::Event::ActionOutcome(o) => {
                    Some((o.action_id.0.clone(), o.result.clone()))
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn declined(sim: &Sim) -> Vec<String> {
    outcomes(sim)
        .into_iter()
        .filter_map(|(id, r)| match r {
            lockstep_schemas::OutcomeResult::Declined { held_by } => {
                Some(format!("{id}: {held_by}"))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_drain_that_finds_an_admins_drain_leaves_it_and_the_uncordon_resumes_nothing() {
    let sim = build("admin-drain-lands-while-drain-in-flight");
    assert_eq!(
        declined(&sim),
        ["5.slurm_drain.slurm:n1/state: IDLE+DRAIN by netops: NVSwitch RMA"]
    );
    assert_eq!(count(&sim, ActionKind::SlurmResume, "n1"), 0);
    // Shown in Kubernetes as a drain by someone else, until netops resumes.
    let shown = sim.actions.iter().any(|a| {
        matches!(&a.action, Action::KubeSetPodCondition { condition, .. }
            if condition.type_ == "SlurmNodeDrained" && condition.message.contains("NVSwitch RMA"))
    });
    assert!(shown);
    assert_eq!(sim.phase("n1"), Phase::InService);
}

#[test]
fn seen_again_lockstep_waits_for_a_full_listing_and_resumes_no_drain_taken_over() {
    let sim = build("admins-act-while-slurm-unseen");
    let back = event_seq(&sim, |e| {
        matches!(
            e,
            lockstep_schemas::Event::ConnectorStatus { visible: true, .. }
        )
    });
    let listed = event_seq(&sim, |e| {
        matches!(
            e,
            lockstep_schemas::Event::SyncDone {
                domain: lockstep_schemas::Domain::SlurmJobs
            }
        )
    });
    assert!(back < listed);
    let slurm_actions: Vec<u64> = sim
        .actions
        .iter()
        .filter(|a| a.action.kind().connector() == lockstep_schemas::Connector::Slurm)
        .map(|a| a.seq)
        .filter(|&s| s >= back)
        .collect();
    assert!(
        slurm_actions.is_empty(),
        "Slurm actions after sight came back: {slurm_actions:?}"
    );
    assert_eq!(count(&sim, ActionKind::SlurmResume, "n1"), 0);
    assert_eq!(count(&sim, ActionKind::SlurmResume, "n2"), 0);
    assert_eq!(sim.phase("n1"), Phase::ForeignDrain);
    assert_eq!(sim.phase("n2"), Phase::ForeignDrain);
    assert_eq!(
        sim.slurm["n1"].reason.as_deref(),
        Some("disk replaced, keep out")
    );
    assert_eq!(sim.slurm["n2"].reason.as_deref(), Some("NVSwitch RMA"));
}

#[test]
fn admin_resumes_of_a_health_drain_are_not_counted_as_flaps() {
    let sim = build("admin-resumes-are-not-flaps");
    // One NotReady spell: one drain for it, three put back after an admin's resume.
    assert_eq!(count(&sim, ActionKind::SlurmDrain, "n1"), 4);
    let reapplied = sim
        .transitions
        .iter()
        .filter(|t| t.rule == Rule::Reapplied)
        .count();
    assert_eq!(reapplied, 3);
    assert!(!sim.transitions.iter().any(|t| t.rule == Rule::FlapHold));
    // Resumed resume_after_s (30 s) after the node is Ready again.
    let ready = sim
        .last_seq_where(|e| {
            matches!(e, lockstep_schemas::Event::KubeNode(n)
                if n.ready == lockstep_schemas::ConditionStatus::True && n.name == "k1")
        })
        .unwrap();
    let resume = sim
        .actions
        .iter()
        .find(|a| a.action.kind() == ActionKind::SlurmResume)
        .expect("resumed");
    let time_of = |seq: u64| {
        sim.records()
            .iter()
            .find_map(|r| match r {
                lockstep_schemas::Record::Event(e) if e.seq == seq => Some(e.time_ms),
                _ => None,
            })
            .unwrap()
    };
    let waited_s = (resume.time_ms - time_of(ready)) / 1000;
    assert!((30..=40).contains(&waited_s), "resumed after {waited_s} s");
    assert_eq!(sim.phase("n1"), Phase::InService);
}

#[test]
fn a_cordon_cycle_does_not_end_a_flap_hold() {
    let sim = build("cordon-cycle-keeps-flap-hold");
    let uncordon = sim
        .transitions
        .iter()
        .rposition(|t| t.rule == Rule::Cordoned)
        .expect("cordoned");
    // After the uncordon the node is held, not resumed.
    let next = &sim.transitions[uncordon + 1];
    assert_eq!(next.rule, Rule::FlapHold, "{next:?}");
    let resumes: Vec<u64> = sim
        .actions
        .iter()
        .filter(|a| a.action.kind() == ActionKind::SlurmResume)
        .map(|a| a.time_ms)
        .collect();
    let last_drain = sim
        .actions
        .iter()
        .filter(|a| a.action.kind() == ActionKind::SlurmDrain)
        .map(|a| a.time_ms)
        .max()
        .unwrap();
    // Three resumes after the first three spells, the fourth at the hold's end.
    assert_eq!(resumes.len(), 4);
    assert!(resumes[3] >= last_drain + 1_800_000, "{resumes:?}");
    assert_eq!(sim.phase("n1"), Phase::InService);
}

#[test]
fn a_rollout_counts_a_pulling_successor_as_unavailable() {
    let sim = build("rollout-waits-for-pulling-pods");
    let replaced: Vec<u64> = sim
        .actions
        .iter()
        .filter(|a| a.rule == Rule::Replace.name() && a.action.kind() == ActionKind::SlurmDrain)
        .map(|a| a.seq)
        .collect();
    assert_eq!(replaced.len(), 6, "every pod replaced once");
    // The first successors run only once their image is pulled; until then
    // no third pod is taken out (max_unavailable 2).
    let first_back = event_seq(&sim, |e| {
        matches!(e, lockstep_schemas::Event::KubePod(p)
            if p.revision.as_deref() == Some("rev-2") && p.running_and_ready())
    });
    let before = replaced.iter().filter(|&&s| s < first_back).count();
    assert_eq!(
        before, 2,
        "replacements before a successor serves: {replaced:?}"
    );
    for n in ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"] {
        assert_eq!(sim.phase(n), Phase::InService, "{n}");
    }
}

#[test]
fn lockstep_and_slinky_never_fight_and_nothing_stays_out() {
    let sim = build("slinky-beside-lockstep");
    // Slinky's drain and its preStop DOWN each landed before lockstep's
    // write: both left as they were.
    assert_eq!(
        declined(&sim),
        [
            "8.slurm_drain.slurm:n1/state: IDLE+DRAIN by slurm: slurm-operator: Node (k1) was cordoned, Pod (slurm/n1) must be cordoned",
            "25.slurm_drain.slurm:n2/state: DOWN by slurm: slurm-operator: Pod is terminating",
        ]
    );
    // lockstep resumed only its own drain (n2 after the cordon), never
    // Slinky's drain or DOWN; its reasons never replaced Slinky's.
    assert_eq!(count(&sim, ActionKind::SlurmResume, "n1"), 0);
    assert_eq!(count(&sim, ActionKind::SlurmResume, "n2"), 1);
    assert_eq!(sim.phase("n1"), Phase::InService);
    assert_eq!(sim.phase("n2"), Phase::InService);
}
