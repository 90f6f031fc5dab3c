//! The metrics' count of the model taken a part at a time
//! (`Engine::stats_part`) adds up to the count taken at once
//! (`Engine::stats`), whatever the number of parts.

use std::collections::BTreeMap;

mod common;

use lockstep_engine::{Engine, Output, Stats, STATS_PARTS_MAX};
use lockstep_schemas::{
    Envelope, Event, EventRecord, Policy, SlurmBaseState, SlurmJob, SlurmJobState, SlurmNode,
    SlurmNodeFlag, SlurmPartition, Source,
};

/// A model of 3,000 Slurm nodes in two partitions (some in none), in
/// several states, on 1,500 Kubernetes nodes of which every fifth is
/// cordoned (drains in flight), and 2,000 jobs, most pending, one
/// partition of them unknown to Slurm's partition list.
fn events() -> Vec<Event> {
    let mut events = vec![Event::PolicyChanged(Box::default())];
    events.extend(common::both_visible());
    for p in ["batch", "gpu"] {
        events.push(Event::SlurmPartition(SlurmPartition {
            name: p.into(),
            nodes: vec![],
            version: 0,
        }));
    }
    for i in 0..3_000u32 {
        let (state, flags) = match i % 7 {
            0 => (SlurmBaseState::Allocated, vec![]),
            1 => (SlurmBaseState::Down, vec![]),
            2 => (SlurmBaseState::Idle, vec![SlurmNodeFlag::Drain]),
            3 => (SlurmBaseState::Mixed, vec![SlurmNodeFlag::Drain]),
            _ => (SlurmBaseState::Idle, vec![]),
        };
        let partitions = match i % 3 {
            0 => vec!["batch".into()],
            1 => vec!["batch".into(), "gpu".into()],
            _ => vec![],
        };
        events.push(Event::SlurmNode(SlurmNode {
            name: format!("n{i}").into(),
            state,
            flags,
            reason: (i % 7 >= 2 && i % 7 <= 3).then(|| "admin".into()),
            reason_user: None,
            features: vec![],
            topology: None,
            partitions,
            version: 0,
        }));
    }
    for k in 0..1_500u32 {
        events.push(Event::KubeNode(common::kube_node(
            &format!("k{k}"),
            k % 5 == 0,
            BTreeMap::new(),
        )));
    }
    for i in 0..3_000u32 {
        events.push(Event::KubePod(common::running_pod(
            &format!("n{i}"),
            &format!("u{i}"),
            &format!("k{}", i / 2),
        )));
    }
    for j in 0..2_000u64 {
        events.push(Event::SlurmJob(SlurmJob {
            job_id: j + 1,
            state: if j % 4 == 0 {
                SlurmJobState::Running
            } else {
                SlurmJobState::Pending
            },
            partition: ["batch", "gpu", "elsewhere"][(j % 3) as usize].into(),
            nodes: vec![],
            node_count: 1,
            pending_reason: Some("Resources".into()),
            version: 0,
        }));
    }
    events
}

fn engine() -> Engine {
    let mut engine = Engine::new(Policy::default());
    let mut out = Output::default();
    for (i, event) in events().into_iter().enumerate() {
        let rec = EventRecord {
            seq: i as u64 + 1,
            time_ms: 1_000 + i as u64,
            envelope: Envelope::new(Source::Test, 1_000 + i as u64, event),
        };
        out.clear();
        engine.apply(&rec, &mut out);
    }
    engine
}

#[test]
fn the_count_taken_in_parts_adds_up_to_the_count_taken_at_once() {
    let engine = engine();
    let whole = engine.stats();
    // Not a count of nothing: every kind of figure is there.
    assert_eq!(whole.phases.values().sum::<u64>(), 3_000, "{whole:?}");
    assert!(whole.in_flight.values().sum::<u64>() > 0, "{whole:?}");
    assert!(!whole.drains.is_empty(), "{whole:?}");
    assert!(whole.slurm_nodes.keys().any(|(p, _)| p.is_empty()));
    assert_eq!(whole.pending_jobs.get("elsewhere"), Some(&500));
    assert!(whole.pending_nodes.contains_key("elsewhere"));
    assert_eq!(engine.stats_parts(), 1, "a small model is counted at once");
    let mut parts = 1;
    while parts <= STATS_PARTS_MAX {
        let mut merged = Stats::default();
        for part in 0..parts {
            let counted = engine.stats_part(part, parts);
            if parts > 1 {
                assert!(
                    counted.phases.values().sum::<u64>() < 3_000,
                    "part {part} of {parts} counts only its share"
                );
            }
            merged.merge(counted);
        }
        assert_eq!(merged, whole, "in {parts} parts");
        parts *= 2;
    }
}
