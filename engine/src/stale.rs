//! Stale observations: an observation or deletion older than what the model
//! holds changes nothing.
//!
//! The log deduplicates a re-published envelope only within its window
//! (JetStream's `duplicate_window`); a connector that re-publishes after a
//! restart, or a retry that outlives the window, appends an old observation
//! again, after newer ones of the same object. Every observation carries its
//! object's own version (Kubernetes `resourceVersion`, the Slurm observer's
//! poll generation), so the reducer can tell.
//!
//! | row | holds when                                                      | effect                 |
//! |-----|-----------------------------------------------------------------|------------------------|
//! | 1   | incoming version 0, or the held version 0                        | applied (unknown)      |
//! | 2   | incoming version < held version                                  | ignored: nothing changes, nothing is re-evaluated |
//! | 3   | the object is not held, a tombstone says it was deleted at version >= incoming | ignored: a deleted object does not come back |
//! | 4   | otherwise                                                        | applied                |
//! | 5   | a Kubernetes node at the held version that looked for fewer label keys than the held copy (taken under an earlier policy) | counts as listed; the held copy is kept |
//! | 7   | a Kubernetes node at the held version that looked for keys the held copy did not, and not for some it did (a policy edit that drops one key and adds another) | applied, merged with the held copy: the same object, so each copy's keys are true of it |
//! | 6   | a deletion of version 0 (inferred from a full listing) outside a listing of its kind, of an object held at a known version | ignored: a late copy of one; connectors infer deletions only between `SyncStarted` and `SyncDone` (logs from before versions, all 0, keep row 1) |
//!
//! An observation equal in version to the one held is applied: it says
//! nothing new, so it changes nothing, except inside a relist, where it
//! counts as listed (a Kubernetes relist gives an unchanged object its old
//! `resourceVersion`, so versions cannot tell a late copy of the last
//! observation from the relist's own).
//!
//! A deletion leaves a tombstone (object -> the newest version known of it:
//! the deletion's own, or the one last held when a relist inferred it). The
//! tombstones are bounded: each lives [`TOMBSTONE_AGE_MS_MAX`] of log time
//! and at most [`TOMBSTONES_MAX`] are kept (the oldest go first). This module
//! only answers "is it stale?"; it never changes the model itself.

use std::collections::{BTreeMap, BTreeSet};

use lockstep_schemas::{KubeNode, ScaleTargetRef};
use serde::{Deserialize, Serialize};

use crate::units::after_ms;

/// How long a tombstone is kept, in log time. Far longer than any
/// deduplication window: a re-delivery comes from a publisher that retried
/// or restarted, within hours at worst.
pub(crate) const TOMBSTONE_AGE_MS_MAX: u64 = 6 * 3_600 * 1_000;

/// Tombstones kept at most; past it, the oldest are dropped. A relist that
/// finds a whole 50,000-node cluster gone stays within it.
pub(crate) const TOMBSTONES_MAX: usize = 65_536;

/// One observed object, whatever its kind.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) enum ObjectKey {
    SlurmNode(String),
    SlurmJob(u64),
    SlurmPartition(String),
    KubeNode(String),
    /// `namespace/name`.
    Pod(String),
    ScaleTarget(ScaleTargetRef),
}

/// Row 5: whether an observation that looked for the label keys `incoming`
/// says at least what one that looked for `held` does (`None`: written
/// before observations recorded it, taken as every key).
pub(crate) fn reads_at_least(incoming: &Option<Vec<String>>, held: &Option<Vec<String>>) -> bool {
    match (incoming, held) {
        (None, _) | (Some(_), None) => true,
        (Some(incoming), Some(held)) => held.iter().all(|k| incoming.contains(k)),
    }
}

/// Row 7: `incoming` and `held`, the same Kubernetes node at the same
/// version, looked for different label keys: what both say of it, every
/// key either looked for (`None` when neither looked for a key the other did
/// not, or either is from before observations recorded them).
pub(crate) fn merged_reads(incoming: &KubeNode, held: &KubeNode) -> Option<KubeNode> {
    let (Some(reads), Some(held_reads)) = (&incoming.read_labels, &held.read_labels) else {
        return None;
    };
    let more: Vec<&String> = held_reads.iter().filter(|k| !reads.contains(k)).collect();
    if more.is_empty() || reads.iter().all(|k| held_reads.contains(k)) {
        return None;
    }
    let mut merged = incoming.clone();
    for k in &more {
        if let Some(v) = held.labels.get(*k) {
            merged.labels.insert((*k).clone(), v.clone());
        }
    }
    let mut keys = reads.clone();
    keys.extend(more.into_iter().cloned());
    keys.sort();
    merged.read_labels = Some(keys);
    Some(merged)
}

/// Row 2: an observation (or deletion) older than the one held.
pub(crate) fn older_than_held(incoming: u64, held: Option<u64>) -> bool {
    incoming != 0 && held.is_some_and(|h| h != 0 && incoming < h)
}

/// Row 6: a deletion a full listing inferred (version 0) arriving while no
/// listing of its kind is in progress, of an object held at a known version.
pub(crate) fn inferred_outside_listing(incoming: u64, listing: bool, held: Option<u64>) -> bool {
    incoming == 0 && !listing && held.is_some_and(|h| h != 0)
}

/// Row 3: an observation of a deleted object, not newer than its deletion.
pub(crate) fn buried(incoming: u64, tombstone: Option<u64>) -> bool {
    incoming != 0 && tombstone.is_some_and(|t| incoming <= t)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Tomb {
    version: u64,
    at_ms: u64,
}

/// Deleted objects and the version they were deleted at, bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Tombstones {
    entries: BTreeMap<ObjectKey, Tomb>,
    /// The same entries by age, for pruning; derived, rebuilt on restore.
    #[serde(skip)]
    by_age: BTreeSet<(u64, ObjectKey)>,
}

impl Tombstones {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Rebuilds the age index after a restore.
    pub fn rebuild(&mut self) {
        self.by_age = self
            .entries
            .iter()
            .map(|(k, t)| (t.at_ms, k.clone()))
            .collect();
    }

    /// Records that `key` was deleted at `version` (0: nothing is known, and
    /// nothing is recorded). A tombstone never goes back to an older version.
    pub fn bury(&mut self, key: ObjectKey, version: u64, now_ms: u64) {
        let known = self.version(&key, now_ms).unwrap_or(0);
        if version == 0 || version <= known {
            return;
        }
        self.lift(&key);
        self.by_age.insert((now_ms, key.clone()));
        self.entries.insert(
            key,
            Tomb {
                version,
                at_ms: now_ms,
            },
        );
        self.prune(now_ms);
    }

    /// The object exists again: forget its deletion.
    pub fn lift(&mut self, key: &ObjectKey) {
        if let Some(t) = self.entries.remove(key) {
            self.by_age.remove(&(t.at_ms, key.clone()));
        }
    }

    /// The version `key` was deleted at, unless the tombstone has expired.
    pub fn version(&self, key: &ObjectKey, now_ms: u64) -> Option<u64> {
        self.entries
            .get(key)
            .filter(|t| now_ms < after_ms(t.at_ms, TOMBSTONE_AGE_MS_MAX))
            .map(|t| t.version)
    }

    fn prune(&mut self, now_ms: u64) {
        while let Some((at_ms, key)) = self.by_age.first().cloned() {
            let expired = now_ms >= after_ms(at_ms, TOMBSTONE_AGE_MS_MAX);
            if !expired && self.entries.len() <= TOMBSTONES_MAX {
                break;
            }
            self.by_age.pop_first();
            self.entries.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staleness_table() {
        // (incoming, held, tombstone) -> ignored
        let rows: &[(u64, Option<u64>, Option<u64>, bool)] = &[
            (0, Some(9), None, false),  // unknown incoming: applied
            (5, Some(0), None, false),  // unknown held: applied
            (5, Some(9), None, true),   // older than held
            (9, Some(9), None, false),  // the same again: applied (changes nothing)
            (10, Some(9), None, false), // newer
            (5, None, None, false),     // new object
            (5, None, Some(9), true),   // deleted at 9: a re-delivery of 5
            (9, None, Some(9), true),   // the deleted version itself
            (10, None, Some(9), false), // created again after the deletion
            (0, None, Some(9), false),  // unknown: applied
        ];
        for &(incoming, held, tomb, ignored) in rows {
            let got = match held {
                Some(_) => older_than_held(incoming, held),
                None => buried(incoming, tomb),
            };
            assert_eq!(got, ignored, "{incoming} {held:?} {tomb:?}");
        }
    }

    #[test]
    fn inferred_deletions_table() {
        // (incoming, listing in progress, held) -> ignored
        let rows: &[(u64, bool, Option<u64>, bool)] = &[
            (0, true, Some(9), false),   // inferred by the listing under way
            (0, false, Some(9), true),   // a late copy of an inferred deletion
            (0, false, Some(0), false),  // held unversioned (an old log): row 1
            (0, false, None, false),     // not held: nothing to undo
            (12, false, Some(9), false), // a watched deletion, with its version
        ];
        for &(incoming, listing, held, ignored) in rows {
            let got = inferred_outside_listing(incoming, listing, held);
            assert_eq!(got, ignored, "{incoming} {listing} {held:?}");
        }
    }

    #[test]
    fn copies_of_one_node_that_looked_for_other_labels_are_merged() {
        let node = |labels: &[(&str, &str)], read: Option<&[&str]>| KubeNode {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            read_labels: read.map(|r| r.iter().map(|k| (*k).to_owned()).collect()),
            ..KubeNode::ready("k8s-1")
        };
        let keys = |n: &KubeNode| n.read_labels.clone().unwrap();
        // A policy edit dropped `a` and added `rack`: the new copy says what
        // `rack` is, the held one what `a` is.
        let held = node(&[("a", "1"), ("zone", "z")], Some(&["a", "zone"]));
        let incoming = node(&[("rack", "r2"), ("zone", "z")], Some(&["rack", "zone"]));
        let m = merged_reads(&incoming, &held).expect("merged");
        assert_eq!(keys(&m), ["a", "rack", "zone"]);
        assert_eq!(m.labels.get("a").map(String::as_str), Some("1"));
        assert_eq!(m.labels.get("rack").map(String::as_str), Some("r2"));
        // Either way round: a late copy from before the edit adds `a` back
        // and keeps `rack`.
        let m = merged_reads(&held, &incoming).expect("merged");
        assert_eq!(keys(&m), ["a", "rack", "zone"]);
        assert_eq!(m.labels.get("rack").map(String::as_str), Some("r2"));
        // A key looked for and absent stays absent.
        let held = node(&[("zone", "z")], Some(&["a", "zone"]));
        let m = merged_reads(&incoming, &held).expect("merged");
        assert!(!m.labels.contains_key("a"));
        // One that looked for at most, or at least, what the other did is
        // row 5's or a plain copy: nothing to merge.
        let fewer = node(&[("zone", "z")], Some(&["zone"]));
        assert!(merged_reads(&fewer, &incoming).is_none());
        assert!(merged_reads(&incoming, &fewer).is_none());
        assert!(merged_reads(&incoming, &incoming).is_none());
        assert!(merged_reads(&node(&[], None), &incoming).is_none());
    }

    #[test]
    fn tombstones_expire_and_are_bounded() {
        let mut t = Tombstones::default();
        let k = |i: u64| ObjectKey::SlurmJob(i);
        t.bury(k(1), 0, 0);
        assert!(t.is_empty(), "version 0 leaves no tombstone");
        t.bury(k(1), 7, 1_000);
        assert_eq!(t.version(&k(1), 1_000), Some(7));
        t.bury(k(1), 5, 1_000);
        assert_eq!(
            t.version(&k(1), 1_000),
            Some(7),
            "an older deletion changes nothing"
        );
        assert_eq!(t.version(&k(1), 1_000 + TOMBSTONE_AGE_MS_MAX), None);
        t.lift(&k(1));
        assert!(t.is_empty());
        for i in 0..(TOMBSTONES_MAX as u64 + 10) {
            t.bury(k(i), 1, 5_000);
        }
        assert_eq!(t.entries.len(), TOMBSTONES_MAX);
        assert_eq!(t.by_age.len(), TOMBSTONES_MAX);
        // The oldest (by time, then key) went first.
        assert_eq!(t.version(&k(0), 5_000), None);
        // A later burial prunes what has expired.
        t.bury(k(u64::MAX), 1, 5_000 + TOMBSTONE_AGE_MS_MAX);
        assert_eq!(t.entries.len(), 1);
        let mut restored: Tombstones =
            rmp_serde::from_slice(&rmp_serde::to_vec_named(&t).unwrap()).unwrap();
        restored.rebuild();
        assert_eq!(restored, t);
    }
}
