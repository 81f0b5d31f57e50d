//! From the Gateway API's objects to what the proxy serves and says: the
//! Gateways of Portal's GatewayClasses, their listeners checked against
//! the proxy's two sockets (plain HTTP and HTTPS, one port each), the
//! HTTPRoutes attached to them compiled into [`HostRoutes`] per socket,
//! the listeners' certificates, and the status every object should show
//! (conditions as the Gateway API specification names them).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use http::header::{HeaderName, HeaderValue};
use http::Method;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use regex::Regex;
use serde_json::{json, Value};

use super::objects::{
    duration, granted, Filter, Gateway, GatewayClass, HttpRoute, Listener, ParentRef,
    ReferenceGrant, GROUP,
};
use super::routes::{
    Action, Entry, HeaderEdit, HostRoutes, PathChange, PathTest, Rank, RedirectTo, RewriteTo,
    ValueTest, Weighted,
};
use super::CONTROLLER;
use crate::backends::{Backends, TlsHost};

type Key = (String, String);

/// The ReferenceGrants of each namespace.
type Grants<'a> = HashMap<String, Vec<&'a ReferenceGrant>>;

fn grants_in<'a, 'b>(grants: &'b Grants<'a>, namespace: &str) -> &'b [&'a ReferenceGrant] {
    grants.get(namespace).map_or(&[], Vec::as_slice)
}

/// What the proxy listens on: the port of each socket (none: no socket).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sockets {
    pub(crate) http: Option<u16>,
    pub(crate) https: Option<u16>,
}

/// The objects the Gateway API side is made of.
pub(crate) struct Objects<'a> {
    pub(crate) classes: &'a HashMap<Key, Arc<GatewayClass>>,
    pub(crate) gateways: &'a HashMap<Key, Arc<Gateway>>,
    pub(crate) routes: &'a HashMap<Key, Arc<HttpRoute>>,
    pub(crate) grants: &'a HashMap<Key, Arc<ReferenceGrant>>,
    pub(crate) namespaces: &'a HashMap<Key, Arc<Namespace>>,
    pub(crate) secrets: &'a HashMap<Key, Arc<Secret>>,
}

/// Which object a status belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    GatewayClass,
    Gateway,
    HttpRoute,
}

/// The status an object should show (conditions without their
/// `lastTransitionTime`, which the writer keeps or sets).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Desired {
    pub(crate) kind: Kind,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) status: Value,
}

#[derive(Debug, Default)]
pub(crate) struct Compiled {
    pub(crate) plain: HostRoutes,
    pub(crate) secure: HostRoutes,
    pub(crate) tls: Vec<TlsHost>,
    pub(crate) statuses: Vec<Desired>,
}

fn condition(kind: &str, ok: bool, reason: &str, message: &str, generation: i64) -> Value {
    json!({
        "type": kind, "status": if ok { "True" } else { "False" },
        "reason": reason, "message": message, "observedGeneration": generation,
    })
}

/// A listener as checked: where it serves and what it says.
struct Checked<'a> {
    listener: &'a Listener,
    /// Serves on the TLS socket (else the plain one); none: not served.
    secure: Option<bool>,
    conditions: Vec<Value>,
    kinds: Vec<Value>,
    attached: i64,
}

pub(crate) fn compile(
    objects: &Objects<'_>,
    sockets: Sockets,
    advertised: &[IpAddr],
    backends: &mut Backends<'_>,
) -> Compiled {
    let mut out = Compiled::default();
    let ours: Vec<&String> = objects
        .classes
        .iter()
        .filter(|(_, c)| c.spec.controller_name == CONTROLLER)
        .map(|((_, name), _)| name)
        .collect();
    for ((_, name), class) in objects.classes {
        if class.spec.controller_name != CONTROLLER {
            continue;
        }
        let generation = class.metadata.generation.unwrap_or_default();
        out.statuses.push(Desired {
            kind: Kind::GatewayClass,
            namespace: String::new(),
            name: name.clone(),
            status: json!({"conditions": [condition(
                "Accepted", true, "Accepted", "Handled by Portal's built-in layer-7 proxy", generation)]}),
        });
    }
    let mut grants: Grants<'_> = HashMap::new();
    for ((namespace, _), grant) in objects.grants {
        grants
            .entry(namespace.clone())
            .or_default()
            .push(grant.as_ref());
    }

    // Listeners of our Gateways, checked.
    let mut gateways: Vec<(&Key, &Arc<Gateway>)> = objects
        .gateways
        .iter()
        .filter(|(_, g)| ours.contains(&&g.spec.gateway_class_name))
        .collect();
    gateways.sort_by(|a, b| a.0.cmp(b.0));
    let mut checked: HashMap<&Key, Vec<Checked<'_>>> = HashMap::new();
    for (key, gateway) in &gateways {
        let generation = gateway.metadata.generation.unwrap_or_default();
        let mut listeners = Vec::new();
        for listener in &gateway.spec.listeners {
            listeners.push(check_listener(
                listener,
                &key.0,
                sockets,
                generation,
                objects,
                &grants,
                &mut out.tls,
            ));
        }
        // Listeners of one Gateway on one socket with one hostname conflict,
        // all of them (decided before any is changed).
        let conflicts: Vec<bool> = (0..listeners.len())
            .map(|i| {
                listeners.iter().enumerate().any(|(j, other)| {
                    j != i
                        && other.secure.is_some()
                        && other.secure == listeners[i].secure
                        && other.listener.hostname == listeners[i].listener.hostname
                })
            })
            .collect();
        for (i, conflict) in conflicts.into_iter().enumerate() {
            let ok = !conflict;
            listeners[i].conditions.push(condition(
                "Conflicted",
                conflict,
                if ok {
                    "NoConflicts"
                } else {
                    "HostnameConflict"
                },
                if ok {
                    "No conflicts"
                } else {
                    "Another listener serves this hostname on this port"
                },
                generation,
            ));
            if conflict {
                listeners[i].secure = None;
                for c in &mut listeners[i].conditions {
                    if c["type"] == "Programmed" {
                        c["status"] = json!("False");
                        c["reason"] = json!("Invalid");
                        c["message"] = json!("The listener conflicts with another");
                    }
                }
            }
        }
        checked.insert(key, listeners);
    }

    // Routes, oldest first (the order of precedence).
    let mut routes: Vec<(&Key, &Arc<HttpRoute>)> = objects.routes.iter().collect();
    routes.sort_by(|a, b| a.0.cmp(b.0));
    for (key, route) in routes {
        let (namespace, name) = key;
        let generation = route.metadata.generation.unwrap_or_default();
        let resolved = resolve_refs(route, namespace, &grants, backends);
        let mut parents = Vec::new();
        let mut hosts: Vec<(bool, Option<String>)> = Vec::new();
        for parent in &route.spec.parent_refs {
            if parent.group.as_deref().unwrap_or(GROUP) != GROUP
                || parent.kind.as_deref().unwrap_or("Gateway") != "Gateway"
            {
                continue;
            }
            let gateway_key = (
                parent
                    .namespace
                    .clone()
                    .unwrap_or_else(|| namespace.clone()),
                parent.name.clone(),
            );
            let Some(listeners) = checked.get_mut(&gateway_key) else {
                continue; // not a Gateway of Portal's: not ours to answer.
            };
            let (accepted, reason, message) =
                attach(route, namespace, parent, listeners, objects, &mut hosts);
            let mut shown = parent.clone();
            shown.group = Some(GROUP.into());
            shown.kind = Some("Gateway".into());
            shown.namespace = Some(gateway_key.0.clone());
            parents.push(json!({
                "parentRef": shown,
                "controllerName": CONTROLLER,
                "conditions": [
                    condition("Accepted", accepted, reason, message, generation),
                    condition("ResolvedRefs", resolved.0, resolved.1, &resolved.2, generation),
                ],
            }));
        }
        let shown: Vec<Value> = route
            .status
            .get("parents")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let held = shown.iter().any(|e| e["controllerName"] == CONTROLLER);
        if parents.is_empty() && !held {
            continue;
        }
        out.statuses.push(Desired {
            kind: Kind::HttpRoute,
            namespace: namespace.clone(),
            name: name.clone(),
            status: json!({"parents": merge_parents(&shown, parents)}),
        });
        hosts.sort();
        hosts.dedup();
        if hosts.is_empty() {
            continue;
        }
        let label = format!("{namespace}/{name}");
        for (index, rule) in route.spec.rules.iter().enumerate() {
            let action = Arc::new(action_of(rule, &label, namespace, &grants, backends));
            let defaults = [super::objects::RouteMatch::default()];
            let matches: &[super::objects::RouteMatch] = if rule.matches.is_empty() {
                &defaults
            } else {
                &rule.matches
            };
            for (at, matching) in matches.iter().enumerate() {
                let Some(entry) = entry_of(matching, route, &label, index, at, &action) else {
                    continue;
                };
                let entry = Arc::new(entry);
                for (secure, host) in &hosts {
                    let routes = if *secure {
                        &mut out.secure
                    } else {
                        &mut out.plain
                    };
                    routes.add(host.as_deref(), entry.clone());
                }
            }
        }
    }

    // Gateways' own status.
    for (key, gateway) in &gateways {
        let generation = gateway.metadata.generation.unwrap_or_default();
        let listeners = checked.remove(key).unwrap_or_default();
        let served = listeners.iter().filter(|l| l.secure.is_some()).count();
        let all_valid = served == listeners.len();
        let addresses_ok = gateway.spec.addresses.iter().all(|a| {
            a.get("value")
                .and_then(Value::as_str)
                .and_then(|v| v.parse::<IpAddr>().ok())
                .is_some_and(|ip| advertised.contains(&ip))
        });
        let (accepted, reason, message) = if !addresses_ok {
            (
                false,
                "UnsupportedAddress",
                "Portal's proxy serves at the node's address only",
            )
        } else if all_valid {
            (
                true,
                "Accepted",
                "Accepted by Portal's built-in layer-7 proxy",
            )
        } else {
            (true, "ListenersNotValid", "Some listeners are not valid")
        };
        let programmed = addresses_ok && served > 0;
        let listener_status: Vec<Value> = listeners
            .iter()
            .map(|l| {
                json!({
                    "name": l.listener.name,
                    "supportedKinds": l.kinds,
                    "attachedRoutes": l.attached,
                    "conditions": l.conditions,
                })
            })
            .collect();
        let addresses: Vec<Value> = advertised
            .iter()
            .map(|ip| json!({"type": "IPAddress", "value": ip.to_string()}))
            .collect();
        out.statuses.push(Desired {
            kind: Kind::Gateway,
            namespace: key.0.clone(),
            name: key.1.clone(),
            status: json!({
                "addresses": addresses,
                "conditions": [
                    condition("Accepted", accepted, reason, message, generation),
                    condition(
                        "Programmed", programmed,
                        if programmed { "Programmed" } else { "Invalid" },
                        if programmed { "Serving" } else { "No listener can be served" },
                        generation,
                    ),
                ],
                "listeners": listener_status,
            }),
        });
    }
    out.plain.seal();
    out.secure.seal();
    out
}

/// A route's `status.parents`: others' entries as they are, Portal's
/// replaced where they stand (or dropped), new ones at the end — so two
/// controllers writing the same list do not reorder each other's.
fn merge_parents(shown: &[Value], mut ours: Vec<Value>) -> Vec<Value> {
    let mut merged = Vec::new();
    for entry in shown {
        if entry["controllerName"] != CONTROLLER {
            merged.push(entry.clone());
        } else if let Some(at) = ours
            .iter()
            .position(|o| o["parentRef"] == entry["parentRef"])
        {
            merged.push(ours.remove(at));
        }
    }
    merged.extend(ours);
    merged
}

/// Checks a listener against the proxy's sockets and its references.
fn check_listener<'a>(
    listener: &'a Listener,
    namespace: &str,
    sockets: Sockets,
    generation: i64,
    objects: &Objects<'_>,
    grants: &Grants<'_>,
    tls: &mut Vec<TlsHost>,
) -> Checked<'a> {
    let port = u16::try_from(listener.port).ok();
    let (accepted, reason, message): (bool, &str, String) = match listener.protocol.as_str() {
        "HTTP" if sockets.http.is_some() && port == sockets.http => {
            (true, "Accepted", String::new())
        }
        "HTTPS" if sockets.https.is_some() && port == sockets.https => {
            match listener.tls.as_ref().and_then(|t| t.mode.as_deref()) {
                Some("Passthrough") => (
                    false,
                    "UnsupportedProtocol",
                    "TLS passthrough needs TLSRoutes, which Portal does not serve".into(),
                ),
                _ => (true, "Accepted", String::new()),
            }
        }
        "HTTP" | "HTTPS" => (
            false,
            "PortUnavailable",
            format!(
                "Portal's proxy serves {} on port {} only",
                listener.protocol,
                match listener.protocol.as_str() {
                    "HTTP" => sockets.http,
                    _ => sockets.https,
                }
                .map_or_else(|| "(none)".to_owned(), |p| p.to_string())
            ),
        ),
        other => (
            false,
            "UnsupportedProtocol",
            format!("Portal's proxy serves HTTP and HTTPS, not {other}"),
        ),
    };
    // Route kinds: HTTPRoute alone.
    let mut kinds = Vec::new();
    let mut bad_kind = false;
    match &listener.allowed_routes.kinds {
        Some(asked) if !asked.is_empty() => {
            for kind in asked {
                if kind.group.as_deref().unwrap_or(GROUP) == GROUP && kind.kind == "HTTPRoute" {
                    kinds.push(json!({"group": GROUP, "kind": "HTTPRoute"}));
                } else {
                    bad_kind = true;
                }
            }
        }
        _ => kinds.push(json!({"group": GROUP, "kind": "HTTPRoute"})),
    }
    // Certificates.
    let mut refs_ok = !bad_kind;
    let mut refs_reason = if bad_kind {
        "InvalidRouteKinds"
    } else {
        "ResolvedRefs"
    };
    let mut refs_message = if bad_kind {
        "Only HTTPRoutes attach to HTTP and HTTPS listeners".to_owned()
    } else {
        String::new()
    };
    if accepted && listener.protocol == "HTTPS" {
        let mut certificate = None;
        for reference in listener.tls.iter().flat_map(|t| &t.certificate_refs) {
            let target_namespace = reference
                .namespace
                .clone()
                .unwrap_or_else(|| namespace.to_owned());
            let kind = reference.kind.as_deref().unwrap_or("Secret");
            let problem = if !reference.group.is_empty() || kind != "Secret" {
                Some((
                    "InvalidCertificateRef",
                    format!("{}/{kind} is not a Secret", reference.group),
                ))
            } else if target_namespace != namespace
                && !granted(
                    grants_in(grants, &target_namespace),
                    "Gateway",
                    namespace,
                    "",
                    "Secret",
                    &reference.name,
                )
            {
                Some((
                    "RefNotPermitted",
                    format!("no ReferenceGrant in {target_namespace} allows this Gateway's Secret reference"),
                ))
            } else if !usable_secret(
                objects
                    .secrets
                    .get(&(target_namespace.clone(), reference.name.clone())),
            ) {
                Some((
                    "InvalidCertificateRef",
                    format!(
                        "Secret {target_namespace}/{} is missing or not a kubernetes.io/tls Secret",
                        reference.name
                    ),
                ))
            } else {
                None
            };
            match problem {
                Some((reason, message)) => {
                    refs_ok = false;
                    refs_reason = reason;
                    refs_message = message;
                }
                None if certificate.is_none() => {
                    certificate = Some((target_namespace, reference.name.clone()))
                }
                None => {}
            }
        }
        if let Some((secret_namespace, secret)) = certificate {
            let host = listener.hostname.clone().unwrap_or_else(|| "*".into());
            if !tls.iter().any(|t| t.host == host) {
                tls.push(TlsHost {
                    host,
                    namespace: secret_namespace,
                    secret,
                });
            }
        }
    }
    let programmed = accepted && refs_ok;
    let conditions = vec![
        condition("Accepted", accepted, reason, &message, generation),
        condition(
            "Programmed",
            programmed,
            if programmed { "Programmed" } else { "Invalid" },
            "",
            generation,
        ),
        condition(
            "ResolvedRefs",
            refs_ok,
            refs_reason,
            &refs_message,
            generation,
        ),
    ];
    Checked {
        listener,
        secure: programmed.then_some(listener.protocol == "HTTPS"),
        conditions,
        kinds,
        attached: 0,
    }
}

/// Whether a Secret holds a certificate and its key that parse.
fn usable_secret(secret: Option<&Arc<Secret>>) -> bool {
    secret.is_some_and(|s| crate::tls::usable(s))
}

/// Attaches a route to the listeners of one parent Gateway: the hostnames
/// it serves there are added to `hosts` (per socket); says whether it is
/// accepted, and why not.
fn attach(
    route: &HttpRoute,
    namespace: &str,
    parent: &ParentRef,
    listeners: &mut [Checked<'_>],
    objects: &Objects<'_>,
    hosts: &mut Vec<(bool, Option<String>)>,
) -> (bool, &'static str, &'static str) {
    let gateway_namespace = parent.namespace.as_deref().unwrap_or(namespace);
    let named: Vec<usize> = (0..listeners.len())
        .filter(|&i| {
            let l = listeners[i].listener;
            parent.section_name.as_ref().is_none_or(|s| *s == l.name)
                && parent.port.is_none_or(|p| p == l.port)
        })
        .collect();
    if named.is_empty() {
        return (
            false,
            "NoMatchingParent",
            "No listener of the Gateway has this name or port",
        );
    }
    // Attachment is by parentRef and allowedRoutes alone (a listener that
    // is not valid still counts its routes); serving needs it programmed.
    let allowed: Vec<usize> = named
        .into_iter()
        .filter(|&i| {
            let checked = &listeners[i];
            !checked.kinds.is_empty()
                && namespace_allowed(checked.listener, gateway_namespace, namespace, objects)
        })
        .collect();
    if allowed.is_empty() {
        return (
            false,
            "NotAllowedByListeners",
            "No listener of the Gateway allows this route",
        );
    }
    let mut any = false;
    for i in allowed {
        listeners[i].attached += 1;
        let listener = listeners[i].listener;
        let effective = intersect(listener.hostname.as_deref(), &route.spec.hostnames);
        if effective.is_empty() {
            continue;
        }
        any = true;
        if let Some(secure) = listeners[i].secure {
            hosts.extend(effective.into_iter().map(|h| (secure, h)));
        }
    }
    if any {
        (
            true,
            "Accepted",
            "Accepted by Portal's built-in layer-7 proxy",
        )
    } else {
        (
            false,
            "NoMatchingListenerHostname",
            "No listener hostname matches the route's hostnames",
        )
    }
}

fn namespace_allowed(
    listener: &Listener,
    gateway_namespace: &str,
    route_namespace: &str,
    objects: &Objects<'_>,
) -> bool {
    match listener
        .allowed_routes
        .namespaces
        .from
        .as_deref()
        .unwrap_or("Same")
    {
        "All" => true,
        "Selector" => {
            let labels = objects
                .namespaces
                .get(&(String::new(), route_namespace.to_owned()))
                .and_then(|n| n.metadata.labels.clone())
                .unwrap_or_default();
            listener
                .allowed_routes
                .namespaces
                .selector
                .as_ref()
                .is_some_and(|s| selects(s, &labels))
        }
        _ => gateway_namespace == route_namespace,
    }
}

/// Whether a label selector selects these labels.
pub(crate) fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    by_labels
        && selector.match_expressions.iter().flatten().all(|e| {
            let values = e.values.clone().unwrap_or_default();
            let value = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// The hostnames a route serves on a listener (none inside: any host).
pub(crate) fn intersect(listener: Option<&str>, route: &[String]) -> Vec<Option<String>> {
    let covers = |wildcard: &str, host: &str| {
        wildcard
            .strip_prefix('*')
            .is_some_and(|suffix| host.ends_with(suffix) && host.len() > suffix.len())
    };
    match (listener, route.is_empty()) {
        (None, true) => vec![None],
        (Some(l), true) => vec![Some(l.to_owned())],
        (None, false) => route.iter().map(|h| Some(h.to_ascii_lowercase())).collect(),
        (Some(l), false) => route
            .iter()
            .filter_map(|h| {
                let h = h.to_ascii_lowercase();
                if h == l || covers(l, &h) {
                    Some(Some(h))
                } else if covers(&h, l) {
                    Some(Some(l.to_owned()))
                } else {
                    None
                }
            })
            .collect(),
    }
}

/// The ResolvedRefs condition of a route: the first problem of its
/// backend and mirror references.
fn resolve_refs(
    route: &HttpRoute,
    namespace: &str,
    grants: &Grants<'_>,
    backends: &Backends<'_>,
) -> (bool, &'static str, String) {
    for rule in &route.spec.rules {
        let mirrors = rule
            .filters
            .iter()
            .filter_map(|f| f.request_mirror.as_ref())
            .map(|m| &m.backend_ref);
        for target in rule.backend_refs.iter().map(|b| &b.target).chain(mirrors) {
            if let Err((reason, message)) = check_ref(target, namespace, grants, backends) {
                return (false, reason, message);
            }
        }
        let filters = rule
            .filters
            .iter()
            .chain(rule.backend_refs.iter().flat_map(|b| &b.filters));
        if filters.clone().any(|f| f.kind == "ExtensionRef") {
            return (
                false,
                "InvalidKind",
                "Portal's proxy has no filter extensions".into(),
            );
        }
    }
    (true, "ResolvedRefs", "All references resolved".into())
}

fn check_ref(
    target: &super::objects::ObjectRef,
    namespace: &str,
    grants: &Grants<'_>,
    backends: &Backends<'_>,
) -> Result<(), (&'static str, String)> {
    let kind = target.kind.as_deref().unwrap_or("Service");
    if !target.group.is_empty() || kind != "Service" {
        return Err((
            "InvalidKind",
            format!("{}/{kind} is not a Service", target.group),
        ));
    }
    let target_namespace = target.namespace.as_deref().unwrap_or(namespace);
    if target_namespace != namespace
        && !granted(
            grants_in(grants, target_namespace),
            "HTTPRoute",
            namespace,
            "",
            "Service",
            &target.name,
        )
    {
        return Err((
            "RefNotPermitted",
            format!(
                "no ReferenceGrant in {target_namespace} allows a reference to Service {}",
                target.name
            ),
        ));
    }
    if !backends.has_service(target_namespace, &target.name) {
        return Err((
            "BackendNotFound",
            format!("Service {target_namespace}/{} not found", target.name),
        ));
    }
    Ok(())
}

fn header_edit(modifier: &super::objects::HeaderModifier) -> HeaderEdit {
    let pairs = |values: &[super::objects::HeaderValue]| -> Vec<(HeaderName, HeaderValue)> {
        values
            .iter()
            .filter_map(|h| {
                Some((
                    HeaderName::from_bytes(h.name.to_ascii_lowercase().as_bytes()).ok()?,
                    HeaderValue::from_str(&h.value).ok()?,
                ))
            })
            .collect()
    };
    HeaderEdit {
        set: pairs(&modifier.set),
        add: pairs(&modifier.add),
        remove: modifier
            .remove
            .iter()
            .filter_map(|n| HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()).ok())
            .collect(),
    }
}

fn path_change(modifier: &super::objects::PathModifier) -> Option<PathChange> {
    match modifier.kind.as_str() {
        "ReplaceFullPath" => Some(PathChange::Full(modifier.replace_full_path.clone()?)),
        "ReplacePrefixMatch" => Some(PathChange::Prefix(modifier.replace_prefix_match.clone()?)),
        _ => None,
    }
}

fn action_of(
    rule: &super::objects::Rule,
    label: &str,
    namespace: &str,
    grants: &Grants<'_>,
    backends: &mut Backends<'_>,
) -> Action {
    // A zero or unreadable duration is no timeout.
    let timeout = |text: Option<&String>| duration(text?).filter(|d| !d.is_zero());
    let timeouts = rule.timeouts.as_ref();
    let mut action = Action {
        route: Arc::new(format!("httproute/{label}")),
        timeout: timeout(timeouts.and_then(|t| t.request.as_ref())),
        backend_timeout: timeout(timeouts.and_then(|t| t.backend_request.as_ref())),
        ..Action::default()
    };
    let backend_of = |target: &super::objects::ObjectRef, backends: &mut Backends<'_>| {
        check_ref(target, namespace, grants, backends).ok()?;
        let port = IntOrString::Int(target.port?);
        Some(backends.get(
            target.namespace.as_deref().unwrap_or(namespace),
            &target.name,
            &port,
        ))
    };
    for filter in &rule.filters {
        apply_filter(filter, &mut action, &mut |t| backend_of(t, backends));
    }
    for reference in &rule.backend_refs {
        let mut own = Action::default();
        for filter in &reference.filters {
            apply_filter(filter, &mut own, &mut |_| None);
        }
        if own.unsupported {
            action.unsupported = true;
        }
        action.backends.push(Weighted {
            weight: reference.weight.unwrap_or(1),
            backend: backend_of(&reference.target, backends),
            request_headers: own.request_headers,
            response_headers: own.response_headers,
        });
    }
    action
}

fn apply_filter(
    filter: &Filter,
    action: &mut Action,
    backend_of: &mut dyn FnMut(&super::objects::ObjectRef) -> Option<Arc<crate::backends::Backend>>,
) {
    match filter.kind.as_str() {
        "RequestHeaderModifier" => {
            action.request_headers = filter.request_header_modifier.as_ref().map(header_edit);
        }
        "ResponseHeaderModifier" => {
            action.response_headers = filter.response_header_modifier.as_ref().map(header_edit);
        }
        "RequestRedirect" => {
            if let Some(r) = &filter.request_redirect {
                action.redirect = Some(RedirectTo {
                    scheme: r.scheme.clone(),
                    hostname: r.hostname.clone(),
                    path: r.path.as_ref().and_then(path_change),
                    port: r.port.and_then(|p| u16::try_from(p).ok()),
                    code: r.status_code.unwrap_or(302),
                });
            }
        }
        "URLRewrite" => {
            if let Some(r) = &filter.url_rewrite {
                action.rewrite = Some(RewriteTo {
                    hostname: r.hostname.clone(),
                    path: r.path.as_ref().and_then(path_change),
                });
            }
        }
        "RequestMirror" => {
            if let Some(backend) = filter
                .request_mirror
                .as_ref()
                .and_then(|m| backend_of(&m.backend_ref))
            {
                action.mirrors.push(backend);
            }
        }
        _ => action.unsupported = true,
    }
}

fn entry_of(
    matching: &super::objects::RouteMatch,
    route: &HttpRoute,
    label: &str,
    rule: usize,
    index: usize,
    action: &Arc<Action>,
) -> Option<Entry> {
    let value = matching
        .path
        .as_ref()
        .and_then(|p| p.value.clone())
        .unwrap_or_else(|| "/".into());
    let kind = matching
        .path
        .as_ref()
        .and_then(|p| p.kind.as_deref())
        .unwrap_or("PathPrefix");
    let (path, path_kind) = match kind {
        "Exact" => (PathTest::Exact(value.clone()), 0),
        "RegularExpression" => (PathTest::Regex(anchored(&value)?), 1),
        _ => (PathTest::Prefix(value.clone()), 2),
    };
    let test = |kind: &Option<String>, value: &str| match kind.as_deref() {
        Some("RegularExpression") => anchored(value).map(ValueTest::Regex),
        _ => Some(ValueTest::Exact(value.to_owned())),
    };
    let headers = matching
        .headers
        .iter()
        .map(|h| {
            Some((
                HeaderName::from_bytes(h.name.to_ascii_lowercase().as_bytes()).ok()?,
                test(&h.kind, &h.value)?,
            ))
        })
        .collect::<Option<Vec<_>>>()?;
    let query = matching
        .query_params
        .iter()
        .map(|q| Some((q.name.clone(), test(&q.kind, &q.value)?)))
        .collect::<Option<Vec<_>>>()?;
    let method = match &matching.method {
        Some(m) => Some(Method::from_bytes(m.as_bytes()).ok()?),
        None => None,
    };
    let rank = Rank {
        path_kind,
        path_length: std::cmp::Reverse(match kind {
            "Exact" => value.len(),
            _ => value.trim_end_matches('/').len(),
        }),
        no_method: method.is_none(),
        headers: std::cmp::Reverse(headers.len()),
        query: std::cmp::Reverse(query.len()),
        created: route.metadata.creation_timestamp.as_ref().map(|t| t.0),
        route: label.to_owned(),
        rule,
        index,
    };
    Some(Entry {
        path,
        method,
        headers,
        query,
        action: action.clone(),
        rank,
    })
}

/// A regular expression that must match the whole value (bounded size).
fn anchored(pattern: &str) -> Option<Regex> {
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(1 << 20)
        .build()
        .ok()
}
