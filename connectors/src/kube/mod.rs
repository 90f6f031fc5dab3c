//! Kubernetes watchers and actuator.
//!
//! Owns everything lockstep says to and hears from the Kubernetes API:
//!
//! - [`Observer`]: kube-runtime watchers on Nodes, the slurmd Pods (the
//!   policy's `mapping.pod_selector`) and scale targets (StatefulSets, and
//!   any [`ScaleKind`] the policy names, discovered: [`discover`]), each
//!   object reduced to the observation the reducer
//!   reads ([`reduce`]), deduplicated, with relists as
//!   `SyncStarted` .. `SyncDone` and deletes as `*Gone` events; with
//!   `health.device_faults`, also ResourceSlices and DeviceTaintRules, whose
//!   taints reach the reducer on the nodes they concern ([`devices`]). It sends
//!   [`Observation`]s into a bounded channel; the caller turns them into
//!   envelopes ([`Observation::into_envelope`]) and appends them to the log.
//! - [`Actuator`]: executes the `Kube*` actions idempotently and reports an
//!   [`ActionOutcome`](lockstep_schemas::ActionOutcome) for each.
//! - [`wire`]: the names and shapes the actuator writes and the reducer
//!   reads back, in one place so that the two cannot drift apart.
//!
//! It must never decide anything (that is the reducer's job, from the log
//! alone), never block without a bound, and never let a Kubernetes type
//! leak into the events: only `lockstep_schemas` types leave this module.

mod actuator;
mod devices;
mod discover;
mod error;
mod evictions;
mod lease;
mod multimap;
mod observer;
pub mod reduce;
mod spec;
mod tracker;
pub mod wire;

pub use crate::observation::Observation;
pub use actuator::{Actuator, ActuatorConfig};
pub use discover::discover;
pub use error::{Error, Result};
pub use lease::{Leadership, LeaseConfig};
pub use observer::{load_config, Observer, ObserverConfig};
pub use spec::{scale_kinds, ChangedWatches, ObserveSpec, ScaleKind};
pub use wire::FIELD_MANAGER;
