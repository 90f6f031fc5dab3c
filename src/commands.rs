//! The commands behind the CLI, writing to any `Write` so tests see exactly
//! what a user sees.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{Context, Result};
use lockstep_engine::replay::{Audit, Divergence, Replay, Step};
use lockstep_engine::Engine;
use lockstep_schemas::log::DecodeError;
use lockstep_schemas::{IssuedAction, Policy, Record};

use crate::render;

/// How `replay` should run.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// JSON Lines instead of text.
    pub json: bool,
    /// Print every event, not only those that caused something.
    pub all_events: bool,
    /// Compare recomputed actions with the recorded ones.
    pub verify: bool,
    /// Replay with this policy instead of the log's.
    pub policy: Option<Policy>,
}

/// How a replay ended.
#[derive(Debug)]
pub struct ReplayReport {
    /// Events applied.
    pub events: u64,
    /// Transitions.
    pub transitions: u64,
    /// Actions issued.
    pub actions: u64,
    /// Actions recorded in the log.
    pub recorded_actions: u64,
    /// State hash at the end.
    pub state_hash: String,
    /// With `verify` or `policy`: where recomputed and recorded actions differ.
    pub divergence: Option<Divergence>,
    /// Where the log was damaged, if it was; everything before was replayed.
    pub damage: Option<DecodeError>,
}

/// Folds a log, writing the timeline to `out`. `progress` is called with the
/// bytes read so far every few thousand records.
pub fn replay(
    reader: impl Iterator<Item = Result<Record, DecodeError>>,
    opts: &ReplayOptions,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Result<ReplayReport> {
    let mut engine = Engine::new(opts.policy.clone().unwrap_or_default());
    if opts.policy.is_some() {
        engine.pin_policy();
    }
    let mut replay = Replay::new(engine);
    if opts.verify || opts.policy.is_some() {
        replay = replay.verifying();
    }
    let what_if = opts.policy.is_some();
    let mut damage = None;
    let mut n = 0u64;
    let mut reader = reader;
    loop {
        let rec = match reader.next() {
            None => break,
            Some(Ok(rec)) => rec,
            Some(Err(e)) => {
                damage = Some(e);
                break;
            }
        };
        n += 1;
        if n.is_multiple_of(4096) {
            progress(n);
        }
        if let Step::Applied(ev, output) = replay.feed(&rec) {
            let productive = !output.transitions.is_empty() || !output.actions.is_empty();
            if opts.json {
                if productive || opts.all_events {
                    let row = render::TimelineRow::new(ev, &output.transitions, &output.actions);
                    serde_json::to_writer(&mut *out, &row)?;
                    out.write_all(b"\n")?;
                }
            } else if productive || opts.all_events {
                out.write_all(
                    render::timeline(ev, &output.transitions, &output.actions).as_bytes(),
                )?;
            }
        }
    }
    progress(n);
    let totals = replay.totals();
    let divergence = if opts.verify || what_if {
        replay.divergence()
    } else {
        None
    };
    if what_if {
        let diff = replay.what_if();
        if opts.json {
            serde_json::to_writer(&mut *out, &render::WhatIfRow::new(&diff))?;
            out.write_all(b"\n")?;
        } else {
            out.write_all(render::what_if(&diff).as_bytes())?;
        }
    }
    Ok(ReplayReport {
        events: totals.events,
        transitions: totals.transitions,
        actions: totals.actions,
        recorded_actions: totals.recorded_actions,
        state_hash: replay.engine().hash(),
        divergence,
        damage,
    })
}

/// Describes a divergence for a person.
pub fn describe_divergence(d: &Divergence) -> String {
    let show = |a: &Option<IssuedAction>| match a {
        Some(a) => format!(
            "{} (attempt {}, rule {}): {}",
            a.id,
            a.attempt,
            a.rule,
            a.action.describe()
        ),
        None => "nothing".to_owned(),
    };
    format!(
        "first divergence at seq {}:\n  recorded:   {}\n  recomputed: {}",
        d.seq,
        show(&d.recorded),
        show(&d.recomputed)
    )
}

/// Builds the causal chain of one Slurm node from a log.
pub fn audit(
    reader: impl Iterator<Item = Result<Record, DecodeError>>,
    node: &str,
    json: bool,
    out: &mut dyn Write,
) -> Result<Option<DecodeError>> {
    let mut replay = Replay::new(Engine::new(Policy::default()));
    let mut audit = Audit::new(node);
    let mut damage = None;
    for rec in reader {
        let rec = match rec {
            Ok(rec) => rec,
            Err(e) => {
                damage = Some(e);
                break;
            }
        };
        replay.feed(&rec);
        if let Record::Event(ev) = &rec {
            audit.observe(ev, replay.output(), replay.engine());
        }
    }
    if json {
        for e in audit.entries() {
            let row = match e {
                lockstep_engine::replay::AuditEntry::Event {
                    seq,
                    time_ms,
                    id,
                    summary,
                } => {
                    serde_json::json!({"type": "event", "seq": seq, "time_ms": time_ms, "id": id, "summary": summary})
                }
                lockstep_engine::replay::AuditEntry::Transition(t) => {
                    serde_json::json!({"type": "transition", "transition": t})
                }
                lockstep_engine::replay::AuditEntry::Action(a) => {
                    serde_json::json!({"type": "action", "action": a})
                }
            };
            serde_json::to_writer(&mut *out, &row)?;
            out.write_all(b"\n")?;
        }
    } else {
        out.write_all(render::audit(node, audit.entries()).as_bytes())?;
        let transitions = audit
            .entries()
            .iter()
            .any(|e| matches!(e, lockstep_engine::replay::AuditEntry::Transition(_)));
        if !transitions {
            writeln!(out, "(slurm node {node} has no transitions in this log)")?;
        }
    }
    Ok(damage)
}

/// Every record of an event log (events, each followed by the actions it
/// caused), for `replay`, `audit` and `export`.
pub async fn log_records(
    log: &lockstep_store::EventLog,
    from: u64,
    to: Option<u64>,
) -> Result<Vec<Record>> {
    let head = log.head().await?;
    let to = to.unwrap_or(head).min(head);
    let mut actions: BTreeMap<u64, Vec<IssuedAction>> = BTreeMap::new();
    for a in log.actions().await? {
        actions.entry(a.seq).or_default().push(a);
    }
    let mut out = vec![Record::Header(lockstep_schemas::log::LogHeader::current(
        concat!("lockstep ", env!("CARGO_PKG_VERSION")),
    ))];
    let mut next = from.max(1);
    while next <= to {
        let batch = log
            .read(next, 4096, std::time::Duration::from_secs(5))
            .await?;
        if batch.is_empty() {
            anyhow::bail!("the log stopped at seq {} before its head {to}", next - 1);
        }
        for rec in batch.into_iter().filter(|r| r.seq <= to) {
            next = rec.seq + 1;
            let seq = rec.seq;
            out.push(Record::Event(rec));
            out.extend(
                actions
                    .remove(&seq)
                    .unwrap_or_default()
                    .into_iter()
                    .map(Record::Action),
            );
        }
    }
    Ok(out)
}

/// Reads a policy file (JSON).
pub fn read_policy(path: &std::path::Path) -> Result<Policy> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading policy {}", path.display()))?;
    Policy::from_json(&text).with_context(|| format!("in policy {}", path.display()))
}

/// Where a replay, an audit or a history reads its records: a log file, or
/// the event log of a configuration (embedded or NATS) or a NATS URL.
pub enum RecordSource {
    /// A log file (JSON Lines or MessagePack).
    File(std::path::PathBuf),
    /// A configured event log, and the name to show for it.
    Log(Box<crate::config::Config>, String),
}

impl RecordSource {
    /// From a `LOG` argument (a file or `nats://`) or `--config`.
    pub fn new(log: Option<String>, config: Option<&std::path::Path>) -> Result<Self> {
        match (log, config) {
            (Some(url), _) if url.starts_with("nats://") => {
                let mut cfg = crate::config::Config::default();
                cfg.log.nats_url = Some(url.clone());
                Ok(Self::Log(Box::new(cfg), url))
            }
            (Some(path), _) => Ok(Self::File(std::path::PathBuf::from(path))),
            (None, Some(cfg)) => Ok(Self::Log(
                Box::new(crate::config::Config::load(cfg)?),
                cfg.display().to_string(),
            )),
            (None, None) => anyhow::bail!("name a log file, a nats:// URL, or --config"),
        }
    }

    /// For messages.
    pub fn name(&self) -> String {
        match self {
            Self::File(p) => p.display().to_string(),
            Self::Log(_, name) => name.clone(),
        }
    }

    /// The records, in order.
    pub fn records(&self) -> Result<Records> {
        self.records_with_progress(None)
    }

    /// The records, with a progress bar labelled `what` on a terminal (by
    /// bytes for a file, by records for a configured log); none when
    /// stderr is not a terminal.
    pub fn records_with_progress(&self, what: Option<&'static str>) -> Result<Records> {
        match self {
            Self::File(path) => {
                let name = path.display().to_string();
                let reader = lockstep_schemas::log::open(path)
                    .with_context(|| format!("opening log {}", path.display()))?
                    .on_warning(move |w| eprintln!("warning: {name}: {w}"));
                let len = std::fs::metadata(path).map_or(0, |m| m.len());
                let bar = what.and_then(|w| progress_bar(len, true, w));
                Ok(Box::new(Tracked { reader, bar, n: 0 }))
            }
            Self::Log(cfg, _) => {
                let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
                let records = rt.block_on(async {
                    let log = crate::service::open_log(cfg).await?;
                    log_records(&log, 1, None).await
                })?;
                let bar = what.and_then(|w| progress_bar(records.len() as u64, false, w));
                Ok(Box::new(Counted {
                    inner: records.into_iter(),
                    bar,
                    n: 0,
                }))
            }
        }
    }
}

/// Records as a source hands them out.
pub type Records = Box<dyn Iterator<Item = Result<Record, DecodeError>>>;

/// Records between two updates of a progress bar.
const PROGRESS_EVERY_RECORDS: u64 = 4096;

/// A progress bar on stderr when it is a terminal; `None` when piped or
/// redirected (a log file or a pipe gets no control characters).
pub fn progress_bar(len: u64, bytes: bool, what: &'static str) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let template = if bytes {
        "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)"
    } else {
        "{msg} [{bar:40}] {pos}/{len} records ({per_sec}, {eta} left)"
    };
    let bar = indicatif::ProgressBar::new(len.max(1));
    bar.set_style(
        indicatif::ProgressStyle::with_template(template)
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(what);
    Some(bar)
}

/// A log file's records, moving a bar by the bytes read.
struct Tracked<R: std::io::BufRead> {
    reader: lockstep_schemas::log::LogReader<R>,
    bar: Option<indicatif::ProgressBar>,
    n: u64,
}

impl<R: std::io::BufRead> Iterator for Tracked<R> {
    type Item = Result<Record, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.reader.next();
        if let Some(bar) = &self.bar {
            self.n += 1;
            if item.is_none() {
                bar.finish_and_clear();
            } else if self.n.is_multiple_of(PROGRESS_EVERY_RECORDS) {
                bar.set_position(self.reader.bytes_read());
            }
        }
        item
    }
}

impl<R: std::io::BufRead> Drop for Tracked<R> {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Records in memory, moving a bar by their count.
struct Counted {
    inner: std::vec::IntoIter<Record>,
    bar: Option<indicatif::ProgressBar>,
    n: u64,
}

impl Iterator for Counted {
    type Item = Result<Record, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.inner.next();
        if let Some(bar) = &self.bar {
            self.n += 1;
            if item.is_none() {
                bar.finish_and_clear();
            } else if self.n.is_multiple_of(PROGRESS_EVERY_RECORDS) {
                bar.set_position(self.n);
            }
        }
        item.map(Ok)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
