//! The `kubernetes` Service's Endpoints list every API server that is alive,
//! as Kubernetes' lease endpoint reconciler does: each server keeps a record
//! of its address in the store (`/registry/portal/apiservers/<ip:port>`)
//! and, on a shared store, renews it every few seconds; every server writes
//! the Endpoints from the records that are alive, and removes records that
//! stopped being renewed. A lone server (embedded store) writes once at
//! start, dropping the records of its earlier addresses.
//!
//! "Alive" is judged by this server's clock from when it last saw a record
//! change (a renewal always changes its revision), never by comparing the
//! clocks of different machines.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use portal_api::{kinds, Status};
use portal_store::{Error as StoreError, Op, Revision, Store};
use serde_json::{json, Value};

use crate::registry::write::internal::{Change, Writer};
use crate::registry::write::Part;
use crate::{store_error, ApiState};

/// The field manager of the server's writes to the `kubernetes` Service
/// and Endpoints (Kubernetes' is `kube-apiserver`).
pub(crate) const MANAGER: &str = "portal-apiserver";

const PREFIX: &str = "/registry/portal/apiservers/";

/// How often a server renews its record and reconciles the Endpoints.
pub(crate) const RENEW: Duration = Duration::from_secs(5);

/// A record not renewed for this long is a server that is gone
/// (Kubernetes' `--endpoint-reconciler-type=lease` uses 15 s too).
pub(crate) const TTL: Duration = Duration::from_secs(15);

/// Records as last seen: revision, and when it changed by our clock.
type Seen = HashMap<String, (Revision, Instant)>;

/// The API servers alive, by port.
type Alive = BTreeMap<u16, Vec<String>>;

/// Puts this server's address in the `kubernetes` Endpoints, the only one.
pub(crate) async fn publish_alone(state: &ApiState, ip: IpAddr, port: u16) -> Result<(), Status> {
    let alive = alone(state.store.as_ref(), ip, port)
        .await
        .map_err(store_error)?;
    write_endpoints(state, &alive).await
}

/// Drops the records of this server's earlier addresses, renews its own.
async fn alone(store: &dyn Store, ip: IpAddr, port: u16) -> Result<Alive, StoreError> {
    let own = record_key(ip, port);
    let (records, _) = store.list(PREFIX).await?;
    for kv in records.into_iter().filter(|kv| kv.key != own) {
        let op = Op::Delete {
            key: kv.key,
            expected_revision: Some(kv.mod_revision),
        };
        match store.txn(vec![op]).await {
            Ok(_) | Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    once(store, ip, port, &mut Seen::new(), TTL).await
}

/// Keeps this server's address in the `kubernetes` Endpoints for as long as
/// it runs, beside the other servers'.
pub(crate) async fn run(
    state: Arc<ApiState>,
    ip: IpAddr,
    port: u16,
    renew: Duration,
    ttl: Duration,
) {
    let mut seen = Seen::new();
    loop {
        let published = match once(state.store.as_ref(), ip, port, &mut seen, ttl).await {
            Ok(alive) => write_endpoints(&state, &alive).await,
            Err(error) => Err(store_error(error)),
        };
        if let Err(error) = published {
            tracing::warn!(error = %error.message, "publishing this API server in the kubernetes Endpoints");
        }
        tokio::time::sleep(renew).await;
    }
}

/// One round: renew our record, drop expired ones; the servers alive.
async fn once(
    store: &dyn Store,
    ip: IpAddr,
    port: u16,
    seen: &mut Seen,
    ttl: Duration,
) -> Result<Alive, StoreError> {
    renew(store, ip, port).await?;
    let (records, _) = store.list(PREFIX).await?;
    let now = Instant::now();
    let mut alive: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    seen.retain(|key, _| records.iter().any(|kv| &kv.key == key));
    for kv in &records {
        let entry = seen.entry(kv.key.clone()).or_insert((kv.mod_revision, now));
        if entry.0 != kv.mod_revision {
            *entry = (kv.mod_revision, now);
        }
        if now.duration_since(entry.1) > ttl {
            // Gone: remove it unless it was renewed just now.
            let op = Op::Delete {
                key: kv.key.clone(),
                expected_revision: Some(kv.mod_revision),
            };
            match store.txn(vec![op]).await {
                Ok(_) | Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {}
                Err(error) => return Err(error),
            }
            continue;
        }
        let Ok(record) = serde_json::from_slice::<Value>(&kv.value) else {
            continue;
        };
        if let (Some(ip), Some(port)) = (record["ip"].as_str(), record["port"].as_u64()) {
            if let Ok(port) = u16::try_from(port) {
                alive.entry(port).or_default().push(ip.to_owned());
            }
        }
    }
    Ok(alive)
}

/// Writes (creates or refreshes) our record; every write is a new revision
/// that others see as a renewal.
fn record_key(ip: IpAddr, port: u16) -> String {
    format!("{PREFIX}{}", std::net::SocketAddr::new(ip, port))
}

async fn renew(store: &dyn Store, ip: IpAddr, port: u16) -> Result<(), StoreError> {
    let key = record_key(ip, port);
    let value = Bytes::from(json!({"ip": ip.to_string(), "port": port}).to_string());
    let op = match store.get(&key).await? {
        Some(current) => Op::Update {
            key,
            value,
            expected_revision: current.mod_revision,
        },
        None => Op::Create { key, value },
    };
    match store.txn(vec![op]).await {
        // Someone else touched it at the same moment: next round.
        Ok(_) | Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => Ok(()),
        Err(error) => Err(error),
    }
}

/// The subsets for servers by port (addresses sorted, so equal sets compare
/// equal).
fn subsets(alive: &BTreeMap<u16, Vec<String>>) -> Value {
    Value::Array(
        alive
            .iter()
            .map(|(port, ips)| {
                let mut ips = ips.clone();
                ips.sort();
                json!({
                    "addresses": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
                    "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
                })
            })
            .collect(),
    )
}

/// Creates or updates the `kubernetes` Endpoints through the registry.
async fn write_endpoints(state: &ApiState, alive: &Alive) -> Result<(), Status> {
    let writer = Writer::new(state, &kinds::endpoints::RESOURCE, MANAGER);
    let subsets = subsets(alive);
    let update = writer
        .update(Some("default"), "kubernetes", Part::Main, |current| {
            if current["subsets"] == subsets {
                return Change::Keep;
            }
            let mut object = current.clone();
            object["subsets"] = subsets.clone();
            Change::Write(object)
        })
        .await;
    match update {
        Ok(_) => Ok(()),
        Err(status) if status.code == 404 => {
            let object = json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "kubernetes"}, "subsets": subsets});
            match writer.create(Some("default"), object).await {
                // Another server made it first; the next round compares again.
                Ok(_) => Ok(()),
                Err(status) if status.code == 409 => Ok(()),
                Err(status) => Err(status),
            }
        }
        // Another server wrote it meanwhile; the next round compares again.
        Err(status) if status.code == 409 => Ok(()),
        Err(status) => Err(status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portal_store::{EmbeddedOptions, EmbeddedStore};

    fn https(ips: &[&str], port: u16) -> Value {
        json!([{"addresses": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(), "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}])
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn servers_come_and_go_from_the_endpoints() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        let (a, b) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let ttl = Duration::from_millis(300);
        let (mut seen_a, mut seen_b) = (Seen::new(), Seen::new());
        once(&store, a, 6443, &mut seen_a, ttl).await.unwrap();
        let alive = once(&store, b, 6443, &mut seen_b, ttl).await.unwrap();
        assert_eq!(subsets(&alive), https(&["192.0.2.1", "192.0.2.2"], 6443));
        // b stops renewing; a goes on and, after the TTL, drops it.
        let mut alive = Alive::new();
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            alive = once(&store, a, 6443, &mut seen_a, ttl).await.unwrap();
        }
        assert_eq!(subsets(&alive), https(&["192.0.2.1"], 6443));
        assert_eq!(store.list(PREFIX).await.unwrap().0.len(), 1);
        // A lone server that comes back on another address is the only one.
        let alive = alone(&store, b, 7443).await.unwrap();
        assert_eq!(subsets(&alive), https(&["192.0.2.2"], 7443));
        assert_eq!(store.list(PREFIX).await.unwrap().0.len(), 1);
    }
}
