//! Service and Endpoints validation (`pkg/apis/core/validation`): what can
//! be checked from the object alone. Range and availability checks of
//! cluster IPs and node ports belong to the allocators.

use std::collections::HashSet;
use std::net::IpAddr;

use serde_json::{json, Value};

use crate::name;
use crate::status::Cause;

const TYPES: &str = "\"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\"";
const PROTOCOLS: &str = "\"SCTP\", \"TCP\", \"UDP\"";
const MAX_AFFINITY_SECONDS: i64 = 86_400;

pub(crate) fn unsupported(field: &str, value: &str, supported: &str) -> Cause {
    Cause {
        reason: "FieldValueNotSupported".into(),
        message: format!(
            "Unsupported value: {}: supported values: {supported}",
            json!(value)
        ),
        field: field.into(),
    }
}

pub(crate) fn duplicate(field: &str, value: Value) -> Cause {
    Cause {
        reason: "FieldValueDuplicate".into(),
        message: format!("Duplicate value: {value}"),
        field: field.into(),
    }
}

pub(crate) fn port_range(field: &str, port: &Value, causes: &mut Vec<Cause>) {
    if !port.as_i64().is_some_and(|p| (1..=65535).contains(&p)) {
        causes.push(Cause::invalid(
            field,
            port.clone(),
            "must be between 1 and 65535, inclusive",
        ));
    }
}

/// An IANA service name, as a named `targetPort` must be.
pub(crate) fn port_name_problems(name: &str) -> Vec<&'static str> {
    let mut problems = Vec::new();
    if name.len() > 15 {
        problems.push("must be no more than 15 characters");
    }
    if !name
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        problems.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)");
    }
    if name.contains("--") {
        problems.push("must not contain consecutive hyphens");
    }
    if !name.bytes().any(|c| c.is_ascii_lowercase()) {
        problems.push("must contain at least one letter (a-z)");
    }
    if name.starts_with('-') || name.ends_with('-') {
        problems.push("must not begin or end with a hyphen");
    }
    problems
}

fn valid_ip(text: &str) -> bool {
    text.parse::<IpAddr>().is_ok()
}

use crate::ip_text::IP_HINT;

/// Problems with a Service; `old` is the stored object on update.
pub fn validate(svc: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = &svc["spec"];
    let kind = spec["type"].as_str().unwrap_or("ClusterIP");
    if !matches!(
        kind,
        "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName"
    ) {
        causes.push(unsupported("spec.type", kind, TYPES));
    }
    let cluster_ip = spec["clusterIP"].as_str().unwrap_or("");
    let headless = cluster_ip == super::HEADLESS;
    let ports = spec["ports"].as_array().map_or(&[][..], Vec::as_slice);
    if ports.is_empty() && !headless && kind != "ExternalName" {
        causes.push(Cause::required("spec.ports", ""));
    }
    let mut names = HashSet::new();
    let mut keys = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let path = format!("spec.ports[{i}]");
        let port_name = port["name"].as_str().unwrap_or("");
        if port_name.is_empty() {
            if ports.len() > 1 {
                causes.push(Cause::required(&format!("{path}.name"), ""));
            }
        } else {
            for problem in name::dns1123_label(port_name) {
                causes.push(Cause::invalid(&format!("{path}.name"), port_name, &problem));
            }
            if !names.insert(port_name) {
                causes.push(duplicate(&format!("{path}.name"), json!(port_name)));
            }
        }
        port_range(&format!("{path}.port"), &port["port"], &mut causes);
        let protocol = port["protocol"].as_str().unwrap_or("TCP");
        if !matches!(protocol, "TCP" | "UDP" | "SCTP") {
            causes.push(unsupported(
                &format!("{path}.protocol"),
                protocol,
                PROTOCOLS,
            ));
        }
        match &port["targetPort"] {
            Value::String(target) => {
                for problem in port_name_problems(target) {
                    causes.push(Cause::invalid(
                        &format!("{path}.targetPort"),
                        target.as_str(),
                        problem,
                    ));
                }
            }
            Value::Null => {}
            number => port_range(&format!("{path}.targetPort"), number, &mut causes),
        }
        let node_port = port["nodePort"].as_i64().unwrap_or(0);
        if node_port != 0 {
            if kind == "ClusterIP" {
                causes.push(Cause::forbidden(
                    &format!("{path}.nodePort"),
                    "may not be used when `type` is 'ClusterIP'",
                ));
            } else if !(1..=65535).contains(&node_port) {
                port_range(&format!("{path}.nodePort"), &port["nodePort"], &mut causes);
            }
        }
        let key = (port["port"].as_i64(), protocol.to_owned());
        if !keys.insert(key) {
            let go = format!(
                "core.ServicePort{{Name:\"\", Protocol:\"{protocol}\", AppProtocol:(*string)(nil), Port:{}, TargetPort:intstr.IntOrString{{Type:0, IntVal:0, StrVal:\"\"}}, NodePort:0}}",
                port["port"].as_i64().unwrap_or(0)
            );
            causes.push(Cause {
                reason: "FieldValueDuplicate".into(),
                message: format!("Duplicate value: {go}"),
                field: path,
            });
        }
    }

    let affinity = spec["sessionAffinity"].as_str().unwrap_or("None");
    match affinity {
        "None" => {
            if !spec["sessionAffinityConfig"].is_null()
                && spec["sessionAffinityConfig"] != json!({})
            {
                causes.push(Cause::forbidden(
                    "spec.sessionAffinityConfig",
                    "must not be set when session affinity is None",
                ));
            }
        }
        "ClientIP" => {
            let timeout = &spec["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"];
            if !timeout
                .as_i64()
                .is_some_and(|t| t > 0 && t <= MAX_AFFINITY_SECONDS)
            {
                causes.push(Cause::invalid(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    timeout.clone(),
                    &format!("must be greater than 0 and less than {MAX_AFFINITY_SECONDS}"),
                ));
            }
        }
        other => causes.push(unsupported(
            "spec.sessionAffinity",
            other,
            "\"ClientIP\", \"None\"",
        )),
    }

    causes.extend(super::families::validate_related_fields(svc));
    if headless && matches!(kind, "NodePort" | "LoadBalancer") {
        causes.push(Cause::invalid(
            "spec.clusterIPs[0]",
            cluster_ip,
            &format!("may not be set to 'None' for {kind} services"),
        ));
    }
    // Kubernetes' validateServiceExternalTrafficPolicy.
    let health_check = &spec["healthCheckNodePort"];
    let local = spec["externalTrafficPolicy"].as_str() == Some("Local");
    if health_check.as_i64().is_some_and(|p| p != 0) && !(kind == "LoadBalancer" && local) {
        causes.push(Cause::invalid(
            "spec.healthCheckNodePort",
            health_check.clone(),
            "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
        ));
    }
    if health_check
        .as_i64()
        .is_some_and(|p| !(0..=65535).contains(&p))
    {
        causes.push(Cause::invalid(
            "spec.healthCheckNodePort",
            health_check.clone(),
            "must be between 1 and 65535, inclusive",
        ));
    }
    match spec["externalTrafficPolicy"].as_str() {
        None | Some("Cluster") => {}
        Some("Local")
            if matches!(kind, "NodePort" | "LoadBalancer")
                || !spec["externalIPs"].as_array().is_none_or(Vec::is_empty) => {}
        Some("Local") => causes.push(Cause::invalid(
            "spec.externalTrafficPolicy",
            "Local",
            "may only be set for externally-accessible services",
        )),
        Some(other) => causes.push(unsupported(
            "spec.externalTrafficPolicy",
            other,
            "\"Cluster\", \"Local\"",
        )),
    }
    // Kubernetes' Service update: a Local LoadBalancer keeps its port.
    let local_lb = |s: &Value| {
        s["spec"]["type"].as_str() == Some("LoadBalancer")
            && s["spec"]["externalTrafficPolicy"].as_str() == Some("Local")
    };
    if let Some(old) = old.filter(|o| local_lb(o) && local_lb(svc)) {
        let before = old["spec"]["healthCheckNodePort"].as_i64().unwrap_or(0);
        if before != 0 && health_check.as_i64().unwrap_or(0) != before {
            causes.push(Cause::invalid(
                "spec.healthCheckNodePort",
                health_check.clone(),
                "cannot change healthCheckNodePort on loadBalancer service with externalTraffic=Local during update",
            ));
        }
    }
    match spec["internalTrafficPolicy"].as_str() {
        None | Some("Cluster") | Some("Local") => {}
        Some(other) => causes.push(unsupported(
            "spec.internalTrafficPolicy",
            other,
            "\"Cluster\", \"Local\"",
        )),
    }
    causes.extend(super::families::validate_external_name(svc));
    if kind == "ExternalName" {
        let external = spec["externalName"].as_str().unwrap_or("");
        if external.is_empty() {
            causes.push(Cause::required("spec.externalName", ""));
        } else {
            for problem in name::dns1123_subdomain(external.trim_end_matches('.')) {
                causes.push(Cause::invalid("spec.externalName", external, &problem));
            }
        }
    }
    for (i, ip) in spec["externalIPs"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .enumerate()
    {
        let text = ip.as_str().unwrap_or("");
        if !valid_ip(text) {
            causes.push(Cause::invalid(
                &format!("spec.externalIPs[{i}]"),
                text,
                IP_HINT,
            ));
        }
    }
    if let Some(lb_ip) = spec["loadBalancerIP"].as_str().filter(|ip| !ip.is_empty()) {
        if kind != "LoadBalancer" {
            causes.push(Cause::forbidden(
                "spec.loadBalancerIP",
                "may only be used when `type` is 'LoadBalancer'",
            ));
        } else if !valid_ip(lb_ip) {
            causes.push(Cause::invalid("spec.loadBalancerIP", lb_ip, IP_HINT));
        }
    }

    if let Some(old) = old {
        causes.extend(super::families::validate_update(svc, old));
    }
    causes
}

/// Why an endpoint address is not allowed (SPEC S7), if it is not.
fn special_ip(ip: IpAddr) -> Option<&'static str> {
    match ip {
        _ if ip.is_unspecified() => Some("may not be unspecified (0.0.0.0)"),
        _ if ip.is_loopback() => Some("may not be in the loopback range (127.0.0.0/8, ::1/128)"),
        IpAddr::V4(v4) if v4.is_link_local() => {
            Some("may not be in the link-local range (169.254.0.0/16, fe80::/10)")
        }
        IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => {
            Some("may not be in the link-local range (169.254.0.0/16, fe80::/10)")
        }
        IpAddr::V4(v4) if v4.octets()[..3] == [224, 0, 0] => {
            Some("may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)")
        }
        IpAddr::V6(v6)
            if (v6.segments()[0] & 0xffc0) == 0xff00 && (v6.segments()[0] & 0x000f) == 2 =>
        {
            Some("may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)")
        }
        _ => None,
    }
}

/// Problems with an Endpoints object (addresses and ports).
pub fn validate_endpoints(endpoints: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    for (s, subset) in endpoints["subsets"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .enumerate()
    {
        for list in ["addresses", "notReadyAddresses"] {
            for (a, address) in subset[list]
                .as_array()
                .map_or(&[][..], Vec::as_slice)
                .iter()
                .enumerate()
            {
                let field = format!("subsets[{s}].{list}[{a}].ip");
                let text = address["ip"].as_str().unwrap_or("");
                match text.parse::<IpAddr>() {
                    Err(_) => causes.push(Cause::invalid(&field, text, IP_HINT)),
                    Ok(ip) => {
                        if let Some(problem) = special_ip(ip) {
                            causes.push(Cause::invalid(&field, text, problem));
                        }
                    }
                }
            }
        }
        let ports = subset["ports"].as_array().map_or(&[][..], Vec::as_slice);
        for (p, port) in ports.iter().enumerate() {
            let path = format!("subsets[{s}].ports[{p}]");
            port_range(&format!("{path}.port"), &port["port"], &mut causes);
            let protocol = port["protocol"].as_str().unwrap_or("TCP");
            if !matches!(protocol, "TCP" | "UDP" | "SCTP") {
                causes.push(unsupported(
                    &format!("{path}.protocol"),
                    protocol,
                    PROTOCOLS,
                ));
            }
            let port_name = port["name"].as_str().unwrap_or("");
            if port_name.is_empty() && ports.len() > 1 {
                causes.push(Cause::required(&format!("{path}.name"), ""));
            }
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(svc: Value) -> Vec<String> {
        validate(&svc, None).iter().map(Cause::display).collect()
    }

    #[test]
    fn traffic_policies_and_the_health_check_port() {
        let lb = |extra: Value| {
            let mut svc = json!({"spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                "ports": [{"name": "a", "port": 80, "protocol": "TCP"}]}});
            for (k, v) in extra.as_object().into_iter().flatten() {
                svc["spec"][k] = v.clone();
            }
            svc
        };
        assert!(messages(lb(json!({"healthCheckNodePort": 30001}))).is_empty());
        assert!(messages(lb(
            json!({"externalTrafficPolicy": "Cluster", "healthCheckNodePort": 30001})
        ))
        .iter()
        .any(|m| m
            .starts_with("spec.healthCheckNodePort: Invalid value: 30001: may only be set when")));
        assert!(messages(json!({"spec": {"externalTrafficPolicy": "Local", "ports": [{"name": "a", "port": 80, "protocol": "TCP"}]}}))
            .contains(&"spec.externalTrafficPolicy: Invalid value: \"Local\": may only be set for externally-accessible services".to_owned()));
        assert!(messages(lb(json!({"internalTrafficPolicy": "Nearby"})))
            .iter()
            .any(|m| m.starts_with("spec.internalTrafficPolicy: Unsupported value: \"Nearby\"")));
        let old = lb(json!({"healthCheckNodePort": 30001}));
        let changed = validate(&lb(json!({"healthCheckNodePort": 30002})), Some(&old));
        assert!(changed
            .iter()
            .any(|c| c.display().contains("cannot change healthCheckNodePort")));
        assert!(validate(&old, Some(&old)).is_empty());
    }

    #[test]
    fn ports() {
        let svc = json!({"spec": {"type": "ClusterIP", "ports": [
            {"port": 0, "protocol": "TCP", "targetPort": 80},
            {"name": "b", "port": 80, "protocol": "ICMP", "targetPort": "Bad_Name"}]}});
        let got = messages(svc);
        assert!(
            got.contains(&"spec.ports[0].name: Required value".to_owned()),
            "{got:?}"
        );
        assert!(got.contains(
            &"spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive"
                .to_owned()
        ));
        assert!(got.contains(&"spec.ports[1].protocol: Unsupported value: \"ICMP\": supported values: \"SCTP\", \"TCP\", \"UDP\"".to_owned()));
        assert!(got
            .iter()
            .any(|m| m.starts_with("spec.ports[1].targetPort: Invalid value: \"Bad_Name\"")));
        let dup = json!({"spec": {"ports": [{"name": "a", "port": 80, "protocol": "TCP"}, {"name": "a", "port": 80, "protocol": "TCP"}]}});
        let got = messages(dup);
        assert!(got.contains(&"spec.ports[1].name: Duplicate value: \"a\"".to_owned()));
        assert!(got
            .iter()
            .any(|m| m.starts_with("spec.ports[1]: Duplicate value: core.ServicePort{")));
        assert!(
            messages(json!({"spec": {"ports": [{"port": 80, "nodePort": 30000}]}})).contains(
                &"spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"
                    .to_owned()
            )
        );
        assert!(messages(json!({"spec": {"type": "ClusterIP"}}))
            .contains(&"spec.ports: Required value".to_owned()));
        assert!(
            messages(json!({"spec": {"clusterIP": "None", "clusterIPs": ["None"]}})).is_empty(),
            "headless needs no ports"
        );
    }

    #[test]
    fn types_addresses_affinity() {
        assert!(
            messages(json!({"spec": {"type": "Bogus", "ports": [{"port": 1}]}}))[0]
                .starts_with("spec.type: Unsupported value: \"Bogus\"")
        );
        assert!(
            messages(json!({"spec": {"ports": [{"port": 1}], "externalIPs": ["nope"]}}))[0]
                .starts_with("spec.externalIPs[0]: Invalid value: \"nope\"")
        );
        assert_eq!(
            messages(json!({"spec": {"ports": [{"port": 1}], "loadBalancerIP": "1.2.3.4"}})),
            ["spec.loadBalancerIP: Forbidden: may only be used when `type` is 'LoadBalancer'"]
        );
        let affinity = json!({"spec": {"ports": [{"port": 1}], "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86401}}}});
        assert_eq!(messages(affinity), ["spec.sessionAffinityConfig.clientIP.timeoutSeconds: Invalid value: 86401: must be greater than 0 and less than 86400"]);
        assert_eq!(
            messages(json!({"spec": {"type": "ExternalName"}})),
            ["spec.externalName: Required value"]
        );
        assert!(messages(json!({"spec": {"type": "NodePort", "clusterIP": "None", "ports": [{"port": 1}]}}))
            .contains(&"spec.clusterIPs[0]: Invalid value: \"None\": may not be set to 'None' for NodePort services".to_owned()));
    }

    #[test]
    fn cluster_ip_is_immutable() {
        let old = json!({"spec": {"clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5"], "ports": [{"port": 1}]}});
        let new = json!({"spec": {"clusterIP": "10.96.0.6", "clusterIPs": ["10.96.0.6"], "ports": [{"port": 1}]}});
        let got: Vec<String> = validate(&new, Some(&old))
            .iter()
            .map(Cause::display)
            .collect();
        assert_eq!(got, ["spec.clusterIPs[0]: Invalid value: []string{\"10.96.0.6\"}: may not change once set"]);
    }

    #[test]
    fn endpoint_addresses() {
        let ep = json!({"subsets": [{"addresses": [{"ip": "127.0.0.1"}, {"ip": "169.254.1.1"}, {"ip": "224.0.0.5"}, {"ip": "10.244.0.5"}], "ports": [{"port": 80}]}]});
        let got: Vec<String> = validate_endpoints(&ep).iter().map(Cause::display).collect();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0], "subsets[0].addresses[0].ip: Invalid value: \"127.0.0.1\": may not be in the loopback range (127.0.0.0/8, ::1/128)");
    }
}
