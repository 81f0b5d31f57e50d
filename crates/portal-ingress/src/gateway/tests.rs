use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderMap, Method};
use k8s_openapi::api::core::v1::Service;
use serde_json::json;

use super::compile::{compile, intersect, Objects, Sockets};
use super::objects::{duration, Gateway, GatewayClass, HttpRoute};
use super::routes::{PathChange, Request};
use crate::backends::Backends;

type Map<T> = HashMap<(String, String), Arc<T>>;

fn key(namespace: &str, name: &str) -> (String, String) {
    (namespace.into(), name.into())
}

fn world() -> (Map<GatewayClass>, Map<Gateway>) {
    let class: GatewayClass = serde_json::from_value(json!({
        "metadata": {"name": "portal", "generation": 1},
        "spec": {"controllerName": super::CONTROLLER}}))
    .unwrap();
    let gateway: Gateway = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "generation": 1},
        "spec": {"gatewayClassName": "portal", "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "Same"}}},
            {"name": "other", "port": 8080, "protocol": "HTTP"}]}})).unwrap();
    (
        HashMap::from([(key("", "portal"), Arc::new(class))]),
        HashMap::from([(key("default", "web"), Arc::new(gateway))]),
    )
}

fn route(name: &str, created: &str, spec: serde_json::Value) -> ((String, String), Arc<HttpRoute>) {
    let route: HttpRoute = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": created, "generation": 2},
        "spec": spec})).unwrap();
    (key("default", name), Arc::new(route))
}

fn services() -> HashMap<(String, String), Arc<Service>> {
    ["a", "b"]
        .into_iter()
        .map(|name| {
            let svc: Service = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"ports": [{"port": 80}]}}))
            .unwrap();
            (key("default", name), Arc::new(svc))
        })
        .collect()
}

fn backend_of(found: Option<&super::routes::Entry>) -> Option<String> {
    let action = &found?.action;
    action
        .backends
        .first()?
        .backend
        .as_ref()
        .map(|b| b.name.to_string())
}

#[test]
fn precedence_status_and_attachment() {
    let (classes, gateways) = world();
    let routes = HashMap::from([
        route(
            "older",
            "2026-01-01T00:00:00Z",
            json!({
            "parentRefs": [{"name": "web", "sectionName": "http"}],
            "hostnames": ["a.example.test"],
            "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [{"name": "a", "port": 80}]},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}, "headers": [{"name": "x-v", "value": "2"}]}],
                 "backendRefs": [{"name": "b", "port": 80}]},
            ]}),
        ),
        route(
            "newer",
            "2026-02-01T00:00:00Z",
            json!({
            "parentRefs": [{"name": "web", "sectionName": "http"}],
            "rules": [{"matches": [{"path": {"type": "Exact", "value": "/api"}}], "backendRefs": [{"name": "b", "port": 80}]}]}),
        ),
        route(
            "unserved",
            "2026-02-01T00:00:00Z",
            json!({
            "parentRefs": [{"name": "web", "sectionName": "other"}],
            "rules": [{"backendRefs": [{"name": "a", "port": 80}]}]}),
        ),
    ]);
    let (empty_grants, empty_namespaces, empty_secrets) =
        (HashMap::new(), HashMap::new(), HashMap::new());
    let objects = Objects {
        classes: &classes,
        gateways: &gateways,
        routes: &routes,
        grants: &empty_grants,
        namespaces: &empty_namespaces,
        secrets: &empty_secrets,
    };
    let (services, slices) = (services(), HashMap::new());
    let mut backends = Backends::new(&services, &slices);
    let sockets = Sockets {
        http: Some(80),
        https: None,
    };
    let compiled = compile(
        &objects,
        sockets,
        &["192.0.2.1".parse().unwrap()],
        &mut backends,
    );
    let headers = HeaderMap::new();
    let mut with_header = HeaderMap::new();
    with_header.insert("x-v", "2".parse().unwrap());
    let ask = |path: &'static str, headers: &'static HeaderMap| {
        Request::new(&Method::GET, path, None, headers)
    };
    let headers: &'static HeaderMap = Box::leak(Box::new(headers));
    let with_header: &'static HeaderMap = Box::leak(Box::new(with_header));
    let find = |host, path, h| backend_of(compiled.plain.find(host, &ask(path, h)));
    // The host's own rules first; a header match beats a shorter prefix.
    assert_eq!(
        find("a.example.test", "/api/x", with_header).as_deref(),
        Some("default/b:80")
    );
    assert_eq!(
        find("a.example.test", "/api/x", headers).as_deref(),
        Some("default/a:80")
    );
    // `/api` exactly: the host's own prefix `/` comes before the host-less
    // route's Exact (hostname specificity first).
    assert_eq!(
        find("a.example.test", "/api", headers).as_deref(),
        Some("default/a:80")
    );
    // Another host has the host-less route only.
    assert_eq!(
        find("b.example.test", "/api", headers).as_deref(),
        Some("default/b:80")
    );
    assert_eq!(find("b.example.test", "/other", headers), None);
    // Status: the class accepted; the route on an unserved listener not.
    let status = |name: &str| {
        compiled
            .statuses
            .iter()
            .find(|d| d.name == name)
            .map(|d| d.status.clone())
            .unwrap()
    };
    assert_eq!(status("portal")["conditions"][0]["status"], "True");
    // Attached to a listener that is not valid: counted and accepted
    // (attachment is by parentRef and allowedRoutes alone), not served.
    let unserved = status("unserved");
    assert_eq!(
        unserved["parents"][0]["conditions"][0]["reason"],
        "Accepted"
    );
    assert_eq!(
        unserved["parents"][0]["conditions"][0]["observedGeneration"],
        2
    );
    let web = status("web");
    assert_eq!(web["conditions"][0]["reason"], "ListenersNotValid");
    assert_eq!(web["conditions"][1]["status"], "True");
    assert_eq!(web["listeners"][0]["attachedRoutes"], 2);
    assert_eq!(web["listeners"][1]["attachedRoutes"], 1);
    assert_eq!(
        web["listeners"][1]["conditions"][0]["reason"],
        "PortUnavailable"
    );
    assert_eq!(web["addresses"][0]["value"], "192.0.2.1");
}

#[test]
fn hostnames_intersect_as_the_specification_says() {
    let hosts = |listener, route: &[&str]| {
        intersect(
            listener,
            &route.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(hosts(None, &[]), [None]);
    assert_eq!(
        hosts(Some("*.example.test"), &[]),
        [Some("*.example.test".into())]
    );
    assert_eq!(
        hosts(Some("*.example.test"), &["a.b.example.test", "other.test"]),
        [Some("a.b.example.test".into())]
    );
    assert_eq!(
        hosts(Some("a.example.test"), &["*.example.test"]),
        [Some("a.example.test".into())]
    );
    assert!(hosts(Some("example.test"), &["*.example.test"]).is_empty());
}

#[test]
fn paths_change_as_asked() {
    let prefix = PathChange::Prefix("/v2".into());
    assert_eq!(prefix.apply("/v1/items", Some("/v1")), "/v2/items");
    assert_eq!(prefix.apply("/v1", Some("/v1/")), "/v2");
    let root = PathChange::Prefix("/".into());
    assert_eq!(root.apply("/v1/items", Some("/v1")), "/items");
    assert_eq!(root.apply("/v1", Some("/v1")), "/");
    assert_eq!(
        PathChange::Full("/x".into()).apply("/v1/items", Some("/v1")),
        "/x"
    );
}

#[test]
fn durations_parse() {
    assert_eq!(
        duration("1h2m3s4ms"),
        Some(std::time::Duration::from_millis(3_723_004))
    );
    assert_eq!(
        duration("500ms"),
        Some(std::time::Duration::from_millis(500))
    );
    assert_eq!(duration("1x"), None);
    assert_eq!(duration(""), None);
}
