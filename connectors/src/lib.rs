//! lockstep's connectors: everything that talks to the outside world.
//!
//! - `kube`: watchers that turn Kubernetes objects into observation events,
//!   and the actuator that carries out Kubernetes actions.
//! - `slurm`: the slurmrestd / scontrol observer and the Slurm actuator.
//!
//! Connectors produce [`lockstep_schemas::Event`]s and consume
//! [`lockstep_schemas::Action`]s; they never decide anything. Deciding is the
//! reducer's job (`lockstep-engine`), which sees only the log.

pub mod backoff;
pub mod clock;
mod diff;
pub mod kube;
mod observation;
pub mod slurm;

pub use observation::Observation;
