//! Seeded search for failing schedules: a schedule from a `u64` seed (the
//! soak program's unit of reproduction), and proptest's shrinking loop
//! kept to the story that failed first, so a failure ends as the smallest
//! schedule that still breaks the same rule the same way.
//!
//! It owns nothing but the search; the world and the properties are
//! elsewhere.

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use super::check::{check_with, shape, Determinism, Property, Report};
use super::schedule::{schedules, Bounds, Schedule};
use super::WorldConfig;

/// A test runner whose randomness comes from `seed` alone.
pub fn runner(seed: u64) -> TestRunner {
    let mut bytes = [0u8; 32];
    let mut s = seed;
    for chunk in bytes.chunks_mut(8) {
        // SplitMix64 spreads a small seed over the whole key.
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    )
}

/// The value tree of the schedule of `seed`.
pub fn tree(seed: u64, bounds: Bounds) -> impl ValueTree<Value = Schedule> {
    schedules(bounds)
        .new_tree(&mut runner(seed))
        .expect("schedule strategies never reject")
}

/// The schedule of `seed`.
pub fn schedule(seed: u64, bounds: Bounds) -> Schedule {
    tree(seed, bounds).current()
}

/// Shrinks a failing schedule (the current value of `tree`, whose report
/// is `first`) to a minimal one that still tells `first`'s first story
/// (the same property, a message of the same shape), as proptest's runner
/// does. Returns it with its report and
/// the number of schedules tried.
pub fn shrink(
    mut tree: impl ValueTree<Value = Schedule>,
    first: Report,
    max_iterations: usize,
    determinism: Determinism,
) -> (Schedule, Report, usize) {
    let cfg = WorldConfig::default();
    let property: Property = first.violations[0].property;
    let story = shape(&first.violations[0].message);
    let mut best = (tree.current(), first);
    let mut tried = 0;
    if !tree.simplify() {
        return (best.0, best.1, tried);
    }
    while tried < max_iterations {
        tried += 1;
        let candidate = tree.current();
        let report = check_with(&candidate, &cfg, determinism);
        if report
            .violations
            .iter()
            .any(|v| v.property == property && shape(&v.message) == story)
        {
            best = (candidate, report);
            if !tree.simplify() {
                break;
            }
        } else if !tree.complicate() {
            break;
        }
    }
    // Put the story that was shrunk for first.
    best.1.violations.sort_by_key(|v| {
        (
            v.property != property || shape(&v.message) != story,
            v.at_ms,
        )
    });
    (best.0, best.1, tried)
}
