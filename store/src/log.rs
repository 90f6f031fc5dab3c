//! The event log: one total order of envelopes, and the stream of issued
//! actions beside it.
//!
//! Two implementations behind one type:
//! - NATS JetStream: streams `LOCKSTEP` (observations, subjects `ls.obs.>`)
//!   and `LOCKSTEP_ACTIONS` (subjects `ls.act.>`), file storage, published
//!   with `Nats-Msg-Id` = the event or action id so a re-publish is
//!   deduplicated. The record's time is the server's stored timestamp.
//!   On a JetStream cluster each stream is a raft group of
//!   [`StreamLimits::replicas`] servers: a publish is acknowledged once a
//!   majority stored it, the sequence and the deduplication window are the
//!   group's, so a leader change loses no acknowledged record and makes no
//!   re-publish a second record. The client is given every server of the
//!   cluster (a comma-separated URL list) and moves to another when one dies.
//! - Embedded (sled): the same contract in a local directory, the default
//!   when no NATS URL is configured. The record's time is the append time on
//!   this machine.
//!
//! This module owns ordering and deduplication; it never interprets events.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use lockstep_schemas::{Envelope, EventRecord, IssuedAction};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, Notify};

/// Stream name of observations.
pub const EVENTS_STREAM: &str = "LOCKSTEP";
/// Stream name of issued actions.
pub const ACTIONS_STREAM: &str = "LOCKSTEP_ACTIONS";

/// Errors of the event log.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The embedded log's database failed.
    #[error("embedded log")]
    Sled(#[from] sled::Error),
    /// A sled transaction failed.
    #[error("embedded log transaction: {0}")]
    Transaction(String),
    /// Connecting to NATS failed (retryable).
    #[error("connecting to nats at {url}")]
    Connect {
        /// Server URL.
        url: String,
        /// Cause.
        #[source]
        source: async_nats::ConnectError,
    },
    /// A JetStream request failed (retryable: the server may be restarting).
    #[error("jetstream {what}: {message}")]
    JetStream {
        /// What was being done.
        what: &'static str,
        /// The error.
        message: String,
    },
    /// A stream exists with a configuration lockstep cannot use.
    #[error("stream {stream} exists with subjects {found:?}; lockstep needs {wanted:?} (delete or fix the stream)")]
    StreamMismatch {
        /// Stream name.
        stream: String,
        /// Its subjects.
        found: Vec<String>,
        /// The subjects lockstep uses.
        wanted: Vec<String>,
    },
    /// Keeping, listing or reading a snapshot failed.
    #[error("snapshots: {0}")]
    Snapshot(String),
    /// A stored record does not decode.
    #[error("record at seq {seq} does not decode")]
    Decode {
        /// Sequence.
        seq: u64,
        /// Cause.
        #[source]
        source: rmp_serde::decode::Error,
    },
}

impl Error {
    /// Whether trying again later may help.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Connect { .. } | Self::JetStream { .. })
    }
}

/// `Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn js_err(what: &'static str) -> impl FnOnce(String) -> Error {
    move |message| Error::JetStream { what, message }
}

/// Says what an unanswered JetStream API request most often means on a
/// cluster, so that an operator reading `/readyz` or the log knows where to
/// look.
fn with_quorum_hint(message: String) -> String {
    let lower = message.to_lowercase();
    if lower.contains("timed out")
        || lower.contains("no responders")
        || lower.contains("temporarily unavailable")
        || lower.contains("insufficient resources")
    {
        format!("{message} (JetStream does not answer: no server reachable, or fewer than a majority of the cluster's servers up)")
    } else {
        message
    }
}

/// Limits of the JetStream streams. lockstep creates both streams with
/// these, and brings an existing stream to them when they differ (JetStream
/// allows changing each of them on a live stream, the replica count too).
#[derive(Debug, Clone)]
pub struct StreamLimits {
    /// How long a message id is remembered for deduplication.
    pub duplicate_window: Duration,
    /// Messages older than this are discarded (0: kept forever).
    pub max_age: Duration,
    /// Size bound of each stream in bytes (-1: unbounded).
    pub max_bytes: i64,
    /// Servers that hold a copy of each stream (1, 3 or 5). With 3, one
    /// server may fail (or be restarted, or cut off) while the log goes on;
    /// it needs a JetStream cluster of at least that many servers.
    pub replicas: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            duplicate_window: Duration::from_secs(120),
            max_age: Duration::from_secs(30 * 24 * 3600),
            max_bytes: 8 << 30,
            replicas: 1,
        }
    }
}

/// The servers of a comma-separated URL list (`nats://a:4222,nats://b:4222`),
/// without blanks and empty entries.
pub fn server_urls(url: &str) -> Vec<&str> {
    url.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The record's sequence (the original's, for a duplicate).
    pub seq: u64,
    /// The envelope was already in the log (same id); nothing was added.
    pub duplicate: bool,
}

/// Which log this is, and the sequences it holds: what tells a log that
/// went back, was created anew or lost records in the middle from one that
/// only grew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogState {
    /// Names this log for as long as it exists: the stream's creation time
    /// (NATS; kept by a backup and its restore), or an id written when the
    /// embedded log was created. A stream deleted and created again, or an
    /// embedded log directory replaced, is another log.
    pub id: String,
    /// The first sequence it holds (`last_seq + 1` when it holds none: a
    /// new log, or one whose records were all discarded).
    pub first_seq: u64,
    /// The last sequence it ever gave a record (0 when it never did).
    pub last_seq: u64,
    /// The bytes of the records it holds (0 for the embedded log, which
    /// does not count them).
    pub bytes: u64,
}

/// The event log.
#[derive(Clone)]
pub enum EventLog {
    /// Embedded in a local directory.
    Embedded(Arc<Embedded>),
    /// NATS JetStream.
    Nats(Arc<Nats>),
}

impl EventLog {
    /// Opens (creating if needed) the embedded log in `dir`. Fails at once
    /// while another holds it ([`Self::open_embedded_waiting`]).
    pub fn open_embedded(dir: &Path) -> Result<Self> {
        Self::open_embedded_waiting(dir, Duration::ZERO)
    }

    /// [`Self::open_embedded`], waiting up to `wait` while its lock is held:
    /// by a process killed a moment ago, or by a handle of this process
    /// dropped a moment ago (the database's threads let go of its files a
    /// little after). A lock still held after `wait` is another live user.
    pub fn open_embedded_waiting(dir: &Path, wait: Duration) -> Result<Self> {
        Ok(Self::Embedded(Arc::new(Embedded::open(dir, wait)?)))
    }

    /// Connects to NATS (`url`: one server, or a comma-separated list of
    /// the servers of a cluster) and creates or checks the two streams.
    ///
    /// Fails with a retryable error while JetStream cannot answer (no
    /// server reachable, or a cluster without a majority of its servers:
    /// no meta leader to create or find a stream).
    pub async fn connect_nats(url: &str, limits: &StreamLimits) -> Result<Self> {
        Ok(Self::Nats(Arc::new(Nats::connect(url, limits).await?)))
    }

    /// Appends one envelope, deduplicated by its id.
    pub async fn append(&self, envelope: &Envelope) -> Result<Appended> {
        match self {
            Self::Embedded(e) => e.append(envelope),
            Self::Nats(n) => n.append(envelope).await,
        }
    }

    /// Appends envelopes in order, each deduplicated by its id. To NATS all
    /// are sent before the first ack is awaited, one round trip for the
    /// lot where [`EventLog::append`] waits for each in turn. After an error
    /// some may have landed: appending the same envelopes again adds only
    /// the others (their ids deduplicate), though one that failed may then
    /// land after one that followed it.
    pub async fn append_all(&self, envelopes: &[Envelope]) -> Result<Vec<Appended>> {
        match self {
            Self::Embedded(e) => envelopes.iter().map(|env| e.append(env)).collect(),
            Self::Nats(n) => n.append_all(envelopes).await,
        }
    }

    /// Up to `max` records with sequence `>= from`, waiting up to `wait` for
    /// the first one. Empty when nothing arrived in time.
    pub async fn read(&self, from: u64, max: usize, wait: Duration) -> Result<Vec<EventRecord>> {
        match self {
            Self::Embedded(e) => e.read(from, max, wait).await,
            Self::Nats(n) => n.read(from, max, wait).await,
        }
    }

    /// The last sequence in the log (0 when empty).
    pub async fn head(&self) -> Result<u64> {
        match self {
            Self::Embedded(e) => e.head(),
            Self::Nats(n) => n.head().await,
        }
    }

    /// Which log this is and the range of sequences it holds.
    pub async fn state(&self) -> Result<LogState> {
        match self {
            Self::Embedded(e) => e.state(),
            Self::Nats(n) => n.state().await,
        }
    }

    /// The id of the envelope at exactly `seq`; `None` when the log holds
    /// no record there (discarded, deleted, or never written).
    pub async fn envelope_id_at(&self, seq: u64) -> Result<Option<String>> {
        match self {
            Self::Embedded(e) => e.envelope_id_at(seq),
            Self::Nats(n) => n.envelope_id_at(seq).await,
        }
    }

    /// The snapshots kept beside the log, oldest first (the embedded log
    /// keeps them in its directory, under `snapshots/`).
    pub async fn snapshots(&self) -> Result<Vec<crate::snapshots::SnapshotInfo>> {
        match self {
            Self::Embedded(e) => crate::snapshots::files::list(&e.snapshot_dir()),
            Self::Nats(n) => crate::snapshots::list(&n.js).await,
        }
    }

    /// Keeps the checkpoint file `file` as a snapshot beside the log, then
    /// deletes all but the newest `keep`.
    pub async fn put_snapshot(
        &self,
        file: &Path,
        meta: &crate::snapshots::SnapshotInfo,
        keep: usize,
    ) -> Result<()> {
        match self {
            Self::Embedded(e) => {
                // Copied and synced on a blocking thread, not on the
                // runtime's.
                let (dir, file, meta) = (e.snapshot_dir(), file.to_owned(), meta.clone());
                tokio::task::spawn_blocking(move || {
                    crate::snapshots::files::put(&dir, &file, &meta, keep)
                })
                .await
                .map_err(|e| Error::Snapshot(format!("keeping a snapshot stopped: {e}")))?
            }
            Self::Nats(n) => crate::snapshots::put(&n.js, n.replicas, file, meta, keep).await,
        }
    }

    /// Appends to the embedded log with this log time (at least the last
    /// record's): a log rebuilt with its original times, or months of log
    /// time compressed into minutes (benchmarks of long runs). The NATS log
    /// stamps its own time.
    #[doc(hidden)]
    pub fn append_at(&self, envelope: &Envelope, time_ms: u64) -> Result<Appended> {
        match self {
            Self::Embedded(e) => e.append_at(envelope, time_ms),
            Self::Nats(_) => Err(Error::Snapshot("a NATS log stamps its own time".to_owned())),
        }
    }

    /// Discards the records appended before `before_ms` (the embedded
    /// log's retention, `[log] max_age_s`; JetStream applies its own), but
    /// none after the oldest snapshot kept beside it, and never the last
    /// record: the state the log starts from stays kept, and sequence
    /// numbers go on from where they were. Without a snapshot, nothing is
    /// discarded. The actions published for the discarded records go too.
    /// Returns how many records were discarded. Blocking: call it off the
    /// apply loop.
    pub fn discard_before(&self, before_ms: u64) -> Result<u64> {
        match self {
            Self::Embedded(e) => {
                let oldest = crate::snapshots::files::list(&e.snapshot_dir())?
                    .first()
                    .map(|s| s.seq);
                match oldest {
                    Some(seq) => e.discard(before_ms, seq + 1),
                    None => Ok(0),
                }
            }
            Self::Nats(_) => Ok(0),
        }
    }

    /// Writes the snapshot named `name` to the file `to`; its size.
    pub async fn fetch_snapshot(&self, name: &str, to: &Path) -> Result<u64> {
        match self {
            Self::Embedded(e) => crate::snapshots::files::fetch(&e.snapshot_dir(), name, to),
            Self::Nats(n) => crate::snapshots::fetch(&n.js, name, to).await,
        }
    }

    /// Publishes issued actions, deduplicated by action id.
    ///
    /// Returns, for each action, whether this call published it (`true`) or
    /// the stream already held its id (`false`: another instance, or an
    /// earlier life of this one, published it). Only the publisher carries
    /// an action out, so an action id is executed at most once.
    pub async fn publish_actions(&self, actions: &[IssuedAction]) -> Result<Vec<bool>> {
        match self {
            Self::Embedded(e) => e.publish_actions(actions),
            Self::Nats(n) => n.publish_actions(actions).await,
        }
    }

    /// Every published action, in publication order.
    pub async fn actions(&self) -> Result<Vec<IssuedAction>> {
        match self {
            Self::Embedded(e) => e.actions(),
            Self::Nats(n) => n.actions().await,
        }
    }

    /// Makes everything appended so far durable.
    pub async fn flush(&self) -> Result<()> {
        match self {
            Self::Embedded(e) => {
                e.db.flush_async().await?;
                Ok(())
            }
            Self::Nats(_) => Ok(()),
        }
    }
}

/// A record as the embedded log stores it.
#[derive(Serialize, Deserialize)]
struct Stored {
    time_ms: u64,
    envelope: Envelope,
}

/// The embedded log.
pub struct Embedded {
    /// The log's directory.
    dir: std::path::PathBuf,
    db: sled::Db,
    /// The first sequence kept once earlier records were discarded (BE,
    /// under `first`): sequence numbers never go back below it, even if
    /// every record were gone.
    meta: sled::Tree,
    log: sled::Tree,
    ids: sled::Tree,
    actions: sled::Tree,
    action_ids: sled::Tree,
    /// Names this log ([`LogState::id`]), written when it was created (or,
    /// for a log older than the id, when it was first opened with it).
    id: String,
    /// Serialises appends (sequence numbers are contiguous).
    append_lock: std::sync::Mutex<u64>,
    appended: Notify,
}

impl Embedded {
    fn open(dir: &Path, wait: Duration) -> Result<Self> {
        let db = crate::store::open_db_waiting(dir, wait)?;
        let log = db.open_tree("log")?;
        let ids = db.open_tree("ids")?;
        let actions = db.open_tree("actions")?;
        let action_ids = db.open_tree("action_ids")?;
        let meta = db.open_tree("meta")?;
        let id = match meta.get("id")? {
            Some(v) => String::from_utf8_lossy(&v).into_owned(),
            None => {
                let id = format!("embedded@{}.{}", now_nanos(), std::process::id());
                meta.insert("id", id.as_bytes())?;
                db.flush()?;
                id
            }
        };
        let last_time = match log.last()? {
            Some((k, v)) => {
                let seq = be(&k);
                rmp_serde::from_slice::<Stored>(&v)
                    .map_err(|source| Error::Decode { seq, source })?
                    .time_ms
            }
            None => 0,
        };
        Ok(Self {
            dir: dir.to_owned(),
            db,
            meta,
            log,
            ids,
            actions,
            action_ids,
            id,
            append_lock: std::sync::Mutex::new(last_time),
            appended: Notify::new(),
        })
    }

    fn append(&self, envelope: &Envelope) -> Result<Appended> {
        self.append_at(envelope, now_ms())
    }

    fn append_at(&self, envelope: &Envelope, time_ms: u64) -> Result<Appended> {
        let mut last_time = self.append_lock.lock().expect("append lock poisoned");
        if let Some(seq) = self.ids.get(envelope.id.0.as_bytes())? {
            return Ok(Appended {
                seq: be(&seq),
                duplicate: true,
            });
        }
        let seq = self
            .log
            .last()?
            .map_or(1, |(k, _)| be(&k) + 1)
            .max(self.discarded_to()?);
        // The log's clock never goes back, whatever this machine's does.
        let time_ms = time_ms.max(*last_time);
        let value = rmp_serde::to_vec_named(&Stored {
            time_ms,
            envelope: envelope.clone(),
        })
        .expect("envelopes encode");
        use sled::Transactional;
        (&self.log, &self.ids)
            .transaction(|(log, ids)| {
                log.insert(&seq.to_be_bytes(), value.as_slice())?;
                ids.insert(envelope.id.0.as_bytes(), &seq.to_be_bytes())?;
                Ok(())
            })
            .map_err(|e: sled::transaction::TransactionError| Error::Transaction(e.to_string()))?;
        *last_time = time_ms;
        drop(last_time);
        self.appended.notify_waiters();
        Ok(Appended {
            seq,
            duplicate: false,
        })
    }

    async fn read(&self, from: u64, max: usize, wait: Duration) -> Result<Vec<EventRecord>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.appended.notified();
            let out = self.read_now(from, max)?;
            if !out.is_empty() {
                return Ok(out);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }

    fn read_now(&self, from: u64, max: usize) -> Result<Vec<EventRecord>> {
        let mut out = Vec::new();
        for item in self.log.range(from.max(1).to_be_bytes()..).take(max) {
            let (k, v) = item?;
            let seq = be(&k);
            let stored: Stored =
                rmp_serde::from_slice(&v).map_err(|source| Error::Decode { seq, source })?;
            out.push(EventRecord {
                seq,
                time_ms: stored.time_ms,
                envelope: stored.envelope,
            });
        }
        Ok(out)
    }

    fn head(&self) -> Result<u64> {
        Ok(self
            .log
            .last()?
            .map_or(0, |(k, _)| be(&k))
            .max(self.discarded_to()?.saturating_sub(1)))
    }

    /// The first sequence kept after earlier records were discarded (1
    /// when none ever were).
    fn discarded_to(&self) -> Result<u64> {
        Ok(self.meta.get("first")?.map_or(1, |v| be(&v)))
    }

    fn snapshot_dir(&self) -> std::path::PathBuf {
        self.dir.join("snapshots")
    }

    /// Discards the records before `keep_from` appended before
    /// `before_ms`, and the actions published for them; never the last
    /// record. Returns how many records went.
    fn discard(&self, before_ms: u64, keep_from: u64) -> Result<u64> {
        let keep_from = keep_from.min(self.head()?);
        let mut first = None;
        let mut batch = (sled::Batch::default(), sled::Batch::default());
        let mut n = 0u64;
        for item in self.log.range(..keep_from.to_be_bytes()) {
            let (k, v) = item?;
            let seq = be(&k);
            let stored: Stored =
                rmp_serde::from_slice(&v).map_err(|source| Error::Decode { seq, source })?;
            if stored.time_ms >= before_ms {
                first = Some(seq);
                break;
            }
            batch.0.remove(k);
            batch.1.remove(stored.envelope.id.0.as_bytes());
            n += 1;
            if n.is_multiple_of(4096) {
                self.discard_batch(std::mem::take(&mut batch), seq + 1)?;
            }
        }
        if n == 0 {
            return Ok(0);
        }
        let first = first.unwrap_or(keep_from);
        self.discard_batch(batch, first)?;
        // The actions of the records gone, in the order they were
        // published (by and large that of their records).
        let mut actions = (sled::Batch::default(), sled::Batch::default());
        for item in self.actions.iter() {
            let (k, v) = item?;
            let a: IssuedAction = rmp_serde::from_slice(&v).map_err(|source| Error::Decode {
                seq: be(&k),
                source,
            })?;
            if a.seq >= first {
                break;
            }
            actions.0.remove(k);
            actions.1.remove(a.id.0.as_bytes());
        }
        self.actions.apply_batch(actions.0)?;
        self.action_ids.apply_batch(actions.1)?;
        self.db.flush()?;
        Ok(n)
    }

    /// Removes records and their ids; `first` is kept from then on.
    fn discard_batch(&self, (log, ids): (sled::Batch, sled::Batch), first: u64) -> Result<()> {
        // The mark first: a crash between the two leaves it ahead of the
        // records, which only moves the first sequence kept.
        self.meta.insert("first", &first.to_be_bytes())?;
        self.log.apply_batch(log)?;
        self.ids.apply_batch(ids)?;
        Ok(())
    }

    fn state(&self) -> Result<LogState> {
        let last_seq = self.head()?;
        let first_seq = self
            .log
            .first()?
            .map_or(last_seq + 1, |(k, _)| be(&k))
            .max(self.discarded_to()?);
        Ok(LogState {
            id: self.id.clone(),
            first_seq,
            last_seq,
            bytes: 0,
        })
    }

    fn envelope_id_at(&self, seq: u64) -> Result<Option<String>> {
        let Some(v) = self.log.get(seq.to_be_bytes())? else {
            return Ok(None);
        };
        let stored: Stored =
            rmp_serde::from_slice(&v).map_err(|source| Error::Decode { seq, source })?;
        Ok(Some(stored.envelope.id.0))
    }

    fn publish_actions(&self, actions: &[IssuedAction]) -> Result<Vec<bool>> {
        let _guard = self.append_lock.lock().expect("append lock poisoned");
        let mut fresh = Vec::with_capacity(actions.len());
        for a in actions {
            if self.action_ids.contains_key(a.id.0.as_bytes())? {
                fresh.push(false);
                continue;
            }
            fresh.push(true);
            let n = self.actions.last()?.map_or(1, |(k, _)| be(&k) + 1);
            let value = rmp_serde::to_vec_named(a).expect("actions encode");
            self.actions.insert(n.to_be_bytes(), value)?;
            self.action_ids
                .insert(a.id.0.as_bytes(), &n.to_be_bytes())?;
        }
        Ok(fresh)
    }

    fn actions(&self) -> Result<Vec<IssuedAction>> {
        let mut out = Vec::new();
        for item in self.actions.iter() {
            let (k, v) = item?;
            out.push(rmp_serde::from_slice(&v).map_err(|source| Error::Decode {
                seq: be(&k),
                source,
            })?);
        }
        Ok(out)
    }
}

fn be(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(b)
}

fn now_ms() -> u64 {
    (now_nanos() / 1_000_000) as u64
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The NATS JetStream log.
pub struct Nats {
    js: async_nats::jetstream::Context,
    /// Copies of each stream, and of the snapshot bucket.
    replicas: usize,
    /// The ordered consumer reading observations, and the next sequence it
    /// will deliver.
    cursor: Mutex<Option<(u64, async_nats::jetstream::consumer::pull::Ordered)>>,
}

impl Nats {
    async fn connect(url: &str, limits: &StreamLimits) -> Result<Self> {
        let client = async_nats::ConnectOptions::new()
            .name("lockstep")
            .retry_on_initial_connect()
            .connect(server_urls(url))
            .await
            .map_err(|source| Error::Connect {
                url: url.to_owned(),
                source,
            })?;
        let js = async_nats::jetstream::new(client);
        for (name, subject) in [(EVENTS_STREAM, "ls.obs.>"), (ACTIONS_STREAM, "ls.act.>")] {
            let config = async_nats::jetstream::stream::Config {
                name: name.to_owned(),
                subjects: vec![subject.to_owned()],
                storage: async_nats::jetstream::stream::StorageType::File,
                duplicate_window: limits.duplicate_window,
                max_age: limits.max_age,
                max_bytes: limits.max_bytes,
                num_replicas: limits.replicas.max(1),
                ..Default::default()
            };
            let mut stream = js
                .get_or_create_stream(config.clone())
                .await
                .map_err(|e| js_err("create or check stream")(with_quorum_hint(e.to_string())))?;
            let info = stream
                .info()
                .await
                .map_err(|e| js_err("stream info")(with_quorum_hint(e.to_string())))?;
            if info.config.subjects != [subject] {
                return Err(Error::StreamMismatch {
                    stream: name.to_owned(),
                    found: info.config.subjects.clone(),
                    wanted: vec![subject.to_owned()],
                });
            }
            let found = &info.config;
            if found.num_replicas.max(1) != config.num_replicas
                || found.max_bytes != config.max_bytes
                || found.max_age != config.max_age
                || found.duplicate_window != config.duplicate_window
            {
                tracing::info!(
                    stream = name,
                    replicas = format!("{} -> {}", found.num_replicas, config.num_replicas),
                    max_bytes = format!("{} -> {}", found.max_bytes, config.max_bytes),
                    "bringing the stream to the configured limits"
                );
                // What lockstep does not set stays as it is.
                let config = async_nats::jetstream::stream::Config {
                    num_replicas: config.num_replicas,
                    max_bytes: config.max_bytes,
                    max_age: config.max_age,
                    duplicate_window: config.duplicate_window,
                    ..found.clone()
                };
                js.update_stream(&config)
                    .await
                    .map_err(|e| js_err("update stream")(with_quorum_hint(e.to_string())))?;
            }
        }
        Ok(Self {
            js,
            replicas: limits.replicas.max(1),
            cursor: Mutex::new(None),
        })
    }

    async fn append(&self, envelope: &Envelope) -> Result<Appended> {
        let mut appended = self.append_all(std::slice::from_ref(envelope)).await?;
        Ok(appended.pop().expect("one ack for one envelope"))
    }

    async fn append_all(&self, envelopes: &[Envelope]) -> Result<Vec<Appended>> {
        let messages = envelopes.iter().map(event_publish);
        let acks = self
            .publish_all(messages, ("publish", "publish ack"))
            .await?;
        Ok(acks
            .into_iter()
            .map(|ack| Appended {
                seq: ack.sequence,
                duplicate: ack.duplicate,
            })
            .collect())
    }

    async fn read(&self, from: u64, max: usize, wait: Duration) -> Result<Vec<EventRecord>> {
        use async_nats::jetstream::consumer::{pull, DeliverPolicy};
        let mut cursor = self.cursor.lock().await;
        if cursor.as_ref().is_none_or(|(next, _)| *next != from) {
            let stream = self
                .js
                .get_stream(EVENTS_STREAM)
                .await
                .map_err(|e| js_err("get stream")(e.to_string()))?;
            let consumer = stream
                .create_consumer(pull::OrderedConfig {
                    deliver_policy: DeliverPolicy::ByStartSequence {
                        start_sequence: from.max(1),
                    },
                    ..Default::default()
                })
                .await
                .map_err(|e| js_err("create consumer")(e.to_string()))?;
            let messages = consumer
                .messages()
                .await
                .map_err(|e| js_err("consume")(e.to_string()))?;
            *cursor = Some((from, messages));
        }
        let (next, messages) = cursor.as_mut().expect("set above");
        let mut out = Vec::new();
        let first = match tokio::time::timeout(wait, messages.next()).await {
            Err(_) => return Ok(out),
            Ok(None) => {
                *cursor = None;
                return Err(js_err("consume")("consumer ended".to_owned()));
            }
            Ok(Some(m)) => m,
        };
        let mut pending = Some(first);
        loop {
            let msg = match pending.take() {
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    *cursor = None;
                    return Err(js_err("consume")(e.to_string()));
                }
                None => break,
            };
            let info = msg
                .info()
                .map_err(|e| js_err("message info")(e.to_string()))?;
            let seq = info.stream_sequence;
            let time_ms = (info.published.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
            let envelope: Envelope = rmp_serde::from_slice(&msg.payload)
                .map_err(|source| Error::Decode { seq, source })?;
            *next = seq + 1;
            out.push(EventRecord {
                seq,
                time_ms,
                envelope,
            });
            if out.len() >= max {
                break;
            }
            pending = match messages.next().now_or_never() {
                Some(Some(m)) => Some(m),
                _ => None,
            };
        }
        Ok(out)
    }

    async fn head(&self) -> Result<u64> {
        Ok(self.state().await?.last_seq)
    }

    async fn state(&self) -> Result<LogState> {
        let mut stream = self
            .js
            .get_stream(EVENTS_STREAM)
            .await
            .map_err(|e| js_err("get stream")(e.to_string()))?;
        let info = stream
            .info()
            .await
            .map_err(|e| js_err("stream info")(e.to_string()))?;
        let state = &info.state;
        let first_seq = if state.messages == 0 {
            state.last_sequence + 1
        } else {
            state.first_sequence
        };
        Ok(LogState {
            id: format!("{EVENTS_STREAM}@{}", info.created.unix_timestamp_nanos()),
            first_seq,
            last_seq: state.last_sequence,
            bytes: state.bytes,
        })
    }

    async fn envelope_id_at(&self, seq: u64) -> Result<Option<String>> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        let stream = self
            .js
            .get_stream_no_info(EVENTS_STREAM)
            .await
            .map_err(|e| js_err("get stream")(e.to_string()))?;
        match stream.get_raw_message(seq).await {
            Ok(m) => {
                let envelope: Envelope = rmp_serde::from_slice(&m.payload)
                    .map_err(|source| Error::Decode { seq, source })?;
                Ok(Some(envelope.id.0))
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(js_err("get message")(e.to_string())),
        }
    }

    async fn publish_actions(&self, actions: &[IssuedAction]) -> Result<Vec<bool>> {
        let messages = actions.iter().map(|a| {
            let payload = rmp_serde::to_vec_named(a).expect("actions encode");
            let publish = async_nats::jetstream::context::Publish::build()
                .message_id(&a.id.0)
                .payload(payload.into());
            (format!("ls.act.{}", a.action.kind().name()), publish)
        });
        let what = ("publish action", "publish action ack");
        let acks = self.publish_all(messages, what).await?;
        Ok(acks.into_iter().map(|ack| !ack.duplicate).collect())
    }

    /// Sends every message, then awaits their acks in order, each settled
    /// by [`Nats::settle`]: the publishes travel together instead of each
    /// waiting for the one before it to be acknowledged.
    async fn publish_all(
        &self,
        messages: impl Iterator<Item = (String, async_nats::jetstream::context::Publish)>,
        what: (&'static str, &'static str),
    ) -> Result<Vec<async_nats::jetstream::publish::PublishAck>> {
        let mut sent = Vec::with_capacity(messages.size_hint().0);
        for (subject, publish) in messages {
            let ack = self
                .js
                .send_publish(subject.clone(), publish.clone())
                .await
                .map_err(|e| js_err(what.0)(e.to_string()))?;
            sent.push((subject, publish, ack));
        }
        let mut acks = Vec::with_capacity(sent.len());
        for (subject, publish, ack) in sent {
            acks.push(self.settle(&subject, &publish, ack.await, what).await?);
        }
        Ok(acks)
    }

    /// The ack of a publish, sent again while JetStream answers that the same
    /// message id is in process ([`duplicate_in_process`]), until it is
    /// answered as a duplicate. `what`: the words for a failed send and a
    /// failed ack.
    async fn settle(
        &self,
        subject: &str,
        publish: &async_nats::jetstream::context::Publish,
        mut ack: std::result::Result<
            async_nats::jetstream::publish::PublishAck,
            async_nats::jetstream::context::PublishError,
        >,
        what: (&'static str, &'static str),
    ) -> Result<async_nats::jetstream::publish::PublishAck> {
        let mut attempt = 0;
        loop {
            match ack {
                Err(e) if duplicate_in_process(&e) && attempt < IN_PROCESS_WAITS => {
                    attempt += 1;
                    tokio::time::sleep(IN_PROCESS_WAIT).await;
                    ack = self
                        .js
                        .send_publish(subject.to_owned(), publish.clone())
                        .await
                        .map_err(|e| js_err(what.0)(e.to_string()))?
                        .await;
                }
                other => return other.map_err(|e| js_err(what.1)(e.to_string())),
            }
        }
    }

    async fn actions(&self) -> Result<Vec<IssuedAction>> {
        let mut stream = self
            .js
            .get_stream(ACTIONS_STREAM)
            .await
            .map_err(|e| js_err("get stream")(e.to_string()))?;
        let last = stream
            .info()
            .await
            .map_err(|e| js_err("stream info")(e.to_string()))?
            .state
            .last_sequence;
        let mut out = Vec::new();
        if last == 0 {
            return Ok(out);
        }
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
            .await
            .map_err(|e| js_err("create consumer")(e.to_string()))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| js_err("consume")(e.to_string()))?;
        while let Some(m) = tokio::time::timeout(Duration::from_secs(5), messages.next())
            .await
            .map_err(|_| js_err("read actions")("timed out".to_owned()))?
        {
            let m = m.map_err(|e| js_err("consume")(e.to_string()))?;
            let seq = m
                .info()
                .map_err(|e| js_err("message info")(e.to_string()))?
                .stream_sequence;
            out.push(
                rmp_serde::from_slice(&m.payload)
                    .map_err(|source| Error::Decode { seq, source })?,
            );
            if seq >= last {
                break;
            }
        }
        Ok(out)
    }
}

/// How often, and how long apart, a publish answered "duplicate message id
/// is in process" is sent again.
const IN_PROCESS_WAITS: u32 = 100;
const IN_PROCESS_WAIT: Duration = Duration::from_millis(20);

/// JetStream's answer "duplicate message id is in process" (error code
/// 10158): a publish with the same message id is being stored (on a
/// replicated stream, until its entry is committed by a majority). Sent
/// again a moment later, it is answered as a duplicate of that one.
fn duplicate_in_process(e: &async_nats::jetstream::context::PublishError) -> bool {
    const DUPLICATE_IN_PROCESS: u64 = 10158;
    e.kind() == async_nats::jetstream::context::PublishErrorKind::Other
        && std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>())
            .is_some_and(|je| {
                // `ErrorCode` keeps its number private; it serializes as it.
                rmp_serde::to_vec(&je.error_code()).ok()
                    == rmp_serde::to_vec(&DUPLICATE_IN_PROCESS).ok()
            })
}

/// The subject and message of an envelope's publish to the events stream,
/// its id the message id (JetStream's deduplication).
fn event_publish(envelope: &Envelope) -> (String, async_nats::jetstream::context::Publish) {
    let payload = rmp_serde::to_vec_named(envelope).expect("envelopes encode");
    let subject = format!("ls.obs.{}", envelope.source.name());
    let publish = async_nats::jetstream::context::Publish::build()
        .message_id(&envelope.id.0)
        .payload(payload.into());
    (subject, publish)
}
