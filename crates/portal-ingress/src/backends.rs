//! The backends requests go to, shared by Ingress rules and HTTPRoutes:
//! a Service port's *ready* endpoints from its EndpointSlices (requests go
//! to pods directly, not through the cluster IP), each Service port made
//! once per rebuild, picked round robin; and the TLS hosts with the
//! Secrets of their certificates.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http::uri::Authority;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use portal_client::labels::SERVICE_NAME as SERVICE_NAME_LABEL;

use crate::metrics::Label;

/// Where matching requests go: a Service port's ready endpoints.
#[derive(Debug)]
pub(crate) struct Backend {
    /// `namespace/name:port` (metrics and logs).
    pub(crate) name: Label,
    pub(crate) endpoints: Vec<SocketAddr>,
    /// Each endpoint as a URI authority, made once (cheap to clone).
    authorities: Vec<Authority>,
    next: AtomicUsize,
}

impl Backend {
    fn new(name: String, found: Vec<SocketAddr>, start: usize) -> Self {
        // Kept in step: an endpoint without an authority is left out.
        let (endpoints, authorities) = found
            .into_iter()
            .filter_map(|e| Some((e, Authority::try_from(e.to_string()).ok()?)))
            .unzip();
        Backend {
            name: Arc::new(name),
            endpoints,
            authorities,
            next: AtomicUsize::new(start),
        }
    }

    /// The endpoints in round-robin order, starting at the next one,
    /// each with its URI authority.
    pub(crate) fn rotation(&self) -> impl Iterator<Item = (SocketAddr, &Authority)> + '_ {
        let n = self.endpoints.len().max(1);
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        (0..self.endpoints.len()).map(move |i| {
            let at = (start + i) % n;
            (self.endpoints[at], &self.authorities[at])
        })
    }
}

/// A TLS host (or `*.` wildcard) and the Secret with its certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TlsHost {
    pub(crate) host: String,
    pub(crate) namespace: String,
    pub(crate) secret: String,
}

/// The backends made so far in one rebuild (each Service port once,
/// whichever Ingresses and routes name it).
pub(crate) struct Backends<'a> {
    made: HashMap<String, Arc<Backend>>,
    services: &'a HashMap<(String, String), Arc<Service>>,
    slices: &'a HashMap<(String, String), Vec<Arc<EndpointSlice>>>,
}

impl<'a> Backends<'a> {
    pub(crate) fn new(
        services: &'a HashMap<(String, String), Arc<Service>>,
        slices: &'a HashMap<(String, String), Vec<Arc<EndpointSlice>>>,
    ) -> Self {
        Backends {
            made: HashMap::new(),
            services,
            slices,
        }
    }

    /// The backend of a Service's port (by number or name).
    pub(crate) fn get(
        &mut self,
        namespace: &str,
        service: &str,
        port: &IntOrString,
    ) -> Arc<Backend> {
        let key = format!("{namespace}/{service}:{}", show(port));
        let (services, slices) = (self.services, self.slices);
        self.made
            .entry(key.clone())
            .or_insert_with(|| {
                // A random start: frequent rebuilds do not lean on the
                // first endpoint.
                let start = RandomState::new().hash_one(&key) as usize;
                let endpoints = endpoints(namespace, service, port, services, slices);
                Arc::new(Backend::new(key, endpoints, start))
            })
            .clone()
    }

    /// Whether the Service exists.
    pub(crate) fn has_service(&self, namespace: &str, service: &str) -> bool {
        self.services
            .contains_key(&(namespace.to_owned(), service.to_owned()))
    }
}

fn show(port: &IntOrString) -> String {
    match port {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// The ready endpoints of a Service's port (by number or name), from its
/// EndpointSlices: the slice port named as the Service port is named.
fn endpoints(
    namespace: &str,
    service: &str,
    port: &IntOrString,
    services: &HashMap<(String, String), Arc<Service>>,
    slices: &HashMap<(String, String), Vec<Arc<EndpointSlice>>>,
) -> Vec<SocketAddr> {
    let key = (namespace.to_owned(), service.to_owned());
    let Some(svc) = services.get(&key) else {
        return Vec::new();
    };
    let ports = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    let Some(service_port) = ports.iter().find(|p| match port {
        IntOrString::Int(n) => p.port == *n,
        IntOrString::String(name) => p.name.as_deref() == Some(name.as_str()),
    }) else {
        return Vec::new();
    };
    let port_name = service_port.name.clone().unwrap_or_default();
    let mut found = Vec::new();
    for slice in slices.get(&key).into_iter().flatten() {
        let number = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.clone().unwrap_or_default() == port_name)
            .and_then(|p| p.port);
        let Some(number) = number.and_then(|n| u16::try_from(n).ok()) else {
            continue;
        };
        for endpoint in &slice.endpoints {
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(true);
            if !ready {
                continue;
            }
            for address in &endpoint.addresses {
                if let Ok(ip) = address.parse::<IpAddr>() {
                    found.push(SocketAddr::new(ip, number));
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// The slices of each Service, by `(namespace, service)`.
pub(crate) fn slices_by_service(
    slices: impl IntoIterator<Item = Arc<EndpointSlice>>,
) -> HashMap<(String, String), Vec<Arc<EndpointSlice>>> {
    let mut by_service: HashMap<(String, String), Vec<Arc<EndpointSlice>>> = HashMap::new();
    for slice in slices {
        let service = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .cloned();
        if let Some(service) = service {
            let namespace = slice.metadata.namespace.clone().unwrap_or_default();
            by_service
                .entry((namespace, service))
                .or_default()
                .push(slice);
        }
    }
    by_service
}
