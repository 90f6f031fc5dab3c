//! Cross-checks against third-party slurmrestd material kept beside the
//! repository in `../shared/slurm-api` (not copied into the project; CI has
//! a copy of `shared/` beside the clone; the test fails, never skips, when it
//! is missing):
//!
//! - the published OpenAPI specs v0.0.38 .. v0.0.45: every node, job and
//!   partition field lockstep reads exists in that version with a type the
//!   parser accepts, and every field the specs define is either read or
//!   deliberately ignored (`connectors/src/slurm/fields.rs`);
//! - answers recorded from other sites' live 23.11 .. 25.11 clusters parse to
//!   the objects they show, including the two traps: an unknown node is HTTP
//!   200 without `nodes` (must not read as "no nodes"), an expired token is
//!   HTTP 511 with `"jobs": []` (must never read as "every job is gone").

use std::collections::BTreeMap;
use std::path::PathBuf;

use lockstep_connectors::slurm::parse::{self, FieldShape, SlurmObject};
use lockstep_connectors::slurm::{
    Backend, Error, Fetch, Observation, Observer, ObserverConfig, RestClient, RestConfig,
    TokenSource,
};
use lockstep_schemas::{
    Event, SlurmBaseState as B, SlurmJobState as J, SlurmNode, SlurmNodeFlag as F,
};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// `../shared/slurm-api` relative to the repository root.
fn shared() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/slurm-api");
    assert!(
        p.join("README.md").is_file(),
        "{} is missing: the cross-checks need the third-party slurmrestd material beside the repository (shared/slurm-api)",
        p.display()
    );
    p
}

fn read_json(rel: &str) -> Value {
    let p = shared().join(rel);
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn read_bytes(rel: &str) -> Vec<u8> {
    let p = shared().join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

// ------------------------------------------------------------------ specs

/// Every spec file of each openapi version, and the names of its node, job
/// and partition schemas.
fn specs() -> Vec<(u32, &'static str, [String; 3])> {
    let names = |v: u32| {
        [
            format!("v0.0.{v}_node"),
            format!("v0.0.{v}_job_info"),
            format!("v0.0.{v}_partition_info"),
        ]
    };
    let mut out = vec![
        (
            38,
            "openapi/v0038/openapi.json",
            [
                "v0.0.38_node".to_owned(),
                "v0.0.38_job_response_properties".to_owned(),
                "v0.0.38_partition".to_owned(),
            ],
        ),
        // 23.02's own v0.0.39 file is a template (the data parser fills it
        // in at run time): the full schemas are in what 24.05 served.
        (39, "openapi/served/24.05/openapi-v3.json", names(39)),
    ];
    let gen = [
        (40, "openapi/v0040/slurm-openapi.gen.json"),
        (41, "openapi/v0041/slurm-openapi.gen.json"),
        (41, "openapi/v0041/openapi_spec_v41.json"),
        (42, "openapi/v0042/slurm-openapi.gen.json"),
        (42, "openapi/v0042/openapi_spec_v42.json"),
        (43, "openapi/v0043/slurm-openapi.gen.json"),
        (43, "openapi/v0043/openapi_spec_v43.json"),
        (44, "openapi/v0044/slurm-openapi.gen.json"),
        (44, "openapi/v0044/openapi_spec_v44.json"),
        (44, "openapi/served/25.11/openapi-v3.json"),
        (45, "openapi/v0045/slurm-openapi.gen.json"),
        (45, "openapi/v0045/openapi_spec_v45.json"),
    ];
    out.extend(gen.into_iter().map(|(v, f)| (v, f, names(v))));
    out
}

/// A schema with its `$ref`s (and single-entry `allOf`s) followed.
fn resolve<'a>(spec: &'a Value, mut s: &'a Value) -> &'a Value {
    for _ in 0..16 {
        if let Some(r) = s.get("$ref").and_then(Value::as_str) {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("unexpected $ref {r}"));
            s = &spec["components"]["schemas"][name];
        } else if let Some([only]) = s.get("allOf").and_then(Value::as_array).map(Vec::as_slice) {
            s = only;
        } else {
            return s;
        }
    }
    panic!("$ref chain too long");
}

fn type_of(s: &Value) -> &str {
    s.get("type").and_then(Value::as_str).unwrap_or("")
}

/// Whether the parser's `shape` accepts what the schema `s` allows.
fn accepts(spec: &Value, shape: FieldShape, s: &Value) -> Result<(), String> {
    let s = resolve(spec, s);
    let prop = |name: &str| {
        s.get("properties")
            .and_then(|p| p.get(name))
            .map(|p| resolve(spec, p))
    };
    let ok = match (shape, type_of(s)) {
        (FieldShape::Text, "string") => true,
        (FieldShape::Words, "string") => true,
        (FieldShape::Words, "array") => {
            type_of(resolve(spec, s.get("items").unwrap_or(&Value::Null))) == "string"
        }
        (FieldShape::Count, "integer") => true,
        (FieldShape::Count, "object") => prop("number").is_some_and(|n| type_of(n) == "integer"),
        (FieldShape::PartitionNodes, "string") => true,
        (FieldShape::PartitionNodes, "object") => {
            prop("configured").is_some_and(|n| type_of(n) == "string")
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{shape:?} cannot read {}", s))
    }
}

/// The versions in which the published specs have a field lockstep reads.
/// A field the parser starts reading must be added here.
fn present_in(object: SlurmObject, field: &str) -> std::ops::RangeInclusive<u32> {
    match (object, field) {
        // 22.05 splits the state into a word and its flags; 23.02+ send one
        // list.
        (SlurmObject::Node, "state_flags") => 38..=38,
        // Per-node topology is 25.05's (v0.0.43).
        (SlurmObject::Node, "topology") => 43..=45,
        (
            SlurmObject::Node,
            "name" | "state" | "reason" | "reason_set_by_user" | "features" | "active_features"
            | "partitions",
        )
        | (
            SlurmObject::Job,
            "job_id" | "job_state" | "partition" | "nodes" | "node_count" | "state_reason",
        )
        | (SlurmObject::Partition, "name" | "nodes") => 38..=45,
        _ => panic!("{object:?}.{field}: say in which versions the specs have it"),
    }
}

const OBJECTS: [SlurmObject; 3] = [SlurmObject::Node, SlurmObject::Job, SlurmObject::Partition];

#[test]
fn every_field_lockstep_reads_exists_with_a_type_it_accepts_in_every_published_spec() {
    let mut problems = Vec::new();
    let mut checked = BTreeMap::new();
    for (v, file, names) in specs() {
        let spec = read_json(file);
        for (object, name) in OBJECTS.iter().zip(&names) {
            let schema = resolve(&spec, &spec["components"]["schemas"][name.as_str()]);
            let props = schema
                .get("properties")
                .and_then(Value::as_object)
                .unwrap_or_else(|| panic!("{file}: no schema {name}"));
            for (field, shape) in parse::fields_read(*object) {
                let want = present_in(*object, field).contains(&v);
                match (props.get(*field), want) {
                    (Some(s), true) => {
                        if let Err(e) = accepts(&spec, *shape, s) {
                            problems.push(format!("{file}: {name}.{field}: {e}"));
                        }
                        *checked.entry(v).or_insert(0) += 1;
                    }
                    (None, true) => problems.push(format!("{file}: {name} has no {field}")),
                    (Some(_), false) => {
                        problems.push(format!("{file}: {name} has {field}: widen present_in()"))
                    }
                    (None, false) => {}
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(
        checked.keys().copied().collect::<Vec<_>>(),
        (38..=45).collect::<Vec<_>>()
    );
}

#[test]
fn every_field_the_published_specs_define_is_read_or_deliberately_ignored() {
    let mut unaccounted = Vec::new();
    for (_, file, names) in specs() {
        let spec = read_json(file);
        for (object, name) in OBJECTS.iter().zip(&names) {
            let schema = resolve(&spec, &spec["components"]["schemas"][name.as_str()]);
            for field in schema["properties"].as_object().unwrap().keys() {
                let read = parse::fields_read(*object).iter().any(|(f, _)| f == field);
                if !read && !parse::field_ignored(*object, field) {
                    unaccounted.push(format!("{file}: {name}.{field}"));
                }
            }
        }
    }
    assert!(
        unaccounted.is_empty(),
        "neither read nor listed in connectors/src/slurm/fields.rs:\n{}",
        unaccounted.join("\n")
    );
}

// ------------------------------------------------------------------ answers

fn node(name: &str, state: B, flags: &[F], reason: Option<(&str, &str)>, part: &str) -> SlurmNode {
    SlurmNode {
        name: name.into(),
        state,
        flags: flags.to_vec(),
        reason: reason.map(|r| r.0.to_owned()),
        reason_user: reason.map(|r| r.1.to_owned()),
        features: vec![],
        topology: None,
        partitions: vec![part.into()],
        version: 0,
    }
}

#[test]
fn other_sites_recorded_nodes_parse_to_the_states_they_show() {
    let ecc = Some(("ECC memory error", "root"));
    let dead = Some(("CPU dead", "root"));
    let ecc_s = Some(("ECC memory error", "slurm"));
    let dead_s = Some(("CPU dead", "slurm"));
    let rows: Vec<(&str, Vec<SlurmNode>)> = vec![
        (
            "fixtures/slurm-web/23.11/slurm-nodes.json",
            vec![
                node("cn1", B::Idle, &[F::Drain], ecc, "standard"),
                node("cn2", B::Mixed, &[], None, "standard"),
                node("cn3", B::Allocated, &[], None, "standard"),
                node("cn4", B::Down, &[], dead, "standard"),
                node("ia1", B::Idle, &[], None, "ia"),
                node("ia2", B::Idle, &[], None, "ia"),
            ],
        ),
        (
            "fixtures/slurm-web/24.05/0.0.41/slurm-node-draining.json",
            vec![node("cn1", B::Mixed, &[F::Drain], ecc, "normal")],
        ),
        (
            "fixtures/slurm-web/24.11/0.0.42/slurm-nodes.json",
            vec![
                node("cn1", B::Idle, &[], None, "standard"),
                node("cn2", B::Idle, &[], None, "standard"),
                node("cn3", B::Down, &[], dead_s, "standard"),
                node("cn4", B::Idle, &[F::Drain], ecc_s, "standard"),
                node("ia1", B::Idle, &[F::Completing], None, "ia"),
                node("ia2", B::Idle, &[], None, "ia"),
            ],
        ),
        (
            "fixtures/slurm-web/25.05/0.0.43/slurm-nodes.json",
            vec![
                node("cn1", B::Idle, &[], None, "normal"),
                node("cn2", B::Idle, &[], None, "normal"),
                node("cn3", B::Idle, &[F::Drain], ecc_s, "normal"),
                node("cn4", B::Down, &[], dead_s, "normal"),
                node("gpu1", B::Idle, &[F::Completing], None, "gpu"),
                node("gpu2", B::Idle, &[], None, "gpu"),
            ],
        ),
        (
            "fixtures/slurm-web/25.11/0.0.44/slurm-nodes.json",
            vec![
                node("cn1", B::Idle, &[F::Drain], ecc_s, "normal"),
                node("cn2", B::Down, &[], dead_s, "normal"),
                node("cn3", B::Allocated, &[], None, "normal"),
                node("cn4", B::Mixed, &[], None, "normal"),
                node("gpu1", B::Idle, &[], None, "gpu"),
                node("gpu2", B::Idle, &[], None, "gpu"),
                node("gpu3", B::Idle, &[], None, "gpu"),
                node("gpu4", B::Idle, &[], None, "gpu"),
            ],
        ),
        (
            "fixtures/slurm-web/25.11/0.0.44/slurm-node-drain.json",
            vec![node("cn2", B::Idle, &[F::Drain], ecc, "normal")],
        ),
    ];
    for (file, want) in rows {
        let l = parse::nodes(&read_bytes(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(l.items, want, "{file}");
        assert!(l.errors.is_empty(), "{file}");
        assert!(l.last_update.is_some_and(|t| t > 1_700_000_000), "{file}");
    }
}

/// Job id, state, nodes, node count, pending reason.
type JobSummary = (u64, J, Vec<String>, u32, Option<String>);

#[test]
fn other_sites_recorded_jobs_parse_to_what_they_show() {
    let file = "fixtures/slurm-web/25.11/0.0.44/slurm-jobs.json";
    let l = parse::jobs(&read_bytes(file)).unwrap();
    let got: Vec<JobSummary> = l
        .items
        .iter()
        .map(|j| {
            (
                j.job_id,
                j.state.clone(),
                j.nodes.iter().map(ToString::to_string).collect(),
                j.node_count,
                j.pending_reason.clone(),
            )
        })
        .collect();
    assert_eq!(got.len(), 15);
    let cn1 = || vec!["cn1".to_owned()];
    assert_eq!(
        got[0],
        (5736, J::Cancelled, vec!["gpu1".to_owned()], 1, None)
    );
    assert_eq!(got[1], (5737, J::Timeout, cn1(), 1, None));
    assert_eq!(got[3], (5739, J::Failed, cn1(), 1, None));
    assert_eq!(got[9], (5745, J::Running, cn1(), 1, None));
    assert_eq!(
        got[14],
        (5750, J::Pending, vec![], 2, Some("BeginTime".to_owned()))
    );
    assert!(l
        .items
        .iter()
        .all(|j| j.partition == "normal" || j.partition == "gpu"));
}

#[test]
fn every_field_of_other_sites_answers_is_read_or_deliberately_ignored() {
    let files = [
        "fixtures/slurm-web/23.11/slurm-nodes.json",
        "fixtures/slurm-web/24.05/0.0.41/slurm-node-draining.json",
        "fixtures/slurm-web/24.11/0.0.42/slurm-nodes.json",
        "fixtures/slurm-web/25.05/0.0.43/slurm-nodes.json",
        "fixtures/slurm-web/25.11/0.0.44/slurm-nodes.json",
        "fixtures/slurm-web/25.11/0.0.44/slurm-node-drain.json",
        "fixtures/slurm-web/25.11/0.0.44/slurm-jobs.json",
    ];
    let mut unaccounted = Vec::new();
    for file in files {
        let v = read_json(file);
        for (key, object) in [("nodes", SlurmObject::Node), ("jobs", SlurmObject::Job)] {
            for item in v.get(key).and_then(Value::as_array).into_iter().flatten() {
                for field in item.as_object().unwrap().keys() {
                    let read = parse::fields_read(object).iter().any(|(f, _)| f == field);
                    if !read && !parse::field_ignored(object, field) {
                        unaccounted.push(format!("{file}: {key}.{field}"));
                    }
                }
            }
        }
    }
    unaccounted.dedup();
    assert!(unaccounted.is_empty(), "{}", unaccounted.join("\n"));
}

// ------------------------------------------------------------------ the traps

type Routes = std::sync::Arc<std::sync::Mutex<Vec<(&'static str, u16, Vec<u8>)>>>;

/// A slurmrestd stand-in that answers every request for a path starting
/// with one of the routes with that route's status and body (one request
/// per connection), and everything else with 404. The routes can be changed
/// while it runs.
async fn serve(routes: Vec<(&'static str, u16, Vec<u8>)>) -> (String, Routes) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let shared: Routes = std::sync::Arc::new(std::sync::Mutex::new(routes));
    let routes = std::sync::Arc::clone(&shared);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let routes = std::sync::Arc::clone(&routes);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf);
                let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                let (status, body) = routes
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|(p, _, _)| path.starts_with(p))
                    .map_or((404, Vec::new()), |(_, s, b)| (*s, b.clone()));
                let mut resp = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                resp.extend_from_slice(&body);
                let _ = conn.write_all(&resp).await;
            });
        }
    });
    (url, shared)
}

/// A client of `url` with a token file of its own: the tests run on
/// threads of one process, and a file they shared could be read while
/// another test rewrites it.
fn client(url: &str) -> RestClient {
    let token = lockstep_testkit::temp_dir("slurm-api").join("token");
    std::fs::write(&token, "SLURM_JWT=a.b.c\n").unwrap();
    let mut c = RestConfig::new(url, "root", TokenSource::File(token));
    c.openapi_version = lockstep_connectors::slurm::ApiVersion::parse("v0.0.44");
    RestClient::new(c).unwrap()
}

#[tokio::test]
async fn an_unknown_node_answered_200_without_nodes_is_no_such_node_never_no_nodes() {
    let body = read_bytes("fixtures/slurm-web/25.11/0.0.44/slurm-node-unfound.json");
    // The same answer for one node and, as a lookalike, for the list.
    let (url, _) = serve(vec![
        ("/slurm/v0.0.44/node/unexisting-node", 200, body.clone()),
        ("/slurm/v0.0.44/nodes", 200, body),
    ])
    .await;
    let rest = client(&url);
    assert_eq!(rest.node("unexisting-node").await.unwrap(), None);
    match rest.nodes(None).await {
        Err(e) => assert!(e.to_string().contains("Failure to query node"), "{e}"),
        Ok(f) => panic!("a list without nodes must be an error, got {f:?}"),
    }
    // The observer: no node is gone, and it says it lost sight of Slurm.
    let mut obs = Observer::new(
        Backend::Rest(rest),
        ObserverConfig {
            lost_after_failures: 1,
            ..ObserverConfig::default()
        },
    );
    let seen = obs.poll().await;
    assert!(
        !seen.iter().any(|Observation { event: e, .. }| matches!(
            e,
            Event::SlurmNodeGone { .. } | Event::SyncDone { .. }
        )),
        "{seen:?}"
    );
    assert!(!obs.visible());
}

#[tokio::test]
async fn an_expired_token_answered_511_with_no_jobs_never_makes_jobs_gone() {
    let expired = read_bytes("fixtures/slurm-web/25.11/0.0.44/slurm-jwt-expired-token.json");
    let nodes = read_bytes("fixtures/slurm-web/25.11/0.0.44/slurm-nodes.json");
    let jobs = read_bytes("fixtures/slurm-web/25.11/0.0.44/slurm-jobs.json");
    let parts =
        br#"{"partitions": [], "last_update": {"set": true, "number": 1762942546}}"#.to_vec();
    let (url, routes) = serve(vec![
        ("/slurm/v0.0.44/nodes", 200, nodes.clone()),
        ("/slurm/v0.0.44/jobs", 200, jobs),
        ("/slurm/v0.0.44/partitions", 200, parts.clone()),
    ])
    .await;
    // One observer: a good full listing, then the token expires.
    let mut obs = Observer::new(
        Backend::Rest(client(&url)),
        ObserverConfig {
            lost_after_failures: 2,
            resync_every_polls: 2,
            ..ObserverConfig::default()
        },
    );
    obs.poll().await;
    assert_eq!(obs.jobs().len(), 15);
    *routes.lock().unwrap() = vec![
        ("/slurm/v0.0.44/nodes", 200, nodes),
        ("/slurm/v0.0.44/jobs", 511, expired.clone()),
        ("/slurm/v0.0.44/partitions", 200, parts),
    ];
    let rest = client(&url);
    for since in [None, Some(1_762_942_000)] {
        match rest.jobs(since).await {
            Err(Error::Unauthorized { .. }) => {}
            r => panic!("511 with \"jobs\": [] must be an authentication failure, got {r:?}"),
        }
    }
    // Polls with and without update_time (resync_every_polls: 2): the jobs
    // it listed stay, none is gone, and it reports losing sight of Slurm.
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.extend(obs.poll().await);
    }
    assert!(
        !seen.iter().any(|Observation { event: e, .. }| matches!(
            e,
            Event::SlurmJobGone { .. } | Event::SyncDone { .. }
        )),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|Observation { event: e, .. }| matches!(
            e,
            Event::ConnectorStatus { visible: false, .. }
        )),
        "{seen:?}"
    );
    assert_eq!(obs.jobs().len(), 15, "the listed jobs stay");
    // The same body under HTTP 200 is an error answer too, never a list.
    *routes.lock().unwrap() = vec![("/slurm/v0.0.44/jobs", 200, expired)];
    match client(&url).jobs(None).await {
        Err(e) => assert!(
            e.to_string().contains("Protocol authentication error"),
            "{e}"
        ),
        Ok(Fetch::Changed(l)) => panic!("an error answer read as a list of {}", l.items.len()),
        Ok(Fetch::Unchanged) => panic!("an error answer read as unchanged"),
    }
}
