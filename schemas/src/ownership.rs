//! Which Slurm drains and downs are lockstep's own: the one rule that the
//! reducer (what it may resume) and the Slurm actuator (what it may replace
//! or lift) both follow, so that neither can take for lockstep's a drain that
//! somebody else set.
//!
//! A drain or down is lockstep's own when Slurm says lockstep's Slurm user
//! (`drain.slurm_user`) set its reason; when that user is not configured or
//! Slurm does not say who set it, when its reason starts with the policy's
//! reason prefix or one lockstep used under an earlier policy. A DOWN whose
//! reason ends in [`SLURM_NOT_RESPONDING_SUFFIX`] is slurmctld's (24.11 and
//! later append that to the reason lockstep set), never lockstep's.

use serde::{Deserialize, Serialize};

use crate::{SlurmBaseState, SlurmNode, SlurmNodeFlag};

/// What slurmctld appends to a node's reason when it sets the node DOWN for
/// not responding (Slurm 24.11 and later keep the reason there was before
/// it: `<old reason> : Not responding`).
pub const SLURM_NOT_RESPONDING_SUFFIX: &str = " : Not responding";

/// How lockstep tells its own reasons, borrowed from wherever they are kept
/// (the reducer's policy, an actuator's [`ReasonOwnership`]).
#[derive(Debug, Clone, Copy)]
pub struct Ownership<'a> {
    /// The policy's reason prefix.
    pub prefix: &'a str,
    /// Prefixes lockstep used under earlier policies.
    pub earlier_prefixes: &'a [String],
    /// `drain.slurm_user`.
    pub slurm_user: Option<&'a str>,
}

impl Ownership<'_> {
    /// Whether lockstep set the node's reason (the node's drain or down is
    /// its own if it has one).
    pub fn owns(&self, node: &SlurmNode) -> bool {
        if slurm_took_down(node) {
            return false;
        }
        if let (Some(me), Some(by)) = (self.slurm_user, node.reason_user.as_deref()) {
            return by == me;
        }
        node.reason.as_deref().is_some_and(|r| {
            r.starts_with(self.prefix)
                || self
                    .earlier_prefixes
                    .iter()
                    .any(|p| r.starts_with(p.as_str()))
        })
    }

    /// Held out of service by somebody else: drained, or set DOWN or FAIL by
    /// a user (an administrator, another operator's preStop hook), with a
    /// reason lockstep did not set. What lockstep must neither replace nor
    /// lift. A DOWN that is slurmctld's own (the node not responding) holds
    /// nothing: slurmctld lifts it when slurmd answers again, and a drain on
    /// top of it is what keeps the node out then.
    pub fn held_by_other(&self, node: &SlurmNode) -> bool {
        (node.has(&SlurmNodeFlag::Drain) || set_down_by_user(node)) && !self.owns(node)
    }

    /// Who holds the node and why, as an audit line: `root: NVSwitch RMA`.
    pub fn describe_holder(node: &SlurmNode) -> String {
        let mut state = node.state.to_string();
        for f in &node.flags {
            state.push('+');
            state.push_str(f.as_str());
        }
        format!(
            "{state} by {}: {}",
            node.reason_user.as_deref().unwrap_or("someone else"),
            node.reason.as_deref().unwrap_or("(no reason)")
        )
    }
}

/// An owned [`Ownership`], for a connector that follows the policy in force
/// (the service sends it a new one when a `PolicyChanged` changes it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasonOwnership {
    /// The policy's reason prefix.
    pub prefix: String,
    /// Prefixes lockstep used under earlier policies.
    pub earlier_prefixes: Vec<String>,
    /// `drain.slurm_user`.
    pub slurm_user: Option<String>,
}

impl ReasonOwnership {
    /// Borrowed, to ask.
    pub fn borrow(&self) -> Ownership<'_> {
        Ownership {
            prefix: &self.prefix,
            earlier_prefixes: &self.earlier_prefixes,
            slurm_user: self.slurm_user.as_deref(),
        }
    }
}

impl From<Ownership<'_>> for ReasonOwnership {
    fn from(o: Ownership<'_>) -> Self {
        Self {
            prefix: o.prefix.to_owned(),
            earlier_prefixes: o.earlier_prefixes.to_vec(),
            slurm_user: o.slurm_user.map(str::to_owned),
        }
    }
}

/// Set DOWN or FAIL by a user (an administrator, an operator's hook, lockstep
/// itself), not by slurmctld for a node that does not answer: out until its
/// setter lifts it, not until slurmd answers again.
pub fn set_down_by_user(node: &SlurmNode) -> bool {
    (node.state == SlurmBaseState::Down || node.has(&SlurmNodeFlag::Fail)) && !slurmctld_down(node)
}

/// DOWN because slurmd does not answer: slurmctld's own doing, as its
/// reason says (its own reason, or its suffix on the reason there was
/// before). Not the NOT_RESPONDING flag alone: a node somebody set DOWN whose
/// slurmd then stops (a pod's preStop hook, then the pod ends) keeps their
/// reason, and their DOWN.
fn slurmctld_down(node: &SlurmNode) -> bool {
    match node.reason.as_deref() {
        Some(r) => r == SLURM_NOT_RESPONDING || r.ends_with(SLURM_NOT_RESPONDING_SUFFIX),
        None => node.has(&SlurmNodeFlag::NotResponding),
    }
}

/// The reason slurmctld gives a node it sets DOWN for not responding.
const SLURM_NOT_RESPONDING: &str = "Not responding";

/// DOWN by slurmctld's doing, whatever reason lockstep set before: the DOWN
/// is Slurm's to lift (`ReturnToService`), never lockstep's.
fn slurm_took_down(node: &SlurmNode) -> bool {
    node.state == SlurmBaseState::Down
        && node
            .reason
            .as_deref()
            .is_some_and(|r| r.ends_with(SLURM_NOT_RESPONDING_SUFFIX))
}
