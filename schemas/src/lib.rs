//! lockstep's wire types: the [`Envelope`] every event travels in, the
//! [`Event`] and [`Action`] vocabularies, the [`Policy`], the audit trail's
//! [`Transition`]s (with their [`Phase`] and [`Rule`]), the exported log
//! file's [`Record`]s, and their codecs (MessagePack with named fields, JSON).
//!
//! This crate owns the formats that outlive a process: logs written today must
//! replay with every later build. It never changes a field's meaning; it adds
//! fields with defaults, and a breaking change gets a new schema version with
//! a conversion from the old one.

mod action;
mod envelope;
mod event;
pub mod log;
mod open_enum;
mod ownership;
mod policy;
pub mod schema;
mod transition;

pub use action::{Action, ActionId, ActionKind, IssuedAction, Target};
pub use envelope::{Envelope, EventId, Source, SourceDetail, SCHEMA_VERSION};
pub use event::{
    format_text, ActionOutcome, ConditionStatus, Connector, Domain, Event, IdentityChange,
    KubeNode, KubePod, KubeScaleTarget, Maintenance, NodeCondition, NodeDevices, NodeIdentity,
    OutcomeResult, OwnerRef, PodCondition, PodEviction, PodPhase, ResponderState, ScaleTargetRef,
    SlurmBaseState, SlurmJob, SlurmJobState, SlurmNode, SlurmNodeFlag, SlurmPartition, Taint,
    TaintEffect, Text, ANNOTATION_PREFIX, DRAINED, DRAIN_IN_PROGRESS, POD_DELETION_COST,
};
pub use log::{EventRecord, Record};
pub use ownership::{set_down_by_user, Ownership, ReasonOwnership, SLURM_NOT_RESPONDING_SUFFIX};
pub use policy::{
    valid_topology_token, ActionPolicy, DrainPolicy, HealthAction, HealthPolicy, LabelFeature,
    MaintenancePolicy, Mapping, MappingMode, NodeSignalsPolicy, Policy, PolicyError,
    PolicyFileError, Removal, ScaleRule, ScalingPolicy, TaintSpec, TopologyPolicy, COUNT_MAX,
    DURATION_S_MAX,
};
pub use transition::{Phase, Rule, Transition};

/// Every event kind's wire name, as [`Event::kind`] gives it.
pub const EVENT_KINDS: &[&str] = &[
    "slurm_node",
    "slurm_node_gone",
    "slurm_job",
    "slurm_job_gone",
    "slurm_partition",
    "slurm_partition_gone",
    "kube_node",
    "kube_node_gone",
    "kube_pod",
    "kube_pod_gone",
    "kube_scale_target",
    "kube_scale_target_gone",
    "sync_started",
    "sync_done",
    "connector_status",
    "tick",
    "action_outcome",
    "policy_changed",
];
