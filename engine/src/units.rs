//! Policy durations on the log clock.
//!
//! Policies give durations in seconds; the log clock counts milliseconds
//! since the Unix epoch. Every conversion and every deadline here saturates,
//! so an absurd policy value (`u64::MAX` seconds) means "never", not an
//! overflow panic in a debug build or a deadline that wraps into the past.
//! Arithmetic on log times must go through these, never through `*` or `+`.

/// Seconds as milliseconds, saturating.
pub(crate) const fn ms(s: u64) -> u64 {
    s.saturating_mul(1000)
}

/// The log time `s` seconds after `at_ms`, saturating.
pub(crate) const fn after_s(at_ms: u64, s: u64) -> u64 {
    at_ms.saturating_add(ms(s))
}

/// The log time `d_ms` milliseconds after `at_ms`, saturating.
pub(crate) const fn after_ms(at_ms: u64, d_ms: u64) -> u64 {
    at_ms.saturating_add(d_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_saturate() {
        // (at, seconds) -> deadline
        for (at, s, want) in [
            (0, 0, 0),
            (1_000, 5, 6_000),
            (1_000, u64::MAX, u64::MAX),
            (u64::MAX - 1, 1, u64::MAX),
            (0, u64::MAX / 1000 + 1, u64::MAX),
        ] {
            assert_eq!(after_s(at, s), want, "{at} + {s}s");
        }
        assert_eq!(ms(u64::MAX), u64::MAX);
        assert_eq!(after_ms(u64::MAX, 1), u64::MAX);
    }
}
