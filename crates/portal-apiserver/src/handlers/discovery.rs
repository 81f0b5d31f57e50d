//! Discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`)
//! and `/version`, derived from the resource table.

use portal_api::resources;

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
fn groups() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut groups: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    let served = resources()
        .filter(|r| !r.group.is_empty())
        .map(|r| (r.group, r.version))
        .chain(REVIEWS.iter().map(|(group, ..)| (*group, "v1")));
    for (group, version) in served {
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, versions)) if !versions.contains(&version) => versions.push(version),
            Some(_) => {}
            None => groups.push((group, vec![version])),
        }
    }
    groups
}

fn api_group(group: &str, versions: &[&str]) -> Value {
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
            resource_list("networking.k8s.io", "v1").is_none(),
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
        assert!(group("networking.k8s.io").is_none());
    }
}
