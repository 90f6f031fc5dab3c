//! Protocol tests of lockstep's slurmrestd client, not Slurm tests: request
//! bodies, version probing and client failure modes (401, hangs, refused
//! connections, error answers), against a small local HTTP server that
//! serves answers hand-written from the published v0.0.41 / v0.0.44 schemas.
//! The same paths against real 24.11 and 26.05 servers are in `slurm.rs`;
//! real recorded answers in `slurm_parse.rs`, `slurm_fields.rs` and
//! `slurm_api.rs`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockstep_connectors::slurm::{
    Actuator, ActuatorConfig, ApiVersion, Backend, Observation, Observer, ObserverConfig,
    RestClient, RestConfig, TokenSource,
};
use lockstep_schemas::{Action, Event, OutcomeResult, ReasonOwnership};
use lockstep_testkit::issued;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone)]
struct Req {
    method: String,
    path: String,
    user: String,
    token: String,
    body: String,
}

type Handler = Arc<dyn Fn(&Req) -> Option<(u16, String)> + Send + Sync>;

/// A fake slurmrestd: answers each request with what the handler returns
/// (`None`: never answers), records every request.
struct Fake {
    url: String,
    seen: Arc<Mutex<Vec<Req>>>,
}

impl Fake {
    async fn start(
        handler: impl Fn(&Req) -> Option<(u16, String)> + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let s = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, Arc::clone(&handler), Arc::clone(&s)));
            }
        });
        Self { url, seen }
    }

    fn requests(&self) -> Vec<Req> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(mut conn: TcpStream, handler: Handler, seen: Arc<Mutex<Vec<Req>>>) {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.lines();
        let mut first = lines.next().unwrap_or("").split_whitespace();
        let (method, path) = (
            first.next().unwrap_or("").to_owned(),
            first.next().unwrap_or("").to_owned(),
        );
        let (mut len, mut user, mut token) = (0, String::new(), String::new());
        for l in lines {
            if let Some((k, v)) = l.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "content-length" => len = v.trim().parse().unwrap_or(0),
                    "x-slurm-user-name" => user = v.trim().to_owned(),
                    "x-slurm-user-token" => token = v.trim().to_owned(),
                    _ => {}
                }
            }
        }
        while buf.len() < head_end + len {
            let mut chunk = [0u8; 4096];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = String::from_utf8_lossy(&buf[head_end..head_end + len]).into_owned();
        buf.drain(..head_end + len);
        let req = Req {
            method,
            path,
            user,
            token,
            body,
        };
        seen.lock().unwrap().push(req.clone());
        let Some((status, body)) = handler(&req) else {
            // Never answer; keep the connection open.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return;
        };
        let resp = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if conn.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn fixture(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("slurm/fixtures")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The fixture's answer with only node `name`, as `GET /node/{name}` gives.
fn one_node(version: &str, name: &str) -> String {
    let mut v: serde_json::Value =
        serde_json::from_str(&fixture(&format!("openapi-{version}/nodes.json"))).unwrap();
    v["nodes"]
        .as_array_mut()
        .unwrap()
        .retain(|n| n["name"] == name);
    v.to_string()
}

const TOKEN: &str = "fake.jwt.token";

fn token_file() -> PathBuf {
    static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("lockstep-fake-slurm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("token");
        std::fs::write(&p, format!("SLURM_JWT={TOKEN}\n")).unwrap();
        p
    })
    .clone()
}

fn client(url: &str, timeout_ms: u64) -> RestClient {
    let mut c = RestConfig::new(url, "root", TokenSource::File(token_file()));
    c.request_timeout_ms = timeout_ms;
    c.connect_timeout_ms = timeout_ms;
    RestClient::new(c).unwrap()
}

/// A slurmrestd serving only `version`, from the hand-written fixtures;
/// node updates answer with `update`.
async fn slurmrestd(version: &'static str, update: (u16, &'static str)) -> Fake {
    Fake::start(move |r| {
        let base = format!("/slurm/{version}/");
        let Some(rest) = r.path.strip_prefix(&base) else {
            return Some((404, "Unable to find plugin".to_owned()));
        };
        Some(match (r.method.as_str(), rest) {
            ("GET", "ping") => (200, "{\"pings\": [], \"errors\": []}".to_owned()),
            ("GET", p) if p.starts_with("node/") => (200, one_node(version, &p[5..])),
            ("POST", p) if p.starts_with("node/") => (update.0, update.1.to_owned()),
            ("GET", p) if p.starts_with("nodes") => {
                (200, fixture(&format!("openapi-{version}/nodes.json")))
            }
            ("GET", p) if p.starts_with("jobs") => {
                (200, fixture(&format!("openapi-{version}/jobs.json")))
            }
            ("GET", p) if p.starts_with("partitions") => {
                (200, fixture(&format!("openapi-{version}/partitions.json")))
            }
            _ => (404, String::new()),
        })
    })
    .await
}

/// lockstep's drains are those with the default reason prefix.
fn owned() -> tokio::sync::watch::Receiver<ReasonOwnership> {
    let ownership = ReasonOwnership {
        prefix: "lockstep:".to_owned(),
        ..ReasonOwnership::default()
    };
    tokio::sync::watch::channel(ownership).1
}

const OK: (u16, &str) = (200, "{\"errors\": [], \"warnings\": []}");

#[tokio::test]
async fn newer_slurm_updates_nodes_through_rest_idempotently() {
    let fake = slurmrestd("v0.0.44", OK).await;
    let rest = client(&fake.url, 5_000);
    assert_eq!(rest.version().await.unwrap(), ApiVersion(44));
    let act = Actuator::new(Some(rest), None, owned(), ActuatorConfig::default()).unwrap();
    let run = |a: Action| {
        let act = &act;
        async move { act.execute(&issued(7, a)).await.result }
    };

    // ls-n1 is allocated: drain it (POST), with the published update_node_msg.
    let drain = Action::SlurmDrain {
        node: "ls-n1".to_owned(),
        reason: "lockstep: cordoned".to_owned(),
    };
    assert_eq!(run(drain).await, OutcomeResult::Succeeded);
    // ls-n2 is drained by root with a reason not lockstep's, ls-n4 down
    // by slurmctld: neither a drain nor a resume touches them.
    let drained = "IDLE+DRAIN by root: lockstep fixture: disk check";
    let down = "DOWN+NOT_RESPONDING by root: Not responding";
    for (a, held_by) in [
        (
            Action::SlurmDrain {
                node: "ls-n2".to_owned(),
                reason: "lockstep fixture: disk check".to_owned(),
            },
            drained,
        ),
        (
            Action::SlurmResume {
                node: "ls-n2".to_owned(),
            },
            drained,
        ),
        (
            Action::SlurmResume {
                node: "ls-n4".to_owned(),
            },
            down,
        ),
    ] {
        let want = OutcomeResult::Declined {
            held_by: held_by.to_owned(),
        };
        assert_eq!(run(a.clone()).await, want, "{a:?}");
    }
    // ls-n3 has these features and this topology; ls-n1 is not drained, so
    // there is nothing to resume.
    let already = [
        Action::SlurmSetFeatures {
            node: "ls-n3".to_owned(),
            features: vec!["zone-a".to_owned(), "gpu".to_owned()],
        },
        Action::SlurmSetTopology {
            node: "ls-n3".to_owned(),
            topology: "default:s2".to_owned(),
        },
        Action::SlurmResume {
            node: "ls-n1".to_owned(),
        },
    ];
    for a in already {
        assert_eq!(run(a.clone()).await, OutcomeResult::AlreadyDone, "{a:?}");
    }
    let more = [
        Action::SlurmSetTopology {
            node: "ls-n3".to_owned(),
            topology: "default:s9".to_owned(),
        },
        Action::SlurmSetFeatures {
            node: "ls-n1".to_owned(),
            features: vec!["gpu".to_owned()],
        },
        Action::SlurmDown {
            node: "ls-n3".to_owned(),
            reason: "lockstep: gpu xid".to_owned(),
        },
    ];
    for a in more {
        assert_eq!(run(a.clone()).await, OutcomeResult::Succeeded, "{a:?}");
    }
    let posts: Vec<(String, serde_json::Value)> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| (r.path, serde_json::from_str(&r.body).unwrap()))
        .collect();
    let want = [
        (
            "/slurm/v0.0.44/node/ls-n1",
            serde_json::json!({"state": ["DRAIN"], "reason": "lockstep: cordoned", "reason_uid": "root"}),
        ),
        (
            "/slurm/v0.0.44/node/ls-n3",
            serde_json::json!({"topology_str": "default:s9"}),
        ),
        (
            "/slurm/v0.0.44/node/ls-n1",
            serde_json::json!({"features": ["gpu"], "features_act": ["gpu"]}),
        ),
        (
            "/slurm/v0.0.44/node/ls-n3",
            serde_json::json!({"state": ["DOWN"], "reason": "lockstep: gpu xid", "reason_uid": "root"}),
        ),
    ];
    assert_eq!(posts.len(), want.len(), "{posts:?}");
    for ((path, body), (wpath, wbody)) in posts.iter().zip(want) {
        assert_eq!((path.as_str(), body), (wpath, &wbody));
    }
    for r in fake.requests() {
        assert_eq!(
            (r.user.as_str(), r.token.as_str()),
            ("root", TOKEN),
            "{} {}",
            r.method,
            r.path
        );
    }
}

#[tokio::test]
async fn the_highest_served_version_is_used_and_topology_needs_v0_0_43() {
    let fake = slurmrestd("v0.0.41", OK).await;
    let rest = client(&fake.url, 5_000);
    assert_eq!(rest.version().await.unwrap(), ApiVersion(41));
    let probed: Vec<String> = fake.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        probed,
        [
            "/slurm/v0.0.45/ping",
            "/slurm/v0.0.44/ping",
            "/slurm/v0.0.43/ping",
            "/slurm/v0.0.42/ping",
            "/slurm/v0.0.41/ping"
        ]
    );
    let act = Actuator::new(Some(rest), None, owned(), ActuatorConfig::default()).unwrap();
    let topo = issued(
        7,
        Action::SlurmSetTopology {
            node: "ls-n1".to_owned(),
            topology: "default:s1".to_owned(),
        },
    );
    match act.execute(&topo).await.result {
        OutcomeResult::Failed {
            retryable: false,
            error,
        } => {
            assert!(
                error.contains("25.05") && error.contains("v0.0.41"),
                "{error}"
            );
        }
        r => panic!("{r:?}"),
    }
    // Drains still go through REST on v0.0.41.
    let drain = issued(
        7,
        Action::SlurmDrain {
            node: "ls-n1".to_owned(),
            reason: "lockstep: x".to_owned(),
        },
    );
    assert_eq!(act.execute(&drain).await.result, OutcomeResult::Succeeded);
}

#[tokio::test]
async fn slurm_errors_are_classified() {
    let cases: [(u16, &'static str, bool); 3] = [
        (
            500,
            r#"{"errors": [{"description": "update failed", "error_number": 2018, "error": "Invalid node name specified", "source": "slurm_update_node"}]}"#,
            false,
        ),
        (
            200,
            r#"{"errors": [{"error_number": 2016, "error": "Invalid node state specified"}]}"#,
            false,
        ),
        (
            500,
            r#"{"errors": [{"error_number": 1007, "error": "Unable to contact slurm controller (connect failure)"}]}"#,
            true,
        ),
    ];
    for (status, body, retryable) in cases {
        let fake = slurmrestd("v0.0.42", (status, body)).await;
        let act = Actuator::new(
            Some(client(&fake.url, 5_000)),
            None,
            owned(),
            ActuatorConfig::default(),
        )
        .unwrap();
        let drain = issued(
            7,
            Action::SlurmDrain {
                node: "ls-n1".to_owned(),
                reason: "lockstep: x".to_owned(),
            },
        );
        match act.execute(&drain).await.result {
            OutcomeResult::Failed {
                retryable: r,
                error,
            } => assert_eq!(r, retryable, "{error}"),
            r => panic!("{body}: {r:?}"),
        }
    }
}

#[tokio::test]
async fn a_401_rereads_the_token_once_then_gives_up() {
    let calls = Arc::new(Mutex::new(0));
    let c = Arc::clone(&calls);
    let fake = Fake::start(move |_| {
        let mut n = c.lock().unwrap();
        *n += 1;
        Some(if *n == 1 {
            (401, "Authentication failure".to_owned())
        } else {
            (200, "{}".to_owned())
        })
    })
    .await;
    let rest = client(&fake.url, 5_000);
    assert_eq!(rest.get_raw("/slurm/v0.0.44/ping").await.unwrap().0, 200);
    assert_eq!(fake.requests().len(), 2);

    let always = Fake::start(|_| Some((401, "Authentication failure".to_owned()))).await;
    let e = client(&always.url, 5_000).version().await.unwrap_err();
    assert!(e.to_string().contains("rejected the jwt"), "{e}");
    assert!(e.retryable());
    assert!(!e.to_string().contains(TOKEN));
}

#[tokio::test]
async fn a_hanging_slurmrestd_never_hangs_an_action_or_the_observer() {
    let fake = Fake::start(|_| None).await;
    let act = Actuator::new(
        Some(client(&fake.url, 60_000)),
        None,
        owned(),
        ActuatorConfig {
            action_timeout_ms: 300,
            ..ActuatorConfig::default()
        },
    )
    .unwrap();
    let t = Instant::now();
    let out = act
        .execute(&issued(
            7,
            Action::SlurmResume {
                node: "ls-n1".to_owned(),
            },
        ))
        .await;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    match out.result {
        OutcomeResult::Failed {
            retryable: true,
            error,
        } => assert!(error.contains("timed out"), "{error}"),
        r => panic!("{r:?}"),
    }

    let mut obs = Observer::new(
        Backend::Rest(client(&fake.url, 200)),
        ObserverConfig::default(),
    );
    let t = Instant::now();
    let mut events = obs.poll().await;
    events.extend(obs.poll().await);
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(!obs.visible());
    assert!(
        matches!(
            &events[..],
            [Observation { event: Event::ConnectorStatus { visible: false, detail, .. }, .. }] if detail.contains("timed out after 200 ms")
        ),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_refused_connection_is_reported_and_retried_with_backoff() {
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let mut obs = Observer::new(
        Backend::Rest(client(&url, 1_000)),
        ObserverConfig::default(),
    );
    assert!(obs.poll().await.is_empty(), "one failure is not yet a loss");
    assert_eq!(obs.next_delay(), Duration::from_millis(500));
    let lost = obs.poll().await;
    assert!(
        matches!(&lost[..], [Observation { event: Event::ConnectorStatus { visible: false, detail, .. }, .. }] if detail.contains("cannot reach slurmrestd")),
        "{lost:?}"
    );
    assert_eq!(obs.next_delay(), Duration::from_millis(1_000));
    assert!(obs.poll().await.is_empty(), "the loss is reported once");
    let act = Actuator::new(
        Some(client(&url, 1_000)),
        None,
        owned(),
        ActuatorConfig::default(),
    )
    .unwrap();
    let out = act
        .execute(&issued(
            7,
            Action::SlurmResume {
                node: "ls-n1".to_owned(),
            },
        ))
        .await;
    assert!(
        matches!(
            out.result,
            OutcomeResult::Failed {
                retryable: true,
                ..
            }
        ),
        "{out:?}"
    );
}

#[tokio::test]
async fn the_observer_lists_then_polls_with_update_time_and_never_takes_errors_as_gone() {
    let mode = Arc::new(Mutex::new("list"));
    let m = Arc::clone(&mode);
    let fake = Fake::start(move |r| {
        let mode = *m.lock().unwrap();
        Some(match (mode, r.path.as_str()) {
            (_, "/slurm/v0.0.44/ping") => (200, "{}".to_owned()),
            (_, p) if !p.starts_with("/slurm/v0.0.44/") => (404, String::new()),
            ("unchanged", p) if p.contains("update_time=") => (304, String::new()),
            ("down", p) if p.contains("/nodes") => {
                (500, fixture("openapi-v0.0.44/nodes-controller-down.json"))
            }
            (_, p) if p.contains("/nodes") => (200, fixture("openapi-v0.0.44/nodes.json")),
            (_, p) if p.contains("/jobs") => (200, fixture("openapi-v0.0.44/jobs.json")),
            (_, p) if p.contains("/partitions") => {
                (200, fixture("openapi-v0.0.44/partitions.json"))
            }
            _ => (404, String::new()),
        })
    })
    .await;
    let config = ObserverConfig {
        resync_every_polls: 3,
        ..ObserverConfig::default()
    };
    let mut obs = Observer::new(Backend::Rest(client(&fake.url, 5_000)), config);
    let first: Vec<Event> = obs.poll().await.into_iter().map(|o| o.event).collect();
    let kinds: Vec<&str> = first.iter().map(Event::kind).collect();
    assert_eq!(
        kinds,
        [
            "connector_status",
            "sync_started",
            "slurm_node",
            "slurm_node",
            "slurm_node",
            "slurm_node",
            "sync_done",
            "sync_started",
            "slurm_job",
            "slurm_job",
            "slurm_job",
            "slurm_job",
            "sync_done",
            "sync_started",
            "slurm_partition",
            "sync_done"
        ]
    );
    // Same data again (200): nothing new.
    assert!(obs.poll().await.is_empty());
    // 304s: nothing, and the polls carried update_time.
    *mode.lock().unwrap() = "unchanged";
    let n = fake.requests().len();
    assert!(obs.poll().await.is_empty());
    let stats = obs.last_poll();
    assert_eq!(
        (stats.unchanged, stats.fetched, stats.failed),
        (3, 0, false)
    );
    let polled = fake.requests()[n..].to_vec();
    assert_eq!(polled.len(), 3, "{polled:?}");
    assert!(
        polled.iter().all(|r| r.path.contains("?update_time=")),
        "{polled:?}"
    );
    // Every third poll is a full listing (resync_every_polls = 3): no
    // update_time, every object again, without a status change.
    let n = fake.requests().len();
    let resync = obs.poll().await;
    assert_eq!(resync.len(), first.len() - 1);
    assert!(fake.requests()[n..]
        .iter()
        .all(|r| !r.path.contains("update_time")));
    assert!(obs.poll().await.is_empty());

    // slurmctld down behind slurmrestd: an error listing, not "all gone".
    *mode.lock().unwrap() = "down";
    let mut down = Vec::new();
    for _ in 0..3 {
        down.extend(obs.poll().await);
    }
    assert!(
        matches!(&down[..], [Observation { event: Event::ConnectorStatus { visible: false, detail, .. }, .. }] if detail.contains("Unable to contact slurm controller")),
        "{down:?}"
    );
    assert_eq!(obs.nodes().len(), 4);
    // Back: visible, then every domain listed in full (what left during
    // the blackout is gone by absence), as on the first poll.
    *mode.lock().unwrap() = "list";
    let back: Vec<Event> = obs.poll().await.into_iter().map(|o| o.event).collect();
    assert!(
        matches!(&back[0], Event::ConnectorStatus { visible: true, .. }),
        "{back:?}"
    );
    assert_eq!(back.iter().map(Event::kind).collect::<Vec<_>>(), kinds);
}

#[tokio::test]
async fn run_sends_every_observation_and_stops_when_the_channel_closes() {
    let fake = slurmrestd("v0.0.44", OK).await;
    let obs = Observer::new(
        Backend::Rest(client(&fake.url, 5_000)),
        ObserverConfig {
            poll_interval_ms: 50,
            ..ObserverConfig::default()
        },
    );
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let task = tokio::spawn(obs.run(tx));
    let first = rx.recv().await.unwrap().event;
    assert!(matches!(
        first,
        Event::ConnectorStatus { visible: true, .. }
    ));
    let mut n = 1;
    while let Some(Observation {
        observed_ms,
        event: e,
        ..
    }) = rx.recv().await
    {
        assert!(observed_ms > 1_700_000_000_000);
        n += 1;
        if matches!(
            e,
            Event::SyncDone {
                domain: lockstep_schemas::Domain::SlurmPartitions
            }
        ) {
            break;
        }
    }
    assert_eq!(n, 16);
    drop(rx);
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("run ends once the receiver is gone")
        .unwrap();
}
