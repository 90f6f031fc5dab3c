//! Slurm observer (slurmrestd, scontrol) and actuator.
//!
//! Owns everything lockstep says to and hears from Slurm:
//!
//! - [`RestClient`]: a slurmrestd client (plain HTTP, JWT from a file or an
//!   environment variable, re-read before expiry and after a 401, never
//!   logged; bounded timeouts and answer sizes).
//! - [`parse`]: version-tolerant parsing of slurmrestd's node, job and
//!   partition lists (openapi v0.0.38 of Slurm 22.05 up to v0.0.45 of
//!   26.05) into [`SlurmNode`](lockstep_schemas::SlurmNode),
//!   [`SlurmJob`](lockstep_schemas::SlurmJob) and
//!   [`SlurmPartition`](lockstep_schemas::SlurmPartition); [`scontrol`]
//!   parses `scontrol show -o` into the same types, and [`NodeSession`]
//!   lists nodes through one long-lived scontrol.
//! - [`Observer`]: polls (with `update_time`), diffs and sends
//!   [`Observation`]s: one event per changed object, `*Gone` events, full
//!   listings bracketed by `SyncStarted` .. `SyncDone`, and
//!   `ConnectorStatus` when it loses or regains Slurm. The caller turns each
//!   into an envelope ([`Observation::into_envelope`]).
//! - [`Actuator`]: executes the `Slurm*` actions idempotently and reports an
//!   [`ActionOutcome`](lockstep_schemas::ActionOutcome) for each.
//!
//! It must never decide anything (the reducer does, from the log alone),
//! never take a failed or partial listing as "objects are gone", never block
//! without a bound, never log a token, and never let a Slurm type leak into
//! the events: only `lockstep_schemas` types leave this module.

mod actuator;
mod error;
mod fields;
pub mod hostlist;
mod observer;
pub mod parse;
mod rest;
pub mod scontrol;
mod session;
mod token;

pub use crate::observation::Observation;
pub use actuator::{
    clean_reason, Actuator, ActuatorConfig, BeforeWrite, REASON_CHARS_MAX, RESUMED_REASON,
};
pub use error::{classify_message, Error, Result};
pub use observer::{Backend, Observer, ObserverConfig, PollStats};
pub use rest::{ApiVersion, Fetch, RestClient, RestConfig, API_VERSIONS};
pub use scontrol::{Scontrol, ScontrolConfig, SlurmVersion};
pub use session::{NodeSession, SessionCounts};
pub use token::TokenSource;
