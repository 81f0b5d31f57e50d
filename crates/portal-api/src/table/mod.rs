//! Server-side printing: the `meta.k8s.io/v1` `Table` that `kubectl get`
//! asks for, with the upstream columns of each kind (`kubectl get` shows
//! what the server prints). Pure functions of the object and the time.

mod cells;
mod duration;

use serde_json::{json, Value};

use crate::resource::{Kind, Resource};

pub use duration::human_duration;

/// One column: name, type, and priority (0 = always, 1 = `-o wide`).
#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub name: &'static str,
    pub kind: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    pub priority: u8,
}

const fn col(name: &'static str, description: &'static str, priority: u8) -> Column {
    Column {
        name,
        kind: "string",
        format: "",
        description,
        priority,
    }
}

const NAME: Column = Column {
    name: "Name",
    kind: "string",
    format: "name",
    description: "Name must be unique within a namespace.",
    priority: 0,
};
const AGE: Column = col(
    "Age",
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
    0,
);

/// The columns of a kind, in order.
pub fn columns(kind: Kind) -> Vec<Column> {
    match kind {
        Kind::Namespace => vec![NAME, col("Status", "The status of the namespace", 0), AGE],
        Kind::Pod => vec![
            NAME,
            col(
                "Ready",
                "The aggregate readiness state of this pod for accepting traffic.",
                0,
            ),
            col(
                "Status",
                "The aggregate status of the containers in this pod.",
                0,
            ),
            Column {
                kind: "string",
                ..col(
                    "Restarts",
                    "The number of times the containers in this pod have been restarted.",
                    0,
                )
            },
            AGE,
            col("IP", "IP address allocated to the pod.", 1),
            col("Node", "Name of the node the pod is assigned to.", 1),
            col(
                "Nominated Node",
                "Name of the node where the pod is nominated.",
                1,
            ),
            col("Readiness Gates", "Pod readiness gates.", 1),
        ],
        Kind::Service => vec![
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
        ],
        Kind::Endpoints => vec![NAME, col("Endpoints", "Endpoints of the service.", 0), AGE],
        Kind::ReplicationController => vec![
            NAME,
            Column {
                kind: "integer",
                ..col("Desired", "Number of desired pods.", 0)
            },
            Column {
                kind: "integer",
                ..col("Current", "Number of actually running pods.", 0)
            },
            Column {
                kind: "integer",
                ..col("Ready", "Number of pods ready.", 0)
            },
            AGE,
            col("Containers", "Names of each container in the template.", 1),
            col(
                "Images",
                "Images referenced by each container in the template.",
                1,
            ),
            col("Selector", "Label selector for pods.", 1),
        ],
        Kind::Node => vec![
            NAME,
            col("Status", "The status of the node", 0),
            col("Roles", "The roles of the node", 0),
            AGE,
            col("Version", "Kubelet Version reported by the node.", 0),
            col("Internal-IP", "List of internal IPs.", 1),
            col("External-IP", "List of external IPs.", 1),
            col("OS-Image", "OS image reported by the node.", 1),
            col("Kernel-Version", "Kernel version reported by the node.", 1),
            col(
                "Container-Runtime",
                "Container runtime reported by the node.",
                1,
            ),
        ],
        Kind::Event => vec![
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
        ],
        Kind::EndpointSlice => vec![
            NAME,
            col("AddressType", "The IP protocol for this slice.", 0),
            col("Ports", "Enumerated ports on this slice.", 0),
            col("Endpoints", "Addresses of the endpoints in this slice.", 0),
            AGE,
        ],
        Kind::Lease => vec![NAME, col("Holder", "The holder of the lease.", 0), AGE],
    }
}

/// The cells of one object's row, matching [`columns`].
pub fn cells(kind: Kind, object: &Value, now: i64) -> Vec<Value> {
    cells::row(kind, object, now)
}

fn column_json(column: &Column) -> Value {
    json!({
        "name": column.name,
        "type": column.kind,
        "format": column.format,
        "description": column.description,
        "priority": column.priority,
    })
}

/// `rows[].object`: the object's metadata only (`includeObject=Metadata`,
/// the default), enough for `-A` and `--show-labels`.
pub fn partial_metadata(object: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// What `rows[].object` carries (`includeObject=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(other) => Err(format!(
                "includeObject {other:?} must be None, Metadata or Object"
            )),
        }
    }
}

/// A `Table` of `objects` at list revision `resource_version`.
pub fn table<'a>(
    resource: &Resource,
    objects: impl IntoIterator<Item = &'a Value>,
    now: i64,
    include: IncludeObject,
    list_meta: Value,
) -> Value {
    let rows: Vec<Value> = objects
        .into_iter()
        .map(|object| {
            let mut row = json!({"cells": cells(resource.kind, object, now)});
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => row["object"] = partial_metadata(object),
                IncludeObject::Object => row["object"] = object.clone(),
            }
            row
        })
        .collect();
    let mut table = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "columnDefinitions": columns(resource.kind).iter().map(column_json).collect::<Vec<_>>(),
        "rows": rows,
    });
    table["metadata"] = list_meta;
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_fits_its_columns() {
        let empty = json!({"metadata": {"name": "x", "creationTimestamp": "2026-01-01T00:00:00Z"}});
        for resource in crate::RESOURCES {
            assert_eq!(
                cells(resource.kind, &empty, 0).len(),
                columns(resource.kind).len(),
                "{:?}",
                resource.kind
            );
        }
    }

    #[test]
    fn table_shape() {
        let svc = json!({"metadata": {"name": "web", "labels": {"a": "b"}}, "spec": {"clusterIP": "10.0.0.11"}});
        let t = table(
            Resource::of(Kind::Service),
            [&svc],
            0,
            IncludeObject::Metadata,
            json!({"resourceVersion": "5"}),
        );
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["columnDefinitions"][0]["format"], "name");
        assert_eq!(t["rows"][0]["object"]["metadata"]["labels"]["a"], "b");
        assert_eq!(t["rows"][0]["cells"][2], "10.0.0.11");
    }
}
