//! Exponential backoff with jitter, for every retry loop (remote sinks, the debug-info
//! upload, the Kubernetes watch).

use std::time::Duration;

/// The n-th delay is drawn from [d/2, d] with d = base * 2^n, capped, so clients that failed
/// together (agents on many nodes after a server outage) do not come back together.
#[derive(Debug, Clone)]
pub struct Backoff {
    attempt: u32,
    base: Duration,
    cap: Duration,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            attempt: 0,
            base,
            cap,
        }
    }

    /// The next delay; `unit` is a random number in [0, 1) (a parameter so tests can pick it).
    pub fn next_delay_with(&mut self, unit: f64) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        ceiling.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
    }

    /// The next delay, with fresh randomness.
    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_with(fastrand::f64())
    }

    /// Starts again from `base`, after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_with_jitter_up_to_the_cap() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(backoff.next_delay_with(0.0), Duration::from_millis(50));
        assert_eq!(backoff.next_delay_with(0.5), Duration::from_millis(150));
        let delays: Vec<_> = (0..10).map(|_| backoff.next_delay_with(0.5)).collect();
        assert!(delays.iter().all(|&d| d <= Duration::from_secs(1)));
        assert_eq!(delays.last(), Some(&Duration::from_millis(750)));
    }

    #[test]
    fn doubles_up_to_its_maximum_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let delays: Vec<Duration> = (0..5).map(|_| backoff.next_delay()).collect();
        for (delay, ceiling) in delays.iter().zip([100, 200, 400, 400, 400]) {
            let ceiling = Duration::from_millis(ceiling);
            assert!(
                *delay >= ceiling / 2 && *delay <= ceiling,
                "{delay:?} vs {ceiling:?}"
            );
        }
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(100));
    }
}
