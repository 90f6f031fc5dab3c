//! The `lockstep` command as a user runs it, on the shipped incidents.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn lockstep(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .output()
        .expect("lockstep runs")
}

fn incident(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("replay-tests/incidents/{name}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lockstep-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn help_names_the_commands() {
    let out = lockstep(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for cmd in ["replay", "audit", "policy", "convert"] {
        assert!(help.contains(cmd), "{help}");
    }
    let out = lockstep(&["replay", "--help"]);
    assert!(text(&out.stdout).contains("--verify"));
}

#[test]
fn replay_prints_the_expected_timeline_and_verifies() {
    let log = incident("cordon-while-job-runs.jsonl");
    let out = lockstep(&["replay", "--verify", log.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let expected = std::fs::read_to_string(incident("cordon-while-job-runs.expected")).unwrap();
    assert_eq!(text(&out.stdout), expected);
    let err = text(&out.stderr);
    assert!(
        err.contains("verified: all 2 recorded actions match"),
        "{err}"
    );
    assert!(err.contains("state hash "), "{err}");
}

#[test]
fn replay_json_rows_parse() {
    let log = incident("slurm-not-responding.jsonl");
    let out = lockstep(&["replay", "--json", log.to_str().unwrap()]);
    assert!(out.status.success());
    let rows: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let actions: usize = rows
        .iter()
        .map(|r| r["actions"].as_array().unwrap().len())
        .sum();
    assert_eq!(actions, 4);
    assert!(rows
        .iter()
        .all(|r| r["seq"].is_u64() && r["kind"].is_string()));
}

#[test]
fn verify_names_the_first_sequence_where_actions_differ() {
    // Drop the first recorded action: the recomputed one at its seq has no match.
    let src = std::fs::read_to_string(incident("owned-drain-removed-early.jsonl")).unwrap();
    let mut lines: Vec<&str> = src.lines().collect();
    let first_action = lines
        .iter()
        .position(|l| l.starts_with("{\"action\""))
        .unwrap();
    let removed = lines.remove(first_action);
    let seq = serde_json::from_str::<serde_json::Value>(removed).unwrap()["action"]["seq"]
        .as_u64()
        .unwrap();
    let path = tmp("tampered.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let out = lockstep(&["replay", "--verify", "--quiet", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("first divergence at seq {seq}")),
        "{err}"
    );
    assert!(err.contains("recomputed: "), "{err}");
}

#[test]
fn a_truncated_log_replays_up_to_the_damage_and_names_the_line() {
    let src = std::fs::read_to_string(incident("not-ready-grace.jsonl")).unwrap();
    let lines: Vec<&str> = src.lines().collect();
    let keep = lines.len() - 3;
    let mut cut = lines[..keep].join("\n");
    cut.push('\n');
    cut.push_str(&lines[keep][..lines[keep].len() / 2]);
    let path = tmp("truncated.jsonl");
    std::fs::write(&path, cut).unwrap();
    let out = lockstep(&["replay", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("line {}: truncated record", keep + 1)),
        "{err}"
    );
    assert!(err.contains("everything before it was replayed"), "{err}");
    assert!(text(&out.stdout).contains("n2: in_service -> draining [health.not_ready]"));
}

#[test]
fn a_missing_file_and_a_bad_policy_are_clear_errors() {
    let out = lockstep(&["replay", "/nonexistent/log.jsonl"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("opening log /nonexistent/log.jsonl"));
    let policy = tmp("bad-policy.json");
    std::fs::write(&policy, r#"{"drain": {"on_cordonn": false}}"#).unwrap();
    let log = incident("cordon-while-job-runs.jsonl");
    let out = lockstep(&[
        "replay",
        "--policy",
        policy.to_str().unwrap(),
        log.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("unknown field `on_cordonn`"), "{err}");
}

#[test]
fn policy_what_if_shows_what_would_have_changed() {
    let policy = tmp("no-cordon.json");
    std::fs::write(&policy, r#"{"drain": {"on_cordon": false}}"#).unwrap();
    let log = incident("cordon-while-job-runs.jsonl");
    let out = lockstep(&[
        "replay",
        "--policy",
        policy.to_str().unwrap(),
        log.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("2 of 2 recorded actions would not have been issued"),
        "{stdout}"
    );
    assert!(
        stdout.contains("- 11.slurm_drain.slurm:n1/state"),
        "{stdout}"
    );
    // The recorded observations still show lockstep's drain, which this
    // policy has no cause for: it would have resumed it at once.
    assert!(
        stdout.contains("+ 13.slurm_resume.slurm:n1/state"),
        "{stdout}"
    );
}

#[test]
fn audit_gives_the_causal_chain_of_a_node() {
    let log = incident("not-ready-grace.jsonl");
    let out = lockstep(&["audit", "n2", "--log", log.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let chain = text(&out.stdout);
    let drain_at = chain
        .find("transition  in_service -> draining [health.not_ready]")
        .expect(&chain);
    let because = chain[drain_at..].lines().nth(1).unwrap();
    assert!(
        because.contains("because of seq 12: kubernetes node k2 Ready=False"),
        "{chain}"
    );
    assert!(
        chain.contains("action      18.slurm_drain.slurm:n2/state"),
        "{chain}"
    );
    assert!(
        chain.contains("outcome of 18.slurm_drain.slurm:n2/state: succeeded"),
        "{chain}"
    );
    assert!(!chain.contains("slurm node n1"), "only n2's chain: {chain}");
    let out = lockstep(&["audit", "n9", "--log", log.to_str().unwrap()]);
    assert!(text(&out.stdout).contains("slurm node n9 has no transitions in this log"));
}

#[test]
fn convert_to_messagepack_and_back_replays_the_same() {
    let log = incident("flapping-node-damped.jsonl");
    let mp = tmp("flapping.msgpack");
    let out = lockstep(&["convert", log.to_str().unwrap(), mp.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let a = lockstep(&["replay", "--verify", log.to_str().unwrap()]);
    let b = lockstep(&["replay", "--verify", mp.to_str().unwrap()]);
    assert!(b.status.success(), "{}", text(&b.stderr));
    assert_eq!(a.stdout, b.stdout);
    let hash = |o: &Output| {
        text(&o.stderr)
            .lines()
            .find(|l| l.contains("state hash"))
            .unwrap()
            .to_owned()
    };
    assert_eq!(hash(&a), hash(&b));
}

#[test]
fn policy_default_is_a_valid_policy() {
    let out = lockstep(&["policy", "default"]);
    assert!(out.status.success());
    let path = tmp("default.json");
    std::fs::write(&path, &out.stdout).unwrap();
    let check = lockstep(&["policy", "check", path.to_str().unwrap()]);
    assert!(check.status.success());
    assert_eq!(check.stdout, out.stdout);
}

#[test]
fn bad_run_configurations_are_refused_at_start_with_the_reason() {
    let dir = tmp("bad-run-config");
    std::fs::create_dir_all(&dir).unwrap();
    for (text, says) in [
        (
            "[leader_election]\n",
            "leader_election needs a shared log ([log] nats_url)",
        ),
        (
            "[log]\nnats_url = \"nats://127.0.0.1:1\"\n[leader_election]\nrenew_deadline_ms = 20000\n",
            "retry_period_ms < renew_deadline_ms < lease_duration_ms",
        ),
        ("[leader_election]\nlease = \"x\"\n", "unknown field `lease`"),
    ] {
        let config = dir.join("lockstep.toml");
        std::fs::write(&config, text).unwrap();
        let out = lockstep(&["run", "--config", config.to_str().unwrap()]);
        assert!(!out.status.success(), "{text} was accepted");
        assert!(text_of(&out).contains(says), "{text}: {}", text_of(&out));
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn text_of(out: &Output) -> String {
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}
