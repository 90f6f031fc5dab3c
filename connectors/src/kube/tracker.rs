//! Deduplication and relist bookkeeping for one watched kind of object.
//!
//! Pure: no I/O, no clock. The observer feeds it the watcher's steps, already
//! reduced to observations, and it returns the events to append.
//!
//! Two rules:
//!
//! - Outside a listing, an object is emitted only when its observation
//!   differs from the last one emitted (its version aside), so a status
//!   heartbeat that changes nothing lockstep reads appends nothing.
//! - A listing (`Init` .. `InitDone`, at start and after every `410 Gone`
//!   or other desync) is emitted whole between `SyncStarted` and `SyncDone`,
//!   unchanged objects included: the reducer treats every object of the
//!   domain not listed in between as gone. Objects known before the listing
//!   and not listed in it get an explicit `*Gone` event before `SyncDone`,
//!   so a delete that happened while the watch was down is in the log as a
//!   delete, not only as an absence.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use lockstep_schemas::{Domain, Event};

/// One step of a watcher, with objects reduced to (key, observation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step<K, O> {
    /// A listing starts (kube-runtime `Init`).
    Init,
    /// An object of the listing (`InitApply`).
    Listed(K, O),
    /// The listing is complete (`InitDone`).
    InitDone,
    /// An object was added or changed (`Apply`).
    Applied(K, O),
    /// An object was deleted (`Delete`), with its version at deletion.
    Deleted(K, u64),
}

/// How a tracker turns its keys and observations into events.
pub(crate) trait Kind {
    /// Object key.
    type Key: Clone + Eq + Hash + Ord;
    /// Reduced observation.
    type Obs: Clone + PartialEq;
    /// The domain of the `SyncStarted` / `SyncDone` markers.
    const DOMAIN: Domain;
    /// The event for an observation.
    fn event(obs: &Self::Obs) -> Event;
    /// The event for a deleted object and its version at deletion (0: the
    /// deletion is inferred from a listing).
    fn gone(key: &Self::Key, version: u64) -> Event;
    /// Whether two observations say the same (versions aside).
    fn same(a: &Self::Obs, b: &Self::Obs) -> bool {
        a == b
    }
}

#[derive(Debug)]
enum Listing<K> {
    /// Not listing.
    Idle,
    /// `Init` seen; `SyncStarted` is held back until the first object or
    /// `InitDone`, so a list that fails before it starts (the API server is
    /// down and the watcher retries) appends nothing.
    Pending,
    /// `SyncStarted` emitted; the keys listed so far.
    Active(HashSet<K>),
}

/// Last emitted observation per object, and the listing in progress.
#[derive(Debug)]
pub(crate) struct Tracker<T: Kind> {
    known: HashMap<T::Key, T::Obs>,
    listing: Listing<T::Key>,
    /// Whether this tracker emits the domain's sync markers. Off when several
    /// trackers share one domain (several scale target kinds): their listings
    /// would overlap and each would declare the others' objects gone. Their
    /// deletes still arrive as explicit `*Gone` events.
    sync_markers: bool,
}

impl<T: Kind> Tracker<T> {
    /// A tracker that knows nothing yet.
    pub(crate) fn new(sync_markers: bool) -> Self {
        Self {
            known: HashMap::new(),
            listing: Listing::Idle,
            sync_markers,
        }
    }

    /// Number of objects known.
    pub(crate) fn len(&self) -> usize {
        self.known.len()
    }

    /// Applies one step; pushes the events to append onto `out`.
    pub(crate) fn step(&mut self, step: Step<T::Key, T::Obs>, out: &mut Vec<Event>) {
        match step {
            Step::Init => self.listing = Listing::Pending,
            Step::Listed(key, obs) => {
                self.start_listing(out);
                if let Listing::Active(listed) = &mut self.listing {
                    listed.insert(key.clone());
                }
                out.push(T::event(&obs));
                self.known.insert(key, obs);
            }
            Step::InitDone => {
                self.start_listing(out);
                let Listing::Active(listed) = std::mem::replace(&mut self.listing, Listing::Idle)
                else {
                    unreachable!("start_listing leaves an active listing");
                };
                let mut gone: Vec<T::Key> = self
                    .known
                    .keys()
                    .filter(|k| !listed.contains(*k))
                    .cloned()
                    .collect();
                gone.sort();
                for key in gone {
                    self.known.remove(&key);
                    out.push(T::gone(&key, 0));
                }
                if self.sync_markers {
                    out.push(Event::SyncDone { domain: T::DOMAIN });
                }
            }
            Step::Applied(key, obs) => {
                if !self.known.get(&key).is_some_and(|k| T::same(k, &obs)) {
                    out.push(T::event(&obs));
                    self.known.insert(key, obs);
                }
            }
            Step::Deleted(key, version) => {
                if self.known.remove(&key).is_some() {
                    out.push(T::gone(&key, version));
                }
            }
        }
    }

    fn start_listing(&mut self, out: &mut Vec<Event>) {
        if matches!(self.listing, Listing::Active(_)) {
            return;
        }
        // `Idle` here means a watcher that sent objects of a listing without
        // `Init`; treat it as the start of one rather than lose the markers.
        self.listing = Listing::Active(HashSet::new());
        if self.sync_markers {
            out.push(Event::SyncStarted { domain: T::DOMAIN });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy kind: key a letter, observation a number.
    struct Toy;
    impl Kind for Toy {
        type Key = char;
        type Obs = u32;
        const DOMAIN: Domain = Domain::KubeNodes;
        fn event(obs: &u32) -> Event {
            Event::KubeNodeGone {
                name: format!("obs {obs}"),
                version: 0,
            }
        }
        fn gone(key: &char, version: u64) -> Event {
            Event::KubeNodeGone {
                name: format!("gone {key}"),
                version,
            }
        }
    }

    fn show(e: &Event) -> String {
        match e {
            Event::SyncStarted { .. } => "[".to_owned(),
            Event::SyncDone { .. } => "]".to_owned(),
            Event::KubeNodeGone { name, version: 0 } => name.clone(),
            Event::KubeNodeGone { name, version } => format!("{name}@{version}"),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn run(tracker: &mut Tracker<Toy>, steps: Vec<Step<char, u32>>) -> Vec<String> {
        let mut out = Vec::new();
        for s in steps {
            tracker.step(s, &mut out);
        }
        out.iter().map(show).collect()
    }

    use Step::{Applied, Deleted, Init, InitDone, Listed};

    #[test]
    fn scenarios() {
        // (steps, events), one scenario a line, each from a fresh tracker.
        type Case = (Vec<Step<char, u32>>, Vec<&'static str>);
        let cases: Vec<Case> = vec![
            // First listing: every object between the markers.
            (
                vec![Init, Listed('a', 1), Listed('b', 2), InitDone],
                vec!["[", "obs 1", "obs 2", "]"],
            ),
            // Empty listing still has both markers.
            (vec![Init, InitDone], vec!["[", "]"]),
            // A failed list (Init, error, Init again) appends nothing extra.
            (
                vec![Init, Init, Init, Listed('a', 1), InitDone],
                vec!["[", "obs 1", "]"],
            ),
            // An unchanged apply is dropped; a changed one is emitted.
            (
                vec![
                    Init,
                    Listed('a', 1),
                    InitDone,
                    Applied('a', 1),
                    Applied('a', 2),
                ],
                vec!["[", "obs 1", "]", "obs 2"],
            ),
            // Deletes: known -> gone; unknown -> nothing.
            (
                vec![
                    Init,
                    Listed('a', 1),
                    InitDone,
                    Deleted('a', 7),
                    Deleted('a', 8),
                    Deleted('z', 9),
                ],
                vec!["[", "obs 1", "]", "gone a@7"],
            ),
            // Relist: unchanged objects are re-emitted, the missing get Gone
            // (sorted) before SyncDone.
            (
                vec![
                    Init,
                    Listed('a', 1),
                    Listed('b', 2),
                    Listed('c', 3),
                    InitDone,
                    Init,
                    Listed('b', 2),
                    InitDone,
                ],
                vec![
                    "[", "obs 1", "obs 2", "obs 3", "]", "[", "obs 2", "gone a", "gone c", "]",
                ],
            ),
            // A listing restarted midway starts over.
            (
                vec![Init, Listed('a', 1), Init, Listed('b', 2), InitDone],
                vec!["[", "obs 1", "[", "obs 2", "gone a", "]"],
            ),
            // An apply for an object created after a delete is emitted again.
            (
                vec![
                    Init,
                    Listed('a', 1),
                    InitDone,
                    Deleted('a', 0),
                    Applied('a', 1),
                ],
                vec!["[", "obs 1", "]", "gone a", "obs 1"],
            ),
        ];
        for (i, (steps, want)) in cases.into_iter().enumerate() {
            let mut t = Tracker::<Toy>::new(true);
            assert_eq!(run(&mut t, steps), want, "case {i}");
        }
    }

    #[test]
    fn without_sync_markers_deletes_are_still_explicit() {
        let mut t = Tracker::<Toy>::new(false);
        let got = run(
            &mut t,
            vec![
                Init,
                Listed('a', 1),
                Listed('b', 1),
                InitDone,
                Init,
                Listed('b', 1),
                InitDone,
            ],
        );
        assert_eq!(got, vec!["obs 1", "obs 1", "obs 1", "gone a"]);
        assert_eq!(t.len(), 1);
    }
}
