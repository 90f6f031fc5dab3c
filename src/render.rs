//! How replays and audits read on a terminal and as JSON Lines.
//!
//! The text forms are what the incident goldens hold, so a change here shows
//! up as a golden diff: keep them stable and readable.

use std::fmt::Write as _;

use lockstep_engine::replay::{AuditEntry, WhatIf};
use lockstep_engine::Transition;
use lockstep_schemas::{EventRecord, IssuedAction, SourceDetail};
use serde::Serialize;

/// The last instant RFC 3339 can write (9999-12-31T23:59:59.999Z), in ms
/// since the Unix epoch.
pub const RFC3339_MS_MAX: u64 = 253_402_300_799_999;

/// RFC 3339 UTC with milliseconds. A time past year 9999 (a damaged or
/// hand-made log; RFC 3339 has four-digit years) is shown as its raw value.
pub fn time(ms: u64) -> String {
    if ms > RFC3339_MS_MAX {
        return format!("{ms} ms since the Unix epoch (past year 9999)");
    }
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// The timeline lines for one applied record: the event, then what it caused.
pub fn timeline(rec: &EventRecord, transitions: &[Transition], actions: &[IssuedAction]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "{}  seq {:<6} {}",
        time(rec.time_ms),
        rec.seq,
        rec.envelope.event.summary()
    );
    if !rec.envelope.detail.is_empty() {
        let _ = write!(s, " ({})", detail(&rec.envelope.detail));
    }
    s.push('\n');
    for t in transitions {
        let _ = writeln!(s, "{}", transition(t));
    }
    for a in actions {
        let _ = writeln!(s, "{}", action(a));
    }
    s
}

/// An envelope's [`SourceDetail`] for a person: `file policy.json`,
/// `rollback to the policy in force at seq 12, by ops@host`; empty when
/// there is none.
pub fn detail(d: &SourceDetail) -> String {
    let mut parts = Vec::new();
    if !d.file.is_empty() {
        parts.push(format!("file {}", d.file));
    }
    if d.rollback_to_seq > 0 {
        parts.push(format!(
            "rollback to the policy in force at seq {}",
            d.rollback_to_seq
        ));
    }
    if !d.by.is_empty() {
        parts.push(format!("by {}", d.by));
    }
    parts.join(", ")
}

/// `    n1: in_service -> draining [drain.cordon] kubernetes node k1 cordoned`
pub fn transition(t: &Transition) -> String {
    format!(
        "    {}: {} -> {} [{}] {}",
        t.node, t.from, t.to, t.rule, t.detail
    )
}

/// `    => 14.slurm_drain.slurm:n1/state: drain slurm node n1 (...)`
pub fn action(a: &IssuedAction) -> String {
    let attempt = if a.attempt > 1 {
        format!(" (attempt {})", a.attempt)
    } else {
        String::new()
    };
    format!("    => {}{attempt}: {}", a.id, a.action.describe())
}

/// One JSON Lines row of `replay --json`.
#[derive(Serialize)]
pub struct TimelineRow<'a> {
    /// Sequence.
    pub seq: u64,
    /// Log time (ms).
    pub time_ms: u64,
    /// Event id.
    pub event_id: &'a str,
    /// Event kind.
    pub kind: &'static str,
    /// Event summary.
    pub summary: String,
    /// The envelope's source detail (absent when empty).
    #[serde(skip_serializing_if = "SourceDetail::is_empty")]
    pub detail: &'a SourceDetail,
    /// Transitions it caused.
    pub transitions: &'a [Transition],
    /// Actions it caused.
    pub actions: &'a [IssuedAction],
}

impl<'a> TimelineRow<'a> {
    /// The row for one applied record.
    pub fn new(
        rec: &'a EventRecord,
        transitions: &'a [Transition],
        actions: &'a [IssuedAction],
    ) -> Self {
        Self {
            seq: rec.seq,
            time_ms: rec.time_ms,
            event_id: &rec.envelope.id.0,
            kind: rec.envelope.event.kind(),
            summary: rec.envelope.event.summary(),
            detail: &rec.envelope.detail,
            transitions,
            actions,
        }
    }
}

/// What a what-if comparison is, in one place for both renderings.
pub const WHAT_IF_NOTE: &str = "the what-if run folds the recorded observations: the world in the log does not react to actions that were never carried out, so actions only this policy issues change nothing that follows in it, and the effects of recorded actions it would not have issued stay visible to it. Actions are matched by kind, target and content; what-if actions that only react to such effects, and retries, are not compared";

/// The what-if lists of `replay --policy` (text).
pub fn what_if(diff: &WhatIf) -> String {
    const SHOWN_MAX: usize = 20;
    fn list(s: &mut String, mark: char, actions: &[IssuedAction]) {
        for a in actions.iter().take(SHOWN_MAX) {
            let _ = writeln!(s, "  {mark} {}: {}", a.id, a.action.describe());
        }
        if actions.len() > SHOWN_MAX {
            let _ = writeln!(
                s,
                "  ... and {} more (--json lists them all)",
                actions.len() - SHOWN_MAX
            );
        }
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nwith this policy, replayed against the recorded observations:"
    );
    let _ = writeln!(
        s,
        "  (the world in the log does not react to actions that were never carried out:\n   \
         actions only this policy issues change nothing that follows, and the effects\n   \
         of recorded actions it would not have issued stay visible to it. Actions are\n   \
         matched by kind, target and content, not by id or time.)"
    );
    let _ = writeln!(
        s,
        "  {} of {} recorded actions would not have been issued",
        diff.not_issued.len(),
        diff.recorded
    );
    list(&mut s, '-', &diff.not_issued);
    let _ = writeln!(
        s,
        "  {} actions would have been issued that were not",
        diff.issued.len()
    );
    list(&mut s, '+', &diff.issued);
    if !diff.reactions.is_empty() {
        let _ = writeln!(
            s,
            "  {} actions of the what-if run left out: they react to the effects of recorded actions it would not have issued",
            diff.reactions.len()
        );
        list(&mut s, '~', &diff.reactions);
    }
    if diff.recorded_retries + diff.what_if_retries > 0 {
        let _ = writeln!(
            s,
            "  retries not compared: {} recorded, {} in the what-if run",
            diff.recorded_retries, diff.what_if_retries
        );
    }
    s
}

/// The last JSON Lines row of `replay --policy --json`: the what-if lists.
#[derive(Serialize)]
pub struct WhatIfRow<'a> {
    /// The lists.
    pub what_if: WhatIfLists<'a>,
}

/// See [`WhatIfRow`] and [`WhatIf`].
#[derive(Serialize)]
pub struct WhatIfLists<'a> {
    /// [`WHAT_IF_NOTE`].
    pub note: &'static str,
    /// Recorded first attempts.
    pub recorded_actions: u64,
    /// First attempts of the what-if run.
    pub what_if_actions: u64,
    /// Recorded actions the what-if policy would not have issued.
    pub not_issued: &'a [IssuedAction],
    /// Actions the what-if policy would have issued that were not recorded.
    pub issued: &'a [IssuedAction],
    /// What-if actions left out: reactions to the effects of recorded
    /// actions it would not have issued.
    pub reactions: &'a [IssuedAction],
    /// Retries (attempt > 1), not compared.
    pub retries_not_compared: Retries,
}

/// Retry counts of both runs.
#[derive(Serialize)]
pub struct Retries {
    /// In the recorded run.
    pub recorded: u64,
    /// In the what-if run.
    pub what_if: u64,
}

impl<'a> WhatIfRow<'a> {
    /// The row for a comparison.
    pub fn new(diff: &'a WhatIf) -> Self {
        Self {
            what_if: WhatIfLists {
                note: WHAT_IF_NOTE,
                recorded_actions: diff.recorded,
                what_if_actions: diff.what_if,
                not_issued: &diff.not_issued,
                issued: &diff.issued,
                reactions: &diff.reactions,
                retries_not_compared: Retries {
                    recorded: diff.recorded_retries,
                    what_if: diff.what_if_retries,
                },
            },
        }
    }
}

/// The causal chain of one node: every related event, each transition with
/// the event behind it, each action with its outcome.
pub fn audit(node: &str, entries: &[AuditEntry]) -> String {
    let mut events = std::collections::HashMap::new();
    for e in entries {
        if let AuditEntry::Event {
            seq, id, summary, ..
        } = e
        {
            events.insert(id.0.as_str(), (*seq, summary.as_str()));
        }
    }
    let mut s = String::new();
    let _ = writeln!(s, "audit of slurm node {node}: {} entries", entries.len());
    for e in entries {
        match e {
            AuditEntry::Event {
                seq,
                time_ms,
                summary,
                ..
            } => {
                let _ = writeln!(s, "{}  seq {seq:<6} event       {summary}", time(*time_ms));
            }
            AuditEntry::Transition(t) => {
                let _ = writeln!(
                    s,
                    "{}  seq {:<6} transition  {} -> {} [{}] {}",
                    time(t.time_ms),
                    t.seq,
                    t.from,
                    t.to,
                    t.rule,
                    t.detail
                );
                match events.get(t.cause.0.as_str()) {
                    Some((seq, summary)) => {
                        let _ = writeln!(s, "{:38}because of seq {seq}: {summary}", "");
                    }
                    None => {
                        let _ = writeln!(s, "{:38}because of event {}", "", t.cause);
                    }
                }
            }
            AuditEntry::Action(a) => {
                let attempt = if a.attempt > 1 {
                    format!(" attempt {}", a.attempt)
                } else {
                    String::new()
                };
                let _ = writeln!(
                    s,
                    "{}  seq {:<6} action      {} [{}{attempt}] {}",
                    time(a.time_ms),
                    a.seq,
                    a.id,
                    a.rule,
                    a.action.describe()
                );
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_time_renders_without_panicking() {
        // (ms since the epoch, rendering)
        for (ms, want) in [
            (0, "1970-01-01T00:00:00.000Z"),
            (1_772_334_000_123, "2026-03-01T03:00:00.123Z"),
            (RFC3339_MS_MAX, "9999-12-31T23:59:59.999Z"),
            (
                RFC3339_MS_MAX + 1,
                "253402300800000 ms since the Unix epoch (past year 9999)",
            ),
            (
                u64::MAX,
                "18446744073709551615 ms since the Unix epoch (past year 9999)",
            ),
        ] {
            assert_eq!(time(ms), want, "{ms}");
        }
    }
}
