//! Log files: round trips in both encodings, and a clear, positioned error
//! for every kind of bad input, with every record before it still handed out.

use lockstep_schemas::log::{read_all, DecodeError, Format, LogReader, LogWriter, Position};
use lockstep_schemas::{
    ConditionStatus, Envelope, Event, EventRecord, KubeNode, Record, SlurmBaseState, SlurmNode,
    SlurmNodeFlag, Source,
};

fn slurm_node(name: &str, state: &str) -> Event {
    Event::SlurmNode(SlurmNode {
        name: name.into(),
        state: SlurmBaseState::parse(state),
        flags: vec![SlurmNodeFlag::Drain],
        reason: Some("lockstep: test".into()),
        reason_user: Some("root".into()),
        features: vec!["gpu".into()],
        topology: None,
        partitions: vec!["batch".into()],
        version: 0,
    })
}

fn records() -> Vec<Record> {
    let events = [
        slurm_node("n1", "IDLE"),
        Event::KubeNode(KubeNode {
            read_labels: None,
            maintenance: None,
            name: "k1".into(),
            unschedulable: true,
            ready: ConditionStatus::Unknown,
            conditions: vec![],
            labels: [("topology.kubernetes.io/zone".to_owned(), "a".to_owned())].into(),
            taints: vec![],
            identity: Default::default(),
            devices: Default::default(),
            version: 0,
        }),
        Event::Tick,
        slurm_node("n2", "SOME_FUTURE_STATE"),
    ];
    events
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let seq = i as u64 + 1;
            Record::Event(EventRecord {
                seq,
                time_ms: 1_000 * seq,
                envelope: Envelope::new(Source::Test, 1_000 * seq, e),
            })
        })
        .collect()
}

fn encode(format: Format, recs: &[Record]) -> Vec<u8> {
    let mut w = LogWriter::new(Vec::new(), format, "test").unwrap();
    for r in recs {
        w.write(r).unwrap();
    }
    w.finish().unwrap()
}

fn decode(bytes: &[u8]) -> (Vec<Record>, Option<DecodeError>) {
    let (mut recs, err) = read_all(LogReader::detect(bytes).unwrap());
    assert!(matches!(recs.first(), Some(Record::Header(_))) || recs.is_empty());
    if !recs.is_empty() {
        recs.remove(0);
    }
    (recs, err)
}

#[test]
fn both_encodings_round_trip_and_keep_unknown_states() {
    for format in [Format::JsonLines, Format::MessagePack] {
        let (got, err) = decode(&encode(format, &records()));
        assert!(err.is_none(), "{format:?}: {err:?}");
        assert_eq!(got, records(), "{format:?}");
        let Record::Event(last) = &got[3] else {
            panic!()
        };
        let Event::SlurmNode(n) = &last.envelope.event else {
            panic!()
        };
        assert_eq!(n.state, SlurmBaseState::Other("SOME_FUTURE_STATE".into()));
        assert!(last.envelope.id_matches());
    }
}

#[test]
fn the_content_id_changes_with_the_content_and_only_with_it() {
    let a = Envelope::new(Source::Slurm, 5, slurm_node("n1", "IDLE"));
    let b = Envelope::new(Source::Slurm, 5, slurm_node("n1", "IDLE"));
    let c = Envelope::new(Source::Slurm, 6, slurm_node("n1", "IDLE"));
    let d = Envelope::new(Source::Slurm, 5, slurm_node("n1", "MIXED"));
    assert_eq!(a.id, b.id);
    assert_ne!(
        a.id, c.id,
        "a new observation of the same state is a new event"
    );
    assert_ne!(a.id, d.id);
    assert_eq!(a.id.0.len(), 32);
}

fn jsonl_lines() -> Vec<String> {
    String::from_utf8(encode(Format::JsonLines, &records()))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn decode_lines(lines: &[String]) -> (Vec<Record>, Option<DecodeError>) {
    decode(lines.join("\n").as_bytes())
}

#[test]
fn a_truncated_json_lines_file_names_the_line_and_keeps_what_came_before() {
    let mut lines = jsonl_lines();
    let last = lines.pop().unwrap();
    lines.push(last[..last.len() / 2].to_owned());
    let (got, err) = decode_lines(&lines);
    assert_eq!(got.len(), 3);
    let err = err.unwrap();
    assert!(
        matches!(
            err,
            DecodeError::Truncated {
                pos: Position::Line(5)
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "line 5: truncated record (the file ends inside it)"
    );
}

#[test]
fn a_truncated_messagepack_file_names_the_byte_offset() {
    let full = encode(Format::MessagePack, &records());
    let cut = &full[..full.len() - 7];
    let (got, err) = decode(cut);
    assert_eq!(got.len(), 3);
    match err.unwrap() {
        DecodeError::Truncated {
            pos: Position::Offset(off),
        } => {
            let upto3 = encode(Format::MessagePack, &records()[..3]).len() as u64;
            assert_eq!(off, upto3, "the offset of the record that was cut");
        }
        other => panic!("{other}"),
    }
}

fn edit_line(line: usize, f: impl FnOnce(&mut serde_json::Value)) -> Vec<String> {
    let mut lines = jsonl_lines();
    let mut v: serde_json::Value = serde_json::from_str(&lines[line - 1]).unwrap();
    f(&mut v);
    lines[line - 1] = v.to_string();
    lines
}

#[test]
fn a_newer_schema_version_is_named() {
    let lines = edit_line(3, |v| v["event"]["envelope"]["v"] = 7.into());
    let (got, err) = decode_lines(&lines);
    assert_eq!(got.len(), 1);
    let err = err.unwrap();
    assert!(matches!(
        err,
        DecodeError::UnknownSchemaVersion {
            found: 7,
            pos: Position::Line(3)
        }
    ));
    assert!(err.to_string().contains("upgrade lockstep"), "{err}");
}

#[test]
fn a_newer_schema_version_with_an_unknown_event_is_still_a_version_error() {
    let lines = edit_line(3, |v| {
        v["event"]["envelope"]["v"] = 2.into();
        v["event"]["envelope"]["event"] = serde_json::json!({"gpu_fell_off_the_bus": {}});
    });
    let err = decode_lines(&lines).1.unwrap();
    assert!(
        matches!(err, DecodeError::UnknownSchemaVersion { found: 2, .. }),
        "{err}"
    );
}

#[test]
fn an_unknown_event_kind_is_named() {
    let lines = edit_line(2, |v| {
        v["event"]["envelope"]["event"] =
            serde_json::json!({"gpu_fell_off_the_bus": {"node": "n1"}});
    });
    let (got, err) = decode_lines(&lines);
    assert!(got.is_empty());
    let err = err.unwrap();
    assert_eq!(
        err.to_string(),
        "line 2: unknown event kind `gpu_fell_off_the_bus`"
    );
}

#[test]
fn malformed_json_is_named_with_the_decoder_message() {
    let mut lines = jsonl_lines();
    lines[2] = "{\"event\": nonsense}".into();
    let err = decode_lines(&lines).1.unwrap();
    assert!(
        matches!(
            err,
            DecodeError::Malformed {
                pos: Position::Line(3),
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_wrong_field_type_is_malformed_not_a_crash() {
    let lines = edit_line(2, |v| {
        v["event"]["envelope"]["event"]["slurm_node"]["flags"] = 42.into()
    });
    let err = decode_lines(&lines).1.unwrap();
    assert!(
        matches!(
            err,
            DecodeError::Malformed {
                pos: Position::Line(2),
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn an_altered_record_fails_its_content_id() {
    let lines = edit_line(2, |v| {
        v["event"]["envelope"]["event"]["slurm_node"]["reason"] = "edited".into();
    });
    let err = decode_lines(&lines).1.unwrap();
    assert!(
        matches!(err, DecodeError::IdMismatch { seq: 1, .. }),
        "{err}"
    );
}

#[test]
fn sequence_numbers_must_go_up() {
    let lines = edit_line(3, |v| v["event"]["seq"] = 1.into());
    let err = decode_lines(&lines).1.unwrap();
    assert_eq!(err.to_string(), "line 3: event seq 1 does not follow seq 1");
}

#[test]
fn a_file_without_a_header_is_not_a_log() {
    let mut lines = jsonl_lines();
    lines.remove(0);
    let err = decode_lines(&lines).1.unwrap();
    assert!(
        matches!(
            err,
            DecodeError::NotALog {
                pos: Position::Line(1)
            }
        ),
        "{err}"
    );
    let err = decode(b"").1.unwrap();
    assert!(matches!(err, DecodeError::NotALog { .. }));
    let err = decode(b"\x93\x01\x02\x03").1.unwrap();
    assert!(
        matches!(
            err,
            DecodeError::Malformed {
                pos: Position::Offset(0),
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn blank_lines_are_skipped_and_counted() {
    let mut lines = jsonl_lines();
    lines.insert(2, String::new());
    let lines = {
        let mut l = lines;
        let bad = l.len() - 1;
        l[bad] = "{".into();
        l
    };
    let err = decode_lines(&lines).1.unwrap();
    assert_eq!(err.position(), Some(Position::Line(6)));
}

/// A policy rollback as `lockstep policy rollback` appends it.
fn rollback(seq: u64) -> Record {
    let detail = lockstep_schemas::SourceDetail {
        file: String::new(),
        by: "ops@host".into(),
        rollback_to_seq: 3,
    };
    Record::Event(EventRecord {
        seq,
        time_ms: 1_000 * seq,
        envelope: Envelope::with_detail(
            Source::Lockstep,
            1_000 * seq,
            Event::PolicyChanged(Box::default()),
            detail,
        ),
    })
}

#[test]
fn a_source_detail_is_covered_by_the_id_and_absent_when_empty() {
    let plain = Envelope::new(Source::Lockstep, 7, Event::PolicyChanged(Box::default()));
    let empty = Envelope::with_detail(
        Source::Lockstep,
        7,
        Event::PolicyChanged(Box::default()),
        lockstep_schemas::SourceDetail::default(),
    );
    assert_eq!(plain, empty, "an empty detail is no detail: ids stay");
    let json = serde_json::to_value(&plain).unwrap();
    assert!(json.get("detail").is_none(), "{json}");

    let mut recs = records();
    recs.push(rollback(5));
    for format in [Format::JsonLines, Format::MessagePack] {
        let (got, err) = decode(&encode(format, &recs));
        assert!(err.is_none(), "{format:?}: {err:?}");
        assert_eq!(got, recs, "{format:?}");
    }
    let Record::Event(rb) = rollback(5) else {
        unreachable!()
    };
    assert_ne!(rb.envelope.id, plain.id);
    assert!(rb.envelope.id_matches());

    // Altering the detail, or dropping it, is caught like any other edit.
    for edit in [
        (|v: &mut serde_json::Value| {
            v["event"]["envelope"]["detail"]["rollback_to_seq"] = 2.into();
        }) as fn(&mut serde_json::Value),
        |v| {
            v["event"]["envelope"]
                .as_object_mut()
                .unwrap()
                .remove("detail");
        },
    ] {
        let mut lines: Vec<String> = String::from_utf8(encode(Format::JsonLines, &recs))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        let mut v: serde_json::Value = serde_json::from_str(&lines[5]).unwrap();
        edit(&mut v);
        lines[5] = v.to_string();
        let err = decode_lines(&lines).1.unwrap();
        assert!(
            matches!(err, DecodeError::IdMismatch { seq: 5, .. }),
            "{err}"
        );
    }
}
