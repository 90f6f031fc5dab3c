//! JSON Schema documents for the wire types, checked in under `schemas/json/`
//! so that tools in other languages can validate lockstep's logs, actions and
//! policies. A test fails when the checked-in files are stale.

use crate::{Action, Envelope, Policy, Record};

/// `(file name, pretty JSON Schema)` for each published type.
pub fn documents() -> Vec<(&'static str, String)> {
    fn doc<T: schemars::JsonSchema>() -> String {
        let schema = schemars::schema_for!(T);
        let mut text = serde_json::to_string_pretty(&schema).expect("schemas serialize");
        text.push('\n');
        text
    }
    vec![
        ("envelope.schema.json", doc::<Envelope>()),
        ("action.schema.json", doc::<Action>()),
        ("policy.schema.json", doc::<Policy>()),
        ("record.schema.json", doc::<Record>()),
    ]
}
