use serde_json::json;

use super::*;
use crate::backends::slices_by_service;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use portal_client::labels::SERVICE_NAME as SERVICE_NAME_LABEL;
use std::net::SocketAddr;

fn ingress(name: &str, created: &str, spec: serde_json::Value) -> Arc<Ingress> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
            "spec": spec,
        }))
        .unwrap(),
    )
}

fn service(name: &str, ports: serde_json::Value) -> ((String, String), Arc<Service>) {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"}, "spec": {"ports": ports}}))
    .unwrap();
    (("default".into(), name.into()), Arc::new(svc))
}

fn slice(
    service: &str,
    port: (&str, i32),
    ready: &[&str],
    not_ready: &[&str],
) -> Arc<EndpointSlice> {
    let mut endpoints: Vec<serde_json::Value> = ready
        .iter()
        .map(|a| json!({"addresses": [a], "conditions": {"ready": true}}))
        .collect();
    endpoints.extend(
        not_ready
            .iter()
            .map(|a| json!({"addresses": [a], "conditions": {"ready": false}})),
    );
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": format!("{service}-x"), "namespace": "default",
                         "labels": {SERVICE_NAME_LABEL: service}},
            "addressType": "IPv4",
            "ports": [{"name": port.0, "port": port.1}],
            "endpoints": endpoints,
        }))
        .unwrap(),
    )
}

fn path(path: &str, kind: &str, service: &str, port: serde_json::Value) -> serde_json::Value {
    json!({"path": path, "pathType": kind, "backend": {"service": {"name": service, "port": port}}})
}

fn table(ingresses: &[Arc<Ingress>]) -> Table {
    let services = HashMap::from([
        service(
            "a",
            json!([{"name": "http", "port": 80, "targetPort": 8080}]),
        ),
        service("b", json!([{"port": 80, "targetPort": 9090}])),
    ]);
    let slices = slices_by_service([
        slice(
            "a",
            ("http", 8080),
            &["10.0.0.1", "10.0.0.2"],
            &["10.0.0.9"],
        ),
        slice("b", ("", 9090), &["10.0.1.1"], &[]),
    ]);
    Table::build(
        ingresses,
        &["portal".to_owned()],
        &mut Backends::new(&services, &slices),
    )
}

/// As the proxy asks: the host in lower case.
fn backend(table: &Table, host: &str, path: &str) -> Option<String> {
    match table.find(&host.to_ascii_lowercase(), path) {
        Found::Route(route) => Some(route.backend.name.to_string()),
        Found::Nothing | Found::Gateway(_) => None,
    }
}

#[test]
fn hosts_and_paths_as_the_specification_says() {
    let web = ingress(
        "web",
        "2026-01-01T00:00:00Z",
        json!({"ingressClassName": "portal", "rules": [
            {"host": "a.example.test", "http": {"paths": [path("/", "Prefix", "a", json!({"name": "http"}))]}},
            {"host": "b.example.test", "http": {"paths": [
                path("/api", "Prefix", "b", json!({"number": 80})),
                path("/api/exact", "Exact", "a", json!({"number": 80})),
            ]}},
            {"host": "*.wild.test", "http": {"paths": [path("/", "Prefix", "a", json!({"number": 80}))]}},
        ]}),
    );
    let t = table(&[web]);
    assert_eq!(
        backend(&t, "a.example.test", "/anything").as_deref(),
        Some("default/a:http")
    );
    assert_eq!(
        backend(&t, "A.Example.Test", "/").as_deref(),
        Some("default/a:http")
    );
    assert_eq!(
        backend(&t, "b.example.test", "/api").as_deref(),
        Some("default/b:80")
    );
    assert_eq!(
        backend(&t, "b.example.test", "/api/v1").as_deref(),
        Some("default/b:80")
    );
    assert_eq!(
        backend(&t, "b.example.test", "/apis"),
        None,
        "prefixes match whole elements"
    );
    assert_eq!(
        backend(&t, "b.example.test", "/api/exact").as_deref(),
        Some("default/a:80")
    );
    assert_eq!(
        backend(&t, "b.example.test", "/api/exact/more").as_deref(),
        Some("default/b:80")
    );
    assert_eq!(
        backend(&t, "x.wild.test", "/").as_deref(),
        Some("default/a:80")
    );
    assert_eq!(
        backend(&t, "y.x.wild.test", "/"),
        None,
        "a wildcard covers one label"
    );
    assert_eq!(backend(&t, "wild.test", "/"), None);
    assert_eq!(backend(&t, "other.test", "/"), None);
}

#[test]
fn only_ready_endpoints_of_the_named_port() {
    let web = ingress(
        "web",
        "2026-01-01T00:00:00Z",
        json!({"ingressClassName": "portal", "rules": [
        {"http": {"paths": [path("/", "Prefix", "a", json!({"number": 80}))]}}]}),
    );
    let t = table(&[web]);
    let Found::Route(route) = t.find("any.test", "/") else {
        panic!("no route")
    };
    let endpoints: Vec<String> = route
        .backend
        .endpoints
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(endpoints, ["10.0.0.1:8080", "10.0.0.2:8080"]);
    let first: Vec<SocketAddr> = route.backend.rotation().map(|(e, _)| e).collect();
    let second: Vec<SocketAddr> = route.backend.rotation().map(|(e, _)| e).collect();
    assert_eq!(first.len(), 2);
    assert_ne!(first[0], second[0], "round robin");
}

#[test]
fn other_classes_are_not_ours_and_the_oldest_wins_a_clash() {
    let theirs = ingress(
        "theirs",
        "2026-01-01T00:00:00Z",
        json!({"ingressClassName": "nginx", "rules": [
        {"host": "a.test", "http": {"paths": [path("/", "Prefix", "b", json!({"number": 80}))]}}]}),
    );
    let newer = ingress(
        "newer",
        "2026-01-03T00:00:00Z",
        json!({"ingressClassName": "portal", "rules": [
        {"host": "a.test", "http": {"paths": [path("/", "Prefix", "b", json!({"number": 80}))]}}],
        "tls": [{"hosts": ["a.test"], "secretName": "newer-tls"}]}),
    );
    let older = ingress(
        "older",
        "2026-01-02T00:00:00Z",
        json!({"ingressClassName": "portal",
        "defaultBackend": {"service": {"name": "b", "port": {"number": 80}}},
        "rules": [{"host": "a.test", "http": {"paths": [path("/", "Prefix", "a", json!({"number": 80}))]}}],
        "tls": [{"hosts": ["a.test"], "secretName": "older-tls"}]}),
    );
    let t = table(&[theirs, newer, older]);
    assert_eq!(backend(&t, "a.test", "/").as_deref(), Some("default/a:80"));
    assert_eq!(
        t.tls,
        [TlsHost {
            host: "a.test".into(),
            namespace: "default".into(),
            secret: "older-tls".into()
        }]
    );
    assert_eq!(
        backend(&t, "elsewhere.test", "/x").as_deref(),
        Some("default/b:80"),
        "the default backend"
    );
    let names: Vec<&str> = t.ingresses.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["older", "newer"]);
}
