//! The checked-in JSON Schema files and the policy document.

use std::path::PathBuf;

use lockstep_schemas::{Policy, PolicyError};

#[test]
fn checked_in_json_schemas_are_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("json");
    let bless = std::env::var_os("LOCKSTEP_BLESS").is_some_and(|v| v == "1");
    for (name, text) in lockstep_schemas::schema::documents() {
        let path = dir.join(name);
        if bless {
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == text,
            "{} is stale: regenerate with LOCKSTEP_BLESS=1 cargo test -p lockstep-schemas --test documents",
            path.display()
        );
    }
}

#[test]
fn the_default_policy_round_trips_and_an_empty_document_is_the_default() {
    let text = serde_json::to_string_pretty(&Policy::default()).unwrap();
    assert_eq!(Policy::from_json(&text).unwrap(), Policy::default());
    assert_eq!(Policy::from_json("{}").unwrap(), Policy::default());
    let partial = Policy::from_json(r#"{"health": {"not_ready_grace_s": 5}}"#).unwrap();
    assert_eq!(partial.health.not_ready_grace_s, 5);
    assert_eq!(
        partial.health.resume_after_s,
        Policy::default().health.resume_after_s
    );
}

#[test]
fn a_misspelt_field_is_an_error_that_names_it() {
    let err = Policy::from_json(r#"{"health": {"not_ready_grace": 5}}"#).unwrap_err();
    assert!(matches!(err, PolicyError::Invalid(_)));
    let msg = format!("{}", std::error::Error::source(&err).unwrap());
    assert!(msg.contains("unknown field `not_ready_grace`"), "{msg}");
    assert!(
        msg.contains("not_ready_grace_s"),
        "suggests the real names: {msg}"
    );
}

#[test]
fn out_of_range_values_are_rejected() {
    for (doc, needle) in [
        (r#"{"drain": {"reason_prefix": " "}}"#, "reason_prefix"),
        (r#"{"actions": {"attempts_max": 0}}"#, "attempts_max"),
        (
            r#"{"actions": {"retry_backoff_initial_s": 10, "retry_backoff_max_s": 5}}"#,
            "retry_backoff",
        ),
        (
            r#"{"health": {"drains_per_minute_max": 0}}"#,
            "drains_per_minute_max",
        ),
    ] {
        let err = Policy::from_json(doc).unwrap_err();
        assert!(err.to_string().contains(needle), "{doc}: {err}");
    }
}
