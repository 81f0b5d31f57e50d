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
//!
//! The table also holds the HTTPRoutes compiled for each socket
//! (`gateway::routes`), consulted before the Ingress rules.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use portal_client::labels::INGRESS_CLASS;

use crate::backends::{Backend, Backends, TlsHost};
use crate::gateway::compile::Sockets;
use crate::gateway::routes::{prefix_matches, Entry, HostRoutes, Request as RouteRequest};
use crate::metrics::Label;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Match {
    Exact,
    Prefix,
}

#[derive(Debug)]
pub(crate) struct Route {
    /// `namespace/ingress` that made it (metrics and logs).
    pub(crate) ingress: Label,
    kind: Match,
    path: String,
    pub(crate) backend: Arc<Backend>,
}

impl Route {
    fn matches(&self, path: &str) -> bool {
        match self.kind {
            Match::Exact => path == self.path,
            Match::Prefix => prefix_matches(&self.path, path),
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
    /// The ports of the plain and the TLS socket (redirects name them).
    pub(crate) ports: Sockets,
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
    /// The route for a request's host (port removed, lower case) and path.
    pub(crate) fn find(&self, host: &str, path: &str) -> Found<'_> {
        let routes = self.hosts.get(host).or_else(|| {
            // `.example.test` of `a.example.test`.
            let suffix = &host[host.find('.')?..];
            self.wildcards
                .iter()
                .find(|(w, _)| w == suffix)
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

    /// The port of the plain or the TLS socket.
    pub(crate) fn port(&self, secure: bool) -> Option<u16> {
        if secure {
            self.ports.https
        } else {
            self.ports.http
        }
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
            let label: Label = Arc::new(format!("{namespace}/{name}"));
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

#[cfg(test)]
mod tests;
