//! The exported log file: a header, then observation records and the actions
//! that were issued, each with its sequence number, in JSON Lines or
//! MessagePack (a stream of named-field MessagePack values).
//!
//! This module owns reading and writing those files: format detection, the
//! bound on one record, the header's schema version, content ids and sequence
//! order. It never interprets events (that is the reducer's) and never
//! touches the file system beyond the reader or writer it is given (except
//! [`open`]).
//!
//! Readers stop at the first bad record with an error that names its line or
//! byte offset; every record before it has already been handed out, so a
//! truncated or corrupt file still replays up to the damage. Both encodings
//! are read as a stream in memory bounded by [`RECORD_BYTES_MAX`], so a huge
//! or endless input (`/dev/zero`) is an error, not an out-of-memory kill.

use std::io::{BufRead, Write};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::action::IssuedAction;
use crate::envelope::{Envelope, SCHEMA_VERSION};

/// The header's format name.
pub const LOG_FORMAT: &str = "lockstep-log";

/// The minor schema version this build writes, beside the major
/// [`SCHEMA_VERSION`]. A minor version only adds fields (with defaults) or
/// values of open enums, so every build of the same major version reads it:
/// an older build ignores what it does not know (the event ids still cover
/// it, see [`LogReader`]). Bump it with every such addition to a wire type.
pub const SCHEMA_MINOR: u32 = 4;

/// The largest record a reader accepts, in bytes (one JSON line or one
/// MessagePack value). Real records are a few hundred bytes, a policy a few
/// KiB; anything near this bound is damage, and the bound keeps a reader's
/// memory bounded on any input.
pub const RECORD_BYTES_MAX: usize = 16 << 20;

/// One record of a log file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Record {
    /// First record of every file.
    Header(LogHeader),
    /// An event as it was appended to the log.
    Event(EventRecord),
    /// An action the reducer issued.
    Action(IssuedAction),
    /// A part of the reducer's state before the file's first event (an
    /// incident bundle: a window of a longer log that replays alone). The
    /// parts come right after the header, in order, before any event.
    /// Files with one need schema minor version 3 or later to read.
    Snapshot(SnapshotPart),
}

/// The most state bytes one [`SnapshotPart`] carries: a snapshot of a large
/// fleet is split so that every record stays well inside
/// [`RECORD_BYTES_MAX`] (base64 in JSON Lines adds a third).
pub const SNAPSHOT_PART_BYTES: usize = 4 << 20;

/// One part of the reducer's state at a point of the log: the engine's
/// snapshot (named-field MessagePack) split in order, each part naming the
/// whole it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotPart {
    /// The last sequence the state has applied: the file's events follow it.
    pub seq: u64,
    /// The reducer's clock at that point (ms since the Unix epoch).
    pub time_ms: u64,
    /// The state hash of the whole snapshot (SHA-256 of its bytes, hex).
    pub state_hash: String,
    /// The engine's state layout: a build of another layout cannot restore
    /// it.
    pub layout: u32,
    /// Which part this is, from 0.
    pub part: u32,
    /// How many parts there are.
    pub parts: u32,
    /// This part's bytes (base64 in JSON Lines, binary in MessagePack).
    #[serde(with = "bytes")]
    #[schemars(with = "String")]
    pub bytes: Vec<u8>,
}

impl SnapshotPart {
    /// `snapshot` (the engine's state at `seq`, its hash `state_hash`)
    /// split into parts of at most [`SNAPSHOT_PART_BYTES`].
    pub fn split(
        snapshot: &[u8],
        seq: u64,
        time_ms: u64,
        state_hash: &str,
        layout: u32,
    ) -> Vec<Self> {
        let chunks: Vec<&[u8]> = if snapshot.is_empty() {
            vec![&[]]
        } else {
            snapshot.chunks(SNAPSHOT_PART_BYTES).collect()
        };
        let parts = u32::try_from(chunks.len()).expect("a snapshot under 16 PiB");
        chunks
            .into_iter()
            .zip(0..)
            .map(|(chunk, part)| Self {
                seq,
                time_ms,
                state_hash: state_hash.to_owned(),
                layout,
                part,
                parts,
                bytes: chunk.to_vec(),
            })
            .collect()
    }
}

/// Bytes as base64 text where the format is read by people (JSON), as a
/// binary string where it is not (MessagePack).
mod bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b))
        } else {
            s.serialize_bytes(b)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        if d.is_human_readable() {
            let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
            base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(serde::de::Error::custom)
        } else {
            d.deserialize_byte_buf(Visitor)
        }
    }

    struct Visitor;

    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("bytes")
        }

        fn visit_bytes<E: serde::de::Error>(self, b: &[u8]) -> Result<Vec<u8>, E> {
            Ok(b.to_vec())
        }

        fn visit_byte_buf<E: serde::de::Error>(self, b: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(b)
        }
    }
}

/// Identifies a lockstep log file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LogHeader {
    /// Always [`LOG_FORMAT`].
    pub format: String,
    /// Highest envelope schema version in the file: the major version. A
    /// reader refuses a newer one.
    pub schema_version: u32,
    /// Minor schema version (see [`SCHEMA_MINOR`]). Absent in files written
    /// before it existed: 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub schema_minor: u32,
    /// What wrote the file, e.g. `lockstep 0.1.0`.
    #[serde(default)]
    pub written_by: String,
}

impl LogHeader {
    /// A header for a file written by this build.
    pub fn current(written_by: impl Into<String>) -> Self {
        Self {
            format: LOG_FORMAT.to_owned(),
            schema_version: SCHEMA_VERSION,
            schema_minor: SCHEMA_MINOR,
            written_by: written_by.into(),
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// An event with its place in the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EventRecord {
    /// Stream sequence: the one total order.
    pub seq: u64,
    /// Append time (ms since the Unix epoch): the reducer's clock.
    pub time_ms: u64,
    /// The event.
    pub envelope: Envelope,
}

/// File encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON document a line.
    JsonLines,
    /// Concatenated named-field MessagePack values.
    MessagePack,
}

impl Format {
    /// Guesses the format from a file name: `.msgpack` / `.mpk` are MessagePack,
    /// everything else JSON Lines.
    pub fn from_path(path: &std::path::Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some("msgpack" | "mpk") => Self::MessagePack,
            _ => Self::JsonLines,
        }
    }
}

/// Where in a file a record starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// JSON Lines: 1-based line number.
    Line(u64),
    /// MessagePack: byte offset.
    Offset(u64),
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Line(n) => write!(f, "line {n}"),
            Self::Offset(n) => write!(f, "byte offset {n}"),
        }
    }
}

/// Why a log file could not be read further.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The file does not start with a lockstep log header.
    #[error("{pos}: not a lockstep log (the first record must be a `{LOG_FORMAT}` header)")]
    NotALog {
        /// Where.
        pos: Position,
    },
    /// A record's schema version is newer than this build knows.
    #[error("{pos}: unknown schema version {found} (this lockstep reads versions up to {SCHEMA_VERSION}; upgrade lockstep)")]
    UnknownSchemaVersion {
        /// Where.
        pos: Position,
        /// The version found.
        found: u32,
    },
    /// An event kind this build does not know.
    #[error("{pos}: unknown event kind `{kind}`")]
    UnknownEventKind {
        /// Where.
        pos: Position,
        /// The kind found.
        kind: String,
    },
    /// The file ends inside a record.
    #[error("{pos}: truncated record (the file ends inside it)")]
    Truncated {
        /// Where the incomplete record starts.
        pos: Position,
    },
    /// A record is not valid.
    #[error("{pos}: malformed record: {message}")]
    Malformed {
        /// Where.
        pos: Position,
        /// What the decoder said.
        message: String,
    },
    /// An event's id does not match its content.
    #[error("{pos}: event at seq {seq} has id {id}, which does not match its content (the record was altered)")]
    IdMismatch {
        /// Where.
        pos: Position,
        /// The record's sequence.
        seq: u64,
        /// The id in the record.
        id: String,
    },
    /// A snapshot part out of place: after an event, out of order, or not
    /// followed by the rest of its parts.
    #[error("{pos}: {message}")]
    MisplacedSnapshot {
        /// Where.
        pos: Position,
        /// What is wrong.
        message: String,
    },
    /// Sequence numbers must go up.
    #[error("{pos}: event seq {seq} does not follow seq {prev}")]
    OutOfOrder {
        /// Where.
        pos: Position,
        /// The record's sequence.
        seq: u64,
        /// The previous event's sequence.
        prev: u64,
    },
    /// The header names a major schema version newer than this build reads.
    #[error("{pos}: the log was written by `{written_by}` with schema version {found_major}.{found_minor}, newer than the {SCHEMA_VERSION}.{SCHEMA_MINOR} this lockstep reads; upgrade lockstep")]
    NewerSchema {
        /// Where (the header).
        pos: Position,
        /// The header's major version.
        found_major: u32,
        /// The header's minor version.
        found_minor: u32,
        /// What wrote the file, as the header says.
        written_by: String,
    },
    /// A record is larger than [`RECORD_BYTES_MAX`].
    #[error("{pos}: record larger than {} MiB, the bound of one record (the file is damaged or not a lockstep log)", RECORD_BYTES_MAX >> 20)]
    RecordTooLarge {
        /// Where the record starts.
        pos: Position,
    },
    /// Reading failed.
    #[error("reading the log failed")]
    Io(#[source] std::io::Error),
}

/// Something a reader accepts but a person should know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogWarning {
    /// The header names another schema version of the same major version
    /// (or an older major one, which is converted).
    OtherSchemaVersion {
        /// The header's major version.
        found_major: u32,
        /// The header's minor version.
        found_minor: u32,
        /// What wrote the file, as the header says.
        written_by: String,
    },
}

impl std::fmt::Display for LogWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OtherSchemaVersion {
                found_major,
                found_minor,
                written_by,
            } => {
                let found = (*found_major, *found_minor);
                let ours = (SCHEMA_VERSION, SCHEMA_MINOR);
                write!(
                    f,
                    "the log was written by `{written_by}` with schema version {found_major}.{found_minor}; this lockstep writes {SCHEMA_VERSION}.{SCHEMA_MINOR}: "
                )?;
                if found > ours {
                    f.write_str("fields this build does not know are ignored (the event ids still cover them)")
                } else {
                    f.write_str("fields added since read as their defaults")
                }
            }
        }
    }
}

impl DecodeError {
    /// Where the bad record starts, if the error is about one.
    pub fn position(&self) -> Option<Position> {
        match self {
            Self::NotALog { pos }
            | Self::UnknownSchemaVersion { pos, .. }
            | Self::UnknownEventKind { pos, .. }
            | Self::Truncated { pos }
            | Self::Malformed { pos, .. }
            | Self::IdMismatch { pos, .. }
            | Self::OutOfOrder { pos, .. }
            | Self::MisplacedSnapshot { pos, .. }
            | Self::NewerSchema { pos, .. }
            | Self::RecordTooLarge { pos } => Some(*pos),
            Self::Io(_) => None,
        }
    }
}

/// Reads records from a log file, checking the header, schema versions,
/// content ids and sequence order.
///
/// # Content ids of records a newer build wrote
///
/// An event's id is the hash of its envelope's content as the writer encoded
/// it. A newer lockstep of the same major schema version may write fields
/// this build does not know; decoding drops them, so re-encoding the decoded
/// event would no longer give the id, and a genuine log would look altered.
/// The reader therefore checks the id over the event as read: for
/// MessagePack, over the record's own bytes; for JSON Lines, over the
/// event's JSON value with its keys in the order read, unknown fields
/// included, encoded as the writer encodes it. A change to any field, known
/// or not, still fails the check. (Only when that check fails does the
/// reader accept a record whose known content verifies and which has no
/// unknown field, so that a JSON log whose keys a tool reordered still
/// reads.)
///
/// The ids are content hashes with no secret: they catch damage and hand
/// edits that forgot the id, not someone who recomputes it.
pub struct LogReader<R> {
    inner: Inner<R>,
    state: Check,
}

enum Inner<R> {
    Json {
        rd: R,
        /// Lines read so far (the 1-based number of the last one).
        line: u64,
        buf: Vec<u8>,
        consumed: u64,
        /// Nothing read yet: a byte-order mark may come.
        at_start: bool,
    },
    MsgPack {
        rd: R,
        /// Bytes read and not yet handed out start at `buf[start]`.
        buf: Vec<u8>,
        start: usize,
        /// File offset of `buf[start]`.
        offset: u64,
        eof: bool,
    },
}

struct Check {
    header_seen: bool,
    /// An event or an action has been read: no snapshot part may follow.
    past_snapshot: bool,
    /// The snapshot being read: its sequence, the next part and how many.
    snapshot: Option<(u64, u32, u32)>,
    last_event_seq: u64,
    done: bool,
    verify_ids: bool,
    warnings: Vec<LogWarning>,
    on_warning: Option<WarningSink>,
}

/// Where a reader's warnings go as they come up.
type WarningSink = Box<dyn FnMut(&LogWarning) + Send>;

/// The UTF-8 byte-order mark some editors put in front of a text file.
const BOM: &[u8] = b"\xef\xbb\xbf";

impl<R: BufRead> LogReader<R> {
    /// Reads JSON Lines from `rd` (a leading byte-order mark is skipped).
    pub fn json_lines(rd: R) -> Self {
        Self::with(Inner::Json {
            rd,
            line: 0,
            buf: Vec::new(),
            consumed: 0,
            at_start: true,
        })
    }

    /// Reads MessagePack records from `rd` as a stream.
    pub fn msgpack_stream(rd: R) -> Self {
        Self::with(Inner::MsgPack {
            rd,
            buf: Vec::new(),
            start: 0,
            offset: 0,
            eof: false,
        })
    }

    /// Reads a log, detecting its format: JSON Lines when it starts with
    /// printable text, after a UTF-8 byte-order mark and whitespace (which
    /// are skipped, and which a MessagePack log never starts with);
    /// MessagePack otherwise.
    pub fn detect(mut rd: R) -> Result<Self, DecodeError> {
        let mut consumed = 0u64;
        let mut newlines = 0u64;
        // A byte-order mark, matched byte by byte: a reader may hand out
        // fewer than three bytes at a time.
        while let Some(b) = peek(&mut rd)? {
            let at = consumed as usize;
            if at >= BOM.len() || b != BOM[at] {
                break;
            }
            rd.consume(1);
            consumed += 1;
        }
        if consumed != 0 && consumed as usize != BOM.len() {
            return Err(DecodeError::NotALog {
                pos: Position::Offset(0),
            });
        }
        while let Some(b) = peek(&mut rd)? {
            if !matches!(b, b' ' | b'\t' | b'\r' | b'\n') {
                break;
            }
            newlines += u64::from(b == b'\n');
            rd.consume(1);
            consumed += 1;
        }
        // JSON Lines is text: a lockstep log starts with `{`. A first byte
        // outside printable ASCII is MessagePack (a lockstep log's first
        // byte is a map marker; anything else is named as damage there).
        let first = peek(&mut rd)?;
        if consumed == 0 && first.is_some_and(|b| !(0x20..=0x7e).contains(&b)) {
            return Ok(Self::msgpack_stream(rd));
        }
        Ok(Self::with(Inner::Json {
            rd,
            line: newlines,
            buf: Vec::new(),
            consumed,
            at_start: false,
        }))
    }
}

fn peek<R: BufRead>(rd: &mut R) -> Result<Option<u8>, DecodeError> {
    loop {
        match rd.fill_buf() {
            Ok(buf) => return Ok(buf.first().copied()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(DecodeError::Io(e)),
        }
    }
}

impl LogReader<std::io::Empty> {
    /// Reads MessagePack records from a buffer.
    pub fn msgpack(data: Vec<u8>) -> Self {
        Self::with(Inner::MsgPack {
            rd: std::io::empty(),
            buf: data,
            start: 0,
            offset: 0,
            eof: true,
        })
    }
}

impl<R> LogReader<R> {
    fn with(inner: Inner<R>) -> Self {
        Self {
            inner,
            state: Check {
                header_seen: false,
                past_snapshot: false,
                snapshot: None,
                last_event_seq: 0,
                done: false,
                verify_ids: true,
                warnings: Vec::new(),
                on_warning: None,
            },
        }
    }

    /// Skips the content-id check (faster; for trusted logs and benchmarks).
    pub fn trust_ids(mut self) -> Self {
        self.state.verify_ids = false;
        self
    }

    /// Calls `f` with each warning as it comes up (before the record it is
    /// about is handed out).
    pub fn on_warning(mut self, f: impl FnMut(&LogWarning) + Send + 'static) -> Self {
        self.state.on_warning = Some(Box::new(f));
        self
    }

    /// The warnings so far.
    pub fn warnings(&self) -> &[LogWarning] {
        &self.state.warnings
    }

    /// Bytes consumed so far, for progress reporting.
    pub fn bytes_read(&self) -> u64 {
        match &self.inner {
            Inner::Json { consumed, .. } => *consumed,
            Inner::MsgPack { offset, .. } => *offset,
        }
    }
}

impl<R: BufRead> Iterator for LogReader<R> {
    type Item = Result<Record, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.state.done {
            return None;
        }
        let verify = self.state.verify_ids;
        let item = match &mut self.inner {
            Inner::Json {
                rd,
                line,
                buf,
                consumed,
                at_start,
            } => next_json(rd, line, buf, consumed, at_start, verify),
            Inner::MsgPack {
                rd,
                buf,
                start,
                offset,
                eof,
            } => next_msgpack(rd, buf, start, offset, eof, verify),
        };
        let item = match item {
            None => {
                self.state.done = true;
                if !self.state.header_seen {
                    let pos = match self.inner {
                        Inner::Json { .. } => Position::Line(1),
                        Inner::MsgPack { .. } => Position::Offset(0),
                    };
                    return Some(Err(DecodeError::NotALog { pos }));
                }
                if let Some((seq, next, parts)) = self.state.snapshot {
                    let pos = match &self.inner {
                        Inner::Json { line, .. } => Position::Line(*line + 1),
                        Inner::MsgPack { offset, .. } => Position::Offset(*offset),
                    };
                    return Some(Err(DecodeError::MisplacedSnapshot {
                        pos,
                        message: format!(
                            "the file ends inside the snapshot of seq {seq}, after part {next} of {parts}"
                        ),
                    }));
                }
                return None;
            }
            Some(item) => item.and_then(|(pos, rec, id_ok)| self.state.check(pos, rec, id_ok)),
        };
        if item.is_err() {
            self.state.done = true;
        }
        Some(item)
    }
}

impl Check {
    /// `id_ok`: whether the event's id verified over the record as read
    /// (`None` when not checked).
    fn check(
        &mut self,
        pos: Position,
        rec: Record,
        id_ok: Option<bool>,
    ) -> Result<Record, DecodeError> {
        match &rec {
            Record::Header(h) => {
                if self.header_seen || h.format != LOG_FORMAT || h.schema_version == 0 {
                    return Err(DecodeError::NotALog { pos });
                }
                if h.schema_version > SCHEMA_VERSION {
                    return Err(DecodeError::NewerSchema {
                        pos,
                        found_major: h.schema_version,
                        found_minor: h.schema_minor,
                        written_by: h.written_by.clone(),
                    });
                }
                if (h.schema_version, h.schema_minor) != (SCHEMA_VERSION, SCHEMA_MINOR) {
                    self.warn(LogWarning::OtherSchemaVersion {
                        found_major: h.schema_version,
                        found_minor: h.schema_minor,
                        written_by: h.written_by.clone(),
                    });
                }
                self.header_seen = true;
            }
            _ if !self.header_seen => return Err(DecodeError::NotALog { pos }),
            Record::Snapshot(p) => self.check_snapshot(pos, p)?,
            _ if self.snapshot.is_some() => {
                let (seq, next, parts) = self.snapshot.expect("checked");
                return Err(DecodeError::MisplacedSnapshot {
                    pos,
                    message: format!("the snapshot of seq {seq} ends after part {next} of {parts}"),
                });
            }
            Record::Event(ev) => {
                self.past_snapshot = true;
                if ev.envelope.v > SCHEMA_VERSION || ev.envelope.v == 0 {
                    return Err(DecodeError::UnknownSchemaVersion {
                        pos,
                        found: ev.envelope.v,
                    });
                }
                if ev.seq <= self.last_event_seq {
                    return Err(DecodeError::OutOfOrder {
                        pos,
                        seq: ev.seq,
                        prev: self.last_event_seq,
                    });
                }
                if id_ok == Some(false) {
                    return Err(DecodeError::IdMismatch {
                        pos,
                        seq: ev.seq,
                        id: ev.envelope.id.0.clone(),
                    });
                }
                self.last_event_seq = ev.seq;
            }
            Record::Action(_) => self.past_snapshot = true,
        }
        Ok(rec)
    }

    /// A snapshot part comes before any event, in order, each naming the
    /// same snapshot as the part before it.
    fn check_snapshot(&mut self, pos: Position, p: &SnapshotPart) -> Result<(), DecodeError> {
        let misplaced = |message: String| Err(DecodeError::MisplacedSnapshot { pos, message });
        if self.past_snapshot {
            return misplaced(format!(
                "a snapshot (of seq {}) after events or after another snapshot: a file holds one, right after its header",
                p.seq
            ));
        }
        let expected = match self.snapshot {
            None => (p.seq, 0, p.parts),
            Some(expected) => expected,
        };
        if (p.seq, p.part, p.parts) != expected || p.parts == 0 {
            return misplaced(format!(
                "snapshot part {} of {} (seq {}) where part {} of {} (seq {}) was due",
                p.part, p.parts, p.seq, expected.1, expected.2, expected.0
            ));
        }
        self.snapshot = (p.part + 1 < p.parts).then_some((p.seq, p.part + 1, p.parts));
        if self.snapshot.is_none() {
            // The file's events follow the state, and there is one state.
            self.past_snapshot = true;
            self.last_event_seq = p.seq;
        }
        Ok(())
    }

    fn warn(&mut self, w: LogWarning) {
        if let Some(f) = &mut self.on_warning {
            f(&w);
        }
        self.warnings.push(w);
    }
}

/// A record, where it starts, and whether its event id verified (`None`: not
/// checked).
type Decoded = Option<Result<(Position, Record, Option<bool>), DecodeError>>;

/// What reading one line gave.
enum Line {
    Eof,
    Read(usize),
    TooLong,
}

/// Reads one line into `buf` (newline included), at most
/// [`RECORD_BYTES_MAX`] bytes of it.
fn read_line_bounded<R: BufRead>(rd: &mut R, buf: &mut Vec<u8>) -> std::io::Result<Line> {
    buf.clear();
    loop {
        let avail = match rd.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok(if buf.is_empty() {
                Line::Eof
            } else {
                Line::Read(buf.len())
            });
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (avail.len(), false),
        };
        // The newline (and a CR before it) do not count against the bound.
        if buf.len() + take > RECORD_BYTES_MAX + 2 {
            return Ok(Line::TooLong);
        }
        buf.extend_from_slice(&avail[..take]);
        rd.consume(take);
        if done {
            return Ok(Line::Read(buf.len()));
        }
    }
}

fn next_json<R: BufRead>(
    rd: &mut R,
    line: &mut u64,
    buf: &mut Vec<u8>,
    consumed: &mut u64,
    at_start: &mut bool,
    verify: bool,
) -> Decoded {
    loop {
        let n = match read_line_bounded(rd, buf) {
            Ok(Line::Eof) => return None,
            Ok(Line::Read(n)) => n,
            Ok(Line::TooLong) => {
                return Some(Err(DecodeError::RecordTooLarge {
                    pos: Position::Line(*line + 1),
                }))
            }
            Err(e) => return Some(Err(DecodeError::Io(e))),
        };
        *line += 1;
        *consumed += n as u64;
        let pos = Position::Line(*line);
        let mut bytes = buf.as_slice();
        if std::mem::take(at_start) {
            bytes = bytes.strip_prefix(BOM).unwrap_or(bytes);
        }
        let Ok(text) = std::str::from_utf8(bytes) else {
            return Some(Err(DecodeError::Malformed {
                pos,
                message: "not UTF-8".to_owned(),
            }));
        };
        let newline = text.ends_with('\n');
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        return Some(match serde_json::from_str::<Record>(text) {
            Ok(rec) => {
                let id_ok = match &rec {
                    Record::Event(ev) if verify => Some(id::json_verifies(text, ev)),
                    _ => None,
                };
                Ok((pos, rec, id_ok))
            }
            Err(e) => {
                let truncated = e.is_eof() && !newline;
                Err(classify(
                    pos,
                    serde_json::from_str(text).ok(),
                    truncated,
                    e.to_string(),
                ))
            }
        });
    }
}

/// How many bytes a MessagePack reader asks for at least when it needs more.
const MSGPACK_READ_BYTES_MIN: usize = 64 << 10;

fn next_msgpack<R: BufRead>(
    rd: &mut R,
    buf: &mut Vec<u8>,
    start: &mut usize,
    offset: &mut u64,
    eof: &mut bool,
    verify: bool,
) -> Decoded {
    let at = Position::Offset(*offset);
    // Find the record's extent first, reading more until it is all in the
    // buffer, then decode it in place: strings are read straight from the
    // buffer instead of through a copying reader.
    let len = loop {
        let avail = &buf[*start..];
        if avail.is_empty() && *eof {
            return None;
        }
        match msgpack_value_len(avail) {
            Ok(len) if len > RECORD_BYTES_MAX => {
                return Some(Err(DecodeError::RecordTooLarge { pos: at }))
            }
            Ok(len) => break len,
            Err(Extent::Invalid(marker)) => {
                return Some(Err(DecodeError::Malformed {
                    pos: at,
                    message: format!("invalid MessagePack marker 0x{marker:02x}"),
                }))
            }
            Err(Extent::Truncated { needed }) => {
                if needed > RECORD_BYTES_MAX {
                    return Some(Err(DecodeError::RecordTooLarge { pos: at }));
                }
                if *eof {
                    return Some(Err(DecodeError::Truncated { pos: at }));
                }
                // Read at least twice what is buffered, so that a long record
                // is walked O(log n) times, not once per read.
                let want = needed
                    .max(2 * avail.len())
                    .clamp(MSGPACK_READ_BYTES_MIN, RECORD_BYTES_MAX + 1);
                buf.drain(..*start);
                *start = 0;
                match fill(rd, buf, want) {
                    Ok(more) => *eof = !more,
                    Err(e) => return Some(Err(DecodeError::Io(e))),
                }
            }
        }
    };
    let bytes = &buf[*start..*start + len];
    let item = match rmp_serde::from_slice::<Record>(bytes) {
        Ok(rec) => {
            let id_ok = match &rec {
                Record::Event(ev) if verify => Some(id::msgpack_verifies(bytes, ev)),
                _ => None,
            };
            Ok((at, rec, id_ok))
        }
        Err(e) => {
            let value = rmp_serde::from_slice::<serde_json::Value>(bytes).ok();
            Err(classify(at, value, false, e.to_string()))
        }
    };
    *start += len;
    *offset += len as u64;
    Some(item)
}

/// Appends bytes from `rd` to `buf` until it holds `want` bytes. Returns
/// false at the end of the input.
fn fill<R: BufRead>(rd: &mut R, buf: &mut Vec<u8>, want: usize) -> std::io::Result<bool> {
    while buf.len() < want {
        let avail = match rd.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok(false);
        }
        let take = avail.len().min(want - buf.len());
        buf.extend_from_slice(&avail[..take]);
        rd.consume(take);
    }
    Ok(true)
}

/// Checking an event's id over the record as read (see [`LogReader`]).
mod id {
    use serde::de::{self, Deserialize, Deserializer, Visitor};
    use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

    use super::{be_uint, msgpack_value_len};
    use crate::envelope::{id_hex_of_parts, id_of_parts};
    use crate::{EventId, EventRecord};

    /// Any value, as read: maps keep their keys in the order read.
    #[derive(Debug)]
    pub(super) enum Raw {
        Nil,
        Bool(bool),
        Int(i64),
        UInt(u64),
        Float(f64),
        Str(String),
        Bin(Vec<u8>),
        Seq(Vec<Raw>),
        Map(Vec<(Raw, Raw)>),
    }

    impl Serialize for Raw {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            match self {
                Self::Nil => s.serialize_unit(),
                Self::Bool(b) => s.serialize_bool(*b),
                Self::Int(n) => s.serialize_i64(*n),
                Self::UInt(n) => s.serialize_u64(*n),
                Self::Float(x) => s.serialize_f64(*x),
                Self::Str(t) => s.serialize_str(t),
                Self::Bin(b) => s.serialize_bytes(b),
                Self::Seq(items) => {
                    let mut seq = s.serialize_seq(Some(items.len()))?;
                    for i in items {
                        seq.serialize_element(i)?;
                    }
                    seq.end()
                }
                Self::Map(entries) => {
                    let mut map = s.serialize_map(Some(entries.len()))?;
                    for (k, v) in entries {
                        map.serialize_entry(k, v)?;
                    }
                    map.end()
                }
            }
        }
    }

    impl<'de> Deserialize<'de> for Raw {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Raw;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("any value")
                }
                fn visit_unit<E>(self) -> Result<Raw, E> {
                    Ok(Raw::Nil)
                }
                fn visit_none<E>(self) -> Result<Raw, E> {
                    Ok(Raw::Nil)
                }
                fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Raw, D::Error> {
                    Raw::deserialize(d)
                }
                fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Raw, D::Error> {
                    Raw::deserialize(d)
                }
                fn visit_bool<E>(self, b: bool) -> Result<Raw, E> {
                    Ok(Raw::Bool(b))
                }
                fn visit_i64<E>(self, n: i64) -> Result<Raw, E> {
                    // The writer encodes every non-negative integer the same
                    // way, signed or not.
                    Ok(u64::try_from(n).map_or(Raw::Int(n), Raw::UInt))
                }
                fn visit_u64<E>(self, n: u64) -> Result<Raw, E> {
                    Ok(Raw::UInt(n))
                }
                fn visit_f64<E>(self, x: f64) -> Result<Raw, E> {
                    Ok(Raw::Float(x))
                }
                fn visit_str<E>(self, t: &str) -> Result<Raw, E> {
                    Ok(Raw::Str(t.to_owned()))
                }
                fn visit_string<E>(self, t: String) -> Result<Raw, E> {
                    Ok(Raw::Str(t))
                }
                fn visit_bytes<E>(self, b: &[u8]) -> Result<Raw, E> {
                    Ok(Raw::Bin(b.to_vec()))
                }
                fn visit_byte_buf<E>(self, b: Vec<u8>) -> Result<Raw, E> {
                    Ok(Raw::Bin(b))
                }
                fn visit_seq<A: de::SeqAccess<'de>>(self, mut a: A) -> Result<Raw, A::Error> {
                    let mut items = Vec::with_capacity(a.size_hint().unwrap_or(0).min(64));
                    while let Some(i) = a.next_element()? {
                        items.push(i);
                    }
                    Ok(Raw::Seq(items))
                }
                fn visit_map<A: de::MapAccess<'de>>(self, mut a: A) -> Result<Raw, A::Error> {
                    let mut entries = Vec::with_capacity(a.size_hint().unwrap_or(0).min(64));
                    while let Some(e) = a.next_entry()? {
                        entries.push(e);
                    }
                    Ok(Raw::Map(entries))
                }
            }
            d.deserialize_any(V)
        }
    }

    /// The path to an event in a record: `{"event": {"envelope": {"event": ..}}}`.
    #[derive(serde::Deserialize)]
    pub(super) struct RawRecord {
        pub(super) event: RawEventRecord,
    }

    #[derive(serde::Deserialize)]
    pub(super) struct RawEventRecord {
        pub(super) envelope: RawEnvelope,
    }

    #[derive(serde::Deserialize)]
    pub(super) struct RawEnvelope {
        pub(super) event: Raw,
        /// The envelope's detail, when it has one (it is then covered by
        /// the id, see `Envelope::with_detail`).
        #[serde(default)]
        pub(super) detail: Option<Raw>,
    }

    /// Whether the id of the event in a JSON record verifies over its JSON
    /// value as read.
    pub(super) fn json_verifies(text: &str, ev: &EventRecord) -> bool {
        let Ok(raw) = serde_json::from_str::<RawRecord>(text) else {
            return false;
        };
        let raw = raw.event.envelope;
        raw_id(&raw, ev).is_some_and(|id| id == ev.envelope.id) || same_content_reordered(&raw, ev)
    }

    /// Whether the id of the event in a MessagePack record verifies over the
    /// record's bytes.
    pub(super) fn msgpack_verifies(bytes: &[u8], ev: &EventRecord) -> bool {
        if msgpack_id(bytes).is_some_and(|id| id == ev.envelope.id.0.as_bytes()) {
            return true;
        }
        match rmp_serde::from_slice::<RawRecord>(bytes) {
            Ok(raw) => same_content_reordered(&raw.event.envelope, ev),
            Err(_) => false,
        }
    }

    /// The id over a JSON event as read: its value encoded as the writer
    /// encodes, keys in the order read.
    pub(super) fn raw_id(raw: &RawEnvelope, ev: &EventRecord) -> Option<EventId> {
        let env = &ev.envelope;
        let bytes = match &raw.detail {
            None => rmp_serde::to_vec_named(&(env.v, env.source, env.observed_ms, &raw.event)),
            Some(detail) => {
                rmp_serde::to_vec_named(&(env.v, env.source, env.observed_ms, &raw.event, detail))
            }
        }
        .ok()?;
        Some(id_of_parts(&[&bytes]))
    }

    /// The id over a MessagePack record's bytes (the record and nothing
    /// after it), as its 32 hex digits.
    pub(super) fn msgpack_id(bytes: &[u8]) -> Option<[u8; 32]> {
        // The id is the hash of the named MessagePack encoding of the tuple
        // (v, source, observed_ms, event), or with the detail when there is
        // one: an array marker, then the values exactly as the writer
        // encoded them inside the record.
        let (record, last) = map_value_from(bytes, "event")?;
        let (env, env_last) = map_value_from(record, "envelope")?;
        // `bytes` is the record: a map's last value ends where the map
        // does, so an envelope that is the last value all the way up ends
        // where the record does, and so does its own last value.
        let [v, source, observed_ms, event, detail] = map_values(
            env,
            ["v", "source", "observed_ms", "event", "detail"],
            last && env_last,
        )?;
        let [v, source, observed_ms, event] = [v?, source?, observed_ms?, event?];
        Some(match detail {
            None => id_hex_of_parts(&[&[0x94], v, source, observed_ms, event]),
            Some(detail) => id_hex_of_parts(&[&[0x95], v, source, observed_ms, event, detail]),
        })
    }

    /// The fallback: the known content verifies and the event as read holds
    /// nothing else, only in another key order.
    fn same_content_reordered(raw: &RawEnvelope, ev: &EventRecord) -> bool {
        // serde_json's maps are sorted by key: equal values are equal
        // content whatever the order the keys were read in.
        let read = serde_json::to_value(&raw.event);
        let known = serde_json::to_value(&ev.envelope.event);
        let read_detail = match &raw.detail {
            Some(d) => serde_json::to_value(d),
            None => Ok(serde_json::json!({})),
        };
        let known_detail = serde_json::to_value(&ev.envelope.detail);
        matches!((read, known), (Ok(a), Ok(b)) if a == b)
            && matches!((read_detail, known_detail), (Ok(a), Ok(b)) if a == b)
            && ev.envelope.id_matches()
    }

    /// Where the first key of the MessagePack map at the start of `buf`
    /// starts, and how many entries the map has.
    fn map_entries(buf: &[u8]) -> Option<(usize, usize)> {
        match *buf.first()? {
            m @ 0x80..=0x8f => Some((1, usize::from(m & 0x0f))),
            0xde => Some((3, be_uint(buf, 1, 2).ok()?)),
            0xdf => Some((5, be_uint(buf, 1, 4).ok()?)),
            _ => None,
        }
    }

    /// The name of the key at `buf[pos..]` (empty when it is no string)
    /// and where its value starts.
    fn key_at(buf: &[u8], pos: usize) -> Option<(&[u8], usize)> {
        let klen = msgpack_value_len(buf.get(pos..)?).ok()?;
        let k = &buf[pos..pos + klen];
        let name = match k[0] {
            0xa0..=0xbf => &k[1..],
            0xd9 => &k[2..],
            0xda => &k[3..],
            0xdb => &k[5..],
            _ => &[][..],
        };
        Some((name, pos + klen))
    }

    /// Where the value of `key` in the MessagePack map at the start of
    /// `buf` starts: the rest of `buf` from there, and whether it is the
    /// map's last value. Only the values before it are walked.
    fn map_value_from<'a>(buf: &'a [u8], key: &str) -> Option<(&'a [u8], bool)> {
        let (mut pos, entries) = map_entries(buf)?;
        for i in 0..entries {
            let (name, at) = key_at(buf, pos)?;
            if name == key.as_bytes() {
                return Some((buf.get(at..)?, i + 1 == entries));
            }
            pos = at + msgpack_value_len(buf.get(at..)?).ok()?;
        }
        None
    }

    /// The encoded values of `keys` in the MessagePack map at the start of
    /// `buf`, in one walk over it. `to_end`: the map ends where `buf`
    /// does, so its last value is the rest of `buf`, not walked.
    fn map_values<'a, const N: usize>(
        buf: &'a [u8],
        keys: [&str; N],
        to_end: bool,
    ) -> Option<[Option<&'a [u8]>; N]> {
        let (mut pos, entries) = map_entries(buf)?;
        let mut found = [None; N];
        for i in 0..entries {
            let (name, at) = key_at(buf, pos)?;
            pos = if to_end && i + 1 == entries {
                buf.len()
            } else {
                at + msgpack_value_len(buf.get(at..)?).ok()?
            };
            if let Some(k) = keys.iter().position(|k| k.as_bytes() == name) {
                found[k].get_or_insert(buf.get(at..pos)?);
            }
        }
        Some(found)
    }
}

/// Why a MessagePack value has no extent.
enum Extent {
    /// The buffer ends inside it; the value is at least `needed` bytes long.
    Truncated {
        /// A lower bound of the value's length.
        needed: usize,
    },
    /// A byte that is no MessagePack marker (0xc1).
    Invalid(u8),
}

/// The big-endian unsigned number in `buf[at..at + n]` (a MessagePack
/// length or count).
fn be_uint(buf: &[u8], at: usize, n: usize) -> Result<usize, Extent> {
    let b = buf
        .get(at..at + n)
        .ok_or(Extent::Truncated { needed: at + n })?;
    Ok(b.iter().fold(0usize, |acc, &x| (acc << 8) | usize::from(x)))
}

/// The length in bytes of the MessagePack value at the start of `buf`,
/// walking markers without decoding anything. (rmp offers no skip; this is
/// the format's marker table, MessagePack spec "Formats".)
fn msgpack_value_len(buf: &[u8]) -> Result<usize, Extent> {
    let mut pos = 0usize;
    // Values still to walk: maps count twice per entry.
    let mut pending: usize = 1;
    while pending > 0 {
        pending -= 1;
        let marker = *buf.get(pos).ok_or(Extent::Truncated { needed: pos + 1 })?;
        pos += 1;
        let (skip, values) = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0x80..=0x8f => (0, 2 * usize::from(marker & 0x0f)),
            0x90..=0x9f => (0, usize::from(marker & 0x0f)),
            0xa0..=0xbf => (usize::from(marker & 0x1f), 0),
            0xc1 => return Err(Extent::Invalid(marker)),
            // bin 8/16/32, str 8/16/32
            0xc4 | 0xd9 => (1 + be_uint(buf, pos, 1)?, 0),
            0xc5 | 0xda => (2 + be_uint(buf, pos, 2)?, 0),
            0xc6 | 0xdb => (4 + be_uint(buf, pos, 4)?, 0),
            // ext 8/16/32: length, type byte, data
            0xc7 => (2 + be_uint(buf, pos, 1)?, 0),
            0xc8 => (3 + be_uint(buf, pos, 2)?, 0),
            0xc9 => (5 + be_uint(buf, pos, 4)?, 0),
            // float 32/64, uint 8..64, int 8..64
            0xca => (4, 0),
            0xcb => (8, 0),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 => (2, 0),
            0xce | 0xd2 => (4, 0),
            0xcf | 0xd3 => (8, 0),
            // fixext 1/2/4/8/16
            0xd4 => (2, 0),
            0xd5 => (3, 0),
            0xd6 => (5, 0),
            0xd7 => (9, 0),
            0xd8 => (17, 0),
            // array 16/32, map 16/32
            0xdc => (2, be_uint(buf, pos, 2)?),
            0xdd => (4, be_uint(buf, pos, 4)?),
            0xde => (2, 2 * be_uint(buf, pos, 2)?),
            0xdf => (4, 2 * be_uint(buf, pos, 4)?),
        };
        pos = pos.saturating_add(skip);
        pending = pending.saturating_add(values);
        if pos > buf.len() {
            return Err(Extent::Truncated { needed: pos });
        }
    }
    Ok(pos)
}

/// Turns a decoding failure into the clearest error: looks at the record as
/// an untyped value to tell a newer schema version or an unknown event kind
/// from plain damage.
fn classify(
    pos: Position,
    value: Option<serde_json::Value>,
    truncated: bool,
    message: String,
) -> DecodeError {
    if truncated {
        return DecodeError::Truncated { pos };
    }
    if let Some(envelope) = value
        .as_ref()
        .and_then(|v| v.get("event"))
        .and_then(|v| v.get("envelope"))
    {
        if let Some(found) = envelope.get("v").and_then(|v| v.as_u64()) {
            if found > u64::from(SCHEMA_VERSION) || found == 0 {
                return DecodeError::UnknownSchemaVersion {
                    pos,
                    found: u32::try_from(found).unwrap_or(u32::MAX),
                };
            }
        }
        let kind = match envelope.get("event") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Object(m)) if m.len() == 1 => m.keys().next().cloned(),
            _ => None,
        };
        if let Some(kind) = kind {
            if !crate::EVENT_KINDS.contains(&kind.as_str()) {
                return DecodeError::UnknownEventKind { pos, kind };
            }
        }
    }
    DecodeError::Malformed { pos, message }
}

/// Writes a log file: the header first, then records.
pub struct LogWriter<W: Write> {
    out: W,
    format: Format,
}

impl<W: Write> LogWriter<W> {
    /// Starts a file, writing its header.
    pub fn new(out: W, format: Format, written_by: &str) -> std::io::Result<Self> {
        let mut w = Self { out, format };
        w.write(&Record::Header(LogHeader::current(written_by)))?;
        Ok(w)
    }

    /// Appends one record.
    pub fn write(&mut self, rec: &Record) -> std::io::Result<()> {
        match self.format {
            Format::JsonLines => {
                serde_json::to_writer(&mut self.out, rec)?;
                self.out.write_all(b"\n")
            }
            Format::MessagePack => rmp_serde::encode::write_named(&mut self.out, rec)
                .map_err(|e| std::io::Error::other(e.to_string())),
        }
    }

    /// Flushes and returns the writer.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Opens a log file, detecting its format; records are read as a stream.
pub fn open(
    path: &std::path::Path,
) -> Result<LogReader<std::io::BufReader<std::fs::File>>, DecodeError> {
    let file = std::fs::File::open(path).map_err(DecodeError::Io)?;
    LogReader::detect(std::io::BufReader::with_capacity(1 << 16, file))
}

/// Records handed over from the decoding thread at a time.
const READ_AHEAD_BATCH: usize = 256;

/// Batches decoded and not yet taken, at most: with [`READ_AHEAD_BATCH`],
/// and a snapshot part in a batch of its own, what waits stays within a few
/// MiB.
const READ_AHEAD_BATCHES: usize = 4;

/// The records of `records` (a [`LogReader`], or anything that yields what
/// one does), decoded on a thread of their own while the caller takes them:
/// a replay decodes and applies at once, on two cores, instead of one after
/// the other. The records, the error that ends them and the warnings come
/// as they would from `records` itself, in the same order; what is decoded
/// ahead is bounded. Dropping it stops the decoding thread at its next
/// batch; a panic on that thread is resumed on the caller's.
pub fn read_ahead<I>(records: I) -> ReadAhead
where
    I: Iterator<Item = Result<Record, DecodeError>> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(READ_AHEAD_BATCHES);
    let decoder = std::thread::Builder::new()
        .name("log-read-ahead".into())
        .spawn(move || {
            let mut batch = Vec::with_capacity(READ_AHEAD_BATCH);
            for item in records {
                // A snapshot part is up to 4 MiB: it goes on its own.
                let alone = matches!(item, Ok(Record::Snapshot(_)));
                batch.push(item);
                if alone || batch.len() == READ_AHEAD_BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(READ_AHEAD_BATCH));
                    if tx.send(full).is_err() {
                        // The reader was dropped: nobody wants the rest.
                        return;
                    }
                }
            }
            if !batch.is_empty() {
                let _ = tx.send(batch);
            }
        })
        .expect("starting the log's decoding thread");
    ReadAhead {
        batch: Vec::new().into_iter(),
        rx,
        decoder: Some(decoder),
    }
}

/// Records decoded on another thread ([`read_ahead`]).
pub struct ReadAhead {
    batch: std::vec::IntoIter<Result<Record, DecodeError>>,
    rx: std::sync::mpsc::Receiver<Vec<Result<Record, DecodeError>>>,
    decoder: Option<std::thread::JoinHandle<()>>,
}

impl Iterator for ReadAhead {
    type Item = Result<Record, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(item) = self.batch.next() {
                return Some(item);
            }
            match self.rx.recv() {
                Ok(batch) => self.batch = batch.into_iter(),
                Err(_) => {
                    // Every batch is in: the thread ended, or panicked.
                    if let Some(decoder) = self.decoder.take() {
                        if let Err(panic) = decoder.join() {
                            std::panic::resume_unwind(panic);
                        }
                    }
                    return None;
                }
            }
        }
    }
}

/// Reads a log into memory, stopping at the first error: a [`LogReader`],
/// a [`read_ahead`] of one, or anything else that yields what they do.
pub fn read_all(
    rd: impl IntoIterator<Item = Result<Record, DecodeError>>,
) -> (Vec<Record>, Option<DecodeError>) {
    let mut out = Vec::new();
    for item in rd {
        match item {
            Ok(rec) => out.push(rec),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Event, Source};

    /// An event from its JSON form, so the tests do not depend on the
    /// fields each event struct has today.
    fn ev(json: &str) -> Event {
        serde_json::from_str(json).unwrap()
    }

    fn record(seq: u64, event: Event) -> Record {
        Record::Event(EventRecord {
            seq,
            time_ms: 1_000 * seq,
            envelope: Envelope::new(Source::Test, 1_000 * seq, event),
        })
    }

    fn sample() -> Vec<Record> {
        vec![
            record(1, Event::Tick),
            record(2, ev(r#"{"slurm_job_gone":{"job_id":7}}"#)),
            record(
                3,
                ev(r#"{"kube_node":{"name":"k1","unschedulable":true,"ready":"True"}}"#),
            ),
        ]
    }

    fn encode_with(format: Format, header: &LogHeader, recs: &[Record]) -> Vec<u8> {
        let mut w = LogWriter {
            out: Vec::new(),
            format,
        };
        w.write(&Record::Header(header.clone())).unwrap();
        for r in recs {
            w.write(r).unwrap();
        }
        w.finish().unwrap()
    }

    fn encode(format: Format, recs: &[Record]) -> Vec<u8> {
        encode_with(format, &LogHeader::current("test"), recs)
    }

    fn decode(bytes: &[u8]) -> (Vec<Record>, Option<DecodeError>) {
        read_all(LogReader::detect(bytes).unwrap())
    }

    #[test]
    fn json_lines_after_a_byte_order_mark_or_whitespace_are_json_lines() {
        let text = encode(Format::JsonLines, &sample());
        // (prefix, lines it adds before the header)
        for (prefix, lines) in [
            (&b"\xef\xbb\xbf"[..], 0),
            (b"\n\n", 2),
            (b"  \t", 0),
            (b"\xef\xbb\xbf\r\n \n", 2),
        ] {
            let mut bytes = prefix.to_vec();
            bytes.extend_from_slice(&text);
            let (recs, err) = decode(&bytes);
            assert!(err.is_none(), "{prefix:?}: {err:?}");
            assert_eq!(recs.len(), 4, "{prefix:?}");
            // Damage is still named by its line in the file.
            bytes.extend_from_slice(b"{\n");
            let err = decode(&bytes).1.unwrap();
            assert_eq!(
                err.position(),
                Some(Position::Line(5 + lines)),
                "{prefix:?}: {err}"
            );
        }
        // A reader made for JSON Lines skips the mark too.
        let mut bytes = BOM.to_vec();
        bytes.extend_from_slice(&text);
        let (recs, err) = read_all(LogReader::json_lines(&bytes[..]));
        assert!(err.is_none() && recs.len() == 4, "{err:?}");
    }

    #[test]
    fn messagepack_is_detected_by_its_leading_map() {
        let bytes = encode(Format::MessagePack, &sample());
        assert!(matches!(bytes[0], 0x80..=0x8f));
        let (recs, err) = decode(&bytes);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(&recs[1..], &sample()[..]);
    }

    /// A reader that hands out `prefix`, then `fill` forever, and fails the
    /// test once more than `limit` bytes were asked of it.
    struct Endless {
        prefix: Vec<u8>,
        fill: u8,
        served: usize,
        limit: usize,
    }

    impl std::io::Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            assert!(
                self.served <= self.limit,
                "the reader read {} bytes: its memory is not bounded",
                self.served
            );
            let n = buf.len().min(1 << 16);
            for (i, b) in buf[..n].iter_mut().enumerate() {
                *b = self
                    .prefix
                    .get(self.served + i)
                    .copied()
                    .unwrap_or(self.fill);
            }
            self.served += n;
            Ok(n)
        }
    }

    fn endless(prefix: Vec<u8>, fill: u8) -> std::io::BufReader<Endless> {
        std::io::BufReader::new(Endless {
            prefix,
            fill,
            served: 0,
            limit: 2 * RECORD_BYTES_MAX,
        })
    }

    #[test]
    fn endless_messagepack_is_read_in_bounded_memory() {
        // A header, then an array of four billion nils that never ends.
        let mut prefix = encode(Format::MessagePack, &[]);
        let at = prefix.len() as u64;
        prefix.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
        let (recs, err) = read_all(LogReader::detect(endless(prefix, 0xc0)).unwrap());
        assert_eq!(recs.len(), 1);
        let err = err.unwrap();
        assert!(
            matches!(err, DecodeError::RecordTooLarge { pos: Position::Offset(o) } if o == at),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!("byte offset {at}: record larger than 16 MiB, the bound of one record (the file is damaged or not a lockstep log)")
        );
    }

    #[test]
    fn a_record_that_claims_more_than_the_bound_is_refused_before_it_is_read() {
        let mut bytes = encode(Format::MessagePack, &sample());
        let at = bytes.len() as u64;
        // {"event": <4 GiB of binary>}, of which 3 bytes are there.
        bytes.extend_from_slice(&[0x81, 0xa5]);
        bytes.extend_from_slice(b"event");
        bytes.extend_from_slice(&[0xc6, 0xff, 0xff, 0xff, 0xf0, 1, 2, 3]);
        let (recs, err) = read_all(LogReader::detect(&bytes[..]).unwrap());
        assert_eq!(recs.len(), 4);
        assert!(
            matches!(err, Some(DecodeError::RecordTooLarge { pos: Position::Offset(o) }) if o == at),
            "{err:?}"
        );
    }

    #[test]
    fn an_endless_line_is_read_in_bounded_memory() {
        // Text with no newline, ever.
        let (recs, err) = read_all(LogReader::detect(endless(Vec::new(), b'x')).unwrap());
        assert!(recs.is_empty());
        let err = err.unwrap();
        assert!(
            matches!(
                err,
                DecodeError::RecordTooLarge {
                    pos: Position::Line(1)
                }
            ),
            "{err}"
        );
        // And after a good header, the line it happens on.
        let prefix = encode(Format::JsonLines, &[]);
        let (recs, err) = read_all(LogReader::detect(endless(prefix, b' ')).unwrap());
        assert_eq!(recs.len(), 1);
        assert!(
            matches!(
                err,
                Some(DecodeError::RecordTooLarge {
                    pos: Position::Line(2)
                })
            ),
            "{err:?}"
        );
    }

    #[test]
    fn endless_zeros_are_an_error_at_the_start() {
        // What `lockstep replay /dev/zero` reads.
        let (recs, err) = read_all(LogReader::detect(endless(Vec::new(), 0)).unwrap());
        assert!(recs.is_empty());
        assert_eq!(err.unwrap().position(), Some(Position::Offset(0)));
    }

    #[test]
    fn messagepack_read_in_small_pieces_decodes_the_same() {
        struct Trickle<'a>(&'a [u8]);
        impl std::io::Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(self.0.len()).min(3);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let bytes = encode(Format::MessagePack, &sample());
        let rd = std::io::BufReader::with_capacity(5, Trickle(&bytes));
        let (recs, err) = read_all(LogReader::detect(rd).unwrap());
        assert!(err.is_none(), "{err:?}");
        assert_eq!(&recs[1..], &sample()[..]);
        // Cut short, it names the record that was cut.
        let cut = &bytes[..bytes.len() - 2];
        let rd = std::io::BufReader::with_capacity(5, Trickle(cut));
        let (recs, err) = read_all(LogReader::detect(rd).unwrap());
        assert_eq!(recs.len(), 3);
        assert!(
            matches!(err, Some(DecodeError::Truncated { .. })),
            "{err:?}"
        );
    }

    /// What a newer lockstep writes: an event with a field this build does
    /// not know, its id computed over all of it.
    mod newer {
        use serde::Serialize;

        use crate::Source;

        #[derive(Serialize)]
        pub enum Record {
            #[serde(rename = "event")]
            Event {
                seq: u64,
                time_ms: u64,
                envelope: Envelope,
            },
        }

        #[derive(Serialize)]
        pub struct Envelope {
            pub v: u32,
            pub id: String,
            pub source: Source,
            pub observed_ms: u64,
            pub event: Event,
        }

        #[derive(Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum Event {
            SlurmPartitionGone { name: String, retired_by: String },
        }

        pub fn record(seq: u64, retired_by: &str) -> Record {
            let event = Event::SlurmPartitionGone {
                name: "batch".into(),
                retired_by: retired_by.into(),
            };
            let bytes = rmp_serde::to_vec_named(&(1u32, Source::Slurm, 9u64, &event)).unwrap();
            let id = crate::envelope::id_of_parts(&[&bytes]).0;
            Record::Event {
                seq,
                time_ms: 9,
                envelope: Envelope {
                    v: 1,
                    id,
                    source: Source::Slurm,
                    observed_ms: 9,
                    event,
                },
            }
        }
    }

    fn with_newer_record(format: Format, rec: &newer::Record) -> Vec<u8> {
        let mut bytes = encode(Format::MessagePack, &[]);
        if format == Format::JsonLines {
            bytes = encode(Format::JsonLines, &[]);
            bytes.extend_from_slice(serde_json::to_string(rec).unwrap().as_bytes());
            bytes.push(b'\n');
        } else {
            bytes.extend_from_slice(&rmp_serde::to_vec_named(rec).unwrap());
        }
        bytes
    }

    #[test]
    fn an_event_with_a_field_this_build_does_not_know_verifies_over_what_was_read() {
        for format in [Format::JsonLines, Format::MessagePack] {
            let bytes = with_newer_record(format, &newer::record(1, "admin"));
            let (recs, err) = decode(&bytes);
            assert!(err.is_none(), "{format:?}: {err:?}");
            let Record::Event(e) = &recs[1] else {
                panic!("{recs:?}")
            };
            assert_eq!(e.envelope.event.kind(), "slurm_partition_gone");
            // The unknown field is covered by the id: changing it is caught.
            let mut altered = newer::record(1, "admin");
            let newer::Record::Event { envelope, .. } = &mut altered;
            envelope.id = match newer::record(1, "someone else") {
                newer::Record::Event { envelope, .. } => envelope.id,
            };
            let err = decode(&with_newer_record(format, &altered)).1;
            assert!(
                matches!(err, Some(DecodeError::IdMismatch { seq: 1, .. })),
                "{format:?}: {err:?}"
            );
        }
    }

    fn jsonl_lines() -> Vec<String> {
        String::from_utf8(encode(Format::JsonLines, &sample()))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn reordered_keys_still_verify_but_an_added_field_does_not() {
        // serde_json's Value sorts keys: a tool that rewrote the file.
        let mut lines = jsonl_lines();
        let v: serde_json::Value = serde_json::from_str(&lines[3]).unwrap();
        lines[3] = v.to_string();
        assert_ne!(lines[3], jsonl_lines()[3], "the keys moved");
        let (recs, err) = decode((lines.join("\n") + "\n").as_bytes());
        assert!(err.is_none() && recs.len() == 4, "{err:?}");
        // A field added to a record without a new id is an alteration, even
        // one this build would ignore.
        let mut v: serde_json::Value = serde_json::from_str(&lines[3]).unwrap();
        v["event"]["envelope"]["event"]["kube_node"]["cordoned_by"] = "x".into();
        lines[3] = v.to_string();
        let err = decode((lines.join("\n") + "\n").as_bytes()).1;
        assert!(
            matches!(err, Some(DecodeError::IdMismatch { seq: 3, .. })),
            "{err:?}"
        );
    }

    fn header(major: u32, minor: u32) -> LogHeader {
        LogHeader {
            format: LOG_FORMAT.into(),
            schema_version: major,
            schema_minor: minor,
            written_by: "lockstep 9.9.9".into(),
        }
    }

    #[test]
    fn a_newer_minor_version_warns_and_a_newer_major_version_is_refused() {
        for format in [Format::JsonLines, Format::MessagePack] {
            // (header, read, warned)
            let newer_minor = header(SCHEMA_VERSION, SCHEMA_MINOR + 1);
            let bytes = encode_with(format, &newer_minor, &sample());
            let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let sink = seen.clone();
            let rd = LogReader::detect(&bytes[..])
                .unwrap()
                .on_warning(move |w| sink.lock().unwrap().push(w.to_string()));
            let (recs, err) = read_all(rd);
            assert!(err.is_none() && recs.len() == 4, "{format:?}: {err:?}");
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 1, "{seen:?}");
            assert!(
                seen[0].contains(&format!(
                    "schema version {SCHEMA_VERSION}.{}",
                    SCHEMA_MINOR + 1
                )) && seen[0].contains("lockstep 9.9.9")
                    && seen[0].contains("does not know"),
                "{}",
                seen[0]
            );

            let bytes = encode_with(format, &header(SCHEMA_VERSION + 1, 0), &sample());
            let (recs, err) = decode(&bytes);
            assert!(recs.is_empty());
            let err = err.unwrap().to_string();
            assert!(
                err.contains(&format!("schema version {}.0", SCHEMA_VERSION + 1))
                    && err.contains(&format!(
                        "the {SCHEMA_VERSION}.{SCHEMA_MINOR} this lockstep reads"
                    ))
                    && err.contains("upgrade lockstep"),
                "{err}"
            );

            // Today's header: no warning.
            let today = encode(format, &sample());
            let mut rd = LogReader::detect(&today[..]).unwrap();
            rd.by_ref().for_each(drop);
            assert!(rd.warnings().is_empty());
        }
    }

    #[test]
    fn the_header_of_today_reads_back_as_it_was_written() {
        // Files written before the minor version existed have no such key;
        // the header of a minor-0 file is still written without it.
        let line = serde_json::to_string(&Record::Header(header(1, 0))).unwrap();
        assert!(!line.contains("schema_minor"), "{line}");
        let back: Record = serde_json::from_str(&line).unwrap();
        assert_eq!(back, Record::Header(header(1, 0)));
    }
    /// Every log the project ships, as (path, text).
    fn shipped_logs() -> Vec<(std::path::PathBuf, String)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../replay-tests");
        let mut out = Vec::new();
        for sub in ["incidents", "compat"] {
            for entry in std::fs::read_dir(root.join(sub)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "jsonl") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    out.push((path, text));
                }
            }
        }
        assert!(out.len() > 10);
        out
    }

    #[test]
    fn the_id_over_what_was_read_is_the_id_the_writer_computed() {
        // The fallback must not be what makes real logs verify: in both
        // encodings, the id over the record as read is the recorded id.
        for (path, text) in shipped_logs() {
            for line in text.lines().filter(|l| l.starts_with("{\"event\"")) {
                let Record::Event(ev) = serde_json::from_str(line).unwrap() else {
                    unreachable!()
                };
                let raw = serde_json::from_str::<id::RawRecord>(line).unwrap();
                let json_id = id::raw_id(&raw.event.envelope, &ev);
                assert_eq!(
                    json_id.as_ref(),
                    Some(&ev.envelope.id),
                    "{}: {line}",
                    path.display()
                );
                let packed = rmp_serde::to_vec_named(&Record::Event(ev.clone())).unwrap();
                assert_eq!(
                    id::msgpack_id(&packed).as_ref().map(|h| &h[..]),
                    Some(ev.envelope.id.0.as_bytes()),
                    "{}: {line}",
                    path.display()
                );
            }
        }
    }

    #[test]
    fn an_altered_messagepack_record_fails_its_content_id_with_or_without_detail() {
        // The id is checked over the record's own bytes: the event as the
        // last value of the envelope, and followed by a detail.
        let node = r#"{"kube_node":{"name":"k1","unschedulable":true,"ready":"True"}}"#;
        let with_detail = Record::Event(EventRecord {
            seq: 2,
            time_ms: 2_000,
            envelope: Envelope::with_detail(
                Source::Test,
                2_000,
                ev(node),
                crate::SourceDetail {
                    file: "policy.toml".into(),
                    ..Default::default()
                },
            ),
        });
        for rec in [record(2, ev(node)), with_detail] {
            let recs = vec![record(1, Event::Tick), rec, record(3, Event::Tick)];
            let bytes = encode(Format::MessagePack, &recs);
            let (got, err) = decode(&bytes);
            assert!(err.is_none(), "{err:?}");
            assert_eq!(got[1..], recs, "after the header");
            // "k1" becomes "k2": the same length, only the content differs.
            let at = bytes
                .windows(3)
                .position(|w| w == b"\xa2k1")
                .expect("the node's name in the record");
            let mut altered = bytes.clone();
            altered[at + 2] = b'2';
            let (got, err) = decode(&altered);
            assert_eq!(got.len(), 2, "the header and the first record");
            assert!(
                matches!(err, Some(DecodeError::IdMismatch { seq: 2, .. })),
                "{err:?}"
            );
        }
    }

    fn snapshot(seq: u64, len: usize) -> Vec<Record> {
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        SnapshotPart::split(&bytes, seq, 9_000, "abc", 2)
            .into_iter()
            .map(Record::Snapshot)
            .collect()
    }

    #[test]
    fn a_snapshot_in_parts_reads_back_in_both_encodings() {
        // Three parts: two whole, one short; the events follow its seq.
        let mut recs = snapshot(2, 2 * SNAPSHOT_PART_BYTES + 10);
        assert_eq!(recs.len(), 3);
        recs.push(sample().remove(2));
        for format in [Format::JsonLines, Format::MessagePack] {
            let (back, err) = decode(&encode(format, &recs));
            assert!(err.is_none(), "{format:?}: {err:?}");
            assert_eq!(back[1..], recs[..], "{format:?}");
        }
        // JSON carries the bytes as base64 text.
        let text = String::from_utf8(encode(Format::JsonLines, &snapshot(2, 3))).unwrap();
        assert!(text.contains(r#""bytes":"AAEC""#), "{text}");
    }

    #[test]
    fn a_snapshot_out_of_place_is_refused_where_it_stands() {
        let misplaced = |recs: &[Record], format| {
            let (_, err) = decode(&encode(format, recs));
            match err {
                Some(e @ DecodeError::MisplacedSnapshot { .. }) => e.to_string(),
                other => panic!("{format:?}: {other:?}"),
            }
        };
        let parts = snapshot(2, SNAPSHOT_PART_BYTES + 1);
        for format in [Format::JsonLines, Format::MessagePack] {
            // After an event.
            let mut after_event = sample()[..1].to_vec();
            after_event.extend(parts.clone());
            assert!(misplaced(&after_event, format).contains("right after its header"));
            // Parts swapped, or one missing before an event, or at the end.
            let swapped = [parts[1].clone(), parts[0].clone()];
            assert!(misplaced(&swapped, format).contains("part 1 of 2 (seq 2) where part 0"));
            let cut = [parts[0].clone(), sample().remove(2)];
            assert!(misplaced(&cut, format).contains("ends after part 1 of 2"));
            assert!(misplaced(&parts[..1], format).contains("file ends inside the snapshot"));
            // A second snapshot.
            let mut twice = parts.clone();
            twice.extend(parts.clone());
            assert!(misplaced(&twice, format).contains("right after its header"));
        }
        // An event at or before the snapshot's seq does not follow it.
        let mut behind = parts.clone();
        behind.push(sample().remove(1));
        let (_, err) = decode(&encode(Format::JsonLines, &behind));
        assert!(
            matches!(
                err,
                Some(DecodeError::OutOfOrder {
                    seq: 2,
                    prev: 2,
                    ..
                })
            ),
            "{err:?}"
        );
    }

    /// The records, the error that ends them and the warnings of a file,
    /// read directly and read ahead on another thread.
    fn both_ways(bytes: &[u8]) -> [(Vec<Record>, Option<String>, Vec<String>); 2] {
        [false, true].map(|ahead| {
            let warned = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let sink = std::sync::Arc::clone(&warned);
            let rd = LogReader::detect(std::io::Cursor::new(bytes.to_vec()))
                .unwrap()
                .on_warning(move |w| sink.lock().unwrap().push(w.to_string()));
            let (recs, err) = if ahead {
                read_all(read_ahead(rd))
            } else {
                read_all(rd)
            };
            let warned = warned.lock().unwrap().clone();
            (recs, err.map(|e| e.to_string()), warned)
        })
    }

    #[test]
    fn read_ahead_hands_out_what_the_reader_does_in_its_order() {
        // A header that warns (a newer minor version), several batches, a
        // snapshot in parts among them, and damage at the end.
        let mut recs = snapshot(2, 2 * SNAPSHOT_PART_BYTES + 10);
        recs.extend((3..1_300).map(|seq| record(seq, Event::Tick)));
        let header = LogHeader {
            schema_minor: SCHEMA_MINOR + 1,
            ..LogHeader::current("a newer lockstep")
        };
        for format in [Format::MessagePack, Format::JsonLines] {
            let mut bytes = encode_with(format, &header, &recs);
            bytes.extend_from_slice(b"\xc1 damage");
            let [direct, ahead] = both_ways(&bytes);
            assert_eq!(
                direct.0.len(),
                recs.len() + 1,
                "{format:?}: header and records"
            );
            assert!(direct.1.is_some(), "{format:?}: the damage is an error");
            assert_eq!(direct.2.len(), 1, "{format:?}: the header warns");
            assert!(ahead == direct, "{format:?}: read ahead differs");
        }
    }

    /// Counts the records it makes, without end; says when it is dropped.
    struct Unending {
        made: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        dropped: std::sync::mpsc::Sender<()>,
    }

    impl Iterator for Unending {
        type Item = Result<Record, DecodeError>;

        fn next(&mut self) -> Option<Self::Item> {
            let n = self.made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Some(Ok(record(n as u64 + 1, Event::Tick)))
        }
    }

    impl Drop for Unending {
        fn drop(&mut self) {
            let _ = self.dropped.send(());
        }
    }

    #[test]
    fn read_ahead_decodes_a_bounded_way_ahead_and_stops_when_dropped() {
        use std::sync::atomic::Ordering;
        let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (dropped, gone) = std::sync::mpsc::channel();
        let mut ahead = read_ahead(Unending {
            made: std::sync::Arc::clone(&made),
            dropped,
        });
        assert!(matches!(ahead.next(), Some(Ok(Record::Event(e))) if e.seq == 1));
        // Time for the thread to run ahead as far as it may: the batches
        // the channel holds, the one taken, the one being filled.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let bound = (READ_AHEAD_BATCHES + 2) * READ_AHEAD_BATCH + 1;
        assert!(
            made.load(Ordering::SeqCst) <= bound,
            "{made:?} made, bound {bound}"
        );
        drop(ahead);
        gone.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the decoding thread ends once its reader is dropped");
    }

    #[test]
    fn a_panic_while_reading_ahead_reaches_the_reader() {
        let records = (1..=300u64).map(|seq| {
            assert!(seq < 300, "decoding failed");
            Ok(record(seq, Event::Tick))
        });
        let caught = std::panic::catch_unwind(|| read_ahead(records).count());
        let panic = caught.expect_err("the panic is resumed");
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"decoding failed"));
    }
}
