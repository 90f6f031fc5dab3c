//! lockstep-engine: the deterministic reducer at the heart of lockstep.
//!
//! Like quinn-proto for QUIC, this crate is pure logic: it contains no
//! networking or storage code, does not depend on tokio, kube, async-nats or
//! sled, never reads a clock and uses no randomness. Time comes in with every
//! log record (its append time), and everything it decides comes out as
//! values: [`Transition`]s and [`IssuedAction`](lockstep_schemas::IssuedAction)s.
//! Because every decision is a function of the log, the same log gives the
//! same state hash, transitions and action ids on any machine, at any batch
//! size, after any restart.
//!
//! Policies live in their own modules, each a table of rules: `drain`
//! (cordons, evictions, pod deletions, foreign drains), `health`
//! (NotReady, node conditions, Slurm health shown in Kubernetes, damping),
//! `topology` (labels to Slurm features and topology), `scaling`
//! (replicas from Slurm demand, scale-in through drain, busy labels) and
//! `maintenance` (announced maintenance: a Slurm reservation ahead, a drain
//! in the window, the node's drain conditions).

mod drain;
mod engine;
mod flights;
mod health;
mod maintenance;
mod model;
pub mod replay;
mod retired;
mod scaling;
mod shown;
mod slot;
mod sorted;
mod stale;
mod timers;
mod topology;
mod units;

pub use engine::{Engine, Output, SnapshotError, LAYOUT};
pub use lockstep_schemas::{Phase, Rule, Transition};
