//! Exponential backoff, bounded: the one rule every retry in lockstep waits by.
//!
//! The n-th consecutive failure waits `initial_ms * 2^(n-1)`, at most
//! `max_ms`. [`Backoff`] counts the failures; [`retry`] is the loop around
//! one fallible call. Owners decide when the count starts over (a success,
//! a quiet period).

use std::future::Future;
use std::time::Duration;

/// The delay after consecutive failures, doubling from `initial_ms` up to
/// `max_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    initial_ms: u64,
    max_ms: u64,
    failures: u32,
}

impl Backoff {
    /// A backoff that has seen no failure. `initial_ms` is at least 1 and
    /// `max_ms` at least `initial_ms`.
    pub fn new(initial_ms: u64, max_ms: u64) -> Self {
        let initial_ms = initial_ms.max(1);
        Self {
            initial_ms,
            max_ms: max_ms.max(initial_ms),
            failures: 0,
        }
    }

    /// The delay to wait after `failures` consecutive failures (none after
    /// none).
    pub fn delay_after(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let exp = (failures - 1).min(32);
        let ms = self.initial_ms.saturating_mul(1u64 << exp).min(self.max_ms);
        Duration::from_millis(ms)
    }

    /// Counts one more failure and returns how long to wait before trying
    /// again.
    pub fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.delay_after(self.failures)
    }

    /// Starts over: the next failure waits `initial_ms` again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Consecutive failures counted since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// Calls `attempt` until it succeeds, waiting `backoff` between tries.
/// After each failure, `on_failure(&error, delay)` reports it and says
/// whether to try again; if not, the error is returned. The backoff starts
/// over once it succeeds.
pub async fn retry<T, E, Fut>(
    backoff: &mut Backoff,
    mut attempt: impl FnMut() -> Fut,
    mut on_failure: impl FnMut(&E, Duration) -> bool,
) -> Result<T, E>
where
    Fut: Future<Output = Result<T, E>>,
{
    loop {
        match attempt().await {
            Ok(v) => {
                backoff.reset();
                return Ok(v);
            }
            Err(e) => {
                let delay = backoff.failed();
                if !on_failure(&e, delay) {
                    return Err(e);
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_its_bound_and_starts_over() {
        let mut b = Backoff::new(100, 1_000);
        let got: Vec<u128> = (0..6).map(|_| b.failed().as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(b.failures(), 6);
        b.reset();
        assert_eq!(b.failed(), Duration::from_millis(100));
        assert_eq!(b.delay_after(0), Duration::ZERO);
        assert_eq!(b.delay_after(u32::MAX), Duration::from_millis(1_000));
        assert_eq!(Backoff::new(0, 0).failed(), Duration::from_millis(1));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_waits_between_tries_and_stops_when_told() {
        let mut b = Backoff::new(100, 1_000);
        let mut tries = 0;
        let mut waited = Vec::new();
        let got: Result<u32, &str> = retry(
            &mut b,
            || {
                tries += 1;
                let n = tries;
                async move {
                    if n < 4 {
                        Err("down")
                    } else {
                        Ok(n)
                    }
                }
            },
            |_, d| {
                waited.push(d.as_millis());
                true
            },
        )
        .await;
        assert_eq!(got, Ok(4));
        assert_eq!(waited, [100, 200, 400]);
        assert_eq!(b.failures(), 0, "a success starts over");

        let got: Result<(), &str> = retry(&mut b, || async { Err("refused") }, |_, _| false).await;
        assert_eq!(got, Err("refused"));
    }
}
