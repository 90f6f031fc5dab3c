//! A hash map whose copies share their entries until one of them changes
//! them: the engine's large tables, so that a copy of the state to encode a
//! checkpoint from costs a few hundred reference counts instead of a deep
//! copy of every node, job and pod (which paused the apply loop as long as
//! encoding did).
//!
//! The entries live in [`SHARDS`] hash maps, each behind an [`Arc`]. A copy
//! shares every shard; a change to a shared shard copies that shard first
//! ([`Arc::make_mut`]), a 1/[`SHARDS`] part of the table. A map nobody
//! shares changes in place, as a plain hash map does.
//!
//! Serialized in key order, byte for byte as [`crate::sorted`] writes a
//! hash map, so a snapshot does not depend on how the entries are spread.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use rustc_hash::{FxBuildHasher, FxHashMap};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::sorted;

/// Shards of a table: a change while a copy is held copies 1/256 of it.
pub(crate) const SHARDS: usize = 256;

/// The shard of a key. Bits 40-47 of its hash: the shard's own table
/// places entries by the low bits and tags them with the top seven, so
/// neither may be constant within a shard.
fn shard_of<Q: Hash + ?Sized>(key: &Q) -> usize {
    ((FxBuildHasher.hash_one(key) >> 40) & (SHARDS as u64 - 1)) as usize
}

/// A hash map of shards shared copy-on-write (see the module).
pub(crate) struct CowMap<K, V> {
    shards: Box<[Arc<FxHashMap<K, V>>]>,
    len: usize,
}

impl<K, V> Default for CowMap<K, V> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Arc::default()).collect(),
            len: 0,
        }
    }
}

impl<K, V> Clone for CowMap<K, V> {
    /// Shares every shard: no entry is copied.
    fn clone(&self) -> Self {
        Self {
            shards: self.shards.clone(),
            len: self.len,
        }
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for CowMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Eq + Hash, V: PartialEq> PartialEq for CowMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

impl<K: Eq + Hash, V: Eq> Eq for CowMap<K, V> {}

impl<K, V> CowMap<K, V> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.shards.iter().flat_map(|s| s.iter())
    }

    /// Every key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.shards.iter().flat_map(|s| s.keys())
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.shards.iter().flat_map(|s| s.values())
    }

    /// The values of part `part` of `parts` (`parts` divides [`SHARDS`]):
    /// over every part, each value once.
    pub fn values_of_part(&self, part: usize, parts: usize) -> impl Iterator<Item = &V> + '_ {
        let per = SHARDS / parts;
        self.shards[part * per..(part + 1) * per]
            .iter()
            .flat_map(|s| s.values())
    }
}

impl<K: Eq + Hash, V> CowMap<K, V> {
    /// The value of `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[shard_of(key)].get(key)
    }

    /// The entry of `key`: the map's own key and its value.
    pub fn get_key_value<Q>(&self, key: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[shard_of(key)].get_key_value(key)
    }

    /// Whether `key` has a value.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[shard_of(key)].contains_key(key)
    }
}

impl<K: Eq + Hash + Clone, V: Clone> CowMap<K, V> {
    /// The shard of `key` to change, copied first if a copy of the map
    /// shares it; `None` when shared and `key` has no value there (nothing
    /// to change, so nothing copied).
    fn shard_to_change<Q>(&mut self, key: &Q) -> Option<&mut FxHashMap<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shard = &mut self.shards[shard_of(key)];
        if Arc::get_mut(shard).is_none() && !shard.contains_key(key) {
            return None;
        }
        Some(Arc::make_mut(shard))
    }

    /// The value of `key`, to change.
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shard_to_change(key)?.get_mut(key)
    }

    /// Sets the value of `key`; returns the value it replaces.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let shard = Arc::make_mut(&mut self.shards[shard_of(&key)]);
        let old = shard.insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Removes `key`; returns its value.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let old = self.shard_to_change(key)?.remove(key);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// Every value, to change (copies every shard a copy shares).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> + '_ {
        self.shards
            .iter_mut()
            .flat_map(|s| Arc::make_mut(s).values_mut())
    }
}

impl<K: Eq + Hash + Borrow<Q>, V, Q: Hash + Eq + ?Sized> std::ops::Index<&Q> for CowMap<K, V> {
    type Output = V;

    /// The value of `key`; panics when it has none, as a hash map does.
    fn index(&self, key: &Q) -> &V {
        self.get(key).expect("key in the map")
    }
}

impl<'a, K, V> IntoIterator for &'a CowMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::FlatMap<
        std::slice::Iter<'a, Arc<FxHashMap<K, V>>>,
        &'a FxHashMap<K, V>,
        fn(&'a Arc<FxHashMap<K, V>>) -> &'a FxHashMap<K, V>,
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.shards.iter().flat_map(|s| &**s)
    }
}

impl<K: Ord + Serialize, V: Serialize> Serialize for CowMap<K, V> {
    /// In key order, as [`crate::sorted`] writes a hash map.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        sorted::serialize_entries(self.iter(), s)
    }
}

impl<K: Eq + Hash + Clone, V: Clone> sorted::Table<K, V> for CowMap<K, V> {
    /// Room for `n` entries spread evenly.
    fn with_capacity(n: usize) -> Self {
        if n == 0 {
            return Self::default();
        }
        let each = n.div_ceil(SHARDS);
        Self {
            shards: (0..SHARDS)
                .map(|_| Arc::new(FxHashMap::with_capacity_and_hasher(each, FxBuildHasher)))
                .collect(),
            len: 0,
        }
    }

    fn put(&mut self, k: K, v: V) {
        self.insert(k, v);
    }
}

impl<'de, K, V> Deserialize<'de> for CowMap<K, V>
where
    K: Eq + Hash + Clone + Deserialize<'de>,
    V: Clone + Deserialize<'de>,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        sorted::deserialize_into(d)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn numbered(n: u32) -> CowMap<String, u32> {
        let mut map = CowMap::default();
        for i in 0..n {
            map.insert(format!("node-{i:05}"), i);
        }
        map
    }

    #[test]
    fn a_copy_keeps_its_entries_while_the_original_changes() {
        let mut map = numbered(5_000);
        let copy = map.clone();
        *map.get_mut("node-00007").expect("held") = 70;
        map.insert("node-99999".to_owned(), 1);
        map.remove("node-00008");
        for v in map.values_mut().take(10) {
            *v += 1_000_000;
        }
        assert_eq!(copy.len(), 5_000);
        assert_eq!(copy, numbered(5_000));
        assert_eq!(map.len(), 5_000);
        assert_eq!(map.get("node-99999"), Some(&1));
        assert!(!map.contains_key("node-00008"));
        assert!(copy.contains_key("node-00008"));
        // A change copies only the shards it touches.
        let unshared = map
            .shards
            .iter()
            .zip(copy.shards.iter())
            .filter(|(a, b)| !Arc::ptr_eq(a, b))
            .count();
        assert!(unshared <= 3 + 10, "{unshared} shards copied");
    }

    #[test]
    fn nothing_to_change_copies_nothing() {
        let mut map = numbered(1_000);
        let copy = map.clone();
        assert!(map.get_mut("absent").is_none());
        assert!(map.remove("absent").is_none());
        assert!(map
            .shards
            .iter()
            .zip(copy.shards.iter())
            .all(|(a, b)| Arc::ptr_eq(a, b)));
    }

    #[test]
    fn writes_the_bytes_of_the_same_entries_in_a_btree_map_and_reads_them_back() {
        let map = numbered(3_000);
        let btree: BTreeMap<String, u32> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let bytes = rmp_serde::to_vec_named(&map).expect("encodes");
        assert_eq!(bytes, rmp_serde::to_vec_named(&btree).expect("encodes"));
        let back: CowMap<String, u32> = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(back, map);
        assert_eq!(back.len(), 3_000);
    }

    #[test]
    fn keys_spread_over_the_shards() {
        let map = numbered(SHARDS as u32 * 64);
        let smallest = map.shards.iter().map(|s| s.len()).min().unwrap_or(0);
        let largest = map.shards.iter().map(|s| s.len()).max().unwrap_or(0);
        assert!(smallest >= 16 && largest <= 160, "{smallest}..{largest}");
    }
}
