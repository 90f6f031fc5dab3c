//! The record being applied ([`Ctx`]) and what applying records produced
//! ([`Output`]): what every policy reads of the record and writes its
//! decisions to.

use lockstep_schemas::{EventId, IssuedAction, Rule, Transition};

use crate::slot::Issue;

/// What applying records produced. Reuse one across calls; [`Output::clear`]
/// between batches.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Output {
    /// State transitions, in order.
    pub transitions: Vec<Transition>,
    /// Actions issued, in order.
    pub actions: Vec<IssuedAction>,
}

impl Output {
    /// Empties both lists, keeping their capacity.
    pub fn clear(&mut self) {
        self.transitions.clear();
        self.actions.clear();
    }
}

/// The record being applied: the one way its sequence, its time (the
/// engine's clock, which never goes back) and its event reach the rules.
pub(crate) struct Ctx<'a> {
    pub seq: u64,
    pub now_ms: u64,
    pub event: &'a EventId,
}

impl<'a> Ctx<'a> {
    /// An action `rule` wants because of this record.
    pub fn issue(&self, rule: Rule) -> Issue<'a> {
        Issue {
            seq: self.seq,
            now_ms: self.now_ms,
            cause: self.event,
            rule: rule.name(),
        }
    }
}
