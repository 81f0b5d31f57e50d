//! The built-in load-balancer provider (SPEC S10, S13): gives each
//! `type: LoadBalancer` Service an address from `--load-balancer-pool`
//! (its `spec.loadBalancerIP` when that is free), publishes it in
//! `status.loadBalancer.ingress`, and takes it back when the Service goes or
//! changes type. Without a pool Services stay pending, as on Kubernetes
//! without a cloud. Annotations stay on the Service untouched.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use portal_api::kinds;
use portal_store::{Error as StoreError, Op, Store};
use serde_json::{json, Value};

use crate::registry::allocator::{owner, Pool, Range, Refusal, LOAD_BALANCER_IPS};
use crate::registry::cache::WatchCache;

/// Waits this long after a change before reconciling, to batch bursts.
const SETTLE: Duration = Duration::from_millis(20);
/// Reconciles at least this often, whatever happens.
const RESYNC: Duration = Duration::from_secs(30);

pub(crate) fn pool(cidrs: Vec<portal_api::cidr::Ipv4Cidr>) -> Pool {
    Pool::new(Range::Ipv4Pool(cidrs), LOAD_BALANCER_IPS)
}

fn is_load_balancer(svc: &Value) -> bool {
    svc["spec"]["type"].as_str() == Some("LoadBalancer")
}

fn ingress_ip(svc: &Value) -> Option<&str> {
    svc.pointer("/status/loadBalancer/ingress/0/ip")
        .and_then(Value::as_str)
}

/// Follows Service changes for ever.
pub(crate) async fn run(store: Arc<dyn Store>, cache: Arc<WatchCache>, pool: Pool) {
    let mut changes = cache.subscribe();
    loop {
        if let Err(error) = reconcile(store.as_ref(), &cache, &pool).await {
            tracing::warn!(%error, "load-balancer provider: reconcile failed");
        }
        let _ = tokio::time::timeout(RESYNC, changes.changed()).await;
        tokio::time::sleep(SETTLE).await;
        changes.mark_unchanged();
    }
}

/// One pass: assign, publish and release addresses.
pub(crate) async fn reconcile(
    store: &dyn Store,
    cache: &WatchCache,
    pool: &Pool,
) -> Result<(), StoreError> {
    let resource = &kinds::service::RESOURCE;
    let (services, _, _) = cache.list(resource, &resource.key_prefix(), None, 0, |o| {
        is_load_balancer(&o.value)
    });
    let (records, _) = store.list(LOAD_BALANCER_IPS).await?;
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    for kv in &records {
        let holder: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
        held.insert(
            kv.key[LOAD_BALANCER_IPS.len()..].to_owned(),
            holder["service"].as_str().unwrap_or("").to_owned(),
        );
    }
    pool.sync(held.keys().map(String::as_str));
    let mut wanted: BTreeMap<String, String> = BTreeMap::new();
    // Services asking for a given address go first, so a Service content
    // with any address cannot take it from them in the same pass.
    let mut services = services;
    services.sort_by_key(|svc| {
        svc.value["spec"]["loadBalancerIP"]
            .as_str()
            .is_none_or(str::is_empty)
    });
    for svc in &services {
        let who = owner(&svc.value);
        if let Some(ip) = ingress_ip(&svc.value).filter(|ip| held.get(*ip) == Some(&who)) {
            wanted.insert(ip.to_owned(), who);
            continue;
        }
        if let Some(ip) = assign(store, pool, &svc.key).await? {
            wanted.insert(ip, who);
        }
    }
    // Records whose Service is gone or no longer a LoadBalancer.
    for kv in records {
        let ip = &kv.key[LOAD_BALANCER_IPS.len()..];
        if wanted.contains_key(ip) {
            continue;
        }
        let holder = held.get(ip).cloned().unwrap_or_default();
        release(store, &holder, ip).await?;
        match store
            .txn(vec![Op::Delete {
                key: kv.key.clone(),
                expected_revision: Some(kv.mod_revision),
            }])
            .await
        {
            Ok(_) => {
                if let Some(offset) = pool.range.offset(ip) {
                    pool.release(offset);
                }
                tracing::info!(%ip, service = %holder, "load-balancer address released");
            }
            Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Picks an address for one Service and publishes it with its record.
async fn assign(store: &dyn Store, pool: &Pool, key: &str) -> Result<Option<String>, StoreError> {
    let Some(current) = store.get(key).await? else {
        return Ok(None);
    };
    let mut svc: Value =
        serde_json::from_slice(&current.value).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    if !is_load_balancer(&svc) {
        return Ok(None);
    }
    let requested = svc["spec"]["loadBalancerIP"]
        .as_str()
        .filter(|ip| !ip.is_empty())
        .map(str::to_owned);
    let choice = match &requested {
        Some(ip) => pool.reserve(ip).map(|offset| (offset, ip.clone())),
        None => pool.reserve_any(),
    };
    let (offset, ip) = match choice {
        Ok(choice) => choice,
        Err(refusal) => {
            let why = match refusal {
                Refusal::OutOfRange => "is not in the load-balancer pool",
                Refusal::Taken => "is already in use",
                Refusal::Full => "cannot be assigned: the load-balancer pool is full",
            };
            tracing::warn!(service = %owner(&svc), requested = ?requested, "load-balancer address {why}; pending");
            return Ok(None);
        }
    };
    svc["status"]["loadBalancer"] = json!({"ingress": [{"ip": ip, "ipMode": "VIP"}]});
    let record = Bytes::from(json!({"service": owner(&svc)}).to_string());
    let ops = vec![
        Op::Update {
            key: key.to_owned(),
            value: Bytes::from(svc.to_string()),
            expected_revision: current.mod_revision,
        },
        Op::Create {
            key: pool.key(&ip),
            value: record,
        },
    ];
    match store.txn(ops).await {
        Ok(_) => {
            tracing::info!(%ip, service = %owner(&svc), "load-balancer address assigned");
            Ok(Some(ip))
        }
        // Changed meanwhile: the next pass sees the new state.
        Err(
            StoreError::Conflict { .. }
            | StoreError::NotFound { .. }
            | StoreError::AlreadyExists { .. },
        ) => {
            pool.release(offset);
            Ok(None)
        }
        Err(e) => {
            pool.release(offset);
            Err(e)
        }
    }
}

/// Clears the published address of a Service that no longer holds it.
async fn release(store: &dyn Store, holder: &str, ip: &str) -> Result<(), StoreError> {
    let Some((namespace, name)) = holder.split_once('/') else {
        return Ok(());
    };
    let key = kinds::service::RESOURCE.key(Some(namespace), name);
    let Some(current) = store.get(&key).await? else {
        return Ok(());
    };
    let mut svc: Value =
        serde_json::from_slice(&current.value).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    if ingress_ip(&svc) != Some(ip) {
        return Ok(());
    }
    svc["status"]["loadBalancer"] = json!({});
    let op = Op::Update {
        key,
        value: Bytes::from(svc.to_string()),
        expected_revision: current.mod_revision,
    };
    match store.txn(vec![op]).await {
        Ok(_) | Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}
