//! NetworkPolicies (`networking.k8s.io/v1`): which traffic may reach
//! (ingress) and leave (egress) the pods a policy selects. Validation and
//! defaults are Kubernetes'; every node's agent enforces them for its own
//! pods (portal-agent's `policy`).

use std::net::IpAddr;

use serde_json::{json, Value};

use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::selector::LabelSelector;
use crate::service::validate::port_name_problems;
use crate::table::Column;
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("networking.k8s.io", "NetworkPolicy");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "networkpolicies",
    singular: "networkpolicy",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["netpol"],
    categories: &[],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::networking::v1::NetworkPolicy>,
    openapi_schema: openapi_schema::<k8s_openapi::api::networking::v1::NetworkPolicy>,
    defaults,
    validate,
    prepare_create: |_| {},
    kept_on_update: &[],
    generation: Generation::Spec,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: |_| ListStrategy::Replace,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];

/// Kubernetes' defaults: every port's protocol is TCP; `policyTypes` is
/// Ingress, and Egress too when egress rules are given.
fn defaults(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    if spec.get("podSelector").is_none_or(Value::is_null) {
        spec["podSelector"] = json!({});
    }
    for direction in ["ingress", "egress"] {
        let Some(rules) = spec.get_mut(direction).and_then(Value::as_array_mut) else {
            continue;
        };
        for rule in rules {
            let Some(ports) = rule.get_mut("ports").and_then(Value::as_array_mut) else {
                continue;
            };
            for port in ports.iter_mut().filter(|p| p.is_object()) {
                if port.get("protocol").is_none_or(Value::is_null) {
                    port["protocol"] = json!("TCP");
                }
            }
        }
    }
    let given = spec["policyTypes"]
        .as_array()
        .is_some_and(|t| !t.is_empty());
    if !given {
        let egress = spec["egress"].as_array().is_some_and(|e| !e.is_empty());
        spec["policyTypes"] = if egress {
            json!(["Ingress", "Egress"])
        } else {
            json!(["Ingress"])
        };
    }
}

fn selector_causes(value: &Value, field: &str, causes: &mut Vec<Cause>) {
    if let Err(message) = LabelSelector::from_api(value, field) {
        let (field, detail) = message.split_once(": ").unwrap_or((field, &message));
        causes.push(Cause::invalid_rendered(field, "", detail));
    }
}

/// An address block: `(address, prefix length)`, either family.
pub fn parse_cidr(text: &str) -> Option<(IpAddr, u8)> {
    let (address, prefix) = text.split_once('/')?;
    let address: IpAddr = address.parse().ok()?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let prefix: u8 = prefix.parse().ok()?;
    let bits = if address.is_ipv4() { 32 } else { 128 };
    (prefix <= bits).then_some((address, prefix))
}

/// The first and last address of a block, as 128-bit numbers (IPv4 mapped).
pub fn cidr_bounds((address, prefix): (IpAddr, u8)) -> (u128, u128) {
    let (value, bits) = match address {
        IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
        IpAddr::V6(v6) => (u128::from(v6), 128),
    };
    let host = bits - u32::from(prefix);
    let mask = if host >= 128 {
        u128::MAX
    } else {
        (1u128 << host) - 1
    };
    (value & !mask, value | mask)
}

fn validate_ip_block(block: &Value, field: &str, causes: &mut Vec<Cause>) {
    let Some(cidr_text) = block["cidr"].as_str().filter(|c| !c.is_empty()) else {
        causes.push(Cause::required(&format!("{field}.cidr"), ""));
        return;
    };
    let Some(cidr) = parse_cidr(cidr_text) else {
        causes.push(Cause::invalid(
            &format!("{field}.cidr"),
            cidr_text,
            "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
        ));
        return;
    };
    let (low, high) = cidr_bounds(cidr);
    for (i, except) in block["except"].as_array().into_iter().flatten().enumerate() {
        let except_field = format!("{field}.except[{i}]");
        let text = except.as_str().unwrap_or("");
        let Some(inner) = parse_cidr(text) else {
            causes.push(Cause::invalid(
                &except_field,
                text,
                "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            ));
            continue;
        };
        let (inner_low, inner_high) = cidr_bounds(inner);
        let subset = inner.0.is_ipv4() == cidr.0.is_ipv4()
            && inner.1 > cidr.1
            && inner_low >= low
            && inner_high <= high;
        if !subset {
            causes.push(Cause::invalid(
                &except_field,
                text,
                "must be a strict subset of `cidr`",
            ));
        }
    }
}

fn validate_peer(peer: &Value, field: &str, causes: &mut Vec<Cause>) {
    let mut given = 0;
    for key in ["podSelector", "namespaceSelector"] {
        if !peer[key].is_null() {
            given += 1;
            selector_causes(&peer[key], &format!("{field}.{key}"), causes);
        }
    }
    if !peer["ipBlock"].is_null() {
        given += 1;
        validate_ip_block(&peer["ipBlock"], &format!("{field}.ipBlock"), causes);
        if given > 1 {
            causes.push(Cause::forbidden(
                field,
                "may not specify both ipBlock and another peer",
            ));
        }
    }
    if given == 0 {
        causes.push(Cause::required(field, "must specify a peer"));
    }
}

fn valid_port_number(n: i64) -> bool {
    (1..=65535).contains(&n)
}

fn validate_port(port: &Value, field: &str, causes: &mut Vec<Cause>) {
    if let Some(protocol) = port["protocol"].as_str() {
        if !PROTOCOLS.contains(&protocol) {
            causes.push(Cause::unsupported(
                &format!("{field}.protocol"),
                protocol,
                &PROTOCOLS,
            ));
        }
    }
    let end_port = &port["endPort"];
    match &port["port"] {
        Value::Null => {
            if !end_port.is_null() {
                causes.push(Cause::invalid(
                    &format!("{field}.endPort"),
                    end_port.clone(),
                    "may not be specified when `port` is not specified",
                ));
            }
        }
        Value::Number(n) => {
            let n = n.as_i64().unwrap_or(0);
            if !valid_port_number(n) {
                causes.push(Cause::invalid(
                    &format!("{field}.port"),
                    n,
                    "must be between 1 and 65535, inclusive",
                ));
            }
            if let Some(end) = end_port.as_i64() {
                // Kubernetes shows `port`'s value here.
                if end < n {
                    causes.push(Cause::invalid(
                        &format!("{field}.endPort"),
                        n,
                        "must be greater than or equal to `port`",
                    ));
                }
                if !valid_port_number(end) {
                    causes.push(Cause::invalid(
                        &format!("{field}.endPort"),
                        end,
                        "must be between 1 and 65535, inclusive",
                    ));
                }
            }
        }
        Value::String(name) => {
            if !end_port.is_null() {
                causes.push(Cause::invalid(
                    &format!("{field}.endPort"),
                    end_port.clone(),
                    "may not be specified when `port` is non-numeric",
                ));
            }
            for problem in port_name_problems(name) {
                causes.push(Cause::invalid(
                    &format!("{field}.port"),
                    name.as_str(),
                    problem,
                ));
            }
        }
        other => causes.push(Cause::invalid(
            &format!("{field}.port"),
            other.clone(),
            "must be a port number or name",
        )),
    }
}

fn validate(object: &Value, _old: Option<&Value>) -> Vec<Cause> {
    let spec = &object["spec"];
    let mut causes = Vec::new();
    selector_causes(&spec["podSelector"], "spec.podSelector", &mut causes);
    for (direction, peers) in [("ingress", "from"), ("egress", "to")] {
        for (i, rule) in spec[direction].as_array().into_iter().flatten().enumerate() {
            let field = format!("spec.{direction}[{i}]");
            for (j, port) in rule["ports"].as_array().into_iter().flatten().enumerate() {
                validate_port(port, &format!("{field}.ports[{j}]"), &mut causes);
            }
            for (j, peer) in rule[peers].as_array().into_iter().flatten().enumerate() {
                validate_peer(peer, &format!("{field}.{peers}[{j}]"), &mut causes);
            }
        }
    }
    let types = spec["policyTypes"].as_array().cloned().unwrap_or_default();
    for (i, kind) in types.iter().enumerate() {
        let text = kind.as_str().unwrap_or("");
        if !matches!(text, "Ingress" | "Egress") {
            causes.push(Cause::unsupported(
                &format!("spec.policyTypes[{i}]"),
                text,
                &["Egress", "Ingress"],
            ));
        }
    }
    if types.len() > 2 {
        causes.push(Cause::invalid(
            "spec.policyTypes",
            Value::Array(types),
            "may not specify more than two policyTypes",
        ));
    }
    causes
}

fn columns() -> Vec<Column> {
    use crate::table::{col, AGE, NAME};
    vec![
        NAME,
        col(
            "Pod-Selector",
            "Selects the pods to which this NetworkPolicy object applies.",
            0,
        ),
        AGE,
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    use crate::table::cells::*;
    let selector = LabelSelector::from_api(&object["spec"]["podSelector"], "")
        .map(|s| s.to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "<none>".into());
    vec![name(object), json!(selector), age(object, now)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(spec: Value) -> Value {
        let mut object = json!({"metadata": {"name": "p", "namespace": "a"}, "spec": spec});
        defaults(&mut object);
        object
    }

    fn messages(spec: Value) -> Vec<String> {
        validate(&policy(spec), None)
            .iter()
            .map(Cause::display)
            .collect()
    }

    #[test]
    fn defaults_as_kubernetes() {
        let p = policy(json!({"ingress": [{"ports": [{"port": 80}]}]}));
        assert_eq!(p["spec"]["policyTypes"], json!(["Ingress"]));
        assert_eq!(p["spec"]["ingress"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(p["spec"]["podSelector"], json!({}));
        let both = policy(json!({"egress": [{}]}));
        assert_eq!(both["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        let given = policy(json!({"policyTypes": ["Egress"]}));
        assert_eq!(given["spec"]["policyTypes"], json!(["Egress"]));
    }

    #[test]
    fn a_good_policy_is_valid() {
        let spec = json!({
            "podSelector": {"matchLabels": {"app": "db"}},
            "ingress": [{"from": [
                {"namespaceSelector": {"matchLabels": {"team": "b"}}, "podSelector": {}},
                {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
                {"ipBlock": {"cidr": "2001:db8::/32"}}
            ], "ports": [{"port": "http"}, {"port": 8000, "endPort": 8080, "protocol": "UDP"}]}],
            "egress": [{"to": [{"podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]}]
        });
        assert!(messages(spec).is_empty());
    }

    #[test]
    fn bad_policies_say_what_is_wrong() {
        let bad = messages(json!({"ingress": [{
            "from": [{}, {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16", "10.0.0.0/8"]}, "podSelector": {}}],
            "ports": [{"port": 0}, {"port": 90, "endPort": 80}, {"port": "http", "endPort": 90}, {"protocol": "ICMP"}, {"endPort": 3}]
        }], "policyTypes": ["Ingress", "Sideways"]}));
        let expect = [
            "spec.ingress[0].ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive",
            "spec.ingress[0].ports[1].endPort: Invalid value: 90: must be greater than or equal to `port`",
            "spec.ingress[0].ports[2].endPort: Invalid value: 90: may not be specified when `port` is non-numeric",
            "spec.ingress[0].ports[3].protocol: Unsupported value: \"ICMP\": supported values: \"TCP\", \"UDP\", \"SCTP\"",
            "spec.ingress[0].ports[4].endPort: Invalid value: 3: may not be specified when `port` is not specified",
            "spec.ingress[0].from[0]: Required value: must specify a peer",
            "spec.ingress[0].from[1].ipBlock.except[0]: Invalid value: \"11.0.0.0/16\": must be a strict subset of `cidr`",
            "spec.ingress[0].from[1].ipBlock.except[1]: Invalid value: \"10.0.0.0/8\": must be a strict subset of `cidr`",
            "spec.ingress[0].from[1]: Forbidden: may not specify both ipBlock and another peer",
            "spec.policyTypes[1]: Unsupported value: \"Sideways\": supported values: \"Egress\", \"Ingress\"",
        ];
        assert_eq!(bad, expect);
        assert!(
            messages(json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0/8"}}]}]}))[0]
                .contains("must be a valid CIDR value")
        );
    }

    #[test]
    fn shows_its_pod_selector() {
        let p = policy(json!({"podSelector": {"matchLabels": {"app": "db"}}}));
        assert_eq!(cells(&p, 0)[1], json!("app=db"));
        assert_eq!(cells(&policy(json!({})), 0)[1], json!("<none>"));
    }

    #[test]
    fn cidr_bounds_cover_the_block() {
        assert_eq!(
            cidr_bounds(parse_cidr("10.1.2.3/24").unwrap()),
            (0x0a01_0200, 0x0a01_02ff)
        );
        assert_eq!(
            cidr_bounds(parse_cidr("0.0.0.0/0").unwrap()),
            (0, 0xffff_ffff)
        );
        assert_eq!(cidr_bounds(parse_cidr("::/0").unwrap()), (0, u128::MAX));
        assert!(parse_cidr("10.0.0.0/33").is_none() && parse_cidr("10.0.0.0").is_none());
        assert!(parse_cidr("10.0.0.0/+8").is_none() && parse_cidr("10.0.0.0/").is_none());
    }
}
