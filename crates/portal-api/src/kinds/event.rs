//! Events (`v1`): written blindly by components (a PUT creates), selected
//! by the object they are about, printed as `kubectl get events` does.

use serde_json::{json, Value};

use super::{no_validation, nothing, replace_lists};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, NAME};

/// The kind this module defines.
pub const KIND: Kind = Kind::new("", "Event");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "events",
    singular: "event",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["ev"],
    categories: &[],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::core::v1::Event>,
    openapi_schema: openapi_schema::<k8s_openapi::api::core::v1::Event>,
    defaults: nothing,
    validate: no_validation,
    prepare_create: nothing,
    kept_on_update: &[],
    generation: Generation::Untracked,
    create_on_update: true,
    selectable_fields: &[
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ],
    field_paths: &[("source", "source.component")],
    field_defaults: &[],
    own_list_strategy: replace_lists,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

fn columns() -> Vec<Column> {
    vec![
        col("Last Seen", "Time when last this event was observed.", 0),
        col("Type", "Type of this event (Normal, Warning).", 0),
        col("Reason", "Why the action was taken.", 0),
        col("Object", "The object that this event is about.", 0),
        col("Subobject", "The subobject that this event is about.", 1),
        col("Source", "The component reporting this event.", 1),
        col(
            "Message",
            "A human-readable description of the status of this operation.",
            0,
        ),
        col(
            "First Seen",
            "The time at which the event was first recorded.",
            1,
        ),
        col("Count", "The number of times this event has occurred.", 1),
        Column {
            priority: 1,
            ..NAME
        },
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    let last = s(object, &["lastTimestamp"])
        .or(s(object, &["eventTime"]))
        .or(s(object, &["firstTimestamp"]))
        .or(s(object, &["metadata", "creationTimestamp"]));
    let first = s(object, &["firstTimestamp"])
        .or(s(object, &["eventTime"]))
        .or(last);
    let involved = |f: &str| s(object, &["involvedObject", f]).unwrap_or("");
    let source = s(object, &["source", "component"])
        .or(s(object, &["reportingComponent"]))
        .unwrap_or("");
    let source = match s(object, &["source", "host"]) {
        Some(host) if !host.is_empty() => format!("{source}, {host}"),
        _ => source.to_owned(),
    };
    vec![
        json!(age_of(last, now)),
        json!(s(object, &["type"]).unwrap_or("")),
        json!(s(object, &["reason"]).unwrap_or("")),
        json!(format!(
            "{}/{}",
            involved("kind").to_ascii_lowercase(),
            involved("name")
        )),
        json!(involved("fieldPath")),
        json!(source),
        json!(s(object, &["message"]).unwrap_or("").trim()),
        json!(age_of(first, now)),
        json!(object
            .get("count")
            .and_then(Value::as_i64)
            .unwrap_or(1)
            .to_string()),
        name(object),
    ]
}
