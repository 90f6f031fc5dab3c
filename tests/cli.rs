//! The `lockstep` command as a user runs it, on the shipped incidents.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn lockstep(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .output()
        .expect("lockstep runs")
}

/// Runs lockstep, killing it if it has not ended within `limit` (a
/// configuration that should be refused at start may instead start).
fn lockstep_within(args: &[&str], limit: std::time::Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("lockstep runs");
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
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

/// `replay --policy` with this policy document on an incident: (stdout of
/// the text run, the `what_if` object of the JSON run).
fn what_if(policy: &str, name: &str) -> (String, serde_json::Value) {
    let path = tmp(&format!("what-if-{}.json", policy.len()));
    std::fs::write(&path, policy).unwrap();
    let log = incident(name);
    let args = [
        "replay",
        "--policy",
        path.to_str().unwrap(),
        log.to_str().unwrap(),
    ];
    let out = lockstep(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json = lockstep(&[&args[..], &["--json"]].concat());
    assert!(json.status.success(), "{}", text(&json.stderr));
    let rows: Vec<serde_json::Value> = text(&json.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = rows.last().expect("rows");
    assert!(
        rows[..rows.len() - 1].iter().all(|r| r["seq"].is_u64()),
        "the timeline rows come first"
    );
    (text(&out.stdout), last["what_if"].clone())
}

fn ids(list: &serde_json::Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect()
}

#[test]
fn policy_what_if_lists_exactly_the_actions_that_differ() {
    // Without drains on cordon, the cordon's drain and its resume were never
    // needed. The recorded world still shows the drain lockstep set, which
    // this policy would resume: a reaction to a recorded action, not a
    // decision of the policy, so it is left out, and so are the retries of
    // that resume (the log has no outcomes for it).
    let (stdout, json) = what_if(
        r#"{"drain": {"on_cordon": false}}"#,
        "cordon-while-job-runs.jsonl",
    );
    assert!(
        stdout.contains("does not react to actions that were never carried out"),
        "{stdout}"
    );
    assert!(
        stdout.contains("2 of 2 recorded actions would not have been issued\n  - 11.slurm_drain.slurm:n1/state: drain slurm node n1 (lockstep: kubernetes node k1 cordoned)\n  - 18.slurm_resume.slurm:n1/state: resume slurm node n1\n  0 actions would have been issued that were not\n"),
        "{stdout}"
    );
    assert!(!stdout.contains("  + "), "{stdout}");
    assert!(
        stdout.contains("left out: they react to the effects of recorded actions it would not have issued\n  ~ 13.slurm_resume.slurm:n1/state"),
        "{stdout}"
    );
    assert!(
        stdout.contains("retries not compared: 0 recorded, 2 in the what-if run"),
        "{stdout}"
    );
    assert_eq!(
        ids(&json["not_issued"]),
        [
            "11.slurm_drain.slurm:n1/state",
            "18.slurm_resume.slurm:n1/state"
        ]
    );
    assert!(ids(&json["issued"]).is_empty(), "{json}");
    assert_eq!(ids(&json["reactions"]), ["13.slurm_resume.slurm:n1/state"]);
    assert_eq!(json["retries_not_compared"]["what_if"], 2);
    assert!(json["note"]
        .as_str()
        .unwrap()
        .contains("does not react to actions that were never carried out"));

    // A shorter grace drains during the 20 s blip: one drain more, issued
    // once (its retries are not compared), and nothing recorded is missing.
    let (stdout, json) = what_if(
        r#"{"health": {"not_ready_grace_s": 10}}"#,
        "not-ready-grace.jsonl",
    );
    assert!(
        stdout.contains("0 of 2 recorded actions would not have been issued\n  1 actions would have been issued that were not\n  + 9.slurm_drain.slurm:n1/state: drain slurm node n1 (lockstep: kubernetes node k1 not ready)\n"),
        "{stdout}"
    );
    assert_eq!(ids(&json["issued"]), ["9.slurm_drain.slurm:n1/state"]);
    assert!(ids(&json["not_issued"]).is_empty(), "{json}");

    // The same policy as the log's: nothing differs, though the what-if run
    // issues its actions under its own ids.
    let (stdout, json) = what_if("{}", "pod-evicted.jsonl");
    assert!(
        stdout.contains("0 of 2 recorded actions would not have been issued\n  0 actions would have been issued that were not\n"),
        "{stdout}"
    );
    assert_eq!(json["recorded_actions"], 2);
    assert_eq!(json["what_if_actions"], 2);
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
    std::fs::write(
        dir.join("policy.json"),
        r#"{"scaling": {"targets": [{"target": {"group": "apps", "kind": "StatefulSet", "namespace": "slurm", "name": "gpu"}, "partition": "batch", "max_replicas": 4, "idle_before_scale_down_s": 18446744073709551615}]}}"#,
    )
    .unwrap();
    std::fs::write(dir.join("list.json"), "[{}, {}]").unwrap();
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
        // Sections given as arrays would be taken field by field in order.
        (
            "log = [\"nats://127.0.0.1:1\", 120]\n",
            "log: expected a table of named fields, found array",
        ),
        (
            "service = { batch_max = 1 }\nslurm = [\"http://127.0.0.1:1\"]\n",
            "slurm: expected a table of named fields, found array",
        ),
        // The policy file is checked before anything starts.
        (
            "policy_file = \"policy.json\"\n",
            "scaling.targets[0].idle_before_scale_down_s: 18446744073709551615 is more than the largest allowed value",
        ),
        (
            "policy_file = \"list.json\"\n",
            "invalid policy: (document): expected a map of named fields, found a list",
        ),
    ] {
        let config = dir.join("lockstep.toml");
        std::fs::write(&config, text).unwrap();
        let out = lockstep_within(
            &["run", "--config", config.to_str().unwrap()],
            std::time::Duration::from_secs(30),
        );
        assert!(!out.status.success(), "{text} was accepted");
        assert!(text_of(&out).contains(says), "{text}: {}", text_of(&out));
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn text_of(out: &Output) -> String {
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

fn compat_log() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("replay-tests/compat/0.1.0-2026-11-30.jsonl")
}

/// The summary line `replay` prints on stderr.
fn summary(out: &Output) -> String {
    text(&out.stderr)
        .lines()
        .find(|l| l.contains("state hash"))
        .unwrap_or_else(|| panic!("no summary in {}", text(&out.stderr)))
        .to_owned()
}

#[test]
fn converting_a_log_onto_itself_loses_nothing() {
    // Larger than any read buffer (64 KiB), so that writing the output
    // while the input is still being read would show.
    let original = compat_log();
    assert!(std::fs::metadata(&original).unwrap().len() > 1 << 16);
    // Plain replay, not --verify: this log was written by an older lockstep
    // whose rules later changed on purpose (see replay-tests/compat); what
    // matters here is that the converted file replays exactly like the input.
    let before = lockstep(&["replay", original.to_str().unwrap()]);
    assert!(before.status.success(), "{}", text(&before.stderr));
    for name in ["in-place.jsonl", "in-place.msgpack"] {
        let path = tmp(name);
        std::fs::copy(&original, &path).unwrap();
        if name.ends_with(".msgpack") {
            // A MessagePack file with a .msgpack name, converted onto itself.
            let json = tmp("in-place-src.jsonl");
            std::fs::copy(&original, &json).unwrap();
            let out = lockstep(&["convert", json.to_str().unwrap(), path.to_str().unwrap()]);
            assert!(out.status.success(), "{}", text(&out.stderr));
        }
        let p = path.to_str().unwrap();
        let out = lockstep(&["convert", p, p]);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        let after = lockstep(&["replay", p]);
        assert!(after.status.success(), "{name}: {}", text(&after.stderr));
        assert_eq!(after.stdout, before.stdout, "{name}: the same timeline");
        assert_eq!(summary(&after), summary(&before), "{name}");
        let dir = path.parent().unwrap();
        let leftovers: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}

#[test]
fn a_failed_convert_leaves_the_output_as_it_was() {
    let src = std::fs::read_to_string(incident("pod-evicted.jsonl")).unwrap();
    let damaged = tmp("damaged.jsonl");
    std::fs::write(&damaged, &src[..src.len() - 40]).unwrap();
    let output = tmp("precious.jsonl");
    std::fs::write(&output, "precious").unwrap();
    let out = lockstep(&[
        "convert",
        damaged.to_str().unwrap(),
        output.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("was not written"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "precious");
    // A target a rename would destroy is refused, and named.
    let out = lockstep(&["convert", damaged.to_str().unwrap(), "/dev/null"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("refusing to write /dev/null: it is a device, not a regular file"),
        "{err}"
    );
}

#[test]
fn json_lines_with_a_byte_order_mark_and_leading_blank_lines_replay() {
    let src = std::fs::read(incident("pod-evicted.jsonl")).unwrap();
    let plain = lockstep(&["replay", incident("pod-evicted.jsonl").to_str().unwrap()]);
    for prefix in [&b"\xef\xbb\xbf"[..], b"\n \n", b"\xef\xbb\xbf\r\n"] {
        let mut bytes = prefix.to_vec();
        bytes.extend_from_slice(&src);
        let path = tmp("bom.jsonl");
        std::fs::write(&path, bytes).unwrap();
        let out = lockstep(&["replay", path.to_str().unwrap()]);
        assert!(out.status.success(), "{prefix:?}: {}", text(&out.stderr));
        assert_eq!(out.stdout, plain.stdout, "{prefix:?}");
    }
}

#[test]
fn an_endless_input_is_an_error_not_an_out_of_memory_kill() {
    // /dev/zero, and endless text with no newline.
    let yes = tmp("endless-text.fifo");
    for input in ["/dev/zero", "text"] {
        let path = if input == "text" {
            // A file bigger than the record bound, with no newline.
            let f = std::fs::File::create(&yes).unwrap();
            f.set_len(17 << 20).unwrap();
            drop(f);
            let mut bytes = std::fs::read(&yes).unwrap();
            bytes.iter_mut().for_each(|b| *b = b'x');
            std::fs::write(&yes, bytes).unwrap();
            yes.to_str().unwrap().to_owned()
        } else {
            input.to_owned()
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_lockstep"))
            .args(["replay", &path])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("lockstep replay {input} still reads after 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(2), "{input}: {err}");
        let says = if input == "text" {
            "line 1: record larger than 16 MiB"
        } else {
            "byte offset 0"
        };
        assert!(err.contains(says), "{input}: {err}");
    }
    let _ = std::fs::remove_file(yes);
}

/// A copy of an incident whose events from `from_seq` on happen at `time_ms`.
fn with_times(name: &str, from_seq: u64, time_ms: u64) -> PathBuf {
    let src = std::fs::read_to_string(incident(name)).unwrap();
    let mut out = String::new();
    for line in src.lines() {
        let mut line = line.to_owned();
        if line.starts_with("{\"event\"") || line.starts_with("{\"action\"") {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            let rec = v.get("event").or_else(|| v.get("action")).unwrap();
            let (seq, old) = (
                rec["seq"].as_u64().unwrap(),
                rec["time_ms"].as_u64().unwrap(),
            );
            if seq >= from_seq {
                // Edit in place: the keys keep their order.
                line = line.replacen(
                    &format!("\"time_ms\":{old}"),
                    &format!("\"time_ms\":{time_ms}"),
                    1,
                );
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    let path = tmp(&format!("late-{name}"));
    std::fs::write(&path, out).unwrap();
    path
}

#[test]
fn times_past_year_9999_are_shown_raw_not_a_crash() {
    // 10000-01-01T00:00:00Z and later.
    let late = 253_402_300_800_000u64;
    let log = with_times("not-ready-grace.jsonl", 12, late);
    let out = lockstep(&["replay", log.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let timeline = text(&out.stdout);
    assert!(
        timeline.contains(&format!(
            "{late} ms since the Unix epoch (past year 9999)  seq 23 "
        )),
        "{timeline}"
    );
    let out = lockstep(&["audit", "n2", "--log", log.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("ms since the Unix epoch (past year 9999)"),
        "{}",
        text(&out.stdout)
    );
}

fn with_header(name: &str, header: &str) -> PathBuf {
    let src = std::fs::read_to_string(incident(name)).unwrap();
    let rest = src.split_once('\n').unwrap().1;
    let path = tmp(&format!("header-{name}"));
    std::fs::write(&path, format!("{header}\n{rest}")).unwrap();
    path
}

#[test]
fn another_schema_version_in_the_header_is_named() {
    // A newer minor version: read, with a warning.
    let log = with_header(
        "pod-evicted.jsonl",
        r#"{"header":{"format":"lockstep-log","schema_version":1,"schema_minor":7,"written_by":"lockstep 1.9.0"}}"#,
    );
    let out = lockstep(&["replay", log.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("warning: ")
            && err.contains("written by `lockstep 1.9.0` with schema version 1.7"),
        "{err}"
    );
    // A newer major version: refused, naming both versions.
    let log = with_header(
        "pod-evicted.jsonl",
        r#"{"header":{"format":"lockstep-log","schema_version":2,"written_by":"lockstep 2.0.0"}}"#,
    );
    let out = lockstep(&["replay", log.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    let want = format!(
        "line 1: the log was written by `lockstep 2.0.0` with schema version 2.0, newer than the 1.{} this lockstep reads; upgrade lockstep",
        lockstep_schemas::log::SCHEMA_MINOR
    );
    assert!(err.contains(&want), "{err}");
    assert!(out.stdout.is_empty(), "nothing replayed");
}

#[test]
fn completions_are_scripts_for_each_shell() {
    let out = lockstep(&["completions", "bash"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let script = text(&out.stdout);
    for word in ["_lockstep", "timeline", "rollback", "completions"] {
        assert!(
            script.contains(word),
            "{word} missing from the bash completion"
        );
    }
    let file = tmp("lockstep.bash");
    std::fs::write(&file, &script).unwrap();
    let syntax = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(syntax.status.success(), "{}", text(&syntax.stderr));
    for shell in ["zsh", "fish"] {
        let out = lockstep(&["completions", shell]);
        assert!(out.status.success());
        assert!(text(&out.stdout).contains("timeline"), "{shell}");
    }
    assert!(!lockstep(&["completions", "tcsh"]).status.success());
}

/// A log of `events` records from the benchmark generator (a steady-state
/// mix over 40 nodes), for the commands whose progress shows.
fn big_log(name: &str, events: usize) -> PathBuf {
    use lockstep_schemas::log::{Format, LogWriter};
    let path = tmp(name);
    let mut g =
        lockstep_testkit::gen::Generator::new(lockstep_testkit::gen::Shape::plain(40, 4), 7);
    g.steady_state(events);
    let file = std::fs::File::create(&path).unwrap();
    let mut w = LogWriter::new(
        std::io::BufWriter::new(file),
        Format::from_path(&path),
        "cli test",
    )
    .unwrap();
    for rec in g.into_records() {
        w.write(&lockstep_schemas::Record::Event(rec)).unwrap();
    }
    w.finish().unwrap();
    path
}

/// Runs `lockstep ARGS` on a pseudo-terminal (util-linux `script`):
/// everything it wrote to the terminal.
fn on_a_terminal(args: &[&str]) -> String {
    let cmd = std::iter::once(env!("CARGO_BIN_EXE_lockstep"))
        .chain(args.iter().copied())
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &format!("{cmd} >/dev/null"), "/dev/null"])
        .env("TERM", "xterm")
        .output()
        .expect("util-linux script runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn long_commands_show_progress_on_a_terminal_and_none_when_piped() {
    let log = big_log("big.msgpack", 120_000);
    let log = log.to_str().unwrap();
    let jsonl = tmp("big.jsonl");
    let jsonl = jsonl.to_str().unwrap();
    // (command, what the bar says)
    let cases: [(&[&str], &str); 2] = [
        (&["replay", "--quiet", log], "replaying"),
        (&["convert", log, jsonl], "converting"),
    ];
    for (args, label) in cases {
        let piped = lockstep(args);
        assert!(piped.status.success(), "{}", text(&piped.stderr));
        let err = text(&piped.stderr);
        assert!(
            !err.contains(label) && !err.contains('\u{1b}') && !err.contains('\r'),
            "piped: {err:?}"
        );
        let tty = on_a_terminal(args);
        assert!(
            tty.contains(label) && tty.contains('['),
            "{args:?} on a terminal: {tty:?}"
        );
    }
}

/// `kubectl-lockstep`, as kubectl finds plugins: a link on PATH.
fn plugin_dir() -> PathBuf {
    let dir = tmp("plugin");
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("kubectl-lockstep");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_lockstep"), &link).unwrap();
    dir
}

fn plugin(args: &[&str]) -> Output {
    Command::new(plugin_dir().join("kubectl-lockstep"))
        .args(args)
        .env_remove("LOCKSTEP_URL")
        .output()
        .unwrap()
}

#[test]
fn kubectl_lockstep_why_tells_the_chain_of_the_slurm_nodes_on_a_node_from_a_log() {
    let log = incident("not-ready-grace.jsonl");
    let out = plugin(&["why", "k2", "--log", log.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("1 Slurm node(s): n2"), "{said}");
    assert!(
        said.contains("in_service -> draining [health.not_ready] kubernetes node k2 not ready"),
        "{said}"
    );
    assert!(
        said.contains("because of seq 12: kubernetes node k2 Ready=False"),
        "{said}"
    );
    // A Slurm node by name works too; a node with nothing on it says so.
    assert!(
        text(&plugin(&["why", "n2", "--log", log.to_str().unwrap()]).stdout)
            .contains("Slurm node(s): n2")
    );
    let none = plugin(&["why", "k9", "--log", log.to_str().unwrap()]);
    assert!(text(&none.stdout).contains("no Slurm node is k9"));
    // Help names the plugin as kubectl shows it.
    assert!(text(&plugin(&["--help"]).stdout).contains("kubectl lockstep"));
    // Nothing running and no log: the way to reach lockstep is named.
    let out = plugin(&["status", "--url", "http://127.0.0.1:9"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("port-forward"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn kubectl_finds_the_plugin_and_it_asks_the_running_service() {
    // The project's kubectl (deploy/local/kube/build.sh; cached after the
    // first build).
    let build = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/local/kube/build.sh");
    let built = Command::new(&build).output().unwrap();
    assert!(built.status.success(), "{}", text(&built.stderr));
    let bin = Command::new(&build)
        .arg("--print-bin-dir")
        .output()
        .unwrap();
    let kubectl = PathBuf::from(text(&bin.stdout).trim()).join("kubectl");
    assert!(kubectl.exists(), "{}", kubectl.display());

    // lockstep run on an embedded log holding an incident: k1 cordoned, its
    // Slurm node n1 drained.
    let dir = tmp("why-service");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data/log")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let log = lockstep_store::EventLog::open_embedded(&dir.join("data/log")).unwrap();
        for rec in lockstep_schemas::log::open(&incident("cordon-while-job-runs.jsonl")).unwrap() {
            if let lockstep_schemas::Record::Event(ev) = rec.unwrap() {
                log.append(&ev.envelope).await.unwrap();
            }
        }
        log.flush().await.unwrap();
    });
    let port = lockstep_testkit::free_port();
    let url = format!("http://127.0.0.1:{port}");
    std::fs::write(
        dir.join("lockstep.toml"),
        format!("data_dir = \"data\"\n[telemetry]\nlisten = \"127.0.0.1:{port}\"\n"),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["run", "--config"])
        .arg(dir.join("lockstep.toml"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let kubectl_lockstep = |args: &[&str]| -> Output {
        Command::new(&kubectl)
            .arg("lockstep")
            .args(args)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    plugin_dir().display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("LOCKSTEP_URL", &url)
            .output()
            .unwrap()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        let out = kubectl_lockstep(&["status"]);
        let said = text(&out.stdout);
        if out.status.success() && said.contains("leader, ready") {
            break said;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("lockstep did not get ready: {said} {}", text(&out.stderr));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(status.contains("slurm nodes: "), "{status}");
    let out = kubectl_lockstep(&["why", "k1"]);
    let json = kubectl_lockstep(&["why", "k1", "--json"]);
    let _ = child.kill();
    let _ = child.wait();
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(
        said.contains("slurm node n1 on k1, pod slurm/n1:"),
        "{said}"
    );
    assert!(
        said.contains("[drain.cordon] kubernetes node k1 cordoned"),
        "{said}"
    );
    let answer: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let n1 = &answer["slurm_nodes"][0];
    assert_eq!(n1["slurm_node"], "n1", "{answer}");
    assert_eq!(n1["kube_node"], "k1", "{answer}");
    assert!(n1["transitions"].as_array().unwrap().len() >= 2, "{answer}");
    let _ = std::fs::remove_dir_all(&dir);
}
