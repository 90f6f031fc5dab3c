//! `kubectl lockstep`: the same binary invoked as `kubectl-lockstep` (a
//! symlink on `PATH`, which is how kubectl finds plugins).
//!
//! - `kubectl lockstep why NODE`: why the Slurm nodes on Kubernetes node NODE
//!   (or Slurm node NODE) are where they are: the running service's answer
//!   (`/status`, `/why/NODE`: phase, placement, actions in flight, the audit
//!   index's last transitions), or, with `--config` / `--log`, the full
//!   causal chain from a replay of the log.
//! - `kubectl lockstep status`: the running service's `/status`.
//!
//! This module reads and prints; it never changes anything, in lockstep or
//! in the cluster.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

/// Where the service answers when nothing else is said: what
/// `kubectl -n lockstep port-forward deploy/lockstep 9464` gives.
pub const DEFAULT_URL: &str = "http://127.0.0.1:9464";

/// kubectl lockstep: why Slurm nodes on a Kubernetes node are drained, and
/// how lockstep is doing.
#[derive(Parser)]
#[command(
    name = "kubectl lockstep",
    bin_name = "kubectl lockstep",
    version,
    about
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Why the Slurm nodes on a Kubernetes node (or one Slurm node) are where
    /// they are: phase, actions in flight and the transitions behind them.
    Why {
        /// A Kubernetes node, or a Slurm node.
        node: String,
        /// The running service's telemetry endpoint (default
        /// `$LOCKSTEP_URL`, else http://127.0.0.1:9464, as
        /// `kubectl -n lockstep port-forward deploy/lockstep 9464` gives).
        #[arg(long, value_name = "URL", conflicts_with_all = ["config", "log"])]
        url: Option<String>,
        /// Replay this configuration's event log instead (the full causal
        /// chain: event -> transition -> action -> outcome).
        #[arg(long, value_name = "FILE", conflicts_with = "log")]
        config: Option<PathBuf>,
        /// Replay this log instead: a file or `nats://HOST:PORT`.
        #[arg(long, value_name = "LOG")]
        log: Option<String>,
        /// Print the service's answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The running service: leader, ready, applied and head sequences, lag,
    /// Slurm nodes by phase, actions in flight.
    Status {
        /// The telemetry endpoint (as for `why`).
        #[arg(long, value_name = "URL")]
        url: Option<String>,
    },
}

/// Whether this process was started as the kubectl plugin.
pub fn invoked_as_plugin() -> bool {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
        .is_some_and(|name| name.starts_with("kubectl-lockstep"))
}

/// The plugin's main.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn url(given: Option<String>) -> String {
    given
        .or_else(|| std::env::var("LOCKSTEP_URL").ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| DEFAULT_URL.to_owned())
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Status { url: u } => {
            let base = url(u);
            let status = get_json(&base, "/status")?;
            print!("{}", render_status(&base, &status));
            Ok(ExitCode::SUCCESS)
        }
        Command::Why {
            node,
            url: u,
            config,
            log,
            json,
        } => {
            if config.is_some() || log.is_some() {
                return why_from_log(&node, log, config);
            }
            let base = url(u);
            let status = get_json(&base, "/status")?;
            let answer = get_json(&base, &format!("/why/{node}"))?;
            if json {
                println!("{answer}");
            } else {
                print!("{}", render_status(&base, &status));
                print!("{}", render_why(&node, &answer));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// How long the service may take to answer.
const HTTP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);
/// The largest answer read.
const HTTP_BODY_BYTES_MAX: u64 = 64 << 20;

/// `GET base + path`, parsed as JSON. Plain HTTP on the telemetry port.
fn get_json(base: &str, path: &str) -> Result<serde_json::Value> {
    use std::io::{Read, Write};
    let hostport = base
        .strip_prefix("http://")
        .with_context(|| format!("{base}: only http:// URLs (lockstep's telemetry endpoint)"))?
        .trim_end_matches('/');
    let unreachable = || {
        format!("cannot reach lockstep at {base}: port-forward it (kubectl -n lockstep port-forward deploy/lockstep 9464), pass --url, or replay its log with --config / --log")
    };
    let addr = std::net::ToSocketAddrs::to_socket_addrs(hostport)
        .with_context(unreachable)?
        .next()
        .with_context(unreachable)?;
    let mut s =
        std::net::TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).with_context(unreachable)?;
    s.set_read_timeout(Some(HTTP_TIMEOUT))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {hostport}\r\n\r\n").as_bytes())
        .with_context(unreachable)?;
    let mut buf = Vec::new();
    s.take(HTTP_BODY_BYTES_MAX)
        .read_to_end(&mut buf)
        .with_context(|| format!("reading {base}{path}"))?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("{base}{path}: not an HTTP answer"))?;
    let status = head.split_whitespace().nth(1).unwrap_or("?");
    let value: serde_json::Value = serde_json::from_str(body.trim())
        .with_context(|| format!("{base}{path} answered {status}: {}", body.trim()))?;
    if status != "200" {
        bail!(
            "{base}{path} answered {status}: {}",
            value["error"].as_str().unwrap_or(body.trim())
        );
    }
    Ok(value)
}

/// The `/status` document for a person.
pub fn render_status(base: &str, s: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let applied = s["applied_seq"].as_u64().unwrap_or(0);
    let head = s["head_seq"].as_u64().unwrap_or(0);
    let _ = writeln!(
        out,
        "lockstep at {base}: {}, {}; applied seq {applied} of {head} (lag {}), checkpoint at seq {}",
        if s["leader"] == true { "leader" } else { "follower" },
        if s["ready"] == true {
            "ready"
        } else {
            "catching up"
        },
        head.saturating_sub(applied),
        s["checkpoint_seq"].as_u64().unwrap_or(0),
    );
    if let Some(phases) = s["phases"].as_object() {
        let list: Vec<String> = phases.iter().map(|(p, n)| format!("{p} {n}")).collect();
        let _ = writeln!(out, "slurm nodes: {}", list.join(", "));
    }
    if s.get("actions_in_flight").is_some() {
        let seen = |v: &serde_json::Value| if v == true { "sees" } else { "does NOT see" };
        let _ = writeln!(
            out,
            "actions in flight: {}; {} Slurm, {} Kubernetes",
            s["actions_in_flight"],
            seen(&s["slurm_visible"]),
            seen(&s["kube_visible"])
        );
    }
    out
}

/// The `/why/NODE` answer for a person.
pub fn render_why(node: &str, a: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let nodes = a["slurm_nodes"].as_array().cloned().unwrap_or_default();
    if nodes.is_empty() {
        let _ = writeln!(
            out,
            "no Slurm node is {node} or runs on Kubernetes node {node} (as of seq {})",
            a["applied_seq"]
        );
        return out;
    }
    for n in &nodes {
        let name = n["slurm_node"].as_str().unwrap_or("?");
        let on = n["kube_node"].as_str().unwrap_or("(no Kubernetes node)");
        let _ = writeln!(
            out,
            "\nslurm node {name} on {on}{}: {} ({} jobs)",
            n["pod"]
                .as_str()
                .map(|p| format!(", pod {p}"))
                .unwrap_or_default(),
            n["phase"].as_str().unwrap_or("?"),
            n["jobs"]
        );
        for id in n["in_flight"].as_array().into_iter().flatten() {
            let _ = writeln!(out, "  in flight: {}", id.as_str().unwrap_or("?"));
        }
        let transitions = n["transitions"].as_array().cloned().unwrap_or_default();
        if transitions.is_empty() {
            let _ = writeln!(out, "  no transition in the audit index");
        }
        for t in &transitions {
            let Ok(t) = serde_json::from_value::<lockstep_engine::Transition>(t.clone()) else {
                let _ = writeln!(out, "  {t}");
                continue;
            };
            let _ = writeln!(
                out,
                "  {}  seq {:<6} {} -> {} [{}] {} (cause event {})",
                crate::render::time(t.time_ms),
                t.seq,
                t.from,
                t.to,
                t.rule,
                t.detail,
                t.cause
            );
        }
        if let Some(e) = n["audit_error"].as_str() {
            let _ = writeln!(out, "  (the audit index could not be read: {e})");
        }
    }
    out
}

/// `why` from a replay of a log: the Slurm nodes that are `node` or ran
/// on it, each with its whole causal chain.
fn why_from_log(node: &str, log: Option<String>, config: Option<PathBuf>) -> Result<ExitCode> {
    let source = crate::commands::RecordSource::new(log, config.as_deref())?;
    // First pass: which Slurm nodes. Second: their chains.
    let mut replay = lockstep_engine::replay::Replay::new(lockstep_engine::Engine::new(
        lockstep_schemas::Policy::default(),
    ));
    let mut on: std::collections::BTreeSet<String> = Default::default();
    for rec in source.records()? {
        let rec = rec.with_context(|| format!("reading {}", source.name()))?;
        replay
            .feed(&rec)
            .with_context(|| format!("replaying {}", source.name()))?;
        if let lockstep_schemas::Record::Event(_) = rec {
            for t in &replay.output().transitions {
                let e = replay.engine();
                if t.node == node || e.placement(&t.node).as_deref() == Some(node) {
                    on.insert(t.node.clone());
                }
            }
        }
    }
    if on.is_empty() {
        println!(
            "no Slurm node is {node} or ran on Kubernetes node {node} in {}",
            source.name()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let scope = crate::html::Scope {
        nodes: on.into_iter().collect(),
        ..Default::default()
    };
    let (page, damage) = crate::html::collect(source.records()?, &scope, String::new());
    println!(
        "{} in {}: {} Slurm node(s): {}",
        node,
        source.name(),
        scope.nodes.len(),
        scope.nodes.join(", ")
    );
    for (_, chain) in &page.chains {
        println!();
        print!("{chain}");
    }
    if let Some(e) = damage {
        eprintln!(
            "error: {}: {e} (the chain covers the log up to there)",
            source.name()
        );
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}
