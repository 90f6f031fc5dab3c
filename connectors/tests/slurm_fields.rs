//! Every field of every node, job and partition in the answers recorded from
//! the real Slurm servers of `deploy/local/slurm` (22.05: v0.0.38; 24.11:
//! v0.0.40 - v0.0.42; 26.05: v0.0.42 - v0.0.45; `record-fixtures.sh`) is
//! accounted for: either the parser reads it, or `fields.rs` lists it as
//! known and deliberately not read. A Slurm release that adds a field fails
//! here until someone decides which it is. No server needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use lockstep_connectors::slurm::parse::{self, SlurmObject};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("slurm/fixtures")
}

/// Every `.json` file below `dir`.
fn json_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            json_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "json") {
            out.push(p);
        }
    }
}

/// The openapi version a recorded file answers: its directory (`v0.0.42`),
/// or v0.0.38 for the 22.05 files.
fn api_of(file: &Path) -> String {
    let dir = file
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy();
    if dir.starts_with("v0.0.") {
        dir.into_owned()
    } else {
        "v0.0.38".to_owned()
    }
}

const OBJECTS: [(&str, SlurmObject); 3] = [
    ("nodes", SlurmObject::Node),
    ("jobs", SlurmObject::Job),
    ("partitions", SlurmObject::Partition),
];

#[test]
fn every_field_of_the_recorded_answers_is_read_or_deliberately_ignored() {
    let mut files = Vec::new();
    for release in ["slurm-22.05", "slurm-24.11", "slurm-26.05"] {
        json_files(&fixtures().join(release), &mut files);
    }
    // (object, field) -> where it was seen, for the fields nobody decided on.
    let mut unaccounted: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    // api -> objects seen, so a missing recording fails too.
    let mut seen: BTreeMap<String, BTreeMap<&str, usize>> = BTreeMap::new();
    for file in &files {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(file).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (key, object) in OBJECTS {
            let Some(list) = v.get(key).and_then(|l| l.as_array()) else {
                continue;
            };
            for item in list {
                let Some(fields) = item.as_object() else {
                    panic!("{}: a {key} entry is not an object", file.display());
                };
                *seen
                    .entry(api_of(file))
                    .or_default()
                    .entry(key)
                    .or_default() += 1;
                for field in fields.keys() {
                    let read = parse::fields_read(object).iter().any(|(f, _)| f == field);
                    if !read && !parse::field_ignored(object, field) {
                        unaccounted
                            .entry((key.to_owned(), field.clone()))
                            .or_default()
                            .insert(file.strip_prefix(fixtures()).unwrap().display().to_string());
                    }
                }
            }
        }
    }
    assert!(
        unaccounted.is_empty(),
        "fields neither read nor listed in connectors/src/slurm/fields.rs:\n{}",
        unaccounted
            .iter()
            .map(|((o, f), w)| format!("  {o}.{f} (in {})", w.iter().next().unwrap()))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Every version the servers answer, with nodes, jobs and partitions.
    let apis: Vec<&str> = seen.keys().map(String::as_str).collect();
    assert_eq!(
        apis,
        ["v0.0.38", "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"]
    );
    for (api, objects) in &seen {
        for (key, _) in OBJECTS {
            assert!(
                objects.get(key).copied().unwrap_or(0) > 0,
                "no {key} recorded for {api}"
            );
        }
    }
}

#[test]
fn every_recorded_list_parses_with_every_object() {
    let mut files = Vec::new();
    for release in ["slurm-22.05", "slurm-24.11", "slurm-26.05"] {
        json_files(&fixtures().join(release), &mut files);
    }
    let mut parsed = 0;
    for file in &files {
        let body = std::fs::read(file).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let count = |k: &str| v.get(k).and_then(|l| l.as_array()).map(Vec::len);
        let name = file.display();
        if let Some(n) = count("nodes") {
            let l = parse::nodes(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(l.items.len(), n, "{name}");
            parsed += 1;
        }
        if let Some(n) = count("jobs") {
            let l = parse::jobs(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(l.items.len(), n, "{name}");
            parsed += 1;
        }
        if let Some(n) = count("partitions") {
            let l = parse::partitions(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(l.items.len(), n, "{name}");
            parsed += 1;
        }
    }
    assert!(parsed > 100, "only {parsed} lists found");
}
