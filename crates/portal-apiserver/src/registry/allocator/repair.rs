//! The repair pass (SPEC S5): reconciles allocation records with the
//! Services that exist. Frees records no Service holds (leaks from manual
//! store edits or crashes of older versions), restores records a Service
//! holds but that are missing (an IPAddress a user deleted), and records an
//! Event for duplicates and out-of-range values. Then rebuilds the
//! in-memory bitmaps. IPAddresses a user made (not labelled as the
//! allocator's) are left alone and keep their addresses taken. Cluster IP
//! records of older versions (`/registry/ranges/serviceips*/`) become
//! IPAddresses here.
//!
//! On a shared store every API server rebuilds its bitmaps from the records
//! (to learn what the others allocated), but only the elected one mends:
//! [`Mend::No`] only learns.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use portal_api::cidr::IpFamily;
use portal_api::kinds::ip_address::{ALLOCATOR, MANAGED_BY_LABEL};
use portal_api::{kinds, meta};
use portal_store::{Error as StoreError, KeyValue, Op, Store};
use serde_json::{json, Value};

use super::{
    cluster_ips_of, ip_record, node_ports_of, owner, Allocators, Pool, IP_ADDRESSES,
    LEGACY_SERVICE_IPS,
};
use crate::registry::strategy;

/// What one pass did, for logs and tests.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Report {
    pub(crate) freed: usize,
    pub(crate) restored: usize,
    pub(crate) events: usize,
    /// Records of an older version moved.
    pub(crate) migrated: usize,
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
    // Records before Services: a Service deleted in between is missing
    // from both (no record restored for it), one created in between has
    // a record already (its restore finds it).
    let (records, _) = store.list(IP_ADDRESSES).await?;
    let (ranges, _) = store
        .list(&kinds::service_cidr::RESOURCE.key_prefix())
        .await?;
    let (services, listed_at) = store.list(&kinds::service::RESOURCE.key_prefix()).await?;
    // Every ServiceCIDR's pool exists before addresses are checked against
    // them (at start, before the ServiceCIDRs are followed from the cache).
    let ranges: Vec<Value> = ranges
        .iter()
        .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
        .collect();
    allocators.follow(&ranges, || {
        records
            .iter()
            .map(|kv| kv.key[IP_ADDRESSES.len()..].to_owned())
            .collect()
    });
    let services: Vec<Value> = services
        .iter()
        .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
        .collect();
    let mut report = Report::default();
    let mut ip_holders: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    let mut port_holders: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for svc in &services {
        for (_, ip) in cluster_ips_of(svc) {
            ip_holders.entry(ip).or_default().push(svc);
        }
        for port in node_ports_of(svc) {
            port_holders.entry(port.to_string()).or_default().push(svc);
        }
    }
    reconcile_ips(
        store,
        allocators,
        records,
        &ip_holders,
        listed_at,
        mend,
        &mut report,
    )
    .await?;
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

/// Whether an IPAddress names one of `services` as its parent.
fn names_a_holder(address: &Value, services: &[&Value]) -> bool {
    let parent = &address["spec"]["parentRef"];
    parent["resource"] == "services"
        && parent["group"].as_str().unwrap_or("").is_empty()
        && services.iter().any(|svc| {
            parent["namespace"].as_str() == meta::meta_str(svc, "namespace")
                && parent["name"].as_str() == meta::meta_str(svc, "name")
        })
}

fn family_of(ip: &str) -> IpFamily {
    ip.parse().map_or(IpFamily::Ipv4, IpFamily::of)
}

/// Cluster IPs against their IPAddresses, across every pool.
async fn reconcile_ips(
    store: &dyn Store,
    allocators: &Allocators,
    records: Vec<KeyValue>,
    holders: &BTreeMap<String, Vec<&Value>>,
    listed_at: u64,
    mend: Mend,
    report: &mut Report,
) -> Result<(), StoreError> {
    let mut present = HashSet::new();
    for kv in records {
        let ip = kv.key[IP_ADDRESSES.len()..].to_owned();
        let address: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
        let ours = meta::label(&address, MANAGED_BY_LABEL) == Some(ALLOCATOR);
        // A record newer than the Service listing may belong to a Service
        // created (or changed) since: leave it.
        if mend == Mend::Yes && ours && kv.mod_revision <= listed_at {
            match holders.get(&ip) {
                None => {
                    if delete_record(store, &kv).await? {
                        report.freed += 1;
                        continue;
                    }
                }
                // It names a Service that does not hold it: it is the
                // holder's now.
                Some(services) if !names_a_holder(&address, services) => {
                    let op = Op::Update {
                        key: kv.key.clone(),
                        value: ip_record(&ip, family_of(&ip), &owner(services[0])),
                        expected_revision: kv.mod_revision,
                    };
                    match store.txn(vec![op]).await {
                        Ok(_) => report.restored += 1,
                        Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                Some(_) => {}
            }
        }
        present.insert(ip);
    }
    let ranges = allocators.all_cidrs();
    for (ip, services) in holders.iter().filter(|_| mend == Mend::Yes) {
        let family = family_of(ip);
        let address: Option<std::net::IpAddr> = ip.parse().ok();
        if !address.is_some_and(|a| ranges.iter().any(|r| r.contains(a))) {
            for svc in services {
                let message = format!("Cluster IP [{}]: {ip} is not within any configured Service CIDR; please recreate service", family.name());
                record_event(store, svc, "ClusterIPOutOfRange", &message).await?;
                report.events += 1;
            }
            continue;
        }
        for svc in services.iter().skip(1) {
            let message = format!(
                "Cluster IP [{}]: {ip} was assigned to multiple services; please recreate service",
                family.name()
            );
            record_event(store, svc, "ClusterIPAlreadyAllocated", &message).await?;
            report.events += 1;
        }
        if !present.contains(ip) {
            let op = Op::Create {
                key: format!("{IP_ADDRESSES}{ip}"),
                value: ip_record(ip, family, &owner(services[0])),
            };
            match store.txn(vec![op]).await {
                Ok(_) => report.restored += 1,
                Err(StoreError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    if mend == Mend::Yes {
        for prefix in LEGACY_SERVICE_IPS {
            let (legacy, _) = store.list(prefix).await?;
            for kv in legacy {
                if delete_record(store, &kv).await? {
                    report.migrated += 1;
                }
            }
        }
    }
    // Taken: what is recorded, and what Services hold whether recorded or
    // not (a record not restored yet, on a server that does not mend).
    let taken: Vec<&str> = present
        .iter()
        .chain(holders.keys())
        .map(String::as_str)
        .collect();
    for pool in allocators.all_ip_pools() {
        pool.sync(taken.iter().copied());
    }
    Ok(())
}

/// Deletes a record unless it changed since it was read; whether it went.
async fn delete_record(store: &dyn Store, kv: &KeyValue) -> Result<bool, StoreError> {
    let op = Op::Delete {
        key: kv.key.clone(),
        expected_revision: Some(kv.mod_revision),
    };
    match store.txn(vec![op]).await {
        Ok(_) => Ok(true),
        Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => Ok(false),
        Err(e) => Err(e),
    }
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
    let mut present = HashSet::new();
    for kv in records {
        let value = kv.key[pool.prefix.len()..].to_owned();
        // A record newer than the Service listing may belong to a Service
        // created since (they are written together): leave it.
        if mend == Mend::Yes
            && !holders.contains_key(&value)
            && kv.create_revision <= listed_at
            && delete_record(store, &kv).await?
        {
            report.freed += 1;
            continue;
        }
        present.insert(value);
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
            present.insert(value.clone());
        }
    }
    // Held ports count as taken on a server that does not mend, too.
    pool.sync(present.iter().chain(holders.keys()).map(String::as_str));
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
            value: ip_record("10.96.0.50", IpFamily::Ipv4, "default/gone"),
        };
        // An address a user keeps from being handed out.
        let kept = Op::Create {
            key: allocators.ips[0].1.key("10.96.0.70"),
            value: Bytes::from(
                json!({"metadata": {"name": "10.96.0.70"}, "spec": {"parentRef": {"resource": "gateways", "name": "g"}}})
                    .to_string(),
            ),
        };
        // A record of an older version.
        let legacy = Op::Create {
            key: format!("{}10.96.0.60", LEGACY_SERVICE_IPS[0]),
            value: Bytes::from_static(br#"{"service":"default/one"}"#),
        };
        // Two Services claiming one address (a manual edit), none recorded.
        let (k1, v1) = service("one", "10.96.0.60");
        let (k2, v2) = service("two", "10.96.0.60");
        let (k3, v3) = service("far", "10.0.0.1");
        let ops = vec![
            leaked,
            kept,
            legacy,
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
                events: 2,
                migrated: 1,
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
        assert!(
            allocators.ips[0].1.reserve("10.96.0.70").is_err(),
            "the user's stays taken"
        );
        let restored: Value = serde_json::from_slice(
            &store
                .get(&allocators.ips[0].1.key("10.96.0.60"))
                .await
                .unwrap()
                .unwrap()
                .value,
        )
        .unwrap();
        assert_eq!(restored["kind"], "IPAddress");
        assert_eq!(restored["spec"]["parentRef"]["name"], "one");
        assert!(store
            .list(LEGACY_SERVICE_IPS[0])
            .await
            .unwrap()
            .0
            .is_empty());
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
