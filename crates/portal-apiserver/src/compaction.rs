//! Compaction of a shared store (etcd), as kube-apiserver does it: every
//! period, drop the history older than the revision seen one period ago.
//! Watches can resume from anything newer; older resourceVersions get 410.
//! Run by the elected server only (the embedded store compacts itself).

use std::sync::Arc;
use std::time::Duration;

use portal_store::Store;

/// kube-apiserver's `--etcd-compaction-interval` default.
pub(crate) const PERIOD: Duration = Duration::from_secs(300);

pub(crate) async fn run(store: Arc<dyn Store>, period: Duration) {
    let mut previous = None;
    loop {
        match store.current_revision().await {
            Ok(now) => {
                if let Some(before) = previous {
                    match store.compact(before).await {
                        Ok(()) => tracing::debug!(revision = before, "compacted the store"),
                        Err(error) => tracing::warn!(%error, "compaction failed"),
                    }
                }
                previous = Some(now);
            }
            Err(error) => tracing::warn!(%error, "compaction: cannot read the revision"),
        }
        tokio::time::sleep(period).await;
    }
}
