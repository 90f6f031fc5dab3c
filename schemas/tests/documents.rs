//! The checked-in JSON Schema files, the policy reference page generated from
//! the policy's schema (`docs/src/reference/policy.md`), and the policy document.

use std::path::PathBuf;

use lockstep_schemas::{Policy, PolicyError};
use serde_json::Value;

fn blessing() -> bool {
    std::env::var_os("LOCKSTEP_BLESS").is_some_and(|v| v == "1")
}

#[test]
fn checked_in_json_schemas_are_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("json");
    let bless = blessing();
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

/// The policy reference: one section per part of the policy, one row per
/// field with its type, default and doc comment, from the same JSON Schema
/// as `schemas/json/policy.schema.json` (so from the fields' doc comments).
fn policy_reference(schema: &Value) -> String {
    let defs = &schema["$defs"];
    let mut out = String::from(
        "# Policy reference\n\n\
         <!-- Generated from the policy's field docs (schemas/src/policy.rs, through \
         schemas/json/policy.schema.json) by schemas/tests/documents.rs. Do not edit: \
         regenerate with LOCKSTEP_BLESS=1 cargo test -p lockstep-schemas --test documents -->\n\n",
    );
    out += &one_line(&schema["description"]);
    out += " A policy file is JSON: any subset of `lockstep policy default`, every field \
            missing keeps its default, an unknown field is an error \
            (`lockstep policy check FILE`). It takes effect without a restart \
            ([policy history](../replay/policy-history.md)).\n";
    let mut sections = vec![(String::new(), schema.clone())];
    let mut enums = std::collections::BTreeMap::new();
    while let Some((path, object)) = sections.pop() {
        let Some(props) = object["properties"].as_object() else {
            continue;
        };
        if !path.is_empty() {
            out += &format!("\n## `{path}`\n\n{}\n", one_line(&object["description"]));
        } else {
            out += "\n## The policy\n";
        }
        out += "\n| field | type | default | what |\n| --- | --- | --- | --- |\n";
        let mut nested = Vec::new();
        for (name, field) in props {
            let full = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            let (ty, target) = type_of(field, defs);
            let default = match &field["default"] {
                Value::Null => String::new(),
                Value::Object(_) if target.is_some() => "see below".to_owned(),
                v => format!(
                    "`{}`",
                    serde_json::to_string(v).unwrap().replace('|', "\\|")
                ),
            };
            out += &format!(
                "| `{full}` | {ty} | {default} | {} |\n",
                one_line(&field["description"]).replace('|', "\\|")
            );
            if let Some(def) = target {
                let def_schema = &defs[&def];
                if def_schema["properties"].is_object() {
                    nested.push((full, def_schema.clone()));
                } else {
                    enums.insert(def, def_schema.clone());
                }
            }
        }
        sections.extend(nested.into_iter().rev());
    }
    out += "\n## Values\n\nA field whose type links here takes one of these values.\n";
    for (name, def) in &enums {
        out += &enum_values(name, def);
    }
    out
}

/// The type of a field as the page shows it, and the `$defs` entry it names.
fn type_of(field: &Value, defs: &Value) -> (String, Option<String>) {
    let def_name = |r: &Value| {
        r.as_str()
            .and_then(|r| r.strip_prefix("#/$defs/"))
            .map(str::to_owned)
    };
    if let Some(def) = def_name(&field["$ref"]) {
        if defs[&def]["properties"].is_object() {
            return (format!("object ({def})"), Some(def));
        }
        return (format!("[{def}](#{})", def.to_lowercase()), Some(def));
    }
    if let Some(items) = field.get("items") {
        if let Some(def) = def_name(&items["$ref"]) {
            let shown = if defs[&def]["properties"].is_object() {
                def.clone()
            } else {
                format!("[{def}](#{})", def.to_lowercase())
            };
            return (format!("list of {shown}"), Some(def));
        }
        return (format!("list of {}", type_of(items, defs).0), None);
    }
    if let Some(def) = def_name(&field["additionalProperties"]["$ref"]) {
        return (
            format!("map of kind to [{def}](#{})", def.to_lowercase()),
            Some(def),
        );
    }
    if let Some(any) = field["anyOf"].as_array() {
        if let Some(def) = any.iter().find_map(|a| def_name(&a["$ref"])) {
            return (format!("{def} or null"), Some(def));
        }
    }
    let ty = match &field["type"] {
        Value::String(t) => t.clone(),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".to_owned(),
    };
    (ty, None)
}

/// The values of an enumeration, each with its doc comment.
fn enum_values(name: &str, def: &Value) -> String {
    let mut out = format!("\n### {name}\n\n{}\n\n", one_line(&def["description"]));
    let values: Vec<(String, String)> = match (def["oneOf"].as_array(), def["enum"].as_array()) {
        (Some(cases), _) => cases
            .iter()
            .map(|c| {
                let value = c["const"].clone();
                let value = if value.is_null() {
                    c["enum"][0].clone()
                } else {
                    value
                };
                (
                    serde_json::to_string(&value).unwrap(),
                    one_line(&c["description"]),
                )
            })
            .collect(),
        (None, Some(values)) => values
            .iter()
            .map(|v| (serde_json::to_string(v).unwrap(), String::new()))
            .collect(),
        _ => return String::new(),
    };
    for (value, what) in values {
        out += &format!(
            "- `{value}`{}{what}\n",
            if what.is_empty() { "" } else { ": " }
        );
    }
    out
}

fn one_line(v: &Value) -> String {
    v.as_str()
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_policy_reference_page_is_current() {
    let (_, text) = lockstep_schemas::schema::documents()
        .into_iter()
        .find(|(name, _)| *name == "policy.schema.json")
        .unwrap();
    let page = policy_reference(&serde_json::from_str(&text).unwrap());
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference/policy.md");
    if blessing() {
        std::fs::write(&path, &page).unwrap();
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == page,
        "{} is stale: regenerate with LOCKSTEP_BLESS=1 cargo test -p lockstep-schemas --test documents",
        path.display()
    );
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
