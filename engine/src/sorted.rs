//! Serializes hash maps in key order, so that a snapshot (and the state hash
//! taken over it) does not depend on hash-map iteration order.
//!
//! Neither direction builds a second map of the entries: writing sorts a
//! vector of references (16 bytes an entry), reading inserts each entry
//! straight into a table sized once from the map's length. A `BTreeMap` in
//! between held every value twice at the peak of a restore.

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;

use rustc_hash::FxHashMap;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Entries reserved up front at most, whatever length a snapshot claims: a
/// damaged length must not allocate gigabytes before the decoder fails.
/// The table grows past it as entries actually arrive.
const RESERVE_ENTRIES_MAX: usize = 1 << 20;

pub(crate) fn serialize<K, V, S>(map: &FxHashMap<K, V>, s: S) -> Result<S::Ok, S::Error>
where
    K: Ord + Serialize,
    V: Serialize,
    S: Serializer,
{
    serialize_entries(map.iter(), s)
}

/// Writes `entries` as a map in key order.
pub(crate) fn serialize_entries<'a, K, V, S>(
    entries: impl Iterator<Item = (&'a K, &'a V)>,
    s: S,
) -> Result<S::Ok, S::Error>
where
    K: Ord + Serialize + 'a,
    V: Serialize + 'a,
    S: Serializer,
{
    let mut ordered: Vec<(&K, &V)> = entries.collect();
    // Keys are unique, so an unstable sort gives the one order.
    ordered.sort_unstable_by(|a, b| a.0.cmp(b.0));
    s.collect_map(ordered)
}

pub(crate) fn deserialize<'de, K, V, D>(d: D) -> Result<FxHashMap<K, V>, D::Error>
where
    K: Eq + Hash + Deserialize<'de>,
    V: Deserialize<'de>,
    D: Deserializer<'de>,
{
    deserialize_into(d)
}

/// A table a map is read into, entry by entry.
pub(crate) trait Table<K, V> {
    /// An empty table with room for `n` entries.
    fn with_capacity(n: usize) -> Self;
    /// Sets the value of `k`.
    fn put(&mut self, k: K, v: V);
}

impl<K: Eq + Hash, V> Table<K, V> for FxHashMap<K, V> {
    fn with_capacity(n: usize) -> Self {
        FxHashMap::with_capacity_and_hasher(n, Default::default())
    }

    fn put(&mut self, k: K, v: V) {
        self.insert(k, v);
    }
}

/// Reads a map straight into a `T`.
pub(crate) fn deserialize_into<'de, T, K, V, D>(d: D) -> Result<T, D::Error>
where
    T: Table<K, V>,
    K: Deserialize<'de>,
    V: Deserialize<'de>,
    D: Deserializer<'de>,
{
    struct Entries<T, K, V>(PhantomData<(T, K, V)>);

    impl<'de, T, K, V> Visitor<'de> for Entries<T, K, V>
    where
        T: Table<K, V>,
        K: Deserialize<'de>,
        V: Deserialize<'de>,
    {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
            let reserve = access.size_hint().unwrap_or(0).min(RESERVE_ENTRIES_MAX);
            let mut table = T::with_capacity(reserve);
            // A repeated key keeps its last value, as a `BTreeMap` did.
            while let Some((k, v)) = access.next_entry()? {
                table.put(k, v);
            }
            Ok(table)
        }
    }

    d.deserialize_map(Entries(PhantomData))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Hashed(#[serde(with = "super")] FxHashMap<String, u32>);

    #[test]
    fn writes_the_bytes_of_the_same_entries_in_a_btree_map_and_reads_them_back() {
        let entries = [("b", 2), ("a", 1), ("c", 3), ("aa", 4)];
        let hashed: FxHashMap<String, u32> =
            entries.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        let btree: BTreeMap<String, u32> =
            entries.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        let bytes = rmp_serde::to_vec_named(&Hashed(hashed.clone())).expect("encodes");
        assert_eq!(bytes, rmp_serde::to_vec_named(&btree).expect("encodes"));
        let back: Hashed = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(back.0, hashed);
    }
}
