//! One target's action in flight (the table of them is `flights`).
//!
//! A slot holds at most one action, so there are never two pending actions
//! for one target. It owns retries: a failed outcome, an outcome that never
//! comes, or a success whose effect is never observed all count as a failed
//! attempt, retried with a doubling backoff measured in log time, until the
//! policy's attempt bound; then the slot gives up until what the reducer
//! wants changes.

use lockstep_schemas::{Action, ActionId, ActionPolicy, EventId, IssuedAction, OutcomeResult};
use serde::{Deserialize, Serialize};

use crate::units::{after_ms, ms};

/// What the slot knows about its action. Errors are `Box<str>`, not
/// `String`: 8 bytes less in every slot holding an action, which keeps
/// [`InFlight`] within a smaller allocation size class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Flight {
    /// Issued; no outcome yet.
    Sent,
    /// The actuator reported success at this time; waiting to observe the effect.
    Done { at_ms: u64 },
    /// Failed; retry at this time.
    Failed { retry_at_ms: u64, error: Box<str> },
    /// Out of attempts, or failed for good: nothing more until the wanted
    /// action changes.
    GaveUp { error: Box<str> },
}

/// The action in flight on one target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InFlight {
    pub id: ActionId,
    pub action: Action,
    pub issued_ms: u64,
    pub attempt: u32,
    pub flight: Flight,
}

/// One target's slot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Slot {
    /// Boxed: most slots are empty most of the time, and the model keeps
    /// several per node.
    pub current: Option<Box<InFlight>>,
}

/// Where and why an action would be issued.
pub(crate) struct Issue<'a> {
    pub seq: u64,
    pub now_ms: u64,
    pub cause: &'a EventId,
    pub rule: &'static str,
}

/// What a reconcile step did, for the caller's transitions.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing to report.
    Quiet,
    /// The slot sent its action: the first attempt at it, or a retry.
    Sent { attempt: u32 },
    /// The slot just gave up on its action.
    GaveUp { attempts: u32, error: String },
}

impl Slot {
    /// Brings the slot in line with what is wanted. `want` is the action that
    /// would bring the observed state to the desired one, or `None` when the
    /// observed state already is the desired one. Returns what happened and the
    /// next log time at which the slot needs another look, if any.
    pub fn reconcile(
        &mut self,
        want: Option<Action>,
        issue: &Issue<'_>,
        policy: &ActionPolicy,
        out: &mut Vec<IssuedAction>,
    ) -> (Step, Option<u64>) {
        let timeout_ms = ms(policy.timeout_s);
        let Some(want) = want else {
            // Observed state is what we want. An action still on its way may
            // yet land (and be undone by the next evaluation); until its
            // outcome or timeout, it keeps the slot so nothing races it.
            if let Some(cur) = &self.current {
                let deadline = after_ms(cur.issued_ms, timeout_ms);
                if cur.flight == Flight::Sent && issue.now_ms < deadline {
                    return (Step::Quiet, Some(deadline));
                }
            }
            self.current = None;
            return (Step::Quiet, None);
        };
        let Some(cur) = &mut self.current else {
            self.send(want, 1, issue, out);
            return (
                Step::Sent { attempt: 1 },
                Some(after_ms(issue.now_ms, timeout_ms)),
            );
        };
        if cur.action != want {
            // What we want changed. Never two in flight: wait for the current
            // one to end (outcome or timeout) before sending the new one.
            let deadline = after_ms(cur.issued_ms, timeout_ms);
            if cur.flight == Flight::Sent && issue.now_ms < deadline {
                return (Step::Quiet, Some(deadline));
            }
            self.send(want, 1, issue, out);
            return (
                Step::Sent { attempt: 1 },
                Some(after_ms(issue.now_ms, timeout_ms)),
            );
        }
        let (retry_at, error) = match &cur.flight {
            Flight::Sent => (
                after_ms(cur.issued_ms, timeout_ms),
                "no outcome before the timeout",
            ),
            // A report whose effect lockstep never reads back is done
            // once the actuator says so.
            Flight::Done { .. } if !cur.action.effect_observed() => return (Step::Quiet, None),
            Flight::Done { at_ms } => (
                after_ms(*at_ms, timeout_ms),
                "effect not observed before the timeout",
            ),
            Flight::Failed { retry_at_ms, error } => (*retry_at_ms, &**error),
            Flight::GaveUp { .. } => return (Step::Quiet, None),
        };
        if issue.now_ms < retry_at {
            return (Step::Quiet, Some(retry_at));
        }
        if cur.attempt >= policy.attempts_max {
            let error = error.to_owned();
            let attempts = cur.attempt;
            cur.flight = Flight::GaveUp {
                error: error.as_str().into(),
            };
            return (Step::GaveUp { attempts, error }, None);
        }
        let attempt = cur.attempt + 1;
        self.send(want, attempt, issue, out);
        (
            Step::Sent { attempt },
            Some(after_ms(issue.now_ms, timeout_ms)),
        )
    }

    fn send(
        &mut self,
        action: Action,
        attempt: u32,
        issue: &Issue<'_>,
        out: &mut Vec<IssuedAction>,
    ) {
        let id = ActionId::derive(issue.seq, action.kind(), &action.target());
        // The slot keeps the clones: a clone's strings and vectors are as
        // long as their contents, while the originals (built with
        // `format!`, `push`) may have room to spare, which would be held for
        // as long as the action is in flight.
        let kept = InFlight {
            id: id.clone(),
            action: action.clone(),
            issued_ms: issue.now_ms,
            attempt,
            flight: Flight::Sent,
        };
        out.push(IssuedAction {
            id,
            seq: issue.seq,
            time_ms: issue.now_ms,
            cause: issue.cause.clone(),
            rule: issue.rule.to_owned(),
            attempt,
            action,
        });
        self.current = Some(Box::new(kept));
    }

    /// Records an actuator's outcome. Outcomes of older attempts, and repeated
    /// outcomes, change nothing. Returns whether the slot changed.
    pub fn handle_outcome(
        &mut self,
        id: &ActionId,
        result: &OutcomeResult,
        now_ms: u64,
        policy: &ActionPolicy,
    ) -> bool {
        let Some(cur) = &mut self.current else {
            return false;
        };
        if &cur.id != id || cur.flight != Flight::Sent {
            return false;
        }
        cur.flight = match result {
            // Declined: somebody else holds the target. Nothing is retried
            // before the timeout; by then the observation shows who.
            OutcomeResult::Succeeded
            | OutcomeResult::AlreadyDone
            | OutcomeResult::Declined { .. } => Flight::Done { at_ms: now_ms },
            OutcomeResult::Failed {
                retryable: true,
                error,
            } => Flight::Failed {
                retry_at_ms: after_ms(now_ms, backoff_ms(policy, cur.attempt)),
                error: error.as_str().into(),
            },
            OutcomeResult::Failed {
                retryable: false,
                error,
            } => Flight::GaveUp {
                error: error.as_str().into(),
            },
        };
        true
    }

    /// Whether an action is pending (sent, no outcome yet).
    pub fn pending(&self) -> Option<&InFlight> {
        self.current.as_deref().filter(|c| c.flight == Flight::Sent)
    }
}

/// Retry delay after the `attempt`-th attempt failed: doubling from the
/// initial delay, bounded by the maximum.
pub(crate) fn backoff_ms(policy: &ActionPolicy, attempt: u32) -> u64 {
    let shift = attempt.saturating_sub(1).min(32);
    policy
        .retry_backoff_initial_s
        .saturating_mul(1 << shift)
        .min(policy.retry_backoff_max_s)
        .saturating_mul(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain() -> Action {
        Action::SlurmDrain {
            node: "n1".into(),
            reason: "lockstep: test".into(),
        }
    }

    fn issue(seq: u64, now_ms: u64, cause: &EventId) -> Issue<'_> {
        Issue {
            seq,
            now_ms,
            cause,
            rule: "test",
        }
    }

    #[test]
    fn backoff_doubles_and_is_bounded() {
        let p = ActionPolicy {
            retry_backoff_initial_s: 5,
            retry_backoff_max_s: 60,
            ..ActionPolicy::default()
        };
        let got: Vec<u64> = (1..=6).map(|a| backoff_ms(&p, a) / 1000).collect();
        assert_eq!(got, [5, 10, 20, 40, 60, 60]);
        assert_eq!(backoff_ms(&p, u32::MAX), 60_000);
    }

    #[test]
    fn one_action_in_flight_until_timeout_then_retry_until_bound() {
        let p = ActionPolicy {
            timeout_s: 10,
            attempts_max: 2,
            ..ActionPolicy::default()
        };
        let cause = EventId("e".into());
        let mut slot = Slot::default();
        let mut out = Vec::new();
        assert_eq!(
            slot.reconcile(Some(drain()), &issue(1, 0, &cause), &p, &mut out),
            (Step::Sent { attempt: 1 }, Some(10_000))
        );
        assert_eq!(out.len(), 1);
        // Wanted again before the timeout: nothing new.
        assert_eq!(
            slot.reconcile(Some(drain()), &issue(2, 5_000, &cause), &p, &mut out),
            (Step::Quiet, Some(10_000))
        );
        assert_eq!(out.len(), 1);
        // Timeout: second attempt.
        let (step, _) = slot.reconcile(Some(drain()), &issue(3, 10_000, &cause), &p, &mut out);
        assert_eq!(step, Step::Sent { attempt: 2 });
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].attempt, 2);
        assert_eq!(out[1].id.0, "3.slurm_drain.slurm:n1/state");
        // Second timeout: out of attempts.
        let (step, wake) = slot.reconcile(Some(drain()), &issue(4, 20_000, &cause), &p, &mut out);
        assert!(matches!(step, Step::GaveUp { attempts: 2, .. }));
        assert_eq!(wake, None);
        assert_eq!(out.len(), 2);
        // Observed as wanted: the slot clears.
        slot.reconcile(None, &issue(5, 30_000, &cause), &p, &mut out);
        assert_eq!(slot.current, None);
    }

    #[test]
    fn stale_and_repeated_outcomes_change_nothing() {
        let p = ActionPolicy::default();
        let cause = EventId("e".into());
        let mut slot = Slot::default();
        let mut out = Vec::new();
        slot.reconcile(Some(drain()), &issue(7, 0, &cause), &p, &mut out);
        let stale = ActionId("1.slurm_drain.slurm:n1/state".into());
        assert!(!slot.handle_outcome(&stale, &OutcomeResult::Succeeded, 1, &p));
        let id = out[0].id.clone();
        assert!(slot.handle_outcome(&id, &OutcomeResult::Succeeded, 2, &p));
        assert!(!slot.handle_outcome(&id, &OutcomeResult::Succeeded, 3, &p));
        assert_eq!(slot.current.unwrap().flight, Flight::Done { at_ms: 2 });
    }
}
