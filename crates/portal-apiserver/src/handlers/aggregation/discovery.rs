//! The groups of remote APIServices in this server's discovery: listed in
//! `/apis` (groups by `groupPriorityMinimum`, versions by
//! `versionPriority`, highest first, as kube-aggregator orders them),
//! answered at `/apis/<group>`, and in the aggregated documents with the
//! resources their extension servers last reported (`Stale` while one
//! does not answer). `/apis/<group>/<version>` itself is proxied.

use serde_json::{json, Value};

use crate::handlers::discovery::{aggregated_group_of, api_group};
use crate::ApiState;

/// Each remote group with its versions, in discovery order.
fn remote_groups(state: &ApiState) -> Vec<(String, Vec<(String, String)>)> {
    let mut entries: Vec<(i64, String, i64, String, String)> = super::api_services(state)
        .iter()
        .filter(|a| a["spec"]["service"].is_object())
        .filter_map(|a| {
            let spec = &a["spec"];
            let group = spec["group"].as_str().filter(|g| !g.is_empty())?;
            Some((
                spec["groupPriorityMinimum"].as_i64().unwrap_or(0),
                group.to_owned(),
                spec["versionPriority"].as_i64().unwrap_or(0),
                spec["version"].as_str().unwrap_or("").to_owned(),
                a["metadata"]["name"].as_str().unwrap_or("").to_owned(),
            ))
        })
        .collect();
    entries.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then_with(|| a.1.cmp(&b.1))
            .then_with(|| b.2.cmp(&a.2))
            .then_with(|| a.3.cmp(&b.3))
    });
    let mut groups: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for (_, group, _, version, name) in entries {
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, versions)) => versions.push((version, name)),
            None => groups.push((group, vec![(version, name)])),
        }
    }
    groups
}

/// `/apis` with the remote groups (a version of a group also served here
/// joins that group's entry).
pub(crate) fn extend_group_list(state: &ApiState, list: &mut Value) {
    let Some(listed) = list["groups"].as_array_mut() else {
        return;
    };
    for (group, versions) in remote_groups(state) {
        let names: Vec<&str> = versions.iter().map(|(v, _)| v.as_str()).collect();
        match listed.iter_mut().find(|g| g["name"] == group.as_str()) {
            Some(entry) => {
                if let Some(known) = entry["versions"].as_array_mut() {
                    for version in names {
                        if !known.iter().any(|v| v["version"] == version) {
                            known.push(json!({"groupVersion": format!("{group}/{version}"), "version": version}));
                        }
                    }
                }
            }
            None => listed.push(api_group(&group, &names)),
        }
    }
}

/// `/apis/<group>` of a group only extension servers serve.
pub(crate) fn group(state: &ApiState, name: &str) -> Option<Value> {
    let (group, versions) = remote_groups(state).into_iter().find(|(g, _)| g == name)?;
    let names: Vec<&str> = versions.iter().map(|(v, _)| v.as_str()).collect();
    let mut value = api_group(&group, &names);
    value["kind"] = json!("APIGroup");
    value["apiVersion"] = json!("v1");
    Some(value)
}

/// The aggregated `/apis` with the remote groups.
pub(crate) fn extend_aggregated(state: &ApiState, document: &mut Value) {
    let Some(items) = document["items"].as_array_mut() else {
        return;
    };
    for (group, versions) in remote_groups(state) {
        let known: Vec<(&str, Option<Value>, bool)> = versions
            .iter()
            .map(|(version, name)| {
                let remote = state.aggregator.remote(name).unwrap_or_default();
                (version.as_str(), remote.resources, remote.current)
            })
            .collect();
        let entry = aggregated_group_of(&group, &known);
        match items
            .iter_mut()
            .find(|g| g["metadata"]["name"] == group.as_str())
        {
            Some(existing) => {
                if let (Some(listed), Some(more)) = (
                    existing["versions"].as_array_mut(),
                    entry["versions"].as_array(),
                ) {
                    listed.extend(more.iter().cloned());
                }
            }
            None => items.push(entry),
        }
    }
}
