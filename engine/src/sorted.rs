//! Serializes hash maps in key order, so that a snapshot (and the state hash
//! taken over it) does not depend on hash-map iteration order.

use std::collections::BTreeMap;
use std::hash::Hash;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub(crate) fn serialize<K, V, S>(map: &FxHashMap<K, V>, s: S) -> Result<S::Ok, S::Error>
where
    K: Ord + Serialize,
    V: Serialize,
    S: Serializer,
{
    let ordered: BTreeMap<&K, &V> = map.iter().collect();
    ordered.serialize(s)
}

pub(crate) fn deserialize<'de, K, V, D>(d: D) -> Result<FxHashMap<K, V>, D::Error>
where
    K: Ord + Eq + Hash + Deserialize<'de>,
    V: Deserialize<'de>,
    D: Deserializer<'de>,
{
    let ordered: BTreeMap<K, V> = BTreeMap::deserialize(d)?;
    Ok(ordered.into_iter().collect())
}
