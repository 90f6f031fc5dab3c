//! The policy's history in the log: `lockstep policy history`, `diff` and
//! `rollback`.
//!
//! Every policy that was ever in force is a `PolicyChanged` event in the
//! log, so the history is a scan of the log and a rollback is one more
//! `PolicyChanged`, carrying the policy that was in force at an earlier
//! sequence and a [`SourceDetail`] that says it is a rollback, of which
//! sequence and by whom. The reducer reads only the policy: a log replays
//! across a rollback like across any other policy change.
//!
//! This module reads logs and renders; it never appends by itself (the
//! command that calls [`rollback_envelope`] does) and never decides what a
//! policy means.

use std::fmt::Write as _;

use anyhow::{bail, Result};
use lockstep_schemas::log::DecodeError;
use lockstep_schemas::{Envelope, Event, Policy, Record, Source, SourceDetail};
use serde::Serialize;

use crate::render;

/// One `PolicyChanged` event of a log.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyChange {
    /// Its sequence.
    pub seq: u64,
    /// Its log time (ms).
    pub time_ms: u64,
    /// Who appended it.
    pub source: Source,
    /// File, person, rollback.
    pub detail: SourceDetail,
    /// Its event id.
    pub id: String,
    /// The policy it put in force.
    pub policy: Policy,
}

/// Every `PolicyChanged` of a log, in order, and where the log was damaged
/// if it was (the history covers it up to there).
pub fn changes(
    records: impl Iterator<Item = Result<Record, DecodeError>>,
) -> (Vec<PolicyChange>, Option<DecodeError>) {
    let mut out = Vec::new();
    for rec in records {
        let rec = match rec {
            Ok(r) => r,
            Err(e) => return (out, Some(e)),
        };
        if let Record::Event(ev) = rec {
            if let Event::PolicyChanged(p) = ev.envelope.event {
                out.push(PolicyChange {
                    seq: ev.seq,
                    time_ms: ev.time_ms,
                    source: ev.envelope.source,
                    detail: ev.envelope.detail,
                    id: ev.envelope.id.0,
                    policy: *p,
                });
            }
        }
    }
    (out, None)
}

/// The policy in force once the record at `seq` was applied: that of the
/// last change at or before it, or the default (what the reducer starts
/// with) when there is none; with the change that set it.
pub fn in_force(changes: &[PolicyChange], seq: u64) -> (Option<&PolicyChange>, Policy) {
    match changes.iter().rev().find(|c| c.seq <= seq) {
        Some(c) => (Some(c), c.policy.clone()),
        None => (None, Policy::default()),
    }
}

/// One difference between two policies, at a field path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldChange {
    /// `drain.on_cordon`, `scaling.targets[0].max_replicas`.
    pub path: String,
    /// The value before (absent: the field was added).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<serde_json::Value>,
    /// The value after (absent: the field was removed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<serde_json::Value>,
}

/// What changed from `a` to `b`, field by field, in document order.
pub fn diff(a: &Policy, b: &Policy) -> Vec<FieldChange> {
    let a = serde_json::to_value(a).expect("a policy is JSON");
    let b = serde_json::to_value(b).expect("a policy is JSON");
    let mut out = Vec::new();
    diff_values("", Some(&a), Some(&b), &mut out);
    out
}

fn diff_values(
    path: &str,
    a: Option<&serde_json::Value>,
    b: Option<&serde_json::Value>,
    out: &mut Vec<FieldChange>,
) {
    use serde_json::Value;
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match (a, b) {
        (Some(x), Some(y)) if x == y => {}
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                diff_values(&join(k), x.get(k), y.get(k), out);
            }
        }
        (Some(Value::Array(x)), Some(Value::Array(y))) => {
            for i in 0..x.len().max(y.len()) {
                diff_values(&format!("{path}[{i}]"), x.get(i), y.get(i), out);
            }
        }
        (None, None) => {}
        (x, y) => out.push(FieldChange {
            path: path.to_owned(),
            from: x.cloned(),
            to: y.cloned(),
        }),
    }
}

/// `~ path: a -> b`, `+ path: b`, `- path: a`, one a line, indented.
pub fn render_diff(changes: &[FieldChange], indent: &str) -> String {
    let mut s = String::new();
    if changes.is_empty() {
        let _ = writeln!(s, "{indent}(no change)");
    }
    for c in changes {
        let _ = match (&c.from, &c.to) {
            (Some(a), Some(b)) => writeln!(s, "{indent}~ {}: {a} -> {b}", c.path),
            (None, Some(b)) => writeln!(s, "{indent}+ {}: {b}", c.path),
            (Some(a), None) => writeln!(s, "{indent}- {}: {a}", c.path),
            (None, None) => Ok(()),
        };
    }
    s
}

/// Who or what a change came from, for a person: the source, then the
/// file, the rollback and who asked.
pub fn origin(source: Source, detail: &SourceDetail) -> String {
    let mut s = source.name().to_owned();
    let more = render::detail(detail);
    if !more.is_empty() {
        s.push_str(", ");
        s.push_str(&more);
    }
    s
}

/// One row of `policy history --json`.
#[derive(Serialize)]
pub struct HistoryRow<'a> {
    /// Sequence.
    pub seq: u64,
    /// Log time (ms).
    pub time_ms: u64,
    /// Who appended it.
    pub source: &'static str,
    /// File, person, rollback (absent when empty).
    #[serde(skip_serializing_if = "SourceDetail::is_empty")]
    pub detail: &'a SourceDetail,
    /// Event id.
    pub id: &'a str,
    /// What changed against the policy in force before it (the default
    /// policy for the first).
    pub changes: Vec<FieldChange>,
}

/// The history, text: each change with what it changed against the one
/// before it (the first against the default policy the reducer starts
/// with).
pub fn render_history(changes: &[PolicyChange]) -> String {
    let mut s = String::new();
    if changes.is_empty() {
        s.push_str("no policy change in this log: the default policy was in force throughout\n");
        return s;
    }
    let mut before = Policy::default();
    for c in changes {
        let _ = writeln!(
            s,
            "seq {:<6} {}  {}",
            c.seq,
            render::time(c.time_ms),
            origin(c.source, &c.detail)
        );
        s.push_str(&render_diff(&diff(&before, &c.policy), "    "));
        before = c.policy.clone();
    }
    s
}

/// The history as JSON Lines rows.
pub fn history_rows(changes: &[PolicyChange]) -> Vec<HistoryRow<'_>> {
    let mut before = Policy::default();
    changes
        .iter()
        .map(|c| {
            let row = HistoryRow {
                seq: c.seq,
                time_ms: c.time_ms,
                source: c.source.name(),
                detail: &c.detail,
                id: &c.id,
                changes: diff(&before, &c.policy),
            };
            before = c.policy.clone();
            row
        })
        .collect()
}

/// The `PolicyChanged` that rolls the log back to the policy in force at
/// `seq`, appended at `now_ms` on behalf of `by`; `None` when that policy
/// is already the one in force (nothing to roll back). `head` is the log's
/// last sequence: a rollback names a sequence the log has.
pub fn rollback_envelope(
    changes: &[PolicyChange],
    seq: u64,
    head: u64,
    by: &str,
    now_ms: u64,
) -> Result<Option<Envelope>> {
    if seq == 0 || seq > head {
        bail!("seq {seq} is not in the log (its sequences run from 1 to {head})");
    }
    let (_, target) = in_force(changes, seq);
    let (_, current) = in_force(changes, head);
    if target == current {
        return Ok(None);
    }
    // Checked again: the log holds what some lockstep accepted, but this
    // build may bound a field more tightly.
    target.validate()?;
    Ok(Some(Envelope::with_detail(
        Source::Lockstep,
        now_ms,
        Event::PolicyChanged(Box::new(target)),
        SourceDetail {
            file: String::new(),
            by: by.to_owned(),
            rollback_to_seq: seq,
        },
    )))
}

/// `user@host` of whoever runs this command.
pub fn who() -> String {
    let user = ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "unknown".to_owned());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    if host.is_empty() {
        user
    } else {
        format!("{user}@{host}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(seq: u64, f: impl FnOnce(&mut Policy)) -> PolicyChange {
        let mut policy = Policy::default();
        f(&mut policy);
        PolicyChange {
            seq,
            time_ms: seq * 1000,
            source: Source::Lockstep,
            detail: SourceDetail::default(),
            id: format!("e{seq}"),
            policy,
        }
    }

    #[test]
    fn the_policy_in_force_is_the_last_change_at_or_before_a_sequence() {
        let changes = [
            change(3, |p| p.drain.on_cordon = false),
            change(9, |p| p.health.not_ready_grace_s = 5),
        ];
        // (seq, the change in force)
        for (seq, want) in [
            (1, None),
            (3, Some(3)),
            (8, Some(3)),
            (9, Some(9)),
            (50, Some(9)),
        ] {
            let (c, policy) = in_force(&changes, seq);
            assert_eq!(c.map(|c| c.seq), want, "seq {seq}");
            match want {
                None => assert_eq!(policy, Policy::default()),
                Some(w) => assert_eq!(policy, changes.iter().find(|c| c.seq == w).unwrap().policy),
            }
        }
    }

    #[test]
    fn a_diff_names_each_field_that_changed_by_its_path() {
        let a = Policy::default();
        let mut b = Policy::default();
        b.drain.on_cordon = false;
        b.health.not_ready_grace_s = 5;
        b.topology.features.push(lockstep_schemas::LabelFeature {
            label: "zone".into(),
            prefix: "zone_".into(),
        });
        let d = diff(&a, &b);
        let paths: Vec<&str> = d.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "drain.on_cordon",
                "health.not_ready_grace_s",
                "topology.features[0]"
            ]
        );
        let text = render_diff(&d, "");
        assert!(text.contains("~ drain.on_cordon: true -> false"), "{text}");
        assert!(text.contains("+ topology.features[0]: {"), "{text}");
        assert_eq!(render_diff(&diff(&b, &a), "").lines().count(), 3);
        assert!(diff(&a, &a).is_empty());
    }

    #[test]
    fn a_rollback_publishes_the_policy_then_in_force_and_says_so() {
        let changes = [
            change(3, |p| p.drain.on_cordon = false),
            change(9, |p| p.health.not_ready_grace_s = 5),
        ];
        let env = rollback_envelope(&changes, 5, 12, "ops@host", 77)
            .unwrap()
            .expect("another policy");
        let Event::PolicyChanged(p) = &env.event else {
            panic!("{env:?}")
        };
        assert_eq!(**p, changes[0].policy);
        assert_eq!(env.detail.rollback_to_seq, 5);
        assert_eq!(env.detail.by, "ops@host");
        assert!(env.id_matches());
        // The policy in force already: nothing to append.
        assert!(rollback_envelope(&changes, 10, 12, "x", 77)
            .unwrap()
            .is_none());
        // Before any change: the default policy.
        let env = rollback_envelope(&changes, 1, 12, "x", 77)
            .unwrap()
            .unwrap();
        assert_eq!(env.event, Event::PolicyChanged(Box::default()));
        for bad in [0, 13] {
            let err = rollback_envelope(&changes, bad, 12, "x", 77).unwrap_err();
            assert!(err.to_string().contains("not in the log"), "{err}");
        }
    }
}
