//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`): the
//! `k8s\0` magic, then a `runtime.Unknown` envelope around the object's
//! protobuf encoding. kubectl's typed `create` commands send these (e.g.
//! `kubectl create service`). Decoded with `k8s-pb` and turned into the same
//! JSON form the rest of the server handles; kinds without a conversion
//! here are refused with 415, so the client can tell.

use std::collections::BTreeMap;

use k8s_pb::api::core::v1 as pb;
use k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::{json, Map, Value};

use crate::decode::DecodeError;
use crate::resource::Resource;

const MAGIC: &[u8] = b"k8s\0";

/// Decodes a protobuf body as an object of `resource`.
pub fn decode(resource: &Resource, body: &[u8]) -> Result<Value, DecodeError> {
    let envelope = body.strip_prefix(MAGIC).ok_or_else(|| {
        DecodeError::Malformed("protobuf body does not start with the k8s magic".into())
    })?;
    let unknown = Unknown::decode(envelope)
        .map_err(|e| DecodeError::Malformed(format!("protobuf envelope: {e}")))?;
    if let Some(encoding) = unknown
        .content_encoding
        .as_deref()
        .filter(|e| !e.is_empty())
    {
        return Err(DecodeError::Malformed(format!(
            "unsupported content encoding {encoding:?}"
        )));
    }
    let type_meta = unknown.type_meta.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    if !kind.is_empty() && kind != resource.kind_name {
        return Err(DecodeError::WrongKind(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            resource.kind_name
        )));
    }
    let raw = unknown.raw.unwrap_or_default();
    let Some(decode_raw) = resource.definition().protobuf else {
        return Err(DecodeError::Unsupported(format!(
            "protobuf bodies for {} are not supported; send JSON",
            resource.kind_name
        )));
    };
    let mut object = decode_raw(&raw)
        .map_err(|e| DecodeError::Malformed(format!("protobuf {}: {e}", resource.kind_name)))?;
    object["apiVersion"] = json!(resource.api_version());
    object["kind"] = json!(resource.kind_name);
    Ok(object)
}

/// Inserts `value` unless it is absent or empty, as JSON omits empty fields.
fn put(map: &mut Map<String, Value>, key: &str, value: impl Into<Value>) {
    match value.into() {
        Value::Null => {}
        Value::String(s) if s.is_empty() => {}
        Value::Array(a) if a.is_empty() => {}
        Value::Object(o) if o.is_empty() => {}
        value => {
            map.insert(key.into(), value);
        }
    }
}

fn string_map(map: BTreeMap<String, String>) -> Value {
    Value::Object(
        map.into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect(),
    )
}

fn metadata(meta: Option<ObjectMeta>) -> Value {
    let meta = meta.unwrap_or_default();
    let mut out = Map::new();
    put(&mut out, "name", meta.name);
    put(&mut out, "generateName", meta.generate_name);
    put(&mut out, "namespace", meta.namespace);
    put(&mut out, "resourceVersion", meta.resource_version);
    put(&mut out, "uid", meta.uid);
    put(&mut out, "labels", string_map(meta.labels));
    put(&mut out, "annotations", string_map(meta.annotations));
    put(&mut out, "finalizers", meta.finalizers);
    Value::Object(out)
}

fn int_or_string(value: IntOrString) -> Value {
    match (value.r#type, value.int_val, value.str_val) {
        (Some(1), _, Some(s)) => json!(s),
        (_, Some(i), _) => json!(i),
        (_, None, Some(s)) => json!(s),
        _ => json!(0),
    }
}

/// A Service's protobuf bytes as its JSON object.
pub(crate) fn service(raw: &[u8]) -> Result<Value, String> {
    let service = pb::Service::decode(raw).map_err(|e| e.to_string())?;
    let spec = service.spec.unwrap_or_default();
    let mut s = Map::new();
    let ports: Vec<Value> = spec
        .ports
        .into_iter()
        .map(|p| {
            let mut port = Map::new();
            put(&mut port, "name", p.name);
            put(&mut port, "protocol", p.protocol);
            put(&mut port, "appProtocol", p.app_protocol);
            put(&mut port, "port", p.port);
            put(&mut port, "targetPort", p.target_port.map(int_or_string));
            put(&mut port, "nodePort", p.node_port.filter(|n| *n != 0));
            Value::Object(port)
        })
        .collect();
    put(&mut s, "ports", ports);
    put(&mut s, "selector", string_map(spec.selector));
    put(&mut s, "clusterIP", spec.cluster_ip);
    put(&mut s, "clusterIPs", spec.cluster_ips);
    put(&mut s, "type", spec.r#type);
    put(&mut s, "externalIPs", spec.external_ips);
    put(&mut s, "sessionAffinity", spec.session_affinity);
    put(&mut s, "loadBalancerIP", spec.load_balancer_ip);
    put(
        &mut s,
        "loadBalancerSourceRanges",
        spec.load_balancer_source_ranges,
    );
    put(&mut s, "externalName", spec.external_name);
    put(
        &mut s,
        "externalTrafficPolicy",
        spec.external_traffic_policy,
    );
    put(
        &mut s,
        "healthCheckNodePort",
        spec.health_check_node_port.filter(|n| *n != 0),
    );
    // A plain `bool` with omitempty upstream: false is not written.
    put(
        &mut s,
        "publishNotReadyAddresses",
        spec.publish_not_ready_addresses.filter(|p| *p),
    );
    if let Some(timeout) = spec
        .session_affinity_config
        .and_then(|c| c.client_ip)
        .and_then(|c| c.timeout_seconds)
    {
        s.insert(
            "sessionAffinityConfig".into(),
            json!({"clientIP": {"timeoutSeconds": timeout}}),
        );
    }
    put(&mut s, "ipFamilies", spec.ip_families);
    put(&mut s, "ipFamilyPolicy", spec.ip_family_policy);
    put(
        &mut s,
        "allocateLoadBalancerNodePorts",
        spec.allocate_load_balancer_node_ports,
    );
    put(&mut s, "loadBalancerClass", spec.load_balancer_class);
    put(
        &mut s,
        "internalTrafficPolicy",
        spec.internal_traffic_policy,
    );
    put(&mut s, "trafficDistribution", spec.traffic_distribution);
    Ok(json!({"metadata": metadata(service.metadata), "spec": s}))
}

/// A Namespace's protobuf bytes as its JSON object.
pub(crate) fn namespace(raw: &[u8]) -> Result<Value, String> {
    let namespace = pb::Namespace::decode(raw).map_err(|e| e.to_string())?;
    let finalizers = namespace.spec.map(|s| s.finalizers).unwrap_or_default();
    Ok(json!({"metadata": metadata(namespace.metadata), "spec": {"finalizers": finalizers}}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Kind;
    use k8s_pb::apimachinery::pkg::runtime::TypeMeta;

    fn envelope(kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some("v1".into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [MAGIC.to_vec(), unknown.encode_to_vec()].concat()
    }

    #[test]
    fn service_as_kubectl_create_sends_it() {
        let service = pb::Service {
            metadata: Some(ObjectMeta {
                name: Some("foo".into()),
                labels: [("app".to_owned(), "foo".to_owned())].into(),
                ..ObjectMeta::default()
            }),
            spec: Some(pb::ServiceSpec {
                ports: vec![pb::ServicePort {
                    name: Some("5678-8080".into()),
                    protocol: Some("TCP".into()),
                    port: Some(5678),
                    target_port: Some(IntOrString {
                        r#type: Some(0),
                        int_val: Some(8080),
                        str_val: Some(String::new()),
                    }),
                    ..pb::ServicePort::default()
                }],
                selector: [("app".to_owned(), "foo".to_owned())].into(),
                r#type: Some("ClusterIP".into()),
                ..pb::ServiceSpec::default()
            }),
            status: None,
        };
        let body = envelope("Service", service.encode_to_vec());
        let object = decode(Resource::of(Kind::Service), &body).unwrap();
        assert_eq!(object["metadata"]["name"], "foo");
        assert_eq!(
            object["spec"]["ports"][0],
            json!({"name": "5678-8080", "protocol": "TCP", "port": 5678, "targetPort": 8080})
        );
        assert_eq!(object["spec"]["type"], "ClusterIP");
        assert_eq!(object["kind"], "Service");
    }

    #[test]
    fn bad_bodies_are_errors() {
        let svc = Resource::of(Kind::Service);
        assert!(decode(svc, b"not k8s").is_err());
        assert!(decode(svc, b"k8s\0\xff\xff\xff").is_err());
        assert!(matches!(
            decode(svc, &envelope("Pod", vec![])),
            Err(DecodeError::WrongKind(_))
        ));
        assert!(matches!(
            decode(Resource::of(Kind::Pod), &envelope("Pod", vec![])),
            Err(DecodeError::Unsupported(_))
        ));
    }
}
