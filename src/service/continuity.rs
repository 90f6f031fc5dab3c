//! The log never silently goes back: what the store applied, checked
//! against the log the service reads.
//!
//! The store keeps the last record it committed ([`LogPosition`]: the log's
//! id, the sequence, the envelope id). When the service starts, after every
//! read that does not continue where the last one ended, and whenever it
//! looks at the log's head, it compares:
//!
//! | seen                                                   | what it is          | lockstep          |
//! |--------------------------------------------------------|---------------------|-------------------|
//! | another log id                                         | a stream deleted and created again, an embedded log replaced | stops ([`Break::Recreated`]) |
//! | the log's last sequence below the one applied          | the log went back (an unsynced write lost, a backup restored) | stops ([`Break::WentBack`]) |
//! | another record at the sequence applied last            | it went back and grew again | stops ([`Break::Rewritten`]) |
//! | a sequence missing after one applied, with later ones held | a hole (a record deleted, a purge of a range) | stops ([`Break::Hole`]) |
//! | the log's first record past the next one to apply, and no snapshot covers what was discarded | retention discarded records this replica never applied | stops ([`Break::Uncovered`]) |
//!
//! Stopping is for good, until an operator recovers (docs: operations,
//! alerts, LockstepLogBroken): the records applied no longer say what the
//! log says, and whatever the engine decided from them may be wrong both
//! ways; no record is skipped and nothing is acted on. A replica whose next
//! record retention discarded starts from the newest snapshot the log
//! continues (`open::bootstrap`), so it meets [`Break::Uncovered`] only when
//! no snapshot is recent enough; restarted once one is, it goes on.

use std::fmt;

use anyhow::Result;
use lockstep_schemas::EventRecord;
use lockstep_store::{EventLog, LogPosition, LogState};

/// Why the service stopped folding the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Break {
    /// The log is not the one the store folded.
    Recreated { bound: String, found: String },
    /// The log ends before the last record applied.
    WentBack { applied: u64, last: u64 },
    /// The log holds another record at the sequence applied last.
    Rewritten { seq: u64 },
    /// Records missing between ones the log holds.
    Hole { from: u64, to: u64 },
    /// Records retention discarded before this replica applied them, and
    /// no snapshot to start after them.
    Uncovered {
        from: u64,
        to: u64,
        newest_snapshot: Option<u64>,
    },
}

impl Break {
    /// The metric's label.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::Recreated { .. } => "recreated",
            Self::WentBack { .. } => "went_back",
            Self::Rewritten { .. } => "rewritten",
            Self::Hole { .. } => "hole",
            Self::Uncovered { .. } => "uncovered",
        }
    }
}

impl fmt::Display for Break {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Recreated { bound, found } => write!(
                f,
                "the event log was created anew: the store folded log {bound}, the log is {found} (a stream deleted and created again, or an embedded log replaced)"
            ),
            Self::WentBack { applied, last } => write!(
                f,
                "the event log went back: its last record is seq {last}, lockstep applied up to seq {applied} (writes lost before they were synced, or the log restored from an older backup)"
            ),
            Self::Rewritten { seq } => write!(
                f,
                "the event log went back and grew again: seq {seq}, which lockstep applied, now holds another record"
            ),
            Self::Hole { from, to } if from == to => write!(
                f,
                "the event log has a hole: seq {from} is missing between records it holds"
            ),
            Self::Hole { from, to } => write!(
                f,
                "the event log has a hole: seqs {from}..={to} are missing between records it holds"
            ),
            Self::Uncovered {
                from,
                to,
                newest_snapshot,
            } => {
                write!(
                    f,
                    "records {from}..={to} were discarded by the event log's retention before this replica applied them, and no snapshot starts after them ("
                )?;
                match newest_snapshot {
                    Some(seq) => write!(f, "the newest is at seq {seq})"),
                    None => write!(f, "none is kept)"),
                }
            }
        }
    }
}

/// Where a store's last record stands in the log, when the service starts.
pub(crate) async fn at_start(
    log: &EventLog,
    position: Option<&LogPosition>,
    state: &LogState,
) -> Result<Option<Break>> {
    let Some(p) = position else {
        return Ok(None);
    };
    if let Some(b) = against_state(&p.log_id, p.seq, state) {
        return Ok(Some(b));
    }
    if p.seq < state.first_seq {
        // Discarded by retention since: nothing to compare.
        return Ok(None);
    }
    Ok(match log.envelope_id_at(p.seq).await? {
        Some(id) if id == p.envelope_id => None,
        Some(_) => Some(Break::Rewritten { seq: p.seq }),
        None => Some(Break::Hole {
            from: p.seq,
            to: p.seq,
        }),
    })
}

/// What the log's state says of the one folded as `bound` up to `applied`.
pub(crate) fn against_state(bound: &str, applied: u64, state: &LogState) -> Option<Break> {
    if bound != state.id {
        return Some(Break::Recreated {
            bound: bound.to_owned(),
            found: state.id.clone(),
        });
    }
    (state.last_seq < applied).then_some(Break::WentBack {
        applied,
        last: state.last_seq,
    })
}

/// How many records of `batch` (read from `next`) follow each other without
/// a gap, and the first sequences missing, if any.
pub(crate) fn contiguous(next: u64, batch: &[EventRecord]) -> (usize, Option<(u64, u64)>) {
    let mut want = next;
    for (i, rec) in batch.iter().enumerate() {
        if rec.seq > want {
            return (i, Some((want, rec.seq - 1)));
        }
        want = want.max(rec.seq + 1);
    }
    (batch.len(), None)
}

/// What the missing `from..=to` is, given the log's state: the front that
/// retention discarded (the newest snapshot does not start after it, or
/// this replica would have started from it), or a hole.
pub(crate) fn gap(from: u64, to: u64, state: &LogState, newest_snapshot: Option<u64>) -> Break {
    if state.first_seq > to {
        Break::Uncovered {
            from,
            to,
            newest_snapshot,
        }
    } else {
        Break::Hole { from, to }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_schemas::{Envelope, Event, Source};

    fn rec(seq: u64) -> EventRecord {
        EventRecord {
            seq,
            time_ms: seq,
            envelope: Envelope::new(Source::Lockstep, seq, Event::Tick),
        }
    }

    fn state(id: &str, first_seq: u64, last_seq: u64) -> LogState {
        LogState {
            id: id.to_owned(),
            first_seq,
            last_seq,
            bytes: 0,
        }
    }

    #[test]
    fn a_batch_that_continues_has_no_gap() {
        let batch: Vec<_> = (5..9).map(rec).collect();
        assert_eq!(contiguous(5, &batch), (4, None));
        // Records below `next` (read again) are no gap either.
        assert_eq!(contiguous(6, &batch), (4, None));
        assert_eq!(contiguous(5, &[]), (0, None));
    }

    #[test]
    fn a_gap_is_found_at_the_start_or_inside_a_batch() {
        let batch = vec![rec(7), rec(8), rec(11)];
        assert_eq!(contiguous(5, &batch), (0, Some((5, 6))));
        assert_eq!(contiguous(7, &batch), (2, Some((9, 10))));
    }

    #[test]
    fn retention_is_told_from_a_hole_by_the_first_record_held() {
        assert_eq!(
            gap(5, 6, &state("a", 7, 20), Some(3)),
            Break::Uncovered {
                from: 5,
                to: 6,
                newest_snapshot: Some(3)
            }
        );
        assert_eq!(
            gap(9, 10, &state("a", 1, 20), Some(3)),
            Break::Hole { from: 9, to: 10 }
        );
    }

    #[test]
    fn another_log_or_a_shorter_one_is_a_break() {
        assert_eq!(against_state("a", 3, &state("a", 1, 3)), None);
        assert_eq!(against_state("a", 3, &state("a", 1, 9)), None);
        assert_eq!(
            against_state("a", 3, &state("a", 1, 1)),
            Some(Break::WentBack {
                applied: 3,
                last: 1
            })
        );
        let b = against_state("a", 3, &state("b", 1, 9)).unwrap();
        assert_eq!(b.reason(), "recreated");
        assert!(b.to_string().contains("created anew"), "{b}");
    }
}
