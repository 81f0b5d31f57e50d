//! ControllerRevisions (`apps/v1`): an immutable snapshot of a DaemonSet's
//! (or StatefulSet's) pod template, numbered, which `kubectl rollout
//! history` lists and `rollout undo` applies back.

use serde_json::{json, Value};

use super::{nothing, replace_lists};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("apps", "ControllerRevision");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "controllerrevisions",
    singular: "controllerrevision",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &[],
    categories: &[],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::apps::v1::ControllerRevision>,
    openapi_schema: openapi_schema::<k8s_openapi::api::apps::v1::ControllerRevision>,
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

/// A revision number ≥ 0 and data that never changes (upstream's
/// `ValidateControllerRevision` and its update rule).
fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    if object["revision"].as_i64().is_some_and(|r| r < 0) {
        causes.push(Cause::invalid(
            "revision",
            object["revision"].clone(),
            "must be greater than or equal to 0",
        ));
    }
    if object["data"].is_null() {
        causes.push(Cause::required("data", ""));
    }
    if let Some(old) = old {
        if old["data"] != object["data"] {
            causes.push(Cause::forbidden("data", "field is immutable"));
        }
    }
    causes
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        col("Controller", "Controller of the object.", 0),
        Column {
            kind: "integer",
            ..col("Revision", "Revision of the ControllerRevision.", 0)
        },
        AGE,
    ]
}

/// `daemonset.apps/web` for its controller, as kubectl shows it.
fn cells(object: &Value, now: i64) -> Vec<Value> {
    let owners = arr(object, &["metadata", "ownerReferences"]);
    let controller = owners
        .iter()
        .find(|o| o["controller"] == true)
        .map(|o| {
            let kind = o["kind"].as_str().unwrap_or("").to_lowercase();
            let group = o["apiVersion"]
                .as_str()
                .and_then(|v| v.split_once('/'))
                .map(|(g, _)| format!(".{g}"))
                .unwrap_or_default();
            format!("{kind}{group}/{}", o["name"].as_str().unwrap_or(""))
        })
        .unwrap_or_else(|| "<none>".into());
    vec![
        name(object),
        json!(controller),
        json!(object["revision"].as_i64().unwrap_or(0)),
        age(object, now),
    ]
}
