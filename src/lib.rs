//! lockstep: an event-sourced state-sync engine between Slurm and Kubernetes.
//!
//! This crate is the `lockstep` command: CLI, configuration and wiring. The
//! reducer lives in `lockstep-engine`, the wire types in `lockstep-schemas`.

pub mod commands;
pub mod config;
pub mod html;
pub mod kubectl;
pub mod outfile;
pub mod policies;
pub mod render;
pub mod service;
pub mod storage;
pub mod telemetry;
