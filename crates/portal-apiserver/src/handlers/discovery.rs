//! Discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`)
//! and `/version`, derived from the resource table.

use portal_api::resources;

use crate::handlers::metrics;
use crate::handlers::review::REVIEWS;
use serde_json::{json, Value};

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/api`: the core group's versions.
pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

/// The named groups, each with its versions (the first preferred), in
/// the order their first kind was registered.
pub(crate) fn groups() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut groups: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    let served = resources()
        .filter(|r| !r.group.is_empty())
        .map(|r| (r.group, r.version))
        .chain(REVIEWS.iter().map(|(group, ..)| (*group, "v1")))
        .chain(std::iter::once((metrics::GROUP, metrics::VERSION)));
    for (group, version) in served {
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, versions)) if !versions.contains(&version) => versions.push(version),
            Some(_) => {}
            None => groups.push((group, vec![version])),
        }
    }
    groups
}

pub(crate) fn api_group(group: &str, versions: &[&str]) -> Value {
    let listed: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": listed, "preferredVersion": listed[0]})
}

/// `/apis`: every named group.
pub(crate) fn group_list() -> Value {
    let groups: Vec<Value> = groups()
        .iter()
        .map(|(group, versions)| api_group(group, versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`: one group and its versions; `None` for an unknown one.
pub(crate) fn group(name: &str) -> Option<Value> {
    let (group, versions) = groups().into_iter().find(|(g, _)| *g == name)?;
    let mut value = api_group(group, &versions);
    value["kind"] = json!("APIGroup");
    value["apiVersion"] = json!("v1");
    Some(value)
}

/// `/api/v1` or `/apis/<group>/<version>`; `None` for an unknown one.
pub(crate) fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in portal_api::resources().filter(|r| r.group == group && r.version == version) {
        resources.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind_name,
            "verbs": VERBS,
            "shortNames": r.short_names,
        }));
        if !r.categories.is_empty() {
            if let Some(entry) = resources.last_mut() {
                entry["categories"] = json!(r.categories);
            }
        }
        if r.has_status {
            resources.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind_name,
                "verbs": ["get", "patch", "update"],
            }));
        }
        for sub in r.subresources {
            let mut entry = json!({
                "name": format!("{}/{}", r.plural, sub.name),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": sub.kind,
                "verbs": sub.verbs,
            });
            if let Some((group, version)) = sub.group_version {
                entry["group"] = json!(group);
                entry["version"] = json!(version);
            }
            resources.push(entry);
        }
    }
    if version == "v1" {
        for (_, plural, kind, namespaced) in REVIEWS.iter().filter(|(g, ..)| *g == group) {
            resources.push(json!({
                "name": plural,
                "singularName": plural.trim_end_matches('s'),
                "namespaced": namespaced,
                "kind": kind,
                "verbs": ["create"],
            }));
        }
    }
    if group == metrics::GROUP && version == metrics::VERSION {
        for (plural, singular, kind, namespaced) in metrics::RESOURCES {
            resources.push(json!({
                "name": plural,
                "singularName": singular,
                "namespaced": namespaced,
                "kind": kind,
                "verbs": ["get", "list"],
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
    )
}

/// The aggregated discovery form a client asks for in `Accept`
/// (`application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`),
/// if it prefers one to the legacy documents: `v2` or `v2beta1`.
pub(crate) fn aggregated_version(accept: &str) -> Option<&'static str> {
    for range in accept.split(',') {
        let params: Vec<&str> = range.split(';').map(str::trim).collect();
        if params.contains(&"g=apidiscovery.k8s.io") {
            if !params.contains(&"as=APIGroupDiscoveryList") {
                continue;
            }
            if params.contains(&"v=v2") {
                return Some("v2");
            }
            if params.contains(&"v=v2beta1") {
                return Some("v2beta1");
            }
            continue;
        }
        // A plain JSON range first: the legacy documents.
        if matches!(params[0], "application/json" | "*/*" | "application/*") {
            return None;
        }
    }
    None
}

/// The media type of an aggregated discovery answer.
pub(crate) fn aggregated_media_type(version: &str) -> String {
    format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList")
}

/// `/api` (`core`) or `/apis` as one aggregated document: every group,
/// version and resource with its verbs and subresources, in one answer
/// (what kubectl ≥ 1.26 asks for first).
pub(crate) fn aggregated(core: bool, version: &str) -> Value {
    let items: Vec<Value> = if core {
        vec![aggregated_group("", &["v1"])]
    } else {
        groups()
            .iter()
            .map(|(group, versions)| aggregated_group(group, versions))
            .collect()
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": items,
    })
}

fn aggregated_group(group: &str, versions: &[&str]) -> Value {
    let versions: Vec<(&str, Option<Value>, bool)> = versions
        .iter()
        .map(|version| (*version, resource_list(group, version), true))
        .collect();
    aggregated_group_of(group, &versions)
}

/// One group in the aggregated form, from each version's legacy list
/// (`None`: not known yet) and whether that list is current (`Stale`
/// when an extension server did not answer its last check).
pub(crate) fn aggregated_group_of(group: &str, versions: &[(&str, Option<Value>, bool)]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|(version, list, current)| {
            let entries = list
                .as_ref()
                .and_then(|list| list["resources"].as_array().cloned())
                .unwrap_or_default();
            let resources: Vec<Value> = entries
                .iter()
                .filter(|r| !r["name"].as_str().unwrap_or("").contains('/'))
                .map(|r| aggregated_resource(group, version, r, &entries))
                .collect();
            let freshness = if *current { "Current" } else { "Stale" };
            json!({"version": version, "resources": resources, "freshness": freshness})
        })
        .collect();
    let mut metadata = json!({"creationTimestamp": null});
    if !group.is_empty() {
        metadata["name"] = json!(group);
    }
    json!({"metadata": metadata, "versions": versions})
}

/// One resource of a legacy list in the aggregated form, with its
/// subresources (the legacy list's `plural/sub` entries).
fn aggregated_resource(group: &str, version: &str, legacy: &Value, entries: &[Value]) -> Value {
    let plural = legacy["name"].as_str().unwrap_or("");
    let kind = |entry: &Value| {
        json!({
            "group": entry.get("group").cloned().unwrap_or(json!(group)),
            "version": entry.get("version").cloned().unwrap_or(json!(version)),
            "kind": entry["kind"],
        })
    };
    let subresources: Vec<Value> = entries
        .iter()
        .filter_map(|entry| {
            let name = entry["name"].as_str()?;
            let sub = name.strip_prefix(plural)?.strip_prefix('/')?;
            Some(json!({"subresource": sub, "responseKind": kind(entry), "verbs": entry["verbs"]}))
        })
        .collect();
    let mut resource = json!({
        "resource": plural,
        "responseKind": kind(legacy),
        "scope": if legacy["namespaced"] == true { "Namespaced" } else { "Cluster" },
        "singularResource": legacy["singularName"],
        "verbs": legacy["verbs"],
    });
    for field in ["shortNames", "categories"] {
        if legacy[field].as_array().is_some_and(|a| !a.is_empty()) {
            resource[field] = legacy[field].clone();
        }
    }
    if !subresources.is_empty() {
        resource["subresources"] = json!(subresources);
    }
    resource
}

/// `/version`: the Kubernetes version whose API Portal serves.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": format!("v1.33.0-portal.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_cover_every_resource() {
        let core = resource_list("", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert!(names.contains(&"services") && names.contains(&"services/status"));
        assert!(resource_list("discovery.k8s.io", "v1").is_some());
        assert!(resource_list("apps", "v1").is_some());
        assert!(
            resource_list("node.k8s.io", "v1").is_none(),
            "a group not served"
        );
        let reviews = resource_list("authorization.k8s.io", "v1").unwrap();
        assert_eq!(reviews["resources"][0]["verbs"], json!(["create"]));
        assert_eq!(group_list()["groups"][0]["name"], "apps");
        let autoscaling = group("autoscaling").unwrap();
        assert_eq!(
            autoscaling["preferredVersion"]["groupVersion"],
            "autoscaling/v2"
        );
        assert!(group("rbac.authorization.k8s.io").is_some());
        assert!(group("networking.k8s.io").is_some());
        assert!(group("node.k8s.io").is_none());
    }

    #[test]
    fn aggregated_documents() {
        let kubectl = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(aggregated_version(kubectl), Some("v2"));
        assert_eq!(aggregated_version("application/json"), None);
        assert_eq!(aggregated_version("application/json, application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"), None);
        let core = aggregated(true, "v2");
        assert_eq!(core["apiVersion"], "apidiscovery.k8s.io/v2");
        let v1 = &core["items"][0]["versions"][0];
        assert_eq!(v1["version"], "v1");
        let pods = v1["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "pods")
            .unwrap();
        assert_eq!(pods["scope"], "Namespaced");
        assert_eq!(pods["responseKind"]["kind"], "Pod");
        assert!(pods["subresources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["subresource"] == "status"));
        let apps = aggregated(false, "v2beta1");
        let names: Vec<_> = apps["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["metadata"]["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"apps") && names.contains(&"rbac.authorization.k8s.io"));
    }
}
