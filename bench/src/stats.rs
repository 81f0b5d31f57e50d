//! Latency samples → throughput and percentiles.

use std::time::Duration;

#[derive(Debug, Default)]
pub(crate) struct Samples(Vec<Duration>);

impl Samples {
    pub(crate) fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    pub(crate) fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The `p`-th percentile (0–100) in milliseconds.
    pub(crate) fn percentile_ms(&mut self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        self.0.sort_unstable();
        let rank = ((p / 100.0) * (self.0.len() - 1) as f64).round() as usize;
        self.0[rank.min(self.0.len() - 1)].as_secs_f64() * 1000.0
    }
}
