//! Loopback networking for the tests: free ports, and a TCP proxy that a
//! test cuts like a network partition.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A TCP port on loopback that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A TCP proxy in front of a server (the API server, say) that the test can
/// cut, like a network partition: open connections are dropped, new ones
/// are closed right away.
pub struct Proxy {
    /// Where it listens (loopback, a free port).
    pub addr: SocketAddr,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts forwarding to `upstream`; call within a tokio runtime.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let up = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let (up, conns) = (Arc::clone(&up), Arc::clone(&conns));
            async move {
                loop {
                    let Ok((mut inbound, _)) = listener.accept().await else {
                        continue;
                    };
                    if !up.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let h = tokio::spawn(async move {
                        if let Ok(mut out) = tokio::net::TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        }
                    });
                    conns.lock().expect("not poisoned").push(h);
                }
            }
        });
        Self {
            addr,
            up,
            conns,
            accept,
        }
    }

    /// Drops every open connection and refuses new ones, until
    /// [`Self::restore`].
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for h in self.conns.lock().expect("not poisoned").drain(..) {
            h.abort();
        }
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
