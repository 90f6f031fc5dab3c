//! lockstep-engine: the deterministic reducer at the heart of lockstep.
//!
//! Like quinn-proto for QUIC, this crate is pure logic: it contains no
//! networking or storage code, does not depend on tokio, kube, async-nats or
//! sled, never reads a clock and uses no randomness. Time comes in with every
//! log record (its append time), and everything it decides comes out as
//! values: [`Transition`]s and [`IssuedAction`](lockstep_schemas::IssuedAction)s.
//! Because every decision is a function of the log, the same log gives the
//! same state hash, transitions and action ids on any machine, at any batch
//! size, after any restart.
//!
//! Policies live in their own modules, each a table of rules: `drain`
//! (cordons, evictions, pod deletions, foreign drains), `health`
//! (NotReady, node conditions, Slurm health shown in Kubernetes, damping),
//! `topology` (labels to Slurm features and topology), `scaling`
//! (replicas from Slurm demand, scale-in through drain, busy labels) and
//! `maintenance` (announced maintenance: a Slurm reservation ahead, a drain
//! in the window, the node's drain conditions); `shown` holds what lockstep
//! shows in Kubernetes of what Slurm says (pod conditions, a label, taints).
//! The loop itself (`engine`) names a few rules of its own:
//!
//! | holds when                                                  | rule                      |
//! |-------------------------------------------------------------|---------------------------|
//! | Slurm reports the node for the first time                   | `observe.slurm`           |
//! | Slurm no longer reports the node                            | `observe.gone`            |
//! | lockstep cannot see Slurm: no Slurm action until it can     | `observe.slurm_invisible` |
//! | an action ran out of attempts or failed for good            | `actions.gave_up`         |
//! | (logs of earlier lockstep) any scaling action or report     | `scaling`                 |
//!
//! Every rule a table names is a [`Rule`], and every [`Rule`] is in a table
//! (a test checks both).

mod drain;
mod engine;
mod flights;
mod health;
mod maintenance;
mod model;
pub mod replay;
mod retired;
mod scaling;
mod shown;
mod slot;
mod sorted;
mod stale;
mod timers;
mod topology;
mod units;

pub use engine::{Engine, Output, SnapshotError, LAYOUT};
pub use lockstep_schemas::{Phase, Rule, Transition};

#[cfg(test)]
mod rule_tables {
    use std::collections::BTreeSet;

    use lockstep_schemas::Rule;

    /// The sources whose module documentation holds rule tables.
    const TABLES: [(&str, &str); 8] = [
        ("lib.rs", include_str!("lib.rs")),
        ("drain.rs", include_str!("drain.rs")),
        ("health.rs", include_str!("health.rs")),
        ("topology.rs", include_str!("topology.rs")),
        ("scaling/mod.rs", include_str!("scaling/mod.rs")),
        ("maintenance.rs", include_str!("maintenance.rs")),
        ("shown.rs", include_str!("shown.rs")),
        ("retired.rs", include_str!("retired.rs")),
    ];

    /// Rule names (`policy.rule`, or `scaling`) in the table rows of the
    /// module documentation.
    fn named_in_tables() -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for (_, text) in TABLES {
            for row in text.lines().filter(|l| l.starts_with("//! |")) {
                for cell in row.split('|') {
                    for quoted in cell.split('`').skip(1).step_by(2) {
                        let rule_like = quoted
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.');
                        if rule_like && (quoted.contains('.') || quoted == "scaling") {
                            names.insert(quoted.to_owned());
                        }
                    }
                }
            }
        }
        names
    }

    #[test]
    fn every_rule_a_table_names_exists_and_every_rule_is_in_a_table() {
        let tables = named_in_tables();
        let rules: BTreeSet<String> = Rule::ALL.iter().map(|r| r.name().to_owned()).collect();
        let unknown: Vec<_> = tables.difference(&rules).collect();
        assert!(
            unknown.is_empty(),
            "named in a table, not a Rule: {unknown:?}"
        );
        let undocumented: Vec<_> = rules.difference(&tables).collect();
        assert!(
            undocumented.is_empty(),
            "a Rule in no table: {undocumented:?}"
        );
    }
}
