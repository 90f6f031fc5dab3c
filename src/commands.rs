//! The commands behind the CLI, writing to any `Write` so tests see exactly
//! what a user sees.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{Context, Result};
use lockstep_engine::replay::{Audit, Divergence, Replay, ReplayError, Step};
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

/// Where a log could not be followed further: everything before it was
/// replayed.
#[derive(Debug, thiserror::Error)]
pub enum Damage {
    /// A record does not read.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The log's snapshot cannot become the state.
    #[error(transparent)]
    Snapshot(#[from] ReplayError),
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
    pub damage: Option<Damage>,
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
                damage = Some(e.into());
                break;
            }
        };
        n += 1;
        if n.is_multiple_of(4096) {
            progress(n);
        }
        let step = match replay.feed(&rec) {
            Ok(step) => step,
            Err(e) => {
                damage = Some(e.into());
                break;
            }
        };
        if let Step::Applied(ev, output) = step {
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
) -> Result<Option<Damage>> {
    let mut replay = Replay::new(Engine::new(Policy::default()));
    let mut audit = Audit::new(node);
    let mut damage = None;
    for rec in reader {
        let rec = match rec {
            Ok(rec) => rec,
            Err(e) => {
                damage = Some(e.into());
                break;
            }
        };
        if let Err(e) = replay.feed(&rec) {
            damage = Some(e.into());
            break;
        }
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

/// Where a window of a log starts (`--from SEQ`, `--since TIME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The first event at or after this sequence.
    Seq(u64),
    /// The first event at or after this log time (ms since the Unix epoch).
    Time(u64),
}

impl Start {
    /// From `--from` or `--since` (at most one); `None` for neither: the
    /// whole log. `--since` is an RFC 3339 time (`2026-12-03T04:00:00Z`)
    /// or a duration before `now_ms` (`90m`, `1h 30m`, `2days`).
    pub fn from_args(from: Option<u64>, since: Option<&str>, now_ms: u64) -> Result<Option<Self>> {
        Ok(match (from, since) {
            (Some(seq), _) => Some(Self::Seq(seq)),
            (None, Some(text)) => Some(Self::Time(parse_since(text, now_ms)?)),
            (None, None) => None,
        })
    }

    fn reached(self, ev: &lockstep_schemas::EventRecord) -> bool {
        match self {
            Self::Seq(seq) => ev.seq >= seq,
            Self::Time(ms) => ev.time_ms >= ms,
        }
    }
}

impl std::fmt::Display for Start {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Seq(seq) => write!(f, "seq {seq}"),
            Self::Time(ms) => write!(f, "{}", render::time(*ms)),
        }
    }
}

/// `--since`: an RFC 3339 time, or a duration before `now_ms`.
fn parse_since(text: &str, now_ms: u64) -> Result<u64> {
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        let since = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| anyhow::anyhow!("--since {text}: before 1970"))?;
        return Ok(u64::try_from(since.as_millis()).unwrap_or(u64::MAX));
    }
    match humantime::parse_duration(text) {
        Ok(ago) => Ok(now_ms.saturating_sub(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX))),
        Err(e) => anyhow::bail!(
            "--since {text}: neither a time (2026-12-03T04:00:00Z) nor a duration before now (90m, 1h 30m): {e}"
        ),
    }
}

/// The records of a window of a log, as a file that replays alone: the
/// header, then the state just before the window's first event as
/// snapshot records (none when nothing comes before it), then the
/// window's events and the actions they caused. What comes before the
/// window is folded here, silently, from the source's start (its own
/// snapshot, if it has one). A log that ends before the window starts is
/// an error.
pub fn window(records: Records, start: Start) -> Result<Records> {
    window_after(Engine::new(Policy::default()), records, start)
}

/// [`window`] of records that follow the state `engine` holds (a snapshot
/// read from beside the log): it is folded on without being encoded into
/// the records and decoded again.
fn window_after(engine: Engine, records: Records, start: Start) -> Result<Records> {
    let mut replay = Replay::new(engine);
    let mut header = None;
    let mut records = records;
    let first = loop {
        let rec = match records.next() {
            None => {
                let last = replay.engine().last_seq();
                anyhow::bail!(
                    "the log ends at seq {last} ({}), before the window's start at {start}",
                    render::time(replay.engine().now_ms())
                );
            }
            Some(rec) => rec?,
        };
        match &rec {
            Record::Header(h) => header = Some(h.clone()),
            Record::Event(ev) if start.reached(ev) => break rec,
            _ => {
                replay.feed(&rec)?;
            }
        }
    };
    let header = header.ok_or_else(|| anyhow::anyhow!("the log has no header"))?;
    let engine = replay.engine();
    let state: Vec<Record> = if engine.last_seq() == 0 {
        Vec::new()
    } else {
        lockstep_engine::replay::snapshot_parts(engine)
            .into_iter()
            .map(Record::Snapshot)
            .collect()
    };
    let head = std::iter::once(Record::Header(header))
        .chain(state)
        .chain(std::iter::once(first))
        .map(Ok);
    Ok(Box::new(head.chain(records)))
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
                // Decoded on a second thread while the caller applies.
                Ok(Box::new(lockstep_schemas::log::read_ahead(Tracked {
                    reader,
                    bar,
                    n: 0,
                })))
            }
            Self::Log(cfg, _) => Ok(Self::log_records(cfg, None, what)?.1),
        }
    }

    /// The records of the window that `start` opens (the whole log for
    /// `None`), as [`window`] gives them. A configured log starts from the
    /// newest snapshot kept beside it before the window instead of its
    /// first record.
    pub fn window(&self, start: Option<Start>, what: Option<&'static str>) -> Result<Records> {
        match (self, start) {
            (_, None) => self.records_with_progress(what),
            (Self::File(_), Some(start)) => window(self.records_with_progress(what)?, start),
            (Self::Log(cfg, _), Some(start)) => {
                let (engine, records) = Self::log_records(cfg, Some(start), what)?;
                window_after(
                    engine.unwrap_or_else(|| Engine::new(Policy::default())),
                    records,
                    start,
                )
            }
        }
    }

    /// A configured log's records from the state [`start_state`] finds
    /// (that state, if any, and the records after it). Without a window,
    /// the state goes into the records as snapshot records, for readers
    /// that build their own engine.
    fn log_records(
        cfg: &crate::config::Config,
        start: Option<Start>,
        what: Option<&'static str>,
    ) -> Result<(Option<Engine>, Records)> {
        let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
        let (mut engine, mut records) = rt.block_on(async {
            let log = crate::storage::open_log(cfg, std::time::Duration::ZERO).await?;
            let (engine, from) = match start_state(&log, start).await? {
                Some((engine, seq)) => (Some(engine), seq + 1),
                None => (None, 1),
            };
            anyhow::Ok((engine, log_records(&log, from, None).await?))
        })?;
        if start.is_none() {
            if let Some(engine) = engine.take() {
                let parts = lockstep_engine::replay::snapshot_parts(&engine);
                records.splice(1..1, parts.into_iter().map(Record::Snapshot));
            }
        }
        let bar = what.and_then(|w| progress_bar(records.len() as u64, false, w));
        let records: Records = Box::new(Counted {
            inner: records.into_iter(),
            bar,
            n: 0,
        });
        Ok((engine, records))
    }
}

/// The state a replay of a configured log starts from, and its sequence:
/// the newest snapshot kept beside the log before `start`'s window, or,
/// for the whole log, the oldest one, when the log's retention has
/// discarded its first records. `None`: fold the log from its first
/// record. Says on stderr when the log's first records are gone and no
/// snapshot covers them.
async fn start_state(
    log: &lockstep_store::EventLog,
    start: Option<Start>,
) -> Result<Option<(Engine, u64)>> {
    let state = log.state().await.context("reading the event log's state")?;
    let snapshots = log
        .snapshots()
        .await
        .context("listing the snapshots kept beside the event log")?;
    // The log continues it, and holds what it covers.
    let usable = |s: &&lockstep_store::snapshots::SnapshotInfo| {
        s.layout == lockstep_engine::LAYOUT
            && s.seq + 1 >= state.first_seq
            && s.seq <= state.last_seq
    };
    let chosen = match start {
        None if state.first_seq <= 1 => None,
        None => snapshots.iter().find(usable),
        Some(Start::Seq(seq)) => snapshots.iter().rev().filter(usable).find(|s| s.seq < seq),
        Some(Start::Time(ms)) => {
            // Log times never go back: a snapshot whose record is before
            // the time covers nothing of the window. One whose record the
            // log no longer holds is the best start the log has.
            let mut chosen = None;
            for s in snapshots.iter().rev().filter(usable) {
                let at = log
                    .read(s.seq, 1, std::time::Duration::from_secs(5))
                    .await?;
                if at.first().is_none_or(|r| r.seq > s.seq || r.time_ms < ms) {
                    chosen = Some(s);
                    break;
                }
            }
            chosen
        }
    };
    if state.first_seq > 1 {
        if let Some(first) = log
            .read(state.first_seq, 1, std::time::Duration::from_secs(5))
            .await?
            .first()
        {
            eprintln!(
                "beyond retention: the log's records before seq {} were discarded; oldest kept: seq {} at {}",
                state.first_seq,
                first.seq,
                render::time(first.time_ms)
            );
        }
    }
    let Some(snapshot) = chosen else {
        if state.first_seq > 1 {
            eprintln!(
                "warning: the log holds seq {} to {}; its retention discarded the records before, and no snapshot kept beside it covers them: the state is folded from seq {} on, without what came before",
                state.first_seq, state.last_seq, state.first_seq
            );
        }
        return Ok(None);
    };
    let path = std::env::temp_dir().join(format!(
        "lockstep-{}-{}.checkpoint",
        std::process::id(),
        snapshot.name
    ));
    let fetched = async {
        log.fetch_snapshot(&snapshot.name, &path).await?;
        let (seq, engine) = lockstep_store::read_checkpoint_file(&path, |r| {
            Engine::restore_from(std::io::BufReader::with_capacity(256 << 10, r))
        })?;
        anyhow::Ok((engine?, seq))
    }
    .await;
    let _ = std::fs::remove_file(&path);
    let (engine, seq) = fetched
        .with_context(|| format!("reading snapshot {} kept beside the log", snapshot.name))?;
    eprintln!(
        "starting from the snapshot of seq {seq} kept beside the log (state hash {})",
        snapshot.state_hash
    );
    Ok(Some((engine, seq)))
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
