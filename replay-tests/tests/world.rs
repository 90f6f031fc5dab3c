//! lockstep in the world model: random schedules of administrator actions,
//! failures, jobs and policy edits, carried out by a model of Kubernetes and
//! Slurm, with the reducer deciding from the log; the properties an
//! administrator expects must hold for every schedule.
//!
//! A failing schedule is shrunk to a minimal story and saved under
//! `incidents/world/` (schedule and log); `saved_world_schedules_hold`
//! runs every saved schedule again. Stories under `incidents/world-pending/`
//! fail until their fix lands: the random test takes a schedule that breaks
//! a property the way one of them does (same property, same shape of
//! message) as that known story, and `pending_world_schedules_still_fail`
//! says when one holds and should move to `incidents/world/`.
//! The draw is fixed (`SEED_DEFAULT`; `LOCKSTEP_WORLD_SEED` draws others), so
//! a run fails for a change, never by chance. `PROPTEST_CASES` sets the number of
//! schedules (default below: a few thousand in well under a minute in a
//! debug build); `cargo run --release -p lockstep-replay-tests --bin soak`
//! runs many more.

use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use std::collections::BTreeSet;

use lockstep_replay_tests::world::check::{check, check_with, shape, Determinism, Property};
use lockstep_replay_tests::world::{incident, schedule, search, Bounds, WorldConfig};

/// Steps per schedule: with the quiet time that follows every schedule,
/// 8 steps keep a debug build near 90 schedules a second (measured on 2
/// busy cores: 2,000 schedules in 21 s).
const STEPS_MAX: usize = 8;

/// Schedules per run unless `PROPTEST_CASES` says otherwise (about 35 s in
/// a debug build).
const CASES_DEFAULT: u32 = 3_000;

/// The draw of schedules unless `LOCKSTEP_WORLD_SEED` says otherwise.
const SEED_DEFAULT: u64 = 20_261_202;

#[test]
fn world_properties_hold_over_random_schedules() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES_DEFAULT);
    // The same schedules on every run, so that a run on a fresh machine
    // fails only for a change, never by the draw: `LOCKSTEP_WORLD_SEED` (a
    // number) draws others, and the soak program explores far more.
    let seed: u64 = std::env::var("LOCKSTEP_WORLD_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SEED_DEFAULT);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases,
            failure_persistence: None,
            max_shrink_iters: 2_000,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let strategy = schedule::schedules(Bounds {
        steps_max: STEPS_MAX,
    });
    let pending: BTreeSet<(Property, String)> = incident::load_all(&incident::pending_dir())
        .expect("pending schedules read")
        .iter()
        .flat_map(|s| s.violations.iter())
        .map(|v| (v.property, shape(&v.message)))
        .collect();
    let result = runner.run(&strategy, |s| {
        let report = check(&s);
        let known = report
            .violations
            .iter()
            .any(|v| pending.contains(&(v.property, shape(&v.message))));
        match report.violations.first() {
            Some(v) if !known => Err(TestCaseError::fail(v.to_string())),
            _ => Ok(()),
        }
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, minimal)) => {
            let report = check(&minimal);
            let saved = incident::save(
                &incident::dir(),
                &minimal,
                &report.violations,
                &report.world,
            )
            .map_or_else(|e| format!("(not saved: {e})"), |p| p.display().to_string());
            let violations: Vec<String> =
                report.violations.iter().map(|v| format!("  {v}")).collect();
            panic!(
                "{reason}\nminimal story:\n{}violations:\n{}\nsaved: {saved}",
                minimal.story(),
                violations.join("\n")
            );
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn saved_world_schedules_hold() {
    let saved = incident::load_all(&incident::dir()).expect("saved schedules read");
    let mut failures = Vec::new();
    for s in &saved {
        let report = check(&s.schedule);
        if !report.violations.is_empty() {
            let v: Vec<String> = report
                .violations
                .iter()
                .map(|v| format!("    {v}"))
                .collect();
            failures.push(format!("{}:\n{}", s.name, v.join("\n")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} saved world schedules break a property:\n{}",
        failures.len(),
        saved.len(),
        failures.join("\n")
    );
}

#[test]
fn pending_world_schedules_still_fail() {
    let saved = incident::load_all(&incident::pending_dir()).expect("pending schedules read");
    let holding: Vec<&str> = saved
        .iter()
        .filter(|s| check(&s.schedule).violations.is_empty())
        .map(|s| s.name.as_str())
        .collect();
    assert!(
        holding.is_empty(),
        "these pending world schedules hold now: move them from incidents/world-pending/ to incidents/world/: {holding:?}"
    );
}

#[test]
fn the_world_is_deterministic() {
    // The model itself: the same schedule writes the same log, twice.
    for seed in 0..16 {
        let s = search::schedule(seed, Bounds { steps_max: 12 });
        let report = check_with(&s, &WorldConfig::default(), Determinism::RerunWorld);
        let broken: Vec<_> = report
            .violations
            .iter()
            .filter(|v| v.property == Property::Deterministic)
            .collect();
        assert!(broken.is_empty(), "seed {seed}: {broken:?}");
    }
}
