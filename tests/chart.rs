//! The Helm chart (`deploy/helm/lockstep`) renders, for every value set in
//! its `ci/` directory, a `lockstep.toml` that `lockstep run` accepts and a
//! policy that validates: checked with lockstep's own configuration loader
//! and policy parser, not by pattern. (`deploy/helm/check.sh` lints and
//! renders the same value sets; `tests/node_e2e.rs` installs the chart on a
//! real node.) helm comes from `deploy/local/kube/build.sh helm` (built
//! from the Go module proxy once, cached).

use std::path::PathBuf;
use std::process::Command;

use lockstep::config::Config;
use lockstep_schemas::Policy;
use lockstep_testkit::repo;

fn helm() -> PathBuf {
    let build = repo().join("deploy/local/kube/build.sh");
    let out = Command::new(&build).arg("helm").output().unwrap();
    assert!(
        out.status.success(),
        "build.sh helm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&build)
        .arg("--print-bin-dir")
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("helm")
}

/// The text of `  KEY: |` in a rendered ConfigMap (its lines, unindented).
fn block(manifest: &str, key: &str) -> String {
    let start = manifest
        .find(&format!("  {key}: |"))
        .unwrap_or_else(|| panic!("no {key} in\n{manifest}"));
    manifest[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("    ") || l.is_empty())
        .map(|l| l.get(4..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_ci_value_set_renders_a_configuration_and_policy_that_lockstep_accepts() {
    let helm = helm();
    let chart = repo().join("deploy/helm/lockstep");
    let dir = lockstep_testkit::temp_dir("chart");
    let mut sets: Vec<PathBuf> = std::fs::read_dir(chart.join("ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    sets.sort();
    assert!(sets.len() >= 4, "{sets:?}");
    for values in sets {
        let name = values.file_stem().unwrap().to_string_lossy().into_owned();
        let out = Command::new(&helm)
            .args(["template", "lockstep"])
            .arg(&chart)
            .args([
                "-n",
                "lockstep-system",
                "--show-only",
                "templates/configmap.yaml",
                "-f",
            ])
            .arg(&values)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rendered = String::from_utf8(out.stdout).unwrap();
        let toml_path = dir.join(format!("{name}.toml"));
        std::fs::write(&toml_path, block(&rendered, "lockstep.toml")).unwrap();
        let cfg = Config::load(&toml_path).unwrap_or_else(|e| {
            panic!(
                "{name}: lockstep does not accept the rendered config: {e:#}\n{}",
                block(&rendered, "lockstep.toml")
            )
        });
        let policy = Policy::from_json(&block(&rendered, "policy.json"))
            .unwrap_or_else(|e| panic!("{name}: policy: {e}"));
        policy
            .validate()
            .unwrap_or_else(|e| panic!("{name}: policy: {e:?}"));

        // What the pod expects of it.
        assert_eq!(cfg.data_dir, PathBuf::from("/var/lib/lockstep"), "{name}");
        assert_eq!(
            cfg.policy_file.as_deref(),
            Some(std::path::Path::new("/etc/lockstep/policy/policy.json")),
            "{name}"
        );
        assert_eq!(cfg.telemetry.listen.map(|a| a.port()), Some(9464), "{name}");
        let embedded = name.starts_with("embedded");
        assert_eq!(cfg.log.nats_url.is_none(), embedded, "{name}");
        assert_eq!(cfg.leader_election.is_none(), embedded, "{name}");
        assert!(cfg.kubernetes.is_some(), "{name}");
        if name.contains("scontrol") {
            let slurm = cfg.slurm.as_ref().unwrap();
            assert_eq!(
                slurm.slurm_conf.as_deref(),
                Some(std::path::Path::new("/etc/slurm/slurm.conf"))
            );
            // `slurm.scontrol.listNodes` beside `restUrl`.
            assert!(slurm.nodes_through_scontrol, "{name}");
            assert_eq!(slurm.jobs_poll_interval_ms, Some(1_000), "{name}");
        } else if let Some(slurm) = &cfg.slurm {
            assert!(!slurm.nodes_through_scontrol, "{name}");
            // 0, the default: the nodes' interval.
            assert_eq!(slurm.jobs_poll_interval_ms, None, "{name}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
