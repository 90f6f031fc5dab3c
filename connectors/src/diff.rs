//! What each object looked like when last emitted, and what changed since:
//! the one diff both connectors use (the Slurm poller between two polls,
//! the Kubernetes trackers between watch events).
//!
//! Pure: no I/O, no clock. Two rules, the same on both sides:
//!
//! - An object is emitted when its observation differs from the last one
//!   emitted, versions aside (or always, inside a full listing, whose
//!   objects the reducer must all see).
//! - A listing marks every object it sees; at its end, the objects it did
//!   not see are gone, and leave in key order.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

use lockstep_schemas::{
    Domain, Event, KubeNode, KubePod, KubeScaleTarget, ScaleTargetRef, SlurmJob, SlurmNode,
    SlurmPartition,
};

/// An observation that connectors diff: how it is keyed, compared and
/// turned into events.
pub(crate) trait Observed: Clone + std::fmt::Debug {
    /// Object key.
    type Key: Clone + Eq + Hash + Ord + std::fmt::Debug;
    /// The domain of the objects (of the `SyncStarted` / `SyncDone`
    /// markers around their listings).
    const DOMAIN: Domain;
    /// The event that carries this observation.
    fn event(&self) -> Event;
    /// The event for a deleted object and its version at deletion.
    fn gone(key: &Self::Key, version: u64) -> Event;
    /// Whether two observations say the same, versions aside.
    fn same(&self, other: &Self) -> bool;
    /// The observation's own version (resourceVersion, poll generation).
    fn version(&self) -> u64;
}

#[derive(Debug)]
struct Seen<O> {
    obs: O,
    /// The listing that last saw it.
    listing: u64,
}

impl<O: Observed> Seen<O> {
    /// Seen again by `listing`: the event when `obs` is to be emitted.
    fn update(&mut self, obs: O, always: bool, listing: u64) -> Option<Event> {
        self.listing = listing;
        if always || !self.obs.same(&obs) {
            let event = obs.event();
            self.obs = obs;
            return Some(event);
        }
        None
    }
}

/// The last emitted observation per object.
#[derive(Debug)]
pub(crate) struct Known<O: Observed> {
    objects: HashMap<O::Key, Seen<O>>,
    /// Listings started so far (marks what each one saw).
    listing: u64,
}

impl<O: Observed> Default for Known<O> {
    fn default() -> Self {
        Self {
            objects: HashMap::new(),
            listing: 0,
        }
    }
}

impl<O: Observed> Known<O> {
    /// Number of objects known.
    pub(crate) fn len(&self) -> usize {
        self.objects.len()
    }

    /// The last observation emitted of `key`.
    pub(crate) fn get(&self, key: &O::Key) -> Option<&O> {
        self.objects.get(key).map(|s| &s.obs)
    }

    /// Every object known, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&O::Key, &O)> {
        self.objects.iter().map(|(k, s)| (k, &s.obs))
    }

    /// A listing starts: objects not observed from now until
    /// [`Known::end_listing`] are gone.
    pub(crate) fn start_listing(&mut self) {
        self.listing += 1;
    }

    /// Records `obs` for `key` and returns its event when it is to be
    /// emitted: it differs from what was emitted last, or `always`.
    pub(crate) fn observe(&mut self, key: O::Key, obs: O, always: bool) -> Option<Event> {
        let listing = self.listing;
        match self.objects.get_mut(&key) {
            Some(seen) => seen.update(obs, always, listing),
            None => {
                let event = obs.event();
                self.objects.insert(key, Seen { obs, listing });
                Some(event)
            }
        }
    }

    /// [`Known::observe`] for an observation that holds its key: an
    /// unchanged object costs a lookup and a comparison (its key is not
    /// even cloned).
    pub(crate) fn observe_keyed<Q>(
        &mut self,
        obs: O,
        key_of: impl Fn(&O) -> &Q,
        always: bool,
    ) -> Option<Event>
    where
        O::Key: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = O::Key>,
    {
        let listing = self.listing;
        match self.objects.get_mut(key_of(&obs)) {
            Some(seen) => seen.update(obs, always, listing),
            None => {
                let event = obs.event();
                let key = key_of(&obs).to_owned();
                self.objects.insert(key, Seen { obs, listing });
                Some(event)
            }
        }
    }

    /// Forgets `key`; whether it was known.
    pub(crate) fn remove<Q>(&mut self, key: &Q) -> bool
    where
        O::Key: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        self.objects.remove(key).is_some()
    }

    /// The listing is complete: forgets the objects it did not see and
    /// returns their keys, sorted.
    pub(crate) fn end_listing(&mut self) -> Vec<O::Key> {
        let listing = self.listing;
        let mut gone: Vec<O::Key> = self
            .objects
            .iter()
            .filter(|(_, s)| s.listing != listing)
            .map(|(k, _)| k.clone())
            .collect();
        gone.sort();
        for k in &gone {
            self.objects.remove(k);
        }
        gone
    }

    /// Forgets every object and returns their keys, sorted (what a watch
    /// that is given up leaves behind).
    pub(crate) fn clear(&mut self) -> Vec<O::Key> {
        let mut gone: Vec<O::Key> = self.objects.drain().map(|(k, _)| k).collect();
        gone.sort();
        gone
    }
}

impl Observed for SlurmNode {
    type Key = String;
    const DOMAIN: Domain = Domain::SlurmNodes;
    fn event(&self) -> Event {
        Event::SlurmNode(self.clone())
    }
    fn gone(name: &String, version: u64) -> Event {
        Event::SlurmNodeGone {
            name: name.clone(),
            version,
        }
    }
    fn same(&self, other: &Self) -> bool {
        self.same_but_version(other)
    }
    fn version(&self) -> u64 {
        self.version
    }
}

impl Observed for SlurmJob {
    type Key = u64;
    const DOMAIN: Domain = Domain::SlurmJobs;
    fn event(&self) -> Event {
        Event::SlurmJob(self.clone())
    }
    fn gone(job_id: &u64, version: u64) -> Event {
        Event::SlurmJobGone {
            job_id: *job_id,
            version,
        }
    }
    fn same(&self, other: &Self) -> bool {
        self.same_but_version(other)
    }
    fn version(&self) -> u64 {
        self.version
    }
}

impl Observed for SlurmPartition {
    type Key = String;
    const DOMAIN: Domain = Domain::SlurmPartitions;
    fn event(&self) -> Event {
        Event::SlurmPartition(self.clone())
    }
    fn gone(name: &String, version: u64) -> Event {
        Event::SlurmPartitionGone {
            name: name.clone(),
            version,
        }
    }
    fn same(&self, other: &Self) -> bool {
        self.same_but_version(other)
    }
    fn version(&self) -> u64 {
        self.version
    }
}

impl Observed for KubeNode {
    type Key = String;
    const DOMAIN: Domain = Domain::KubeNodes;
    fn event(&self) -> Event {
        Event::KubeNode(self.clone())
    }
    fn gone(name: &String, version: u64) -> Event {
        Event::KubeNodeGone {
            name: name.clone(),
            version,
        }
    }
    fn same(&self, other: &Self) -> bool {
        self.same_but_version(other)
    }
    fn version(&self) -> u64 {
        self.version
    }
}

impl Observed for KubePod {
    type Key = (String, String);
    const DOMAIN: Domain = Domain::KubePods;
    fn event(&self) -> Event {
        Event::KubePod(self.clone())
    }
    fn gone((namespace, name): &(String, String), version: u64) -> Event {
        Event::KubePodGone {
            namespace: namespace.clone(),
            name: name.clone(),
            version,
        }
    }
    fn same(&self, other: &Self) -> bool {
        self.same_but_version(other)
    }
    fn version(&self) -> u64 {
        self.version
    }
}

impl Observed for KubeScaleTarget {
    type Key = ScaleTargetRef;
    const DOMAIN: Domain = Domain::KubeScaleTargets;
    fn event(&self) -> Event {
        Event::KubeScaleTarget(self.clone())
    }
    fn gone(target: &ScaleTargetRef, version: u64) -> Event {
        Event::KubeScaleTargetGone {
            target: target.clone(),
            version,
        }
    }
    fn same(&self, other: &Self) -> bool {
        self.same_but_version(other)
    }
    fn version(&self) -> u64 {
        self.version
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy observation: key a letter, value a number, version the tens.
    #[derive(Debug, Clone, PartialEq)]
    struct Toy(u32);
    impl Observed for Toy {
        type Key = char;
        const DOMAIN: Domain = Domain::KubeNodes;
        fn event(&self) -> Event {
            Event::Tick
        }
        fn gone(_: &char, _: u64) -> Event {
            Event::Tick
        }
        fn same(&self, other: &Self) -> bool {
            self.0 % 10 == other.0 % 10
        }
        fn version(&self) -> u64 {
            u64::from(self.0 / 10)
        }
    }

    #[test]
    fn emits_changes_and_lists_the_unseen_as_gone() {
        let mut k = Known::<Toy>::default();
        let value =
            |k: &Known<Toy>, key: char| k.iter().find(|(c, _)| **c == key).map(|(_, t)| t.0);
        // (key, value, always) -> emitted, and the value kept.
        k.start_listing();
        assert!(k.observe('a', Toy(1), true).is_some(), "new");
        assert!(k.observe('b', Toy(2), true).is_some(), "new");
        assert_eq!(k.end_listing(), Vec::<char>::new());
        assert!(k.observe('a', Toy(11), false).is_none(), "same but version");
        assert_eq!(value(&k, 'a'), Some(1), "the last emitted is kept");
        assert!(k.observe('a', Toy(3), false).is_some(), "changed");
        assert!(k.observe('a', Toy(13), true).is_some(), "listed again");
        assert_eq!(value(&k, 'a'), Some(13));
        k.start_listing();
        assert!(k.observe('c', Toy(4), true).is_some());
        assert!(k.observe('b', Toy(2), false).is_none(), "seen, unchanged");
        assert_eq!(k.end_listing(), vec!['a']);
        assert!(k.remove(&'b'));
        assert!(!k.remove(&'b'));
        assert_eq!(k.len(), 1);
        assert_eq!(k.clear(), vec!['c']);
        assert_eq!(k.iter().count(), 0);
    }

    #[test]
    fn keyed_observations_are_looked_up_by_their_own_key() {
        #[derive(Debug, Clone)]
        struct Named(String, u32);
        impl Observed for Named {
            type Key = String;
            const DOMAIN: Domain = Domain::SlurmNodes;
            fn event(&self) -> Event {
                Event::Tick
            }
            fn gone(_: &String, _: u64) -> Event {
                Event::Tick
            }
            fn same(&self, other: &Self) -> bool {
                self.1 == other.1
            }
            fn version(&self) -> u64 {
                0
            }
        }
        let mut k = Known::<Named>::default();
        fn name(n: &Named) -> &str {
            &n.0
        }
        k.start_listing();
        assert!(k
            .observe_keyed(Named("n1".into(), 1), name, false)
            .is_some());
        assert!(k
            .observe_keyed(Named("n1".into(), 1), name, false)
            .is_none());
        assert!(k
            .observe_keyed(Named("n1".into(), 2), name, false)
            .is_some());
        assert!(k.observe_keyed(Named("n1".into(), 2), name, true).is_some());
        assert_eq!(k.end_listing(), Vec::<String>::new());
    }
}
