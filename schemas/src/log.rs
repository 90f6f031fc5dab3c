//! The exported log file: a header, then observation records and the actions
//! that were issued, each with its sequence number, in JSON Lines or
//! MessagePack (a stream of named-field MessagePack values).
//!
//! Readers stop at the first bad record with an error that names its line or
//! byte offset; every record before it has already been handed out, so a
//! truncated or corrupt file still replays up to the damage.

use std::io::{BufRead, Write};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::action::IssuedAction;
use crate::envelope::{Envelope, SCHEMA_VERSION};

/// The header's format name.
pub const LOG_FORMAT: &str = "lockstep-log";

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
}

/// Identifies a lockstep log file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LogHeader {
    /// Always [`LOG_FORMAT`].
    pub format: String,
    /// Highest envelope schema version in the file.
    pub schema_version: u32,
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
            written_by: written_by.into(),
        }
    }
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
    /// Reading failed.
    #[error("reading the log failed")]
    Io(#[source] std::io::Error),
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
            | Self::OutOfOrder { pos, .. } => Some(*pos),
            Self::Io(_) => None,
        }
    }
}

/// Reads records from a log file, checking the header, schema versions,
/// content ids and sequence order.
pub struct LogReader<R> {
    inner: Inner<R>,
    state: Check,
}

enum Inner<R> {
    Json {
        rd: R,
        line: u64,
        buf: String,
        consumed: u64,
    },
    MsgPack {
        data: Vec<u8>,
        pos: usize,
    },
}

struct Check {
    header_seen: bool,
    last_event_seq: u64,
    done: bool,
    verify_ids: bool,
}

impl<R: BufRead> LogReader<R> {
    /// Reads JSON Lines from `rd`.
    pub fn json_lines(rd: R) -> Self {
        Self::with(Inner::Json {
            rd,
            line: 0,
            buf: String::new(),
            consumed: 0,
        })
    }

    /// Reads a log, detecting its format from the first byte.
    pub fn detect(mut rd: R) -> Result<Self, DecodeError> {
        let first = rd.fill_buf().map_err(DecodeError::Io)?.first().copied();
        match first {
            Some(b'{') | Some(b' ') | Some(b'\n') | None => Ok(Self::json_lines(rd)),
            Some(_) => {
                let mut data = Vec::new();
                rd.read_to_end(&mut data).map_err(DecodeError::Io)?;
                Ok(Self::with(Inner::MsgPack { data, pos: 0 }))
            }
        }
    }
}

impl LogReader<std::io::Empty> {
    /// Reads MessagePack records from a buffer.
    pub fn msgpack(data: Vec<u8>) -> Self {
        Self::with(Inner::MsgPack { data, pos: 0 })
    }
}

impl<R> LogReader<R> {
    fn with(inner: Inner<R>) -> Self {
        Self {
            inner,
            state: Check {
                header_seen: false,
                last_event_seq: 0,
                done: false,
                verify_ids: true,
            },
        }
    }

    /// Skips the content-id check (faster; for trusted logs and benchmarks).
    pub fn trust_ids(mut self) -> Self {
        self.state.verify_ids = false;
        self
    }

    /// Bytes consumed so far, for progress reporting.
    pub fn bytes_read(&self) -> u64 {
        match &self.inner {
            Inner::Json { consumed, .. } => *consumed,
            Inner::MsgPack { pos, .. } => *pos as u64,
        }
    }
}

impl<R: BufRead> Iterator for LogReader<R> {
    type Item = Result<Record, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.state.done {
            return None;
        }
        let item = match &mut self.inner {
            Inner::Json {
                rd,
                line,
                buf,
                consumed,
            } => next_json(rd, line, buf, consumed),
            Inner::MsgPack { data, pos } => next_msgpack(data, pos),
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
                return None;
            }
            Some(item) => item.and_then(|(pos, rec)| self.state.check(pos, rec)),
        };
        if item.is_err() {
            self.state.done = true;
        }
        Some(item)
    }
}

impl Check {
    fn check(&mut self, pos: Position, rec: Record) -> Result<Record, DecodeError> {
        match &rec {
            Record::Header(h) => {
                if self.header_seen || h.format != LOG_FORMAT {
                    return Err(DecodeError::NotALog { pos });
                }
                self.header_seen = true;
            }
            _ if !self.header_seen => return Err(DecodeError::NotALog { pos }),
            Record::Event(ev) => {
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
                if self.verify_ids && !ev.envelope.id_matches() {
                    return Err(DecodeError::IdMismatch {
                        pos,
                        seq: ev.seq,
                        id: ev.envelope.id.0.clone(),
                    });
                }
                self.last_event_seq = ev.seq;
            }
            Record::Action(_) => {}
        }
        Ok(rec)
    }
}

type Decoded = Option<Result<(Position, Record), DecodeError>>;

fn next_json<R: BufRead>(
    rd: &mut R,
    line: &mut u64,
    buf: &mut String,
    consumed: &mut u64,
) -> Decoded {
    loop {
        buf.clear();
        let n = match rd.read_line(buf) {
            Ok(0) => return None,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                *line += 1;
                return Some(Err(DecodeError::Malformed {
                    pos: Position::Line(*line),
                    message: "not UTF-8".to_owned(),
                }));
            }
            Err(e) => return Some(Err(DecodeError::Io(e))),
        };
        *line += 1;
        *consumed += n as u64;
        let text = buf.trim();
        if text.is_empty() {
            continue;
        }
        let pos = Position::Line(*line);
        return Some(match serde_json::from_str::<Record>(text) {
            Ok(rec) => Ok((pos, rec)),
            Err(e) => {
                let truncated = e.is_eof() && !buf.ends_with('\n');
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

fn next_msgpack(data: &[u8], pos: &mut usize) -> Decoded {
    if *pos >= data.len() {
        return None;
    }
    let start = *pos;
    let at = Position::Offset(start as u64);
    // Find the record's extent first, then decode it in place: strings are
    // read straight from the buffer instead of through a copying reader.
    let len = match msgpack_value_len(&data[start..]) {
        Ok(len) => len,
        Err(extent) => {
            *pos = data.len();
            return Some(Err(match extent {
                Extent::Truncated => DecodeError::Truncated { pos: at },
                Extent::Invalid(marker) => DecodeError::Malformed {
                    pos: at,
                    message: format!("invalid MessagePack marker 0x{marker:02x}"),
                },
            }));
        }
    };
    let bytes = &data[start..start + len];
    match rmp_serde::from_slice::<Record>(bytes) {
        Ok(rec) => {
            *pos = start + len;
            Some(Ok((at, rec)))
        }
        Err(e) => {
            // Nothing after a bad record is handed out.
            *pos = data.len();
            let value = rmp_serde::from_slice::<serde_json::Value>(bytes).ok();
            Some(Err(classify(at, value, false, e.to_string())))
        }
    }
}

/// Why a MessagePack value has no extent.
enum Extent {
    /// The buffer ends inside it.
    Truncated,
    /// A byte that is no MessagePack marker (0xc1).
    Invalid(u8),
}

/// The length in bytes of the MessagePack value at the start of `buf`,
/// walking markers without decoding anything. (rmp offers no skip; this is
/// the format's marker table, MessagePack spec "Formats".)
fn msgpack_value_len(buf: &[u8]) -> Result<usize, Extent> {
    fn be(buf: &[u8], at: usize, n: usize) -> Result<usize, Extent> {
        let b = buf.get(at..at + n).ok_or(Extent::Truncated)?;
        Ok(b.iter().fold(0usize, |acc, &x| (acc << 8) | usize::from(x)))
    }
    let mut pos = 0usize;
    // Values still to walk: maps count twice per entry.
    let mut pending: usize = 1;
    while pending > 0 {
        pending -= 1;
        let marker = *buf.get(pos).ok_or(Extent::Truncated)?;
        pos += 1;
        match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => {}
            0x80..=0x8f => pending += 2 * usize::from(marker & 0x0f),
            0x90..=0x9f => pending += usize::from(marker & 0x0f),
            0xa0..=0xbf => pos += usize::from(marker & 0x1f),
            0xc1 => return Err(Extent::Invalid(marker)),
            // bin 8/16/32, str 8/16/32
            0xc4 | 0xd9 => pos += 1 + be(buf, pos, 1)?,
            0xc5 | 0xda => pos += 2 + be(buf, pos, 2)?,
            0xc6 | 0xdb => pos += 4 + be(buf, pos, 4)?,
            // ext 8/16/32: length, type byte, data
            0xc7 => pos += 2 + be(buf, pos, 1)?,
            0xc8 => pos += 3 + be(buf, pos, 2)?,
            0xc9 => pos += 5 + be(buf, pos, 4)?,
            // float 32/64, uint 8..64, int 8..64
            0xca => pos += 4,
            0xcb => pos += 8,
            0xcc | 0xd0 => pos += 1,
            0xcd | 0xd1 => pos += 2,
            0xce | 0xd2 => pos += 4,
            0xcf | 0xd3 => pos += 8,
            // fixext 1/2/4/8/16
            0xd4 => pos += 2,
            0xd5 => pos += 3,
            0xd6 => pos += 5,
            0xd7 => pos += 9,
            0xd8 => pos += 17,
            // array 16/32, map 16/32
            0xdc => {
                pending += be(buf, pos, 2)?;
                pos += 2;
            }
            0xdd => {
                pending += be(buf, pos, 4)?;
                pos += 4;
            }
            0xde => {
                pending += 2 * be(buf, pos, 2)?;
                pos += 2;
            }
            0xdf => {
                pending += 2 * be(buf, pos, 4)?;
                pos += 4;
            }
        }
        if pos > buf.len() {
            return Err(Extent::Truncated);
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

/// Reads a whole log file into memory, in either format.
pub fn open(
    path: &std::path::Path,
) -> Result<LogReader<std::io::BufReader<std::fs::File>>, DecodeError> {
    let file = std::fs::File::open(path).map_err(DecodeError::Io)?;
    LogReader::detect(std::io::BufReader::with_capacity(1 << 16, file))
}

/// Reads a log into memory, stopping at the first error.
pub fn read_all<R: BufRead>(rd: LogReader<R>) -> (Vec<Record>, Option<DecodeError>) {
    let mut out = Vec::new();
    for item in rd {
        match item {
            Ok(rec) => out.push(rec),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}
