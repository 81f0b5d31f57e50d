//! Per-container back-off, as the kubelet's: 10 s after the first failure,
//! doubling to 5 minutes; forgotten once a container has run for 10
//! minutes. Used for restarts (CrashLoopBackOff) and image pulls
//! (ImagePullBackOff). Time is passed in, so tests need no clock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

pub(crate) const INITIAL: Duration = Duration::from_secs(10);
pub(crate) const MAX: Duration = Duration::from_secs(300);
/// A container that ran this long starts over at [`INITIAL`].
pub(crate) const RESET_AFTER: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, Debug)]
struct Entry {
    delay: Duration,
    until: Instant,
}

/// Back-off per key (a container name, or `image:NAME`).
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    entries: HashMap<String, Entry>,
}

impl Backoff {
    /// Records a failure at `now`: the next try waits longer.
    pub(crate) fn fail(&mut self, key: &str, now: Instant) -> Duration {
        let delay = match self.entries.get(key) {
            Some(entry) => (entry.delay * 2).min(MAX),
            None => INITIAL,
        };
        self.entries.insert(
            key.to_owned(),
            Entry {
                delay,
                until: now + delay,
            },
        );
        delay
    }

    /// How long `key` must still wait at `now` (None: go ahead).
    pub(crate) fn remaining(&self, key: &str, now: Instant) -> Option<Duration> {
        self.entries
            .get(key)
            .and_then(|e| e.until.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }

    /// The current delay of `key`, if it failed before.
    pub(crate) fn delay(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.delay)
    }

    pub(crate) fn reset(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// The earliest moment a waiting key may go ahead.
    pub(crate) fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.entries
            .values()
            .map(|e| e.until)
            .filter(|u| *u > now)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let mut backoff = Backoff::default();
        let t0 = Instant::now();
        assert_eq!(backoff.remaining("c", t0), None);
        assert_eq!(backoff.fail("c", t0), INITIAL);
        assert_eq!(backoff.remaining("c", t0), Some(INITIAL));
        assert_eq!(backoff.remaining("c", t0 + INITIAL), None);
        assert_eq!(backoff.fail("c", t0), Duration::from_secs(20));
        for _ in 0..10 {
            backoff.fail("c", t0);
        }
        assert_eq!(backoff.delay("c"), Some(MAX));
        assert_eq!(backoff.next_expiry(t0), Some(t0 + MAX));
        backoff.reset("c");
        assert_eq!(backoff.fail("c", t0), INITIAL);
    }
}
