//! APIServices (`apiregistration.k8s.io/v1`): who serves one API group
//! version. A local one (no `spec.service`) is this server's own; a
//! remote one names the Service of an extension API server, to which the
//! API server proxies the group's paths (API aggregation). Checked as
//! kube-aggregator's validation does; the `Available` condition is the
//! API server's to keep.

use serde_json::{json, Value};

use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("apiregistration.k8s.io", "APIService");

/// Marks the APIServices the server keeps itself: `onstart` (its own
/// groups, made at start) or `true` (kept in step, as CRDs' groups).
pub const AUTOMANAGED: &str = "kube-aggregator.kubernetes.io/automanaged";

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "apiservices",
    singular: "apiservice",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &[],
    categories: &["api-extensions"],
    has_status: true,
    // `v1.` names the core group: a path segment, checked further below.
    name_rule: NameRule::PathSegment,
    decode: typed::<k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService>,
    openapi_schema: openapi_schema::<
        k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService,
    >,
    defaults,
    validate,
    prepare_create,
    kept_on_update: &[],
    generation: Generation::Spec,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: super::conditions_by_type,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

/// A new APIService is not available until checked (as upstream, a
/// creator's `status` is dropped).
fn prepare_create(object: &mut Value) {
    object["status"] = json!({});
}

fn defaults(object: &mut Value) {
    let service = &mut object["spec"]["service"];
    if service.is_object() && service["port"].is_null() {
        service["port"] = json!(443);
    }
}

/// The name an APIService of `group` and `version` must have (`v1.` for
/// the core group).
pub fn name_of(group: &str, version: &str) -> String {
    format!("{version}.{group}")
}

fn validate(object: &Value, _old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = &object["spec"];
    let group = spec["group"].as_str().unwrap_or("");
    let version = spec["version"].as_str().unwrap_or("");
    let name = object["metadata"]["name"].as_str().unwrap_or("");
    let wanted = name_of(group, version);
    if name != wanted {
        causes.push(Cause::invalid(
            "metadata.name",
            name,
            &format!("must be `spec.version+\".\"+spec.group`: {wanted:?}"),
        ));
    }
    if group.is_empty() {
        if version != "v1" {
            causes.push(Cause::required(
                "spec.group",
                "only v1 may have an empty group and it better be legacy kube",
            ));
        }
    } else {
        for problem in crate::name::dns1123_subdomain(group) {
            causes.push(Cause::invalid("spec.group", group, &problem));
        }
    }
    for problem in crate::name::dns1035_label(version) {
        causes.push(Cause::invalid("spec.version", version, &problem));
    }
    let priority = |field: &str, max: i64| {
        let value = spec[field].as_i64().unwrap_or(0);
        (value <= 0 || value > max).then(|| {
            Cause::invalid(
                &format!("spec.{field}"),
                value,
                &format!("must be positive and less than {max}"),
            )
        })
    };
    causes.extend(priority("groupPriorityMinimum", 20_000));
    causes.extend(priority("versionPriority", 1_000));
    let bundle = spec["caBundle"].as_str().unwrap_or("");
    let insecure = spec["insecureSkipTLSVerify"] == true;
    let service = &spec["service"];
    if !service.is_object() {
        if !bundle.is_empty() {
            // Base64 on the wire: the bytes it stands for.
            let bytes = bundle.len() / 4 * 3;
            causes.push(Cause::invalid(
                "spec.caBundle",
                format!("{bytes} bytes"),
                "local APIServices may not have a caBundle",
            ));
        }
        if insecure {
            causes.push(Cause::invalid(
                "spec.insecureSkipTLSVerify",
                true,
                "local APIServices may not have insecureSkipTLSVerify",
            ));
        }
    } else {
        for field in ["namespace", "name"] {
            if service[field].as_str().unwrap_or("").is_empty() {
                causes.push(Cause::required(&format!("spec.service.{field}"), ""));
            }
        }
        let port = service["port"].as_i64().unwrap_or(0);
        if !(1..=65_535).contains(&port) {
            causes.push(Cause::invalid(
                "spec.service.port",
                port,
                "port is not valid: must be between 1 and 65535, inclusive",
            ));
        }
        if insecure && !bundle.is_empty() {
            causes.push(Cause::invalid(
                "spec.insecureSkipTLSVerify",
                true,
                "may not be true if caBundle is present",
            ));
        }
    }
    for (i, condition) in arr(object, &["status", "conditions"]).iter().enumerate() {
        let status = condition["status"].as_str().unwrap_or("");
        if !matches!(status, "True" | "False" | "Unknown") {
            causes.push(Cause::unsupported(
                &format!("status.conditions[{i}].status"),
                status,
                &["False", "True", "Unknown"],
            ));
        }
    }
    causes
}

fn columns() -> Vec<crate::table::Column> {
    vec![
        NAME,
        col("Service", "The service that serves this API version.", 0),
        col(
            "Available",
            "Whether this service is available to serve requests.",
            0,
        ),
        AGE,
    ]
}

/// `Local` or `NAMESPACE/NAME`; `True`, or `False (Reason)`.
fn cells(object: &Value, now: i64) -> Vec<Value> {
    let service = &object["spec"]["service"];
    let service = match (s(service, &["namespace"]), s(service, &["name"])) {
        (Some(namespace), Some(name)) => format!("{namespace}/{name}"),
        _ => "Local".to_owned(),
    };
    let available = arr(object, &["status", "conditions"])
        .iter()
        .find(|c| c["type"] == "Available")
        .map(|c| match (s(c, &["status"]), s(c, &["reason"])) {
            (Some("True"), _) => "True".to_owned(),
            (Some(status), Some(reason)) => format!("{status} ({reason})"),
            (Some(status), None) => status.to_owned(),
            _ => "Unknown".to_owned(),
        })
        .unwrap_or_else(|| "Unknown".to_owned());
    vec![
        name(object),
        json!(service),
        json!(available),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(object: Value) -> Vec<String> {
        validate(&object, None)
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn remote_and_local_api_services_are_checked() {
        let mut good = json!({"metadata": {"name": "v1beta1.metrics.k8s.io"}, "spec": {
            "group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
            "versionPriority": 100, "service": {"namespace": "kube-system", "name": "metrics-server"}}});
        defaults(&mut good);
        assert_eq!(good["spec"]["service"]["port"], 443);
        assert!(messages(good.clone()).is_empty());
        let core = json!({"metadata": {"name": "v1."}, "spec": {
            "group": "", "version": "v1", "groupPriorityMinimum": 18000, "versionPriority": 1}});
        assert!(messages(core).is_empty());
        let mut bad = good.clone();
        bad["metadata"]["name"] = json!("metrics");
        bad["spec"]["groupPriorityMinimum"] = json!(0);
        bad["spec"]["insecureSkipTLSVerify"] = json!(true);
        bad["spec"]["caBundle"] = json!("AAAA");
        bad["spec"]["service"]["name"] = json!("");
        let found = messages(bad).join("\n");
        for expected in [
            "metadata.name: Invalid value: \"metrics\": must be `spec.version+\".\"+spec.group`: \"v1beta1.metrics.k8s.io\"",
            "spec.groupPriorityMinimum: Invalid value: 0: must be positive and less than 20000",
            "spec.service.name: Required value",
            "spec.insecureSkipTLSVerify: Invalid value: true: may not be true if caBundle is present",
        ] {
            assert!(found.contains(expected), "{expected} not in\n{found}");
        }
        let local = json!({"metadata": {"name": "v2.example.com"}, "spec": {
            "group": "example.com", "version": "v2", "groupPriorityMinimum": 1,
            "versionPriority": 1, "caBundle": "AAAA"}});
        assert!(messages(local)[0].contains("local APIServices may not have a caBundle"));
        let mut claimed =
            json!({"status": {"conditions": [{"type": "Available", "status": "True"}]}});
        prepare_create(&mut claimed);
        assert_eq!(
            claimed["status"],
            json!({}),
            "a creator does not say it is available"
        );
    }
}
