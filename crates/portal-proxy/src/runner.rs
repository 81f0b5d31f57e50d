//! The bounded-frequency sync runner (kube-proxy's
//! `BoundedFrequencyRunner`): a change is synced at once unless the last
//! sync was less than `min_sync_period` ago (then when that has passed, with
//! everything queued meanwhile in one sync), and a sync runs at least every
//! `sync_period`. The first sync waits for both watches' initial lists, so
//! a restarted proxy never replaces good rules with an empty table.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{watch, Notify};

use crate::health::HealthChecks;
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::tracker::{Changes, Tracker};

/// A data plane: kernel rules or userspace listeners.
pub(crate) trait Backend: Send + 'static {
    /// Applies the changes (all Services when `full`). An error makes the
    /// next sync a full one.
    fn sync(&mut self, changes: &Changes, full: bool) -> Result<(), String>;

    /// Asked at each periodic sync: has the data plane been changed behind
    /// our back (a flushed ruleset)? Then the sync is a full one.
    fn tampered(&mut self) -> bool {
        false
    }

    /// Whether the next sync must be a full one though the last succeeded
    /// (a part of the data plane failed and a change set cannot mend it).
    fn wants_full(&self) -> bool {
        false
    }
}

/// A full sync at least this often, as kube-proxy does, whatever happened.
const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

#[derive(Debug)]
pub(crate) struct Timing {
    pub min_sync_period: Duration,
    pub sync_period: Duration,
}

pub(crate) async fn run(
    tracker: Arc<Mutex<Tracker>>,
    wake: Arc<Notify>,
    mut listed: watch::Receiver<bool>,
    mut backend: Box<dyn Backend>,
    metrics: Arc<Metrics>,
    timing: Timing,
    mut health: HealthChecks,
) {
    let _ = listed.wait_for(|done| *done).await;
    let mut full = true;
    let mut last = Instant::now() - timing.min_sync_period;
    let mut last_full = Instant::now();
    let mut periodic = false;
    loop {
        let earliest = last + timing.min_sync_period;
        if Instant::now() < earliest {
            tokio::time::sleep_until(earliest).await;
        }
        let started = Instant::now();
        if !full && (started - last_full >= FULL_SYNC_PERIOD || backend.wants_full()) {
            full = true;
        }
        if periodic && !full {
            let checked = tokio::task::spawn_blocking(move || {
                let tampered = backend.tampered();
                (backend, tampered)
            })
            .await;
            let Ok((checked, tampered)) = checked else {
                tracing::error!("proxy check panicked; syncs stopped");
                return;
            };
            backend = checked;
            if tampered {
                tracing::warn!("Portal's rules were changed from outside; rebuilding them");
                full = true;
            }
        }
        let changes = {
            let mut tracker = tracker.lock();
            let changes = tracker.take(full);
            metrics.set_pending(tracker.pending());
            changes
        };
        let was_full = full;
        health.update(&changes, was_full);
        let span = tracing::debug_span!(
            "proxy_sync",
            kind = if was_full { "full" } else { "partial" },
            services = changes.services.len(),
        );
        let joined = tokio::task::spawn_blocking(move || {
            let _span = span.entered();
            let result = match backend.sync(&changes, was_full) {
                Ok(()) => Ok(changes.triggers),
                Err(error) => Err((error, changes.triggers)),
            };
            (result, backend)
        })
        .await;
        let Ok((result, returned)) = joined else {
            // A panicking backend is a bug: stop syncing, so /healthz fails.
            tracing::error!("proxy sync panicked; syncs stopped");
            return;
        };
        backend = returned;
        let took = started.elapsed();
        last = Instant::now();
        match result {
            Ok(triggers) => {
                if was_full {
                    last_full = started;
                }
                full = false;
                metrics.observe_sync(took, was_full);
                metrics.observe_programming(&triggers);
                metrics.synced(started);
                tracing::debug!(?took, full = was_full, "proxy rules synced");
            }
            Err((error, triggers)) => {
                // Still waiting to be programmed: measured when they are.
                tracker.lock().requeue_triggers(triggers);
                full = true;
                metrics.failures.inc();
                tracing::warn!(%error, "proxy sync failed; the next one is a full resync");
            }
        }
        // Wait for a change, the periodic sync, or a retry after a failure.
        let retry = if full {
            timing.min_sync_period.max(Duration::from_secs(1))
        } else {
            timing.sync_period
        };
        periodic = tokio::time::timeout(retry, wake.notified()).await.is_err();
    }
}
