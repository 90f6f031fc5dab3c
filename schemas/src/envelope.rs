//! The envelope every event travels in.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::event::Event;

/// The schema version this build writes. Readers accept every version up to
/// it; each older version lives in its own module and converts to the
/// current one (`TryFrom<v1::Envelope>`), so old logs stay replayable.
pub const SCHEMA_VERSION: u32 = 1;

/// Who observed an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The Slurm observer (slurmrestd or scontrol).
    Slurm,
    /// The Kubernetes watchers.
    Kubernetes,
    /// An actuator reporting an outcome.
    Actuator,
    /// lockstep itself (ticks, policy changes).
    Lockstep,
    /// A test or a hand-written incident log.
    Test,
}

impl Source {
    /// A static name, usable as a metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Slurm => "slurm",
            Self::Kubernetes => "kubernetes",
            Self::Actuator => "actuator",
            Self::Lockstep => "lockstep",
            Self::Test => "test",
        }
    }
}

/// A content-derived event id: the first 128 bits of the SHA-256 of the
/// envelope's other fields, in hex. Used as `Nats-Msg-Id`, so publishing the
/// same envelope twice (after a crash between publish and acknowledgement) is
/// deduplicated, while a new observation of an unchanged object (a different
/// `observed_ms`) is a new event.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct EventId(pub String);

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an event came from beyond its [`Source`], for the audit trail: the
/// file a policy was read from, who asked for it, whether it rolls a policy
/// back. The reducer never reads it; the event id covers it (when it is not
/// empty), so it cannot be altered unnoticed and an event with it is another
/// event than the same without it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SourceDetail {
    /// The file the event was read from (a policy file), as the service
    /// names it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub file: String,
    /// Who asked for it: `user@host` of the command that appended it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub by: String,
    /// A policy rollback: this `PolicyChanged` publishes again the policy
    /// that was in force at this sequence. 0: not a rollback.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rollback_to_seq: u64,
}

impl SourceDetail {
    /// Nothing to say: the envelope carries no detail (every envelope
    /// written before details existed).
    pub fn is_empty(&self) -> bool {
        self.file.is_empty() && self.by.is_empty() && self.rollback_to_seq == 0
    }
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// An event with its metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Envelope {
    /// Schema version of this envelope.
    pub v: u32,
    /// Content-derived id.
    pub id: EventId,
    /// Who observed it.
    pub source: Source,
    /// When the observer saw it (ms since the Unix epoch, the observer's
    /// clock). Metadata only: the reducer's clock is the log's.
    pub observed_ms: u64,
    /// What happened.
    pub event: Event,
    /// Where it came from beyond `source` (policy file, who, rollback).
    /// Absent in envelopes written before it existed, and when empty.
    #[serde(default, skip_serializing_if = "SourceDetail::is_empty")]
    pub detail: SourceDetail,
}

impl Envelope {
    /// Wraps an event, deriving its id.
    pub fn new(source: Source, observed_ms: u64, event: Event) -> Self {
        Self::with_detail(source, observed_ms, event, SourceDetail::default())
    }

    /// Wraps an event with a [`SourceDetail`], deriving its id over both.
    pub fn with_detail(
        source: Source,
        observed_ms: u64,
        event: Event,
        detail: SourceDetail,
    ) -> Self {
        let id = content_id(SCHEMA_VERSION, source, observed_ms, &event, &detail);
        Self {
            v: SCHEMA_VERSION,
            id,
            source,
            observed_ms,
            event,
            detail,
        }
    }

    /// Whether `id` is the content id of the other fields.
    pub fn id_matches(&self) -> bool {
        content_id(
            self.v,
            self.source,
            self.observed_ms,
            &self.event,
            &self.detail,
        ) == self.id
    }
}

fn content_id(
    v: u32,
    source: Source,
    observed_ms: u64,
    event: &Event,
    detail: &SourceDetail,
) -> EventId {
    // The named MessagePack encoding is deterministic for these types: maps
    // are BTreeMaps and lists are kept sorted by the connectors. Without a
    // detail the id is that of the four-tuple, as before details existed, so
    // every id ever written stays valid.
    let bytes = if detail.is_empty() {
        rmp_serde::to_vec_named(&(v, source, observed_ms, event))
    } else {
        rmp_serde::to_vec_named(&(v, source, observed_ms, event, detail))
    }
    .expect("events always encode to MessagePack");
    id_of_parts(&[&bytes])
}

/// The id of an encoded `(v, source, observed_ms, event)` tuple given in
/// pieces, so that a reader can hash the bytes it read without copying them
/// (see `log::LogReader`).
pub(crate) fn id_of_parts(parts: &[&[u8]]) -> EventId {
    let hex = id_hex_of_parts(parts);
    EventId(
        std::str::from_utf8(&hex)
            .expect("hex digits are ASCII")
            .to_owned(),
    )
}

/// [`id_of_parts`] as its 32 hex digits, without allocating: what a reader
/// compares with the id a record names.
pub(crate) fn id_hex_of_parts(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for p in parts {
        hasher.update(p);
    }
    let digest = hasher.finalize();
    let mut hex = [0u8; 32];
    hex::encode_to_slice(&digest[..16], &mut hex).expect("16 bytes are 32 hex digits");
    hex
}
