//! What observers send: one type for both connectors.
//!
//! An observer turns what it sees into [`Observation`]s on a bounded channel;
//! the service wraps each into an [`Envelope`] and appends it to the log.

use lockstep_schemas::{Envelope, Event, Source};

/// One observed event, where it comes from and when it was observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The connector that observed it.
    pub source: Source,
    /// When, in ms since the Unix epoch by this host's clock (metadata: the
    /// reducer's clock is the log's).
    pub observed_ms: u64,
    /// What was observed.
    pub event: Event,
}

impl Observation {
    /// `event`, observed by `source` at `observed_ms`.
    pub const fn new(source: Source, observed_ms: u64, event: Event) -> Self {
        Self {
            source,
            observed_ms,
            event,
        }
    }

    /// The envelope to append to the log.
    pub fn into_envelope(self) -> Envelope {
        Envelope::new(self.source, self.observed_ms, self.event)
    }
}
