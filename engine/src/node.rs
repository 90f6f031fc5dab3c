//! What lockstep keeps of each Slurm node, a part per policy: the drain
//! policy's status and causes with their origins (`drain::decide`), health
//! damping (`health::NodeHealth`, behind `health::Gate`), and topology's
//! complaint about the node's label (`topology::report_issue`). One record
//! per node, so that a node's state is one map entry; each part is written
//! by its policy alone.

use serde::{Deserialize, Serialize};

use crate::cause::{Cause, Status};
use crate::health;
use crate::model::Origin;

/// Per Slurm node: its status, the causes in force with their origins, and
/// damping history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeCtl {
    pub status: Status,
    pub causes: Vec<(Cause, Origin)>,
    /// Health damping, both directions (`health::Gate`).
    #[serde(flatten)]
    pub health: health::NodeHealth,
    /// When and by which event the last cause cleared (resume hysteresis,
    /// and the cause of the resume in the audit trail).
    /// Boxed: a node keeps one only once a drain of it has ended, and every
    /// node without one saves 32 bytes.
    pub cleared: Option<Box<Origin>>,
    /// Why the node's topology label cannot be used, while it cannot.
    pub topology_issue: Option<String>,
    /// lockstep changed the node's state (drain, down, resume) while Slurm
    /// did not show its previous change yet: what the model holds of the
    /// node predates both, so none of it counts as the new change seen until
    /// Slurm reports the node in an observation after this sequence (the
    /// change's outcome moves it to the outcome's). Without it, a drain sent
    /// right after a resume "shows" in the drain the resume lifted, and a
    /// job that started in between is not seen before a scale-in removes
    /// the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fresh_after: Option<u64>,
    /// Since `fresh_after` was set, one of lockstep's changes of the node's
    /// state may have been written (an outcome other than "already done":
    /// done, or failed, which may have landed all the same). While none
    /// may have, an "already done" says the node has stayed as the model
    /// holds it: the actuator found the change in place, and only lockstep
    /// writes lockstep's reason, so nothing came and went in between.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fresh_written: bool,
    /// With `fresh_written`: every change that may have been written since
    /// was a resume. A resume moves the node out of lockstep's drain or
    /// down, never into one, and only lockstep writes lockstep's reason: so
    /// a drain or down "already done" that finds what the model's copy
    /// shows finds a node that never left it (a resume that timed out
    /// without landing leaves Slurm as it was, and the poller, which
    /// reports only changes, says nothing more of it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fresh_resumes_only: bool,
}
