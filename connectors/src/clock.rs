//! The wall clock, read in one place.
//!
//! Connectors and the service stamp what they observe and when they act with
//! this host's clock. The reducer never reads it: its time is the log's.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch by this host's clock; 0 before 1970.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Seconds since the Unix epoch by this host's clock; 0 before 1970.
pub fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    #[test]
    fn seconds_and_milliseconds_agree() {
        let (s, ms) = (super::now_s(), super::now_ms());
        assert!(ms / 1000 >= s && ms / 1000 <= s + 1, "{s} s, {ms} ms");
        assert!(s > 1_600_000_000, "the wall clock, not a monotonic one");
    }
}
