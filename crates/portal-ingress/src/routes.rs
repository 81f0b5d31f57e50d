//! The routing table: every Ingress of Portal's classes compiled into
//! hosts → paths → backends, each backend with the ready endpoints of its
//! Service's port (requests go to pods directly, not through the cluster
//! IP). Built whole on each change and swapped in; requests only read it.
//!
//! Matching is the Ingress specification's: a host's rules (exact host
//! first, then a `*.` wildcard covering exactly one label), else the
//! host-less rules; within them the longest matching path, `Exact` before
//! `Prefix` at equal length; `Prefix` matches whole path elements
//! (`/api` matches `/api` and `/api/v1`, not `/apis`);
//! `ImplementationSpecific` is a prefix. Where two Ingresses give the same
//! host and path, the older one's backend serves (as ingress-nginx).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use portal_client::labels::{INGRESS_CLASS, SERVICE_NAME as SERVICE_NAME_LABEL};

use crate::gateway::routes::{Entry, HostRoutes, Request as RouteRequest};

/// Where matching requests go: a Service port's ready endpoints.
#[derive(Debug)]
pub(crate) struct Backend {
    /// `namespace/name:port` (metrics and logs).
    pub(crate) name: String,
    pub(crate) endpoints: Vec<SocketAddr>,
    next: AtomicUsize,
}

impl Backend {
    /// The endpoints in round-robin order, starting at the next one.
    pub(crate) fn rotation(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        let n = self.endpoints.len().max(1);
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        (0..self.endpoints.len()).map(move |i| self.endpoints[(start + i) % n])
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Match {
    Exact,
    Prefix,
}

#[derive(Debug)]
pub(crate) struct Route {
    /// `namespace/ingress` that made it (metrics and logs).
    pub(crate) ingress: String,
    kind: Match,
    path: String,
    pub(crate) backend: Arc<Backend>,
}

impl Route {
    fn matches(&self, path: &str) -> bool {
        match self.kind {
            Match::Exact => path == self.path,
            Match::Prefix => {
                let prefix = self.path.trim_end_matches('/');
                prefix.is_empty()
                    || path == prefix
                    || path
                        .strip_prefix(prefix)
                        .is_some_and(|rest| rest.starts_with('/'))
            }
        }
    }
}

/// One host's routes (or the host-less ones), most specific first.
#[derive(Debug, Default)]
struct Routes(Vec<Route>);

impl Routes {
    fn add(&mut self, route: Route) {
        let same = |r: &Route| r.kind == route.kind && r.path == route.path;
        if !self.0.iter().any(same) {
            self.0.push(route);
        }
    }

    /// The longest path first (a prefix's without its trailing `/`: `/foo/`
    /// and `/foo` match the same requests), `Exact` before `Prefix`; the
    /// sort is stable, so the older Ingress's route stays first.
    fn sort(&mut self) {
        let length = |r: &Route| match r.kind {
            Match::Exact => r.path.len(),
            Match::Prefix => r.path.trim_end_matches('/').len(),
        };
        self.0.sort_by(|a, b| {
            length(b)
                .cmp(&length(a))
                .then_with(|| (a.kind == Match::Prefix).cmp(&(b.kind == Match::Prefix)))
        });
    }

    fn find(&self, path: &str) -> Option<&Route> {
        self.0.iter().find(|r| r.matches(path))
    }
}

/// A TLS host (or `*.` wildcard) and the Secret with its certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TlsHost {
    pub(crate) host: String,
    pub(crate) namespace: String,
    pub(crate) secret: String,
}

/// Every route of Portal's Ingresses.
#[derive(Debug, Default)]
pub(crate) struct Table {
    hosts: HashMap<String, Routes>,
    /// `*.example.test` as `.example.test`.
    wildcards: Vec<(String, Routes)>,
    any_host: Routes,
    default_backend: Option<Route>,
    pub(crate) tls: Vec<TlsHost>,
    /// `namespace/name` of the Ingresses served (their status is written).
    pub(crate) ingresses: Vec<(String, String)>,
    /// HTTPRoutes on the plain and the TLS socket (consulted first).
    pub(crate) gateway_plain: HostRoutes,
    pub(crate) gateway_secure: HostRoutes,
}

/// What a request matched.
#[derive(Debug)]
pub(crate) enum Found<'a> {
    Route(&'a Route),
    /// An HTTPRoute's match.
    Gateway(&'a Entry),
    /// No route for the host and path (404).
    Nothing,
}

impl Table {
    /// The route for a request's host (port removed, any case) and path.
    pub(crate) fn find(&self, host: &str, path: &str) -> Found<'_> {
        let host = host.to_ascii_lowercase();
        let routes = self.hosts.get(&host).or_else(|| {
            let suffix = host.split_once('.').map(|(_, rest)| format!(".{rest}"))?;
            self.wildcards
                .iter()
                .find(|(w, _)| *w == suffix)
                .map(|(_, r)| r)
        });
        let route = match routes {
            Some(routes) => routes.find(path),
            None => self.any_host.find(path),
        };
        match route.or(self.default_backend.as_ref()) {
            Some(route) => Found::Route(route),
            None => Found::Nothing,
        }
    }

    /// How many routes the table holds (default backend included).
    pub(crate) fn len(&self) -> usize {
        let hosts: usize = self.hosts.values().map(|r| r.0.len()).sum();
        let wildcards: usize = self.wildcards.iter().map(|(_, r)| r.0.len()).sum();
        hosts
            + wildcards
            + self.any_host.0.len()
            + usize::from(self.default_backend.is_some())
            + self.gateway_plain.len()
            + self.gateway_secure.len()
    }

    /// The HTTPRoute entry a request matches on one socket.
    pub(crate) fn find_route(
        &self,
        secure: bool,
        host: &str,
        request: &RouteRequest<'_>,
    ) -> Option<&Entry> {
        let routes = if secure {
            &self.gateway_secure
        } else {
            &self.gateway_plain
        };
        if routes.is_empty() {
            return None;
        }
        routes.find(host, request)
    }

    /// Compiles the Ingresses of `classes` (oldest first wins a clash).
    pub(crate) fn build(
        ingresses: &[Arc<Ingress>],
        classes: &[String],
        backends: &mut Backends<'_>,
    ) -> Table {
        let mut ours: Vec<&Arc<Ingress>> = ingresses
            .iter()
            .filter(|i| class_of(i).is_some_and(|c| classes.contains(&c)))
            .collect();
        ours.sort_by(|a, b| {
            let key = |i: &Ingress| {
                (
                    i.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    i.metadata.namespace.clone(),
                    i.metadata.name.clone(),
                )
            };
            key(a).cmp(&key(b))
        });
        let mut table = Table::default();
        for ingress in ours {
            let namespace = ingress.metadata.namespace.clone().unwrap_or_default();
            let name = ingress.metadata.name.clone().unwrap_or_default();
            let label = format!("{namespace}/{name}");
            table.ingresses.push((namespace.clone(), name));
            let Some(spec) = &ingress.spec else { continue };
            let mut backend_of = |b: &IngressBackend| {
                let service = b.service.as_ref()?;
                let port = service.port.as_ref()?;
                let port = match (&port.name, port.number) {
                    (Some(name), _) if !name.is_empty() => IntOrString::String(name.clone()),
                    (_, Some(number)) => IntOrString::Int(number),
                    _ => return None,
                };
                Some(backends.get(&namespace, &service.name, &port))
            };
            if table.default_backend.is_none() {
                if let Some(backend) = spec.default_backend.as_ref().and_then(&mut backend_of) {
                    table.default_backend = Some(Route {
                        ingress: label.clone(),
                        kind: Match::Prefix,
                        path: "/".into(),
                        backend,
                    });
                }
            }
            for rule in spec.rules.iter().flatten() {
                let host = rule.host.clone().unwrap_or_default().to_ascii_lowercase();
                let routes = if host.is_empty() {
                    &mut table.any_host
                } else if let Some(suffix) = host.strip_prefix('*') {
                    let at = table.wildcards.iter().position(|(w, _)| w == suffix);
                    let at = at.unwrap_or_else(|| {
                        table.wildcards.push((suffix.to_owned(), Routes::default()));
                        table.wildcards.len() - 1
                    });
                    &mut table.wildcards[at].1
                } else {
                    table.hosts.entry(host).or_default()
                };
                for path in rule.http.iter().flat_map(|h| &h.paths) {
                    let Some(backend) = backend_of(&path.backend) else {
                        continue;
                    };
                    let kind = match path.path_type.as_str() {
                        "Exact" => Match::Exact,
                        _ => Match::Prefix,
                    };
                    routes.add(Route {
                        ingress: label.clone(),
                        kind,
                        path: path.path.clone().unwrap_or_else(|| "/".into()),
                        backend,
                    });
                }
            }
            for tls in spec.tls.iter().flatten() {
                let Some(secret) = tls.secret_name.clone().filter(|s| !s.is_empty()) else {
                    continue;
                };
                for host in tls.hosts.iter().flatten() {
                    let host = host.to_ascii_lowercase();
                    if !table.tls.iter().any(|t| t.host == host) {
                        table.tls.push(TlsHost {
                            host,
                            namespace: namespace.clone(),
                            secret: secret.clone(),
                        });
                    }
                }
            }
        }
        for routes in table.hosts.values_mut() {
            routes.sort();
        }
        for (_, routes) in &mut table.wildcards {
            routes.sort();
        }
        table.any_host.sort();
        table
    }
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
                Arc::new(Backend {
                    endpoints: endpoints(namespace, service, port, services, slices),
                    name: key,
                    next: AtomicUsize::new(start),
                })
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

/// The class an Ingress names: `ingressClassName`, else the old annotation.
fn class_of(ingress: &Ingress) -> Option<String> {
    ingress
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.clone())
        .or_else(|| {
            ingress
                .metadata
                .annotations
                .as_ref()?
                .get(INGRESS_CLASS)
                .cloned()
        })
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

#[cfg(test)]
mod tests;
