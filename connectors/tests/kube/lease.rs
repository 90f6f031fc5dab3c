//! Leader election on a Lease in the real API server.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use lockstep_connectors::kube::{Leadership, LeaseConfig};
use lockstep_testkit::kube::{shared, unique, ControlPlane, NS};
use serde_json::Value;

use crate::support::KubeConfig;

fn lease(name: &str, identity: &str, duration_s: u64, renew_s: u64) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(duration_s),
        renew_deadline: Duration::from_secs(renew_s),
        retry_period: Duration::from_millis(500),
        ..LeaseConfig::new(NS, name, identity)
    }
}

/// Waits until `f` holds, for at most `limit`.
async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Instant {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Instant::now()
}

fn holder(cp: &ControlPlane, name: &str) -> Value {
    cp.get(&["lease", name, "-n", NS])["spec"]["holderIdentity"].clone()
}

/// Two candidates: exactly one leads; when it stops it releases the Lease,
/// and the other takes over at once rather than when the Lease would have
/// expired (30 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_candidate_leads_and_a_release_hands_over_at_once() {
    let cp = shared();
    let name = unique("lease");
    let a = Leadership::start(cp.kube_config().await, lease(&name, "a", 30, 20)).unwrap();
    let b = Leadership::start(cp.kube_config().await, lease(&name, "b", 30, 20)).unwrap();
    until("a leader", Duration::from_secs(10), || {
        a.is_leader() || b.is_leader()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(a.is_leader() != b.is_leader(), "exactly one leads");
    let (leader, follower, follower_id) = if a.is_leader() {
        (a, b, "b")
    } else {
        (b, a, "a")
    };
    leader.release(Duration::from_secs(5)).await;
    until("the follower takes over", Duration::from_secs(10), || {
        follower.is_leader()
    })
    .await;
    assert_eq!(holder(cp, &name), follower_id);
    follower.release(Duration::from_secs(5)).await;
    assert_eq!(holder(cp, &name), Value::Null, "released");
    cp.kubectl(&["delete", "lease", &name, "-n", NS]);
}

/// A TCP proxy to the API server that can be cut.
async fn proxy(to: SocketAddr) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((mut inbound, _)) = listener.accept().await {
            conns.spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, task)
}

/// The safety of the protocol: a leader cut off from the API server stops
/// leading (renew deadline 2 s) before anyone may take its Lease (4 s
/// after its last renewal), so two candidates never lead at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_steps_down_before_another_takes_over() {
    let cp = shared();
    let name = unique("lease");
    let direct = cp.kube_config().await;
    let api: SocketAddr = format!(
        "{}:{}",
        direct.cluster_url.host().unwrap(),
        direct.cluster_url.port_u16().unwrap()
    )
    .parse()
    .unwrap();
    let (addr, cut) = proxy(api).await;
    let mut via_proxy = direct.clone();
    via_proxy.cluster_url = format!("https://{addr}").parse().unwrap();

    let mut a = Leadership::start(via_proxy, lease(&name, "a", 4, 2)).unwrap();
    until("a leads", Duration::from_secs(10), || a.is_leader()).await;
    let b = Leadership::start(direct, lease(&name, "b", 4, 2)).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(a.is_leader() && !b.is_leader());

    // Cut a off: its listener and every connection through it go away.
    cut.abort();
    let _ = cut.await;
    tokio::time::timeout(Duration::from_secs(10), async {
        // (The first change may still be the one to leader.)
        while a.changed().await {}
    })
    .await
    .expect("a notices within its renew deadline");
    assert!(!a.is_leader());
    let a_down = Instant::now();
    let b_up = until("b takes over", Duration::from_secs(15), || b.is_leader()).await;
    assert!(
        b_up > a_down,
        "b led before a stepped down: two leaders at once"
    );
    eprintln!(
        "a stepped down {:?} before b took over",
        b_up.duration_since(a_down)
    );
    assert_eq!(holder(cp, &name), "b");
    b.release(Duration::from_secs(5)).await;
    a.release(Duration::from_secs(1)).await;
    cp.kubectl(&["delete", "lease", &name, "-n", NS]);
}
