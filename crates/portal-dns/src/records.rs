//! The records of the cluster domain, kept in memory and rebuilt per Service
//! from watch events (the Kubernetes DNS-based service discovery
//! specification, schema 1.1.0).
//!
//! Sources are Services and EndpointSlices, reduced to what DNS needs. Each
//! change rebuilds the records of the one Service it touches, so a change
//! costs the size of that Service, never of the cluster. Names are stored
//! lower-cased and fully qualified (`web.default.svc.cluster.local.`); a
//! count of the names beneath every name tells an empty non-terminal
//! (NODATA) from a name that does not exist (NXDOMAIN).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

/// `(namespace, name)` of a Service.
pub type ServiceKey = (String, String);

/// One resource record's data.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Data {
    Address(IpAddr),
    Srv { port: u16, target: String },
    Cname(String),
    Ptr(String),
}

/// A port as DNS sees it: SRV records exist only for named ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub name: String,
    /// Lower case: `tcp`, `udp`, `sctp`.
    pub protocol: String,
    pub port: u16,
}

/// What DNS needs of a Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceInfo {
    /// Empty for headless Services.
    pub cluster_ips: Vec<IpAddr>,
    pub external_name: Option<String>,
    pub ports: Vec<Port>,
}

/// One endpoint of a slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    pub addresses: Vec<IpAddr>,
    pub hostname: Option<String>,
    pub ready: bool,
}

/// What DNS needs of an EndpointSlice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceInfo {
    pub service: String,
    pub endpoints: Vec<EndpointInfo>,
    pub ports: Vec<Port>,
}

/// How a name stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// The name has these records (possibly none of the asked type).
    Found(Vec<&'a Data>),
    /// The name exists only because names beneath it do.
    Empty,
    Missing,
}

#[derive(Debug)]
pub struct Records {
    /// The cluster domain, lower case with a trailing dot.
    domain: String,
    services: HashMap<ServiceKey, ServiceInfo>,
    /// Slices by `(namespace, slice name)`.
    slices: HashMap<(String, String), SliceInfo>,
    /// Slice names per Service.
    slices_of: HashMap<ServiceKey, Vec<String>>,
    names: HashMap<String, Vec<(ServiceKey, Data)>>,
    /// How many owned names lie beneath each name.
    beneath: HashMap<String, usize>,
    /// The names each Service's records use.
    owned: HashMap<ServiceKey, Vec<String>>,
    /// Bumped on every change: the zone's SOA serial.
    serial: u32,
}

/// The name of an endpoint without a hostname: its address with dashes.
fn endpoint_label(endpoint: &EndpointInfo, address: &IpAddr) -> String {
    match &endpoint.hostname {
        Some(hostname) => hostname.to_ascii_lowercase(),
        None => address.to_string().replace(['.', ':'], "-"),
    }
}

/// `5.1.244.10.in-addr.arpa.` or the nibble form for IPv6.
pub fn reverse_name(address: &IpAddr) -> String {
    match address {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            format!("{d}.{c}.{b}.{a}.in-addr.arpa.")
        }
        IpAddr::V6(v6) => {
            let mut name = String::with_capacity(72);
            for byte in v6.octets().iter().rev() {
                name.push_str(&format!("{:x}.{:x}.", byte & 0xf, byte >> 4));
            }
            name + "ip6.arpa."
        }
    }
}

/// The names strictly above `name` (stopping before the root).
fn ancestors(name: &str) -> impl Iterator<Item = &str> {
    let trimmed = name.trim_end_matches('.');
    trimmed
        .match_indices('.')
        .map(move |(at, _)| &name[at + 1..])
}

impl Records {
    /// An empty zone for `domain` (`cluster.local`).
    pub fn new(domain: &str) -> Self {
        Records {
            domain: format!("{}.", domain.trim_end_matches('.').to_ascii_lowercase()),
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_of: HashMap::new(),
            names: HashMap::new(),
            beneath: HashMap::new(),
            owned: HashMap::new(),
            serial: 1,
        }
    }

    pub fn domain(&self) -> &str {
        &self.domain
    }

    pub fn serial(&self) -> u32 {
        self.serial
    }

    /// Sets (or with `None` removes) a Service.
    pub fn set_service(&mut self, key: &ServiceKey, info: Option<ServiceInfo>) {
        match info {
            Some(info) => {
                if self.services.get(key) == Some(&info) {
                    return;
                }
                self.services.insert(key.clone(), info);
            }
            None => {
                if self.services.remove(key).is_none() {
                    return;
                }
            }
        }
        self.rebuild(key);
    }

    /// Sets (or with `None` removes) an EndpointSlice.
    pub fn set_slice(&mut self, namespace: &str, name: &str, info: Option<SliceInfo>) {
        let slice_key = (namespace.to_owned(), name.to_owned());
        let before = self.slices.remove(&slice_key);
        if let Some(before) = &before {
            let service = (namespace.to_owned(), before.service.clone());
            if let Some(names) = self.slices_of.get_mut(&service) {
                names.retain(|n| n != name);
                if names.is_empty() {
                    self.slices_of.remove(&service);
                }
            }
        }
        if let Some(info) = &info {
            let service = (namespace.to_owned(), info.service.clone());
            self.slices_of
                .entry(service)
                .or_default()
                .push(name.to_owned());
            self.slices.insert(slice_key, info.clone());
        }
        if before == info {
            return;
        }
        let mut touched: Vec<String> = before.map(|b| b.service).into_iter().collect();
        touched.extend(info.map(|i| i.service));
        touched.dedup();
        for service in touched {
            self.rebuild(&(namespace.to_owned(), service));
        }
    }

    /// How `name` (lower case, fully qualified) stands.
    pub fn lookup(&self, name: &str) -> Lookup<'_> {
        if let Some(records) = self.names.get(name) {
            return Lookup::Found(records.iter().map(|(_, data)| data).collect());
        }
        if self.beneath.contains_key(name) || name == self.domain {
            Lookup::Empty
        } else {
            Lookup::Missing
        }
    }

    /// Every Service held.
    pub fn service_keys(&self) -> Vec<ServiceKey> {
        self.services.keys().cloned().collect()
    }

    /// Every EndpointSlice held, as `(namespace, name)`.
    pub fn slice_keys(&self) -> Vec<(String, String)> {
        self.slices.keys().cloned().collect()
    }

    /// The number of names with records.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Replaces the records of one Service with what its sources say now.
    fn rebuild(&mut self, key: &ServiceKey) {
        self.serial = self.serial.wrapping_add(1);
        for name in self.owned.remove(key).unwrap_or_default() {
            self.remove_record(key, &name);
        }
        let Some(info) = self.services.get(key) else {
            return;
        };
        let (namespace, service) = key;
        let service_name = format!("{service}.{namespace}.svc.{}", self.domain);
        let mut records: Vec<(String, Data)> = Vec::new();
        let srv_name = |port: &Port| format!("_{}._{}.{service_name}", port.name, port.protocol);
        if let Some(external) = &info.external_name {
            let target = format!("{}.", external.trim_end_matches('.').to_ascii_lowercase());
            records.push((service_name.clone(), Data::Cname(target)));
        } else if !info.cluster_ips.is_empty() {
            for ip in &info.cluster_ips {
                records.push((service_name.clone(), Data::Address(*ip)));
                records.push((reverse_name(ip), Data::Ptr(service_name.clone())));
            }
            for port in info.ports.iter().filter(|p| !p.name.is_empty()) {
                let srv = Data::Srv {
                    port: port.port,
                    target: service_name.clone(),
                };
                records.push((srv_name(port), srv));
            }
        } else {
            // Headless: the ready endpoints themselves, by address and name.
            for slice_name in self.slices_of.get(key).into_iter().flatten() {
                let Some(slice) = self.slices.get(&(namespace.clone(), slice_name.clone())) else {
                    continue;
                };
                for endpoint in slice.endpoints.iter().filter(|e| e.ready) {
                    for address in &endpoint.addresses {
                        let name = format!("{}.{service_name}", endpoint_label(endpoint, address));
                        records.push((service_name.clone(), Data::Address(*address)));
                        records.push((name.clone(), Data::Address(*address)));
                        records.push((reverse_name(address), Data::Ptr(name.clone())));
                        for port in slice.ports.iter().filter(|p| !p.name.is_empty()) {
                            let srv = Data::Srv {
                                port: port.port,
                                target: name.clone(),
                            };
                            records.push((srv_name(port), srv));
                        }
                    }
                }
            }
        }
        // This Service's old records are gone: only duplicates among the
        // new ones remain to skip (a set, so a large headless Service
        // stays linear).
        let mut seen = HashSet::new();
        records.retain(|record| seen.insert(record.clone()));
        let mut owned: Vec<String> = Vec::new();
        for (name, data) in records {
            let list = self.names.entry(name.clone()).or_default();
            if list.iter().all(|(k, _)| k != key) {
                owned.push(name.clone());
                for ancestor in ancestors(&name) {
                    *self.beneath.entry(ancestor.to_owned()).or_default() += 1;
                }
            }
            if let Some(list) = self.names.get_mut(&name) {
                list.push((key.clone(), data));
            }
        }
        if !owned.is_empty() {
            self.owned.insert(key.clone(), owned);
        }
    }

    fn remove_record(&mut self, key: &ServiceKey, name: &str) {
        if let Some(list) = self.names.get_mut(name) {
            list.retain(|(k, _)| k != key);
            if list.is_empty() {
                self.names.remove(name);
            }
        }
        for ancestor in ancestors(name) {
            if let Some(count) = self.beneath.get_mut(ancestor) {
                *count -= 1;
                if *count == 0 {
                    self.beneath.remove(ancestor);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ServiceKey {
        ("default".into(), name.into())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn port(name: &str, number: u16) -> Port {
        Port {
            name: name.into(),
            protocol: "tcp".into(),
            port: number,
        }
    }

    fn cluster_ip(address: &str) -> ServiceInfo {
        ServiceInfo {
            cluster_ips: vec![ip(address)],
            external_name: None,
            ports: vec![port("http", 80), port("", 81)],
        }
    }

    fn endpoint(address: &str, hostname: Option<&str>, ready: bool) -> EndpointInfo {
        EndpointInfo {
            addresses: vec![ip(address)],
            hostname: hostname.map(Into::into),
            ready,
        }
    }

    fn found(records: &Records, name: &str) -> Vec<Data> {
        match records.lookup(name) {
            Lookup::Found(data) => data.into_iter().cloned().collect(),
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn a_cluster_ip_service_has_a_srv_and_ptr_records() {
        let mut records = Records::new("cluster.local");
        records.set_service(&key("web"), Some(cluster_ip("10.96.0.20")));
        let name = "web.default.svc.cluster.local.";
        assert_eq!(found(&records, name), vec![Data::Address(ip("10.96.0.20"))]);
        assert_eq!(
            found(&records, "_http._tcp.web.default.svc.cluster.local."),
            vec![Data::Srv {
                port: 80,
                target: name.into()
            }]
        );
        assert_eq!(
            found(&records, "20.0.96.10.in-addr.arpa."),
            vec![Data::Ptr(name.into())]
        );
        // Unnamed ports have no SRV; the parents are empty non-terminals.
        assert_eq!(
            records.lookup("_tcp.web.default.svc.cluster.local."),
            Lookup::Empty
        );
        assert_eq!(records.lookup("default.svc.cluster.local."), Lookup::Empty);
        assert_eq!(records.lookup("svc.cluster.local."), Lookup::Empty);
        assert_eq!(records.lookup("cluster.local."), Lookup::Empty);
        assert_eq!(
            records.lookup("db.default.svc.cluster.local."),
            Lookup::Missing
        );
    }

    #[test]
    fn removing_a_service_removes_its_names_and_parents() {
        let mut records = Records::new("cluster.local");
        records.set_service(&key("web"), Some(cluster_ip("10.96.0.20")));
        records.set_service(&key("web"), None);
        assert!(records.is_empty());
        assert_eq!(
            records.lookup("default.svc.cluster.local."),
            Lookup::Missing
        );
        assert_eq!(records.lookup("20.0.96.10.in-addr.arpa."), Lookup::Missing);
        // The apex always exists.
        assert_eq!(records.lookup("cluster.local."), Lookup::Empty);
    }

    #[test]
    fn a_headless_service_lists_ready_endpoints_by_address_and_name() {
        let mut records = Records::new("cluster.local");
        let headless = ServiceInfo {
            ports: vec![port("http", 80)],
            ..ServiceInfo::default()
        };
        records.set_service(&key("db"), Some(headless));
        // No ready endpoints: the name does not exist.
        assert_eq!(
            records.lookup("db.default.svc.cluster.local."),
            Lookup::Missing
        );
        let slice = SliceInfo {
            service: "db".into(),
            endpoints: vec![
                endpoint("10.244.1.5", Some("db-0"), true),
                endpoint("10.244.1.6", None, true),
                endpoint("10.244.1.7", None, false),
            ],
            ports: vec![port("http", 5432)],
        };
        records.set_slice("default", "db-abc", Some(slice));
        let mut addresses = found(&records, "db.default.svc.cluster.local.");
        addresses.sort_by_key(|d| format!("{d:?}"));
        assert_eq!(
            addresses,
            vec![
                Data::Address(ip("10.244.1.5")),
                Data::Address(ip("10.244.1.6"))
            ]
        );
        assert_eq!(
            found(&records, "db-0.db.default.svc.cluster.local."),
            vec![Data::Address(ip("10.244.1.5"))]
        );
        assert_eq!(
            found(&records, "10-244-1-6.db.default.svc.cluster.local."),
            vec![Data::Address(ip("10.244.1.6"))]
        );
        let srv = found(&records, "_http._tcp.db.default.svc.cluster.local.");
        assert!(srv.contains(&Data::Srv {
            port: 5432,
            target: "db-0.db.default.svc.cluster.local.".into()
        }));
        assert_eq!(
            found(&records, "5.1.244.10.in-addr.arpa."),
            vec![Data::Ptr("db-0.db.default.svc.cluster.local.".into())]
        );
        assert_eq!(records.lookup("7.1.244.10.in-addr.arpa."), Lookup::Missing);
        records.set_slice("default", "db-abc", None);
        assert_eq!(
            records.lookup("db.default.svc.cluster.local."),
            Lookup::Missing
        );
    }

    #[test]
    fn an_external_name_is_a_cname() {
        let mut records = Records::new("cluster.local.");
        let info = ServiceInfo {
            external_name: Some("Example.COM".into()),
            ..ServiceInfo::default()
        };
        records.set_service(&key("ext"), Some(info));
        assert_eq!(
            found(&records, "ext.default.svc.cluster.local."),
            vec![Data::Cname("example.com.".into())]
        );
    }

    #[test]
    fn two_services_may_share_a_reverse_name() {
        let mut records = Records::new("cluster.local");
        let headless = ServiceInfo::default();
        records.set_service(&key("a"), Some(headless.clone()));
        records.set_service(&key("b"), Some(headless));
        for service in ["a", "b"] {
            let slice = SliceInfo {
                service: service.into(),
                endpoints: vec![endpoint("10.244.1.5", None, true)],
                ports: vec![],
            };
            records.set_slice("default", &format!("{service}-x"), Some(slice));
        }
        assert_eq!(found(&records, "5.1.244.10.in-addr.arpa.").len(), 2);
        records.set_service(&key("a"), None);
        assert_eq!(
            found(&records, "5.1.244.10.in-addr.arpa."),
            vec![Data::Ptr("10-244-1-5.b.default.svc.cluster.local.".into())]
        );
    }

    #[test]
    fn ipv6_reverse_names_use_nibbles() {
        let name = reverse_name(&ip("2001:db8::1"));
        assert!(name.starts_with("1.0.0.0.0.0.0.0."));
        assert!(name.ends_with(".8.b.d.0.1.0.0.2.ip6.arpa."));
        assert_eq!(name.split('.').count(), 32 + 3);
    }
}
