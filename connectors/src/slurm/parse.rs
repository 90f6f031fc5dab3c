//! Version-tolerant parsing of slurmrestd's node, job and partition lists
//! into the observation types the reducer reads.
//!
//! One parser covers every openapi version lockstep speaks, by shape rather
//! than by version number:
//!
//! | what | v0.0.38 (Slurm 22.05) | v0.0.39 - v0.0.45 (23.02 - 26.05) |
//! | --- | --- | --- |
//! | node state | `"state": "idle"` + `"state_flags": ["DRAIN"]` | `"state": ["IDLE", "DRAIN"]` |
//! | features | `"a,b"` | `["a", "b"]` |
//! | numbers | `3` | `{"set": true, "infinite": false, "number": 3}` |
//! | job state | `"RUNNING"` | `["RUNNING"]` |
//! | partition nodes | `"nodes": "n[1-4]"` | `"nodes": {"configured": "n[1-4]", ...}` |
//! | errors | `{"error": ..., "errno": ...}` | `{"description": ..., "error_number": ..., "error": ...}` |
//!
//! Values lockstep does not know (a new node state, a new field) are kept
//! (`SlurmBaseState::Other`, ...) or skipped, and logged once; they are never
//! an error. What is an error: JSON that does not parse (truncated,
//! malformed), and objects without what lockstep cannot do without (a node
//! without a name or a state, a job without an id).
//!
//! The parser reads the borrowed JSON once, skips what it does not need
//! without building it, and allocates only the strings that end up in the
//! events: a 10,000-node answer (12 MB on 22.05) parses in a few tens of ms.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Mutex;

use lockstep_schemas::{
    SlurmBaseState, SlurmJob, SlurmJobState, SlurmNode, SlurmNodeFlag, SlurmPartition, Text,
};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::fields;
use super::hostlist;

/// One list as slurmrestd (or `sinfo --json` / `squeue --json`) sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing<T> {
    /// The objects, in slurmrestd's order.
    pub items: Vec<T>,
    /// When the data last changed (`last_update`, v0.0.39+), Unix seconds.
    pub last_update: Option<u64>,
    /// The `errors` slurmrestd listed, as text. A listing with errors may be
    /// incomplete: callers must not take missing objects as gone.
    pub errors: Vec<String>,
}

/// Parses a node list (`GET /slurm/vX/nodes`, `/node/{name}`, `sinfo --json`).
pub fn nodes(body: &[u8]) -> Result<Listing<SlurmNode>, serde_json::Error> {
    listing::<NodeItem>(body)
}

/// Parses a job list (`GET /slurm/vX/jobs`, `/job/{id}`, `squeue --json`).
pub fn jobs(body: &[u8]) -> Result<Listing<SlurmJob>, serde_json::Error> {
    listing::<JobItem>(body)
}

/// Parses a partition list (`GET /slurm/vX/partitions`, `/partition/{name}`).
pub fn partitions(body: &[u8]) -> Result<Listing<SlurmPartition>, serde_json::Error> {
    listing::<PartitionItem>(body)
}

/// Parses only the `errors` of an answer (for error statuses); an answer
/// that is not JSON gives no errors.
pub fn errors(body: &[u8]) -> Vec<String> {
    #[derive(Deserialize)]
    struct Only {
        #[serde(default)]
        errors: ApiErrors,
    }
    serde_json::from_slice::<Only>(body)
        .map(|o| o.errors.0)
        .unwrap_or_default()
}

fn listing<T: Item>(body: &[u8]) -> Result<Listing<T::Out>, serde_json::Error> {
    let r: Response<T> = serde_json::from_slice(body)?;
    let items = match r.items {
        Some(items) => items,
        // An error answer may have no list at all; a success must have one.
        None if !r.errors.is_empty() => Vec::new(),
        None => {
            return Err(de::Error::custom(format_args!(
                "answer has no {:?} list",
                T::KEY
            )))
        }
    };
    Ok(Listing {
        items,
        last_update: r.last_update,
        errors: r.errors,
    })
}

// ------------------------------------------------------------------ logging

/// Values already reported, by kind; bounded so that a stream of random
/// values cannot grow memory.
static SEEN: Mutex<BTreeMap<&'static str, BTreeSet<String>>> = Mutex::new(BTreeMap::new());
const SEEN_MAX: usize = 512;

/// Logs a value this version of lockstep does not know, once per value.
pub(crate) fn note_unknown(kind: &'static str, value: &str) {
    let Ok(mut seen) = SEEN.lock() else { return };
    let set = seen.entry(kind).or_default();
    if set.contains(value) || set.len() >= SEEN_MAX {
        return;
    }
    set.insert(value.to_owned());
    if kind.ends_with("field") {
        tracing::info!(
            kind,
            value,
            "slurm sent a field this version of lockstep does not know; skipped"
        );
    } else {
        tracing::warn!(
            kind,
            value,
            "slurm sent a value this version of lockstep does not know; kept as is"
        );
    }
}

// ------------------------------------------------------------------ states

fn base_state(s: &str) -> Option<SlurmBaseState> {
    let b = SlurmBaseState::parse(s);
    b.is_known().then_some(b)
}

/// Base state and sorted flags from Slurm's state words: v0.0.38's `state`
/// plus `state_flags`, v0.0.39+'s `state` array, scontrol's `IDLE+DRAIN`
/// split at `+`. Case does not matter. The first known base state is the
/// base; if there is none, the first word is kept as an unknown base.
/// Returns `None` if there are no words at all.
pub(crate) fn node_state<'a>(
    words: impl IntoIterator<Item = &'a str>,
) -> Option<(SlurmBaseState, Vec<SlurmNodeFlag>)> {
    let words: Vec<String> = words
        .into_iter()
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_uppercase)
        .collect();
    let first = words.first()?;
    let (base_at, base) = match words
        .iter()
        .enumerate()
        .find_map(|(i, w)| base_state(w).map(|b| (i, b)))
    {
        Some(found) => found,
        None => {
            note_unknown("node state", first);
            (0, SlurmBaseState::Other(first.clone()))
        }
    };
    let mut flags: Vec<SlurmNodeFlag> = words
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != base_at)
        .map(|(_, w)| {
            let f = SlurmNodeFlag::parse(w);
            if !f.is_known() {
                note_unknown("node state flag", w);
            }
            f
        })
        .collect();
    flags.sort();
    flags.dedup();
    Some((base, flags))
}

/// A job's state from Slurm's state words (v0.0.38 / scontrol: one word,
/// v0.0.39+: base state plus flags).
///
/// Slurm 22.05 names a job by its flag when one is set (`job_state_string`:
/// `COMPLETING`, `CONFIGURING`, ...), hiding the base state; the flags are
/// mapped to the base state they imply: `CONFIGURING`, `RESIZING`,
/// `SIGNALING`, `STOPPED` and `POWER_UP_NODE` occur only on jobs that hold
/// their nodes (RUNNING), the requeue holds on jobs that wait (PENDING).
/// `COMPLETING` wins over any base state: the job still holds its nodes.
pub(crate) fn job_state<'a>(words: impl IntoIterator<Item = &'a str>) -> Option<SlurmJobState> {
    let words: Vec<String> = words
        .into_iter()
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_uppercase)
        .collect();
    let first = words.first()?;
    if words.iter().any(|w| w == "COMPLETING") {
        return Some(SlurmJobState::Completing);
    }
    if let Some(s) = words
        .iter()
        .map(|w| SlurmJobState::parse(w))
        .find(SlurmJobState::is_known)
    {
        return Some(s);
    }
    for w in &words {
        match w.as_str() {
            "CONFIGURING" | "RESIZING" | "SIGNALING" | "STOPPED" | "POWER_UP_NODE" => {
                return Some(SlurmJobState::Running)
            }
            "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "SPECIAL_EXIT" | "RESV_DEL_HOLD" => {
                return Some(SlurmJobState::Pending)
            }
            _ => {}
        }
    }
    note_unknown("job state", first);
    Some(SlurmJobState::Other(first.clone()))
}

/// A comma list into sorted, deduplicated, non-empty items. Slurm's
/// placeholders for "nothing" (`(null)`) give nothing.
pub(crate) fn csv_sorted(s: &str) -> Vec<Text> {
    let mut v: Vec<Text> = s
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty() && *x != "(null)")
        .map(Text::from)
        .collect();
    v.sort();
    v.dedup();
    v
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty() && s != "(null)")
}

/// The pending reason the reducer reads: only for pending jobs, and not
/// Slurm's "None".
pub(crate) fn pending_reason(state: &SlurmJobState, reason: Option<String>) -> Option<String> {
    if *state != SlurmJobState::Pending {
        return None;
    }
    non_empty(reason).filter(|r| r != "None")
}

/// The first partition of a job's (comma separated) partition list.
pub(crate) fn first_partition(s: &str) -> Text {
    s.split(',').next().unwrap_or("").trim().into()
}

// ------------------------------------------------------------------ response

trait Item: for<'de> Deserialize<'de> {
    const KEY: &'static str;
    type Out;
    /// The object, its node lists expanded within what is left of the
    /// listing's budget.
    fn into_out(self, budget: &mut hostlist::Budget) -> Result<Self::Out, String>;
}

struct Response<T: Item> {
    items: Option<Vec<T::Out>>,
    last_update: Option<u64>,
    errors: Vec<String>,
}

enum TopField {
    List,
    Errors,
    LastUpdate,
    Other,
}

struct TopKey(&'static str);

impl<'de> DeserializeSeed<'de> for TopKey {
    type Value = TopField;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<TopField, D::Error> {
        struct V(&'static str);
        impl Visitor<'_> for V {
            type Value = TopField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<TopField, E> {
                Ok(match v {
                    _ if v == self.0 => TopField::List,
                    "errors" => TopField::Errors,
                    "last_update" => TopField::LastUpdate,
                    _ => TopField::Other,
                })
            }
        }
        d.deserialize_str(V(self.0))
    }
}

/// The list itself, converting items as they are read.
struct ListSeed<T>(PhantomData<T>);

impl<'de, T: Item> DeserializeSeed<'de> for ListSeed<T> {
    type Value = Option<Vec<T::Out>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Item> Visitor<'de> for V<T> {
            type Value = Option<Vec<T::Out>>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a list of {}", T::KEY)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(100_000));
                let mut budget = hostlist::Budget::default();
                while let Some(item) = seq.next_element::<T>()? {
                    v.push(item.into_out(&mut budget).map_err(de::Error::custom)?);
                }
                Ok(Some(v))
            }
        }
        d.deserialize_any(V::<T>(PhantomData))
    }
}

impl<'de, T: Item> Deserialize<'de> for Response<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Item> Visitor<'de> for V<T> {
            type Value = Response<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a slurmrestd answer with a {:?} list", T::KEY)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Response<T>, A::Error> {
                let mut r = Response::<T> {
                    items: None,
                    last_update: None,
                    errors: Vec::new(),
                };
                while let Some(k) = map.next_key_seed(TopKey(T::KEY))? {
                    match k {
                        TopField::List => {
                            r.items = map.next_value_seed(ListSeed::<T>(PhantomData))?
                        }
                        TopField::Errors => r.errors = map.next_value::<ApiErrors>()?.0,
                        TopField::LastUpdate => r.last_update = map.next_value::<NoVal>()?.0,
                        TopField::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(r)
            }
        }
        d.deserialize_map(V::<T>(PhantomData))
    }
}

// ------------------------------------------------------------------ values

/// A string, a list of strings, or null.
struct Strings(Vec<String>);

impl<'de> Deserialize<'de> for Strings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Strings;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Strings, E> {
                Ok(Strings(vec![v.to_owned()]))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Strings, E> {
                Ok(Strings(Vec::new()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strings, A::Error> {
                let mut v = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    v.push(s);
                }
                Ok(Strings(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// A comma list (`"a,b"`, v0.0.38) or a list (`["a", "b"]`, v0.0.39+), or
/// null; sorted and deduplicated.
struct Csv(Vec<Text>);

impl<'de> Deserialize<'de> for Csv {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Strings(v) = Strings::deserialize(d)?;
        let mut out: Vec<Text> = Vec::with_capacity(v.len());
        for s in &v {
            if s.contains(',') {
                out.extend(csv_sorted(s));
            } else if !s.trim().is_empty() && s != "(null)" {
                out.push(s.trim().into());
            }
        }
        out.sort();
        out.dedup();
        Ok(Csv(out))
    }
}

/// A string or null.
struct OptStr(Option<String>);

impl<'de> Deserialize<'de> for OptStr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(OptStr(Option::<String>::deserialize(d)?))
    }
}

/// A number: plain (v0.0.38) or Slurm's `{set, infinite, number}` (v0.0.39+).
/// Unset, infinite, negative and null give `None`.
struct NoVal(Option<u64>);

impl<'de> Deserialize<'de> for NoVal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NoVal;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number or {set, infinite, number}")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<NoVal, E> {
                Ok(NoVal(Some(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<NoVal, E> {
                Ok(NoVal(u64::try_from(v).ok()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<NoVal, E> {
                // Integral floats only; anything else is not a count.
                Ok(NoVal(
                    (v >= 0.0 && v.fract() == 0.0 && v < 1.8e19).then_some(v as u64),
                ))
            }
            fn visit_unit<E: de::Error>(self) -> Result<NoVal, E> {
                Ok(NoVal(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NoVal, A::Error> {
                let (mut set, mut infinite, mut number) = (true, false, None);
                while let Some(k) = map.next_key::<String>()? {
                    match k.as_str() {
                        "set" => set = map.next_value()?,
                        "infinite" => infinite = map.next_value()?,
                        "number" => number = map.next_value::<NoVal>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(NoVal(number.filter(|_| set && !infinite)))
            }
        }
        d.deserialize_any(V)
    }
}

/// slurmrestd's `errors`: v0.0.38 `{"error": "...", "errno": -1}`, v0.0.39+
/// `{"description", "error_number", "error", "source"}`; plain strings too.
#[derive(Default)]
struct ApiErrors(Vec<String>);

impl<'de> Deserialize<'de> for ApiErrors {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct One(String);
        impl<'de> Deserialize<'de> for One {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = One;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("an error object or string")
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<One, E> {
                        Ok(One(v.to_owned()))
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<One, A::Error> {
                        let (mut error, mut description, mut number) = (None, None, None);
                        while let Some(k) = map.next_key::<String>()? {
                            match k.as_str() {
                                "error" => error = map.next_value::<OptStr>()?.0,
                                "description" => description = map.next_value::<OptStr>()?.0,
                                "errno" | "error_number" | "error_code" => {
                                    number = map.next_value::<Option<i64>>()?;
                                }
                                _ => {
                                    map.next_value::<IgnoredAny>()?;
                                }
                            }
                        }
                        let mut s = [non_empty(description), non_empty(error)]
                            .into_iter()
                            .flatten()
                            .collect::<Vec<_>>()
                            .join(": ");
                        if s.is_empty() {
                            s = "unspecified error".to_owned();
                        }
                        if let Some(n) = number {
                            s.push_str(&format!(" (error {n})"));
                        }
                        Ok(One(s))
                    }
                }
                d.deserialize_any(V)
            }
        }
        let v = Option::<Vec<One>>::deserialize(d)?.unwrap_or_default();
        Ok(ApiErrors(v.into_iter().map(|o| o.0).collect()))
    }
}

/// A partition's nodes: a hostlist string (v0.0.38) or an object whose
/// `configured` is one (v0.0.39+).
struct PartitionNodes(Option<String>);

impl<'de> Deserialize<'de> for PartitionNodes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PartitionNodes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a hostlist or {configured: hostlist}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PartitionNodes, E> {
                Ok(PartitionNodes(Some(v.to_owned())))
            }
            fn visit_unit<E: de::Error>(self) -> Result<PartitionNodes, E> {
                Ok(PartitionNodes(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PartitionNodes, A::Error> {
                let mut configured = None;
                while let Some(k) = map.next_key::<String>()? {
                    if k == "configured" {
                        configured = map.next_value::<OptStr>()?.0;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(PartitionNodes(configured))
            }
        }
        d.deserialize_any(V)
    }
}

// ------------------------------------------------------------------ objects

/// The objects whose fields the parsers read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlurmObject {
    /// A node (`nodes`).
    Node,
    /// A job (`jobs`).
    Job,
    /// A partition (`partitions`).
    Partition,
}

/// The JSON shapes the parser accepts for a field it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldShape {
    /// A string, or null.
    Text,
    /// A string (one word, or a comma list), a list of strings, or null:
    /// states, flags, features, partitions.
    Words,
    /// An integer, or Slurm's `{set, infinite, number}` (unset and infinite
    /// read as absent).
    Count,
    /// A hostlist string, or an object whose `configured` is one.
    PartitionNodes,
}

/// The fields of `object` the parsers read, with the shapes they accept.
/// Every other field slurmrestd sends must be in [`field_ignored`]; the
/// fixture and OpenAPI cross-check tests hold both lists to that.
pub fn fields_read(object: SlurmObject) -> &'static [(&'static str, FieldShape)] {
    match object {
        SlurmObject::Node => NodeField::READ,
        SlurmObject::Job => JobField::READ,
        SlurmObject::Partition => PartitionField::READ,
    }
}

/// Whether `name` is a field of `object` that lockstep knows and
/// deliberately does not read.
pub fn field_ignored(object: SlurmObject, name: &str) -> bool {
    match object {
        SlurmObject::Node => fields::node_field_known(name),
        SlurmObject::Job => fields::job_field_known(name),
        SlurmObject::Partition => fields::partition_field_known(name),
    }
}

/// Generates a field-name enum whose visitor matches borrowed keys and logs
/// (once) keys that are neither read nor known.
macro_rules! fields {
    ($name:ident, $kind:literal, $known:path { $($variant:ident => $key:literal as $shape:ident,)+ }) => {
        enum $name {
            $($variant,)+
            Skip,
        }
        impl $name {
            const READ: &'static [(&'static str, FieldShape)] = &[$(($key, FieldShape::$shape),)+];
        }
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl Visitor<'_> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a field name")
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<$name, E> {
                        Ok(match v {
                            $($key => $name::$variant,)+
                            other => {
                                if !$known(other) {
                                    note_unknown($kind, other);
                                }
                                $name::Skip
                            }
                        })
                    }
                }
                d.deserialize_str(V)
            }
        }
    };
}

fields!(NodeField, "node field", fields::node_field_known {
    Name => "name" as Text,
    State => "state" as Words,
    StateFlags => "state_flags" as Words,
    Reason => "reason" as Text,
    ReasonUser => "reason_set_by_user" as Text,
    Features => "features" as Words,
    ActiveFeatures => "active_features" as Words,
    Partitions => "partitions" as Words,
    Topology => "topology" as Text,
});

fields!(JobField, "job field", fields::job_field_known {
    JobId => "job_id" as Count,
    State => "job_state" as Words,
    Partition => "partition" as Text,
    Nodes => "nodes" as Text,
    NodeCount => "node_count" as Count,
    Reason => "state_reason" as Text,
});

fields!(PartitionField, "partition field", fields::partition_field_known {
    Name => "name" as Text,
    Nodes => "nodes" as PartitionNodes,
});

struct NodeItem(SlurmNode);

impl Item for NodeItem {
    const KEY: &'static str = "nodes";
    type Out = SlurmNode;
    fn into_out(self, _: &mut hostlist::Budget) -> Result<SlurmNode, String> {
        Ok(self.0)
    }
}

impl<'de> Deserialize<'de> for NodeItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NodeItem;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a slurm node object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NodeItem, A::Error> {
                let mut name = None;
                let mut state = Vec::new();
                let mut state_flags = Vec::new();
                let mut reason = None;
                let mut reason_user = None;
                let mut features = None;
                let mut active_features = None;
                let mut partitions = Vec::new();
                let mut topology = None;
                while let Some(k) = map.next_key::<NodeField>()? {
                    match k {
                        NodeField::Name => name = map.next_value::<OptStr>()?.0,
                        NodeField::State => state = map.next_value::<Strings>()?.0,
                        NodeField::StateFlags => state_flags = map.next_value::<Strings>()?.0,
                        NodeField::Reason => reason = map.next_value::<OptStr>()?.0,
                        NodeField::ReasonUser => reason_user = map.next_value::<OptStr>()?.0,
                        NodeField::Features => features = Some(map.next_value::<Csv>()?.0),
                        NodeField::ActiveFeatures => {
                            active_features = Some(map.next_value::<Csv>()?.0);
                        }
                        NodeField::Partitions => partitions = map.next_value::<Csv>()?.0,
                        NodeField::Topology => topology = map.next_value::<OptStr>()?.0,
                        NodeField::Skip => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let name =
                    non_empty(name).ok_or_else(|| de::Error::custom("node without a name"))?;
                let (state, flags) = node_state(
                    state
                        .iter()
                        .map(String::as_str)
                        .chain(state_flags.iter().map(String::as_str)),
                )
                .ok_or_else(|| de::Error::custom(format_args!("node {name} has no state")))?;
                let reason = non_empty(reason);
                let reason_user = if reason.is_some() {
                    non_empty(reason_user)
                } else {
                    None
                };
                Ok(NodeItem(SlurmNode {
                    name: name.into(),
                    state,
                    flags,
                    reason,
                    reason_user,
                    // Active features are what jobs can use; without a node
                    // features plugin they equal the available ones.
                    features: active_features.or(features).unwrap_or_default(),
                    topology: non_empty(topology).map(Text::from),
                    partitions,
                    version: 0,
                }))
            }
        }
        d.deserialize_map(V)
    }
}

/// A job, and its node list still compressed.
struct JobItem(SlurmJob, Option<String>);

impl Item for JobItem {
    const KEY: &'static str = "jobs";
    type Out = SlurmJob;
    fn into_out(self, budget: &mut hostlist::Budget) -> Result<SlurmJob, String> {
        let Self(mut job, nodes) = self;
        job.nodes = hostlist::expand_set_within(nodes.as_deref().unwrap_or(""), budget)
            .map_err(|e| format!("job {}: {e}", job.job_id))?
            .into_iter()
            .map(Text::from)
            .collect();
        Ok(job)
    }
}

impl<'de> Deserialize<'de> for JobItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = JobItem;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a slurm job object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JobItem, A::Error> {
                let mut job_id = None;
                let mut state = Vec::new();
                let mut partition = None;
                let mut nodes = None;
                let mut node_count = None;
                let mut reason = None;
                while let Some(k) = map.next_key::<JobField>()? {
                    match k {
                        JobField::JobId => job_id = map.next_value::<NoVal>()?.0,
                        JobField::State => state = map.next_value::<Strings>()?.0,
                        JobField::Partition => partition = map.next_value::<OptStr>()?.0,
                        JobField::Nodes => nodes = map.next_value::<OptStr>()?.0,
                        JobField::NodeCount => node_count = map.next_value::<NoVal>()?.0,
                        JobField::Reason => reason = map.next_value::<OptStr>()?.0,
                        JobField::Skip => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let job_id = job_id.ok_or_else(|| de::Error::custom("job without a job_id"))?;
                let state = job_state(state.iter().map(String::as_str))
                    .ok_or_else(|| de::Error::custom(format_args!("job {job_id} has no state")))?;
                Ok(JobItem(
                    SlurmJob {
                        job_id,
                        partition: first_partition(partition.as_deref().unwrap_or("")),
                        nodes: Vec::new(),
                        node_count: node_count.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
                        pending_reason: pending_reason(&state, reason),
                        state,
                        version: 0,
                    },
                    nodes,
                ))
            }
        }
        d.deserialize_map(V)
    }
}

/// A partition, and its node list still compressed.
struct PartitionItem(SlurmPartition, Option<String>);

impl Item for PartitionItem {
    const KEY: &'static str = "partitions";
    type Out = SlurmPartition;
    fn into_out(self, budget: &mut hostlist::Budget) -> Result<SlurmPartition, String> {
        let Self(mut partition, nodes) = self;
        partition.nodes = hostlist::expand_set_within(nodes.as_deref().unwrap_or(""), budget)
            .map_err(|e| format!("partition {}: {e}", partition.name))?;
        Ok(partition)
    }
}

impl<'de> Deserialize<'de> for PartitionItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PartitionItem;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a slurm partition object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PartitionItem, A::Error> {
                let mut name = None;
                let mut nodes = None;
                while let Some(k) = map.next_key::<PartitionField>()? {
                    match k {
                        PartitionField::Name => name = map.next_value::<OptStr>()?.0,
                        PartitionField::Nodes => nodes = map.next_value::<PartitionNodes>()?.0,
                        PartitionField::Skip => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let name =
                    non_empty(name).ok_or_else(|| de::Error::custom("partition without a name"))?;
                Ok(PartitionItem(
                    SlurmPartition {
                        name,
                        nodes: Vec::new(),
                        version: 0,
                    },
                    nodes,
                ))
            }
        }
        d.deserialize_map(V)
    }
}
