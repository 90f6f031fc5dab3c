//! lockstep-store: what outlives a `lockstep run` process.
//!
//! - [`log`]: the event log, NATS JetStream or embedded (sled), with
//!   deduplication by content id and one total order.
//! - [`store`]: checkpoints, the action ledger and the audit index, written in
//!   one transaction per batch (persist first, then act).
//!
//! Nothing here decides anything; the reducer (`lockstep-engine`) does.

pub mod log;
pub mod snapshots;
pub mod store;

pub use log::{server_urls, Appended, EventLog, LogState, StreamLimits};
pub use store::{
    read_checkpoint_file, Checkpoint, Commit, LedgerEntry, LogPosition, Store, Trimmed,
};
