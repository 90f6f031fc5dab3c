//! Reducer throughput on the steady-state mix over 10,000 Slurm nodes, and
//! replay of a MessagePack log including decoding (DESIGN.md targets:
//! >= 2M events/s apply, >= 1M events/s replay with decoding, one core).
//!
//! `cargo bench -p lockstep-benches`

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use lockstep_engine::replay::Replay;
use lockstep_engine::{Engine, Output};
use lockstep_schemas::log::{Format, LogReader, LogWriter};
use lockstep_schemas::{Policy, Record};
use lockstep_testkit::gen::{Generator, Shape};

// The same allocator as the `lockstep` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SHAPE: Shape = Shape::plain(10_000, 4);

/// Issue figure: scaling and topology on, 10,000 nodes and 100,000 jobs
/// (10,000 running at most, the rest queued).
const FULL: Shape = Shape {
    slurm_nodes: 10_000,
    per_kube_node: 4,
    pending_jobs: 90_000,
    scaling_and_topology: true,
};
const STEADY_EVENTS: usize = 200_000;

/// Generates `shape`'s log and an engine that has applied its bring-up.
fn setup(shape: Shape) -> (Vec<lockstep_schemas::EventRecord>, usize, Engine) {
    let mut g = Generator::new(shape, 42);
    let bring_up = g.records().len();
    g.steady_state(STEADY_EVENTS);
    let records = g.into_records();
    let mut warm = Engine::new(Policy::default());
    let mut out = Output::default();
    for r in &records[..bring_up] {
        warm.apply(r, &mut out);
        out.clear();
    }
    (records, bring_up, warm)
}

fn apply_group(c: &mut Criterion, name: &str, shape: Shape) {
    let (records, bring_up, warm) = setup(shape);
    let steady = &records[bring_up..];
    let mut group = c.benchmark_group("reducer");
    group.sample_size(10);
    group.throughput(Throughput::Elements(steady.len() as u64));
    group.bench_function(name, |b| {
        b.iter_batched(
            || warm.clone(),
            |mut engine| {
                let mut out = Output::default();
                for r in steady {
                    engine.apply(r, &mut out);
                    out.clear();
                }
                engine
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn bench(c: &mut Criterion) {
    apply_group(c, "apply_steady_state_10k_nodes", SHAPE);
    apply_group(c, "apply_scaling_topology_10k_nodes_100k_jobs", FULL);
    let (records, _, _) = setup(SHAPE);

    let mut w = LogWriter::new(Vec::new(), Format::MessagePack, "bench").unwrap();
    for r in &records {
        w.write(&Record::Event(r.clone())).unwrap();
    }
    let bytes = w.finish().unwrap();
    let mut group = c.benchmark_group("replay");
    group.sample_size(10);
    group.throughput(Throughput::Elements(records.len() as u64));
    for (name, verify_ids) in [
        ("msgpack_decode_and_apply", false),
        ("msgpack_decode_verify_ids_and_apply", true),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || bytes.clone(),
                |bytes| {
                    let mut reader = LogReader::msgpack(bytes);
                    if !verify_ids {
                        reader = reader.trust_ids();
                    }
                    let mut replay = Replay::new(Engine::new(Policy::default()));
                    for rec in reader {
                        replay.feed(&rec.unwrap()).unwrap();
                    }
                    replay.totals()
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
