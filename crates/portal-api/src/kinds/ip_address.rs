//! IPAddresses (`networking.k8s.io/v1`, cluster-scoped): one object per
//! Service cluster IP, named by the address in canonical form, its
//! `parentRef` naming the Service. The allocator writes them in the same
//! transaction as the Service (they are its allocation records); a user
//! may also create one to keep an address from being handed out.

use serde_json::{json, Value};

use super::{nothing, replace_lists};
use crate::name::{dns1123_subdomain, path_segment};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{Column, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("networking.k8s.io", "IPAddress");

/// The IP family of an address the allocator recorded.
pub const FAMILY_LABEL: &str = "ipaddress.kubernetes.io/ip-family";
/// Who made an IPAddress; the allocator's own are cleaned up by repair.
pub const MANAGED_BY_LABEL: &str = "ipaddress.kubernetes.io/managed-by";
/// The allocator's name in [`MANAGED_BY_LABEL`].
pub const ALLOCATOR: &str = "ipallocator.k8s.io";

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "ipaddresses",
    singular: "ipaddress",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &["ip"],
    categories: &[],
    has_status: false,
    name_rule: NameRule::IpAddress,
    decode: typed::<k8s_openapi::api::networking::v1::IPAddress>,
    openapi_schema: openapi_schema::<k8s_openapi::api::networking::v1::IPAddress>,
    defaults: nothing,
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

/// The object the allocator records for `ip` held by Service
/// `namespace/name` (metadata such as uid is the write path's to add).
pub fn for_service(ip: &str, family: &str, namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "IPAddress",
        "metadata": {
            "name": ip,
            "labels": {FAMILY_LABEL: family, MANAGED_BY_LABEL: ALLOCATOR},
        },
        "spec": {"parentRef": {"group": "", "resource": "services", "namespace": namespace, "name": name}},
    })
}

/// Upstream's `ValidateIPAddress` and `ValidateIPAddressUpdate`.
fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let parent = &object["spec"]["parentRef"];
    // Decoding fills a missing (required) reference with empty fields.
    let empty = |v: &Value| v.is_null() || v.as_str() == Some("");
    if parent.as_object().is_none_or(|p| p.values().all(empty)) {
        causes.push(Cause::required("spec.parentRef", ""));
        return causes;
    }
    let field = |name: &str| parent[name].as_str().unwrap_or("");
    if !field("group").is_empty() {
        for problem in dns1123_subdomain(field("group")) {
            causes.push(Cause::invalid(
                "spec.parentRef.group",
                field("group"),
                &problem,
            ));
        }
    }
    for (name, required) in [("resource", true), ("name", true), ("namespace", false)] {
        let path = format!("spec.parentRef.{name}");
        let value = field(name);
        if value.is_empty() {
            if required {
                causes.push(Cause::required(&path, ""));
            }
            continue;
        }
        for problem in path_segment(value) {
            causes.push(Cause::invalid(&path, value, &problem));
        }
    }
    if let Some(old) = old {
        // An empty field and a missing one are the same reference (Go
        // clients leave empty strings out).
        let fields = |p: &Value| {
            ["group", "resource", "namespace", "name"]
                .map(|f| p[f].as_str().unwrap_or("").to_owned())
        };
        if fields(&old["spec"]["parentRef"]) != fields(parent) {
            causes.push(Cause::invalid(
                "spec.parentRef",
                parent.clone(),
                "field is immutable",
            ));
        }
    }
    causes
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        crate::table::col("ParentRef", "The object the address belongs to.", 0),
    ]
}

/// `services/default/kubernetes`, as kubectl prints a parent reference.
fn cells(object: &Value, _now: i64) -> Vec<Value> {
    let parent = &object["spec"]["parentRef"];
    let shown = if parent.is_object() {
        let part = |name: &str| parent[name].as_str().unwrap_or("");
        let mut text = part("resource").to_lowercase();
        if !part("group").is_empty() {
            text = format!("{text}.{}", part("group").to_lowercase());
        }
        for part in [part("namespace"), part("name")] {
            if !part.is_empty() {
                text = format!("{text}/{part}");
            }
        }
        text
    } else {
        "<none>".to_owned()
    };
    vec![name(object), json!(shown)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta;

    fn messages(causes: &[Cause]) -> Vec<String> {
        causes.iter().map(Cause::display).collect()
    }

    #[test]
    fn names_are_canonical_addresses() {
        let named = |name: &str| {
            messages(&meta::validate(
                &RESOURCE,
                &for_service(name, "IPv6", "d", "s"),
            ))
        };
        assert!(named("2001:db8::1").is_empty());
        assert_eq!(
            named("2001:db8:0::1"),
            ["metadata.name: Invalid value: \"2001:db8:0::1\": must be in canonical form (\"2001:db8::1\")"]
        );
        assert_eq!(named("web").len(), 1);
    }

    #[test]
    fn parent_is_required_and_immutable() {
        let mut object = for_service("10.96.0.5", "IPv4", "default", "web");
        assert!(validate(&object, None).is_empty());
        let old = object.clone();
        object["spec"]["parentRef"]["name"] = json!("other");
        assert_eq!(
            messages(&validate(&object, Some(&old)))[0],
            "spec.parentRef: Invalid value: {\"group\":\"\",\"name\":\"other\",\"namespace\":\"default\",\"resource\":\"services\"}: field is immutable"
        );
        let mut same = old.clone();
        same["spec"]["parentRef"]
            .as_object_mut()
            .unwrap()
            .remove("group");
        assert!(
            validate(&same, Some(&old)).is_empty(),
            "no group is the empty group"
        );
        object["spec"]["parentRef"] = json!({"group": "", "name": "a/b"});
        assert_eq!(
            messages(&validate(&object, None)),
            [
                "spec.parentRef.resource: Required value",
                "spec.parentRef.name: Invalid value: \"a/b\": may not contain '/'"
            ]
        );
        assert_eq!(
            messages(&validate(&json!({"spec": {}}), None)),
            ["spec.parentRef: Required value"]
        );
    }

    #[test]
    fn printed_as_kubectl_does() {
        let object = for_service("10.96.0.1", "IPv4", "default", "kubernetes");
        assert_eq!(cells(&object, 0)[1], json!("services/default/kubernetes"));
        assert_eq!(
            cells(&json!({"metadata": {"name": "x"}}), 0)[1],
            json!("<none>")
        );
    }
}
