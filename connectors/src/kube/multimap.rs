//! A map from a key to a set of values, with no empty sets: the indexes
//! the observer keeps beside what it watches (a node's ResourceSlices, a
//! pod's Evictions).

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

/// Adds `value` to the set of `key` (`add`), or removes it, dropping the
/// set once empty.
pub(crate) fn link<K, V>(map: &mut HashMap<K, BTreeSet<V>>, key: &K, value: &V, add: bool)
where
    K: Hash + Eq + Clone,
    V: Ord + Clone,
{
    if add {
        map.entry(key.clone()).or_default().insert(value.clone());
    } else if let Some(set) = map.get_mut(key) {
        set.remove(value);
        if set.is_empty() {
            map.remove(key);
        }
    }
}
