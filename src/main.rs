//! The `lockstep` command.

use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use lockstep::commands::{self, ReplayOptions};
use lockstep_schemas::log::{self, Format, LogWriter};
use lockstep_schemas::Policy;

// Replays decode millions of small records; mimalloc makes that ~1.4x faster
// than the system allocator (benches/, README "Performance").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// lockstep keeps a Slurm cluster and the Kubernetes cluster it runs on in
/// lockstep. Every decision is a pure function of its event log, so any
/// incident can be replayed bit for bit and every transition audited back to
/// its cause.
#[derive(Parser)]
#[command(name = "lockstep", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fold a recorded log and print the transitions and actions it causes.
    ///
    /// Reads an exported log file (JSON Lines, or MessagePack for .msgpack /
    /// .mpk; the format is detected). A damaged file replays up to the damage,
    /// then the command names the line or byte offset and exits 2.
    Replay {
        /// The log file.
        log: PathBuf,
        /// Print JSON Lines (one object per event that caused something).
        #[arg(long)]
        json: bool,
        /// Print every event, not only those that caused a transition or action.
        #[arg(long)]
        all_events: bool,
        /// Compare the recomputed actions with those recorded in the log; exit 1
        /// and name the first sequence where they differ.
        #[arg(long, conflicts_with = "policy")]
        verify: bool,
        /// Replay with this policy (JSON) instead of the log's, and show what
        /// it would have done differently.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Print only the summary.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Show the causal chain of one Slurm node: event -> transition -> action -> outcome.
    Audit {
        /// Slurm node name.
        node: String,
        /// The log file to replay.
        #[arg(long, value_name = "FILE")]
        log: PathBuf,
        /// Print JSON Lines.
        #[arg(long)]
        json: bool,
    },
    /// Policy documents.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Convert a log between JSON Lines and MessagePack (by file extension).
    Convert {
        /// Input log.
        input: PathBuf,
        /// Output log: .msgpack / .mpk for MessagePack, anything else JSON Lines.
        output: PathBuf,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Print the default policy (JSON), every field with its default.
    Default,
    /// Check a policy file and print it with defaults filled in.
    Check {
        /// The policy file (JSON).
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Replay {
            log,
            json,
            all_events,
            verify,
            policy,
            quiet,
        } => {
            let policy = policy.as_deref().map(commands::read_policy).transpose()?;
            let opts = ReplayOptions {
                json,
                all_events,
                verify,
                policy,
            };
            replay(&log, &opts, quiet)
        }
        Command::Audit { node, log, json } => {
            let reader = open(&log)?;
            let stdout = std::io::stdout();
            let mut out = BufWriter::new(stdout.lock());
            let damage = commands::audit(reader, &node, json, &mut out)?;
            out.flush()?;
            match damage {
                Some(e) => {
                    eprintln!(
                        "error: {}: {e} (the audit covers the log up to there)",
                        log.display()
                    );
                    Ok(ExitCode::from(2))
                }
                None => Ok(ExitCode::SUCCESS),
            }
        }
        Command::Policy(PolicyCommand::Default) => {
            println!("{}", serde_json::to_string_pretty(&Policy::default())?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy(PolicyCommand::Check { file }) => {
            let policy = commands::read_policy(&file)?;
            println!("{}", serde_json::to_string_pretty(&policy)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Convert { input, output } => convert(&input, &output),
    }
}

fn open(path: &Path) -> Result<log::LogReader<std::io::BufReader<std::fs::File>>> {
    log::open(path).with_context(|| format!("opening log {}", path.display()))
}

fn replay(path: &Path, opts: &ReplayOptions, quiet: bool) -> Result<ExitCode> {
    let reader = open(path)?;
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let bar = if std::io::stderr().is_terminal() && size > 8 << 20 {
        let bar = indicatif::ProgressBar::new(size);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("static template"),
        );
        Some(bar)
    } else {
        None
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut sink = std::io::sink();
    let target: &mut dyn Write = if quiet { &mut sink } else { &mut out };
    let report = commands::replay(reader, opts, target, &mut |n| {
        if let Some(b) = &bar {
            b.set_position(n);
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    out.flush()?;
    let summary = format!(
        "replayed {} events: {} transitions, {} actions ({} recorded in the log); state hash {}",
        report.events,
        report.transitions,
        report.actions,
        report.recorded_actions,
        report.state_hash
    );
    eprintln!("{summary}");
    if let Some(e) = &report.damage {
        eprintln!(
            "error: {}: {e}; everything before it was replayed",
            path.display()
        );
        return Ok(ExitCode::from(2));
    }
    if opts.verify {
        match &report.divergence {
            None => eprintln!(
                "verified: all {} recorded actions match",
                report.recorded_actions
            ),
            Some(d) => {
                eprintln!("verify failed: {}", commands::describe_divergence(d));
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn convert(input: &Path, output: &Path) -> Result<ExitCode> {
    let reader = open(input)?;
    let file =
        std::fs::File::create(output).with_context(|| format!("creating {}", output.display()))?;
    let written_by = concat!("lockstep ", env!("CARGO_PKG_VERSION"));
    let mut writer = LogWriter::new(BufWriter::new(file), Format::from_path(output), written_by)?;
    let mut n = 0u64;
    for rec in reader {
        let rec = rec.with_context(|| format!("reading {}", input.display()))?;
        if matches!(rec, lockstep_schemas::Record::Header(_)) {
            continue;
        }
        writer.write(&rec)?;
        n += 1;
    }
    writer.finish()?;
    eprintln!("wrote {n} records to {}", output.display());
    Ok(ExitCode::SUCCESS)
}
