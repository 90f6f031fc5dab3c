//! Failing schedules kept as incidents: `incidents/world/<name>.json` (the
//! schedule, the properties it broke and its story) and `<name>.jsonl`
//! (the log it produced, as `lockstep replay` reads it). A test runs every
//! saved schedule again and asserts the properties. Stories that fail
//! until a fix lands wait under `incidents/world-pending/` ([`pending_dir`]).
//!
//! It owns the file format; it never decides whether a schedule fails.

use std::path::{Path, PathBuf};

use lockstep_schemas::log::{Format, LogWriter};
use serde::{Deserialize, Serialize};

use super::check::Violation;
use super::schedule::Schedule;
use super::World;

/// Errors of reading or writing saved schedules.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// Which file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A saved schedule does not parse.
    #[error("{path}: not a saved world schedule: {source}")]
    Parse {
        /// Which file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A saved failing schedule.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Saved {
    /// File stem.
    pub name: String,
    /// The violations when it was saved.
    pub violations: Vec<Violation>,
    /// The schedule in words.
    pub story: String,
    /// The schedule.
    pub schedule: Schedule,
}

/// `replay-tests/incidents/world`.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("incidents")
        .join("world")
}

/// `replay-tests/incidents/world-pending`: failing schedules whose fix has
/// not landed yet. The saved-schedule test does not run them; the random
/// test takes a schedule that breaks a property the way one of them does
/// for that known story, not a new one. Once the fix lands they move to
/// [`dir`].
pub fn pending_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("incidents")
        .join("world-pending")
}

/// A stable name for a schedule: the first broken property and a hash of
/// the schedule.
pub fn name_of(schedule: &Schedule, violations: &[Violation]) -> String {
    let json = serde_json::to_vec(schedule).expect("schedules serialize");
    // FNV-1a: stable across builds, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in json {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let property = violations.first().map_or("passing", |v| v.property.name());
    format!("{}-{:08x}", property.replace('_', "-"), h as u32)
}

/// Saves a failing schedule and the log its world wrote under `dir`;
/// returns the path of the schedule file.
pub fn save(
    dir: &Path,
    schedule: &Schedule,
    violations: &[Violation],
    world: &World,
) -> Result<PathBuf> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let name = name_of(schedule, violations);
    let saved = Saved {
        name: name.clone(),
        violations: violations.to_vec(),
        story: schedule.story(),
        schedule: schedule.clone(),
    };
    let path = dir.join(format!("{name}.json"));
    let mut text = serde_json::to_string_pretty(&saved).expect("saved schedules serialize");
    text.push('\n');
    std::fs::write(&path, text).map_err(io(&path))?;
    let log = dir.join(format!("{name}.jsonl"));
    let mut w =
        LogWriter::new(Vec::new(), Format::JsonLines, "lockstep world model").map_err(io(&log))?;
    for r in &world.ls.records {
        w.write(r).map_err(io(&log))?;
    }
    let bytes = w.finish().map_err(io(&log))?;
    std::fs::write(&log, bytes).map_err(io(&log))?;
    Ok(path)
}

/// Every saved schedule under `dir`, by name.
pub fn load_all(dir: &Path) -> Result<Vec<Saved>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(source) => {
            return Err(Error::Io {
                path: dir.to_owned(),
                source,
            })
        }
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let saved: Saved =
            serde_json::from_str(&text).map_err(|source| Error::Parse { path, source })?;
        out.push(saved);
    }
    Ok(out)
}
