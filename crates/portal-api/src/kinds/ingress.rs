//! Ingresses (`networking.k8s.io/v1`, `ing`): HTTP routes by host and path
//! to Services, with TLS by host, as upstream validates them
//! (`ValidateIngressCreate`/`Update`, `validateHTTPIngressPath`,
//! `validateIngressBackend`) and as `kubectl get ingress` prints them.
//! Which controller serves one is its `ingressClassName` (the default
//! class's when unset, see admission).

use std::net::IpAddr;

use serde_json::{json, Value};

use super::{nothing, replace_lists};
use crate::ip_text::IP_HINT;
use crate::name::{dns1035_label, dns1123_subdomain, path_segment, wildcard_dns1123_subdomain};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::service::validate::port_name_problems;
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("networking.k8s.io", "Ingress");

/// The annotation that named a class before `ingressClassName`.
pub const CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "ingresses",
    singular: "ingress",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["ing"],
    categories: &[],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::networking::v1::Ingress>,
    openapi_schema: openapi_schema::<k8s_openapi::api::networking::v1::Ingress>,
    defaults: nothing,
    validate,
    prepare_create: nothing,
    kept_on_update: &[],
    generation: Generation::Spec,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: replace_lists,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

const PATH_TYPES: &[&str] = &["Exact", "ImplementationSpecific", "Prefix"];

fn text<'a>(value: &'a Value, field: &str) -> &'a str {
    value[field].as_str().unwrap_or("")
}

fn items(value: &Value) -> &[Value] {
    value.as_array().map_or(&[][..], Vec::as_slice)
}

/// Whether a host has a wildcard and its rule fails validation (an old
/// object like that may still be updated).
fn invalid_wildcard_rule(object: &Value) -> bool {
    items(&object["spec"]["rules"])
        .iter()
        .enumerate()
        .any(|(i, rule)| {
            let mut causes = Vec::new();
            text(rule, "host").contains('*') && {
                rule_value(rule, &format!("spec.rules[{i}]"), &mut causes);
                !causes.is_empty()
            }
        })
}

fn invalid_secret_name(object: &Value) -> bool {
    items(&object["spec"]["tls"]).iter().any(|tls| {
        let name = text(tls, "secretName");
        !name.is_empty() && !dns1123_subdomain(name).is_empty()
    })
}

/// Upstream's `ValidateIngressCreate` and `ValidateIngressUpdate`.
fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let spec = &object["spec"];
    let mut causes = Vec::new();
    let allow_invalid_secret = old.is_some_and(invalid_secret_name);
    let allow_invalid_wildcard = old.is_some_and(invalid_wildcard_rule);
    let rules = items(&spec["rules"]);
    if rules.is_empty() && spec["defaultBackend"].is_null() {
        causes.push(Cause::invalid(
            "spec",
            json!([]),
            "either `defaultBackend` or `rules` must be specified",
        ));
    }
    if !spec["defaultBackend"].is_null() {
        backend(&spec["defaultBackend"], "spec.defaultBackend", &mut causes);
    }
    if let Some(class) = spec["ingressClassName"].as_str() {
        for problem in dns1123_subdomain(class) {
            causes.push(Cause::invalid("spec.ingressClassName", class, &problem));
        }
    }
    for (i, rule) in rules.iter().enumerate() {
        let at = format!("spec.rules[{i}]");
        let host = text(rule, "host");
        let wildcard = host.contains('*');
        if !host.is_empty() {
            host_problems(host, &format!("{at}.host"), true, &mut causes);
        }
        if !(wildcard && allow_invalid_wildcard) {
            rule_value(rule, &at, &mut causes);
        }
    }
    for (i, tls) in items(&spec["tls"]).iter().enumerate() {
        for (j, host) in items(&tls["hosts"]).iter().enumerate() {
            let host = host.as_str().unwrap_or("");
            host_problems(
                host,
                &format!("spec.tls[{i}].hosts[{j}]"),
                false,
                &mut causes,
            );
        }
        let secret = text(tls, "secretName");
        if !secret.is_empty() && !allow_invalid_secret {
            for problem in dns1123_subdomain(secret) {
                causes.push(Cause::invalid(
                    &format!("spec.tls[{i}].secretName"),
                    secret,
                    &problem,
                ));
            }
        }
    }
    if old.is_none() {
        let annotation = object["metadata"]["annotations"][CLASS_ANNOTATION].as_str();
        if let (Some(annotated), Some(class)) = (annotation, spec["ingressClassName"].as_str()) {
            if annotated != class {
                causes.push(Cause::invalid(
                    &format!("annotations.{CLASS_ANNOTATION}"),
                    annotated,
                    "must match `ingressClassName` when both are specified",
                ));
            }
        }
    }
    for (i, ingress) in items(&object["status"]["loadBalancer"]["ingress"])
        .iter()
        .enumerate()
    {
        let at = format!("status.loadBalancer.ingress[{i}]");
        let ip = text(ingress, "ip");
        if !ip.is_empty() && ip.parse::<IpAddr>().is_err() {
            causes.push(Cause::invalid(&format!("{at}.ip"), ip, IP_HINT));
        }
        let hostname = text(ingress, "hostname");
        if !hostname.is_empty() {
            host_problems(hostname, &format!("{at}.hostname"), true, &mut causes);
        }
    }
    causes
}

/// A host: a wildcard or plain DNS subdomain, never an address.
fn host_problems(host: &str, at: &str, refuse_ip: bool, causes: &mut Vec<Cause>) {
    if refuse_ip && host.parse::<IpAddr>().is_ok() {
        causes.push(Cause::invalid(
            at,
            host,
            "must be a DNS name, not an IP address",
        ));
    }
    let problems = if host.contains('*') {
        wildcard_dns1123_subdomain(host)
    } else {
        dns1123_subdomain(host)
    };
    for problem in problems {
        causes.push(Cause::invalid(at, host, &problem));
    }
}

/// A rule's `http` paths, each with a type, a valid path and a backend.
fn rule_value(rule: &Value, at: &str, causes: &mut Vec<Cause>) {
    let http = &rule["http"];
    if http.is_null() {
        return;
    }
    let paths = items(&http["paths"]);
    if paths.is_empty() {
        causes.push(Cause::required(&format!("{at}.http.paths"), ""));
    }
    for (j, path) in paths.iter().enumerate() {
        let at = format!("{at}.http.paths[{j}]");
        let Some(kind) = path["pathType"].as_str() else {
            causes.push(Cause::required(
                &format!("{at}.pathType"),
                "pathType must be specified",
            ));
            continue;
        };
        let value = text(path, "path");
        let field = format!("{at}.path");
        match kind {
            "Exact" | "Prefix" => {
                if !value.starts_with('/') {
                    causes.push(Cause::invalid(&field, value, "must be an absolute path"));
                }
                for bad in ["//", "/./", "/../", "%2f", "%2F"] {
                    if value.contains(bad) {
                        causes.push(Cause::invalid(
                            &field,
                            value,
                            &format!("must not contain '{bad}'"),
                        ));
                    }
                }
                for bad in ["/..", "/."] {
                    if value.ends_with(bad) {
                        causes.push(Cause::invalid(
                            &field,
                            value,
                            &format!("cannot end with '{bad}'"),
                        ));
                    }
                }
            }
            "ImplementationSpecific" => {
                if !value.is_empty() && !value.starts_with('/') {
                    causes.push(Cause::invalid(&field, value, "must be an absolute path"));
                }
            }
            other => {
                causes.push(Cause::unsupported(
                    &format!("{at}.pathType"),
                    other,
                    PATH_TYPES,
                ));
            }
        }
        backend(&path["backend"], &format!("{at}.backend"), causes);
    }
}

/// Upstream's `validateIngressBackend`: a Service (by name and port) or a
/// resource, not both.
fn backend(backend: &Value, at: &str, causes: &mut Vec<Cause>) {
    let (service, resource) = (&backend["service"], &backend["resource"]);
    match (service.is_null(), resource.is_null()) {
        (false, false) => {
            causes.push(Cause::invalid(
                at,
                "",
                "cannot set both resource and service backends",
            ));
        }
        (true, false) => typed_reference(resource, &format!("{at}.resource"), causes),
        (false, true) => {
            let name = text(service, "name");
            if name.is_empty() {
                causes.push(Cause::required(&format!("{at}.service.name"), ""));
            } else {
                for problem in dns1035_label(name) {
                    causes.push(Cause::invalid(
                        &format!("{at}.service.name"),
                        name,
                        &problem,
                    ));
                }
            }
            let port = &service["port"];
            let port_name = text(port, "name");
            let number = port["number"].as_i64().unwrap_or(0);
            match (port_name.is_empty(), number == 0) {
                (false, false) => causes.push(Cause::invalid(
                    at,
                    "",
                    "cannot set both port name & port number",
                )),
                (false, true) => {
                    for problem in port_name_problems(port_name) {
                        causes.push(Cause::invalid(
                            &format!("{at}.service.port.name"),
                            port_name,
                            problem,
                        ));
                    }
                }
                (true, false) => {
                    if !(1..=65535).contains(&number) {
                        causes.push(Cause::invalid(
                            &format!("{at}.service.port.number"),
                            number,
                            "must be between 1 and 65535, inclusive",
                        ));
                    }
                }
                (true, true) => causes.push(Cause::required(at, "port name or number is required")),
            }
        }
        (true, true) => {
            causes.push(Cause::invalid(
                at,
                "",
                "resource or service backend is required",
            ));
        }
    }
}

/// A typed local object reference (a resource backend, a class's
/// parameters): an optional API group, a kind and a name.
pub(super) fn typed_reference(reference: &Value, at: &str, causes: &mut Vec<Cause>) {
    let group = text(reference, "apiGroup");
    if !group.is_empty() {
        for problem in dns1123_subdomain(group) {
            causes.push(Cause::invalid(&format!("{at}.apiGroup"), group, &problem));
        }
    }
    for field in ["kind", "name"] {
        let value = text(reference, field);
        let path = format!("{at}.{field}");
        if value.is_empty() {
            causes.push(Cause::required(&path, &format!("{field} is required")));
            continue;
        }
        for problem in path_segment(value) {
            causes.push(Cause::invalid(&path, value, &problem));
        }
    }
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        col("Class", "The name of the IngressClass resource.", 0),
        col(
            "Hosts",
            "Hosts that incoming requests are matched against.",
            0,
        ),
        col(
            "Address",
            "Address is a list of IPs or hostnames of the load balancer.",
            0,
        ),
        col("Ports", "Ports of TLS configurations that open.", 0),
        AGE,
    ]
}

/// As kubectl prints them (`formatHosts`, `ingressLoadBalancerStatusStringer`).
fn cells(object: &Value, now: i64) -> Vec<Value> {
    let spec = &object["spec"];
    let class = spec["ingressClassName"].as_str().unwrap_or("<none>");
    let rules = items(&spec["rules"]);
    // Upstream's `formatHosts`: three hosts, then how many rules more.
    let mut hosts: Vec<&str> = Vec::new();
    let mut more = false;
    for rule in rules {
        more |= hosts.len() == 3;
        if !more && !text(rule, "host").is_empty() {
            hosts.push(text(rule, "host"));
        }
    }
    let shown_hosts = match (hosts.is_empty(), more) {
        (true, _) => "*".to_owned(),
        (false, false) => hosts.join(","),
        (false, true) => format!("{} + {} more...", hosts.join(","), rules.len() - 3),
    };
    let mut addresses: Vec<&str> = items(&object["status"]["loadBalancer"]["ingress"])
        .iter()
        .map(|i| {
            if text(i, "ip").is_empty() {
                text(i, "hostname")
            } else {
                text(i, "ip")
            }
        })
        .filter(|a| !a.is_empty())
        .collect();
    addresses.sort_unstable();
    addresses.dedup();
    let ports = if items(&spec["tls"]).is_empty() {
        "80"
    } else {
        "80, 443"
    };
    vec![
        name(object),
        json!(class),
        json!(shown_hosts),
        json!(addresses.join(",")),
        json!(ports),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ingress(spec: Value) -> Value {
        json!({"metadata": {"name": "web", "namespace": "default"}, "spec": spec})
    }

    fn messages(object: &Value, old: Option<&Value>) -> Vec<String> {
        validate(object, old).iter().map(Cause::display).collect()
    }

    fn to(service: &str, port: Value) -> Value {
        json!({"service": {"name": service, "port": port}})
    }

    #[test]
    fn routes_by_host_and_path() {
        let good = ingress(json!({"ingressClassName": "portal", "rules": [
            {"host": "a.example.test", "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": to("a", json!({"number": 80}))}]}},
            {"host": "*.example.test", "http": {"paths": [{"path": "/api", "pathType": "Exact", "backend": to("b", json!({"name": "http"}))}]}},
        ], "tls": [{"hosts": ["a.example.test"], "secretName": "a-tls"}]}));
        assert!(
            messages(&good, None).is_empty(),
            "{:?}",
            messages(&good, None)
        );
        assert_eq!(
            messages(&ingress(json!({})), None),
            ["spec: Invalid value: []: either `defaultBackend` or `rules` must be specified"]
        );
    }

    #[test]
    fn paths_and_backends_as_upstream() {
        let bad = ingress(json!({"rules": [
            {"host": "10.0.0.1", "http": {"paths": [
                {"path": "api", "pathType": "Prefix", "backend": to("a", json!({"number": 80}))},
                {"path": "/a//b/..", "pathType": "Exact", "backend": to("a", json!({"name": "http", "number": 80}))},
                {"path": "/x", "backend": to("a", json!({"number": 80}))},
                {"path": "/y", "pathType": "Regex", "backend": {}},
            ]}},
            {"host": "*.*.bad", "http": {"paths": []}},
        ]}));
        assert_eq!(
            messages(&bad, None),
            [
                "spec.rules[0].host: Invalid value: \"10.0.0.1\": must be a DNS name, not an IP address",
                "spec.rules[0].http.paths[0].path: Invalid value: \"api\": must be an absolute path",
                "spec.rules[0].http.paths[1].path: Invalid value: \"/a//b/..\": must not contain '//'",
                "spec.rules[0].http.paths[1].path: Invalid value: \"/a//b/..\": cannot end with '/..'",
                "spec.rules[0].http.paths[1].backend: Invalid value: \"\": cannot set both port name & port number",
                "spec.rules[0].http.paths[2].pathType: Required value: pathType must be specified",
                "spec.rules[0].http.paths[3].pathType: Unsupported value: \"Regex\": supported values: \"Exact\", \"ImplementationSpecific\", \"Prefix\"",
                "spec.rules[0].http.paths[3].backend: Invalid value: \"\": resource or service backend is required",
                "spec.rules[1].host: Invalid value: \"*.*.bad\": a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character (e.g. '*.example.com', regex used for validation is '\\*\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
                "spec.rules[1].http.paths: Required value",
            ]
        );
    }

    #[test]
    fn the_class_annotation_must_agree_on_create() {
        let mut both = ingress(
            json!({"ingressClassName": "portal", "defaultBackend": to("a", json!({"number": 80}))}),
        );
        both["metadata"]["annotations"] = json!({CLASS_ANNOTATION: "nginx"});
        assert_eq!(
            messages(&both, None),
            ["annotations.kubernetes.io/ingress.class: Invalid value: \"nginx\": must match `ingressClassName` when both are specified"]
        );
        assert!(messages(&both, Some(&both)).is_empty());
    }

    #[test]
    fn printed_as_kubectl_does() {
        let object = json!({"metadata": {"name": "web"}, "spec": {
            "rules": [{"host": "a.test"}, {"host": "b.test"}], "tls": [{"hosts": ["a.test"]}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}, {"hostname": "lb.test"}]}}});
        let cells = cells(&object, 0);
        assert_eq!(
            cells[1..5],
            [
                json!("<none>"),
                json!("a.test,b.test"),
                json!("192.0.2.10,lb.test"),
                json!("80, 443")
            ]
        );
        let default_only = json!({"metadata": {"name": "d"}, "spec": {"ingressClassName": "portal", "defaultBackend": {}}});
        assert_eq!(cells_of(&default_only)[1..3], [json!("portal"), json!("*")]);
        let many = json!({"metadata": {"name": "m"}, "spec": {"rules": [
            {"host": "a"}, {"host": "b"}, {"host": "c"}, {"host": "d"}, {"host": "e"}]}});
        assert_eq!(cells_of(&many)[2], json!("a,b,c + 2 more..."));
    }

    fn cells_of(object: &Value) -> Vec<Value> {
        cells(object, 0)
    }
}
