//! Loopback networking for the tests.

use std::net::TcpListener;

/// A TCP port on loopback that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
