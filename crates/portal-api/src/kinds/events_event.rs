//! Events of `events.k8s.io/v1`: the same objects as core Events (one
//! store key, one watch cache), seen with the newer field names, as
//! Kubernetes serves them — `regarding` is `involvedObject`, `note` is
//! `message`, `reportingController` is `reportingComponent`, the
//! `deprecated*` fields are the core ones. Writes are checked as upstream
//! checks events.k8s.io Events (eventTime, action, reason, reporting
//! controller and instance required) and stored as core Events.

use serde_json::{Map, Value};

use super::event;
use crate::schema::{
    openapi_schema, typed, Column, DecodeError, Decoded, Defined, Generation, Kind, ListStrategy,
    NameRule, Resource, ScalePaths,
};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("events.k8s.io", "Event");

/// Field names of events.k8s.io/v1 and of core/v1, where they differ.
const RENAMED: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

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
    decode: typed::<k8s_openapi::api::events::v1::Event>,
    openapi_schema: openapi_schema::<k8s_openapi::api::events::v1::Event>,
    defaults: super::nothing,
    validate,
    prepare_create: super::nothing,
    kept_on_update: &[],
    generation: Generation::Untracked,
    create_on_update: true,
    selectable_fields: &[
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "regarding.apiVersion",
        "regarding.resourceVersion",
        "regarding.fieldPath",
        "reason",
        "reportingController",
        "type",
    ],
    // Selectors and tables read the stored (core) form.
    field_paths: &[
        ("regarding.kind", "involvedObject.kind"),
        ("regarding.namespace", "involvedObject.namespace"),
        ("regarding.name", "involvedObject.name"),
        ("regarding.uid", "involvedObject.uid"),
        ("regarding.apiVersion", "involvedObject.apiVersion"),
        (
            "regarding.resourceVersion",
            "involvedObject.resourceVersion",
        ),
        ("regarding.fieldPath", "involvedObject.fieldPath"),
        ("reportingController", "reportingComponent"),
    ],
    field_defaults: &[],
    own_list_strategy: super::replace_lists,
    list_map_keys: &[],
    columns: Vec::new,
    cells: |_, _| Vec::new(),
    custom: Some(&VIEW),
    subresources: &[],
};

/// The events.k8s.io view of core Events.
#[derive(Debug)]
struct View;

static VIEW: View = View;

impl Defined for View {
    fn decode(&self, object: Value) -> Result<Decoded, DecodeError> {
        typed::<k8s_openapi::api::events::v1::Event>(object)
    }

    fn defaults(&self, _object: &mut Value) {}

    fn validate(&self, object: &Value, old: Option<&Value>) -> Vec<Cause> {
        validate(object, old)
    }

    // Tables read what the cache holds, the core form.
    fn columns(&self) -> Vec<Column> {
        (event::RESOURCE.columns)()
    }

    fn cells(&self, object: &Value, now: i64) -> Vec<Value> {
        (event::RESOURCE.cells)(object, now)
    }

    /// `Null`: the typed schema of the function hook serves.
    fn openapi_schema(&self) -> Value {
        Value::Null
    }

    fn list_strategy(&self, _path: &[&str]) -> ListStrategy {
        ListStrategy::Replace
    }

    fn list_map_keys(&self, _path: &[&str]) -> Option<&'static [&'static str]> {
        None
    }

    fn scale(&self) -> Option<&ScalePaths> {
        None
    }

    fn storage_version(&self) -> &'static str {
        "v1"
    }

    fn stored_as(&self) -> Option<&'static Resource> {
        Some(&event::RESOURCE)
    }

    fn to_version(&self, _resource: &Resource, object: &mut Value) -> bool {
        if object["apiVersion"] == "events.k8s.io/v1" {
            return false;
        }
        rename(object, false);
        object["apiVersion"] = Value::from("events.k8s.io/v1");
        true
    }

    fn to_storage(&self, _resource: &Resource, object: &mut Value) {
        rename(object, true);
        object["apiVersion"] = Value::from("v1");
    }

    fn strategic_merge(&self) -> bool {
        true
    }

    fn user_defined(&self) -> bool {
        false
    }
}

/// Renames the top-level fields of `object` from their events.k8s.io names
/// to their core ones (`to_core`), or back.
fn rename(object: &mut Value, to_core: bool) {
    let Some(map) = object.as_object_mut() else {
        return;
    };
    let mut renamed = Map::new();
    for &(new, old) in RENAMED {
        let (from, to) = if to_core { (new, old) } else { (old, new) };
        if let Some(value) = map.remove(from) {
            renamed.insert(to.to_owned(), value);
        }
    }
    map.extend(renamed);
}

/// Upstream's `ValidateEventCreate` for events.k8s.io/v1.
fn validate(object: &Value, _old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let text = |field: &str| object[field].as_str().unwrap_or("");
    if object["eventTime"].is_null() {
        causes.push(Cause::required("eventTime", ""));
    }
    for (field, max) in [
        ("reportingController", 0),
        ("reportingInstance", 128),
        ("action", 128),
        ("reason", 128),
    ] {
        let value = text(field);
        if value.is_empty() {
            causes.push(Cause::required(field, ""));
        } else if max > 0 && value.len() > max {
            causes.push(Cause::too_long(field, max));
        }
    }
    let controller = text("reportingController");
    if !controller.is_empty() {
        for problem in crate::name::qualified_name(controller) {
            causes.push(Cause::invalid("reportingController", controller, &problem));
        }
    }
    match text("type") {
        "Normal" | "Warning" => {}
        other => causes.push(Cause::unsupported("type", other, &["Normal", "Warning"])),
    }
    if text("note").len() > 1024 {
        causes.push(Cause::too_long("note", 1024));
    }
    if let Some(count) = object["series"]["count"].as_i64() {
        if count < 2 {
            causes.push(Cause::invalid(
                "series.count",
                count,
                "should be at least 2",
            ));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_same_event_both_ways() {
        let new = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "eventTime": "2026-11-27T00:00:00.000000Z", "reportingController": "example.com/ctl",
            "reportingInstance": "ctl-1", "action": "Sync", "reason": "Synced", "type": "Normal",
            "note": "all good", "regarding": {"kind": "Pod", "name": "p"}});
        assert!(validate(&new, None).is_empty());
        let mut stored = new.clone();
        VIEW.to_storage(&RESOURCE, &mut stored);
        assert_eq!(stored["apiVersion"], "v1");
        assert_eq!(stored["message"], "all good");
        assert_eq!(stored["involvedObject"]["name"], "p");
        assert_eq!(stored["reportingComponent"], "example.com/ctl");
        assert!(stored.get("note").is_none());
        let mut seen = stored.clone();
        assert!(VIEW.to_version(&RESOURCE, &mut seen));
        assert_eq!(seen, new);
        let causes: Vec<_> = validate(&json!({"type": "Odd"}), None)
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(
            causes,
            [
                "eventTime",
                "reportingController",
                "reportingInstance",
                "action",
                "reason",
                "type"
            ]
        );
    }
}
