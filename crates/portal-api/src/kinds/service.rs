//! Services: defaults (type, ports' target ports, traffic policies),
//! validation (`crate::service`), the server's empty load-balancer status,
//! protobuf bodies, and `kubectl get svc`'s columns. Address allocation is
//! the API server's (its `allocator`).

use serde_json::{json, Value};

use super::{Subresource, PROXY_VERBS};
use crate::defaults::{array_mut, default};
use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};

/// The kind this module defines.
pub const KIND: Kind = Kind::new("", "Service");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "services",
    singular: "service",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["svc"],
    categories: &["all"],
    has_status: true,
    name_rule: NameRule::Label1035,
    decode: typed::<k8s_openapi::api::core::v1::Service>,
    openapi_schema: openapi_schema::<k8s_openapi::api::core::v1::Service>,
    defaults,
    validate: crate::service::validate,
    prepare_create,
    kept_on_update: &[],
    generation: Generation::Untracked,
    create_on_update: false,
    selectable_fields: &["spec.clusterIP", "spec.type"],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: list_strategy,
    // Port numbers may be shared by TCP and UDP.
    list_map_keys: &[(&["spec", "ports"], &["port", "protocol"])],
    columns,
    cells,
    custom: None,
    subresources: &[Subresource {
        name: "proxy",
        kind: "ServiceProxyOptions",
        verbs: PROXY_VERBS,
        group_version: None,
    }],
};

fn prepare_create(object: &mut Value) {
    object["status"] = json!({"loadBalancer": {}});
}

fn list_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["spec", "ports"] => ListStrategy::MergeKey("port"),
        _ => ListStrategy::Replace,
    }
}

fn defaults(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    default(spec, "type", json!("ClusterIP"));
    let kind = spec["type"].as_str().unwrap_or("ClusterIP").to_owned();
    default(spec, "sessionAffinity", json!("None"));
    if spec["sessionAffinity"] == "ClientIP" {
        default(spec, "sessionAffinityConfig", json!({}));
        let config = &mut spec["sessionAffinityConfig"];
        default(config, "clientIP", json!({}));
        default(&mut config["clientIP"], "timeoutSeconds", json!(10800));
    }
    for port in array_mut(spec, "ports") {
        default(port, "protocol", json!("TCP"));
        let unset = match port.get("targetPort") {
            None | Some(Value::Null) => true,
            Some(Value::Number(n)) => n.as_i64() == Some(0),
            Some(Value::String(s)) => s.is_empty(),
            Some(_) => false,
        };
        if unset {
            let number = port.get("port").cloned().unwrap_or(Value::Null);
            port["targetPort"] = number;
        }
    }
    if kind != "ExternalName" {
        default(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    if kind == "NodePort" || kind == "LoadBalancer" {
        default(spec, "externalTrafficPolicy", json!("Cluster"));
    }
    if kind == "LoadBalancer" {
        default(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        col("Type", "The type of the service.", 0),
        col("Cluster-IP", "The cluster IP of the service.", 0),
        col("External-IP", "The external IPs of the service.", 0),
        col("Port(s)", "The ports the service exposes.", 0),
        AGE,
        col(
            "Selector",
            "Route service traffic to pods with label keys and values matching this selector.",
            1,
        ),
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    let kind = s(object, &["spec", "type"]).unwrap_or("ClusterIP");
    let cluster_ip = s(object, &["spec", "clusterIP"])
        .filter(|ip| !ip.is_empty())
        .unwrap_or(NONE);
    let external_ips: Vec<&str> = arr(object, &["spec", "externalIPs"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let external = match kind {
        "ExternalName" => s(object, &["spec", "externalName"])
            .unwrap_or("")
            .to_owned(),
        "LoadBalancer" => {
            let mut addresses: Vec<&str> = arr(object, &["status", "loadBalancer", "ingress"])
                .iter()
                .filter_map(|i| i.get("ip").or(i.get("hostname")).and_then(Value::as_str))
                .collect();
            addresses.extend(external_ips.iter().copied());
            if addresses.is_empty() {
                "<pending>".into()
            } else {
                addresses.join(",")
            }
        }
        _ => or_none(external_ips.join(",")),
    };
    let ports: Vec<String> = arr(object, &["spec", "ports"])
        .iter()
        .map(|p| {
            let port = int(p, &["port"]);
            let protocol = s(p, &["protocol"]).unwrap_or("TCP");
            match int(p, &["nodePort"]) {
                0 => format!("{port}/{protocol}"),
                node_port => format!("{port}:{node_port}/{protocol}"),
            }
        })
        .collect();
    vec![
        name(object),
        json!(kind),
        json!(cluster_ip),
        json!(external),
        json!(or_none(ports.join(","))),
        age(object, now),
        json!(or_none(format_labels(object.pointer("/spec/selector")))),
    ]
}
