//! The repair pass (SPEC S5): reconciles allocation records with the
//! Services that exist. Frees records no Service holds (leaks from manual
//! store edits or crashes of older versions), restores records a Service
//! holds but that are missing, and records an Event for duplicates and
//! out-of-range values. Then rebuilds the in-memory bitmaps.
//!
//! On a shared store every API server rebuilds its bitmaps from the records
//! (to learn what the others allocated), but only the elected one mends:
//! [`Mend::No`] only learns.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use portal_api::{kinds, meta};
use portal_store::{Error as StoreError, Op, Store};
use serde_json::{json, Value};

use super::{cluster_ips_of, node_ports_of, owner, Allocators, Pool};
use crate::registry::strategy;

/// What one pass did, for logs and tests.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Report {
    pub(crate) freed: usize,
    pub(crate) restored: usize,
    pub(crate) events: usize,
}

/// Whether a pass changes the store, or only learns from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mend {
    Yes,
    No,
}

/// Runs a pass now and then every `period`, for ever.
pub(crate) async fn run(
    store: std::sync::Arc<dyn Store>,
    allocators: std::sync::Arc<Allocators>,
    period: Duration,
    mend: Mend,
) {
    loop {
        match pass(store.as_ref(), &allocators, mend).await {
            Ok(report) if report != Report::default() => {
                tracing::info!(?report, "allocation repair")
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "allocation repair failed"),
        }
        tokio::time::sleep(period).await;
    }
}

/// One reconciliation of cluster IPs and node ports.
pub(crate) async fn pass(
    store: &dyn Store,
    allocators: &Allocators,
    mend: Mend,
) -> Result<Report, StoreError> {
    let (services, listed_at) = store.list(&kinds::service::RESOURCE.key_prefix()).await?;
    let services: Vec<Value> = services
        .iter()
        .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
        .collect();
    let mut report = Report::default();
    // Each family's addresses against its own pool and records.
    let mut ip_holders: Vec<BTreeMap<String, Vec<&Value>>> =
        vec![BTreeMap::new(); allocators.ips.len()];
    let mut port_holders: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for svc in &services {
        for (family, ip) in cluster_ips_of(svc) {
            // An address of a family the cluster no longer has counts in the
            // primary pool, where it is reported as out of range.
            let at = allocators
                .ips
                .iter()
                .position(|(f, _)| *f == family)
                .unwrap_or(0);
            ip_holders[at].entry(ip).or_default().push(svc);
        }
        for port in node_ports_of(svc) {
            port_holders.entry(port.to_string()).or_default().push(svc);
        }
    }
    for ((_, pool), holders) in allocators.ips.iter().zip(&ip_holders) {
        reconcile(
            store,
            pool,
            holders,
            listed_at,
            "ClusterIP",
            mend,
            &mut report,
        )
        .await?;
    }
    reconcile(
        store,
        &allocators.node_ports,
        &port_holders,
        listed_at,
        "NodePort",
        mend,
        &mut report,
    )
    .await?;
    Ok(report)
}

async fn reconcile(
    store: &dyn Store,
    pool: &Pool,
    holders: &BTreeMap<String, Vec<&Value>>,
    listed_at: u64,
    what: &str,
    mend: Mend,
    report: &mut Report,
) -> Result<(), StoreError> {
    let (records, _) = store.list(pool.prefix).await?;
    let mut present = Vec::new();
    for kv in records {
        let value = kv.key[pool.prefix.len()..].to_owned();
        // A record newer than the Service listing may belong to a Service
        // created since (they are written together): leave it.
        if mend == Mend::Yes && !holders.contains_key(&value) && kv.create_revision <= listed_at {
            let op = Op::Delete {
                key: kv.key.clone(),
                expected_revision: Some(kv.mod_revision),
            };
            match store.txn(vec![op]).await {
                Ok(_) => report.freed += 1,
                Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {
                    present.push(value)
                }
                Err(e) => return Err(e),
            }
            continue;
        }
        present.push(value);
    }
    for (value, services) in holders.iter().filter(|_| mend == Mend::Yes) {
        if pool.range.offset(value).is_none() {
            for svc in services {
                let message = format!("{what} {value} is not within the configured range {}; please recreate the service", pool.range.describe());
                record_event(store, svc, &format!("{what}OutOfRange"), &message).await?;
                report.events += 1;
            }
            continue;
        }
        for svc in services.iter().skip(1) {
            let message = format!(
                "{what} {value} was assigned to multiple services; please recreate the service"
            );
            record_event(store, svc, &format!("{what}AlreadyAllocated"), &message).await?;
            report.events += 1;
        }
        if !present.contains(value) {
            let record = Bytes::from(json!({"service": owner(services[0])}).to_string());
            match store
                .txn(vec![Op::Create {
                    key: pool.key(value),
                    value: record,
                }])
                .await
            {
                Ok(_) => report.restored += 1,
                Err(StoreError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            }
            present.push(value.clone());
        }
    }
    pool.sync(present.iter().map(String::as_str));
    Ok(())
}

/// A Warning Event about `svc`, as `kubectl describe` shows them.
async fn record_event(
    store: &dyn Store,
    svc: &Value,
    reason: &str,
    message: &str,
) -> Result<(), StoreError> {
    let namespace = meta::meta_str(svc, "namespace").unwrap_or("default");
    let name = meta::meta_str(svc, "name").unwrap_or("");
    let now = strategy::now();
    let event_name = format!("{name}.{}", uuid::Uuid::new_v4().simple());
    let resource = &kinds::event::RESOURCE;
    let mut event = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name, "namespace": namespace},
        "involvedObject": {
            "kind": "Service", "apiVersion": "v1", "namespace": namespace, "name": name,
            "uid": meta::meta_str(svc, "uid").unwrap_or(""),
        },
        "reason": reason,
        "message": message,
        "type": "Warning",
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": "ipallocator-repair-controller"},
        "reportingComponent": "ipallocator-repair-controller",
    });
    strategy::prepare_create(resource, &mut event, Some(namespace));
    let key = resource.key(Some(namespace), &event_name);
    let value = Bytes::from(serde_json::to_vec(&event).unwrap_or_default());
    store.txn(vec![Op::Create { key, value }]).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use portal_store::{EmbeddedOptions, EmbeddedStore};

    fn service(name: &str, ip: &str) -> (String, Bytes) {
        let svc = json!({"metadata": {"name": name, "namespace": "default", "uid": name}, "spec": {"clusterIP": ip, "ports": [{"port": 80}]}});
        (
            kinds::service::RESOURCE.key(Some("default"), name),
            Bytes::from(svc.to_string()),
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frees_leaks_restores_records_and_reports_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        let allocators = Allocators::new(
            &"10.96.0.0/24".parse().unwrap(),
            "30000-30009".parse().unwrap(),
        );
        // A record whose Service was removed behind the allocator's back.
        let leaked = Op::Create {
            key: allocators.ips[0].1.key("10.96.0.50"),
            value: Bytes::from_static(b"{}"),
        };
        // Two Services claiming one address (a manual edit), none recorded.
        let (k1, v1) = service("one", "10.96.0.60");
        let (k2, v2) = service("two", "10.96.0.60");
        let (k3, v3) = service("far", "10.0.0.1");
        let ops = vec![
            leaked,
            Op::Create { key: k1, value: v1 },
            Op::Create { key: k2, value: v2 },
            Op::Create { key: k3, value: v3 },
        ];
        store.txn(ops).await.unwrap();
        allocators.ips[0].1.mark("10.96.0.50");

        let report = pass(&store, &allocators, Mend::Yes).await.unwrap();
        assert_eq!(
            report,
            Report {
                freed: 1,
                restored: 1,
                events: 2
            }
        );
        assert!(store
            .get(&allocators.ips[0].1.key("10.96.0.50"))
            .await
            .unwrap()
            .is_none());
        assert!(store
            .get(&allocators.ips[0].1.key("10.96.0.60"))
            .await
            .unwrap()
            .is_some());
        assert_eq!(
            allocators.ips[0].1.reserve("10.96.0.50"),
            Ok(50),
            "the leaked address is free again"
        );
        assert!(allocators.ips[0].1.reserve("10.96.0.60").is_err());
        let (events, _) = store
            .list(&kinds::event::RESOURCE.key_prefix())
            .await
            .unwrap();
        let reasons: Vec<String> = events
            .iter()
            .map(|kv| {
                serde_json::from_slice::<Value>(&kv.value).unwrap()["reason"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert!(
            reasons.contains(&"ClusterIPAlreadyAllocated".to_owned())
                && reasons.contains(&"ClusterIPOutOfRange".to_owned())
        );
        // A second pass finds nothing to do but the standing problems.
        assert_eq!(pass(&store, &allocators, Mend::Yes).await.unwrap().freed, 0);
    }
}
