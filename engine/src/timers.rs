//! The engine's one timer wheel, keyed by log time.
//!
//! Every wait the rules have (a grace period ending, an action's timeout or
//! retry, a resume delay, scaling's next look, a maintenance window opening)
//! is a [`Wake`] at a log time. Each wake has at most one time: setting it
//! again moves it. When a record's append time reaches a wake's time, the
//! engine re-evaluates what it names. Nothing here reads a clock.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// What to re-evaluate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) enum Wake {
    /// A Slurm node: its causes, drain, features, topology and pod.
    Slurm(String),
    /// A Kubernetes node's taints.
    Kube(String),
    /// Every scale target (scaling is evaluated for all targets at once).
    Scale,
    /// A Kubernetes node's maintenance: its reservation and drain conditions.
    Maint(String),
}

/// The times set for the wakes of one name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Named {
    slurm: Option<u64>,
    kube: Option<u64>,
    maint: Option<u64>,
}

impl Named {
    fn field(&mut self, wake: &Wake) -> &mut Option<u64> {
        match wake {
            Wake::Slurm(_) => &mut self.slurm,
            Wake::Kube(_) => &mut self.kube,
            Wake::Maint(_) => &mut self.maint,
            Wake::Scale => unreachable!("scaling's wake has no name"),
        }
    }

    fn is_empty(self) -> bool {
        self.slurm.is_none() && self.kube.is_none() && self.maint.is_none()
    }
}

/// Wakes in log-time order, and the time of each.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Timers {
    due: BTreeSet<(u64, Wake)>,
    /// Name -> the times of its wakes; derived from `due` (rebuilt after a
    /// restore), so a look-up by name allocates nothing.
    #[serde(skip)]
    named: FxHashMap<String, Named>,
    #[serde(skip)]
    scale: Option<u64>,
}

/// A wake by borrowed name, for look-ups.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WakeOf<'a> {
    Slurm(&'a str),
    Kube(&'a str),
    Maint(&'a str),
    Scale,
}

impl WakeOf<'_> {
    fn owned(self) -> Wake {
        match self {
            Self::Slurm(n) => Wake::Slurm(n.to_owned()),
            Self::Kube(n) => Wake::Kube(n.to_owned()),
            Self::Maint(n) => Wake::Maint(n.to_owned()),
            Self::Scale => Wake::Scale,
        }
    }
}

impl Timers {
    /// The earliest time set, if any.
    pub fn next(&self) -> Option<u64> {
        self.due.first().map(|(at, _)| *at)
    }

    /// The time set for a wake.
    pub fn get(&self, wake: WakeOf<'_>) -> Option<u64> {
        let named = |n: &str| self.named.get(n).copied().unwrap_or_default();
        match wake {
            WakeOf::Slurm(n) => named(n).slurm,
            WakeOf::Kube(n) => named(n).kube,
            WakeOf::Maint(n) => named(n).maint,
            WakeOf::Scale => self.scale,
        }
    }

    /// Sets (or with `None` clears) the one time of a wake.
    pub fn set(&mut self, wake: WakeOf<'_>, at: Option<u64>) {
        let current = self.get(wake);
        if current == at {
            return;
        }
        let owned = wake.owned();
        if let Some(old) = current {
            self.due.remove(&(old, owned.clone()));
        }
        self.record(&owned, at);
        if let Some(at) = at {
            self.due.insert((at, owned));
        }
    }

    /// Takes the first wake due at `now`, if any.
    pub fn pop_due(&mut self, now: u64) -> Option<Wake> {
        if self.next()? > now {
            return None;
        }
        let (_, wake) = self.due.pop_first()?;
        self.record(&wake, None);
        Some(wake)
    }

    /// The Kubernetes nodes with a maintenance timer.
    pub fn maint_names(&self) -> impl Iterator<Item = &str> {
        self.named
            .iter()
            .filter(|(_, n)| n.maint.is_some())
            .map(|(name, _)| name.as_str())
    }

    /// A copy of what a snapshot holds: the wakes, not the index by name.
    pub fn frozen(&self) -> Self {
        Self {
            due: self.due.clone(),
            ..Self::default()
        }
    }

    /// Rebuilds the index by name (after a restore).
    pub fn rebuild(&mut self) {
        self.named.clear();
        self.scale = None;
        let due = std::mem::take(&mut self.due);
        for (at, wake) in &due {
            self.record(wake, Some(*at));
        }
        self.due = due;
    }

    fn record(&mut self, wake: &Wake, at: Option<u64>) {
        let name = match wake {
            Wake::Scale => {
                self.scale = at;
                return;
            }
            Wake::Slurm(n) | Wake::Kube(n) | Wake::Maint(n) => n,
        };
        match self.named.get_mut(name.as_str()) {
            Some(named) => {
                *named.field(wake) = at;
                if named.is_empty() {
                    self.named.remove(name.as_str());
                }
            }
            None if at.is_some() => {
                let mut named = Named::default();
                *named.field(wake) = at;
                self.named.insert(name.clone(), named);
            }
            None => {}
        }
    }
}

/// Keeps the earliest of two wake-up times.
pub(crate) fn min_wake(wake: &mut Option<u64>, at: u64) {
    *wake = Some(wake.map_or(at, |w| w.min(at)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_time_per_wake_in_log_time_order() {
        let mut t = Timers::default();
        t.set(WakeOf::Slurm("a"), Some(30));
        t.set(WakeOf::Kube("a"), Some(10));
        t.set(WakeOf::Scale, Some(20));
        t.set(WakeOf::Slurm("a"), Some(5)); // moved, not added
        assert_eq!(t.next(), Some(5));
        assert_eq!(t.get(WakeOf::Kube("a")), Some(10));
        assert_eq!(t.pop_due(4), None);
        assert_eq!(t.pop_due(10), Some(Wake::Slurm("a".into())));
        assert_eq!(t.pop_due(10), Some(Wake::Kube("a".into())));
        assert_eq!(t.pop_due(10), None);
        assert_eq!(t.get(WakeOf::Slurm("a")), None);
        t.set(WakeOf::Scale, None);
        assert_eq!(t.next(), None);
        assert!(t.named.is_empty());
    }

    #[test]
    fn the_index_by_name_is_rebuilt_after_a_restore() {
        let mut t = Timers::default();
        t.set(WakeOf::Maint("k"), Some(7));
        t.set(WakeOf::Scale, Some(9));
        let bytes = rmp_serde::to_vec_named(&t).unwrap();
        let mut back: Timers = rmp_serde::from_slice(&bytes).unwrap();
        back.rebuild();
        assert_eq!(back, t);
    }
}
