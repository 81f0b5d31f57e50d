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
use portal_api::{kinds, Status};
use portal_store::{Error as StoreError, Op};
use serde_json::{json, Value};

use crate::registry::allocator::{owner, Pool, Range, Refusal, LOAD_BALANCER_IPS};
use crate::registry::write::internal::{Change, Writer};
use crate::registry::write::Part;
use crate::{store_error, ApiState};

/// The field manager of the addresses it publishes in Services' status.
pub(crate) const MANAGER: &str = "portal-load-balancer";

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
pub(crate) async fn run(state: Arc<ApiState>, pool: Pool) {
    let mut changes = state.cache.subscribe();
    loop {
        if let Err(error) = reconcile(&state, &pool).await {
            tracing::warn!(error = %error.message, "load-balancer provider: reconcile failed");
        }
        let _ = tokio::time::timeout(RESYNC, changes.changed()).await;
        tokio::time::sleep(SETTLE).await;
        changes.mark_unchanged();
    }
}

/// One pass: assign, publish and release addresses.
pub(crate) async fn reconcile(state: &ApiState, pool: &Pool) -> Result<(), Status> {
    let resource = &kinds::service::RESOURCE;
    let (services, _, _) = state
        .cache
        .list(resource, &resource.key_prefix(), None, 0, |o| {
            is_load_balancer(&o.value)
        });
    let store = state.store.as_ref();
    let (records, _) = store.list(LOAD_BALANCER_IPS).await.map_err(store_error)?;
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
        if let Some(ip) = assign(state, pool, &svc.value).await? {
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
        release(state, &holder, ip).await?;
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
            Err(e) => return Err(store_error(e)),
        }
    }
    Ok(())
}

/// Picks an address for one Service and publishes it in its status,
/// through the registry, with the address's record in the same
/// transaction.
async fn assign(state: &ApiState, pool: &Pool, svc: &Value) -> Result<Option<String>, Status> {
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
            tracing::warn!(service = %owner(svc), requested = ?requested, "load-balancer address {why}; pending");
            return Ok(None);
        }
    };
    let (namespace, name) = (
        svc["metadata"]["namespace"].as_str().unwrap_or_default(),
        svc["metadata"]["name"].as_str().unwrap_or_default(),
    );
    let writer = Writer::new(state, &kinds::service::RESOURCE, MANAGER);
    let record = Op::Create {
        key: pool.key(&ip),
        value: Bytes::from(json!({"service": owner(svc)}).to_string()),
    };
    let published = writer
        .update(Some(namespace), name, Part::Status, |current| {
            // Changed meanwhile: the next pass sees the new state.
            if !is_load_balancer(current)
                || current["spec"]["loadBalancerIP"] != svc["spec"]["loadBalancerIP"]
            {
                return Change::Keep;
            }
            let mut next = current.clone();
            next["status"]["loadBalancer"] = json!({"ingress": [{"ip": ip, "ipMode": "VIP"}]});
            Change::WriteWith(next, vec![record.clone()])
        })
        .await;
    match published {
        Ok(stored) if ingress_ip(&stored.value) == Some(ip.as_str()) => {
            tracing::info!(%ip, service = %owner(svc), "load-balancer address assigned");
            Ok(Some(ip))
        }
        Ok(_)
        | Err(Status {
            code: 404 | 409, ..
        }) => {
            pool.release(offset);
            Ok(None)
        }
        Err(status) => {
            pool.release(offset);
            Err(status)
        }
    }
}

/// Clears the published address of a Service that no longer holds it.
async fn release(state: &ApiState, holder: &str, ip: &str) -> Result<(), Status> {
    let Some((namespace, name)) = holder.split_once('/') else {
        return Ok(());
    };
    let writer = Writer::new(state, &kinds::service::RESOURCE, MANAGER);
    let cleared = writer
        .update(Some(namespace), name, Part::Status, |current| {
            if ingress_ip(current) != Some(ip) {
                return Change::Keep;
            }
            let mut next = current.clone();
            next["status"]["loadBalancer"] = json!({});
            Change::Write(next)
        })
        .await;
    match cleared {
        Ok(_)
        | Err(Status {
            code: 404 | 409, ..
        }) => Ok(()),
        Err(status) => Err(status),
    }
}
