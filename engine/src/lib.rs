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

mod cause;
mod cow;
mod ctx;
mod drain;
mod engine;
mod evict;
mod flights;
mod health;
mod maintenance;
mod model;
mod node;
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

pub use engine::{Engine, Frozen, Output, SnapshotError, Stats, LAYOUT, STATS_PARTS_MAX};
pub use lockstep_schemas::{Phase, Rule, Transition};

#[cfg(test)]
mod rule_tables {
    use std::collections::BTreeSet;

    use lockstep_schemas::Rule;

    /// The sources whose module documentation holds rule tables.
    const TABLES: [(&str, &str); 9] = [
        ("lib.rs", include_str!("lib.rs")),
        ("drain/mod.rs", include_str!("drain/mod.rs")),
        ("evict.rs", include_str!("evict.rs")),
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
                names.extend(rule_names(row));
            }
        }
        names
    }

    /// The rule reference (`docs/src/reference/rules.md`): each module's rule
    /// tables as its documentation has them, then every rule with the rows
    /// that name it.
    fn rule_reference() -> String {
        let mut out = String::from(
            "# Rule reference\n\n\
             <!-- Generated from the rule tables in the module docs of engine/src by the \
             rule_tables test of lockstep-engine. Do not edit: regenerate with \
             LOCKSTEP_BLESS=1 cargo test -p lockstep-engine --lib rule_tables -->\n\n\
             Every transition and action names the rule that decided it \
             (`[drain.cordon]` in a replay, the `rule` label of \
             `lockstep_rule_firings_total`). Each policy module keeps its rules in a \
             table in its documentation, one case a line in its table test; these are \
             those tables, then every rule with the row that names it.\n",
        );
        let mut index: Vec<(String, &str, String)> = Vec::new();
        for (file, text) in TABLES {
            let rows: Vec<&str> = text
                .lines()
                .map(|l| l.strip_prefix("//!").map(str::trim_start).unwrap_or(""))
                .collect();
            let mut tables = String::new();
            let mut previous_was_row = false;
            for row in &rows {
                let is_row = row.starts_with('|');
                if is_row && !previous_was_row {
                    tables.push('\n');
                }
                if is_row {
                    tables += &format!("{}\n", code_links(row));
                    for name in rule_names(row) {
                        index.push((name, file, code_links(row)));
                    }
                }
                previous_was_row = is_row;
            }
            out += &format!("\n## `engine/src/{file}`\n{tables}");
        }
        out += "\n## Every rule\n\n| rule | module | its row |\n| --- | --- | --- |\n";
        index.sort();
        for rule in Rule::ALL {
            for (name, file, row) in index.iter().filter(|(n, _, _)| n == rule.name()) {
                let cells: Vec<&str> = row
                    .trim_matches('|')
                    .split('|')
                    .map(str::trim)
                    .filter(|c| !c.is_empty() && !c.chars().all(|ch| ch.is_ascii_digit()))
                    .collect();
                out += &format!("| `{name}` | `{file}` | {} |\n", cells.join(" / "));
            }
        }
        out
    }

    /// Rustdoc links (`` [`Name`] ``) as plain code: the page is not rustdoc.
    fn code_links(row: &str) -> String {
        row.replace("[`", "`").replace("`]", "`")
    }

    /// The rule names in the backquoted words of one table row.
    fn rule_names(row: &str) -> Vec<String> {
        let mut names = Vec::new();
        for cell in row.split('|') {
            for quoted in cell.split('`').skip(1).step_by(2) {
                let rule_like = quoted
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.');
                if rule_like && (quoted.contains('.') || quoted == "scaling") {
                    names.push(quoted.to_owned());
                }
            }
        }
        names
    }

    #[test]
    fn the_rule_reference_page_is_current() {
        let page = rule_reference();
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference/rules.md");
        if std::env::var_os("LOCKSTEP_BLESS").is_some_and(|v| v == "1") {
            std::fs::write(&path, &page).unwrap();
            return;
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == page,
            "{} is stale: regenerate with LOCKSTEP_BLESS=1 cargo test -p lockstep-engine --lib rule_tables",
            path.display()
        );
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
