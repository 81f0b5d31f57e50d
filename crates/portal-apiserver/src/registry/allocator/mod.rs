//! Cluster IPs and node ports of Services (SPEC S4, S9): chosen here,
//! recorded as one store key each in the same transaction as the Service
//! (ADR 0003), released in the same transaction as its deletion or type
//! change. A cluster IP's record is an IPAddress object (`networking.k8s.io/v1`,
//! ADR 0037); a node port's a small record of its own. A dual-stack cluster
//! has a pool per family (`families`: which families a Service gets), and
//! ServiceCIDRs beyond the flags' add pools at run time (`ranges`).

mod families;
mod pool;
pub(crate) mod ranges;
pub(crate) mod repair;

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::RwLock;
use portal_api::cidr::{IpFamily, PortRange, ServiceCidrs};
use portal_api::kinds::ip_address;
use portal_api::service::families::{cluster_ips, ip_families};
use portal_api::service::{wants_cluster_ip, wants_node_ports, HEADLESS};
use portal_api::{kinds, meta, Cause, Resource};
use portal_store::Op;
use serde_json::{json, Value};

pub(crate) use pool::{Pool, Range, Refusal};
use ranges::Extra;

/// Where IPAddress objects, the cluster IPs' records, are kept (the
/// kind's own prefix, so they are served as they are written).
pub(crate) const IP_ADDRESSES: &str = "/registry/networking.k8s.io/ipaddresses/";
/// Where cluster IPs were recorded before they were IPAddresses (repair
/// moves what it finds there).
pub(crate) const LEGACY_SERVICE_IPS: [&str; 2] = [
    "/registry/ranges/serviceips/",
    "/registry/ranges/serviceips-ipv6/",
];
pub(crate) const NODE_PORTS: &str = "/registry/ranges/servicenodeports/";

/// The allocation ranges of one cluster.
#[derive(Debug)]
pub(crate) struct Allocators {
    /// A pool per CIDR of `--service-cluster-ip-range` (the `kubernetes`
    /// ServiceCIDR), the primary family's first.
    pub(crate) ips: Vec<(IpFamily, Arc<Pool>)>,
    /// Pools of the other ServiceCIDRs, as `ranges::follow` finds them.
    extra: RwLock<Vec<Extra>>,
    /// Held while the ServiceCIDRs are taken in.
    following: parking_lot::Mutex<()>,
    pub(crate) node_ports: Arc<Pool>,
}

/// In-memory reservations made for one write, and the store ops that make
/// them real. Committed or aborted once the transaction's fate is known.
#[derive(Debug, Default)]
pub(crate) struct Reservation {
    pub(crate) ops: Vec<Op>,
    taken: Vec<(Arc<Pool>, u64)>,
    freed: Vec<(Arc<Pool>, String)>,
}

impl Reservation {
    /// The write committed: what it released is free now.
    pub(crate) fn commit(self) {
        for (pool, value) in self.freed {
            if let Some(offset) = pool.range.offset(&value) {
                pool.release(offset);
            }
        }
    }

    /// The write failed: undo the reservations, except one whose key turned
    /// out to be taken by someone else (it stays marked).
    pub(crate) fn abort(self, taken_elsewhere: Option<&str>) {
        for (pool, offset) in self.taken {
            let key = pool.range.value(offset).map(|v| pool.key(&v));
            if taken_elsewhere.is_none() || key.as_deref() != taken_elsewhere {
                pool.release(offset);
            }
        }
    }
}

/// The record of who holds a node port.
fn record(owner: &str) -> Bytes {
    Bytes::from(json!({"service": owner}).to_string())
}

/// The IPAddress object recording that Service `owner` (`namespace/name`)
/// holds `ip`.
pub(crate) fn ip_record(ip: &str, family: IpFamily, owner: &str) -> Bytes {
    let (namespace, name) = owner.split_once('/').unwrap_or(("", owner));
    let mut object = ip_address::for_service(ip, family.name(), namespace, name);
    crate::registry::strategy::prepare_create(&ip_address::RESOURCE, &mut object, None);
    Bytes::from(serde_json::to_vec(&object).unwrap_or_default())
}

/// `namespace/name` of a Service.
pub(crate) fn owner(svc: &Value) -> String {
    format!(
        "{}/{}",
        meta::meta_str(svc, "namespace").unwrap_or(""),
        meta::meta_str(svc, "name").unwrap_or("")
    )
}

fn ports_mut(svc: &mut Value) -> impl Iterator<Item = &mut Value> {
    svc.pointer_mut("/spec/ports")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

fn port_key(port: &Value) -> (i64, String) {
    (
        port["port"].as_i64().unwrap_or(0),
        port["protocol"].as_str().unwrap_or("TCP").to_owned(),
    )
}

/// The node ports a Service holds: its ports' and its health check's.
pub(crate) fn node_ports_of(svc: &Value) -> Vec<i64> {
    let mut ports = if wants_node_ports(svc) {
        node_ports_written(svc)
    } else {
        Vec::new()
    };
    if let Some(port) = health_check_port_of(svc) {
        ports.push(port);
        ports.sort_unstable();
        ports.dedup();
    }
    ports
}

/// A LoadBalancer Service with `externalTrafficPolicy: Local` has a
/// health check node port (`healthCheckNodePort`).
fn needs_health_check(svc: &Value) -> bool {
    svc["spec"]["type"].as_str() == Some("LoadBalancer")
        && svc["spec"]["externalTrafficPolicy"].as_str() == Some("Local")
}

fn health_check_port_of(svc: &Value) -> Option<i64> {
    needs_health_check(svc)
        .then(|| svc["spec"]["healthCheckNodePort"].as_i64())
        .flatten()
        .filter(|p| *p != 0)
}

/// The node ports written in a Service, whatever its type.
fn node_ports_written(svc: &Value) -> Vec<i64> {
    let mut ports: Vec<i64> = svc["spec"]["ports"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter_map(|p| p["nodePort"].as_i64())
        .filter(|p| *p != 0)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The cluster IPs a Service holds, by family.
pub(crate) fn cluster_ips_of(svc: &Value) -> Vec<(IpFamily, String)> {
    if !wants_cluster_ip(svc) {
        return Vec::new();
    }
    let mut ips = cluster_ips(svc);
    if ips.is_empty() {
        ips.extend(svc["spec"]["clusterIP"].as_str());
    }
    // Canonical text: one address, one record key, whatever the spelling.
    ips.into_iter()
        .filter_map(|ip| ip.parse::<std::net::IpAddr>().ok())
        .map(|ip| (IpFamily::of(ip), ip.to_string()))
        .collect()
}

impl Allocators {
    pub(crate) fn new(service_cidrs: &ServiceCidrs, node_ports: PortRange) -> Self {
        let ips = service_cidrs
            .all()
            .iter()
            // Offset 1 is the `kubernetes` Service's; dynamic picks start at 2.
            .map(|cidr| (cidr.family(), Arc::new(ranges::pool(*cidr, 2))))
            .collect();
        Allocators {
            ips,
            extra: RwLock::default(),
            following: parking_lot::Mutex::default(),
            node_ports: Arc::new(Pool::new(Range::Ports(node_ports), NODE_PORTS)),
        }
    }

    /// The flags' pool of `family`, if the cluster has that family.
    pub(crate) fn pool(&self, family: IpFamily) -> Option<&Arc<Pool>> {
        self.ips
            .iter()
            .find(|(f, _)| *f == family)
            .map(|(_, pool)| pool)
    }

    /// Where new addresses of `family` come from: the flags' range, then
    /// the other ServiceCIDRs' (not those being deleted), oldest first.
    fn pools_of(&self, family: IpFamily) -> Vec<Arc<Pool>> {
        let mut pools: Vec<Arc<Pool>> = self.pool(family).cloned().into_iter().collect();
        pools.extend(
            self.extra
                .read()
                .iter()
                .filter(|e| e.allocatable && e.family() == family)
                .map(|e| e.pool.clone()),
        );
        pools
    }

    /// Every pool, the flags' and the other ServiceCIDRs' (repair syncs
    /// each from the records).
    pub(crate) fn all_ip_pools(&self) -> Vec<Arc<Pool>> {
        let mut pools: Vec<Arc<Pool>> = self.ips.iter().map(|(_, p)| p.clone()).collect();
        pools.extend(self.extra.read().iter().map(|e| e.pool.clone()));
        pools
    }

    fn primary(&self) -> &Pool {
        &self.ips[0].1
    }

    /// The address reserved for the `kubernetes` Service (the primary
    /// family's).
    pub(crate) fn first_address(&self) -> String {
        self.primary().range.value(1).unwrap_or_default()
    }

    /// Each family's first address (the serving certificate names them
    /// all, so a reordered flag keeps in-cluster clients working).
    pub(crate) fn first_addresses(&self) -> Vec<String> {
        self.ips
            .iter()
            .filter_map(|(_, pool)| pool.range.value(1))
            .collect()
    }

    /// The cluster DNS Service's address: the tenth of the primary range
    /// (none in ranges too small to have one).
    pub(crate) fn dns_address(&self) -> Option<String> {
        self.primary().range.value(10)
    }

    /// A cluster IP for each of `svc`'s families it does not hold yet
    /// (`held`): the one asked for at that index, else any free one.
    fn take_ips(
        &self,
        r: &mut Reservation,
        svc: &mut Value,
        owner: &str,
        held: &[(IpFamily, String)],
    ) -> Result<(), Cause> {
        let families: Vec<IpFamily> = ip_families(svc)
            .into_iter()
            .filter_map(IpFamily::from_name)
            .collect();
        let mut ips: Vec<String> = cluster_ips(svc).into_iter().map(str::to_owned).collect();
        ips.resize(ips.len().max(families.len()), String::new());
        for (i, family) in families.iter().enumerate() {
            if held.iter().any(|(f, ip)| f == family && *ip == ips[i]) {
                continue;
            }
            let rendered = portal_api::service::families::go_strings(&ips);
            if self.pool(*family).is_none() {
                return Err(Cause::invalid(
                    &format!("spec.ipFamilies[{i}]"),
                    family.name(),
                    "not configured on this cluster",
                ));
            }
            let pools = self.pools_of(*family);
            let refused =
                |detail: String| Cause::invalid_rendered("spec.clusterIPs", &rendered, &detail);
            let marked = if ips[i].is_empty() {
                self.pick(&pools).ok_or_else(|| {
                    let ranges: Vec<String> = pools.iter().map(|p| p.range.describe()).collect();
                    refused(format!(
                        "failed to allocate a serviceIP: range is full ({})",
                        ranges.join(", ")
                    ))
                })?
            } else {
                self.reserve_asked(&pools, &ips[i]).map_err(refused)?
            };
            let ip = marked.ip;
            r.taken.extend(marked.taken);
            r.ops.push(Op::Create {
                key: format!("{IP_ADDRESSES}{ip}"),
                value: ip_record(&ip, *family, owner),
            });
            ips[i] = ip;
        }
        if let Some(first) = ips.first().cloned() {
            svc["spec"]["clusterIP"] = json!(first);
            svc["spec"]["clusterIPs"] = json!(ips);
        }
        Ok(())
    }

    /// Releases `ips` when the write commits (the records of a family
    /// the cluster no longer has too).
    fn release_ips(&self, r: &mut Reservation, ips: &[(IpFamily, String)]) {
        let pools = self.all_ip_pools();
        for (_, ip) in ips {
            r.ops.push(Op::Delete {
                key: format!("{IP_ADDRESSES}{ip}"),
                expected_revision: None,
            });
            for pool in pools.iter().filter(|p| p.range.offset(ip).is_some()) {
                r.freed.push((pool.clone(), ip.clone()));
            }
        }
    }

    /// Node ports for every port of `svc` that has none, and reservations
    /// for requested ones not already held (`held`).
    fn take_node_ports(
        &self,
        r: &mut Reservation,
        svc: &mut Value,
        owner: &str,
        held: &[i64],
    ) -> Result<(), Cause> {
        let mut mine: Vec<i64> = Vec::new();
        for (i, port) in ports_mut(svc).enumerate() {
            let field = format!("spec.ports[{i}].nodePort");
            let requested = port["nodePort"].as_i64().unwrap_or(0);
            // One node port may serve several ports of the same Service.
            if requested != 0 && (held.contains(&requested) || mine.contains(&requested)) {
                continue;
            }
            let value = self.take_node_port(r, &field, requested, owner)?;
            mine.push(value);
            port["nodePort"] = json!(value);
        }
        Ok(())
    }

    /// One node port for `field`: `requested` if free and in range, else
    /// (0) any free one; its record joins the reservation.
    fn take_node_port(
        &self,
        r: &mut Reservation,
        field: &str,
        requested: i64,
        owner: &str,
    ) -> Result<i64, Cause> {
        let range = self.node_ports.range.describe();
        let value = if requested != 0 {
            match self.node_ports.reserve(&requested.to_string()) {
                Ok(offset) => {
                    r.taken.push((self.node_ports.clone(), offset));
                    requested
                }
                Err(Refusal::OutOfRange) => {
                    let detail = format!("provided port is not in the valid range. The range of valid ports is {range}");
                    return Err(Cause::invalid(field, requested, &detail));
                }
                Err(_) => {
                    return Err(Cause::invalid(
                        field,
                        requested,
                        "provided port is already allocated",
                    ))
                }
            }
        } else {
            match self.node_ports.reserve_any() {
                Ok((offset, value)) => {
                    r.taken.push((self.node_ports.clone(), offset));
                    value.parse().unwrap_or(0)
                }
                Err(_) => {
                    let detail = format!("failed to allocate a nodePort: range is full ({range})");
                    return Err(Cause::invalid(field, 0, &detail));
                }
            }
        };
        r.ops.push(Op::Create {
            key: self.node_ports.key(&value.to_string()),
            value: record(owner),
        });
        Ok(value)
    }

    /// The health check node port of a Service that needs one (requested
    /// or allocated), unless already `held`; dropped from one that does not.
    fn take_health_check(
        &self,
        r: &mut Reservation,
        svc: &mut Value,
        owner: &str,
        held: &[i64],
    ) -> Result<(), Cause> {
        const FIELD: &str = "spec.healthCheckNodePort";
        if !needs_health_check(svc) {
            if let Some(spec) = svc["spec"].as_object_mut() {
                spec.remove("healthCheckNodePort");
            }
            return Ok(());
        }
        let requested = svc["spec"]["healthCheckNodePort"].as_i64().unwrap_or(0);
        if requested != 0 && held.contains(&requested) {
            return Ok(());
        }
        let value = self.take_node_port(r, FIELD, requested, owner)?;
        svc["spec"]["healthCheckNodePort"] = json!(value);
        Ok(())
    }

    /// Allocations of a new object (only Services have any).
    pub(crate) fn for_create(
        &self,
        resource: &Resource,
        svc: &mut Value,
    ) -> Result<Reservation, Cause> {
        let mut r = Reservation::default();
        if resource.kind() != kinds::service::KIND {
            return Ok(r);
        }
        let owner = owner(svc);
        let result = (|| {
            if wants_cluster_ip(svc) {
                self.take_ips(&mut r, svc, &owner, &[])?;
            } else if svc["spec"]["clusterIP"].as_str() == Some(HEADLESS) {
                svc["spec"]["clusterIPs"] = json!([HEADLESS]);
            }
            // A requested health check port is reserved before any port
            // is picked at random (which could otherwise take it); one
            // number for both is refused by the second reservation.
            let requested = health_check_port_of(svc).is_some();
            if requested {
                self.take_health_check(&mut r, svc, &owner, &[])?;
            }
            if wants_node_ports(svc) {
                self.take_node_ports(&mut r, svc, &owner, &[])?;
            }
            if !requested {
                self.take_health_check(&mut r, svc, &owner, &[])?;
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(r),
            Err(cause) => {
                r.abort(None);
                Err(cause)
            }
        }
    }

    /// What an update carries over from the old Service, as Kubernetes does
    /// (`patchAllocatedValues`, `dropTypeDependentFields`): allocations the
    /// client left out (a PUT without `clusterIP` or `nodePort`) are kept,
    /// and fields the new type has no use for are dropped when the client
    /// only changed the type (NodePort → ClusterIP keeps no node ports).
    pub(crate) fn keep_allocated(resource: &Resource, new: &mut Value, old: &Value) {
        if resource.kind() != kinds::service::KIND {
            return;
        }
        let spec_field = |svc: &Value, field: &str| svc["spec"][field].clone();
        if wants_node_ports(old)
            && !wants_node_ports(new)
            && node_ports_written(new) == node_ports_of(old)
        {
            for port in ports_mut(new) {
                if let Some(map) = port.as_object_mut() {
                    map.remove("nodePort");
                }
            }
            for field in ["externalTrafficPolicy", "healthCheckNodePort"] {
                if spec_field(new, field) == spec_field(old, field) {
                    if let Some(spec) = new["spec"].as_object_mut() {
                        spec.remove(field);
                    }
                }
            }
        }
        if new["spec"]["type"].as_str() != Some("LoadBalancer")
            && spec_field(new, "allocateLoadBalancerNodePorts")
                == spec_field(old, "allocateLoadBalancerNodePorts")
        {
            if let Some(spec) = new["spec"].as_object_mut() {
                spec.remove("allocateLoadBalancerNodePorts");
            }
        }
        // Kubernetes' `dropTypeDependentFields`: to ExternalName, each
        // cluster IP field the client sent back unchanged goes.
        let needs_cluster_ip = |s: &Value| s["spec"]["type"].as_str() != Some("ExternalName");
        if needs_cluster_ip(old) && !needs_cluster_ip(new) {
            let same_ips = spec_field(new, "clusterIP") == spec_field(old, "clusterIP")
                && spec_field(new, "clusterIPs") == spec_field(old, "clusterIPs");
            if let Some(spec) = new["spec"].as_object_mut() {
                if same_ips {
                    spec.remove("clusterIP");
                    spec.remove("clusterIPs");
                }
                for field in ["ipFamilies", "ipFamilyPolicy", "internalTrafficPolicy"] {
                    if spec.get(field) == old["spec"].get(field) {
                        spec.remove(field);
                    }
                }
            }
        }
        // Kubernetes' `patchAllocatedValues`: addresses the client left out
        // are kept (headless `None` too); the families follow from them and
        // the policy from the old one.
        if needs_cluster_ip(old) && needs_cluster_ip(new) {
            let held = old["spec"]["clusterIP"].as_str().unwrap_or("").to_owned();
            if new["spec"]["clusterIP"].as_str().unwrap_or("").is_empty() && !held.is_empty() {
                new["spec"]["clusterIP"] = json!(held);
            }
            if cluster_ips(new).is_empty() {
                let old_ips = cluster_ips(old);
                if !old_ips.is_empty() {
                    new["spec"]["clusterIPs"] = json!(old_ips);
                } else if !held.is_empty() {
                    new["spec"]["clusterIPs"] = json!([held]);
                }
            }
        }
        // No longer Local (or no longer a LoadBalancer): the health check
        // port the client sent back unchanged goes with it.
        if needs_health_check(old)
            && !needs_health_check(new)
            && new["spec"]["healthCheckNodePort"] == old["spec"]["healthCheckNodePort"]
        {
            if let Some(spec) = new["spec"].as_object_mut() {
                spec.remove("healthCheckNodePort");
            }
        }
        if needs_health_check(old) && needs_health_check(new) {
            let given = new["spec"]["healthCheckNodePort"].as_i64().unwrap_or(0);
            if let (0, Some(held)) = (given, health_check_port_of(old)) {
                new["spec"]["healthCheckNodePort"] = json!(held);
            }
        }
        if wants_node_ports(new) && wants_node_ports(old) {
            let old_ports = old["spec"]["ports"].as_array().cloned().unwrap_or_default();
            for port in ports_mut(new) {
                if port["nodePort"].as_i64().unwrap_or(0) == 0 {
                    if let Some(held) = old_ports.iter().find(|p| port_key(p) == port_key(port)) {
                        if let Some(n) = held["nodePort"].as_i64().filter(|n| *n != 0) {
                            port["nodePort"] = json!(n);
                        }
                    }
                }
            }
        }
    }

    /// Allocations that change with an update: a type change allocates or
    /// releases node ports, ExternalName ↔ ClusterIP the cluster IP.
    pub(crate) fn for_update(
        &self,
        resource: &Resource,
        new: &mut Value,
        old: &Value,
    ) -> Result<Reservation, Cause> {
        let mut r = Reservation::default();
        if resource.kind() != kinds::service::KIND {
            return Ok(r);
        }
        let owner = owner(new);
        let result = (|| {
            let held = cluster_ips_of(old);
            if wants_cluster_ip(new) {
                // A family added (an upgrade, or ExternalName no more) gets
                // an address; a family dropped (a downgrade) gives its back.
                self.take_ips(&mut r, new, &owner, &held)?;
                let wanted = cluster_ips_of(new);
                let dropped: Vec<(IpFamily, String)> =
                    held.into_iter().filter(|h| !wanted.contains(h)).collect();
                self.release_ips(&mut r, &dropped);
            } else if !held.is_empty() {
                self.release_ips(&mut r, &held);
                if let Some(spec) = new["spec"].as_object_mut() {
                    if spec.get("clusterIP").and_then(Value::as_str) != Some(HEADLESS) {
                        spec.remove("clusterIPs");
                    }
                }
            }
            let held = node_ports_of(old);
            if wants_node_ports(new) {
                self.take_node_ports(&mut r, new, &owner, &held)?;
            } else {
                for port in ports_mut(new) {
                    if let Some(map) = port.as_object_mut() {
                        map.remove("nodePort");
                    }
                }
            }
            self.take_health_check(&mut r, new, &owner, &held)?;
            let kept = node_ports_of(new);
            for port in held.into_iter().filter(|p| !kept.contains(p)) {
                r.ops.push(Op::Delete {
                    key: self.node_ports.key(&port.to_string()),
                    expected_revision: None,
                });
                r.freed.push((self.node_ports.clone(), port.to_string()));
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(r),
            Err(cause) => {
                r.abort(None);
                Err(cause)
            }
        }
    }

    /// Releases of a deleted object.
    pub(crate) fn for_delete(&self, resource: &Resource, old: &Value) -> Reservation {
        let mut r = Reservation::default();
        if resource.kind() != kinds::service::KIND {
            return r;
        }
        self.release_ips(&mut r, &cluster_ips_of(old));
        for port in node_ports_of(old) {
            r.ops.push(Op::Delete {
                key: self.node_ports.key(&port.to_string()),
                expected_revision: None,
            });
            r.freed.push((self.node_ports.clone(), port.to_string()));
        }
        r
    }

    /// Whether a store key is an allocation record.
    pub(crate) fn is_record(key: &str) -> bool {
        key.starts_with("/registry/ranges/") || key.starts_with(IP_ADDRESSES)
    }
}

/// An address reserved in every pool that holds it.
struct Marked {
    ip: String,
    taken: Vec<(Arc<Pool>, u64)>,
}

impl Allocators {
    /// Reserves `ip` in every pool but `picked` that holds it (ranges may
    /// overlap, and one address is one record); `None`, with nothing kept,
    /// if one of them has it taken.
    fn mark_elsewhere(&self, ip: &str, picked: &Arc<Pool>) -> Option<Vec<(Arc<Pool>, u64)>> {
        let mut taken: Vec<(Arc<Pool>, u64)> = Vec::new();
        for pool in self.all_ip_pools() {
            if Arc::ptr_eq(&pool, picked) {
                continue;
            }
            match pool.reserve(ip) {
                Ok(offset) => taken.push((pool, offset)),
                Err(Refusal::Taken) => {
                    for (pool, offset) in taken {
                        pool.release(offset);
                    }
                    return None;
                }
                Err(_) => {}
            }
        }
        Some(taken)
    }

    /// A free address from the first of `pools` that has one.
    fn pick(&self, pools: &[Arc<Pool>]) -> Option<Marked> {
        for pool in pools {
            while let Ok((offset, ip)) = pool.reserve_any() {
                if let Some(mut taken) = self.mark_elsewhere(&ip, pool) {
                    taken.push((pool.clone(), offset));
                    return Some(Marked { ip, taken });
                }
                // Taken in an overlapping range: it stays marked here too.
            }
        }
        None
    }

    /// The address a Service asked for, from the first of `pools` that
    /// holds it, or why it cannot have it (as Kubernetes words it).
    fn reserve_asked(&self, pools: &[Arc<Pool>], ip: &str) -> Result<Marked, String> {
        let taken = || format!("failed to allocate IP {ip}: provided IP is already allocated");
        let holding: Vec<&Arc<Pool>> = pools
            .iter()
            .filter(|p| p.range.offset(ip).is_some())
            .collect();
        let Some(first) = holding.first() else {
            return Err(format!(
                "failed to allocate IP {ip}: the provided network does not match the current range"
            ));
        };
        for pool in &holding {
            match pool.reserve(ip) {
                Ok(offset) => {
                    let Some(mut elsewhere) = self.mark_elsewhere(ip, pool) else {
                        pool.release(offset);
                        return Err(taken());
                    };
                    elsewhere.push(((*pool).clone(), offset));
                    return Ok(Marked {
                        ip: ip.to_owned(),
                        taken: elsewhere,
                    });
                }
                Err(Refusal::OutOfRange) => {}
                Err(Refusal::Taken | Refusal::Full) => return Err(taken()),
            }
        }
        Err(format!("failed to allocate IP {ip}: the provided IP ({ip}) is not in the valid range. The range of valid IPs is {}", first.range.describe()))
    }
}

/// Deletes a stored object and releases what it held, in one transaction
/// conditional on the object being unchanged since `current` was read.
pub(crate) async fn delete_stored(
    store: &dyn portal_store::Store,
    allocators: &Allocators,
    resource: &Resource,
    current: &portal_store::KeyValue,
) -> portal_store::Result<u64> {
    let old: Value = serde_json::from_slice(&current.value).unwrap_or(Value::Null);
    let mut reservation = allocators.for_delete(resource, &old);
    let mut ops = vec![Op::Delete {
        key: current.key.clone(),
        expected_revision: Some(current.mod_revision),
    }];
    ops.append(&mut reservation.ops);
    let result = store.txn(ops).await;
    match &result {
        Ok(_) => reservation.commit(),
        Err(_) => reservation.abort(None),
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocators() -> Allocators {
        Allocators::new(
            &"10.96.0.0/24".parse().unwrap(),
            "30000-30009".parse().unwrap(),
        )
    }

    fn svc(spec: Value) -> Value {
        json!({"metadata": {"name": "s", "namespace": "default"}, "spec": spec})
    }

    /// As the write path does it: the families first, then the addresses.
    fn create(a: &Allocators, svc: &mut Value) -> Result<Reservation, Cause> {
        let resource = &kinds::service::RESOURCE;
        a.prepare_families(resource, svc, None)
            .map_err(|mut causes| causes.remove(0))?;
        a.for_create(resource, svc)
    }

    fn update(a: &Allocators, new: &mut Value, old: &Value) -> Result<Reservation, Cause> {
        let resource = &kinds::service::RESOURCE;
        Allocators::keep_allocated(resource, new, old);
        a.prepare_families(resource, new, Some(old))
            .map_err(|mut causes| causes.remove(0))?;
        a.for_update(resource, new, old)
    }

    #[test]
    fn create_allocates_and_reports_conflicts() {
        let a = allocators();
        let mut one = svc(json!({"type": "NodePort", "ports": [{"port": 80, "protocol": "TCP"}]}));
        let r = create(&a, &mut one).unwrap();
        assert_eq!(r.ops.len(), 2);
        r.commit();
        let ip = one["spec"]["clusterIP"].as_str().unwrap().to_owned();
        assert!(ip.starts_with("10.96.0.") && ip != "10.96.0.0" && ip != "10.96.0.1");
        let port = one["spec"]["ports"][0]["nodePort"].as_i64().unwrap();
        assert!((30000..=30009).contains(&port));

        let mut clash = svc(json!({"clusterIP": ip, "ports": [{"port": 80}]}));
        let cause = create(&a, &mut clash).unwrap_err();
        assert!(
            cause.message.ends_with("provided IP is already allocated"),
            "{}",
            cause.message
        );
        let mut outside = svc(json!({"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}));
        assert!(create(&a, &mut outside)
            .unwrap_err()
            .message
            .ends_with("the provided network does not match the current range"));
        let mut broadcast = svc(json!({"clusterIP": "10.96.0.255", "ports": [{"port": 80}]}));
        assert!(create(&a, &mut broadcast)
            .unwrap_err()
            .message
            .contains("is not in the valid range. The range of valid IPs is 10.96.0.0/24"));
        let mut bad_port =
            svc(json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 80}]}));
        let cause = create(&a, &mut bad_port).unwrap_err();
        assert_eq!(cause.display(), "spec.ports[0].nodePort: Invalid value: 80: provided port is not in the valid range. The range of valid ports is 30000-30009");
    }

    #[test]
    fn type_changes_allocate_and_release() {
        let a = allocators();
        let resource = &kinds::service::RESOURCE;
        let mut old = svc(json!({"type": "NodePort", "ports": [{"port": 80, "protocol": "TCP"}]}));
        create(&a, &mut old).unwrap().commit();
        let mut new = old.clone();
        new["spec"]["type"] = json!("ClusterIP");
        let r = update(&a, &mut new, &old).unwrap();
        assert!(matches!(&r.ops[..], [Op::Delete { key, .. }] if key.starts_with(NODE_PORTS)));
        assert!(new["spec"]["ports"][0].get("nodePort").is_none());
        r.commit();
        let mut back = new.clone();
        back["spec"]["type"] = json!("NodePort");
        let r = update(&a, &mut back, &new).unwrap();
        assert!(matches!(&r.ops[..], [Op::Create { key, .. }] if key.starts_with(NODE_PORTS)));
        r.abort(None);
        let freed = a.for_delete(resource, &new);
        assert_eq!(freed.ops.len(), 1, "only the cluster IP is held");
    }

    #[test]
    fn a_local_load_balancer_gets_a_health_check_port_and_gives_it_back() {
        let a = allocators();
        let mut lb = svc(
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                                "ports": [{"port": 80, "protocol": "TCP"}]}),
        );
        let r = create(&a, &mut lb).unwrap();
        r.commit();
        let hc = lb["spec"]["healthCheckNodePort"].as_i64().unwrap();
        let node_port = lb["spec"]["ports"][0]["nodePort"].as_i64().unwrap();
        assert_ne!(hc, node_port);
        assert_eq!(node_ports_of(&lb), {
            let mut both = vec![hc, node_port];
            both.sort_unstable();
            both
        });
        // Cluster policy: the health check port is released.
        let mut cluster = lb.clone();
        cluster["spec"]["externalTrafficPolicy"] = json!("Cluster");
        Allocators::keep_allocated(&kinds::service::RESOURCE, &mut cluster, &lb);
        assert!(cluster["spec"].get("healthCheckNodePort").is_none());
        let r = a
            .for_update(&kinds::service::RESOURCE, &mut cluster, &lb)
            .unwrap();
        assert!(r.freed.iter().any(|(_, port)| *port == hc.to_string()));
        r.commit();
        assert_eq!(node_ports_of(&cluster), vec![node_port]);
        // Asked for by number: given (before any port is picked at
        // random), unless a port of the Service asks for it too.
        let a = allocators();
        let mut asked = svc(
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 30007, "ports": [{"port": 80, "protocol": "TCP"}]}),
        );
        create(&a, &mut asked).unwrap().commit();
        assert_eq!(asked["spec"]["healthCheckNodePort"], json!(30007));
        let mut same = svc(
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 30008, "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30008}]}),
        );
        assert!(create(&a, &mut same).is_err());
    }

    #[test]
    fn keeps_allocations_a_put_left_out() {
        let old = svc(
            json!({"type": "NodePort", "clusterIP": "10.96.0.7", "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30003}]}),
        );
        let mut new = svc(json!({"type": "NodePort", "ports": [{"port": 80, "protocol": "TCP"}]}));
        Allocators::keep_allocated(&kinds::service::RESOURCE, &mut new, &old);
        assert_eq!(new["spec"]["clusterIP"], "10.96.0.7");
        assert_eq!(new["spec"]["ports"][0]["nodePort"], 30003);
    }

    fn dual_stack() -> Allocators {
        Allocators::new(
            &"10.96.0.0/24,fd00:96::/112".parse().unwrap(),
            "30000-30009".parse().unwrap(),
        )
    }

    #[test]
    fn families_default_as_kubernetes() {
        let a = dual_stack();
        let mut plain = svc(json!({"ports": [{"port": 80}]}));
        create(&a, &mut plain).unwrap().commit();
        assert_eq!(plain["spec"]["ipFamilies"], json!(["IPv4"]));
        assert_eq!(plain["spec"]["ipFamilyPolicy"], "SingleStack");
        assert_eq!(cluster_ips(&plain).len(), 1);

        let mut both = svc(json!({"ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}));
        create(&a, &mut both).unwrap().commit();
        assert_eq!(both["spec"]["ipFamilies"], json!(["IPv4", "IPv6"]));
        let ips = cluster_ips(&both);
        assert!(
            ips[0].starts_with("10.96.0.") && ips[1].starts_with("fd00:96::"),
            "{ips:?}"
        );
        assert_eq!(both["spec"]["clusterIP"], ips[0]);

        let mut v6_first = svc(
            json!({"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6"], "ports": [{"port": 80}]}),
        );
        create(&a, &mut v6_first).unwrap().commit();
        assert_eq!(v6_first["spec"]["ipFamilies"], json!(["IPv6", "IPv4"]));
        assert!(v6_first["spec"]["clusterIP"]
            .as_str()
            .unwrap()
            .contains(':'));

        let mut given = svc(json!({"clusterIP": "fd00:96::99", "ports": [{"port": 80}]}));
        create(&a, &mut given).unwrap().commit();
        assert_eq!(given["spec"]["ipFamilies"], json!(["IPv6"]));

        let mut headless = svc(json!({"clusterIP": "None", "ports": [{"port": 80}]}));
        create(&a, &mut headless).unwrap();
        assert_eq!(headless["spec"]["ipFamilyPolicy"], "RequireDualStack");
        assert_eq!(headless["spec"]["ipFamilies"], json!(["IPv4", "IPv6"]));
        assert_eq!(headless["spec"]["clusterIPs"], json!(["None"]));

        let mut two_single = svc(
            json!({"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4", "IPv6"], "ports": [{"port": 80}]}),
        );
        assert_eq!(create(&a, &mut two_single).unwrap_err().display(), "spec.ipFamilyPolicy: Invalid value: \"SingleStack\": must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified");
    }

    #[test]
    fn a_single_stack_cluster_refuses_what_it_cannot_give() {
        let a = allocators();
        let mut required =
            svc(json!({"ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}));
        assert_eq!(create(&a, &mut required).unwrap_err().display(), "spec.ipFamilyPolicy: Invalid value: \"RequireDualStack\": this cluster is not configured for dual-stack services");
        let mut preferred =
            svc(json!({"ipFamilyPolicy": "PreferDualStack", "ports": [{"port": 80}]}));
        create(&a, &mut preferred).unwrap();
        assert_eq!(preferred["spec"]["ipFamilies"], json!(["IPv4"]));
        let mut v6 = svc(json!({"ipFamilies": ["IPv6"], "ports": [{"port": 80}]}));
        assert_eq!(
            create(&a, &mut v6).unwrap_err().display(),
            "spec.ipFamilies[0]: Invalid value: \"IPv6\": not configured on this cluster"
        );
        let mut v6_ip = svc(json!({"clusterIP": "fd00::1", "ports": [{"port": 80}]}));
        assert_eq!(create(&a, &mut v6_ip).unwrap_err().display(), "spec.clusterIPs[0]: Invalid value: []string{\"fd00::1\"}: IPv6 is not configured on this cluster");
    }

    #[test]
    fn upgrades_keep_the_first_address_and_downgrades_release_the_second() {
        let a = dual_stack();
        let mut single = svc(json!({"ports": [{"port": 80}]}));
        create(&a, &mut single).unwrap().commit();
        let first = single["spec"]["clusterIP"].as_str().unwrap().to_owned();

        let mut upgraded = single.clone();
        upgraded["spec"]["ipFamilyPolicy"] = json!("PreferDualStack");
        let r = update(&a, &mut upgraded, &single).unwrap();
        assert!(
            matches!(&r.ops[..], [Op::Create { key, .. }] if key.starts_with(&format!("{IP_ADDRESSES}fd00:96::")))
        );
        r.commit();
        let ips = cluster_ips(&upgraded);
        assert_eq!((ips[0], ips.len()), (first.as_str(), 2));
        assert_eq!(upgraded["spec"]["ipFamilies"], json!(["IPv4", "IPv6"]));

        // Down to one: the policy alone; the server trims the lists.
        let mut downgraded = upgraded.clone();
        downgraded["spec"]["ipFamilyPolicy"] = json!("SingleStack");
        let r = update(&a, &mut downgraded, &upgraded).unwrap();
        assert!(
            matches!(&r.ops[..], [Op::Delete { key, .. }] if key.starts_with(&format!("{IP_ADDRESSES}fd00:96::")))
        );
        assert_eq!(cluster_ips(&downgraded), [first.as_str()]);
        assert_eq!(downgraded["spec"]["ipFamilies"], json!(["IPv4"]));

        // Trimming without the policy is refused.
        let mut trimmed = upgraded.clone();
        trimmed["spec"]["clusterIPs"] = json!([first]);
        assert_eq!(update(&a, &mut trimmed, &upgraded).unwrap_err().display(), "spec.ipFamilyPolicy: Invalid value: \"PreferDualStack\": must be 'SingleStack' to release the secondary cluster IP");

        // Deleting releases both.
        assert_eq!(
            a.for_delete(&kinds::service::RESOURCE, &upgraded).ops.len(),
            2
        );
    }

    #[test]
    fn prefer_dual_stack_is_not_upgraded_behind_its_owners_back() {
        // Made on a single-stack cluster, sent back as it is after the
        // cluster became dual-stack: it stays single.
        let single_stack = allocators();
        let mut svc_ = svc(json!({"ipFamilyPolicy": "PreferDualStack", "ports": [{"port": 80}]}));
        create(&single_stack, &mut svc_).unwrap().commit();
        let a = dual_stack();
        let mut again = svc_.clone();
        let r = update(&a, &mut again, &svc_).unwrap();
        assert!(r.ops.is_empty(), "{:?}", r.ops);
        assert_eq!(again["spec"]["ipFamilies"], json!(["IPv4"]));
        // Asked for explicitly (RequireDualStack), it is upgraded.
        let mut required = svc_.clone();
        required["spec"]["ipFamilyPolicy"] = json!("RequireDualStack");
        let r = update(&a, &mut required, &svc_).unwrap();
        assert_eq!(r.ops.len(), 1);
        assert_eq!(required["spec"]["ipFamilies"], json!(["IPv4", "IPv6"]));
    }

    #[test]
    fn addresses_are_recorded_in_canonical_text() {
        let a = dual_stack();
        let mut loud = svc(json!({"clusterIP": "FD00:96:0::0063", "ports": [{"port": 80}]}));
        let r = create(&a, &mut loud).unwrap();
        assert!(
            matches!(&r.ops[..], [Op::Create { key, .. }] if key == &format!("{IP_ADDRESSES}fd00:96::63"))
        );
        assert_eq!(loud["spec"]["clusterIPs"], json!(["fd00:96::63"]));
        r.commit();
        let mut quiet = svc(json!({"clusterIP": "fd00:96::63", "ports": [{"port": 80}]}));
        assert!(create(&a, &mut quiet)
            .unwrap_err()
            .message
            .ends_with("provided IP is already allocated"));
        // The last IPv6 address is usable; IPv4's broadcast address is not.
        let mut last = svc(json!({"clusterIP": "fd00:96::ffff", "ports": [{"port": 80}]}));
        assert!(create(&a, &mut last).is_ok());
        let mut broadcast = svc(json!({"clusterIP": "10.96.0.255", "ports": [{"port": 80}]}));
        assert!(create(&a, &mut broadcast).is_err());
    }

    #[test]
    fn a_family_the_cluster_lost_still_gives_its_records_back() {
        let a = dual_stack();
        let mut both = svc(json!({"ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}));
        create(&a, &mut both).unwrap().commit();
        let single_stack = allocators();
        let r = single_stack.for_delete(&kinds::service::RESOURCE, &both);
        let keys: Vec<&str> = r
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Delete { key, .. } => Some(key.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(keys.len(), 2);
        assert!(keys
            .iter()
            .any(|k| k.starts_with(&format!("{IP_ADDRESSES}fd00:96::"))));
    }

    #[test]
    fn to_external_name_drops_the_fields_sent_back_unchanged() {
        let a = dual_stack();
        let mut headless =
            svc(json!({"clusterIP": "None", "selector": {"app": "x"}, "ports": [{"port": 80}]}));
        create(&a, &mut headless).unwrap();
        let mut named = headless.clone();
        named["spec"]["type"] = json!("ExternalName");
        named["spec"]["externalName"] = json!("example.com");
        update(&a, &mut named, &headless).unwrap();
        for field in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            assert!(named["spec"].get(field).is_none(), "{field}: {named}");
        }
        // A PUT that leaves out a headless Service's address keeps it.
        let mut put = headless.clone();
        put["spec"].as_object_mut().unwrap().remove("clusterIP");
        put["spec"].as_object_mut().unwrap().remove("clusterIPs");
        update(&a, &mut put, &headless).unwrap();
        assert_eq!(put["spec"]["clusterIPs"], json!(["None"]));
    }
}
