//! Waking pod workers. Whatever learns that a pod needs another look (a
//! source, a probe, the mirror manager, the relist) sends the pod's UID
//! here; the pod manager (`pods`) owns the workers and wakes or starts the
//! one for that UID. The senders know nothing of workers, so they sit
//! below `pods` and never call back into it (the kubelet's pod workers are
//! fed the same way: `podWorkers.UpdatePod` from the sync loop).

use tokio::sync::mpsc;

/// Sends pod UIDs to the pod manager.
#[derive(Clone, Debug)]
pub(crate) struct PodWaker(mpsc::UnboundedSender<String>);

/// The pod manager's end: the UIDs to look at, in order, duplicates and
/// all (a worker coalesces them).
pub(crate) type Wakes = mpsc::UnboundedReceiver<String>;

impl PodWaker {
    pub(crate) fn channel() -> (PodWaker, Wakes) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (PodWaker(sender), receiver)
    }

    /// Asks for the pod's worker to look again (a no-op once the agent is
    /// stopping and nobody receives).
    pub(crate) fn wake(&self, uid: &str) {
        let _ = self.0.send(uid.to_owned());
    }
}
