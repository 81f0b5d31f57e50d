//! The built-in load-balancer provider (SPEC S10, S13), the part of a cloud
//! controller manager that Kubernetes leaves to the cloud: gives each
//! `type: LoadBalancer` Service an address from `--load-balancer-pool` (its
//! `spec.loadBalancerIP` when that is free), publishes it in
//! `status.loadBalancer.ingress`, and takes it back when the Service goes
//! or changes type. Without a pool Services stay pending, as on Kubernetes
//! without a cloud; a Service naming a `loadBalancerClass` is another
//! provider's.
//!
//! It is an API client like any controller: what is allocated is what the
//! Services' status says (as MetalLB reads it), written with the Service's
//! `resourceVersion` as a precondition, and one provider runs at a time
//! (the controllers are leader-elected).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, reflector, Store};
use kube::runtime::{
    watcher::{self, watcher},
    WatchStreamExt,
};
use kube::{Api, Client, ResourceExt};
use portal_api::cidr::Ipv4Cidr;
use serde_json::{json, Value};
use tokio::sync::Notify;

/// The field manager of the addresses it publishes.
pub const MANAGER: &str = "portal-load-balancer";

/// Waits this long after a change before a pass, to batch bursts.
const SETTLE: Duration = Duration::from_millis(20);
/// Makes a pass at least this often, whatever happens.
const RESYNC: Duration = Duration::from_secs(30);
/// How long an address just published is held for its Service while the
/// Service cache does not show it yet.
const ASSUMED_FOR: Duration = Duration::from_secs(60);

/// Where addresses come from.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// `--load-balancer-pool`: every address of these ranges.
    pub pool: Vec<Ipv4Cidr>,
}

/// The addresses of the pool, in order.
#[derive(Debug)]
struct Pool(Vec<Ipv4Cidr>);

impl Pool {
    fn contains(&self, ip: Ipv4Addr) -> bool {
        self.0.iter().any(|cidr| cidr.contains(ip))
    }

    /// The first address no one holds.
    fn first_free(&self, taken: &dyn Fn(Ipv4Addr) -> bool) -> Option<Ipv4Addr> {
        self.0
            .iter()
            .flat_map(|cidr| (0..cidr.size()).filter_map(|n| cidr.nth(n)))
            .find(|ip| !taken(*ip))
    }
}

/// Follows Services for ever (returns at once without a pool).
pub async fn run(client: Client, config: Config) {
    if config.pool.is_empty() {
        return;
    }
    let api = Api::<Service>::all(client.clone());
    let (services, writer) = reflector::store();
    let changed = Arc::new(Notify::new());
    let notify = changed.clone();
    let follow = reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .for_each(move |_| {
            notify.notify_one();
            std::future::ready(())
        });
    let provider = Provider {
        client,
        pool: Pool(config.pool),
        services,
        assumed: HashMap::new(),
    };
    tokio::join!(follow, provider.run(changed));
}

struct Provider {
    client: Client,
    pool: Pool,
    services: Store<Service>,
    /// Addresses published but not yet seen in `services`: ip → (Service, when).
    assumed: HashMap<Ipv4Addr, (String, Instant)>,
}

/// `namespace/name`.
fn key(svc: &Service) -> String {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

fn ours(svc: &Service) -> bool {
    svc.spec.as_ref().is_some_and(|spec| {
        spec.type_.as_deref() == Some("LoadBalancer")
            && spec
                .load_balancer_class
                .as_deref()
                .is_none_or(str::is_empty)
    })
}

fn requested(svc: &Service) -> Option<Ipv4Addr> {
    svc.spec.as_ref()?.load_balancer_ip.as_deref()?.parse().ok()
}

fn published(svc: &Service) -> Option<Ipv4Addr> {
    svc.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .ip
        .as_deref()?
        .parse()
        .ok()
}

impl Provider {
    async fn run(mut self, changed: Arc<Notify>) {
        if self.services.wait_until_ready().await.is_err() {
            return;
        }
        loop {
            self.pass().await;
            let _ = tokio::time::timeout(RESYNC, changed.notified()).await;
            tokio::time::sleep(SETTLE).await;
        }
    }

    /// One pass: keep, assign, and take back addresses.
    async fn pass(&mut self) {
        let mut services = self.services.state();
        // The oldest holder of an address keeps it; Services asking for a
        // given address choose before those content with any.
        services.sort_by(|a, b| {
            (a.creation_timestamp(), key(a)).cmp(&(b.creation_timestamp(), key(b)))
        });
        let now = Instant::now();
        // An address stays assumed for a while, but never for a Service
        // that is gone: deleting one frees its address at once.
        let present: std::collections::HashSet<String> = services.iter().map(|s| key(s)).collect();
        self.assumed.retain(|_, (who, when)| {
            now.duration_since(*when) < ASSUMED_FOR && present.contains(who)
        });
        let mut held: HashMap<Ipv4Addr, String> = HashMap::new();
        let mut waiting = Vec::new();
        for svc in services.iter().filter(|svc| ours(svc)) {
            match published(svc).filter(|ip| self.pool.contains(*ip)) {
                Some(ip) if !held.contains_key(&ip) => {
                    self.assumed.remove(&ip);
                    held.insert(ip, key(svc));
                }
                _ => waiting.push(svc.clone()),
            }
        }
        waiting.sort_by_key(|svc| requested(svc).is_none());
        for svc in waiting {
            let who = key(&svc);
            let taken = |ip: Ipv4Addr| {
                held.contains_key(&ip) || self.assumed.get(&ip).is_some_and(|(k, _)| *k != who)
            };
            let choice = match requested(&svc) {
                Some(ip) if !self.pool.contains(ip) => Err("is not in the load-balancer pool"),
                Some(ip) if taken(ip) => Err("is already in use"),
                Some(ip) => Ok(ip),
                None => match self.assumed.iter().find(|(_, (k, _))| *k == who) {
                    Some((ip, _)) => Ok(*ip),
                    None => self
                        .pool
                        .first_free(&taken)
                        .ok_or("cannot be assigned: the load-balancer pool is full"),
                },
            };
            let ip = match choice {
                Ok(ip) => ip,
                Err(why) => {
                    tracing::warn!(service = %who, requested = ?requested(&svc), "load-balancer address {why}; pending");
                    continue;
                }
            };
            let ingress = json!({"ingress": [{"ip": ip.to_string(), "ipMode": "VIP"}]});
            if self.write(&svc, ingress).await {
                tracing::info!(%ip, service = %who, "load-balancer address assigned");
                self.assumed.insert(ip, (who.clone(), Instant::now()));
            }
            held.insert(ip, who);
        }
        // Addresses of the pool on Services that are no longer ours.
        for svc in services.iter().filter(|svc| !ours(svc)) {
            if let Some(ip) = published(svc).filter(|ip| self.pool.contains(*ip)) {
                if self.write(svc, json!({"ingress": null})).await {
                    tracing::info!(%ip, service = %key(svc), "load-balancer address released");
                }
            }
        }
    }

    /// Writes `status.loadBalancer` of the Service as it was seen (a
    /// changed Service is left to the next pass). Whether it was written.
    async fn write(&self, svc: &Service, load_balancer: Value) -> bool {
        let api = Api::<Service>::namespaced(
            self.client.clone(),
            svc.namespace().as_deref().unwrap_or_default(),
        );
        let patch = json!({
            "metadata": {"resourceVersion": svc.resource_version()},
            "status": {"loadBalancer": load_balancer},
        });
        let params = PatchParams {
            field_manager: Some(MANAGER.to_owned()),
            ..PatchParams::default()
        };
        match api
            .patch_status(&svc.name_any(), &params, &Patch::Merge(&patch))
            .await
        {
            Ok(_) => true,
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => false,
            Err(error) => {
                tracing::warn!(%error, service = %key(svc), "writing a load-balancer status failed");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_pool_hands_out_its_addresses_in_order() {
        let pool = Pool(vec![
            "192.0.2.8/30".parse().unwrap(),
            "198.51.100.1/32".parse().unwrap(),
        ]);
        let held: BTreeSet<Ipv4Addr> =
            BTreeSet::from(["192.0.2.8".parse().unwrap(), "192.0.2.9".parse().unwrap()]);
        let taken = |ip: Ipv4Addr| held.contains(&ip);
        assert_eq!(pool.first_free(&taken), Some("192.0.2.10".parse().unwrap()));
        let all = |_: Ipv4Addr| true;
        assert_eq!(pool.first_free(&all), None);
        assert!(pool.contains("198.51.100.1".parse().unwrap()));
        assert!(!pool.contains("192.0.2.12".parse().unwrap()));
    }

    #[test]
    fn another_class_is_another_providers() {
        let mut svc = Service {
            spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(ours(&svc));
        svc.spec.as_mut().unwrap().load_balancer_class = Some("example.com/lb".into());
        assert!(!ours(&svc));
    }
}
