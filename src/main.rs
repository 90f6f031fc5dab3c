//! The `lockstep` command.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use lockstep::commands::{self, ReplayOptions};
use lockstep_schemas::log::{self, Format, LogWriter};
use lockstep_schemas::Policy;

// Replays decode millions of small records; mimalloc makes that ~1.4x faster
// than the system allocator (benches/, docs/src/benchmarks.md).
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
        /// The log: a file, or `nats://HOST:PORT` (the LOCKSTEP streams).
        /// Omit it with --config to replay the configured log.
        #[arg(required_unless_present = "config")]
        log: Option<String>,
        /// Replay the event log of this configuration (embedded or NATS).
        #[arg(long, value_name = "FILE", conflicts_with = "log")]
        config: Option<PathBuf>,
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
        /// Replay with this policy (JSON) instead of the log's, and list the
        /// actions that differ: recorded ones it would not have issued, and
        /// ones it would have issued that were not recorded, matched by kind,
        /// target and content. It sees the recorded world, which does not
        /// react to actions that were never carried out.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Print only the summary.
        #[arg(long, short)]
        quiet: bool,
        /// Start at this sequence: what comes before is folded silently
        /// (from the newest snapshot before it, for a configured log).
        #[arg(long, value_name = "SEQ", conflicts_with_all = ["since", "policy"])]
        from: Option<u64>,
        /// Start at this time: an RFC 3339 time (2026-12-03T04:00:00Z) or a
        /// duration before now (90m, 1h 30m).
        #[arg(long, value_name = "TIME", conflicts_with = "policy")]
        since: Option<String>,
    },
    /// Show the causal chain of one Slurm node: event -> transition -> action -> outcome.
    Audit {
        /// Slurm node name.
        node: String,
        /// The log to replay: a file or `nats://HOST:PORT`.
        #[arg(long, value_name = "LOG", required_unless_present = "config")]
        log: Option<String>,
        /// Use this configuration: its store's audit index when the service is
        /// not running, else a replay of its event log.
        #[arg(long, value_name = "FILE", conflicts_with = "log")]
        config: Option<PathBuf>,
        /// Print JSON Lines.
        #[arg(long, conflicts_with = "html")]
        json: bool,
        /// Write the node's timeline and causal chain as one self-contained
        /// HTML file (phase bands, events, actions and outcomes; each
        /// cause on hover and click), from a replay of the log.
        #[arg(long, value_name = "OUT.html")]
        html: Option<PathBuf>,
    },
    /// Write the timelines of several Slurm nodes, or of a part of the log,
    /// as one self-contained HTML file.
    Timeline {
        /// The log: a file, or `nats://HOST:PORT`. Omit it with --config.
        #[arg(required_unless_present = "config")]
        log: Option<String>,
        /// The event log of this configuration (embedded or NATS).
        #[arg(long, value_name = "FILE", conflicts_with = "log")]
        config: Option<PathBuf>,
        /// The HTML file to write.
        #[arg(long, value_name = "OUT.html")]
        html: PathBuf,
        /// These Slurm nodes (comma-separated; default: every node with a
        /// transition in the range, at most 200).
        #[arg(long, value_name = "NODES", value_delimiter = ',')]
        nodes: Vec<String>,
        /// First sequence shown.
        #[arg(long, value_name = "SEQ")]
        from: Option<u64>,
        /// Last sequence shown.
        #[arg(long, value_name = "SEQ")]
        to: Option<u64>,
    },
    /// Print a shell completion script: `lockstep completions bash >
    /// /etc/bash_completion.d/lockstep`.
    Completions {
        /// bash, zsh or fish.
        shell: clap_complete::Shell,
    },
    /// Policy documents.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Run the service: consume the event log, apply, commit, then act.
    ///
    /// With no NATS URL in the config, the event log is embedded in the data
    /// directory: a single machine needs nothing else. SIGTERM or Ctrl-C
    /// finishes the batch, writes a checkpoint, releases the leader Lease if
    /// held, and exits 0.
    ///
    /// With `[leader_election]`, several replicas share one NATS log: each
    /// folds it, and only the holder of the Lease observes and acts. A leader
    /// that loses its Lease exits 1, to be restarted as a follower.
    Run {
        /// Configuration file (TOML); every field has a default.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Export the configured event log (or a NATS URL, or a log file) to a
    /// log file.
    ///
    /// With --from or --since, the file is an incident bundle: the state
    /// just before the window (a snapshot record), then the window's
    /// records. It replays alone to the same state and actions as the whole
    /// log (`replay --verify`), and `audit` reads it.
    Export {
        /// Configuration file naming the log (or use --nats or --log).
        #[arg(long, value_name = "FILE", conflicts_with_all = ["nats", "log"])]
        config: Option<PathBuf>,
        /// Read from this NATS server's LOCKSTEP streams.
        #[arg(long, value_name = "URL", conflicts_with = "log")]
        nats: Option<String>,
        /// Read this log file (JSON Lines or MessagePack).
        #[arg(long, value_name = "FILE")]
        log: Option<PathBuf>,
        /// First sequence of the window.
        #[arg(long, value_name = "SEQ", conflicts_with = "since")]
        from: Option<u64>,
        /// Start of the window in time: an RFC 3339 time
        /// (2026-12-03T04:00:00Z) or a duration before now (90m, 1h 30m).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Last sequence to export (default: the head).
        #[arg(long, value_name = "SEQ")]
        to: Option<u64>,
        /// Output file: .msgpack / .mpk for MessagePack, anything else JSON Lines.
        output: PathBuf,
    },
    /// Show what the store holds: checkpoint, state hash, action ledger.
    /// The service must not be running (the store is locked while it runs).
    Inspect {
        /// Configuration file.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Also print the recorded transitions of this Slurm node.
        #[arg(long, value_name = "NODE")]
        node: Option<String>,
    },
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
    /// List the policy changes in a log: sequence, time, who or what file,
    /// and what each changed against the policy in force before it.
    History {
        /// The log: a file, or `nats://HOST:PORT`. Omit it with --config.
        #[arg(required_unless_present = "config")]
        log: Option<String>,
        /// The event log of this configuration (embedded or NATS).
        #[arg(long, value_name = "FILE", conflicts_with = "log")]
        config: Option<PathBuf>,
        /// Print JSON Lines.
        #[arg(long)]
        json: bool,
    },
    /// Compare two policies, field by field. Each is a sequence of the log
    /// (the policy in force there) or a policy file.
    Diff {
        /// The policy before: a sequence or a file.
        a: String,
        /// The policy after: a sequence or a file.
        b: String,
        /// The log the sequences refer to: a file or `nats://HOST:PORT`.
        #[arg(long, value_name = "LOG", conflicts_with = "config")]
        log: Option<String>,
        /// The event log of this configuration.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Put the policy that was in force at SEQ back in force: appends it to
    /// the configured log as a new policy change, recorded as a rollback of
    /// SEQ and by whom. The configuration's policy file, if it names one,
    /// is rewritten with it, so that a restart keeps the rollback.
    ///
    /// An embedded log has one user at a time: stop `lockstep run` first (a
    /// NATS log takes the rollback while lockstep runs).
    Rollback {
        /// The sequence whose policy in force to restore.
        seq: u64,
        /// The configuration naming the log (and the policy file).
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Who asks (default: `$USER@hostname`), for the audit trail.
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
    },
}

fn main() -> ExitCode {
    // Installed as `kubectl-lockstep` (a symlink), the same binary is the
    // kubectl plugin.
    if lockstep::kubectl::invoked_as_plugin() {
        return lockstep::kubectl::main();
    }
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
            config,
            json,
            all_events,
            verify,
            policy,
            quiet,
            from,
            since,
        } => {
            let policy = policy.as_deref().map(Policy::from_file).transpose()?;
            let opts = ReplayOptions {
                json,
                all_events,
                verify,
                policy,
            };
            let start = commands::Start::from_args(
                from,
                since.as_deref(),
                lockstep_connectors::clock::now_ms(),
            )?;
            let source = Source::new(log, config.as_deref())?;
            replay(&source, start, &opts, quiet)
        }
        Command::Audit {
            node,
            log,
            config,
            json: _,
            html: Some(out),
        } => {
            let scope = lockstep::html::Scope {
                nodes: vec![node.clone()],
                ..Default::default()
            };
            write_html(
                &Source::new(log, config.as_deref())?,
                &scope,
                format!("lockstep audit of Slurm node {node}"),
                &out,
            )
        }
        Command::Timeline {
            log,
            config,
            html,
            nodes,
            from,
            to,
        } => {
            let scope = lockstep::html::Scope {
                nodes,
                from_seq: from,
                to_seq: to,
            };
            let source = Source::new(log, config.as_deref())?;
            let title = format!("lockstep timeline of {}", source.name());
            write_html(&source, &scope, title, &html)
        }
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "lockstep", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Audit {
            node,
            log,
            config,
            json,
            html: None,
        } => audit(&node, log, config.as_deref(), json),
        Command::Policy(PolicyCommand::Default) => {
            println!("{}", serde_json::to_string_pretty(&Policy::default())?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy(PolicyCommand::Check { file }) => {
            let policy = Policy::from_file(&file)?;
            println!("{}", serde_json::to_string_pretty(&policy)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy(PolicyCommand::History { log, config, json }) => {
            policy_history(&Source::new(log, config.as_deref())?, json)
        }
        Command::Policy(PolicyCommand::Diff {
            a,
            b,
            log,
            config,
            json,
        }) => policy_diff(&a, &b, log, config.as_deref(), json),
        Command::Policy(PolicyCommand::Rollback { seq, config, by }) => {
            policy_rollback(seq, &config, by)
        }
        Command::Convert { input, output } => convert(&input, &output),
        Command::Run { config } => {
            let cfg = load_config(config.as_deref())?;
            // Refused at start, by field, on every replica: not only once
            // this one leads and appends it to the log.
            if let Some(path) = &cfg.policy_file {
                Policy::from_file(path)?;
            }
            lockstep::telemetry::init_logging(cfg.telemetry.log_format);
            if !cfg.service.transparent_huge_pages {
                opt_out_of_huge_pages();
            }
            let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
            let shutdown = listen_for_shutdown(&rt)?;
            rt.block_on(lockstep::service::run(cfg, shutdown))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Export {
            config,
            nats,
            log,
            from,
            since,
            to,
            output,
        } => {
            let source = match (log, nats) {
                (Some(path), _) => Source::File(path),
                (None, Some(url)) => {
                    let mut cfg = load_config(None)?;
                    cfg.log.nats_url = Some(url.clone());
                    commands::RecordSource::Log(Box::new(cfg), url)
                }
                (None, None) => {
                    let name = config.as_ref().map_or_else(
                        || "the embedded log of the default configuration".to_owned(),
                        |p| p.display().to_string(),
                    );
                    commands::RecordSource::Log(Box::new(load_config(config.as_deref())?), name)
                }
            };
            let start = commands::Start::from_args(
                from,
                since.as_deref(),
                lockstep_connectors::clock::now_ms(),
            )?;
            export(&source, start, to, &output)
        }
        Command::Inspect { config, node } => {
            inspect(&load_config(config.as_deref())?, node.as_deref())
        }
    }
}

/// `lockstep audit NODE`: from the store's audit index when the store is
/// free, else by replaying the log.
fn audit(node: &str, log: Option<String>, config: Option<&Path>, json: bool) -> Result<ExitCode> {
    if let (Some(cfg), false) = (&config, json) {
        let cfg = load_config(Some(cfg))?;
        if let Ok(store) = lockstep::storage::open_store(&cfg, std::time::Duration::ZERO) {
            let transitions = store.transitions(node)?;
            println!(
                "audit index of slurm node {node}: {} transitions",
                transitions.len()
            );
            if let Some(before) = store.retained_from()? {
                let oldest = transitions.first().map_or_else(
                    || "none of this node".to_owned(),
                    |t| format!("seq {} at {}", t.seq, lockstep::render::time(t.time_ms)),
                );
                println!(
                    "beyond retention: what happened before {} was dropped ([service] retention_s); oldest kept: {oldest}",
                    lockstep::render::time(before)
                );
            }
            for t in &transitions {
                println!(
                    "{}  seq {:<6} {} -> {} [{}] {} (cause event {})",
                    lockstep::render::time(t.time_ms),
                    t.seq,
                    t.from,
                    t.to,
                    t.rule,
                    t.detail,
                    t.cause
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        eprintln!(
            "the store is in use (is lockstep running?); replaying the configured log instead"
        );
    }
    let source = Source::new(log, config)?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let damage = commands::audit(source.records()?, node, json, &mut out)?;
    out.flush()?;
    match damage {
        Some(e) => {
            eprintln!(
                "error: {}: {e} (the audit covers the log up to there)",
                source.name()
            );
            Ok(ExitCode::from(2))
        }
        None => Ok(ExitCode::SUCCESS),
    }
}

fn load_config(path: Option<&Path>) -> Result<lockstep::config::Config> {
    match path {
        Some(p) => lockstep::config::Config::load(p),
        None => Ok(lockstep::config::Config::default()),
    }
}

/// How long a graceful stop may take before the process exits anyway.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// Keeps the kernel from backing this process's memory with transparent
/// huge pages (`[service] transparent_huge_pages`), before the runtime and
/// the engine allocate: a huge page is resident as a whole.
fn opt_out_of_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::warn!(error = %e, "could not opt out of transparent huge pages (prctl PR_SET_THP_DISABLE); resident memory may be higher");
    }
}

/// SIGTERM and SIGINT (Ctrl-C), listened for from before the service
/// starts: one that arrives while it opens its store or restores its state
/// asks for a graceful stop, where the default action would end the
/// process by the signal.
///
/// The first signal resolves the returned future, which the service polls
/// to start a graceful stop. A second signal, or a stop that takes longer
/// than [`SHUTDOWN_GRACE`] (a hung disk, a lost data directory, a long
/// rebuild that polls nothing), ends the process at once: nothing is lost,
/// the next start resumes from the last checkpoint and the log. This runs
/// on the runtime's workers, so it holds while the service blocks one.
fn listen_for_shutdown(
    rt: &tokio::runtime::Runtime,
) -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    // Listening needs the runtime's signal driver.
    let _entered = rt.enter();
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    let (requested, shutdown) = tokio::sync::oneshot::channel::<()>();
    rt.spawn(async move {
        let mut signalled = async || {
            tokio::select! {
                _ = term.recv() => {},
                _ = interrupt.recv() => {},
            }
        };
        signalled().await;
        tracing::info!("shutdown requested; finishing the batch (a second signal stops at once)");
        let _ = requested.send(());
        tokio::select! {
            () = signalled() => tracing::error!("second shutdown signal; exiting now"),
            () = tokio::time::sleep(SHUTDOWN_GRACE) => tracing::error!(
                grace_s = SHUTDOWN_GRACE.as_secs(),
                "the graceful stop did not finish in time; exiting now"
            ),
        }
        std::process::exit(1);
    });
    Ok(async {
        // An error is the sender gone: the listener ended with the runtime.
        let _ = shutdown.await;
    })
}

/// `lockstep export`: the source's records, or the window that `start`
/// opens as an incident bundle, up to `to`.
fn export(
    source: &Source,
    start: Option<commands::Start>,
    to: Option<u64>,
    output: &Path,
) -> Result<ExitCode> {
    let records = source.window(start, Some("exporting"))?;
    let mut writer = log_writer(output)?;
    let (mut events, mut actions, mut state) = (0u64, 0u64, None);
    for rec in records {
        let rec = rec.with_context(|| not_written(&source.name(), output))?;
        match &rec {
            lockstep_schemas::Record::Header(_) => continue,
            lockstep_schemas::Record::Event(e) if to.is_some_and(|to| e.seq > to) => break,
            lockstep_schemas::Record::Event(_) => events += 1,
            lockstep_schemas::Record::Action(_) => actions += 1,
            lockstep_schemas::Record::Snapshot(p) => state = Some(p.seq),
        }
        writer
            .write(&rec)
            .with_context(|| format!("writing {}", output.display()))?;
    }
    finish(writer, output)?;
    let state = state.map_or_else(String::new, |seq| format!(" after the state at seq {seq}"));
    eprintln!(
        "exported {events} events and {actions} actions{state} to {}",
        output.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn inspect(cfg: &lockstep::config::Config, node: Option<&str>) -> Result<ExitCode> {
    let store = lockstep::storage::open_store(cfg, std::time::Duration::ZERO)?;
    match store.read_checkpoint(|r| lockstep_engine::Engine::restore_from(r)) {
        Ok(Some((seq, engine))) => {
            let engine = engine.context("restoring the checkpoint")?;
            let bytes = std::fs::metadata(store.checkpoint_path()).map_or_else(
                |_| "in the database".to_owned(),
                |m| format!("{} bytes", m.len()),
            );
            println!(
                "checkpoint: seq {seq} ({bytes}), state hash {}",
                engine.hash()
            );
        }
        Ok(None) => println!("checkpoint: none"),
        Err(e) => println!("checkpoint: {e}"),
    }
    let ledger = store.ledger()?;
    let dispatched = ledger.iter().filter(|e| e.dispatched > 0).count();
    let twice = ledger.iter().filter(|e| e.dispatched > 1).count();
    let outcomes = ledger.iter().filter(|e| e.outcome.is_some()).count();
    println!(
        "ledger: {} actions issued, {dispatched} dispatched, {twice} dispatched more than once, {outcomes} with an outcome",
        ledger.len()
    );
    match store.retained_from()? {
        Some(before) => println!(
            "retention: what happened before {} was dropped",
            lockstep::render::time(before)
        ),
        None => println!("retention: nothing dropped yet"),
    }
    if let Some(node) = node {
        for t in store.transitions(node)? {
            println!("{}", lockstep::render::transition(&t));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Where a replay or audit reads its records.
type Source = commands::RecordSource;

fn replay(
    source: &Source,
    start: Option<commands::Start>,
    opts: &ReplayOptions,
    quiet: bool,
) -> Result<ExitCode> {
    let records = source.window(start, Some("replaying"))?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut sink = std::io::sink();
    let target: &mut dyn Write = if quiet { &mut sink } else { &mut out };
    let report = commands::replay(records, opts, target, &mut |_| {})?;
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
            source.name()
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
    let reader = Source::File(input.to_owned()).records_with_progress(Some("converting"))?;
    // Written next to the output and renamed over it at the end: converting
    // a file onto itself reads all of it first, and a failure on the way
    // leaves the output as it was.
    let mut writer = log_writer(output)?;
    let mut n = 0u64;
    for rec in reader {
        let rec = rec.with_context(|| not_written(&input.display().to_string(), output))?;
        if let lockstep_schemas::Record::Header(h) = &rec {
            // Decoding drops the fields this build does not know; written
            // again, those events would no longer match their ids.
            let ours = (lockstep_schemas::SCHEMA_VERSION, log::SCHEMA_MINOR);
            if (h.schema_version, h.schema_minor) > ours {
                anyhow::bail!(
                    "{} was written by `{}` with schema version {}.{}, newer than this lockstep's {}.{}: converting it would drop the fields this build does not know; convert it with that lockstep or a newer one",
                    input.display(),
                    h.written_by,
                    h.schema_version,
                    h.schema_minor,
                    ours.0,
                    ours.1
                );
            }
            continue;
        }
        writer
            .write(&rec)
            .with_context(|| format!("writing {}", output.display()))?;
        n += 1;
    }
    finish(writer, output)?;
    eprintln!("wrote {n} records to {}", output.display());
    Ok(ExitCode::SUCCESS)
}

/// A log file written by this lockstep to a temporary file beside
/// `output`, in the format its name says; [`finish`] puts it in place.
fn log_writer(output: &Path) -> Result<LogWriter<lockstep::outfile::OutFile>> {
    let file = lockstep::outfile::OutFile::create(output)?;
    let written_by = concat!("lockstep ", env!("CARGO_PKG_VERSION"));
    LogWriter::new(file, Format::from_path(output), written_by)
        .with_context(|| format!("writing {}", output.display()))
}

/// The context of a read that failed while `output` was being written.
fn not_written(input: &str, output: &Path) -> String {
    format!("reading {input}; {} was not written", output.display())
}

/// Flushes a log writer and puts its file in place of the target.
fn finish(writer: LogWriter<lockstep::outfile::OutFile>, output: &Path) -> Result<()> {
    let file = writer
        .finish()
        .with_context(|| format!("writing {}", output.display()))?;
    file.commit()?;
    Ok(())
}

/// Every policy change of a log; a damaged log is an error here (a history
/// or a rollback must not silently stop short).
fn policy_changes(source: &Source) -> Result<Vec<lockstep::policies::PolicyChange>> {
    let (changes, damage) = lockstep::policies::changes(source.records()?);
    if let Some(e) = damage {
        anyhow::bail!("{}: {e}", source.name());
    }
    Ok(changes)
}

fn policy_history(source: &Source, json: bool) -> Result<ExitCode> {
    let changes = policy_changes(source)?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if json {
        for row in lockstep::policies::history_rows(&changes) {
            serde_json::to_writer(&mut out, &row)?;
            out.write_all(b"\n")?;
        }
    } else {
        out.write_all(lockstep::policies::render_history(&changes).as_bytes())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn policy_diff(
    a: &str,
    b: &str,
    log: Option<String>,
    config: Option<&Path>,
    json: bool,
) -> Result<ExitCode> {
    // Read the log once, and only when a side names a sequence.
    let mut changes: Option<Vec<lockstep::policies::PolicyChange>> = None;
    let mut resolve = |arg: &str| -> Result<(String, Policy)> {
        if let Ok(seq) = arg.parse::<u64>() {
            if changes.is_none() {
                if log.is_none() && config.is_none() {
                    anyhow::bail!(
                        "`{arg}` is a sequence: name the log (--log LOG or --config FILE)"
                    );
                }
                changes = Some(policy_changes(&Source::new(log.clone(), config)?)?);
            }
            let changes = changes.as_deref().unwrap_or_default();
            let (set_by, policy) = lockstep::policies::in_force(changes, seq);
            let what = match set_by {
                Some(c) => format!("seq {seq} (the policy set at seq {})", c.seq),
                None => format!("seq {seq} (the default policy: no change before it)"),
            };
            return Ok((what, policy));
        }
        Ok((format!("file {arg}"), Policy::from_file(Path::new(arg))?))
    };
    let (what_a, pa) = resolve(a)?;
    let (what_b, pb) = resolve(b)?;
    let d = lockstep::policies::diff(&pa, &pb);
    if json {
        println!(
            "{}",
            serde_json::json!({"a": what_a, "b": what_b, "changes": d})
        );
    } else {
        println!("policy {what_a} -> {what_b}:");
        print!("{}", lockstep::policies::render_diff(&d, "  "));
    }
    Ok(ExitCode::SUCCESS)
}

fn policy_rollback(seq: u64, config: &Path, by: Option<String>) -> Result<ExitCode> {
    let cfg = load_config(Some(config))?;
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    rt.block_on(async {
        let log = lockstep::storage::open_log(&cfg, std::time::Duration::ZERO).await.with_context(|| {
            match cfg.log.nats_url {
                Some(_) => "the rollback goes into the configured event log".to_owned(),
                None => "the embedded log has one user at a time: is `lockstep run` running with this configuration? Stop it first".to_owned(),
            }
        })?;
        let records = commands::log_records(&log, 1, None).await?;
        let head = records
            .iter()
            .filter_map(|r| match r {
                lockstep_schemas::Record::Event(e) => Some(e.seq),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let (changes, _) = lockstep::policies::changes(records.into_iter().map(Ok));
        let by = by.unwrap_or_else(lockstep::policies::who);
        let now_ms = lockstep_connectors::clock::now_ms();
        let (set_by, target) = lockstep::policies::in_force(&changes, seq);
        let (_, current) = lockstep::policies::in_force(&changes, head);
        let Some(env) = lockstep::policies::rollback_envelope(&changes, seq, head, &by, now_ms)?
        else {
            println!("the policy in force at seq {seq} is the one in force now: nothing to roll back");
            return Ok(ExitCode::SUCCESS);
        };
        let appended = log.append(&env).await.context("appending the rollback")?;
        log.flush().await?;
        let set_at = match set_by {
            Some(c) => format!("set at seq {}", c.seq),
            None => "the default policy".to_owned(),
        };
        println!(
            "appended seq {}: rollback to the policy in force at seq {seq} ({set_at}), by {by}",
            appended.seq
        );
        print!(
            "{}",
            lockstep::policies::render_diff(&lockstep::policies::diff(&current, &target), "  ")
        );
        if let Some(path) = &cfg.policy_file {
            // So that a restart, which appends the file's policy, keeps the
            // rollback. The service sees the file change and appends the
            // same policy again: a change that changes nothing.
            let mut file = lockstep::outfile::OutFile::create(path)?;
            serde_json::to_writer_pretty(&mut file, &target)?;
            file.write_all(b"\n")
                .with_context(|| format!("writing {}", path.display()))?;
            file.commit()?;
            println!("wrote it to the policy file {}", path.display());
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `audit --html` and `timeline --html`: replays, draws, writes the file
/// (through a temporary file, like every output).
fn write_html(
    source: &Source,
    scope: &lockstep::html::Scope,
    title: String,
    out: &Path,
) -> Result<ExitCode> {
    let mut scope = scope.clone();
    if scope.nodes.is_empty() {
        scope.nodes = lockstep::html::nodes_in(source.records()?, &scope);
    }
    let records = source.records_with_progress(Some("replaying"))?;
    let (page, damage) = lockstep::html::collect(records, &scope, title);
    let mut file = lockstep::outfile::OutFile::create(out)?;
    file.write_all(lockstep::html::render(&page).as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    file.commit()?;
    let (bands, ticks, arrows) = page.nodes.iter().fold((0, 0, 0), |(b, t, a), n| {
        (b + n.bands.len(), t + n.events.len(), a + n.actions.len())
    });
    eprintln!(
        "wrote {}: {} Slurm node(s), {bands} phase bands, {ticks} events, {arrows} actions",
        out.display(),
        page.nodes.len()
    );
    if let Some(e) = damage {
        eprintln!(
            "error: {}: {e} (the page covers the log up to there)",
            source.name()
        );
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}
