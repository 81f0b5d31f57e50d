//! Supervised tasks: every long-lived loop of a process runs under one
//! [`Supervisor`], so a loop that ends or panics is noticed, never lost in
//! a detached `tokio::spawn`.
//!
//! - [`Supervisor::restarting`] runs a loop made anew by a factory each
//!   time it ends or panics, after a back-off (1 s doubling to 30 s, reset
//!   after a minute of running); each restart is logged at `error`.
//! - [`Supervisor::critical`] runs a task the process cannot do without:
//!   when it ends or panics, [`Supervisor::failed`] answers its name and
//!   the process stops with an error.
//! - [`Supervisor::once`] runs a task that may end (a registration, a
//!   source whose channel closes): its end is fine, a panic is reported
//!   as a critical task's.
//! - [`Supervisor::shutdown`] stops every task (they are cancelled at
//!   their next await point) and waits for them, bounded.
//!
//! Cloning a supervisor gives another handle to the same set of tasks.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Mutex};
use tokio::task::JoinSet;

/// The first wait before a restart; doubled each time, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A loop that ran this long before ending starts again at once.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// The tasks of one process.
#[derive(Clone, Debug)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tasks: parking_lot::Mutex<JoinSet<()>>,
    failures: mpsc::UnboundedSender<&'static str>,
    failed: Mutex<mpsc::UnboundedReceiver<&'static str>>,
}

impl Default for Supervisor {
    fn default() -> Self {
        Supervisor::new()
    }
}

impl Supervisor {
    pub fn new() -> Supervisor {
        let (failures, failed) = mpsc::unbounded_channel();
        Supervisor {
            inner: Arc::new(Inner {
                tasks: parking_lot::Mutex::new(JoinSet::new()),
                failures,
                failed: Mutex::new(failed),
            }),
        }
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let mut tasks = self.inner.tasks.lock();
        // Reap the finished ones so the set does not grow.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(task);
    }

    /// Runs `make()` until the process stops, starting it again whenever it
    /// ends or panics.
    pub fn restarting<F, Fut>(&self, name: &'static str, make: F)
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.spawn(async move {
            let mut backoff = FIRST_BACKOFF;
            loop {
                let started = tokio::time::Instant::now();
                match tokio::spawn(make()).await {
                    Ok(()) => tracing::error!(task = name, "task ended; restarting it"),
                    Err(error) if error.is_panic() => {
                        tracing::error!(task = name, %error, "task panicked; restarting it")
                    }
                    // Cancelled: the process is stopping.
                    Err(_) => return,
                }
                if started.elapsed() >= HEALTHY_RUN {
                    backoff = FIRST_BACKOFF;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        });
    }

    /// Runs `task`, which should run until the process stops: if it ends
    /// or panics, [`failed`](Self::failed) answers `name`.
    pub fn critical(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let failures = self.inner.failures.clone();
        self.spawn(async move {
            match tokio::spawn(task).await {
                Ok(()) => tracing::error!(task = name, "a task the process needs ended"),
                Err(error) if error.is_panic() => {
                    tracing::error!(task = name, %error, "a task the process needs panicked")
                }
                Err(_) => return,
            }
            let _ = failures.send(name);
        });
    }

    /// Runs `task` once: ending is fine, a panic is reported through
    /// [`failed`](Self::failed).
    pub fn once(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let failures = self.inner.failures.clone();
        self.spawn(async move {
            if let Err(error) = tokio::spawn(task).await {
                if error.is_panic() {
                    tracing::error!(task = name, %error, "task panicked");
                    let _ = failures.send(name);
                }
            }
        });
    }

    /// Answers the name of the first critical task that stopped (pending
    /// for ever while they all run).
    pub async fn failed(&self) -> &'static str {
        let mut failed = self.inner.failed.lock().await;
        match failed.recv().await {
            Some(name) => name,
            // Never: `inner` holds a sender.
            None => std::future::pending().await,
        }
    }

    /// Stops every task and waits for them, at most `deadline`.
    pub async fn shutdown(&self, deadline: Duration) {
        let mut tasks = std::mem::take(&mut *self.inner.tasks.lock());
        tasks.abort_all();
        let drained = tokio::time::timeout(deadline, async {
            while tasks.join_next().await.is_some() {}
        });
        if drained.await.is_err() {
            tracing::warn!("some tasks did not stop in time");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn a_loop_that_ends_or_panics_is_started_again() {
        let supervisor = Supervisor::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        supervisor.restarting("flaky", move || {
            let runs = counted.clone();
            async move {
                if runs.fetch_add(1, Ordering::SeqCst) % 2 == 0 {
                    panic!("boom");
                }
            }
        });
        // 1 s, 2 s, 4 s of back-off: four runs within 8 s.
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        supervisor.shutdown(Duration::from_secs(1)).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 4, "no restarts after shutdown");
    }

    #[tokio::test]
    async fn a_critical_task_that_stops_is_reported() {
        let supervisor = Supervisor::new();
        supervisor.critical("forever", std::future::pending());
        supervisor.critical("short-lived", async {});
        assert_eq!(supervisor.failed().await, "short-lived");
        let panicking = Supervisor::new();
        panicking.once("ends", async {});
        panicking.critical("panics", async { panic!("boom") });
        assert_eq!(
            panicking.failed().await,
            "panics",
            "an ending `once` task is no failure"
        );
        supervisor.shutdown(Duration::from_secs(1)).await;
    }
}
