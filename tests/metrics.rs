//! A real Prometheus scrapes a real `lockstep run`, and every query of the
//! Grafana dashboard (`deploy/grafana/lockstep.json`) and every alert rule
//! (`deploy/prometheus/alerts.yaml`) is asked of it through Prometheus' HTTP
//! API.
//!
//! The parts: a Slurm 22.05 of its own (`deploy/local/slurm/up.sh` in its
//! own state dir and ports: five nodes, slurmd on four), a nats-server, and
//! Prometheus (`scripts/ensure-prometheus.sh` installs Debian's package when
//! it is missing). lockstep observes and actuates that Slurm; the test plays
//! the Kubernetes watcher (host mode: a Kubernetes node per Slurm node,
//! appended to the log) and the admin. What happens: a job waits for five
//! nodes (demand), ls-n1 is cordoned (lockstep drains it in slurmctld: a
//! reaction with its outcome), an admin drains ls-n2 (a foreign drain),
//! ls-n3 and ls-n4 go NotReady with a drain budget of one a minute (one is
//! drained, the other held by the rate bound), ls-n5 has no slurmd (down).
//!
//! Every dashboard query must return a finite value; every alert rule must
//! evaluate without error and either return data or, as the alerts that are
//! empty on a healthy cluster do, have every metric selector inside it
//! return data. `promtool check rules` passes on the rule groups of the
//! PrometheusRule and `promtool check metrics` on what lockstep serves.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_schemas::{ConditionStatus, Envelope, Event, KubeNode, Source};
use lockstep_store::EventLog;
use lockstep_testkit::{free_port, repo, temp_dir, NatsServer};

/// This test's own Slurm: its state dir and ports, apart from the shared
/// clusters of the other tests.
const SLURM_STATE: &str = "/tmp/lockstep-local/slurm-metrics";

fn slurm_env(cmd: &mut Command) -> &mut Command {
    cmd.env("LOCKSTEP_SLURM_VERSION", "22.05")
        .env("LOCKSTEP_SLURM_STATE_DIR", SLURM_STATE)
        .env("LOCKSTEP_SLURM_NODES", "5")
        .env("LOCKSTEP_SLURMD_MAX", "4")
        .env("LOCKSTEP_SLURMCTLD_PORT", "17317")
        .env("LOCKSTEP_SLURMRESTD_PORT", "6950")
        .env("LOCKSTEP_SLURMD_PORT_BASE", "17330")
        .env("LOCKSTEP_SLURM_CLUSTER", "lsmetrics")
        .env_remove("SLURM_JWT")
}

/// Stops this test's Slurm when dropped.
struct Slurm {
    env: BTreeMap<String, String>,
}

impl Slurm {
    fn up() -> Self {
        let out = slurm_env(&mut Command::new(repo().join("deploy/local/slurm/up.sh")))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "deploy/local/slurm/up.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let env = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Self { env }
    }

    fn run(&self, program: &str, args: &[&str]) -> String {
        let out = Command::new(Path::new(&self.env["LOCKSTEP_SLURM_BIN"]).join(program))
            .args(args)
            .env("SLURM_CONF", &self.env["SLURM_CONF"])
            .env_remove("SLURM_JWT")
            .current_dir("/tmp")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let _ = slurm_env(&mut Command::new(repo().join("deploy/local/slurm/down.sh"))).output();
    }
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET path` on a loopback server: (status, body).
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// An instant query: the result vector.
fn query(prom: &str, q: &str) -> Vec<serde_json::Value> {
    let (status, body) = get(prom, &format!("/api/v1/query?query={}", urlencode(q)))
        .unwrap_or_else(|| panic!("prometheus does not answer {q}"));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200, "{q}: {body}");
    assert_eq!(v["status"], "success", "{q}: {body}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn finite(result: &[serde_json::Value]) -> bool {
    result.iter().any(|r| {
        r["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(f64::is_finite)
    })
}

/// The metric selectors inside a PromQL expression: `name` or
/// `name{matchers}`, for every lockstep metric it reads.
fn selectors(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("lockstep_") {
        let tail = &rest[i..];
        let name_len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let mut sel = tail[..name_len].to_owned();
        let after = &tail[name_len..];
        let mut used = name_len;
        if after.starts_with('{') {
            let end = after.find('}').expect("matchers close") + 1;
            sel.push_str(&after[..end]);
            used += end;
        }
        out.push(sel);
        rest = &tail[used..];
    }
    out
}

/// A dashboard expression with Grafana's variables set as "All".
fn with_variables(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$partition", ".*")
        .replace("$kind", ".*")
}

/// Every query of the dashboard: panel targets, and the label_values()
/// queries of its variables as the PromQL Grafana sends for them.
fn dashboard_queries() -> Vec<(String, String)> {
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/grafana/lockstep.json")).unwrap(),
    )
    .unwrap();
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((
                p["title"].as_str().unwrap().to_owned(),
                with_variables(t["expr"].as_str().unwrap()),
            ));
        }
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        let Some(q) = v["query"]["query"].as_str() else {
            continue;
        };
        let args = q
            .strip_prefix("label_values(")
            .and_then(|a| a.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable query {q}"));
        let (metric, label) = args.split_once(", ").unwrap();
        out.push((
            format!("variable {}", v["name"]),
            format!("count by ({label}) ({metric})"),
        ));
    }
    assert!(out.len() >= 20, "{out:?}");
    out
}

/// The rule groups inside the PrometheusRule: the lines under `spec:`, one
/// level out (a plain Prometheus rules file).
fn rule_groups() -> String {
    let text = std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yaml")).unwrap();
    let spec = text
        .split_once("\nspec:\n")
        .expect("a PrometheusRule with a spec")
        .1;
    spec.lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

fn kube_node(name: &str, cordoned: bool, ready: ConditionStatus) -> Envelope {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    Envelope::new(
        Source::Kubernetes,
        now,
        Event::KubeNode(KubeNode {
            read_labels: None,
            maintenance: None,
            name: name.into(),
            unschedulable: cordoned,
            ready,
            conditions: vec![],
            labels: Default::default(),
            taints: vec![],
            identity: Default::default(),
            devices: Default::default(),
            version: 0,
        }),
    )
}

#[test]
fn prometheus_gets_data_for_every_dashboard_query_and_alert() {
    let ensure = Command::new(repo().join("scripts/ensure-prometheus.sh"))
        .status()
        .unwrap();
    assert!(ensure.success(), "scripts/ensure-prometheus.sh failed");
    let dir = temp_dir("metrics");

    // The rule groups are a valid rules file.
    std::fs::write(dir.join("rules.yaml"), rule_groups()).unwrap();
    let check = Command::new("promtool")
        .args(["check", "rules"])
        .arg(dir.join("rules.yaml"))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    let slurm = Slurm::up();
    // A clean start: every node in service, no job left from a last run.
    let _ = Command::new(Path::new(&slurm.env["LOCKSTEP_SLURM_BIN"]).join("scancel"))
        .args(["-u", "root"])
        .env("SLURM_CONF", &slurm.env["SLURM_CONF"])
        .status();
    for n in 1..=4 {
        let _ = Command::new(Path::new(&slurm.env["LOCKSTEP_SLURM_BIN"]).join("scontrol"))
            .args(["update", &format!("nodename=ls-n{n}"), "state=resume"])
            .env("SLURM_CONF", &slurm.env["SLURM_CONF"])
            .env_remove("SLURM_JWT")
            .output();
    }
    let nats = NatsServer::start();
    let telemetry = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        dir.join("policy.json"),
        serde_json::json!({
            "mapping": {"mode": "host"},
            "health": {"not_ready_grace_s": 1, "drains_per_minute_max": 1}
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("lockstep.toml"),
        format!(
            "data_dir = \"data\"\npolicy_file = \"policy.json\"\n[log]\nnats_url = \"{nats}\"\n\
             [service]\ntick_interval_ms = 250\n[telemetry]\nlisten = \"{telemetry}\"\n\
             [slurm]\nrest_url = \"{rest}\"\nrest_user = \"{user}\"\njwt_file = \"{jwt}\"\n\
             slurm_conf = \"{conf}\"\npoll_interval_ms = 300\n",
            nats = nats.url(),
            rest = slurm.env["SLURMRESTD_URL"],
            user = slurm.env["SLURM_JWT_USER"],
            jwt = slurm.env["SLURM_JWT_FILE"],
            conf = slurm.env["SLURM_CONF"],
        ),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        slurm.env["LOCKSTEP_SLURM_BIN"],
        std::env::var("PATH").unwrap_or_default()
    );
    let _lockstep = Proc(
        Command::new(env!("CARGO_BIN_EXE_lockstep"))
            .args(["run", "--config"])
            .arg(dir.join("lockstep.toml"))
            .env("PATH", path)
            .env_remove("SLURM_JWT")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("run.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let run_log = || std::fs::read_to_string(dir.join("run.log")).unwrap_or_default();
    wait_for("lockstep leads", Duration::from_secs(60), || {
        let (_, body) = get(&telemetry, "/status")?;
        body.contains("\"leader\":true").then_some(())
    });

    let prom_addr = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - rules.yaml\n\
             scrape_configs:\n  - job_name: lockstep\n    static_configs:\n      - targets: ['{telemetry}']\n"
        ),
    )
    .unwrap();
    let _prometheus = Proc(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom_addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .unwrap(),
    );

    // The world: a Kubernetes node per Slurm node, demand, a cordon, an
    // admin's drain, two NotReady nodes under a budget of one drain a minute.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let log = rt
        .block_on(EventLog::connect_nats(&nats.url(), &Default::default()))
        .unwrap();
    let append = |env: Envelope| {
        rt.block_on(log.append(&env)).unwrap();
    };
    for n in 1..=5 {
        append(kube_node(&format!("ls-n{n}"), false, ConditionStatus::True));
    }
    let job = slurm.run(
        "sbatch",
        &[
            "--parsable",
            "--output=/dev/null",
            "-N",
            "5",
            "--wrap",
            "sleep 600",
        ],
    );
    append(kube_node("ls-n1", true, ConditionStatus::True));
    wait_for(
        "lockstep's drain of ls-n1 in slurmctld",
        Duration::from_secs(60),
        || {
            let s = slurm.run("scontrol", &["show", "node", "ls-n1", "-o"]);
            s.contains("Reason=lockstep: kubernetes node ls-n1 cordoned")
                .then_some(())
        },
    );
    slurm.run(
        "scontrol",
        &[
            "update",
            "nodename=ls-n2",
            "state=drain",
            "reason=admin: disk",
        ],
    );
    append(kube_node("ls-n3", false, ConditionStatus::False));
    append(kube_node("ls-n4", false, ConditionStatus::False));

    // Until Prometheus has it all: the reaction measured, the admin's drain
    // seen, one node held by the rate bound, the demand.
    let prom = prom_addr.as_str();
    wait_for(
        "prometheus sees the story",
        Duration::from_secs(120),
        || {
            let ready = matches!(get(prom, "/-/ready"), Some((200, _)));
            let seen = ready
                && !query(
                    prom,
                    "lockstep_reaction_latency_seconds_count{kind=\"slurm_drain\"} > 0",
                )
                .is_empty()
                && !query(prom, "lockstep_drains{owner=\"other\"} > 0").is_empty()
                && !query(
                    prom,
                    "lockstep_health_held_nodes{rule=\"health.rate_limited\"} > 0",
                )
                .is_empty()
                && !query(
                    prom,
                    "lockstep_slurm_pending_nodes{partition=\"batch\"} >= 5",
                )
                .is_empty();
            seen.then_some(())
        },
    );
    // A series' first sample is no increase: the histograms get their
    // rates from a second round, uncordon (resume) and cordon again (drain),
    // measured after Prometheus has scraped the first.
    append(kube_node("ls-n1", false, ConditionStatus::True));
    wait_for(
        "lockstep's resume of ls-n1 in slurmctld",
        Duration::from_secs(60),
        || {
            let s = slurm.run("scontrol", &["show", "node", "ls-n1", "-o"]);
            (!s.contains("DRAIN")).then_some(())
        },
    );
    append(kube_node("ls-n1", true, ConditionStatus::True));
    wait_for(
        "the second drain measured",
        Duration::from_secs(120),
        || {
            let rising = [
                "rate(lockstep_reaction_latency_seconds_count{kind=\"slurm_drain\"}[5m]) > 0",
                "rate(lockstep_action_publish_latency_seconds_count{kind=\"slurm_drain\"}[5m]) > 0",
                "rate(lockstep_observation_age_seconds_count{source=\"kubernetes\"}[5m]) > 0",
                "rate(lockstep_observation_age_seconds_count{source=\"slurm\"}[5m]) > 0",
            ];
            rising
                .iter()
                .all(|q| !query(prom, q).is_empty())
                .then_some(())
        },
    );

    let mut empty = Vec::new();
    for (panel, expr) in dashboard_queries() {
        let r = query(prom, &expr);
        if !finite(&r) {
            empty.push(format!("{panel}: {expr} -> {r:?}"));
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data:\n{}\nlockstep log:\n{}",
        empty.join("\n"),
        run_log()
    );

    // The alerts, as Prometheus loaded them from the extracted groups.
    let (_, body) = get(prom, "/api/v1/rules?type=alert").unwrap();
    let rules: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rules: Vec<&serde_json::Value> = rules["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    let written = std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yaml"))
        .unwrap()
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    assert_eq!(
        rules.len(),
        written,
        "every rule of alerts.yaml loaded: {body}"
    );
    let mut missing = Vec::new();
    for rule in &rules {
        let name = rule["name"].as_str().unwrap();
        let expr = rule["query"].as_str().unwrap();
        assert_eq!(rule["health"], "ok", "{name}: {rule}");
        if !query(prom, expr).is_empty() {
            continue;
        }
        let sels = selectors(expr);
        assert!(!sels.is_empty(), "{name}: {expr}");
        for sel in sels {
            if query(prom, &sel).is_empty() {
                missing.push(format!("{name}: {sel}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "alert selectors without data:\n{}",
        missing.join("\n")
    );
    // What is true of this healthy cluster does not alert.
    for healthy in [
        "LockstepLeaderMissing",
        "LockstepSlurmInvisible",
        "LockstepLogLag",
    ] {
        let rule = rules.iter().find(|r| r["name"] == healthy).unwrap();
        assert!(
            query(prom, rule["query"].as_str().unwrap()).is_empty(),
            "{healthy} fires on a healthy cluster"
        );
    }

    // What lockstep serves passes promtool's lint and names no node.
    let (_, metrics) = get(&telemetry, "/metrics").unwrap();
    assert!(
        !metrics.contains("ls-n"),
        "a node name in a label:\n{metrics}"
    );
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        lint.stdin
            .take()
            .unwrap()
            .write_all(metrics.as_bytes())
            .unwrap();
    }
    let lint = lint.wait_with_output().unwrap();
    assert!(
        lint.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );

    slurm.run("scancel", &[job.trim()]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn selectors_are_found_inside_expressions() {
    // (expression, selectors)
    let cases: &[(&str, &[&str])] = &[
        (
            "sum(lockstep_leader) < 1 or absent(lockstep_leader)",
            &["lockstep_leader", "lockstep_leader"],
        ),
        (
            "sum by (kind) (rate(lockstep_action_outcomes_total{result=~\"failed|x\"}[10m])) / sum by (kind) (rate(lockstep_action_outcomes_total[10m]))",
            &[
                "lockstep_action_outcomes_total{result=~\"failed|x\"}",
                "lockstep_action_outcomes_total",
            ],
        ),
        ("max(lockstep_connector_visible{connector=\"slurm\"}) == 0", &["lockstep_connector_visible{connector=\"slurm\"}"]),
    ];
    for (expr, want) in cases {
        assert_eq!(selectors(expr), *want, "{expr}");
    }
}
