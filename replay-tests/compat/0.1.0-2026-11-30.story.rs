//! The program that wrote 0.1.0-2026-11-30.{jsonl,msgpack}, as a test run
//! against commit 142c1c2 of replay-tests (COMPAT_OUT=<stem> cargo test --test
//! gen_compat). Kept as a record of what the log holds; not built, and never to
//! be rerun to replace the log (see README.md).

use std::collections::BTreeSet;

use lockstep_replay_tests::Sim;
use lockstep_schemas::log::{Format, LogWriter};
use lockstep_schemas::{
    ConditionStatus, Connector, Domain, Event, HealthAction, LabelFeature, Policy, Record,
    ScaleRule, ScaleTargetRef, SlurmPartition, Source, TaintSpec, TaintEffect,
};

fn set_ref() -> ScaleTargetRef {
    ScaleTargetRef {
        group: "apps".into(),
        kind: "StatefulSet".into(),
        namespace: "slurm".into(),
        name: "gpu".into(),
    }
}

fn policy() -> Policy {
    let mut p = Policy::default();
    p.drain.foreign_drain_taint = Some(TaintSpec {
        key: "lockstep.io/slurm-drained".into(),
        value: "admin".into(),
        effect: TaintEffect::PreferNoSchedule,
    });
    p.health.node_conditions = vec!["GpuXidError".into()];
    p.health.not_ready_grace_s = 30;
    p.health.resume_after_s = 30;
    p.topology.features = vec![LabelFeature {
        label: "topology.kubernetes.io/zone".into(),
        prefix: "zone-".into(),
    }];
    p.topology.unit_label = Some("nvidia.com/gpu.clique".into());
    p.topology.topology_name = "cliques".into();
    p.scaling.busy_label = "lockstep.io/slurm-busy".into();
    p.scaling.targets = vec![ScaleRule {
        target: set_ref(),
        partition: "batch".into(),
        min_replicas: 1,
        max_replicas: 5,
        scale_up_cooldown_s: 30,
        scale_down_cooldown_s: 60,
        idle_before_scale_down_s: 300,
        max_unavailable: 1,
    }];
    p
}

fn story() -> Sim {
    let mut sim = Sim::new(policy());
    sim.slurm_visible(true);
    sim.append(
        Source::Kubernetes,
        Event::SyncStarted {
            domain: Domain::KubeNodes,
        },
    );
    for (k, zone, clique) in [("k1", "a", "c1"), ("k2", "a", "c1"), ("k3", "b", "c2")] {
        sim.add_kube_node(k)
            .label_node(k, "topology.kubernetes.io/zone", Some(zone))
            .label_node(k, "nvidia.com/gpu.clique", Some(clique));
    }
    sim.append(
        Source::Kubernetes,
        Event::SyncDone {
            domain: Domain::KubeNodes,
        },
    );
    sim.append(
        Source::Slurm,
        Event::SlurmPartition(SlurmPartition {
            name: "batch".into(),
            nodes: vec!["gpu-0".into(), "gpu-1".into()],
        }),
    );
    sim.add_set("gpu", 2, &["k1", "k2", "k3"]);
    sim.run_s(10, 5);

    // Demand: scale up, a job runs (busy label), ends (label removed).
    sim.advance_s(5)
        .submit(11, "batch", 3, "Resources")
        .submit(12, "batch", 1, "Dependency");
    sim.run_s(20, 5);
    sim.advance_s(2).schedule(11, &["gpu-0", "gpu-1", "gpu-2"]);
    sim.run_s(30, 10);

    // A cordon under the running job drains; uncordon resumes.
    sim.advance_s(5).cordon("k1").actuate();
    sim.run_s(20, 10);
    sim.advance_s(5).uncordon("k1").actuate();

    // An admin drain shows on the pod and as a taint, never undone.
    sim.advance_s(5).admin_drain("gpu-1", "bad DIMM").actuate();
    sim.run_s(20, 10);
    sim.advance_s(5).admin_resume("gpu-1").actuate();

    // slurmd stops answering: condition and taint; back: both cleared.
    sim.advance_s(5).slurmd_not_responding("gpu-2").actuate();
    sim.run_s(20, 10);
    sim.advance_s(5).slurmd_back("gpu-2").actuate();

    // A failed, a lost and a retried action.
    sim.advance_s(5).set_ready("k3", ConditionStatus::False);
    sim.idle_s(40, 10);
    sim.advance_s(1).fail_next(true, "slurmctld: Socket timed out");
    sim.idle_s(10, 5);
    sim.advance_s(1).lose_next();
    sim.idle_s(70, 10);
    sim.actuate();
    sim.advance_s(5).set_ready("k3", ConditionStatus::True);
    sim.run_s(60, 10);

    // A pod moves to another zone and clique: features and topology follow.
    sim.advance_s(5)
        .label_node("k2", "nvidia.com/gpu.clique", Some("c3"))
        .actuate();
    sim.run_s(20, 10);

    // The job ends; a GPU XID takes a node DOWN under a new policy.
    sim.advance_s(5).end_job(11).actuate();
    let mut down = policy();
    down.health.action = HealthAction::Down;
    sim.advance_s(5)
        .append(Source::Lockstep, Event::PolicyChanged(Box::new(down)));
    sim.advance_s(5)
        .set_node_condition("k3", "GpuXidError", ConditionStatus::True)
        .actuate();
    sim.run_s(30, 10);
    sim.advance_s(5)
        .set_node_condition("k3", "GpuXidError", ConditionStatus::False);
    sim.run_s(60, 10);

    // A new revision: rolling replacement (drain, delete).
    sim.advance_s(5).set_revision("gpu", "rev-2");
    sim.run_s(120, 5);

    // Idle: scale in to the minimum.
    sim.advance_s(5).end_job_if_any();
    sim.run_s(900, 30);

    // An evicted pod drains; its Kubernetes node goes away.
    sim.advance_s(5);
    let pods: Vec<String> = sim.pods.keys().cloned().collect();
    if let Some(p) = pods.first() {
        let name = p.trim_start_matches("slurm/").to_owned();
        sim.pod_change(&name, |p| p.disruption_target = true).actuate();
    }
    sim.run_s(20, 10);
    sim.advance_s(5).append(
        Source::Kubernetes,
        Event::KubeNodeGone { name: "k3".into() },
    );
    sim.run_s(20, 10);

    // The connector goes blind and sees again; then the objects go.
    sim.advance_s(5).slurm_visible(false);
    sim.idle_s(20, 10);
    sim.advance_s(5).slurm_visible(true);
    sim.append(
        Source::Kubernetes,
        Event::KubeScaleTargetGone { target: set_ref() },
    );
    sim.append(
        Source::Slurm,
        Event::SlurmPartitionGone {
            name: "batch".into(),
        },
    );
    sim.append(
        Source::Slurm,
        Event::SyncStarted {
            domain: Domain::SlurmJobs,
        },
    );
    sim.append(
        Source::Slurm,
        Event::SyncDone {
            domain: Domain::SlurmJobs,
        },
    );
    let _ = Connector::Kubernetes;
    sim.run_s(30, 10);
    sim
}

trait EndJobs {
    fn end_job_if_any(&mut self) -> &mut Self;
}

impl EndJobs for Sim {
    fn end_job_if_any(&mut self) -> &mut Self {
        let ids: Vec<u64> = self.jobs.keys().copied().collect();
        for id in ids {
            if self.jobs[&id].state == lockstep_schemas::SlurmJobState::Running {
                self.end_job(id);
            } else {
                let mut job = self.jobs.remove(&id).unwrap();
                job.state = lockstep_schemas::SlurmJobState::Cancelled;
                self.append(Source::Slurm, Event::SlurmJob(job));
                self.append(Source::Slurm, Event::SlurmJobGone { job_id: id });
            }
        }
        self
    }
}

#[test]
fn write_compat_log() {
    let sim = story();
    let out = std::env::var("COMPAT_OUT").expect("COMPAT_OUT");
    for (ext, format) in [("jsonl", Format::JsonLines), ("msgpack", Format::MessagePack)] {
        let file = std::fs::File::create(format!("{out}.{ext}")).unwrap();
        let mut w = LogWriter::new(std::io::BufWriter::new(file), format, "lockstep 0.1.0").unwrap();
        for r in sim.records() {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
    }
    let mut events = BTreeSet::new();
    let mut actions = BTreeSet::new();
    for r in sim.records() {
        match r {
            Record::Event(e) => {
                events.insert(e.envelope.event.kind());
            }
            Record::Action(a) => {
                actions.insert(a.action.kind().name());
            }
            Record::Header(_) => {}
        }
    }
    let missing_events: Vec<_> = lockstep_schemas::EVENT_KINDS
        .iter()
        .filter(|k| !events.contains(*k))
        .collect();
    eprintln!("events: {events:?}\nmissing: {missing_events:?}\nactions: {actions:?} ({})", actions.len());
    eprintln!("records: {}", sim.records().len());
}
