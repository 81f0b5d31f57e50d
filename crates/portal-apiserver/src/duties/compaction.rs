//! Compaction of a shared store (etcd), as kube-apiserver does it: every
//! period, drop the history older than the revision recorded one period
//! ago. Watches can resume from anything newer; older resourceVersions get
//! 410. (The embedded store compacts itself.)
//!
//! Every API server runs this; a record in the store
//! (`/registry/portal/compaction`, the revision to compact at next) is
//! advanced by compare-and-swap, so the cluster compacts once per period
//! whichever servers come and go (kube-apiserver's `compact_rev_key`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use portal_store::{Error as StoreError, Op, Revision, Store};

/// kube-apiserver's `--etcd-compaction-interval` default.
pub(crate) const PERIOD: Duration = Duration::from_secs(300);

const KEY: &str = "/registry/portal/compaction";

pub(crate) async fn run(store: Arc<dyn Store>, period: Duration) {
    let mut seen = None;
    loop {
        tokio::time::sleep(period).await;
        match round(store.as_ref(), &mut seen).await {
            Ok(Some(revision)) => tracing::debug!(revision, "compacted the store"),
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "compaction"),
        }
    }
}

/// One round. `seen` is the record's revision as this server saw it a
/// period ago: if nobody has advanced the record since, this server
/// advances it to the current revision and compacts at the revision it
/// held. Returns the revision compacted at, if any.
async fn round(
    store: &dyn Store,
    seen: &mut Option<Revision>,
) -> Result<Option<Revision>, StoreError> {
    let current = store.current_revision().await?;
    let value = Bytes::from(current.to_string());
    let Some(record) = store.get(KEY).await? else {
        match store
            .txn(vec![Op::Create {
                key: KEY.into(),
                value,
            }])
            .await
        {
            Ok(written) => *seen = Some(written),
            Err(StoreError::AlreadyExists { .. }) => *seen = None,
            Err(error) => return Err(error),
        }
        return Ok(None);
    };
    if *seen != Some(record.mod_revision) {
        // Someone advanced it within the period (or this is our first
        // look): wait a full period from now.
        *seen = Some(record.mod_revision);
        return Ok(None);
    }
    let target: Revision = std::str::from_utf8(&record.value)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let op = Op::Update {
        key: KEY.into(),
        value,
        expected_revision: record.mod_revision,
    };
    match store.txn(vec![op]).await {
        Ok(written) => *seen = Some(written),
        // Another server did this round.
        Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {
            *seen = None;
            return Ok(None);
        }
        Err(error) => return Err(error),
    }
    if target == 0 {
        return Ok(None);
    }
    store.compact(target).await?;
    Ok(Some(target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use portal_store::{EmbeddedOptions, EmbeddedStore};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_server_compacts_per_period_to_the_revision_of_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        let write = |i: u32| Op::Create {
            key: format!("/registry/x/{i}"),
            value: Bytes::from_static(b"v"),
        };
        let (mut a, mut b) = (None, None);
        store.txn(vec![write(0)]).await.unwrap();
        // First looks: the record is made, nothing compacted.
        assert_eq!(round(&store, &mut a).await.unwrap(), None);
        let recorded = store.current_revision().await.unwrap() - 1;
        assert_eq!(round(&store, &mut b).await.unwrap(), None);
        store.txn(vec![write(1)]).await.unwrap();
        // A period later: a compacts at what was recorded; b, seeing the
        // record moved, waits.
        assert_eq!(round(&store, &mut a).await.unwrap(), Some(recorded));
        assert_eq!(round(&store, &mut b).await.unwrap(), None);
        assert!(matches!(
            store.watch("/registry/x/", recorded - 1).await,
            Err(StoreError::Compacted { .. })
        ));
    }
}
