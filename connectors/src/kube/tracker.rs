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

use lockstep_schemas::Event;

use crate::diff::{Known, Observed};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listing {
    /// Not listing.
    Idle,
    /// `Init` seen; `SyncStarted` is held back until the first object or
    /// `InitDone`, so a list that fails before it starts (the API server is
    /// down and the watcher retries) appends nothing.
    Pending,
    /// `SyncStarted` emitted; objects not listed before `InitDone` are gone.
    Active,
}

/// Last emitted observation per object, and the listing in progress.
#[derive(Debug)]
pub(crate) struct Tracker<O: Observed> {
    known: Known<O>,
    listing: Listing,
    /// Whether this tracker emits the domain's sync markers. Off when several
    /// trackers share one domain (several scale target kinds): their listings
    /// would overlap and each would declare the others' objects gone. Their
    /// deletes still arrive as explicit `*Gone` events.
    sync_markers: bool,
}

impl<O: Observed> Tracker<O> {
    /// A tracker that knows nothing yet.
    pub(crate) fn new(sync_markers: bool) -> Self {
        Self {
            known: Known::default(),
            listing: Listing::Idle,
            sync_markers,
        }
    }

    /// Number of objects known.
    pub(crate) fn len(&self) -> usize {
        self.known.len()
    }

    /// The last observation emitted of `key`.
    pub(crate) fn get(&self, key: &O::Key) -> Option<&O> {
        self.known.get(key)
    }

    /// Applies one step; pushes the events to append onto `out`.
    pub(crate) fn step(&mut self, step: Step<O::Key, O>, out: &mut Vec<Event>) {
        match step {
            Step::Init => self.listing = Listing::Pending,
            Step::Listed(key, obs) => {
                self.start_listing(out);
                out.extend(self.known.observe(key, obs, true));
            }
            Step::InitDone => {
                self.start_listing(out);
                self.listing = Listing::Idle;
                for key in self.known.end_listing() {
                    out.push(O::gone(&key, 0));
                }
                if self.sync_markers {
                    out.push(Event::SyncDone { domain: O::DOMAIN });
                }
            }
            Step::Applied(key, obs) => out.extend(self.known.observe(key, obs, false)),
            Step::Deleted(key, version) => {
                if self.known.remove(&key) {
                    out.push(O::gone(&key, version));
                }
            }
        }
    }

    /// Whether it emits the domain's sync markers from the next listing on.
    pub(crate) fn set_sync_markers(&mut self, on: bool) {
        self.sync_markers = on;
    }

    /// The watch is given up for good (no longer wanted): every object it
    /// reported is gone.
    pub(crate) fn forget_all(&mut self, out: &mut Vec<Event>) {
        self.listing = Listing::Idle;
        for key in self.known.clear() {
            out.push(O::gone(&key, 0));
        }
    }

    fn start_listing(&mut self, out: &mut Vec<Event>) {
        if self.listing == Listing::Active {
            return;
        }
        // `Idle` here means a watcher that sent objects of a listing without
        // `Init`; treat it as the start of one rather than lose the markers.
        self.listing = Listing::Active;
        self.known.start_listing();
        if self.sync_markers {
            out.push(Event::SyncStarted { domain: O::DOMAIN });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use lockstep_schemas::Domain;

    /// A toy observation: keyed by a letter, a number.
    impl Observed for u32 {
        type Key = char;
        const DOMAIN: Domain = Domain::KubeNodes;
        fn event(&self) -> Event {
            Event::KubeNodeGone {
                name: format!("obs {self}"),
                version: 0,
            }
        }
        fn gone(key: &char, version: u64) -> Event {
            Event::KubeNodeGone {
                name: format!("gone {key}"),
                version,
            }
        }
        fn same(&self, other: &Self) -> bool {
            self == other
        }
        fn version(&self) -> u64 {
            0
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

    fn run(tracker: &mut Tracker<u32>, steps: Vec<Step<char, u32>>) -> Vec<String> {
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
            let mut t = Tracker::<u32>::new(true);
            assert_eq!(run(&mut t, steps), want, "case {i}");
        }
    }

    #[test]
    fn without_sync_markers_deletes_are_still_explicit() {
        let mut t = Tracker::<u32>::new(false);
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

    #[test]
    fn a_watch_given_up_leaves_its_objects_gone() {
        let mut t = Tracker::<u32>::new(true);
        let got = run(&mut t, vec![Init, Listed('b', 2), Listed('a', 1), InitDone]);
        assert_eq!(got, vec!["[", "obs 2", "obs 1", "]"]);
        let mut out = Vec::new();
        t.forget_all(&mut out);
        assert_eq!(
            out.iter().map(show).collect::<Vec<_>>(),
            vec!["gone a", "gone b"]
        );
        assert_eq!(t.len(), 0);
    }
}
