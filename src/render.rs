//! How replays and audits read on a terminal and as JSON Lines.
//!
//! The text forms are what the incident goldens hold, so a change here shows
//! up as a golden diff: keep them stable and readable.

use std::fmt::Write as _;

use lockstep_engine::replay::AuditEntry;
use lockstep_engine::Transition;
use lockstep_schemas::{EventRecord, IssuedAction};
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
    let _ = writeln!(
        s,
        "{}  seq {:<6} {}",
        time(rec.time_ms),
        rec.seq,
        rec.envelope.event.summary()
    );
    for t in transitions {
        let _ = writeln!(s, "{}", transition(t));
    }
    for a in actions {
        let _ = writeln!(s, "{}", action(a));
    }
    s
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
            transitions,
            actions,
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
