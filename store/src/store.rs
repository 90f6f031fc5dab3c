//! The store: the action ledger, its index of actions not yet dispatched,
//! and the audit index (sled), committed together in one transaction per
//! batch, and the engine checkpoint, a file beside them written by
//! streaming.
//!
//! It owns durability of what the service decided; it never decides. A
//! checkpoint carries a SHA-256 of its bytes: a damaged or truncated one is
//! detected and refused, and the service rebuilds from the log instead of
//! starting from bad state.

mod checkpoint;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use lockstep_schemas::Transition;
use lockstep_schemas::{ActionId, IssuedAction, OutcomeResult};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sled::Transactional;

/// The format this build writes. A store written by a newer format is
/// refused; an older one is upgraded when opened.
///
/// - 1: ledger, audit index, checkpoint.
/// - 2: and the `undispatched` index (built from the ledger on upgrade).
pub const FORMAT_VERSION: u32 = 2;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database failed.
    #[error("store database")]
    Sled(#[from] sled::Error),
    /// A transaction failed.
    #[error("store transaction: {0}")]
    Transaction(String),
    /// The store was written by a newer lockstep.
    #[error("the store at {path} has format {found}; this lockstep writes format {FORMAT_VERSION} (upgrade lockstep, or point it at a new data directory)")]
    NewerFormat {
        /// Store path.
        path: String,
        /// The format found.
        found: u32,
    },
    /// The checkpoint is damaged (truncated, or its checksum does not
    /// match).
    #[error("checkpoint at seq {seq} is damaged (truncated or checksum mismatch)")]
    CorruptCheckpoint {
        /// The sequence it claims (0 when not even that can be read).
        seq: u64,
    },
    /// Reading or writing the checkpoint file failed.
    #[error("checkpoint file {path}")]
    CheckpointIo {
        /// The file.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A stored value does not decode.
    #[error("stored {what} does not decode")]
    Decode {
        /// What.
        what: &'static str,
        /// Cause.
        #[source]
        source: rmp_serde::decode::Error,
    },
}

impl Error {
    /// Another process holds the store's lock (a lockstep running on it).
    pub fn is_lock_held(&self) -> bool {
        matches!(self, Self::Sled(e) if lock_held(e))
    }
}

/// sled reports a held lock as an I/O error of kind `Other` whose message
/// carries the `WouldBlock` of the failed `flock` (sled 0.34); a bare
/// `WouldBlock` is taken the same way.
fn lock_held(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io)
        if io.kind() == std::io::ErrorKind::WouldBlock
            || io.to_string().starts_with("could not acquire lock"))
}

/// `Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A checkpoint: the engine snapshot after applying `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Last applied sequence.
    pub seq: u64,
    /// `Engine::snapshot()` bytes.
    pub snapshot: Vec<u8>,
}

/// What the ledger knows of an action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// The action as issued.
    pub issued: IssuedAction,
    /// How many times it was handed to the action stream (a correct run
    /// never needs more than one; re-publishing is deduplicated anyway).
    pub dispatched: u32,
    /// The outcome, once reported.
    pub outcome: Option<OutcomeResult>,
}

/// The last record a store applied, and the log it came from: what the
/// service compares with the log when it starts and while it runs, so that
/// a log that went back, was created anew or has a hole is noticed instead
/// of folded on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogPosition {
    /// [`crate::LogState::id`] of the log.
    pub log_id: String,
    /// The record's sequence.
    pub seq: u64,
    /// The record's envelope id (the same sequence in a log that went back
    /// and grew again holds another record).
    pub envelope_id: String,
}

/// One batch's worth of things to make durable together. The checkpoint
/// is not one of them: [`Store::write_checkpoint`] writes it apart, after
/// the batch is committed and flushed.
#[derive(Debug, Default)]
pub struct Commit<'a> {
    /// Actions issued in the batch (borrowed from the engine's output: a
    /// batch's actions are not copied to be committed).
    pub issued: &'a [IssuedAction],
    /// Outcomes reported in the batch.
    pub outcomes: Vec<(ActionId, OutcomeResult)>,
    /// Transitions of the batch.
    pub transitions: &'a [Transition],
    /// The batch's last record (`None`: the position stays).
    pub position: Option<&'a LogPosition>,
}

/// What [`Store::trim`] dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Ledger entries (and their `undispatched` keys).
    pub ledger: u64,
    /// Transitions of the audit index.
    pub transitions: u64,
}

/// The store. Clones share the same database.
#[derive(Clone)]
pub struct Store {
    /// The store's directory: sled's files and the checkpoint file.
    dir: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    ledger: sled::Tree,
    /// `seq(BE) id` of every ledger entry not dispatched and without an
    /// outcome: what a new leader publishes, found without reading the
    /// whole ledger (which keeps every action ever issued).
    undispatched: sled::Tree,
    audit: sled::Tree,
}

/// Reads a checkpoint file outside a store (a snapshot downloaded from
/// beside the log): `decode` reads the body as a stream, then the checksum
/// is verified. Returns the sequence it names and what `decode` made of it;
/// a damaged file is [`Error::CorruptCheckpoint`].
pub fn read_checkpoint_file<T, E>(
    path: &Path,
    decode: impl FnOnce(&mut dyn Read) -> Result<T, E>,
) -> Result<(u64, Result<T, E>)> {
    let io = |source| Error::CheckpointIo {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    match checkpoint::read(file, decode) {
        Ok(read) => Ok(read),
        Err(checkpoint::ReadError::Corrupt { seq }) => Err(Error::CorruptCheckpoint { seq }),
        Err(checkpoint::ReadError::Io(source)) => Err(io(source)),
    }
}

impl Store {
    /// Opens (creating if needed) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let db = sled_config(dir).open()?;
        Self::from_db(db, dir)
    }

    /// [`Self::open`], waiting up to `wait` while another process holds the
    /// store's lock. A process killed a moment ago (SIGKILL, an OOM kill)
    /// holds it until the kernel has closed its files, some tens of
    /// milliseconds; its replacement waits that out instead of failing. A
    /// lock still held after `wait` is another live lockstep: an error.
    pub fn open_waiting(dir: &Path, wait: std::time::Duration) -> Result<Self> {
        Self::from_db(open_db_waiting(dir, wait)?, dir)
    }

    fn from_db(db: sled::Db, dir: &Path) -> Result<Self> {
        let meta = db.open_tree("meta")?;
        let ledger = db.open_tree("ledger")?;
        let undispatched = db.open_tree("undispatched")?;
        let audit = db.open_tree("audit")?;
        let found = match meta.get("format")? {
            Some(v) => u32::from_be_bytes(v.as_ref().try_into().unwrap_or([0xff; 4])),
            // A new store (format 1 stores always recorded their format).
            None => FORMAT_VERSION,
        };
        if found > FORMAT_VERSION {
            return Err(Error::NewerFormat {
                path: dir.display().to_string(),
                found,
            });
        }
        let store = Self {
            dir: dir.to_path_buf(),
            db,
            meta,
            ledger,
            undispatched,
            audit,
        };
        if found < 2 {
            // Idempotent: a crash before the new format is recorded builds
            // the same index again on the next open.
            store.index_undispatched()?;
        }
        if found != FORMAT_VERSION || store.meta.get("format")?.is_none() {
            store.meta.insert("format", &FORMAT_VERSION.to_be_bytes())?;
            store.db.flush()?;
        }
        Ok(store)
    }

    /// Builds the `undispatched` index from the ledger (upgrading a format
    /// 1 store).
    fn index_undispatched(&self) -> Result<()> {
        for item in self.ledger.iter() {
            let (_, v) = item?;
            let entry = decode_entry(&v)?;
            if entry.is_undispatched() {
                self.undispatched
                    .insert(undispatched_key(&entry.issued), &[])?;
            }
        }
        Ok(())
    }

    /// The last checkpoint, verified, read whole into memory; `Ok(None)`
    /// when there is none. [`Self::read_checkpoint`] decodes it without
    /// holding its bytes.
    pub fn checkpoint(&self) -> Result<Option<Checkpoint>> {
        let read = self.read_checkpoint(|r| {
            let mut snapshot = Vec::new();
            r.read_to_end(&mut snapshot).map(|_| snapshot)
        })?;
        read.map(|(seq, snapshot)| {
            snapshot
                .map(|snapshot| Checkpoint { seq, snapshot })
                .map_err(|source| self.checkpoint_io(source))
        })
        .transpose()
    }

    /// Decodes the last checkpoint with `decode`, which reads its body (the
    /// bytes the writer's `body` wrote) as a stream, then verifies it:
    /// `Ok(Some((seq, decoded)))`, `Ok(None)` when there is no checkpoint.
    /// A damaged or truncated checkpoint is [`Error::CorruptCheckpoint`],
    /// whatever `decode` made of it: what it decoded is dropped.
    ///
    /// A store written before checkpoints were files keeps its checkpoint
    /// in the database; it is read while there is no file.
    pub fn read_checkpoint<T, E>(
        &self,
        decode: impl FnOnce(&mut dyn Read) -> Result<T, E>,
    ) -> Result<Option<(u64, Result<T, E>)>> {
        let file = match std::fs::File::open(self.checkpoint_path()) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return self.read_legacy_checkpoint(decode)
            }
            Err(e) => return Err(self.checkpoint_io(e)),
        };
        match checkpoint::read(file, decode) {
            Ok((seq, decoded)) => Ok(Some((seq, decoded))),
            Err(checkpoint::ReadError::Corrupt { seq }) => Err(Error::CorruptCheckpoint { seq }),
            Err(checkpoint::ReadError::Io(source)) => Err(self.checkpoint_io(source)),
        }
    }

    /// The checkpoint as stores before checkpoint files kept it: in `meta`
    /// under `checkpoint`, `[seq: u64 BE][sha256 of snapshot: 32][snapshot]`.
    fn read_legacy_checkpoint<T, E>(
        &self,
        decode: impl FnOnce(&mut dyn Read) -> Result<T, E>,
    ) -> Result<Option<(u64, Result<T, E>)>> {
        let Some(raw) = self.meta.get(LEGACY_CHECKPOINT_KEY)? else {
            return Ok(None);
        };
        if raw.len() < 40 {
            return Err(Error::CorruptCheckpoint { seq: 0 });
        }
        let seq = u64::from_be_bytes(raw[..8].try_into().expect("8 bytes"));
        let (sum, mut snapshot) = raw[8..].split_at(32);
        if Sha256::digest(snapshot).as_slice() != sum {
            return Err(Error::CorruptCheckpoint { seq });
        }
        Ok(Some((seq, decode(&mut snapshot))))
    }

    /// Writes a checkpoint of the engine after `seq`: `body` writes the
    /// snapshot, which goes to disk as it is written (no buffer of the
    /// whole). The new checkpoint replaces the old one atomically once it
    /// is whole and on disk; until then, and when `body` or the writing
    /// fails, the old one stays. Returns the checkpoint file's size.
    ///
    /// Write it after the batches it covers are committed and flushed: a
    /// checkpoint never runs ahead of the ledger and audit index.
    pub fn write_checkpoint(
        &self,
        seq: u64,
        body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<u64> {
        let path = self.checkpoint_path();
        let bytes = checkpoint::write(&path, seq, body).map_err(|e| self.checkpoint_io(e))?;
        // The file supersedes a checkpoint an older lockstep kept in the
        // database; it goes to disk with the next flush.
        self.meta.remove(LEGACY_CHECKPOINT_KEY)?;
        Ok(bytes)
    }

    /// Where the checkpoint file is.
    pub fn checkpoint_path(&self) -> PathBuf {
        self.dir.join(checkpoint::FILE_NAME)
    }

    /// The sequence the checkpoint names, read from its header alone (its
    /// body is verified when it is restored); `None` without a checkpoint or
    /// with one that is not a checkpoint file. A store that keeps its
    /// checkpoint in the database (written before checkpoint files) reads
    /// and verifies it.
    pub fn checkpoint_seq(&self) -> Result<Option<u64>> {
        match std::fs::File::open(self.checkpoint_path()) {
            Ok(f) => checkpoint::seq_of(f).map_err(|e| self.checkpoint_io(e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(self
                .read_legacy_checkpoint(|_| Ok::<(), std::convert::Infallible>(()))
                .ok()
                .flatten()
                .map(|(seq, _)| seq)),
            Err(e) => Err(self.checkpoint_io(e)),
        }
    }

    /// Where a snapshot to start from is downloaded before
    /// [`Self::adopt_checkpoint`] makes it the checkpoint.
    pub fn download_path(&self) -> PathBuf {
        self.dir.join("engine.checkpoint.download")
    }

    /// Makes the checkpoint file `file` (a snapshot downloaded beside the
    /// store) the store's checkpoint once it reads whole and its checksum
    /// holds; returns its sequence. A file that does not verify is removed
    /// and the checkpoint stays as it was.
    pub fn adopt_checkpoint(&self, file: &Path) -> Result<u64> {
        let io = |source| Error::CheckpointIo {
            path: file.display().to_string(),
            source,
        };
        let f = std::fs::File::open(file).map_err(io)?;
        let drain = |r: &mut dyn std::io::Read| std::io::copy(r, &mut std::io::sink());
        let seq = match checkpoint::read(f, drain) {
            Ok((seq, Ok(_))) => seq,
            Ok((seq, Err(_))) | Err(checkpoint::ReadError::Corrupt { seq }) => {
                let _ = std::fs::remove_file(file);
                return Err(Error::CorruptCheckpoint { seq });
            }
            Err(checkpoint::ReadError::Io(source)) => return Err(io(source)),
        };
        std::fs::rename(file, self.checkpoint_path()).map_err(io)?;
        if let Ok(dir) = std::fs::File::open(&self.dir) {
            dir.sync_all().map_err(io)?;
        }
        Ok(seq)
    }

    fn checkpoint_io(&self, source: std::io::Error) -> Error {
        Error::CheckpointIo {
            path: self.checkpoint_path().display().to_string(),
            source,
        }
    }

    /// Writes one batch atomically: ledger, audit index.
    pub fn commit(&self, commit: &Commit<'_>) -> Result<()> {
        // Keyed by (node, seq, place among that record's transitions): the
        // same whatever the batch split, so re-applying after a restart
        // overwrites instead of duplicating.
        let mut audit_rows: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(commit.transitions.len());
        let mut place = (0u64, 0u32);
        for t in commit.transitions {
            place = if place.0 == t.seq {
                (t.seq, place.1 + 1)
            } else {
                (t.seq, 0)
            };
            audit_rows.push((
                audit_key(&t.node, t.seq, place.1),
                rmp_serde::to_vec_named(t).expect("transitions encode"),
            ));
        }
        let position = commit
            .position
            .map(|p| rmp_serde::to_vec_named(p).expect("positions encode"));
        (&self.ledger, &self.undispatched, &self.audit, &self.meta)
            .transaction(|(ledger, undispatched, audit, meta)| {
                for a in commit.issued {
                    // Re-applying after a restart issues the same ids: keep
                    // what the ledger already knows about them.
                    if ledger.get(a.id.0.as_bytes())?.is_none() {
                        let entry = LedgerEntry {
                            issued: a.clone(),
                            dispatched: 0,
                            outcome: None,
                        };
                        ledger.insert(
                            a.id.0.as_bytes(),
                            rmp_serde::to_vec_named(&entry).expect("ledger encodes"),
                        )?;
                        undispatched.insert(undispatched_key(a), &[])?;
                    }
                }
                for (id, outcome) in &commit.outcomes {
                    if let Some(raw) = ledger.get(id.0.as_bytes())? {
                        if let Ok(mut entry) = rmp_serde::from_slice::<LedgerEntry>(&raw) {
                            entry.outcome = Some(outcome.clone());
                            undispatched.remove(undispatched_key(&entry.issued))?;
                            ledger.insert(
                                id.0.as_bytes(),
                                rmp_serde::to_vec_named(&entry).expect("ledger encodes"),
                            )?;
                        }
                    }
                }
                for (k, v) in &audit_rows {
                    audit.insert(k.as_slice(), v.as_slice())?;
                }
                if let Some(p) = &position {
                    meta.insert(POSITION_KEY, p.as_slice())?;
                }
                Ok(())
            })
            .map_err(|e: sled::transaction::TransactionError| Error::Transaction(e.to_string()))
    }

    /// The last record committed and the log it came from; `None` for a
    /// new store (or one written before positions were kept).
    pub fn log_position(&self) -> Result<Option<LogPosition>> {
        match self.meta.get(POSITION_KEY)? {
            Some(v) => Ok(rmp_serde::from_slice(&v).ok()),
            None => Ok(None),
        }
    }

    /// Up to `max` actions of the ledger this store never dispatched and
    /// that have no outcome (an action with an outcome was dispatched, by
    /// another instance if not by this one), in issue order: the first
    /// ones, or those after `after` (the last of the previous page). Read
    /// page by page, the actions a new leader publishes take memory for one
    /// page, however many there are.
    pub fn undispatched(
        &self,
        after: Option<&IssuedAction>,
        max: usize,
    ) -> Result<Vec<IssuedAction>> {
        let keys = match after {
            Some(a) => {
                let mut from = undispatched_key(a);
                from.push(0);
                self.undispatched.range(from..)
            }
            None => self.undispatched.iter(),
        };
        let mut out = Vec::with_capacity(max.min(1024));
        for item in keys {
            if out.len() >= max {
                break;
            }
            let (k, _) = item?;
            let entry = self
                .ledger
                .get(&k[8..])?
                .map(|v| decode_entry(&v))
                .transpose()?;
            match entry {
                Some(e) if e.is_undispatched() => out.push(e.issued),
                // Not in the ledger, or dispatched since: not indexed.
                _ => {
                    self.undispatched.remove(&k)?;
                }
            }
        }
        Ok(out)
    }

    /// Takes actions out of those [`Self::undispatched`] offers, without
    /// recording a dispatch: actions too old to publish (see the service's
    /// take-over), left to the leader of their time.
    pub fn forget_undispatched(&self, actions: &[IssuedAction]) -> Result<()> {
        for a in actions {
            self.undispatched.remove(undispatched_key(a))?;
        }
        Ok(())
    }

    /// Records that these actions were handed to the action stream, in one
    /// transaction.
    pub fn mark_dispatched(&self, ids: &[ActionId]) -> Result<()> {
        (&self.ledger, &self.undispatched)
            .transaction(|(ledger, undispatched)| {
                for id in ids {
                    let Some(old) = ledger.get(id.0.as_bytes())? else {
                        continue;
                    };
                    let Ok(mut entry) = rmp_serde::from_slice::<LedgerEntry>(&old) else {
                        continue;
                    };
                    entry.dispatched += 1;
                    undispatched.remove(undispatched_key(&entry.issued))?;
                    ledger.insert(
                        id.0.as_bytes(),
                        rmp_serde::to_vec_named(&entry).expect("ledger encodes"),
                    )?;
                }
                Ok(())
            })
            .map_err(|e: sled::transaction::TransactionError| Error::Transaction(e.to_string()))
    }

    /// The ledger entry of one action.
    pub fn ledger_entry(&self, id: &ActionId) -> Result<Option<LedgerEntry>> {
        self.ledger
            .get(id.0.as_bytes())?
            .map(|v| decode_entry(&v))
            .transpose()
    }

    /// Every ledger entry.
    pub fn ledger(&self) -> Result<Vec<LedgerEntry>> {
        self.ledger
            .iter()
            .map(|item| decode_entry(&item?.1))
            .collect()
    }

    /// Every recorded transition of one Slurm node, in order.
    pub fn transitions(&self, node: &str) -> Result<Vec<Transition>> {
        let mut prefix = node.as_bytes().to_vec();
        prefix.push(0);
        self.audit
            .scan_prefix(&prefix)
            .map(|item| {
                let (_, v) = item?;
                rmp_serde::from_slice(&v).map_err(|source| Error::Decode {
                    what: "transition",
                    source,
                })
            })
            .collect()
    }

    /// Drops what happened before `before_ms` (log time): ledger entries of
    /// actions issued before it, with their `undispatched` keys, and the
    /// audit index's transitions before it. The retention horizon is kept
    /// (see [`Self::retained_from`]). Reads the ledger and the index once,
    /// removing in batches: call it off the apply loop (the store is
    /// `Clone`; sled serves both at once).
    pub fn trim(&self, before_ms: u64) -> Result<Trimmed> {
        let mut trimmed = Trimmed::default();
        let mut ledger = sled::Batch::default();
        let mut undispatched = sled::Batch::default();
        let mut pending = 0;
        for item in self.ledger.iter() {
            let (k, v) = item?;
            let entry = decode_entry(&v)?;
            if entry.issued.time_ms >= before_ms {
                continue;
            }
            ledger.remove(k);
            undispatched.remove(undispatched_key(&entry.issued));
            trimmed.ledger += 1;
            pending += 1;
            if pending == TRIM_BATCH {
                self.ledger.apply_batch(std::mem::take(&mut ledger))?;
                self.undispatched
                    .apply_batch(std::mem::take(&mut undispatched))?;
                pending = 0;
            }
        }
        self.ledger.apply_batch(ledger)?;
        self.undispatched.apply_batch(undispatched)?;
        let mut audit = sled::Batch::default();
        let mut pending = 0;
        for item in self.audit.iter() {
            let (k, v) = item?;
            let t: Transition = rmp_serde::from_slice(&v).map_err(|source| Error::Decode {
                what: "transition",
                source,
            })?;
            if t.time_ms >= before_ms {
                continue;
            }
            audit.remove(k);
            trimmed.transitions += 1;
            pending += 1;
            if pending == TRIM_BATCH {
                self.audit.apply_batch(std::mem::take(&mut audit))?;
                pending = 0;
            }
        }
        self.audit.apply_batch(audit)?;
        let newer = self.retained_from()?.is_none_or(|was| before_ms > was);
        if newer {
            self.meta
                .insert(RETAINED_FROM_KEY, &before_ms.to_be_bytes())?;
        }
        self.db.flush()?;
        Ok(trimmed)
    }

    /// The retention horizon: what happened before it (log time, ms) was
    /// dropped by [`Self::trim`]; `None` when nothing ever was.
    pub fn retained_from(&self) -> Result<Option<u64>> {
        Ok(self.meta.get(RETAINED_FROM_KEY)?.map(|v| be_u64(&v)))
    }

    /// Makes everything committed so far durable on disk.
    pub async fn flush(&self) -> Result<()> {
        self.db.flush_async().await?;
        Ok(())
    }

    /// Size of the store on disk, in bytes.
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }

    /// Overwrites a byte of the checkpoint (tests: simulate damage).
    #[doc(hidden)]
    pub fn damage_checkpoint(&self) -> Result<()> {
        let path = self.checkpoint_path();
        if path.exists() {
            return checkpoint::damage(&path).map_err(|e| self.checkpoint_io(e));
        }
        if let Some(raw) = self.meta.get(LEGACY_CHECKPOINT_KEY)? {
            let mut raw = raw.to_vec();
            let last = raw.len() - 1;
            raw[last] ^= 0xff;
            self.meta.insert(LEGACY_CHECKPOINT_KEY, raw)?;
            self.db.flush()?;
        }
        Ok(())
    }

    /// Writes a checkpoint the way stores before checkpoint files did: in
    /// the database (tests: an old store).
    #[doc(hidden)]
    pub fn write_legacy_checkpoint(&self, seq: u64, snapshot: &[u8]) -> Result<()> {
        let mut raw = Vec::with_capacity(40 + snapshot.len());
        raw.extend_from_slice(&seq.to_be_bytes());
        raw.extend_from_slice(&Sha256::digest(snapshot));
        raw.extend_from_slice(snapshot);
        self.meta.insert(LEGACY_CHECKPOINT_KEY, raw)?;
        self.db.flush()?;
        Ok(())
    }
}

/// Where stores before checkpoint files kept the checkpoint, in `meta`.
const LEGACY_CHECKPOINT_KEY: &str = "checkpoint";
const POSITION_KEY: &str = "log_position";
/// The retention horizon of the last [`Store::trim`] (ms, BE).
const RETAINED_FROM_KEY: &str = "retained_from_ms";
/// Removals per sled batch while trimming.
const TRIM_BATCH: usize = 4096;

/// Opens the sled database in `dir`, waiting up to `wait` while its lock is
/// held. A process killed a moment ago holds it until the kernel has closed
/// its files; a database dropped a moment ago in this process, until sled's
/// own threads have let go of its files (sled 0.34 lets go of them after
/// `drop` returns). A lock still held after `wait` is another live user.
pub(crate) fn open_db_waiting(
    dir: &Path,
    wait: std::time::Duration,
) -> Result<sled::Db, sled::Error> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match sled_config(dir).open() {
            Err(e) if lock_held(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            opened => return opened,
        }
    }
}

/// sled with a bounded page cache: its default (1 GiB) would dwarf the
/// engine's own memory.
pub(crate) fn sled_config(dir: &Path) -> sled::Config {
    sled::Config::new()
        .path(dir)
        .cache_capacity(CACHE_BYTES_MAX)
}

/// Upper bound of sled's page cache, per database.
const CACHE_BYTES_MAX: u64 = 8 << 20;

impl LedgerEntry {
    /// Never dispatched by this store, and no outcome.
    fn is_undispatched(&self) -> bool {
        self.dispatched == 0 && self.outcome.is_none()
    }
}

fn be_u64(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = bytes.len().min(8);
    b[..n].copy_from_slice(&bytes[..n]);
    u64::from_be_bytes(b)
}

fn decode_entry(raw: &[u8]) -> Result<LedgerEntry> {
    rmp_serde::from_slice(raw).map_err(|source| Error::Decode {
        what: "ledger entry",
        source,
    })
}

/// `seq(BE) id`: the `undispatched` index in issue order (the order the
/// ledger's actions were published in).
fn undispatched_key(a: &IssuedAction) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + a.id.0.len());
    k.extend_from_slice(&a.seq.to_be_bytes());
    k.extend_from_slice(a.id.0.as_bytes());
    k
}

/// `node \0 seq(BE) index(BE)`: a node's transitions in log order.
fn audit_key(node: &str, seq: u64, index: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(node.len() + 13);
    k.extend_from_slice(node.as_bytes());
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k.extend_from_slice(&index.to_be_bytes());
    k
}
