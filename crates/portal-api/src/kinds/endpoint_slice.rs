//! EndpointSlices (`discovery.k8s.io/v1`): ports defaulted to TCP,
//! validated as upstream's `ValidateEndpointSlice` (every address of the
//! slice's one address type, which never changes), printed as `kubectl get
//! endpointslices` does.

use std::net::IpAddr;

use serde_json::{json, Value};

use super::{nothing, replace_lists};
use crate::defaults::{array_mut, default};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("discovery.k8s.io", "EndpointSlice");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "endpointslices",
    singular: "endpointslice",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &[],
    categories: &[],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::discovery::v1::EndpointSlice>,
    openapi_schema: openapi_schema::<k8s_openapi::api::discovery::v1::EndpointSlice>,
    defaults,
    validate,
    prepare_create: nothing,
    kept_on_update: &[],
    generation: Generation::Untracked,
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

fn defaults(object: &mut Value) {
    for port in array_mut(object, "ports") {
        default(port, "protocol", json!("TCP"));
    }
}

const ADDRESS_TYPES: &[&str] = &["IPv4", "IPv6", "FQDN"];
const MAX_ENDPOINTS: usize = 1000;
const MAX_ADDRESSES: usize = 100;
const MAX_PORTS: usize = 20000;
const MAX_ZONE_HINTS: usize = 8;

fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let address_type = object["addressType"].as_str().unwrap_or("");
    match old.map(|old| &old["addressType"]) {
        Some(before) if before != &object["addressType"] => {
            causes.push(Cause::invalid(
                "addressType",
                address_type,
                "field is immutable",
            ));
        }
        _ if address_type.is_empty() => causes.push(Cause::required("addressType", "")),
        _ if !ADDRESS_TYPES.contains(&address_type) => {
            causes.push(Cause::unsupported(
                "addressType",
                address_type,
                ADDRESS_TYPES,
            ));
        }
        _ => {}
    }
    let endpoints = arr(object, &["endpoints"]);
    if endpoints.len() > MAX_ENDPOINTS {
        causes.push(Cause::too_many(
            "endpoints",
            endpoints.len(),
            MAX_ENDPOINTS as u64,
        ));
    }
    for (e, endpoint) in endpoints.iter().enumerate().take(MAX_ENDPOINTS) {
        causes.extend(endpoint_causes(
            &format!("endpoints[{e}]"),
            endpoint,
            address_type,
        ));
    }
    let ports = arr(object, &["ports"]);
    if ports.len() > MAX_PORTS {
        causes.push(Cause::too_many("ports", ports.len(), MAX_PORTS as u64));
    }
    let mut names = std::collections::HashSet::new();
    for (p, port) in ports.iter().enumerate().take(MAX_PORTS) {
        let path = format!("ports[{p}]");
        let name = port["name"].as_str().unwrap_or("");
        if !name.is_empty() {
            for problem in crate::name::dns1123_label(name) {
                causes.push(Cause::invalid(&format!("{path}.name"), name, &problem));
            }
        }
        if !names.insert(name) {
            causes.push(Cause::duplicate(&format!("{path}.name"), name));
        }
        let protocol = port["protocol"].as_str().unwrap_or("");
        if !["TCP", "UDP", "SCTP"].contains(&protocol) {
            causes.push(Cause::unsupported(
                &format!("{path}.protocol"),
                protocol,
                &["SCTP", "TCP", "UDP"],
            ));
        }
        let number = &port["port"];
        if !number.is_null() && !number.as_i64().is_some_and(|n| (1..=65535).contains(&n)) {
            causes.push(Cause::invalid(
                &format!("{path}.port"),
                number.clone(),
                "must be between 1 and 65535, inclusive",
            ));
        }
        if let Some(protocol) = port["appProtocol"].as_str() {
            for problem in crate::name::qualified_name(protocol) {
                causes.push(Cause::invalid(
                    &format!("{path}.appProtocol"),
                    protocol,
                    &problem,
                ));
            }
        }
    }
    causes
}

/// One endpoint: 1 to 100 addresses of the slice's type, a DNS label for
/// a hostname, a subdomain for a node name, at most 8 zone hints.
fn endpoint_causes(path: &str, endpoint: &Value, address_type: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let addresses = arr(endpoint, &["addresses"]);
    let field = format!("{path}.addresses");
    if addresses.is_empty() {
        causes.push(Cause::required(&field, "must contain at least 1 address"));
    } else if addresses.len() > MAX_ADDRESSES {
        causes.push(Cause::too_many(
            &field,
            addresses.len(),
            MAX_ADDRESSES as u64,
        ));
    }
    for (a, address) in addresses.iter().enumerate().take(MAX_ADDRESSES) {
        let text = address.as_str().unwrap_or("");
        let field = format!("{field}[{a}]");
        let problem = match (address_type, text.parse::<IpAddr>()) {
            ("IPv4", Ok(IpAddr::V4(_))) | ("IPv6", Ok(IpAddr::V6(_))) => None,
            ("IPv4", _) => Some("must be a valid IPv4 address".to_owned()),
            ("IPv6", _) => Some("must be a valid IPv6 address".to_owned()),
            ("FQDN", _) => crate::name::dns1123_subdomain(text).into_iter().next(),
            _ => None,
        };
        if let Some(problem) = problem {
            causes.push(Cause::invalid(&field, text, &problem));
        }
    }
    if let Some(hostname) = endpoint["hostname"].as_str() {
        for problem in crate::name::dns1123_label(hostname) {
            causes.push(Cause::invalid(
                &format!("{path}.hostname"),
                hostname,
                &problem,
            ));
        }
    }
    if let Some(node) = endpoint["nodeName"].as_str() {
        for problem in crate::name::dns1123_subdomain(node) {
            causes.push(Cause::invalid(&format!("{path}.nodeName"), node, &problem));
        }
    }
    let zones = arr(endpoint, &["hints", "forZones"]);
    if zones.len() > MAX_ZONE_HINTS {
        let field = format!("{path}.hints.forZones");
        causes.push(Cause::too_many(&field, zones.len(), MAX_ZONE_HINTS as u64));
    }
    causes
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        col("AddressType", "The IP protocol for this slice.", 0),
        col("Ports", "Enumerated ports on this slice.", 0),
        col("Endpoints", "Addresses of the endpoints in this slice.", 0),
        AGE,
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    let ports: Vec<String> = arr(object, &["ports"])
        .iter()
        .map(|p| {
            p.get("port")
                .and_then(Value::as_i64)
                .map_or_else(|| "<unset>".to_owned(), |p| p.to_string())
        })
        .collect();
    let addresses: Vec<&str> = arr(object, &["endpoints"])
        .iter()
        .flat_map(|e| arr(e, &["addresses"]).iter().filter_map(Value::as_str))
        .collect();
    let endpoints = match addresses.len() {
        0 => "<none>".to_owned(),
        n if n > 3 => format!("{} + {} more...", addresses[..3].join(","), n - 3),
        _ => addresses.join(","),
    };
    vec![
        name(object),
        json!(s(object, &["addressType"]).unwrap_or("")),
        json!(if ports.is_empty() {
            "<unset>".to_owned()
        } else {
            ports.join(",")
        }),
        json!(endpoints),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(slice: Value, old: Option<Value>) -> Vec<String> {
        validate(&slice, old.as_ref())
            .iter()
            .map(Cause::display)
            .collect()
    }

    #[test]
    fn addresses_are_of_the_slice_type_and_the_type_never_changes() {
        let slice = |kind: &str, address: &str| {
            json!({"addressType": kind, "endpoints": [{"addresses": [address], "hostname": "web-0"}],
                "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]})
        };
        assert!(problems(slice("IPv4", "10.0.0.1"), None).is_empty());
        assert!(problems(slice("IPv6", "fd00::1"), None).is_empty());
        assert!(problems(slice("FQDN", "db.example.com"), None).is_empty());
        assert_eq!(
            problems(slice("IPv4", "fd00::1"), None),
            ["endpoints[0].addresses[0]: Invalid value: \"fd00::1\": must be a valid IPv4 address"]
        );
        assert_eq!(
            problems(slice("IPv6", "10.0.0.1"), None),
            ["endpoints[0].addresses[0]: Invalid value: \"10.0.0.1\": must be a valid IPv6 address"]
        );
        assert_eq!(
            problems(slice("IPv6", "fd00::1"), Some(slice("IPv4", "10.0.0.1"))),
            ["addressType: Invalid value: \"IPv6\": field is immutable"]
        );
        assert!(problems(slice("IPX", "x"), None)[0]
            .starts_with("addressType: Unsupported value: \"IPX\""));
    }

    #[test]
    fn inputs_are_bounded() {
        let many: Vec<Value> = (0..1001)
            .map(|i| json!({"addresses": [format!("10.0.{}.{}", i / 250, i % 250 + 1)]}))
            .collect();
        let found = problems(json!({"addressType": "IPv4", "endpoints": many}), None);
        assert_eq!(
            found,
            ["endpoints: Too many: 1001: must have at most 1000 items"]
        );
        let found = problems(
            json!({"addressType": "IPv4", "endpoints": [{"addresses": []}],
            "ports": [{"name": "a", "protocol": "TCP"}, {"name": "a", "protocol": "TCP", "port": 70000}]}),
            None,
        );
        assert_eq!(found.len(), 3, "{found:?}");
    }
}
