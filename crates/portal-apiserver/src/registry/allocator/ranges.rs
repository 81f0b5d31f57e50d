//! Cluster IP ranges beyond `--service-cluster-ip-range`: every
//! ServiceCIDR other than `kubernetes` (which is the flags') adds a pool
//! per CIDR. New addresses come from the flags' range first, then from the
//! others, oldest first; a Service may ask for an address in any of them.
//! A ServiceCIDR being deleted gives no new addresses (its pool stays
//! until it is gone, so repair still finds its Services in range).
//! Every API server follows the ServiceCIDRs into its own allocators.

use std::sync::Arc;

use portal_api::cidr::{IpCidr, IpFamily};
use portal_api::kinds::{ip_address, service_cidr};
use serde_json::Value;

use super::{Allocators, Pool, Range, IP_ADDRESSES};
use crate::ApiState;

/// A pool of cluster IPs in `cidr`; random picks start at `first_dynamic`.
pub(crate) fn pool(cidr: IpCidr, first_dynamic: u64) -> Pool {
    Pool::new(
        Range::Ip {
            cidr,
            first_dynamic,
        },
        IP_ADDRESSES,
    )
}

/// The pool of one CIDR of a ServiceCIDR.
#[derive(Debug)]
pub(crate) struct Extra {
    /// The ServiceCIDR it comes from.
    pub(crate) name: String,
    pub(crate) cidr: IpCidr,
    pub(crate) pool: Arc<Pool>,
    /// False while the ServiceCIDR is being deleted.
    pub(crate) allocatable: bool,
}

impl Extra {
    pub(crate) fn family(&self) -> IpFamily {
        self.cidr.family()
    }
}

/// Keeps this server's allocators in step with the ServiceCIDRs.
pub(crate) async fn follow(state: Arc<ApiState>) {
    let mut advanced = state.cache.subscribe();
    let mut handled = None;
    loop {
        let changed = state.cache.changed(&[service_cidr::KIND]);
        if handled != Some(changed) {
            handled = Some(changed);
            apply(&state, &listed(&state, &service_cidr::RESOURCE));
        }
        if advanced.changed().await.is_err() {
            return;
        }
    }
}

/// Takes `ranges` (the ServiceCIDRs now) into this server's allocators.
pub(crate) fn apply(state: &ApiState, ranges: &[Value]) {
    state
        .allocators
        .follow(ranges, || names(state, &ip_address::RESOURCE));
}

/// The names of every object of a cluster-scoped kind, from the watch cache.
pub(crate) fn names(state: &ApiState, resource: &portal_api::Resource) -> Vec<String> {
    let prefix = resource.key_prefix();
    let (found, _, _) = state.cache.list(resource, &prefix, None, 0, |_| true);
    found
        .iter()
        .filter_map(|o| o.value["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// Every object of a cluster-scoped kind, from the watch cache.
pub(crate) fn listed(state: &ApiState, resource: &portal_api::Resource) -> Vec<Value> {
    let prefix = resource.key_prefix();
    let (found, _, _) = state.cache.list(resource, &prefix, None, 0, |_| true);
    found.iter().map(|o| o.value.clone()).collect()
}

/// The CIDRs of a ServiceCIDR that parse (validation made sure they all do).
pub(crate) fn cidrs_of(range: &Value) -> Vec<IpCidr> {
    service_cidr::cidrs(range)
        .into_iter()
        .filter_map(|c| c.parse().ok())
        .collect()
}

impl Allocators {
    /// Takes the ServiceCIDRs as they now are: pools for new ones (their
    /// bitmaps filled from the addresses `taken` says are), none for
    /// deleted ones, and none to allocate from for those being deleted or
    /// not yet holding their finalizer (so none can go while it holds an
    /// address handed out here).
    pub(crate) fn follow(&self, ranges: &[Value], taken: impl FnOnce() -> Vec<String>) {
        let mut wanted: Vec<(String, IpCidr, bool, String)> = Vec::new();
        for range in ranges {
            let name = range["metadata"]["name"].as_str().unwrap_or("");
            if name == service_cidr::DEFAULT_NAME {
                continue;
            }
            let created = range["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or("");
            let allocatable = service_cidr::holds_finalizer(range)
                && range["metadata"]["deletionTimestamp"].is_null();
            for cidr in cidrs_of(range) {
                wanted.push((name.to_owned(), cidr, allocatable, created.to_owned()));
            }
        }
        // Oldest first, then by name: every server picks in the same order.
        wanted.sort_by(|a, b| (&a.3, &a.0).cmp(&(&b.3, &b.0)));
        // One change at a time (the cache's follower and the duty both
        // call this); Service writes wait only for the swap at the end.
        let _one_at_a_time = self.following.lock();
        let existing: Vec<(String, IpCidr, Arc<Pool>)> = self
            .extra
            .read()
            .iter()
            .map(|e| (e.name.clone(), e.cidr, e.pool.clone()))
            .collect();
        let is_new =
            |name: &str, cidr: &IpCidr| !existing.iter().any(|(n, c, _)| n == name && c == cidr);
        let taken = if wanted.iter().any(|(n, c, ..)| is_new(n, c)) {
            taken()
        } else {
            Vec::new()
        };
        let next: Vec<Extra> = wanted
            .into_iter()
            .map(|(name, cidr, allocatable, _)| {
                let kept = existing
                    .iter()
                    .find(|(n, c, _)| *n == name && *c == cidr)
                    .map(|(_, _, pool)| pool.clone());
                let pool = kept.unwrap_or_else(|| {
                    let fresh = pool(cidr, 1);
                    fresh.sync(taken.iter().map(String::as_str));
                    Arc::new(fresh)
                });
                Extra {
                    name,
                    cidr,
                    pool,
                    allocatable,
                }
            })
            .collect();
        *self.extra.write() = next;
    }

    /// The ranges of `--service-cluster-ip-range`, the primary first.
    pub(crate) fn flag_cidrs(&self) -> Vec<IpCidr> {
        self.ips
            .iter()
            .filter_map(|(_, p)| p.range.cidr())
            .collect()
    }

    /// Every range Services may hold addresses in: the flags' and every
    /// ServiceCIDR's, being deleted or not.
    pub(crate) fn all_cidrs(&self) -> Vec<IpCidr> {
        self.all_ip_pools()
            .iter()
            .filter_map(|p| p.range.cidr())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portal_api::kinds;
    use serde_json::json;

    fn range(name: &str, cidrs: &[&str], deleting: bool) -> Value {
        let mut object = json!({"metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z",
            "finalizers": [service_cidr::FINALIZER]}, "spec": {"cidrs": cidrs}});
        if deleting {
            object["metadata"]["deletionTimestamp"] = json!("2026-01-02T00:00:00Z");
        }
        object
    }

    fn service(spec: Value) -> Value {
        let mut svc = json!({"metadata": {"name": "s", "namespace": "default"}, "spec": spec});
        let allocators = Allocators::new(
            &"10.96.0.0/30".parse().unwrap(),
            "30000-30009".parse().unwrap(),
        );
        allocators
            .prepare_families(&kinds::service::RESOURCE, &mut svc, None)
            .unwrap();
        svc
    }

    #[test]
    fn a_full_range_is_extended_by_a_service_cidr() {
        // A /30 has two usable addresses; .1 is the `kubernetes` Service's.
        let a = Allocators::new(
            &"10.96.0.0/30".parse().unwrap(),
            "30000-30009".parse().unwrap(),
        );
        let mut first = service(json!({"ports": [{"port": 80}]}));
        a.for_create(&kinds::service::RESOURCE, &mut first)
            .unwrap()
            .commit();
        assert_eq!(first["spec"]["clusterIP"], "10.96.0.2");
        let mut second = service(json!({"ports": [{"port": 80}]}));
        let full = a
            .for_create(&kinds::service::RESOURCE, &mut second)
            .unwrap_err();
        assert!(
            full.message.contains("range is full (10.96.0.0/30)"),
            "{}",
            full.message
        );

        a.follow(
            &[
                range("kubernetes", &["10.96.0.0/30"], false),
                range("more", &["10.100.0.0/29"], false),
            ],
            || vec!["10.100.0.1".to_owned()],
        );
        let mut second = service(json!({"ports": [{"port": 80}]}));
        a.for_create(&kinds::service::RESOURCE, &mut second)
            .unwrap()
            .commit();
        let ip = second["spec"]["clusterIP"].as_str().unwrap();
        assert!(
            ip.starts_with("10.100.0.") && ip != "10.100.0.1",
            "{ip} (taken already)"
        );
        // Two addresses the random pick above did not take.
        let free: Vec<&str> = ["10.100.0.6", "10.100.0.5", "10.100.0.4"]
            .into_iter()
            .filter(|free| *free != ip)
            .collect();
        let mut asked = service(json!({"clusterIP": free[0], "ports": [{"port": 80}]}));
        a.for_create(&kinds::service::RESOURCE, &mut asked)
            .unwrap()
            .commit();

        // Being deleted: no new addresses from it, but it still holds them.
        a.follow(&[range("more", &["10.100.0.0/29"], true)], Vec::new);
        let mut third = service(json!({"ports": [{"port": 80}]}));
        assert!(a.for_create(&kinds::service::RESOURCE, &mut third).is_err());
        let mut asked = service(json!({"clusterIP": free[1], "ports": [{"port": 80}]}));
        assert!(a
            .for_create(&kinds::service::RESOURCE, &mut asked)
            .unwrap_err()
            .message
            .ends_with("the provided network does not match the current range"));
        assert_eq!(a.all_cidrs().len(), 2);
        a.follow(&[], Vec::new);
        assert_eq!(a.all_cidrs().len(), 1);
    }

    #[test]
    fn overlapping_ranges_never_hand_out_one_address_twice() {
        let a = Allocators::new(
            &"10.96.0.0/30".parse().unwrap(),
            "30000-30009".parse().unwrap(),
        );
        a.follow(&[range("wide", &["10.96.0.0/29"], false)], Vec::new);
        let mut got = Vec::new();
        for _ in 0..6 {
            let mut svc = service(json!({"ports": [{"port": 80}]}));
            a.for_create(&kinds::service::RESOURCE, &mut svc)
                .unwrap()
                .commit();
            got.push(svc["spec"]["clusterIP"].as_str().unwrap().to_owned());
        }
        got.sort();
        // The flags' .2 first; then the wide range's .1 to .6 but .2.
        assert_eq!(
            got,
            (1..=6).map(|i| format!("10.96.0.{i}")).collect::<Vec<_>>()
        );
        let mut full = service(json!({"ports": [{"port": 80}]}));
        assert!(a.for_create(&kinds::service::RESOURCE, &mut full).is_err());
        let mut again = service(json!({"clusterIP": "10.96.0.2", "ports": [{"port": 80}]}));
        assert!(a
            .for_create(&kinds::service::RESOURCE, &mut again)
            .unwrap_err()
            .message
            .ends_with("provided IP is already allocated"));
        // Released in both: asked for again, it is given.
        let old = json!({"metadata": {"name": "s", "namespace": "default"}, "spec": {"clusterIP": "10.96.0.2", "clusterIPs": ["10.96.0.2"]}});
        a.for_delete(&kinds::service::RESOURCE, &old).commit();
        let mut again = service(json!({"clusterIP": "10.96.0.2", "ports": [{"port": 80}]}));
        assert!(a.for_create(&kinds::service::RESOURCE, &mut again).is_ok());
    }
}
