//! Soak: runs many seeded world schedules against the reducer and checks
//! the properties an administrator expects. Schedule `i` of a run with
//! `--seed S` is the schedule of seed `S + i`, so one failing schedule is
//! reproduced with `--schedules 1 --seed <its seed>`.
//!
//! On the first failure it shrinks the schedule to a minimal story, saves
//! it under `replay-tests/incidents/world/` (unless `--no-save`), prints
//! the seed, the property broken, the story and the command that
//! reproduces it, and exits with status 1.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use clap::Parser;
use proptest::strategy::ValueTree;

use lockstep_replay_tests::world::check::{check_with, Determinism};
use lockstep_replay_tests::world::{incident, search, Bounds, WorldConfig};

/// Runs seeded world schedules and checks lockstep's properties.
#[derive(Debug, Parser)]
#[command(name = "soak")]
struct Args {
    /// How many schedules to run.
    #[arg(long, default_value_t = 1000)]
    schedules: u64,
    /// Seed of the first schedule (default: from the clock, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Most steps per schedule.
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// Most schedules tried while shrinking a failure.
    #[arg(long, default_value_t = 2000)]
    shrink_iterations_max: usize,
    /// Do not save a failing schedule under incidents/world/.
    #[arg(long)]
    no_save: bool,
    /// Save a failing schedule under this directory instead of
    /// incidents/world/ (e.g. replay-tests/incidents/world-pending for a
    /// story that fails until its fix lands).
    #[arg(long)]
    save_dir: Option<std::path::PathBuf>,
    /// Instead of random schedules, run every saved schedule under this
    /// directory (e.g. replay-tests/incidents/world) and say which still fail.
    #[arg(long)]
    saved: Option<std::path::PathBuf>,
    /// Shrink for the first violation whose message contains this text
    /// (default: the first violation).
    #[arg(long)]
    follow: Option<String>,
    /// Print the minimal failing schedule's log as a timeline.
    #[arg(long)]
    timeline: bool,
    /// Print the world's state at the end of the minimal failing schedule.
    #[arg(long)]
    state: bool,
    /// Check determinism by folding the log again only (as the test does),
    /// not by running the whole world twice.
    #[arg(long)]
    replay_only: bool,
    /// Do not stop at the first failure: print one line per failing
    /// schedule and a count per property at the end (no shrinking).
    #[arg(long)]
    keep_going: bool,
}

fn main() {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let bounds = Bounds {
        steps_max: args.steps,
    };
    if let Some(dir) = &args.saved {
        std::process::exit(run_saved(dir, &args));
    }
    eprintln!(
        "soak: {} schedules of at most {} steps from seed {seed}",
        args.schedules, args.steps
    );
    let tty = std::io::stderr().is_terminal();
    let cfg = WorldConfig::default();
    let determinism = if args.replay_only {
        Determinism::Replay
    } else {
        Determinism::RerunWorld
    };
    let start = Instant::now();
    let mut last_shown = Instant::now();
    let (mut steps, mut events, mut records) = (0u64, 0u64, 0u64);
    let mut failing: std::collections::BTreeMap<String, u64> = Default::default();
    for i in 0..args.schedules {
        let case_seed = seed.wrapping_add(i);
        let tree = search::tree(case_seed, bounds);
        let schedule = tree.current();
        let report = check_with(&schedule, &cfg, determinism);
        steps += report.steps as u64;
        events += report.world_events;
        records += report.records as u64;
        if tty && last_shown.elapsed() > Duration::from_millis(200) {
            last_shown = Instant::now();
            let s = start.elapsed().as_secs_f64();
            eprint!(
                "\r{}/{} schedules, {:.1} schedules/s, {:.0} steps/s   ",
                i + 1,
                args.schedules,
                (i + 1) as f64 / s,
                steps as f64 / s
            );
        }
        if report.violations.is_empty() {
            continue;
        }
        if args.keep_going {
            let mut props: Vec<String> = report
                .violations
                .iter()
                .map(|v| v.property.name().to_owned())
                .collect();
            props.sort();
            props.dedup();
            for p in &props {
                *failing.entry(p.clone()).or_default() += 1;
            }
            if tty {
                eprint!("\r");
            }
            let first = report
                .violations
                .iter()
                .find(|v| v.property.name() == props[0])
                .expect("listed");
            println!("seed {case_seed} [{}]: {}", props.join(","), first.message);
            for v in &report.violations {
                println!("    {v}");
            }
            continue;
        }
        if tty {
            eprintln!();
        }
        let mut report = report;
        if let Some(text) = &args.follow {
            if let Some(i) = report
                .violations
                .iter()
                .position(|v| v.message.contains(text.as_str()))
            {
                let v = report.violations.remove(i);
                report.violations.insert(0, v);
            }
        }
        let first = report.violations[0].clone();
        eprintln!(
            "schedule {i} (seed {case_seed}) breaks {}: {first}",
            first.property
        );
        eprintln!("shrinking ...");
        let (small, small_report, tried) =
            search::shrink(tree, report, args.shrink_iterations_max, determinism);
        println!("seed: {case_seed}");
        println!("property broken: {}", small_report.violations[0].property);
        println!("minimal story ({tried} schedules tried while shrinking):");
        print!("{}", small.story());
        if args.timeline {
            println!("timeline:");
            print!("{}", small_report.world.timeline());
        }
        if args.state {
            println!("state at the end:");
            print!("{}", small_report.world.state());
        }
        println!("violations:");
        for v in &small_report.violations {
            println!("  {v}");
        }
        if !args.no_save {
            match incident::save(
                &args.save_dir.clone().unwrap_or_else(incident::dir),
                &small,
                &small_report.violations,
                &small_report.world,
            ) {
                Ok(path) => println!("saved: {}", path.display()),
                Err(e) => eprintln!("could not save the schedule: {e}"),
            }
        }
        println!(
            "reproduce: cargo run --release -p lockstep-replay-tests --bin soak -- --schedules 1 --seed {case_seed} --steps {}",
            args.steps
        );
        std::process::exit(1);
    }
    let s = start.elapsed().as_secs_f64().max(1e-9);
    if tty {
        eprintln!();
    }
    if !failing.is_empty() {
        println!("failing schedules per property:");
        for (p, n) in &failing {
            println!("  {p}: {n}");
        }
    }
    println!(
        "{} schedules checked in {s:.1} s: {:.1} schedules/s, {:.0} world steps/s ({:.0} world events/s, {:.0} log records/s)",
        args.schedules,
        args.schedules as f64 / s,
        steps as f64 / s,
        events as f64 / s,
        records as f64 / s
    );
    let _ = std::io::stdout().flush();
    if !failing.is_empty() {
        std::process::exit(1);
    }
}

/// Runs every saved schedule under `dir`; returns the exit status.
fn run_saved(dir: &std::path::Path, args: &Args) -> i32 {
    let saved = match incident::load_all(dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("soak: {e}");
            return 2;
        }
    };
    let mut failing = 0;
    for s in &saved {
        let report = check_with(
            &s.schedule,
            &WorldConfig::default(),
            Determinism::RerunWorld,
        );
        match report.violations.first() {
            None => println!("holds  {}", s.name),
            Some(v) => {
                failing += 1;
                println!("FAILS  {}: {v}", s.name);
                if args.timeline {
                    print!("{}", s.schedule.story());
                    println!("timeline:");
                    print!("{}", report.world.timeline());
                }
                if args.state {
                    println!("state at the end:");
                    print!("{}", report.world.state());
                }
            }
        }
    }
    println!(
        "{failing} of {} saved schedules break a property",
        saved.len()
    );
    i32::from(failing > 0)
}
